//! The fused decoder op's backward pass: back-propagation through time inside the op, then each weight's
//! gradient as one GEMM over all steps.

use candle_core::{Result, Tensor};

use super::gate_mix::bwd_mix_row_d;
use super::transition::{paper_transition_backward, vanilla_grad_row_d};
use super::{CgruView, DecoderSequence, Dims, Saved, ZPreOp};
use crate::gru::GruStep;
use crate::kernels::{rows_par, storage_slice, Mat, Oriented, Real, RowsMut, Shared};

impl DecoderSequence {
    pub(super) fn backward<T: Real>(&self, grad: &Tensor) -> Result<()> {
        let Dims { tl, b, h, k, s, ad } = self.dims()?;
        let (a2, h3, kh, w_ac) = (2 * h, 3 * h, k * h, s + 2 * h);
        let gru = k == 3;
        let n = tl - 1;
        let gated = self.gate.is_some();
        let Saved {
            tall,
            q,
            actx,
            z,
            ts,
            cp,
            ru,
            rts,
            c: cc,
            tw: tw_v,
            wq,
            cw: cw_v,
            wc,
            covs,
            cacts,
            hus,
            rcs,
            sall,
            wru,
            wrh,
            wht,
        } = crate::kernels::take_saved::<Saved<T>>(&self.saved, "fused decoder")?;
        let cgru_v = self.cgru_data::<T>()?;
        let cgru = cgru_v.as_ref().map(|v| CgruView::new(v, h));
        let nt = if cgru.is_some() { tl } else { n };
        let paper = self.paper;
        let ones = vec![T::one(); if paper { h } else { 0 }];
        // Paper form: ∂ of the products before their scale, per step (for the weights' gradients), and ∂t_i
        // through the transition.
        let off = &self.off;
        let mut dhus = crate::kernels::zeroed(if paper && gru { off[nt] * 2 * h } else { 0 });
        let mut drcs = crate::kernels::zeroed(if paper { off[nt] * h } else { 0 });
        // cGRU: the word GRU's ∂pre per step (for its weights' gradients), its ∂t_i, the mix's ∂(word term)
        // (discarded: the context GRU has none) and the zero word term.
        let cn = if cgru.is_some() { n } else { 0 };
        let mut dpw_all = crate::kernels::zeroed(off[cn] * kh);
        let mut dh_w = vec![T::zero(); if cgru.is_some() { b * h } else { 0 }];
        let mut dwp_scratch = vec![T::zero(); if cgru.is_some() { b * kh } else { 0 }];
        let wp_zero = vec![T::zero(); if cgru.is_some() { kh } else { 0 }];
        let mut dtp = vec![T::zero(); if paper { b * h } else { 0 }];
        let grad = grad.contiguous()?;
        let (g_st, g_l) = grad.storage_and_layout();
        let g = storage_slice::<T>(&g_st, g_l)?; // [B·T, 3H]
        let vec_of = |x: &Shared| crate::kernels::to_vec::<T>(&x.tensor);
        let (wp_st, wp_l) = self.wp.tensor.storage_and_layout();
        let wp = storage_slice::<T>(&wp_st, wp_l)?;
        let v = vec_of(&self.v)?;
        let u_ru_v = match &self.u_ru {
            Some(x) => vec_of(x)?,
            None => vec![],
        };
        let u_v = vec_of(&self.u)?;
        let tw = Oriented::new(&tw_v, h, wq);
        let cw = Oriented::new(&cw_v, a2, wc);
        let u_ru = Oriented::new(&u_ru_v, h, if gru { 2 * h } else { 0 });
        let u = Oriented::new(&u_v, h, h);
        let (has_uz, has_cz) = (self.u_z.is_some(), self.c_z.is_some());
        let scales = self.scales::<T>();
        let bh = b * h;
        let cd = self.cov_data::<T>()?;
        let cr = cd.as_ref().map(|c| c.rows());
        let (cdim, pw, kd, aw) = cr.as_ref().map_or((0, 0, 0, 0), |c| {
            (c.d, c.pre_width(), c.kd(), c.acts_width())
        });
        let wh_off = ad + if has_uz { h } else { 0 };
        let wb_off = wh_off + kd;
        let mut db_beta = T::zero();
        let mut dtheta = vec![
            T::zero();
            if matches!(self.z_pre, Some(ZPreOp::Static { .. })) {
                h
            } else {
                0
            }
        ];
        let bsd = b * s * cdim;
        let lens = &self.src_lens;
        // Coverage: ∂C_i carried from step i + 1 and ∂C_{i−1} formed at step i; per-sentence sums of the
        // coverage weights' gradients.
        let mut dcov = vec![T::zero(); bsd];
        let mut dcov_prev = vec![T::zero(); bsd];
        let mut dpre_cov = vec![T::zero(); b * s * pw];
        let mut dvcov_rows = vec![T::zero(); b * cdim * ad];
        let mut dp_rows = vec![T::zero(); b * kd];
        let (uw, uruw) = if cd.as_ref().is_some_and(|c| c.neural) {
            (
                cdim * cdim,
                if cr.as_ref().is_some_and(|c| c.gated) {
                    2 * cdim * cdim
                } else {
                    0
                },
            )
        } else {
            (0, 0)
        };
        let mut du_rows = vec![T::zero(); b * uw];
        let mut duru_rows = vec![T::zero(); b * uruw];

        let (toff, koff) = (&self.toff, &self.koff);
        // (The projections' rows: see `word_offsets`.)
        let wp_rows = self.wp.tensor.dim(0)?;
        let mut dwp = crate::kernels::zeroed(wp_rows * kh);
        let mut dzp = crate::kernels::zeroed(if gated { wp_rows * h } else { 0 });
        let mut dcp = crate::kernels::zeroed(off[nt] * wc);
        let mut dpre = crate::kernels::zeroed(off[nt] * kh);
        let mut dq = crate::kernels::zeroed(off[tl] * wq);
        let mut dv_rows = vec![T::zero(); b * ad];
        let mut dt = vec![T::zero(); bh]; // ∂t_i carried from step i + 1
        let mut dts = vec![T::zero(); bh];
        let mut drts = vec![T::zero(); bh];
        // ∂s_i of every step, time-major: the annotations' gradient is formed from them after the loop.
        let mut dctx_all = crate::kernels::zeroed(off[tl] * a2);
        let mut dt_prev = vec![T::zero(); bh];
        for i in (0..tl).rev() {
            // The rows the forward pass computed at step i (see `target_rows`). Going back they only grow,
            // and every buffer's rows past them are still zero: a row joins with zero gradients.
            let m = self.active[i];
            if m == 0 {
                continue;
            }
            let (o, o1) = (off[i], off[i + 1]);
            let dctx = &mut dctx_all[o * a2..o1 * a2];
            let t_i = &tall[o * h..o1 * h];
            // The readout's gradients for [t_{i−1} | s_i] (padded rows' are not read).
            for r in 0..m {
                let gr = &g[(r * tl + i) * h3..(r * tl + i + 1) * h3];
                dt_prev[r * h..(r + 1) * h].copy_from_slice(&gr[..h]);
                dctx[r * a2..(r + 1) * a2].copy_from_slice(&gr[h..]);
            }
            if let Some(g) = &cgru {
                // cGRU: the readout's gradient is t_i's (the context GRU's state); before the last step
                // the word GRU t'_{i+1} = GRU_word(e(y_i), t_i) adds its share, from ∂t'_{i+1} in `dt`.
                // (The word GRU's rows: those of step i + 1.)
                let m1 = if i < n { self.active[i + 1] } else { 0 };
                if m1 > 0 {
                    let m1h = m1 * h;
                    let dpw_i = &mut dpw_all[o * kh..o * kh + m1 * kh];
                    dh_w.fill(T::zero());
                    let step = GruStep {
                        h,
                        ru: &wru[o * 2 * h..o * 2 * h + 2 * m1h],
                        ht: &wht[o * h..o * h + m1h],
                        hp: &sall[o * h..o * h + m1h],
                        mask: None,
                    };
                    crate::profile::timed("  decoder bwd: word GRU step", || {
                        step.backward(
                            &dt[..m1h],
                            &mut dh_w[..m1h],
                            dpw_i,
                            &mut drts[..m1h],
                            &g.u,
                            &g.u_ru,
                        )
                    });
                    for (a, &x) in dt_prev.iter_mut().zip(&dh_w) {
                        *a = *a + x;
                    }
                    for r in 0..m1 {
                        dwp[(toff[r] + i) * kh..(toff[r] + i + 1) * kh]
                            .copy_from_slice(&dpw_i[r * kh..(r + 1) * kh]);
                    }
                }
                // ∂t_i is the context GRU's output gradient; ∂t'_i collects in `dt_prev` below.
                dt.copy_from_slice(&dt_prev);
                dt_prev.fill(T::zero());
            }
            // The transition's rows: those of step i + 1 (the cGRU's context GRU: step i's).
            let mt = match (i < nt, cgru.is_some()) {
                (false, _) => 0,
                (true, true) => m,
                (true, false) => self.active[i + 1],
            };
            let mth = mt * h;
            if mt > 0 {
                let dpre_i = &mut dpre[o * kh..o1 * kh];
                if paper {
                    // `dts` becomes ∂T (the scale), `dtp` ∂t_i through the transition.
                    let gru_acts = gru.then(|| {
                        (
                            &ru[o * 2 * h..o1 * 2 * h],
                            &cc[o * h..o1 * h],
                            &hus[o * 2 * h..o1 * 2 * h],
                            &mut dhus[o * 2 * h..o1 * 2 * h],
                        )
                    });
                    crate::profile::timed("  decoder bwd: GRU step", || {
                        paper_transition_backward(
                            (mt, h),
                            &dt,
                            (
                                t_i,
                                if cgru.is_some() {
                                    &sall[o * h..o1 * h]
                                } else {
                                    &tall[o1 * h..off[i + 2] * h]
                                },
                            ),
                            (&rcs[o * h..o1 * h], &ts[o * h..o1 * h]),
                            (&u, &u_ru),
                            gru_acts,
                            (dpre_i, &mut drcs[o * h..o1 * h]),
                            (&mut dts, &mut dtp, &mut drts),
                        )
                    });
                } else if gru {
                    let (ru_i, ts_i, cc_i) = (
                        &ru[o * 2 * h..o1 * 2 * h],
                        &ts[o * h..o1 * h],
                        &cc[o * h..o1 * h],
                    );
                    // The GRU step from the scaled state T∘t: `dts` becomes ∂(T∘t).
                    dts.fill(T::zero());
                    let step = GruStep {
                        h,
                        ru: &ru_i[..2 * mth],
                        ht: &cc_i[..mth],
                        hp: &ts_i[..mth],
                        mask: None,
                    };
                    crate::profile::timed("  decoder bwd: GRU step", || {
                        step.backward(
                            &dt[..mth],
                            &mut dts[..mth],
                            &mut dpre_i[..mt * kh],
                            &mut drts[..mth],
                            &u,
                            &u_ru,
                        )
                    });
                } else {
                    // The vanilla unit t_{i+1} = tanh(pre + U (T∘t)): ∂pre, then ∂(T∘t) = ∂pre Uᵀ.
                    let t_next = &tall[o1 * h..off[i + 2] * h];
                    crate::profile::timed("  decoder bwd: GRU step", || {
                        {
                            let (dt, dw) = (&dt, RowsMut::new(dpre_i, h));
                            rows_par(mt, mth, |r| unsafe {
                                vanilla_grad_row_d(
                                    &dt[r * h..(r + 1) * h],
                                    &t_next[r * h..(r + 1) * h],
                                    dw.row(r),
                                )
                            });
                        }
                        u.mul_t_into(mt, &mut dts, h, false, Mat::rows(dpre_i, h));
                    });
                }
                // Mix and gate; ∂t_{i−1} through T∘t is written into `dt` (free now).
                let dcp_i = &mut dcp[o * wc..o1 * wc];
                {
                    let cg = cgru.is_some();
                    let (dww, dcw, dtw, dzw) = (
                        RowsMut::new(if cg { &mut dwp_scratch } else { &mut dwp }, kh),
                        RowsMut::new(dcp_i, wc),
                        RowsMut::new(&mut dt, h),
                        RowsMut::new(&mut dzp, if gated { h } else { 0 }),
                    );
                    let (dpre_i, dts) = (&*dpre_i, &dts);
                    let (wp, cp_i) = (&wp, &cp[o * wc..o1 * wc]);
                    let z_i = if gated { &z[o * h..o1 * h] } else { &z[..] };
                    let _t = crate::profile::Scope::new("  decoder bwd: gate rows");
                    rows_par(mt, mt * kh, |r| unsafe {
                        bwd_mix_row_d(
                            &dpre_i[r * kh..(r + 1) * kh],
                            &dts[r * h..(r + 1) * h],
                            // (Paper form: the scale's ∂ into the gate; ∂t is the transition's.)
                            if paper {
                                &ones
                            } else {
                                &t_i[r * h..(r + 1) * h]
                            },
                            if cg {
                                &wp_zero
                            } else {
                                &wp[(toff[r] + i) * kh..(toff[r] + i + 1) * kh]
                            },
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
                    dt.copy_from_slice(&dtp);
                }
                for (a, x) in dt_prev.iter_mut().zip(&dt) {
                    *a = *a + *x;
                }
                // ∂ of the gate's pre-activation next to ∂(C s) and ∂(B t) for the stacked products.
                if gated {
                    for r in 0..mt {
                        let d = &dzp[(toff[r] + i) * h..(toff[r] + i + 1) * h];
                        match &self.z_pre {
                            // β's pre-activation is every element's: its gradient is the row's sum.
                            Some(ZPreOp::Scalar { .. }) => {
                                let g = d.iter().fold(T::zero(), |a, &x| a + x);
                                dq[(o + r) * wq + wb_off] = g;
                                db_beta = db_beta + g;
                            }
                            Some(ZPreOp::Static { .. }) => {
                                for (a, &x) in dtheta.iter_mut().zip(d) {
                                    *a = *a + x;
                                }
                            }
                            None => {}
                        }
                        if has_cz {
                            dcp_i[r * wc + kh..(r + 1) * wc].copy_from_slice(d);
                        }
                        if has_uz {
                            dq[(o + r) * wq + ad..(o + r) * wq + ad + h].copy_from_slice(d);
                        }
                    }
                }
                let dcp_i = &*dcp_i;
                crate::profile::timed("  decoder bwd: context GEMM", || {
                    cw.mul_t_into(mt, dctx, a2, true, Mat::rows(dcp_i, wc))
                });
            }
            // Attention backward: ∂s_i → ∂e → ∂(A h), ∂(B t), ∂v (∂h from all steps after the loop).
            let actx_i = &actx[o * w_ac..o1 * w_ac];
            let q_i = &q[o * wq..o1 * wq];
            let dq_i = &mut dq[o * wq..o1 * wq];
            {
                let dqw = RowsMut::new(dq_i, wq);
                let dvw = RowsMut::new(&mut dv_rows, ad);
                let dctx = &*dctx;
                let v = &v;
                // Coverage: each row's ∂C_{i−1}, ∂(1/Φ or h W_c) and per-sentence weight gradients.
                let c_i = &covs[i * bsd..(i + 1) * bsd];
                let c_next = if i < n {
                    &covs[(i + 1) * bsd..(i + 2) * bsd]
                } else {
                    &[]
                };
                let acts_i = if i < n {
                    &cacts[i * b * s * aw..(i + 1) * b * s * aw]
                } else {
                    &[]
                };
                let dcov = &dcov;
                let dcw = RowsMut::new(&mut dcov_prev, s * cdim);
                let dprew = RowsMut::new(&mut dpre_cov, s * pw);
                let dvcw = RowsMut::new(&mut dvcov_rows, cdim * ad);
                let dpw = RowsMut::new(&mut dp_rows, kd);
                let duw = RowsMut::new(&mut du_rows, uw);
                let duruw = RowsMut::new(&mut duru_rows, uruw);
                let (cr, cd) = (&cr, &cd);
                let _t = crate::profile::Scope::new("  decoder bwd: attention rows");
                self.ah.with_slice::<T, _>(|ah| {
                    self.ann.with_slice::<T, _>(|ann| {
                        self.ah.accumulate::<T>(|d_ah| {
                            let dahw = RowsMut::new(d_ah, ad);
                            rows_par(m, m * s * ad, |r| unsafe {
                                // The scores of the sentence's own positions (α is 0 on padding).
                                let sr = lens[r];
                                let mut de = vec![T::zero(); s];
                                let alpha = &actx_i[r * w_ac..r * w_ac + s];
                                crate::attention::context_score_grad_row_d(
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
                                    crate::attention::score_grad_rows_d(
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
                                crate::coverage::scores_grad_row(
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
            }
            std::mem::swap(&mut dcov, &mut dcov_prev);
            let dq_i = &*dq_i;
            crate::profile::timed("  decoder bwd: query GEMM", || {
                tw.mul_t_into(m, &mut dt_prev, h, true, Mat::rows(dq_i, wq))
            });
            std::mem::swap(&mut dt, &mut dt_prev);
        }
        // The annotations' gradient from every step's context, per sentence: ∂h_r += α_rᵀ ∂S_r with α_r
        // `[L, S]` and ∂S_r `[L, 2H]` over the sentence's `L` steps, gathered from the time-major rows.
        {
            let _t = crate::profile::Scope::new("  decoder bwd: annotation gradients");
            let active = &self.active;
            self.ann.accumulate::<T>(|d_ann| {
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
        // `dt` is ∂t_0 now. Inputs' gradients, and each weight's as one GEMM over all steps.
        let _t = crate::profile::Scope::new("  decoder bwd: weight gradients");
        self.t0.add_grad(dt);
        self.wp.add_grad(dwp);
        if let Some(wz) = &self.wz {
            wz.add_grad(dzp);
        }
        let mut dv = vec![T::zero(); ad];
        for row in dv_rows.chunks(ad) {
            for (a, x) in dv.iter_mut().zip(row) {
                *a = *a + *x;
            }
        }
        self.v.add_grad(dv);
        if let Some(c) = &self.cov {
            let sum_rows = |rows: &[T], w: usize| -> Vec<T> {
                let mut out = vec![T::zero(); w];
                for row in rows.chunks(w.max(1)) {
                    for (a, &x) in out.iter_mut().zip(row) {
                        *a = *a + x;
                    }
                }
                out
            };
            c.v_cov.add_grad(sum_rows(&dvcov_rows, cdim * ad));
            if let (Some(nf), Some(cd)) = (c.fertility, &cd) {
                // ∂(1/(N σ(x)))/∂x = −(1 − σ)/(N σ).
                let nf = T::from_f64c(nf);
                for (g, &x) in dpre_cov.iter_mut().zip(&cd.pre_in) {
                    let sg = x.sigmoid_v();
                    *g = -*g * (T::one() - sg) / (nf * sg);
                }
            }
            c.pre.add_grad(dpre_cov);
            if let Some(p) = &c.p {
                p.add_grad(sum_rows(&dp_rows, kd));
            }
            if let Some(u) = &c.u {
                u.add_grad(sum_rows(&du_rows, uw));
            }
            if let Some(u_ru) = &c.u_ru {
                u_ru.add_grad(sum_rows(&duru_rows, uruw));
            }
            if let Some(w_h) = &c.w_h {
                w_h.add_grad(crate::kernels::product::<T>(
                    h,
                    kd,
                    off[tl],
                    Mat::t(&tall, h),
                    Mat {
                        data: dq.get(wh_off..).unwrap_or(&[]),
                        rs: wq,
                        cs: 1,
                    },
                ));
            }
        }
        match &self.z_pre {
            Some(ZPreOp::Scalar { w, b: bias }) => {
                w.add_grad(crate::kernels::product::<T>(
                    h,
                    1,
                    off[tl],
                    Mat::t(&tall, h),
                    Mat {
                        data: dq.get(wb_off..).unwrap_or(&[]),
                        rs: wq,
                        cs: 1,
                    },
                ));
                bias.add_grad(vec![db_beta]);
            }
            Some(ZPreOp::Static { theta }) => theta.add_grad(dtheta),
            None => {}
        }
        let nb = off[nt];
        let ctx_t = Mat {
            data: &actx[s..],
            rs: 1,
            cs: w_ac,
        };
        let weight_grad = crate::kernels::product::<T>;
        // A stacked weight's parts as GEMMs over column blocks `[from, from + cols)` of the stacked
        // gradient rows `d` (no copies of the parts).
        fn block<T>(d: &[T], width: usize, from: usize) -> Mat<'_, T> {
            Mat {
                data: d.get(from..).unwrap_or(&[]),
                rs: width,
                cs: 1,
            }
        }
        let rows_t = off[tl];
        self.b_att.add_grad(weight_grad(
            h,
            ad,
            rows_t,
            Mat::t(&tall, h),
            block(&dq, wq, 0),
        ));
        if let Some(uz) = &self.u_z {
            uz.add_grad(weight_grad(
                h,
                h,
                rows_t,
                Mat::t(&tall, h),
                block(&dq, wq, ad),
            ));
        }
        self.c
            .add_grad(weight_grad(a2, kh, nb, ctx_t, block(&dcp, wc, 0)));
        if let Some(cz) = &self.c_z {
            cz.add_grad(weight_grad(a2, h, nb, ctx_t, block(&dcp, wc, kh)));
        }
        if let Some(gs) = &self.cgru {
            // The context GRU's bias (its candidate's context term), the word GRU's U_ru from t_i and U
            // from r∘t_i.
            let mut db = vec![T::zero(); h];
            for row in dcp.chunks_exact(wc) {
                for (a, &x) in db.iter_mut().zip(&row[2 * h..3 * h]) {
                    *a = *a + x;
                }
            }
            gs.b.add_grad(db);
            let nw = off[n];
            gs.u_ru.add_grad(weight_grad(
                h,
                2 * h,
                nw,
                Mat::t(&sall, h),
                block(&dpw_all, kh, 0),
            ));
            gs.u.add_grad(weight_grad(
                h,
                h,
                nw,
                Mat::t(&wrh, h),
                block(&dpw_all, kh, 2 * h),
            ));
        }
        if paper {
            // The products' own gradients: U_ru from t, U from r∘t (GRU) or t (vanilla).
            if let Some(u_ru) = &self.u_ru {
                u_ru.add_grad(weight_grad(
                    h,
                    2 * h,
                    nb,
                    Mat::t(&tall, h),
                    Mat::rows(&dhus, 2 * h),
                ));
            }
            self.u.add_grad(weight_grad(
                h,
                h,
                nb,
                Mat::t(if gru { &rts } else { &tall }, h),
                Mat::rows(&drcs, h),
            ));
            return Ok(());
        }
        if let Some(u_ru) = &self.u_ru {
            u_ru.add_grad(weight_grad(
                h,
                2 * h,
                nb,
                Mat::t(&ts, h),
                Mat::rows(&dpre, kh),
            ));
        }
        // U multiplies r∘(T∘t) (GRU) or T∘t (vanilla).
        self.u.add_grad(weight_grad(
            h,
            h,
            nb,
            Mat::t(if gru { &rts } else { &ts }, h),
            Mat {
                // (Empty when the sentences are one step long: no transition.)
                data: dpre.get(if gru { 2 * h } else { 0 }..).unwrap_or(&[]),
                rs: kh,
                cs: 1,
            },
        ));
        Ok(())
    }
}
