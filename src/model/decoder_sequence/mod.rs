//! The decoder's whole recurrence over a target sentence in training as one fused op (fused kernels, CPU):
//! for every step `i`, attention from `t_{i−1}` (model-spec §2, with coverage §5), the gate (§4) and the
//! transition (§3), the same computation as the decoder's one step ([`crate::model::Model::step`] followed by
//! [`crate::model::Model::feed`]), step by step. One graph node for the whole sentence instead
//! of some twenty per step: the forward pass runs the steps with one GEMM per recurrent product into
//! preallocated buffers, the backward pass runs back-propagation through time inside the op, and each
//! recurrent weight's gradient is one GEMM over all steps. Inputs and their gradients travel through
//! [`Shared`] handles (one graph input bundles them all). Covers the GRU and the vanilla tanh decoder, in the
//! reference or the paper-literal gate form, with any gate (none; a context gate with any strategy and inputs;
//! the gating scalar; static interpolation) and any coverage model (§5: linguistic with or without fertility,
//! neural gated or not; `kernels::coverage::CovRows` per sentence row, the state's term `t W_h` stacked into
//! the query product), and the cGRU (its context GRU as the gated transition with no word term, its word GRU
//! after it, see [`CgruWeights`]). Tested against the
//! step-by-step composition (`tests/it/kernels/`) and by finite differences (`tests/it/gradcheck.rs`).
//!
//! Here: the op's inputs, state and helpers; `forward` and `backward`, its two passes; `gate_mix`, the gate
//! and the mix of the word and context terms per sentence row; `transition`, the vanilla unit's and the
//! paper form's transitions (the GRU's row kernels are in `kernels::gru`; attention's and coverage's rows in
//! `kernels::attention` and `kernels::coverage`).

use candle_core::{CpuStorage, Result, Shape, Tensor};

use crate::kernels::gate::GateKinds;
use crate::kernels::guided_alignment::Guidance;
use crate::kernels::{storage_slice, Input, Oriented, Real, Shared};
use crate::model::attention::AttentionWeights;
use crate::model::coverage::CoverageInputs;
use crate::model::decoder_cell::TransitionWeights;
use crate::model::gate::{GateWeights, ZPre};

mod backward;
mod forward;
mod gate_mix;
mod transition;

/// The decoder's weights the recurrence reads, one part per concept, each built by its own module
/// ([`crate::model::attention::Attention::sequence_weights`], [`crate::model::decoder_cell::DecoderCell::sequence_weights`],
/// [`crate::model::gate::Gate::sequence_weights`]).
pub struct DecoderWeights<'a> {
    pub attention: AttentionWeights<'a>,
    pub transition: TransitionWeights<'a>,
    pub gate: GateWeights<'a>,
    /// Layer normalisation inside the recurrence (`model.layer_norm`).
    pub ln: Option<LnWeights<'a>>,
}

/// The gains and biases of the layer normalisations the recurrence runs (model-spec §5b), each `[g, β]`: of
/// the query `B t` (`[Ad]`), of the context product `s C` (`[kH]`, blocks `[2H | H]`, or `[H]` for the vanilla
/// unit), of the transition's recurrent products `[g_U_ru, β_U_ru, g_U, β_U]` (the cGRU's context GRU's; the
/// vanilla unit's `[g_U, β_U]`), each later deep GRU's likewise, and the cGRU's word GRU's. (The word
/// projections, the keys and the readout are normalised outside the op; the cGRU's context GRU adds its bias
/// after the normalisation of `s C`.)
pub struct LnWeights<'a> {
    pub query: [&'a Tensor; 2],
    pub context: [&'a Tensor; 2],
    pub rec: Vec<&'a Tensor>,
    pub deep: Vec<[&'a Tensor; 4]>,
    pub word: Option<[&'a Tensor; 4]>,
}

/// The target side of a batch for [`decoder_sequence_fused`].
#[derive(Clone, Copy, Debug, Default)]
pub struct Targets<'a> {
    /// `T`, the target positions of each sentence: the output's rows are `(b, i)` for `i < T`.
    pub positions: usize,
    /// The sentences' lengths (EOS included) when only the words' positions are to be computed (see
    /// [`target_rows`]; the other output rows are then zero).
    pub lengths: Option<&'a [usize]>,
    /// Guided alignment (`train.guided_alignment`): the attention rows' targets `[B, T, S]`, whose cost the
    /// forward pass leaves in the guidance's cell and whose gradient the backward pass adds to the scores'
    /// (see [`crate::kernels::guided_alignment`]).
    pub guidance: Option<&'a Guidance>,
}

/// Run the decoder over `T` target steps: word projections `wp` `[N, kH]` (`W e + b`), the gate's word term
/// `wz` `[N, H]` (when the gate reads the word), the initial state `t0` `[B, H]`, the attention keys `ah`
/// `[B, S, Ad]` (or the source words' only, `[Σ len, Ad]`; see [`key_offsets`]) and annotations `[B, S, 2H]`
/// (shared), the additive padding mask `[B, S]` and the target side
/// `targets`. The projections' rows are every position's, batch-major (`N = B·T`, row `b·T + i` for
/// `(b, i)`), or, with lengths in decreasing order, the words' only (`N = Σ_b len_b`, row
/// `Σ_{b' < b} len_b' + i`; see [`word_offsets`]). (cGRU: `wp` holds the word GRU's projections and `wz` row
/// `(b, i)` reads `e(y_{i−1})`, zero at `i = 0`.) `gate` is `Some((src, tgt))` for a context gate (the scales
/// as functions of `z`), `None` for no gate; `coverage` the coverage model's inputs when it is on (`C_0 = 0`;
/// attention at step `i` reads `C_{i−1}`, and `C_i` follows from its weights). Returns `[B·T, 3H]` as a
/// [`Shared`] handle (see [`crate::kernels::shared_output`]): row `(b, i)` is `[t_{i−1} | s_i]`, what the
/// fused readout reads in place, adding its gradient into the handle, so that the rows' gradient never
/// enters candle's gradient store. `drop`: recurrent dropout's masks `[B, H]` (training): the transition's
/// recurrent products read their operand through the masks — `d∘(T∘t_{i−1})` in the reference form,
/// `d∘t_{i−1}` in the paper form — and the GRU interpolates with the state itself (see
/// [`crate::model::gru::Gru::step_dropped`]); the cGRU's two GRUs share the masks.
#[allow(clippy::too_many_arguments)]
pub fn decoder_sequence_fused<'a>(
    wp: impl Into<Input<'a>>,
    wz: Option<Input<'a>>,
    t0: &Tensor,
    ah: &Shared,
    annotations: &Shared,
    mask_bias: &Tensor,
    targets: Targets,
    w: &DecoderWeights,
    gate: Option<GateKinds>,
    coverage: Option<CoverageInputs>,
    drop: Option<&Tensor>,
) -> Result<Shared> {
    let DecoderWeights {
        attention: AttentionWeights { b: b_att, v },
        transition:
            TransitionWeights {
                c,
                u_ru,
                u,
                paper_form,
                cgru,
                deep,
            },
        gate: GateWeights { u_z, c_z, z_pre },
        ln,
    } = w;
    let wp: Input = wp.into();
    let (rows, kh) = wp.tensor().dims2()?;
    let (b, h) = t0.dims2()?;
    let k = if u_ru.is_some() { 3 } else { 1 };
    let tl = targets.positions;
    let (b2, s, a2) = annotations.tensor.dims3()?;
    let ad = *ah.tensor.dims().last().unwrap_or(&0);
    let ok = kh == k * h
        && b2 == b
        && tl > 0
        && a2 == 2 * h
        && mask_bias.dims2()? == (b, s)
        && b_att.dims2()? == (h, ad)
        && v.elem_count() == ad
        && c.dims2()? == (2 * h, k * h)
        && u_ru.map_or(Ok(true), |x| x.dims2().map(|d| d == (h, 2 * h)))?
        && u.dims2()? == (h, h)
        && wz
            .as_ref()
            .map_or(Ok(true), |x| x.tensor().dims2().map(|d| d == (rows, h)))?
        && u_z.map_or(Ok(true), |x| x.dims2().map(|d| d == (h, h)))?
        && c_z.map_or(Ok(true), |x| x.dims2().map(|d| d == (2 * h, h)))?
        && (gate.is_some() || (wz.is_none() && u_z.is_none() && c_z.is_none() && z_pre.is_none()))
        && (gate.is_none() || wz.is_some() || u_z.is_some() || c_z.is_some() || z_pre.is_some())
        && (z_pre.is_none() || (wz.is_none() && u_z.is_none() && c_z.is_none()))
        && match &z_pre {
            None => true,
            Some(ZPre::Scalar { w, b }) => w.dims2()? == (h, 1) && b.elem_count() == 1,
            Some(ZPre::Static { theta }) => theta.elem_count() == h,
        }
        && match &cgru {
            None => true,
            Some(g) => {
                k == 3
                    && g.b.elem_count() == h
                    && g.u_ru.dims2()? == (h, 2 * h)
                    && g.u.dims2()? == (h, h)
            }
        };
    if !ok || drop.is_some_and(|d| d.dims() != [b, h]) {
        candle_core::bail!("fused decoder sequence: shape mismatch");
    }
    if targets
        .guidance
        .is_some_and(|g| g.targets.dims() != [b, tl, s])
    {
        candle_core::bail!("fused decoder sequence: guided alignment's targets are not [B, T, S]");
    }
    let sh = |x: &Tensor| Shared::new(x);
    let cov = match coverage {
        None => None,
        Some(c) => {
            let d = c.v_cov.dim(0)?;
            let k = match (c.neural, c.gated) {
                (false, _) => 0,
                (true, true) => 3,
                (true, false) => 1,
            };
            let pw = if c.neural { k * d } else { 1 };
            let ok = d > 0
                && c.v_cov.dims2()? == (d, ad)
                && c.pre.tensor().dims3()? == (b, s, pw)
                && (c.neural || d == 1)
                && (c.fertility.is_none() || !c.neural)
                && c.w_h
                    .map_or(Ok(!c.neural), |x| x.dims2().map(|x| x == (h, k * d)))?
                && c.p.map_or(Ok(!c.neural), |x| {
                    Ok::<_, candle_core::Error>(x.elem_count() == k * d)
                })?
                && c.u
                    .map_or(Ok(!c.neural), |x| x.dims2().map(|x| x == (d, d)))?
                && c.u_ru.map_or(Ok(!(c.neural && c.gated)), |x| {
                    x.dims2().map(|x| x == (d, 2 * d))
                })?;
            if !ok {
                candle_core::bail!("fused decoder sequence: coverage shape mismatch");
            }
            Some(CovOp {
                neural: c.neural,
                gated: c.gated,
                d,
                v_cov: sh(c.v_cov)?,
                pre: c.pre.into_shared()?,
                fertility: c.fertility,
                w_h: c.w_h.map(sh).transpose()?,
                p: c.p.map(sh).transpose()?,
                u: c.u.map(sh).transpose()?,
                u_ru: c.u_ru.map(sh).transpose()?,
            })
        }
    };
    let active = target_rows(targets.lengths, b, tl)?;
    let src_lens = source_lengths(
        &mask_bias
            .to_dtype(candle_core::DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()?,
        b,
        s,
    );
    let op = DecoderSequence {
        koff: key_offsets(ah.tensor.dims(), (b, s, ad), &src_lens)?,
        src_lens,
        off: step_offsets(&active),
        active,
        toff: word_offsets(rows, b, tl, targets.lengths)?,
        wp: wp.into_shared()?,
        wz: wz.map(Input::into_shared).transpose()?,
        t0: sh(t0)?,
        ah: ah.clone(),
        ann: annotations.clone(),
        mask: mask_bias.contiguous()?,
        b_att: sh(b_att)?,
        v: sh(v)?,
        c: sh(c)?,
        u_ru: u_ru.map(sh).transpose()?,
        u: sh(u)?,
        u_z: u_z.map(sh).transpose()?,
        c_z: c_z.map(sh).transpose()?,
        paper: *paper_form,
        z_pre: match &z_pre {
            None => None,
            Some(ZPre::Scalar { w, b }) => Some(ZPreOp::Scalar {
                w: sh(w)?,
                b: sh(b)?,
            }),
            Some(ZPre::Static { theta }) => Some(ZPreOp::Static { theta: sh(theta)? }),
        },
        gate,
        cov,
        cgru: match &cgru {
            None => None,
            Some(g) => Some(CgruOp {
                b: sh(g.b)?,
                u_ru: sh(g.u_ru)?,
                u: sh(g.u)?,
            }),
        },
        deep: DeepOp::all(deep, h)?,
        ln: LnOp::checked(ln.as_ref(), (k, cgru.is_some()), deep.len(), (h, ad))?,
        drop: drop.map(|d| d.contiguous()).transpose()?,
        guidance: targets.guidance.cloned(),
        saved: Default::default(),
    };
    // One graph input for all: the backward pass reaches every token through the concatenation.
    let bundle = Tensor::cat(&op.tokens(), 0)?;
    crate::kernels::shared_output(op, &bundle)
}

impl crate::kernels::FusedOutput for DecoderSequence {
    fn profile_names(&self) -> (&'static str, &'static str) {
        ("decoder sequence forward", "decoder sequence backward")
    }
    fn forward_output(&self) -> Result<(CpuStorage, Shape)> {
        match self.wp.tensor.dtype() {
            candle_core::DType::F32 => self.forward::<f32>(),
            candle_core::DType::F64 => self.forward::<f64>(),
            _ => candle_core::bail!("fused kernels support f32 and f64"),
        }
    }
    fn backward_output(&self, grad: &Tensor) -> Result<()> {
        match grad.dtype() {
            candle_core::DType::F32 => self.backward::<f32>(grad),
            candle_core::DType::F64 => self.backward::<f64>(grad),
            _ => candle_core::bail!("fused kernels support f32 and f64"),
        }
    }
}

struct DecoderSequence {
    /// The rows step `i` computes (see [`target_rows`]).
    active: Vec<usize>,
    /// Where step `i`'s rows start in the time-major buffers (see [`step_offsets`]).
    off: Vec<usize>,
    /// Where sentence `b`'s rows start in `wp` and `wz` (see [`word_offsets`]).
    toff: Vec<usize>,
    /// Where sentence `b`'s keys start in `ah` (see [`key_offsets`]).
    koff: Vec<usize>,
    /// Each sentence's source positions the attention rows compute (see [`source_lengths`]).
    src_lens: Vec<usize>,
    wp: Shared,
    wz: Option<Shared>,
    t0: Shared,
    ah: Shared,
    ann: Shared,
    mask: Tensor,
    b_att: Shared,
    v: Shared,
    c: Shared,
    u_ru: Option<Shared>,
    u: Shared,
    u_z: Option<Shared>,
    c_z: Option<Shared>,
    z_pre: Option<ZPreOp>,
    paper: bool,
    gate: Option<GateKinds>,
    cov: Option<CovOp>,
    cgru: Option<CgruOp>,
    /// A deep transition's later GRUs (see [`DeepOp`]).
    deep: Vec<DeepOp>,
    /// Layer normalisation inside the recurrence (see [`LnWeights`]).
    ln: Option<LnOp>,
    /// Recurrent dropout's masks `[B, H]` (see [`decoder_sequence_fused`]).
    drop: Option<Tensor>,
    /// Guided alignment (see [`Targets::guidance`]).
    guidance: Option<Guidance>,
    saved: crate::kernels::SavedSlot,
}

/// The cGRU's values for one pass: the context GRU's bias, the word GRU's `U_ru` and `U`.
struct CgruView<'a, T> {
    b: &'a [T],
    u_ru: Oriented<'a, T>,
    u: Oriented<'a, T>,
}

impl<'a, T: Real> CgruView<'a, T> {
    /// From [`DecoderSequence::cgru_data`]'s values, for hidden size `h`.
    fn new([b, u_ru, u]: &'a [Vec<T>; 3], h: usize) -> Self {
        CgruView {
            b,
            u_ru: Oriented::new(u_ru, h, 2 * h),
            u: Oriented::new(u, h, h),
        }
    }
}

/// One later GRU of a deep transition (see [`crate::model::decoder_cell::DeepTransition`]): its bias
/// `[b_r | b_u | b_c]` (the step's input terms), `U_ru`, `U`.
struct DeepOp {
    b: Shared,
    u_ru: Shared,
    u: Shared,
}

impl DeepOp {
    /// The ops of a deep transition's later GRUs `[b, U_ru, U]` of hidden size `h`.
    fn all(deep: &[[&Tensor; 3]], h: usize) -> Result<Vec<DeepOp>> {
        deep.iter()
            .map(|[b, u_ru, u]| {
                if b.elem_count() != 3 * h || u_ru.dims() != [h, 2 * h] || u.dims() != [h, h] {
                    candle_core::bail!("fused decoder sequence: deep transition shape mismatch");
                }
                Ok(DeepOp {
                    b: Shared::new(b)?,
                    u_ru: Shared::new(u_ru)?,
                    u: Shared::new(u)?,
                })
            })
            .collect()
    }
}

/// A [`DeepOp`]'s values for one pass: its input terms repeated over `B` rows `[B, 3H]`, `U_ru`, `U`.
struct DeepView<'a, T> {
    xp: Vec<T>,
    u_ru: Oriented<'a, T>,
    u: Oriented<'a, T>,
}

impl<'a, T: Real> DeepView<'a, T> {
    /// From [`DecoderSequence::deep_data`]'s values, for `b` rows of hidden size `h`.
    fn new([bias, u_ru, u]: &'a [Vec<T>; 3], b: usize, h: usize) -> Self {
        DeepView {
            xp: bias.repeat(b),
            u_ru: Oriented::new(u_ru, h, 2 * h),
            u: Oriented::new(u, h, h),
        }
    }
}

/// See [`LnWeights`].
struct LnOp {
    query: [Shared; 2],
    context: [Shared; 2],
    rec: Vec<Shared>,
    deep: Vec<[Shared; 4]>,
    word: Option<[Shared; 4]>,
}

impl LnOp {
    /// The op's normalisations from `ln`, after checking that they fit the decoder (`k` blocks of the
    /// transition's inputs: 3 for a GRU, 1 for the vanilla unit; `cgru`: the cGRU, whose word GRU has its own),
    /// `deep` later GRUs, hidden width `h` and attention width `ad`.
    fn checked(
        ln: Option<&LnWeights>,
        (k, cgru): (usize, bool),
        deep: usize,
        (h, ad): (usize, usize),
    ) -> Result<Option<LnOp>> {
        let Some(l) = ln else {
            return Ok(None);
        };
        let widths =
            |ts: &[&Tensor], ws: &[usize]| ts.iter().zip(ws).all(|(t, &w)| t.dims() == [w]);
        let rec: &[usize] = if k == 3 {
            &[2 * h, 2 * h, h, h]
        } else {
            &[h, h]
        };
        let ok = widths(&l.query, &[ad, ad])
            && widths(&l.context, &[k * h, k * h])
            && l.rec.len() == rec.len()
            && widths(&l.rec, rec)
            && l.deep.len() == deep
            && l.deep.iter().all(|d| widths(d, &[2 * h, 2 * h, h, h]))
            && l.word.is_some() == cgru
            && l.word.is_none_or(|w| widths(&w, &[2 * h, 2 * h, h, h]));
        if !ok {
            candle_core::bail!(
                "fused decoder sequence: layer normalisation's gains and biases do not fit the decoder: \
                 [Ad], [kH], [2H, 2H, H, H] (the vanilla unit: [H, H]), each deep GRU's and the cGRU's word \
                 GRU's [2H, 2H, H, H]"
            );
        }
        Ok(Some(LnOp::new(l)?))
    }

    fn new(w: &LnWeights) -> Result<LnOp> {
        let sh = |t: &Tensor| Shared::new(t);
        let four = |x: &[&Tensor; 4]| -> Result<[Shared; 4]> {
            Ok([sh(x[0])?, sh(x[1])?, sh(x[2])?, sh(x[3])?])
        };
        Ok(LnOp {
            query: [sh(w.query[0])?, sh(w.query[1])?],
            context: [sh(w.context[0])?, sh(w.context[1])?],
            rec: w.rec.iter().map(|t| sh(t)).collect::<Result<_>>()?,
            deep: w.deep.iter().map(four).collect::<Result<_>>()?,
            word: w.word.as_ref().map(four).transpose()?,
        })
    }

    /// Every gain and bias, in a fixed order.
    fn all(&self) -> impl Iterator<Item = &Shared> {
        self.query
            .iter()
            .chain(&self.context)
            .chain(&self.rec)
            .chain(self.deep.iter().flatten())
            .chain(self.word.iter().flatten())
    }

    /// Their values, in the order of [`LnOp::all`].
    fn data<T: Real>(&self) -> Result<LnData<T>> {
        let v = |x: &Shared| crate::kernels::to_vec::<T>(&x.tensor);
        let four = |x: &[Shared; 4]| -> Result<[Vec<T>; 4]> {
            Ok([v(&x[0])?, v(&x[1])?, v(&x[2])?, v(&x[3])?])
        };
        Ok(LnData {
            query: [v(&self.query[0])?, v(&self.query[1])?],
            context: [v(&self.context[0])?, v(&self.context[1])?],
            rec: self.rec.iter().map(v).collect::<Result<_>>()?,
            deep: self.deep.iter().map(four).collect::<Result<_>>()?,
            word: self.word.as_ref().map(four).transpose()?,
        })
    }
}

/// [`LnOp`]'s values for one pass.
struct LnData<T> {
    query: [Vec<T>; 2],
    context: [Vec<T>; 2],
    rec: Vec<Vec<T>>,
    deep: Vec<[Vec<T>; 4]>,
    word: Option<[Vec<T>; 4]>,
}

/// Which GRU's recurrent normalisations: the transition's (the cGRU's context GRU's), a later deep GRU's, the
/// cGRU's word GRU's.
#[derive(Clone, Copy)]
enum RecAt {
    Transition,
    Deep(usize),
    Word,
}

impl<T: Real> LnData<T> {
    /// The recurrent products' gains and biases of the GRU at `at` (the transition's: a GRU's).
    fn rec_ln(&self, at: RecAt) -> crate::kernels::gru::RecLn<'_, T> {
        let p: &[Vec<T>] = match at {
            RecAt::Transition => &self.rec,
            RecAt::Deep(k) => &self.deep[k],
            RecAt::Word => self
                .word
                .as_ref()
                .expect("the cGRU's word GRU's normalisations"),
        };
        crate::kernels::gru::RecLn {
            g_ru: &p[0],
            b_ru: &p[1],
            g_c: &p[2],
            b_c: &p[3],
        }
    }
}

/// A GRU step's saved normalisation statistics over the steps (`[n, B, 2H]`, `[n, B]`, `[n, B, H]`, `[n, B]`,
/// rows as the step offsets).
struct RecLnStats<T> {
    xh_ru: Vec<T>,
    rs_ru: Vec<T>,
    xh_c: Vec<T>,
    rs_c: Vec<T>,
}

impl<T: Real> RecLnStats<T> {
    fn new(rows: usize, h: usize) -> Self {
        RecLnStats {
            xh_ru: crate::kernels::zeroed(rows * 2 * h),
            rs_ru: crate::kernels::zeroed(rows),
            xh_c: crate::kernels::zeroed(rows * h),
            rs_c: crate::kernels::zeroed(rows),
        }
    }

    /// Where rows `o..o + m` of a step keep their statistics.
    fn acts(&mut self, o: usize, m: usize, h: usize) -> crate::kernels::gru::RecLnActs<'_, T> {
        crate::kernels::gru::RecLnActs {
            xh_ru: &mut self.xh_ru[o * 2 * h..(o + m) * 2 * h],
            rs_ru: &mut self.rs_ru[o..o + m],
            xh_c: &mut self.xh_c[o * h..(o + m) * h],
            rs_c: &mut self.rs_c[o..o + m],
        }
    }

    /// Rows `o..o + m`'s statistics with the gains, for the backward pass.
    fn saved<'s>(
        &'s self,
        o: usize,
        m: usize,
        h: usize,
        ln: &crate::kernels::gru::RecLn<'s, T>,
    ) -> crate::kernels::gru::RecLnSaved<'s, T> {
        crate::kernels::gru::RecLnSaved {
            g_ru: ln.g_ru,
            g_c: ln.g_c,
            xh_ru: &self.xh_ru[o * 2 * h..(o + m) * 2 * h],
            rs_ru: &self.rs_ru[o..o + m],
            xh_c: &self.xh_c[o * h..(o + m) * h],
            rs_c: &self.rs_c[o..o + m],
        }
    }

    /// `[∂g_U_ru, ∂β_U_ru, ∂g_U, ∂β_U]` from the pre-activations' gradients `dx` (rows of `[r | u | h~]`):
    /// `∂g = Σ ∂y∘x̂`, `∂β = Σ ∂y` over every row (rows not computed hold zeros in both).
    fn param_grads(&self, dx: &[T], h: usize) -> [Vec<T>; 4] {
        crate::kernels::gru::rec_ln_param_grads(dx, &self.xh_ru, &self.xh_c, h)
    }
}

/// The forward pass's layer normalisation statistics: the query's and the context product's `x̂` (`[T, B, Ad]`,
/// `[n, B, 3H]`) and `1/σ` (`[T, B]`, `[n, B, 2]`), the transition's and each deep GRU's recurrent products'.
struct LnSaved<T> {
    xq: Vec<T>,
    rsq: Vec<T>,
    xc: Vec<T>,
    rsc: Vec<T>,
    rec: RecLnStats<T>,
    deep: Vec<RecLnStats<T>>,
    /// The cGRU's word GRU's (rows as its activations).
    word: Option<RecLnStats<T>>,
}

/// See [`CgruWeights`].
struct CgruOp {
    b: Shared,
    u_ru: Shared,
    u: Shared,
}

/// [`ZPre`]'s constant part as values.
enum ZConst<T> {
    None,
    Scalar(T),
    Static(Vec<T>),
}

/// See [`ZPre`].
enum ZPreOp {
    Scalar { w: Shared, b: Shared },
    Static { theta: Shared },
}

/// The coverage model's inputs (see [`CoverageInputs`]).
struct CovOp {
    neural: bool,
    gated: bool,
    d: usize,
    v_cov: Shared,
    pre: Shared,
    fertility: Option<f64>,
    w_h: Option<Shared>,
    p: Option<Shared>,
    u: Option<Shared>,
    u_ru: Option<Shared>,
}

/// The forward pass's activations, time-major (`n` = steps with a transition, `T − 1`).
struct Saved<T> {
    /// `t_{i−1}` `[T, B, H]`, `B t_{i−1}` `[T, B, Ad]`, `[α_i | s_i]` `[T, B, S + 2H]`.
    tall: Vec<T>,
    q: Vec<T>,
    actx: Vec<T>,
    /// `[n, B, ·]`: `z`, `T∘t`, `C s`, `[r | u]`, `r∘(T∘t)`, `tanh(·)`.
    z: Vec<T>,
    ts: Vec<T>,
    cp: Vec<T>,
    ru: Vec<T>,
    rts: Vec<T>,
    c: Vec<T>,
    /// The stacked weights the pass read (`[B | U_z]`, `[C | C_z]`) and their widths, for the backward pass.
    tw: Vec<T>,
    wq: usize,
    cw: Vec<T>,
    wc: usize,
    /// Coverage: `C_{i−1}` of every step `[T, B, S, d]`, the gated update's activations `[n, B, S, 3d]`.
    covs: Vec<T>,
    cacts: Vec<T>,
    /// Paper form: the products `U_ru t` `[n, B, 2H]` (GRU) and `U(r∘t)` or `U t` `[n, B, H]` before the
    /// scale (`ts` holds the scale `T` itself then).
    hus: Vec<T>,
    rcs: Vec<T>,
    /// cGRU: the context GRU's states `t_i` `[T, B, H]` and the word GRU's `[r | u]`, `r∘t`, `tanh(·)`
    /// `[n, B, ·]` (`tall` holds the intermediate states `t'_i`).
    sall: Vec<T>,
    wru: Vec<T>,
    wrh: Vec<T>,
    wht: Vec<T>,
    /// A deep transition's later GRUs, each: its input state, `[r | u]`, `r∘(d∘t)`, `tanh(·)`
    /// `[nt, B, ·]` (the first one's input state is the transition's output).
    deep: Vec<[Vec<T>; 4]>,
    /// With layer normalisation: its statistics.
    ln: Option<LnSaved<T>>,
}

/// The coverage inputs' values for one pass (all small: `[d, Ad]`, `[B, S, ·]`, `[d, 2d]`).
struct CovData<T> {
    neural: bool,
    gated: bool,
    d: usize,
    v_cov: Vec<T>,
    /// `1/Φ_j` or `h_j W_c`, and (fertility) `h_j U_f` it was formed from.
    pre: Vec<T>,
    pre_in: Vec<T>,
    p: Vec<T>,
    u: Vec<T>,
    u_ru: Vec<T>,
}

impl<T: Real> CovData<T> {
    fn rows(&self) -> crate::kernels::coverage::CovRows<'_, T> {
        crate::kernels::coverage::CovRows {
            neural: self.neural,
            gated: self.gated,
            d: self.d,
            p: &self.p,
            u: &self.u,
            u_ru: &self.u_ru,
        }
    }
}

/// The rows each step computes, from the sentences' target lengths (EOS included; see
/// [`crate::model::mask_lengths`]): when the sentences come in order of decreasing length (as
/// [`crate::model::Batch`] builds them), step `i` computes the first `active[i]` rows only, the sentences with
/// a word at `i`. Without lengths, or in another order, every row at every step (under the loss's mask).
///
/// Padded positions do not enter the loss, so nothing of theirs is needed: their output rows are zero and
/// their rows' gradient is not read. The transition of step `i` (which makes the state the next step reads)
/// covers the rows of step `i + 1` (the cGRU's context GRU, whose state is step `i`'s output, those of step
/// `i`). Going back, the rows grow with every step, and a row enters the backward recurrence with zero
/// gradients.
fn target_rows(lengths: Option<&[usize]>, b: usize, tl: usize) -> Result<Vec<usize>> {
    let Some(lens) = lengths else {
        return Ok(vec![b; tl]);
    };
    if lens.len() != b || lens.iter().any(|&l| l == 0 || l > tl) {
        candle_core::bail!("fused decoder sequence: target lengths do not fit the batch");
    }
    if lens.windows(2).any(|w| w[0] < w[1]) {
        return Ok(vec![b; tl]);
    }
    Ok((0..tl)
        .map(|i| lens.iter().filter(|&&l| l > i).count())
        .collect())
}

/// The time-major buffers' layout: step `i`'s `active[i]` rows start at row `off[i]` (`off[tl]`: all rows),
/// so that no row is kept for a padded position and each weight's gradient, one GEMM over the rows of all
/// steps, covers the words only. (Every row at every step: `off[i] = i·B`.) A buffer of the transitions,
/// whose step `i` covers the rows of step `i + 1`, keeps the same blocks: the rows past those stay zero.
fn step_offsets(active: &[usize]) -> Vec<usize> {
    let mut off = starts(active);
    off.push(active.iter().sum());
    off
}

/// Where each of consecutive blocks of `counts` rows starts.
fn starts(counts: &[usize]) -> Vec<usize> {
    counts
        .iter()
        .scan(0, |at, &n| {
            let o = *at;
            *at += n;
            Some(o)
        })
        .collect()
}

/// Where each sentence's rows start in the word projections `wp` (and `wz`) of `rows` rows: at `b·T` when
/// they hold every position, or after the words of the sentences before it when they hold the words only
/// (`rows = Σ len`), which needs the lengths in decreasing order: the op then reads no padded position.
fn word_offsets(rows: usize, b: usize, tl: usize, lengths: Option<&[usize]>) -> Result<Vec<usize>> {
    if rows == b * tl {
        return Ok((0..b).map(|r| r * tl).collect());
    }
    match lengths {
        Some(l)
            if l.len() == b
                && l.windows(2).all(|w| w[0] >= w[1])
                && l.iter().sum::<usize>() == rows =>
        {
            Ok(starts(l))
        }
        _ => candle_core::bail!(
            "fused decoder sequence: {rows} word projection rows are neither B·T = {} nor the words' positions",
            b * tl
        ),
    }
}

/// Where each sentence's keys start in `ah` (in rows of `Ad`): at `b·S` when `ah` is `[B, S, Ad]`, or after
/// the words of the sentences before it when `ah` holds the words' keys only, `[Σ len, Ad]` (the lengths
/// `lens` read from the mask by [`source_lengths`]; the op reads the words' keys only).
fn key_offsets(
    dims: &[usize],
    (b, s, ad): (usize, usize, usize),
    lens: &[usize],
) -> Result<Vec<usize>> {
    if dims == [b, s, ad] {
        return Ok((0..b).map(|r| r * s).collect());
    }
    if dims == [lens.iter().sum::<usize>(), ad] {
        return Ok(starts(lens));
    }
    candle_core::bail!(
        "fused decoder sequence: keys {dims:?} are neither [B, S, Ad] = [{b}, {s}, {ad}] nor the words' [{}, {ad}]",
        lens.iter().sum::<usize>()
    )
}

/// Each sentence's length from the additive padding mask `[B, S]` (0 on words): the positions the attention
/// rows compute (`α` is exactly 0 on the rest). A mask that is not words then padding, or has no word, gives
/// `S` (every position, under the mask).
fn source_lengths<T: Real>(mask: &[T], b: usize, s: usize) -> Vec<usize> {
    (0..b)
        .map(|r| {
            let row = &mask[r * s..(r + 1) * s];
            let n = row.iter().take_while(|&&m| m == T::zero()).count();
            if n == 0 || row[n..].iter().any(|&m| m == T::zero()) {
                s
            } else {
                n
            }
        })
        .collect()
}

/// Sizes of one run, and the widths both passes derive from them.
#[derive(Clone, Copy)]
struct Dims {
    /// `T`: target positions of the run (the previous-word inputs, BOS first).
    tl: usize,
    /// `B`: sentences in the batch.
    b: usize,
    /// `H`: the decoder state's width.
    h: usize,
    /// Blocks of the transition's inputs: 3 (GRU: `[r | u | t~]`) or 1 (vanilla).
    k: usize,
    /// `S`: source positions (the annotations' length, padding included).
    s: usize,
    /// `A`: the attention's hidden width (`W_a`, `U_a`, `v_a`).
    ad: usize,
    /// `2H`: an annotation's width (the two encoder directions).
    a2: usize,
    /// `3H`: the width of a position's row `[t_{i−1} | c_i]` (the state `H`, the context `2H`) the readout
    /// reads, and of its gradient.
    h3: usize,
    /// `k·H`: the transition's input width (`[r | u | t~]` or the vanilla unit's one block).
    kh: usize,
    /// `S + 2H`: the per-step row `[α | c]` (the attention weights, then the context).
    w_ac: usize,
    /// The transition is a GRU (`k` = 3), not the vanilla unit.
    gru: bool,
    /// `n = T − 1`: steps with a transition.
    n: usize,
    /// Steps with a transition of the context GRU: all `T` for the cGRU, else `n`.
    nt: usize,
    /// A context gate (any strategy) scales the transition's inputs.
    gated: bool,
    /// The paper's gate form (operand `d∘t`), not the reference form (`d∘(T∘t)`).
    paper: bool,
    /// Whether the gate reads the state (`U_z`) and the context (`C_z`).
    has_uz: bool,
    has_cz: bool,
    /// Coverage's width `d` (0 without coverage).
    cdim: usize,
    /// The width of coverage's pre-computed per-position term.
    pw: usize,
    /// The `k·d` part of the query rows that coverage reads.
    kd: usize,
    /// The width of coverage's kept activations per position.
    aw: usize,
    /// The sizes of neural coverage's recurrent weights `U` (`d·d`) and, gated, `U_ru` (`2·d·d`).
    uw: usize,
    uruw: usize,
    /// `B·S·d`: the coverage vectors of one step.
    bsd: usize,
    /// Where the query rows `t [B | U_z | W_h | w_β]` hold coverage's `t W_h`.
    wh_off: usize,
    /// Where they hold the gating scalar's term `t w_β`.
    wb_off: usize,
}

impl Dims {
    /// The blocks in which layer normalisation normalises the context product `s C`: `[2H | H]` (GRU) or
    /// `[H]` (the vanilla unit).
    fn ctx_blocks(&self) -> Vec<usize> {
        if self.gru {
            vec![2 * self.h, self.h]
        } else {
            vec![self.h]
        }
    }
}

impl DecoderSequence {
    /// Every input's graph handle, in a fixed order.
    fn tokens(&self) -> Vec<&Tensor> {
        let mut tokens = vec![
            &self.wp.token,
            &self.t0.token,
            &self.ah.token,
            &self.ann.token,
            &self.b_att.token,
            &self.v.token,
            &self.c.token,
            &self.u.token,
        ];
        for x in [&self.u_ru, &self.wz, &self.u_z, &self.c_z]
            .into_iter()
            .flatten()
        {
            tokens.push(&x.token);
        }
        match &self.z_pre {
            Some(ZPreOp::Scalar { w, b }) => tokens.extend([&w.token, &b.token]),
            Some(ZPreOp::Static { theta }) => tokens.push(&theta.token),
            None => {}
        }
        if let Some(g) = &self.cgru {
            tokens.extend([&g.b.token, &g.u_ru.token, &g.u.token]);
        }
        for g in &self.deep {
            tokens.extend([&g.b.token, &g.u_ru.token, &g.u.token]);
        }
        if let Some(l) = &self.ln {
            tokens.extend(l.all().map(|x| &x.token));
        }
        if let Some(c) = &self.cov {
            tokens.extend([&c.v_cov.token, &c.pre.token]);
            for x in [&c.w_h, &c.p, &c.u, &c.u_ru].into_iter().flatten() {
                tokens.push(&x.token);
            }
        }
        tokens
    }

    fn dims(&self) -> Result<Dims> {
        let kh = self.wp.tensor.dim(1)?;
        let (b, h) = self.t0.tensor.dims2()?;
        let tl = self.active.len();
        let s = self.ann.tensor.dim(1)?;
        let ad = *self.ah.tensor.dims().last().unwrap_or(&0);
        let k = kh / h.max(1);
        let n = tl - 1;
        let cr = self
            .cov
            .as_ref()
            .map(|c| crate::kernels::coverage::CovRows::<f32> {
                neural: c.neural,
                gated: c.gated,
                d: c.d,
                p: &[],
                u: &[],
                u_ru: &[],
            });
        let (cdim, pw, kd, aw) = cr.as_ref().map_or((0, 0, 0, 0), |c| {
            (c.d, c.pre_width(), c.kd(), c.acts_width())
        });
        let (uw, uruw) = match &cr {
            Some(c) if c.neural => (cdim * cdim, if c.gated { 2 * cdim * cdim } else { 0 }),
            _ => (0, 0),
        };
        let (has_uz, has_cz) = (self.u_z.is_some(), self.c_z.is_some());
        let wh_off = ad + if has_uz { h } else { 0 };
        Ok(Dims {
            tl,
            b,
            h,
            k,
            s,
            ad,
            a2: 2 * h,
            h3: 3 * h,
            kh,
            w_ac: s + 2 * h,
            gru: k == 3,
            n,
            nt: if self.cgru.is_some() { tl } else { n },
            gated: self.gate.is_some(),
            paper: self.paper,
            has_uz,
            has_cz,
            cdim,
            pw,
            kd,
            aw,
            uw,
            uruw,
            bsd: b * s * cdim,
            wh_off,
            wb_off: wh_off + kd,
        })
    }

    fn cov_data<T: Real>(&self) -> Result<Option<CovData<T>>> {
        let Some(c) = &self.cov else {
            return Ok(None);
        };
        let vec_of = |x: &Option<Shared>| -> Result<Vec<T>> {
            x.as_ref()
                .map_or(Ok(vec![]), |x| crate::kernels::to_vec::<T>(&x.tensor))
        };
        let pre_in = crate::kernels::to_vec::<T>(&c.pre.tensor)?;
        let (pre, pre_in) = match c.fertility {
            // 1/Φ_j = 1/(N σ(h_j U_f)).
            Some(nf) => {
                let nf = T::from_f64c(nf);
                (
                    pre_in
                        .iter()
                        .map(|&x| T::one() / (nf * x.sigmoid_v()))
                        .collect(),
                    pre_in,
                )
            }
            None => (pre_in, vec![]),
        };
        Ok(Some(CovData {
            neural: c.neural,
            gated: c.gated,
            d: c.d,
            v_cov: crate::kernels::to_vec::<T>(&c.v_cov.tensor)?,
            pre,
            pre_in,
            p: vec_of(&c.p)?,
            u: vec_of(&c.u)?,
            u_ru: vec_of(&c.u_ru)?,
        }))
    }

    /// Recurrent dropout's masks as values (`[B, H]`, batch order: step `i`'s rows are the first ones).
    fn drop_data<T: Real>(&self) -> Result<Option<Vec<T>>> {
        self.drop
            .as_ref()
            .map(|d| crate::kernels::to_vec::<T>(d))
            .transpose()
    }

    /// A deep transition's later GRUs' `b`, `U_ru`, `U` as values.
    fn deep_data<T: Real>(&self) -> Result<Vec<[Vec<T>; 3]>> {
        let v = |x: &Shared| crate::kernels::to_vec::<T>(&x.tensor);
        self.deep
            .iter()
            .map(|g| Ok([v(&g.b)?, v(&g.u_ru)?, v(&g.u)?]))
            .collect()
    }

    /// cGRU: the context GRU's bias and the word GRU's `U_ru`, `U` as values.
    fn cgru_data<T: Real>(&self) -> Result<Option<[Vec<T>; 3]>> {
        let Some(g) = &self.cgru else {
            return Ok(None);
        };
        let v = |x: &Shared| crate::kernels::to_vec::<T>(&x.tensor);
        Ok(Some([v(&g.b)?, v(&g.u_ru)?, v(&g.u)?]))
    }

    /// The gate's constant part: `b_β` (gating scalar) or `θ` (static interpolation).
    fn z_const<T: Real>(&self) -> Result<ZConst<T>> {
        Ok(match &self.z_pre {
            None => ZConst::None,
            Some(ZPreOp::Scalar { b, .. }) => {
                ZConst::Scalar(crate::kernels::to_vec::<T>(&b.tensor)?[0])
            }
            Some(ZPreOp::Static { theta }) => {
                ZConst::Static(crate::kernels::to_vec::<T>(&theta.tensor)?)
            }
        })
    }

    /// The gate's scales as `((α_s, β_s), (α_t, β_t))` (no gate: both 1).
    fn scales<T: Real>(&self) -> gate_mix::RowScales<T> {
        match &self.gate {
            Some(k) => k.affine::<T>(),
            None => ((T::one(), T::zero()), (T::one(), T::zero())),
        }
    }

    /// `[B | U_z | W_h]` `[H, Ad (+ H) (+ k·d)]` and `[C | C_z]` `[2H, 3H (+ H)]` with their widths: the
    /// products that share a left operand (`t_{i−1}`, `s_i`) as one GEMM each.
    #[allow(clippy::type_complexity)]
    fn stacked<T: Real>(&self) -> Result<(Vec<T>, usize, Vec<T>, usize)> {
        fn cat<T: Real>(parts: &[&Shared]) -> Result<(Vec<T>, usize)> {
            use rayon::prelude::*;
            let guards: Vec<_> = parts
                .iter()
                .map(|p| p.tensor.storage_and_layout())
                .collect();
            let mats: Vec<(&[T], usize)> = guards
                .iter()
                .zip(parts)
                .map(|((g, l), p)| Ok((storage_slice::<T>(g, l)?, p.tensor.dim(1)?)))
                .collect::<Result<_>>()?;
            let width: usize = mats.iter().map(|m| m.1).sum();
            let rows = parts[0].tensor.dim(0)?;
            let mut out = crate::kernels::zeroed::<T>(rows * width);
            if width > 0 {
                out.par_chunks_mut(width).enumerate().for_each(|(r, o)| {
                    let mut at = 0;
                    for (m, w) in &mats {
                        o[at..at + w].copy_from_slice(&m[r * w..(r + 1) * w]);
                        at += w;
                    }
                });
            }
            Ok((out, width))
        }
        let mut t_parts = vec![&self.b_att];
        t_parts.extend(self.u_z.as_ref());
        t_parts.extend(self.cov.as_ref().and_then(|c| c.w_h.as_ref()));
        if let Some(ZPreOp::Scalar { w, .. }) = &self.z_pre {
            t_parts.push(w);
        }
        let mut c_parts = vec![&self.c];
        c_parts.extend(self.c_z.as_ref());
        let (tw, wq) = cat::<T>(&t_parts)?;
        let (cw, wc) = cat::<T>(&c_parts)?;
        Ok((tw, wq, cw, wc))
    }
}

#[cfg(test)]
mod tests {
    use super::{step_offsets, target_rows, word_offsets};

    #[test]
    fn steps_rows_and_offsets() {
        // Targets 3, 3, 2, 1 long: every sentence at step 0, three at step 1, two at step 2.
        let active = target_rows(Some(&[3, 3, 2, 1]), 4, 3).unwrap();
        assert_eq!(active, vec![4, 3, 2]);
        assert_eq!(step_offsets(&active), vec![0, 4, 7, 9]);
        // Out of order: every row at every step, at `i·B`.
        let all = target_rows(Some(&[1, 3, 2, 3]), 4, 3).unwrap();
        assert_eq!(all, vec![4, 4, 4]);
        assert_eq!(step_offsets(&all), vec![0, 4, 8, 12]);
        assert!(target_rows(Some(&[4, 1]), 2, 3).is_err());
        assert!(target_rows(Some(&[2, 0]), 2, 3).is_err());
    }

    #[test]
    fn word_projection_rows() {
        // Every position: sentence b at b·T.
        assert_eq!(word_offsets(12, 4, 3, None).unwrap(), vec![0, 3, 6, 9]);
        assert_eq!(
            word_offsets(12, 4, 3, Some(&[3, 3, 2, 1])).unwrap(),
            vec![0, 3, 6, 9]
        );
        // The words only: after the words of the sentences before.
        assert_eq!(
            word_offsets(9, 4, 3, Some(&[3, 3, 2, 1])).unwrap(),
            vec![0, 3, 6, 8]
        );
        // Rows that fit neither, words without lengths, or lengths out of order (padding would be read).
        assert!(word_offsets(8, 4, 3, Some(&[3, 3, 2, 1])).is_err());
        assert!(word_offsets(9, 4, 3, None).is_err());
        assert!(word_offsets(9, 4, 3, Some(&[1, 3, 2, 3])).is_err());
    }
}
