//! Coverage models of Tu et al. (2016) (model-spec §5). A coverage vector `C_{i,j}` (dimension d) per source
//! position enters attention through `V_cov C_{i−1,j}` and is updated right after each attention step.
//!
//! * linguistic: `C_{i,j} = C_{i−1,j} + α_ij / Φ_j`, with fertility `Φ_j = N σ(U_f h_j)` or `Φ_j = 1`;
//! * neural, gated: a GRU per source position over `C` with inputs `α_ij`, `h_j`, `t_{i−1}`:
//!   `z, r = σ(U_ru C + p_ru α + h_j W_c,ru + t W_h,ru)`, `C~ = tanh(U (r∘C) + p α + h_j W_c + t W_h)`,
//!   `C' = (1 − z)∘C + z∘C~`;
//! * neural, not gated: `C' = tanh(U C + p α + h_j W_c + t W_h)`.
//!
//! [`Coverage::update`] and [`Coverage::attention_term`] are the composed references of the fused decoder
//! sequence's coverage rows, which are in [`crate::kernels::coverage`].

use candle_core::{Result, Tensor, D};
use candle_nn::VarBuilder;

use crate::config::{CoverageKind, ModelConfig};

pub struct Coverage {
    pub kind: CoverageKind,
    pub dim: usize,
    pub v_cov: Tensor,
    pub u_f: Option<Tensor>,
    pub max_fertility: f64,
    pub gated: bool,
    /// Neural: `[2H, k·d]`, `[H, k·d]`, `[k·d]` with k = 3 (gated) or 1.
    pub w_c: Option<Tensor>,
    pub w_h: Option<Tensor>,
    pub p: Option<Tensor>,
    pub u_ru: Option<Tensor>,
    pub u: Option<Tensor>,
}

/// Per-sentence precomputation: fertilities (linguistic) or `h_j W_c` (neural).
#[derive(Clone)]
pub struct CovKeys {
    /// Linguistic: `1/Φ_j` `[B, S, 1]`; neural: `h_j W_c` `[B, S, k·d]`.
    pub pre: Tensor,
}

impl CovKeys {
    pub fn select(&self, idx: &Tensor) -> Result<CovKeys> {
        Ok(CovKeys {
            pre: crate::kernels::select_rows(&self.pre, idx)?,
        })
    }
}

impl Coverage {
    /// Coverage's inputs to the fused decoder op ([`crate::model::decoder_sequence::decoder_sequence_fused`]): the
    /// per-position terms read from the annotations' handle `ann` (`h W_c` neural, `h U_f` fertility, from
    /// which the op forms `1/Φ`, or ones) and the update's weights.
    pub fn sequence_inputs<'a>(
        &'a self,
        ann: &crate::kernels::Shared,
    ) -> Result<CoverageInputs<'a>> {
        use crate::kernels::{product_shared, Input, Shared};
        let (pre, fertility): (Input, Option<f64>) = match (self.kind, &self.w_c, &self.u_f) {
            (CoverageKind::Neural, Some(w_c), _) => (product_shared(ann, w_c)?.into(), None),
            (_, _, Some(u_f)) => (product_shared(ann, u_f)?.into(), Some(self.max_fertility)),
            _ => {
                let (bs, s) = (ann.tensor.dim(0)?, ann.tensor.dim(1)?);
                let ones = Tensor::ones((bs, s, 1), ann.tensor.dtype(), ann.tensor.device())?;
                (Shared::new(&ones)?.into(), None)
            }
        };
        Ok(CoverageInputs {
            neural: self.kind == CoverageKind::Neural,
            gated: self.gated,
            v_cov: &self.v_cov,
            pre,
            fertility,
            w_h: self.w_h.as_ref(),
            p: self.p.as_ref(),
            u: self.u.as_ref(),
            u_ru: self.u_ru.as_ref(),
        })
    }

    pub fn new(vb: VarBuilder, cfg: &ModelConfig) -> Result<Option<Self>> {
        if cfg.coverage == CoverageKind::None {
            return Ok(None);
        }
        let vb = vb.pp("coverage");
        let (h, d) = (cfg.hidden_dim, cfg.coverage_dim);
        let v_cov = vb.get_with_hints((d, cfg.attention_dim), "V_cov", crate::model::init::ZERO)?;
        let mut c = Coverage {
            kind: cfg.coverage,
            dim: d,
            v_cov,
            u_f: None,
            max_fertility: cfg.coverage_max_fertility,
            gated: cfg.coverage_gated,
            w_c: None,
            w_h: None,
            p: None,
            u_ru: None,
            u: None,
        };
        match cfg.coverage {
            CoverageKind::Linguistic => {
                if cfg.coverage_fertility {
                    c.u_f = Some(vb.get_with_hints((2 * h, 1), "U_f", crate::model::init::ZERO)?);
                }
            }
            CoverageKind::Neural => {
                let k = if cfg.coverage_gated { 3 } else { 1 };
                c.w_c = Some(vb.get_with_hints((2 * h, k * d), "W_c", crate::model::init::ZERO)?);
                c.w_h = Some(vb.get_with_hints((h, k * d), "W_h", crate::model::init::ZERO)?);
                c.p = Some(vb.get_with_hints(k * d, "p", crate::model::init::ZERO)?);
                c.u = Some(vb.get_with_hints((d, d), "U", crate::model::init::ZERO)?);
                if cfg.coverage_gated {
                    c.u_ru =
                        Some(vb.get_with_hints((d, 2 * d), "U_ru", crate::model::init::ZERO)?);
                }
            }
            CoverageKind::None => unreachable!(),
        }
        Ok(Some(c))
    }

    pub fn keys(&self, annotations: &Tensor) -> Result<CovKeys> {
        let (b, s, a) = annotations.dims3()?;
        let flat = annotations.reshape((b * s, a))?;
        let pre = match self.kind {
            CoverageKind::Linguistic => match &self.u_f {
                Some(u_f) => {
                    let phi = candle_nn::ops::sigmoid(&flat.matmul(u_f)?)?
                        .affine(self.max_fertility, 0.0)?;
                    phi.recip()?.reshape((b, s, 1))?
                }
                None => Tensor::ones((b, s, 1), annotations.dtype(), annotations.device())?,
            },
            _ => {
                let w_c = self.w_c.as_ref().expect("neural coverage has W_c");
                flat.matmul(w_c)?.reshape((b, s, w_c.dim(1)?))?
            }
        };
        Ok(CovKeys { pre })
    }

    /// `C_0 = 0`, `[B, S, d]`.
    pub fn initial(&self, b: usize, s: usize, like: &Tensor) -> Result<Tensor> {
        Tensor::zeros((b, s, self.dim), like.dtype(), like.device())
    }

    /// The attention term `V_cov C_{i−1,j}` `[B, S, Ad]`.
    pub fn attention_term(&self, cov: &Tensor) -> Result<Tensor> {
        let (b, s, d) = cov.dims3()?;
        let ad = self.v_cov.dim(1)?;
        cov.reshape((b * s, d))?
            .matmul(&self.v_cov)?
            .reshape((b, s, ad))
    }

    /// `C_i` from `C_{i−1}` `[B, S, d]`, the new weights `α_i` `[B, S]` and `t_{i−1}` `[B, H]`.
    pub fn update(
        &self,
        keys: &CovKeys,
        cov: &Tensor,
        alpha: &Tensor,
        t_prev: &Tensor,
    ) -> Result<Tensor> {
        let a = alpha.unsqueeze(D::Minus1)?; // [B, S, 1]
        match self.kind {
            CoverageKind::Linguistic => cov + (a * &keys.pre)?,
            _ => {
                let (b, s, d) = cov.dims3()?;
                let w_h = self.w_h.as_ref().expect("W_h");
                let p = self.p.as_ref().expect("p");
                let u = self.u.as_ref().expect("U");
                // Input terms for all parts: h_j W_c + t W_h + α p, [B, S, k·d].
                let inp = keys
                    .pre
                    .broadcast_add(&t_prev.matmul(w_h)?.unsqueeze(1)?)?
                    .broadcast_add(&a.broadcast_mul(p)?)?;
                let flat_c = cov.reshape((b * s, d))?;
                if !self.gated {
                    return (inp + flat_c.matmul(u)?.reshape((b, s, d))?)?.tanh();
                }
                let u_ru = self.u_ru.as_ref().expect("U_ru");
                let zr = candle_nn::ops::sigmoid(
                    &(inp.narrow(2, 0, 2 * d)? + flat_c.matmul(u_ru)?.reshape((b, s, 2 * d))?)?,
                )?;
                let z = zr.narrow(2, 0, d)?;
                let r = zr.narrow(2, d, d)?;
                let rc = (r * cov)?
                    .reshape((b * s, d))?
                    .matmul(u)?
                    .reshape((b, s, d))?;
                let cand = (inp.narrow(2, 2 * d, d)? + rc)?.tanh()?;
                cov + (z * (cand - cov)?)?
            }
        }
    }
}

/// Coverage (model-spec §5) inside the recurrence: `V_cov` `[d, Ad]`, the per-position precomputed input
/// `pre` (`1/Φ_j` `[B, S, 1]` for linguistic coverage — or `h_j U_f` when `fertility` is `Some(N)`, and the op
/// forms `1/Φ_j = 1/(N σ(h_j U_f))` itself — and `h_j W_c` `[B, S, k·d]` for neural), and the neural update's
/// `W_h` `[H, k·d]`, `p` `[k·d]`, `U` `[d, d]` and (gated) `U_ru` `[d, 2d]`, as in
/// [`crate::model::coverage::Coverage`].
pub struct CoverageInputs<'a> {
    pub neural: bool,
    pub gated: bool,
    pub v_cov: &'a Tensor,
    pub pre: crate::kernels::Input<'a>,
    pub fertility: Option<f64>,
    pub w_h: Option<&'a Tensor>,
    pub p: Option<&'a Tensor>,
    pub u: Option<&'a Tensor>,
    pub u_ru: Option<&'a Tensor>,
}
