//! The CPU underneath the fused kernels: feature probes (AVX2/FMA, AVX-512, VNNI), the element types
//! ([`Real`]: f32, and f64 for the gradient checks) with branch-free `exp`/`tanh`/`σ` that vectorise, the
//! dtype and SIMD dispatch macros, slices of candle's storage, vectorisable reductions, buffer fills, and
//! row parallelism (with the thread-local serial switch).

use super::*;

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
/// int8 products of decoding use when present ([`crate::kernels::quantized_gemm`]).
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
            acc[l] += x[l] * y[l];
        }
    }
    let mut s = acc.iter().fold(T::zero(), |s, &x| s + x);
    for (x, y) in ra.iter().zip(rb) {
        s += *x * *y;
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
            acc[l] += (x[l] - m).exp_v();
        }
    }
    let mut s = acc.iter().fold(T::zero(), |s, &x| s + x);
    for &x in r {
        s += (x - m).exp_v();
    }
    s
}

/// A CPU tensor's elements as a vector of `T` (contiguous or not).
pub fn to_vec<T: Real>(x: &Tensor) -> Result<Vec<T>> {
    x.flatten_all()?.to_vec1::<T>()
}

/// Elements from which [`zeroed`] and [`tiled`] fill a new buffer on both cores.
pub(super) const PAR_FILL: usize = 1 << 16;

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
    pub(super) static SERIAL: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
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

/// Size the process's thread pool for `train.threads` (0: keep the default, the physical cores). It takes
/// effect only before the first parallel work of the process, so commands call it first.
pub fn set_threads(n: usize) {
    if n > 0 {
        std::env::set_var("RAYON_NUM_THREADS", n.to_string());
    }
}
