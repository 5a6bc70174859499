//! Optional subword segmentation, trained and applied with the `tokenizers` crate: BPE (merges of frequent
//! pairs) or a SentencePiece-style unigram language model (the segmentation of highest probability under a
//! unigram model of pieces, whose vocabulary is pruned from a large seed by EM). Both share the marker
//! convention and the files below; [`BpeModel`] is either.
//!
//! The model is learned over the words produced by our tokenizers (the `tokenizers` pre-tokenizer is
//! a plain whitespace split), so a subword never crosses one of our tokens.
//!
//! **Marker convention** (that of subword-nmt): every subword that is *not* the last piece of
//! its word ends with `@@` ([`BPE_MARKER`]); the last piece (and an unsplit word) has no
//! marker. `unbelievable` → `un@@ believ@@ able`, `the` → `the`. [`merge_subwords`] joins a
//! token ending in `@@` to the next one, which exactly inverts [`BpeModel::apply`] for any
//! word that does not itself end in `@@` (such words cannot be represented; they do not occur
//! in normal text). A dangling marker at the end of a sequence is dropped.
//!
//! Characters never seen in training cannot be segmented; a word containing one is kept whole
//! (it will be UNK for the model unless it is in the vocabulary), so the round trip stays exact.
//!
//! The model file is a standard Hugging Face `tokenizer.json` (BPE model, whitespace-split
//! pre-tokenizer) and can be loaded by the Python `tokenizers` library too.

use std::path::Path;

use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::unigram::{Unigram, UnigramTrainerBuilder};
use tokenizers::pre_tokenizers::whitespace::WhitespaceSplit;
use tokenizers::{Model, Trainer};

use crate::error::DataError;

/// Suffix marking a subword that continues into the next one.
pub const BPE_MARKER: &str = "@@";

/// The subword algorithm of a [`BpeModel`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubwordKind {
    Bpe,
    Unigram,
}

/// A trained subword model (BPE or unigram; see the module doc).
#[derive(Clone)]
pub struct BpeModel {
    tokenizer: tokenizers::Tokenizer,
    /// The BPE merges by rank and the symbols, read from the model when BPE-dropout first needs them.
    merges: std::sync::Arc<std::sync::OnceLock<Option<Merges>>>,
}

/// A BPE model's merges, `(left, right) → rank` (lower: earlier, applied first), and its symbols.
#[derive(Debug)]
struct Merges {
    rank: std::collections::HashMap<(String, String), usize>,
    symbols: std::collections::HashSet<String>,
}

impl std::fmt::Debug for BpeModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BpeModel")
            .field("vocab_size", &self.vocab_size())
            .finish()
    }
}

fn bpe_err(path: Option<&Path>, e: impl std::fmt::Display) -> DataError {
    DataError::Bpe {
        path: path.map(Path::to_path_buf),
        message: e.to_string(),
    }
}

impl BpeModel {
    fn of(tokenizer: tokenizers::Tokenizer) -> Self {
        BpeModel {
            tokenizer,
            merges: Default::default(),
        }
    }

    /// The merges and symbols of a BPE model (`None` for a unigram model), from its serialised form.
    fn merges(&self) -> Option<&Merges> {
        self.merges
            .get_or_init(|| {
                if self.kind() != SubwordKind::Bpe {
                    return None;
                }
                let json: serde_json::Value =
                    serde_json::from_str(&self.tokenizer.to_string(false).ok()?).ok()?;
                let model = json.get("model")?;
                let mut rank = std::collections::HashMap::new();
                for (r, m) in model.get("merges")?.as_array()?.iter().enumerate() {
                    // `["a", "b"]`, or `"a b"` in older files.
                    let pair = match m {
                        serde_json::Value::Array(p) if p.len() == 2 => {
                            (p[0].as_str()?.to_string(), p[1].as_str()?.to_string())
                        }
                        serde_json::Value::String(p) => {
                            let (a, b) = p.split_once(' ')?;
                            (a.to_string(), b.to_string())
                        }
                        _ => return None,
                    };
                    rank.entry(pair).or_insert(r);
                }
                let symbols = model.get("vocab")?.as_object()?.keys().cloned().collect();
                Some(Merges { rank, symbols })
            })
            .as_ref()
    }

    /// Every subword a BPE model can produce, as tokens (with and without [`BPE_MARKER`]): what BPE-dropout
    /// may emit (empty for a unigram model).
    pub fn symbols(&self) -> Vec<String> {
        let Some(m) = self.merges() else {
            return vec![];
        };
        let mut out: Vec<String> = m
            .symbols
            .iter()
            .flat_map(|s| [s.clone(), format!("{s}{BPE_MARKER}")])
            .collect();
        out.sort();
        out
    }

    /// BPE-dropout (Provilkov et al., 2020): `word` segmented by merging, at each step, the adjacent pair of
    /// lowest rank among those not dropped, each candidate dropped with probability `p` (drawn from `rng`,
    /// so a seeded generator gives the same segmentation again). `p` = 0 is [`BpeModel::apply_word`]'s
    /// segmentation. (The `tokenizers` crate's own BPE dropout draws from a generator that cannot be
    /// seeded.) A unigram model, or a word with a character the model has not seen, is segmented as
    /// [`BpeModel::apply_word`] does.
    pub fn apply_word_dropout(&self, word: &str, p: f64, rng: &mut impl rand::Rng) -> Vec<String> {
        let Some(m) = self.merges() else {
            return self.apply_word(word);
        };
        let mut pieces: Vec<String> = word.chars().map(String::from).collect();
        if pieces.iter().any(|c| !m.symbols.contains(c)) {
            return self.apply_word(word);
        }
        loop {
            let mut best: Option<(usize, usize)> = None;
            for i in 0..pieces.len().saturating_sub(1) {
                let Some(&r) = m.rank.get(&(pieces[i].clone(), pieces[i + 1].clone())) else {
                    continue;
                };
                if p > 0.0 && rng.random::<f64>() < p {
                    continue;
                }
                if best.is_none_or(|(_, br)| r < br) {
                    best = Some((i, r));
                }
            }
            let Some((i, _)) = best else { break };
            let right = pieces.remove(i + 1);
            pieces[i].push_str(&right);
        }
        let last = pieces.len() - 1;
        pieces
            .into_iter()
            .enumerate()
            .map(|(i, t)| if i < last { t + BPE_MARKER } else { t })
            .collect()
    }

    /// Learns a BPE model with (at most about) `vocab_size` subword types from tokenized
    /// sentences. The initial alphabet (every character seen) is part of that size; if the
    /// alphabet alone is larger (e.g. Chinese characters), the vocabulary is the alphabet.
    /// Training is deterministic for a given input up to ties between equally frequent pairs.
    pub fn train(sentences: &[Vec<String>], vocab_size: usize) -> Result<BpeModel, DataError> {
        if vocab_size == 0 {
            return Err(DataError::Config(
                "BPE vocabulary size must be positive".into(),
            ));
        }
        Self::train_words(
            sentences.iter().flat_map(|s| s.iter().map(String::as_str)),
            vocab_size,
        )
    }

    /// [`BpeModel::train`] over a stream of words.
    fn train_words<'a>(
        words: impl Iterator<Item = &'a str> + Send,
        vocab_size: usize,
    ) -> Result<BpeModel, DataError> {
        if vocab_size == 0 {
            return Err(DataError::Config(
                "BPE vocabulary size must be positive".into(),
            ));
        }
        let mut trainer = BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(0)
            .show_progress(false)
            .build();
        trainer
            .feed(words, |w| Ok(vec![w.to_owned()]))
            .map_err(|e| bpe_err(None, e))?;
        let mut bpe = BPE::default();
        trainer.train(&mut bpe).map_err(|e| bpe_err(None, e))?;
        let mut tokenizer = tokenizers::Tokenizer::new(bpe);
        tokenizer.with_pre_tokenizer(Some(WhitespaceSplit));
        Ok(BpeModel::of(tokenizer))
    }

    /// Learns a model of `kind` from word counts (every word fed as often as it occurs): the model that
    /// [`BpeModel::train_kind`] learns from sentences with these words, in memory that grows with the
    /// distinct words only.
    pub fn train_counts(
        counts: &crate::vocab::WordCounts,
        vocab_size: usize,
        kind: SubwordKind,
    ) -> Result<BpeModel, DataError> {
        let sorted = counts.sorted();
        let stream = || {
            sorted
                .iter()
                .flat_map(|&(w, n)| std::iter::repeat_n(w, n as usize))
        };
        match kind {
            SubwordKind::Bpe => Self::train_words(stream(), vocab_size),
            SubwordKind::Unigram => Self::train_unigram_words(stream(), vocab_size),
        }
    }

    /// Learns a model of `kind` (see [`BpeModel::train`] and [`BpeModel::train_unigram`]).
    pub fn train_kind(
        sentences: &[Vec<String>],
        vocab_size: usize,
        kind: SubwordKind,
    ) -> Result<BpeModel, DataError> {
        match kind {
            SubwordKind::Bpe => Self::train(sentences, vocab_size),
            SubwordKind::Unigram => Self::train_unigram(sentences, vocab_size),
        }
    }

    /// Learns a unigram language model of (at most about) `vocab_size` pieces from tokenized sentences
    /// (SentencePiece's algorithm: a seed of frequent substrings pruned by EM to the size; every character
    /// seen stays a piece). A word with a character never seen in training is kept whole.
    pub fn train_unigram(
        sentences: &[Vec<String>],
        vocab_size: usize,
    ) -> Result<BpeModel, DataError> {
        if vocab_size == 0 {
            return Err(DataError::Config(
                "unigram vocabulary size must be positive".into(),
            ));
        }
        Self::train_unigram_words(
            sentences.iter().flat_map(|s| s.iter().map(String::as_str)),
            vocab_size,
        )
    }

    /// [`BpeModel::train_unigram`] over a stream of words.
    fn train_unigram_words<'a>(
        words: impl Iterator<Item = &'a str> + Send,
        vocab_size: usize,
    ) -> Result<BpeModel, DataError> {
        if vocab_size == 0 {
            return Err(DataError::Config(
                "unigram vocabulary size must be positive".into(),
            ));
        }
        let mut trainer = UnigramTrainerBuilder::default()
            .vocab_size(vocab_size.min(u32::MAX as usize) as u32)
            .show_progress(false)
            .unk_token(Some("<unk>".into()))
            .build()
            .map_err(|e| bpe_err(None, e))?;
        trainer
            .feed(words, |w| Ok(vec![w.to_owned()]))
            .map_err(|e| bpe_err(None, e))?;
        let mut model = Unigram::default();
        trainer.train(&mut model).map_err(|e| bpe_err(None, e))?;
        let mut tokenizer = tokenizers::Tokenizer::new(model);
        tokenizer.with_pre_tokenizer(Some(WhitespaceSplit));
        Ok(BpeModel::of(tokenizer))
    }

    /// The model's algorithm.
    pub fn kind(&self) -> SubwordKind {
        match self.tokenizer.get_model() {
            tokenizers::models::ModelWrapper::Unigram(_) => SubwordKind::Unigram,
            _ => SubwordKind::Bpe,
        }
    }

    /// Saves the model as a `tokenizer.json`-style JSON file.
    pub fn save(&self, path: &Path) -> Result<(), DataError> {
        self.tokenizer
            .save(path, false)
            .map_err(|e| bpe_err(Some(path), e))
    }

    /// Loads a model saved by [`BpeModel::save`]. Errors name the file.
    pub fn load(path: &Path) -> Result<BpeModel, DataError> {
        let text = std::fs::read_to_string(path).map_err(|e| DataError::io("read", path, e))?;
        let tokenizer: tokenizers::Tokenizer =
            serde_json::from_str(&text).map_err(|e| DataError::Json {
                path: path.to_path_buf(),
                source: e,
            })?;
        if !matches!(
            tokenizer.get_model(),
            tokenizers::models::ModelWrapper::BPE(_) | tokenizers::models::ModelWrapper::Unigram(_)
        ) {
            return Err(bpe_err(
                Some(path),
                "the tokenizer's model is neither BPE nor unigram",
            ));
        }
        Ok(BpeModel::of(tokenizer))
    }

    /// Number of subword types of the model.
    pub fn vocab_size(&self) -> usize {
        self.tokenizer.get_vocab_size(false)
    }

    /// Segments one word into subwords, with [`BPE_MARKER`] on all pieces but the last.
    pub fn apply_word(&self, word: &str) -> Vec<String> {
        let pieces = match self.tokenizer.get_model().tokenize(word) {
            Ok(p) => p,
            Err(_) => return vec![word.to_owned()],
        };
        let joined: String = pieces.iter().map(|t| t.value.as_str()).collect();
        if pieces.len() <= 1 || joined != word {
            return vec![word.to_owned()];
        }
        let last = pieces.len() - 1;
        pieces
            .into_iter()
            .enumerate()
            .map(|(i, t)| {
                if i < last {
                    t.value + BPE_MARKER
                } else {
                    t.value
                }
            })
            .collect()
    }

    /// Segments every word of a token list; see the module doc for the convention.
    pub fn apply<S: AsRef<str>>(&self, tokens: &[S]) -> Vec<String> {
        tokens
            .iter()
            .flat_map(|t| self.apply_word(t.as_ref()))
            .collect()
    }
}

/// Joins subwords back into words (inverse of [`BpeModel::apply`]).
pub fn merge_subwords<S: AsRef<str>>(subwords: &[S]) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut pending = false;
    for s in subwords {
        let s = s.as_ref();
        match s.strip_suffix(BPE_MARKER) {
            Some(piece) => {
                cur.push_str(piece);
                pending = true;
            }
            None => {
                cur.push_str(s);
                out.push(std::mem::take(&mut cur));
                pending = false;
            }
        }
    }
    // A dangling continuation (e.g. a decoder stopped mid-word) still ends a word, so that
    // the indices of `word_index_of_subwords` are always valid (it may be empty if the
    // pieces were bare markers).
    if pending {
        out.push(cur);
    }
    out
}

/// For each subword, the index of the word it belongs to in [`merge_subwords`]'s output
/// (same length as `subwords`). Used to map attention links on subwords back to words.
pub fn word_index_of_subwords<S: AsRef<str>>(subwords: &[S]) -> Vec<usize> {
    let mut out = Vec::with_capacity(subwords.len());
    let mut word = 0usize;
    for s in subwords {
        out.push(word);
        if !s.as_ref().ends_with(BPE_MARKER) {
            word += 1;
        }
    }
    out
}
