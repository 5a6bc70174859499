//! The fused decoder op's forward pass: the steps in order, one GEMM per recurrent product. Each step of the
//! recurrence is a named method of [`Forward`] (what the pass reads), writing into [`Acts`] (what it saves
//! for the backward pass): the cGRU's word GRU, the attention (with coverage), the context product, the gate
//! and mix, the transition; after the loop, the readout's input rows.

use candle_core::{CpuStorage, Result, Shape};

use super::gate_mix::{gate_mix_row_d, MixRows, RowScales};
use super::transition::{paper_transition, vanilla_row_d, NormFwd, RecNorms};
use super::{
    CgruView, CovData, DecoderSequence, DeepView, Dims, LnData, LnSaved, RecAt, RecLnStats, Saved,
    ZConst,
};
use crate::kernels::coverage::CovRows;
use crate::kernels::gru::{gru_step_forward, GruActs};
use crate::kernels::{rows_par, storage_slice, Mat, Oriented, Real, RowsMut};

/// What every step of the forward pass reads: the sizes, the op's inputs and its weights as values.
struct Forward<'a, T: Real> {
    op: &'a DecoderSequence,
    dims: Dims,
    wp: &'a [T],
    ah: &'a [T],
    ann: &'a [T],
    v: &'a [T],
    wz: Option<&'a [T]>,
    /// The products that share a left operand run as one GEMM: t [B | U_z], s [C | C_z].
    tw: Oriented<'a, T>,
    wq: usize,
    cw: Oriented<'a, T>,
    wc: usize,
    u_ru: Oriented<'a, T>,
    u: Oriented<'a, T>,
    mask: Vec<T>,
    scales: RowScales<T>,
    zc: ZConst<T>,
    cd: Option<&'a CovData<T>>,
    cr: Option<CovRows<'a, T>>,
    cgru: Option<CgruView<'a, T>>,
    /// A deep transition's later GRUs.
    deep: Vec<DeepView<'a, T>>,
    /// The mix's state and word rows.
    mix: MixRows<'a, T>,
    /// Recurrent dropout's masks `[B, H]`.
    drop: Option<Vec<T>>,
    /// Layer normalisation's gains and biases.
    ln: Option<&'a LnData<T>>,
}

/// What the forward pass writes: the activations it saves for the backward pass (`s`; its stacked weights
/// are added at the end) and the steps' scratch rows.
struct Acts<T> {
    s: Saved<T>,
    /// cGRU: the word GRU's inputs; the transition's pre-activations; the GRU step's `U_ru t`, `U(r∘t)`.
    pre_w: Vec<T>,
    pre: Vec<T>,
    hu: Vec<T>,
    rc: Vec<T>,
    /// Paper form under recurrent dropout: the products' operand `d∘t`.
    tm: Vec<T>,
}

impl DecoderSequence {
    pub(super) fn forward<T: Real>(&self) -> Result<(CpuStorage, Shape)> {
        let dims = self.dims()?;
        macro_rules! data {
            ($sh:expr) => {{
                let (g, l) = $sh.tensor.storage_and_layout();
                (g, l.clone())
            }};
        }
        let (g_wp, l_wp) = data!(self.wp);
        let (g_t0, l_t0) = data!(self.t0);
        let (g_ah, l_ah) = data!(self.ah);
        let (g_ann, l_ann) = data!(self.ann);
        let (g_v, l_v) = data!(self.v);
        let (g_u, l_u) = data!(self.u);
        let wz_g = self.wz.as_ref().map(|x| data!(x));
        let wz = match &wz_g {
            Some((g, l)) => Some(storage_slice::<T>(g, l)?),
            None => None,
        };
        let (tw_v, wq, cw_v, wc) = self.stacked::<T>()?;
        let u_ru_v: Vec<T> = match &self.u_ru {
            Some(x) => crate::kernels::to_vec(&x.tensor)?,
            None => vec![],
        };
        let cd = self.cov_data::<T>()?;
        let cgru_v = self.cgru_data::<T>()?;
        let deep_v = self.deep_data::<T>()?;
        let ln_v = self.ln.as_ref().map(|l| l.data::<T>()).transpose()?;
        let mut x = Forward::new(
            self,
            dims,
            [
                storage_slice::<T>(&g_wp, &l_wp)?,
                storage_slice::<T>(&g_ah, &l_ah)?,
                storage_slice::<T>(&g_ann, &l_ann)?,
                storage_slice::<T>(&g_v, &l_v)?,
                storage_slice::<T>(&g_u, &l_u)?,
                &u_ru_v,
            ],
            wz,
            (&tw_v, wq, &cw_v, wc),
            cd.as_ref(),
            (cgru_v.as_ref(), &deep_v),
        )?;
        x.ln = ln_v.as_ref();
        let mut a = x.acts(storage_slice::<T>(&g_t0, &l_t0)?);
        let Dims { tl, b, h, .. } = dims;
        for i in 0..tl {
            // The rows with a word at step i (see `target_rows`); the rest are padding from here on.
            let m = self.active[i];
            if m == 0 {
                break;
            }
            if x.cgru.is_some() && i > 0 {
                x.word_gru(&mut a, i, m);
            }
            x.attention(&mut a, i, m);
            if i == x.dims.nt {
                break;
            }
            // The rows the transition covers: those of the next step (the cGRU's context GRU: this step's).
            let mt = if x.cgru.is_some() {
                m
            } else {
                self.active[i + 1]
            };
            if mt == 0 {
                continue;
            }
            x.context_product(&mut a, i, mt);
            x.gate(&mut a, i, mt);
            x.transition(&mut a, i, mt);
            x.deep(&mut a, i, mt);
        }
        let out = x.readout_input(&a);
        drop(x);
        self.guided_alignment_cost(&a.s.actx, dims)?;
        let mut saved = a.s;
        (saved.tw, saved.wq, saved.cw, saved.wc) = (tw_v, wq, cw_v, wc);
        *self.saved.lock().expect("saved activations") = Some(Box::new(saved));
        Ok((T::to_cpu_storage_owned(out), Shape::from((b * tl, 3 * h))))
    }
}

impl DecoderSequence {
    /// Guided alignment's scaled cost of the attention rows `actx` (see [`super::Targets::guidance`]), left
    /// in the guidance's cell with its gradient cleared for the backward pass.
    fn guided_alignment_cost<T: Real>(&self, actx: &[T], dims: Dims) -> Result<()> {
        let Some(g) = &self.guidance else {
            return Ok(());
        };
        let Dims { tl, s, w_ac, .. } = dims;
        let a: Vec<T> = crate::kernels::to_vec(&g.targets)?;
        let mut total = 0.0;
        for i in 0..tl {
            for r in 0..self.active[i] {
                let n = self.src_lens[r];
                let at = (self.off[i] + r) * w_ac;
                let row = (r * tl + i) * s;
                total += crate::kernels::guided_alignment::cost_row(
                    &actx[at..at + n],
                    &a[row..row + n],
                    g.cost,
                );
            }
        }
        let mut cell = g.cell.lock().expect("guided alignment cell");
        cell.loss = g.scale * total;
        cell.grad = 0.0;
        Ok(())
    }
}

impl<'a, T: Real> Forward<'a, T> {
    /// `[wp, ah, ann, v, u, u_ru]` as values, the gate's word term, the stacked weights `(tw, wq, cw, wc)`.
    #[allow(clippy::type_complexity)]
    fn new(
        op: &'a DecoderSequence,
        dims: Dims,
        [wp, ah, ann, v, u, u_ru]: [&'a [T]; 6],
        wz: Option<&'a [T]>,
        (tw, wq, cw, wc): (&'a [T], usize, &'a [T], usize),
        cd: Option<&'a CovData<T>>,
        (cgru_v, deep_v): (Option<&'a [Vec<T>; 3]>, &'a [[Vec<T>; 3]]),
    ) -> Result<Self> {
        let Dims { h, k, b, .. } = dims;
        let cgru = cgru_v.map(|v| CgruView::new(v, h));
        let cr = cd.map(|c| c.rows());
        Ok(Forward {
            op,
            dims,
            wp,
            ah,
            ann,
            v,
            wz,
            tw: Oriented::new(tw, h, wq),
            wq,
            cw: Oriented::new(cw, 2 * h, wc),
            wc,
            u_ru: Oriented::new(u_ru, h, if dims.gru { 2 * h } else { 0 }),
            u: Oriented::new(u, h, h),
            mask: crate::kernels::to_vec(&op.mask)?,
            scales: op.scales::<T>(),
            zc: op.z_const::<T>()?,
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

    /// The activations' buffers, time-major (step `i`'s rows at `off[i]..off[i + 1]`, see `step_offsets`),
    /// with the initial state `t0` in step 0's rows.
    fn acts(&self, t0: &[T]) -> Acts<T> {
        let Dims {
            tl,
            b,
            h,
            s,
            nt,
            n,
            kh,
            ..
        } = self.dims;
        let off = &self.op.off;
        let zeroed = crate::kernels::zeroed::<T>;
        let mut tall = zeroed(off[tl] * h);
        tall[..b * h].copy_from_slice(t0);
        // GRU activations (none for the vanilla unit, whose activation is the next state itself).
        let gn = if self.dims.gru { nt } else { 0 };
        // cGRU: the context GRU's states, the word GRU's activations and its step's inputs; the context GRU
        // has no word term (a zero row in the mix).
        let cg = self.cgru.is_some();
        let cn = if cg { n } else { 0 };
        let paper = self.dims.paper;
        Acts {
            s: Saved {
                tall,
                q: zeroed(off[tl] * self.wq),
                actx: zeroed(off[tl] * self.dims.w_ac),
                z: zeroed(if self.dims.gated { off[nt] * h } else { 0 }),
                ts: zeroed(off[nt] * h),
                cp: zeroed(off[nt] * self.wc),
                ru: zeroed(off[gn] * 2 * h),
                rts: zeroed(off[gn] * h),
                c: zeroed(off[gn] * h),
                covs: zeroed(tl * self.dims.bsd),
                cacts: zeroed(n * b * s * self.dims.aw),
                hus: zeroed(if paper { off[gn] * 2 * h } else { 0 }),
                rcs: zeroed(if paper { off[nt] * h } else { 0 }),
                sall: zeroed(if cg { off[tl] * h } else { 0 }),
                wru: zeroed(off[cn] * 2 * h),
                wrh: zeroed(off[cn] * h),
                wht: zeroed(off[cn] * h),
                deep: (0..self.deep.len())
                    .map(|_| {
                        [
                            zeroed(off[nt] * h),
                            zeroed(off[nt] * 2 * h),
                            zeroed(off[nt] * h),
                            zeroed(off[nt] * h),
                        ]
                    })
                    .collect(),
                tw: vec![],
                wq: 0,
                cw: vec![],
                wc: 0,
                ln: self.ln.map(|_| LnSaved {
                    xq: zeroed(off[tl] * self.dims.ad),
                    rsq: zeroed(off[tl]),
                    xc: zeroed(off[nt] * kh),
                    rsc: zeroed(off[nt] * 2),
                    rec: RecLnStats::new(off[nt], h),
                    deep: (0..self.deep.len())
                        .map(|_| RecLnStats::new(off[nt], h))
                        .collect(),
                    word: cg.then(|| RecLnStats::new(off[cn], h)),
                }),
            },
            pre_w: vec![T::zero(); if cg { b * kh } else { 0 }],
            pre: vec![T::zero(); b * kh],
            hu: vec![T::zero(); b * 2 * h],
            rc: vec![T::zero(); b * h],
            tm: vec![
                T::zero();
                if paper && self.drop.is_some() {
                    b * h
                } else {
                    0
                }
            ],
        }
    }

    /// cGRU: the word GRU `t'_i = GRU_word(e(y_{i−1}), t_{i−1})` over step `i`'s `m` rows.
    fn word_gru(&self, a: &mut Acts<T>, i: usize, m: usize) {
        let Dims { h, kh, .. } = self.dims;
        let (off, toff) = (&self.op.off, &self.op.toff);
        let g = self.cgru.as_ref().expect("the cGRU's step");
        let (o, op) = (off[i], off[i - 1]);
        let mh = m * h;
        for r in 0..m {
            a.pre_w[r * kh..(r + 1) * kh]
                .copy_from_slice(&self.wp[(toff[r] + i - 1) * kh..(toff[r] + i) * kh]);
        }
        let state = &mut a.s.tall[o * h..o * h + mh];
        state.copy_from_slice(&a.s.sall[op * h..op * h + mh]);
        let acts = GruActs {
            ru: &mut a.s.wru[op * 2 * h..op * 2 * h + 2 * mh],
            rh: &mut a.s.wrh[op * h..op * h + mh],
            ht: &mut a.s.wht[op * h..op * h + mh],
        };
        // (Layer normalisation: the word GRU's statistics, rows as its activations.)
        let rl = self.ln.map(|l| l.rec_ln(RecAt::Word));
        let ln = match (&rl, a.s.ln.as_mut().and_then(|l| l.word.as_mut())) {
            (Some(r), Some(st)) => Some((r, st.acts(op, m, h))),
            _ => None,
        };
        crate::kernels::profile::timed("  decoder fwd: word GRU step", || {
            gru_step_forward(
                h,
                &a.pre_w[..m * kh],
                state,
                None,
                self.drop.as_ref().map(|d| &d[..mh]),
                acts,
                (&mut a.hu[..2 * mh], &mut a.rc[..mh]),
                &g.u_ru,
                &g.u,
                ln,
            )
        });
    }

    /// Attention from `t_{i−1}` (cGRU: `t'_i`) over step `i`'s `m` rows: the query products `t [B | U_z …]`,
    /// the scores (with the coverage term), `α_i` and `s_i`; with coverage, `C_i` from `C_{i−1}`.
    fn attention(&self, a: &mut Acts<T>, i: usize, m: usize) {
        let Dims {
            h,
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
        let wq = self.wq;
        let (off, koff, lens) = (&self.op.off, &self.op.koff, &self.op.src_lens);
        let (o, o1) = (off[i], off[i + 1]);
        let t_i = &a.s.tall[o * h..o1 * h];
        let q_i = &mut a.s.q[o * wq..o1 * wq];
        crate::kernels::profile::timed("  decoder fwd: query GEMM", || {
            self.tw.mul_into(m, q_i, wq, false, Mat::rows(t_i, h))
        });
        if let (Some(l), Some(ls)) = (self.ln, a.s.ln.as_mut()) {
            // Layer normalisation of B t (the query rows' first Ad values).
            crate::kernels::layer_norm::ln_rows_forward(
                (m, ad, wq),
                q_i,
                &l.query[0],
                &l.query[1],
                &[ad],
                &mut ls.xq[o * ad..o1 * ad],
                &mut ls.rsq[o..o1],
            );
        }
        let actx_i = &mut a.s.actx[o * w_ac..o1 * w_ac];
        let out = RowsMut::new(actx_i, w_ac);
        let q_i = &*q_i;
        let (mask, ah, ann, v) = (&self.mask, self.ah, self.ann, self.v);
        // Coverage: C_{i−1} read, C_i (and the gated update's activations) written by each row.
        let (c_done, c_rest) = a.s.covs.split_at_mut((i + 1) * bsd);
        let c_i = &c_done[i * bsd..];
        let c_next = RowsMut::new(if i < n { &mut c_rest[..bsd] } else { &mut [] }, s * cdim);
        let acts_i = RowsMut::new(
            if i < n {
                &mut a.s.cacts[i * b * s * aw..(i + 1) * b * s * aw]
            } else {
                &mut []
            },
            s * aw,
        );
        let (cr, cd) = (&self.cr, &self.cd);
        let _t = crate::kernels::profile::Scope::new("  decoder fwd: attention rows");
        rows_par(m, m * s * ad, |r| {
            // The sentence's own positions (α stays 0 on padding, as the mask makes it).
            let sr = lens[r];
            let mut e = vec![T::zero(); sr];
            let ah_r = &ah[koff[r] * ad..(koff[r] + sr) * ad];
            let q_r = &q_i[r * wq..(r + 1) * wq];
            match cd {
                Some(cd) => crate::kernels::coverage::scores_row(
                    ah_r,
                    &c_i[r * s * cdim..(r * s + sr) * cdim],
                    &cd.v_cov,
                    &q_r[..ad],
                    v,
                    &mut e,
                ),
                None => crate::kernels::attention::score_rows_d(ah_r, &q_r[..ad], v, &mut e),
            }
            for (x, m) in e.iter_mut().zip(&mask[r * s..(r + 1) * s]) {
                *x += *m;
            }
            // SAFETY: row r of each buffer is written by this task only.
            let o = unsafe { out.row(r) };
            let (al, cx) = o.split_at_mut(s);
            crate::kernels::attention::softmax_context_parts_d(
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

    /// The context's products `s_i [C | C_z]` over the transition's `mt` rows (the cGRU's context GRU: with
    /// its candidate's bias).
    fn context_product(&self, a: &mut Acts<T>, i: usize, mt: usize) {
        let Dims { h, s, w_ac, .. } = self.dims;
        let wc = self.wc;
        let (o, o1) = (self.op.off[i], self.op.off[i + 1]);
        let ctx_i = Mat {
            data: &a.s.actx[o * w_ac + s..o1 * w_ac],
            rs: w_ac,
            cs: 1,
        };
        let cp_i = &mut a.s.cp[o * wc..o1 * wc];
        crate::kernels::profile::timed("  decoder fwd: context GEMM", || {
            self.cw.mul_into(mt, cp_i, wc, false, ctx_i)
        });
        if let (Some(l), Some(ls)) = (self.ln, a.s.ln.as_mut()) {
            // Layer normalisation of s C in blocks [2H | H] (vanilla: [H]; the rows' first kH values).
            let (kh, blocks) = (self.dims.kh, self.dims.ctx_blocks());
            let nb = blocks.len();
            crate::kernels::layer_norm::ln_rows_forward(
                (mt, kh, wc),
                cp_i,
                &l.context[0],
                &l.context[1],
                &blocks,
                &mut ls.xc[o * kh..(o + mt) * kh],
                &mut ls.rsc[o * nb..(o + mt) * nb],
            );
        }
        if let Some(g) = &self.cgru {
            // The context GRU's candidate bias, with the context's term.
            for row in cp_i[..mt * wc].chunks_exact_mut(wc) {
                for (x, &bb) in row[2 * h..3 * h].iter_mut().zip(g.b.iter()) {
                    *x += bb;
                }
            }
        }
    }

    /// The gate and the mix over the transition's `mt` rows: `z`, `T∘t` (paper form: `T`) and the
    /// transition's pre-activations `T∘(W e) + S∘(C s)` (see `gate_mix`).
    fn gate(&self, a: &mut Acts<T>, i: usize, mt: usize) {
        let Dims {
            h,
            ad,
            kh,
            wb_off,
            gated,
            has_uz,
            has_cz,
            ..
        } = self.dims;
        let (wq, wc) = (self.wq, self.wc);
        let (o, o1) = (self.op.off[i], self.op.off[i + 1]);
        let toff = &self.op.toff;
        let Saved {
            tall, q, cp, z, ts, ..
        } = &mut a.s;
        let pre = &mut a.pre;
        let t_i = &tall[o * h..o1 * h];
        let (zw, tsw, prew) = (
            RowsMut::new(
                if gated {
                    &mut z[o * h..o1 * h]
                } else {
                    &mut z[..]
                },
                if gated { h } else { 0 },
            ),
            RowsMut::new(&mut ts[o * h..o1 * h], h),
            RowsMut::new(pre, kh),
        );
        let (wz, q_i, cp_i) = (self.wz, &q[o * wq..o1 * wq], &cp[o * wc..o1 * wc]);
        let scales = self.scales;
        let (zc, mix) = (&self.zc, &self.mix);
        let _t = crate::kernels::profile::Scope::new("  decoder fwd: gate rows");
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
                    mix.state(t_i, r),
                    mix.word(i, r),
                    &cp_i[r * wc..r * wc + kh],
                    scales,
                    zw.row(r),
                    tsw.row(r),
                    prew.row(r),
                )
            }
        });
    }

    /// A deep transition's later GRUs over the `mt` rows the transition of step `i` wrote (its output, `t_{i+1}`
    /// or the cGRU's `t_i`), in place: each saves its input state and its activations at step `i`'s rows.
    fn deep(&self, a: &mut Acts<T>, i: usize, mt: usize) {
        if self.deep.is_empty() {
            return;
        }
        let h = self.dims.h;
        let (o, o1) = (self.op.off[i], self.op.off[i + 1]);
        let mth = mt * h;
        let Saved {
            tall,
            sall,
            deep,
            ln: ln_s,
            ..
        } = &mut a.s;
        let state = if self.cgru.is_some() {
            &mut sall[o * h..o * h + mth]
        } else {
            &mut tall[o1 * h..o1 * h + mth]
        };
        for (k, (g, [hp, ru, rh, ht])) in self.deep.iter().zip(deep.iter_mut()).enumerate() {
            let rl = self.ln.map(|l| l.rec_ln(RecAt::Deep(k)));
            hp[o * h..o * h + mth].copy_from_slice(state);
            let acts = GruActs {
                ru: &mut ru[o * 2 * h..o * 2 * h + 2 * mth],
                rh: &mut rh[o * h..o * h + mth],
                ht: &mut ht[o * h..o * h + mth],
            };
            crate::kernels::profile::timed("  decoder fwd: deep transition", || {
                gru_step_forward(
                    h,
                    &g.xp[..3 * mth],
                    state,
                    None,
                    self.drop.as_ref().map(|d| &d[..mth]),
                    acts,
                    (&mut a.hu[..2 * mth], &mut a.rc[..mth]),
                    &g.u_ru,
                    &g.u,
                    match (&rl, ln_s.as_mut()) {
                        (Some(r), Some(ls)) => Some((r, ls.deep[k].acts(o, mt, h))),
                        _ => None,
                    },
                )
            });
        }
    }

    /// The transition over its `mt` rows, from the pre-activations and `T∘t`: the next state `t_i` (the
    /// cGRU's context GRU: `s`-state), GRU, vanilla or paper form.
    fn transition(&self, a: &mut Acts<T>, i: usize, mt: usize) {
        let Dims { h, kh, .. } = self.dims;
        let (o, o1) = (self.op.off[i], self.op.off[i + 1]);
        let mth = mt * h;
        let Saved {
            tall,
            ts,
            hus,
            ru,
            rts,
            c: cc,
            rcs,
            sall,
            ln: ln_s,
            ..
        } = &mut a.s;
        let (pre, hu, rc, tm) = (&mut a.pre, &mut a.hu, &mut a.rc, &mut a.tm);
        let (t_done, t_rest) = tall.split_at_mut(o1 * h);
        let ts_i = &ts[o * h..o1 * h];
        let t_next = if self.cgru.is_some() {
            &mut sall[o * h..o1 * h]
        } else {
            &mut t_rest[..mth]
        };
        let (u, u_ru) = (&self.u, &self.u_ru);
        if self.dims.paper {
            // t_i from the unscaled state; the products scaled by T (= ts_i) after them.
            let gru_acts = self.dims.gru.then(|| {
                (
                    &mut hus[o * 2 * h..o1 * 2 * h],
                    &mut ru[o * 2 * h..o1 * 2 * h],
                    &mut rts[o * h..o1 * h],
                    &mut cc[o * h..o1 * h],
                )
            });
            let t_i = &t_done[o * h..];
            // The recurrent products' operand: t, or d∘t under recurrent dropout.
            let tm = match &self.drop {
                Some(d) => {
                    crate::kernels::gru::dropped_state(&t_i[..mth], &d[..mth], &mut tm[..mth]);
                    &tm[..mth]
                }
                None => t_i,
            };
            let norms = self.rec_norms(ln_s.as_mut(), o, mt);
            crate::kernels::profile::timed("  decoder fwd: GRU step", || {
                paper_transition(
                    (mt, h),
                    (&pre[..], t_i, tm, ts_i),
                    (u, u_ru),
                    gru_acts,
                    &mut rcs[o * h..o1 * h],
                    t_next,
                    norms,
                )
            });
            return;
        }
        if !self.dims.gru {
            // The vanilla unit: t_i = tanh(pre + U (T∘t)) (recurrent dropout: U (d∘T∘t), formed in `rc`).
            let norms = self.rec_norms(ln_s.as_mut(), o, mt);
            crate::kernels::profile::timed("  decoder fwd: GRU step", || {
                let operand = match &self.drop {
                    Some(d) => {
                        crate::kernels::gru::dropped_state(&ts_i[..mth], &d[..mth], &mut rc[..mth]);
                        &rc[..mth]
                    }
                    None => &ts_i[..mth],
                };
                u.mul_into(mt, t_next, h, false, Mat::rows(operand, h));
                if let Some(mut n) = norms {
                    // Layer normalisation of U (T∘t).
                    n.c.run(mt, h, t_next);
                }
                let pre = &*pre;
                let tw = RowsMut::new(t_next, h);
                rows_par(mt, mth, |r| unsafe {
                    vanilla_row_d(&pre[r * h..(r + 1) * h], tw.row(r))
                });
            });
            return;
        }
        // The GRU step from the scaled state T∘t: t_i = T∘t + u∘(t~ − T∘t).
        let rl = self.ln.map(|l| l.rec_ln(RecAt::Transition));
        let t_next = &mut t_next[..mth];
        t_next.copy_from_slice(&ts_i[..mth]);
        let acts = GruActs {
            ru: &mut ru[o * 2 * h..o * 2 * h + 2 * mth],
            rh: &mut rts[o * h..o * h + mth],
            ht: &mut cc[o * h..o * h + mth],
        };
        crate::kernels::profile::timed("  decoder fwd: GRU step", || {
            gru_step_forward(
                h,
                &pre[..mt * kh],
                t_next,
                None,
                self.drop.as_ref().map(|d| &d[..mth]),
                acts,
                (&mut hu[..2 * mth], &mut rc[..mth]),
                u_ru,
                u,
                match (&rl, ln_s.as_mut()) {
                    (Some(r), Some(ls)) => Some((r, ls.rec.acts(o, mt, h))),
                    _ => None,
                },
            )
        });
    }

    /// The normalisations of the transition's recurrent products for the vanilla unit and the paper form, over
    /// rows `o..o + mt` of the saved statistics (`None` without layer normalisation).
    fn rec_norms<'s>(
        &'s self,
        ls: Option<&'s mut LnSaved<T>>,
        o: usize,
        mt: usize,
    ) -> Option<RecNorms<NormFwd<'s, T>>> {
        let (l, ls) = (self.ln?, ls?);
        let h = self.dims.h;
        let a = ls.rec.acts(o, mt, h);
        let n = l.rec.len();
        Some(RecNorms {
            ru: (n == 4).then(|| NormFwd {
                g: &l.rec[0],
                b: &l.rec[1],
                xh: a.xh_ru,
                rs: a.rs_ru,
            }),
            c: NormFwd {
                g: &l.rec[n - 2],
                b: &l.rec[n - 1],
                xh: a.xh_c,
                rs: a.rs_c,
            },
        })
    }

    /// The readout's input, batch-major: `[t_{i−1} | s_i]` (cGRU: `[t_i | s_i]`) `[B·T, 3H]`.
    fn readout_input(&self, a: &Acts<T>) -> Vec<T> {
        use rayon::prelude::*;
        let Dims { tl, b, h, s, .. } = self.dims;
        let w_ac = self.dims.w_ac;
        let mut out = crate::kernels::zeroed(b * tl * 3 * h);
        let states = if self.cgru.is_some() {
            &a.s.sall
        } else {
            &a.s.tall
        };
        let (off, active, actx) = (&self.op.off, &self.op.active, &a.s.actx);
        out.par_chunks_mut(3 * h).enumerate().for_each(|(row, o)| {
            let (r, i) = (row / tl, row % tl);
            // (A padded position's row stays zero.)
            if r < active[i] {
                let x = off[i] + r;
                o[..h].copy_from_slice(&states[x * h..(x + 1) * h]);
                o[h..].copy_from_slice(&actx[x * w_ac + s..(x + 1) * w_ac]);
            }
        });
        out
    }
}
