//! Bidirectional GRU encoder (model-spec §1): shared source embedding `E[x] + b_e`, a forward and a backward GRU,
//! annotations `h_j = [→h_j ; ←h_j]`. Input projections of all time steps are one matmul per direction.

use candle_core::{IndexOp, Result, Tensor, D};
use candle_nn::VarBuilder;

/// GRU cell parameters: `W` = [W_r | W_u | W] (in × 3H), `b` (H, candidate only), `U_ru` = [U_r | U_u] (H × 2H),
/// `U` (H × H).
pub struct Gru {
    pub w: Tensor,
    pub b: Tensor,
    pub u_ru: Tensor,
    pub u: Tensor,
    pub hidden: usize,
}

impl Gru {
    pub fn new(vb: VarBuilder, input: usize, hidden: usize) -> Result<Self> {
        Ok(Self {
            w: vb.get_with_hints((input, 3 * hidden), "W", crate::init::ZERO)?,
            b: vb.get_with_hints(hidden, "b", crate::init::ZERO)?,
            u_ru: vb.get_with_hints((hidden, 2 * hidden), "U_ru", crate::init::ZERO)?,
            u: vb.get_with_hints((hidden, hidden), "U", crate::init::ZERO)?,
            hidden,
        })
    }

    /// Input projections `[x W_r, x W_u, x W + b]` of every step: `[N, in]` → `[N, 3H]`.
    pub fn project(&self, x: &Tensor) -> Result<Tensor> {
        let zeros = Tensor::zeros(2 * self.hidden, self.b.dtype(), self.b.device())?;
        let bias = Tensor::cat(&[&zeros, &self.b], 0)?;
        x.matmul(&self.w)?.broadcast_add(&bias)
    }

    /// One step from a projected input `[B, 3H]` and the previous state `[B, H]`.
    pub fn step(&self, xp: &Tensor, h: &Tensor) -> Result<Tensor> {
        let hd = self.hidden;
        let ru = candle_nn::ops::sigmoid(&(xp.narrow(1, 0, 2 * hd)? + h.matmul(&self.u_ru)?)?)?;
        let r = ru.narrow(1, 0, hd)?;
        let u = ru.narrow(1, hd, hd)?;
        let cand = (xp.narrow(1, 2 * hd, hd)? + (r * h)?.matmul(&self.u)?)?.tanh()?;
        // u∘h~ + (1−u)∘h
        h + (u * (cand - h)?)?
    }
}

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
    pub fn new(vb: VarBuilder, vocab: usize, emb_dim: usize, hidden: usize) -> Result<Self> {
        Ok(Self {
            emb: vb.get_with_hints((vocab, emb_dim), "E", crate::init::ZERO)?,
            emb_b: vb.get_with_hints(emb_dim, "b_e", crate::init::ZERO)?,
            fwd: Gru::new(vb.pp("fwd"), emb_dim, hidden)?,
            bwd: Gru::new(vb.pp("bwd"), emb_dim, hidden)?,
            hidden,
        })
    }

    /// `src`: `[B, S]` u32 ids, `mask`: `[B, S]` (1 = word, 0 = padding), in the model dtype.
    pub fn forward(&self, src: &Tensor, mask: &Tensor) -> Result<Encoded> {
        let (b, s) = src.dims2()?;
        let e = self
            .emb
            .embedding(&src.flatten_all()?)?
            .broadcast_add(&self.emb_b)?;
        // Time-major so every step reads a contiguous slice.
        let xf = self
            .fwd
            .project(&e)?
            .reshape((b, s, 3 * self.hidden))?
            .transpose(0, 1)?
            .contiguous()?;
        let xb = self
            .bwd
            .project(&e)?
            .reshape((b, s, 3 * self.hidden))?
            .transpose(0, 1)?
            .contiguous()?;
        let m = mask.transpose(0, 1)?.contiguous()?.unsqueeze(D::Minus1)?; // [S, B, 1]
        let h0 = Tensor::zeros((b, self.hidden), e.dtype(), e.device())?;
        let mut fwd = Vec::with_capacity(s);
        let mut h = h0.clone();
        for t in 0..s {
            let hn = self.fwd.step(&xf.i(t)?, &h)?;
            h = (&h + m.i(t)?.broadcast_mul(&(hn - &h)?)?)?;
            fwd.push(h.clone());
        }
        let mut bwd = vec![h0.clone(); s];
        let mut h = h0;
        for t in (0..s).rev() {
            let hn = self.bwd.step(&xb.i(t)?, &h)?;
            h = (&h + m.i(t)?.broadcast_mul(&(hn - &h)?)?)?;
            bwd[t] = h.clone();
        }
        let annotations = Tensor::cat(&[Tensor::stack(&fwd, 1)?, Tensor::stack(&bwd, 1)?], 2)?;
        Ok(Encoded {
            annotations,
            bwd_first: bwd[0].clone(),
        })
    }
}
