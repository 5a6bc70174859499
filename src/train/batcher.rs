//! Training batches as the paper makes them: shuffle the corpus (seeded per epoch), read ahead
//! `sort_batches` batches, sort them by length, and cut batches of `batch_size` sentences — or, with
//! `train.batch_tokens`, of as many sentences as fit that many target tokens. The order is a pure function of
//! (seed, epoch), so a resumed run can skip to any batch.

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

/// Training pairs as id sequences (without EOS) in the run's vocabularies: in memory, or read through the
/// prepared directory's token stores ([`cgnmt_data::store`]), with only each pair's lengths (and, when some
/// stored pairs are left out, their store indices) in memory.
pub struct Corpus {
    pairs: Pairs,
}

enum Pairs {
    Memory {
        src: Vec<Vec<u32>>,
        tgt: Vec<Vec<u32>>,
    },
    Stored(Box<Stored>),
}

/// A corpus read from its token stores.
pub struct Stored {
    pub src: cgnmt_data::store::TokenStore,
    pub tgt: cgnmt_data::store::TokenStore,
    /// Each pair's source and target lengths.
    pub lengths: Vec<(u16, u16)>,
    /// The store index of each pair (`None`: pair `i` is stored sentence `i`).
    pub index: Option<Vec<u32>>,
    /// Store id → the run's vocabulary's id, per side.
    pub ids: [Vec<u32>; 2],
}

impl Corpus {
    /// Pairs held in memory.
    pub fn in_memory(src: Vec<Vec<u32>>, tgt: Vec<Vec<u32>>) -> Corpus {
        assert_eq!(src.len(), tgt.len(), "a corpus's sides are line-aligned");
        Corpus {
            pairs: Pairs::Memory { src, tgt },
        }
    }

    /// Pairs read from token stores.
    pub fn stored(s: Stored) -> Corpus {
        Corpus {
            pairs: Pairs::Stored(Box::new(s)),
        }
    }

    pub fn len(&self) -> usize {
        match &self.pairs {
            Pairs::Memory { src, .. } => src.len(),
            Pairs::Stored(s) => s.lengths.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether the pairs are read from token stores.
    pub fn is_stored(&self) -> bool {
        matches!(self.pairs, Pairs::Stored(_))
    }

    /// Pair `i`'s source length.
    pub fn src_len(&self, i: usize) -> usize {
        match &self.pairs {
            Pairs::Memory { src, .. } => src[i].len(),
            Pairs::Stored(s) => s.lengths[i].0 as usize,
        }
    }

    /// Pair `i`'s target length.
    pub fn tgt_len(&self, i: usize) -> usize {
        match &self.pairs {
            Pairs::Memory { tgt, .. } => tgt[i].len(),
            Pairs::Stored(s) => s.lengths[i].1 as usize,
        }
    }

    /// Pair `i`'s source ids.
    pub fn src(&self, i: usize) -> crate::Result<Vec<u32>> {
        self.side(i, 0)
    }

    /// Pair `i`'s target ids.
    pub fn tgt(&self, i: usize) -> crate::Result<Vec<u32>> {
        self.side(i, 1)
    }

    fn side(&self, i: usize, side: usize) -> crate::Result<Vec<u32>> {
        match &self.pairs {
            Pairs::Memory { src, tgt } => Ok(if side == 0 { &src[i] } else { &tgt[i] }.clone()),
            Pairs::Stored(s) => {
                let at = s.index.as_ref().map_or(i, |x| x[i] as usize);
                let store = if side == 0 { &s.src } else { &s.tgt };
                Ok(store
                    .sentence(at)?
                    .into_iter()
                    .map(|id| {
                        s.ids[side]
                            .get(id as usize)
                            .copied()
                            .unwrap_or(cgnmt_data::UNK_ID)
                    })
                    .collect())
            }
        }
    }

    /// Every pair's source or target ids (for small corpora: reports, tests).
    pub fn all(&self, side: usize) -> crate::Result<Vec<Vec<u32>>> {
        (0..self.len()).map(|i| self.side(i, side)).collect()
    }
}

/// How batches are sized: `sentences` per batch, or (when `tokens` > 0) as many length-sorted sentences as
/// fit `tokens` target tokens (EOS included; a longer sentence is a batch alone); `sort_batches` batches'
/// worth read ahead and sorted together.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchSize {
    pub sentences: usize,
    pub tokens: usize,
    pub sort_batches: usize,
}

impl BatchSize {
    pub fn of(t: &crate::config::TrainConfig) -> Self {
        BatchSize {
            sentences: t.batch_size,
            tokens: t.batch_tokens,
            sort_batches: t.sort_batches,
        }
    }
}

/// The batches of one epoch sized by `size` (see [`BatchSize`]; by sentences, [`epoch_batches`]'s).
pub fn epoch_batches_sized(
    corpus: &Corpus,
    size: BatchSize,
    seed: u64,
    epoch: u64,
) -> Vec<Vec<u32>> {
    if size.tokens == 0 {
        return epoch_batches(corpus, size.sentences, size.sort_batches, seed, epoch);
    }
    let mut rng =
        StdRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(epoch));
    let mut order: Vec<u32> = (0..corpus.len() as u32).collect();
    order.shuffle(&mut rng);
    let tokens = |i: u32| corpus.tgt_len(i as usize) + 1;
    let window = size.tokens.saturating_mul(size.sort_batches);
    let mut batches = Vec::new();
    let mut at = 0;
    while at < order.len() {
        // A read-ahead window of `sort_batches` batches' worth of target tokens, sorted by length.
        let mut end = at;
        let mut sum = 0;
        while end < order.len() && (end == at || sum + tokens(order[end]) <= window) {
            sum += tokens(order[end]);
            end += 1;
        }
        let mut chunk = order[at..end].to_vec();
        chunk.sort_by_key(|&i| (corpus.tgt_len(i as usize), corpus.src_len(i as usize)));
        let mut group: Vec<Vec<u32>> = vec![];
        let mut cur: Vec<u32> = vec![];
        let mut cur_tokens = 0;
        for i in chunk {
            if !cur.is_empty() && cur_tokens + tokens(i) > size.tokens {
                group.push(std::mem::take(&mut cur));
                cur_tokens = 0;
            }
            cur_tokens += tokens(i);
            cur.push(i);
        }
        if !cur.is_empty() {
            group.push(cur);
        }
        group.shuffle(&mut rng);
        batches.extend(group);
        at = end;
    }
    batches
}

/// The batches (lists of pair indices) of one epoch.
pub fn epoch_batches(
    corpus: &Corpus,
    batch_size: usize,
    sort_batches: usize,
    seed: u64,
    epoch: u64,
) -> Vec<Vec<u32>> {
    let mut rng =
        StdRng::seed_from_u64(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(epoch));
    let mut order: Vec<u32> = (0..corpus.len() as u32).collect();
    order.shuffle(&mut rng);
    let mut batches = Vec::new();
    for chunk in order.chunks(batch_size * sort_batches) {
        let mut chunk = chunk.to_vec();
        chunk.sort_by_key(|&i| (corpus.tgt_len(i as usize), corpus.src_len(i as usize)));
        let mut group: Vec<Vec<u32>> = chunk.chunks(batch_size).map(|c| c.to_vec()).collect();
        group.shuffle(&mut rng);
        batches.extend(group);
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_batches_cover_the_corpus_once_within_the_budget_and_repeat() {
        let corpus = Corpus::in_memory(
            (0..211).map(|i| vec![1; 1 + i % 9]).collect(),
            (0..211).map(|i| vec![1; 1 + (i * 7) % 23]).collect(),
        );
        let size = BatchSize {
            sentences: 0,
            tokens: 40,
            sort_batches: 5,
        };
        let a = epoch_batches_sized(&corpus, size, 3, 0);
        assert_eq!(a, epoch_batches_sized(&corpus, size, 3, 0));
        assert_ne!(a, epoch_batches_sized(&corpus, size, 3, 1));
        let mut all: Vec<u32> = a.iter().flatten().copied().collect();
        all.sort();
        assert_eq!(all, (0..211).collect::<Vec<_>>());
        let tokens = |b: &Vec<u32>| {
            b.iter()
                .map(|&i| corpus.tgt_len(i as usize) + 1)
                .sum::<usize>()
        };
        for b in &a {
            assert!(
                !b.is_empty() && tokens(b) <= 40,
                "{b:?}: {} tokens",
                tokens(b)
            );
            let l: Vec<usize> = b.iter().map(|&i| corpus.tgt_len(i as usize)).collect();
            assert!(l.windows(2).all(|w| w[0] <= w[1]), "sorted within a batch");
        }
        // Batches are full: sorted sentences of similar length fill them (few batches under half the budget).
        let thin = a.iter().filter(|b| tokens(b) < 20).count();
        assert!(
            thin * 10 < a.len(),
            "{thin} of {} batches under half full",
            a.len()
        );
        // Without a token budget: the sentence batches of `epoch_batches`.
        let by_count = BatchSize {
            sentences: 8,
            tokens: 0,
            sort_batches: 4,
        };
        assert_eq!(
            epoch_batches_sized(&corpus, by_count, 7, 0),
            epoch_batches(&corpus, 8, 4, 7, 0)
        );
    }

    #[test]
    fn batches_cover_the_corpus_once_and_are_deterministic() {
        let corpus = Corpus::in_memory(
            (0..103).map(|i| vec![1; 1 + i % 7]).collect(),
            (0..103).map(|i| vec![1; 1 + (i * 3) % 11]).collect(),
        );
        let a = epoch_batches(&corpus, 8, 4, 7, 0);
        let b = epoch_batches(&corpus, 8, 4, 7, 0);
        let c = epoch_batches(&corpus, 8, 4, 7, 1);
        assert_eq!(a, b);
        assert_ne!(a, c);
        let mut all: Vec<u32> = a.iter().flatten().copied().collect();
        all.sort();
        assert_eq!(all, (0..103).collect::<Vec<_>>());
        assert!(a.iter().all(|x| x.len() <= 8));
        // Within a batch, lengths are sorted (read-ahead sorting).
        for bt in &a {
            let l: Vec<usize> = bt.iter().map(|&i| corpus.tgt_len(i as usize)).collect();
            assert!(l.windows(2).all(|w| w[0] <= w[1]));
        }
    }
}
