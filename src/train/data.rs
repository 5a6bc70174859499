//! The training data of a run: the prepared directory's tokenised pairs mapped to ids with the run's
//! vocabularies (those of its counts, or the model's when resuming or fine-tuning), and its dev set.

use std::path::{Path, PathBuf};

use cgnmt_data::vocab::{Vocab, WordCounts};

use crate::config::Config;
use crate::error::{NmtError, Result};
use crate::train::batcher::Corpus;

/// Tokenised sentences of a prepared-data file (one per line, tokens separated by spaces).
pub fn read_tokenized(path: &Path) -> Result<Vec<Vec<String>>> {
    Ok(cgnmt_data::corpus::read_lines(path)?
        .into_iter()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect())
}

/// The prepared directory's tokenised training pairs (`train.src`, `train.tgt`), an error when their line
/// counts differ.
pub fn read_prepared_pairs(dir: &Path) -> Result<(Vec<Vec<String>>, Vec<Vec<String>>)> {
    let src = read_tokenized(&dir.join("train.src"))?;
    let tgt = read_tokenized(&dir.join("train.tgt"))?;
    if src.len() != tgt.len() {
        return Err(NmtError::Data(format!(
            "{}: train.src has {} lines but train.tgt has {}",
            dir.display(),
            src.len(),
            tgt.len()
        )));
    }
    Ok((src, tgt))
}

/// Training data prepared for the model.
pub struct TrainData {
    pub corpus: Corpus,
    /// With BPE-dropout: the training pairs' words (their subwords merged), by corpus index, and the
    /// sides' BPE models, to segment them again at every update.
    pub words: Option<SubwordSource>,
    pub src_vocab: Vocab,
    pub tgt_vocab: Vocab,
    pub dev_src: Vec<String>,
    pub dev_ref: Vec<String>,
    /// Tokenised dev targets (for the dev loss), aligned with `dev_src`; empty when `dev.tgt` is absent.
    pub dev_tgt: Vec<String>,
    pub dropped_long: usize,
}

/// The training pairs of the prepared directory's text files (`train.src`, `train.tgt`), read into memory:
/// pairs with an empty side skipped, those longer than `data.max_len` dropped (counted), at most
/// `data.limit`; with BPE-dropout, their words too.
fn text_corpus(
    cfg: &Config,
    vocabs: [&Vocab; 2],
    subwords: Option<[Option<cgnmt_data::BpeModel>; 2]>,
) -> Result<(Corpus, Option<SubwordSource>, usize)> {
    let (src, tgt) = read_prepared_pairs(&cfg.data.prepared)?;
    let (mut ids_src, mut ids_tgt) = (vec![], vec![]);
    let mut dropped_long = 0;
    let mut words: Option<SubwordSource> = subwords.map(|models| SubwordSource {
        src: vec![],
        tgt: vec![],
        models,
    });
    for (s, t) in src.iter().zip(&tgt) {
        if s.is_empty() || t.is_empty() {
            continue;
        }
        if s.len() > cfg.data.max_len || t.len() > cfg.data.max_len {
            dropped_long += 1;
            continue;
        }
        ids_src.push(vocabs[0].encode(s));
        ids_tgt.push(vocabs[1].encode(t));
        if let Some(w) = words.as_mut() {
            w.src.push(cgnmt_data::bpe::merge_subwords(s));
            w.tgt.push(cgnmt_data::bpe::merge_subwords(t));
        }
        if cfg.data.limit > 0 && ids_src.len() >= cfg.data.limit {
            break;
        }
    }
    Ok((Corpus::in_memory(ids_src, ids_tgt), words, dropped_long))
}

/// The training pairs of the prepared directory's token stores (`train.src.store`, `train.tgt.store`),
/// read sentence by sentence: the same pairs as [`text_corpus`] (the same skipping, dropping and limit), with only their
/// lengths in memory, and each store id mapped to the run's vocabulary through the counts the store's ids
/// rank (`counts.src`, `counts.tgt`). Returns the corpus and the pairs dropped as too long.
fn stored_corpus(
    cfg: &Config,
    stores: &[PathBuf; 2],
    vocabs: [&Vocab; 2],
) -> Result<(Corpus, usize)> {
    let dir = &cfg.data.prepared;
    let (src, src_len) = cgnmt_data::store::TokenStore::open(&stores[0])?;
    let (tgt, tgt_len) = cgnmt_data::store::TokenStore::open(&stores[1])?;
    if src.len() != tgt.len() {
        return Err(NmtError::Data(format!(
            "{}: {} sentences but {} has {}: prepare the corpus again",
            stores[0].display(),
            src.len(),
            stores[1].display(),
            tgt.len()
        )));
    }
    let mut ids: [Vec<u32>; 2] = [vec![], vec![]];
    for (side, (name, store)) in [("src", &src), ("tgt", &tgt)].into_iter().enumerate() {
        let counts = WordCounts::load(&dir.join(format!("counts.{name}")))?;
        let all = Vocab::build(&counts, usize::MAX);
        if all.len() as u64 != store.distinct() {
            return Err(NmtError::Data(format!(
                "{}: made for counts of {} tokens, but counts.{name} has {}: prepare the corpus again",
                store.path().display(),
                store.distinct(),
                all.len()
            )));
        }
        ids[side] = (0..all.len() as u32)
            .map(|k| {
                let w = all.token(k).unwrap_or(cgnmt_data::UNK_TOKEN);
                vocabs[side].id(w).unwrap_or(cgnmt_data::UNK_ID)
            })
            .collect();
    }
    let (mut lengths, mut index) = (Vec::with_capacity(src.len()), Vec::new());
    // While every stored pair is kept, pair `i` is sentence `i` and no index is needed.
    let mut dense = true;
    let mut dropped_long = 0;
    for (i, (&s, &t)) in src_len.iter().zip(&tgt_len).enumerate() {
        if cfg.data.limit > 0 && lengths.len() >= cfg.data.limit {
            break;
        }
        let (ls, lt) = (s as usize, t as usize);
        if ls == 0 || lt == 0 {
            continue;
        }
        if ls > cfg.data.max_len || lt > cfg.data.max_len {
            dropped_long += 1;
            continue;
        }
        if dense && lengths.len() != i {
            dense = false;
            index.extend(0..lengths.len() as u32);
        }
        if !dense {
            index.push(i as u32);
        }
        lengths.push((s, t));
    }
    drop((src_len, tgt_len));
    let index = (!dense).then_some(index);
    Ok((
        Corpus::stored(crate::train::batcher::Stored {
            src,
            tgt,
            lengths,
            index,
            ids,
        }),
        dropped_long,
    ))
}

/// The training words of BPE-dropout (see [`TrainData::words`]).
pub struct SubwordSource {
    pub src: Vec<Vec<String>>,
    pub tgt: Vec<Vec<String>>,
    /// The source and target BPE models (`None` for a side without subwords).
    pub models: [Option<cgnmt_data::BpeModel>; 2],
}

impl SubwordSource {
    /// Sentence `i`'s ids on `side` (0 source, 1 target) segmented again with BPE-dropout `p`, drawn from
    /// the sentence's own stream in the update seeded with `seed`: the same at any number of ranks.
    pub fn segment(&self, i: usize, side: usize, p: f64, seed: u64, vocab: &Vocab) -> Vec<u32> {
        use rand::SeedableRng;
        let words = if side == 0 {
            &self.src[i]
        } else {
            &self.tgt[i]
        };
        let Some(model) = &self.models[side] else {
            return vocab.encode(words);
        };
        let stream = crate::model::dropout::word_dropout_seed(seed, i as u64, 2 + side as u64);
        let mut rng = rand::rngs::StdRng::seed_from_u64(stream);
        let pieces: Vec<String> = words
            .iter()
            .flat_map(|w| model.apply_word_dropout(w, p, &mut rng))
            .collect();
        vocab.encode(&pieces)
    }
}

/// `v` with the subwords `model` can produce that it lacks, after its own words, up to `max` words.
fn with_symbols(v: Vocab, model: Option<&cgnmt_data::BpeModel>, max: usize) -> Vocab {
    let Some(model) = model else {
        return v;
    };
    let mut words: Vec<String> = (2..v.len() as u32)
        .filter_map(|i| v.token(i).map(str::to_string))
        .collect();
    for s in model.symbols() {
        if words.len() >= max {
            break;
        }
        if v.id(&s).is_none() {
            words.push(s);
        }
    }
    Vocab::from_words(words)
}

/// The BPE models of a prepared directory for BPE-dropout (an error when it has none, or unigram ones).
fn bpe_models(dir: &Path) -> Result<[Option<cgnmt_data::BpeModel>; 2]> {
    let pre = cgnmt_data::preprocess::Preprocessor::load(dir)?;
    let models = [pre.src_subwords().cloned(), pre.tgt_subwords().cloned()];
    if models.iter().all(Option::is_none) {
        return Err(NmtError::Config(format!(
            "train.bpe_dropout: {} has no subwords (prepare it with --bpe-src / --bpe-tgt)",
            dir.display()
        )));
    }
    if models
        .iter()
        .flatten()
        .any(|m| m.kind() != cgnmt_data::bpe::SubwordKind::Bpe)
    {
        return Err(NmtError::Config(format!(
            "train.bpe_dropout: {} has unigram subwords; BPE-dropout needs BPE (--bpe-src / --bpe-tgt)",
            dir.display()
        )));
    }
    Ok(models)
}

/// Load `data.prepared`: vocabularies of the K most frequent words (or the given ones on resume), training pairs
/// filtered by `data.max_len`, the dev set.
pub fn load_data(cfg: &Config, vocabs: Option<(Vocab, Vocab)>, quiet: bool) -> Result<TrainData> {
    let dir = &cfg.data.prepared;
    if !dir.is_dir() {
        return Err(NmtError::Data(format!(
            "data.prepared = {}: not a directory; create it with `cgnmt prepare`",
            dir.display()
        )));
    }
    let subwords = if cfg.train.bpe_dropout > 0.0 {
        Some(bpe_models(dir)?)
    } else {
        None
    };
    let (src_vocab, tgt_vocab) = match vocabs {
        Some(v) => v,
        None => {
            let cs = WordCounts::load(&dir.join("counts.src"))?;
            let ct = WordCounts::load(&dir.join("counts.tgt"))?;
            let mut vs = Vocab::build(&cs, cfg.data.src_vocab_size);
            let mut vt = Vocab::build(&ct, cfg.data.tgt_vocab_size);
            // BPE-dropout emits subwords that the data's one segmentation may never show.
            if let Some([ms, mt]) = &subwords {
                vs = with_symbols(vs, ms.as_ref(), cfg.data.src_vocab_size);
                vt = with_symbols(vt, mt.as_ref(), cfg.data.tgt_vocab_size);
            }
            if !quiet {
                eprintln!(
                    "vocabulary: source {} words cover {:.1}% of training tokens, target {} words cover {:.1}%",
                    vs.len() - 2,
                    100.0 * cgnmt_data::vocab::coverage(&vs, &cs),
                    vt.len() - 2,
                    100.0 * cgnmt_data::vocab::coverage(&vt, &ct)
                );
            }
            (vs, vt)
        }
    };
    let stores = [dir.join("train.src.store"), dir.join("train.tgt.store")];
    let (corpus, words, dropped_long) = if subwords.is_none() && stores.iter().all(|p| p.is_file())
    {
        let (c, dropped) = stored_corpus(cfg, &stores, [&src_vocab, &tgt_vocab])?;
        (c, None, dropped)
    } else {
        text_corpus(cfg, [&src_vocab, &tgt_vocab], subwords)?
    };
    if corpus.is_empty() {
        return Err(NmtError::Data(format!(
            "{}: no training pairs left after filtering",
            dir.display()
        )));
    }
    if !quiet {
        eprintln!(
            "training pairs: {} ({} dropped as longer than data.max_len = {}), read from {}",
            corpus.len(),
            dropped_long,
            cfg.data.max_len,
            if corpus.is_stored() {
                "the token stores (train.src.store, train.tgt.store)"
            } else {
                "the text (train.src, train.tgt)"
            }
        );
    }
    let (dev_src, dev_ref, dev_tgt) =
        if dir.join("dev.src").is_file() && dir.join("dev.ref").is_file() {
            let mut s = cgnmt_data::corpus::read_lines(&dir.join("dev.src"))?;
            let mut r = cgnmt_data::corpus::read_lines(&dir.join("dev.ref"))?;
            let mut t = if dir.join("dev.tgt").is_file() {
                cgnmt_data::corpus::read_lines(&dir.join("dev.tgt"))?
            } else {
                vec![]
            };
            if !t.is_empty() && t.len() != s.len() {
                return Err(NmtError::Data(format!(
                    "{}: dev.src and dev.tgt differ in line count",
                    dir.display()
                )));
            }
            if s.len() != r.len() {
                return Err(NmtError::Data(format!(
                    "{}: dev.src and dev.ref differ in line count",
                    dir.display()
                )));
            }
            let n = cfg.train.eval_max_sentences;
            if n > 0 && s.len() > n {
                // An evenly spaced subset: dev sets are often sorted by length, and a prefix would hold only the
                // shortest sentences.
                let pick: Vec<usize> = (0..n).map(|k| k * s.len() / n).collect();
                s = pick.iter().map(|&i| s[i].clone()).collect();
                r = pick.iter().map(|&i| r[i].clone()).collect();
                if !t.is_empty() {
                    t = pick.iter().map(|&i| t[i].clone()).collect();
                }
            }
            (s, r, t)
        } else {
            (vec![], vec![], vec![])
        };
    Ok(TrainData {
        corpus,
        words,
        src_vocab,
        tgt_vocab,
        dev_src,
        dev_ref,
        dev_tgt,
        dropped_long,
    })
}
