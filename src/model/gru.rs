//! The GRU (model-spec §1 and §3), defined once: the cell's parameters and its step ([`Gru`]). Its update
//! `h' = h + m∘u∘(h~ − h)` as a composed reference and a fused op ([`gru_update`]), and the row kernels of a
//! step's forward and backward passes ([`gru_step_forward`](crate::kernels::gru::gru_step_forward),
//! [`GruStep::backward`](crate::kernels::gru::GruStep::backward)) that the encoder's two directions
//! ([`crate::kernels::encoder`]) and the decoder's fused recurrence (`decoder_sequence`) both run,
//! are in [`crate::kernels::gru`]. The decoder's readable step (`decoder_cell`) uses [`Gru`] and
//! [`gru_update`]; the gradient checks that tie each fused form to its reference are in `tests/it/kernels/`.

use candle_core::{Result, Tensor};
use candle_nn::VarBuilder;

use crate::kernels::gru::gru_update;
use crate::kernels::{rec_matmul, Kernels};
use crate::model::layer_norm::{norm, LayerNorm};

/// GRU cell parameters: `W` = [W_r | W_u | W] (in × 3H), `b` (H, candidate only), `U_ru` = [U_r | U_u] (H × 2H),
/// `U` (H × H); with layer normalisation (`ln`), its gains and biases.
pub struct Gru {
    pub w: Tensor,
    pub b: Tensor,
    pub u_ru: Tensor,
    pub u: Tensor,
    pub hidden: usize,
    pub ln: Option<GruNorm>,
}

/// A GRU's layer normalisations (model-spec §5b): of its input projections `x W` in blocks `[2H | H]`
/// (`ln_W`), and of its recurrent products `h U_ru` (`ln_U_ru`, one block of 2H) and `(r∘h) U` (`ln_U`).
pub struct GruNorm {
    pub w: LayerNorm,
    pub rec: RecNorm,
}

/// A GRU's layer normalisations of its recurrent products `h U_ru` and `(r∘h) U`.
pub struct RecNorm {
    pub u_ru: LayerNorm,
    pub u: LayerNorm,
}

impl RecNorm {
    /// `ln_U_ru` and `ln_U` under `vb` for width `hidden`.
    pub fn new(vb: &VarBuilder, hidden: usize) -> Result<Self> {
        Ok(RecNorm {
            u_ru: LayerNorm::new(vb.pp("ln_U_ru"), &[2 * hidden])?,
            u: LayerNorm::new(vb.pp("ln_U"), &[hidden])?,
        })
    }
}

impl Gru {
    /// The paper's GRU (no layer normalisation).
    pub fn new(vb: VarBuilder, input: usize, hidden: usize) -> Result<Self> {
        Self::new_normed(vb, input, hidden, false)
    }

    /// A GRU with layer normalisation when `layer_norm` (`model.layer_norm`).
    pub fn new_normed(
        vb: VarBuilder,
        input: usize,
        hidden: usize,
        layer_norm: bool,
    ) -> Result<Self> {
        let ln = if layer_norm {
            Some(GruNorm {
                w: LayerNorm::new(vb.pp("ln_W"), &[2 * hidden, hidden])?,
                rec: RecNorm::new(&vb, hidden)?,
            })
        } else {
            None
        };
        Ok(Self {
            w: vb.get_with_hints((input, 3 * hidden), "W", crate::model::init::ZERO)?,
            b: vb.get_with_hints(hidden, "b", crate::model::init::ZERO)?,
            u_ru: vb.get_with_hints((hidden, 2 * hidden), "U_ru", crate::model::init::ZERO)?,
            u: vb.get_with_hints((hidden, hidden), "U", crate::model::init::ZERO)?,
            hidden,
            ln,
        })
    }

    /// Input projections `[x W_r, x W_u, x W + b]` of every step: `[N, in]` → `[N, 3H]` (normalised in
    /// blocks `[2H | H]` with layer normalisation).
    pub fn project(&self, k: Kernels, x: &Tensor) -> Result<Tensor> {
        let zeros = Tensor::zeros(2 * self.hidden, self.b.dtype(), self.b.device())?;
        let bias = Tensor::cat(&[&zeros, &self.b], 0)?;
        norm(
            k,
            self.ln.as_ref().map(|n| &n.w),
            crate::kernels::linear(k, x, &self.w, &bias)?,
        )
    }

    /// One step from a projected input `[B, 3H]` and the previous state `[B, H]`.
    pub fn step(&self, k: Kernels, xp: &Tensor, h: &Tensor) -> Result<Tensor> {
        self.step_masked(k, xp, h, None)
    }

    /// One step that keeps the previous state where `mask` (`[B, 1]`) is 0.
    pub fn step_masked(
        &self,
        k: Kernels,
        xp: &Tensor,
        h: &Tensor,
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        self.step_dropped(k, xp, h, mask, None)
    }

    /// [`Gru::step_masked`] under recurrent dropout: the recurrent products read `d∘h` (`drop`: the masks
    /// `[B, H]`), the interpolation `h` itself (see [`crate::kernels::gru::gru_step_forward`]).
    pub fn step_dropped(
        &self,
        k: Kernels,
        xp: &Tensor,
        h: &Tensor,
        mask: Option<&Tensor>,
        drop: Option<&Tensor>,
    ) -> Result<Tensor> {
        gru_step(
            k,
            xp,
            h,
            mask,
            drop,
            (&self.u_ru, &self.u),
            self.ln.as_ref().map(|n| &n.rec),
        )
    }
}

/// One GRU step from the input terms `xp` `[B, 3H]` of `[r | u | h~]` and the previous state `h` `[B, H]`,
/// with the recurrent weights `(U_ru, U)`: `[r | u] = σ(xp_ru + (d∘h) U_ru)`, `h~ = tanh(xp_c + (r∘d∘h) U)`,
/// `h' = h + m∘u∘(h~ − h)` (`drop`: recurrent dropout's masks `d`; `mask`: the padding mask `m` `[B, 1]`).
/// With layer normalisation (`ln`), each product is normalised before the sum. The composed form of
/// [`crate::kernels::gru::gru_step_forward`].
pub fn gru_step(
    k: Kernels,
    xp: &Tensor,
    h: &Tensor,
    mask: Option<&Tensor>,
    drop: Option<&Tensor>,
    (u_ru, u): (&Tensor, &Tensor),
    ln: Option<&RecNorm>,
) -> Result<Tensor> {
    let hd = u.dim(0)?;
    let hm = match drop {
        Some(d) => (h * d)?,
        None => h.clone(),
    };
    let hu = norm(k, ln.map(|n| &n.u_ru), rec_matmul(k, &hm, u_ru)?)?;
    let ru = crate::kernels::sigmoid(k, &(xp.narrow(1, 0, 2 * hd)? + hu)?)?;
    let r = ru.narrow(1, 0, hd)?;
    let rc = norm(k, ln.map(|n| &n.u), rec_matmul(k, &(r * &hm)?, u)?)?;
    let pre_c = (xp.narrow(1, 2 * hd, hd)? + rc)?;
    // u∘h~ + (1−u)∘h
    gru_update(k, &ru, &pre_c, h, mask)
}
