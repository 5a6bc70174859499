//! Bidirectional GRU encoder (model-spec §1): shared source embedding `E[x] + b_e`, a forward and a backward GRU,
//! annotations `h_j = [→h_j ; ←h_j]`. Input projections of all time steps are one matmul per direction.
//! Both recurrences as one fused op are in [`crate::kernels::encoder`]; the step-by-step path here is its
//! composed reference.

use candle_core::{DType, IndexOp, Result, Tensor, D};

use crate::kernels::encoder::{BiGru, RowOrder};
use crate::kernels::{Kernels, Shared};
use crate::model::gru::Gru;
use candle_nn::VarBuilder;

pub struct Encoder {
    pub emb: Tensor,
    pub emb_b: Tensor,
    pub fwd: Gru,
    pub bwd: Gru,
    pub hidden: usize,
}

/// What the encoder hands to the decoder.
pub struct Encoded {
    /// `[B, S, 2H]`
    pub annotations: Tensor,
    /// Backward state at the first word `←h_1`, `[B, H]`.
    pub bwd_first: Tensor,
}

impl Encoder {
    /// Both directions' input projections as one product, both recurrences as one fused op (see
    /// [`crate::kernels::encoder::bigru_fused`]), for the embedded words `e` `[B·S, E]` (rows `(b, t)`).
    fn bigru_op(
        &self,
        e: &Tensor,
        b: usize,
        mask: &Tensor,
        drop: Option<&[Tensor; 2]>,
    ) -> Result<BiGru> {
        let h = self.hidden;
        let zeros = Tensor::zeros(2 * h, self.fwd.b.dtype(), self.fwd.b.device())?;
        let w = Tensor::cat(&[&self.fwd.w, &self.bwd.w], 1)?;
        let bias = Tensor::cat(&[&zeros, &self.fwd.b, &zeros, &self.bwd.b], 0)?;
        let m: Vec<f64> = crate::kernels::to_vec(&mask.t()?.to_dtype(DType::F64)?)?;
        let s = mask.dim(1)?;
        let order = RowOrder::new(&m, s, b);
        // The words' rows `(b, t)` only when the recurrences read no other (padding is not computed), read
        // through a shared handle: no `[B·S, 6H]` gradient in candle's store.
        let rows = order.word_rows(s).map(std::sync::Arc::new);
        let x = crate::kernels::linear_shared_rows(e, &w, &bias, rows.clone())?;
        BiGru::build(
            x.into(),
            (b, s),
            order,
            rows,
            (&self.fwd.u_ru, &self.fwd.u),
            (&self.bwd.u_ru, &self.bwd.u),
            drop_values(drop)?,
        )
    }

    /// Training with fused kernels on the CPU: the annotations `[B, S, 2H]` as a [`Shared`] output of the fused
    /// encoder, formed outside the graph, whose consumers (the decoder's attention, the keys `A h`, the initial
    /// state) add their gradients into the handle; the encoder's backward pass reads the sum from there, so
    /// the annotations' gradient never enters candle's gradient store.
    /// `e`: the embedded words `[B·S, E]` ([`Encoder::embed`], after dropout); `drop`: recurrent dropout's
    /// masks `[B, H]` of the forward and the backward direction (see [`crate::model::gru::Gru::step_dropped`]).
    pub fn forward_shared(
        &self,
        k: Kernels,
        e: &Tensor,
        mask: &Tensor,
        drop: Option<&[Tensor; 2]>,
    ) -> Result<Shared> {
        let (b, _) = mask.dims2()?;
        if !k.fused_on(e.device()) {
            candle_core::bail!("shared annotations need the fused kernels on the CPU");
        }
        self.bigru_op(e, b, mask, drop)?.apply_shared()
    }

    pub fn new(vb: VarBuilder, vocab: usize, emb_dim: usize, hidden: usize) -> Result<Self> {
        Ok(Self {
            emb: vb.get_with_hints((vocab, emb_dim), "E", crate::model::init::ZERO)?,
            emb_b: vb.get_with_hints(emb_dim, "b_e", crate::model::init::ZERO)?,
            fwd: Gru::new(vb.pp("fwd"), emb_dim, hidden)?,
            bwd: Gru::new(vb.pp("bwd"), emb_dim, hidden)?,
            hidden,
        })
    }

    /// `src`: `[B, S]` u32 ids, `mask`: `[B, S]` (1 = word, 0 = padding), in the model dtype.
    pub fn forward(&self, k: Kernels, src: &Tensor, mask: &Tensor) -> Result<Encoded> {
        self.forward_embedded(k, &self.embed(k, src)?, mask, None)
    }

    /// The source words' embeddings `E[x] + b_e`, `[B·S, E]` (rows `(b, t)`) of `src` `[B, S]`.
    pub fn embed(&self, k: Kernels, src: &Tensor) -> Result<Tensor> {
        crate::kernels::embedding(k, &self.emb, &src.flatten_all()?)?.broadcast_add(&self.emb_b)
    }

    /// [`Encoder::forward`] from the embedded words `e` `[B·S, E]` ([`Encoder::embed`], after dropout), with
    /// recurrent dropout's masks `drop` (see [`Encoder::forward_shared`]).
    pub fn forward_embedded(
        &self,
        k: Kernels,
        e: &Tensor,
        mask: &Tensor,
        drop: Option<&[Tensor; 2]>,
    ) -> Result<Encoded> {
        let (b, s) = mask.dims2()?;
        if k.fused_on(e.device()) {
            let annotations = self.bigru_op(e, b, mask, drop)?.apply()?;
            let bwd_first = annotations
                .i((.., 0))?
                .narrow(1, self.hidden, self.hidden)?;
            return Ok(Encoded {
                annotations,
                bwd_first,
            });
        }
        // Time-major so every step reads a contiguous slice.
        let time_major = |g: &Gru| -> Result<Tensor> {
            g.project(k, e)?
                .reshape((b, s, 3 * self.hidden))?
                .transpose(0, 1)?
                .contiguous()
        };
        let (xf, xb) = (time_major(&self.fwd)?, time_major(&self.bwd)?);
        let m = mask.transpose(0, 1)?.contiguous()?.unsqueeze(D::Minus1)?; // [S, B, 1]
        let h0 = Tensor::zeros((b, self.hidden), e.dtype(), e.device())?;
        // Step by step (reference kernels, or a device without the fused ones).
        let steps = |x: &Tensor| -> Result<Vec<Tensor>> { (0..s).map(|t| x.i(t)).collect() };
        let (xf, xb) = (steps(&xf)?, steps(&xb)?);
        let mut fwd = Vec::with_capacity(s);
        let mut h = h0.clone();
        for t in 0..s {
            h = self
                .fwd
                .step_dropped(k, &xf[t], &h, Some(&m.i(t)?), drop.map(|d| &d[0]))?;
            fwd.push(h.clone());
        }
        let mut bwd = vec![h0.clone(); s];
        let mut h = h0;
        for t in (0..s).rev() {
            h = self
                .bwd
                .step_dropped(k, &xb[t], &h, Some(&m.i(t)?), drop.map(|d| &d[1]))?;
            bwd[t] = h.clone();
        }
        let annotations = Tensor::cat(&[Tensor::stack(&fwd, 1)?, Tensor::stack(&bwd, 1)?], 2)?;
        Ok(Encoded {
            annotations,
            bwd_first: bwd[0].clone(),
        })
    }
}

/// Recurrent dropout's masks as values (batch order).
fn drop_values(drop: Option<&[Tensor; 2]>) -> Result<Option<[Vec<f64>; 2]>> {
    let Some([f, b]) = drop else {
        return Ok(None);
    };
    let v = |x: &Tensor| crate::kernels::to_vec::<f64>(&x.to_dtype(DType::F64)?);
    Ok(Some([v(f)?, v(b)?]))
}
