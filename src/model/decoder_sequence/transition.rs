//! The transitions' row kernels of the fused decoder op beyond the GRU's (in `gru`, shared with the encoder): the
//! vanilla tanh unit, and the paper-literal gate form (`T` scaling the recurrent products after them), with
//! their backward passes.

use crate::kernels::{rows_par, simd_dispatch, Mat, Oriented, Real, RowsMut};

/// Layer normalisation of one recurrent product of the transition, in the forward pass: its gain and bias,
/// and where its rows keep `x̂` and `1/σ` (one block per row).
pub(super) struct NormFwd<'a, T> {
    pub g: &'a [T],
    pub b: &'a [T],
    pub xh: &'a mut [T],
    pub rs: &'a mut [T],
}

impl<T: Real> NormFwd<'_, T> {
    /// Normalises `rows` rows of width `w` of `x` in place.
    pub fn run(&mut self, rows: usize, w: usize, x: &mut [T]) {
        crate::kernels::layer_norm::ln_rows_forward(
            (rows, w, w),
            &mut x[..rows * w],
            self.g,
            self.b,
            &[w],
            &mut self.xh[..rows * w],
            &mut self.rs[..rows],
        );
    }
}

/// Back through a [`NormFwd`]: the gain, the rows' saved `x̂` and `1/σ`, and where the gain's and bias's
/// gradients gather.
pub(super) struct NormBwd<'a, T> {
    pub g: &'a [T],
    pub xh: &'a [T],
    pub rs: &'a [T],
    pub dg: &'a mut [T],
    pub db: &'a mut [T],
}

impl<T: Real> NormBwd<'_, T> {
    /// `d` (`rows` rows of width `w`) holds the normalised product's gradient on entry and the product's on
    /// exit.
    pub fn run(&mut self, rows: usize, w: usize, d: &mut [T]) {
        crate::kernels::layer_norm::ln_rows_backward(
            (rows, w, w),
            &mut d[..rows * w],
            self.g,
            &[w],
            &self.xh[..rows * w],
            &self.rs[..rows],
            self.dg,
            self.db,
        );
    }
}

/// The normalisations of the transition's recurrent products (model-spec §5b): `U_ru t` (a GRU's; `None` for
/// the vanilla unit) and `U(r∘t)` or `U t`.
pub(super) struct RecNorms<N> {
    pub ru: Option<N>,
    pub c: N,
}

/// The vanilla unit's step for one row: `t = tanh(pre + t)` (`t` holding `U (T∘t_{i−1})` on entry).
#[inline(always)]
pub(super) fn vanilla_row<T: Real>(pre: &[T], t: &mut [T]) {
    for (o, &p) in t.iter_mut().zip(pre) {
        *o = (*o + p).tanh_v();
    }
}
simd_dispatch!(vanilla_row_d, vanilla_row_avx, vanilla_row, (pre: &[T], t: &mut [T]));

/// Backward through [`vanilla_row`]: `dpre = ∂t ∘ (1 − t²)`.
#[inline(always)]
pub(super) fn vanilla_grad_row<T: Real>(dt: &[T], t: &[T], dpre: &mut [T]) {
    for ((o, &g), &x) in dpre.iter_mut().zip(dt).zip(t) {
        *o = g * (T::one() - x * x);
    }
}
simd_dispatch!(vanilla_grad_row_d, vanilla_grad_row_avx, vanilla_grad_row, (dt: &[T], t: &[T], dpre: &mut [T]));

/// Paper form, vanilla: `t = tanh(pre + T∘(U t_{i−1}))` for one row (`rc` = `U t_{i−1}`, `sc` = `T`).
#[inline(always)]
pub(super) fn paper_vanilla_row<T: Real>(pre: &[T], rc: &[T], sc: &[T], t: &mut [T]) {
    for (((o, &p), &c), &x) in t.iter_mut().zip(pre).zip(rc).zip(sc) {
        *o = (p + x * c).tanh_v();
    }
}
simd_dispatch!(paper_vanilla_row_d, paper_vanilla_row_avx, paper_vanilla_row, (pre: &[T], rc: &[T], sc: &[T], t: &mut [T]));

/// Paper form, GRU gates for one row: `[r | u] = σ(pre_ru + T∘(U_ru t))` (`hu` = `U_ru t`, `sc` = `T` over each
/// block) and `r∘t`.
#[inline(always)]
pub(super) fn paper_gates_row<T: Real>(
    pre: &[T],
    hu: &[T],
    sc: &[T],
    t: &[T],
    ru: &mut [T],
    rh: &mut [T],
) {
    let h = t.len();
    for blk in 0..2 {
        let r = blk * h..(blk + 1) * h;
        for (((o, &p), &c), &x) in ru[r.clone()]
            .iter_mut()
            .zip(&pre[r.clone()])
            .zip(&hu[r])
            .zip(sc)
        {
            *o = (p + x * c).sigmoid_v();
        }
    }
    for ((o, &rr), &x) in rh.iter_mut().zip(&ru[..h]).zip(t) {
        *o = rr * x;
    }
}
simd_dispatch!(paper_gates_row_d, paper_gates_row_avx, paper_gates_row, (pre: &[T], hu: &[T], sc: &[T], t: &[T], ru: &mut [T], rh: &mut [T]));

/// Paper form, GRU update for one row: `t~ = tanh(pre_c + T∘(U(r∘t)))` into `ht`, `t_i = t + u∘(t~ − t)`.
#[inline(always)]
pub(super) fn paper_update_row<T: Real>(
    pre: &[T],
    rc: &[T],
    sc: &[T],
    ru: &[T],
    t: &[T],
    ht: &mut [T],
    out: &mut [T],
) {
    let h = t.len();
    for k in 0..h {
        let c = (pre[k] + sc[k] * rc[k]).tanh_v();
        ht[k] = c;
        out[k] = crate::kernels::gru::interpolate(t[k], ru[h + k], c, T::one());
    }
}
simd_dispatch!(paper_update_row_d, paper_update_row_avx, paper_update_row, (pre: &[T], rc: &[T], sc: &[T], ru: &[T], t: &[T], ht: &mut [T], out: &mut [T]));

/// Backward through [`paper_vanilla_row`]: `∂pre`, `∂(U t)` = `T∘∂pre` and `∂T` for one row.
#[inline(always)]
pub(super) fn paper_vanilla_grad_row<T: Real>(
    dt: &[T],
    t: &[T],
    rc: &[T],
    sc: &[T],
    dpre: &mut [T],
    drc: &mut [T],
    dsc: &mut [T],
) {
    for k in 0..t.len() {
        let d = dt[k] * (T::one() - t[k] * t[k]);
        dpre[k] = d;
        drc[k] = sc[k] * d;
        dsc[k] = d * rc[k];
    }
}
simd_dispatch!(paper_vanilla_grad_row_d, paper_vanilla_grad_row_avx, paper_vanilla_grad_row, (dt: &[T], t: &[T], rc: &[T], sc: &[T], dpre: &mut [T], drc: &mut [T], dsc: &mut [T]));

/// Backward through [`paper_update_row`] for one row from `dt` = `∂t_i`: the update gate's and the
/// candidate's `∂pre` (`dpre[H..3H]`), `∂(U(r∘t))` = `T∘∂`, `∂T` (written) and `∂t` through the
/// interpolation (written).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn paper_update_grad_row<T: Real>(
    dt: &[T],
    ru: &[T],
    ht: &[T],
    t: &[T],
    rc: &[T],
    sc: &[T],
    dpre: &mut [T],
    drc: &mut [T],
    dsc: &mut [T],
    dtp: &mut [T],
) {
    let h = t.len();
    for k in 0..h {
        let (u, c) = (ru[h + k], ht[k]);
        let dc = dt[k] * u * (T::one() - c * c);
        dpre[2 * h + k] = dc;
        drc[k] = sc[k] * dc;
        dsc[k] = dc * rc[k];
        dpre[h + k] = dt[k] * (c - t[k]) * u * (T::one() - u);
        dtp[k] = dt[k] * (T::one() - u);
    }
}
simd_dispatch!(paper_update_grad_row_d, paper_update_grad_row_avx, paper_update_grad_row, (dt: &[T], ru: &[T], ht: &[T], t: &[T], rc: &[T], sc: &[T], dpre: &mut [T], drc: &mut [T], dsc: &mut [T], dtp: &mut [T]));

/// Backward through [`paper_gates_row`] for one row from `drh` = `∂(r∘t)`: the reset gate's `∂pre`
/// (`dpre[..H]`; the update gate's is there already), `∂(U_ru t)` = `T∘∂pre_ru`, and adds into `∂T` and `∂t`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn paper_gates_grad_row<T: Real>(
    drh: &[T],
    ru: &[T],
    t: &[T],
    hu: &[T],
    sc: &[T],
    dpre: &mut [T],
    dhu: &mut [T],
    dsc: &mut [T],
    dtp: &mut [T],
) {
    let h = t.len();
    for k in 0..h {
        let r = ru[k];
        dpre[k] = drh[k] * t[k] * r * (T::one() - r);
        dtp[k] += drh[k] * r;
    }
    for blk in 0..2 {
        for k in 0..h {
            let j = blk * h + k;
            dhu[j] = sc[k] * dpre[j];
            dsc[k] += dpre[j] * hu[j];
        }
    }
}
simd_dispatch!(paper_gates_grad_row_d, paper_gates_grad_row_avx, paper_gates_grad_row, (drh: &[T], ru: &[T], t: &[T], hu: &[T], sc: &[T], dpre: &mut [T], dhu: &mut [T], dsc: &mut [T], dtp: &mut [T]));

/// The paper form's transition for one step over `B` rows of width `h`: from `pre` (the mix of the word and
/// context terms), the unscaled state `t` and the target scale `sc` = `T`, the next state into `t_next`;
/// `rc` receives `U(r∘t)` (GRU) or `U t` (vanilla) before its scale; `gru` is `Some(([U_ru t], [r | u],
/// r∘t, t~))` for the GRU's saved activations, `None` for the vanilla unit. `tm` is the recurrent products'
/// operand: `t` itself, or `d∘t` under recurrent dropout (the GRU interpolates with `t`). `ln`: layer
/// normalisation of the products (`rc` and `U_ru t` then hold them normalised, before the scale).
#[allow(clippy::type_complexity)]
pub(super) fn paper_transition<T: Real>(
    (b, h): (usize, usize),
    (pre, t, tm, sc): (&[T], &[T], &[T], &[T]),
    (u, u_ru): (&Oriented<T>, &Oriented<T>),
    gru: Option<(&mut [T], &mut [T], &mut [T], &mut [T])>,
    rc: &mut [T],
    t_next: &mut [T],
    mut ln: Option<RecNorms<NormFwd<T>>>,
) {
    let bh = b * h;
    let Some((hu, ru, rh, cand)) = gru else {
        u.mul_into(b, rc, h, false, Mat::rows(tm, h));
        if let Some(n) = ln.as_mut() {
            n.c.run(b, h, rc);
        }
        let (tw, rc) = (RowsMut::new(t_next, h), &*rc);
        rows_par(b, bh, |r| unsafe {
            let rr = r * h..(r + 1) * h;
            paper_vanilla_row_d(&pre[rr.clone()], &rc[rr.clone()], &sc[rr], tw.row(r))
        });
        return;
    };
    let kh = 3 * h;
    u_ru.mul_into(b, hu, 2 * h, false, Mat::rows(tm, h));
    if let Some(n) = ln.as_mut().and_then(|n| n.ru.as_mut()) {
        n.run(b, 2 * h, hu);
    }
    {
        let (rw, rhw, hu) = (RowsMut::new(ru, 2 * h), RowsMut::new(rh, h), &*hu);
        rows_par(b, bh, |r| unsafe {
            paper_gates_row_d(
                &pre[r * kh..r * kh + 2 * h],
                &hu[r * 2 * h..(r + 1) * 2 * h],
                &sc[r * h..(r + 1) * h],
                &tm[r * h..(r + 1) * h],
                rw.row(r),
                rhw.row(r),
            )
        });
    }
    u.mul_into(b, rc, h, false, Mat::rows(rh, h));
    if let Some(n) = ln.as_mut() {
        n.c.run(b, h, rc);
    }
    let (cw, tw, rc, ru) = (RowsMut::new(cand, h), RowsMut::new(t_next, h), &*rc, &*ru);
    rows_par(b, bh, |r| unsafe {
        let rr = r * h..(r + 1) * h;
        paper_update_row_d(
            &pre[r * kh + 2 * h..(r + 1) * kh],
            &rc[rr.clone()],
            &sc[rr.clone()],
            &ru[r * 2 * h..(r + 1) * 2 * h],
            &t[rr],
            cw.row(r),
            tw.row(r),
        )
    });
}

/// Backward through [`paper_transition`] from `dt` = `∂t_next`: the pre-activations' gradient into `dpre`,
/// the products' own gradients into `drc` (and, GRU, the last slot of `gru`: `∂(U_ru t)`), `∂T` into `dsc`,
/// `∂t` through the transition into `dtp`; `drh` is scratch `[B, H]`. `gru` holds the forward pass's
/// `[r | u]`, `t~` and `U_ru t`. Under recurrent dropout `drop` holds the products' operand `d∘t`, the masks
/// `d` and a scratch `[B, H]` for the operand's gradient. `ln`: back through the products' layer
/// normalisation (`drc` and `∂(U_ru t)` then end as the gradients of the products before it).
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
pub(super) fn paper_transition_backward<T: Real>(
    (b, h): (usize, usize),
    dt: &[T],
    (t, t_next): (&[T], &[T]),
    (rc, sc): (&[T], &[T]),
    (u, u_ru): (&Oriented<T>, &Oriented<T>),
    gru: Option<(&[T], &[T], &[T], &mut [T])>,
    (dpre, drc): (&mut [T], &mut [T]),
    (dsc, dtp, drh): (&mut [T], &mut [T], &mut [T]),
    drop: Option<(&[T], &[T], &mut [T])>,
    mut ln: Option<RecNorms<NormBwd<T>>>,
) {
    let bh = b * h;
    let Some((ru, cand, hu, dhu)) = gru else {
        {
            let (pw, cw, sw) = (
                RowsMut::new(dpre, h),
                RowsMut::new(drc, h),
                RowsMut::new(dsc, h),
            );
            rows_par(b, bh, |r| unsafe {
                let rr = r * h..(r + 1) * h;
                paper_vanilla_grad_row_d(
                    &dt[rr.clone()],
                    &t_next[rr.clone()],
                    &rc[rr.clone()],
                    &sc[rr],
                    pw.row(r),
                    cw.row(r),
                    sw.row(r),
                )
            });
        }
        if let Some(n) = ln.as_mut() {
            n.c.run(b, h, drc);
        }
        u.mul_t_into(b, dtp, h, false, Mat::rows(drc, h));
        if let Some((_, d, _)) = drop {
            // U read d∘t: ∂t through the mask.
            crate::kernels::gru::undrop_grad(&mut dtp[..bh], &d[..bh]);
        }
        return;
    };
    let kh = 3 * h;
    {
        let (pw, cw, sw, tw) = (
            RowsMut::new(dpre, kh),
            RowsMut::new(drc, h),
            RowsMut::new(dsc, h),
            RowsMut::new(dtp, h),
        );
        rows_par(b, bh, |r| unsafe {
            let rr = r * h..(r + 1) * h;
            paper_update_grad_row_d(
                &dt[rr.clone()],
                &ru[r * 2 * h..(r + 1) * 2 * h],
                &cand[rr.clone()],
                &t[rr.clone()],
                &rc[rr.clone()],
                &sc[rr],
                pw.row(r),
                cw.row(r),
                sw.row(r),
                tw.row(r),
            )
        });
    }
    if let Some(n) = ln.as_mut() {
        n.c.run(b, h, drc);
    }
    u.mul_t_into(b, drh, h, false, Mat::rows(drc, h));
    let mut ln_ru = ln.and_then(|n| n.ru);
    // The products' operand and where its gradient gathers: `t` and `dtp`, or, under recurrent dropout,
    // `d∘t` and the scratch, carried to `dtp` through the mask at the end.
    let mut gates = |tm: &[T], acc: &mut [T]| {
        {
            let (pw, hw, sw, tw, drh) = (
                RowsMut::new(&mut *dpre, kh),
                RowsMut::new(&mut *dhu, 2 * h),
                RowsMut::new(&mut *dsc, h),
                RowsMut::new(&mut *acc, h),
                &*drh,
            );
            rows_par(b, bh, |r| unsafe {
                let rr = r * h..(r + 1) * h;
                paper_gates_grad_row_d(
                    &drh[rr.clone()],
                    &ru[r * 2 * h..(r + 1) * 2 * h],
                    &tm[rr.clone()],
                    &hu[r * 2 * h..(r + 1) * 2 * h],
                    &sc[rr],
                    pw.row(r),
                    hw.row(r),
                    sw.row(r),
                    tw.row(r),
                )
            });
        }
        if let Some(n) = ln_ru.as_mut() {
            n.run(b, 2 * h, dhu);
        }
        u_ru.mul_t_into(b, acc, h, true, Mat::rows(dhu, 2 * h));
    };
    match drop {
        Some((tm, d, dm)) => {
            let dm = &mut dm[..bh];
            dm.fill(T::zero());
            gates(tm, dm);
            crate::kernels::gru::add_dropped_row(dm, &d[..bh], &mut dtp[..bh]);
        }
        None => gates(t, dtp),
    }
}
