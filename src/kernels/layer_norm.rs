//! Layer normalisation (Ba et al. 2016) of a row's blocks, as Nematus and Marian apply it inside a GRU: each
//! block of a pre-activation row (e.g. `[r | u]` and the candidate's of `x W`, `[2H | H]`) is normalised on its
//! own, `y = g∘(x − μ)/σ + β` with the block's mean `μ`, `σ = √(var + ε)` (the biased variance), and a learned
//! gain `g` and bias `β` per unit. The composed reference ([`layer_norm_reference`]), the fused op with a
//! hand-derived backward pass ([`layer_norm_fused`]), and the row kernels ([`ln_row_forward`],
//! [`ln_row_backward`]) that a fused recurrence can run per step; the gradient checks that tie them are in
//! `tests/it/kernels/ops.rs`. (The building block of `model.layer_norm`, which the cells do not read yet.)

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

use crate::kernels::{by_dtype, simd_dispatch, slice, AccBuf, Kernels, Real, Shared};

/// The `ε` under the variance (Nematus's and Marian's 1e-5).
pub const EPS: f64 = 1e-5;

/// Whether `blocks` tile a row of `width`: positive widths summing to it.
fn check_blocks(width: usize, blocks: &[usize]) -> Result<()> {
    if blocks.is_empty() || blocks.contains(&0) || blocks.iter().sum::<usize>() != width {
        candle_core::bail!("layer norm: blocks {blocks:?} do not tile a row of {width} values");
    }
    Ok(())
}

/// `x` `[N, W]` with each of its rows' `blocks` (widths summing to `W`) normalised on its own, then scaled by
/// `g` `[W]` and shifted by `b` `[W]`. Composed reference.
pub fn layer_norm_reference(
    x: &Tensor,
    g: &Tensor,
    b: &Tensor,
    blocks: &[usize],
) -> Result<Tensor> {
    let (_, w) = x.dims2()?;
    check_blocks(w, blocks)?;
    let mut parts = Vec::with_capacity(blocks.len());
    let mut at = 0;
    for &n in blocks {
        let xb = x.narrow(1, at, n)?;
        let mu = xb.mean_keepdim(D::Minus1)?;
        let c = xb.broadcast_sub(&mu)?;
        let var = c.sqr()?.mean_keepdim(D::Minus1)?;
        let xhat = c.broadcast_div(&(var + EPS)?.sqrt()?)?;
        parts.push(
            xhat.broadcast_mul(&g.narrow(0, at, n)?)?
                .broadcast_add(&b.narrow(0, at, n)?)?,
        );
        at += n;
    }
    Tensor::cat(&parts, 1)
}

/// [`layer_norm_reference`] as one fused op with a hand-derived backward pass.
pub fn layer_norm_fused(x: &Tensor, g: &Tensor, b: &Tensor, blocks: &[usize]) -> Result<Tensor> {
    let (_, w) = x.dims2()?;
    check_blocks(w, blocks)?;
    if g.elem_count() != w || b.elem_count() != w {
        candle_core::bail!(
            "layer norm: a gain of {} and a bias of {} values for rows of {w}",
            g.elem_count(),
            b.elem_count()
        );
    }
    x.contiguous()?.apply_op3(
        &g.contiguous()?,
        &b.contiguous()?,
        LayerNorm {
            blocks: blocks.to_vec(),
        },
    )
}

/// Reference or fused, as `kernels` and the device say.
pub fn layer_norm(
    kernels: Kernels,
    x: &Tensor,
    g: &Tensor,
    b: &Tensor,
    blocks: &[usize],
) -> Result<Tensor> {
    if kernels.ops_fused_on(x.device()) {
        layer_norm_fused(x, g, b, blocks)
    } else {
        layer_norm_reference(x, g, b, blocks)
    }
}

/// One row's forward pass: `y` = the normalised blocks scaled and shifted; `xhat` keeps `(x − μ)/σ` and
/// `rstd` each block's `1/σ` (one value per block) for the backward pass.
pub fn ln_row_forward<T: Real>(
    x: &[T],
    g: &[T],
    b: &[T],
    blocks: &[usize],
    xhat: &mut [T],
    rstd: &mut [T],
    y: &mut [T],
) {
    y.copy_from_slice(x);
    ln_row_inplace_d(y, g, b, blocks, xhat, rstd);
}

/// One row's backward pass from `dy`, its saved `xhat` and `rstd` and the gain `g`: writes `∂x` into `dx`
/// (see [`ln_row_dx`]) and adds the row's shares of `∂g` (`dy∘x̂`) and `∂β` (`dy`) into `dg` and `db`.
#[allow(clippy::too_many_arguments)]
pub fn ln_row_backward<T: Real>(
    dy: &[T],
    xhat: &[T],
    rstd: &[T],
    g: &[T],
    blocks: &[usize],
    dx: &mut [T],
    dg: &mut [T],
    db: &mut [T],
) {
    for j in 0..dy.len() {
        dg[j] += dy[j] * xhat[j];
        db[j] += dy[j];
    }
    ln_row_dx_d(dy, xhat, rstd, g, blocks, dx);
}

/// One row's `∂x` from `dy`, its saved `xhat` and `rstd` and the gain `g`:
/// `∂x = (1/σ)·(d − mean(d) − x̂·mean(d∘x̂))` per block with `d = g∘dy`. (The sums run in lanes, so that the
/// loops vectorise; [`ln_row_dx_d`] runs it with the CPU's vector instructions.)
#[inline(always)]
pub fn ln_row_dx<T: Real>(
    dy: &[T],
    xhat: &[T],
    rstd: &[T],
    g: &[T],
    blocks: &[usize],
    dx: &mut [T],
) {
    let mut at = 0;
    for (k, &n) in blocks.iter().enumerate() {
        let r = at..at + n;
        let inv = T::one() / T::from_f64c(n as f64);
        let (sd, sdx) = lane_sums2(&g[r.clone()], &dy[r.clone()], &xhat[r.clone()]);
        let (md, mdx) = (sd * inv, sdx * inv);
        for j in r {
            dx[j] = rstd[k] * (g[j] * dy[j] - md - xhat[j] * mdx);
        }
        at += n;
    }
}

/// [`ln_row_forward`] in place: `x` becomes `y`. (The sums run in lanes, so that the loops vectorise;
/// [`ln_row_inplace_d`] runs it with the CPU's vector instructions.)
#[inline(always)]
pub fn ln_row_inplace<T: Real>(
    x: &mut [T],
    g: &[T],
    b: &[T],
    blocks: &[usize],
    xhat: &mut [T],
    rstd: &mut [T],
) {
    let mut at = 0;
    for (k, &n) in blocks.iter().enumerate() {
        let r = at..at + n;
        let inv = T::one() / T::from_f64c(n as f64);
        let mu = lane_sum(&x[r.clone()], |v| v) * inv;
        let var = lane_sum(&x[r.clone()], |v| (v - mu) * (v - mu)) * inv;
        let rs = T::one() / (var + T::from_f64c(EPS)).sqrt();
        rstd[k] = rs;
        for j in r {
            let xh = (x[j] - mu) * rs;
            xhat[j] = xh;
            x[j] = g[j] * xh + b[j];
        }
        at += n;
    }
}

simd_dispatch!(ln_row_inplace_d, ln_row_inplace_avx, ln_row_inplace, (x: &mut [T], g: &[T], b: &[T], blocks: &[usize], xhat: &mut [T], rstd: &mut [T]));
simd_dispatch!(ln_row_dx_d, ln_row_dx_avx, ln_row_dx, (dy: &[T], xhat: &[T], rstd: &[T], g: &[T], blocks: &[usize], dx: &mut [T]));

/// Lanes of [`lane_sum`] and [`lane_sums2`] (8 × f32 = one AVX register).
const LANES: usize = 8;

/// `Σ f(a_j)` with independent accumulators, so that the loop vectorises.
#[inline(always)]
fn lane_sum<T: Real>(a: &[T], f: impl Fn(T) -> T) -> T {
    let mut acc = [T::zero(); LANES];
    let c = a.chunks_exact(LANES);
    let r = c.remainder();
    for x in c {
        for l in 0..LANES {
            acc[l] += f(x[l]);
        }
    }
    let mut s = acc.iter().fold(T::zero(), |s, &x| s + x);
    for &x in r {
        s += f(x);
    }
    s
}

/// `(Σ g_j d_j, Σ g_j d_j x_j)` with independent accumulators, so that the loop vectorises.
#[inline(always)]
fn lane_sums2<T: Real>(g: &[T], d: &[T], x: &[T]) -> (T, T) {
    let n = g.len().min(d.len()).min(x.len());
    let (mut a, mut b) = ([T::zero(); LANES], [T::zero(); LANES]);
    let full = n - n % LANES;
    for i in (0..full).step_by(LANES) {
        for l in 0..LANES {
            let v = g[i + l] * d[i + l];
            a[l] += v;
            b[l] += v * x[i + l];
        }
    }
    let (mut sa, mut sb) = (
        a.iter().fold(T::zero(), |s, &v| s + v),
        b.iter().fold(T::zero(), |s, &v| s + v),
    );
    for i in full..n {
        let v = g[i] * d[i];
        sa += v;
        sb += v * x[i];
    }
    (sa, sb)
}

/// `rows` rows of stride `stride` in `x`, the first `w` values of each normalised in place in `blocks`
/// (widths summing to `w`), scaled by `g` and shifted by `b`; `xh` `[rows, w]` and `rs` `[rows, blocks]`
/// keep `x̂` and `1/σ` for [`ln_rows_backward`]. (A fused recurrence's per-step normalisation.)
#[allow(clippy::too_many_arguments)]
pub(crate) fn ln_rows_forward<T: Real>(
    (rows, w, stride): (usize, usize, usize),
    x: &mut [T],
    g: &[T],
    b: &[T],
    blocks: &[usize],
    xh: &mut [T],
    rs: &mut [T],
) {
    let nb = blocks.len();
    let (x_w, xh_w, rs_w) = (
        crate::kernels::RowsMut::new(x, stride),
        crate::kernels::RowsMut::new(xh, w),
        crate::kernels::RowsMut::new(rs, nb),
    );
    crate::kernels::rows_par(rows, rows * w, |i| unsafe {
        ln_row_inplace_d(&mut x_w.row(i)[..w], g, b, blocks, xh_w.row(i), rs_w.row(i))
    });
}

/// Back through [`ln_rows_forward`] in place: `d` (rows of stride `stride`) holds the gradient of the
/// normalised values in each row's first `w` on entry and that of the values before the normalisation on
/// exit; the rows' shares of `∂g` and `∂β` are added into `dg` and `db`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ln_rows_backward<T: Real>(
    (rows, w, stride): (usize, usize, usize),
    d: &mut [T],
    g: &[T],
    blocks: &[usize],
    xh: &[T],
    rs: &[T],
    dg: &mut [T],
    db: &mut [T],
) {
    let nb = blocks.len();
    for i in 0..rows {
        let (dy, x) = (&d[i * stride..i * stride + w], &xh[i * w..(i + 1) * w]);
        for j in 0..w {
            dg[j] += dy[j] * x[j];
            db[j] += dy[j];
        }
    }
    let d_w = crate::kernels::RowsMut::new(d, stride);
    crate::kernels::rows_par(rows, rows * w, |i| unsafe {
        let row = &mut d_w.row(i)[..w];
        let dy = row.to_vec();
        ln_row_dx_d(
            &dy,
            &xh[i * w..(i + 1) * w],
            &rs[i * nb..(i + 1) * nb],
            g,
            blocks,
            row,
        )
    });
}

struct LayerNorm {
    blocks: Vec<usize>,
}

/// Rows per task of the fused op's passes: a fixed size, so that the sums over rows do not depend on the
/// number of threads.
const CHUNK_ROWS: usize = 32;

fn ln_fwd<T: Real>(
    blocks: &[usize],
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
    s3: &CpuStorage,
    l3: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let (n, w) = l1.shape().dims2()?;
    let (x, g, b) = (
        slice::<T>(s1, l1)?,
        slice::<T>(s2, l2)?,
        slice::<T>(s3, l3)?,
    );
    let mut y = vec![T::zero(); n * w];
    // Chunks of rows in parallel, each with its own scratch.
    y.par_chunks_mut(CHUNK_ROWS * w.max(1))
        .enumerate()
        .for_each(|(c, yc)| {
            let (mut xhat, mut rstd) = (vec![T::zero(); w], vec![T::zero(); blocks.len()]);
            for (k, yr) in yc.chunks_mut(w.max(1)).enumerate() {
                let i = c * CHUNK_ROWS + k;
                ln_row_forward(
                    &x[i * w..(i + 1) * w],
                    g,
                    b,
                    blocks,
                    &mut xhat,
                    &mut rstd,
                    yr,
                );
            }
        });
    Ok((T::to_cpu_storage_owned(y), Shape::from((n, w))))
}

/// The backward pass's three gradients `(∂x, ∂g, ∂β)` from the inputs' and the output gradient's values.
fn ln_bwd<T: Real>(
    blocks: &[usize],
    x: &Tensor,
    g: &Tensor,
    grad: &Tensor,
) -> Result<(Tensor, Tensor, Tensor)> {
    let (n, w) = x.dims2()?;
    let (xv, gv, dyv) = (
        crate::kernels::to_vec::<T>(x)?,
        crate::kernels::to_vec::<T>(g)?,
        crate::kernels::to_vec::<T>(grad)?,
    );
    let (dx, dg, db) = ln_grads(blocks, (n, w), &xv, &gv, &dyv);
    let dev = x.device();
    Ok((
        Tensor::from_vec(dx, (n, w), dev)?,
        Tensor::from_vec(dg, g.shape(), dev)?,
        Tensor::from_vec(db, g.shape(), dev)?,
    ))
}

/// `(∂x, ∂g, ∂β)` of `n` rows of `w` values `xv` normalised in `blocks` with the gain `gv`, for the output
/// gradient `dyv`.
fn ln_grads<T: Real>(
    blocks: &[usize],
    (n, w): (usize, usize),
    xv: &[T],
    gv: &[T],
    dyv: &[T],
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let mut dx = vec![T::zero(); n * w];
    let zeros = vec![T::zero(); w];
    // Chunks of rows in parallel, each with its own share of ∂g and ∂β, summed in chunk order after (the
    // same sums whatever the threads).
    let parts: Vec<(Vec<T>, Vec<T>)> = dx
        .par_chunks_mut(CHUNK_ROWS * w.max(1))
        .enumerate()
        .map(|(c, dxc)| {
            let (mut dg, mut db) = (vec![T::zero(); w], vec![T::zero(); w]);
            let (mut xhat, mut rstd, mut y) = (
                vec![T::zero(); w],
                vec![T::zero(); blocks.len()],
                vec![T::zero(); w],
            );
            for (k, dxr) in dxc.chunks_mut(w.max(1)).enumerate() {
                let r = (c * CHUNK_ROWS + k) * w..(c * CHUNK_ROWS + k + 1) * w;
                // The row's statistics again (cheaper to recompute than to keep for every row).
                ln_row_forward(
                    &xv[r.clone()],
                    gv,
                    &zeros,
                    blocks,
                    &mut xhat,
                    &mut rstd,
                    &mut y,
                );
                ln_row_backward(&dyv[r], &xhat, &rstd, gv, blocks, dxr, &mut dg, &mut db);
            }
            (dg, db)
        })
        .collect();
    let (mut dg, mut db) = (vec![T::zero(); w], vec![T::zero(); w]);
    for (pg, pb) in parts {
        for j in 0..w {
            dg[j] += pg[j];
            db[j] += pb[j];
        }
    }
    (dx, dg, db)
}

impl CustomOp3 for LayerNorm {
    fn name(&self) -> &'static str {
        "fused-layer-norm"
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
        crate::kernels::profile::timed("layer norm forward", || {
            by_dtype!(s1, ln_fwd, &self.blocks, s1, l1, s2, l2, s3, l3)
        })
    }
    fn bwd(
        &self,
        x: &Tensor,
        g: &Tensor,
        _b: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dx, dg, db) =
            crate::kernels::profile::timed("layer norm backward", || match x.dtype() {
                candle_core::DType::F32 => ln_bwd::<f32>(&self.blocks, x, g, grad),
                candle_core::DType::F64 => ln_bwd::<f64>(&self.blocks, x, g, grad),
                _ => candle_core::bail!("fused kernels support f32 and f64"),
            })?;
        Ok((Some(dx), Some(dg), Some(db)))
    }
}

/// `x` (a [`Shared`] handle `[…, W]`) with each row's `blocks` normalised as [`layer_norm_fused`] does, itself
/// as a [`Shared`] handle: formed now, outside the graph; the graph holds a one-element token (on `x`'s token,
/// `g` and `b`) whose backward pass takes the gradient the consumers accumulated in the result's handle, adds
/// `∂x` into `x`'s handle and hands `∂g` and `∂β` over. A layer-normalised model's encoder projections and
/// attention keys reach the fused ops this way, as the plain model's do: neither the normalised rows'
/// gradient nor the product's enters candle's gradient store.
pub fn layer_norm_shared(x: &Shared, g: &Tensor, b: &Tensor, blocks: &[usize]) -> Result<Shared> {
    let dims = x.tensor.dims().to_vec();
    let w = *dims.last().unwrap_or(&0);
    let n = x.tensor.elem_count() / w.max(1);
    let (g, b) = (g.contiguous()?, b.contiguous()?);
    let flat = x.tensor.reshape((n, w))?;
    let tensor =
        layer_norm_fused(&flat.detach(), &g.detach(), &b.detach(), blocks)?.reshape(dims)?;
    let acc = std::sync::Arc::new(std::sync::Mutex::new(AccBuf::Empty));
    let token = x.token.apply_op3(
        &g,
        &b,
        LayerNormTap {
            x: x.clone(),
            acc: acc.clone(),
            blocks: blocks.to_vec(),
            rows: (n, w),
        },
    )?;
    Ok(Shared { tensor, token, acc })
}

struct LayerNormTap {
    x: Shared,
    acc: std::sync::Arc<std::sync::Mutex<AccBuf>>,
    blocks: Vec<usize>,
    rows: (usize, usize),
}

impl LayerNormTap {
    /// `∂x` added into `x`'s handle; `(∂g, ∂β)` returned.
    fn backward<T: Real>(&self, g: &Tensor, dy: &Tensor) -> Result<(Tensor, Tensor)> {
        let gv = crate::kernels::to_vec::<T>(g)?;
        let dyv = crate::kernels::to_vec::<T>(dy)?;
        let (dx, dg, db) = self
            .x
            .with_slice::<T, _>(|xv| Ok(ln_grads(&self.blocks, self.rows, xv, &gv, &dyv)))?;
        self.x.add_grad::<T>(dx);
        Ok((
            Tensor::from_vec(dg, g.shape(), g.device())?,
            Tensor::from_vec(db, g.shape(), g.device())?,
        ))
    }
}

impl CustomOp3 for LayerNormTap {
    fn name(&self) -> &'static str {
        "layer-norm-shared"
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
        crate::kernels::token_storage(s1)
    }
    fn bwd(
        &self,
        token: &Tensor,
        g: &Tensor,
        b: &Tensor,
        _res: &Tensor,
        _grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        crate::kernels::profile::timed("layer norm backward", || {
            let Some(dy) =
                crate::kernels::take_accumulated(&self.acc, self.rows, g.dtype(), g.device())?
            else {
                return Ok((None, None, None));
            };
            let (dg, db) = match g.dtype() {
                candle_core::DType::F32 => self.backward::<f32>(g, &dy)?,
                candle_core::DType::F64 => self.backward::<f64>(g, &dy)?,
                _ => candle_core::bail!("fused kernels support f32 and f64"),
            };
            Ok((
                Some(token.zeros_like()?),
                crate::kernels::hand_over(g, dg),
                crate::kernels::hand_over(b, db),
            ))
        })
    }
}
