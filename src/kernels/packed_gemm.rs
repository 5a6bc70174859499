//! Products with few rows against a weight packed once: the recurrences' per-step products `x W` and
//! `g Wᵀ` (`M` = the batch, 64–80 rows) run with the same weight at every time step of a pass, so the weight
//! is laid out once in panels of `NR` columns ([`Packed`]) and every step's product streams through them
//! with a register-blocked micro-kernel (`6 × 32` with AVX-512, `6 × 16` with AVX2+FMA). A general GEMM
//! packs its operand again at every call; at these shapes that repacking costs as much as a fifth of the
//! product. f32 only, chosen at run time ([`Isa::detect`]); other types and CPUs keep the general GEMM.

use crate::kernels::gemm_common::{SendPtr, Start};
use rayon::prelude::*;

/// Rows of the left operand per micro-kernel call.
const MR: usize = 6;
/// Depth of one pass over a panel (a `KC × NR` block of the panel stays in L1 across the row blocks).
const KC: usize = 256;

/// The micro-kernel's instruction set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// 32-column panels, two 512-bit registers per row.
    Avx512,
    /// 16-column panels, two 256-bit registers per row.
    Avx2,
}

impl Isa {
    /// The best instruction set this CPU has (`None`: no packed kernel, use the general GEMM).
    pub fn detect() -> Option<Isa> {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::kernels::gemm_has_avx512() {
                return Some(Isa::Avx512);
            }
            if crate::kernels::has_avx2_fma() {
                return Some(Isa::Avx2);
            }
        }
        None
    }

    /// Whether this CPU can run `self`.
    pub fn available(self) -> bool {
        match self {
            Isa::Avx512 => crate::kernels::gemm_has_avx512(),
            Isa::Avx2 => crate::kernels::has_avx2_fma(),
        }
    }

    /// Panel width.
    pub fn nr(self) -> usize {
        match self {
            Isa::Avx512 => 64,
            Isa::Avx2 => 16,
        }
    }
}

/// A right operand `B` `[k, n]` in panels of `nr` columns: panel `p` holds columns `p·nr .. p·nr + nr`
/// (zero past `n`) of rows `0..k`, row after row.
pub struct Packed {
    data: Vec<f32>,
    k: usize,
    n: usize,
    isa: Isa,
    /// The weight quantised to 8 bits instead (`data` empty): products run in integers
    /// ([`crate::kernels::quantized_gemm`]).
    int8: Option<crate::kernels::quantized_gemm::QPacked>,
}

impl Packed {
    /// Pack `B` `[k, n]` whose element `(i, j)` is `b[i·rs + j·cs]` (`rs = n, cs = 1`: a row-major matrix;
    /// `rs = 1, cs = k`: the transpose of a row-major `[n, k]` matrix).
    pub fn new(isa: Isa, b: &[f32], k: usize, n: usize, rs: usize, cs: usize) -> Packed {
        assert!(
            isa.available(),
            "packed GEMM: {isa:?} is not available on this CPU"
        );
        assert!(
            k == 0 || n == 0 || (k - 1) * rs + (n - 1) * cs < b.len(),
            "packed GEMM: operand out of bounds"
        );
        let nr = isa.nr();
        let panels = n.div_ceil(nr);
        let mut data = crate::kernels::zeroed::<f32>(panels * k * nr);
        if k > 0 {
            data.par_chunks_mut(k * nr)
                .enumerate()
                .for_each(|(p, panel)| {
                    let j0 = p * nr;
                    let cols = nr.min(n - j0);
                    if cs == 1 {
                        for i in 0..k {
                            panel[i * nr..i * nr + cols]
                                .copy_from_slice(&b[i * rs + j0..i * rs + j0 + cols]);
                        }
                    } else {
                        // Read along the source's rows (contiguous when `rs` = 1).
                        for jj in 0..cols {
                            for i in 0..k {
                                panel[i * nr + jj] = b[i * rs + (j0 + jj) * cs];
                            }
                        }
                    }
                });
        }
        Packed {
            data,
            k,
            n,
            isa,
            int8: None,
        }
    }

    /// `B` (laid out as for [`Packed::new`]) quantised to 8 bits per column: its products are approximate and
    /// run in integers ([`crate::kernels::quantized_gemm`]), by the fastest int8 kernel this CPU has. `None` without AVX2.
    pub fn new_int8(b: &[f32], k: usize, n: usize, rs: usize, cs: usize) -> Option<Packed> {
        Packed::new_int8_with(
            crate::kernels::quantized_gemm::Kernel::detect()?,
            b,
            k,
            n,
            rs,
            cs,
        )
    }

    /// [`Packed::new_int8`] with the given int8 kernel (`None` where this CPU cannot run it); every kernel gives
    /// the same results.
    pub fn new_int8_with(
        kernel: crate::kernels::quantized_gemm::Kernel,
        b: &[f32],
        k: usize,
        n: usize,
        rs: usize,
        cs: usize,
    ) -> Option<Packed> {
        if !kernel.runs_here() {
            return None;
        }
        Some(Packed {
            data: Vec::new(),
            k,
            n,
            isa: Isa::Avx2,
            int8: Some(crate::kernels::quantized_gemm::QPacked::new(
                kernel, b, k, n, rs, cs,
            )),
        })
    }

    /// Whether the products are int8 ([`Packed::new_int8`]).
    pub fn is_int8(&self) -> bool {
        self.int8.is_some()
    }

    /// `[k, n]`.
    pub fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    /// `dst = (accumulate ? dst : 0) + a · B` for a row-major `a` `[m, k]` (row stride `lda`) and a row-major
    /// `dst` `[m, n]` (row stride `ldc`), on up to `threads` threads (panels split between them).
    #[allow(clippy::too_many_arguments)]
    pub fn mul_into(
        &self,
        m: usize,
        a: &[f32],
        lda: usize,
        dst: &mut [f32],
        ldc: usize,
        accumulate: bool,
        threads: usize,
    ) {
        let start = if accumulate { Start::Dst } else { Start::Zero };
        self.mul_from(m, a, lda, dst, ldc, start, threads);
    }

    /// `dst = start + a · B` (see [`Start`]; [`Packed::mul_into`] otherwise).
    #[allow(clippy::too_many_arguments)]
    pub fn mul_from(
        &self,
        m: usize,
        a: &[f32],
        lda: usize,
        dst: &mut [f32],
        ldc: usize,
        start: Start,
        threads: usize,
    ) {
        if m == 0 || self.n == 0 {
            return;
        }
        assert!(
            (m - 1) * ldc + self.n <= dst.len(),
            "packed GEMM: operand out of bounds"
        );
        // SAFETY: `dst` holds the m rows of n elements at stride ldc (checked above).
        unsafe { self.run(m, a, lda, dst.as_mut_ptr(), ldc, start, threads) }
    }

    /// `start + a · B` `[m, n]` (row-major) in a new buffer, which it writes once (no zero fill first);
    /// `start` is [`Start::Zero`] or [`Start::Row`].
    pub fn mul_new(
        &self,
        m: usize,
        a: &[f32],
        lda: usize,
        start: Start,
        threads: usize,
    ) -> Vec<f32> {
        assert!(
            !matches!(start, Start::Dst),
            "packed GEMM: a new buffer has nothing to accumulate into"
        );
        let len = m * self.n;
        let mut out: Vec<f32> = Vec::with_capacity(len);
        if len > 0 {
            // SAFETY: `out` has room for the m rows of n elements (stride n), and `run` writes every one of
            // them before any is read (with `Zero` or `Row`, the first depth block stores without loading).
            unsafe {
                self.run(m, a, lda, out.as_mut_ptr(), self.n, start, threads);
                out.set_len(len);
            }
        }
        out
    }

    /// `dst = start + a · B` through a raw `dst` (every element of its m rows written).
    /// SAFETY: `dst` points at m rows of at least n writable elements at stride ldc (`Start::Dst`: initialised).
    #[allow(clippy::too_many_arguments)]
    unsafe fn run(
        &self,
        m: usize,
        a: &[f32],
        lda: usize,
        dst: *mut f32,
        ldc: usize,
        start: Start,
        threads: usize,
    ) {
        let (k, n) = (self.k, self.n);
        if let Start::Row(bias) = start {
            assert!(
                bias.len() >= n,
                "packed GEMM: bias shorter than the columns"
            );
        }
        if k == 0 {
            for r in 0..m {
                let row = dst.add(r * ldc);
                match start {
                    Start::Zero => std::ptr::write_bytes(row, 0, n),
                    Start::Dst => {}
                    Start::Row(bias) => std::ptr::copy_nonoverlapping(bias.as_ptr(), row, n),
                }
            }
            return;
        }
        assert!(
            (m - 1) * lda + k <= a.len(),
            "packed GEMM: operand out of bounds"
        );
        if let Some(q) = &self.int8 {
            // SAFETY: as this function's (the caller's guarantee on `dst`, `a` checked above).
            return q.run(m, a, lda, dst, ldc, start, threads);
        }
        let nr = self.isa.nr();
        let panels = n.div_ceil(nr);
        let threads = threads.clamp(1, panels);
        let per = panels.div_ceil(threads);
        let out = SendPtr(dst);
        let bias = match start {
            Start::Row(b) => SendPtr(b.as_ptr().cast_mut()),
            _ => SendPtr(std::ptr::null_mut()),
        };
        let run = |t: usize| {
            let (p0, p1) = (t * per, ((t + 1) * per).min(panels));
            for k0 in (0..k).step_by(KC) {
                let kc = KC.min(k - k0);
                for p in p0..p1 {
                    let panel = &self.data[(p * k + k0) * nr..(p * k + k0 + kc) * nr];
                    let cols = nr.min(n - p * nr);
                    let mut r0 = 0;
                    while r0 < m {
                        let rows = MR.min(m - r0);
                        let c = out.get().add(r0 * ldc + p * nr);
                        // What the tile's sums are added to: the partial sums already in `dst` after the
                        // first depth block, else what `start` says.
                        let add = match start {
                            _ if k0 > 0 => (c.cast_const(), ldc),
                            Start::Dst => (c.cast_const(), ldc),
                            Start::Zero => (std::ptr::null(), 0),
                            Start::Row(_) => (bias.get().cast_const().add(p * nr), 0),
                        };
                        // SAFETY: rows r0..r0 + rows of `a` hold k0 + kc ≤ k elements from `lda·r` (checked
                        // above); this task alone writes columns p·nr..p·nr + cols of those `dst` rows.
                        micro(
                            self.isa,
                            rows,
                            kc,
                            a.as_ptr().add(r0 * lda + k0),
                            lda,
                            panel.as_ptr(),
                            c,
                            ldc,
                            cols,
                            add,
                        );
                        r0 += rows;
                    }
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

/// One `rows × cols` tile (`rows` ≤ 6, `cols` ≤ the panel width) over depth `kc`, its sums added to the rows
/// at `add.0` (stride `add.1`) when that is not null.
#[allow(clippy::too_many_arguments)]
unsafe fn micro(
    isa: Isa,
    rows: usize,
    kc: usize,
    a: *const f32,
    lda: usize,
    panel: *const f32,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    add: (*const f32, usize),
) {
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! by_rows {
            ($f:ident) => {
                match rows {
                    6 => $f::<6>(kc, a, lda, panel, c, ldc, cols, add),
                    5 => $f::<5>(kc, a, lda, panel, c, ldc, cols, add),
                    4 => $f::<4>(kc, a, lda, panel, c, ldc, cols, add),
                    3 => $f::<3>(kc, a, lda, panel, c, ldc, cols, add),
                    2 => $f::<2>(kc, a, lda, panel, c, ldc, cols, add),
                    _ => $f::<1>(kc, a, lda, panel, c, ldc, cols, add),
                }
            };
        }
        match isa {
            Isa::Avx512 => by_rows!(tile_avx512),
            Isa::Avx2 => by_rows!(tile_avx2),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, rows, kc, a, lda, panel, c, ldc, cols, add);
        unreachable!("packed GEMM: no kernel for this architecture");
    }
}

/// Write a finished row of a tile (`vals` = the panel-wide accumulators) into `c` (`cols` columns), added to
/// the row at `add` unless it is null.
#[inline(always)]
unsafe fn write_row(vals: &[f32], c: *mut f32, cols: usize, add: *const f32) {
    for (j, &v) in vals.iter().enumerate().take(cols) {
        *c.add(j) = if add.is_null() { v } else { v + *add.add(j) };
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_avx512<const R: usize>(
    kc: usize,
    a: *const f32,
    lda: usize,
    panel: *const f32,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    (add, add_rs): (*const f32, usize),
) {
    use std::arch::x86_64::*;
    const V: usize = 4;
    let mut acc = [[_mm512_setzero_ps(); V]; R];
    for kk in 0..kc {
        let mut w = [_mm512_setzero_ps(); V];
        for (v, wv) in w.iter_mut().enumerate() {
            *wv = _mm512_loadu_ps(panel.add(kk * 16 * V + 16 * v));
        }
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let x = _mm512_set1_ps(*a.add(r * lda + kk));
            for v in 0..V {
                acc_r[v] = _mm512_fmadd_ps(x, w[v], acc_r[v]);
            }
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        let cr = c.add(r * ldc);
        let ar = if add.is_null() {
            add
        } else {
            add.add(r * add_rs)
        };
        if cols == 16 * V {
            for (v, &x) in acc_r.iter().enumerate() {
                let y = if ar.is_null() {
                    x
                } else {
                    _mm512_add_ps(x, _mm512_loadu_ps(ar.add(16 * v)))
                };
                _mm512_storeu_ps(cr.add(16 * v), y);
            }
        } else {
            let mut tmp = [0.0f32; 16 * V];
            for (v, &x) in acc_r.iter().enumerate() {
                _mm512_storeu_ps(tmp.as_mut_ptr().add(16 * v), x);
            }
            write_row(&tmp, cr, cols, ar);
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile_avx2<const R: usize>(
    kc: usize,
    a: *const f32,
    lda: usize,
    panel: *const f32,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    (add, add_rs): (*const f32, usize),
) {
    use std::arch::x86_64::*;
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    for kk in 0..kc {
        let w0 = _mm256_loadu_ps(panel.add(kk * 16));
        let w1 = _mm256_loadu_ps(panel.add(kk * 16 + 8));
        for (r, acc_r) in acc.iter_mut().enumerate() {
            let x = _mm256_set1_ps(*a.add(r * lda + kk));
            acc_r[0] = _mm256_fmadd_ps(x, w0, acc_r[0]);
            acc_r[1] = _mm256_fmadd_ps(x, w1, acc_r[1]);
        }
    }
    for (r, acc_r) in acc.iter().enumerate() {
        let cr = c.add(r * ldc);
        let ar = if add.is_null() {
            add
        } else {
            add.add(r * add_rs)
        };
        if cols == 16 {
            let (mut v0, mut v1) = (acc_r[0], acc_r[1]);
            if !ar.is_null() {
                v0 = _mm256_add_ps(v0, _mm256_loadu_ps(ar));
                v1 = _mm256_add_ps(v1, _mm256_loadu_ps(ar.add(8)));
            }
            _mm256_storeu_ps(cr, v0);
            _mm256_storeu_ps(cr.add(8), v1);
        } else {
            let mut tmp = [0.0f32; 16];
            _mm256_storeu_ps(tmp.as_mut_ptr(), acc_r[0]);
            _mm256_storeu_ps(tmp.as_mut_ptr().add(8), acc_r[1]);
            write_row(&tmp, cr, cols, ar);
        }
    }
}
