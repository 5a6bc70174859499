//! Paired significance tests between a baseline and a system on the same test set:
//!
//! - **sign test** (Collins, Koehn & Kučerová 2005): for every sentence, replace the baseline's
//!   translation by the system's, recompute the corpus score and record whether it went up or
//!   down; two-sided exact binomial test (p = 0.5) on the ups vs downs, ties dropped;
//! - **paired bootstrap resampling** (Koehn 2004) as sacreBLEU `--paired-bs`: `n` resamples of
//!   segment indices with replacement (the same index sets for baseline and system); corpus
//!   scores recomputed from summed sufficient statistics; with d_k = |sys_k − base_k|,
//!   p = (#{k : d_k − mean(d) > |sys − base|} + 1)/(n + 1); mean and 95% CI half-width of the
//!   resampled scores (sorted s, lower = s[n/40], upper = s[n − n/40 − 1], ci = (upper − lower)/2);
//! - **approximate randomization** as sacreBLEU `--paired-ar`: in each of `n` trials every
//!   segment's statistics are swapped between the systems with probability 1/2;
//!   p = (#{k : |A_k − B_k| > |sys − base|} + 1)/(n + 1).
//!
//! As in sacreBLEU the p-values use a strict `>`: two systems with *identical* scores get the
//! minimum p-value 1/(n+1); check the score difference before reading a p-value.
//!
//! All randomness comes from `rand::rngs::StdRng::seed_from_u64(seed)`; results are
//! deterministic for a seed but differ from sacreBLEU's numpy generator, so p-values, means and
//! CIs agree with sacreBLEU only within sampling noise (see the significance fixture).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::bleu::{self, BleuOptions, BleuStats};
use crate::chrf::{self, ChrfOptions};
use crate::EvalError;

/// Default number of bootstrap resamples (sacreBLEU).
pub const DEFAULT_BS_SAMPLES: usize = 1000;
/// Default number of approximate-randomization trials (sacreBLEU).
pub const DEFAULT_AR_TRIALS: usize = 10000;
/// Default seed (sacreBLEU's `SACREBLEU_SEED` default).
pub const DEFAULT_SEED: u64 = 12345;

/// A corpus metric that can be recomputed from summed per-segment statistics.
#[derive(Debug, Clone, PartialEq)]
pub enum Metric {
    /// Corpus BLEU.
    Bleu(BleuOptions),
    /// chrF / chrF++.
    Chrf(ChrfOptions),
}

impl Metric {
    /// Display name (`BLEU`, `chrF2`, `chrF2++`).
    pub fn name(&self) -> String {
        match self {
            Metric::Bleu(_) => "BLEU".into(),
            Metric::Chrf(o) => o.name(),
        }
    }

    /// Signature of the metric for `nrefs` references.
    pub fn signature(&self, nrefs: usize) -> String {
        match self {
            Metric::Bleu(o) => o.signature(nrefs),
            Metric::Chrf(o) => o.signature(nrefs),
        }
    }

    /// Per-segment sufficient statistics as float vectors (BLEU: 4 counts, 4 totals, sys_len,
    /// ref_len; chrF: `[hyp, ref, match]` per order).
    pub fn segment_stats(
        &self,
        hyps: &[String],
        refs: &[Vec<String>],
    ) -> Result<Vec<Vec<f64>>, EvalError> {
        Ok(match self {
            Metric::Bleu(o) => bleu::sentence_stats(hyps, refs, o)?
                .iter()
                .map(bleu_to_vec)
                .collect(),
            Metric::Chrf(o) => chrf::sentence_stats(hyps, refs, o)?
                .iter()
                .map(chrf::ChrfStats::to_f64)
                .collect(),
        })
    }

    /// Corpus score (0–100) from summed statistics.
    pub fn score(&self, summed: &[f64]) -> f64 {
        match self {
            Metric::Bleu(o) => bleu::score_from_stats(&vec_to_bleu(summed), o).score,
            Metric::Chrf(o) => chrf::f_score_flat(summed, o.beta),
        }
    }

    /// Corpus score of per-segment statistics.
    pub fn corpus_score(&self, stats: &[Vec<f64>]) -> f64 {
        let dim = stats.first().map_or(0, Vec::len);
        self.score(&sum_rows(stats, dim))
    }
}

fn bleu_to_vec(s: &BleuStats) -> Vec<f64> {
    let mut v: Vec<f64> = s.counts.iter().map(|&x| x as f64).collect();
    v.extend(s.totals.iter().map(|&x| x as f64));
    v.push(s.sys_len as f64);
    v.push(s.ref_len as f64);
    v
}

fn vec_to_bleu(v: &[f64]) -> BleuStats {
    let g = |i: usize| v.get(i).copied().unwrap_or(0.0).max(0.0).round() as usize;
    BleuStats {
        counts: [g(0), g(1), g(2), g(3)],
        totals: [g(4), g(5), g(6), g(7)],
        sys_len: g(8),
        ref_len: g(9),
    }
}

fn sum_rows(rows: &[Vec<f64>], dim: usize) -> Vec<f64> {
    let mut s = vec![0.0; dim];
    for r in rows {
        for (a, b) in s.iter_mut().zip(r) {
            *a += b;
        }
    }
    s
}

fn check_pair(base: &[Vec<f64>], sys: &[Vec<f64>]) -> Result<usize, EvalError> {
    if base.is_empty() {
        return Err(EvalError::EmptyCorpus);
    }
    if base.len() != sys.len() {
        return Err(EvalError::LengthMismatch {
            what: "system segments vs baseline segments".into(),
            expected: base.len(),
            got: sys.len(),
        });
    }
    Ok(base[0].len())
}

/// Result of the sign test.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SignTestResult {
    /// Sentences whose replacement raised the baseline's corpus score.
    pub better: usize,
    /// Sentences whose replacement lowered it.
    pub worse: usize,
    /// Sentences that left it unchanged.
    pub ties: usize,
    /// Two-sided exact binomial p-value (ties dropped).
    pub p_value: f64,
}

/// Two-sided exact binomial test p-value for `k` successes in `n` trials with p = 1/2.
pub fn binomial_two_sided(k: usize, n: usize) -> f64 {
    if n == 0 || k > n {
        return 1.0;
    }
    let m = k.min(n - k);
    let mut ln_fact = vec![0.0f64; n + 1];
    for i in 1..=n {
        ln_fact[i] = ln_fact[i - 1] + (i as f64).ln();
    }
    let ln2n = n as f64 * std::f64::consts::LN_2;
    let tail: f64 = (0..=m)
        .map(|i| (ln_fact[n] - ln_fact[i] - ln_fact[n - i] - ln2n).exp())
        .sum();
    (2.0 * tail).min(1.0)
}

/// Sign test (Collins et al. 2005) on per-segment statistics.
pub fn sign_test(
    metric: &Metric,
    base: &[Vec<f64>],
    sys: &[Vec<f64>],
) -> Result<SignTestResult, EvalError> {
    let dim = check_pair(base, sys)?;
    let total = sum_rows(base, dim);
    let base_score = metric.score(&total);
    let (mut better, mut worse, mut ties) = (0, 0, 0);
    let mut buf = vec![0.0; dim];
    for (b, s) in base.iter().zip(sys) {
        for d in 0..dim {
            buf[d] = total[d] - b.get(d).unwrap_or(&0.0) + s.get(d).unwrap_or(&0.0);
        }
        let sc = metric.score(&buf);
        if sc > base_score {
            better += 1;
        } else if sc < base_score {
            worse += 1;
        } else {
            ties += 1;
        }
    }
    Ok(SignTestResult {
        better,
        worse,
        ties,
        p_value: binomial_two_sided(better.min(worse), better + worse),
    })
}

/// Mean and 95% CI half-width of resampled scores (sacreBLEU `estimate_ci`).
pub fn estimate_ci(scores: &[f64]) -> (f64, f64) {
    if scores.is_empty() {
        return (0.0, 0.0);
    }
    let n = scores.len();
    let mean = scores.iter().sum::<f64>() / n as f64;
    let mut s = scores.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let lower = s[n / 40];
    let upper = s[n - n / 40 - 1];
    (mean, (upper - lower) / 2.0)
}

/// Result of paired bootstrap resampling.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct BootstrapResult {
    /// Baseline corpus score.
    pub base_score: f64,
    /// System corpus score.
    pub sys_score: f64,
    /// Mean of the baseline's resampled scores.
    pub base_mean: f64,
    /// 95% CI half-width of the baseline's resampled scores.
    pub base_ci: f64,
    /// Mean of the system's resampled scores.
    pub sys_mean: f64,
    /// 95% CI half-width of the system's resampled scores.
    pub sys_ci: f64,
    /// p-value of the difference.
    pub p_value: f64,
    /// Number of resamples.
    pub n_samples: usize,
}

/// Draws the bootstrap index sets (`n_samples` × `n_segments`).
fn bootstrap_indices(n_samples: usize, n_segments: usize, seed: u64) -> Vec<Vec<usize>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n_samples)
        .map(|_| {
            (0..n_segments)
                .map(|_| rng.random_range(0..n_segments))
                .collect()
        })
        .collect()
}

fn resampled_scores(
    metric: &Metric,
    stats: &[Vec<f64>],
    idx: &[Vec<usize>],
    dim: usize,
) -> Vec<f64> {
    let mut buf = vec![0.0; dim];
    idx.iter()
        .map(|set| {
            buf.iter_mut().for_each(|x| *x = 0.0);
            for &i in set {
                for (a, b) in buf.iter_mut().zip(&stats[i]) {
                    *a += b;
                }
            }
            metric.score(&buf)
        })
        .collect()
}

/// Paired bootstrap resampling (sacreBLEU `--paired-bs`).
pub fn paired_bootstrap(
    metric: &Metric,
    base: &[Vec<f64>],
    sys: &[Vec<f64>],
    n_samples: usize,
    seed: u64,
) -> Result<BootstrapResult, EvalError> {
    let dim = check_pair(base, sys)?;
    if n_samples == 0 {
        return Err(EvalError::InvalidOption(
            "bootstrap needs at least one resample".into(),
        ));
    }
    let base_score = metric.score(&sum_rows(base, dim));
    let sys_score = metric.score(&sum_rows(sys, dim));
    let idx = bootstrap_indices(n_samples, base.len(), seed);
    let bs = resampled_scores(metric, base, &idx, dim);
    let ss = resampled_scores(metric, sys, &idx, dim);
    let diffs: Vec<f64> = bs.iter().zip(&ss).map(|(b, s)| (s - b).abs()).collect();
    let mean_d = diffs.iter().sum::<f64>() / diffs.len() as f64;
    let real = (sys_score - base_score).abs();
    let c = diffs.iter().filter(|&&d| d - mean_d > real).count();
    let (base_mean, base_ci) = estimate_ci(&bs);
    let (sys_mean, sys_ci) = estimate_ci(&ss);
    Ok(BootstrapResult {
        base_score,
        sys_score,
        base_mean,
        base_ci,
        sys_mean,
        sys_ci,
        p_value: (c + 1) as f64 / (n_samples + 1) as f64,
        n_samples,
    })
}

/// Result of approximate randomization.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct ArResult {
    /// Baseline corpus score.
    pub base_score: f64,
    /// System corpus score.
    pub sys_score: f64,
    /// p-value of the difference.
    pub p_value: f64,
    /// Number of trials.
    pub n_trials: usize,
}

/// Paired approximate randomization (sacreBLEU `--paired-ar`).
pub fn paired_ar(
    metric: &Metric,
    base: &[Vec<f64>],
    sys: &[Vec<f64>],
    n_trials: usize,
    seed: u64,
) -> Result<ArResult, EvalError> {
    let dim = check_pair(base, sys)?;
    if n_trials == 0 {
        return Err(EvalError::InvalidOption(
            "approximate randomization needs at least one trial".into(),
        ));
    }
    let sb = sum_rows(base, dim);
    let ssys = sum_rows(sys, dim);
    let base_score = metric.score(&sb);
    let sys_score = metric.score(&ssys);
    let real = (sys_score - base_score).abs();
    let total: Vec<f64> = sb.iter().zip(&ssys).map(|(a, b)| a + b).collect();
    // A_k = Σ_j (swap_j ? sys_j : base_j) = Σ base + Σ_{swapped} (sys_j − base_j); B_k = total − A_k
    let delta: Vec<Vec<f64>> = base
        .iter()
        .zip(sys)
        .map(|(b, s)| s.iter().zip(b).map(|(x, y)| x - y).collect())
        .collect();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut a = vec![0.0; dim];
    let mut bvec = vec![0.0; dim];
    let mut c = 0usize;
    for _ in 0..n_trials {
        a.copy_from_slice(&sb);
        let mut bits = 0u64;
        for (j, d) in delta.iter().enumerate() {
            if j % 64 == 0 {
                bits = rng.random::<u64>();
            }
            if bits & 1 == 1 {
                for (x, y) in a.iter_mut().zip(d) {
                    *x += y;
                }
            }
            bits >>= 1;
        }
        for ((bb, t), x) in bvec.iter_mut().zip(&total).zip(&a) {
            *bb = t - x;
        }
        if (metric.score(&a) - metric.score(&bvec)).abs() > real {
            c += 1;
        }
    }
    Ok(ArResult {
        base_score,
        sys_score,
        p_value: (c + 1) as f64 / (n_trials + 1) as f64,
        n_trials,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binomial_values() {
        assert!((binomial_two_sided(0, 1) - 1.0).abs() < 1e-12);
        // 2 * P(X <= 1) with n = 10: 2 * 11/1024
        assert!((binomial_two_sided(1, 10) - 22.0 / 1024.0).abs() < 1e-12);
        assert!((binomial_two_sided(5, 10) - 1.0).abs() < 1e-12);
        assert_eq!(binomial_two_sided(0, 0), 1.0);
    }

    #[test]
    fn ci_indices() {
        let s: Vec<f64> = (0..1000).map(f64::from).collect();
        let (m, ci) = estimate_ci(&s);
        assert!((m - 499.5).abs() < 1e-9);
        assert!((ci - (974.0 - 25.0) / 2.0).abs() < 1e-9);
    }

    #[test]
    fn identical_systems_are_not_significant() {
        let m = Metric::Bleu(BleuOptions::sacrebleu());
        let h: Vec<String> = ["a b c d", "e f g h i", "j k"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let r = vec![vec![
            "a b c x".to_string(),
            "e f g h i".into(),
            "j k l".into(),
        ]];
        let st = m.segment_stats(&h, &r).unwrap();
        // Degenerate case, as in sacreBLEU: with a real difference of 0 no resample exceeds it
        // (strict >), so the p-value is the minimum 1/(n+1). Callers should treat identical
        // scores as "no difference".
        let bs = paired_bootstrap(&m, &st, &st, 100, 1).unwrap();
        assert_eq!(bs.p_value, 1.0 / 101.0);
        assert_eq!(bs.base_score, bs.sys_score);
        let ar = paired_ar(&m, &st, &st, 100, 1).unwrap();
        assert_eq!(ar.p_value, 1.0 / 101.0);
        let sg = sign_test(&m, &st, &st).unwrap();
        assert_eq!(sg.ties, 3);
        assert_eq!(sg.p_value, 1.0);
        assert!(sign_test(&m, &st, &st[..1]).is_err());
        assert!(sign_test(&m, &[], &[]).is_err());
    }
}
