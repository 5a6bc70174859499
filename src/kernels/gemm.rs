//! Matrix products into caller buffers: [`Mat`] operands, [`gemm_into`], a weight in the orientation its
//! products read ([`Oriented`], with the packed micro-kernel of `packed_gemm` where it pays), products and
//! their gradients, column sums, and the cache-blocked [`transpose`].

use super::*;

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
        ::gemm::Parallelism::Rayon(threads)
    } else {
        ::gemm::Parallelism::None
    };
    // SAFETY: every element read or written lies inside the slices (checked above); `T` is f32 or f64.
    unsafe {
        ::gemm::gemm(
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
    packed: std::sync::OnceLock<crate::kernels::packed_gemm::Packed>,
    packed_t: std::sync::OnceLock<crate::kernels::packed_gemm::Packed>,
    k: usize,
    n: usize,
}

/// `x` as f32 when `T` is f32.
pub(super) fn as_f32<T: 'static>(x: &[T]) -> Option<&[f32]> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>())
        // SAFETY: T is f32 (checked above).
        .then(|| unsafe { std::slice::from_raw_parts(x.as_ptr() as *const f32, x.len()) })
}

pub(super) fn as_f32_mut<T: 'static>(x: &mut [T]) -> Option<&mut [f32]> {
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

pub(super) fn packed_gemm_on() -> bool {
    !PACKED_GEMM_OFF.load(std::sync::atomic::Ordering::Relaxed)
}

/// Threads for one product: the pool, or the calling thread inside [`serial`].
pub(super) fn gemm_threads() -> usize {
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
    /// packed at the first product, see [`crate::kernels::packed_gemm`]), the general GEMM otherwise.
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
            crate::kernels::packed_gemm::Isa::detect(),
            as_f32(self.w),
            as_f32(x.data),
            as_f32_mut(dst),
            x.cs == 1 && packed_gemm_on(),
        ) else {
            return false;
        };
        use crate::kernels::packed_gemm::Packed;
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
                    *a += y;
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
