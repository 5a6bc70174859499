//! Readout and output layer (model-spec §3 step 2): `r~ = W_o s_i + U_o t_{i−1} + V_o e(y_{i−1}) + b_o`,
//! `r = maxout_2(r~)` (H → H/2), `logits = W_2 (W_1 r) + b` (H/2 → E → V). The readout is never gated.

use candle_core::{Result, Tensor, D};
use candle_nn::VarBuilder;

pub struct Readout {
    pub w_o: Tensor,
    pub u_o: Tensor,
    pub v_o: Tensor,
    pub b_o: Tensor,
    pub w_1: Tensor,
    pub w_2: Tensor,
    pub b: Tensor,
    pub hidden: usize,
}

impl Readout {
    pub fn new(vb: VarBuilder, emb: usize, hidden: usize, vocab: usize) -> Result<Self> {
        Ok(Self {
            w_o: vb.get_with_hints((2 * hidden, hidden), "W_o", crate::init::ZERO)?,
            u_o: vb.get_with_hints((hidden, hidden), "U_o", crate::init::ZERO)?,
            v_o: vb.get_with_hints((emb, hidden), "V_o", crate::init::ZERO)?,
            b_o: vb.get_with_hints(hidden, "b_o", crate::init::ZERO)?,
            w_1: vb.get_with_hints((hidden / 2, emb), "W_1", crate::init::ZERO)?,
            w_2: vb.get_with_hints((emb, vocab), "W_2", crate::init::ZERO)?,
            b: vb.get_with_hints(vocab, "b", crate::init::ZERO)?,
            hidden,
        })
    }

    /// Logits `[N, V]` from contexts `[N, 2H]`, previous states `[N, H]` and previous-word embeddings `[N, E]`.
    pub fn logits(&self, ctx: &Tensor, t_prev: &Tensor, e_prev: &Tensor) -> Result<Tensor> {
        let n = ctx.dim(0)?;
        let r = (ctx.matmul(&self.w_o)? + t_prev.matmul(&self.u_o)? + e_prev.matmul(&self.v_o)?)?
            .broadcast_add(&self.b_o)?;
        let pairs = r.reshape((n, self.hidden / 2, 2))?;
        let m = pairs
            .narrow(D::Minus1, 0, 1)?
            .maximum(&pairs.narrow(D::Minus1, 1, 1)?)?
            .reshape((n, self.hidden / 2))?;
        m.matmul(&self.w_1)?
            .matmul(&self.w_2)?
            .broadcast_add(&self.b)
    }
}

/// `log softmax` over the last dimension from differentiable ops.
pub fn log_softmax(logits: &Tensor) -> Result<Tensor> {
    let m = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&m)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    shifted.broadcast_sub(&lse)
}
