//! Coverage's row maths inside the fused decoder sequence (model-spec §5): the linguistic and neural updates of
//! `C_{i,j}` and the attention scores with the coverage term `V_cov C_{i−1,j}`, one sentence's rows at a time,
//! with hand-derived backward passes. Their composed references are the concept's own steps,
//! [`crate::model::coverage::Coverage::update`] and [`crate::model::coverage::Coverage::attention_term`].

/// Coverage inside the fused decoder sequence ([`crate::model::decoder_sequence`]): one sentence's rows at a time,
/// the same computation as [`crate::model::coverage::Coverage::attention_term`] and
/// [`crate::model::coverage::Coverage::update`], with hand-derived backward passes (tied to the composed ops by
/// the whole-model comparison in `tests/it/kernels/` and by finite differences in `tests/it/gradcheck.rs`).
pub(crate) struct CovRows<'a, T> {
    /// Neural coverage (else linguistic), gated (neural only), coverage dimension `d`.
    pub neural: bool,
    pub gated: bool,
    pub d: usize,
    /// Neural: `p` `[k·d]`, `U` `[d, d]`, `U_ru` `[d, 2d]` (gated); empty otherwise.
    pub p: &'a [T],
    pub u: &'a [T],
    pub u_ru: &'a [T],
}

impl<T: crate::kernels::Real> CovRows<'_, T> {
    /// Width of the per-position precomputed input: `1/Φ_j` (linguistic) or `h_j W_c` (`k·d`, neural).
    pub fn pre_width(&self) -> usize {
        if self.neural {
            self.kd()
        } else {
            1
        }
    }

    /// Width of the state's input term `t W_h` (0 for linguistic coverage).
    pub fn kd(&self) -> usize {
        match (self.neural, self.gated) {
            (false, _) => 0,
            (true, true) => 3 * self.d,
            (true, false) => self.d,
        }
    }

    /// Activations saved per position for the backward pass: `[z | r | C~]` (gated neural), none otherwise.
    pub fn acts_width(&self) -> usize {
        if self.neural && self.gated {
            3 * self.d
        } else {
            0
        }
    }

    /// `C_{i}` from `C_{i−1}` (`c`, `[S, d]`) for one sentence: weights `alpha` `[S]`, `pre` `[S, pre_width]`,
    /// `th` = `t_{i−1} W_h` `[kd]`; the new coverage into `out`, the gated update's activations into `acts`.
    pub fn update(&self, c: &[T], alpha: &[T], pre: &[T], th: &[T], out: &mut [T], acts: &mut [T]) {
        let d = self.d;
        if !self.neural {
            for (j, o) in out.iter_mut().enumerate() {
                *o = c[j] + alpha[j] * pre[j];
            }
            return;
        }
        let kd = self.kd();
        let mut inp = vec![T::zero(); kd];
        for (j, &a) in alpha.iter().enumerate() {
            let cj = &c[j * d..(j + 1) * d];
            for (k, x) in inp.iter_mut().enumerate() {
                *x = pre[j * kd + k] + th[k] + a * self.p[k];
            }
            let oj = &mut out[j * d..(j + 1) * d];
            if !self.gated {
                for (k, o) in oj.iter_mut().enumerate() {
                    let mut s = inp[k];
                    for (l, &cl) in cj.iter().enumerate() {
                        s += cl * self.u[l * d + k];
                    }
                    *o = s.tanh_v();
                }
                continue;
            }
            let aj = &mut acts[j * 3 * d..(j + 1) * 3 * d];
            for m in 0..2 * d {
                let mut s = inp[m];
                for (l, &cl) in cj.iter().enumerate() {
                    s += cl * self.u_ru[l * 2 * d + m];
                }
                aj[m] = s.sigmoid_v();
            }
            for k in 0..d {
                let mut s = inp[2 * d + k];
                for l in 0..d {
                    s += aj[d + l] * cj[l] * self.u[l * d + k];
                }
                let cand = s.tanh_v();
                aj[2 * d + k] = cand;
                oj[k] = cj[k] + aj[k] * (cand - cj[k]);
            }
        }
    }

    /// Backward through [`CovRows::update`] for one sentence, from `dn` = `∂C_i` `[S, d]`: writes `∂C_{i−1}`
    /// into `dc` and `∂α` into `dalpha`; adds into `dpre` `[S, pre_width]`, `dth` `[kd]`, `dp` `[kd]`, `du`
    /// `[d, d]` and `du_ru` `[d, 2d]`. `out` and `acts` are what the forward pass wrote.
    #[allow(clippy::too_many_arguments)]
    pub fn update_grad(
        &self,
        (c, alpha, pre, out, acts): (&[T], &[T], &[T], &[T], &[T]),
        dn: &[T],
        dc: &mut [T],
        dalpha: &mut [T],
        dpre: &mut [T],
        dth: &mut [T],
        (dp, du, du_ru): (&mut [T], &mut [T], &mut [T]),
    ) {
        let d = self.d;
        if !self.neural {
            for j in 0..alpha.len() {
                dc[j] = dn[j];
                dalpha[j] = dn[j] * pre[j];
                dpre[j] += dn[j] * alpha[j];
            }
            return;
        }
        let kd = self.kd();
        let mut dinp = vec![T::zero(); kd];
        let mut drc = vec![T::zero(); d];
        for (j, &a) in alpha.iter().enumerate() {
            let (cj, dnj) = (&c[j * d..(j + 1) * d], &dn[j * d..(j + 1) * d]);
            let dcj = &mut dc[j * d..(j + 1) * d];
            if !self.gated {
                // C_i = tanh(inp + C_{i−1} U).
                let oj = &out[j * d..(j + 1) * d];
                for k in 0..d {
                    dinp[k] = dnj[k] * (T::one() - oj[k] * oj[k]);
                }
                for l in 0..d {
                    let mut s = T::zero();
                    for k in 0..d {
                        s += dinp[k] * self.u[l * d + k];
                        du[l * d + k] += cj[l] * dinp[k];
                    }
                    dcj[l] = s;
                }
            } else {
                // C_i = C + z∘(C~ − C), C~ = tanh(inp_c + (r∘C) U), [z | r] = σ(inp_zr + C U_ru).
                let aj = &acts[j * 3 * d..(j + 1) * 3 * d];
                let (z, r, cand) = (&aj[..d], &aj[d..2 * d], &aj[2 * d..]);
                for k in 0..d {
                    dcj[k] = dnj[k] * (T::one() - z[k]);
                    let dcand = dnj[k] * z[k];
                    dinp[2 * d + k] = dcand * (T::one() - cand[k] * cand[k]);
                    // ∂ of z's pre-activation.
                    dinp[k] = dnj[k] * (cand[k] - cj[k]) * z[k] * (T::one() - z[k]);
                }
                for l in 0..d {
                    let mut s = T::zero();
                    let rcl = r[l] * cj[l];
                    for k in 0..d {
                        s += dinp[2 * d + k] * self.u[l * d + k];
                        du[l * d + k] += rcl * dinp[2 * d + k];
                    }
                    drc[l] = s;
                }
                for l in 0..d {
                    dcj[l] += drc[l] * r[l];
                    dinp[d + l] = drc[l] * cj[l] * r[l] * (T::one() - r[l]);
                }
                for l in 0..d {
                    let mut s = T::zero();
                    for m in 0..2 * d {
                        s += dinp[m] * self.u_ru[l * 2 * d + m];
                        du_ru[l * 2 * d + m] += cj[l] * dinp[m];
                    }
                    dcj[l] += s;
                }
            }
            let mut da = T::zero();
            for k in 0..kd {
                let g = dinp[k];
                dpre[j * kd + k] += g;
                dth[k] += g;
                dp[k] += a * g;
                da += g * self.p[k];
            }
            dalpha[j] = da;
        }
    }
}

/// One sentence's attention scores with the coverage term (model-spec §5): `e_j = vᵀ tanh(A h_j + C_{i−1,j}
/// V_cov + B t)` for `ah` `[S, Ad]`, `c` `[S, d]`, `v_cov` `[d, Ad]`, `q` = `B t` and `v` `[Ad]`, into `e` `[S]`;
/// one position's pre-activation at a time (no `[S, Ad]` buffer). [`scores_row`] runs it with AVX2+FMA where the
/// CPU has them.
#[inline(always)]
fn scores_row_g<T: crate::kernels::Real>(
    ah: &[T],
    c: &[T],
    v_cov: &[T],
    q: &[T],
    v: &[T],
    e: &mut [T],
) {
    let ad = q.len();
    let d = c.len() / e.len().max(1);
    let mut x = vec![T::zero(); ad];
    for (j, ej) in e.iter_mut().enumerate() {
        pre_activation(
            &ah[j * ad..(j + 1) * ad],
            &c[j * d..(j + 1) * d],
            v_cov,
            q,
            &mut x,
        );
        *ej = crate::kernels::dot(v, &x);
    }
}

/// `x = tanh(A h_j + C_j V_cov + q)` for one position.
#[inline(always)]
fn pre_activation<T: crate::kernels::Real>(
    ah_j: &[T],
    c_j: &[T],
    v_cov: &[T],
    q: &[T],
    x: &mut [T],
) {
    let ad = q.len();
    x.copy_from_slice(ah_j);
    for (k, &ck) in c_j.iter().enumerate() {
        for (xa, &va) in x.iter_mut().zip(&v_cov[k * ad..(k + 1) * ad]) {
            *xa += ck * va;
        }
    }
    for (xa, &qa) in x.iter_mut().zip(q) {
        *xa = (*xa + qa).tanh_v();
    }
}

/// Backward through [`scores_row`] from `de` = `∂e` `[S]`: adds into `dah` `[S, Ad]` (the keys `A h`), `dq`
/// `[Ad]`, `dv` `[Ad]`, `dc` `[S, d]` (`∂C_{i−1}`) and `dv_cov` `[d, Ad]`; dispatched as [`scores_row`].
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn scores_grad_row_g<T: crate::kernels::Real>(
    ah: &[T],
    c: &[T],
    v_cov: &[T],
    q: &[T],
    v: &[T],
    de: &[T],
    dah: &mut [T],
    dq: &mut [T],
    dv: &mut [T],
    dc: &mut [T],
    dv_cov: &mut [T],
) {
    let ad = q.len();
    let d = c.len() / de.len().max(1);
    let mut x = vec![T::zero(); ad];
    for (j, &g) in de.iter().enumerate() {
        let c_j = &c[j * d..(j + 1) * d];
        pre_activation(&ah[j * ad..(j + 1) * ad], c_j, v_cov, q, &mut x);
        // x becomes ∂ of the pre-activation.
        for (((xa, &va), dva), (dqa, daa)) in x
            .iter_mut()
            .zip(v)
            .zip(dv.iter_mut())
            .zip(dq.iter_mut().zip(&mut dah[j * ad..(j + 1) * ad]))
        {
            let t = *xa;
            *dva += g * t;
            let dp = g * va * (T::one() - t * t);
            *xa = dp;
            *dqa += dp;
            *daa += dp;
        }
        for (k, &ck) in c_j.iter().enumerate() {
            let vk = &v_cov[k * ad..(k + 1) * ad];
            dc[j * d + k] += crate::kernels::dot(&x, vk);
            for (g2, &xa) in dv_cov[k * ad..(k + 1) * ad].iter_mut().zip(&x) {
                *g2 += ck * xa;
            }
        }
    }
}
crate::kernels::simd_dispatch!(scores_row, scores_row_avx, scores_row_g, (ah: &[T], c: &[T], v_cov: &[T], q: &[T], v: &[T], e: &mut [T]));
crate::kernels::simd_dispatch!(scores_grad_row, scores_grad_row_avx, scores_grad_row_g, (ah: &[T], c: &[T], v_cov: &[T], q: &[T], v: &[T], de: &[T], dah: &mut [T], dq: &mut [T], dv: &mut [T], dc: &mut [T], dv_cov: &mut [T]));
