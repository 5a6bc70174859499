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
//! [`crate::model::gru::Gru::step_dropped`]). Each sentence's masks are drawn from its own streams, keyed by
//! its index in the training corpus (see [`Dropper`]), so they do not depend on how the batch is split among
//! processes. The masks are plain tensors multiplied in the graph, except on the
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

/// Where a mask applies. Each site of each sentence has its own stream of random numbers (see [`Dropper`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Site {
    SourceEmbeddings = 0,
    EncoderForward = 1,
    EncoderBackward = 2,
    Annotations = 3,
    TargetEmbeddings = 4,
    Decoder = 5,
    Readout = 6,
}

/// Draws the masks of one pass, sentence by sentence: the values of sentence `b`'s rows at a site come from a
/// generator seeded by the pass's seed (`train.seed` and the update), the site and the sentence's **key** (its
/// index in the training corpus), and are drawn position by position, unit by unit. So a sentence's masks do
/// not depend on which other sentences share its batch, on their order, or on the padded length: one process,
/// N ranks (each with its share of the global batch), a resume at another N, and the fused and composed
/// paths (which keep a different number of padded rows) see the same masks for the same sentence.
pub struct Dropper {
    /// The pass's seed and the keys of the batch's sentences, in row order.
    stream: Option<(u64, Vec<u64>)>,
}

impl Dropper {
    /// Drops nothing.
    pub fn none() -> Self {
        Self { stream: None }
    }

    /// The masks of a pass with dropout `d` over sentences whose keys are `keys` (in the batch's row order).
    pub fn new(d: Option<&Dropout>, keys: &[u64]) -> Self {
        Self {
            stream: d.filter(|d| d.is_active()).map(|d| (d.seed, keys.to_vec())),
        }
    }

    /// The masks of layer `l`'s instance of the sites (an encoder layer above the first): layer 1 is this
    /// dropper itself; each layer above draws from a stream of its own (the pass's seed moved by the layer).
    pub fn layer(&self, l: u64) -> Dropper {
        if l <= 1 {
            return Dropper {
                stream: self.stream.clone(),
            };
        }
        Dropper {
            stream: self.stream.as_ref().map(|(seed, keys)| {
                (
                    seed ^ 0x9e37_79b9_7f4a_7c15_u64.wrapping_mul(l),
                    keys.clone(),
                )
            }),
        }
    }

    /// `x` (rows grouped by sentence, see [`Dropper::mask`]) with each value zeroed with probability `p` and
    /// the others scaled by `1 / (1 − p)`; `x` itself when `p` is 0 or nothing drops.
    pub fn apply(&self, x: &Tensor, site: Site, p: f64) -> Result<Tensor> {
        match self.mask(x, site, p)? {
            Some(mask) => x.mul(&mask),
            None => Ok(x.clone()),
        }
    }

    /// The mask [`Dropper::apply`] would multiply `x` with (`x`'s shape and dtype), or `None` when nothing
    /// drops. `x`'s values split evenly among the sentences, in batch order: `[B, ·]`, `[B, S, ·]` or
    /// `[B·S, ·]` with batch-major rows.
    pub fn mask(&self, x: &Tensor, site: Site, p: f64) -> Result<Option<Tensor>> {
        self.mask_shaped(x.shape().clone(), x, site, p)
    }

    /// A mask of `shape` in `like`'s dtype and device (see [`Dropper::mask`]).
    pub fn mask_shaped(
        &self,
        shape: impl Into<candle_core::Shape>,
        like: &Tensor,
        site: Site,
        p: f64,
    ) -> Result<Option<Tensor>> {
        let shape = shape.into();
        let b = self.stream.as_ref().map_or(1, |(_, k)| k.len().max(1));
        let n = shape.elem_count();
        if n % b != 0 {
            candle_core::bail!(
                "dropout: a mask of shape {shape:?} does not split evenly among {b} sentences"
            );
        }
        let per = vec![n / b; b];
        self.mask_ragged(&per, shape, like, site, p)
    }

    /// A mask of `shape` whose first `counts[b]` values (in row-major order, after those of the sentences
    /// before) belong to sentence `b`: the form of a tensor that keeps only each sentence's words (e.g.
    /// `[Σ len_b, W]`, batch-major).
    pub fn mask_ragged(
        &self,
        counts: &[usize],
        shape: impl Into<candle_core::Shape>,
        like: &Tensor,
        site: Site,
        p: f64,
    ) -> Result<Option<Tensor>> {
        let Some((seed, keys)) = &self.stream else {
            return Ok(None);
        };
        if p <= 0.0 {
            return Ok(None);
        }
        let shape = shape.into();
        if counts.len() != keys.len() || counts.iter().sum::<usize>() != shape.elem_count() {
            candle_core::bail!(
                "dropout: a mask of shape {shape:?} split as {counts:?} among {} sentences",
                keys.len()
            );
        }
        let keep = (1.0 / (1.0 - p)) as f32;
        let mut m = Vec::with_capacity(shape.elem_count());
        for (&key, &count) in keys.iter().zip(counts) {
            let mut rng = StdRng::seed_from_u64(sentence_seed(*seed, site, key));
            m.extend((0..count).map(|_| if rng.random::<f64>() < p { 0.0 } else { keep }));
        }
        Ok(Some(
            Tensor::from_vec(m, shape, like.device())?.to_dtype(like.dtype())?,
        ))
    }
}

/// Word dropout: `ids` with each word replaced by `unk` with probability `p`, drawn from a stream of its own
/// for the sentence `key` (its corpus index) on `side` (0 source, 1 target) in the pass seeded with `seed` (the
/// update's [`Dropout::step_seed`]): the same words drop at any number of ranks.
pub fn word_dropout(ids: &[u32], p: f64, unk: u32, seed: u64, key: u64, side: u64) -> Vec<u32> {
    if p <= 0.0 {
        return ids.to_vec();
    }
    let mut rng = StdRng::seed_from_u64(word_dropout_seed(seed, key, side));
    ids.iter()
        .map(|&w| if rng.random::<f64>() < p { unk } else { w })
        .collect()
}

/// The seed of sentence `key`'s stream number `stream` of the words (0 and 1: word dropout on the source and
/// target sides; 2 and 3: their BPE-dropout) in the pass seeded with `seed`. (The pass's seed is moved by the
/// stream, so that the words' streams are apart from the masks'.)
pub fn word_dropout_seed(seed: u64, key: u64, stream: u64) -> u64 {
    let words_seed = seed ^ 0xa076_1d64_78bd_642f_u64.wrapping_mul(stream + 1);
    sentence_seed(words_seed, Site::SourceEmbeddings, key)
}

/// The seed of a sentence's stream at a site in a pass seeded with `seed` (SplitMix64's finaliser over the
/// three, so that nearby keys give unrelated streams).
fn sentence_seed(seed: u64, site: Site, key: u64) -> u64 {
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    mix(seed ^ mix(key.wrapping_mul(8).wrapping_add(site as u64 + 1)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{DType, Device};

    fn values(t: Option<Tensor>) -> Vec<f32> {
        t.unwrap().flatten_all().unwrap().to_vec1().unwrap()
    }

    #[test]
    fn masks_drop_about_p_keep_the_mean_and_repeat_with_the_seed() {
        let x = Tensor::ones((200, 50), DType::F32, &Device::Cpu).unwrap();
        let d = Dropout {
            embeddings: 0.3,
            annotations: 0.0,
            readout: 0.0,
            recurrent: 0.0,
            seed: 11,
        };
        let keys: Vec<u64> = (0..20).collect();
        let dropped = |d: Option<&Dropout>| -> Vec<f32> {
            let drop = match d {
                Some(d) => Dropper::new(Some(d), &keys),
                None => Dropper::none(),
            };
            let y = drop.apply(&x, Site::SourceEmbeddings, 0.3).unwrap();
            y.flatten_all().unwrap().to_vec1().unwrap()
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

    /// A sentence's mask is the same whatever batch it is in: split the batch in shares (as MPI ranks do),
    /// reorder it, pad it to another length, or keep only its words; sites and sentences differ.
    #[test]
    fn a_sentences_masks_do_not_depend_on_the_batch_split() {
        let d = Dropout {
            embeddings: 0.4,
            annotations: 0.4,
            readout: 0.4,
            recurrent: 0.4,
            seed: Dropout::step_seed(3, 17),
        };
        let like = Tensor::zeros(1, DType::F32, &Device::Cpu).unwrap();
        let (s, w) = (9, 5);
        // The whole batch, keys = corpus indices, rows (b, j) batch-major.
        let keys = [40u64, 7, 1003, 12, 8, 99];
        let whole = values(
            Dropper::new(Some(&d), &keys)
                .mask_shaped((keys.len() * s, w), &like, Site::SourceEmbeddings, 0.4)
                .unwrap(),
        );
        let rows_of = |v: &[f32], b: usize, len: usize| v[b * s * w..b * s * w + len * w].to_vec();
        // Every other sentence (rank 1 of 2), in another order, padded to 6 positions only.
        let share = [keys[5], keys[1], keys[3]];
        let part = values(
            Dropper::new(Some(&d), &share)
                .mask_shaped((share.len() * 6, w), &like, Site::SourceEmbeddings, 0.4)
                .unwrap(),
        );
        for (i, b) in [5, 1, 3].into_iter().enumerate() {
            assert_eq!(
                part[i * 6 * w..(i + 1) * 6 * w],
                rows_of(&whole, b, 6)[..],
                "sentence {b}"
            );
        }
        // Words only (ragged rows): lengths 3, 9 and 1 of sentences 0, 2, 4.
        let sub = [keys[0], keys[2], keys[4]];
        let lens = [3, 9, 1];
        let counts: Vec<usize> = lens.iter().map(|l| l * w).collect();
        let ragged = values(
            Dropper::new(Some(&d), &sub)
                .mask_ragged(&counts, (13, w), &like, Site::SourceEmbeddings, 0.4)
                .unwrap(),
        );
        let expect: Vec<f32> = [(0, 3), (2, 9), (4, 1)]
            .iter()
            .flat_map(|&(b, l)| rows_of(&whole, b, l))
            .collect();
        assert_eq!(ragged, expect);
        // Other sites and other sentences draw other values.
        let other_site = values(
            Dropper::new(Some(&d), &keys)
                .mask_shaped((keys.len() * s, w), &like, Site::TargetEmbeddings, 0.4)
                .unwrap(),
        );
        assert_ne!(whole, other_site);
        assert_ne!(rows_of(&whole, 0, s), rows_of(&whole, 1, s));
        // A shape that does not split among the sentences is an error, not a misaligned mask.
        assert!(Dropper::new(Some(&d), &keys)
            .mask_shaped((7, w), &like, Site::Readout, 0.4)
            .is_err());
    }
}
