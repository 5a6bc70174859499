//! The small fused ops every model part uses: [`linear`] (`x W + b`), [`sigmoid`], [`embedding`] and
//! [`select_rows`], each with its composed form under reference kernels.

use super::*;

/// Rows `idx` (`[N]`, u32) of `x` `[R, …]`: `x.index_select(idx, 0)`. For a CPU tensor outside any autodiff
/// graph (decoding with loaded weights) the rows are copied straight into a new buffer, on both cores when
/// there are many (candle's `index_select` zero-fills its output first and copies on one); a tensor that
/// tracks gradients takes `index_select`, whose backward pass it needs.
pub fn select_rows(x: &Tensor, idx: &Tensor) -> Result<Tensor> {
    if !x.device().is_cpu()
        || x.track_op()
        || x.rank() == 0
        || !x.is_contiguous()
        || !matches!(x.dtype(), candle_core::DType::F32 | candle_core::DType::F64)
    {
        return x.index_select(idx, 0);
    }
    let ids: Vec<u32> = idx.to_dtype(candle_core::DType::U32)?.to_vec1()?;
    let r = x.dim(0)?;
    let w = x.elem_count() / r.max(1);
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= r) {
        candle_core::bail!("select_rows: row {bad} is beyond the {r} rows");
    }
    let (st, l) = x.storage_and_layout();
    let out = match &*st {
        candle_core::Storage::Cpu(s) => by_dtype!(s, select_rows_cpu, s, l, &ids, w)?,
        _ => candle_core::bail!("select_rows: tensor is not on the CPU"),
    };
    let mut dims = x.dims().to_vec();
    dims[0] = ids.len();
    out.reshape(dims)
}

fn select_rows_cpu<T: Real>(s: &CpuStorage, l: &Layout, ids: &[u32], w: usize) -> Result<Tensor> {
    use rayon::prelude::*;
    let x = slice::<T>(s, l)?;
    let n = ids.len() * w;
    let mut v: Vec<T> = Vec::with_capacity(n);
    if w > 0 {
        let copy = |(d, &i): (&mut [std::mem::MaybeUninit<T>], &u32)| {
            let src = &x[i as usize * w..(i as usize + 1) * w];
            // SAFETY: `d` is a row of w uninitialised elements, `src` w initialised ones elsewhere.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), d.as_mut_ptr().cast::<T>(), w) };
        };
        let spare = &mut v.spare_capacity_mut()[..n];
        if n >= PAR_FILL && !SERIAL.with(|s| s.get()) {
            spare
                .par_chunks_mut(w)
                .zip(ids)
                .with_min_len(PAR_FILL.div_ceil(4 * w))
                .for_each(copy);
        } else {
            spare.chunks_mut(w).zip(ids).for_each(copy);
        }
    }
    // SAFETY: all n elements were written above (one whole row per id).
    unsafe { v.set_len(n) };
    Tensor::from_vec(v, (ids.len(), w), &Device::Cpu)
}

/// `x W + b` (`x` `[N, K]`, `W` `[K, M]`, `b` `[M]`): with fused kernels on the CPU one graph node whose
/// forward pass runs the GEMM over the broadcast bias and whose backward pass forms `∂b` as parallel column
/// sums (composed, `broadcast_add` adds a node whose backward pass sums the rows on one thread).
pub fn linear(k: Kernels, x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !k.ops_fused_on(x.device())
        || x.rank() != 2
        || w.rank() != 2
        || b.rank() != 1
        || !matches!(x.dtype(), candle_core::DType::F32 | candle_core::DType::F64)
    {
        return x.matmul(w)?.broadcast_add(b);
    }
    x.contiguous()?.apply_op3(
        &w.contiguous()?,
        &b.contiguous()?,
        Linear(None, prepared(w)),
    )
}

/// `σ(x)`: with fused kernels on the CPU one op whose rows vectorise ([`Real::sigmoid_v`]; candle's runs a
/// libm `exp` per element), its backward pass `g σ (1 − σ)` composed; otherwise candle's.
pub fn sigmoid(k: Kernels, x: &Tensor) -> Result<Tensor> {
    if !k.ops_fused_on(x.device())
        || !matches!(x.dtype(), candle_core::DType::F32 | candle_core::DType::F64)
    {
        return candle_nn::ops::sigmoid(x);
    }
    x.contiguous()?.apply_op1(Sigmoid)
}

struct Sigmoid;

#[inline(always)]
fn sigmoid_rows<T: Real>(x: &[T], y: &mut [T]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = v.sigmoid_v();
    }
}
simd_dispatch!(sigmoid_rows_d, sigmoid_rows_avx, sigmoid_rows, (x: &[T], y: &mut [T]));

fn sigmoid_fwd<T: Real>(s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
    use rayon::prelude::*;
    let x = slice::<T>(s, l)?;
    let mut y = vec![T::zero(); x.len()];
    y.par_chunks_mut(PAR_FILL)
        .zip(x.par_chunks(PAR_FILL))
        .for_each(|(y, x)| sigmoid_rows_d(x, y));
    Ok((T::to_cpu_storage_owned(y), l.shape().clone()))
}

impl candle_core::CustomOp1 for Sigmoid {
    fn name(&self) -> &'static str {
        "fused-sigmoid"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        by_dtype!(s, sigmoid_fwd, s, l)
    }
    fn bwd(&self, _x: &Tensor, res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some((grad * (res * res.affine(-1.0, 1.0)?)?)?))
    }
}

/// `x W + b`, over rows `.0` of `x` only (a compact result) when given; with rows it has no backward pass
/// (see [`linear_shared_rows`], whose token carries it). `.1`: `W` as this thread's pass prepared it (see
/// [`begin_pass`]), whose packed form the forward GEMM then reads.
pub(super) struct Linear(pub(super) Option<Rows>, pub(super) Option<RecWeight>);

/// `w` as this thread's pass prepared it, if it did.
pub(super) fn prepared(w: &Tensor) -> Option<RecWeight> {
    PASS.with(|p| {
        p.borrow()
            .iter()
            .find(|e| e.0 == w.id())
            .map(|e| e.1.clone())
    })
}

fn linear_fwd<T: Real>(
    op: &Linear,
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
    s3: &CpuStorage,
    l3: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let (n, k) = l1.shape().dims2()?;
    let (k2, m) = l2.shape().dims2()?;
    let (x, w, b) = (
        slice::<T>(s1, l1)?,
        slice::<T>(s2, l2)?,
        slice::<T>(s3, l3)?,
    );
    if k != k2 || b.len() != m {
        candle_core::bail!(
            "linear: shapes [{n}, {k}] x [{k2}, {m}] + [{}] do not match",
            b.len()
        );
    }
    let xr;
    let (n, x) = match &op.0 {
        None => (n, x),
        Some(rows) => {
            xr = gather_rows(x, k, rows);
            (rows.len(), xr.as_slice())
        }
    };
    if let (Some(p), Some(xf), Some(bf)) = (
        op.1.as_ref().map(|rw| rw.packed()).transpose()?.flatten(),
        as_f32(x),
        as_f32(b),
    ) {
        if p.dims() == (k, m) {
            let out = p.mul_new(n, xf, k, crate::kernels::Start::Row(bf), gemm_threads());
            return Ok((CpuStorage::F32(out), Shape::from((n, m))));
        }
    }
    let mut out = tiled(n, b);
    gemm_into(n, m, k, &mut out, m, true, Mat::rows(x, k), Mat::rows(w, m));
    Ok((T::to_cpu_storage_owned(out), Shape::from((n, m))))
}

impl candle_core::CustomOp3 for Linear {
    fn name(&self) -> &'static str {
        "linear"
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
        crate::kernels::profile::timed("linear forward", || {
            by_dtype!(s1, linear_fwd, self, s1, l1, s2, l2, s3, l3)
        })
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        if self.0.is_some() {
            candle_core::bail!("linear over rows: no backward pass of its own");
        }
        crate::kernels::profile::timed("linear backward", || {
            linear_grads(x, w, b, &grad.contiguous()?)
        })
    }
}

/// Rows `ids` (`[N]`, u32) of an embedding table `[V, E]`: `[N, E]`. With fused kernels on the CPU one graph
/// node whose backward pass scatters the rows' gradients into one `[V, E]` buffer and hands it over (see
/// [`hand_over`]); composed, candle's `index_select` adds into a zero-filled table twice per pass.
pub fn embedding(k: Kernels, table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    if !k.ops_fused_on(table.device())
        || table.rank() != 2
        || !matches!(
            table.dtype(),
            candle_core::DType::F32 | candle_core::DType::F64
        )
    {
        return table.embedding(ids);
    }
    let ids: Vec<u32> = ids
        .flatten_all()?
        .to_dtype(candle_core::DType::U32)?
        .to_vec1()?;
    let v = table.dim(0)?;
    if let Some(bad) = ids.iter().find(|&&i| i as usize >= v) {
        candle_core::bail!("embedding: id {bad} out of range for a vocabulary of {v}");
    }
    table.contiguous()?.apply_op1(Embedding { ids })
}

struct Embedding {
    ids: Vec<u32>,
}

fn embedding_fwd<T: Real>(
    op: &Embedding,
    s: &CpuStorage,
    l: &Layout,
) -> Result<(CpuStorage, Shape)> {
    use rayon::prelude::*;
    let (_, e) = l.shape().dims2()?;
    let table = slice::<T>(s, l)?;
    let mut out = zeroed::<T>(op.ids.len() * e);
    if e > 0 {
        out.par_chunks_mut(e)
            .zip(&op.ids)
            .for_each(|(o, &i)| o.copy_from_slice(&table[i as usize * e..(i as usize + 1) * e]));
    }
    Ok((T::to_cpu_storage_owned(out), Shape::from((op.ids.len(), e))))
}

fn embedding_grad<T: Real>(op: &Embedding, table: &Tensor, grad: &Tensor) -> Result<Tensor> {
    let (v, e) = table.dims2()?;
    let g = grad.contiguous()?;
    let (st, l) = g.storage_and_layout();
    let g = storage_slice::<T>(&st, l)?;
    let mut d = zeroed::<T>(v * e);
    for (row, &i) in g.chunks_exact(e.max(1)).zip(&op.ids) {
        for (a, x) in d[i as usize * e..(i as usize + 1) * e].iter_mut().zip(row) {
            *a += *x;
        }
    }
    Tensor::from_vec(d, (v, e), table.device())
}

impl candle_core::CustomOp1 for Embedding {
    fn name(&self) -> &'static str {
        "embedding"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        by_dtype!(s, embedding_fwd, self, s, l)
    }
    fn bwd(&self, table: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        let d = match table.dtype() {
            candle_core::DType::F32 => embedding_grad::<f32>(self, table, grad)?,
            candle_core::DType::F64 => embedding_grad::<f64>(self, table, grad)?,
            _ => candle_core::bail!("fused kernels support f32 and f64"),
        };
        Ok(hand_over(table, d))
    }
}
