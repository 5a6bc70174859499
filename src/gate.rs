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

use candle_core::{Result, Tensor};
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

    fn times(self, a: f64) -> Result<Scale> {
        if a == 1.0 {
            return Ok(self);
        }
        Ok(match self {
            Scale::One => Scale::Const(a),
            Scale::Const(c) => Scale::Const(c * a),
            Scale::T(t) => Scale::T(t.affine(a, 0.0)?),
        })
    }
}

/// The scales for one decoder step, and the gate value (for analysis) when there is one.
pub struct Scales {
    pub src: Scale,
    pub tgt: Scale,
    /// `z` (`[B, H]`), `β` (`[B, 1]`) or the static `σ(θ)` (`[H]`).
    pub gate: Option<Tensor>,
}

impl Scales {
    /// No scaling and no gate.
    pub fn none() -> Scales {
        Scales {
            src: Scale::One,
            tgt: Scale::One,
            gate: None,
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
                w: vb.get_with_hints((h, 1), "w_beta", crate::init::ZERO)?,
                b: vb.get_with_hints(1, "b_beta", crate::init::ZERO)?,
            });
        }
        if cfg.static_interpolation {
            return Ok(Gate::Static {
                z_logit: vb
                    .pp("static_gate")
                    .get_with_hints(h, "z_logit", crate::init::ZERO)?,
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
                Some(vb.get_with_hints((e, h), "W_z", crate::init::ZERO)?)
            } else {
                None
            },
            u_z: if has(GateInput::State) {
                Some(vb.get_with_hints((h, h), "U_z", crate::init::ZERO)?)
            } else {
                None
            },
            c_z: if has(GateInput::Context) {
                Some(vb.get_with_hints((2 * h, h), "C_z", crate::init::ZERO)?)
            } else {
                None
            },
        })
    }

    /// `W_z e` for a batch of word embeddings `[N, E]` (computed once for all time steps in training).
    pub fn word_term(&self, e: &Tensor) -> Result<Option<Tensor>> {
        match self {
            Gate::Context { w_z: Some(w), .. } => Ok(Some(e.matmul(w)?)),
            _ => Ok(None),
        }
    }

    /// Scales for one step. `wz_e` is `W_z e(y)` for the word fed to the transition.
    pub fn scales(
        &self,
        kernels: crate::kernels::Kernels,
        wz_e: Option<&Tensor>,
        t_prev: &Tensor,
        ctx: &Tensor,
        context_scale: (f64, f64),
    ) -> Result<Scales> {
        let (a, b) = context_scale;
        let (src, tgt, gate) = match self {
            Gate::None => (Scale::One, Scale::One, None),
            Gate::Scalar { w, b: bias } => {
                let beta = candle_nn::ops::sigmoid(&t_prev.matmul(w)?.broadcast_add(bias)?)?;
                (Scale::T(beta.clone()), Scale::One, Some(beta))
            }
            Gate::Static { z_logit } => {
                let z = candle_nn::ops::sigmoid(z_logit)?;
                let g = z.affine(-1.0, 1.0)?;
                (Scale::T(z.clone()), Scale::T(g), Some(z))
            }
            Gate::Context {
                strategy,
                w_z: _,
                u_z,
                c_z,
            } => {
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
                    add(crate::kernels::rec_matmul(kernels, ctx, c)?)?;
                }
                let z = candle_nn::ops::sigmoid(&pre.expect("a gate has at least one input"))?;
                match strategy {
                    ContextGate::Source => (Scale::T(z.clone()), Scale::One, Some(z)),
                    ContextGate::Target => (Scale::One, Scale::T(z.clone()), Some(z)),
                    ContextGate::Both => {
                        (Scale::T(z.clone()), Scale::T(z.affine(-1.0, 1.0)?), Some(z))
                    }
                    ContextGate::None => unreachable!("no gate is Gate::None"),
                }
            }
        };
        Ok(Scales {
            src: src.times(a)?,
            tgt: tgt.times(b)?,
            gate,
        })
    }
}
