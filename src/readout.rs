//! Readout and output layer (model-spec §3 step 2): `r~ = W_o s_i + U_o t_{i−1} + V_o e(y_{i−1}) + b_o`,
//! `r = maxout_2(r~)` (H → H/2), `logits = W_2 (W_1 r) + b` (H/2 → E → V). The readout is never gated.

use candle_core::{
    CpuStorage, CustomOp1, CustomOp2, CustomOp3, DType, Layout, Result, Shape, Tensor, D,
};
use rayon::prelude::*;

use crate::kernels::{by_dtype, simd_dispatch, slice, Real};
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

/// Per-row negative log-likelihood `−log softmax(logits)[target]` `[N]`, composed (the reference).
pub fn nll_reference(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    log_softmax(logits)?
        .gather(&targets.unsqueeze(1)?, 1)?
        .squeeze(1)?
        .neg()
}

/// Per-row negative log-likelihood, fused: one pass for the row maximum, one for the sum of exponentials;
/// nothing of size `[N, V]` is kept for the backward pass, which recomputes `softmax − onehot` row by row.
pub fn nll_fused(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let logits = logits.contiguous()?;
    let targets = targets.to_dtype(DType::U32)?.contiguous()?;
    logits.apply_op2(&targets, NllOp)
}

/// Log-probabilities `[N, V]` (inference only; no autodiff graph).
pub fn log_softmax_inference(logits: &Tensor) -> Result<Tensor> {
    if !logits.device().is_cpu() {
        return log_softmax(&logits.detach());
    }
    logits.contiguous()?.apply_op1_no_bwd(&LogSoftmaxOp)
}

/// `log Σ exp` of a row and its maximum.
#[inline(always)]
fn row_lse<T: Real>(row: &[T]) -> (T, T) {
    let m = crate::kernels::max_of(row);
    (m, m + crate::kernels::sum_exp_shifted(row, m).ln())
}

#[inline(always)]
fn nll_rows<T: Real>(logits: &[T], tgt: &[u32], out: &mut [T], v: usize) {
    for (i, o) in out.iter_mut().enumerate() {
        let row = &logits[i * v..(i + 1) * v];
        let (_, lse) = row_lse(row);
        *o = lse - row[tgt[i] as usize];
    }
}
simd_dispatch!(nll_rows_d, nll_rows_avx, nll_rows, (logits: &[T], tgt: &[u32], out: &mut [T], v: usize));

#[inline(always)]
fn nll_grad_rows<T: Real>(logits: &[T], tgt: &[u32], g: &[T], out: &mut [T], v: usize) {
    let rows = out.len() / v;
    for i in 0..rows {
        let row = &logits[i * v..(i + 1) * v];
        let (_, lse) = row_lse(row);
        let gi = g[i];
        let o = &mut out[i * v..(i + 1) * v];
        for (oj, &x) in o.iter_mut().zip(row) {
            *oj = gi * (x - lse).exp_v();
        }
        o[tgt[i] as usize] = o[tgt[i] as usize] - gi;
    }
}
simd_dispatch!(nll_grad_rows_d, nll_grad_rows_avx, nll_grad_rows, (logits: &[T], tgt: &[u32], g: &[T], out: &mut [T], v: usize));

#[inline(always)]
fn log_softmax_rows<T: Real>(logits: &[T], out: &mut [T], v: usize) {
    let rows = out.len() / v;
    for i in 0..rows {
        let row = &logits[i * v..(i + 1) * v];
        let (_, lse) = row_lse(row);
        for (o, &x) in out[i * v..(i + 1) * v].iter_mut().zip(row) {
            *o = x - lse;
        }
    }
}
simd_dispatch!(log_softmax_rows_d, log_softmax_rows_avx, log_softmax_rows, (logits: &[T], out: &mut [T], v: usize));

/// Rows per rayon task.
const ROWS_PER_TASK: usize = 16;

fn check_targets(tgt: &[u32], v: usize) -> Result<()> {
    if let Some(&t) = tgt.iter().find(|&&t| t as usize >= v) {
        candle_core::bail!("target id {t} is outside the vocabulary of {v}");
    }
    Ok(())
}

struct NllOp;

fn nll_fwd<T: Real>(
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let (n, v) = l1.shape().dims2()?;
    let x = slice::<T>(s1, l1)?;
    let tgt = slice::<u32>(s2, l2)?;
    check_targets(tgt, v)?;
    let mut out = vec![T::zero(); n];
    out.par_chunks_mut(ROWS_PER_TASK)
        .enumerate()
        .for_each(|(c, o)| {
            let r0 = c * ROWS_PER_TASK;
            let r1 = r0 + o.len();
            nll_rows_d(&x[r0 * v..r1 * v], &tgt[r0..r1], o, v)
        });
    Ok((T::to_cpu_storage_owned(out), Shape::from(n)))
}

impl CustomOp2 for NllOp {
    fn name(&self) -> &'static str {
        "fused-nll"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        by_dtype!(s1, nll_fwd, s1, l1, s2, l2)
    }
    fn bwd(
        &self,
        logits: &Tensor,
        targets: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let g = grad.contiguous()?;
        let d = logits.apply_op3_no_bwd(targets, &g, &NllGradOp)?;
        Ok((Some(d), None))
    }
}

/// `∂/∂logits = g_n (softmax − onehot(target))`.
struct NllGradOp;

fn nll_grad<T: Real>(
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
    s3: &CpuStorage,
    l3: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let (n, v) = l1.shape().dims2()?;
    let x = slice::<T>(s1, l1)?;
    let tgt = slice::<u32>(s2, l2)?;
    let g = slice::<T>(s3, l3)?;
    let mut out = vec![T::zero(); n * v];
    out.par_chunks_mut(ROWS_PER_TASK * v)
        .enumerate()
        .for_each(|(c, o)| {
            let r0 = c * ROWS_PER_TASK;
            let r1 = r0 + o.len() / v;
            nll_grad_rows_d(&x[r0 * v..r1 * v], &tgt[r0..r1], &g[r0..r1], o, v)
        });
    Ok((T::to_cpu_storage_owned(out), Shape::from((n, v))))
}

impl CustomOp3 for NllGradOp {
    fn name(&self) -> &'static str {
        "fused-nll-grad"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        by_dtype!(s1, nll_grad, s1, l1, s2, l2, s3, l3)
    }
}

struct LogSoftmaxOp;

fn log_softmax_fwd<T: Real>(s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
    let (n, v) = l.shape().dims2()?;
    let x = slice::<T>(s, l)?;
    let mut out = vec![T::zero(); n * v];
    out.par_chunks_mut(ROWS_PER_TASK * v)
        .enumerate()
        .for_each(|(c, o)| {
            let r0 = c * ROWS_PER_TASK;
            let r1 = r0 + o.len() / v;
            log_softmax_rows_d(&x[r0 * v..r1 * v], o, v)
        });
    Ok((T::to_cpu_storage_owned(out), Shape::from((n, v))))
}

impl CustomOp1 for LogSoftmaxOp {
    fn name(&self) -> &'static str {
        "fused-log-softmax"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        by_dtype!(s, log_softmax_fwd, s, l)
    }
}
