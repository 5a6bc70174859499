//! The fused decoder op's forward pass: the steps in order, one GEMM per recurrent product.

use candle_core::{CpuStorage, Result, Shape};

use super::gate_mix::gate_mix_row_d;
use super::transition::{paper_transition, vanilla_row_d};
use super::{CgruView, DecoderSequence, Dims, Saved, ZConst};
use crate::gru::{gru_step_forward, GruActs};
use crate::kernels::{rows_par, storage_slice, Mat, Oriented, Real, RowsMut};

impl DecoderSequence {
    pub(super) fn forward<T: Real>(&self) -> Result<(CpuStorage, Shape)> {
        let Dims { tl, b, h, k, s, ad } = self.dims()?;
        // `h3`: the output rows `[t_{i−1} | s_i]`; `kh`: the transition's `k` input blocks.
        let (a2, h3, kh, w_ac) = (2 * h, 3 * h, k * h, s + 2 * h);
        let gru = k == 3;
        let n = tl - 1;
        let gated = self.gate.is_some();
        macro_rules! data {
            ($sh:expr) => {{
                let (g, l) = $sh.tensor.storage_and_layout();
                (g, l.clone())
            }};
        }
        let (g_wp, l_wp) = data!(self.wp);
        let wp = storage_slice::<T>(&g_wp, &l_wp)?;
        let (g_t0, l_t0) = data!(self.t0);
        let (g_ah, l_ah) = data!(self.ah);
        let ah = storage_slice::<T>(&g_ah, &l_ah)?;
        let (g_ann, l_ann) = data!(self.ann);
        let ann = storage_slice::<T>(&g_ann, &l_ann)?;
        // The products that share a left operand run as one GEMM: t [B | U_z], s [C | C_z].
        let (tw_v, wq, cw_v, wc) = self.stacked::<T>()?;
        let tw = Oriented::new(&tw_v, h, wq);
        let cw = Oriented::new(&cw_v, a2, wc);
        let (g_v, l_v) = data!(self.v);
        let v = storage_slice::<T>(&g_v, &l_v)?;
        let u_ru_v: Vec<T> = match &self.u_ru {
            Some(x) => crate::kernels::to_vec(&x.tensor)?,
            None => vec![],
        };
        let u_ru = Oriented::new(&u_ru_v, h, if gru { 2 * h } else { 0 });
        let (g_u, l_u) = data!(self.u);
        let u = Oriented::new(storage_slice::<T>(&g_u, &l_u)?, h, h);
        let wz_g = self.wz.as_ref().map(|x| data!(x));
        let wz = match &wz_g {
            Some((g, l)) => Some(storage_slice::<T>(g, l)?),
            None => None,
        };
        let (has_uz, has_cz) = (self.u_z.is_some(), self.c_z.is_some());
        let mask: Vec<T> = crate::kernels::to_vec(&self.mask)?;
        let lens = &self.src_lens;
        let scales = self.scales::<T>();
        let cd = self.cov_data::<T>()?;
        let cr = cd.as_ref().map(|c| c.rows());
        let (cdim, pw, kd, aw) = cr.as_ref().map_or((0, 0, 0, 0), |c| {
            (c.d, c.pre_width(), c.kd(), c.acts_width())
        });
        let wh_off = ad + if has_uz { h } else { 0 };
        let wb_off = wh_off + kd;
        let zc = self.z_const::<T>()?;
        let cgru_v = self.cgru_data::<T>()?;
        let cgru = cgru_v.as_ref().map(|v| CgruView::new(v, h));
        let bsd = b * s * cdim;
        // Step i's rows in the time-major buffers: `off[i]..off[i + 1]` (see `step_offsets`).
        let (off, toff, koff) = (&self.off, &self.toff, &self.koff);
        let mut covs = crate::kernels::zeroed(tl * bsd);
        let mut cacts = crate::kernels::zeroed(n * b * s * aw);

        let mut tall = crate::kernels::zeroed(off[tl] * h);
        tall[..b * h].copy_from_slice(storage_slice::<T>(&g_t0, &l_t0)?);
        let mut q = crate::kernels::zeroed(off[tl] * wq);
        let mut actx = crate::kernels::zeroed(off[tl] * w_ac);
        // Steps with a (gated) transition: all but the last, or all of them for the cGRU's context GRU.
        let nt = if cgru.is_some() { tl } else { n };
        let mut z = crate::kernels::zeroed(if gated { off[nt] * h } else { 0 });
        let mut ts = crate::kernels::zeroed(off[nt] * h);
        let mut cp = crate::kernels::zeroed(off[nt] * wc);
        // GRU activations (none for the vanilla unit, whose activation is the next state itself).
        let gn = if gru { nt } else { 0 };
        let paper = self.paper;
        let ones = vec![T::one(); if paper { h } else { 0 }];
        let mut hus = crate::kernels::zeroed(if paper { off[gn] * 2 * h } else { 0 });
        let mut rcs = crate::kernels::zeroed(if paper { off[nt] * h } else { 0 });
        // cGRU: the context GRU's states, the word GRU's activations and its step's inputs; the context GRU
        // has no word term (a zero row in the mix).
        let cn = if cgru.is_some() { n } else { 0 };
        let mut sall = crate::kernels::zeroed(if cgru.is_some() { off[tl] * h } else { 0 });
        let mut wru = crate::kernels::zeroed(off[cn] * 2 * h);
        let mut wrh = crate::kernels::zeroed(off[cn] * h);
        let mut wht = crate::kernels::zeroed(off[cn] * h);
        let mut pre_w = vec![T::zero(); if cgru.is_some() { b * kh } else { 0 }];
        let wp_zero = vec![T::zero(); if cgru.is_some() { kh } else { 0 }];
        let mut ru = crate::kernels::zeroed(off[gn] * 2 * h);
        let mut rts = crate::kernels::zeroed(off[gn] * h);
        let mut cc = crate::kernels::zeroed(off[gn] * h);
        let mut pre = vec![T::zero(); b * kh];
        let mut hu = vec![T::zero(); b * 2 * h];
        let mut rc = vec![T::zero(); b * h];
        for i in 0..tl {
            // The rows with a word at step i (see `target_rows`); the rest are padding from here on.
            let m = self.active[i];
            if m == 0 {
                break;
            }
            let mh = m * h;
            let (o, o1) = (off[i], off[i + 1]);
            if let (Some(g), true) = (&cgru, i > 0) {
                // cGRU: the word GRU t'_i = GRU_word(e(y_{i−1}), t_{i−1}).
                let op = off[i - 1];
                for r in 0..m {
                    pre_w[r * kh..(r + 1) * kh]
                        .copy_from_slice(&wp[(toff[r] + i - 1) * kh..(toff[r] + i) * kh]);
                }
                let state = &mut tall[o * h..o * h + mh];
                state.copy_from_slice(&sall[op * h..op * h + mh]);
                let acts = GruActs {
                    ru: &mut wru[op * 2 * h..op * 2 * h + 2 * mh],
                    rh: &mut wrh[op * h..op * h + mh],
                    ht: &mut wht[op * h..op * h + mh],
                };
                crate::profile::timed("  decoder fwd: word GRU step", || {
                    gru_step_forward(
                        h,
                        &pre_w[..m * kh],
                        state,
                        None,
                        acts,
                        (&mut hu[..2 * mh], &mut rc[..mh]),
                        &g.u_ru,
                        &g.u,
                    )
                });
            }
            // Attention from t_{i−1} (cGRU: t'_i).
            let (t_done, t_rest) = tall.split_at_mut(o1 * h);
            let t_i = &t_done[o * h..];
            let q_i = &mut q[o * wq..o1 * wq];
            crate::profile::timed("  decoder fwd: query GEMM", || {
                tw.mul_into(m, q_i, wq, false, Mat::rows(t_i, h))
            });
            let actx_i = &mut actx[o * w_ac..o1 * w_ac];
            {
                let out = RowsMut::new(actx_i, w_ac);
                let q_i = &*q_i;
                let mask = &mask;
                // Coverage: C_{i−1} read, C_i (and the gated update's activations) written by each row.
                let (c_done, c_rest) = covs.split_at_mut((i + 1) * bsd);
                let c_i = &c_done[i * bsd..];
                let c_next =
                    RowsMut::new(if i < n { &mut c_rest[..bsd] } else { &mut [] }, s * cdim);
                let acts_i = RowsMut::new(
                    if i < n {
                        &mut cacts[i * b * s * aw..(i + 1) * b * s * aw]
                    } else {
                        &mut []
                    },
                    s * aw,
                );
                let (cr, cd) = (&cr, &cd);
                let _t = crate::profile::Scope::new("  decoder fwd: attention rows");
                rows_par(m, m * s * ad, |r| {
                    // The sentence's own positions (α stays 0 on padding, as the mask makes it).
                    let sr = lens[r];
                    let mut e = vec![T::zero(); sr];
                    let ah_r = &ah[koff[r] * ad..(koff[r] + sr) * ad];
                    let q_r = &q_i[r * wq..(r + 1) * wq];
                    match cd {
                        Some(cd) => crate::coverage::scores_row(
                            ah_r,
                            &c_i[r * s * cdim..(r * s + sr) * cdim],
                            &cd.v_cov,
                            &q_r[..ad],
                            v,
                            &mut e,
                        ),
                        None => crate::attention::score_rows_d(ah_r, &q_r[..ad], v, &mut e),
                    }
                    for (x, m) in e.iter_mut().zip(&mask[r * s..(r + 1) * s]) {
                        *x = *x + *m;
                    }
                    // SAFETY: row r of each buffer is written by this task only.
                    let o = unsafe { out.row(r) };
                    let (al, cx) = o.split_at_mut(s);
                    crate::attention::softmax_context_parts_d(
                        &e,
                        &ann[r * s * a2..(r * s + sr) * a2],
                        &mut al[..sr],
                        cx,
                    );
                    if let (Some(cr), Some(cd), true) = (cr, cd, i < n) {
                        cr.update(
                            &c_i[r * s * cdim..(r + 1) * s * cdim],
                            &o[..s],
                            &cd.pre[r * s * pw..(r + 1) * s * pw],
                            &q_r[wh_off..wh_off + kd],
                            unsafe { c_next.row(r) },
                            unsafe { acts_i.row(r) },
                        );
                    }
                });
            }
            if i == nt {
                break;
            }
            // The rows the transition covers: those of the next step (the cGRU's context GRU: this step's).
            let mt = if cgru.is_some() {
                m
            } else {
                self.active[i + 1]
            };
            if mt == 0 {
                continue;
            }
            let mth = mt * h;
            let ctx_i = Mat {
                data: &actx_i[s..],
                rs: w_ac,
                cs: 1,
            };
            let cp_i = &mut cp[o * wc..o1 * wc];
            crate::profile::timed("  decoder fwd: context GEMM", || {
                cw.mul_into(mt, cp_i, wc, false, ctx_i)
            });
            if let Some(g) = &cgru {
                // The context GRU's candidate bias, with the context's term.
                for row in cp_i[..mt * wc].chunks_exact_mut(wc) {
                    for (x, &bb) in row[2 * h..3 * h].iter_mut().zip(g.b.iter()) {
                        *x = *x + bb;
                    }
                }
            }
            let (z_i, ts_i) = (
                if gated {
                    &mut z[o * h..o1 * h]
                } else {
                    &mut z[..]
                },
                &mut ts[o * h..o1 * h],
            );
            {
                let (zw, tsw, prew) = (
                    RowsMut::new(z_i, if gated { h } else { 0 }),
                    RowsMut::new(ts_i, h),
                    RowsMut::new(&mut pre, kh),
                );
                let (wz, q_i, cp_i) = (wz, &q[o * wq..o1 * wq], &*cp_i);
                let _t = crate::profile::Scope::new("  decoder fwd: gate rows");
                let zc = &zc;
                rows_par(mt, mt * kh, |r| {
                    // Gating scalar: `w_βᵀ t + b_β` repeated over the row; static: θ.
                    let scalar_term;
                    let zc_term: Option<&[T]> = match zc {
                        ZConst::None => None,
                        ZConst::Static(theta) => Some(theta),
                        ZConst::Scalar(bb) => {
                            scalar_term = vec![q_i[r * wq + wb_off] + *bb; h];
                            Some(&scalar_term)
                        }
                    };
                    let terms = [
                        wz.map(|x| &x[(toff[r] + i) * h..(toff[r] + i + 1) * h])
                            .or(zc_term),
                        has_uz.then(|| &q_i[r * wq + ad..r * wq + ad + h]),
                        has_cz.then(|| &cp_i[r * wc + kh..(r + 1) * wc]),
                    ];
                    // SAFETY: row r of each buffer is written by this task only.
                    unsafe {
                        gate_mix_row_d(
                            terms,
                            // (Paper form: the scale T itself into `ts`.)
                            if paper {
                                &ones
                            } else {
                                &t_i[r * h..(r + 1) * h]
                            },
                            if cgru.is_some() {
                                &wp_zero
                            } else {
                                &wp[(toff[r] + i) * kh..(toff[r] + i + 1) * kh]
                            },
                            &cp_i[r * wc..r * wc + kh],
                            scales,
                            zw.row(r),
                            tsw.row(r),
                            prew.row(r),
                        )
                    }
                });
            }
            let ts_i = &*ts_i;
            let t_next = if cgru.is_some() {
                &mut sall[o * h..o1 * h]
            } else {
                &mut t_rest[..mth]
            };
            if paper {
                // t_i from the unscaled state; the products scaled by T (= ts_i) after them.
                let gru_acts = gru.then(|| {
                    (
                        &mut hus[o * 2 * h..o1 * 2 * h],
                        &mut ru[o * 2 * h..o1 * 2 * h],
                        &mut rts[o * h..o1 * h],
                        &mut cc[o * h..o1 * h],
                    )
                });
                crate::profile::timed("  decoder fwd: GRU step", || {
                    paper_transition(
                        (mt, h),
                        (&pre, &t_done[o * h..], ts_i),
                        (&u, &u_ru),
                        gru_acts,
                        &mut rcs[o * h..o1 * h],
                        t_next,
                    )
                });
                continue;
            }
            if !gru {
                // The vanilla unit: t_i = tanh(pre + U (T∘t)).
                crate::profile::timed("  decoder fwd: GRU step", || {
                    u.mul_into(mt, t_next, h, false, Mat::rows(ts_i, h));
                    let pre = &pre;
                    let tw = RowsMut::new(t_next, h);
                    rows_par(mt, mth, |r| unsafe {
                        vanilla_row_d(&pre[r * h..(r + 1) * h], tw.row(r))
                    });
                });
                continue;
            }
            // The GRU step from the scaled state T∘t: t_i = T∘t + u∘(t~ − T∘t).
            let t_next = &mut t_next[..mth];
            t_next.copy_from_slice(&ts_i[..mth]);
            let acts = GruActs {
                ru: &mut ru[o * 2 * h..o * 2 * h + 2 * mth],
                rh: &mut rts[o * h..o * h + mth],
                ht: &mut cc[o * h..o * h + mth],
            };
            crate::profile::timed("  decoder fwd: GRU step", || {
                gru_step_forward(
                    h,
                    &pre[..mt * kh],
                    t_next,
                    None,
                    acts,
                    (&mut hu[..2 * mth], &mut rc[..mth]),
                    &u_ru,
                    &u,
                )
            });
        }
        // The readout's input, batch-major: [t_{i−1} | s_i] (cGRU: [t_i | s_i]).
        let mut out = crate::kernels::zeroed(b * tl * h3);
        {
            use rayon::prelude::*;
            let states = if cgru.is_some() { &sall } else { &tall };
            let (off, active) = (&self.off, &self.active);
            out.par_chunks_mut(h3).enumerate().for_each(|(row, o)| {
                let (r, i) = (row / tl, row % tl);
                // (A padded position's row stays zero.)
                if r < active[i] {
                    let x = off[i] + r;
                    o[..h].copy_from_slice(&states[x * h..(x + 1) * h]);
                    o[h..].copy_from_slice(&actx[x * w_ac + s..(x + 1) * w_ac]);
                }
            });
        }
        drop((tw, cw));
        *self.saved.lock().expect("saved activations") = Some(Box::new(Saved {
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
        }));
        Ok((T::to_cpu_storage_owned(out), Shape::from((b * tl, h3))))
    }
}
