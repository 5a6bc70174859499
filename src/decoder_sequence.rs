//! The decoder's whole recurrence over a target sentence in training as one fused op (fused kernels, CPU):
//! for every step `i`, attention from `t_{i−1}` (model-spec §2, with coverage §5), the gate (§4) and the
//! transition (§3), the same computation as [`crate::model::Model::attend`] followed by
//! [`crate::model::Model::transition_projected`], step by step. One graph node for the whole sentence instead
//! of some twenty per step: the forward pass runs the steps with one GEMM per recurrent product into
//! preallocated buffers, the backward pass runs back-propagation through time inside the op, and each
//! recurrent weight's gradient is one GEMM over all steps. Inputs and their gradients travel through
//! [`Shared`] handles (one graph input bundles them all). Covers the GRU and the vanilla tanh decoder, in the
//! reference or the paper-literal gate form, with any gate (none; a context gate with any strategy and inputs;
//! the gating scalar; static interpolation) and any coverage model (§5: linguistic with or without fertility,
//! neural gated or not; `coverage::CovRows` per sentence row, the state's term `t W_h` stacked into the query
//! product), and the cGRU (its context GRU as the gated transition with no word term, its word GRU after it,
//! see [`CgruWeights`]). Tested against the
//! step-by-step composition (`tests/kernels.rs`) and by finite differences (`tests/gradcheck.rs`).

use candle_core::{CpuStorage, Result, Shape, Tensor};

use crate::encoder::{gru_step_forward, GruActs, GruStep};
use crate::gate::ZKind;
use crate::kernels::{
    rows_par, simd_dispatch, storage_slice, Input, Mat, Oriented, Real, RowsMut, Shared,
};

/// The decoder's weights the recurrence reads.
pub struct DecoderWeights<'a> {
    /// Attention `B` `[H, Ad]` and `v` `[Ad, 1]`.
    pub b_att: &'a Tensor,
    pub v: &'a Tensor,
    /// Transition `C` `[2H, kH]`, `U_ru` `[H, 2H]` (GRU: k = 3; `None` for the vanilla tanh unit, k = 1),
    /// `U` `[H, H]`. (cGRU: the context GRU's.)
    pub c: &'a Tensor,
    pub u_ru: Option<&'a Tensor>,
    pub u: &'a Tensor,
    /// Gate `U_z` `[H, H]` and `C_z` `[2H, H]` (when the gate reads the state / the context).
    pub u_z: Option<&'a Tensor>,
    pub c_z: Option<&'a Tensor>,
    /// The gate's pre-activation when it is not a context gate's sum of terms (model-spec §4).
    pub z_pre: Option<ZPre<'a>>,
    /// The paper-literal form: the target scale `T` multiplies the recurrent products `U_ru t`, `U(r∘t)` (or
    /// `U t`) after them, and the GRU interpolates with the unscaled state (see [`crate::decoder_cell`]).
    pub paper_form: bool,
    /// The conditional GRU (cGRU): the transition above is its context GRU (no word input), and a word GRU
    /// follows it at every step.
    pub cgru: Option<CgruWeights<'a>>,
}

/// The cGRU's weights beyond the context GRU's `C`, `U_ru`, `U` (see [`crate::decoder_cell::DecoderCell`]):
/// the context GRU's candidate bias `b` `[H]` (with the context's term, under the source scale), and the
/// word GRU's `U_ru` `[H, 2H]` and `U` `[H, H]` (its input projections `W e + b` are the op's `wp`).
/// Step `i` then runs attention from the intermediate state `t'_i` (`t'_0 = t_0`), the gate (reading
/// `e(y_{i−1})`, `t'_i`, `s_i`) and the context GRU `t_i = GRU_ctx(s_i, t'_i)` under its scales, and, before
/// the last step, the word GRU `t'_{i+1} = GRU_word(e(y_i), t_i)`; the output row `(b, i)` is `[t_i | s_i]`.
pub struct CgruWeights<'a> {
    pub b: &'a Tensor,
    pub u_ru: &'a Tensor,
    pub u: &'a Tensor,
}

/// A gate value that is not a context gate's: Xu et al.'s gating scalar `β = σ(w_βᵀ t_{i−1} + b_β)` (`w_β`
/// `[H, 1]`, `b_β` `[1]`; with the *source* scales) or static interpolation's `z = σ(θ)` (`θ` `[H]`; with the
/// *both* scales). In the op they are the gate's one term: `w_βᵀ t + b_β` repeated over `H`, or `θ`.
pub enum ZPre<'a> {
    Scalar { w: &'a Tensor, b: &'a Tensor },
    Static { theta: &'a Tensor },
}

/// Coverage (model-spec §5) inside the recurrence: `V_cov` `[d, Ad]`, the per-position precomputed input
/// `pre` (`1/Φ_j` `[B, S, 1]` for linguistic coverage — or `h_j U_f` when `fertility` is `Some(N)`, and the op
/// forms `1/Φ_j = 1/(N σ(h_j U_f))` itself — and `h_j W_c` `[B, S, k·d]` for neural), and the neural update's
/// `W_h` `[H, k·d]`, `p` `[k·d]`, `U` `[d, d]` and (gated) `U_ru` `[d, 2d]`, as in
/// [`crate::coverage::Coverage`].
pub struct CoverageInputs<'a> {
    pub neural: bool,
    pub gated: bool,
    pub v_cov: &'a Tensor,
    pub pre: Input<'a>,
    pub fertility: Option<f64>,
    pub w_h: Option<&'a Tensor>,
    pub p: Option<&'a Tensor>,
    pub u: Option<&'a Tensor>,
    pub u_ru: Option<&'a Tensor>,
}

/// Run the decoder over `T` target steps: word projections `wp` `[B·T, 3H]` (batch-major rows `(b, i)`, `W e +
/// b`), the gate's word term `wz` `[B·T, H]` (when the gate reads the word), the initial state `t0` `[B, H]`, the
/// attention keys `ah` `[B, S, Ad]` and annotations `[B, S, 2H]` (shared), the additive padding mask
/// `[B, S]` (cGRU: `wp` holds the word GRU's projections and `wz` row `(b, i)` reads `e(y_{i−1})`, zero at
/// `i = 0`); `gate` is `Some((src, tgt))` for a context gate (the scales as functions of `z`), `None` for
/// no gate; `coverage` the coverage model's inputs when it is on (`C_0 = 0`; attention at step `i` reads
/// `C_{i−1}`, and `C_i` follows from its weights). Returns `[B·T, 3H]` as a [`Shared`] handle (see [`crate::kernels::shared_output`]): row `(b, i)` is
/// `[t_{i−1} | s_i]`, what the fused readout reads in place, adding its gradient into the handle, so that the
/// rows' gradient never enters candle's gradient store.
#[allow(clippy::too_many_arguments)]
pub fn decoder_sequence_fused<'a>(
    wp: impl Into<Input<'a>>,
    wz: Option<Input<'a>>,
    t0: &Tensor,
    ah: &Shared,
    annotations: &Shared,
    mask_bias: &Tensor,
    w: &DecoderWeights,
    gate: Option<((ZKind, f64), (ZKind, f64))>,
    coverage: Option<CoverageInputs>,
) -> Result<Shared> {
    let wp: Input = wp.into();
    let (rows, kh) = wp.tensor().dims2()?;
    let (b, h) = t0.dims2()?;
    let k = if w.u_ru.is_some() { 3 } else { 1 };
    let tl = if b > 0 { rows / b } else { 0 };
    let (b2, s, ad) = ah.tensor.dims3()?;
    let a2 = annotations.tensor.dim(2)?;
    let ok = kh == k * h
        && b2 == b
        && tl > 0
        && rows == b * tl
        && annotations.tensor.dims3()? == (b, s, 2 * h)
        && a2 == 2 * h
        && mask_bias.dims2()? == (b, s)
        && w.b_att.dims2()? == (h, ad)
        && w.v.elem_count() == ad
        && w.c.dims2()? == (2 * h, k * h)
        && w.u_ru
            .map_or(Ok(true), |x| x.dims2().map(|d| d == (h, 2 * h)))?
        && w.u.dims2()? == (h, h)
        && wz
            .as_ref()
            .map_or(Ok(true), |x| x.tensor().dims2().map(|d| d == (b * tl, h)))?
        && w.u_z.map_or(Ok(true), |x| x.dims2().map(|d| d == (h, h)))?
        && w.c_z
            .map_or(Ok(true), |x| x.dims2().map(|d| d == (2 * h, h)))?
        && (gate.is_some()
            || (wz.is_none() && w.u_z.is_none() && w.c_z.is_none() && w.z_pre.is_none()))
        && (gate.is_none()
            || wz.is_some()
            || w.u_z.is_some()
            || w.c_z.is_some()
            || w.z_pre.is_some())
        && (w.z_pre.is_none() || (wz.is_none() && w.u_z.is_none() && w.c_z.is_none()))
        && match &w.z_pre {
            None => true,
            Some(ZPre::Scalar { w, b }) => w.dims2()? == (h, 1) && b.elem_count() == 1,
            Some(ZPre::Static { theta }) => theta.elem_count() == h,
        }
        && match &w.cgru {
            None => true,
            Some(g) => {
                k == 3
                    && g.b.elem_count() == h
                    && g.u_ru.dims2()? == (h, 2 * h)
                    && g.u.dims2()? == (h, h)
            }
        };
    if !ok {
        candle_core::bail!("fused decoder sequence: shape mismatch");
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
    let op = DecoderSequence {
        wp: wp.into_shared()?,
        wz: wz.map(Input::into_shared).transpose()?,
        t0: sh(t0)?,
        ah: ah.clone(),
        ann: annotations.clone(),
        mask: mask_bias.contiguous()?,
        b_att: sh(w.b_att)?,
        v: sh(w.v)?,
        c: sh(w.c)?,
        u_ru: w.u_ru.map(sh).transpose()?,
        u: sh(w.u)?,
        u_z: w.u_z.map(sh).transpose()?,
        c_z: w.c_z.map(sh).transpose()?,
        paper: w.paper_form,
        z_pre: match &w.z_pre {
            None => None,
            Some(ZPre::Scalar { w, b }) => Some(ZPreOp::Scalar {
                w: sh(w)?,
                b: sh(b)?,
            }),
            Some(ZPre::Static { theta }) => Some(ZPreOp::Static { theta: sh(theta)? }),
        },
        gate,
        cov,
        cgru: match &w.cgru {
            None => None,
            Some(g) => Some(CgruOp {
                b: sh(g.b)?,
                u_ru: sh(g.u_ru)?,
                u: sh(g.u)?,
            }),
        },
        saved: Default::default(),
    };
    let mut tokens = vec![
        &op.wp.token,
        &op.t0.token,
        &op.ah.token,
        &op.ann.token,
        &op.b_att.token,
        &op.v.token,
        &op.c.token,
        &op.u.token,
    ];
    for x in [&op.u_ru, &op.wz, &op.u_z, &op.c_z].into_iter().flatten() {
        tokens.push(&x.token);
    }
    match &op.z_pre {
        Some(ZPreOp::Scalar { w, b }) => tokens.extend([&w.token, &b.token]),
        Some(ZPreOp::Static { theta }) => tokens.push(&theta.token),
        None => {}
    }
    if let Some(g) = &op.cgru {
        tokens.extend([&g.b.token, &g.u_ru.token, &g.u.token]);
    }
    if let Some(c) = &op.cov {
        tokens.extend([&c.v_cov.token, &c.pre.token]);
        for x in [&c.w_h, &c.p, &c.u, &c.u_ru].into_iter().flatten() {
            tokens.push(&x.token);
        }
    }
    // One graph input for all: the backward pass reaches every token through the concatenation.
    let bundle = Tensor::cat(&tokens, 0)?;
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
    gate: Option<((ZKind, f64), (ZKind, f64))>,
    cov: Option<CovOp>,
    cgru: Option<CgruOp>,
    saved: crate::kernels::SavedSlot,
}

/// The cGRU's values for one pass: the context GRU's bias, the word GRU's `U_ru` and `U`.
struct CgruView<'a, T> {
    b: &'a [T],
    u_ru: Oriented<'a, T>,
    u: Oriented<'a, T>,
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
}

/// `c·kind(z)` as `α + β z`: `(α, β)` (`β` is also the derivative in `z`).
#[inline(always)]
fn affine<T: Real>(k: ZKind, c: T) -> (T, T) {
    match k {
        ZKind::One => (c, T::zero()),
        ZKind::Z => (T::zero(), c),
        ZKind::OneMinusZ => (c, -c),
    }
}

/// Gate and mix for one row: `z = σ(Σ terms)`, the scales, `T∘t` and the pre-activations `T∘(W e) + S∘(C s)`
/// of the three blocks. (Each pass a plain loop over the row, so that it vectorises.)
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn gate_mix_row<T: Real>(
    terms: [Option<&[T]>; 3],
    t: &[T],
    wp: &[T],
    cp: &[T],
    kinds: (ZKind, T, ZKind, T),
    z: &mut [T],
    ts: &mut [T],
    pre: &mut [T],
) {
    let h = t.len();
    let ((sa, sb), (ta, tb)) = (affine(kinds.0, kinds.1), affine(kinds.2, kinds.3));
    let gated = terms.iter().any(|x| x.is_some());
    if gated {
        let z = &mut z[..h];
        let mut first = true;
        for x in terms.iter().flatten() {
            let x = &x[..h];
            if first {
                z.copy_from_slice(x);
                first = false;
            } else {
                for (a, &y) in z.iter_mut().zip(x) {
                    *a = *a + y;
                }
            }
        }
        for a in z.iter_mut() {
            *a = a.sigmoid_v();
        }
    }
    let zero = [T::zero(); 0];
    let zs: &[T] = if gated { &z[..h] } else { &zero };
    let (t, ts) = (&t[..h], &mut ts[..h]);
    if gated {
        for ((o, &x), &zj) in ts.iter_mut().zip(t).zip(zs) {
            *o = (ta + tb * zj) * x;
        }
    } else {
        for (o, &x) in ts.iter_mut().zip(t) {
            *o = ta * x;
        }
    }
    for blk in 0..pre.len() / h.max(1) {
        let r = blk * h..(blk + 1) * h;
        let (pre, wp, cp) = (&mut pre[r.clone()], &wp[r.clone()], &cp[r]);
        if gated {
            for (((o, &w), &c), &zj) in pre.iter_mut().zip(wp).zip(cp).zip(zs) {
                *o = (ta + tb * zj) * w + (sa + sb * zj) * c;
            }
        } else {
            for ((o, &w), &c) in pre.iter_mut().zip(wp).zip(cp) {
                *o = ta * w + sa * c;
            }
        }
    }
}
simd_dispatch!(gate_mix_row_d, gate_mix_row_avx, gate_mix_row, (terms: [Option<&[T]>; 3], t: &[T], wp: &[T], cp: &[T], kinds: (ZKind, T, ZKind, T), z: &mut [T], ts: &mut [T], pre: &mut [T]));

/// Backward through the mix and the gate: `∂(W e)` (`dwp`), `∂(C s)` (`dcp`), `∂t_{i−1}` through `T∘t`
/// (`dt`, overwritten) and `∂` of the gate's pre-activation (`dzp`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn bwd_mix_row<T: Real>(
    dpre: &[T],
    dts: &[T],
    t: &[T],
    wp: &[T],
    cp: &[T],
    z: &[T],
    kinds: (ZKind, T, ZKind, T),
    gated: bool,
    dwp: &mut [T],
    dcp: &mut [T],
    dt: &mut [T],
    dzp: &mut [T],
) {
    let h = t.len();
    let ((sa, sb), (ta, tb)) = (affine(kinds.0, kinds.1), affine(kinds.2, kinds.3));
    let (dts, t, dt) = (&dts[..h], &t[..h], &mut dt[..h]);
    if !gated {
        for (o, &d) in dt.iter_mut().zip(dts) {
            *o = d * ta;
        }
        for blk in 0..dpre.len() / h.max(1) {
            let r = blk * h..(blk + 1) * h;
            let (dpre, dwp, dcp) = (&dpre[r.clone()], &mut dwp[r.clone()], &mut dcp[r]);
            for ((&d, w), c) in dpre.iter().zip(dwp.iter_mut()).zip(dcp.iter_mut()) {
                *w = d * ta;
                *c = d * sa;
            }
        }
        return;
    }
    let (z, dzp) = (&z[..h], &mut dzp[..h]);
    // ∂z accumulates in `dzp` first: through T∘t, then through each block's mix.
    for ((((o, dz), &d), &x), &zj) in dt.iter_mut().zip(dzp.iter_mut()).zip(dts).zip(t).zip(z) {
        *o = d * (ta + tb * zj);
        *dz = d * x * tb;
    }
    for blk in 0..dpre.len() / h.max(1) {
        let r = blk * h..(blk + 1) * h;
        let (dpre, wp, cp) = (&dpre[r.clone()], &wp[r.clone()], &cp[r.clone()]);
        let (dwp, dcp) = (&mut dwp[r.clone()], &mut dcp[r]);
        for (((((&d, &w), &c), ow), oc), (dz, &zj)) in dpre
            .iter()
            .zip(wp)
            .zip(cp)
            .zip(dwp.iter_mut())
            .zip(dcp.iter_mut())
            .zip(dzp.iter_mut().zip(z))
        {
            *ow = d * (ta + tb * zj);
            *oc = d * (sa + sb * zj);
            *dz = *dz + d * (w * tb + c * sb);
        }
    }
    for (dz, &zj) in dzp.iter_mut().zip(z) {
        *dz = *dz * zj * (T::one() - zj);
    }
}
simd_dispatch!(bwd_mix_row_d, bwd_mix_row_avx, bwd_mix_row, (dpre: &[T], dts: &[T], t: &[T], wp: &[T], cp: &[T], z: &[T], kinds: (ZKind, T, ZKind, T), gated: bool, dwp: &mut [T], dcp: &mut [T], dt: &mut [T], dzp: &mut [T]));

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
    fn rows(&self) -> crate::coverage::CovRows<'_, T> {
        crate::coverage::CovRows {
            neural: self.neural,
            gated: self.gated,
            d: self.d,
            p: &self.p,
            u: &self.u,
            u_ru: &self.u_ru,
        }
    }
}

/// The vanilla unit's step for one row: `t = tanh(pre + t)` (`t` holding `U (T∘t_{i−1})` on entry).
#[inline(always)]
fn vanilla_row<T: Real>(pre: &[T], t: &mut [T]) {
    for (o, &p) in t.iter_mut().zip(pre) {
        *o = (*o + p).tanh_v();
    }
}
simd_dispatch!(vanilla_row_d, vanilla_row_avx, vanilla_row, (pre: &[T], t: &mut [T]));

/// Backward through [`vanilla_row`]: `dpre = ∂t ∘ (1 − t²)`.
#[inline(always)]
fn vanilla_grad_row<T: Real>(dt: &[T], t: &[T], dpre: &mut [T]) {
    for ((o, &g), &x) in dpre.iter_mut().zip(dt).zip(t) {
        *o = g * (T::one() - x * x);
    }
}
simd_dispatch!(vanilla_grad_row_d, vanilla_grad_row_avx, vanilla_grad_row, (dt: &[T], t: &[T], dpre: &mut [T]));

/// Paper form, vanilla: `t = tanh(pre + T∘(U t_{i−1}))` for one row (`rc` = `U t_{i−1}`, `sc` = `T`).
#[inline(always)]
fn paper_vanilla_row<T: Real>(pre: &[T], rc: &[T], sc: &[T], t: &mut [T]) {
    for (((o, &p), &c), &x) in t.iter_mut().zip(pre).zip(rc).zip(sc) {
        *o = (p + x * c).tanh_v();
    }
}
simd_dispatch!(paper_vanilla_row_d, paper_vanilla_row_avx, paper_vanilla_row, (pre: &[T], rc: &[T], sc: &[T], t: &mut [T]));

/// Paper form, GRU gates for one row: `[r | u] = σ(pre_ru + T∘(U_ru t))` (`hu` = `U_ru t`, `sc` = `T` over each
/// block) and `r∘t`.
#[inline(always)]
fn paper_gates_row<T: Real>(pre: &[T], hu: &[T], sc: &[T], t: &[T], ru: &mut [T], rh: &mut [T]) {
    let h = t.len();
    for blk in 0..2 {
        let r = blk * h..(blk + 1) * h;
        for (((o, &p), &c), &x) in ru[r.clone()]
            .iter_mut()
            .zip(&pre[r.clone()])
            .zip(&hu[r])
            .zip(sc)
        {
            *o = (p + x * c).sigmoid_v();
        }
    }
    for ((o, &rr), &x) in rh.iter_mut().zip(&ru[..h]).zip(t) {
        *o = rr * x;
    }
}
simd_dispatch!(paper_gates_row_d, paper_gates_row_avx, paper_gates_row, (pre: &[T], hu: &[T], sc: &[T], t: &[T], ru: &mut [T], rh: &mut [T]));

/// Paper form, GRU update for one row: `t~ = tanh(pre_c + T∘(U(r∘t)))` into `ht`, `t_i = t + u∘(t~ − t)`.
#[inline(always)]
fn paper_update_row<T: Real>(
    pre: &[T],
    rc: &[T],
    sc: &[T],
    ru: &[T],
    t: &[T],
    ht: &mut [T],
    out: &mut [T],
) {
    let h = t.len();
    for k in 0..h {
        let c = (pre[k] + sc[k] * rc[k]).tanh_v();
        ht[k] = c;
        out[k] = t[k] + ru[h + k] * (c - t[k]);
    }
}
simd_dispatch!(paper_update_row_d, paper_update_row_avx, paper_update_row, (pre: &[T], rc: &[T], sc: &[T], ru: &[T], t: &[T], ht: &mut [T], out: &mut [T]));

/// Backward through [`paper_vanilla_row`]: `∂pre`, `∂(U t)` = `T∘∂pre` and `∂T` for one row.
#[inline(always)]
fn paper_vanilla_grad_row<T: Real>(
    dt: &[T],
    t: &[T],
    rc: &[T],
    sc: &[T],
    dpre: &mut [T],
    drc: &mut [T],
    dsc: &mut [T],
) {
    for k in 0..t.len() {
        let d = dt[k] * (T::one() - t[k] * t[k]);
        dpre[k] = d;
        drc[k] = sc[k] * d;
        dsc[k] = d * rc[k];
    }
}
simd_dispatch!(paper_vanilla_grad_row_d, paper_vanilla_grad_row_avx, paper_vanilla_grad_row, (dt: &[T], t: &[T], rc: &[T], sc: &[T], dpre: &mut [T], drc: &mut [T], dsc: &mut [T]));

/// Backward through [`paper_update_row`] for one row from `dt` = `∂t_i`: the update gate's and the
/// candidate's `∂pre` (`dpre[H..3H]`), `∂(U(r∘t))` = `T∘∂`, `∂T` (written) and `∂t` through the
/// interpolation (written).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn paper_update_grad_row<T: Real>(
    dt: &[T],
    ru: &[T],
    ht: &[T],
    t: &[T],
    rc: &[T],
    sc: &[T],
    dpre: &mut [T],
    drc: &mut [T],
    dsc: &mut [T],
    dtp: &mut [T],
) {
    let h = t.len();
    for k in 0..h {
        let (u, c) = (ru[h + k], ht[k]);
        let dc = dt[k] * u * (T::one() - c * c);
        dpre[2 * h + k] = dc;
        drc[k] = sc[k] * dc;
        dsc[k] = dc * rc[k];
        dpre[h + k] = dt[k] * (c - t[k]) * u * (T::one() - u);
        dtp[k] = dt[k] * (T::one() - u);
    }
}
simd_dispatch!(paper_update_grad_row_d, paper_update_grad_row_avx, paper_update_grad_row, (dt: &[T], ru: &[T], ht: &[T], t: &[T], rc: &[T], sc: &[T], dpre: &mut [T], drc: &mut [T], dsc: &mut [T], dtp: &mut [T]));

/// Backward through [`paper_gates_row`] for one row from `drh` = `∂(r∘t)`: the reset gate's `∂pre`
/// (`dpre[..H]`; the update gate's is there already), `∂(U_ru t)` = `T∘∂pre_ru`, and adds into `∂T` and `∂t`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn paper_gates_grad_row<T: Real>(
    drh: &[T],
    ru: &[T],
    t: &[T],
    hu: &[T],
    sc: &[T],
    dpre: &mut [T],
    dhu: &mut [T],
    dsc: &mut [T],
    dtp: &mut [T],
) {
    let h = t.len();
    for k in 0..h {
        let r = ru[k];
        dpre[k] = drh[k] * t[k] * r * (T::one() - r);
        dtp[k] = dtp[k] + drh[k] * r;
    }
    for blk in 0..2 {
        for k in 0..h {
            let j = blk * h + k;
            dhu[j] = sc[k] * dpre[j];
            dsc[k] = dsc[k] + dpre[j] * hu[j];
        }
    }
}
simd_dispatch!(paper_gates_grad_row_d, paper_gates_grad_row_avx, paper_gates_grad_row, (drh: &[T], ru: &[T], t: &[T], hu: &[T], sc: &[T], dpre: &mut [T], dhu: &mut [T], dsc: &mut [T], dtp: &mut [T]));

/// The paper form's transition for one step over `B` rows of width `h`: from `pre` (the mix of the word and
/// context terms), the unscaled state `t` and the target scale `sc` = `T`, the next state into `t_next`;
/// `rc` receives `U(r∘t)` (GRU) or `U t` (vanilla) before its scale; `gru` is `Some(([U_ru t], [r | u],
/// r∘t, t~))` for the GRU's saved activations, `None` for the vanilla unit.
#[allow(clippy::type_complexity)]
fn paper_transition<T: Real>(
    (b, h): (usize, usize),
    (pre, t, sc): (&[T], &[T], &[T]),
    (u, u_ru): (&Oriented<T>, &Oriented<T>),
    gru: Option<(&mut [T], &mut [T], &mut [T], &mut [T])>,
    rc: &mut [T],
    t_next: &mut [T],
) {
    let bh = b * h;
    let Some((hu, ru, rh, cand)) = gru else {
        u.mul_into(b, rc, h, false, Mat::rows(t, h));
        let (tw, rc) = (RowsMut::new(t_next, h), &*rc);
        rows_par(b, bh, |r| unsafe {
            let rr = r * h..(r + 1) * h;
            paper_vanilla_row_d(&pre[rr.clone()], &rc[rr.clone()], &sc[rr], tw.row(r))
        });
        return;
    };
    let kh = 3 * h;
    u_ru.mul_into(b, hu, 2 * h, false, Mat::rows(t, h));
    {
        let (rw, rhw, hu) = (RowsMut::new(ru, 2 * h), RowsMut::new(rh, h), &*hu);
        rows_par(b, bh, |r| unsafe {
            paper_gates_row_d(
                &pre[r * kh..r * kh + 2 * h],
                &hu[r * 2 * h..(r + 1) * 2 * h],
                &sc[r * h..(r + 1) * h],
                &t[r * h..(r + 1) * h],
                rw.row(r),
                rhw.row(r),
            )
        });
    }
    u.mul_into(b, rc, h, false, Mat::rows(rh, h));
    let (cw, tw, rc, ru) = (RowsMut::new(cand, h), RowsMut::new(t_next, h), &*rc, &*ru);
    rows_par(b, bh, |r| unsafe {
        let rr = r * h..(r + 1) * h;
        paper_update_row_d(
            &pre[r * kh + 2 * h..(r + 1) * kh],
            &rc[rr.clone()],
            &sc[rr.clone()],
            &ru[r * 2 * h..(r + 1) * 2 * h],
            &t[rr],
            cw.row(r),
            tw.row(r),
        )
    });
}

/// Backward through [`paper_transition`] from `dt` = `∂t_next`: the pre-activations' gradient into `dpre`,
/// the products' own gradients into `drc` (and, GRU, the last slot of `gru`: `∂(U_ru t)`), `∂T` into `dsc`,
/// `∂t` through the transition into `dtp`; `drh` is scratch `[B, H]`. `gru` holds the forward pass's
/// `[r | u]`, `t~` and `U_ru t`.
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn paper_transition_backward<T: Real>(
    (b, h): (usize, usize),
    dt: &[T],
    (t, t_next): (&[T], &[T]),
    (rc, sc): (&[T], &[T]),
    (u, u_ru): (&Oriented<T>, &Oriented<T>),
    gru: Option<(&[T], &[T], &[T], &mut [T])>,
    (dpre, drc): (&mut [T], &mut [T]),
    (dsc, dtp, drh): (&mut [T], &mut [T], &mut [T]),
) {
    let bh = b * h;
    let Some((ru, cand, hu, dhu)) = gru else {
        {
            let (pw, cw, sw) = (
                RowsMut::new(dpre, h),
                RowsMut::new(drc, h),
                RowsMut::new(dsc, h),
            );
            rows_par(b, bh, |r| unsafe {
                let rr = r * h..(r + 1) * h;
                paper_vanilla_grad_row_d(
                    &dt[rr.clone()],
                    &t_next[rr.clone()],
                    &rc[rr.clone()],
                    &sc[rr],
                    pw.row(r),
                    cw.row(r),
                    sw.row(r),
                )
            });
        }
        u.mul_t_into(b, dtp, h, false, Mat::rows(drc, h));
        return;
    };
    let kh = 3 * h;
    {
        let (pw, cw, sw, tw) = (
            RowsMut::new(dpre, kh),
            RowsMut::new(drc, h),
            RowsMut::new(dsc, h),
            RowsMut::new(dtp, h),
        );
        rows_par(b, bh, |r| unsafe {
            let rr = r * h..(r + 1) * h;
            paper_update_grad_row_d(
                &dt[rr.clone()],
                &ru[r * 2 * h..(r + 1) * 2 * h],
                &cand[rr.clone()],
                &t[rr.clone()],
                &rc[rr.clone()],
                &sc[rr],
                pw.row(r),
                cw.row(r),
                sw.row(r),
                tw.row(r),
            )
        });
    }
    u.mul_t_into(b, drh, h, false, Mat::rows(drc, h));
    {
        let (pw, hw, sw, tw, drh) = (
            RowsMut::new(dpre, kh),
            RowsMut::new(dhu, 2 * h),
            RowsMut::new(dsc, h),
            RowsMut::new(dtp, h),
            &*drh,
        );
        rows_par(b, bh, |r| unsafe {
            let rr = r * h..(r + 1) * h;
            paper_gates_grad_row_d(
                &drh[rr.clone()],
                &ru[r * 2 * h..(r + 1) * 2 * h],
                &t[rr.clone()],
                &hu[r * 2 * h..(r + 1) * 2 * h],
                &sc[rr],
                pw.row(r),
                hw.row(r),
                sw.row(r),
                tw.row(r),
            )
        });
    }
    u_ru.mul_t_into(b, dtp, h, true, Mat::rows(dhu, 2 * h));
}

/// Sizes of one run.
#[derive(Clone, Copy)]
struct Dims {
    tl: usize,
    b: usize,
    h: usize,
    /// Blocks of the transition's inputs: 3 (GRU: `[r | u | t~]`) or 1 (vanilla).
    k: usize,
    s: usize,
    ad: usize,
}

impl DecoderSequence {
    fn dims(&self) -> Result<Dims> {
        let (rows, kh) = self.wp.tensor.dims2()?;
        let (b, h) = self.t0.tensor.dims2()?;
        let tl = rows / b.max(1);
        let (_, s, ad) = self.ah.tensor.dims3()?;
        Ok(Dims {
            tl,
            b,
            h,
            k: kh / h.max(1),
            s,
            ad,
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

    fn kinds<T: Real>(&self) -> (ZKind, T, ZKind, T) {
        match self.gate {
            Some(((ks, cs), (kt, ct))) => (ks, T::from_f64c(cs), kt, T::from_f64c(ct)),
            None => (ZKind::One, T::one(), ZKind::One, T::one()),
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

    fn forward<T: Real>(&self) -> Result<(CpuStorage, Shape)> {
        let Dims { tl, b, h, k, s, ad } = self.dims()?;
        // `h3`: the output rows `[t_{i−1} | s_i]`; `kh`: the transition's `k` input blocks.
        let (a2, h3, kh, w_ac) = (2 * h, 3 * h, k * h, s + 2 * h);
        let gru = k == 3;
        let n = tl - 1;
        let gated = self.gate.is_some();
        macro_rules! data {
            ($sh:expr) => {{
                let (g, l) = $sh.tensor.storage_and_layout();
                (g, l.clone())
            }};
        }
        let (g_wp, l_wp) = data!(self.wp);
        let wp = storage_slice::<T>(&g_wp, &l_wp)?;
        let (g_t0, l_t0) = data!(self.t0);
        let (g_ah, l_ah) = data!(self.ah);
        let ah = storage_slice::<T>(&g_ah, &l_ah)?;
        let (g_ann, l_ann) = data!(self.ann);
        let ann = storage_slice::<T>(&g_ann, &l_ann)?;
        // The products that share a left operand run as one GEMM: t [B | U_z], s [C | C_z].
        let (tw_v, wq, cw_v, wc) = self.stacked::<T>()?;
        let tw = Oriented::new(&tw_v, h, wq);
        let cw = Oriented::new(&cw_v, a2, wc);
        let (g_v, l_v) = data!(self.v);
        let v = storage_slice::<T>(&g_v, &l_v)?;
        let u_ru_v: Vec<T> = match &self.u_ru {
            Some(x) => crate::kernels::to_vec(&x.tensor)?,
            None => vec![],
        };
        let u_ru = Oriented::new(&u_ru_v, h, if gru { 2 * h } else { 0 });
        let (g_u, l_u) = data!(self.u);
        let u = Oriented::new(storage_slice::<T>(&g_u, &l_u)?, h, h);
        let wz_g = self.wz.as_ref().map(|x| data!(x));
        let wz = match &wz_g {
            Some((g, l)) => Some(storage_slice::<T>(g, l)?),
            None => None,
        };
        let (has_uz, has_cz) = (self.u_z.is_some(), self.c_z.is_some());
        let mask: Vec<T> = crate::kernels::to_vec(&self.mask)?;
        let kinds = self.kinds::<T>();
        let cd = self.cov_data::<T>()?;
        let cr = cd.as_ref().map(|c| c.rows());
        let (cdim, pw, kd, aw) = cr.as_ref().map_or((0, 0, 0, 0), |c| {
            (c.d, c.pre_width(), c.kd(), c.acts_width())
        });
        let wh_off = ad + if has_uz { h } else { 0 };
        let wb_off = wh_off + kd;
        let zc = self.z_const::<T>()?;
        let cgru_v = self.cgru_data::<T>()?;
        let cgru = cgru_v.as_ref().map(|[b, u_ru, u]| CgruView {
            b,
            u_ru: Oriented::new(u_ru, h, 2 * h),
            u: Oriented::new(u, h, h),
        });
        let bsd = b * s * cdim;
        let mut covs = crate::kernels::zeroed(tl * bsd);
        let mut cacts = crate::kernels::zeroed(n * b * s * aw);

        let mut tall = crate::kernels::zeroed(tl * b * h);
        tall[..b * h].copy_from_slice(storage_slice::<T>(&g_t0, &l_t0)?);
        let mut q = crate::kernels::zeroed(tl * b * wq);
        let mut actx = crate::kernels::zeroed(tl * b * w_ac);
        // Steps with a (gated) transition: all but the last, or all of them for the cGRU's context GRU.
        let nt = if cgru.is_some() { tl } else { n };
        let mut z = crate::kernels::zeroed(if gated { nt * b * h } else { 0 });
        let mut ts = crate::kernels::zeroed(nt * b * h);
        let mut cp = crate::kernels::zeroed(nt * b * wc);
        // GRU activations (none for the vanilla unit, whose activation is the next state itself).
        let gn = if gru { nt } else { 0 };
        let paper = self.paper;
        let ones = vec![T::one(); if paper { h } else { 0 }];
        let mut hus = crate::kernels::zeroed(if paper { gn * b * 2 * h } else { 0 });
        let mut rcs = crate::kernels::zeroed(if paper { nt * b * h } else { 0 });
        // cGRU: the context GRU's states, the word GRU's activations and its step's inputs; the context GRU
        // has no word term (a zero row in the mix).
        let cn = if cgru.is_some() { n } else { 0 };
        let mut sall = crate::kernels::zeroed(if cgru.is_some() { tl * b * h } else { 0 });
        let mut wru = crate::kernels::zeroed(cn * b * 2 * h);
        let mut wrh = crate::kernels::zeroed(cn * b * h);
        let mut wht = crate::kernels::zeroed(cn * b * h);
        let mut pre_w = vec![T::zero(); if cgru.is_some() { b * kh } else { 0 }];
        let wp_zero = vec![T::zero(); if cgru.is_some() { kh } else { 0 }];
        let mut ru = crate::kernels::zeroed(gn * b * 2 * h);
        let mut rts = crate::kernels::zeroed(gn * b * h);
        let mut cc = crate::kernels::zeroed(gn * b * h);
        let mut pre = vec![T::zero(); b * kh];
        let mut hu = vec![T::zero(); b * 2 * h];
        let mut rc = vec![T::zero(); b * h];
        let (bh, bkh, bh2) = (b * h, b * kh, b * 2 * h);
        for i in 0..tl {
            if let (Some(g), true) = (&cgru, i > 0) {
                // cGRU: the word GRU t'_i = GRU_word(e(y_{i−1}), t_{i−1}).
                for r in 0..b {
                    pre_w[r * kh..(r + 1) * kh]
                        .copy_from_slice(&wp[(r * tl + i - 1) * kh..(r * tl + i) * kh]);
                }
                let state = &mut tall[i * bh..(i + 1) * bh];
                state.copy_from_slice(&sall[(i - 1) * bh..i * bh]);
                let acts = GruActs {
                    ru: &mut wru[(i - 1) * bh2..i * bh2],
                    rh: &mut wrh[(i - 1) * bh..i * bh],
                    ht: &mut wht[(i - 1) * bh..i * bh],
                };
                crate::profile::timed("  decoder fwd: word GRU step", || {
                    gru_step_forward(
                        h,
                        &pre_w,
                        state,
                        None,
                        acts,
                        (&mut hu, &mut rc),
                        &g.u_ru,
                        &g.u,
                    )
                });
            }
            // Attention from t_{i−1} (cGRU: t'_i).
            let (t_done, t_rest) = tall.split_at_mut((i + 1) * bh);
            let t_i = &t_done[i * bh..];
            let q_i = &mut q[i * b * wq..(i + 1) * b * wq];
            crate::profile::timed("  decoder fwd: query GEMM", || {
                tw.mul_into(b, q_i, wq, false, Mat::rows(t_i, h))
            });
            let actx_i = &mut actx[i * b * w_ac..(i + 1) * b * w_ac];
            {
                let out = RowsMut::new(actx_i, w_ac);
                let q_i = &*q_i;
                let mask = &mask;
                // Coverage: C_{i−1} read, C_i (and the gated update's activations) written by each row.
                let (c_done, c_rest) = covs.split_at_mut((i + 1) * bsd);
                let c_i = &c_done[i * bsd..];
                let c_next =
                    RowsMut::new(if i < n { &mut c_rest[..bsd] } else { &mut [] }, s * cdim);
                let acts_i = RowsMut::new(
                    if i < n {
                        &mut cacts[i * b * s * aw..(i + 1) * b * s * aw]
                    } else {
                        &mut []
                    },
                    s * aw,
                );
                let (cr, cd) = (&cr, &cd);
                let _t = crate::profile::Scope::new("  decoder fwd: attention rows");
                rows_par(b, b * s * ad, |r| {
                    let mut e = vec![T::zero(); s];
                    let ah_r = &ah[r * s * ad..(r + 1) * s * ad];
                    let q_r = &q_i[r * wq..(r + 1) * wq];
                    match cd {
                        Some(cd) => crate::coverage::scores_row(
                            ah_r,
                            &c_i[r * s * cdim..(r + 1) * s * cdim],
                            &cd.v_cov,
                            &q_r[..ad],
                            v,
                            &mut e,
                        ),
                        None => crate::attention::score_rows_d(ah_r, &q_r[..ad], v, &mut e),
                    }
                    for (x, m) in e.iter_mut().zip(&mask[r * s..(r + 1) * s]) {
                        *x = *x + *m;
                    }
                    // SAFETY: row r of each buffer is written by this task only.
                    let o = unsafe { out.row(r) };
                    crate::attention::softmax_context_row_d(
                        &e,
                        &ann[r * s * a2..(r + 1) * s * a2],
                        o,
                    );
                    if let (Some(cr), Some(cd), true) = (cr, cd, i < n) {
                        cr.update(
                            &c_i[r * s * cdim..(r + 1) * s * cdim],
                            &o[..s],
                            &cd.pre[r * s * pw..(r + 1) * s * pw],
                            &q_r[wh_off..wh_off + kd],
                            unsafe { c_next.row(r) },
                            unsafe { acts_i.row(r) },
                        );
                    }
                });
            }
            if i == nt {
                break;
            }
            let ctx_i = Mat {
                data: &actx_i[s..],
                rs: w_ac,
                cs: 1,
            };
            let cp_i = &mut cp[i * b * wc..(i + 1) * b * wc];
            crate::profile::timed("  decoder fwd: context GEMM", || {
                cw.mul_into(b, cp_i, wc, false, ctx_i)
            });
            if let Some(g) = &cgru {
                // The context GRU's candidate bias, with the context's term.
                for row in cp_i.chunks_exact_mut(wc) {
                    for (x, &bb) in row[2 * h..3 * h].iter_mut().zip(g.b.iter()) {
                        *x = *x + bb;
                    }
                }
            }
            let (z_i, ts_i) = (
                if gated {
                    &mut z[i * bh..(i + 1) * bh]
                } else {
                    &mut z[..]
                },
                &mut ts[i * bh..(i + 1) * bh],
            );
            {
                let (zw, tsw, prew) = (
                    RowsMut::new(z_i, if gated { h } else { 0 }),
                    RowsMut::new(ts_i, h),
                    RowsMut::new(&mut pre, kh),
                );
                let (wz, q_i, cp_i) = (wz, &q[i * b * wq..(i + 1) * b * wq], &*cp_i);
                let _t = crate::profile::Scope::new("  decoder fwd: gate rows");
                let zc = &zc;
                rows_par(b, bkh, |r| {
                    // Gating scalar: `w_βᵀ t + b_β` repeated over the row; static: θ.
                    let scalar_term;
                    let zc_term: Option<&[T]> = match zc {
                        ZConst::None => None,
                        ZConst::Static(theta) => Some(theta),
                        ZConst::Scalar(bb) => {
                            scalar_term = vec![q_i[r * wq + wb_off] + *bb; h];
                            Some(&scalar_term)
                        }
                    };
                    let terms = [
                        wz.map(|x| &x[(r * tl + i) * h..(r * tl + i + 1) * h])
                            .or(zc_term),
                        has_uz.then(|| &q_i[r * wq + ad..r * wq + ad + h]),
                        has_cz.then(|| &cp_i[r * wc + kh..(r + 1) * wc]),
                    ];
                    // SAFETY: row r of each buffer is written by this task only.
                    unsafe {
                        gate_mix_row_d(
                            terms,
                            // (Paper form: the scale T itself into `ts`.)
                            if paper {
                                &ones
                            } else {
                                &t_i[r * h..(r + 1) * h]
                            },
                            if cgru.is_some() {
                                &wp_zero
                            } else {
                                &wp[(r * tl + i) * kh..(r * tl + i + 1) * kh]
                            },
                            &cp_i[r * wc..r * wc + kh],
                            kinds,
                            zw.row(r),
                            tsw.row(r),
                            prew.row(r),
                        )
                    }
                });
            }
            let ts_i = &*ts_i;
            let t_next = if cgru.is_some() {
                &mut sall[i * bh..(i + 1) * bh]
            } else {
                &mut t_rest[..bh]
            };
            if paper {
                // t_i from the unscaled state; the products scaled by T (= ts_i) after them.
                let gru_acts = gru.then(|| {
                    (
                        &mut hus[i * bh2..(i + 1) * bh2],
                        &mut ru[i * bh2..(i + 1) * bh2],
                        &mut rts[i * bh..(i + 1) * bh],
                        &mut cc[i * bh..(i + 1) * bh],
                    )
                });
                crate::profile::timed("  decoder fwd: GRU step", || {
                    paper_transition(
                        (b, h),
                        (&pre, &t_done[i * bh..], ts_i),
                        (&u, &u_ru),
                        gru_acts,
                        &mut rcs[i * bh..(i + 1) * bh],
                        t_next,
                    )
                });
                continue;
            }
            if !gru {
                // The vanilla unit: t_i = tanh(pre + U (T∘t)).
                crate::profile::timed("  decoder fwd: GRU step", || {
                    u.mul_into(b, t_next, h, false, Mat::rows(ts_i, h));
                    let pre = &pre;
                    let tw = RowsMut::new(t_next, h);
                    rows_par(b, bh, |r| unsafe {
                        vanilla_row_d(&pre[r * h..(r + 1) * h], tw.row(r))
                    });
                });
                continue;
            }
            // The GRU step from the scaled state T∘t: t_i = T∘t + u∘(t~ − T∘t).
            t_next.copy_from_slice(ts_i);
            let acts = GruActs {
                ru: &mut ru[i * bh2..(i + 1) * bh2],
                rh: &mut rts[i * bh..(i + 1) * bh],
                ht: &mut cc[i * bh..(i + 1) * bh],
            };
            crate::profile::timed("  decoder fwd: GRU step", || {
                gru_step_forward(h, &pre, t_next, None, acts, (&mut hu, &mut rc), &u_ru, &u)
            });
        }
        // The readout's input, batch-major: [t_{i−1} | s_i] (cGRU: [t_i | s_i]).
        let mut out = crate::kernels::zeroed(b * tl * h3);
        {
            use rayon::prelude::*;
            let states = if cgru.is_some() { &sall } else { &tall };
            out.par_chunks_mut(h3).enumerate().for_each(|(row, o)| {
                let (r, i) = (row / tl, row % tl);
                o[..h].copy_from_slice(&states[(i * b + r) * h..(i * b + r + 1) * h]);
                o[h..].copy_from_slice(&actx[(i * b + r) * w_ac + s..(i * b + r + 1) * w_ac]);
            });
        }
        drop((tw, cw));
        *self.saved.lock().expect("saved activations") = Some(Box::new(Saved {
            tall,
            q,
            actx,
            z,
            ts,
            cp,
            ru,
            rts,
            c: cc,
            tw: tw_v,
            wq,
            cw: cw_v,
            wc,
            covs,
            cacts,
            hus,
            rcs,
            sall,
            wru,
            wrh,
            wht,
        }));
        Ok((T::to_cpu_storage_owned(out), Shape::from((b * tl, h3))))
    }

    fn backward<T: Real>(&self, grad: &Tensor) -> Result<()> {
        let Dims { tl, b, h, k, s, ad } = self.dims()?;
        let (a2, h3, kh, w_ac) = (2 * h, 3 * h, k * h, s + 2 * h);
        let gru = k == 3;
        let n = tl - 1;
        let gated = self.gate.is_some();
        let Saved {
            tall,
            q,
            actx,
            z,
            ts,
            cp,
            ru,
            rts,
            c: cc,
            tw: tw_v,
            wq,
            cw: cw_v,
            wc,
            covs,
            cacts,
            hus,
            rcs,
            sall,
            wru,
            wrh,
            wht,
        } = crate::kernels::take_saved::<Saved<T>>(&self.saved, "fused decoder")?;
        let cgru_v = self.cgru_data::<T>()?;
        let cgru = cgru_v.as_ref().map(|[b, u_ru, u]| CgruView {
            b,
            u_ru: Oriented::new(u_ru, h, 2 * h),
            u: Oriented::new(u, h, h),
        });
        let nt = if cgru.is_some() { tl } else { n };
        let paper = self.paper;
        let ones = vec![T::one(); if paper { h } else { 0 }];
        // Paper form: ∂ of the products before their scale, per step (for the weights' gradients), and ∂t_i
        // through the transition.
        let mut dhus = crate::kernels::zeroed(if paper && gru { nt * b * 2 * h } else { 0 });
        let mut drcs = crate::kernels::zeroed(if paper { nt * b * h } else { 0 });
        // cGRU: the word GRU's ∂pre per step (for its weights' gradients), its ∂t_i, the mix's ∂(word term)
        // (discarded: the context GRU has none) and the zero word term.
        let cn = if cgru.is_some() { n } else { 0 };
        let mut dpw_all = crate::kernels::zeroed(cn * b * kh);
        let mut dh_w = vec![T::zero(); if cgru.is_some() { b * h } else { 0 }];
        let mut dwp_scratch = vec![T::zero(); if cgru.is_some() { b * kh } else { 0 }];
        let wp_zero = vec![T::zero(); if cgru.is_some() { kh } else { 0 }];
        let mut dtp = vec![T::zero(); if paper { b * h } else { 0 }];
        let grad = grad.contiguous()?;
        let (g_st, g_l) = grad.storage_and_layout();
        let g = storage_slice::<T>(&g_st, g_l)?; // [B·T, 3H]
        let vec_of = |x: &Shared| crate::kernels::to_vec::<T>(&x.tensor);
        let (wp_st, wp_l) = self.wp.tensor.storage_and_layout();
        let wp = storage_slice::<T>(&wp_st, wp_l)?;
        let v = vec_of(&self.v)?;
        let u_ru_v = match &self.u_ru {
            Some(x) => vec_of(x)?,
            None => vec![],
        };
        let u_v = vec_of(&self.u)?;
        let tw = Oriented::new(&tw_v, h, wq);
        let cw = Oriented::new(&cw_v, a2, wc);
        let u_ru = Oriented::new(&u_ru_v, h, if gru { 2 * h } else { 0 });
        let u = Oriented::new(&u_v, h, h);
        let (has_uz, has_cz) = (self.u_z.is_some(), self.c_z.is_some());
        let kinds = self.kinds::<T>();
        let (bh, bkh) = (b * h, b * kh);
        let cd = self.cov_data::<T>()?;
        let cr = cd.as_ref().map(|c| c.rows());
        let (cdim, pw, kd, aw) = cr.as_ref().map_or((0, 0, 0, 0), |c| {
            (c.d, c.pre_width(), c.kd(), c.acts_width())
        });
        let wh_off = ad + if has_uz { h } else { 0 };
        let wb_off = wh_off + kd;
        let mut db_beta = T::zero();
        let mut dtheta = vec![
            T::zero();
            if matches!(self.z_pre, Some(ZPreOp::Static { .. })) {
                h
            } else {
                0
            }
        ];
        let bsd = b * s * cdim;
        // Coverage: ∂C_i carried from step i + 1 and ∂C_{i−1} formed at step i; per-sentence sums of the
        // coverage weights' gradients.
        let mut dcov = vec![T::zero(); bsd];
        let mut dcov_prev = vec![T::zero(); bsd];
        let mut dpre_cov = vec![T::zero(); b * s * pw];
        let mut dvcov_rows = vec![T::zero(); b * cdim * ad];
        let mut dp_rows = vec![T::zero(); b * kd];
        let (uw, uruw) = if cd.as_ref().is_some_and(|c| c.neural) {
            (
                cdim * cdim,
                if cr.as_ref().is_some_and(|c| c.gated) {
                    2 * cdim * cdim
                } else {
                    0
                },
            )
        } else {
            (0, 0)
        };
        let mut du_rows = vec![T::zero(); b * uw];
        let mut duru_rows = vec![T::zero(); b * uruw];

        let mut dwp = crate::kernels::zeroed(tl * bkh);
        let mut dzp = crate::kernels::zeroed(if gated { tl * bh } else { 0 });
        let mut dcp = crate::kernels::zeroed(nt * b * wc);
        let mut dpre = crate::kernels::zeroed(nt * bkh);
        let mut dq = crate::kernels::zeroed(tl * b * wq);
        let mut dv_rows = vec![T::zero(); b * ad];
        let mut dt = vec![T::zero(); bh]; // ∂t_i carried from step i + 1
        let mut dts = vec![T::zero(); bh];
        let mut drts = vec![T::zero(); bh];
        // ∂s_i of every step, time-major: the annotations' gradient is formed from them after the loop.
        let mut dctx_all = crate::kernels::zeroed(tl * b * a2);
        let mut dt_prev = vec![T::zero(); bh];
        for i in (0..tl).rev() {
            let dctx = &mut dctx_all[i * b * a2..(i + 1) * b * a2];
            let t_i = &tall[i * bh..(i + 1) * bh];
            // The readout's gradients for [t_{i−1} | s_i].
            for r in 0..b {
                let gr = &g[(r * tl + i) * h3..(r * tl + i + 1) * h3];
                dt_prev[r * h..(r + 1) * h].copy_from_slice(&gr[..h]);
                dctx[r * a2..(r + 1) * a2].copy_from_slice(&gr[h..]);
            }
            if let Some(g) = &cgru {
                // cGRU: the readout's gradient is t_i's (the context GRU's state); before the last step
                // the word GRU t'_{i+1} = GRU_word(e(y_i), t_i) adds its share, from ∂t'_{i+1} in `dt`.
                if i < n {
                    let dpw_i = &mut dpw_all[i * bkh..(i + 1) * bkh];
                    dh_w.fill(T::zero());
                    let step = GruStep {
                        h,
                        ru: &wru[i * 2 * bh..(i + 1) * 2 * bh],
                        ht: &wht[i * bh..(i + 1) * bh],
                        hp: &sall[i * bh..(i + 1) * bh],
                        mask: None,
                    };
                    crate::profile::timed("  decoder bwd: word GRU step", || {
                        step.backward(&dt, &mut dh_w, dpw_i, &mut drts, &g.u, &g.u_ru)
                    });
                    for (a, &x) in dt_prev.iter_mut().zip(&dh_w) {
                        *a = *a + x;
                    }
                    for r in 0..b {
                        dwp[(r * tl + i) * kh..(r * tl + i + 1) * kh]
                            .copy_from_slice(&dpw_i[r * kh..(r + 1) * kh]);
                    }
                }
                // ∂t_i is the context GRU's output gradient; ∂t'_i collects in `dt_prev` below.
                dt.copy_from_slice(&dt_prev);
                dt_prev.fill(T::zero());
            }
            if i < nt {
                let dpre_i = &mut dpre[i * bkh..(i + 1) * bkh];
                if paper {
                    // `dts` becomes ∂T (the scale), `dtp` ∂t_i through the transition.
                    let gru_acts = gru.then(|| {
                        (
                            &ru[i * 2 * bh..(i + 1) * 2 * bh],
                            &cc[i * bh..(i + 1) * bh],
                            &hus[i * 2 * bh..(i + 1) * 2 * bh],
                            &mut dhus[i * 2 * bh..(i + 1) * 2 * bh],
                        )
                    });
                    crate::profile::timed("  decoder bwd: GRU step", || {
                        paper_transition_backward(
                            (b, h),
                            &dt,
                            (
                                t_i,
                                if cgru.is_some() {
                                    &sall[i * bh..(i + 1) * bh]
                                } else {
                                    &tall[(i + 1) * bh..(i + 2) * bh]
                                },
                            ),
                            (&rcs[i * bh..(i + 1) * bh], &ts[i * bh..(i + 1) * bh]),
                            (&u, &u_ru),
                            gru_acts,
                            (dpre_i, &mut drcs[i * bh..(i + 1) * bh]),
                            (&mut dts, &mut dtp, &mut drts),
                        )
                    });
                } else if gru {
                    let (ru_i, ts_i, cc_i) = (
                        &ru[i * 2 * bh..(i + 1) * 2 * bh],
                        &ts[i * bh..(i + 1) * bh],
                        &cc[i * bh..(i + 1) * bh],
                    );
                    // The GRU step from the scaled state T∘t: `dts` becomes ∂(T∘t).
                    dts.fill(T::zero());
                    let step = GruStep {
                        h,
                        ru: ru_i,
                        ht: cc_i,
                        hp: ts_i,
                        mask: None,
                    };
                    crate::profile::timed("  decoder bwd: GRU step", || {
                        step.backward(&dt, &mut dts, dpre_i, &mut drts, &u, &u_ru)
                    });
                } else {
                    // The vanilla unit t_{i+1} = tanh(pre + U (T∘t)): ∂pre, then ∂(T∘t) = ∂pre Uᵀ.
                    let t_next = &tall[(i + 1) * bh..(i + 2) * bh];
                    crate::profile::timed("  decoder bwd: GRU step", || {
                        {
                            let (dt, dw) = (&dt, RowsMut::new(dpre_i, h));
                            rows_par(b, bh, |r| unsafe {
                                vanilla_grad_row_d(
                                    &dt[r * h..(r + 1) * h],
                                    &t_next[r * h..(r + 1) * h],
                                    dw.row(r),
                                )
                            });
                        }
                        u.mul_t_into(b, &mut dts, h, false, Mat::rows(dpre_i, h));
                    });
                }
                // Mix and gate; ∂t_{i−1} through T∘t is written into `dt` (free now).
                let dcp_i = &mut dcp[i * b * wc..(i + 1) * b * wc];
                {
                    let cg = cgru.is_some();
                    let (dww, dcw, dtw, dzw) = (
                        RowsMut::new(if cg { &mut dwp_scratch } else { &mut dwp }, kh),
                        RowsMut::new(dcp_i, wc),
                        RowsMut::new(&mut dt, h),
                        RowsMut::new(&mut dzp, if gated { h } else { 0 }),
                    );
                    let (dpre_i, dts) = (&*dpre_i, &dts);
                    let (wp, cp_i) = (&wp, &cp[i * b * wc..(i + 1) * b * wc]);
                    let z_i = if gated {
                        &z[i * bh..(i + 1) * bh]
                    } else {
                        &z[..]
                    };
                    let _t = crate::profile::Scope::new("  decoder bwd: gate rows");
                    rows_par(b, bkh, |r| unsafe {
                        bwd_mix_row_d(
                            &dpre_i[r * kh..(r + 1) * kh],
                            &dts[r * h..(r + 1) * h],
                            // (Paper form: the scale's ∂ into the gate; ∂t is the transition's.)
                            if paper {
                                &ones
                            } else {
                                &t_i[r * h..(r + 1) * h]
                            },
                            if cg {
                                &wp_zero
                            } else {
                                &wp[(r * tl + i) * kh..(r * tl + i + 1) * kh]
                            },
                            &cp_i[r * wc..r * wc + kh],
                            if gated { &z_i[r * h..(r + 1) * h] } else { z_i },
                            kinds,
                            gated,
                            dww.row(if cg { r } else { r * tl + i }),
                            &mut dcw.row(r)[..kh],
                            dtw.row(r),
                            dzw.row(r * tl + i),
                        )
                    });
                }
                if paper {
                    dt.copy_from_slice(&dtp);
                }
                for (a, x) in dt_prev.iter_mut().zip(&dt) {
                    *a = *a + *x;
                }
                // ∂ of the gate's pre-activation next to ∂(C s) and ∂(B t) for the stacked products.
                if gated {
                    for r in 0..b {
                        let d = &dzp[(r * tl + i) * h..(r * tl + i + 1) * h];
                        match &self.z_pre {
                            // β's pre-activation is every element's: its gradient is the row's sum.
                            Some(ZPreOp::Scalar { .. }) => {
                                let g = d.iter().fold(T::zero(), |a, &x| a + x);
                                dq[(i * b + r) * wq + wb_off] = g;
                                db_beta = db_beta + g;
                            }
                            Some(ZPreOp::Static { .. }) => {
                                for (a, &x) in dtheta.iter_mut().zip(d) {
                                    *a = *a + x;
                                }
                            }
                            None => {}
                        }
                        if has_cz {
                            dcp_i[r * wc + kh..(r + 1) * wc].copy_from_slice(d);
                        }
                        if has_uz {
                            dq[(i * b + r) * wq + ad..(i * b + r) * wq + ad + h].copy_from_slice(d);
                        }
                    }
                }
                let dcp_i = &*dcp_i;
                crate::profile::timed("  decoder bwd: context GEMM", || {
                    cw.mul_t_into(b, dctx, a2, true, Mat::rows(dcp_i, wc))
                });
            }
            // Attention backward: ∂s_i → ∂e → ∂(A h), ∂(B t), ∂v (∂h from all steps after the loop).
            let actx_i = &actx[i * b * w_ac..(i + 1) * b * w_ac];
            let q_i = &q[i * b * wq..(i + 1) * b * wq];
            let dq_i = &mut dq[i * b * wq..(i + 1) * b * wq];
            {
                let dqw = RowsMut::new(dq_i, wq);
                let dvw = RowsMut::new(&mut dv_rows, ad);
                let dctx = &*dctx;
                let v = &v;
                // Coverage: each row's ∂C_{i−1}, ∂(1/Φ or h W_c) and per-sentence weight gradients.
                let c_i = &covs[i * bsd..(i + 1) * bsd];
                let c_next = if i < n {
                    &covs[(i + 1) * bsd..(i + 2) * bsd]
                } else {
                    &[]
                };
                let acts_i = if i < n {
                    &cacts[i * b * s * aw..(i + 1) * b * s * aw]
                } else {
                    &[]
                };
                let dcov = &dcov;
                let dcw = RowsMut::new(&mut dcov_prev, s * cdim);
                let dprew = RowsMut::new(&mut dpre_cov, s * pw);
                let dvcw = RowsMut::new(&mut dvcov_rows, cdim * ad);
                let dpw = RowsMut::new(&mut dp_rows, kd);
                let duw = RowsMut::new(&mut du_rows, uw);
                let duruw = RowsMut::new(&mut duru_rows, uruw);
                let (cr, cd) = (&cr, &cd);
                let _t = crate::profile::Scope::new("  decoder bwd: attention rows");
                self.ah.with_slice::<T, _>(|ah| {
                    self.ann.with_slice::<T, _>(|ann| {
                        self.ah.accumulate::<T>(|d_ah| {
                            let dahw = RowsMut::new(d_ah, s * ad);
                            rows_par(b, b * s * ad, |r| unsafe {
                                let mut de = vec![T::zero(); s];
                                let alpha = &actx_i[r * w_ac..r * w_ac + s];
                                crate::attention::context_score_grad_row_d(
                                    alpha,
                                    &ann[r * s * a2..(r + 1) * s * a2],
                                    &dctx[r * a2..(r + 1) * a2],
                                    &mut de,
                                );
                                let dq_row = dqw.row(r);
                                let ah_r = &ah[r * s * ad..(r + 1) * s * ad];
                                let q_r = &q_i[r * wq..r * wq + ad];
                                let (Some(cr), Some(cd)) = (cr, cd) else {
                                    let dq_r = &mut dq_row[..ad];
                                    dq_r.fill(T::zero());
                                    crate::attention::score_grad_rows_d(
                                        ah_r,
                                        q_r,
                                        v,
                                        &de,
                                        dahw.row(r),
                                        dq_r,
                                        dvw.row(r),
                                        true,
                                    );
                                    return;
                                };
                                let sc = s * cdim;
                                let c_r = &c_i[r * sc..(r + 1) * sc];
                                let dc_r = dcw.row(r);
                                if i < n {
                                    // Back through C_i's update: ∂C_{i−1}, and ∂α_i joins the softmax's.
                                    let mut dalpha = vec![T::zero(); s];
                                    cr.update_grad(
                                        (
                                            c_r,
                                            alpha,
                                            &cd.pre[r * s * pw..(r + 1) * s * pw],
                                            &c_next[r * sc..(r + 1) * sc],
                                            &acts_i[r * s * aw..(r + 1) * s * aw],
                                        ),
                                        &dcov[r * sc..(r + 1) * sc],
                                        dc_r,
                                        &mut dalpha,
                                        dprew.row(r),
                                        &mut dq_row[wh_off..wh_off + kd],
                                        (dpw.row(r), duw.row(r), duruw.row(r)),
                                    );
                                    let total = alpha
                                        .iter()
                                        .zip(&dalpha)
                                        .fold(T::zero(), |t, (&a, &x)| t + a * x);
                                    for ((g, &a), &x) in de.iter_mut().zip(alpha).zip(&dalpha) {
                                        *g = *g + a * (x - total);
                                    }
                                } else {
                                    dc_r.fill(T::zero());
                                }
                                // The scores with the coverage term: ∂(A h), ∂(B t), ∂v, ∂C_{i−1}, ∂V_cov.
                                let dq_r = &mut dq_row[..ad];
                                dq_r.fill(T::zero());
                                crate::coverage::scores_grad_row(
                                    ah_r,
                                    c_r,
                                    &cd.v_cov,
                                    q_r,
                                    v,
                                    &de,
                                    dahw.row(r),
                                    dq_r,
                                    dvw.row(r),
                                    dc_r,
                                    dvcw.row(r),
                                );
                            });
                        });
                        Ok(())
                    })
                })?;
            }
            std::mem::swap(&mut dcov, &mut dcov_prev);
            let dq_i = &*dq_i;
            crate::profile::timed("  decoder bwd: query GEMM", || {
                tw.mul_t_into(b, &mut dt_prev, h, true, Mat::rows(dq_i, wq))
            });
            std::mem::swap(&mut dt, &mut dt_prev);
        }
        // The annotations' gradient from every step's context, per sentence: ∂h_r += α_rᵀ ∂S_r with α_r
        // `[T, S]` and ∂S_r `[T, 2H]` read in place from the time-major rows.
        {
            let _t = crate::profile::Scope::new("  decoder bwd: annotation gradients");
            self.ann.accumulate::<T>(|d_ann| {
                use rayon::prelude::*;
                d_ann.par_chunks_mut(s * a2).enumerate().for_each(|(r, d)| {
                    crate::kernels::serial(|| {
                        crate::kernels::gemm_into(
                            s,
                            a2,
                            tl,
                            d,
                            a2,
                            true,
                            Mat {
                                data: &actx[r * w_ac..],
                                rs: 1,
                                cs: b * w_ac,
                            },
                            Mat {
                                data: &dctx_all[r * a2..],
                                rs: b * a2,
                                cs: 1,
                            },
                        )
                    })
                });
            });
        }
        // `dt` is ∂t_0 now. Inputs' gradients, and each weight's as one GEMM over all steps.
        let _t = crate::profile::Scope::new("  decoder bwd: weight gradients");
        self.t0.add_grad(dt);
        self.wp.add_grad(dwp);
        if let Some(wz) = &self.wz {
            wz.add_grad(dzp);
        }
        let mut dv = vec![T::zero(); ad];
        for row in dv_rows.chunks(ad) {
            for (a, x) in dv.iter_mut().zip(row) {
                *a = *a + *x;
            }
        }
        self.v.add_grad(dv);
        if let Some(c) = &self.cov {
            let sum_rows = |rows: &[T], w: usize| -> Vec<T> {
                let mut out = vec![T::zero(); w];
                for row in rows.chunks(w.max(1)) {
                    for (a, &x) in out.iter_mut().zip(row) {
                        *a = *a + x;
                    }
                }
                out
            };
            c.v_cov.add_grad(sum_rows(&dvcov_rows, cdim * ad));
            if let (Some(nf), Some(cd)) = (c.fertility, &cd) {
                // ∂(1/(N σ(x)))/∂x = −(1 − σ)/(N σ).
                let nf = T::from_f64c(nf);
                for (g, &x) in dpre_cov.iter_mut().zip(&cd.pre_in) {
                    let sg = x.sigmoid_v();
                    *g = -*g * (T::one() - sg) / (nf * sg);
                }
            }
            c.pre.add_grad(dpre_cov);
            if let Some(p) = &c.p {
                p.add_grad(sum_rows(&dp_rows, kd));
            }
            if let Some(u) = &c.u {
                u.add_grad(sum_rows(&du_rows, uw));
            }
            if let Some(u_ru) = &c.u_ru {
                u_ru.add_grad(sum_rows(&duru_rows, uruw));
            }
            if let Some(w_h) = &c.w_h {
                w_h.add_grad(crate::kernels::product::<T>(
                    h,
                    kd,
                    tl * b,
                    Mat::t(&tall, h),
                    Mat {
                        data: dq.get(wh_off..).unwrap_or(&[]),
                        rs: wq,
                        cs: 1,
                    },
                ));
            }
        }
        match &self.z_pre {
            Some(ZPreOp::Scalar { w, b: bias }) => {
                w.add_grad(crate::kernels::product::<T>(
                    h,
                    1,
                    tl * b,
                    Mat::t(&tall, h),
                    Mat {
                        data: dq.get(wb_off..).unwrap_or(&[]),
                        rs: wq,
                        cs: 1,
                    },
                ));
                bias.add_grad(vec![db_beta]);
            }
            Some(ZPreOp::Static { theta }) => theta.add_grad(dtheta),
            None => {}
        }
        let nb = nt * b;
        let ctx_t = Mat {
            data: &actx[s..],
            rs: 1,
            cs: w_ac,
        };
        let weight_grad = crate::kernels::product::<T>;
        // A stacked weight's parts as GEMMs over column blocks `[from, from + cols)` of the stacked
        // gradient rows `d` (no copies of the parts).
        fn block<T>(d: &[T], width: usize, from: usize) -> Mat<'_, T> {
            Mat {
                data: d.get(from..).unwrap_or(&[]),
                rs: width,
                cs: 1,
            }
        }
        let rows_t = tl * b;
        self.b_att.add_grad(weight_grad(
            h,
            ad,
            rows_t,
            Mat::t(&tall, h),
            block(&dq, wq, 0),
        ));
        if let Some(uz) = &self.u_z {
            uz.add_grad(weight_grad(
                h,
                h,
                rows_t,
                Mat::t(&tall, h),
                block(&dq, wq, ad),
            ));
        }
        self.c
            .add_grad(weight_grad(a2, kh, nb, ctx_t, block(&dcp, wc, 0)));
        if let Some(cz) = &self.c_z {
            cz.add_grad(weight_grad(a2, h, nb, ctx_t, block(&dcp, wc, kh)));
        }
        if let Some(gs) = &self.cgru {
            // The context GRU's bias (its candidate's context term), the word GRU's U_ru from t_i and U
            // from r∘t_i.
            let mut db = vec![T::zero(); h];
            for row in dcp.chunks_exact(wc) {
                for (a, &x) in db.iter_mut().zip(&row[2 * h..3 * h]) {
                    *a = *a + x;
                }
            }
            gs.b.add_grad(db);
            let nw = n * b;
            gs.u_ru.add_grad(weight_grad(
                h,
                2 * h,
                nw,
                Mat::t(&sall, h),
                block(&dpw_all, kh, 0),
            ));
            gs.u.add_grad(weight_grad(
                h,
                h,
                nw,
                Mat::t(&wrh, h),
                block(&dpw_all, kh, 2 * h),
            ));
        }
        if paper {
            // The products' own gradients: U_ru from t, U from r∘t (GRU) or t (vanilla).
            if let Some(u_ru) = &self.u_ru {
                u_ru.add_grad(weight_grad(
                    h,
                    2 * h,
                    nb,
                    Mat::t(&tall, h),
                    Mat::rows(&dhus, 2 * h),
                ));
            }
            self.u.add_grad(weight_grad(
                h,
                h,
                nb,
                Mat::t(if gru { &rts } else { &tall }, h),
                Mat::rows(&drcs, h),
            ));
            return Ok(());
        }
        if let Some(u_ru) = &self.u_ru {
            u_ru.add_grad(weight_grad(
                h,
                2 * h,
                nb,
                Mat::t(&ts, h),
                Mat::rows(&dpre, kh),
            ));
        }
        // U multiplies r∘(T∘t) (GRU) or T∘t (vanilla).
        self.u.add_grad(weight_grad(
            h,
            h,
            nb,
            Mat::t(if gru { &rts } else { &ts }, h),
            Mat {
                // (Empty when the sentences are one step long: no transition.)
                data: dpre.get(if gru { 2 * h } else { 0 }..).unwrap_or(&[]),
                rs: kh,
                cs: 1,
            },
        ));
        Ok(())
    }
}
