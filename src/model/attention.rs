//! Bahdanau MLP attention (model-spec §2): `e_ij = vᵀ tanh(A h_j + B t_{i−1} [+ V_cov C_{i−1,j}])`, masked
//! softmax over the source positions, context `s_i = Σ_j α_ij h_j`. `A h_j` is computed once per sentence.
//! The row kernels, fused ops and their composed references are in [`crate::kernels::attention`].

use candle_core::{Result, Tensor};

use crate::kernels::attention::{
    attend_rows, scores_fused, scores_reference, scores_shared, softmax_context_fused,
    softmax_context_reference, softmax_context_shared, weighted_rows, Keys,
};
use crate::kernels::Kernels;
use crate::model::layer_norm::{norm, LayerNorm};
use candle_nn::VarBuilder;

pub struct Attention {
    pub a: Tensor,
    pub b: Tensor,
    pub v: Tensor,
    pub dim: usize,
    /// Layer normalisation (model-spec §5b) of the keys `A h_j` (`ln_A`) and the query `B t` (`ln_B`).
    pub ln: Option<(LayerNorm, LayerNorm)>,
}

impl Attention {
    /// The paper's attention, with layer normalisation of keys and query when `layer_norm`.
    pub fn new(
        vb: VarBuilder,
        ann_dim: usize,
        hidden: usize,
        dim: usize,
        layer_norm: bool,
    ) -> Result<Self> {
        let ln = if layer_norm {
            Some((
                LayerNorm::new(vb.pp("ln_A"), &[dim])?,
                LayerNorm::new(vb.pp("ln_B"), &[dim])?,
            ))
        } else {
            None
        };
        Ok(Self {
            a: vb.get_with_hints((ann_dim, dim), "A", crate::model::init::ZERO)?,
            b: vb.get_with_hints((hidden, dim), "B", crate::model::init::ZERO)?,
            v: vb.get_with_hints((dim, 1), "v", crate::model::init::ZERO)?,
            dim,
            ln,
        })
    }

    /// The query term `B t_{i−1}` `[N, Ad]` (normalised with layer normalisation).
    pub fn query(&self, k: Kernels, t_prev: &Tensor) -> Result<Tensor> {
        norm(
            k,
            self.ln.as_ref().map(|(_, q)| q),
            crate::kernels::rec_matmul(k, t_prev, &self.b)?,
        )
    }

    pub fn keys(&self, k: Kernels, annotations: &Tensor, mask: &Tensor) -> Result<Keys> {
        let (b, s, a) = annotations.dims3()?;
        let flat = crate::kernels::matmul_or_int8(&annotations.reshape((b * s, a))?, &self.a)?;
        let flat = match &self.ln {
            Some((ln, _)) => ln.forward(k, &flat)?,
            None => flat,
        };
        let ah = flat.reshape((b, s, self.dim))?;
        let mask_bias = ((mask - 1.0)? * 1e9)?;
        Ok(Keys {
            ah,
            annotations: annotations.clone(),
            mask_bias,
            shared: None,
        })
    }

    /// The attention's part of the fused decoder op's weights: `B` and `v`.
    pub fn sequence_weights(&self) -> AttentionWeights<'_> {
        AttentionWeights {
            b: &self.b,
            v: &self.v,
        }
    }

    /// [`attend_rows`] with this attention's `B` and `v`: hypothesis row `i` attends over sentence `rows[i]`.
    pub fn step_rows(
        &self,
        k: Kernels,
        keys: &Keys,
        rows: &[u32],
        t_prev: &Tensor,
    ) -> Result<(Tensor, Tensor)> {
        let bt = self.query(k, t_prev)?;
        attend_rows(keys, rows, &bt, &self.v)
    }

    /// Attention weights `[B, S]` and context `[B, 2H]` for previous states `t_prev` `[B, H]`; `cov` is the
    /// projected coverage term `V_cov C_{i−1}` `[B, S, Ad]` when coverage is on.
    pub fn step(
        &self,
        k: Kernels,
        keys: &Keys,
        t_prev: &Tensor,
        cov: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor)> {
        let bt = self.query(k, t_prev)?;
        let pre = match cov {
            Some(c) => (&keys.ah + c)?,
            None => keys.ah.clone(),
        };
        let fused = k.fused_on(pre.device());
        let e = match (&keys.shared, cov) {
            (Some((ah, _)), None) if fused => scores_shared(ah, &bt, &self.v)?,
            _ if fused => scores_fused(&pre, &bt, &self.v)?,
            _ => scores_reference(&pre, &bt, &self.v)?,
        };
        let e = (e + &keys.mask_bias)?;
        match &keys.shared {
            Some((_, ann)) if fused => softmax_context_shared(&e, ann),
            _ if fused => softmax_context_fused(&e, &keys.annotations),
            _ => softmax_context_reference(&e, &keys.annotations),
        }
    }
}

/// An attention context `s_i` `[N, 2H]` as the decoder reads it: the context itself and, when decoding with
/// fused kernels, its products `s_i W` with the weights that read it (the transition's `C`, the gate's `C_z`,
/// the readout's `W_o`), formed by [`ContextProducts::context`]. A product that is not carried is formed from
/// `s_i` by the part of the model that needs it. [`Context::select`] may leave the context itself out when
/// the products kept are all that will be read.
#[derive(Clone)]
pub struct Context {
    ctx: Option<Tensor>,
    products: Vec<(candle_core::TensorId, Tensor)>,
}

impl From<&Tensor> for Context {
    fn from(ctx: &Tensor) -> Self {
        Context {
            ctx: Some(ctx.clone()),
            products: vec![],
        }
    }
}

impl Context {
    /// `s_i W` `[N, ·]` when it is carried.
    pub fn formed(&self, w: &Tensor) -> Option<&Tensor> {
        self.products
            .iter()
            .find(|(id, _)| *id == w.id())
            .map(|(_, p)| p)
    }

    /// `s_i W`: the carried product, or a recurrent product of the context (see
    /// [`crate::kernels::rec_matmul`]).
    pub fn product(&self, k: Kernels, w: &Tensor) -> Result<Tensor> {
        match (self.formed(w), &self.ctx) {
            (Some(p), _) => Ok(p.clone()),
            (None, Some(ctx)) => crate::kernels::rec_matmul(k, ctx, w),
            (None, None) => {
                candle_core::bail!("context: a product was asked for that was not kept")
            }
        }
    }

    /// Rows `idx` (the parents of a beam's new hypotheses) of what products with the weights `read` need:
    /// the carried products among them, and the context itself only when one of them is not carried (the
    /// other products are left out).
    pub fn select(&self, idx: &Tensor, read: &[&Tensor]) -> Result<Context> {
        let products = self
            .products
            .iter()
            .filter(|(id, _)| read.iter().any(|w| w.id() == *id))
            .map(|(id, p)| Ok((*id, crate::kernels::select_rows(p, idx)?)))
            .collect::<Result<Vec<_>>>()?;
        let ctx = match &self.ctx {
            Some(c) if read.iter().any(|w| self.formed(w).is_none()) => {
                Some(crate::kernels::select_rows(c, idx)?)
            }
            _ => None,
        };
        Ok(Context { ctx, products })
    }
}

/// Decoding: each source position's products `h_j W` `[B, S, ·]` with the weights `W` that read the attention
/// context, formed once per batch of sentences (one GEMM per weight over all positions). As `s_i = Σ_j α_ij
/// h_j`, a step's products are `s_i W = Σ_j α_ij (h_j W)`: `S` multiply-adds per column for each hypothesis
/// row instead of `2H`. Beam search computes about ten rows per sentence and step, so this takes the
/// context's products — about a third of a decoder step's multiply-adds at the small and paper sizes — off
/// the steps. The same numbers as the products of the context up to rounding (the decoding tests compare
/// the translations with the reference kernels').
pub struct ContextProducts {
    per_position: Vec<(candle_core::TensorId, Tensor)>,
}

impl ContextProducts {
    /// The products of the annotations `[B, S, 2H]` with `weights` (each `[2H, ·]`; in 8 bits when decoding's
    /// pass prepared them so, see [`crate::kernels::int8_matmul`]).
    pub fn new(annotations: &Tensor, weights: &[&Tensor]) -> Result<ContextProducts> {
        let (b, s, a2) = annotations.dims3()?;
        let flat = annotations.reshape((b * s, a2))?;
        Ok(ContextProducts {
            per_position: weights
                .iter()
                .map(|w| {
                    let p = crate::kernels::matmul_or_int8(&flat, w)?;
                    let width = p.dim(1)?;
                    Ok((w.id(), p.reshape((b, s, width))?))
                })
                .collect::<Result<_>>()?,
        })
    }

    /// The context `ctx` `[N, 2H]` of attention weights `alpha` `[N, S]` with its products, row `i` reading
    /// sentence `rows[i]`'s positions.
    pub fn context(&self, ctx: &Tensor, alpha: &Tensor, rows: &[u32]) -> Result<Context> {
        let alpha = alpha.contiguous()?;
        let products = self
            .per_position
            .iter()
            .map(|(id, p)| Ok((*id, weighted_rows(&alpha, rows, p)?)))
            .collect::<Result<_>>()?;
        Ok(Context {
            ctx: Some(ctx.clone()),
            products,
        })
    }
}

/// The attention weights the fused decoder sequence reads ([`crate::model::decoder_sequence`]).
/// Attention `B` `[H, Ad]` and `v` `[Ad, 1]`.
pub struct AttentionWeights<'a> {
    pub b: &'a Tensor,
    pub v: &'a Tensor,
}
