//! chrF and chrF++ (Popović 2015, 2017) as computed by sacreBLEU 2.x (`CHRF`), corpus level,
//! with one or more references.
//!
//! Per segment, character n-grams (orders 1..=`char_order`, whitespace removed) and, for chrF++,
//! word n-grams (orders 1..=`word_order`, on whitespace tokens with one leading or trailing
//! punctuation character split off) are counted; for each order the statistics are
//! (hypothesis n-grams, reference n-grams, matches). With several references the reference
//! giving the best segment-level score is used (first one on ties). Corpus statistics are the
//! sums; the score averages precision and recall over the orders where both hypothesis and
//! reference have n-grams and combines them into an F-beta score (sacreBLEU's default,
//! non-`eps_smoothing` mode).

use std::collections::HashMap;
use std::hash::Hash;

use serde::Serialize;

use crate::tokenize::py_is_space;
use crate::EvalError;

/// Options of chrF.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChrfOptions {
    /// Maximum character n-gram order (6).
    pub char_order: usize,
    /// Maximum word n-gram order (0 for chrF, 2 for chrF++).
    pub word_order: usize,
    /// Recall weight β (2).
    pub beta: f64,
    /// Lowercase (Python `str.lower()` semantics) before extracting n-grams.
    pub lowercase: bool,
    /// Keep whitespace inside character n-grams.
    pub whitespace: bool,
}

impl Default for ChrfOptions {
    fn default() -> Self {
        Self::chrf()
    }
}

impl ChrfOptions {
    /// chrF2 (sacreBLEU default).
    pub fn chrf() -> Self {
        ChrfOptions {
            char_order: 6,
            word_order: 0,
            beta: 2.0,
            lowercase: false,
            whitespace: false,
        }
    }

    /// chrF++ (word order 2).
    pub fn chrf_plus_plus() -> Self {
        ChrfOptions {
            word_order: 2,
            ..Self::chrf()
        }
    }

    /// Total number of n-gram orders.
    pub fn order(&self) -> usize {
        self.char_order + self.word_order
    }

    /// Metric name as sacreBLEU prints it (`chrF2`, `chrF2++`).
    pub fn name(&self) -> String {
        let mut s = format!("chrF{}", fmt_beta(self.beta));
        for _ in 0..self.word_order {
            s.push('+');
        }
        s
    }

    /// sacreBLEU-style signature.
    pub fn signature(&self, nrefs: usize) -> String {
        format!(
            "nrefs:{}|case:{}|eff:yes|nc:{}|nw:{}|space:{}|version:{}",
            nrefs,
            if self.lowercase { "lc" } else { "mixed" },
            self.char_order,
            self.word_order,
            if self.whitespace { "yes" } else { "no" },
            crate::bleu::VERSION
        )
    }
}

fn fmt_beta(b: f64) -> String {
    if b.fract() == 0.0 && b.abs() < 1e9 {
        format!("{}", b as i64)
    } else {
        format!("{b}")
    }
}

/// chrF sufficient statistics: per order `[hyp n-grams, ref n-grams, matches]`
/// (character orders first, then word orders). Addable.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize)]
pub struct ChrfStats {
    /// One triple per n-gram order.
    pub orders: Vec<[usize; 3]>,
}

impl ChrfStats {
    /// Adds `other` into `self` (orders beyond `self`'s length are appended).
    pub fn add(&mut self, other: &ChrfStats) {
        if self.orders.len() < other.orders.len() {
            self.orders.resize(other.orders.len(), [0; 3]);
        }
        for (a, b) in self.orders.iter_mut().zip(&other.orders) {
            for k in 0..3 {
                a[k] += b[k];
            }
        }
    }

    /// The statistics as floats (for resampling code).
    pub fn to_f64(&self) -> Vec<f64> {
        self.orders
            .iter()
            .flat_map(|t| t.iter().map(|&x| x as f64))
            .collect()
    }
}

/// A chrF score.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChrfScore {
    /// Metric name (`chrF2`, `chrF2++`).
    pub name: String,
    /// Score on the 0–100 scale.
    pub score: f64,
    /// sacreBLEU-style signature.
    pub signature: String,
}

/// The chrF score of flattened statistics `[hyp, ref, match]` per order (a port of sacreBLEU's
/// `CHRF._compute_f_score` without eps smoothing).
pub fn f_score_flat(stats: &[f64], beta: f64) -> f64 {
    let eps = 1e-16;
    let factor = beta * beta;
    let (mut avg_prec, mut avg_rec) = (0.0f64, 0.0f64);
    let mut eff = 0usize;
    for t in stats.chunks_exact(3) {
        let (n_hyp, n_ref, n_match) = (t[0], t[1], t[2]);
        let prec = if n_hyp > 0.0 { n_match / n_hyp } else { eps };
        let rec = if n_ref > 0.0 { n_match / n_ref } else { eps };
        if n_hyp > 0.0 && n_ref > 0.0 {
            avg_prec += prec;
            avg_rec += rec;
            eff += 1;
        }
    }
    if eff == 0 {
        return 0.0;
    }
    avg_prec /= eff as f64;
    avg_rec /= eff as f64;
    if avg_prec + avg_rec > 0.0 {
        100.0 * (1.0 + factor) * avg_prec * avg_rec / (factor * avg_prec + avg_rec)
    } else {
        0.0
    }
}

/// The chrF score of (summed) statistics.
pub fn score_from_stats(stats: &ChrfStats, opts: &ChrfOptions) -> f64 {
    f_score_flat(&stats.to_f64(), opts.beta)
}

/// sacreBLEU's chrF++ word splitting (`_remove_punctuation`): a token longer than one character
/// with a punctuation character at its end (checked first) or start is split in two.
fn chrf_words(s: &str) -> Vec<&str> {
    const PUNCT: &str = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~";
    let mut out = Vec::new();
    for w in s.split(py_is_space).filter(|w| !w.is_empty()) {
        let mut chars = w.chars();
        let first = chars.next();
        let last = w.chars().next_back();
        if w.chars().nth(1).is_none() {
            out.push(w);
        } else if let Some(l) = last.filter(|c| PUNCT.contains(*c)) {
            out.push(&w[..w.len() - l.len_utf8()]);
            out.push(&w[w.len() - l.len_utf8()..]);
        } else if let Some(f) = first.filter(|c| PUNCT.contains(*c)) {
            out.push(&w[..f.len_utf8()]);
            out.push(&w[f.len_utf8()..]);
        } else {
            out.push(w);
        }
    }
    out
}

struct Ngrams {
    /// char orders: counts keyed by char slices
    chars: Vec<HashMap<Vec<char>, usize>>,
    /// word orders: counts keyed by word sequences
    words: Vec<HashMap<Vec<String>, usize>>,
}

fn counter<T: Hash + Eq + Clone>(items: &[T], n: usize) -> HashMap<Vec<T>, usize> {
    let mut m = HashMap::new();
    if n > 0 {
        for w in items.windows(n) {
            *m.entry(w.to_vec()).or_insert(0) += 1;
        }
    }
    m
}

fn extract(line: &str, opts: &ChrfOptions) -> Ngrams {
    let line = if opts.lowercase {
        line.to_lowercase()
    } else {
        line.to_string()
    };
    let chars: Vec<char> = if opts.whitespace {
        line.chars().collect()
    } else {
        line.chars().filter(|&c| !py_is_space(c)).collect()
    };
    let chars_ng = (1..=opts.char_order).map(|n| counter(&chars, n)).collect();
    let words_ng = if opts.word_order > 0 {
        let words: Vec<String> = chrf_words(&line).into_iter().map(String::from).collect();
        (1..=opts.word_order).map(|n| counter(&words, n)).collect()
    } else {
        Vec::new()
    };
    Ngrams {
        chars: chars_ng,
        words: words_ng,
    }
}

/// `[hyp, ref, match]` for one order. As in sacreBLEU, hypothesis n-grams are not counted
/// when the reference has no n-gram of this order.
fn triple<K: Hash + Eq>(h: &HashMap<K, usize>, r: &HashMap<K, usize>) -> [usize; 3] {
    let n_hyp = if r.is_empty() { 0 } else { h.values().sum() };
    let n_ref = r.values().sum();
    let n_match = h
        .iter()
        .map(|(k, &c)| r.get(k).map_or(0, |&rc| c.min(rc)))
        .sum();
    [n_hyp, n_ref, n_match]
}

fn match_stats(h: &Ngrams, r: &Ngrams) -> ChrfStats {
    let mut orders = Vec::with_capacity(h.chars.len() + h.words.len());
    for (a, b) in h.chars.iter().zip(&r.chars) {
        orders.push(triple(a, b));
    }
    for (a, b) in h.words.iter().zip(&r.words) {
        orders.push(triple(a, b));
    }
    ChrfStats { orders }
}

/// Statistics of one segment against its references (best reference by segment score).
pub fn segment_stats(hyp: &str, refs: &[&str], opts: &ChrfOptions) -> ChrfStats {
    let h = extract(hyp, opts);
    let mut best: Option<(f64, ChrfStats)> = None;
    for r in refs {
        let st = match_stats(&h, &extract(r, opts));
        let f = score_from_stats(&st, opts);
        if best.as_ref().is_none_or(|(bf, _)| f > *bf) {
            best = Some((f, st));
        }
    }
    best.map(|b| b.1).unwrap_or_else(|| ChrfStats {
        orders: vec![[0; 3]; opts.order()],
    })
}

fn check(opts: &ChrfOptions) -> Result<(), EvalError> {
    if opts.char_order == 0 && opts.word_order == 0 {
        return Err(EvalError::InvalidOption(
            "chrF needs a character or word order > 0".into(),
        ));
    }
    if !(opts.beta.is_finite() && opts.beta > 0.0) {
        return Err(EvalError::InvalidOption(format!(
            "chrF beta must be positive, got {}",
            opts.beta
        )));
    }
    Ok(())
}

/// Per-segment chrF statistics (`refs[k][line]`).
pub fn sentence_stats(
    hyps: &[String],
    refs: &[Vec<String>],
    opts: &ChrfOptions,
) -> Result<Vec<ChrfStats>, EvalError> {
    check(opts)?;
    if refs.is_empty() {
        return Err(EvalError::NoReferences);
    }
    for (k, r) in refs.iter().enumerate() {
        if r.len() != hyps.len() {
            return Err(EvalError::LengthMismatch {
                what: format!("reference {} vs hypothesis lines", k + 1),
                expected: hyps.len(),
                got: r.len(),
            });
        }
    }
    Ok(hyps
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let rs: Vec<&str> = refs.iter().map(|r| r[i].as_str()).collect();
            segment_stats(h, &rs, opts)
        })
        .collect())
}

/// Corpus chrF / chrF++.
pub fn corpus_chrf(
    hyps: &[String],
    refs: &[Vec<String>],
    opts: &ChrfOptions,
) -> Result<ChrfScore, EvalError> {
    let mut total = ChrfStats {
        orders: vec![[0; 3]; opts.order()],
    };
    for s in sentence_stats(hyps, refs, opts)? {
        total.add(&s);
    }
    Ok(ChrfScore {
        name: opts.name(),
        score: score_from_stats(&total, opts),
        signature: opts.signature(refs.len()),
    })
}

/// Sentence chrF (`sacrebleu.sentence_chrf`).
pub fn sentence_chrf(
    hyp: &str,
    refs: &[String],
    opts: &ChrfOptions,
) -> Result<ChrfScore, EvalError> {
    check(opts)?;
    if refs.is_empty() {
        return Err(EvalError::NoReferences);
    }
    let rs: Vec<&str> = refs.iter().map(String::as_str).collect();
    let st = segment_stats(hyp, &rs, opts);
    Ok(ChrfScore {
        name: opts.name(),
        score: score_from_stats(&st, opts),
        signature: opts.signature(refs.len()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_split_punctuation_like_sacrebleu() {
        assert_eq!(chrf_words("(hi) a, b"), vec!["(hi", ")", "a", ",", "b"]);
        assert_eq!(chrf_words("\"x é."), vec!["\"", "x", "é", "."]);
    }

    #[test]
    fn identical_is_100_and_disjoint_is_0() {
        let h = vec!["abc def".to_string()];
        let s = corpus_chrf(&h, std::slice::from_ref(&h), &ChrfOptions::chrf()).unwrap();
        assert!((s.score - 100.0).abs() < 1e-9);
        let r = vec!["xyz".to_string()];
        let s = corpus_chrf(&h, &[r], &ChrfOptions::chrf_plus_plus()).unwrap();
        assert_eq!(s.score, 0.0);
        assert_eq!(ChrfOptions::chrf_plus_plus().name(), "chrF2++");
    }
}
