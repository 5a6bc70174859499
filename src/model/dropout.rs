//! Dropout (training only): inverted dropout masks drawn from a seeded generator, so that a training update is
//! the same function of its inputs every time it is computed (resuming, rolling back after a divergence, and
//! the finite-difference gradient checks, which evaluate one update's loss many times).
//!
//! A kept value is scaled by `1 / (1 − p)`, so decoding (which drops nothing) sees activations of the same
//! expected size. Where it applies: the source and target word embeddings (`train.embedding_dropout`), the
//! encoder's annotations `h_j` that attention, the initial state and the context read
//! (`train.annotation_dropout`), the readout layer's output `t̃_i`, the input of the output layer
//! (`train.readout_dropout`), and the recurrent connections (`train.recurrent_dropout`): variational dropout
//! on the previous state where the GRU's recurrent products `U_ru`, `U` read it, in both encoder directions
//! and in the decoder's transition, one mask per sentence and unit that every step of the sentence shares
//! (the interpolation `h = h_prev + u∘(h~ − h_prev)` keeps the state itself; see
//! [`crate::model::gru::Gru::step_dropped`]). The masks are plain tensors multiplied in the graph, except on the
//! annotations of the fused training path, which are a shared tensor ([`crate::kernels::dropout_shared`]),
//! and inside the fused recurrences, which read the recurrent masks as values.

use candle_core::{Result, Tensor};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The dropout rates of one training pass and the seed of its masks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dropout {
    /// Rate on the source and target word embeddings.
    pub embeddings: f64,
    /// Rate on the encoder's annotations.
    pub annotations: f64,
    /// Rate on the readout's output (the output layer's input).
    pub readout: f64,
    /// Rate on the recurrent connections (the state the encoder's and decoder's recurrent products read).
    pub recurrent: f64,
    /// Seed of this pass's masks (training derives one per update from `train.seed`).
    pub seed: u64,
}

impl Dropout {
    /// The seed of update `step` of a run seeded with `seed` (a fixed mix of the two).
    pub fn step_seed(seed: u64, step: u64) -> u64 {
        seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)
            ^ step.wrapping_add(1).wrapping_mul(0xbf58_476d_1ce4_e5b9)
    }

    pub fn is_active(&self) -> bool {
        self.embeddings > 0.0
            || self.annotations > 0.0
            || self.readout > 0.0
            || self.recurrent > 0.0
    }
}

/// Draws the masks of one pass, in a fixed order (source embeddings, the encoder's recurrent masks forward then
/// backward, annotations, target embeddings, the decoder's recurrent mask, readout).
pub struct Dropper {
    rng: Option<StdRng>,
}

impl Dropper {
    /// Drops nothing.
    pub fn none() -> Self {
        Self { rng: None }
    }

    pub fn new(d: Option<&Dropout>) -> Self {
        Self {
            rng: d
                .filter(|d| d.is_active())
                .map(|d| StdRng::seed_from_u64(d.seed)),
        }
    }

    /// `x` with each value zeroed with probability `p` and the others scaled by `1 / (1 − p)`; `x` itself when
    /// `p` is 0 or nothing drops.
    pub fn apply(&mut self, x: &Tensor, p: f64) -> Result<Tensor> {
        match self.mask(x, p)? {
            Some(mask) => x.mul(&mask),
            None => Ok(x.clone()),
        }
    }

    /// The mask [`Dropper::apply`] would multiply `x` with (`x`'s shape and dtype), or `None` when nothing
    /// drops.
    pub fn mask(&mut self, x: &Tensor, p: f64) -> Result<Option<Tensor>> {
        self.mask_shaped(x.shape().clone(), x, p)
    }

    /// A mask of `shape` in `like`'s dtype and device (see [`Dropper::mask`]).
    pub fn mask_shaped(
        &mut self,
        shape: impl Into<candle_core::Shape>,
        like: &Tensor,
        p: f64,
    ) -> Result<Option<Tensor>> {
        match &mut self.rng {
            Some(rng) if p > 0.0 => {
                let shape = shape.into();
                let keep = (1.0 / (1.0 - p)) as f32;
                let m: Vec<f32> = (0..shape.elem_count())
                    .map(|_| if rng.random::<f64>() < p { 0.0 } else { keep })
                    .collect();
                Ok(Some(
                    Tensor::from_vec(m, shape, like.device())?.to_dtype(like.dtype())?,
                ))
            }
            _ => Ok(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn masks_drop_about_p_keep_the_mean_and_repeat_with_the_seed() {
        let x = Tensor::ones((200, 50), candle_core::DType::F32, &Device::Cpu).unwrap();
        let d = Dropout {
            embeddings: 0.3,
            annotations: 0.0,
            readout: 0.0,
            recurrent: 0.0,
            seed: 11,
        };
        let dropped = |d: Option<&Dropout>| -> Vec<f32> {
            let mut drop = match d {
                Some(d) => Dropper::new(Some(d)),
                None => Dropper::none(),
            };
            drop.apply(&x, 0.3)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        let a = dropped(Some(&d));
        let zeros = a.iter().filter(|v| **v == 0.0).count() as f64 / a.len() as f64;
        assert!((zeros - 0.3).abs() < 0.02, "dropped {zeros}");
        let mean = a.iter().sum::<f32>() / a.len() as f32;
        assert!((mean - 1.0).abs() < 0.03, "mean {mean}");
        assert!(a.iter().all(|v| *v == 0.0 || (*v - 1.0 / 0.7).abs() < 1e-6));
        assert_eq!(a, dropped(Some(&d)), "same seed, same mask");
        assert_ne!(
            a,
            dropped(Some(&Dropout { seed: 12, ..d })),
            "another seed, another mask"
        );
        // No dropout at all is the identity.
        assert!(dropped(None).iter().all(|v| *v == 1.0));
        assert_ne!(Dropout::step_seed(1, 0), Dropout::step_seed(1, 1));
        assert_ne!(Dropout::step_seed(1, 5), Dropout::step_seed(2, 5));
    }
}
