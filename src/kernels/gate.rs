//! The context gate's mix as a fused op (model-spec §4): `T∘a + S∘b` for target-side terms `a` and source-side
//! terms `b`, the scales `S`, `T` formed from the gate value `z` as `α + β·z` ([`GateKinds`], [`ZKind`]). Its
//! composed reference is [`crate::model::gate::mix_reference`], over the concept's scales; the gate itself is
//! [`crate::model::gate`].

use candle_core::{CpuStorage, CustomOp3, Layout, Result, Shape, Tensor, WithDType};

use crate::kernels::{by_dtype, simd_dispatch, slice, Real};

/// How a scale depends on the gate value `z`: `1`, `z` or `1 − z`, times a constant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ZKind {
    One,
    Z,
    OneMinusZ,
}

impl ZKind {
    /// The scale `c·kind(z)` as `α + β·z`: `(α, β)` (`β` is also its derivative in `z`). The one
    /// parametrisation of the gate's scales: decoding's fused mix, the fused training op
    /// (`decoder_sequence::gate_mix`) and the reference's [`Scale`](crate::model::gate::Scale)s are all built
    /// from it.
    #[inline(always)]
    pub fn affine<T: Real>(self, c: T) -> (T, T) {
        match self {
            ZKind::One => (c, T::zero()),
            ZKind::Z => (T::zero(), c),
            ZKind::OneMinusZ => (c, -c),
        }
    }
}

/// A gate's two scales as functions of its value: `src = c_s·kind_s(z)`, `tgt = c_t·kind_t(z)` (the table
/// in [`crate::model::gate`]; the constants are the context scale `(a, b)`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GateKinds {
    pub src: (ZKind, f64),
    pub tgt: (ZKind, f64),
}

impl GateKinds {
    /// `((α_s, β_s), (α_t, β_t))`: the source and target scales as `α + β·z`.
    #[inline(always)]
    pub fn affine<T: Real>(&self) -> ((T, T), (T, T)) {
        (
            self.src.0.affine(T::from_f64c(self.src.1)),
            self.tgt.0.affine(T::from_f64c(self.tgt.1)),
        )
    }
}

/// A context gate's value and its scales, for the fused mix of decoding's step.
#[derive(Debug, Clone)]
pub struct GateMix {
    pub z: Tensor,
    pub kinds: GateKinds,
}

/// [`crate::model::gate::mix_reference`] as one fused kernel from the gate value (a context gate's [`GateMix`]).
pub fn mix_fused(a: &Tensor, b: &Tensor, m: &GateMix) -> Result<Tensor> {
    a.contiguous()?.apply_op3(
        &b.contiguous()?,
        &m.z.contiguous()?,
        MixOp { kinds: m.kinds },
    )
}

struct MixOp {
    kinds: GateKinds,
}

#[inline(always)]
fn mix_row<T: Real>(a: &[T], b: &[T], z: &[T], out: &mut [T], kinds: GateKinds) {
    let h = z.len();
    let k = a.len() / h;
    let ((sa, sb), (ta, tb)) = kinds.affine::<f64>();
    for j in 0..h {
        let zj = WithDType::to_f64(z[j]);
        let (s, t) = (T::from_f64c(sa + sb * zj), T::from_f64c(ta + tb * zj));
        for blk in 0..k {
            let i = blk * h + j;
            out[i] = t * a[i] + s * b[i];
        }
    }
}
simd_dispatch!(mix_row_d, mix_row_avx, mix_row, (a: &[T], b: &[T], z: &[T], out: &mut [T], kinds: GateKinds));

/// Packed gradient row `[∂a (kH) | ∂b (kH) | ∂z (H)]`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn mix_grad_row<T: Real>(a: &[T], b: &[T], z: &[T], g: &[T], out: &mut [T], kinds: GateKinds) {
    let h = z.len();
    let kh = a.len();
    let k = kh / h;
    let (da, rest) = out.split_at_mut(kh);
    let (db, dz) = rest.split_at_mut(kh);
    let ((sa, sb), (ta, tb)) = kinds.affine::<f64>();
    for j in 0..h {
        let zj = WithDType::to_f64(z[j]);
        let (s, ds, t, dt) = (
            T::from_f64c(sa + sb * zj),
            T::from_f64c(sb),
            T::from_f64c(ta + tb * zj),
            T::from_f64c(tb),
        );
        let mut acc = T::zero();
        for blk in 0..k {
            let i = blk * h + j;
            da[i] = g[i] * t;
            db[i] = g[i] * s;
            acc += g[i] * (a[i] * dt + b[i] * ds);
        }
        dz[j] = acc;
    }
}
simd_dispatch!(mix_grad_row_d, mix_grad_row_avx, mix_grad_row, (a: &[T], b: &[T], z: &[T], g: &[T], out: &mut [T], kinds: GateKinds));

fn mix_fwd<T: Real>(
    op: &MixOp,
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
    s3: &CpuStorage,
    l3: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let (n, kh) = l1.shape().dims2()?;
    let (_, h) = l3.shape().dims2()?;
    let (a, b, z) = (
        slice::<T>(s1, l1)?,
        slice::<T>(s2, l2)?,
        slice::<T>(s3, l3)?,
    );
    if b.len() != n * kh || z.len() != n * h || kh % h != 0 {
        candle_core::bail!(
            "fused gate mix: the inputs are [N {n}, kH {kh}], the second must hold N·kH = {} values (has {}) and \
             the gate N·H = {} (has {}) for H {h}, and kH must be a multiple of H",
            n * kh,
            b.len(),
            n * h,
            z.len()
        );
    }
    let mut out = vec![T::zero(); n * kh];
    out.chunks_mut(kh).enumerate().for_each(|(i, o)| {
        mix_row_d(
            &a[i * kh..(i + 1) * kh],
            &b[i * kh..(i + 1) * kh],
            &z[i * h..(i + 1) * h],
            o,
            op.kinds,
        )
    });
    Ok((T::to_cpu_storage_owned(out), Shape::from((n, kh))))
}

impl CustomOp3 for MixOp {
    fn name(&self) -> &'static str {
        "fused-gate-mix"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        by_dtype!(s1, mix_fwd, self, s1, l1, s2, l2, s3, l3)
    }
    fn bwd(
        &self,
        a: &Tensor,
        b: &Tensor,
        z: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (_, kh) = a.dims2()?;
        let h = z.dim(1)?;
        let op = MixGrad {
            kinds: self.kinds,
            grad: grad.contiguous()?,
        };
        let packed = a.apply_op3_no_bwd(b, z, &op)?;
        Ok((
            Some(packed.narrow(1, 0, kh)?),
            Some(packed.narrow(1, kh, kh)?),
            Some(packed.narrow(1, 2 * kh, h)?),
        ))
    }
}

struct MixGrad {
    kinds: GateKinds,
    grad: Tensor,
}

fn mix_grad<T: Real>(
    op: &MixGrad,
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
    s3: &CpuStorage,
    l3: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let (n, kh) = l1.shape().dims2()?;
    let (_, h) = l3.shape().dims2()?;
    let (a, b, z) = (
        slice::<T>(s1, l1)?,
        slice::<T>(s2, l2)?,
        slice::<T>(s3, l3)?,
    );
    let g: Vec<T> = op.grad.flatten_all()?.to_vec1()?;
    let w = 2 * kh + h;
    let mut out = vec![T::zero(); n * w];
    out.chunks_mut(w).enumerate().for_each(|(i, o)| {
        mix_grad_row_d(
            &a[i * kh..(i + 1) * kh],
            &b[i * kh..(i + 1) * kh],
            &z[i * h..(i + 1) * h],
            &g[i * kh..(i + 1) * kh],
            o,
            op.kinds,
        )
    });
    Ok((T::to_cpu_storage_owned(out), Shape::from((n, w))))
}

impl CustomOp3 for MixGrad {
    fn name(&self) -> &'static str {
        "fused-gate-mix-grad"
    }
    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        by_dtype!(s1, mix_grad, self, s1, l1, s2, l2, s3, l3)
    }
}
