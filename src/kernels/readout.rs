//! The readout's and the output layer's row maths and custom ops (model-spec §3 step 2): maxout, the output
//! layer with its loss (log-softmax + NLL, label smoothing), decoding's log-normaliser, and the fused readout
//! rows of the decoder's output, each beside its composed reference. The concept is [`crate::model::readout`].

use candle_core::{CpuStorage, CustomOp1, CustomOp3, DType, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

use crate::kernels::{by_dtype, simd_dispatch, slice, Real};

/// Maxout over adjacent pairs `[N, H]` → `[N, H/2]`, composed (reference).
pub fn maxout_reference(r: &Tensor) -> Result<Tensor> {
    let (n, h) = r.dims2()?;
    let pairs = r.reshape((n, h / 2, 2))?;
    pairs
        .narrow(D::Minus1, 0, 1)?
        .maximum(&pairs.narrow(D::Minus1, 1, 1)?)?
        .reshape((n, h / 2))
}

/// Maxout as one fused op (the gradient goes to the larger of each pair, split evenly on a tie as the
/// reference does).
pub fn maxout_fused(r: &Tensor) -> Result<Tensor> {
    r.contiguous()?.apply_op1(Maxout)
}

struct Maxout;

/// Maxout pairs per rayon task.
const PAIRS_PER_TASK: usize = 1 << 12;

/// The larger of each adjacent pair of `x`, on both cores.
fn maxout_pairs<T: Real>(x: &[T]) -> Vec<T> {
    x.par_chunks(2 * PAIRS_PER_TASK)
        .flat_map_iter(|c| {
            c.chunks_exact(2)
                .map(|p| if p[0] >= p[1] { p[0] } else { p[1] })
        })
        .collect()
}

/// The maxout's input gradient from the inputs `x` and the output gradient `g`: each pair's gradient goes to its
/// larger element, split evenly on a tie (as the reference's does).
fn maxout_pairs_grad<T: Real>(x: &[T], g: &[T]) -> Vec<T> {
    let half = T::from_f64c(0.5);
    let mut d = crate::kernels::zeroed::<T>(x.len());
    d.par_chunks_mut(2 * PAIRS_PER_TASK)
        .zip(x.par_chunks(2 * PAIRS_PER_TASK))
        .zip(g.par_chunks(PAIRS_PER_TASK))
        .for_each(|((d, x), g)| {
            for ((dp, p), &gk) in d.chunks_exact_mut(2).zip(x.chunks_exact(2)).zip(g) {
                if p[0] > p[1] {
                    dp[0] = gk;
                } else if p[1] > p[0] {
                    dp[1] = gk;
                } else {
                    dp[0] = gk * half;
                    dp[1] = gk * half;
                }
            }
        });
    d
}

fn maxout_fwd<T: Real>(s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
    let (n, h) = l.shape().dims2()?;
    let out = maxout_pairs(slice::<T>(s, l)?);
    Ok((T::to_cpu_storage_owned(out), Shape::from((n, h / 2))))
}

fn maxout_grad<T: Real>(r: &Tensor, g: &Tensor) -> Result<Tensor> {
    let x: Vec<T> = r.flatten_all()?.to_vec1()?;
    let g: Vec<T> = g.flatten_all()?.to_vec1()?;
    Tensor::from_vec(maxout_pairs_grad(&x, &g), r.shape(), r.device())
}

impl CustomOp1 for Maxout {
    fn name(&self) -> &'static str {
        "fused-maxout"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        crate::kernels::profile::timed("maxout forward", || by_dtype!(s, maxout_fwd, s, l))
    }
    fn bwd(&self, r: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        crate::kernels::profile::timed("maxout backward", || {
            let d = match r.dtype() {
                DType::F32 => maxout_grad::<f32>(r, grad)?,
                DType::F64 => maxout_grad::<f64>(r, grad)?,
                _ => candle_core::bail!("fused kernels support f32 and f64"),
            };
            Ok(Some(d))
        })
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

/// `log Σ exp` of a row and its maximum.
#[inline(always)]
fn row_lse<T: Real>(row: &[T]) -> (T, T) {
    let m = crate::kernels::max_of(row);
    (m, m + crate::kernels::sum_exp_shifted(row, m).ln())
}

#[inline(always)]
fn log_normaliser_row<T: Real>(row: &[T], out: &mut T) {
    *out = row_lse(row).1;
}
simd_dispatch!(log_normaliser_row_d, log_normaliser_row_avx, log_normaliser_row, (row: &[T], out: &mut T));

/// `log Σ_j exp(x_j)` of a row of logits (beam search normalises only the words it keeps).
pub fn log_normaliser(row: &[f32]) -> f32 {
    let mut out = 0.0;
    log_normaliser_row_d(row, &mut out);
    out
}

/// Rows per rayon task.
const ROWS_PER_TASK: usize = 16;

fn check_targets(tgt: &[u32], v: usize) -> Result<()> {
    if let Some(&t) = tgt.iter().find(|&&t| t as usize >= v) {
        candle_core::bail!("target id {t} is outside the vocabulary of {v}");
    }
    Ok(())
}

/// The output layer and its loss, composed (reference): `−log softmax(x W_2 + b)[target]` per row `[N]`.
pub fn output_nll_reference(
    x: &Tensor,
    w_2: &Tensor,
    b: &Tensor,
    targets: &Tensor,
) -> Result<Tensor> {
    nll_reference(&x.matmul(w_2)?.broadcast_add(b)?, targets)
}

/// [`output_nll_reference`] with label smoothing `ε` (uniform over the vocabulary, the target included):
/// `−(1 − ε) log p(target) − ε · mean_k log p(k)` per row; `ε = 0` is the plain loss.
pub fn output_nll_smoothed_reference(
    x: &Tensor,
    w_2: &Tensor,
    b: &Tensor,
    targets: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    let logits = x.matmul(w_2)?.broadcast_add(b)?;
    if eps == 0.0 {
        return nll_reference(&logits, targets);
    }
    let lp = log_softmax(&logits)?;
    let nll = lp.gather(&targets.unsqueeze(1)?, 1)?.squeeze(1)?.neg()?;
    let uniform = lp.mean(1)?.neg()?;
    nll.affine(1.0 - eps, 0.0)? + uniform.affine(eps, 0.0)?
}

/// The output layer and its loss as one op: the `[N, V]` logits are computed by one GEMM into a buffer that
/// the backward pass turns in place into `g (softmax − onehot)`; only `∂x`, `∂W_2` and `∂b` reach the
/// autodiff graph (no `[N, V]` tensor is allocated, broadcast or accumulated by it).
pub fn output_nll_fused(x: &Tensor, w_2: &Tensor, b: &Tensor, targets: &Tensor) -> Result<Tensor> {
    output_nll_smoothed_fused(x, w_2, b, targets, 0.0)
}

/// [`output_nll_fused`] with label smoothing `ε` (see [`output_nll_smoothed_reference`]): the row's
/// gradient is `g (softmax − (1 − ε) onehot − ε / V)`.
pub fn output_nll_smoothed_fused(
    x: &Tensor,
    w_2: &Tensor,
    b: &Tensor,
    targets: &Tensor,
    eps: f64,
) -> Result<Tensor> {
    if !(0.0..1.0).contains(&eps) {
        candle_core::bail!("label smoothing {eps}: it must be in [0, 1)");
    }
    let targets: Vec<u32> = targets.to_dtype(DType::U32)?.flatten_all()?.to_vec1()?;
    x.contiguous()?.apply_op3(
        &w_2.contiguous()?,
        &b.contiguous()?,
        OutputNll {
            targets,
            eps,
            logits: std::sync::Mutex::new(None),
        },
    )
}

struct OutputNll {
    targets: Vec<u32>,
    /// Label smoothing ε (0: the plain loss).
    eps: f64,
    /// The forward pass's logits (bias included) and each row's log-normaliser, consumed by the backward pass.
    logits: std::sync::Mutex<Option<(CpuStorage, Vec<f64>)>>,
}

/// The last output layer's `[N, V]` buffer, kept for the next one. At paper size it holds 200 MB; a fresh
/// buffer of that size costs a page fault for each 4 KiB page whenever the allocator maps new memory for
/// it (measured in docs/design-notes.md, "Measurements behind code choices").
static SPARE_LOGITS: std::sync::Mutex<crate::kernels::AccBuf> =
    std::sync::Mutex::new(crate::kernels::AccBuf::Empty);

/// A buffer of `len` elements (contents unspecified: every element is written before it is read), the
/// spare one when it is large enough.
fn logits_buffer<T: Real>(len: usize) -> Vec<T> {
    let spare = T::acc_take(&mut SPARE_LOGITS.lock().expect("spare logits"));
    match spare {
        Some(mut buf) if buf.capacity() >= len => {
            buf.truncate(len);
            buf.resize(len, T::zero());
            buf
        }
        _ => crate::kernels::zeroed::<T>(len),
    }
}

/// Keep `buf` for the next output layer pass (the larger of it and any buffer kept already).
fn keep_logits_buffer<T: Real>(buf: Vec<T>) {
    let mut spare = SPARE_LOGITS.lock().expect("spare logits");
    let kept = match &*spare {
        crate::kernels::AccBuf::F32(v) => v.capacity() * 4,
        crate::kernels::AccBuf::F64(v) => v.capacity() * 8,
        crate::kernels::AccBuf::Empty => 0,
    };
    if buf.capacity() * std::mem::size_of::<T>() >= kept {
        *spare = T::acc_from(buf);
    }
}

impl Drop for OutputNll {
    /// A forward pass without a backward pass (a loss that is only evaluated) leaves its logits here.
    fn drop(&mut self) {
        let cached = self.logits.get_mut().map(|c| c.take());
        match cached {
            Ok(Some((CpuStorage::F32(buf), _))) => keep_logits_buffer(buf),
            Ok(Some((CpuStorage::F64(buf), _))) => keep_logits_buffer(buf),
            _ => {}
        }
    }
}

/// The bias added to each row of logits, its log-normaliser, and its loss: `lse − x_t`, or with label
/// smoothing (`keep` = 1 − ε, `u` = ε / V, nonzero) `lse − keep·x_t − u·Σ_k x_k`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn bias_nll_rows<T: Real>(
    logits: &mut [T],
    b: &[T],
    tgt: &[u32],
    out: &mut [T],
    lses: &mut [T],
    keep: T,
    u: T,
) {
    let v = b.len();
    for (i, (o, l)) in out.iter_mut().zip(lses.iter_mut()).enumerate() {
        let row = &mut logits[i * v..(i + 1) * v];
        for (x, &bb) in row.iter_mut().zip(b) {
            *x += bb;
        }
        let (_, lse) = row_lse(row);
        *l = lse;
        if u == T::zero() {
            *o = lse - row[tgt[i] as usize];
        } else {
            let sum = row.iter().fold(T::zero(), |a, &x| a + x);
            *o = lse - keep * row[tgt[i] as usize] - u * sum;
        }
    }
}
simd_dispatch!(bias_nll_rows_d, bias_nll_rows_avx, bias_nll_rows, (logits: &mut [T], b: &[T], tgt: &[u32], out: &mut [T], lses: &mut [T], keep: T, u: T));

/// `g (softmax − onehot)` in place of each row of logits (with label smoothing, `keep` = 1 − ε and `u` = ε / V
/// nonzero: `g (softmax − keep·onehot − u)`), each finished row also added into `db` (the bias gradient's
/// share of these rows, formed while the row is in cache).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn nll_grad_rows_inplace<T: Real>(
    logits: &mut [T],
    tgt: &[u32],
    g: &[T],
    lses: &[T],
    db: &mut [T],
    keep: T,
    u: T,
) {
    let v = db.len();
    for (i, (&gi, &lse)) in g.iter().zip(lses).enumerate() {
        let row = &mut logits[i * v..(i + 1) * v];
        if u == T::zero() {
            for x in row.iter_mut() {
                *x = gi * (*x - lse).exp_v();
            }
            row[tgt[i] as usize] -= gi;
        } else {
            for x in row.iter_mut() {
                *x = gi * ((*x - lse).exp_v() - u);
            }
            row[tgt[i] as usize] -= gi * keep;
        }
        for (d, &x) in db.iter_mut().zip(row.iter()) {
            *d += x;
        }
    }
}
simd_dispatch!(nll_grad_rows_inplace_d, nll_grad_rows_inplace_avx, nll_grad_rows_inplace, (logits: &mut [T], tgt: &[u32], g: &[T], lses: &[T], db: &mut [T], keep: T, u: T));

#[allow(clippy::too_many_arguments)]
fn output_nll_fwd<T: Real>(
    op: &OutputNll,
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
    s3: &CpuStorage,
    l3: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let (n, e) = l1.shape().dims2()?;
    let (e2, v) = l2.shape().dims2()?;
    let b = slice::<T>(s3, l3)?;
    if e != e2 || b.len() != v || op.targets.len() != n {
        candle_core::bail!(
            "fused output layer: the rows are [N {n}, E {e}] and the weight [E {e2}, V {v}]: E must agree, the bias \
             hold V values (has {}) and the targets N (has {})",
            b.len(),
            op.targets.len()
        );
    }
    check_targets(&op.targets, v)?;
    // The logits `[N, V]` into the kept buffer (or a fresh one filled on both cores), overwritten by the GEMM.
    let _t = crate::kernels::profile::Scope::new("  output nll fwd: logits GEMM");
    let mut buf = logits_buffer::<T>(n * v);
    crate::kernels::gemm_into(
        n,
        v,
        e,
        &mut buf,
        v,
        false,
        crate::kernels::Mat::rows(slice::<T>(s1, l1)?, e),
        crate::kernels::Mat::rows(slice::<T>(s2, l2)?, v),
    );
    drop(_t);
    let _t = crate::kernels::profile::Scope::new("  output nll fwd: bias and normalisers");
    let mut out = vec![T::zero(); n];
    let mut lses = vec![T::zero(); n];
    let (keep, u) = smoothing::<T>(op.eps, v);
    {
        out.par_chunks_mut(ROWS_PER_TASK)
            .zip(lses.par_chunks_mut(ROWS_PER_TASK))
            .zip(buf.par_chunks_mut(ROWS_PER_TASK * v))
            .enumerate()
            .for_each(|(c, ((o, l), x))| {
                let r0 = c * ROWS_PER_TASK;
                bias_nll_rows_d(x, b, &op.targets[r0..r0 + o.len()], o, l, keep, u)
            });
    }
    let lses = lses
        .iter()
        .map(|x| candle_core::WithDType::to_f64(*x))
        .collect();
    *op.logits.lock().expect("logits cache") = Some((T::to_cpu_storage_owned(buf), lses));
    Ok((T::to_cpu_storage_owned(out), Shape::from(n)))
}

/// Label smoothing `ε` over `V` words as the rows' `(keep, u)` = `(1 − ε, ε / V)`.
fn smoothing<T: Real>(eps: f64, v: usize) -> (T, T) {
    (T::from_f64c(1.0 - eps), T::from_f64c(eps / v.max(1) as f64))
}

/// `g (softmax − onehot)` in place of the logits, from each row's log-normaliser (computed here when
/// `lses` is `None`), and its column sums (the bias gradient) from the same pass: each task sums its rows
/// into its own accumulator, and the accumulators are added at the end.
fn output_nll_grad<T: Real>(
    targets: &[u32],
    eps: f64,
    mut logits: Vec<T>,
    lses: Option<Vec<f64>>,
    g: &Tensor,
    v: usize,
) -> Result<(Vec<T>, Vec<T>)> {
    let g: Vec<T> = g.to_dtype(T::DTYPE)?.flatten_all()?.to_vec1()?;
    let lses: Vec<T> = match lses {
        Some(l) => l.into_iter().map(T::from_f64c).collect(),
        None => logits.par_chunks(v).map(|row| row_lse(row).1).collect(),
    };
    let n = targets.len();
    let (keep, u) = smoothing::<T>(eps, v);
    // A few tasks per thread (load balance), each with a `V`-long accumulator.
    let per = n
        .div_ceil(4 * rayon::current_num_threads())
        .max(ROWS_PER_TASK);
    let partial: Vec<Vec<T>> = logits
        .par_chunks_mut(per * v.max(1))
        .enumerate()
        .map(|(c, x)| {
            let mut db = vec![T::zero(); v];
            for (k, rows) in x.chunks_mut(ROWS_PER_TASK * v.max(1)).enumerate() {
                let r0 = c * per + k * ROWS_PER_TASK;
                let r1 = r0 + rows.len() / v.max(1);
                nll_grad_rows_inplace_d(
                    rows,
                    &targets[r0..r1],
                    &g[r0..r1],
                    &lses[r0..r1],
                    &mut db,
                    keep,
                    u,
                );
            }
            db
        })
        .collect();
    let mut db = vec![T::zero(); v];
    for p in &partial {
        for (a, &x) in db.iter_mut().zip(p) {
            *a += x;
        }
    }
    Ok((logits, db))
}

impl CustomOp3 for OutputNll {
    fn name(&self) -> &'static str {
        "fused-output-nll"
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
        crate::kernels::profile::timed("output nll forward", || {
            by_dtype!(s1, output_nll_fwd, self, s1, l1, s2, l2, s3, l3)
        })
    }
    fn bwd(
        &self,
        x: &Tensor,
        w_2: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        crate::kernels::profile::timed("output nll backward", || {
            let cached = self.logits.lock().expect("logits cache").take();
            let (logits, lses) = match cached {
                Some((c, l)) => (c, Some(l)),
                None => {
                    // A second backward pass: recompute the logits.
                    let l = x
                        .detach()
                        .matmul(&w_2.detach())?
                        .broadcast_add(&b.detach())?;
                    let (st, _) = l.storage_and_layout();
                    match &*st {
                        candle_core::Storage::Cpu(c) => (c.clone(), None),
                        _ => candle_core::bail!("fused output layer: not on the CPU"),
                    }
                }
            };
            fn grads<T: Real>(
                op: &OutputNll,
                logits: Vec<T>,
                lses: Option<Vec<f64>>,
                x: &Tensor,
                w_2: &Tensor,
                grad: &Tensor,
            ) -> Result<(Tensor, Tensor, Tensor)> {
                let ((n, e), v) = (x.dims2()?, w_2.dim(1)?);
                let _t = crate::kernels::profile::Scope::new(
                    "  output nll bwd: softmax rows, bias sums",
                );
                let (d, db) = output_nll_grad(&op.targets, op.eps, logits, lses, grad, v)?;
                drop(_t);
                let _t = crate::kernels::profile::Scope::new("  output nll bwd: GEMMs");
                let (x, w_2) = (x.contiguous()?, w_2.contiguous()?);
                let ((xs, xl), (ws, wl)) = (x.storage_and_layout(), w_2.storage_and_layout());
                let (dx, dw) = crate::kernels::product_grads_slices(
                    n,
                    e,
                    v,
                    crate::kernels::storage_slice::<T>(&xs, xl)?,
                    crate::kernels::storage_slice::<T>(&ws, wl)?,
                    &d,
                );
                keep_logits_buffer(d);
                let dev = x.device();
                Ok((
                    Tensor::from_vec(dx, (n, e), dev)?,
                    Tensor::from_vec(dw, (e, v), dev)?,
                    Tensor::from_vec(db, v, dev)?,
                ))
            }
            let (dx, dw, db) = match logits {
                CpuStorage::F32(buf) => grads(self, buf, lses, x, w_2, grad)?,
                CpuStorage::F64(buf) => grads(self, buf, lses, x, w_2, grad)?,
                _ => candle_core::bail!("fused kernels support f32 and f64"),
            };
            Ok((
                Some(dx),
                crate::kernels::hand_over(w_2, dw),
                crate::kernels::hand_over(b, db),
            ))
        })
    }
}

/// The readout's weights that [`hidden_rows_fused`] reads (model-spec §3 step 2): `U_o` `[H, H]`, `W_o`
/// `[2H, H]`, `V_o` `[E, H]`, `b_o` `[H]`, `W_1` `[H/2, E]`, and `H` (see
/// [`crate::model::readout::Readout::rows_weights`]); with layer normalisation (model-spec §5b) the gains and
/// biases `[H]` of its three terms, `[g, β]` each, in the order `W_o s`, `U_o t`, `V_o e`.
pub struct ReadoutWeights<'a> {
    pub u_o: &'a Tensor,
    pub w_o: &'a Tensor,
    pub v_o: &'a Tensor,
    pub b_o: &'a Tensor,
    pub w_1: &'a Tensor,
    pub hidden: usize,
    pub ln: Option<[[&'a Tensor; 2]; 3]>,
}

/// The readout's hidden layer `W_1 maxout([t_{i−1} | s_i] [U_o; W_o] + e(y_{i−1}) V_o + b_o)` `[B·T, E]` for the
/// fused decoder's rows `ts` `[B·T, 3H]` (batch-major `(b, i)`) and the target embeddings `e` `[B·T, E]` (row
/// `(b, i)` is `e(y_i)`; the readout of step `i` reads `e(y_{i−1})`, zero at `i = 0`), as one fused op: the same
/// computation as [`crate::model::readout::Readout::hidden_stacked`] on the shifted embeddings, without the
/// graph's concatenated weight, shifted copy, sums and maxout nodes, whose gradients candle would zero-fill and add at full size each.
///
/// With `lengths` (each sentence's target length, EOS included), only the rows of words are computed: the
/// result is `[N, E]` for the `N` rows `(b, i)` with `i < lengths[b]`, in batch-major order, and the padded
/// rows' inputs get zero gradient.
///
/// With layer normalisation (`ro.ln`) each of the three terms is normalised before the sum:
/// `r~ = LN_W_o(s W_o) + LN_U_o(t U_o) + LN_V_o(e V_o) + b_o`, as [`crate::model::readout::Readout::hidden`].
pub fn hidden_rows_fused<'a>(
    ro: ReadoutWeights,
    ts: impl Into<crate::kernels::Input<'a>>,
    e: &Tensor,
    t_len: usize,
    lengths: Option<&[usize]>,
) -> Result<Tensor> {
    use crate::kernels::Shared;
    let ts: crate::kernels::Input = ts.into();
    let (n, h3) = ts.tensor().dims2()?;
    let (n2, ed) = e.dims2()?;
    let h = ro.hidden;
    let ok = h3 == 3 * h
        && n2 == n
        && t_len > 0
        && n % t_len == 0
        && h % 2 == 0
        && ro.u_o.dims2()? == (h, h)
        && ro.w_o.dims2()? == (2 * h, h)
        && ro.v_o.dims2()? == (ed, h)
        && ro.b_o.dims1()? == h
        && ro.w_1.dims2()? == (h / 2, ed)
        && ro
            .ln
            .is_none_or(|l| l.iter().flatten().all(|x| x.dims() == [h]))
        && lengths.is_none_or(|l| l.len() * t_len == n && l.iter().all(|&x| x <= t_len));
    if !ok {
        candle_core::bail!(
            "fused readout: the state rows are [N {n}, {h3}] (3H for H {h}, H even) and the embeddings [{n2}, E \
             {ed}] (N rows, a multiple of T {t_len}); U_o {:?} must be [H, H], W_o {:?} [2H, H], V_o {:?} [E, H], \
             b_o {:?} [H], W_1 {:?} [H/2, E], layer normalisation's gains and biases [H]; lengths {:?} (B of \
             them, each ≤ T)",
            ro.u_o.dims(),
            ro.w_o.dims(),
            ro.v_o.dims(),
            ro.b_o.dims(),
            ro.w_1.dims(),
            lengths.map(|l| l.len())
        );
    }
    // The rows computed: every row, or the words' rows (`None` when that is every row too).
    let rows = lengths.and_then(|l| {
        let rows: Vec<usize> = l
            .iter()
            .enumerate()
            .flat_map(|(b, &len)| b * t_len..b * t_len + len)
            .collect();
        (rows.len() < n).then_some(rows)
    });
    let sh = Shared::new;
    let op = ReadoutRows {
        ts: ts.into_shared()?,
        e: sh(e)?,
        w: [
            sh(ro.u_o)?,
            sh(ro.w_o)?,
            sh(ro.v_o)?,
            sh(ro.b_o)?,
            sh(ro.w_1)?,
        ],
        ln: ro
            .ln
            .map(|l| -> Result<[crate::kernels::Shared; 6]> {
                let [[g0, b0], [g1, b1], [g2, b2]] = l;
                Ok([sh(g0)?, sh(b0)?, sh(g1)?, sh(b1)?, sh(g2)?, sh(b2)?])
            })
            .transpose()?,
        t_len,
        rows,
        saved: Default::default(),
    };
    let tokens: Vec<&Tensor> = [&op.ts, &op.e]
        .into_iter()
        .chain(&op.w)
        .chain(op.ln.iter().flatten())
        .map(|x| &x.token)
        .collect();
    Tensor::cat(&tokens, 0)?.apply_op1(op)
}

struct ReadoutRows {
    ts: crate::kernels::Shared,
    e: crate::kernels::Shared,
    /// `U_o`, `W_o`, `V_o`, `b_o`, `W_1`.
    w: [crate::kernels::Shared; 5],
    /// Layer normalisation's gains and biases of the terms `W_o s`, `U_o t`, `V_o e` (`g`, `β` each).
    ln: Option<[crate::kernels::Shared; 6]>,
    t_len: usize,
    /// The rows of `ts` and `e` computed, when not all of them (see [`hidden_rows_fused`]).
    rows: Option<Vec<usize>>,
    saved: crate::kernels::SavedSlot,
}

/// The forward pass's `e_prev`, `r~` and `maxout(r~)`, the computed rows of `ts` when they are not all, and,
/// with layer normalisation, the terms' `x̂` and `1/σ` (`[N, H]` and `[N]` each, in the order of
/// [`ReadoutRows::ln`]).
struct ReadoutSaved<T> {
    e_prev: Vec<T>,
    r: Vec<T>,
    m: Vec<T>,
    ts_rows: Option<Vec<T>>,
    ln: Option<[(Vec<T>, Vec<T>); 3]>,
}

impl ReadoutRows {
    /// Layer normalisation's gains and biases as values, in the order of [`ReadoutRows::ln`].
    fn ln_values<T: Real>(&self) -> Result<Option<Vec<Vec<T>>>> {
        self.ln
            .as_ref()
            .map(|l| {
                l.iter()
                    .map(|x| crate::kernels::to_vec::<T>(&x.tensor))
                    .collect()
            })
            .transpose()
    }

    /// The input row of computed row `c`.
    fn row(&self, c: usize) -> usize {
        self.rows.as_ref().map_or(c, |r| r[c])
    }
}

impl ReadoutRows {
    fn forward<T: Real>(&self) -> Result<(CpuStorage, Shape)> {
        use crate::kernels::{gemm_into, product, storage_slice, tiled, zeroed, Mat};
        let (n_all, h3) = self.ts.tensor.dims2()?;
        let n = self.rows.as_ref().map_or(n_all, Vec::len);
        let ed = self.e.tensor.dim(1)?;
        let (h, tl) = (h3 / 3, self.t_len);
        let vals: Vec<Vec<T>> = self
            .w
            .iter()
            .map(|w| crate::kernels::to_vec::<T>(&w.tensor))
            .collect::<Result<_>>()?;
        let (u_o, w_o, v_o, b_o, w_1) = (&vals[0], &vals[1], &vals[2], &vals[3], &vals[4]);
        let (ts_g, ts_l) = self.ts.tensor.storage_and_layout();
        let ts_all = storage_slice::<T>(&ts_g, ts_l)?;
        // The computed rows of `ts`, gathered when they are not all.
        let ts_rows = self.rows.as_ref().map(|rows| {
            let mut out = zeroed::<T>(rows.len() * h3);
            out.par_chunks_mut(h3)
                .zip(rows.par_iter())
                .for_each(|(o, &row)| o.copy_from_slice(&ts_all[row * h3..(row + 1) * h3]));
            out
        });
        let ts = ts_rows.as_deref().unwrap_or(ts_all);
        let (e_g, e_l) = self.e.tensor.storage_and_layout();
        let e = storage_slice::<T>(&e_g, e_l)?;
        // e(y_{i−1}) per row, zero at i = 0.
        let mut e_prev = zeroed::<T>(n * ed);
        if ed > 0 {
            e_prev
                .par_chunks_mut(ed)
                .enumerate()
                .map(|(c, o)| (self.row(c), o))
                .filter(|(row, _)| row % tl != 0)
                .for_each(|(row, o)| o.copy_from_slice(&e[(row - 1) * ed..row * ed]));
        }
        let t_part = Mat {
            data: ts,
            rs: h3,
            cs: 1,
        };
        let s_part = Mat {
            data: ts.get(h..).unwrap_or(&[]),
            rs: h3,
            cs: 1,
        };
        let mut r = tiled(n, b_o);
        let mut ln_saved = None;
        match self.ln_values::<T>()? {
            None => {
                gemm_into(n, h, h, &mut r, h, true, t_part, Mat::rows(u_o, h));
                gemm_into(n, h, 2 * h, &mut r, h, true, s_part, Mat::rows(w_o, h));
                let e_rows = Mat::rows(&e_prev, ed);
                gemm_into(n, h, ed, &mut r, h, true, e_rows, Mat::rows(v_o, h));
            }
            Some(lv) => {
                // Each term on its own, normalised in place, then added in the composed form's order.
                let products = [
                    (s_part, 2 * h, &w_o[..]),
                    (t_part, h, &u_o[..]),
                    (Mat::rows(&e_prev, ed), ed, &v_o[..]),
                ];
                let mut saved: [(Vec<T>, Vec<T>); 3] = Default::default();
                for (j, (lhs, k, w)) in products.into_iter().enumerate() {
                    let mut term = zeroed::<T>(n * h);
                    gemm_into(n, h, k, &mut term, h, false, lhs, Mat::rows(w, h));
                    let (xh, rs) = (zeroed::<T>(n * h), zeroed::<T>(n));
                    saved[j] = (xh, rs);
                    let (xh, rs) = &mut saved[j];
                    crate::kernels::layer_norm::ln_rows_forward(
                        (n, h, h),
                        &mut term,
                        &lv[2 * j],
                        &lv[2 * j + 1],
                        &[h],
                        xh,
                        rs,
                    );
                    r.par_chunks_mut(h.max(1))
                        .zip(term.par_chunks(h.max(1)))
                        .for_each(|(o, x)| {
                            for (a, &v) in o.iter_mut().zip(x) {
                                *a += v;
                            }
                        });
                }
                ln_saved = Some(saved);
            }
        }
        let m = maxout_pairs(&r);
        let hid = product(n, ed, h / 2, Mat::rows(&m, h / 2), Mat::rows(w_1, ed));
        drop((ts_g, e_g));
        *self.saved.lock().expect("saved activations") = Some(Box::new(ReadoutSaved {
            e_prev,
            r,
            m,
            ts_rows,
            ln: ln_saved,
        }));
        Ok((T::to_cpu_storage_owned(hid), Shape::from((n, ed))))
    }

    fn backward<T: Real>(&self, grad: &Tensor) -> Result<()> {
        use crate::kernels::{gemm_into, product, storage_slice, zeroed, Mat};
        let (n_all, h3) = self.ts.tensor.dims2()?;
        let n = self.rows.as_ref().map_or(n_all, Vec::len);
        let ed = self.e.tensor.dim(1)?;
        let (h, tl) = (h3 / 3, self.t_len);
        let ReadoutSaved {
            e_prev,
            r,
            m,
            ts_rows,
            ln,
        } = crate::kernels::take_saved::<ReadoutSaved<T>>(&self.saved, "fused readout")?;
        let vals: Vec<Vec<T>> = [&self.w[0], &self.w[1], &self.w[2], &self.w[4]]
            .iter()
            .map(|w| crate::kernels::to_vec::<T>(&w.tensor))
            .collect::<Result<_>>()?;
        let (u_o, w_o, v_o, w_1) = (&vals[0], &vals[1], &vals[2], &vals[3]);
        let grad = grad.contiguous()?;
        let (g_g, g_l) = grad.storage_and_layout();
        let g = storage_slice::<T>(&g_g, g_l)?; // ∂hid [N, E]
        let (ts_g, ts_l) = self.ts.tensor.storage_and_layout();
        let ts = match &ts_rows {
            Some(x) => x.as_slice(),
            None => storage_slice::<T>(&ts_g, ts_l)?,
        };
        let hh = h / 2;
        // Through W_1 and the maxout (a tie splits the gradient evenly, as the reference's does).
        let dm = product(n, hh, ed, Mat::rows(g, ed), Mat::t(w_1, ed));
        let d_w1 = product(hh, ed, n, Mat::t(&m, hh), Mat::rows(g, ed));
        let dr = maxout_pairs_grad(&r, &dm);
        // With layer normalisation: back through each term's, its gain's and bias's gradients gathered
        // (`[∂g, ∂β]` per term), and the terms' own gradients before it.
        let normed = match (&ln, self.ln_values::<T>()?) {
            (Some(saved), Some(lv)) => {
                let mut gb: Vec<Vec<T>> = (0..6).map(|_| vec![T::zero(); h]).collect();
                let mut d_terms: [Vec<T>; 3] = Default::default();
                for (j, ((xh, rs), gbj)) in saved.iter().zip(gb.chunks_exact_mut(2)).enumerate() {
                    let mut d = dr.clone();
                    let [dg, db] = gbj else { unreachable!("pairs") };
                    crate::kernels::layer_norm::ln_rows_backward(
                        (n, h, h),
                        &mut d,
                        &lv[2 * j],
                        &[h],
                        xh,
                        rs,
                        dg,
                        db,
                    );
                    d_terms[j] = d;
                }
                Some((d_terms, gb))
            }
            _ => None,
        };
        // The gradient each term's product receives: `∂r~` itself, or through its normalisation.
        let (dr_s, dr_t, dr_e): (&[T], &[T], &[T]) = match &normed {
            Some((d, _)) => (&d[0], &d[1], &d[2]),
            None => (&dr, &dr, &dr),
        };
        // ∂[t | s] = ∂r [U_o; W_o]ᵀ, ∂e_prev = ∂r V_oᵀ (shifted back onto e's rows), and the weights'.
        let mut d_ts = zeroed::<T>(n * h3);
        gemm_into(
            n,
            h,
            h,
            &mut d_ts,
            h3,
            false,
            Mat::rows(dr_t, h),
            Mat::t(u_o, h),
        );
        gemm_into(
            n,
            2 * h,
            h,
            &mut d_ts[h..],
            h3,
            false,
            Mat::rows(dr_s, h),
            Mat::t(w_o, h),
        );
        let d_ep = product(n, ed, h, Mat::rows(dr_e, h), Mat::t(v_o, h));
        // Shifted back onto e's rows: computed row (b, i) read e row (b, i − 1).
        let mut d_e = zeroed::<T>(n_all * ed);
        if ed > 0 {
            let dw = crate::kernels::RowsMut::new(&mut d_e, ed);
            (0..n).into_par_iter().for_each(|c| {
                let row = self.row(c);
                if row % tl != 0 {
                    // SAFETY: each e row is read by at most one computed row (the next step's).
                    unsafe { dw.row(row - 1) }.copy_from_slice(&d_ep[c * ed..(c + 1) * ed]);
                }
            });
        }
        let d_uo = product(
            h,
            h,
            n,
            Mat {
                data: ts,
                rs: 1,
                cs: h3,
            },
            Mat::rows(dr_t, h),
        );
        let mut d_wo = zeroed::<T>(2 * h * h);
        let s_t = Mat {
            data: ts.get(h..).unwrap_or(&[]),
            rs: 1,
            cs: h3,
        };
        gemm_into(2 * h, h, n, &mut d_wo, h, false, s_t, Mat::rows(dr_s, h));
        let d_vo = product(ed, h, n, Mat::t(&e_prev, ed), Mat::rows(dr_e, h));
        let mut d_bo = vec![T::zero(); h];
        for row in dr.chunks_exact(h.max(1)) {
            for (a, &x) in d_bo.iter_mut().zip(row) {
                *a += x;
            }
        }
        drop((ts_g, g_g));
        let d_ts = match &self.rows {
            // Padded rows' gradient is zero.
            Some(rows) => {
                let mut all = zeroed::<T>(n_all * h3);
                let aw = crate::kernels::RowsMut::new(&mut all, h3);
                rows.par_iter().enumerate().for_each(|(c, &row)| {
                    // SAFETY: the rows are distinct.
                    unsafe { aw.row(row) }.copy_from_slice(&d_ts[c * h3..(c + 1) * h3]);
                });
                all
            }
            None => d_ts,
        };
        self.ts.add_grad(d_ts);
        self.e.add_grad(d_e);
        for (w, d) in self.w.iter().zip([d_uo, d_wo, d_vo, d_bo, d_w1]) {
            w.add_grad(d);
        }
        if let (Some(l), Some((_, gb))) = (&self.ln, normed) {
            for (p, d) in l.iter().zip(gb) {
                p.add_grad(d);
            }
        }
        Ok(())
    }
}

fn readout_rows_fwd<T: Real>(op: &ReadoutRows) -> Result<(CpuStorage, Shape)> {
    op.forward::<T>()
}

impl CustomOp1 for ReadoutRows {
    fn name(&self) -> &'static str {
        "fused-readout-rows"
    }
    fn cpu_fwd(&self, s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        crate::kernels::profile::timed("readout forward", || by_dtype!(s, readout_rows_fwd, self))
    }
    fn bwd(&self, bundle: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        crate::kernels::profile::timed("readout backward", || {
            match grad.dtype() {
                DType::F32 => self.backward::<f32>(grad)?,
                DType::F64 => self.backward::<f64>(grad)?,
                _ => candle_core::bail!("fused kernels support f32 and f64"),
            }
            Ok(Some(bundle.zeros_like()?))
        })
    }
}
