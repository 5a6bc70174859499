//! Int8 products for decoding (opt-in, approximate: `translate --int8`). A weight `B` `[k, n]` is quantised
//! once, per column, to 8-bit integers (`B ≈ q_B · s_j`, |q_B| ≤ 127); each product's left operand is
//! quantised per row to 7 bits (`a ≈ q_a · s_r`, |q_a| ≤ 63) and stored offset by 64 as unsigned bytes, so
//! that AVX2's `vpmaddubsw` (unsigned × signed byte pairs summed into 16 bits) cannot saturate
//! (2 · 127 · 127 < 2¹⁵). The integer sums are exact; the offset is taken out with the columns' sums of
//! `q_B`, and `s_r · s_j` scales the result back. Every row is quantised and summed on its own, so a row's
//! result does not depend on the other rows of the product (the word table's rows equal the steps'
//! products, as in f32).
//!
//! Two micro-kernels sum the same integers over the same layout, so their results are equal bit for bit:
//! - AVX2 ([`Kernel::Avx2`]): `vpmaddubsw` + `vpmaddwd` + `vpaddd`, 4 rows × 16 columns per call. On a
//!   2-core Zen 3 its inner loop does about 1.5× the multiply-adds per cycle of f32 FMA.
//! - AVX-512 VNNI ([`Kernel::Vnni`], chosen where the CPU has it): one `vpdpbusd` sums four byte products
//!   into each of sixteen 32-bit lanes, 6 rows × 64 columns (four panels) per call.

use crate::kernels::gemm_common::SendPtr;
use rayon::prelude::*;

/// Columns per panel (two 256-bit registers of eight 32-bit sums).
const NR: usize = 16;
/// Rows of the left operand per micro-kernel call (8 accumulators, the panel's two registers, the
/// broadcast operand and the constants fit AVX2's 16 registers).
const MR: usize = 4;
/// Bound of the left operand's quantised values (7 bits), and the offset that makes them unsigned.
const A_MAX: f32 = 63.0;
const A_OFFSET: i32 = 64;

/// Whether this CPU has the instructions the int8 product needs (AVX2).
pub fn available() -> bool {
    crate::kernels::has_avx2_fma()
}

/// The int8 micro-kernel's instruction set (both give the same results, bit for bit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// `vpmaddubsw` + `vpmaddwd` + `vpaddd` on 256-bit registers: [`MR`] rows × one panel per call.
    Avx2,
    /// `vpdpbusd` on 512-bit registers: [`VNNI_MR`] rows × [`VNNI_PANELS`] panels per call.
    Vnni,
}

/// Rows per VNNI micro-kernel call (24 accumulators, four panel registers and the broadcast operand fit
/// AVX-512's 32 registers).
const VNNI_MR: usize = 6;
/// Panels (of [`NR`] columns) per VNNI micro-kernel call.
const VNNI_PANELS: usize = 4;

impl Kernel {
    /// The fastest kernel this CPU runs (`None`: no AVX2, no int8 products).
    pub fn detect() -> Option<Kernel> {
        [Kernel::Vnni, Kernel::Avx2]
            .into_iter()
            .find(|k| k.runs_here())
    }

    /// Whether this CPU runs `self`.
    pub fn runs_here(self) -> bool {
        match self {
            Kernel::Avx2 => available(),
            Kernel::Vnni => available() && crate::kernels::has_avx512_vnni(),
        }
    }

    /// Rows and panels of one micro-kernel call.
    fn tile(self) -> (usize, usize) {
        match self {
            Kernel::Avx2 => (MR, 1),
            Kernel::Vnni => (VNNI_MR, VNNI_PANELS),
        }
    }
}

/// A weight `B` `[k, n]` quantised per column and laid out in panels of [`NR`] columns: panel `p` holds, for
/// each group of four rows `4q..4q + 4` (zero past `k`), the 16 columns' four bytes one after the other.
pub struct QPacked {
    data: Vec<i8>,
    /// Per column (zero past `n` to the panels' width): `s_j`.
    scale: Vec<f32>,
    /// Per column: `64 · Σ_i q_B[i, j]`, what the offset of the left operand adds to a column's sums.
    offset: Vec<i32>,
    k: usize,
    n: usize,
    /// Row groups of four (`k` rounded up to a multiple of four, over four).
    kq: usize,
    /// The micro-kernel its products run.
    kernel: Kernel,
}

impl QPacked {
    /// Quantise `B` `[k, n]` whose element `(i, j)` is `b[i·rs + j·cs]` (as [`crate::kernels::packed_gemm::Packed::new`]),
    /// its products to run `kernel`.
    pub fn new(kernel: Kernel, b: &[f32], k: usize, n: usize, rs: usize, cs: usize) -> QPacked {
        assert!(
            kernel.runs_here(),
            "int8 GEMM: {kernel:?} does not run on this CPU"
        );
        assert!(
            k == 0 || n == 0 || (k - 1) * rs + (n - 1) * cs < b.len(),
            "int8 GEMM: operand out of bounds"
        );
        let panels = n.div_ceil(NR);
        let kq = k.div_ceil(4);
        let mut scale = vec![0f32; panels * NR];
        let mut offset = vec![0i32; panels * NR];
        let mut data = vec![0i8; panels * kq * 4 * NR];
        data.par_chunks_mut((kq * 4 * NR).max(1))
            .zip(scale.par_chunks_mut(NR).zip(offset.par_chunks_mut(NR)))
            .enumerate()
            .for_each(|(p, (panel, (sc, off)))| {
                for jj in 0..NR.min(n.saturating_sub(p * NR)) {
                    let j = p * NR + jj;
                    let col = |i: usize| b[i * rs + j * cs];
                    let max = (0..k).map(|i| col(i).abs()).fold(0f32, f32::max);
                    let s = if max > 0.0 && max.is_finite() {
                        max / 127.0
                    } else {
                        1.0
                    };
                    let inv = 1.0 / s;
                    let mut sum = 0i32;
                    for i in 0..k {
                        let q = (col(i) * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
                        panel[(i / 4) * 4 * NR + jj * 4 + i % 4] = q;
                        sum += q as i32;
                    }
                    sc[jj] = s;
                    off[jj] = A_OFFSET * sum;
                }
            });
        QPacked {
            data,
            scale,
            offset,
            k,
            n,
            kq,
            kernel,
        }
    }

    /// `[k, n]`.
    pub fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    /// `dst = start + a · B` (approximately: see the module) for a row-major `a` `[m, k]` (row stride `lda`)
    /// into `dst` (row stride `ldc`), panels split between up to `threads` threads.
    /// SAFETY: `dst` points at m rows of at least n writable elements at stride ldc (`Start::Dst`:
    /// initialised); `a` holds the m rows of k elements at stride lda.
    #[allow(clippy::too_many_arguments)]
    pub(crate) unsafe fn run(
        &self,
        m: usize,
        a: &[f32],
        lda: usize,
        dst: *mut f32,
        ldc: usize,
        start: crate::kernels::gemm_common::Start,
        threads: usize,
    ) {
        use crate::kernels::gemm_common::Start;
        let (k, n, kernel) = (self.k, self.n, self.kernel);
        if let Start::Row(bias) = start {
            assert!(bias.len() >= n, "int8 GEMM: bias shorter than the columns");
        }
        if m == 0 || n == 0 {
            return;
        }
        assert!(
            (m - 1) * lda + k <= a.len(),
            "int8 GEMM: operand out of bounds"
        );
        let (qa, sa) = quantize_rows(m, a, lda, k, self.kq * 4);
        let (mr, group) = kernel.tile();
        let panel_len = self.kq * 4 * NR;
        // Tasks split the column groups (`group` panels each) between them.
        let groups = n.div_ceil(NR * group);
        let threads = threads.clamp(1, groups);
        let per = groups.div_ceil(threads);
        let out = SendPtr(dst);
        let run = |t: usize| {
            for g in (t * per)..((t + 1) * per).min(groups) {
                let p = g * group;
                let cols = (NR * group).min(n - p * NR);
                let mut r0 = 0;
                while r0 < m {
                    let rows = mr.min(m - r0);
                    let c = out.get().add(r0 * ldc + p * NR);
                    let add = match start {
                        Start::Dst => (c.cast_const(), ldc),
                        Start::Zero => (std::ptr::null(), 0),
                        Start::Row(b) => (b.as_ptr().add(p * NR), 0),
                    };
                    let tile = Tile {
                        kq: self.kq,
                        a: qa.as_ptr().add(r0 * self.kq * 4),
                        lda: self.kq * 4,
                        row_scale: sa.as_ptr().add(r0),
                        panel: self.data.as_ptr().add(p * panel_len),
                        panel_len,
                        col_scale: self.scale.as_ptr().add(p * NR),
                        col_offset: self.offset.as_ptr().add(p * NR),
                        c,
                        ldc,
                        cols,
                        add,
                    };
                    // SAFETY: the tile's rows and columns lie inside `qa`, the panels and `dst`; this task
                    // alone writes columns p·NR.. of these rows; the kernel runs on this CPU (checked by new).
                    match kernel {
                        Kernel::Avx2 => match rows {
                            4 => tile_avx2::<4>(&tile),
                            3 => tile_avx2::<3>(&tile),
                            2 => tile_avx2::<2>(&tile),
                            _ => tile_avx2::<1>(&tile),
                        },
                        Kernel::Vnni => match rows {
                            6 => tile_vnni::<6>(&tile),
                            5 => tile_vnni::<5>(&tile),
                            4 => tile_vnni::<4>(&tile),
                            3 => tile_vnni::<3>(&tile),
                            2 => tile_vnni::<2>(&tile),
                            _ => tile_vnni::<1>(&tile),
                        },
                    }
                    r0 += rows;
                }
            }
        };
        if threads == 1 {
            run(0);
        } else {
            (0..threads).into_par_iter().for_each(run);
        }
    }
}

/// The rows of `a` `[m, k]` (stride `lda`) quantised to 7 bits per row and offset to unsigned bytes, each row
/// padded with the offset (a zero) to `kp` bytes; and each row's scale.
fn quantize_rows(m: usize, a: &[f32], lda: usize, k: usize, kp: usize) -> (Vec<u8>, Vec<f32>) {
    let mut q = vec![A_OFFSET as u8; m * kp];
    let mut s = vec![0f32; m];
    let one = |(r, (qr, sr)): (usize, (&mut [u8], &mut f32))| {
        let row = &a[r * lda..r * lda + k];
        // SAFETY: AVX2 is present (checked when the weight was quantised).
        *sr = unsafe { quantize_row(row, &mut qr[..k]) };
    };
    if m * k >= 1 << 16 {
        q.par_chunks_mut(kp)
            .zip(s.par_iter_mut())
            .enumerate()
            .for_each(one);
    } else {
        q.chunks_mut(kp).zip(s.iter_mut()).enumerate().for_each(one);
    }
    (q, s)
}

/// One row quantised into `q` (same length); returns its scale.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quantize_row(row: &[f32], q: &mut [u8]) -> f32 {
    use std::arch::x86_64::*;
    let k = row.len();
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    let mut mx = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= k {
        mx = _mm256_max_ps(
            mx,
            _mm256_and_ps(abs_mask, _mm256_loadu_ps(row.as_ptr().add(i))),
        );
        i += 8;
    }
    let mut lanes = [0f32; 8];
    _mm256_storeu_ps(lanes.as_mut_ptr(), mx);
    let mut max = lanes.iter().copied().fold(0f32, f32::max);
    for &x in &row[i..] {
        max = max.max(x.abs());
    }
    let s = if max > 0.0 && max.is_finite() {
        max / A_MAX
    } else {
        1.0
    };
    let inv = 1.0 / s;
    let vinv = _mm256_set1_ps(inv);
    let (lo, hi) = (_mm256_set1_ps(-A_MAX), _mm256_set1_ps(A_MAX));
    let off = _mm256_set1_epi32(A_OFFSET);
    let mut i = 0;
    while i + 8 <= k {
        let x = _mm256_mul_ps(_mm256_loadu_ps(row.as_ptr().add(i)), vinv);
        // Round to nearest (ties to even, the MXCSR default), clamp, offset.
        let x = _mm256_min_ps(_mm256_max_ps(x, lo), hi);
        let v = _mm256_add_epi32(_mm256_cvtps_epi32(x), off);
        // 1..127 into bytes: each 128-bit lane's four values land in its low four bytes.
        let v = _mm256_packus_epi16(_mm256_packs_epi32(v, v), _mm256_setzero_si256());
        let dst = q.as_mut_ptr().add(i);
        (dst as *mut i32).write_unaligned(_mm256_cvtsi256_si32(v));
        (dst.add(4) as *mut i32).write_unaligned(_mm256_extract_epi32::<4>(v));
        i += 8;
    }
    for (d, &x) in q[i..].iter_mut().zip(&row[i..]) {
        *d = ((x * inv).round_ties_even().clamp(-A_MAX, A_MAX) as i32 + A_OFFSET) as u8;
    }
    s
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn quantize_row(_row: &[f32], _q: &mut [u8]) -> f32 {
    unreachable!("int8 GEMM: no kernel for this architecture")
}

/// One micro-kernel call's operands: `rows × cols` results (rows and the panels that `cols` spans as
/// [`Kernel::tile`] says).
struct Tile {
    kq: usize,
    a: *const u8,
    lda: usize,
    row_scale: *const f32,
    /// The first panel; the next ones follow at `panel_len` bytes.
    panel: *const i8,
    panel_len: usize,
    col_scale: *const f32,
    col_offset: *const i32,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    /// What the results are added to (null: nothing), and its row stride.
    add: (*const f32, usize),
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn tile_avx2<const R: usize>(t: &Tile) {
    use std::arch::x86_64::*;
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_si256(); 2]; R];
    for q in 0..t.kq {
        let b0 = _mm256_loadu_si256(t.panel.add(q * 64) as *const __m256i);
        let b1 = _mm256_loadu_si256(t.panel.add(q * 64 + 32) as *const __m256i);
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let x = _mm256_set1_epi32((t.a.add(r * t.lda + q * 4) as *const i32).read_unaligned());
            let p0 = _mm256_madd_epi16(_mm256_maddubs_epi16(x, b0), ones);
            let p1 = _mm256_madd_epi16(_mm256_maddubs_epi16(x, b1), ones);
            acc_r[0] = _mm256_add_epi32(acc_r[0], p0);
            acc_r[1] = _mm256_add_epi32(acc_r[1], p1);
        }
    }
    let s0 = _mm256_loadu_ps(t.col_scale);
    let s1 = _mm256_loadu_ps(t.col_scale.add(8));
    let o0 = _mm256_loadu_si256(t.col_offset as *const __m256i);
    let o1 = _mm256_loadu_si256(t.col_offset.add(8) as *const __m256i);
    for (r, acc_r) in acc.iter().enumerate() {
        let sr = _mm256_set1_ps(*t.row_scale.add(r));
        let mut v0 = _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_sub_epi32(acc_r[0], o0)),
            _mm256_mul_ps(s0, sr),
        );
        let mut v1 = _mm256_mul_ps(
            _mm256_cvtepi32_ps(_mm256_sub_epi32(acc_r[1], o1)),
            _mm256_mul_ps(s1, sr),
        );
        let cr = t.c.add(r * t.ldc);
        let ar = if t.add.0.is_null() {
            t.add.0
        } else {
            t.add.0.add(r * t.add.1)
        };
        if t.cols == NR {
            if !ar.is_null() {
                v0 = _mm256_add_ps(v0, _mm256_loadu_ps(ar));
                v1 = _mm256_add_ps(v1, _mm256_loadu_ps(ar.add(8)));
            }
            _mm256_storeu_ps(cr, v0);
            _mm256_storeu_ps(cr.add(8), v1);
        } else {
            let mut tmp = [0f32; NR];
            _mm256_storeu_ps(tmp.as_mut_ptr(), v0);
            _mm256_storeu_ps(tmp.as_mut_ptr().add(8), v1);
            for (j, &v) in tmp.iter().enumerate().take(t.cols) {
                *cr.add(j) = if ar.is_null() { v } else { v + *ar.add(j) };
            }
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn tile_avx2<const R: usize>(_t: &Tile) {
    unreachable!("int8 GEMM: no kernel for this architecture")
}

/// The VNNI micro-kernel: `R` rows × up to four panels. Each panel's four-row group is one 512-bit register
/// (16 columns × 4 bytes), so `vpdpbusd` adds to each column's 32-bit sum the products of the row's four
/// bytes with the column's four; the sums, and the scaling after, are those of [`tile_avx2`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vnni")]
unsafe fn tile_vnni<const R: usize>(t: &Tile) {
    use std::arch::x86_64::*;
    const V: usize = VNNI_PANELS;
    let nv = t.cols.div_ceil(NR);
    let mut acc = [[_mm512_setzero_si512(); V]; R];
    if nv == V {
        for q in 0..t.kq {
            let mut b = [_mm512_setzero_si512(); V];
            for (v, bv) in b.iter_mut().enumerate() {
                *bv = _mm512_loadu_si512(t.panel.add(v * t.panel_len + q * 64) as *const _);
            }
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let x =
                    _mm512_set1_epi32((t.a.add(r * t.lda + q * 4) as *const i32).read_unaligned());
                for v in 0..V {
                    acc_r[v] = _mm512_dpbusd_epi32(acc_r[v], x, b[v]);
                }
            }
        }
    } else {
        // The last column group: fewer panels.
        for q in 0..t.kq {
            for (r, acc_r) in acc.iter_mut().enumerate() {
                let x =
                    _mm512_set1_epi32((t.a.add(r * t.lda + q * 4) as *const i32).read_unaligned());
                for (v, acc_rv) in acc_r.iter_mut().enumerate().take(nv) {
                    let b = _mm512_loadu_si512(t.panel.add(v * t.panel_len + q * 64) as *const _);
                    *acc_rv = _mm512_dpbusd_epi32(*acc_rv, x, b);
                }
            }
        }
    }
    for v in 0..nv {
        let s = _mm512_loadu_ps(t.col_scale.add(v * NR));
        let o = _mm512_loadu_si512(t.col_offset.add(v * NR) as *const _);
        let cols = NR.min(t.cols - v * NR);
        // Columns past `cols` are neither read nor written.
        let mask: __mmask16 = if cols == NR { !0 } else { (1u16 << cols) - 1 };
        for (r, acc_r) in acc.iter().enumerate() {
            let sr = _mm512_set1_ps(*t.row_scale.add(r));
            let mut y = _mm512_mul_ps(
                _mm512_cvtepi32_ps(_mm512_sub_epi32(acc_r[v], o)),
                _mm512_mul_ps(s, sr),
            );
            if !t.add.0.is_null() {
                let ar = t.add.0.add(r * t.add.1 + v * NR);
                y = _mm512_add_ps(y, _mm512_maskz_loadu_ps(mask, ar));
            }
            _mm512_mask_storeu_ps(t.c.add(r * t.ldc + v * NR), mask, y);
        }
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn tile_vnni<const R: usize>(_t: &Tile) {
    unreachable!("int8 GEMM: no kernel for this architecture")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::gemm_common::Start;
    use rand::{rngs::StdRng, Rng, SeedableRng};

    /// `start + a · B` into a new `[m, ldc]` buffer that starts as `fill`.
    #[allow(clippy::too_many_arguments)]
    fn product(
        q: &QPacked,
        m: usize,
        a: &[f32],
        lda: usize,
        fill: &[f32],
        ldc: usize,
        start: Start,
        threads: usize,
    ) -> Vec<f32> {
        let mut dst = fill.to_vec();
        // SAFETY: `dst` holds m rows of ldc ≥ n elements, initialised; `a` holds m rows of k at stride lda.
        unsafe { q.run(m, a, lda, dst.as_mut_ptr(), ldc, start, threads) };
        dst
    }

    /// The VNNI kernel (four panels, six rows per call, masked edges) gives the AVX2 kernel's results bit for
    /// bit, for every start, ragged row and column counts, and 1 and 2 threads; columns past `n` untouched.
    /// (Depth 0 never reaches these kernels: [`crate::kernels::packed_gemm::Packed`] fills the output itself.)
    #[test]
    fn vnni_equals_avx2_bit_for_bit() {
        if !Kernel::Vnni.runs_here() {
            eprintln!("no AVX-512 VNNI on this CPU: the VNNI kernel is never used here");
            return;
        }
        assert_eq!(Kernel::detect(), Some(Kernel::Vnni));
        let mut rng = StdRng::seed_from_u64(7);
        let mut rand =
            |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect() };
        let mut nonzero = 0usize;
        for &(m, k, n) in &[
            (1, 1, 1),
            (6, 5, 15),
            (7, 9, 16),
            (12, 64, 17),
            (13, 257, 63),
            (5, 100, 64),
            (11, 33, 65),
            (20, 512, 200),
        ] {
            let b = rand(k * n);
            let (qx, qy) = (
                QPacked::new(Kernel::Avx2, &b, k, n, n, 1),
                QPacked::new(Kernel::Vnni, &b, k, n, n, 1),
            );
            let (lda, ldc) = (k + 2, n + 3);
            let a = rand(m * lda);
            let fill = rand(m * ldc);
            let bias = rand(n);
            for start in [Start::Zero, Start::Dst, Start::Row(&bias)] {
                for threads in [1, 2] {
                    let x = product(&qx, m, &a, lda, &fill, ldc, start, threads);
                    let y = product(&qy, m, &a, lda, &fill, ldc, start, threads);
                    for r in 0..m {
                        for j in 0..ldc {
                            let (x, y, f) = (x[r * ldc + j], y[r * ldc + j], fill[r * ldc + j]);
                            assert_eq!(
                                x.to_bits(),
                                y.to_bits(),
                                "m {m} k {k} n {n} {start:?} threads {threads}: ({r}, {j}) {x} against {y}"
                            );
                            if j >= n {
                                assert_eq!(y, f, "({r}, {j}) past the columns written");
                            } else if y != f {
                                nonzero += 1;
                            }
                        }
                    }
                }
            }
        }
        // The products were really formed (not left as the fill).
        assert!(nonzero > 10_000, "{nonzero} elements written");
    }
}
