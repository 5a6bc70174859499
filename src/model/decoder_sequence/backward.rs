//! The fused decoder op's backward pass: back-propagation through time inside the op, then each weight's
//! gradient as one GEMM over all steps. The steps mirror the forward pass's, last step first: each is a
//! named method of [`Backward`] (what the pass reads) writing into [`Grads`] (the gradients carried from step
//! to step and those gathered for the weights): the readout's share, the cGRU's word GRU, the transition,
//! the gate and mix, the context product, the attention (with coverage), the query products; after the loop,
//! the annotations' gradient and the weights' (attention, coverage, gate, transition).

use candle_core::{Result, Tensor};

use super::gate_mix::{bwd_mix_row_d, MixRows, RowScales};
use super::transition::{paper_transition_backward, vanilla_grad_row_d};
use super::{CgruView, CovData, DecoderSequence, DeepView, Dims, LnData, RecAt, Saved, ZPreOp};
use crate::kernels::coverage::CovRows;
use crate::kernels::gru::GruStep;
use crate::kernels::{rows_par, storage_slice, Mat, Oriented, Real, RowsMut, Shared};

/// What every step of the backward pass reads: the sizes, the forward pass's saved activations, the
/// incoming gradient and the weights as values.
struct Backward<'a, T: Real> {
    op: &'a DecoderSequence,
    dims: Dims,
    sv: &'a Saved<T>,
    /// `∂[t_{i−1} | s_i]` `[B·T, 3H]` and `v`.
    g: &'a [T],
    v: &'a [T],
    tw: Oriented<'a, T>,
    cw: Oriented<'a, T>,
    u_ru: Oriented<'a, T>,
    u: Oriented<'a, T>,
    scales: RowScales<T>,
    cgru: Option<CgruView<'a, T>>,
    /// A deep transition's later GRUs.
    deep: Vec<DeepView<'a, T>>,
    cd: Option<&'a CovData<T>>,
    cr: Option<CovRows<'a, T>>,
    /// The mix's state and word rows.
    mix: MixRows<'a, T>,
    /// Recurrent dropout's masks `[B, H]`.
    drop: Option<Vec<T>>,
    /// Layer normalisation's gains and biases.
    ln: Option<&'a LnData<T>>,
}

/// Layer normalisation's gradients: the query's and the context product's gains and biases, and the
/// recurrent products' gradients before their normalisation (`[n, B, 2H]`, `[n, B, H]`; the weights'
/// gradients read them) of the transition and of each later deep GRU.
struct LnGrads<T> {
    dq_g: Vec<T>,
    dq_b: Vec<T>,
    dc_g: Vec<T>,
    dc_b: Vec<T>,
    rec: (Vec<T>, Vec<T>),
    deep: Vec<(Vec<T>, Vec<T>)>,
    /// The cGRU's word GRU's (rows as its activations).
    word: Option<(Vec<T>, Vec<T>)>,
}

/// What the backward pass writes.
struct Grads<T> {
    /// ∂t_i carried from step i + 1; ∂t_{i−1} as it is formed; ∂(T∘t) (paper form: ∂T); ∂(r∘(T∘t)).
    dt: Vec<T>,
    dt_prev: Vec<T>,
    dts: Vec<T>,
    drts: Vec<T>,
    /// Paper form: ∂t_i through the transition, and the products' ∂ before their scale, per step.
    dtp: Vec<T>,
    dhus: Vec<T>,
    drcs: Vec<T>,
    /// cGRU: the word GRU's ∂pre per step (for its weights' gradients), its ∂t_i, the mix's ∂(word term)
    /// (discarded: the context GRU has none).
    dpw_all: Vec<T>,
    dh_w: Vec<T>,
    dwp_scratch: Vec<T>,
    /// Paper form under recurrent dropout: the products' operand `d∘t` and its gradient, per step.
    tm: Vec<T>,
    dm: Vec<T>,
    /// The word projections' and the gate's word term's gradients (rows as `wp`).
    dwp: Vec<T>,
    dzp: Vec<T>,
    /// Per step: ∂(s [C | C_z]), ∂pre, ∂(t [B | U_z | W_h | w_β]), ∂s_i (time-major).
    dcp: Vec<T>,
    dpre: Vec<T>,
    dq: Vec<T>,
    dctx_all: Vec<T>,
    /// Per sentence: ∂v; gating scalar ∂b_β, static ∂θ.
    dv_rows: Vec<T>,
    db_beta: T,
    dtheta: Vec<T>,
    /// Coverage: ∂C_i carried from step i + 1 and ∂C_{i−1} formed at step i; ∂(1/Φ or h W_c); per-sentence
    /// sums of the coverage weights' gradients.
    dcov: Vec<T>,
    dcov_prev: Vec<T>,
    dpre_cov: Vec<T>,
    dvcov_rows: Vec<T>,
    dp_rows: Vec<T>,
    du_rows: Vec<T>,
    duru_rows: Vec<T>,
    /// A deep transition's later GRUs: each one's input terms' gradient per step (`[nt, B, 3H]`, for its
    /// weights'), and the scratch rows of their steps.
    ddeep: Vec<Vec<T>>,
    dh_deep: Vec<T>,
    drh_deep: Vec<T>,
    /// With layer normalisation.
    ln: Option<LnGrads<T>>,
}

impl DecoderSequence {
    pub(super) fn backward<T: Real>(&self, grad: &Tensor) -> Result<()> {
        let dims = self.dims()?;
        let saved = crate::kernels::take_saved::<Saved<T>>(&self.saved, "fused decoder")?;
        let cgru_v = self.cgru_data::<T>()?;
        let deep_v = self.deep_data::<T>()?;
        let cd = self.cov_data::<T>()?;
        let grad = grad.contiguous()?;
        let (g_st, g_l) = grad.storage_and_layout();
        let (wp_st, wp_l) = self.wp.tensor.storage_and_layout();
        let vec_of = |x: &Shared| crate::kernels::to_vec::<T>(&x.tensor);
        let v = vec_of(&self.v)?;
        let u_ru = match &self.u_ru {
            Some(x) => vec_of(x)?,
            None => vec![],
        };
        let u = vec_of(&self.u)?;
        let ln_v = self.ln.as_ref().map(|l| l.data::<T>()).transpose()?;
        let mut x = Backward::new(
            self,
            dims,
            &saved,
            [
                storage_slice::<T>(&g_st, g_l)?,
                storage_slice::<T>(&wp_st, wp_l)?,
                &v,
                &u_ru,
                &u,
            ],
            cd.as_ref(),
            (cgru_v.as_ref(), &deep_v),
        )?;
        x.ln = ln_v.as_ref();
        let mut d = x.grads()?;
        for i in (0..dims.tl).rev() {
            // The rows the forward pass computed at step i (see `target_rows`). Going back they only grow,
            // and every buffer's rows past them are still zero: a row joins with zero gradients.
            let m = self.active[i];
            if m == 0 {
                continue;
            }
            x.readout(&mut d, i, m);
            if x.cgru.is_some() {
                x.word_gru(&mut d, i);
            }
            // The transition's rows: those of step i + 1 (the cGRU's context GRU: step i's).
            let mt = match (i < x.dims.nt, x.cgru.is_some()) {
                (false, _) => 0,
                (true, true) => m,
                (true, false) => self.active[i + 1],
            };
            if mt > 0 {
                x.deep(&mut d, i, mt);
                x.transition(&mut d, i, mt);
                x.gate(&mut d, i, mt);
                x.context_product(&mut d, i, mt);
            }
            x.attention(&mut d, i, m)?;
            x.query(&mut d, i, m);
        }
        x.annotations(&d);
        // `dt` is ∂t_0 now. Inputs' gradients, and each weight's as one GEMM over all steps.
        let _t = crate::kernels::profile::Scope::new("  decoder bwd: weight gradients");
        x.attention_weights(&d);
        x.coverage_weights(&mut d);
        x.gate_weights(&d);
        x.transition_weights(&d);
        x.deep_weights(&d);
        x.ln_weights(&d);
        let Grads { dt, dwp, dzp, .. } = d;
        self.t0.add_grad(dt);
        self.wp.add_grad(dwp);
        if let Some(wz) = &self.wz {
            wz.add_grad(dzp);
        }
        Ok(())
    }
}

/// A stacked weight's part as a GEMM operand: column block `[from, from + ·)` of the stacked gradient rows
/// `d` of width `width` (no copy of the part).
fn block<T>(d: &[T], width: usize, from: usize) -> Mat<'_, T> {
    Mat {
        data: d.get(from..).unwrap_or(&[]),
        rs: width,
        cs: 1,
    }
}

/// Each row's sum over the rows of `rows` (width `w`).
fn sum_rows<T: Real>(rows: &[T], w: usize) -> Vec<T> {
    let mut out = vec![T::zero(); w];
    for row in rows.chunks(w.max(1)) {
        for (a, &x) in out.iter_mut().zip(row) {
            *a = *a + x;
        }
    }
    out
}

impl<'a, T: Real> Backward<'a, T> {
    /// `[grad, wp, v, u_ru, u]` as values.
    fn new(
        op: &'a DecoderSequence,
        dims: Dims,
        sv: &'a Saved<T>,
        [g, wp, v, u_ru, u]: [&'a [T]; 5],
        cd: Option<&'a CovData<T>>,
        (cgru_v, deep_v): (Option<&'a [Vec<T>; 3]>, &'a [[Vec<T>; 3]]),
    ) -> Result<Self> {
        let Dims { h, k, b, .. } = dims;
        let cgru = cgru_v.map(|v| CgruView::new(v, h));
        let cr = cd.map(|c| c.rows());
        Ok(Backward {
            op,
            dims,
            sv,
            g,
            v,
            tw: Oriented::new(&sv.tw, h, sv.wq),
            cw: Oriented::new(&sv.cw, 2 * h, sv.wc),
            u_ru: Oriented::new(u_ru, h, if dims.gru { 2 * h } else { 0 }),
            u: Oriented::new(u, h, h),
            scales: op.scales::<T>(),
            cd,
            cr,
            mix: MixRows::new(
                (h, k * h),
                op.paper,
                cgru.is_none().then_some((wp, &op.toff[..])),
            ),
            cgru,
            deep: deep_v.iter().map(|v| DeepView::new(v, b, h)).collect(),
            drop: op.drop_data::<T>()?,
            ln: None,
        })
    }

    /// The gradients' buffers, zero.
    fn grads(&self) -> Result<Grads<T>> {
        let Dims {
            tl,
            b,
            h,
            s,
            ad,
            nt,
            kh,
            paper,
            ..
        } = self.dims;
        let (off, bh) = (&self.op.off, b * h);
        let zeroed = crate::kernels::zeroed::<T>;
        let cg = self.cgru.is_some();
        let cn = if cg { self.dims.n } else { 0 };
        // (The projections' rows: see `word_offsets`.)
        let wp_rows = self.op.wp.tensor.dim(0)?;
        let static_z = matches!(self.op.z_pre, Some(ZPreOp::Static { .. }));
        Ok(Grads {
            dt: vec![T::zero(); bh],
            dt_prev: vec![T::zero(); bh],
            dts: vec![T::zero(); bh],
            drts: vec![T::zero(); bh],
            dtp: vec![T::zero(); if paper { bh } else { 0 }],
            dhus: zeroed(if paper && self.dims.gru {
                off[nt] * 2 * h
            } else {
                0
            }),
            drcs: zeroed(if paper { off[nt] * h } else { 0 }),
            dpw_all: zeroed(off[cn] * kh),
            dh_w: vec![T::zero(); if cg { bh } else { 0 }],
            dwp_scratch: vec![T::zero(); if cg { b * kh } else { 0 }],
            tm: vec![T::zero(); if paper && self.drop.is_some() { bh } else { 0 }],
            dm: vec![T::zero(); if paper && self.drop.is_some() { bh } else { 0 }],
            dwp: zeroed(wp_rows * kh),
            dzp: zeroed(if self.dims.gated { wp_rows * h } else { 0 }),
            dcp: zeroed(off[nt] * self.sv.wc),
            dpre: zeroed(off[nt] * kh),
            dq: zeroed(off[tl] * self.sv.wq),
            dctx_all: zeroed(off[tl] * self.dims.a2),
            dv_rows: vec![T::zero(); b * ad],
            db_beta: T::zero(),
            dtheta: vec![T::zero(); if static_z { h } else { 0 }],
            dcov: vec![T::zero(); self.dims.bsd],
            dcov_prev: vec![T::zero(); self.dims.bsd],
            dpre_cov: vec![T::zero(); b * s * self.dims.pw],
            dvcov_rows: vec![T::zero(); b * self.dims.cdim * ad],
            dp_rows: vec![T::zero(); b * self.dims.kd],
            du_rows: vec![T::zero(); b * self.dims.uw],
            duru_rows: vec![T::zero(); b * self.dims.uruw],
            ddeep: (0..self.deep.len())
                .map(|_| zeroed(off[nt] * 3 * h))
                .collect(),
            dh_deep: vec![T::zero(); if self.deep.is_empty() { 0 } else { bh }],
            drh_deep: vec![T::zero(); if self.deep.is_empty() { 0 } else { bh }],
            ln: self.ln.map(|_| {
                let dp = || (zeroed(off[nt] * 2 * h), zeroed(off[nt] * h));
                LnGrads {
                    dq_g: vec![T::zero(); ad],
                    dq_b: vec![T::zero(); ad],
                    dc_g: vec![T::zero(); kh],
                    dc_b: vec![T::zero(); kh],
                    rec: dp(),
                    deep: (0..self.deep.len()).map(|_| dp()).collect(),
                    word: cg.then(|| (zeroed(off[cn] * 2 * h), zeroed(off[cn] * h))),
                }
            }),
        })
    }

    /// The readout's gradients for `[t_{i−1} | s_i]` of step `i`'s `m` rows (padded rows' are not read):
    /// into `dt_prev` and step `i`'s `∂s_i`.
    fn readout(&self, d: &mut Grads<T>, i: usize, m: usize) {
        let Dims { h, h3, a2, tl, .. } = self.dims;
        let (o, o1) = (self.op.off[i], self.op.off[i + 1]);
        let dctx = &mut d.dctx_all[o * a2..o1 * a2];
        for r in 0..m {
            let gr = &self.g[(r * tl + i) * h3..(r * tl + i + 1) * h3];
            d.dt_prev[r * h..(r + 1) * h].copy_from_slice(&gr[..h]);
            dctx[r * a2..(r + 1) * a2].copy_from_slice(&gr[h..]);
        }
    }

    /// cGRU: the readout's gradient is t_i's (the context GRU's state); before the last step the word GRU
    /// t'_{i+1} = GRU_word(e(y_i), t_i) adds its share, from ∂t'_{i+1} in `dt`. Leaves ∂t_i (the context
    /// GRU's output gradient) in `dt`; ∂t'_i collects in `dt_prev` from here.
    fn word_gru(&self, d: &mut Grads<T>, i: usize) {
        let Dims { h, kh, n, .. } = self.dims;
        let (off, toff) = (&self.op.off, &self.op.toff);
        let g = self.cgru.as_ref().expect("the cGRU's step");
        let o = off[i];
        let sv = self.sv;
        // (The word GRU's rows: those of step i + 1.)
        let m1 = if i < n { self.op.active[i + 1] } else { 0 };
        if m1 > 0 {
            let m1h = m1 * h;
            let dpw_i = &mut d.dpw_all[o * kh..o * kh + m1 * kh];
            d.dh_w.fill(T::zero());
            let rl = self.ln.map(|l| l.rec_ln(RecAt::Word));
            let step = GruStep {
                h,
                ru: &sv.wru[o * 2 * h..o * 2 * h + 2 * m1h],
                ht: &sv.wht[o * h..o * h + m1h],
                hp: &sv.sall[o * h..o * h + m1h],
                mask: None,
                drop: self.drop.as_ref().map(|d| &d[..m1h]),
                ln: match (&rl, sv.ln.as_ref().and_then(|l| l.word.as_ref())) {
                    (Some(r), Some(st)) => Some(st.saved(o, m1, h, r)),
                    _ => None,
                },
            };
            let dp = d.ln.as_mut().and_then(|l| l.word.as_mut()).map(|(a, c)| {
                (
                    &mut a[o * 2 * h..(o + m1) * 2 * h],
                    &mut c[o * h..(o + m1) * h],
                )
            });
            crate::kernels::profile::timed("  decoder bwd: word GRU step", || {
                step.backward(
                    &d.dt[..m1h],
                    &mut d.dh_w[..m1h],
                    dpw_i,
                    &mut d.drts[..m1h],
                    &g.u,
                    &g.u_ru,
                    dp,
                )
            });
            for (a, &x) in d.dt_prev.iter_mut().zip(&d.dh_w) {
                *a = *a + x;
            }
            for r in 0..m1 {
                d.dwp[(toff[r] + i) * kh..(toff[r] + i + 1) * kh]
                    .copy_from_slice(&dpw_i[r * kh..(r + 1) * kh]);
            }
        }
        d.dt.copy_from_slice(&d.dt_prev);
        d.dt_prev.fill(T::zero());
    }

    /// What the transition of step `i` wrote, before a deep transition's later GRUs: `t_{i+1}` (the cGRU's
    /// `t_i`) at step `i`'s rows, or their first one's input state.
    fn transition_output(&self, i: usize) -> &'a [T] {
        let (h, off, sv) = (self.dims.h, &self.op.off, self.sv);
        let (o, o1) = (off[i], off[i + 1]);
        if let Some([hp, ..]) = sv.deep.first() {
            &hp[o * h..o1 * h]
        } else if self.cgru.is_some() {
            &sv.sall[o * h..o1 * h]
        } else {
            &sv.tall[o1 * h..off[i + 2] * h]
        }
    }

    /// Back through a deep transition's later GRUs of step `i`'s `mt` rows, last first: `dt` holds ∂ of their
    /// output on entry and ∂ of the transition's output on exit; each one's input terms' gradient is kept.
    fn deep(&self, d: &mut Grads<T>, i: usize, mt: usize) {
        if self.deep.is_empty() {
            return;
        }
        let h = self.dims.h;
        let o = self.op.off[i];
        let mth = mt * h;
        let Grads {
            dt,
            ddeep,
            dh_deep,
            drh_deep,
            ln: ln_g,
            ..
        } = d;
        for (k, ((g, [hp, ru, _, ht]), dx)) in self
            .deep
            .iter()
            .zip(&self.sv.deep)
            .zip(ddeep.iter_mut())
            .enumerate()
            .rev()
        {
            dh_deep[..mth].fill(T::zero());
            let rl = self.ln.map(|l| l.rec_ln(RecAt::Deep(k)));
            let stats = self.sv.ln.as_ref().map(|l| &l.deep[k]);
            let step = GruStep {
                h,
                ru: &ru[o * 2 * h..o * 2 * h + 2 * mth],
                ht: &ht[o * h..o * h + mth],
                hp: &hp[o * h..o * h + mth],
                mask: None,
                drop: self.drop.as_ref().map(|d| &d[..mth]),
                ln: match (&rl, stats) {
                    (Some(r), Some(st)) => Some(st.saved(o, mt, h, r)),
                    _ => None,
                },
            };
            let dp = ln_g.as_mut().map(|l| {
                let (a, c) = &mut l.deep[k];
                (
                    &mut a[o * 2 * h..(o + mt) * 2 * h],
                    &mut c[o * h..(o + mt) * h],
                )
            });
            crate::kernels::profile::timed("  decoder bwd: deep transition", || {
                step.backward(
                    &dt[..mth],
                    &mut dh_deep[..mth],
                    &mut dx[o * 3 * h..o * 3 * h + 3 * mth],
                    &mut drh_deep[..mth],
                    &g.u,
                    &g.u_ru,
                    dp,
                )
            });
            dt[..mth].copy_from_slice(&dh_deep[..mth]);
        }
    }

    /// A deep transition's later GRUs' weights: `b` from every step's input terms' gradient, `U_ru` from
    /// the input state (`d∘t` under recurrent dropout), `U` from `r∘(d∘t)`, each one GEMM over all steps.
    fn deep_weights(&self, d: &Grads<T>) {
        let h = self.dims.h;
        let nb = self.op.off[self.dims.nt];
        let weight_grad = crate::kernels::product::<T>;
        for (k, ((g, [hp, _, rh, _]), dx)) in self
            .op
            .deep
            .iter()
            .zip(&self.sv.deep)
            .zip(&d.ddeep)
            .enumerate()
        {
            g.b.add_grad(sum_rows(dx, 3 * h));
            // (With layer normalisation the products' gradients are those before it.)
            let (dru, dc) = match &d.ln {
                Some(l) => (
                    Mat::rows(&l.deep[k].0[..], 2 * h),
                    Mat::rows(&l.deep[k].1[..], h),
                ),
                None => (block(dx, 3 * h, 0), block(dx, 3 * h, 2 * h)),
            };
            g.u_ru.add_grad(weight_grad(
                h,
                2 * h,
                nb,
                Mat::t(&self.dropped(hp, self.dims.nt), h),
                dru,
            ));
            g.u.add_grad(weight_grad(h, h, nb, Mat::t(rh, h), dc));
            if let (Some(lo), Some(ls)) = (&self.op.ln, &self.sv.ln) {
                for (p, gr) in lo.deep[k].iter().zip(ls.deep[k].param_grads(dx, h)) {
                    p.add_grad(gr);
                }
            }
        }
    }

    /// Back through the transition of step `i`'s `mt` rows from ∂t_{i+1} in `dt`: the pre-activations'
    /// gradient `dpre`, and `dts` = ∂(T∘t) (paper form: ∂T, with ∂t_i through the transition in `dtp`).
    fn transition(&self, d: &mut Grads<T>, i: usize, mt: usize) {
        let Dims { h, kh, .. } = self.dims;
        let off = &self.op.off;
        let (o, o1) = (off[i], off[i + 1]);
        let sv = self.sv;
        let mth = mt * h;
        let t_i = &sv.tall[o * h..o1 * h];
        let (u, u_ru) = (&self.u, &self.u_ru);
        let Grads {
            dt,
            dts,
            dtp,
            drts,
            dpre,
            dhus,
            drcs,
            tm,
            dm,
            ln: ln_g,
            ..
        } = d;
        let dpre_i = &mut dpre[o * kh..o1 * kh];
        if self.dims.paper {
            // `dts` becomes ∂T (the scale), `dtp` ∂t_i through the transition. (Recurrent dropout: the
            // products read d∘t_i, formed again here.)
            let drop = self.drop.as_ref().map(|dmask| {
                crate::kernels::gru::dropped_state(&t_i[..mth], &dmask[..mth], &mut tm[..mth]);
                (&tm[..mth], &dmask[..mth], &mut dm[..mth])
            });
            let gru_acts = self.dims.gru.then(|| {
                (
                    &sv.ru[o * 2 * h..o1 * 2 * h],
                    &sv.c[o * h..o1 * h],
                    &sv.hus[o * 2 * h..o1 * 2 * h],
                    &mut dhus[o * 2 * h..o1 * 2 * h],
                )
            });
            crate::kernels::profile::timed("  decoder bwd: GRU step", || {
                paper_transition_backward(
                    (mt, h),
                    dt,
                    (t_i, self.transition_output(i)),
                    (&sv.rcs[o * h..o1 * h], &sv.ts[o * h..o1 * h]),
                    (u, u_ru),
                    gru_acts,
                    (dpre_i, &mut drcs[o * h..o1 * h]),
                    (dts, dtp, drts),
                    drop,
                )
            });
        } else if self.dims.gru {
            let (ru_i, ts_i, cc_i) = (
                &sv.ru[o * 2 * h..o1 * 2 * h],
                &sv.ts[o * h..o1 * h],
                &sv.c[o * h..o1 * h],
            );
            // The GRU step from the scaled state T∘t: `dts` becomes ∂(T∘t).
            dts.fill(T::zero());
            let rl = self.ln.map(|l| l.rec_ln(RecAt::Transition));
            let step = GruStep {
                h,
                ru: &ru_i[..2 * mth],
                ht: &cc_i[..mth],
                hp: &ts_i[..mth],
                mask: None,
                drop: self.drop.as_ref().map(|d| &d[..mth]),
                ln: match (&rl, &sv.ln) {
                    (Some(r), Some(st)) => Some(st.rec.saved(o, mt, h, r)),
                    _ => None,
                },
            };
            let dp = ln_g.as_mut().map(|l| {
                let (a, c) = &mut l.rec;
                (
                    &mut a[o * 2 * h..(o + mt) * 2 * h],
                    &mut c[o * h..(o + mt) * h],
                )
            });
            crate::kernels::profile::timed("  decoder bwd: GRU step", || {
                step.backward(
                    &dt[..mth],
                    &mut dts[..mth],
                    &mut dpre_i[..mt * kh],
                    &mut drts[..mth],
                    u,
                    u_ru,
                    dp,
                )
            });
        } else {
            // The vanilla unit t_{i+1} = tanh(pre + U (T∘t)): ∂pre, then ∂(T∘t) = ∂pre Uᵀ.
            let t_next = self.transition_output(i);
            crate::kernels::profile::timed("  decoder bwd: GRU step", || {
                {
                    let (dt, dw) = (&*dt, RowsMut::new(dpre_i, h));
                    rows_par(mt, mth, |r| unsafe {
                        vanilla_grad_row_d(
                            &dt[r * h..(r + 1) * h],
                            &t_next[r * h..(r + 1) * h],
                            dw.row(r),
                        )
                    });
                }
                u.mul_t_into(mt, dts, h, false, Mat::rows(dpre_i, h));
                if let Some(dm) = &self.drop {
                    // U read d∘(T∘t): ∂(T∘t) through the mask.
                    crate::kernels::gru::undrop_grad(&mut dts[..mth], &dm[..mth]);
                }
            });
        }
    }

    /// Back through the gate and the mix of step `i`'s `mt` rows: ∂(word term) into `dwp`, ∂(context
    /// products) into `dcp`, ∂z into `dzp`, ∂t_{i−1} through T∘t added to `dt_prev` (via `dt`, free now), and
    /// ∂ of the gate's pre-activation next to ∂(C s) and ∂(B t) for the stacked products.
    fn gate(&self, d: &mut Grads<T>, i: usize, mt: usize) {
        let Dims {
            h,
            ad,
            kh,
            gated,
            paper,
            ..
        } = self.dims;
        let (wc, wq) = (self.sv.wc, self.sv.wq);
        let (off, toff) = (&self.op.off, &self.op.toff);
        let (o, o1) = (off[i], off[i + 1]);
        let sv = self.sv;
        let t_i = &sv.tall[o * h..o1 * h];
        let Grads {
            dt,
            dt_prev,
            dts,
            dtp,
            dpre,
            dwp,
            dwp_scratch,
            dcp,
            dzp,
            dq,
            db_beta,
            dtheta,
            ..
        } = d;
        let dcp_i = &mut dcp[o * wc..o1 * wc];
        {
            let cg = self.cgru.is_some();
            let (dww, dcw, dtw, dzw) = (
                RowsMut::new(if cg { dwp_scratch } else { dwp }, kh),
                RowsMut::new(dcp_i, wc),
                RowsMut::new(dt, h),
                RowsMut::new(dzp, if gated { h } else { 0 }),
            );
            let (dpre_i, dts) = (&dpre[o * kh..o1 * kh], &*dts);
            let cp_i = &sv.cp[o * wc..o1 * wc];
            let z_i = if gated {
                &sv.z[o * h..o1 * h]
            } else {
                &sv.z[..]
            };
            let (mix, scales) = (&self.mix, self.scales);
            let _t = crate::kernels::profile::Scope::new("  decoder bwd: gate rows");
            rows_par(mt, mt * kh, |r| unsafe {
                bwd_mix_row_d(
                    &dpre_i[r * kh..(r + 1) * kh],
                    &dts[r * h..(r + 1) * h],
                    // (Paper form: the scale's ∂ into the gate; ∂t is the transition's.)
                    mix.state(t_i, r),
                    mix.word(i, r),
                    &cp_i[r * wc..r * wc + kh],
                    if gated { &z_i[r * h..(r + 1) * h] } else { z_i },
                    scales,
                    gated,
                    dww.row(if cg { r } else { toff[r] + i }),
                    &mut dcw.row(r)[..kh],
                    dtw.row(r),
                    dzw.row(toff[r] + i),
                )
            });
        }
        if paper {
            dt.copy_from_slice(dtp);
        }
        for (a, x) in dt_prev.iter_mut().zip(dt.iter()) {
            *a = *a + *x;
        }
        if !gated {
            return;
        }
        for r in 0..mt {
            let g = &dzp[(toff[r] + i) * h..(toff[r] + i + 1) * h];
            match &self.op.z_pre {
                // β's pre-activation is every element's: its gradient is the row's sum.
                Some(ZPreOp::Scalar { .. }) => {
                    let s = g.iter().fold(T::zero(), |a, &x| a + x);
                    dq[(o + r) * wq + self.dims.wb_off] = s;
                    *db_beta = *db_beta + s;
                }
                Some(ZPreOp::Static { .. }) => {
                    for (a, &x) in dtheta.iter_mut().zip(g) {
                        *a = *a + x;
                    }
                }
                None => {}
            }
            if self.dims.has_cz {
                dcp_i[r * wc + kh..(r + 1) * wc].copy_from_slice(g);
            }
            if self.dims.has_uz {
                dq[(o + r) * wq + ad..(o + r) * wq + ad + h].copy_from_slice(g);
            }
        }
    }

    /// ∂s_i of step `i`'s `mt` transition rows from ∂(s [C | C_z]), added to the readout's.
    fn context_product(&self, d: &mut Grads<T>, i: usize, mt: usize) {
        let Dims { a2, .. } = self.dims;
        let wc = self.sv.wc;
        let (o, o1) = (self.op.off[i], self.op.off[i + 1]);
        let dctx = &mut d.dctx_all[o * a2..o1 * a2];
        let dcp_i = &mut d.dcp[o * wc..o1 * wc];
        if let (Some(l), Some(ls), Some(lg)) = (self.ln, &self.sv.ln, d.ln.as_mut()) {
            // Back through the normalisation of s C (the rows' first 3H values), in place.
            let (h, kh) = (self.dims.h, self.dims.kh);
            crate::kernels::layer_norm::ln_rows_backward(
                (mt, kh, wc),
                dcp_i,
                &l.context[0],
                &[2 * h, h],
                &ls.xc[o * kh..(o + mt) * kh],
                &ls.rsc[o * 2..(o + mt) * 2],
                &mut lg.dc_g,
                &mut lg.dc_b,
            );
        }
        let dcp_i = &*dcp_i;
        crate::kernels::profile::timed("  decoder bwd: context GEMM", || {
            self.cw.mul_t_into(mt, dctx, a2, true, Mat::rows(dcp_i, wc))
        });
    }

    /// Attention backward over step `i`'s `m` rows: ∂s_i → ∂e → ∂(A h), ∂(B t), ∂v (∂h from all steps after
    /// the loop); with coverage, back through C_i's update: ∂C_{i−1}, ∂(1/Φ or h W_c), ∂V_cov and the
    /// per-sentence weight gradients.
    fn attention(&self, d: &mut Grads<T>, i: usize, m: usize) -> Result<()> {
        let Dims {
            s,
            ad,
            b,
            a2,
            w_ac,
            n,
            bsd,
            cdim,
            pw,
            kd,
            aw,
            wh_off,
            ..
        } = self.dims;
        let wq = self.sv.wq;
        let (off, koff, lens) = (&self.op.off, &self.op.koff, &self.op.src_lens);
        let (o, o1) = (off[i], off[i + 1]);
        let sv = self.sv;
        let actx_i = &sv.actx[o * w_ac..o1 * w_ac];
        let q_i = &sv.q[o * wq..o1 * wq];
        let dqw = RowsMut::new(&mut d.dq[o * wq..o1 * wq], wq);
        let dvw = RowsMut::new(&mut d.dv_rows, ad);
        let dctx = &d.dctx_all[o * a2..o1 * a2];
        let v = self.v;
        // Coverage: each row's ∂C_{i−1}, ∂(1/Φ or h W_c) and per-sentence weight gradients.
        let c_i = &sv.covs[i * bsd..(i + 1) * bsd];
        let c_next = if i < n {
            &sv.covs[(i + 1) * bsd..(i + 2) * bsd]
        } else {
            &[]
        };
        let acts_i = if i < n {
            &sv.cacts[i * b * s * aw..(i + 1) * b * s * aw]
        } else {
            &[]
        };
        let dcov = &d.dcov;
        let dcw = RowsMut::new(&mut d.dcov_prev, s * cdim);
        let dprew = RowsMut::new(&mut d.dpre_cov, s * pw);
        let dvcw = RowsMut::new(&mut d.dvcov_rows, cdim * ad);
        let dpw = RowsMut::new(&mut d.dp_rows, kd);
        let duw = RowsMut::new(&mut d.du_rows, self.dims.uw);
        let duruw = RowsMut::new(&mut d.duru_rows, self.dims.uruw);
        let (cr, cd) = (&self.cr, &self.cd);
        let _t = crate::kernels::profile::Scope::new("  decoder bwd: attention rows");
        self.op.ah.with_slice::<T, _>(|ah| {
            self.op.ann.with_slice::<T, _>(|ann| {
                self.op.ah.accumulate::<T>(|d_ah| {
                    let dahw = RowsMut::new(d_ah, ad);
                    rows_par(m, m * s * ad, |r| unsafe {
                        // The scores of the sentence's own positions (α is 0 on padding).
                        let sr = lens[r];
                        let mut de = vec![T::zero(); s];
                        let alpha = &actx_i[r * w_ac..r * w_ac + s];
                        crate::kernels::attention::context_score_grad_row_d(
                            &alpha[..sr],
                            &ann[r * s * a2..(r * s + sr) * a2],
                            &dctx[r * a2..(r + 1) * a2],
                            &mut de[..sr],
                        );
                        let dq_row = dqw.row(r);
                        let ah_r = &ah[koff[r] * ad..(koff[r] + sr) * ad];
                        let q_r = &q_i[r * wq..r * wq + ad];
                        let (Some(cr), Some(cd)) = (cr, cd) else {
                            let dq_r = &mut dq_row[..ad];
                            dq_r.fill(T::zero());
                            crate::kernels::attention::score_grad_rows_d(
                                ah_r,
                                q_r,
                                v,
                                &de[..sr],
                                dahw.rows(koff[r], sr),
                                dq_r,
                                dvw.row(r),
                                true,
                            );
                            return;
                        };
                        let sc = s * cdim;
                        let c_r = &c_i[r * sc..(r + 1) * sc];
                        let dc_r = dcw.row(r);
                        if i < n {
                            // Back through C_i's update: ∂C_{i−1}, and ∂α_i joins the softmax's.
                            let mut dalpha = vec![T::zero(); s];
                            cr.update_grad(
                                (
                                    c_r,
                                    alpha,
                                    &cd.pre[r * s * pw..(r + 1) * s * pw],
                                    &c_next[r * sc..(r + 1) * sc],
                                    &acts_i[r * s * aw..(r + 1) * s * aw],
                                ),
                                &dcov[r * sc..(r + 1) * sc],
                                dc_r,
                                &mut dalpha,
                                dprew.row(r),
                                &mut dq_row[wh_off..wh_off + kd],
                                (dpw.row(r), duw.row(r), duruw.row(r)),
                            );
                            let total = alpha
                                .iter()
                                .zip(&dalpha)
                                .fold(T::zero(), |t, (&a, &x)| t + a * x);
                            for ((g, &a), &x) in de.iter_mut().zip(alpha).zip(&dalpha) {
                                *g = *g + a * (x - total);
                            }
                        } else {
                            dc_r.fill(T::zero());
                        }
                        // The scores with the coverage term: ∂(A h), ∂(B t), ∂v, ∂C_{i−1}, ∂V_cov.
                        let dq_r = &mut dq_row[..ad];
                        dq_r.fill(T::zero());
                        crate::kernels::coverage::scores_grad_row(
                            ah_r,
                            &c_r[..sr * cdim],
                            &cd.v_cov,
                            q_r,
                            v,
                            &de[..sr],
                            dahw.rows(koff[r], sr),
                            dq_r,
                            dvw.row(r),
                            &mut dc_r[..sr * cdim],
                            dvcw.row(r),
                        );
                    });
                });
                Ok(())
            })
        })?;
        std::mem::swap(&mut d.dcov, &mut d.dcov_prev);
        Ok(())
    }

    /// ∂t_{i−1} of step `i`'s `m` rows from the query products' gradients `∂(t [B | U_z | …])`, added to
    /// `dt_prev`, which becomes the `dt` of the step before.
    fn query(&self, d: &mut Grads<T>, i: usize, m: usize) {
        let Dims { h, .. } = self.dims;
        let wq = self.sv.wq;
        let (o, o1) = (self.op.off[i], self.op.off[i + 1]);
        let dq_i = &mut d.dq[o * wq..o1 * wq];
        if let (Some(l), Some(ls), Some(lg)) = (self.ln, &self.sv.ln, d.ln.as_mut()) {
            // Back through the normalisation of B t (the rows' first Ad values), in place.
            let ad = self.dims.ad;
            crate::kernels::layer_norm::ln_rows_backward(
                (m, ad, wq),
                dq_i,
                &l.query[0],
                &[ad],
                &ls.xq[o * ad..o1 * ad],
                &ls.rsq[o..o1],
                &mut lg.dq_g,
                &mut lg.dq_b,
            );
        }
        let dq_i = &*dq_i;
        crate::kernels::profile::timed("  decoder bwd: query GEMM", || {
            self.tw
                .mul_t_into(m, &mut d.dt_prev, h, true, Mat::rows(dq_i, wq))
        });
        std::mem::swap(&mut d.dt, &mut d.dt_prev);
    }

    /// The annotations' gradient from every step's context, per sentence: ∂h_r += α_rᵀ ∂S_r with α_r
    /// `[L, S]` and ∂S_r `[L, 2H]` over the sentence's `L` steps, gathered from the time-major rows.
    fn annotations(&self, d: &Grads<T>) {
        let Dims { s, a2, w_ac, .. } = self.dims;
        let _t = crate::kernels::profile::Scope::new("  decoder bwd: annotation gradients");
        let (active, off, lens) = (&self.op.active, &self.op.off, &self.op.src_lens);
        let (actx, dctx_all) = (&self.sv.actx, &d.dctx_all);
        self.op.ann.accumulate::<T>(|d_ann| {
            use rayon::prelude::*;
            d_ann.par_chunks_mut(s * a2).enumerate().for_each(|(r, d)| {
                let steps = active.iter().take_while(|&&m| m > r).count();
                // (α is 0 on the padded positions: their rows get nothing.)
                let sr = lens[r];
                let mut alpha = Vec::with_capacity(steps * s);
                let mut dctx = Vec::with_capacity(steps * a2);
                for &o in &off[..steps] {
                    let x = o + r;
                    alpha.extend_from_slice(&actx[x * w_ac..x * w_ac + s]);
                    dctx.extend_from_slice(&dctx_all[x * a2..(x + 1) * a2]);
                }
                crate::kernels::serial(|| {
                    crate::kernels::gemm_into(
                        sr,
                        a2,
                        steps,
                        &mut d[..sr * a2],
                        a2,
                        true,
                        Mat::t(&alpha, s),
                        Mat::rows(&dctx, a2),
                    )
                })
            });
        });
    }

    /// The attention's weights: `v` (summed over the sentences) and `B` (one GEMM over all steps).
    fn attention_weights(&self, d: &Grads<T>) {
        let Dims { tl, h, ad, .. } = self.dims;
        self.op.v.add_grad(sum_rows(&d.dv_rows, ad));
        self.op.b_att.add_grad(crate::kernels::product::<T>(
            h,
            ad,
            self.op.off[tl],
            Mat::t(&self.sv.tall, h),
            block(&d.dq, self.sv.wq, 0),
        ));
    }

    /// The coverage model's weights: `V_cov`, the pre-computed term (through `σ` for the fertility), `P`,
    /// `U`, `U_ru` (summed over the sentences) and `W_h` (one GEMM over all steps).
    fn coverage_weights(&self, d: &mut Grads<T>) {
        let (Some(c), Some(cd)) = (&self.op.cov, self.cd) else {
            return;
        };
        let Dims { tl, h, ad, .. } = self.dims;
        c.v_cov
            .add_grad(sum_rows(&d.dvcov_rows, self.dims.cdim * ad));
        let mut dpre_cov = std::mem::take(&mut d.dpre_cov);
        if let Some(nf) = c.fertility {
            // ∂(1/(N σ(x)))/∂x = −(1 − σ)/(N σ).
            let nf = T::from_f64c(nf);
            for (g, &x) in dpre_cov.iter_mut().zip(&cd.pre_in) {
                let sg = x.sigmoid_v();
                *g = -*g * (T::one() - sg) / (nf * sg);
            }
        }
        c.pre.add_grad(dpre_cov);
        if let Some(p) = &c.p {
            p.add_grad(sum_rows(&d.dp_rows, self.dims.kd));
        }
        if let Some(u) = &c.u {
            u.add_grad(sum_rows(&d.du_rows, self.dims.uw));
        }
        if let Some(u_ru) = &c.u_ru {
            u_ru.add_grad(sum_rows(&d.duru_rows, self.dims.uruw));
        }
        if let Some(w_h) = &c.w_h {
            w_h.add_grad(crate::kernels::product::<T>(
                h,
                self.dims.kd,
                self.op.off[tl],
                Mat::t(&self.sv.tall, h),
                block(&d.dq, self.sv.wq, self.dims.wh_off),
            ));
        }
    }

    /// The gate's weights: `U_z` from the state, `C_z` from the context (one GEMM each over all steps),
    /// the gating scalar's `w_β`, `b_β`, the static interpolation's `θ`.
    fn gate_weights(&self, d: &Grads<T>) {
        let Dims { tl, h, ad, kh, .. } = self.dims;
        let (wq, wc) = (self.sv.wq, self.sv.wc);
        let rows_t = self.op.off[tl];
        let tall = Mat::t(&self.sv.tall, h);
        match &self.op.z_pre {
            Some(ZPreOp::Scalar { w, b: bias }) => {
                w.add_grad(crate::kernels::product::<T>(
                    h,
                    1,
                    rows_t,
                    tall,
                    block(&d.dq, wq, self.dims.wb_off),
                ));
                bias.add_grad(vec![d.db_beta]);
            }
            Some(ZPreOp::Static { theta }) => theta.add_grad(d.dtheta.clone()),
            None => {}
        }
        if let Some(uz) = &self.op.u_z {
            uz.add_grad(crate::kernels::product::<T>(
                h,
                h,
                rows_t,
                tall,
                block(&d.dq, wq, ad),
            ));
        }
        if let Some(cz) = &self.op.c_z {
            cz.add_grad(crate::kernels::product::<T>(
                self.dims.a2,
                h,
                self.op.off[self.dims.nt],
                self.context_rows(),
                block(&d.dcp, wc, kh),
            ));
        }
    }

    /// Every transition step's context `s_i`, transposed, as a GEMM operand (read from the `[α | s]` rows).
    fn context_rows(&self) -> Mat<'_, T> {
        Mat {
            data: &self.sv.actx[self.dims.s..],
            rs: 1,
            cs: self.dims.w_ac,
        }
    }

    /// The transition's weights, one GEMM each over all steps: `C` from the context, `U_ru` and `U` from the
    /// (scaled) state; the cGRU's context GRU's bias and its word GRU's `U_ru`, `U`.
    /// A time-major buffer of states (step `i`'s rows at `off[i]`) as the recurrent products read it in
    /// its first `steps` steps: itself, or, under recurrent dropout, each step's row `r` times mask row `r`.
    fn dropped<'b>(&self, x: &'b [T], steps: usize) -> std::borrow::Cow<'b, [T]> {
        let Some(dm) = &self.drop else {
            return std::borrow::Cow::Borrowed(x);
        };
        let (h, off) = (self.dims.h, &self.op.off);
        let mut out = crate::kernels::zeroed(off[steps] * h);
        for i in 0..steps {
            let (o, o1) = (off[i], off[i + 1]);
            crate::kernels::gru::dropped_state(
                &x[o * h..o1 * h],
                &dm[..(o1 - o) * h],
                &mut out[o * h..o1 * h],
            );
        }
        std::borrow::Cow::Owned(out)
    }

    fn transition_weights(&self, d: &Grads<T>) {
        let h = self.dims.h;
        let Dims { kh, gru, .. } = self.dims;
        let wc = self.sv.wc;
        let sv = self.sv;
        let nb = self.op.off[self.dims.nt];
        let weight_grad = crate::kernels::product::<T>;
        self.op.c.add_grad(weight_grad(
            self.dims.a2,
            kh,
            nb,
            self.context_rows(),
            block(&d.dcp, wc, 0),
        ));
        if let Some(gs) = &self.op.cgru {
            // The context GRU's bias (its candidate's context term), the word GRU's U_ru from t_i and U
            // from r∘t_i.
            // (With layer normalisation the bias comes after it: its gradient is β's, `dcp` holds the
            // gradient before the normalisation now, and the word GRU's products' gradients are those before
            // theirs.)
            let db = match &d.ln {
                Some(l) => l.dc_b[2 * h..3 * h].to_vec(),
                None => {
                    let mut db = vec![T::zero(); h];
                    for row in d.dcp.chunks_exact(wc) {
                        for (a, &x) in db.iter_mut().zip(&row[2 * h..3 * h]) {
                            *a = *a + x;
                        }
                    }
                    db
                }
            };
            gs.b.add_grad(db);
            let (dru, dc) = match d.ln.as_ref().and_then(|l| l.word.as_ref()) {
                Some((a, c)) => (Mat::rows(&a[..], 2 * h), Mat::rows(&c[..], h)),
                None => (block(&d.dpw_all, kh, 0), block(&d.dpw_all, kh, 2 * h)),
            };
            let nw = self.op.off[self.dims.n];
            gs.u_ru.add_grad(weight_grad(
                h,
                2 * h,
                nw,
                Mat::t(&self.dropped(&sv.sall, self.dims.n), h),
                dru,
            ));
            gs.u.add_grad(weight_grad(h, h, nw, Mat::t(&sv.wrh, h), dc));
        }
        if self.dims.paper {
            // The products' own gradients: U_ru from t, U from r∘t (GRU) or t (vanilla) (under recurrent
            // dropout d∘t, and `rts` holds r∘d∘t).
            let tm = self.dropped(&sv.tall, self.dims.nt);
            if let Some(u_ru) = &self.op.u_ru {
                u_ru.add_grad(weight_grad(
                    h,
                    2 * h,
                    nb,
                    Mat::t(&tm, h),
                    Mat::rows(&d.dhus, 2 * h),
                ));
            }
            self.op.u.add_grad(weight_grad(
                h,
                h,
                nb,
                Mat::t(if gru { &sv.rts } else { &tm }, h),
                Mat::rows(&d.drcs, h),
            ));
            return;
        }
        // The products' operand T∘t, or d∘(T∘t) under recurrent dropout.
        let ts = self.dropped(&sv.ts, self.dims.nt);
        let ts = &ts[..];
        // (With layer normalisation the products' gradients are those before it.)
        let (dru, dc) = match &d.ln {
            Some(l) => (Mat::rows(&l.rec.0[..], 2 * h), Mat::rows(&l.rec.1[..], h)),
            None => (
                Mat::rows(&d.dpre[..], kh),
                block(&d.dpre, kh, if gru { 2 * h } else { 0 }),
            ),
        };
        if let Some(u_ru) = &self.op.u_ru {
            u_ru.add_grad(weight_grad(h, 2 * h, nb, Mat::t(ts, h), dru));
        }
        // U multiplies r∘(T∘t) (GRU; `rts` holds r∘d∘(T∘t) under dropout) or T∘t (vanilla). (Empty when the
        // sentences are one step long: no transition.)
        self.op.u.add_grad(weight_grad(
            h,
            h,
            nb,
            Mat::t(if gru { &sv.rts } else { ts }, h),
            dc,
        ));
    }

    /// Layer normalisation's gains and biases: the query's, the context product's (gathered over the steps)
    /// and the transition's recurrent products' (from the pre-activations' gradients).
    fn ln_weights(&self, d: &Grads<T>) {
        let (Some(lo), Some(ls), Some(lg)) = (&self.op.ln, &self.sv.ln, &d.ln) else {
            return;
        };
        lo.query[0].add_grad(lg.dq_g.clone());
        lo.query[1].add_grad(lg.dq_b.clone());
        lo.context[0].add_grad(lg.dc_g.clone());
        lo.context[1].add_grad(lg.dc_b.clone());
        for (p, g) in lo.rec.iter().zip(ls.rec.param_grads(&d.dpre, self.dims.h)) {
            p.add_grad(g);
        }
        if let (Some(lw), Some(sw)) = (&lo.word, &ls.word) {
            // The word GRU's rows: `dpw_all` holds its pre-activations' gradients.
            for (p, g) in lw.iter().zip(sw.param_grads(&d.dpw_all, self.dims.h)) {
                p.add_grad(g);
            }
        }
    }
}
