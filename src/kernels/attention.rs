//! Attention's row maths and custom ops (model-spec §2): the scores `e_ij = vᵀ tanh(A h_j + B t_{i−1}
//! [+ V_cov C_{i−1,j}])` and the masked softmax with its context `s_i = Σ_j α_ij h_j`, each a fused op beside
//! its composed reference; the rows the fused decoder sequence runs; decoding's attention over sentence rows
//! ([`attend_rows`]) and context products. The concept (parameters, step) is [`crate::model::attention`].

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

use crate::kernels::{by_dtype, simd_dispatch, slice, Real, Shared};

/// Per-sentence attention keys: `A h_j` and the additive padding mask.
pub struct Keys {
    /// `[B, S, Ad]` (for the fused decoder sequence op, the words' keys only when the mask is words then
    /// padding: `[Σ len, Ad]`)
    pub ah: Tensor,
    /// `[B, S, 2H]`
    pub annotations: Tensor,
    /// `[B, S]`: 0 on words, a large negative number on padding.
    pub mask_bias: Tensor,
    /// Training with fused kernels: `ah` and `annotations` as [`Shared`] inputs of the decoder steps.
    pub shared: Option<(Shared, Shared)>,
}

/// A numerically stable softmax over the last dimension built from differentiable ops (candle's fused softmax
/// has no backward pass).
pub fn softmax_last(x: &Tensor) -> Result<Tensor> {
    let m = x.max_keepdim(D::Minus1)?.detach();
    let ex = x.broadcast_sub(&m)?.exp()?;
    ex.broadcast_div(&ex.sum_keepdim(D::Minus1)?)
}

/// Inference only (no autodiff graph): attention weights `[N, S]` and contexts `[N, 2H]` for `N` hypothesis
/// rows, row `i` reading the keys of sentence `rows[i]` (`keys` holds one row per sentence). Beam search uses
/// it so that the keys are never copied per hypothesis and step. The same numbers as
/// [`crate::model::attention::Attention::step`] on keys selected by `rows` (tested). Fused kernels on the CPU, f32 / f64, no coverage term.
pub fn attend_rows(keys: &Keys, rows: &[u32], bt: &Tensor, v: &Tensor) -> Result<(Tensor, Tensor)> {
    let (nsent, s, ad) = keys.ah.dims3()?;
    let a2 = keys.annotations.dim(2)?;
    let n = rows.len();
    if bt.dims2()? != (n, ad) || rows.iter().any(|&r| r as usize >= nsent) {
        candle_core::bail!(
            "attention over sentence rows: the query is {:?}, it must be [N {n}, A {ad}] for keys {:?}; rows \
             must index the {nsent} sentences (largest {:?})",
            bt.dims(),
            keys.ah.dims(),
            rows.iter().max()
        );
    }
    let dev = bt.device().clone();
    let (ah, ann, mask, bt, v) = (
        keys.ah.contiguous()?,
        keys.annotations.contiguous()?,
        keys.mask_bias.contiguous()?,
        bt.contiguous()?,
        v.contiguous()?,
    );
    fn run<T: Real>(
        t: [&Tensor; 5],
        rows: &[u32],
        (s, ad, a2): (usize, usize, usize),
        dev: &candle_core::Device,
    ) -> Result<(Tensor, Tensor)> {
        let data = |x: &Tensor| -> Result<Vec<T>> { x.flatten_all()?.to_vec1::<T>() };
        // The keys are read in place (no copy of the per-sentence tensors).
        let (ahs, ahl) = t[0].storage_and_layout();
        let (anns, annl) = t[1].storage_and_layout();
        let (ah, ann) = match (&*ahs, &*anns) {
            (candle_core::Storage::Cpu(a), candle_core::Storage::Cpu(b)) => {
                (slice::<T>(a, ahl)?, slice::<T>(b, annl)?)
            }
            _ => candle_core::bail!("attention over sentence rows: keys not on the CPU"),
        };
        let (mask, bt, v) = (data(t[2])?, data(t[3])?, data(t[4])?);
        let n = rows.len();
        let mut alpha = vec![T::zero(); n * s];
        let mut ctx = vec![T::zero(); n * a2];
        alpha
            .par_chunks_mut(s.max(1))
            .zip(ctx.par_chunks_mut(a2.max(1)))
            .enumerate()
            .for_each(|(i, (al, cx))| {
                let k = rows[i] as usize;
                let mut e = vec![T::zero(); s];
                score_rows_d(
                    &ah[k * s * ad..(k + 1) * s * ad],
                    &bt[i * ad..(i + 1) * ad],
                    &v,
                    &mut e,
                );
                for (x, m) in e.iter_mut().zip(&mask[k * s..(k + 1) * s]) {
                    *x += *m;
                }
                let mut out = vec![T::zero(); s + a2];
                softmax_context_row_d(&e, &ann[k * s * a2..(k + 1) * s * a2], &mut out);
                al.copy_from_slice(&out[..s]);
                cx.copy_from_slice(&out[s..]);
            });
        Ok((
            Tensor::from_vec(alpha, (n, s), dev)?,
            Tensor::from_vec(ctx, (n, a2), dev)?,
        ))
    }
    let t = [&ah, &ann, &mask, &bt, &v];
    match bt.dtype() {
        candle_core::DType::F32 => run::<f32>(t, rows, (s, ad, a2), &dev),
        candle_core::DType::F64 => run::<f64>(t, rows, (s, ad, a2), &dev),
        d => candle_core::bail!("attention over sentence rows: unsupported dtype {d:?}"),
    }
}

/// `out_i = Σ_j α_ij p_{rows[i], j}` `[N, w]` for `α` `[N, S]` and per-sentence rows `p` `[B, S, w]`
/// (inference only: no autodiff graph).
pub(crate) fn weighted_rows(alpha: &Tensor, rows: &[u32], p: &Tensor) -> Result<Tensor> {
    let (n, s) = alpha.dims2()?;
    let (nsent, s2, w) = p.dims3()?;
    if n != rows.len() || s != s2 || rows.iter().any(|&r| r as usize >= nsent) {
        candle_core::bail!(
            "context products: α is [N {n}, S {s}] for {} rows and the products are [B {nsent}, S {s2}, {w}]: N \
             must equal the rows, S must agree, and rows must index the {nsent} sentences",
            rows.len()
        );
    }
    let p = p.contiguous()?;
    fn run<T: Real>(
        alpha: &Tensor,
        rows: &[u32],
        p: &Tensor,
        (s, w): (usize, usize),
    ) -> Result<Tensor> {
        let (als, all) = alpha.storage_and_layout();
        let (ps, pl) = p.storage_and_layout();
        let al = crate::kernels::storage_slice::<T>(&als, all)?;
        let pp = crate::kernels::storage_slice::<T>(&ps, pl)?;
        let mut out = vec![T::zero(); rows.len() * w];
        out.par_chunks_mut(w.max(1)).enumerate().for_each(|(i, o)| {
            let k = rows[i] as usize;
            weighted_row_d(&al[i * s..(i + 1) * s], &pp[k * s * w..(k + 1) * s * w], o)
        });
        Tensor::from_vec(out, (rows.len(), w), alpha.device())
    }
    match alpha.dtype() {
        candle_core::DType::F32 => run::<f32>(&alpha, rows, &p, (s, w)),
        candle_core::DType::F64 => run::<f64>(&alpha, rows, &p, (s, w)),
        d => candle_core::bail!("context products: unsupported dtype {d:?}"),
    }
}

/// `out += Σ_j α_j p_j` for `α` `[S]` and `p` `[S, w]`; positions with `α_j = 0` (padding) are skipped.
#[inline(always)]
fn weighted_row<T: Real>(alpha: &[T], p: &[T], out: &mut [T]) {
    let w = out.len();
    for (j, &a) in alpha.iter().enumerate() {
        if a == T::zero() {
            continue;
        }
        for (o, &x) in out.iter_mut().zip(&p[j * w..(j + 1) * w]) {
            *o += a * x;
        }
    }
}
simd_dispatch!(weighted_row_d, weighted_row_avx, weighted_row, (alpha: &[T], p: &[T], out: &mut [T]));

/// The attention scores `e_bj = vᵀ tanh(pre_bj + bt_b)` `[B, S]` for `pre` `[B, S, Ad]` (`A h_j`, plus the
/// coverage term when coverage is on), `bt` `[B, Ad]` (`B t_{i−1}`) and `v` `[Ad, 1]`, composed (reference).
pub fn scores_reference(pre: &Tensor, bt: &Tensor, v: &Tensor) -> Result<Tensor> {
    let (b, s, ad) = pre.dims3()?;
    pre.broadcast_add(&bt.unsqueeze(1)?)?
        .tanh()?
        .reshape((b * s, ad))?
        .matmul(v)?
        .reshape((b, s))
}

/// The same scores from one fused kernel: no `[B, S, Ad]` tensor is materialised or kept for the backward
/// pass, which recomputes the tanh.
pub fn scores_fused(pre: &Tensor, bt: &Tensor, v: &Tensor) -> Result<Tensor> {
    pre.contiguous()?.apply_op3(
        &bt.contiguous()?,
        &v.contiguous()?,
        ScoreOp { shared: None },
    )
}

/// Fused scores over shared keys (see [`Shared`]): the keys' gradient is accumulated in place.
pub fn scores_shared(pre: &Shared, bt: &Tensor, v: &Tensor) -> Result<Tensor> {
    pre.token.apply_op3(
        &bt.contiguous()?,
        &v.contiguous()?,
        ScoreOp {
            shared: Some(pre.clone()),
        },
    )
}

#[inline(always)]
fn score_rows<T: Real>(pre: &[T], bt: &[T], v: &[T], out: &mut [T]) {
    let ad = v.len();
    let mut t = vec![T::zero(); ad];
    for (j, o) in out.iter_mut().enumerate() {
        let p = &pre[j * ad..(j + 1) * ad];
        for a in 0..ad {
            t[a] = (p[a] + bt[a]).tanh_v();
        }
        *o = crate::kernels::dot(&t, v);
    }
}
simd_dispatch!(score_rows_d, score_rows_avx, score_rows, (pre: &[T], bt: &[T], v: &[T], out: &mut [T]));

/// For one sentence: `d_pre` (`[S, Ad]`, added to its contents when `add`), `d_bt` and this sentence's
/// share of `d_v` (`[Ad]` each).
#[inline(always)]
fn score_grad_rows<T: Real>(
    pre: &[T],
    bt: &[T],
    v: &[T],
    g: &[T],
    d_pre: &mut [T],
    d_bt: &mut [T],
    d_v: &mut [T],
    add: bool,
) {
    let ad = v.len();
    for (j, &gj) in g.iter().enumerate() {
        let p = &pre[j * ad..(j + 1) * ad];
        let dp = &mut d_pre[j * ad..(j + 1) * ad];
        for a in 0..ad {
            let t = (p[a] + bt[a]).tanh_v();
            let d = gj * v[a] * (T::one() - t * t);
            dp[a] = if add { dp[a] + d } else { d };
            d_bt[a] += d;
            d_v[a] += gj * t;
        }
    }
}
simd_dispatch!(score_grad_rows_d, score_grad_rows_avx, score_grad_rows, (pre: &[T], bt: &[T], v: &[T], g: &[T], d_pre: &mut [T], d_bt: &mut [T], d_v: &mut [T], add: bool));

struct ScoreOp {
    shared: Option<Shared>,
}

fn score_fwd<T: Real>(
    shared: &Option<Shared>,
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
    s3: &CpuStorage,
    l3: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let bt = slice::<T>(s2, l2)?;
    let v = slice::<T>(s3, l3)?;
    let run = |pre: &[T], (b, s, ad): (usize, usize, usize)| -> Result<(CpuStorage, Shape)> {
        if bt.len() != b * ad || v.len() != ad || pre.len() != b * s * ad {
            candle_core::bail!(
                "fused attention scores: for B {b} × S {s} × A {ad}, the query must hold B·A = {} values (has \
                 {}), v A (has {}) and the keys' terms B·S·A = {} (has {})",
                b * ad,
                bt.len(),
                v.len(),
                b * s * ad,
                pre.len()
            );
        }
        let mut out = vec![T::zero(); b * s];
        out.par_chunks_mut(s.max(1)).enumerate().for_each(|(i, o)| {
            score_rows_d(
                &pre[i * s * ad..(i + 1) * s * ad],
                &bt[i * ad..(i + 1) * ad],
                v,
                o,
            )
        });
        Ok((T::to_cpu_storage_owned(out), Shape::from((b, s))))
    };
    match shared {
        Some(sh) => sh.with_slice::<T, _>(|pre| run(pre, sh.tensor.dims3()?)),
        None => run(slice::<T>(s1, l1)?, l1.shape().dims3()?),
    }
}

impl CustomOp3 for ScoreOp {
    fn name(&self) -> &'static str {
        "fused-attention-scores"
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
        by_dtype!(s2, score_fwd, &self.shared, s1, l1, s2, l2, s3, l3)
    }
    fn bwd(
        &self,
        pre: &Tensor,
        bt: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (b, ad) = bt.dims2()?;
        let op = ScoreGradOp {
            grad: grad.contiguous()?,
            shared: self.shared.clone(),
        };
        let packed = pre.apply_op3_no_bwd(bt, v, &op)?;
        let w = packed.elem_count() / b;
        let packed = packed.reshape((b, w))?;
        let s = w / ad - 2;
        // Packed per sentence: [S·Ad d_pre (absent for shared keys) | Ad d_bt | Ad d_v-share].
        let d_pre = match &self.shared {
            Some(_) => pre.zeros_like()?,
            None => packed.narrow(1, 0, s * ad)?.reshape((b, s, ad))?,
        };
        let d_bt = packed.narrow(1, s * ad, ad)?;
        let d_v = packed
            .narrow(1, (s + 1) * ad, ad)?
            .sum(0)?
            .reshape((ad, 1))?;
        Ok((Some(d_pre), Some(d_bt), Some(d_v)))
    }
}

struct ScoreGradOp {
    grad: Tensor,
    shared: Option<Shared>,
}

#[allow(clippy::too_many_arguments)]
fn score_grad<T: Real>(
    grad: &Tensor,
    shared: &Option<Shared>,
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
    s3: &CpuStorage,
    l3: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let bt = slice::<T>(s2, l2)?;
    let v = slice::<T>(s3, l3)?;
    let g: Vec<T> = grad.flatten_all()?.to_vec1()?;
    match shared {
        None => {
            let (b, s, ad) = l1.shape().dims3()?;
            let pre = slice::<T>(s1, l1)?;
            let w = (s + 2) * ad;
            let mut out = vec![T::zero(); b * w];
            out.par_chunks_mut(w).enumerate().for_each(|(i, o)| {
                let (d_pre, rest) = o.split_at_mut(s * ad);
                let (d_bt, d_v) = rest.split_at_mut(ad);
                score_grad_rows_d(
                    &pre[i * s * ad..(i + 1) * s * ad],
                    &bt[i * ad..(i + 1) * ad],
                    v,
                    &g[i * s..(i + 1) * s],
                    d_pre,
                    d_bt,
                    d_v,
                    false,
                )
            });
            Ok((T::to_cpu_storage_owned(out), Shape::from(b * w)))
        }
        Some(sh) => {
            let (b, s, ad) = sh.tensor.dims3()?;
            let w = 2 * ad;
            let mut out = vec![T::zero(); b * w];
            sh.with_slice::<T, _>(|pre| {
                sh.accumulate::<T>(|acc| {
                    out.par_chunks_mut(w)
                        .zip(acc.par_chunks_mut(s * ad))
                        .enumerate()
                        .for_each(|(i, (o, d_pre))| {
                            let (d_bt, d_v) = o.split_at_mut(ad);
                            score_grad_rows_d(
                                &pre[i * s * ad..(i + 1) * s * ad],
                                &bt[i * ad..(i + 1) * ad],
                                v,
                                &g[i * s..(i + 1) * s],
                                d_pre,
                                d_bt,
                                d_v,
                                true,
                            )
                        })
                });
                Ok(())
            })?;
            Ok((T::to_cpu_storage_owned(out), Shape::from(b * w)))
        }
    }
}

impl CustomOp3 for ScoreGradOp {
    fn name(&self) -> &'static str {
        "fused-attention-scores-grad"
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
        by_dtype!(
            s2,
            score_grad,
            &self.grad,
            &self.shared,
            s1,
            l1,
            s2,
            l2,
            s3,
            l3
        )
    }
}

/// Masked softmax and context from scores `e` `[B, S]` (the padding mask already added), composed
/// reference: `(α [B, S], s [B, 2H])`.
pub fn softmax_context_reference(e: &Tensor, annotations: &Tensor) -> Result<(Tensor, Tensor)> {
    let alpha = softmax_last(e)?;
    let ctx = alpha.unsqueeze(1)?.matmul(annotations)?.squeeze(1)?;
    Ok((alpha, ctx))
}

/// The same as one fused kernel (`α` and `s = Σ_j α_j h_j` per sentence) with a hand-derived backward pass.
pub fn softmax_context_fused(e: &Tensor, annotations: &Tensor) -> Result<(Tensor, Tensor)> {
    let annotations = annotations.contiguous()?;
    let (_, s, a2) = annotations.dims3()?;
    let packed = e
        .contiguous()?
        .apply_op2(&annotations, SoftmaxContext { shared: None })?;
    Ok((
        packed.narrow(1, 0, s)?,
        packed.narrow(1, s, a2)?.contiguous()?,
    ))
}

/// Fused softmax + context over shared annotations (see [`Shared`]).
pub fn softmax_context_shared(e: &Tensor, annotations: &Shared) -> Result<(Tensor, Tensor)> {
    let (_, s, a2) = annotations.tensor.dims3()?;
    let packed = e.contiguous()?.apply_op2(
        &annotations.token,
        SoftmaxContext {
            shared: Some(annotations.clone()),
        },
    )?;
    Ok((
        packed.narrow(1, 0, s)?,
        packed.narrow(1, s, a2)?.contiguous()?,
    ))
}

#[inline(always)]
fn softmax_context_row<T: Real>(e: &[T], h: &[T], out: &mut [T]) {
    let (alpha, ctx) = out.split_at_mut(e.len());
    softmax_context_parts(e, h, alpha, ctx)
}
simd_dispatch!(softmax_context_row_d, softmax_context_row_avx, softmax_context_row, (e: &[T], h: &[T], out: &mut [T]));

/// [`softmax_context_row`] into separate outputs `α` `[S]` and `s` `[2H]` (the fused decoder passes a
/// sentence's own positions only, within a row that has room for the batch's longest sentence).
#[inline(always)]
fn softmax_context_parts<T: Real>(e: &[T], h: &[T], alpha: &mut [T], ctx: &mut [T]) {
    let s = e.len();
    let a2 = ctx.len();
    let m = crate::kernels::max_of(e);
    let mut z = T::zero();
    for j in 0..s {
        alpha[j] = (e[j] - m).exp_v();
        z += alpha[j];
    }
    let inv = T::one() / z;
    for c in ctx.iter_mut() {
        *c = T::zero();
    }
    for j in 0..s {
        alpha[j] *= inv;
        let aj = alpha[j];
        let hj = &h[j * a2..(j + 1) * a2];
        for k in 0..a2 {
            ctx[k] += aj * hj[k];
        }
    }
}
simd_dispatch!(softmax_context_parts_d, softmax_context_parts_avx, softmax_context_parts, (e: &[T], h: &[T], alpha: &mut [T], ctx: &mut [T]));

/// Gradient row: `∂e` (S) into `d_e`, `∂h` (S·2H) into `d_h` (added to its contents when `add`), from the
/// forward row `[α | s]` and its gradient.
#[inline(always)]
fn softmax_context_grad_row<T: Real>(
    res: &[T],
    h: &[T],
    g: &[T],
    d_e: &mut [T],
    d_h: &mut [T],
    add: bool,
) {
    let s = d_e.len();
    let a2 = h.len() / s.max(1);
    let (alpha, g_alpha, g_ctx) = (&res[..s], &g[..s], &g[s..s + a2]);
    let mut total = T::zero();
    for j in 0..s {
        let hj = &h[j * a2..(j + 1) * a2];
        d_e[j] = g_alpha[j] + crate::kernels::dot(g_ctx, hj);
        total += alpha[j] * d_e[j];
        let dh = &mut d_h[j * a2..(j + 1) * a2];
        if add {
            for k in 0..a2 {
                dh[k] += alpha[j] * g_ctx[k];
            }
        } else {
            for k in 0..a2 {
                dh[k] = alpha[j] * g_ctx[k];
            }
        }
    }
    for j in 0..s {
        d_e[j] = alpha[j] * (d_e[j] - total);
    }
}
simd_dispatch!(softmax_context_grad_row_d, softmax_context_grad_row_avx, softmax_context_grad_row, (res: &[T], h: &[T], g: &[T], d_e: &mut [T], d_h: &mut [T], add: bool));

/// The fused decoder's gradient row for the context alone (no gradient on `α`): `∂e_j = α_j (g·h_j −
/// Σ_k α_k g·h_k)` into `d_e` from the forward row's `α` and the context's gradient `g`; `∂h` is left to the
/// caller (the decoder forms it for all steps at once as `αᵀ G` per sentence).
#[inline(always)]
fn context_score_grad_row<T: Real>(alpha: &[T], h: &[T], g: &[T], d_e: &mut [T]) {
    let s = d_e.len();
    let a2 = g.len();
    let mut total = T::zero();
    for j in 0..s {
        d_e[j] = crate::kernels::dot(g, &h[j * a2..(j + 1) * a2]);
        total += alpha[j] * d_e[j];
    }
    for j in 0..s {
        d_e[j] = alpha[j] * (d_e[j] - total);
    }
}
simd_dispatch!(context_score_grad_row_d, context_score_grad_row_avx, context_score_grad_row, (alpha: &[T], h: &[T], g: &[T], d_e: &mut [T]));

struct SoftmaxContext {
    shared: Option<Shared>,
}

fn softmax_context_fwd<T: Real>(
    shared: &Option<Shared>,
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let (b, s) = l1.shape().dims2()?;
    let e = slice::<T>(s1, l1)?;
    let run = |h: &[T], (b2, s2_, a2): (usize, usize, usize)| -> Result<(CpuStorage, Shape)> {
        if b != b2 || s != s2_ {
            candle_core::bail!(
                "fused attention context: α is [B {b}, S {s}] and the annotations [B {b2}, S {s2_}, {a2}]: B and S \
                 must agree"
            );
        }
        let w = s + a2;
        let mut out = vec![T::zero(); b * w];
        out.par_chunks_mut(w).enumerate().for_each(|(i, o)| {
            softmax_context_row_d(&e[i * s..(i + 1) * s], &h[i * s * a2..(i + 1) * s * a2], o)
        });
        Ok((T::to_cpu_storage_owned(out), Shape::from((b, w))))
    };
    match shared {
        Some(sh) => sh.with_slice::<T, _>(|h| run(h, sh.tensor.dims3()?)),
        None => run(slice::<T>(s2, l2)?, l2.shape().dims3()?),
    }
}

impl CustomOp2 for SoftmaxContext {
    fn name(&self) -> &'static str {
        "fused-attention-context"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        by_dtype!(s1, softmax_context_fwd, &self.shared, s1, l1, s2, l2)
    }
    fn bwd(
        &self,
        e: &Tensor,
        annotations: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (b, s) = e.dims2()?;
        let op = SoftmaxContextGrad {
            shared: self.shared.clone(),
        };
        let packed = res.apply_op3_no_bwd(annotations, &grad.contiguous()?, &op)?;
        match &self.shared {
            Some(_) => Ok((Some(packed), Some(annotations.zeros_like()?))),
            None => {
                let a2 = annotations.dim(2)?;
                let d_e = packed.narrow(1, 0, s)?;
                let d_h = packed.narrow(1, s, s * a2)?.reshape((b, s, a2))?;
                Ok((Some(d_e), Some(d_h)))
            }
        }
    }
}

struct SoftmaxContextGrad {
    shared: Option<Shared>,
}

fn softmax_context_grad<T: Real>(
    shared: &Option<Shared>,
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
    s3: &CpuStorage,
    l3: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let (b, w) = l1.shape().dims2()?;
    let res = slice::<T>(s1, l1)?;
    let g = slice::<T>(s3, l3)?;
    match shared {
        None => {
            let (_, s, a2) = l2.shape().dims3()?;
            let h = slice::<T>(s2, l2)?;
            let wo = s + s * a2;
            let mut out = vec![T::zero(); b * wo];
            out.par_chunks_mut(wo).enumerate().for_each(|(i, o)| {
                let (d_e, d_h) = o.split_at_mut(s);
                softmax_context_grad_row_d(
                    &res[i * w..(i + 1) * w],
                    &h[i * s * a2..(i + 1) * s * a2],
                    &g[i * w..(i + 1) * w],
                    d_e,
                    d_h,
                    false,
                )
            });
            Ok((T::to_cpu_storage_owned(out), Shape::from((b, wo))))
        }
        Some(sh) => {
            let (_, s, a2) = sh.tensor.dims3()?;
            let mut out = vec![T::zero(); b * s];
            sh.with_slice::<T, _>(|h| {
                sh.accumulate::<T>(|acc| {
                    out.par_chunks_mut(s)
                        .zip(acc.par_chunks_mut(s * a2))
                        .enumerate()
                        .for_each(|(i, (d_e, d_h))| {
                            softmax_context_grad_row_d(
                                &res[i * w..(i + 1) * w],
                                &h[i * s * a2..(i + 1) * s * a2],
                                &g[i * w..(i + 1) * w],
                                d_e,
                                d_h,
                                true,
                            )
                        })
                });
                Ok(())
            })?;
            Ok((T::to_cpu_storage_owned(out), Shape::from((b, s))))
        }
    }
}

impl CustomOp3 for SoftmaxContextGrad {
    fn name(&self) -> &'static str {
        "fused-attention-context-grad"
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
        by_dtype!(
            s1,
            softmax_context_grad,
            &self.shared,
            s1,
            l1,
            s2,
            l2,
            s3,
            l3
        )
    }
}
