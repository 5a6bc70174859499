//! Products with few rows against a weight packed once: the recurrences' per-step products `x W` and
//! `g Wᵀ` (`M` = the batch, 64–80 rows) run with the same weight at every time step of a pass, so the weight
//! is laid out once in panels of `NR` columns ([`Packed`]) and every step's product streams through them
//! with a register-blocked micro-kernel (`6 × 32` with AVX-512, `6 × 16` with AVX2+FMA). A general GEMM
//! packs its operand again at every call; at these shapes that repacking costs as much as a fifth of the
//! product. f32 only, chosen at run time ([`Isa::detect`]); other types and CPUs keep the general GEMM.

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
        Packed { data, k, n, isa }
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
        let (k, n) = (self.k, self.n);
        if m == 0 || n == 0 {
            return;
        }
        assert!(
            (m - 1) * ldc + n <= dst.len() && (k == 0 || (m - 1) * lda + k <= a.len()),
            "packed GEMM: operand out of bounds"
        );
        if k == 0 {
            if !accumulate {
                for r in 0..m {
                    dst[r * ldc..r * ldc + n].fill(0.0);
                }
            }
            return;
        }
        let nr = self.isa.nr();
        let panels = n.div_ceil(nr);
        let threads = threads.clamp(1, panels);
        let per = panels.div_ceil(threads);
        let out = SendPtr(dst.as_mut_ptr());
        let run = |t: usize| {
            let (p0, p1) = (t * per, ((t + 1) * per).min(panels));
            for k0 in (0..k).step_by(KC) {
                let kc = KC.min(k - k0);
                let acc_in = accumulate || k0 > 0;
                for p in p0..p1 {
                    let panel = &self.data[(p * k + k0) * nr..(p * k + k0 + kc) * nr];
                    let cols = nr.min(n - p * nr);
                    let mut r0 = 0;
                    while r0 < m {
                        let rows = MR.min(m - r0);
                        // SAFETY: rows r0..r0 + rows of `a` hold k0 + kc ≤ k elements from `lda·r` (checked
                        // above); this task alone writes columns p·nr..p·nr + cols of those `dst` rows.
                        unsafe {
                            micro(
                                self.isa,
                                rows,
                                kc,
                                a.as_ptr().add(r0 * lda + k0),
                                lda,
                                panel.as_ptr(),
                                out.get().add(r0 * ldc + p * nr),
                                ldc,
                                cols,
                                acc_in,
                            )
                        };
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

#[derive(Clone, Copy)]
struct SendPtr(*mut f32);
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    fn get(self) -> *mut f32 {
        self.0
    }
}

/// One `rows × cols` tile (`rows` ≤ 6, `cols` ≤ the panel width) over depth `kc`.
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
    acc_in: bool,
) {
    #[cfg(target_arch = "x86_64")]
    {
        macro_rules! by_rows {
            ($f:ident) => {
                match rows {
                    6 => $f::<6>(kc, a, lda, panel, c, ldc, cols, acc_in),
                    5 => $f::<5>(kc, a, lda, panel, c, ldc, cols, acc_in),
                    4 => $f::<4>(kc, a, lda, panel, c, ldc, cols, acc_in),
                    3 => $f::<3>(kc, a, lda, panel, c, ldc, cols, acc_in),
                    2 => $f::<2>(kc, a, lda, panel, c, ldc, cols, acc_in),
                    _ => $f::<1>(kc, a, lda, panel, c, ldc, cols, acc_in),
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
        let _ = (isa, rows, kc, a, lda, panel, c, ldc, cols, acc_in);
        unreachable!("packed GEMM: no kernel for this architecture");
    }
}

/// Write a finished row of a tile (`vals` = the panel-wide accumulators) into `c` (`cols` columns).
#[inline(always)]
unsafe fn write_row(vals: &[f32], c: *mut f32, cols: usize, acc_in: bool) {
    for (j, &v) in vals.iter().enumerate().take(cols) {
        let p = c.add(j);
        *p = if acc_in { *p + v } else { v };
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
    acc_in: bool,
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
        if cols == 16 * V {
            for (v, &x) in acc_r.iter().enumerate() {
                let p = cr.add(16 * v);
                let y = if acc_in {
                    _mm512_add_ps(x, _mm512_loadu_ps(p))
                } else {
                    x
                };
                _mm512_storeu_ps(p, y);
            }
        } else {
            let mut tmp = [0.0f32; 16 * V];
            for (v, &x) in acc_r.iter().enumerate() {
                _mm512_storeu_ps(tmp.as_mut_ptr().add(16 * v), x);
            }
            write_row(&tmp, cr, cols, acc_in);
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
    acc_in: bool,
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
        if cols == 16 {
            let (mut v0, mut v1) = (acc_r[0], acc_r[1]);
            if acc_in {
                v0 = _mm256_add_ps(v0, _mm256_loadu_ps(cr));
                v1 = _mm256_add_ps(v1, _mm256_loadu_ps(cr.add(8)));
            }
            _mm256_storeu_ps(cr, v0);
            _mm256_storeu_ps(cr.add(8), v1);
        } else {
            let mut tmp = [0.0f32; 16];
            _mm256_storeu_ps(tmp.as_mut_ptr(), acc_r[0]);
            _mm256_storeu_ps(tmp.as_mut_ptr().add(8), acc_r[1]);
            write_row(&tmp, cr, cols, acc_in);
        }
    }
}
