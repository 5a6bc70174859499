//! Training batches as the paper makes them: shuffle the corpus (seeded per epoch), read ahead
//! `sort_batches` batches, sort them by length, and cut batches of `batch_size` sentences. The order is a pure
//! function of (seed, epoch), so a resumed run can skip to any batch.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// Training pairs as id sequences (without EOS).
pub struct Corpus {
    pub src: Vec<Vec<u32>>,
    pub tgt: Vec<Vec<u32>>,
}

impl Corpus {
    pub fn len(&self) -> usize {
        self.src.len()
    }
    pub fn is_empty(&self) -> bool {
        self.src.is_empty()
    }
}

/// The batches (lists of pair indices) of one epoch.
pub fn epoch_batches(
    corpus: &Corpus,
    batch_size: usize,
    sort_batches: usize,
    seed: u64,
    epoch: u64,
) -> Vec<Vec<usize>> {
    let mut rng =
        StdRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(epoch));
    let mut order: Vec<usize> = (0..corpus.len()).collect();
    order.shuffle(&mut rng);
    let mut batches = Vec::new();
    for chunk in order.chunks(batch_size * sort_batches) {
        let mut chunk = chunk.to_vec();
        chunk.sort_by_key(|&i| (corpus.tgt[i].len(), corpus.src[i].len()));
        let mut group: Vec<Vec<usize>> = chunk.chunks(batch_size).map(|c| c.to_vec()).collect();
        group.shuffle(&mut rng);
        batches.extend(group);
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_cover_the_corpus_once_and_are_deterministic() {
        let corpus = Corpus {
            src: (0..103).map(|i| vec![1; 1 + i % 7]).collect(),
            tgt: (0..103).map(|i| vec![1; 1 + (i * 3) % 11]).collect(),
        };
        let a = epoch_batches(&corpus, 8, 4, 7, 0);
        let b = epoch_batches(&corpus, 8, 4, 7, 0);
        let c = epoch_batches(&corpus, 8, 4, 7, 1);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut all: Vec<usize> = a.iter().flatten().copied().collect();
        all.sort();
        assert_eq!(all, (0..103).collect::<Vec<_>>());
        assert!(a.iter().all(|x| x.len() <= 8));
        // Within a batch, lengths are sorted (read-ahead sorting).
        for bt in &a {
            let l: Vec<usize> = bt.iter().map(|&i| corpus.tgt[i].len()).collect();
            assert!(l.windows(2).all(|w| w[0] <= w[1]));
        }
    }
}
