//! Layer normalisation in the model (`model.layer_norm`, model-spec §5b): a learned gain `g` and bias `β`
//! (`<path>.g`, `<path>.b`) over a product's blocks, each block normalised on its own. The row maths, the
//! composed reference and the fused op are in [`crate::kernels::layer_norm`].

use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;

use crate::kernels::Kernels;

/// One normalisation: gain and bias `[W]` over rows of width `W` split into `blocks`.
pub struct LayerNorm {
    pub g: Tensor,
    pub b: Tensor,
    pub blocks: Vec<usize>,
}

impl LayerNorm {
    /// Parameters `g` (initialised to 1) and `b` (0) under `vb` for rows tiled by `blocks`.
    pub fn new(vb: VarBuilder, blocks: &[usize]) -> Result<Self> {
        let w: usize = blocks.iter().sum();
        Ok(Self {
            g: vb.get_with_hints(w, "g", crate::model::init::ZERO)?,
            b: vb.get_with_hints(w, "b", crate::model::init::ZERO)?,
            blocks: blocks.to_vec(),
        })
    }

    /// `x` `[N, W]` normalised block by block, scaled and shifted.
    pub fn forward(&self, k: Kernels, x: &Tensor) -> Result<Tensor> {
        crate::kernels::layer_norm::layer_norm(k, x, &self.g, &self.b, &self.blocks)
    }

    /// [`LayerNorm::forward`] of `x` `[..., W]` of any rank (rows along the last axis).
    pub fn forward_any(&self, k: Kernels, x: &Tensor) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let w = *dims.last().unwrap_or(&0);
        let flat = x.reshape((x.elem_count() / w.max(1), w))?;
        self.forward(k, &flat)?.reshape(dims)
    }
}

/// `x` through `ln` when there is one (`x` itself without: the paper's model).
pub fn norm(k: Kernels, ln: Option<&LayerNorm>, x: Tensor) -> Result<Tensor> {
    match ln {
        Some(ln) => ln.forward_any(k, &x),
        None => Ok(x),
    }
}
