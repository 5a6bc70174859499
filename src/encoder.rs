//! Bidirectional GRU encoder (model-spec §1): shared source embedding `E[x] + b_e`, a forward and a backward GRU,
//! annotations `h_j = [→h_j ; ←h_j]`. Input projections of all time steps are one matmul per direction.

use candle_core::{CpuStorage, CustomOp3, DType, IndexOp, Layout, Result, Shape, Tensor, D};
use rayon::prelude::*;

use crate::kernels::{by_dtype, rec_matmul, simd_dispatch, slice, Kernels, Real};
use candle_nn::VarBuilder;

/// GRU cell parameters: `W` = [W_r | W_u | W] (in × 3H), `b` (H, candidate only), `U_ru` = [U_r | U_u] (H × 2H),
/// `U` (H × H).
pub struct Gru {
    pub w: Tensor,
    pub b: Tensor,
    pub u_ru: Tensor,
    pub u: Tensor,
    pub hidden: usize,
    pub kernels: Kernels,
}

impl Gru {
    pub fn new(vb: VarBuilder, input: usize, hidden: usize) -> Result<Self> {
        Ok(Self {
            w: vb.get_with_hints((input, 3 * hidden), "W", crate::init::ZERO)?,
            b: vb.get_with_hints(hidden, "b", crate::init::ZERO)?,
            u_ru: vb.get_with_hints((hidden, 2 * hidden), "U_ru", crate::init::ZERO)?,
            u: vb.get_with_hints((hidden, hidden), "U", crate::init::ZERO)?,
            hidden,
            kernels: Kernels::default(),
        })
    }

    /// Input projections `[x W_r, x W_u, x W + b]` of every step: `[N, in]` → `[N, 3H]`.
    pub fn project(&self, x: &Tensor) -> Result<Tensor> {
        let zeros = Tensor::zeros(2 * self.hidden, self.b.dtype(), self.b.device())?;
        let bias = Tensor::cat(&[&zeros, &self.b], 0)?;
        x.matmul(&self.w)?.broadcast_add(&bias)
    }

    /// One step from a projected input `[B, 3H]` and the previous state `[B, H]`.
    pub fn step(&self, xp: &Tensor, h: &Tensor) -> Result<Tensor> {
        self.step_masked(xp, h, None)
    }

    /// One step that keeps the previous state where `mask` (`[B, 1]`) is 0.
    pub fn step_masked(&self, xp: &Tensor, h: &Tensor, mask: Option<&Tensor>) -> Result<Tensor> {
        let hd = self.hidden;
        let k = self.kernels;
        let ru =
            candle_nn::ops::sigmoid(&(xp.narrow(1, 0, 2 * hd)? + rec_matmul(k, h, &self.u_ru)?)?)?;
        let r = ru.narrow(1, 0, hd)?;
        let pre_c = (xp.narrow(1, 2 * hd, hd)? + rec_matmul(k, &(r * h)?, &self.u)?)?;
        // u∘h~ + (1−u)∘h
        gru_update(self.kernels, &ru, &pre_c, h, mask)
    }
}

pub struct Encoder {
    pub emb: Tensor,
    pub emb_b: Tensor,
    pub fwd: Gru,
    pub bwd: Gru,
    pub hidden: usize,
}

/// What the encoder hands to the decoder.
pub struct Encoded {
    /// `[B, S, 2H]`
    pub annotations: Tensor,
    /// Backward state at the first word `←h_1`, `[B, H]`.
    pub bwd_first: Tensor,
}

impl Encoder {
    pub fn new(vb: VarBuilder, vocab: usize, emb_dim: usize, hidden: usize) -> Result<Self> {
        Ok(Self {
            emb: vb.get_with_hints((vocab, emb_dim), "E", crate::init::ZERO)?,
            emb_b: vb.get_with_hints(emb_dim, "b_e", crate::init::ZERO)?,
            fwd: Gru::new(vb.pp("fwd"), emb_dim, hidden)?,
            bwd: Gru::new(vb.pp("bwd"), emb_dim, hidden)?,
            hidden,
        })
    }

    /// `src`: `[B, S]` u32 ids, `mask`: `[B, S]` (1 = word, 0 = padding), in the model dtype.
    pub fn forward(&self, src: &Tensor, mask: &Tensor) -> Result<Encoded> {
        let (b, s) = src.dims2()?;
        let e = self
            .emb
            .embedding(&src.flatten_all()?)?
            .broadcast_add(&self.emb_b)?;
        // Time-major so every step reads a contiguous slice.
        let xf = self
            .fwd
            .project(&e)?
            .reshape((b, s, 3 * self.hidden))?
            .transpose(0, 1)?
            .contiguous()?;
        let xb = self
            .bwd
            .project(&e)?
            .reshape((b, s, 3 * self.hidden))?
            .transpose(0, 1)?
            .contiguous()?;
        let m = mask.transpose(0, 1)?.contiguous()?.unsqueeze(D::Minus1)?; // [S, B, 1]
        let h0 = Tensor::zeros((b, self.hidden), e.dtype(), e.device())?;
        // With fused kernels each step reads its slice of the projections through a shared handle, so the
        // backward pass adds the steps' gradients in place instead of building a full-size tensor per step.
        let steps = |x: &Tensor, k: Kernels| -> Result<Vec<Tensor>> {
            if k.fused_on(x.device()) {
                let sh = crate::kernels::Shared::new(x)?;
                (0..s).map(|t| sh.index(t)).collect()
            } else {
                (0..s).map(|t| x.i(t)).collect()
            }
        };
        let (xf, xb) = (steps(&xf, self.fwd.kernels)?, steps(&xb, self.bwd.kernels)?);
        let mut fwd = Vec::with_capacity(s);
        let mut h = h0.clone();
        for t in 0..s {
            h = self.fwd.step_masked(&xf[t], &h, Some(&m.i(t)?))?;
            fwd.push(h.clone());
        }
        let mut bwd = vec![h0.clone(); s];
        let mut h = h0;
        for t in (0..s).rev() {
            h = self.bwd.step_masked(&xb[t], &h, Some(&m.i(t)?))?;
            bwd[t] = h.clone();
        }
        let annotations = Tensor::cat(&[Tensor::stack(&fwd, 1)?, Tensor::stack(&bwd, 1)?], 2)?;
        Ok(Encoded {
            annotations,
            bwd_first: bwd[0].clone(),
        })
    }
}

/// The GRU update `h' = base + m∘u∘(tanh(pre_c) − base)` from the gates `ru = [r | u]` `[B, 2H]` (after the
/// sigmoid), the candidate's pre-activation `pre_c` `[B, H]` and the state it interpolates with `base`
/// `[B, H]`; `m` is the optional per-row padding mask (the encoder keeps the state on padding). Composed
/// reference.
pub fn gru_update_reference(
    ru: &Tensor,
    pre_c: &Tensor,
    base: &Tensor,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let h = base.dim(1)?;
    let u = ru.narrow(1, h, h)?;
    let hn = (base + (u * (pre_c.tanh()? - base)?)?)?;
    match mask {
        Some(m) => base + m.broadcast_mul(&(hn - base)?)?,
        None => Ok(hn),
    }
}

/// The same update as one fused kernel with a hand-derived backward pass.
pub fn gru_update_fused(
    ru: &Tensor,
    pre_c: &Tensor,
    base: &Tensor,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    let mask = match mask {
        Some(m) => Some(m.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?),
        None => None,
    };
    ru.contiguous()?.apply_op3(
        &pre_c.contiguous()?,
        &base.contiguous()?,
        GruUpdate { mask },
    )
}

/// Reference or fused update, as `kernels` and the device say.
pub fn gru_update(
    kernels: Kernels,
    ru: &Tensor,
    pre_c: &Tensor,
    base: &Tensor,
    mask: Option<&Tensor>,
) -> Result<Tensor> {
    if kernels.fused_on(ru.device()) {
        gru_update_fused(ru, pre_c, base, mask)
    } else {
        gru_update_reference(ru, pre_c, base, mask)
    }
}

struct GruUpdate {
    mask: Option<Vec<f64>>,
}

#[inline(always)]
fn gru_update_row<T: Real>(ru: &[T], pc: &[T], base: &[T], m: T, out: &mut [T]) {
    let h = base.len();
    let u = &ru[h..2 * h];
    for k in 0..h {
        out[k] = base[k] + m * u[k] * (pc[k].tanh_v() - base[k]);
    }
}
simd_dispatch!(gru_update_row_d, gru_update_row_avx, gru_update_row, (ru: &[T], pc: &[T], base: &[T], m: T, out: &mut [T]));

/// Packed gradient row `[d_ru (2H) | d_pre_c (H) | d_base (H)]`.
#[inline(always)]
fn gru_update_grad_row<T: Real>(ru: &[T], pc: &[T], base: &[T], m: T, g: &[T], out: &mut [T]) {
    let h = base.len();
    let u = &ru[h..2 * h];
    let (d_ru, rest) = out.split_at_mut(2 * h);
    let (d_pc, d_base) = rest.split_at_mut(h);
    for k in 0..h {
        let c = pc[k].tanh_v();
        let gm = g[k] * m;
        d_ru[k] = T::zero();
        d_ru[h + k] = gm * (c - base[k]);
        d_pc[k] = gm * u[k] * (T::one() - c * c);
        d_base[k] = g[k] - gm * u[k];
    }
}
simd_dispatch!(gru_update_grad_row_d, gru_update_grad_row_avx, gru_update_grad_row, (ru: &[T], pc: &[T], base: &[T], m: T, g: &[T], out: &mut [T]));

fn gru_update_fwd<T: Real>(
    mask: &Option<Vec<f64>>,
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
    s3: &CpuStorage,
    l3: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let (b, h) = l3.shape().dims2()?;
    let ru = slice::<T>(s1, l1)?;
    let pc = slice::<T>(s2, l2)?;
    let base = slice::<T>(s3, l3)?;
    if ru.len() != 2 * b * h || pc.len() != b * h || mask.as_ref().is_some_and(|m| m.len() != b) {
        candle_core::bail!("fused GRU update: shape mismatch");
    }
    let mut out = vec![T::zero(); b * h];
    let row = |i: usize, o: &mut [T]| {
        let m = mask.as_ref().map_or(T::one(), |m| T::from_f64c(m[i]));
        gru_update_row_d(
            &ru[2 * i * h..2 * (i + 1) * h],
            &pc[i * h..(i + 1) * h],
            &base[i * h..(i + 1) * h],
            m,
            o,
        )
    };
    if b * h >= PAR_MIN {
        out.par_chunks_mut(h)
            .enumerate()
            .for_each(|(i, o)| row(i, o));
    } else {
        out.chunks_mut(h).enumerate().for_each(|(i, o)| row(i, o));
    }
    Ok((T::to_cpu_storage_owned(out), Shape::from((b, h))))
}

/// Below this many elements the GRU kernels run on the calling thread.
const PAR_MIN: usize = 16 * 1024;

impl CustomOp3 for GruUpdate {
    fn name(&self) -> &'static str {
        "fused-gru-update"
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
        by_dtype!(s1, gru_update_fwd, &self.mask, s1, l1, s2, l2, s3, l3)
    }
    fn bwd(
        &self,
        ru: &Tensor,
        pre_c: &Tensor,
        base: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let h = base.dim(1)?;
        let packed = ru.apply_op3_no_bwd(
            pre_c,
            base,
            &GruUpdateGrad {
                mask: self.mask.clone(),
                grad: grad.contiguous()?,
            },
        )?;
        Ok((
            Some(packed.narrow(1, 0, 2 * h)?),
            Some(packed.narrow(1, 2 * h, h)?),
            Some(packed.narrow(1, 3 * h, h)?),
        ))
    }
}

struct GruUpdateGrad {
    mask: Option<Vec<f64>>,
    grad: Tensor,
}

#[allow(clippy::too_many_arguments)]
fn gru_update_grad<T: Real>(
    mask: &Option<Vec<f64>>,
    grad: &Tensor,
    s1: &CpuStorage,
    l1: &Layout,
    s2: &CpuStorage,
    l2: &Layout,
    s3: &CpuStorage,
    l3: &Layout,
) -> Result<(CpuStorage, Shape)> {
    let (b, h) = l3.shape().dims2()?;
    let ru = slice::<T>(s1, l1)?;
    let pc = slice::<T>(s2, l2)?;
    let base = slice::<T>(s3, l3)?;
    let g: Vec<T> = grad.flatten_all()?.to_vec1()?;
    let w = 4 * h;
    let mut out = vec![T::zero(); b * w];
    let row = |i: usize, o: &mut [T]| {
        let m = mask.as_ref().map_or(T::one(), |m| T::from_f64c(m[i]));
        gru_update_grad_row_d(
            &ru[2 * i * h..2 * (i + 1) * h],
            &pc[i * h..(i + 1) * h],
            &base[i * h..(i + 1) * h],
            m,
            &g[i * h..(i + 1) * h],
            o,
        )
    };
    if b * h >= PAR_MIN {
        out.par_chunks_mut(w)
            .enumerate()
            .for_each(|(i, o)| row(i, o));
    } else {
        out.chunks_mut(w).enumerate().for_each(|(i, o)| row(i, o));
    }
    Ok((T::to_cpu_storage_owned(out), Shape::from((b, w))))
}

impl CustomOp3 for GruUpdateGrad {
    fn name(&self) -> &'static str {
        "fused-gru-update-grad"
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
        by_dtype!(
            s1,
            gru_update_grad,
            &self.mask,
            &self.grad,
            s1,
            l1,
            s2,
            l2,
            s3,
            l3
        )
    }
}
