//! The training data of a run: the prepared directory's tokenised pairs mapped to ids with the run's
//! vocabularies (those of its counts, or the model's when resuming or fine-tuning), and its dev set.

use std::path::Path;

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

/// Training data prepared for the model.
pub struct TrainData {
    pub corpus: Corpus,
    pub src_vocab: Vocab,
    pub tgt_vocab: Vocab,
    pub dev_src: Vec<String>,
    pub dev_ref: Vec<String>,
    /// Tokenised dev targets (for the dev loss), aligned with `dev_src`; empty when `dev.tgt` is absent.
    pub dev_tgt: Vec<String>,
    pub dropped_long: usize,
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
    let (src_vocab, tgt_vocab) = match vocabs {
        Some(v) => v,
        None => {
            let cs = WordCounts::load(&dir.join("counts.src"))?;
            let ct = WordCounts::load(&dir.join("counts.tgt"))?;
            let vs = Vocab::build(&cs, cfg.data.src_vocab_size);
            let vt = Vocab::build(&ct, cfg.data.tgt_vocab_size);
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
    let mut corpus = Corpus {
        src: vec![],
        tgt: vec![],
    };
    let mut dropped_long = 0;
    for (s, t) in src.iter().zip(&tgt) {
        if s.is_empty() || t.is_empty() {
            continue;
        }
        if s.len() > cfg.data.max_len || t.len() > cfg.data.max_len {
            dropped_long += 1;
            continue;
        }
        corpus.src.push(src_vocab.encode(s));
        corpus.tgt.push(tgt_vocab.encode(t));
        if cfg.data.limit > 0 && corpus.len() >= cfg.data.limit {
            break;
        }
    }
    if corpus.is_empty() {
        return Err(NmtError::Data(format!(
            "{}: no training pairs left after filtering",
            dir.display()
        )));
    }
    if !quiet {
        eprintln!(
            "training pairs: {} ({} dropped as longer than data.max_len = {})",
            corpus.len(),
            dropped_long,
            cfg.data.max_len
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
        src_vocab,
        tgt_vocab,
        dev_src,
        dev_ref,
        dev_tgt,
        dropped_long,
    })
}
