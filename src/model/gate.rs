//! Context gates (model-spec §4) and the related variants: the element-wise gate
//! `z_i = σ(W_z e(y) + U_z t_{i−1} + C_z s_i)` with strategies *source*, *target* and *both*, Xu et al.'s
//! gating scalar, and static interpolation. Every variant is expressed as a pair of scales applied by the
//! recurrent cell: `src` multiplies the source-context terms, `tgt` the target-side terms (word and state).
//!
//! | variant | src | tgt |
//! |---|---|---|
//! | none | a | b |
//! | source gate | a·z | b |
//! | target gate | a | b·z |
//! | both | a·z | b·(1−z) |
//! | gating scalar | a·β | b |
//! | static interpolation | a·σ(θ) | b·(1−σ(θ)) |
//!
//! `(a, b)` is the decode-time context scaling of the paper's Figure 2 (1, 1 in training).
//!
//! The table is written once, in [`Gate::kinds`], as [`GateKinds`]: each scale is `α + β·z`
//! ([`ZKind::affine`]). Where the scales are applied:
//! - **decoding**, step by step: [`Gate::scales`] builds them, `decoder_cell::DecoderCell::step` applies
//!   them (a context gate in the released-code form through the fused
//!   [`mix_fused`](crate::kernels::gate::mix_fused), otherwise through [`Scale::apply`], the composed reference
//!   [`mix_reference`]); the cGRU applies them in its context GRU ([`crate::model::Model::step`]);
//! - **training**, by default in the fused decoder op: `Model::decoder_path` hands the [`GateKinds`] to
//!   `decoder_sequence`, whose `gate_mix` rows compute `z`, the scales and the mixed pre-activations
//!   forward and back; with `--kernels reference` training runs the decoding step's path above.
//!
//! The scales' parametrisation ([`GateKinds`], [`ZKind`], [`GateMix`]) and the fused mix are in
//! [`crate::kernels::gate`], beside the rows of the mix; the composed reference [`mix_reference`] stays here,
//! over the concept's [`Scales`].

use candle_core::{Result, Tensor};

use crate::kernels::gate::{GateKinds, GateMix, ZKind};
use candle_nn::VarBuilder;

use crate::config::{ContextGate, GateInput, ModelConfig};

/// A scale applied to a group of terms.
#[derive(Clone, Debug)]
pub enum Scale {
    One,
    Const(f64),
    /// `[B, H]`, `[B, 1]` or `[H]`, broadcast against the terms.
    T(Tensor),
}

impl Scale {
    /// Multiply `x` (`[B, k·H]`, `k` blocks of `H`) by the scale, repeated over the `k` blocks.
    pub fn apply(&self, x: &Tensor, blocks: usize) -> Result<Tensor> {
        match self {
            Scale::One => Ok(x.clone()),
            Scale::Const(a) => x.affine(*a, 0.0),
            Scale::T(s) => {
                if blocks == 1 || s.dims().last() == Some(&1) {
                    x.broadcast_mul(s)
                } else {
                    // View `x` as `[B, k, H]` and broadcast the scale over the k blocks.
                    let (b, kh) = x.dims2()?;
                    let s = if s.rank() == 2 {
                        s.unsqueeze(1)?
                    } else {
                        s.clone()
                    };
                    x.reshape((b, blocks, kh / blocks))?
                        .broadcast_mul(&s)?
                        .reshape((b, kh))
                }
            }
        }
    }
}

/// The scales for one decoder step, and the gate value (for analysis) when there is one.
pub struct Scales {
    pub src: Scale,
    pub tgt: Scale,
    /// `z` (`[B, H]`), `β` (`[B, 1]`) or the static `σ(θ)` (`[H]`).
    pub gate: Option<Tensor>,
    /// For a context gate: the same scales as functions of `z`, for the fused kernels.
    pub mix: Option<GateMix>,
}

/// The scale `c·kind(z)` of the reference path as a [`Scale`] over the gate value tensor `z`.
fn scale_of(kind: ZKind, c: f64, z: &Tensor) -> Result<Scale> {
    let (alpha, beta) = kind.affine(c);
    Ok(match kind {
        ZKind::One => constant(c),
        ZKind::Z if c == 1.0 => Scale::T(z.clone()),
        _ => Scale::T(z.affine(beta, alpha)?),
    })
}

/// The constant scale `c`.
fn constant(c: f64) -> Scale {
    if c == 1.0 {
        Scale::One
    } else {
        Scale::Const(c)
    }
}

impl Scales {
    /// No scaling and no gate.
    pub fn none() -> Scales {
        Scales {
            src: Scale::One,
            tgt: Scale::One,
            gate: None,
            mix: None,
        }
    }
}

pub enum Gate {
    None,
    Context {
        strategy: ContextGate,
        w_z: Option<Tensor>,
        u_z: Option<Tensor>,
        c_z: Option<Tensor>,
    },
    Scalar {
        w: Tensor,
        b: Tensor,
    },
    Static {
        z_logit: Tensor,
    },
}

impl Gate {
    pub fn new(vb: VarBuilder, cfg: &ModelConfig) -> Result<Self> {
        let (e, h) = (cfg.embedding_dim, cfg.hidden_dim);
        if cfg.gating_scalar {
            let vb = vb.pp("scalar_gate");
            return Ok(Gate::Scalar {
                w: vb.get_with_hints((h, 1), "w_beta", crate::model::init::ZERO)?,
                b: vb.get_with_hints(1, "b_beta", crate::model::init::ZERO)?,
            });
        }
        if cfg.static_interpolation {
            return Ok(Gate::Static {
                z_logit: vb.pp("static_gate").get_with_hints(
                    h,
                    "z_logit",
                    crate::model::init::ZERO,
                )?,
            });
        }
        if cfg.context_gate == ContextGate::None {
            return Ok(Gate::None);
        }
        let vb = vb.pp("gate");
        let has = |g: GateInput| cfg.gate_inputs.contains(&g);
        Ok(Gate::Context {
            strategy: cfg.context_gate,
            w_z: if has(GateInput::Word) {
                Some(vb.get_with_hints((e, h), "W_z", crate::model::init::ZERO)?)
            } else {
                None
            },
            u_z: if has(GateInput::State) {
                Some(vb.get_with_hints((h, h), "U_z", crate::model::init::ZERO)?)
            } else {
                None
            },
            c_z: if has(GateInput::Context) {
                Some(vb.get_with_hints((2 * h, h), "C_z", crate::model::init::ZERO)?)
            } else {
                None
            },
        })
    }

    /// The gate's part of the fused decoder op's weights: a context gate's `U_z`, `C_z` (each present when
    /// the gate reads the state / the context), or the gating scalar's `w_β`, `b_β`, or static
    /// interpolation's `θ` as the op's one gate term.
    pub fn sequence_weights(&self) -> GateWeights<'_> {
        let (u_z, c_z, z_pre) = match self {
            Gate::None => (None, None, None),
            Gate::Context { u_z, c_z, .. } => (u_z.as_ref(), c_z.as_ref(), None),
            Gate::Scalar { w, b } => (None, None, Some(ZPre::Scalar { w, b })),
            Gate::Static { z_logit } => (None, None, Some(ZPre::Static { theta: z_logit })),
        };
        GateWeights { u_z, c_z, z_pre }
    }

    /// `W_z e` for a batch of word embeddings `[N, E]` (computed once for all time steps in training).
    pub fn word_term(
        &self,
        kernels: crate::kernels::Kernels,
        e: &Tensor,
    ) -> Result<Option<Tensor>> {
        match self {
            Gate::Context { w_z: Some(w), .. } => {
                Ok(Some(crate::kernels::rec_matmul(kernels, e, w)?))
            }
            _ => Ok(None),
        }
    }

    /// [`Gate::word_term`] as the shared input of the fused decoder sequence, over rows `rows` of `e` only
    /// when given (see [`crate::kernels::linear_shared_rows`]).
    pub fn word_term_shared(
        &self,
        e: &Tensor,
        rows: Option<crate::kernels::Rows>,
    ) -> Result<Option<crate::kernels::Shared>> {
        match self {
            Gate::Context { w_z: Some(w), .. } => {
                let zeros = Tensor::zeros(w.dim(1)?, w.dtype(), w.device())?;
                Ok(Some(crate::kernels::linear_shared_rows(
                    e, w, &zeros, rows,
                )?))
            }
            _ => Ok(None),
        }
    }

    /// How this gate's scales depend on its value, with the context scale `(a, b)` (`None`: no gate): the
    /// one place where every variant's scales are written (the table in the module's doc).
    pub fn kinds(&self, (a, b): (f64, f64)) -> Option<GateKinds> {
        let (src, tgt) = match self {
            Gate::None => return None,
            Gate::Context { strategy, .. } => match strategy {
                ContextGate::Source => (ZKind::Z, ZKind::One),
                ContextGate::Target => (ZKind::One, ZKind::Z),
                ContextGate::Both => (ZKind::Z, ZKind::OneMinusZ),
                ContextGate::None => unreachable!("no gate is Gate::None"),
            },
            // Gating scalar: the source scales by β; static interpolation: σ(θ) and 1 − σ(θ).
            Gate::Scalar { .. } => (ZKind::Z, ZKind::One),
            Gate::Static { .. } => (ZKind::Z, ZKind::OneMinusZ),
        };
        Some(GateKinds {
            src: (src, a),
            tgt: (tgt, b),
        })
    }

    /// Scales for one step. `wz_e` is `W_z e(y)` for the word fed to the transition.
    pub fn scales(
        &self,
        kernels: crate::kernels::Kernels,
        wz_e: Option<&Tensor>,
        t_prev: &Tensor,
        ctx: &crate::model::attention::Context,
        context_scale: (f64, f64),
    ) -> Result<Scales> {
        let Some(kinds) = self.kinds(context_scale) else {
            return Ok(Scales {
                src: constant(context_scale.0),
                tgt: constant(context_scale.1),
                gate: None,
                mix: None,
            });
        };
        // The gate value: `β` `[B, 1]`, the static `σ(θ)` `[H]` or `z` `[B, H]`.
        let z = match self {
            Gate::None => unreachable!("a gate has kinds"),
            Gate::Scalar { w, b: bias } => {
                candle_nn::ops::sigmoid(&t_prev.matmul(w)?.broadcast_add(bias)?)?
            }
            Gate::Static { z_logit } => candle_nn::ops::sigmoid(z_logit)?,
            Gate::Context { u_z, c_z, .. } => {
                let mut pre: Option<Tensor> = wz_e.cloned();
                let mut add = |t: Tensor| -> Result<()> {
                    pre = Some(match pre.take() {
                        Some(p) => (p + t)?,
                        None => t,
                    });
                    Ok(())
                };
                if let Some(u) = u_z {
                    add(crate::kernels::rec_matmul(kernels, t_prev, u)?)?;
                }
                if let Some(c) = c_z {
                    add(ctx.product(kernels, c)?)?;
                }
                crate::kernels::sigmoid(kernels, &pre.expect("a gate has at least one input"))?
            }
        };
        Ok(Scales {
            src: scale_of(kinds.src.0, kinds.src.1, &z)?,
            tgt: scale_of(kinds.tgt.0, kinds.tgt.1, &z)?,
            mix: matches!(self, Gate::Context { .. }).then(|| GateMix {
                z: z.clone(),
                kinds,
            }),
            gate: Some(z),
        })
    }
}

/// `T∘a + S∘b` for target-side terms `a` and source-side terms `b` (`[B, k·H]`, the scales repeated over
/// the k blocks), composed from the scales (reference); its fused twin is [`crate::kernels::gate::mix_fused`].
pub fn mix_reference(a: &Tensor, b: &Tensor, sc: &Scales, blocks: usize) -> Result<Tensor> {
    sc.tgt.apply(a, blocks)? + sc.src.apply(b, blocks)?
}

/// The gate's recurrent weights: `U_z` `[H, H]` and `C_z` `[2H, H]` (when a context gate reads the state /
/// the context), and the gate's pre-activation when it is not a context gate's sum of terms (model-spec §4).
/// (Its word term `W_z e` is an input of the op, formed for all steps at once.)
pub struct GateWeights<'a> {
    pub u_z: Option<&'a Tensor>,
    pub c_z: Option<&'a Tensor>,
    pub z_pre: Option<ZPre<'a>>,
}

/// A gate value that is not a context gate's: Xu et al.'s gating scalar `β = σ(w_βᵀ t_{i−1} + b_β)` (`w_β`
/// `[H, 1]`, `b_β` `[1]`; with the *source* scales) or static interpolation's `z = σ(θ)` (`θ` `[H]`; with the
/// *both* scales). In the op they are the gate's one term: `w_βᵀ t + b_β` repeated over `H`, or `θ`.
pub enum ZPre<'a> {
    Scalar { w: &'a Tensor, b: &'a Tensor },
    Static { theta: &'a Tensor },
}
