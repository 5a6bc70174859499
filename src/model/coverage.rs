//! Coverage models of Tu et al. (2016) (model-spec §5). A coverage vector `C_{i,j}` (dimension d) per source
//! position enters attention through `V_cov C_{i−1,j}` and is updated right after each attention step.
//!
//! * linguistic: `C_{i,j} = C_{i−1,j} + α_ij / Φ_j`, with fertility `Φ_j = N σ(U_f h_j)` or `Φ_j = 1`;
//! * neural, gated: a GRU per source position over `C` with inputs `α_ij`, `h_j`, `t_{i−1}`:
//!   `z, r = σ(U_ru C + p_ru α + h_j W_c,ru + t W_h,ru)`, `C~ = tanh(U (r∘C) + p α + h_j W_c + t W_h)`,
//!   `C' = (1 − z)∘C + z∘C~`;
//! * neural, not gated: `C' = tanh(U C + p α + h_j W_c + t W_h)`.

use candle_core::{Result, Tensor, D};
use candle_nn::VarBuilder;

use crate::config::{CoverageKind, ModelConfig};

pub struct Coverage {
    pub kind: CoverageKind,
    pub dim: usize,
    pub v_cov: Tensor,
    pub u_f: Option<Tensor>,
    pub max_fertility: f64,
    pub gated: bool,
    /// Neural: `[2H, k·d]`, `[H, k·d]`, `[k·d]` with k = 3 (gated) or 1.
    pub w_c: Option<Tensor>,
    pub w_h: Option<Tensor>,
    pub p: Option<Tensor>,
    pub u_ru: Option<Tensor>,
    pub u: Option<Tensor>,
}

/// Per-sentence precomputation: fertilities (linguistic) or `h_j W_c` (neural).
#[derive(Clone)]
pub struct CovKeys {
    /// Linguistic: `1/Φ_j` `[B, S, 1]`; neural: `h_j W_c` `[B, S, k·d]`.
    pub pre: Tensor,
}

impl CovKeys {
    pub fn select(&self, idx: &Tensor) -> Result<CovKeys> {
        Ok(CovKeys {
            pre: crate::kernels::select_rows(&self.pre, idx)?,
        })
    }
}

impl Coverage {
    /// Coverage's inputs to the fused decoder op ([`crate::model::decoder_sequence::decoder_sequence_fused`]): the
    /// per-position terms read from the annotations' handle `ann` (`h W_c` neural, `h U_f` fertility, from
    /// which the op forms `1/Φ`, or ones) and the update's weights.
    pub fn sequence_inputs<'a>(
        &'a self,
        ann: &crate::kernels::Shared,
    ) -> Result<CoverageInputs<'a>> {
        use crate::kernels::{product_shared, Input, Shared};
        let (pre, fertility): (Input, Option<f64>) = match (self.kind, &self.w_c, &self.u_f) {
            (CoverageKind::Neural, Some(w_c), _) => (product_shared(ann, w_c)?.into(), None),
            (_, _, Some(u_f)) => (product_shared(ann, u_f)?.into(), Some(self.max_fertility)),
            _ => {
                let (bs, s) = (ann.tensor.dim(0)?, ann.tensor.dim(1)?);
                let ones = Tensor::ones((bs, s, 1), ann.tensor.dtype(), ann.tensor.device())?;
                (Shared::new(&ones)?.into(), None)
            }
        };
        Ok(CoverageInputs {
            neural: self.kind == CoverageKind::Neural,
            gated: self.gated,
            v_cov: &self.v_cov,
            pre,
            fertility,
            w_h: self.w_h.as_ref(),
            p: self.p.as_ref(),
            u: self.u.as_ref(),
            u_ru: self.u_ru.as_ref(),
        })
    }

    pub fn new(vb: VarBuilder, cfg: &ModelConfig) -> Result<Option<Self>> {
        if cfg.coverage == CoverageKind::None {
            return Ok(None);
        }
        let vb = vb.pp("coverage");
        let (h, d) = (cfg.hidden_dim, cfg.coverage_dim);
        let v_cov = vb.get_with_hints((d, cfg.attention_dim), "V_cov", crate::model::init::ZERO)?;
        let mut c = Coverage {
            kind: cfg.coverage,
            dim: d,
            v_cov,
            u_f: None,
            max_fertility: cfg.coverage_max_fertility,
            gated: cfg.coverage_gated,
            w_c: None,
            w_h: None,
            p: None,
            u_ru: None,
            u: None,
        };
        match cfg.coverage {
            CoverageKind::Linguistic => {
                if cfg.coverage_fertility {
                    c.u_f = Some(vb.get_with_hints((2 * h, 1), "U_f", crate::model::init::ZERO)?);
                }
            }
            CoverageKind::Neural => {
                let k = if cfg.coverage_gated { 3 } else { 1 };
                c.w_c = Some(vb.get_with_hints((2 * h, k * d), "W_c", crate::model::init::ZERO)?);
                c.w_h = Some(vb.get_with_hints((h, k * d), "W_h", crate::model::init::ZERO)?);
                c.p = Some(vb.get_with_hints(k * d, "p", crate::model::init::ZERO)?);
                c.u = Some(vb.get_with_hints((d, d), "U", crate::model::init::ZERO)?);
                if cfg.coverage_gated {
                    c.u_ru =
                        Some(vb.get_with_hints((d, 2 * d), "U_ru", crate::model::init::ZERO)?);
                }
            }
            CoverageKind::None => unreachable!(),
        }
        Ok(Some(c))
    }

    pub fn keys(&self, annotations: &Tensor) -> Result<CovKeys> {
        let (b, s, a) = annotations.dims3()?;
        let flat = annotations.reshape((b * s, a))?;
        let pre = match self.kind {
            CoverageKind::Linguistic => match &self.u_f {
                Some(u_f) => {
                    let phi = candle_nn::ops::sigmoid(&flat.matmul(u_f)?)?
                        .affine(self.max_fertility, 0.0)?;
                    phi.recip()?.reshape((b, s, 1))?
                }
                None => Tensor::ones((b, s, 1), annotations.dtype(), annotations.device())?,
            },
            _ => {
                let w_c = self.w_c.as_ref().expect("neural coverage has W_c");
                flat.matmul(w_c)?.reshape((b, s, w_c.dim(1)?))?
            }
        };
        Ok(CovKeys { pre })
    }

    /// `C_0 = 0`, `[B, S, d]`.
    pub fn initial(&self, b: usize, s: usize, like: &Tensor) -> Result<Tensor> {
        Tensor::zeros((b, s, self.dim), like.dtype(), like.device())
    }

    /// The attention term `V_cov C_{i−1,j}` `[B, S, Ad]`.
    pub fn attention_term(&self, cov: &Tensor) -> Result<Tensor> {
        let (b, s, d) = cov.dims3()?;
        let ad = self.v_cov.dim(1)?;
        cov.reshape((b * s, d))?
            .matmul(&self.v_cov)?
            .reshape((b, s, ad))
    }

    /// `C_i` from `C_{i−1}` `[B, S, d]`, the new weights `α_i` `[B, S]` and `t_{i−1}` `[B, H]`.
    pub fn update(
        &self,
        keys: &CovKeys,
        cov: &Tensor,
        alpha: &Tensor,
        t_prev: &Tensor,
    ) -> Result<Tensor> {
        let a = alpha.unsqueeze(D::Minus1)?; // [B, S, 1]
        match self.kind {
            CoverageKind::Linguistic => cov + (a * &keys.pre)?,
            _ => {
                let (b, s, d) = cov.dims3()?;
                let w_h = self.w_h.as_ref().expect("W_h");
                let p = self.p.as_ref().expect("p");
                let u = self.u.as_ref().expect("U");
                // Input terms for all parts: h_j W_c + t W_h + α p, [B, S, k·d].
                let inp = keys
                    .pre
                    .broadcast_add(&t_prev.matmul(w_h)?.unsqueeze(1)?)?
                    .broadcast_add(&a.broadcast_mul(p)?)?;
                let flat_c = cov.reshape((b * s, d))?;
                if !self.gated {
                    return (inp + flat_c.matmul(u)?.reshape((b, s, d))?)?.tanh();
                }
                let u_ru = self.u_ru.as_ref().expect("U_ru");
                let zr = candle_nn::ops::sigmoid(
                    &(inp.narrow(2, 0, 2 * d)? + flat_c.matmul(u_ru)?.reshape((b, s, 2 * d))?)?,
                )?;
                let z = zr.narrow(2, 0, d)?;
                let r = zr.narrow(2, d, d)?;
                let rc = (r * cov)?
                    .reshape((b * s, d))?
                    .matmul(u)?
                    .reshape((b, s, d))?;
                let cand = (inp.narrow(2, 2 * d, d)? + rc)?.tanh()?;
                cov + (z * (cand - cov)?)?
            }
        }
    }
}

/// Coverage inside the fused decoder sequence ([`crate::model::decoder_sequence`]): one sentence's rows at a time,
/// the same computation as [`Coverage::attention_term`] and [`Coverage::update`], with hand-derived backward
/// passes (tied to the composed ops by the whole-model comparison in `tests/it/kernels/` and by finite
/// differences in `tests/it/gradcheck.rs`).
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
                        s = s + cl * self.u[l * d + k];
                    }
                    *o = s.tanh_v();
                }
                continue;
            }
            let aj = &mut acts[j * 3 * d..(j + 1) * 3 * d];
            for m in 0..2 * d {
                let mut s = inp[m];
                for (l, &cl) in cj.iter().enumerate() {
                    s = s + cl * self.u_ru[l * 2 * d + m];
                }
                aj[m] = s.sigmoid_v();
            }
            for k in 0..d {
                let mut s = inp[2 * d + k];
                for l in 0..d {
                    s = s + aj[d + l] * cj[l] * self.u[l * d + k];
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
                dpre[j] = dpre[j] + dn[j] * alpha[j];
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
                        s = s + dinp[k] * self.u[l * d + k];
                        du[l * d + k] = du[l * d + k] + cj[l] * dinp[k];
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
                        s = s + dinp[2 * d + k] * self.u[l * d + k];
                        du[l * d + k] = du[l * d + k] + rcl * dinp[2 * d + k];
                    }
                    drc[l] = s;
                }
                for l in 0..d {
                    dcj[l] = dcj[l] + drc[l] * r[l];
                    dinp[d + l] = drc[l] * cj[l] * r[l] * (T::one() - r[l]);
                }
                for l in 0..d {
                    let mut s = T::zero();
                    for m in 0..2 * d {
                        s = s + dinp[m] * self.u_ru[l * 2 * d + m];
                        du_ru[l * 2 * d + m] = du_ru[l * 2 * d + m] + cj[l] * dinp[m];
                    }
                    dcj[l] = dcj[l] + s;
                }
            }
            let mut da = T::zero();
            for k in 0..kd {
                let g = dinp[k];
                dpre[j * kd + k] = dpre[j * kd + k] + g;
                dth[k] = dth[k] + g;
                dp[k] = dp[k] + a * g;
                da = da + g * self.p[k];
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
            *xa = *xa + ck * va;
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
            *dva = *dva + g * t;
            let dp = g * va * (T::one() - t * t);
            *xa = dp;
            *dqa = *dqa + dp;
            *daa = *daa + dp;
        }
        for (k, &ck) in c_j.iter().enumerate() {
            let vk = &v_cov[k * ad..(k + 1) * ad];
            dc[j * d + k] = dc[j * d + k] + crate::kernels::dot(&x, vk);
            for (g2, &xa) in dv_cov[k * ad..(k + 1) * ad].iter_mut().zip(&x) {
                *g2 = *g2 + ck * xa;
            }
        }
    }
}
crate::kernels::simd_dispatch!(scores_row, scores_row_avx, scores_row_g, (ah: &[T], c: &[T], v_cov: &[T], q: &[T], v: &[T], e: &mut [T]));
crate::kernels::simd_dispatch!(scores_grad_row, scores_grad_row_avx, scores_grad_row_g, (ah: &[T], c: &[T], v_cov: &[T], q: &[T], v: &[T], de: &[T], dah: &mut [T], dq: &mut [T], dv: &mut [T], dc: &mut [T], dv_cov: &mut [T]));

/// Coverage (model-spec §5) inside the recurrence: `V_cov` `[d, Ad]`, the per-position precomputed input
/// `pre` (`1/Φ_j` `[B, S, 1]` for linguistic coverage — or `h_j U_f` when `fertility` is `Some(N)`, and the op
/// forms `1/Φ_j = 1/(N σ(h_j U_f))` itself — and `h_j W_c` `[B, S, k·d]` for neural), and the neural update's
/// `W_h` `[H, k·d]`, `p` `[k·d]`, `U` `[d, d]` and (gated) `U_ru` `[d, 2d]`, as in
/// [`crate::model::coverage::Coverage`].
pub struct CoverageInputs<'a> {
    pub neural: bool,
    pub gated: bool,
    pub v_cov: &'a Tensor,
    pub pre: crate::kernels::Input<'a>,
    pub fertility: Option<f64>,
    pub w_h: Option<&'a Tensor>,
    pub p: Option<&'a Tensor>,
    pub u: Option<&'a Tensor>,
    pub u_ru: Option<&'a Tensor>,
}
