//! Shared machinery of the fused CPU kernels: the `--kernels reference|fused` switch, element-type dispatch
//! (f32, and f64 for the gradient checks), contiguous slice access, run-time AVX2/FMA dispatch and
//! branch-free `exp`/`tanh`/`σ` that the compiler can vectorise.
//!
//! Also here: the recurrent weights prepared once per pass ([`begin_pass`], [`rec_matmul`]), the shared
//! per-sentence inputs whose gradients accumulate in place ([`Shared`]), and a blocked transpose.
//!
//! The fused kernels themselves sit next to their composed reference in the module of the paper concept
//! they compute: `attention` (scores; softmax + context), `encoder` (the GRU update, shared by the encoder
//! and the decoder cells), `gate` (the gate's scales on word and context terms), `readout` (maxout; output
//! layer + log-softmax + NLL; inference log-softmax). Each is a candle custom op with a hand-derived backward
//! pass; on devices without a fused twin (CUDA, Metal) the composed reference runs instead.

use candle_core::{CpuStorage, CustomOp2, Device, Layout, Result, Shape, Tensor, WithDType};
use serde::{Deserialize, Serialize};

/// Which implementation of the hot recurrent steps runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Kernels {
    /// Composed candle ops (the reference every fused kernel is tested against).
    Reference,
    /// Fused CPU kernels with hand-derived backward passes (composed ops on other devices).
    Fused,
}

static PROCESS_KERNELS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

impl Default for Kernels {
    /// Fused, unless the process chose otherwise with [`Kernels::set_process_default`] (the CLI's
    /// `--kernels`).
    fn default() -> Self {
        match PROCESS_KERNELS.load(std::sync::atomic::Ordering::Relaxed) {
            1 => Kernels::Reference,
            _ => Kernels::Fused,
        }
    }
}

impl Kernels {
    /// Whether a fused kernel should run for tensors on `dev`.
    pub fn fused_on(self, dev: &Device) -> bool {
        self == Kernels::Fused && dev.is_cpu()
    }

    /// The kernels every model built afterwards in this process uses.
    pub fn set_process_default(k: Kernels) {
        let v = match k {
            Kernels::Fused => 0,
            Kernels::Reference => 1,
        };
        PROCESS_KERNELS.store(v, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn name(self) -> &'static str {
        match self {
            Kernels::Reference => "reference",
            Kernels::Fused => "fused",
        }
    }
}

/// Whether this CPU has AVX2 and FMA (checked once at run time).
pub fn has_avx2_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether candle's GEMM runs its AVX-512 micro-kernels here (the `gemm` crate's `x86-v4` feature, chosen
/// at run time when the CPU has AVX-512F).
pub fn gemm_has_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| std::arch::is_x86_feature_detected!("avx512f"))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether the CPU has AVX-512 VNNI (`vpdpbusd`: four byte products summed into each 32-bit lane), which the
/// int8 products of decoding use when present ([`crate::quantized_gemm`]).
pub fn has_avx512_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            std::arch::is_x86_feature_detected!("avx512f")
                && std::arch::is_x86_feature_detected!("avx512vnni")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// The instruction sets the fused kernels and the GEMM use on this machine.
pub fn simd_level() -> &'static str {
    match (has_avx2_fma(), gemm_has_avx512(), has_avx512_vnni()) {
        (true, true, true) => "avx2+fma, gemm avx512f, int8 avx512vnni",
        (true, true, false) => "avx2+fma, gemm avx512f",
        (true, false, _) => "avx2+fma",
        (false, _, _) => "generic",
    }
}

/// Element types the fused kernels support.
pub trait Real: WithDType + num_traits::Float + Send + Sync + 'static {
    fn from_f64c(x: f64) -> Self;
    /// This type's zero-initialised buffer of `n` elements in an accumulator.
    fn acc_slice(acc: &mut AccBuf, n: usize) -> &mut [Self];
    /// Take the accumulated buffer out as a vector of this type.
    fn acc_take(acc: &mut AccBuf) -> Option<Vec<Self>>;
    /// A vector of this type as an accumulator.
    fn acc_from(v: Vec<Self>) -> AccBuf;
    /// `exp`, vectorisable (f32: a degree-6 polynomial after range reduction, relative error < 3e-7).
    fn exp_v(self) -> Self;
    /// `tanh`, vectorisable.
    fn tanh_v(self) -> Self;
    #[inline(always)]
    fn sigmoid_v(self) -> Self {
        Self::one() / (Self::one() + (-self).exp_v())
    }
}

impl Real for f64 {
    #[inline(always)]
    fn from_f64c(x: f64) -> Self {
        x
    }
    fn acc_slice(acc: &mut AccBuf, n: usize) -> &mut [Self] {
        if !matches!(acc, AccBuf::F64(v) if v.len() == n) {
            *acc = AccBuf::F64(vec![0.0; n]);
        }
        match acc {
            AccBuf::F64(v) => v,
            _ => unreachable!(),
        }
    }
    fn acc_take(acc: &mut AccBuf) -> Option<Vec<Self>> {
        match std::mem::replace(acc, AccBuf::Empty) {
            AccBuf::F64(v) => Some(v),
            _ => None,
        }
    }
    fn acc_from(v: Vec<Self>) -> AccBuf {
        AccBuf::F64(v)
    }
    #[inline(always)]
    fn exp_v(self) -> Self {
        self.exp()
    }
    #[inline(always)]
    fn tanh_v(self) -> Self {
        self.tanh()
    }
}

impl Real for f32 {
    #[inline(always)]
    fn from_f64c(x: f64) -> Self {
        x as f32
    }
    fn acc_slice(acc: &mut AccBuf, n: usize) -> &mut [Self] {
        if !matches!(acc, AccBuf::F32(v) if v.len() == n) {
            *acc = AccBuf::F32(vec![0.0; n]);
        }
        match acc {
            AccBuf::F32(v) => v,
            _ => unreachable!(),
        }
    }
    fn acc_take(acc: &mut AccBuf) -> Option<Vec<Self>> {
        match std::mem::replace(acc, AccBuf::Empty) {
            AccBuf::F32(v) => Some(v),
            _ => None,
        }
    }
    fn acc_from(v: Vec<Self>) -> AccBuf {
        AccBuf::F32(v)
    }
    #[inline(always)]
    fn exp_v(self) -> Self {
        exp_f32(self)
    }
    #[inline(always)]
    fn tanh_v(self) -> Self {
        tanh_f32(self)
    }
}

/// `exp(x)` for f32 without branches or calls (so that loops over it vectorise): `x = n ln2 + r`, `|r| ≤ ln2/2`,
/// `exp(r)` by its Taylor polynomial to degree 7 (truncation error < 3e-8 relative), scaled by `2^n` through
/// the exponent bits. `n` is rounded to nearest by adding and subtracting `1.5·2²³` (the sum's low mantissa
/// bits then hold `n` as an integer), which compiles to plain vector adds where `f32::round` is a libm call.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let y = x * std::f32::consts::LOG2_E + ROUND;
    let n = y - ROUND;
    // ln 2 split in a high part exact in f32 and a low correction.
    let r = x - n * 0.693_145_75 - n * 1.428_606_8e-6;
    let mut p = 1.0 / 5040.0;
    p = p * r + 1.0 / 720.0;
    p = p * r + 1.0 / 120.0;
    p = p * r + 1.0 / 24.0;
    p = p * r + 1.0 / 6.0;
    p = p * r + 0.5;
    p = p * r + 1.0;
    p = p * r + 1.0;
    // n ∈ [−126, 127]: the biased exponent n + 127 is a normal one.
    let n_int = y.to_bits().wrapping_sub(ROUND.to_bits()) as i32;
    let scale = f32::from_bits(((n_int + 127) as u32) << 23);
    // Underflow to 0 as libm does (softmax over masked positions must give exactly 0).
    if x <= -87.0 {
        0.0
    } else {
        p * scale
    }
}

/// `tanh(x)` for f32 as `x P(x²) / Q(x²)` on `[−9, 9]` (beyond, tanh rounds to ±1 in f32), `P` and `Q` of
/// degree 4: a rational fit made for this project (`scripts/fit_tanh.py`: least squares on the linearised
/// relative error, reweighted towards equal ripple), relative error < 4e-7 in f32 arithmetic everywhere (tested against
/// libm below). No `exp`, no branch, one division: about half the instructions of `1 − 2/(e^{2x} + 1)`
/// blended with a series near 0, which the attention scores' `[B, S, Ad]` rows spent most of their time in.
#[inline(always)]
pub fn tanh_f32(x: f32) -> f32 {
    const P: [f32; 4] = [0.133_810_12, 3.495_571_7e-3, 2.060_884_3e-5, 1.335_438e-8];
    const Q: [f32; 4] = [0.467_143_27, 2.587_691_9e-2, 3.285_609_4e-4, 7.776_432e-7];
    let x = x.clamp(-9.0, 9.0);
    let z = x * x;
    let p = ((P[3] * z + P[2]) * z + P[1]) * z + P[0];
    let q = ((Q[3] * z + Q[2]) * z + Q[1]) * z + Q[0];
    let p = p * z + 1.0;
    let q = q * z + 1.0;
    (x * p / q).clamp(-1.0, 1.0)
}

/// The contiguous elements of an input of a custom op.
pub fn slice<'a, T: WithDType>(s: &'a CpuStorage, l: &Layout) -> Result<&'a [T]> {
    let all = T::cpu_storage_as_slice(s)?;
    match l.contiguous_offsets() {
        Some((a, b)) => Ok(&all[a..b]),
        None => candle_core::bail!("fused kernel: input is not contiguous"),
    }
}

/// Dispatch a generic kernel on the storage's element type (f32 or f64).
macro_rules! by_dtype {
    ($s:expr, $f:ident, $($arg:expr),*) => {
        match $s {
            candle_core::CpuStorage::F32(_) => $f::<f32>($($arg),*),
            candle_core::CpuStorage::F64(_) => $f::<f64>($($arg),*),
            _ => candle_core::bail!("fused kernels support f32 and f64"),
        }
    };
}
pub(crate) use by_dtype;

/// Define `$name` that runs the `#[inline(always)]` generic `$inner` compiled for AVX2+FMA when the CPU has
/// them (run-time detection), or as generic x86-64 code otherwise.
macro_rules! simd_dispatch {
    ($name:ident, $avx:ident, $inner:ident, ($($arg:ident : $ty:ty),*)) => {
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = "avx2,fma")]
        unsafe fn $avx<T: $crate::kernels::Real>($($arg: $ty),*) {
            $inner::<T>($($arg),*)
        }
        pub(crate) fn $name<T: $crate::kernels::Real>($($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            if $crate::kernels::has_avx2_fma() {
                // SAFETY: the CPU supports AVX2 and FMA (checked at run time).
                unsafe { $avx::<T>($($arg),*) };
                return;
            }
            $inner::<T>($($arg),*)
        }
    };
}
pub(crate) use simd_dispatch;

/// Relative difference `max|a−b| / max(max|b|, tiny)` of two tensors (for the kernel tests and `bench`).
pub fn max_rel_diff(a: &candle_core::Tensor, b: &candle_core::Tensor) -> Result<f64> {
    let a = a.to_dtype(candle_core::DType::F64)?.flatten_all()?;
    let b = b.to_dtype(candle_core::DType::F64)?.flatten_all()?;
    let d = (&a - &b)?.abs()?.max(0)?.to_scalar::<f64>()?;
    let m = b.abs()?.max(0)?.to_scalar::<f64>()?;
    Ok(d / m.max(1e-30))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_exp_and_tanh_match_libm() {
        let mut worst = (0f64, 0f64);
        let mut x = -80.0f32;
        while x < 30.0 {
            let e = (exp_f32(x) as f64 - (x as f64).exp()).abs() / (x as f64).exp();
            let t =
                (tanh_f32(x) as f64 - (x as f64).tanh()).abs() / (x as f64).tanh().abs().max(1e-30);
            worst.0 = worst.0.max(e);
            worst.1 = worst.1.max(t);
            x += 0.000_731;
        }
        // Tiny arguments keep their relative accuracy (tanh x ≈ x), large ones saturate at ±1.
        for x in [
            1e-30f32,
            1e-12,
            3e-7,
            1e-4,
            0.01,
            8.99,
            9.0,
            9.5,
            40.0,
            f32::MAX,
        ] {
            for x in [x, -x] {
                let t = tanh_f32(x);
                let r = (x as f64).tanh();
                worst.1 = worst.1.max((t as f64 - r).abs() / r.abs());
                assert!(
                    t.abs() <= 1.0 && t.signum() == x.signum(),
                    "tanh({x}) = {t}"
                );
            }
        }
        assert!(worst.0 < 1e-6, "exp rel err {}", worst.0);
        assert!(worst.1 < 5e-7, "tanh rel err {}", worst.1);
        assert_eq!(tanh_f32(0.0), 0.0);
        assert!(exp_f32(-200.0) == 0.0 && exp_f32(200.0) > 1e38);
        assert!((1.0f32.sigmoid_v() - 0.731_058_6).abs() < 1e-6);
    }
}

/// A recurrent product `x W` (`[B, in] × [in, out]`, one per time step). With fused kernels and `W` prepared
/// by [`begin_pass`], the product reads the prepared `Wᵀ` and its backward pass returns only `∂x`, recording
/// `(x, g)`; `∂W = Σ_t x_tᵀ g_t` is then one GEMM over all steps (`[in, T·B] × [T·B, out]`) instead of T small
/// ones plus T accumulations. Otherwise (reference kernels, a weight not prepared) it is a plain `matmul`.
pub fn rec_matmul(k: Kernels, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    if k.fused_on(x.device()) && x.rank() == 2 {
        if let Some(rw) = prepared(w) {
            return x
                .contiguous()?
                .apply_op2(&rw.token.clone(), RecMatmulT { rw });
        }
    }
    x.matmul(w)
}

/// `dst = start + x W` (see [`crate::packed_gemm::Start`]) for an f32 `x` `[m, k]` (row-major) into a row-major `dst` `[m, n]`
/// with the packed `W` of this thread's pass (see [`begin_pass`]; decoding prepares the output layer's `W_2`
/// too). `false` when `W` has no packed form here (not prepared, not f32, no micro-kernel): nothing is
/// written then.
pub fn prepared_mul_into(
    w: &Tensor,
    m: usize,
    x: &[f32],
    dst: &mut [f32],
    start: crate::packed_gemm::Start,
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
    let out = p.mul_new(m, xs, k, crate::packed_gemm::Start::Zero, gemm_threads());
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
    p: &crate::packed_gemm::Packed,
    m: usize,
    x: &[f32],
    dst: &mut [f32],
    start: crate::packed_gemm::Start,
) -> Result<()> {
    let (k, n) = p.dims();
    if x.len() < m * k || dst.len() < m * n {
        candle_core::bail!("packed product: [{m}, {k}] × [{k}, {n}] does not fit its buffers");
    }
    p.mul_from(m, x, k, dst, n, start, gemm_threads());
    Ok(())
}

/// An f32 weight `W` `[K, N]` packed for [`crate::packed_gemm`] (`None`: not f32, no packed micro-kernel on
/// this CPU, or the packed GEMM switched off).
pub fn packed(w: &Tensor) -> Result<Option<crate::packed_gemm::Packed>> {
    packed_as(w, false)
}

/// [`packed`], or quantised to 8 bits when `int8` (approximate products, see [`crate::quantized_gemm`];
/// `None` also when the CPU has no AVX2).
pub fn packed_as(w: &Tensor, int8: bool) -> Result<Option<crate::packed_gemm::Packed>> {
    if w.dtype() != candle_core::DType::F32 || !packed_gemm_on() || !w.device().is_cpu() {
        return Ok(None);
    }
    let Some(isa) = crate::packed_gemm::Isa::detect() else {
        return Ok(None);
    };
    let (k, n) = w.dims2()?;
    let w = w.contiguous()?;
    let (st, l) = w.storage_and_layout();
    let b = storage_slice::<f32>(&st, l)?;
    if int8 {
        return Ok(crate::packed_gemm::Packed::new_int8(b, k, n, n, 1));
    }
    Ok(Some(crate::packed_gemm::Packed::new(isa, b, k, n, n, 1)))
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
    packed: std::sync::Arc<std::sync::OnceLock<Option<crate::packed_gemm::Packed>>>,
    /// Pack `W` quantised to 8 bits (decoding with `--int8`).
    int8: bool,
    token: Tensor,
    records: std::sync::Arc<std::sync::Mutex<Vec<(Tensor, Tensor)>>>,
}

impl RecWeight {
    /// `W` packed for [`crate::packed_gemm`] (f32 weights on a CPU with a packed micro-kernel, while
    /// [`set_packed_gemm`] leaves it on), made on first use: every product of the pass then streams the same
    /// panels instead of the general GEMM packing `W` again at each call.
    fn packed(&self) -> Result<Option<&crate::packed_gemm::Packed>> {
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
/// except for wide products at batch-size rows (the rates per shape are in docs/RESULTS.md, "Measurements
/// behind code choices"). `cgnmt bench` prints both rates at the model's step shapes.
pub fn right_col_major(m: usize, n: usize) -> bool {
    if !gemm_has_avx512() {
        return true;
    }
    m <= 128 && n >= 2000
}

thread_local! {
    /// The recurrent weights prepared for the forward pass running on this thread.
    static PASS: std::cell::RefCell<Vec<(candle_core::TensorId, RecWeight)>> = const { std::cell::RefCell::new(Vec::new()) };
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
/// products, see [`crate::quantized_gemm`]).
pub fn prepare_as(k: Kernels, weights: &[&Tensor], int8: bool) -> Result<Option<Prepared>> {
    let Some(first) = weights.first() else {
        return Ok(None);
    };
    if !k.fused_on(first.device()) {
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

/// `xᵀ` as a contiguous tensor (a graph node: its gradient is the transposed gradient). On the CPU a
/// cache-blocked copy (candle's strided copy walks one element at a time).
pub fn transpose(x: &Tensor) -> Result<Tensor> {
    if !x.device().is_cpu() || x.rank() != 2 || !x.is_contiguous() {
        return x.t()?.contiguous();
    }
    x.apply_op1(Transpose)
}

struct Transpose;

fn transpose_fwd<T: Real>(s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
    let (r, c) = l.shape().dims2()?;
    let out = transposed(slice::<T>(s, l)?, r, c);
    Ok((T::to_cpu_storage_owned(out), Shape::from((c, r))))
}

/// The row-major `[c, r]` transpose of a row-major `[r, c]` matrix, copied tile by tile.
pub fn transposed<T: Real>(x: &[T], r: usize, c: usize) -> Vec<T> {
    use rayon::prelude::*;
    let mut out = zeroed(r * c);
    if r == 0 || c == 0 {
        return out;
    }
    const TILE: usize = 32;
    // One task per band of TILE output rows (input columns j0..j0 + TILE), copied tile by tile.
    let band = |(b, o): (usize, &mut [T])| {
        let j0 = b * TILE;
        let j1 = j0 + o.len() / r;
        for i0 in (0..r).step_by(TILE) {
            for i in i0..(i0 + TILE).min(r) {
                let src = &x[i * c + j0..i * c + j1];
                for (jj, &v) in src.iter().enumerate() {
                    o[jj * r + i] = v;
                }
            }
        }
    };
    if r * c >= 64 * 1024 && !SERIAL.with(|s| s.get()) {
        out.par_chunks_mut(TILE * r).enumerate().for_each(band);
    } else {
        out.chunks_mut(TILE * r).enumerate().for_each(band);
    }
    out
}

impl candle_core::CustomOp1 for Transpose {
    fn name(&self) -> &'static str {
        "transpose"
    }
    fn cpu_fwd(&self, s: &CpuStorage, l: &Layout) -> Result<(CpuStorage, Shape)> {
        by_dtype!(s, transpose_fwd, s, l)
    }
    fn bwd(&self, _x: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(transpose(&grad.contiguous()?)?))
    }
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
            crate::packed_gemm::Start::Zero,
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

/// Lanes of the vectorisable reductions below (8 × f32 = one AVX register).
const LANES: usize = 8;

/// `Σ a_i b_i` with independent accumulators so that the loop vectorises.
#[inline(always)]
pub fn dot<T: Real>(a: &[T], b: &[T]) -> T {
    let n = a.len().min(b.len());
    let mut acc = [T::zero(); LANES];
    let (ca, cb) = (a[..n].chunks_exact(LANES), b[..n].chunks_exact(LANES));
    let (ra, rb) = (ca.remainder(), cb.remainder());
    for (x, y) in ca.zip(cb) {
        for l in 0..LANES {
            acc[l] = acc[l] + x[l] * y[l];
        }
    }
    let mut s = acc.iter().fold(T::zero(), |s, &x| s + x);
    for (x, y) in ra.iter().zip(rb) {
        s = s + *x * *y;
    }
    s
}

/// `max_i a_i` (−∞ for an empty slice), vectorisable.
#[inline(always)]
pub fn max_of<T: Real>(a: &[T]) -> T {
    let mut acc = [T::neg_infinity(); LANES];
    let c = a.chunks_exact(LANES);
    let r = c.remainder();
    for x in c {
        for l in 0..LANES {
            acc[l] = if x[l] > acc[l] { x[l] } else { acc[l] };
        }
    }
    let mut m = acc
        .iter()
        .fold(T::neg_infinity(), |m, &x| if x > m { x } else { m });
    for &x in r {
        if x > m {
            m = x;
        }
    }
    m
}

/// `Σ_i exp(a_i − m)`, vectorisable.
#[inline(always)]
pub fn sum_exp_shifted<T: Real>(a: &[T], m: T) -> T {
    let mut acc = [T::zero(); LANES];
    let c = a.chunks_exact(LANES);
    let r = c.remainder();
    for x in c {
        for l in 0..LANES {
            acc[l] = acc[l] + (x[l] - m).exp_v();
        }
    }
    let mut s = acc.iter().fold(T::zero(), |s, &x| s + x);
    for &x in r {
        s = s + (x - m).exp_v();
    }
    s
}

/// A gradient accumulated in place across decoder steps.
#[derive(Default)]
pub enum AccBuf {
    #[default]
    Empty,
    F32(Vec<f32>),
    F64(Vec<f64>),
}

/// A large per-sentence tensor that every decoder step reads (the annotations, the attention keys `A h_j`).
/// With autodiff, the steps' fused backward passes add their gradient for it into one buffer in place, and
/// the tensor receives that sum once, instead of one `[B, S, ·]` gradient tensor allocated and added per
/// step. `token` is the one-element graph handle the steps take as their input in its place.
#[derive(Clone)]
pub struct Shared {
    pub tensor: Tensor,
    pub token: Tensor,
    pub acc: std::sync::Arc<std::sync::Mutex<AccBuf>>,
}

impl Shared {
    pub fn new(x: &Tensor) -> Result<Shared> {
        let tensor = x.contiguous()?;
        let acc = std::sync::Arc::new(std::sync::Mutex::new(AccBuf::Empty));
        let token = tensor.apply_op1(ShareTap { acc: acc.clone() })?;
        Ok(Shared { tensor, token, acc })
    }

    /// Block `i` of the first dimension (`[n, …]` → `[…]`, e.g. one time step of a time-major tensor) as a
    /// graph node whose gradient is added in place into the shared buffer: no full-size gradient per step.
    pub fn index(&self, i: usize) -> Result<Tensor> {
        self.token.apply_op1(StepSlice {
            shared: self.clone(),
            i,
        })
    }

    /// The tensor's storage as a slice (for a fused kernel's forward pass).
    pub fn with_slice<T: Real, R>(&self, f: impl FnOnce(&[T]) -> Result<R>) -> Result<R> {
        let (st, l) = self.tensor.storage_and_layout();
        match &*st {
            candle_core::Storage::Cpu(c) => f(slice::<T>(c, l)?),
            _ => candle_core::bail!("shared tensor is not on the CPU"),
        }
    }

    /// Add `g` (this tensor's shape, flattened) into the accumulated gradient.
    pub fn add_grad<T: Real>(&self, g: Vec<T>) {
        let mut acc = self.acc.lock().expect("gradient accumulator");
        let n = self.tensor.elem_count();
        assert_eq!(g.len(), n, "shared input: gradient size");
        if matches!(*acc, AccBuf::Empty) {
            // The first contribution becomes the accumulator (no zero-filled buffer, no pass over it).
            *acc = T::acc_from(g);
            return;
        }
        for (a, x) in T::acc_slice(&mut acc, n).iter_mut().zip(g) {
            *a = *a + x;
        }
    }

    /// Add `f`'s contribution into the accumulated gradient (zero-initialised on first use).
    pub fn accumulate<T: Real>(&self, f: impl FnOnce(&mut [T])) {
        let mut acc = self.acc.lock().expect("gradient accumulator");
        f(T::acc_slice(&mut acc, self.tensor.elem_count()));
    }
}

/// A fused op's large input: a graph tensor (the op wraps it in a [`Shared`] handle) or a handle its producer
/// made ([`linear_shared`]), whose gradient then never enters candle's gradient store.
pub enum Input<'a> {
    Tensor(&'a Tensor),
    Shared(Shared),
}

impl<'a> From<&'a Tensor> for Input<'a> {
    fn from(t: &'a Tensor) -> Self {
        Input::Tensor(t)
    }
}

impl From<Shared> for Input<'_> {
    fn from(s: Shared) -> Self {
        Input::Shared(s)
    }
}

impl Input<'_> {
    /// The input's value.
    pub fn tensor(&self) -> &Tensor {
        match self {
            Input::Tensor(t) => t,
            Input::Shared(s) => &s.tensor,
        }
    }
    /// The handle the op reads it through.
    pub fn into_shared(self) -> Result<Shared> {
        match self {
            Input::Tensor(t) => Shared::new(t),
            Input::Shared(s) => Ok(s),
        }
    }
}

/// `x W + b` as the [`Shared`] input of a fused op: the product is formed now, outside the graph, and the graph
/// holds a one-element token whose backward pass takes the gradient the consumer accumulated in the handle
/// and returns `∂x`, `∂W`, `∂b`. Compared with [`linear`] feeding a [`Shared::new`] handle, the product's
/// gradient (`[N, M]`, multi-megabyte for the sequence ops' projections) is never zero-filled and added in
/// candle's gradient store.
pub fn linear_shared(x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Shared> {
    linear_shared_rows(x, w, b, None)
}

/// Rows of a `[N, ·]` operand, in increasing order.
pub type Rows = std::sync::Arc<Vec<usize>>;

/// [`linear_shared`] over rows `rows` of `x` only (`None`: all): the result is `[rows.len(), M]`, row `i` being
/// `x`'s row `rows[i]` times `W` plus `b` (for a consumer that reads some rows only, such as the words'
/// positions of a padded batch); the other rows of `x` get zero gradient.
pub fn linear_shared_rows(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    rows: Option<Rows>,
) -> Result<Shared> {
    let (x, w, b) = (x.contiguous()?, w.contiguous()?, b.contiguous()?);
    check_rows(rows.as_ref(), x.dims2()?.0, "linear over rows")?;
    let tensor = match &rows {
        None => x
            .detach()
            .apply_op3(&w.detach(), &b.detach(), Linear(None, None))?,
        Some(r) => x
            .detach()
            .apply_op3(&w.detach(), &b.detach(), Linear(Some(r.clone()), None))?,
    };
    let acc = std::sync::Arc::new(std::sync::Mutex::new(AccBuf::Empty));
    let token = x.apply_op3(
        &w,
        &b,
        LinearTap {
            acc: acc.clone(),
            rows,
        },
    )?;
    Ok(Shared { tensor, token, acc })
}

/// `rows` must be increasing and below `n`.
fn check_rows(rows: Option<&Rows>, n: usize, what: &str) -> Result<()> {
    match rows {
        Some(r) if r.windows(2).any(|p| p[0] >= p[1]) || r.last().is_some_and(|&l| l >= n) => {
            candle_core::bail!("{what}: rows out of order or beyond {n}")
        }
        _ => Ok(()),
    }
}

/// Rows `rows` of `x` `[N, w]`, gathered.
fn gather_rows<T: Copy>(x: &[T], w: usize, rows: &[usize]) -> Vec<T> {
    let mut out = Vec::with_capacity(rows.len() * w);
    for &r in rows {
        out.extend_from_slice(&x[r * w..(r + 1) * w]);
    }
    out
}

/// Where a fused op's forward pass leaves its activations for the backward pass.
pub(crate) type SavedSlot = std::sync::Mutex<Option<Box<dyn std::any::Any + Send>>>;

/// The activations the forward pass left in `slot`, taken out (one backward pass per forward pass); `op` names
/// the op in the error when there are none or they are of another dtype.
pub(crate) fn take_saved<S: 'static>(slot: &SavedSlot, op: &str) -> Result<S> {
    let saved = slot
        .lock()
        .expect("saved activations")
        .take()
        .ok_or_else(|| candle_core::Error::Msg(format!("{op}: no saved forward pass")))?;
    saved
        .downcast::<S>()
        .map(|b| *b)
        .map_err(|_| candle_core::Error::Msg(format!("{op}: dtype")))
}

/// A fused op that can hand its output to its consumers as a [`Shared`] handle ([`shared_output`]).
pub(crate) trait FusedOutput: Send + Sync + 'static {
    /// The op's forward and backward names in `cgnmt bench --profile-ops`.
    fn profile_names(&self) -> (&'static str, &'static str);
    /// The output, computed from the op's inputs.
    fn forward_output(&self) -> Result<(CpuStorage, Shape)>;
    /// The backward pass for the output's gradient `grad`: every input's gradient goes to its handle.
    fn backward_output(&self, grad: &Tensor) -> Result<()>;
}

/// `op`'s output as a [`Shared`] handle: formed now, outside the graph; the graph holds a one-element token
/// on `bundle` (the concatenation of the op's inputs' tokens) whose backward pass runs the op's backward pass
/// on the gradient the consumers accumulated in the handle — the output's gradient, multi-megabyte for the
/// sequence ops, is never zero-filled and added in candle's gradient store.
pub(crate) fn shared_output<O: FusedOutput>(op: O, bundle: &Tensor) -> Result<Shared> {
    let (fwd_name, _) = op.profile_names();
    let (storage, shape) = crate::profile::timed(fwd_name, || op.forward_output())?;
    let dev = bundle.device();
    let tensor = match storage {
        CpuStorage::F32(v) => Tensor::from_vec(v, shape.clone(), dev)?,
        CpuStorage::F64(v) => Tensor::from_vec(v, shape.clone(), dev)?,
        _ => candle_core::bail!("fused kernels support f32 and f64"),
    };
    let acc = std::sync::Arc::new(std::sync::Mutex::new(AccBuf::Empty));
    let token = bundle.apply_op1(OutputTap {
        op,
        acc: acc.clone(),
        shape,
    })?;
    Ok(Shared { tensor, token, acc })
}

struct OutputTap<O> {
    op: O,
    acc: std::sync::Arc<std::sync::Mutex<AccBuf>>,
    shape: Shape,
}

impl<O: FusedOutput> candle_core::CustomOp1 for OutputTap<O> {
    fn name(&self) -> &'static str {
        "fused-op-shared-output"
    }
    fn cpu_fwd(&self, s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        token_storage(s)
    }
    fn bwd(&self, bundle: &Tensor, _res: &Tensor, _grad: &Tensor) -> Result<Option<Tensor>> {
        let (_, bwd_name) = self.op.profile_names();
        crate::profile::timed(bwd_name, || {
            let g = take_accumulated(
                &self.acc,
                self.shape.clone(),
                bundle.dtype(),
                bundle.device(),
            )?;
            if let Some(g) = g {
                self.op.backward_output(&g)?;
            }
            Ok(Some(bundle.zeros_like()?))
        })
    }
}

/// `x W` over the last dimension of a [`Shared`] input `x` (`[…, K]` × `[K, M]` → `[…, M]`), itself as a
/// [`Shared`] handle: formed now, outside the graph; the graph holds a one-element token (on `x`'s token and
/// `W`) whose backward pass takes the gradient accumulated in the result's handle, adds `∂x = ∂y Wᵀ` into
/// `x`'s handle and hands `∂W = xᵀ ∂y` over. Neither `[N, K]` nor `[N, M]` gradient enters candle's store.
pub fn product_shared(x: &Shared, w: &Tensor) -> Result<Shared> {
    product_shared_rows(x, w, None)
}

/// [`product_shared`] over rows `rows` of `x` viewed as `[N, K]` (`None`: all): the result is
/// `[rows.len(), M]`, row `i` being `x`'s row `rows[i]` times `W` (for a consumer that reads some rows only,
/// such as the words' positions of a padded batch); the other rows of `x` get no gradient from it.
pub fn product_shared_rows(x: &Shared, w: &Tensor, rows: Option<Rows>) -> Result<Shared> {
    let w = w.contiguous()?;
    let (k, m) = w.dims2()?;
    let dims = x.tensor.dims();
    if dims.last() != Some(&k) {
        candle_core::bail!("shared product: {:?} × [{k}, {m}]", dims);
    }
    let n = x.tensor.elem_count() / k.max(1);
    check_rows(rows.as_ref(), n, "shared product over rows")?;
    let out_dims = match &rows {
        None => {
            let mut d = dims.to_vec();
            *d.last_mut().expect("rank ≥ 1") = m;
            d
        }
        Some(r) => vec![r.len(), m],
    };
    fn run<T: Real>(x: &Shared, w: &Tensor, rows: Option<&[usize]>, n: usize) -> Result<Vec<T>> {
        let (k, m) = w.dims2()?;
        let (ws, wl) = w.storage_and_layout();
        let wd = storage_slice::<T>(&ws, wl)?;
        x.with_slice::<T, _>(|xd| {
            Ok(match rows {
                None => product(n, m, k, Mat::rows(xd, k), Mat::rows(wd, m)),
                Some(r) => {
                    let xg = gather_rows(xd, k, r);
                    product(r.len(), m, k, Mat::rows(&xg, k), Mat::rows(wd, m))
                }
            })
        })
    }
    let tensor = crate::profile::timed("shared product forward", || match w.dtype() {
        candle_core::DType::F32 => Tensor::from_vec(
            run::<f32>(x, &w, rows.as_deref().map(|r| r.as_slice()), n)?,
            out_dims,
            w.device(),
        ),
        candle_core::DType::F64 => Tensor::from_vec(
            run::<f64>(x, &w, rows.as_deref().map(|r| r.as_slice()), n)?,
            out_dims,
            w.device(),
        ),
        _ => candle_core::bail!("fused kernels support f32 and f64"),
    })?;
    let acc = std::sync::Arc::new(std::sync::Mutex::new(AccBuf::Empty));
    let n_out = rows.as_ref().map_or(n, |r| r.len());
    let token = x.token.apply_op2(
        &w,
        ProductTap {
            x: x.clone(),
            acc: acc.clone(),
            n: n_out,
            rows,
        },
    )?;
    Ok(Shared { tensor, token, acc })
}

struct ProductTap {
    x: Shared,
    acc: std::sync::Arc<std::sync::Mutex<AccBuf>>,
    /// Rows of the result (`x`'s, viewed as `[N, K]`, or `rows.len()`).
    n: usize,
    /// The rows of `x` formed (see [`product_shared_rows`]).
    rows: Option<Rows>,
}

impl ProductTap {
    fn backward<T: Real>(&self, w: &Tensor, g: &Tensor) -> Result<Tensor> {
        let (k, m) = w.dims2()?;
        let n = self.n;
        let (ws, wl) = w.storage_and_layout();
        let wd = storage_slice::<T>(&ws, wl)?;
        let (gs, gl) = g.storage_and_layout();
        let gd = storage_slice::<T>(&gs, gl)?;
        let Some(rows) = &self.rows else {
            // ∂x += ∂y Wᵀ, in place in x's handle.
            self.x.accumulate::<T>(|dx| {
                gemm_into(n, k, m, dx, k, true, Mat::rows(gd, m), Mat::t(wd, m))
            });
            let dw = self
                .x
                .with_slice::<T, _>(|xd| Ok(product(k, m, n, Mat::t(xd, k), Mat::rows(gd, m))))?;
            return Tensor::from_vec(dw, (k, m), w.device());
        };
        // The rows' ∂x = ∂y Wᵀ, added into theirs in x's handle; ∂W = x_rowsᵀ ∂y.
        let dxr = product(n, k, m, Mat::rows(gd, m), Mat::t(wd, m));
        self.x.accumulate::<T>(|dx| {
            use rayon::prelude::*;
            let dxw = RowsMut::new(dx, k);
            rows.par_iter().enumerate().for_each(|(i, &r)| {
                // SAFETY: the rows are distinct (checked increasing), one task each.
                let d = unsafe { dxw.row(r) };
                for (a, &x) in d.iter_mut().zip(&dxr[i * k..(i + 1) * k]) {
                    *a = *a + x;
                }
            });
        });
        let dw = self.x.with_slice::<T, _>(|xd| {
            let xg = gather_rows(xd, k, rows);
            Ok(product(k, m, n, Mat::t(&xg, k), Mat::rows(gd, m)))
        })?;
        Tensor::from_vec(dw, (k, m), w.device())
    }
}

impl candle_core::CustomOp2 for ProductTap {
    fn name(&self) -> &'static str {
        "product-shared"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        _l1: &Layout,
        _s2: &CpuStorage,
        _l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        token_storage(s1)
    }
    fn bwd(
        &self,
        token: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        _grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        crate::profile::timed("shared product backward", || {
            let m = w.dim(1)?;
            let Some(g) = take_accumulated(&self.acc, (self.n, m), w.dtype(), w.device())? else {
                return Ok((None, None));
            };
            let dw = match w.dtype() {
                candle_core::DType::F32 => self.backward::<f32>(w, &g)?,
                candle_core::DType::F64 => self.backward::<f64>(w, &g)?,
                _ => candle_core::bail!("fused kernels support f32 and f64"),
            };
            Ok((Some(token.zeros_like()?), hand_over(w, dw)))
        })
    }
}

/// Rows `rows` and columns `cols` of a [`Shared`] tensor viewed as `[N, C]` (`C` its last dimension), as a
/// graph node `[rows.len(), cols.len()]` whose gradient is added into the handle (e.g. the backward
/// direction's state at each sentence's first word, read from the annotations).
pub fn shared_rows(x: &Shared, rows: Vec<usize>, cols: std::ops::Range<usize>) -> Result<Tensor> {
    let c = *x.tensor.dims().last().unwrap_or(&0);
    let n = x.tensor.elem_count() / c.max(1);
    if cols.start > cols.end || cols.end > c || rows.iter().any(|&r| r >= n) {
        candle_core::bail!("shared rows: out of bounds of [{n}, {c}]");
    }
    x.token.apply_op1(SharedRows {
        x: x.clone(),
        rows,
        cols,
        c,
    })
}

struct SharedRows {
    x: Shared,
    rows: Vec<usize>,
    cols: std::ops::Range<usize>,
    c: usize,
}

impl SharedRows {
    fn forward<T: Real>(&self) -> Result<(CpuStorage, Shape)> {
        let w = self.cols.len();
        let v = self.x.with_slice::<T, _>(|xd| {
            Ok(self
                .rows
                .iter()
                .flat_map(|&r| {
                    xd[r * self.c + self.cols.start..r * self.c + self.cols.end]
                        .iter()
                        .copied()
                })
                .collect::<Vec<T>>())
        })?;
        Ok((
            T::to_cpu_storage_owned(v),
            Shape::from((self.rows.len(), w)),
        ))
    }

    fn backward<T: Real>(&self, grad: &Tensor) -> Result<()> {
        let g: Vec<T> = grad.flatten_all()?.to_vec1()?;
        let w = self.cols.len();
        self.x.accumulate::<T>(|acc| {
            for (i, &r) in self.rows.iter().enumerate() {
                let at = r * self.c + self.cols.start;
                for (a, &x) in acc[at..at + w].iter_mut().zip(&g[i * w..(i + 1) * w]) {
                    *a = *a + x;
                }
            }
        });
        Ok(())
    }
}

impl candle_core::CustomOp1 for SharedRows {
    fn name(&self) -> &'static str {
        "shared-rows"
    }
    fn cpu_fwd(&self, s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        match s {
            CpuStorage::F32(_) => self.forward::<f32>(),
            CpuStorage::F64(_) => self.forward::<f64>(),
            _ => candle_core::bail!("fused kernels support f32 and f64"),
        }
    }
    fn bwd(&self, token: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        match grad.dtype() {
            candle_core::DType::F32 => self.backward::<f32>(grad)?,
            candle_core::DType::F64 => self.backward::<f64>(grad)?,
            _ => candle_core::bail!("fused kernels support f32 and f64"),
        }
        Ok(Some(token.zeros_like()?))
    }
}

struct LinearTap {
    acc: std::sync::Arc<std::sync::Mutex<AccBuf>>,
    /// The rows formed (see [`linear_shared_rows`]).
    rows: Option<Rows>,
}

impl candle_core::CustomOp3 for LinearTap {
    fn name(&self) -> &'static str {
        "linear-shared"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        _l1: &Layout,
        _s2: &CpuStorage,
        _l2: &Layout,
        _s3: &CpuStorage,
        _l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        token_storage(s1)
    }
    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        _grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        crate::profile::timed("linear backward", || {
            let n = x.dim(0)?;
            let Some(rows) = &self.rows else {
                let shape = (n, w.dim(1)?);
                return match take_accumulated(&self.acc, shape, x.dtype(), x.device())? {
                    Some(g) => linear_grads(x, w, b, &g),
                    None => Ok((None, None, None)),
                };
            };
            // The formed rows' gradients; the other rows' ∂x is zero.
            let shape = (rows.len(), w.dim(1)?);
            let Some(g) = take_accumulated(&self.acc, shape, x.dtype(), x.device())? else {
                return Ok((None, None, None));
            };
            fn pick<T: Real>(x: &Tensor, rows: &[usize]) -> Result<Tensor> {
                let k = x.dim(1)?;
                let v = to_vec::<T>(x)?;
                Tensor::from_vec(gather_rows(&v, k, rows), (rows.len(), k), x.device())
            }
            fn spread<T: Real>(d: &Tensor, rows: &[usize], n: usize) -> Result<Tensor> {
                let k = d.dim(1)?;
                let v = to_vec::<T>(d)?;
                let mut out = zeroed::<T>(n * k);
                for (i, &r) in rows.iter().enumerate() {
                    out[r * k..(r + 1) * k].copy_from_slice(&v[i * k..(i + 1) * k]);
                }
                Tensor::from_vec(out, (n, k), d.device())
            }
            let (xr, f64s) = match x.dtype() {
                candle_core::DType::F32 => (pick::<f32>(x, rows)?, false),
                candle_core::DType::F64 => (pick::<f64>(x, rows)?, true),
                _ => candle_core::bail!("fused kernels support f32 and f64"),
            };
            let (dxr, dw, db) = linear_grads(&xr, w, b, &g)?;
            let dx = match dxr {
                Some(d) if f64s => Some(spread::<f64>(&d, rows, n)?),
                Some(d) => Some(spread::<f32>(&d, rows, n)?),
                None => None,
            };
            Ok((dx, dw, db))
        })
    }
}

struct ShareTap {
    acc: std::sync::Arc<std::sync::Mutex<AccBuf>>,
}

/// The gradient accumulated in a shared handle as a tensor of `shape` (`None` when nothing was added),
/// leaving the accumulator empty.
pub(crate) fn take_accumulated<S: Into<Shape>>(
    acc: &std::sync::Mutex<AccBuf>,
    shape: S,
    dtype: candle_core::DType,
    dev: &Device,
) -> Result<Option<Tensor>> {
    let mut acc = acc.lock().expect("gradient accumulator");
    match dtype {
        candle_core::DType::F32 => f32::acc_take(&mut acc).map(|v| Tensor::from_vec(v, shape, dev)),
        candle_core::DType::F64 => f64::acc_take(&mut acc).map(|v| Tensor::from_vec(v, shape, dev)),
        _ => None,
    }
    .transpose()
}

/// `x W + b`'s gradients for the output gradient `g`: `∂x` to candle, `∂W` and `∂b` handed over.
fn linear_grads(
    x: &Tensor,
    w: &Tensor,
    b: &Tensor,
    g: &Tensor,
) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
    let (dx, dw) = product_grads(x, w, g)?;
    let db = column_sums(g)?;
    Ok((Some(dx), hand_over(w, dw), hand_over(b, db)))
}

impl candle_core::CustomOp1 for ShareTap {
    fn name(&self) -> &'static str {
        "shared-input"
    }
    fn cpu_fwd(&self, s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        token_storage(s)
    }
    fn bwd(&self, arg: &Tensor, _res: &Tensor, _grad: &Tensor) -> Result<Option<Tensor>> {
        let g = take_accumulated(&self.acc, arg.shape(), arg.dtype(), arg.device())?;
        Ok(g.and_then(|g| hand_over(arg, g)))
    }
}

struct StepSlice {
    shared: Shared,
    i: usize,
}

fn step_slice_fwd<T: Real>(sh: &Shared, i: usize) -> Result<(CpuStorage, Shape)> {
    let dims = sh.tensor.dims();
    let n = dims.first().copied().unwrap_or(0);
    if i >= n {
        candle_core::bail!("step slice {i} of a tensor with {n} steps");
    }
    let block = sh.tensor.elem_count() / n;
    let v = sh.with_slice::<T, _>(|x| Ok(x[i * block..(i + 1) * block].to_vec()))?;
    Ok((T::to_cpu_storage_owned(v), Shape::from(dims[1..].to_vec())))
}

fn step_slice_bwd<T: Real>(sh: &Shared, i: usize, grad: &Tensor) -> Result<()> {
    let n = sh.tensor.dim(0)?;
    let block = sh.tensor.elem_count() / n;
    let g: Vec<T> = grad.flatten_all()?.to_vec1()?;
    sh.accumulate::<T>(|acc| {
        for (a, x) in acc[i * block..(i + 1) * block].iter_mut().zip(g) {
            *a = *a + x;
        }
    });
    Ok(())
}

impl candle_core::CustomOp1 for StepSlice {
    fn name(&self) -> &'static str {
        "shared-step-slice"
    }
    fn cpu_fwd(&self, s: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        by_dtype!(s, step_slice_fwd, &self.shared, self.i)
    }
    fn bwd(&self, token: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        match grad.dtype() {
            candle_core::DType::F32 => step_slice_bwd::<f32>(&self.shared, self.i, grad)?,
            candle_core::DType::F64 => step_slice_bwd::<f64>(&self.shared, self.i, grad)?,
            _ => candle_core::bail!("fused kernels support f32 and f64"),
        }
        Ok(Some(token.zeros_like()?))
    }
}

/// A matrix operand of [`gemm_into`]: its elements, row stride and column stride.
#[derive(Clone, Copy)]
pub struct Mat<'a, T> {
    pub data: &'a [T],
    pub rs: usize,
    pub cs: usize,
}

impl<'a, T> Mat<'a, T> {
    /// A row-major `[rows, cols]` matrix with row stride `rs` (≥ cols).
    pub fn rows(data: &'a [T], rs: usize) -> Self {
        Mat { data, rs, cs: 1 }
    }
    /// The transpose of a row-major matrix with row stride `rs`, read in place (column-major).
    pub fn t(data: &'a [T], rs: usize) -> Self {
        Mat {
            data,
            rs: 1,
            cs: rs,
        }
    }
    fn covers(&self, r: usize, c: usize) -> bool {
        r == 0 || c == 0 || (r - 1) * self.rs + (c - 1) * self.cs < self.data.len()
    }
}

/// `dst = (accumulate ? dst : 0) + lhs · rhs` for `lhs` `[m, k]`, `rhs` `[k, n]` and a row-major `dst` `[m,
/// n]` with row stride `dst_rs`: candle's GEMM (the `gemm` crate, the same micro-kernels and threads) writing
/// into a caller's buffer, so the fused sequence kernels need no tensor per product.
#[allow(clippy::too_many_arguments)]
pub fn gemm_into<T: Real>(
    m: usize,
    n: usize,
    k: usize,
    dst: &mut [T],
    dst_rs: usize,
    accumulate: bool,
    lhs: Mat<T>,
    rhs: Mat<T>,
) {
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        (m - 1) * dst_rs + n <= dst.len() && lhs.covers(m, k) && rhs.covers(k, n),
        "gemm_into: operand out of bounds"
    );
    if k == 0 {
        if !accumulate {
            for r in 0..m {
                dst[r * dst_rs..r * dst_rs + n].fill(T::zero());
            }
        }
        return;
    }
    let threads = candle_core::utils::get_num_threads();
    let par = if threads > 1 && !SERIAL.with(|s| s.get()) {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    // SAFETY: every element read or written lies inside the slices (checked above); `T` is f32 or f64.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            dst_rs as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            T::one(),
            T::one(),
            false,
            false,
            false,
            par,
        )
    }
}

/// A weight `W` `[k, n]` (row-major) and its transpose, for the products of a fused sequence kernel: `x W`
/// and `g Wᵀ` read their right operand in the orientation [`right_col_major`] prefers at that shape.
pub struct Oriented<'a, T> {
    w: &'a [T],
    /// `Wᵀ` `[n, k]`, made on first use.
    wt: std::sync::OnceLock<Vec<T>>,
    /// `W` and `Wᵀ` packed for [`Oriented::mul_into`] / [`Oriented::mul_t_into`], made on first use.
    packed: std::sync::OnceLock<crate::packed_gemm::Packed>,
    packed_t: std::sync::OnceLock<crate::packed_gemm::Packed>,
    k: usize,
    n: usize,
}

/// `x` as f32 when `T` is f32.
fn as_f32<T: 'static>(x: &[T]) -> Option<&[f32]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        // SAFETY: T is f32 (checked above).
        .then(|| unsafe { std::slice::from_raw_parts(x.as_ptr() as *const f32, x.len()) })
}

fn as_f32_mut<T: 'static>(x: &mut [T]) -> Option<&mut [f32]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        // SAFETY: T is f32 (checked above).
        .then(|| unsafe { std::slice::from_raw_parts_mut(x.as_mut_ptr() as *mut f32, x.len()) })
}

/// Set by `set_packed_gemm(false)`: the general GEMM for every product (a benchmark's comparison).
static PACKED_GEMM_OFF: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Use the packed micro-kernel for the recurrences' products where it applies (the default), or the
/// general GEMM everywhere (`cgnmt bench --compare-packed-gemm` alternates the two).
pub fn set_packed_gemm(on: bool) {
    PACKED_GEMM_OFF.store(!on, std::sync::atomic::Ordering::Relaxed);
}

fn packed_gemm_on() -> bool {
    !PACKED_GEMM_OFF.load(std::sync::atomic::Ordering::Relaxed)
}

static TARGET_PADDING_COMPUTED: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Compute only the words' positions of the target side in training (the default: the fused decoder's steps
/// over the sentences with a word there, the readout and output layer over the words' rows), or every padded
/// position too, under the mask (`cgnmt bench --compare-target-padding` alternates the two).
pub fn set_target_padding_skipped(on: bool) {
    TARGET_PADDING_COMPUTED.store(!on, std::sync::atomic::Ordering::Relaxed);
}

pub(crate) fn target_padding_skipped() -> bool {
    !TARGET_PADDING_COMPUTED.load(std::sync::atomic::Ordering::Relaxed)
}

/// Threads for one product: the pool, or the calling thread inside [`serial`].
fn gemm_threads() -> usize {
    if SERIAL.with(|s| s.get()) {
        1
    } else {
        rayon::current_num_threads()
    }
}

impl<'a, T: Real> Oriented<'a, T> {
    pub fn new(w: &'a [T], k: usize, n: usize) -> Self {
        assert_eq!(w.len(), k * n, "oriented weight: shape");
        Oriented {
            w,
            wt: std::sync::OnceLock::new(),
            packed: std::sync::OnceLock::new(),
            packed_t: std::sync::OnceLock::new(),
            k,
            n,
        }
    }

    /// `dst = (accumulate ? dst : 0) + x W` for `x` `[m, k]` (row stride `x.rs`) into a row-major `dst`
    /// `[m, n]` (row stride `dst_rs`): the packed micro-kernel for f32 on AVX2/AVX-512 CPUs (the weight
    /// packed at the first product, see [`crate::packed_gemm`]), the general GEMM otherwise.
    pub fn mul_into(&self, m: usize, dst: &mut [T], dst_rs: usize, accumulate: bool, x: Mat<T>) {
        if !self.packed_mul(false, m, dst, dst_rs, accumulate, &x) {
            gemm_into(m, self.n, self.k, dst, dst_rs, accumulate, x, self.fwd(m));
        }
    }

    /// `dst = (accumulate ? dst : 0) + g Wᵀ` for `g` `[m, n]` into `dst` `[m, k]` (see [`Oriented::mul_into`]).
    pub fn mul_t_into(&self, m: usize, dst: &mut [T], dst_rs: usize, accumulate: bool, g: Mat<T>) {
        if !self.packed_mul(true, m, dst, dst_rs, accumulate, &g) {
            gemm_into(m, self.k, self.n, dst, dst_rs, accumulate, g, self.bwd(m));
        }
    }

    /// The product with `W` (`Wᵀ` when `t`) by the packed micro-kernel, when it applies (f32, a row-major
    /// left operand, a CPU with a packed kernel, not switched off); false when it does not.
    fn packed_mul(
        &self,
        t: bool,
        m: usize,
        dst: &mut [T],
        dst_rs: usize,
        accumulate: bool,
        x: &Mat<T>,
    ) -> bool {
        let (Some(isa), Some(w), Some(xs), Some(d), true) = (
            crate::packed_gemm::Isa::detect(),
            as_f32(self.w),
            as_f32(x.data),
            as_f32_mut(dst),
            x.cs == 1 && packed_gemm_on(),
        ) else {
            return false;
        };
        use crate::packed_gemm::Packed;
        let p = if t {
            self.packed_t
                .get_or_init(|| Packed::new(isa, w, self.n, self.k, 1, self.n))
        } else {
            self.packed
                .get_or_init(|| Packed::new(isa, w, self.k, self.n, self.n, 1))
        };
        p.mul_into(m, xs, x.rs, d, dst_rs, accumulate, gemm_threads());
        true
    }
    fn wt(&self) -> &[T] {
        self.wt.get_or_init(|| transposed(self.w, self.k, self.n))
    }
    /// `W` as the right operand of `x W` for `m` rows.
    pub fn fwd(&self, m: usize) -> Mat<'_, T> {
        if right_col_major(m, self.n) {
            Mat::t(self.wt(), self.k)
        } else {
            Mat::rows(self.w, self.n)
        }
    }
    /// `Wᵀ` as the right operand of `g Wᵀ` for `m` rows.
    pub fn bwd(&self, m: usize) -> Mat<'_, T> {
        if right_col_major(m, self.k) {
            Mat::t(self.w, self.n)
        } else {
            Mat::rows(self.wt(), self.k)
        }
    }
}

/// A CPU tensor's elements as a vector of `T` (contiguous or not).
pub fn to_vec<T: Real>(x: &Tensor) -> Result<Vec<T>> {
    x.flatten_all()?.to_vec1::<T>()
}

/// Elements from which [`zeroed`] and [`tiled`] fill a new buffer on both cores.
const PAR_FILL: usize = 1 << 16;

/// `n` zeros. A zero-filled allocation is one serial `memset` (the allocator reuses freed memory), which for
/// the fused ops' multi-megabyte buffers left the second core idle: large buffers are filled on both.
pub fn zeroed<T: Real>(n: usize) -> Vec<T> {
    use rayon::prelude::*;
    let mut v: Vec<T> = Vec::with_capacity(n);
    let spare = &mut v.spare_capacity_mut()[..n];
    let zero = std::mem::MaybeUninit::new(T::zero());
    if n >= PAR_FILL && !SERIAL.with(|s| s.get()) {
        spare
            .par_chunks_mut(PAR_FILL / 4)
            .for_each(|c| c.fill(zero));
    } else {
        spare.fill(zero);
    }
    // SAFETY: the first n elements were all written above.
    unsafe { v.set_len(n) };
    v
}

/// `rows` copies of `row`, one after the other (e.g. a bias under a GEMM), filled like [`zeroed`].
pub fn tiled<T: Real>(rows: usize, row: &[T]) -> Vec<T> {
    use rayon::prelude::*;
    let (m, n) = (row.len(), rows * row.len());
    let mut v: Vec<T> = Vec::with_capacity(n);
    if m > 0 {
        let fill = |c: &mut [std::mem::MaybeUninit<T>]| {
            for r in c.chunks_mut(m) {
                for (d, x) in r.iter_mut().zip(row) {
                    d.write(*x);
                }
            }
        };
        let spare = &mut v.spare_capacity_mut()[..n];
        if n >= PAR_FILL && !SERIAL.with(|s| s.get()) {
            spare
                .par_chunks_mut(m * (PAR_FILL / 4).div_ceil(m))
                .for_each(fill);
        } else {
            fill(spare);
        }
    }
    // SAFETY: the first n elements were all written above (whole rows of m).
    unsafe { v.set_len(n) };
    v
}

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

/// Run `f(row, …)` over the rows of a step, on the pool when the step is large enough.
pub(crate) fn rows_par<F: Fn(usize) + Sync + Send>(b: usize, elems: usize, f: F) {
    use rayon::prelude::*;
    if elems >= 16 * 1024 && !SERIAL.with(|s| s.get()) {
        (0..b).into_par_iter().for_each(f);
    } else {
        (0..b).for_each(f);
    }
}

/// A raw row view for the parallel row loops below (rows are disjoint, so each is written by one task).
#[derive(Clone, Copy)]
pub(crate) struct RowsMut<T>(*mut T, usize);
unsafe impl<T> Send for RowsMut<T> {}
unsafe impl<T> Sync for RowsMut<T> {}
impl<T> RowsMut<T> {
    pub(crate) fn new(v: &mut [T], width: usize) -> Self {
        RowsMut(v.as_mut_ptr(), width)
    }
    /// Row `i`.
    /// SAFETY: `i` is in bounds and no other task touches row `i` while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn row(&self, i: usize) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(i * self.1), self.1)
    }
    /// Rows `at..at + n`.
    /// SAFETY: they are in bounds and no other task touches them while the slice lives.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn rows(&self, at: usize, n: usize) -> &mut [T] {
        std::slice::from_raw_parts_mut(self.0.add(at * self.1), n * self.1)
    }
}

/// A tensor's storage as a slice (CPU, contiguous), for kernels that read several tensors at once.
pub fn storage_slice<'a, T: WithDType>(
    st: &'a candle_core::Storage,
    l: &Layout,
) -> Result<&'a [T]> {
    match st {
        candle_core::Storage::Cpu(c) => slice::<T>(c, l),
        _ => candle_core::bail!("fused kernel: tensor is not on the CPU"),
    }
}

thread_local! {
    /// Set while a kernel runs one of several concurrent tasks ([`serial`]).
    static SERIAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Run `f` with [`gemm_into`] and the row loops on the calling thread only: for kernels that run
/// independent work (the encoder's two directions) concurrently, one core each, instead of splitting every
/// small product across the cores.
pub fn serial<R>(f: impl FnOnce() -> R) -> R {
    let before = SERIAL.with(|s| s.replace(true));
    let r = f();
    SERIAL.with(|s| s.set(before));
    r
}

/// Column sums of a contiguous `[N, V]` tensor, parallel over blocks of columns (each task reads its
/// columns row after row, contiguously).
pub(crate) fn column_sums(d: &Tensor) -> Result<Tensor> {
    fn run<T: Real>(d: &Tensor) -> Result<Tensor> {
        use rayon::prelude::*;
        let (n, v) = d.dims2()?;
        let (st, l) = d.storage_and_layout();
        let x = match &*st {
            candle_core::Storage::Cpu(c) => slice::<T>(c, l)?,
            _ => candle_core::bail!("column sums: not on the CPU"),
        };
        const COLS: usize = 256;
        let mut out = vec![T::zero(); v];
        out.par_chunks_mut(COLS).enumerate().for_each(|(b, o)| {
            let c0 = b * COLS;
            for r in 0..n {
                let row = &x[r * v + c0..r * v + c0 + o.len()];
                for (a, &y) in o.iter_mut().zip(row) {
                    *a = *a + y;
                }
            }
        });
        Tensor::from_vec(out, v, d.device())
    }
    let d = d.contiguous()?;
    match d.dtype() {
        candle_core::DType::F32 => run::<f32>(&d),
        candle_core::DType::F64 => run::<f64>(&d),
        _ => d.sum(0),
    }
}

/// `lhs rhs` (`[m, k] × [k, n]`) into a new row-major buffer filled on both cores.
pub fn product<T: Real>(m: usize, n: usize, k: usize, lhs: Mat<T>, rhs: Mat<T>) -> Vec<T> {
    let mut d = zeroed::<T>(m * n);
    gemm_into(m, n, k, &mut d, n, false, lhs, rhs);
    d
}

/// The gradients of `x W` (`x` `[N, K]`, `W` `[K, M]`) for the output gradient `g` `[N, M]`: `∂x = g Wᵀ`,
/// `∂W = xᵀ g`, each a GEMM into a buffer filled on both cores (candle's matmul zero-fills on one).
pub(crate) fn product_grads(x: &Tensor, w: &Tensor, g: &Tensor) -> Result<(Tensor, Tensor)> {
    fn run<T: Real>(x: &Tensor, w: &Tensor, g: &Tensor) -> Result<(Tensor, Tensor)> {
        let ((n, k), (k2, m), (n2, m2)) = (x.dims2()?, w.dims2()?, g.dims2()?);
        if k != k2 || n != n2 || m != m2 {
            candle_core::bail!("product gradients: [{n}, {k}] x [{k2}, {m}] against [{n2}, {m2}]");
        }
        let (x, w, g) = (x.contiguous()?, w.contiguous()?, g.contiguous()?);
        let ((xs, xl), (ws, wl), (gs, gl)) = (
            x.storage_and_layout(),
            w.storage_and_layout(),
            g.storage_and_layout(),
        );
        let (xd, wd, gd) = (
            storage_slice::<T>(&xs, xl)?,
            storage_slice::<T>(&ws, wl)?,
            storage_slice::<T>(&gs, gl)?,
        );
        let (dx, dw) = product_grads_slices(n, k, m, xd, wd, gd);
        Ok((
            Tensor::from_vec(dx, (n, k), x.device())?,
            Tensor::from_vec(dw, (k, m), x.device())?,
        ))
    }
    match x.dtype() {
        candle_core::DType::F32 => run::<f32>(x, w, g),
        candle_core::DType::F64 => run::<f64>(x, w, g),
        _ => Ok((g.matmul(&w.t()?)?, x.t()?.matmul(g)?)),
    }
}

/// [`product_grads`] on row-major slices: `x` `[N, K]`, `W` `[K, M]`, `g` `[N, M]` give `(∂x, ∂W)`.
pub(crate) fn product_grads_slices<T: Real>(
    n: usize,
    k: usize,
    m: usize,
    x: &[T],
    w: &[T],
    g: &[T],
) -> (Vec<T>, Vec<T>) {
    (
        product(n, k, m, Mat::rows(g, m), Mat::t(w, m)),
        product(k, m, n, Mat::t(x, k), Mat::rows(g, m)),
    )
}

/// `x W + b` (`x` `[N, K]`, `W` `[K, M]`, `b` `[M]`): with fused kernels on the CPU one graph node whose
/// forward pass runs the GEMM over the broadcast bias and whose backward pass forms `∂b` as parallel column
/// sums (composed, `broadcast_add` adds a node whose backward pass sums the rows on one thread).
pub fn linear(k: Kernels, x: &Tensor, w: &Tensor, b: &Tensor) -> Result<Tensor> {
    if !k.fused_on(x.device())
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
    if !k.fused_on(x.device())
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
struct Linear(Option<Rows>, Option<RecWeight>);

/// `w` as this thread's pass prepared it, if it did.
fn prepared(w: &Tensor) -> Option<RecWeight> {
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
            let out = p.mul_new(n, xf, k, crate::packed_gemm::Start::Row(bf), gemm_threads());
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
        crate::profile::timed("linear forward", || {
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
        crate::profile::timed("linear backward", || {
            linear_grads(x, w, b, &grad.contiguous()?)
        })
    }
}

/// Rows `ids` (`[N]`, u32) of an embedding table `[V, E]`: `[N, E]`. With fused kernels on the CPU one graph
/// node whose backward pass scatters the rows' gradients into one `[V, E]` buffer and hands it over (see
/// [`hand_over`]); composed, candle's `index_select` adds into a zero-filled table twice per pass.
pub fn embedding(k: Kernels, table: &Tensor, ids: &Tensor) -> Result<Tensor> {
    if !k.fused_on(table.device())
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
            *a = *a + *x;
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
