//! The fused decoder op's backward pass, after the steps: the annotations' gradient and each weight's
//! gradient as one GEMM over all steps (attention, coverage, gate, transition, deep transition, layer
//! normalisation's gains and biases).

use super::super::{Dims, ZPreOp};
use super::{block, sum_rows, Backward, Grads};
use crate::kernels::{Mat, Real};

impl<'a, T: Real> Backward<'a, T> {
    /// A deep transition's later GRUs' weights: `b` from every step's input terms' gradient, `U_ru` from
    /// the input state (`d∘t` under recurrent dropout), `U` from `r∘(d∘t)`, each one GEMM over all steps.
    pub(super) fn deep_weights(&self, d: &Grads<T>) {
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

    /// The annotations' gradient from every step's context, per sentence: ∂h_r += α_rᵀ ∂S_r with α_r
    /// `[L, S]` and ∂S_r `[L, 2H]` over the sentence's `L` steps, gathered from the time-major rows.
    pub(super) fn annotations(&self, d: &Grads<T>) {
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
    pub(super) fn attention_weights(&self, d: &Grads<T>) {
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
    pub(super) fn coverage_weights(&self, d: &mut Grads<T>) {
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
    pub(super) fn gate_weights(&self, d: &Grads<T>) {
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
    pub(super) fn context_rows(&self) -> Mat<'_, T> {
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
    pub(super) fn dropped<'b>(&self, x: &'b [T], steps: usize) -> std::borrow::Cow<'b, [T]> {
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

    pub(super) fn transition_weights(&self, d: &Grads<T>) {
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
                            *a += x;
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
    pub(super) fn ln_weights(&self, d: &Grads<T>) {
        let (Some(lo), Some(ls), Some(lg)) = (&self.op.ln, &self.sv.ln, &d.ln) else {
            return;
        };
        lo.query[0].add_grad(lg.dq_g.clone());
        lo.query[1].add_grad(lg.dq_b.clone());
        lo.context[0].add_grad(lg.dc_g.clone());
        lo.context[1].add_grad(lg.dc_b.clone());
        if self.dims.paper || !self.dims.gru {
            for (p, g) in lo.rec.iter().zip(&lg.rec_gb) {
                p.add_grad(g.clone());
            }
        } else {
            for (p, g) in lo.rec.iter().zip(ls.rec.param_grads(&d.dpre, self.dims.h)) {
                p.add_grad(g);
            }
        }
        if let (Some(lw), Some(sw)) = (&lo.word, &ls.word) {
            // The word GRU's rows: `dpw_all` holds its pre-activations' gradients.
            for (p, g) in lw.iter().zip(sw.param_grads(&d.dpw_all, self.dims.h)) {
                p.add_grad(g);
            }
        }
    }
}
