//! The GRU's row maths and custom ops (model-spec §1 and §3): the update `h' = h + m∘u∘(h~ − h)` as a fused op
//! beside its composed reference ([`gru_update`]), and a step's forward and backward row kernels
//! ([`gru_step_forward`], [`GruStep::backward`]) that the encoder's two directions ([`super::encoder`]) and the
//! decoder's fused recurrence (`decoder_sequence`) both run. The cell is [`crate::model::gru::Gru`].

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use crate::kernels::{by_dtype, rows_par, simd_dispatch, slice, Kernels, Mat, Real, RowsMut};

/// The GRU update `h' = base + m∘u∘(tanh(pre_c) − base)` from the gates `ru = [r | u]` `[B, 2H]` (after the
/// sigmoid), the candidate's pre-activation `pre_c` `[B, H]` and the state it interpolates with `base`
/// `[B, H]`; `m` is the optional per-row padding mask (the encoder keeps the state on padding). Composed
/// reference.
pub fn gru_update_reference(
    ru: &Tensor,
    pre_c: &Tensor,
    base: &Tensor,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let h = base.dim(1)?;
    let u = ru.narrow(1, h, h)?;
    let hn = (base + (u * (pre_c.tanh()? - base)?)?)?;
    match mask {
        Some(m) => base + m.broadcast_mul(&(hn - base)?)?,
        None => Ok(hn),
    }
}

/// The same update as one fused kernel with a hand-derived backward pass.
pub fn gru_update_fused(
    ru: &Tensor,
    pre_c: &Tensor,
    base: &Tensor,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let mask = match mask {
        Some(m) => Some(m.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?),
        None => None,
    };
    ru.contiguous()?.apply_op3(
        &pre_c.contiguous()?,
        &base.contiguous()?,
        GruUpdate { mask },
    )
}

/// Reference or fused update, as `kernels` and the device say.
pub fn gru_update(
    kernels: Kernels,
    ru: &Tensor,
    pre_c: &Tensor,
    base: &Tensor,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    if kernels.ops_fused_on(ru.device()) {
        gru_update_fused(ru, pre_c, base, mask)
    } else {
        gru_update_reference(ru, pre_c, base, mask)
    }
}

struct GruUpdate {
    mask: Option<Vec<f64>>,
}

/// The GRU's interpolation of one element, `h' = h + m·u·(h~ − h)`: the one place the update is written
/// (the update op, the encoder's and the decoder's fused recurrences all call it).
#[inline(always)]
pub(crate) fn interpolate<T: Real>(h: T, u: T, c: T, m: T) -> T {
    h + m * u * (c - h)
}

/// [`interpolate`]'s gradients from `g` = `∂h'`: `(∂h, ∂u, ∂h~)`.
#[inline(always)]
fn interpolate_grad<T: Real>(g: T, h: T, u: T, c: T, m: T) -> (T, T, T) {
    let gm = g * m;
    (g - gm * u, gm * (c - h), gm * u)
}

#[inline(always)]
fn gru_update_row<T: Real>(ru: &[T], pc: &[T], base: &[T], m: T, out: &mut [T]) {
    let h = base.len();
    let u = &ru[h..2 * h];
    for k in 0..h {
        out[k] = interpolate(base[k], u[k], pc[k].tanh_v(), m);
    }
}
simd_dispatch!(gru_update_row_d, gru_update_row_avx, gru_update_row, (ru: &[T], pc: &[T], base: &[T], m: T, out: &mut [T]));

/// Packed gradient row `[d_ru (2H) | d_pre_c (H) | d_base (H)]`.
#[inline(always)]
fn gru_update_grad_row<T: Real>(ru: &[T], pc: &[T], base: &[T], m: T, g: &[T], out: &mut [T]) {
    let h = base.len();
    let u = &ru[h..2 * h];
    let (d_ru, rest) = out.split_at_mut(2 * h);
    let (d_pc, d_base) = rest.split_at_mut(h);
    for k in 0..h {
        let c = pc[k].tanh_v();
        let (dh, du, dc) = interpolate_grad(g[k], base[k], u[k], c, m);
        d_ru[k] = T::zero();
        d_ru[h + k] = du;
        d_pc[k] = dc * (T::one() - c * c);
        d_base[k] = dh;
    }
}
simd_dispatch!(gru_update_grad_row_d, gru_update_grad_row_avx, gru_update_grad_row, (ru: &[T], pc: &[T], base: &[T], m: T, g: &[T], out: &mut [T]));

fn gru_update_fwd<T: Real>(
    mask: &Option<Vec<f64>>,
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
    s3: &CpuStorage,
    l3: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let (b, h) = l3.shape().dims2()?;
    let ru = slice::<T>(s1, l1)?;
    let pc = slice::<T>(s2, l2)?;
    let base = slice::<T>(s3, l3)?;
    if ru.len() != 2 * b * h || pc.len() != b * h || mask.as_ref().is_some_and(|m| m.len() != b) {
        candle_core::bail!(
            "fused GRU update: for B {b} × H {h}, [r | u] must hold 2·B·H = {} values (has {}), the candidate's \
             input B·H = {} (has {}) and the mask B (has {:?})",
            2 * b * h,
            ru.len(),
            b * h,
            pc.len(),
            mask.as_ref().map(|m| m.len())
        );
    }
    let mut out = vec![T::zero(); b * h];
    let row = |i: usize, o: &mut [T]| {
        let m = mask.as_ref().map_or(T::one(), |m| T::from_f64c(m[i]));
        gru_update_row_d(
            &ru[2 * i * h..2 * (i + 1) * h],
            &pc[i * h..(i + 1) * h],
            &base[i * h..(i + 1) * h],
            m,
            o,
        )
    };
    if b * h >= PAR_MIN {
        out.par_chunks_mut(h)
            .enumerate()
            .for_each(|(i, o)| row(i, o));
    } else {
        out.chunks_mut(h).enumerate().for_each(|(i, o)| row(i, o));
    }
    Ok((T::to_cpu_storage_owned(out), Shape::from((b, h))))
}

/// Below this many elements the GRU kernels run on the calling thread.
const PAR_MIN: usize = 16 * 1024;

impl CustomOp3 for GruUpdate {
    fn name(&self) -> &'static str {
        "fused-gru-update"
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
        by_dtype!(s1, gru_update_fwd, &self.mask, s1, l1, s2, l2, s3, l3)
    }
    fn bwd(
        &self,
        ru: &Tensor,
        pre_c: &Tensor,
        base: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let h = base.dim(1)?;
        let packed = ru.apply_op3_no_bwd(
            pre_c,
            base,
            &GruUpdateGrad {
                mask: self.mask.clone(),
                grad: grad.contiguous()?,
            },
        )?;
        Ok((
            Some(packed.narrow(1, 0, 2 * h)?),
            Some(packed.narrow(1, 2 * h, h)?),
            Some(packed.narrow(1, 3 * h, h)?),
        ))
    }
}

struct GruUpdateGrad {
    mask: Option<Vec<f64>>,
    grad: Tensor,
}

#[allow(clippy::too_many_arguments)]
fn gru_update_grad<T: Real>(
    mask: &Option<Vec<f64>>,
    grad: &Tensor,
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
    s3: &CpuStorage,
    l3: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let (b, h) = l3.shape().dims2()?;
    let ru = slice::<T>(s1, l1)?;
    let pc = slice::<T>(s2, l2)?;
    let base = slice::<T>(s3, l3)?;
    let g: Vec<T> = grad.flatten_all()?.to_vec1()?;
    let w = 4 * h;
    let mut out = vec![T::zero(); b * w];
    let row = |i: usize, o: &mut [T]| {
        let m = mask.as_ref().map_or(T::one(), |m| T::from_f64c(m[i]));
        gru_update_grad_row_d(
            &ru[2 * i * h..2 * (i + 1) * h],
            &pc[i * h..(i + 1) * h],
            &base[i * h..(i + 1) * h],
            m,
            &g[i * h..(i + 1) * h],
            o,
        )
    };
    if b * h >= PAR_MIN {
        out.par_chunks_mut(w)
            .enumerate()
            .for_each(|(i, o)| row(i, o));
    } else {
        out.chunks_mut(w).enumerate().for_each(|(i, o)| row(i, o));
    }
    Ok((T::to_cpu_storage_owned(out), Shape::from((b, w))))
}

impl CustomOp3 for GruUpdateGrad {
    fn name(&self) -> &'static str {
        "fused-gru-update-grad"
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
            gru_update_grad,
            &self.mask,
            &self.grad,
            s1,
            l1,
            s2,
            l2,
            s3,
            l3
        )
    }
}

// The GRU's row kernels over a step's rows, shared with the decoder's fused op (`decoder_sequence`, which
// passes the gate-scaled state as `h_prev` and no mask).

/// `[r | u] = σ(xp_ru + h_prev U_ru)` and `r∘h_prev`.
#[inline(always)]
fn seq_gates_row<T: Real>(xp: &[T], hu: &[T], hp: &[T], ru: &mut [T], rh: &mut [T]) {
    let h = hp.len();
    for k in 0..2 * h {
        ru[k] = (xp[k] + hu[k]).sigmoid_v();
    }
    for k in 0..h {
        rh[k] = ru[k] * hp[k];
    }
}
simd_dispatch!(seq_gates_row_d, seq_gates_row_avx, seq_gates_row, (xp: &[T], hu: &[T], hp: &[T], ru: &mut [T], rh: &mut [T]));

/// `h~ = tanh(xp_c + (r∘h_prev) U)` into `ht`, and `hs` (holding `h_prev`) becomes `h_prev + m∘u∘(h~ − h_prev)`.
#[inline(always)]
fn seq_update_row<T: Real>(xp: &[T], rc: &[T], ru: &[T], m: T, ht: &mut [T], hs: &mut [T]) {
    let h = rc.len();
    for k in 0..h {
        let c = (xp[2 * h + k] + rc[k]).tanh_v();
        ht[k] = c;
        hs[k] = interpolate(hs[k], ru[h + k], c, m);
    }
}
simd_dispatch!(seq_update_row_d, seq_update_row_avx, seq_update_row, (xp: &[T], rc: &[T], ru: &[T], m: T, ht: &mut [T], hs: &mut [T]));

/// [`seq_gates_row`] under recurrent dropout: `rh` holds the dropped state `d∘h_prev` on entry (the products'
/// operand) and `r∘(d∘h_prev)` on exit.
#[inline(always)]
fn seq_gates_row_dropped<T: Real>(xp: &[T], hu: &[T], ru: &mut [T], rh: &mut [T]) {
    let h = rh.len();
    for k in 0..2 * h {
        ru[k] = (xp[k] + hu[k]).sigmoid_v();
    }
    for k in 0..h {
        rh[k] = ru[k] * rh[k];
    }
}
simd_dispatch!(seq_gates_row_dropped_d, seq_gates_row_dropped_avx, seq_gates_row_dropped, (xp: &[T], hu: &[T], ru: &mut [T], rh: &mut [T]));

/// Backward through the update: `dh` holds the carried gradient on entry and `∂h_prev` (through the
/// interpolation) on exit; writes `∂` of the update gate's and the candidate's pre-activations into `dxp`.
#[inline(always)]
fn seq_bwd_update_row<T: Real>(
    g: &[T],
    dh: &mut [T],
    ru: &[T],
    ht: &[T],
    hp: &[T],
    m: T,
    dxp: &mut [T],
) {
    let h = g.len();
    for k in 0..h {
        let u = ru[h + k];
        let c = ht[k];
        let (d_h, d_u, d_c) = interpolate_grad(g[k] + dh[k], hp[k], u, c, m);
        dh[k] = d_h;
        dxp[2 * h + k] = d_c * (T::one() - c * c);
        dxp[h + k] = d_u * u * (T::one() - u);
    }
}
simd_dispatch!(seq_bwd_update_row_d, seq_bwd_update_row_avx, seq_bwd_update_row, (g: &[T], dh: &mut [T], ru: &[T], ht: &[T], hp: &[T], m: T, dxp: &mut [T]));

/// Backward through `r∘h_prev`: `drh` = `∂(r∘h_prev)`; adds into `dh`, writes the reset gate's `∂`.
#[inline(always)]
fn seq_bwd_reset_row<T: Real>(drh: &[T], ru: &[T], hp: &[T], dh: &mut [T], dxp: &mut [T]) {
    for k in 0..drh.len() {
        let r = ru[k];
        dh[k] += drh[k] * r;
        dxp[k] = drh[k] * hp[k] * r * (T::one() - r);
    }
}
simd_dispatch!(seq_bwd_reset_row_d, seq_bwd_reset_row_avx, seq_bwd_reset_row, (drh: &[T], ru: &[T], hp: &[T], dh: &mut [T], dxp: &mut [T]));

/// Backward through `r∘(d∘h_prev)` under recurrent dropout: `drh` holds `∂(r∘(d∘h_prev))` on entry and the
/// dropped state's gradient through it, `∂(d∘h_prev)` = `drh∘r`, on exit; writes the reset gate's `∂`.
#[inline(always)]
fn seq_bwd_reset_row_dropped<T: Real>(drh: &mut [T], ru: &[T], hp: &[T], d: &[T], dxp: &mut [T]) {
    for k in 0..drh.len() {
        let (g, r) = (drh[k], ru[k]);
        dxp[k] = g * hp[k] * d[k] * r * (T::one() - r);
        drh[k] = g * r;
    }
}
simd_dispatch!(seq_bwd_reset_row_dropped_d, seq_bwd_reset_row_dropped_avx, seq_bwd_reset_row_dropped, (drh: &mut [T], ru: &[T], hp: &[T], d: &[T], dxp: &mut [T]));

/// `dh += dm∘d`: the dropped state's gradient `dm` = `∂(d∘h_prev)` carried back to `h_prev` (rows of any
/// count).
#[inline(always)]
pub(crate) fn add_dropped_row<T: Real>(dm: &[T], d: &[T], dh: &mut [T]) {
    for k in 0..dh.len() {
        dh[k] += dm[k] * d[k];
    }
}
simd_dispatch!(add_dropped_row_d, add_dropped_row_avx, add_dropped_row, (dm: &[T], d: &[T], dh: &mut [T]));

/// `out = x∘d` row by row: the state the recurrent products read under recurrent dropout, from the states
/// `x` `[B, H]` and the masks `d` `[B, H]`.
pub(crate) fn dropped_state<T: Real>(x: &[T], d: &[T], out: &mut [T]) {
    for ((o, &a), &m) in out.iter_mut().zip(x).zip(d) {
        *o = a * m;
    }
}

/// `g ∘= d`: a gradient with respect to the dropped state `d∘x` carried to `x`.
pub(crate) fn undrop_grad<T: Real>(g: &mut [T], d: &[T]) {
    for (a, &m) in g.iter_mut().zip(d) {
        *a *= m;
    }
}

/// Where one GRU step's forward pass leaves its activations (`[B, 2H]`, `[B, H]`, `[B, H]`).
pub(crate) struct GruActs<'a, T> {
    pub ru: &'a mut [T],
    pub rh: &'a mut [T],
    pub ht: &'a mut [T],
}

/// A GRU step's layer normalisation of its recurrent products (model-spec §5b): the gains and biases of
/// `h U_ru` (`ln_U_ru`, one block of 2H) and of `(r∘h) U` (`ln_U`, H).
pub(crate) struct RecLn<'a, T> {
    pub g_ru: &'a [T],
    pub b_ru: &'a [T],
    pub g_c: &'a [T],
    pub b_c: &'a [T],
}

/// Where a normalised step leaves what its backward pass reads: the products' normalised values `x̂`
/// (`[B, 2H]`, `[B, H]`) and each row's `1/σ` (`[B]`, `[B]`).
pub(crate) struct RecLnActs<'a, T> {
    pub xh_ru: &'a mut [T],
    pub rs_ru: &'a mut [T],
    pub xh_c: &'a mut [T],
    pub rs_c: &'a mut [T],
}

/// A normalised step's saved values (see [`RecLnActs`]) and its gains, for [`GruStep::backward`].
pub(crate) struct RecLnSaved<'a, T> {
    pub g_ru: &'a [T],
    pub g_c: &'a [T],
    pub xh_ru: &'a [T],
    pub rs_ru: &'a [T],
    pub xh_c: &'a [T],
    pub rs_c: &'a [T],
}

/// Each of `b` rows of `x` (width `w`, one block) normalised in place, scaled by `g` and shifted by `bias`;
/// `xh` `[b, w]` and `rs` `[b]` keep `x̂` and `1/σ`.
fn norm_rows<T: Real>(
    b: usize,
    w: usize,
    x: &mut [T],
    g: &[T],
    bias: &[T],
    xh: &mut [T],
    rs: &mut [T],
) {
    crate::kernels::layer_norm::ln_rows_forward((b, w, w), x, g, bias, &[w], xh, rs);
}

/// A normalised GRU's `[∂g_U_ru, ∂β_U_ru, ∂g_U, ∂β_U]` over its steps' rows: `∂g = Σ ∂y∘x̂`, `∂β = Σ ∂y`, from
/// the pre-activations' gradients `dx` (rows of `[r | u | h~]`, width 3H) and the products' saved `x̂` (rows of
/// 2H and H; rows not computed hold zeros in both).
pub(crate) fn rec_ln_param_grads<T: Real>(
    dx: &[T],
    xh_ru: &[T],
    xh_c: &[T],
    h: usize,
) -> [Vec<T>; 4] {
    let mut out = [
        vec![T::zero(); 2 * h],
        vec![T::zero(); 2 * h],
        vec![T::zero(); h],
        vec![T::zero(); h],
    ];
    for (row, dy) in dx.chunks(3 * h).enumerate() {
        let (xr, xc) = (
            &xh_ru[row * 2 * h..(row + 1) * 2 * h],
            &xh_c[row * h..(row + 1) * h],
        );
        for j in 0..2 * h {
            out[0][j] += dy[j] * xr[j];
            out[1][j] += dy[j];
        }
        for j in 0..h {
            out[2][j] += dy[2 * h + j] * xc[j];
            out[3][j] += dy[2 * h + j];
        }
    }
    out
}

/// The gradients `dp` `[b, w]` of `b` normalised rows' inputs from those of their outputs, `dy` (row stride
/// `stride`, the first `w` values of each row), with the saved `x̂` and `1/σ` and the gain `g`.
#[allow(clippy::too_many_arguments)]
fn norm_rows_dx<T: Real>(
    b: usize,
    w: usize,
    dy: &[T],
    stride: usize,
    xh: &[T],
    rs: &[T],
    g: &[T],
    dp: &mut [T],
) {
    let dp_w = RowsMut::new(dp, w);
    rows_par(b, b * w, |i| unsafe {
        crate::kernels::layer_norm::ln_row_dx_d(
            &dy[i * stride..i * stride + w],
            &xh[i * w..(i + 1) * w],
            &rs[i..i + 1],
            g,
            &[w],
            dp_w.row(i),
        )
    });
}

/// One GRU step over `B` rows: `xp` `[B, 3H]` the input terms of `[r | u | h~]`, `state` `h_prev` on entry and
/// `h` on exit (kept where `mask` is 0); `scratch` is `([B, 2H], [B, H])`. Two GEMMs (`h_prev U_ru`,
/// `(r∘h_prev) U`) and two row loops. With recurrent dropout's masks `drop` `[B, H]` (values 0 or
/// `1/(1−p)`, the same at every step of a sentence: variational dropout), the products read the dropped
/// state `d∘h_prev` and the interpolation the state itself: `[r | u] = σ(xp + (d∘h_prev) U_ru)`,
/// `h~ = tanh(xp_c + (r∘d∘h_prev) U)`, `h = h_prev + m∘u∘(h~ − h_prev)`; `rh` then holds `r∘d∘h_prev`.
/// With layer normalisation (`ln`: the gains and biases, and where the step keeps its statistics), each
/// recurrent product is normalised before the sum (model-spec §5b).
#[allow(clippy::too_many_arguments)]
pub(crate) fn gru_step_forward<T: Real>(
    h: usize,
    xp: &[T],
    state: &mut [T],
    mask: Option<&[f64]>,
    drop: Option<&[T]>,
    acts: GruActs<T>,
    scratch: (&mut [T], &mut [T]),
    u_ru: &crate::kernels::Oriented<T>,
    u: &crate::kernels::Oriented<T>,
    ln: Option<(&RecLn<T>, RecLnActs<T>)>,
) {
    let h3 = 3 * h;
    let b = state.len() / h.max(1);
    let (hu, rc) = scratch;
    let GruActs { ru, rh, ht } = acts;
    let (ln, mut ln_acts) = match ln {
        Some((p, a)) => (Some(p), Some(a)),
        None => (None, None),
    };
    if let Some(d) = drop {
        // `rh` holds d∘h_prev for the first product, then r∘(d∘h_prev).
        dropped_state(state, &d[..b * h], rh);
        u_ru.mul_into(b, hu, 2 * h, false, Mat::rows(rh, h));
        if let (Some(p), Some(a)) = (ln, ln_acts.as_mut()) {
            norm_rows(b, 2 * h, hu, p.g_ru, p.b_ru, a.xh_ru, a.rs_ru);
        }
        let (ru_w, rh_w) = (RowsMut::new(ru, 2 * h), RowsMut::new(rh, h));
        let hu = &*hu;
        rows_par(b, b * h, |i| unsafe {
            seq_gates_row_dropped_d(
                &xp[i * h3..(i + 1) * h3],
                &hu[i * 2 * h..(i + 1) * 2 * h],
                ru_w.row(i),
                rh_w.row(i),
            )
        });
    } else {
        u_ru.mul_into(b, hu, 2 * h, false, Mat::rows(state, h));
        if let (Some(p), Some(a)) = (ln, ln_acts.as_mut()) {
            norm_rows(b, 2 * h, hu, p.g_ru, p.b_ru, a.xh_ru, a.rs_ru);
        }
        let (ru_w, rh_w) = (RowsMut::new(ru, 2 * h), RowsMut::new(rh, h));
        let (hu, state) = (&*hu, &*state);
        rows_par(b, b * h, |i| unsafe {
            seq_gates_row_d(
                &xp[i * h3..(i + 1) * h3],
                &hu[i * 2 * h..(i + 1) * 2 * h],
                &state[i * h..(i + 1) * h],
                ru_w.row(i),
                rh_w.row(i),
            )
        });
    }
    u.mul_into(b, rc, h, false, Mat::rows(rh, h));
    if let (Some(p), Some(a)) = (ln, ln_acts.as_mut()) {
        norm_rows(b, h, rc, p.g_c, p.b_c, a.xh_c, a.rs_c);
    }
    let (ht_w, st_w) = (RowsMut::new(ht, h), RowsMut::new(state, h));
    let (rc, ru) = (&*rc, &*ru);
    rows_par(b, b * h, |i| unsafe {
        seq_update_row_d(
            &xp[i * h3..(i + 1) * h3],
            &rc[i * h..(i + 1) * h],
            &ru[i * 2 * h..(i + 1) * 2 * h],
            mask.map_or(T::one(), |m| T::from_f64c(m[i])),
            ht_w.row(i),
            st_w.row(i),
        )
    });
}

/// One GRU step's saved activations over its `B` rows of width `h`: `[r | u]`, `h~`, `h_prev` (not dropped),
/// the padding mask and recurrent dropout's masks (see [`gru_step_forward`]).
pub(crate) struct GruStep<'a, T> {
    pub h: usize,
    pub ru: &'a [T],
    pub ht: &'a [T],
    pub hp: &'a [T],
    pub mask: Option<&'a [f64]>,
    pub drop: Option<&'a [T]>,
    /// With layer normalisation: the step's saved statistics and gains.
    pub ln: Option<RecLnSaved<'a, T>>,
}

impl<T: Real> GruStep<'_, T> {
    /// Back-propagation through the step: `dh` holds the carried `∂h_t` on entry (`g`, the step's own
    /// output gradient, is added to it) and `∂h_prev` on exit; `dxp` (`[B, 3H]`) receives the gradients of
    /// the pre-activations `[r | u | h~]`; `drh` is scratch `[B, H]`. With layer normalisation, `dp`
    /// (`[B, 2H]`, `[B, H]`) receives the gradients of the products `h U_ru` and `(r∘h) U` before their
    /// normalisation (what the weights' gradients read), and `dxp` those after it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn backward(
        &self,
        g: &[T],
        dh: &mut [T],
        dxp: &mut [T],
        drh: &mut [T],
        u: &crate::kernels::Oriented<T>,
        u_ru: &crate::kernels::Oriented<T>,
        dp: Option<(&mut [T], &mut [T])>,
    ) {
        let (h, h3) = (self.h, 3 * self.h);
        let b = self.hp.len() / h.max(1);
        assert_eq!(
            self.ln.is_some(),
            dp.is_some(),
            "a normalised GRU step's backward pass needs the products' gradient buffers"
        );
        {
            let (dh_w, dx_w) = (RowsMut::new(dh, h), RowsMut::new(dxp, h3));
            rows_par(b, b * h, |i| unsafe {
                seq_bwd_update_row_d(
                    &g[i * h..(i + 1) * h],
                    dh_w.row(i),
                    &self.ru[i * 2 * h..(i + 1) * 2 * h],
                    &self.ht[i * h..(i + 1) * h],
                    &self.hp[i * h..(i + 1) * h],
                    self.mask.map_or(T::one(), |m| T::from_f64c(m[i])),
                    dx_w.row(i),
                )
            });
        }
        let (mut dp_ru, mut dp_c) = match dp {
            Some((a, c)) => (Some(a), Some(c)),
            None => (None, None),
        };
        let dc = match (&self.ln, dp_c.as_deref_mut()) {
            (Some(n), Some(dpc)) => {
                norm_rows_dx(b, h, &dxp[2 * h..], h3, n.xh_c, n.rs_c, n.g_c, dpc);
                Mat::rows(&*dpc, h)
            }
            _ => Mat {
                data: &dxp[2 * h..],
                rs: h3,
                cs: 1,
            },
        };
        u.mul_t_into(b, drh, h, false, dc);
        if let Some(d) = self.drop {
            // The products read d∘h_prev: its gradient gathers in `drh` (through r∘(d∘h_prev), then
            // through the gates' product) and reaches h_prev through the mask.
            {
                let (dm_w, dx_w) = (RowsMut::new(drh, h), RowsMut::new(dxp, h3));
                rows_par(b, b * h, |i| unsafe {
                    seq_bwd_reset_row_dropped_d(
                        dm_w.row(i),
                        &self.ru[i * 2 * h..(i + 1) * 2 * h],
                        &self.hp[i * h..(i + 1) * h],
                        &d[i * h..(i + 1) * h],
                        dx_w.row(i),
                    )
                });
            }
            let dru = self.dru(b, dxp, dp_ru.as_deref_mut());
            u_ru.mul_t_into(b, drh, h, true, dru);
            let (dh_w, drh) = (RowsMut::new(dh, h), &*drh);
            rows_par(b, b * h, |i| unsafe {
                add_dropped_row_d(
                    &drh[i * h..(i + 1) * h],
                    &d[i * h..(i + 1) * h],
                    dh_w.row(i),
                )
            });
            return;
        }
        {
            let (dh_w, dx_w) = (RowsMut::new(dh, h), RowsMut::new(dxp, h3));
            let drh = &*drh;
            rows_par(b, b * h, |i| unsafe {
                seq_bwd_reset_row_d(
                    &drh[i * h..(i + 1) * h],
                    &self.ru[i * 2 * h..(i + 1) * 2 * h],
                    &self.hp[i * h..(i + 1) * h],
                    dh_w.row(i),
                    dx_w.row(i),
                )
            });
        }
        let dru = self.dru(b, dxp, dp_ru.as_deref_mut());
        u_ru.mul_t_into(b, dh, h, true, dru);
    }

    /// The gradient `h U_ru`'s product receives: the gates' pre-activation gradients in `dxp`'s first 2H
    /// columns, or, with layer normalisation, those taken back through it into `dp`.
    fn dru<'m>(&self, b: usize, dxp: &'m [T], dp: Option<&'m mut [T]>) -> Mat<'m, T> {
        let h = self.h;
        match (&self.ln, dp) {
            (Some(n), Some(dp)) => {
                norm_rows_dx(b, 2 * h, dxp, 3 * h, n.xh_ru, n.rs_ru, n.g_ru, dp);
                Mat::rows(&*dp, 2 * h)
            }
            _ => Mat {
                data: dxp,
                rs: 3 * h,
                cs: 1,
            },
        }
    }
}
