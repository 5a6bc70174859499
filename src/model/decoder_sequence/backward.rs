//! The fused decoder op's backward pass: back-propagation through time inside the op, then each weight's
//! gradient as one GEMM over all steps. The steps mirror the forward pass's, last step first: each is a
//! named method of [`Backward`] (what the pass reads) writing into [`Grads`] (the gradients carried from step
//! to step and those gathered for the weights): the readout's share, the cGRU's word GRU, the transition,
//! the gate and mix, the context product, the attention (with coverage), the query products; after the loop,
//! the annotations' gradient and the weights' (attention, coverage, gate, transition).

use candle_core::{Result, Tensor};

use super::gate_mix::{bwd_mix_row_d, MixRows, RowScales};
use super::transition::{paper_transition_backward, vanilla_grad_row_d, NormBwd, RecNorms};
use super::{CgruView, CovData, DecoderSequence, DeepView, Dims, LnData, RecAt, Saved, ZPreOp};
use crate::config::AlignmentCost;
use crate::kernels::coverage::CovRows;
use crate::kernels::gru::GruStep;
use crate::kernels::{rows_par, storage_slice, Mat, Oriented, Real, RowsMut, Shared};

mod weights;

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
    /// Guided alignment: the targets `[B, T, S]`, the cost, and `∂loss · weight / B` (see
    /// [`super::Targets::guidance`]).
    guide: Option<(Vec<T>, AlignmentCost, T)>,
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
    /// The vanilla unit and the paper form: the transition's recurrent normalisations' `∂g`, `∂β`, gathered
    /// over the steps (in the order of [`super::LnWeights::rec`]).
    rec_gb: Vec<Vec<T>>,
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
            *a += x;
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
            guide: match &op.guidance {
                Some(g) => {
                    let grad = g.cell.lock().expect("guided alignment cell").grad;
                    Some((
                        crate::kernels::to_vec(&g.targets)?,
                        g.cost,
                        T::from_f64c(grad * g.scale),
                    ))
                }
                None => None,
            },
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
            ln: self.ln.map(|l| {
                let dp = || (zeroed(off[nt] * 2 * h), zeroed(off[nt] * h));
                LnGrads {
                    rec_gb: l.rec.iter().map(|x| vec![T::zero(); x.len()]).collect(),
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
                *a += x;
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
            let norms = ln_g.as_mut().map(|l| self.rec_norms(&mut l.rec_gb, o, mt));
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
                    norms,
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
            // The vanilla unit t_{i+1} = tanh(pre + U (T∘t)): ∂pre, then ∂(T∘t) = ∂pre Uᵀ. (With layer
            // normalisation the product's gradient, before it, is formed in the store the weight's gradient
            // reads.)
            let t_next = self.transition_output(i);
            let norms = ln_g
                .as_mut()
                .map(|l| (&mut l.rec.1[o * h..(o + mt) * h], &mut l.rec_gb));
            let norms = norms.map(|(d, gb)| (d, self.rec_norms(gb, o, mt)));
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
                let dprod: &[T] = match norms {
                    Some((dc, mut n)) => {
                        dc.copy_from_slice(&dpre_i[..mth]);
                        n.c.run(mt, h, dc);
                        dc
                    }
                    None => dpre_i,
                };
                u.mul_t_into(mt, dts, h, false, Mat::rows(dprod, h));
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
            *a += *x;
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
                    *db_beta += s;
                }
                Some(ZPreOp::Static { .. }) => {
                    for (a, &x) in dtheta.iter_mut().zip(g) {
                        *a += x;
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
            // Back through the normalisation of s C (the rows' first kH values), in place.
            let (kh, blocks) = (self.dims.kh, self.dims.ctx_blocks());
            let nb = blocks.len();
            crate::kernels::layer_norm::ln_rows_backward(
                (mt, kh, wc),
                dcp_i,
                &l.context[0],
                &blocks,
                &ls.xc[o * kh..(o + mt) * kh],
                &ls.rsc[o * nb..(o + mt) * nb],
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
        let (guide, tl) = (&self.guide, self.dims.tl);
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
                        if let Some((a, cost, g)) = guide {
                            // Guided alignment's cost of this row, through the softmax.
                            let row = (r * tl + i) * s;
                            crate::kernels::guided_alignment::cost_grad_row(
                                &alpha[..sr],
                                &a[row..row + sr],
                                *cost,
                                *g,
                                &mut de[..sr],
                            );
                        }
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
                                *g += a * (x - total);
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

    /// Back through the normalisations of the transition's recurrent products for the vanilla unit and the
    /// paper form, over rows `o..o + mt` of the saved statistics; their gains' and biases' gradients gather in
    /// `gb`. (Called with layer normalisation only.)
    fn rec_norms<'s>(
        &'s self,
        gb: &'s mut [Vec<T>],
        o: usize,
        mt: usize,
    ) -> RecNorms<NormBwd<'s, T>> {
        let (l, st) = match (self.ln, self.sv.ln.as_ref()) {
            (Some(l), Some(ls)) => (l, &ls.rec),
            _ => unreachable!("layer normalisation's statistics"),
        };
        let h = self.dims.h;
        let n = l.rec.len();
        let (ru, c) = gb.split_at_mut(n - 2);
        let [dg_c, db_c] = c else {
            unreachable!("a gain and a bias")
        };
        RecNorms {
            ru: match ru {
                [dg, db] => Some(NormBwd {
                    g: &l.rec[0],
                    xh: &st.xh_ru[o * 2 * h..(o + mt) * 2 * h],
                    rs: &st.rs_ru[o..o + mt],
                    dg,
                    db,
                }),
                _ => None,
            },
            c: NormBwd {
                g: &l.rec[n - 2],
                xh: &st.xh_c[o * h..(o + mt) * h],
                rs: &st.rs_c[o..o + mt],
                dg: dg_c,
                db: db_c,
            },
        }
    }
}
