//! The decoder's recurrent transition `t_i = f(t_{i−1}, e(y_i), s_i)` (model-spec §3) with the scales of a
//! context gate (see `gate`): `gru` or `vanilla`, in the *reference* form (the released code: the previous state
//! is scaled before the recurrent products and the GRU interpolates with the scaled state) or the *paper* form
//! (the projected sums are scaled after the products; the interpolation uses the unscaled state).
//!
//! Reference form, with `S` = source scale and `T` = target scale:
//! `t' = T∘t`, `r,u = σ(T∘(W_ru e) + S∘(C_ru s) + U_ru t')`, `t~ = tanh(T∘(W e + b) + S∘(C s) + U(r∘t'))`,
//! `t = u∘t~ + (1−u)∘t'`. For *source* gating `T = 1`, so only the context is scaled; for *target*
//! gating `S = 1`.

use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;

use crate::config::{DecoderKind, GateForm};
use crate::kernels::gate::mix_fused;
use crate::kernels::gru::gru_update;
use crate::kernels::{rec_matmul, Kernels};
use crate::model::attention::Context;
use crate::model::gate::Scales;
use crate::model::gru::{Gru, RecNorm};
use crate::model::layer_norm::{norm, LayerNorm};

pub struct DecoderCell {
    pub kind: DecoderKind,
    pub form: GateForm,
    /// `[E, kH]`: k = 3 (GRU: W_r | W_u | W) or 1 (vanilla).
    pub w: Tensor,
    pub b: Tensor,
    /// `[2H, kH]`
    pub c: Tensor,
    pub u_ru: Option<Tensor>,
    pub u: Tensor,
    pub hidden: usize,
    /// cGRU: the word GRU (`cell.word.*`) and the context GRU (`cell.ctx.*`); the fields above are unused.
    pub cgru: Option<(Gru, ContextGru)>,
    /// The deep transition's GRUs after the one that reads the inputs (`model.decoder_transition_depth` − 1;
    /// `cell.deep2.*`, `cell.deep3.*`, …): each reads the state only.
    pub deep: Vec<DeepTransition>,
    /// Layer normalisation (`model.layer_norm`, model-spec §5b) of the word projection `W e` (`ln_W`) and the
    /// context product `s C` (`ln_C`), in blocks `[2H | H]` (`[H]` for the vanilla unit), and of the recurrent
    /// products (`ln_U_ru`, `ln_U`); the cGRU's are its two GRUs'.
    pub ln: Option<CellNorm>,
}

/// The transition's layer normalisations (see [`DecoderCell::ln`]).
pub struct CellNorm {
    pub w: LayerNorm,
    pub c: LayerNorm,
    /// `ln_U_ru` (GRU) and `ln_U`; for the vanilla unit `ln_U_ru` is absent and `u` normalises `t U`.
    pub u_ru: Option<LayerNorm>,
    pub u: LayerNorm,
}

/// One transition of a deep-transition decoder after the first (model-spec §3): a GRU over the state alone,
/// its input terms a learned bias `b` = `[b_r | b_u | b_c]` `[3H]`: `[r | u] = σ(b_ru + (d∘t) U_ru)`,
/// `t~ = tanh(b_c + (r∘d∘t) U)`, `t' = t + u∘(t~ − t)`.
pub struct DeepTransition {
    pub b: Tensor,
    pub u_ru: Tensor,
    pub u: Tensor,
    /// Layer normalisation of the two recurrent products.
    pub ln: Option<RecNorm>,
}

impl DeepTransition {
    fn new(vb: VarBuilder, hidden: usize, layer_norm: bool) -> Result<Self> {
        Ok(Self {
            b: vb.get_with_hints(3 * hidden, "b", crate::model::init::ZERO)?,
            u_ru: vb.get_with_hints((hidden, 2 * hidden), "U_ru", crate::model::init::ZERO)?,
            u: vb.get_with_hints((hidden, hidden), "U", crate::model::init::ZERO)?,
            ln: if layer_norm {
                Some(RecNorm::new(&vb, hidden)?)
            } else {
                None
            },
        })
    }

    /// The transition from `t` `[B, H]` under recurrent dropout's masks `drop` (see
    /// [`crate::model::gru::gru_step`]).
    pub fn step(&self, k: Kernels, t: &Tensor, drop: Option<&Tensor>) -> Result<Tensor> {
        let xp = self
            .b
            .unsqueeze(0)?
            .broadcast_as((t.dim(0)?, self.b.dim(0)?))?;
        crate::model::gru::gru_step(
            k,
            &xp,
            t,
            None,
            drop,
            (&self.u_ru, &self.u),
            self.ln.as_ref(),
        )
    }
}

/// The cGRU's second GRU, over the attention context: `C` (2H × 3H), `b` (H), `U_ru`, `U`; with layer
/// normalisation, of `s C` in blocks `[2H | H]` (`ln_C`) and of the recurrent products.
pub struct ContextGru {
    pub c: Tensor,
    pub b: Tensor,
    pub u_ru: Tensor,
    pub u: Tensor,
    pub ln: Option<(LayerNorm, RecNorm)>,
}

impl DecoderCell {
    /// The transition of `kind` in `form`, with `depth` − 1 state-only GRUs after it (a deep transition),
    /// layer-normalised when `layer_norm`.
    pub fn new(
        vb: VarBuilder,
        (kind, form): (DecoderKind, GateForm),
        emb: usize,
        hidden: usize,
        (depth, layer_norm): (usize, bool),
    ) -> Result<Self> {
        let deep = (2..=depth)
            .map(|k| DeepTransition::new(vb.pp(format!("deep{k}")), hidden, layer_norm))
            .collect::<Result<Vec<_>>>()?;
        if kind == DecoderKind::Cgru {
            let word = Gru::new_normed(vb.pp("word"), emb, hidden, layer_norm)?;
            let v = vb.pp("ctx");
            let ln = if layer_norm {
                Some((
                    LayerNorm::new(v.pp("ln_C"), &[2 * hidden, hidden])?,
                    RecNorm::new(&v, hidden)?,
                ))
            } else {
                None
            };
            let ctx = ContextGru {
                c: v.get_with_hints((2 * hidden, 3 * hidden), "C", crate::model::init::ZERO)?,
                b: v.get_with_hints(hidden, "b", crate::model::init::ZERO)?,
                u_ru: v.get_with_hints((hidden, 2 * hidden), "U_ru", crate::model::init::ZERO)?,
                u: v.get_with_hints((hidden, hidden), "U", crate::model::init::ZERO)?,
                ln,
            };
            let (w, b, c, u) = (
                word.w.clone(),
                word.b.clone(),
                ctx.c.clone(),
                word.u.clone(),
            );
            return Ok(Self {
                kind,
                form,
                w,
                b,
                c,
                u_ru: None,
                u,
                hidden,
                cgru: Some((word, ctx)),
                deep,
                ln: None,
            });
        }
        let k = match kind {
            DecoderKind::Gru => 3,
            _ => 1,
        };
        let blocks: &[usize] = if k == 3 {
            &[2 * hidden, hidden]
        } else {
            &[hidden]
        };
        let ln = if layer_norm {
            Some(CellNorm {
                w: LayerNorm::new(vb.pp("ln_W"), blocks)?,
                c: LayerNorm::new(vb.pp("ln_C"), blocks)?,
                u_ru: if k == 3 {
                    Some(LayerNorm::new(vb.pp("ln_U_ru"), &[2 * hidden])?)
                } else {
                    None
                },
                u: LayerNorm::new(vb.pp("ln_U"), &[hidden])?,
            })
        } else {
            None
        };
        Ok(Self {
            kind,
            form,
            w: vb.get_with_hints((emb, k * hidden), "W", crate::model::init::ZERO)?,
            b: vb.get_with_hints(hidden, "b", crate::model::init::ZERO)?,
            c: vb.get_with_hints((2 * hidden, k * hidden), "C", crate::model::init::ZERO)?,
            u_ru: if kind == DecoderKind::Gru {
                Some(vb.get_with_hints((hidden, 2 * hidden), "U_ru", crate::model::init::ZERO)?)
            } else {
                None
            },
            u: vb.get_with_hints((hidden, hidden), "U", crate::model::init::ZERO)?,
            hidden,
            cgru: None,
            deep,
            ln,
        })
    }

    /// The deep transition's later GRUs over the state `t` the first one produced (`t` itself at depth 1),
    /// under recurrent dropout's masks `drop`.
    pub fn deep_steps(&self, k: Kernels, t: Tensor, drop: Option<&Tensor>) -> Result<Tensor> {
        self.deep.iter().try_fold(t, |t, d| d.step(k, &t, drop))
    }

    /// The transition's part of the fused decoder op's weights: `C`, `U_ru`, `U` and the form; for the
    /// cGRU, its context GRU's (the op's transition) and its word GRU's recurrent weights.
    pub fn sequence_weights(&self) -> TransitionWeights<'_> {
        let paper_form = self.form == GateForm::Paper;
        match &self.cgru {
            Some((word, ctx)) => TransitionWeights {
                c: &ctx.c,
                u_ru: Some(&ctx.u_ru),
                u: &ctx.u,
                paper_form,
                cgru: Some(CgruWeights {
                    b: &ctx.b,
                    u_ru: &word.u_ru,
                    u: &word.u,
                }),
                deep: self.deep_weights(),
            },
            None => TransitionWeights {
                c: &self.c,
                u_ru: self.u_ru.as_ref(),
                u: &self.u,
                paper_form,
                cgru: None,
                deep: self.deep_weights(),
            },
        }
    }

    /// The deep transition's later GRUs' `(b, U_ru, U)`.
    fn deep_weights(&self) -> Vec<[&Tensor; 3]> {
        self.deep.iter().map(|d| [&d.b, &d.u_ru, &d.u]).collect()
    }

    /// A per-step product with a recurrent weight (see `kernels::rec_matmul`).
    fn mm(k: Kernels, x: &Tensor, w: &Tensor) -> Result<Tensor> {
        rec_matmul(k, x, w)
    }

    fn blocks(&self) -> usize {
        match self.kind {
            DecoderKind::Gru | DecoderKind::Cgru => 3,
            DecoderKind::Vanilla => 1,
        }
    }

    /// cGRU: the context GRU `t = GRU_ctx(t_prev, s)` with the gate's scales (source scale on the context
    /// terms and their bias, target scale on the state; reference or paper form as the other cells).
    pub fn context_step(
        &self,
        k: Kernels,
        t_prev: &Tensor,
        ctx: &Context,
        sc: &Scales,
    ) -> Result<Tensor> {
        self.context_step_dropped(k, t_prev, ctx, sc, None)
    }

    /// [`DecoderCell::context_step`] under recurrent dropout's masks `drop` `[B, H]` (see
    /// [`DecoderCell::step_dropped`]).
    pub fn context_step_dropped(
        &self,
        k: Kernels,
        t_prev: &Tensor,
        ctx: &Context,
        sc: &Scales,
        drop: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (_, g) = self.cgru.as_ref().expect("context_step is the cGRU's");
        let h = self.hidden;
        let (ln_c, ln_ru, ln_u) = match &g.ln {
            Some((c, rec)) => (Some(c), Some(&rec.u_ru), Some(&rec.u)),
            None => (None, None, None),
        };
        let mm_ru = |x: &Tensor| norm(k, ln_ru, Self::mm(k, x, &g.u_ru)?);
        let mm_u = |x: &Tensor| norm(k, ln_u, Self::mm(k, x, &g.u)?);
        let cp = norm(k, ln_c, ctx.product(k, &g.c)?)?;
        let (c_ru, c_c) = (
            cp.narrow(1, 0, 2 * h)?,
            cp.narrow(1, 2 * h, h)?.broadcast_add(&g.b)?,
        );
        let (ru, base, cand_pre) = if self.form == GateForm::Reference {
            let ts = sc.tgt.apply(t_prev, 1)?;
            let tm = dropped(&ts, drop)?;
            let ru = crate::kernels::sigmoid(k, &(sc.src.apply(&c_ru, 2)? + mm_ru(&tm)?)?)?;
            let r = ru.narrow(1, 0, h)?;
            let cand = (sc.src.apply(&c_c, 1)? + mm_u(&(r * &tm)?)?)?;
            (ru, ts, cand)
        } else {
            let tm = dropped(t_prev, drop)?;
            let ru = crate::kernels::sigmoid(
                k,
                &(sc.tgt.apply(&mm_ru(&tm)?, 2)? + sc.src.apply(&c_ru, 2)?)?,
            )?;
            let r = ru.narrow(1, 0, h)?;
            let cand = (sc.tgt.apply(&mm_u(&(r * &tm)?)?, 1)? + sc.src.apply(&c_c, 1)?)?;
            (ru, t_prev.clone(), cand)
        };
        gru_update(k, &ru, &cand_pre, &base, None)
    }

    /// Word projections `[N, E]` → `[N, kH]` (the candidate's bias included).
    pub fn project_words(&self, k: Kernels, e: &Tensor) -> Result<Tensor> {
        if let Some((word, _)) = &self.cgru {
            return word.project(k, e);
        }
        norm(
            k,
            self.ln.as_ref().map(|n| &n.w),
            crate::kernels::linear(k, e, &self.w, &self.word_bias()?)?,
        )
    }

    /// [`DecoderCell::project_words`] as the shared input of the fused decoder
    /// sequence, over rows `rows` of `e` only when given (see [`crate::kernels::linear_shared_rows`]).
    pub fn project_words_shared(
        &self,
        e: &Tensor,
        rows: Option<crate::kernels::Rows>,
    ) -> Result<crate::kernels::Shared> {
        // The projections `[x W_r, x W_u, x W + b]` (the cGRU's word GRU's, or the cell's own), normalised
        // in blocks with layer normalisation by the fused row op on shared handles, as the encoder's are.
        let (w, bias, ln) = match &self.cgru {
            Some((word, _)) => {
                let zeros = Tensor::zeros(2 * self.hidden, word.b.dtype(), word.b.device())?;
                (
                    &word.w,
                    Tensor::cat(&[&zeros, &word.b], 0)?,
                    word.ln.as_ref().map(|n| &n.w),
                )
            }
            None => (&self.w, self.word_bias()?, self.ln.as_ref().map(|n| &n.w)),
        };
        let x = crate::kernels::linear_shared_rows(e, w, &bias, rows)?;
        match ln {
            Some(n) => crate::kernels::layer_norm::layer_norm_shared(&x, &n.g, &n.b, &n.blocks),
            None => Ok(x),
        }
    }

    /// The word projection's bias over its `k` blocks: `[0; b]` (only the candidate's block has one).
    fn word_bias(&self) -> Result<Tensor> {
        let k = self.blocks();
        if k == 1 {
            return Ok(self.b.clone());
        }
        let zeros = Tensor::zeros((k - 1) * self.hidden, self.b.dtype(), self.b.device())?;
        Tensor::cat(&[&zeros, &self.b], 0)
    }

    /// One transition from `t_prev` `[B, H]`, projected word `wp` `[B, kH]`, context `ctx` `[B, 2H]` (with
    /// its product `s C` when carried).
    pub fn step(
        &self,
        k: Kernels,
        t_prev: &Tensor,
        wp: &Tensor,
        ctx: &Context,
        sc: &Scales,
    ) -> Result<Tensor> {
        self.step_dropped(k, t_prev, wp, ctx, sc, None)
    }

    /// [`DecoderCell::step`] under recurrent dropout (training): the recurrent products read their operand
    /// through the masks `drop` `[B, H]` — `d∘(T∘t)` in the reference form, `d∘t` in the paper form — and the
    /// GRU interpolates with the state itself (see [`crate::model::gru::Gru::step_dropped`]); the cGRU's word GRU
    /// likewise.
    pub fn step_dropped(
        &self,
        k: Kernels,
        t_prev: &Tensor,
        wp: &Tensor,
        ctx: &Context,
        sc: &Scales,
        drop: Option<&Tensor>,
    ) -> Result<Tensor> {
        let h = self.hidden;
        // The operand of the recurrent products, through the masks.
        let dropped = |x: &Tensor| dropped(x, drop);
        if let Some((word, _)) = &self.cgru {
            // The cGRU's word GRU: no context and no gate here.
            return word.step_dropped(k, wp, t_prev, None, drop);
        }
        let ln = self.ln.as_ref();
        let cp = norm(k, ln.map(|n| &n.c), ctx.product(k, &self.c)?)?;
        // The recurrent products, normalised with layer normalisation.
        let mm_ru = |x: &Tensor, u_ru: &Tensor| {
            norm(k, ln.and_then(|n| n.u_ru.as_ref()), Self::mm(k, x, u_ru)?)
        };
        let mm_u = |x: &Tensor| norm(k, ln.map(|n| &n.u), Self::mm(k, x, &self.u)?);
        if let Some(m) = sc.mix.as_ref() {
            if self.form == GateForm::Reference && k.ops_fused_on(wp.device()) {
                // Fused: the gate's scales applied to the word and context terms of all blocks at once (the
                // recurrent products normalised with layer normalisation).
                let ts = sc.tgt.apply(t_prev, 1)?;
                let tm = dropped(&ts)?;
                let pre = mix_fused(wp, &cp, m)?;
                if self.kind == DecoderKind::Vanilla {
                    return (pre + mm_u(&tm)?)?.tanh();
                }
                let u_ru = self.u_ru.as_ref().expect("GRU has U_ru");
                let ru =
                    crate::kernels::sigmoid(k, &(pre.narrow(1, 0, 2 * h)? + mm_ru(&tm, u_ru)?)?)?;
                let r = ru.narrow(1, 0, h)?;
                let cand = (pre.narrow(1, 2 * h, h)? + mm_u(&(r * &tm)?)?)?;
                return gru_update(k, &ru, &cand, &ts, None);
            }
        }
        match (self.kind, self.form) {
            (DecoderKind::Vanilla, GateForm::Reference) => {
                let ts = dropped(&sc.tgt.apply(t_prev, 1)?)?;
                (sc.tgt.apply(wp, 1)? + sc.src.apply(&cp, 1)? + mm_u(&ts)?)?.tanh()
            }
            (DecoderKind::Vanilla, GateForm::Paper) => {
                (sc.tgt.apply(&(wp + mm_u(&dropped(t_prev)?)?)?, 1)? + sc.src.apply(&cp, 1)?)?
                    .tanh()
            }
            (DecoderKind::Cgru, _) => unreachable!("handled above"),
            (DecoderKind::Gru, form) => {
                let u_ru = self.u_ru.as_ref().expect("GRU has U_ru");
                let (w_ru, w_c) = (wp.narrow(1, 0, 2 * h)?, wp.narrow(1, 2 * h, h)?);
                let (c_ru, c_c) = (cp.narrow(1, 0, 2 * h)?, cp.narrow(1, 2 * h, h)?);
                let (ru, base, cand_pre) = if form == GateForm::Reference {
                    let ts = sc.tgt.apply(t_prev, 1)?;
                    let tm = dropped(&ts)?;
                    let ru = crate::kernels::sigmoid(
                        k,
                        &(sc.tgt.apply(&w_ru, 2)? + sc.src.apply(&c_ru, 2)? + mm_ru(&tm, u_ru)?)?,
                    )?;
                    let r = ru.narrow(1, 0, h)?;
                    let cand =
                        (sc.tgt.apply(&w_c, 1)? + sc.src.apply(&c_c, 1)? + mm_u(&(r * &tm)?)?)?;
                    (ru, ts, cand)
                } else {
                    let tm = dropped(t_prev)?;
                    let ru = crate::kernels::sigmoid(
                        k,
                        &(sc.tgt.apply(&(w_ru + mm_ru(&tm, u_ru)?)?, 2)?
                            + sc.src.apply(&c_ru, 2)?)?,
                    )?;
                    let r = ru.narrow(1, 0, h)?;
                    let cand = (sc.tgt.apply(&(w_c + mm_u(&(r * &tm)?)?)?, 1)?
                        + sc.src.apply(&c_c, 1)?)?;
                    (ru, t_prev.clone(), cand)
                };
                gru_update(k, &ru, &cand_pre, &base, None)
            }
        }
    }
}

/// `x` through recurrent dropout's masks `drop` (`x` itself without).
fn dropped(x: &Tensor, drop: Option<&Tensor>) -> Result<Tensor> {
    match drop {
        Some(d) => x * d,
        None => Ok(x.clone()),
    }
}

/// The transition's weights.
pub struct TransitionWeights<'a> {
    /// `C` `[2H, kH]`, `U_ru` `[H, 2H]` (GRU: k = 3; `None` for the vanilla tanh unit, k = 1), `U` `[H, H]`.
    /// (cGRU: the context GRU's.)
    pub c: &'a Tensor,
    pub u_ru: Option<&'a Tensor>,
    pub u: &'a Tensor,
    /// The paper-literal form: the target scale `T` multiplies the recurrent products `U_ru t`, `U(r∘t)` (or
    /// `U t`) after them, and the GRU interpolates with the unscaled state (see [`crate::model::decoder_cell`]).
    pub paper_form: bool,
    /// The conditional GRU (cGRU): the transition above is its context GRU (no word input), and a word GRU
    /// follows it at every step.
    pub cgru: Option<CgruWeights<'a>>,
    /// A deep transition's later GRUs, `[b, U_ru, U]` each (see [`DeepTransition`]): they follow the
    /// transition above (the cGRU's context GRU) at every step, over the state alone.
    pub deep: Vec<[&'a Tensor; 3]>,
}

/// The cGRU's weights beyond the context GRU's `C`, `U_ru`, `U` (see [`crate::model::decoder_cell::DecoderCell`]):
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
