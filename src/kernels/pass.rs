//! One training or decoding pass's prepared recurrent weights ([`begin_pass`], [`rec_matmul`], [`Prepared`]):
//! each recurrent `W` transposed (or packed) once per pass, the per-step products reading it, and the
//! gradient hand-over that lets `∂W` be formed as one GEMM over all steps ([`backward`], [`hand_over`]).

use super::*;

/// A recurrent product `x W` (`[B, in] × [in, out]`, one per time step). With fused kernels and `W` prepared
/// by [`begin_pass`], the product reads the prepared `Wᵀ` and its backward pass returns only `∂x`, recording
/// `(x, g)`; `∂W = Σ_t x_tᵀ g_t` is then one GEMM over all steps (`[in, T·B] × [T·B, out]`) instead of T small
/// ones plus T accumulations. Otherwise (reference kernels, a weight not prepared) it is a plain `matmul`.
pub fn rec_matmul(k: Kernels, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if k.ops_fused_on(x.device()) && x.rank() == 2 {
        if let Some(rw) = prepared(w) {
            return x
                .contiguous()?
                .apply_op2(&rw.token.clone(), RecMatmulT { rw });
        }
    }
    x.matmul(w)
}

/// `dst = start + x W` (see [`crate::kernels::Start`]) for an f32 `x` `[m, k]` (row-major) into a row-major `dst` `[m, n]`
/// with the packed `W` of this thread's pass (see [`begin_pass`]; decoding prepares the output layer's `W_2`
/// too). `false` when `W` has no packed form here (not prepared, not f32, no micro-kernel): nothing is
/// written then.
pub fn prepared_mul_into(
    w: &Tensor,
    m: usize,
    x: &[f32],
    dst: &mut [f32],
    start: crate::kernels::Start,
) -> Result<bool> {
    let Some(rw) = prepared(w) else {
        return Ok(false);
    };
    let Some(p) = rw.packed()? else {
        return Ok(false);
    };
    packed_mul_into(p, m, x, dst, start)?;
    Ok(true)
}

/// Decoding with `--int8`: `x W` `[m, n]` for an f32 `x` `[m, k]` through `W`'s 8-bit form, when this thread's
/// pass prepared `W` quantised ([`prepare_as`]); `None` otherwise (the caller multiplies in f32). For the
/// products formed once per batch (the attention keys, the context's products per source position, the
/// initial state), whose f32 GEMMs would otherwise outweigh the int8 steps.
pub fn int8_matmul(x: &Tensor, w: &Tensor) -> Result<Option<Tensor>> {
    let Some(rw) = prepared(w) else {
        return Ok(None);
    };
    if !rw.int8 || x.dtype() != candle_core::DType::F32 || x.rank() != 2 || !x.device().is_cpu() {
        return Ok(None);
    }
    let Some(p) = rw.packed()? else {
        return Ok(None);
    };
    let (m, k) = x.dims2()?;
    let (k2, n) = p.dims();
    if k != k2 {
        candle_core::bail!("int8 product: [{m}, {k}] × [{k2}, {n}]");
    }
    let x = x.contiguous()?;
    let (st, l) = x.storage_and_layout();
    let xs = storage_slice::<f32>(&st, l)?;
    let out = p.mul_new(m, xs, k, crate::kernels::Start::Zero, gemm_threads());
    Ok(Some(Tensor::from_vec(out, (m, n), x.device())?))
}

/// `x W` with [`int8_matmul`] where it applies, else candle's `matmul`.
pub fn matmul_or_int8(x: &Tensor, w: &Tensor) -> Result<Tensor> {
    match int8_matmul(x, w)? {
        Some(p) => Ok(p),
        None => x.matmul(w),
    }
}

/// `dst = start + x W` for an f32 `x` `[m, k]` (row-major) into a row-major `dst` `[m, n]`, `W` packed
/// ([`packed`]), on the cores the products use.
pub fn packed_mul_into(
    p: &crate::kernels::packed_gemm::Packed,
    m: usize,
    x: &[f32],
    dst: &mut [f32],
    start: crate::kernels::Start,
) -> Result<()> {
    let (k, n) = p.dims();
    if x.len() < m * k || dst.len() < m * n {
        candle_core::bail!("packed product: [{m}, {k}] × [{k}, {n}] does not fit its buffers");
    }
    p.mul_from(m, x, k, dst, n, start, gemm_threads());
    Ok(())
}

/// An f32 weight `W` `[K, N]` packed for [`crate::kernels::packed_gemm`] (`None`: not f32, no packed micro-kernel on
/// this CPU, or the packed GEMM switched off).
pub fn packed(w: &Tensor) -> Result<Option<crate::kernels::packed_gemm::Packed>> {
    packed_as(w, false)
}

/// [`packed`], or quantised to 8 bits when `int8` (approximate products, see [`crate::kernels::quantized_gemm`];
/// `None` also when the CPU has no AVX2).
pub fn packed_as(w: &Tensor, int8: bool) -> Result<Option<crate::kernels::packed_gemm::Packed>> {
    if w.dtype() != candle_core::DType::F32 || !packed_gemm_on() || !w.device().is_cpu() {
        return Ok(None);
    }
    let Some(isa) = crate::kernels::packed_gemm::Isa::detect() else {
        return Ok(None);
    };
    let (k, n) = w.dims2()?;
    let w = w.contiguous()?;
    let (st, l) = w.storage_and_layout();
    let b = storage_slice::<f32>(&st, l)?;
    if int8 {
        return Ok(crate::kernels::packed_gemm::Packed::new_int8(b, k, n, n, 1));
    }
    Ok(Some(crate::kernels::packed_gemm::Packed::new(
        isa, b, k, n, n, 1,
    )))
}

/// A recurrent weight `W` `[K, N]` prepared for one forward pass. Each step's products, `x W` forward and
/// `g Wᵀ` backward, read their right operand in the orientation in which candle's GEMM is fastest at that
/// shape ([`right_col_major`]): the row-major `W` or a column-major view of it, and the row-major `Wᵀ` (a
/// contiguous copy, made on first use) or a column-major view of that. The steps' `(x, g)` pairs are
/// recorded, and `∂W` is formed once, as one GEMM over all steps, when the backward pass reaches `W`'s
/// handle (after all the steps that used it).
#[derive(Clone)]
pub struct RecWeight {
    w: Tensor,
    wt: std::sync::Arc<std::sync::Mutex<Option<Tensor>>>,
    /// f32 on a CPU with a packed micro-kernel: `W` packed for it, made on first use (`None`: no kernel).
    packed: std::sync::Arc<std::sync::OnceLock<Option<crate::kernels::packed_gemm::Packed>>>,
    /// Pack `W` quantised to 8 bits (decoding with `--int8`).
    int8: bool,
    token: Tensor,
    records: std::sync::Arc<std::sync::Mutex<Vec<(Tensor, Tensor)>>>,
}

impl RecWeight {
    /// `W` packed for [`crate::kernels::packed_gemm`] (f32 weights on a CPU with a packed micro-kernel, while
    /// [`set_packed_gemm`] leaves it on), made on first use: every product of the pass then streams the same
    /// panels instead of the general GEMM packing `W` again at each call.
    pub(super) fn packed(&self) -> Result<Option<&crate::kernels::packed_gemm::Packed>> {
        if !packed_gemm_on() {
            return Ok(None);
        }
        if let Some(p) = self.packed.get() {
            return Ok(p.as_ref());
        }
        let p = packed_as(&self.w, self.int8)?;
        Ok(self.packed.get_or_init(|| p).as_ref())
    }

    /// The contiguous `Wᵀ` `[N, K]` (outside the graph), made on first use.
    fn wt(&self) -> Result<Tensor> {
        let mut slot = self.wt.lock().expect("prepared weight");
        if let Some(t) = &*slot {
            return Ok(t.clone());
        }
        let t = transpose(&self.w.detach())?;
        *slot = Some(t.clone());
        Ok(t)
    }

    /// The right operand of `x W` for `m` rows of `x`, in the faster orientation.
    fn right(&self, m: usize) -> Result<Tensor> {
        let n = self.w.dim(1)?;
        if right_col_major(m, n) {
            self.wt()?.t()
        } else {
            Ok(self.w.detach())
        }
    }

    /// The right operand of `g Wᵀ` for `m` rows of `g`, in the faster orientation.
    fn right_t(&self, m: usize) -> Result<Tensor> {
        let k = self.w.dim(0)?;
        if right_col_major(m, k) {
            self.w.detach().t()
        } else {
            self.wt()
        }
    }
}

/// Whether candle's GEMM `[m, k] × [k, n]` is faster with a column-major right operand than with a
/// row-major one, on this CPU (it depends on `m` and `n` only). A fixed rule from measurements, so that
/// results never depend on timing: column-major with AVX2+FMA micro-kernels; with AVX-512 ones row-major,
/// except for wide products at batch-size rows (the rates per shape are in docs/design-notes.md, "Measurements
/// behind code choices"). `cgnmt bench` prints both rates at the model's step shapes.
pub fn right_col_major(m: usize, n: usize) -> bool {
    if !gemm_has_avx512() {
        return true;
    }
    m <= 128 && n >= 2000
}

thread_local! {
    /// The recurrent weights prepared for the forward pass running on this thread.
    pub(super) static PASS: std::cell::RefCell<Vec<(candle_core::TensorId, RecWeight)>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Start a forward pass (training batch or decoding call): prepare `weights` for [`rec_matmul`] with fused
/// kernels, dropping what an earlier pass prepared (the optimiser may have changed the weights since).
pub fn begin_pass(k: Kernels, weights: &[&Tensor]) -> Result<()> {
    let prepared = prepare(k, weights)?;
    PASS.with(|p| *p.borrow_mut() = prepared.map(|p| (*p.0).clone()).unwrap_or_default());
    Ok(())
}

/// Weights prepared for [`rec_matmul`] once for several passes over unchanged weights (decoding: every batch of
/// one `translate` call, on whichever thread decodes it), so that each is transposed or packed once.
#[derive(Clone)]
pub struct Prepared(std::sync::Arc<Vec<(candle_core::TensorId, RecWeight)>>);

/// Start a forward pass with weights prepared earlier (see [`Prepared`]).
pub fn begin_prepared_pass(p: &Prepared) {
    PASS.with(|x| *x.borrow_mut() = (*p.0).clone());
}

/// `weights` prepared for [`rec_matmul`] (`None` without fused kernels on their device).
pub fn prepare(k: Kernels, weights: &[&Tensor]) -> Result<Option<Prepared>> {
    prepare_as(k, weights, false)
}

/// [`prepare`], the weights' packed forms quantised to 8 bits when `int8` (decoding only: approximate
/// products, see [`crate::kernels::quantized_gemm`]).
pub fn prepare_as(k: Kernels, weights: &[&Tensor], int8: bool) -> Result<Option<Prepared>> {
    let Some(first) = weights.first() else {
        return Ok(None);
    };
    if !k.ops_fused_on(first.device()) {
        return Ok(None);
    }
    let mut prepared = Vec::with_capacity(weights.len());
    for w in weights {
        if w.rank() != 2
            || prepared
                .iter()
                .any(|e: &(candle_core::TensorId, RecWeight)| e.0 == w.id())
        {
            continue;
        }
        let records = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let token = w.apply_op1(WeightTap {
            records: records.clone(),
        })?;
        prepared.push((
            w.id(),
            RecWeight {
                w: (*w).clone(),
                wt: Default::default(),
                packed: Default::default(),
                int8,
                token,
                records,
            },
        ));
    }
    Ok(Some(Prepared(std::sync::Arc::new(prepared))))
}

thread_local! {
    /// Parameters' gradients the fused ops handed over during the backward pass running on this thread
    /// ([`backward`]); `None` outside one.
    static HANDED: std::cell::RefCell<Option<Vec<(Tensor, Tensor)>>> = const { std::cell::RefCell::new(None) };
}

/// `loss.backward()`, except that the fused ops hand their parameters' gradients over directly instead of
/// returning them to candle's gradient store, which would add each into a zero-filled tensor of the
/// parameter's size (two passes over it and two allocations per parameter and step); they join the store
/// afterwards, added only where a composed op also contributed.
pub fn backward(loss: &Tensor) -> Result<candle_core::backprop::GradStore> {
    HANDED.with(|h| *h.borrow_mut() = Some(Vec::new()));
    let result = loss.backward();
    let handed = HANDED.with(|h| h.borrow_mut().take()).unwrap_or_default();
    let mut grads = result?;
    for (var, g) in handed {
        let g = match grads.remove(&var) {
            Some(prev) => (prev + g)?,
            None => g,
        };
        grads.insert(&var, g);
    }
    Ok(grads)
}

/// A fused op's gradient `grad` for its input `arg`: kept aside when `arg` is a parameter and a
/// [`backward`] pass is running on this thread (returns `None`), otherwise returned for candle to add.
pub fn hand_over(arg: &Tensor, grad: Tensor) -> Option<Tensor> {
    if !arg.is_variable() {
        return Some(grad);
    }
    HANDED.with(|h| match h.borrow_mut().as_mut() {
        Some(v) => {
            v.push((arg.clone(), grad));
            None
        }
        None => Some(grad),
    })
}

/// End the pass: release the prepared weights.
pub fn end_pass() {
    PASS.with(|p| p.borrow_mut().clear());
}

struct RecMatmulT {
    rw: RecWeight,
}

fn rec_matmul_t_fwd(rw: &RecWeight, s1: &CpuStorage, l1: &Layout) -> Result<(CpuStorage, Shape)> {
    use candle_core::backend::BackendStorage;
    let (b, k) = l1.shape().dims2()?;
    let (k2, n) = rw.w.dims2()?;
    if k != k2 {
        candle_core::bail!("recurrent matmul: [{b}, {k}] × [{k2}, {n}]");
    }
    if let (CpuStorage::F32(_), Some(p)) = (s1, rw.packed()?) {
        let y = p.mul_new(
            b,
            slice::<f32>(s1, l1)?,
            k,
            crate::kernels::Start::Zero,
            gemm_threads(),
        );
        return Ok((CpuStorage::F32(y), Shape::from((b, n))));
    }
    let right = rw.right(b)?;
    let (ws, wl) = right.storage_and_layout();
    let y = match &*ws {
        candle_core::Storage::Cpu(w) => s1.matmul(w, (1, b, n, k), l1, wl)?,
        _ => candle_core::bail!("recurrent matmul: weight not on the CPU"),
    };
    Ok((y, Shape::from((b, n))))
}

impl CustomOp2 for RecMatmulT {
    fn name(&self) -> &'static str {
        "recurrent-matmul-t"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        _s2: &CpuStorage,
        _l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        rec_matmul_t_fwd(&self.rw, s1, l1)
    }
    fn bwd(
        &self,
        x: &Tensor,
        token: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        // ∂x = g Wᵀ, its right operand in the faster orientation again.
        let dx = grad.matmul(&self.rw.right_t(grad.dim(0)?)?)?;
        self.rw
            .records
            .lock()
            .expect("recurrent weight records")
            .push((x.detach(), grad.detach()));
        Ok((Some(dx), Some(token.zeros_like()?)))
    }
}

/// The one-element graph handle (value 0) that stands for a prepared weight or a shared input.
pub(crate) fn token_storage(s: &CpuStorage) -> Result<(CpuStorage, Shape)> {
    let out = match s {
        CpuStorage::F32(_) => CpuStorage::F32(vec![0.0]),
        CpuStorage::F64(_) => CpuStorage::F64(vec![0.0]),
        _ => candle_core::bail!("fused kernels support f32 and f64"),
    };
    Ok((out, Shape::from(1)))
}

struct WeightTap {
    records: std::sync::Arc<std::sync::Mutex<Vec<(Tensor, Tensor)>>>,
}

impl candle_core::CustomOp1 for WeightTap {
    fn name(&self) -> &'static str {
        "recurrent-weight"
    }
    fn cpu_fwd(&self, s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        token_storage(s)
    }
    fn bwd(&self, _w: &Tensor, _res: &Tensor, _grad: &Tensor) -> Result<Option<Tensor>> {
        let recs = std::mem::take(&mut *self.records.lock().expect("recurrent weight records"));
        if recs.is_empty() {
            return Ok(None);
        }
        let (xs, gs): (Vec<Tensor>, Vec<Tensor>) = recs.into_iter().unzip();
        let x = Tensor::cat(&xs, 0)?;
        let g = Tensor::cat(&gs, 0)?;
        // ∂W = Xᵀ G over all steps.
        Ok(Some(x.t()?.matmul(&g)?))
    }
}
