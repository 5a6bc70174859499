//! Bahdanau MLP attention (model-spec §2): `e_ij = vᵀ tanh(A h_j + B t_{i−1} [+ V_cov C_{i−1,j}])`, masked
//! softmax over the source positions, context `s_i = Σ_j α_ij h_j`. `A h_j` is computed once per sentence.

use candle_core::{Result, Tensor, D};
use candle_nn::VarBuilder;

pub struct Attention {
    pub a: Tensor,
    pub b: Tensor,
    pub v: Tensor,
    pub dim: usize,
}

/// Per-sentence attention keys: `A h_j` and the additive padding mask.
pub struct Keys {
    /// `[B, S, Ad]`
    pub ah: Tensor,
    /// `[B, S, 2H]`
    pub annotations: Tensor,
    /// `[B, S]`: 0 on words, a large negative number on padding.
    pub mask_bias: Tensor,
}

/// A numerically stable softmax over the last dimension built from differentiable ops (candle's fused softmax
/// has no backward pass).
pub fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let m = x.max_keepdim(D::Minus1)?.detach();
    let ex = x.broadcast_sub(&m)?.exp()?;
    ex.broadcast_div(&ex.sum_keepdim(D::Minus1)?)
}

impl Attention {
    pub fn new(vb: VarBuilder, ann_dim: usize, hidden: usize, dim: usize) -> Result<Self> {
        Ok(Self {
            a: vb.get_with_hints((ann_dim, dim), "A", crate::init::ZERO)?,
            b: vb.get_with_hints((hidden, dim), "B", crate::init::ZERO)?,
            v: vb.get_with_hints((dim, 1), "v", crate::init::ZERO)?,
            dim,
        })
    }

    pub fn keys(&self, annotations: &Tensor, mask: &Tensor) -> Result<Keys> {
        let (b, s, a) = annotations.dims3()?;
        let ah = annotations
            .reshape((b * s, a))?
            .matmul(&self.a)?
            .reshape((b, s, self.dim))?;
        let mask_bias = ((mask - 1.0)? * 1e9)?;
        Ok(Keys {
            ah,
            annotations: annotations.clone(),
            mask_bias,
        })
    }

    /// Attention weights `[B, S]` and context `[B, 2H]` for previous states `t_prev` `[B, H]`; `cov` is the
    /// projected coverage term `V_cov C_{i−1}` `[B, S, Ad]` when coverage is on.
    pub fn step(
        &self,
        keys: &Keys,
        t_prev: &Tensor,
        cov: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        let (b, s, _) = keys.ah.dims3()?;
        let bt = t_prev.matmul(&self.b)?.unsqueeze(1)?;
        let mut pre = keys.ah.broadcast_add(&bt)?;
        if let Some(c) = cov {
            pre = (pre + c)?;
        }
        let e = pre
            .tanh()?
            .reshape((b * s, self.dim))?
            .matmul(&self.v)?
            .reshape((b, s))?;
        let alpha = softmax_last(&(e + &keys.mask_bias)?)?;
        let ctx = alpha.unsqueeze(1)?.matmul(&keys.annotations)?.squeeze(1)?;
        Ok((alpha, ctx))
    }
}
