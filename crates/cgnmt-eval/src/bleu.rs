//! Corpus and sentence BLEU (Papineni et al. 2002) as computed by sacreBLEU 2.x and by the
//! NIST `mteval-v11b.pl` / `mteval-v13a.pl` and Moses `multi-bleu.perl` scripts.
//!
//! All variants share one pipeline: tokenise ([`Tokenize`]), count clipped n-gram matches
//! per segment against the maximum count over the references ([`BleuStats`]), sum over the
//! corpus, and turn the sums into a score ([`score_from_stats`]). The variants differ only in
//! tokenisation/lowercasing, in the reference length used for the brevity penalty
//! ([`RefLen`]) and in smoothing ([`Smooth`]).
//!
//! Known differences between the reference implementations, reproduced here (see
//! `shared/fixtures/bleu/README.md`):
//! - `mteval-v11b.pl` uses the *shortest* reference length per segment ([`RefLen::Shortest`]);
//!   sacreBLEU, `mteval-v13a.pl` and `multi-bleu.perl` use the closest (ties → shorter).
//! - sacreBLEU smooths corpus BLEU with `exp` by default (an order with zero matches gets
//!   precision 100 / (2^k · total)); `mteval-v11b.pl` and `multi-bleu.perl` do not smooth.
//! - The `unicode` fixture case: the byte-based scripts (`mteval-v11b.pl`, `multi-bleu.perl`)
//!   neither split on U+00A0 / U+3000 nor lowercase non-ASCII letters, and `mteval-v13a.pl`'s
//!   default tokenisation lowercases ASCII only; sacreBLEU `-lc` uses Python `str.lower()`.
//!   Each [`Tokenize`] variant carries its implementation's convention, so all of these values
//!   are matched exactly (they disagree with each other on purpose).

use std::collections::HashMap;
use std::ops::{Add, AddAssign};

use serde::Serialize;

use crate::tokenize::Tokenize;
use crate::EvalError;

/// Maximum n-gram order of BLEU.
pub const MAX_ORDER: usize = 4;

/// The version string used in signatures.
pub const VERSION: &str = "cgnmt-0.1";

/// Sufficient statistics of BLEU for one segment or (summed) for a corpus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct BleuStats {
    /// Clipped n-gram matches for n = 1..4.
    pub counts: [usize; MAX_ORDER],
    /// Hypothesis n-grams for n = 1..4.
    pub totals: [usize; MAX_ORDER],
    /// Hypothesis length in tokens.
    pub sys_len: usize,
    /// Effective reference length in tokens (closest or shortest, see [`RefLen`]).
    pub ref_len: usize,
}

impl Add for BleuStats {
    type Output = BleuStats;
    fn add(mut self, rhs: BleuStats) -> BleuStats {
        self += rhs;
        self
    }
}

impl AddAssign for BleuStats {
    fn add_assign(&mut self, rhs: BleuStats) {
        for n in 0..MAX_ORDER {
            self.counts[n] += rhs.counts[n];
            self.totals[n] += rhs.totals[n];
        }
        self.sys_len += rhs.sys_len;
        self.ref_len += rhs.ref_len;
    }
}

impl std::iter::Sum for BleuStats {
    fn sum<I: Iterator<Item = BleuStats>>(iter: I) -> BleuStats {
        iter.fold(BleuStats::default(), |a, b| a + b)
    }
}

/// A BLEU score with everything needed to report it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BleuScore {
    /// BLEU on the 0–100 scale.
    pub score: f64,
    /// Clipped n-gram matches (n = 1..4), *before* any add-k smoothing.
    pub counts: [usize; MAX_ORDER],
    /// Hypothesis n-gram counts (n = 1..4), *before* any add-k smoothing.
    pub totals: [usize; MAX_ORDER],
    /// n-gram precisions on the 0–100 scale (after smoothing, as sacreBLEU reports them).
    pub precisions: [f64; MAX_ORDER],
    /// Brevity penalty.
    pub bp: f64,
    /// Hypothesis length.
    pub sys_len: usize,
    /// Reference length.
    pub ref_len: usize,
    /// sacreBLEU-style signature, e.g. `nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:cgnmt-0.1`.
    pub signature: String,
}

impl BleuScore {
    /// sacreBLEU's one-line format: `BLEU = 25.17 58.6/31.3/19.0/11.7 (BP = 0.974 ratio = 0.974 hyp_len = 52823 ref_len = 54188)`.
    pub fn format(&self) -> String {
        let ratio = if self.ref_len > 0 {
            self.sys_len as f64 / self.ref_len as f64
        } else {
            0.0
        };
        format!(
            "BLEU = {:.2} {:.1}/{:.1}/{:.1}/{:.1} (BP = {:.3} ratio = {:.3} hyp_len = {} ref_len = {})",
            self.score,
            self.precisions[0],
            self.precisions[1],
            self.precisions[2],
            self.precisions[3],
            self.bp,
            ratio,
            self.sys_len,
            self.ref_len
        )
    }
}

/// Smoothing of zero n-gram matches (sacreBLEU's `smooth_method`).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum Smooth {
    /// mteval-v13a / sacreBLEU default: the k-th order with zero matches gets precision 1/(2^k · total).
    #[default]
    Exp,
    /// No smoothing: a zero precision makes BLEU 0 (mteval-v11b, multi-bleu.perl).
    None,
    /// Zero matches get precision `value / total` (sacreBLEU default value 0.1).
    Floor(f64),
    /// Add k to matches and totals of orders 2..4 (sacreBLEU default k = 1).
    AddK(f64),
}

impl Smooth {
    /// The name used in signatures.
    pub fn name(&self) -> &'static str {
        match self {
            Smooth::Exp => "exp",
            Smooth::None => "none",
            Smooth::Floor(_) => "floor",
            Smooth::AddK(_) => "add-k",
        }
    }
}

/// Which reference length enters the brevity penalty with several references.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RefLen {
    /// Closest to the hypothesis length, ties to the shorter (sacreBLEU, mteval-v13a, multi-bleu.perl).
    #[default]
    Closest,
    /// Shortest reference (NIST mteval-v11b.pl).
    Shortest,
}

/// Options of a BLEU computation.
#[derive(Debug, Clone, PartialEq)]
pub struct BleuOptions {
    /// Tokeniser (and lowercasing convention).
    pub tokenize: Tokenize,
    /// Case-insensitive scoring.
    pub lowercase: bool,
    /// Smoothing.
    pub smooth: Smooth,
    /// Reference length policy.
    pub ref_len: RefLen,
    /// Use only the n-gram orders for which the hypothesis has n-grams (sentence BLEU).
    pub effective_order: bool,
}

impl Default for BleuOptions {
    fn default() -> Self {
        Self::sacrebleu()
    }
}

impl BleuOptions {
    /// sacreBLEU's default corpus BLEU: `13a`, mixed case, `exp` smoothing, closest reference.
    pub fn sacrebleu() -> Self {
        BleuOptions {
            tokenize: Tokenize::Tok13a,
            lowercase: false,
            smooth: Smooth::Exp,
            ref_len: RefLen::Closest,
            effective_order: false,
        }
    }

    /// sacreBLEU's `sentence_bleu` defaults: as [`BleuOptions::sacrebleu`] with effective order.
    pub fn sentence() -> Self {
        BleuOptions {
            effective_order: true,
            ..Self::sacrebleu()
        }
    }

    /// NIST `mteval-v11b.pl -b` (the metric of the paper): case-insensitive (ASCII), its
    /// tokenisation with byte semantics, shortest reference length, no smoothing.
    /// Set `lowercase = false` for `-c`.
    pub fn mteval_v11b() -> Self {
        BleuOptions {
            tokenize: Tokenize::MtevalV11b,
            lowercase: true,
            smooth: Smooth::None,
            ref_len: RefLen::Shortest,
            effective_order: false,
        }
    }

    /// NIST `mteval-v13a.pl -b` (case-insensitive, ASCII lowercasing; closest reference;
    /// `exp` smoothing). Set `lowercase = false` for `-c`.
    pub fn mteval_v13a() -> Self {
        BleuOptions {
            tokenize: Tokenize::MtevalV13a,
            lowercase: true,
            smooth: Smooth::Exp,
            ref_len: RefLen::Closest,
            effective_order: false,
        }
    }

    /// Moses `multi-bleu.perl` (mixed case; set `lowercase` for `-lc`).
    pub fn multi_bleu() -> Self {
        BleuOptions {
            tokenize: Tokenize::MultiBleu,
            lowercase: false,
            smooth: Smooth::None,
            ref_len: RefLen::Closest,
            effective_order: false,
        }
    }

    /// sacreBLEU-style signature for `nrefs` references.
    pub fn signature(&self, nrefs: usize) -> String {
        let mut sig = format!(
            "nrefs:{}|case:{}|eff:{}|tok:{}|smooth:{}",
            nrefs,
            if self.lowercase { "lc" } else { "mixed" },
            if self.effective_order { "yes" } else { "no" },
            self.tokenize.name(),
            self.smooth.name()
        );
        if self.ref_len == RefLen::Shortest {
            sig.push_str("|reflen:shortest");
        }
        sig.push_str("|version:");
        sig.push_str(VERSION);
        sig
    }
}

type NgramCounts<'a> = HashMap<&'a [String], usize>;

fn count_ngrams(tokens: &[String]) -> NgramCounts<'_> {
    let mut m: NgramCounts<'_> = HashMap::with_capacity(tokens.len() * MAX_ORDER);
    for n in 1..=MAX_ORDER {
        for w in tokens.windows(n) {
            *m.entry(w).or_insert(0) += 1;
        }
    }
    m
}

/// Statistics of one tokenised segment against its tokenised references.
fn segment_stats(hyp: &[String], refs: &[Vec<String>], policy: RefLen) -> BleuStats {
    let hyp_len = hyp.len();
    let mut max_ref: NgramCounts<'_> = HashMap::new();
    let mut ref_len: Option<usize> = None;
    let mut closest_diff: Option<usize> = None;
    for r in refs {
        let len = r.len();
        match policy {
            RefLen::Shortest => ref_len = Some(ref_len.map_or(len, |l| l.min(len))),
            RefLen::Closest => {
                let diff = hyp_len.abs_diff(len);
                match closest_diff {
                    Some(d) if diff > d => {}
                    Some(d) if diff == d => ref_len = Some(ref_len.map_or(len, |l| l.min(len))),
                    _ => {
                        closest_diff = Some(diff);
                        ref_len = Some(len);
                    }
                }
            }
        }
        for (ng, c) in count_ngrams(r) {
            let e = max_ref.entry(ng).or_insert(0);
            if c > *e {
                *e = c;
            }
        }
    }
    let mut stats = BleuStats {
        sys_len: hyp_len,
        ref_len: ref_len.unwrap_or(0),
        ..Default::default()
    };
    for n in 0..MAX_ORDER {
        stats.totals[n] = hyp_len.saturating_sub(n);
    }
    for (ng, c) in count_ngrams(hyp) {
        if let Some(&rc) = max_ref.get(ng) {
            stats.counts[ng.len() - 1] += c.min(rc);
        }
    }
    stats
}

fn check_refs(n_hyps: usize, refs: &[Vec<String>]) -> Result<(), EvalError> {
    if refs.is_empty() {
        return Err(EvalError::NoReferences);
    }
    for (k, r) in refs.iter().enumerate() {
        if r.len() != n_hyps {
            return Err(EvalError::LengthMismatch {
                what: format!("reference {} vs hypothesis lines", k + 1),
                expected: n_hyps,
                got: r.len(),
            });
        }
    }
    Ok(())
}

/// Per-segment statistics (for resampling and sign tests). `refs[k][line]` is line `line` of
/// reference `k`; all references must have as many lines as `hyps`.
pub fn sentence_stats(
    hyps: &[String],
    refs: &[Vec<String>],
    opts: &BleuOptions,
) -> Result<Vec<BleuStats>, EvalError> {
    check_refs(hyps.len(), refs)?;
    let tok = opts.tokenize;
    Ok(hyps
        .iter()
        .enumerate()
        .map(|(i, h)| {
            let ht = tok.tokens(h, opts.lowercase);
            let rts: Vec<Vec<String>> = refs
                .iter()
                .map(|r| tok.tokens(&r[i], opts.lowercase))
                .collect();
            segment_stats(&ht, &rts, opts.ref_len)
        })
        .collect())
}

/// Turns (summed) statistics into a score; a port of sacreBLEU's `BLEU.compute_bleu`.
/// The signature assumes one reference; use [`corpus_bleu`] for the real `nrefs`.
pub fn score_from_stats(stats: &BleuStats, opts: &BleuOptions) -> BleuScore {
    score_with_nrefs(stats, opts, 1)
}

fn my_log(x: f64) -> f64 {
    if x == 0.0 {
        -9_999_999_999.0
    } else {
        x.ln()
    }
}

fn score_with_nrefs(stats: &BleuStats, opts: &BleuOptions, nrefs: usize) -> BleuScore {
    let sys_len = stats.sys_len as f64;
    let ref_len = stats.ref_len as f64;
    let bp = if stats.sys_len < stats.ref_len {
        if stats.sys_len > 0 {
            (1.0 - ref_len / sys_len).exp()
        } else {
            0.0
        }
    } else {
        1.0
    };
    let mut precisions = [0.0f64; MAX_ORDER];
    let mut out = BleuScore {
        score: 0.0,
        counts: stats.counts,
        totals: stats.totals,
        precisions,
        bp,
        sys_len: stats.sys_len,
        ref_len: stats.ref_len,
        signature: opts.signature(nrefs),
    };
    if stats.counts.iter().all(|&c| c == 0) {
        return out;
    }
    let mut correct: [f64; MAX_ORDER] = stats.counts.map(|c| c as f64);
    let mut total: [f64; MAX_ORDER] = stats.totals.map(|c| c as f64);
    let mut smooth_mteval = 1.0f64;
    let mut eff_order = MAX_ORDER;
    for n in 0..MAX_ORDER {
        if let Smooth::AddK(k) = opts.smooth {
            if n > 0 {
                correct[n] += k;
                total[n] += k;
            }
        }
        if total[n] == 0.0 {
            break;
        }
        if opts.effective_order {
            eff_order = n + 1;
        }
        if correct[n] == 0.0 {
            match opts.smooth {
                Smooth::Exp => {
                    smooth_mteval *= 2.0;
                    precisions[n] = 100.0 / (smooth_mteval * total[n]);
                }
                Smooth::Floor(v) => precisions[n] = 100.0 * v / total[n],
                Smooth::None | Smooth::AddK(_) => {}
            }
        } else {
            precisions[n] = 100.0 * correct[n] / total[n];
        }
    }
    let sum: f64 = precisions[..eff_order].iter().map(|&p| my_log(p)).sum();
    out.score = bp * (sum / eff_order as f64).exp();
    out.precisions = precisions;
    out
}

/// Corpus BLEU of `hyps` against `refs` (`refs[k][line]`, one or more references).
pub fn corpus_bleu(
    hyps: &[String],
    refs: &[Vec<String>],
    opts: &BleuOptions,
) -> Result<BleuScore, EvalError> {
    let stats: BleuStats = sentence_stats(hyps, refs, opts)?.into_iter().sum();
    Ok(score_with_nrefs(&stats, opts, refs.len()))
}

/// Sentence BLEU of one hypothesis against its references, as `sacrebleu.sentence_bleu`
/// when `opts` is [`BleuOptions::sentence`].
pub fn sentence_bleu(
    hyp: &str,
    refs: &[String],
    opts: &BleuOptions,
) -> Result<BleuScore, EvalError> {
    if refs.is_empty() {
        return Err(EvalError::NoReferences);
    }
    let ht = opts.tokenize.tokens(hyp, opts.lowercase);
    let rts: Vec<Vec<String>> = refs
        .iter()
        .map(|r| opts.tokenize.tokens(r, opts.lowercase))
        .collect();
    let st = segment_stats(&ht, &rts, opts.ref_len);
    Ok(score_with_nrefs(&st, opts, refs.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn identical_is_100() {
        let h = s(&["the cat sat on the mat ."]);
        let r = vec![h.clone()];
        let b = corpus_bleu(&h, &r, &BleuOptions::sacrebleu()).unwrap();
        assert!((b.score - 100.0).abs() < 1e-9);
        assert_eq!(b.counts, [7, 6, 5, 4]);
        assert_eq!(
            b.signature,
            "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:cgnmt-0.1"
        );
    }

    #[test]
    fn errors_not_panics() {
        let h = s(&["a"]);
        assert!(matches!(
            corpus_bleu(&h, &[], &BleuOptions::sacrebleu()),
            Err(EvalError::NoReferences)
        ));
        assert!(corpus_bleu(&h, &[s(&["a", "b"])], &BleuOptions::sacrebleu()).is_err());
        // empty corpus / empty lines score 0 without panicking
        let b = corpus_bleu(&[], &[vec![]], &BleuOptions::sacrebleu()).unwrap();
        assert_eq!(b.score, 0.0);
        let b = corpus_bleu(&s(&[""]), &[s(&[""])], &BleuOptions::mteval_v11b()).unwrap();
        assert_eq!(b.score, 0.0);
    }

    #[test]
    fn shortest_vs_closest() {
        let h = s(&["a b c d e"]);
        let refs = vec![s(&["a b c"]), s(&["a b c d e f"])];
        let st = sentence_stats(&h, &refs, &BleuOptions::sacrebleu()).unwrap();
        assert_eq!(st[0].ref_len, 6);
        let st = sentence_stats(&h, &refs, &BleuOptions::mteval_v11b()).unwrap();
        assert_eq!(st[0].ref_len, 3);
    }
}
