//! The gate and the mix of one sentence row in the fused decoder op: `z = σ(Σ terms)`, the scales as
//! `α + β z` (from `kernels::gate::GateKinds::affine`, the gate's one parametrisation), `T∘t` and the
//! pre-activations `T∘(W e) + S∘(C s)`, and their backward pass.

use crate::kernels::{simd_dispatch, Real};

/// The source and target scales of a row as `((α_s, β_s), (α_t, β_t))`: `S = α_s + β_s z`, `T = α_t + β_t z`.
pub(super) type RowScales<T> = ((T, T), (T, T));

/// Gate and mix for one row: `z = σ(Σ terms)`, the scales, `T∘t` and the pre-activations `T∘(W e) + S∘(C s)`
/// of the three blocks. (Each pass a plain loop over the row, so that it vectorises.)
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn gate_mix_row<T: Real>(
    terms: [Option<&[T]>; 3],
    t: &[T],
    wp: &[T],
    cp: &[T],
    scales: RowScales<T>,
    z: &mut [T],
    ts: &mut [T],
    pre: &mut [T],
) {
    let h = t.len();
    let ((sa, sb), (ta, tb)) = scales;
    let gated = terms.iter().any(|x| x.is_some());
    if gated {
        let z = &mut z[..h];
        let mut first = true;
        for x in terms.iter().flatten() {
            let x = &x[..h];
            if first {
                z.copy_from_slice(x);
                first = false;
            } else {
                for (a, &y) in z.iter_mut().zip(x) {
                    *a += y;
                }
            }
        }
        for a in z.iter_mut() {
            *a = a.sigmoid_v();
        }
    }
    let zero = [T::zero(); 0];
    let zs: &[T] = if gated { &z[..h] } else { &zero };
    let (t, ts) = (&t[..h], &mut ts[..h]);
    if gated {
        for ((o, &x), &zj) in ts.iter_mut().zip(t).zip(zs) {
            *o = (ta + tb * zj) * x;
        }
    } else {
        for (o, &x) in ts.iter_mut().zip(t) {
            *o = ta * x;
        }
    }
    for blk in 0..pre.len() / h.max(1) {
        let r = blk * h..(blk + 1) * h;
        let (pre, wp, cp) = (&mut pre[r.clone()], &wp[r.clone()], &cp[r]);
        if gated {
            for (((o, &w), &c), &zj) in pre.iter_mut().zip(wp).zip(cp).zip(zs) {
                *o = (ta + tb * zj) * w + (sa + sb * zj) * c;
            }
        } else {
            for ((o, &w), &c) in pre.iter_mut().zip(wp).zip(cp) {
                *o = ta * w + sa * c;
            }
        }
    }
}
simd_dispatch!(gate_mix_row_d, gate_mix_row_avx, gate_mix_row, (terms: [Option<&[T]>; 3], t: &[T], wp: &[T], cp: &[T], scales: RowScales<T>, z: &mut [T], ts: &mut [T], pre: &mut [T]));

/// Backward through the mix and the gate: `∂(W e)` (`dwp`), `∂(C s)` (`dcp`), `∂t_{i−1}` through `T∘t`
/// (`dt`, overwritten) and `∂` of the gate's pre-activation (`dzp`).
#[inline(always)]
#[allow(clippy::too_many_arguments)]
pub(super) fn bwd_mix_row<T: Real>(
    dpre: &[T],
    dts: &[T],
    t: &[T],
    wp: &[T],
    cp: &[T],
    z: &[T],
    scales: RowScales<T>,
    gated: bool,
    dwp: &mut [T],
    dcp: &mut [T],
    dt: &mut [T],
    dzp: &mut [T],
) {
    let h = t.len();
    let ((sa, sb), (ta, tb)) = scales;
    let (dts, t, dt) = (&dts[..h], &t[..h], &mut dt[..h]);
    if !gated {
        for (o, &d) in dt.iter_mut().zip(dts) {
            *o = d * ta;
        }
        for blk in 0..dpre.len() / h.max(1) {
            let r = blk * h..(blk + 1) * h;
            let (dpre, dwp, dcp) = (&dpre[r.clone()], &mut dwp[r.clone()], &mut dcp[r]);
            for ((&d, w), c) in dpre.iter().zip(dwp.iter_mut()).zip(dcp.iter_mut()) {
                *w = d * ta;
                *c = d * sa;
            }
        }
        return;
    }
    let (z, dzp) = (&z[..h], &mut dzp[..h]);
    // ∂z accumulates in `dzp` first: through T∘t, then through each block's mix.
    for ((((o, dz), &d), &x), &zj) in dt.iter_mut().zip(dzp.iter_mut()).zip(dts).zip(t).zip(z) {
        *o = d * (ta + tb * zj);
        *dz = d * x * tb;
    }
    for blk in 0..dpre.len() / h.max(1) {
        let r = blk * h..(blk + 1) * h;
        let (dpre, wp, cp) = (&dpre[r.clone()], &wp[r.clone()], &cp[r.clone()]);
        let (dwp, dcp) = (&mut dwp[r.clone()], &mut dcp[r]);
        for (((((&d, &w), &c), ow), oc), (dz, &zj)) in dpre
            .iter()
            .zip(wp)
            .zip(cp)
            .zip(dwp.iter_mut())
            .zip(dcp.iter_mut())
            .zip(dzp.iter_mut().zip(z))
        {
            *ow = d * (ta + tb * zj);
            *oc = d * (sa + sb * zj);
            *dz += d * (w * tb + c * sb);
        }
    }
    for (dz, &zj) in dzp.iter_mut().zip(z) {
        *dz = *dz * zj * (T::one() - zj);
    }
}
simd_dispatch!(bwd_mix_row_d, bwd_mix_row_avx, bwd_mix_row, (dpre: &[T], dts: &[T], t: &[T], wp: &[T], cp: &[T], z: &[T], scales: RowScales<T>, gated: bool, dwp: &mut [T], dcp: &mut [T], dt: &mut [T], dzp: &mut [T]));

/// What a row of the mix reads besides the gate, in both passes: the state (paper form: ones, as the scale
/// `T` itself is the mix's `T∘t` then) and the word projections `W e + b` of step `i` (the cGRU's context
/// GRU: a zero row, as it has no word input).
pub(super) struct MixRows<'a, T> {
    h: usize,
    kh: usize,
    paper: bool,
    ones: Vec<T>,
    /// The word projections' rows (see `word_offsets`) and each sentence's first row; `None`: the cGRU.
    words: Option<(&'a [T], &'a [usize])>,
    zero: Vec<T>,
}

impl<'a, T: Real> MixRows<'a, T> {
    pub(super) fn new(
        (h, kh): (usize, usize),
        paper: bool,
        words: Option<(&'a [T], &'a [usize])>,
    ) -> Self {
        MixRows {
            h,
            kh,
            paper,
            ones: vec![T::one(); if paper { h } else { 0 }],
            zero: vec![T::zero(); if words.is_none() { kh } else { 0 }],
            words,
        }
    }

    /// Row `r`'s state from the step's states `t_i`.
    #[inline]
    pub(super) fn state<'b>(&'b self, t_i: &'b [T], r: usize) -> &'b [T] {
        if self.paper {
            &self.ones
        } else {
            &t_i[r * self.h..(r + 1) * self.h]
        }
    }

    /// Row `r`'s word projection at step `i`.
    #[inline]
    pub(super) fn word(&self, i: usize, r: usize) -> &[T] {
        match self.words {
            Some((wp, toff)) => &wp[(toff[r] + i) * self.kh..(toff[r] + i + 1) * self.kh],
            None => &self.zero,
        }
    }
}
