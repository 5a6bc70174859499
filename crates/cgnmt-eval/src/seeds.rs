//! Significance that counts training variance: tests over systems trained with several seeds (Clark, Dyer,
//! Lavie & Smith, ACL 2011, "Better hypothesis testing for statistical machine translation: controlling for
//! optimizer instability", the MultEval tool).
//!
//! A paired test over the pooled test sentences of several runs ([`crate::significance`]) measures the test
//! set's sampling only: one weak seed of a baseline becomes a "significant" difference. The tests here treat
//! each training run as one draw of the system:
//!
//! - **Welch's t-test** over the runs' corpus scores (unequal variances; two-sided; the t distribution's tail
//!   from the regularised incomplete beta function). The test a claim rests on.
//! - **a permutation test of the runs' system labels**: every way of splitting the pooled runs' scores into
//!   the two systems' sizes (exact up to 100,000 splits, else that many random ones), p = the share whose
//!   difference of means is at least the observed one. With 3 runs a side there are only 20 splits, so p is
//!   never below 0.1: it says plainly how little 3 seeds can show.
//! - **a bootstrap over runs and sentences** (hierarchical): each resample draws each system's runs with
//!   replacement and the test sentences with replacement (the same sentences for every run), and takes the
//!   difference of the drawn runs' mean corpus scores; its 95% percentile interval, and the p-value of the
//!   centred resamples as large as the observed difference.
//! - MultEval's **s_opt** (the standard deviation of a system's corpus score across its runs) and **s_sel**
//!   (the bootstrap standard deviation of one run's score over resampled test sets, averaged over the runs).
//! - the **runs a side** a difference needs to be detected (Welch, α = 0.05, power 0.8; from the measured
//!   s_opt with t quantiles).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use crate::significance::Metric;
use crate::EvalError;

/// ln Γ(x) for x > 0 (Lanczos, g = 7, 9 terms; relative error below 1e-13 over the t-tests' range).
pub fn ln_gamma(x: f64) -> f64 {
    const G: [f64; 9] = [
        0.999_999_999_999_809_9,
        676.520_368_121_885_1,
        -1_259.139_216_722_402_8,
        771.323_428_777_653_1,
        -176.615_029_162_140_6,
        12.507_343_278_686_905,
        -0.138_571_095_265_720_12,
        9.984_369_578_019_572e-6,
        1.505_632_735_149_311_6e-7,
    ];
    if x < 0.5 {
        // Reflection: Γ(x)Γ(1−x) = π / sin(πx).
        let pi = std::f64::consts::PI;
        return (pi / (pi * x).sin()).ln() - ln_gamma(1.0 - x);
    }
    let x = x - 1.0;
    let mut a = G[0];
    let t = x + 7.5;
    for (i, g) in G.iter().enumerate().skip(1) {
        a += g / (x + i as f64);
    }
    0.5 * (2.0 * std::f64::consts::PI).ln() + (x + 0.5) * t.ln() - t + a.ln()
}

/// The regularised incomplete beta function I_x(a, b) (continued fraction, modified Lentz).
pub fn incomplete_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let front =
        (ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b) + a * x.ln() + b * (1.0 - x).ln()).exp();
    // The fraction converges fast for x < (a + 1) / (a + b + 2); else use the symmetry.
    if x > (a + 1.0) / (a + b + 2.0) {
        return 1.0 - incomplete_beta(1.0 - x, b, a);
    }
    let tiny = 1e-300;
    let (mut c, mut d) = (1.0, 1.0 - (a + b) * x / (a + 1.0));
    if d.abs() < tiny {
        d = tiny;
    }
    d = 1.0 / d;
    let mut f = d;
    for m in 1..500 {
        let m = m as f64;
        for k in 0..2 {
            let num = if k == 0 {
                m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m))
            } else {
                -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0))
            };
            d = 1.0 + num * d;
            if d.abs() < tiny {
                d = tiny;
            }
            c = 1.0 + num / c;
            if c.abs() < tiny {
                c = tiny;
            }
            d = 1.0 / d;
            f *= c * d;
        }
        if (c * d - 1.0).abs() < 1e-15 {
            break;
        }
    }
    front * f / a
}

/// The two-sided tail P(|T| ≥ |t|) of Student's t distribution with `df` degrees of freedom.
pub fn t_two_sided(t: f64, df: f64) -> f64 {
    if !t.is_finite() {
        return if t.is_nan() { f64::NAN } else { 0.0 };
    }
    incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
}

fn mean(x: &[f64]) -> f64 {
    x.iter().sum::<f64>() / x.len() as f64
}

/// The sample standard deviation (n − 1); 0 for fewer than two values.
pub fn sd(x: &[f64]) -> f64 {
    if x.len() < 2 {
        return 0.0;
    }
    let m = mean(x);
    (x.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (x.len() - 1) as f64).sqrt()
}

/// Welch's t-test of two groups of runs' scores.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct WelchResult {
    /// mean(b) − mean(a).
    pub delta: f64,
    pub t: f64,
    /// Welch–Satterthwaite degrees of freedom.
    pub df: f64,
    /// Two-sided p-value (1 when both groups have no variance and equal means).
    pub p_value: f64,
}

/// Welch's unequal-variances t-test of `b` against `a` (each at least two runs).
pub fn welch_t_test(a: &[f64], b: &[f64]) -> Result<WelchResult, EvalError> {
    if a.len() < 2 || b.len() < 2 {
        return Err(EvalError::InvalidOption(format!(
            "Welch's t-test needs at least two runs a side ({} and {})",
            a.len(),
            b.len()
        )));
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let (va, vb) = (sd(a).powi(2) / na, sd(b).powi(2) / nb);
    let delta = mean(b) - mean(a);
    let se2 = va + vb;
    if se2 == 0.0 {
        let p = if delta == 0.0 { 1.0 } else { 0.0 };
        return Ok(WelchResult {
            delta,
            t: if delta == 0.0 {
                0.0
            } else {
                f64::INFINITY.copysign(delta)
            },
            df: na + nb - 2.0,
            p_value: p,
        });
    }
    let t = delta / se2.sqrt();
    let df = se2 * se2 / (va * va / (na - 1.0) + vb * vb / (nb - 1.0));
    Ok(WelchResult {
        delta,
        t,
        df,
        p_value: t_two_sided(t, df),
    })
}

/// A permutation test of the runs' system labels.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct PermutationResult {
    pub p_value: f64,
    /// Splits counted (all of them when `exact`).
    pub splits: usize,
    pub exact: bool,
}

/// The largest number of splits enumerated exactly.
pub const MAX_EXACT_SPLITS: usize = 100_000;

/// Two-sided permutation test of the runs' labels: p = the share of splits of the pooled scores into groups
/// of `a`'s and `b`'s sizes whose |difference of means| is at least the observed one (with a tolerance of
/// 1e-12 for ties); random splits (seeded) past [`MAX_EXACT_SPLITS`].
pub fn permutation_test(a: &[f64], b: &[f64], seed: u64) -> Result<PermutationResult, EvalError> {
    if a.is_empty() || b.is_empty() {
        return Err(EvalError::InvalidOption(
            "a permutation test needs runs on both sides".into(),
        ));
    }
    let pooled: Vec<f64> = a.iter().chain(b).copied().collect();
    let (n, k) = (pooled.len(), a.len());
    let total: f64 = pooled.iter().sum();
    let observed = (mean(b) - mean(a)).abs();
    let diff = |sum_a: f64| ((total - sum_a) / (n - k) as f64 - sum_a / k as f64).abs();
    let mut splits = 1.0f64;
    for i in 0..k {
        splits = splits * (n - i) as f64 / (i + 1) as f64;
    }
    if splits <= MAX_EXACT_SPLITS as f64 {
        // Every k-subset as the first group.
        let (mut hits, mut count) = (0usize, 0usize);
        let mut idx: Vec<usize> = (0..k).collect();
        loop {
            let s: f64 = idx.iter().map(|&i| pooled[i]).sum();
            count += 1;
            hits += usize::from(diff(s) >= observed - 1e-12);
            // Next combination.
            let mut i = k;
            while i > 0 && idx[i - 1] == n - k + i - 1 {
                i -= 1;
            }
            if i == 0 {
                break;
            }
            idx[i - 1] += 1;
            for j in i..k {
                idx[j] = idx[j - 1] + 1;
            }
        }
        return Ok(PermutationResult {
            p_value: hits as f64 / count as f64,
            splits: count,
            exact: true,
        });
    }
    let mut rng = StdRng::seed_from_u64(seed);
    let mut order: Vec<usize> = (0..n).collect();
    let mut hits = 0usize;
    for _ in 0..MAX_EXACT_SPLITS {
        for i in 0..k {
            let j = rng.random_range(i..n);
            order.swap(i, j);
        }
        let s: f64 = order[..k].iter().map(|&i| pooled[i]).sum();
        hits += usize::from(diff(s) >= observed - 1e-12);
    }
    Ok(PermutationResult {
        p_value: (hits + 1) as f64 / (MAX_EXACT_SPLITS + 1) as f64,
        splits: MAX_EXACT_SPLITS,
        exact: false,
    })
}

/// The bootstrap over runs and sentences.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct RunBootstrapResult {
    /// The observed difference of the runs' mean corpus scores, b − a.
    pub delta: f64,
    /// Its 95% percentile interval over the resamples.
    pub ci_low: f64,
    pub ci_high: f64,
    pub p_value: f64,
    pub samples: usize,
}

fn corpus_scores(metric: &Metric, runs: &[Vec<Vec<f64>>]) -> Vec<f64> {
    runs.iter().map(|r| metric.corpus_score(r)).collect()
}

fn check_runs(runs: &[&[Vec<Vec<f64>>]]) -> Result<usize, EvalError> {
    let mut len = None;
    for side in runs {
        if side.is_empty() {
            return Err(EvalError::InvalidOption("a system without runs".into()));
        }
        for r in side.iter() {
            if r.is_empty() || *len.get_or_insert(r.len()) != r.len() {
                return Err(EvalError::InvalidOption(
                    "every run must score the same, non-empty test set".into(),
                ));
            }
        }
    }
    Ok(len.unwrap_or(0))
}

/// The bootstrap over runs and sentences of system `b` against `a` (each a list of runs, each run its
/// segments' statistics on the same test set): see the module's description.
pub fn run_bootstrap(
    metric: &Metric,
    a: &[Vec<Vec<f64>>],
    b: &[Vec<Vec<f64>>],
    samples: usize,
    seed: u64,
) -> Result<RunBootstrapResult, EvalError> {
    let n = check_runs(&[a, b])?;
    if samples == 0 {
        return Err(EvalError::InvalidOption(
            "the bootstrap needs at least one resample".into(),
        ));
    }
    let delta = mean(&corpus_scores(metric, b)) - mean(&corpus_scores(metric, a));
    let dim = a[0][0].len();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut sentences = vec![0usize; n];
    let mut buf = vec![0.0; dim];
    let mut draw = |side: &[Vec<Vec<f64>>], sentences: &[usize], rng: &mut StdRng| -> f64 {
        let runs: Vec<usize> = (0..side.len())
            .map(|_| rng.random_range(0..side.len()))
            .collect();
        let mut total = 0.0;
        for &r in &runs {
            buf.iter_mut().for_each(|x| *x = 0.0);
            for &i in sentences {
                for (x, y) in buf.iter_mut().zip(&side[r][i]) {
                    *x += y;
                }
            }
            total += metric.score(&buf);
        }
        total / runs.len() as f64
    };
    let mut deltas = Vec::with_capacity(samples);
    for _ in 0..samples {
        sentences
            .iter_mut()
            .for_each(|s| *s = rng.random_range(0..n));
        let da = draw(a, &sentences, &mut rng);
        let db = draw(b, &sentences, &mut rng);
        deltas.push(db - da);
    }
    let centre = mean(&deltas);
    let hits = deltas
        .iter()
        .filter(|&&d| (d - centre).abs() >= delta.abs())
        .count();
    let mut sorted = deltas.clone();
    sorted.sort_by(|x, y| x.total_cmp(y));
    let lo = sorted[((samples as f64) * 0.025) as usize];
    let hi = sorted[(((samples as f64) * 0.975) as usize).min(samples - 1)];
    Ok(RunBootstrapResult {
        delta,
        ci_low: lo,
        ci_high: hi,
        p_value: if delta == 0.0 {
            1.0
        } else {
            (hits + 1) as f64 / (samples + 1) as f64
        },
        samples,
    })
}

/// MultEval's s_sel of a system: the bootstrap standard deviation of each run's corpus score over `samples`
/// resampled test sets (seeded), averaged over the runs.
pub fn s_sel(
    metric: &Metric,
    runs: &[Vec<Vec<f64>>],
    samples: usize,
    seed: u64,
) -> Result<f64, EvalError> {
    let n = check_runs(&[runs])?;
    let dim = runs[0][0].len();
    let mut rng = StdRng::seed_from_u64(seed);
    let mut buf = vec![0.0; dim];
    let mut total = 0.0;
    for run in runs {
        let mut scores = Vec::with_capacity(samples);
        for _ in 0..samples {
            buf.iter_mut().for_each(|x| *x = 0.0);
            for _ in 0..n {
                let i = rng.random_range(0..n);
                for (x, y) in buf.iter_mut().zip(&run[i]) {
                    *x += y;
                }
            }
            scores.push(metric.score(&buf));
        }
        total += sd(&scores);
    }
    Ok(total / runs.len() as f64)
}

/// The quantile t with P(T ≤ t) = `q` (q > 0.5) of Student's t with `df` degrees of freedom (bisection).
pub fn t_quantile(q: f64, df: f64) -> f64 {
    let tail = 2.0 * (1.0 - q);
    let (mut lo, mut hi) = (0.0f64, 1e3f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if t_two_sided(mid, df) > tail {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    0.5 * (lo + hi)
}

/// Runs a side that Welch's test needs to detect a true difference `delta` with power 0.8 at α = 0.05
/// (two-sided), from the systems' standard deviations across runs: the smallest n ≥ 2 with
/// n ≥ (t₀.₉₇₅ + t₀.₈)² (s_a² + s_b²) / δ², the t quantiles at 2n − 2 degrees of freedom (the normal
/// approximation with the t distribution's heavier tails, which matter at a few runs); `None` when
/// `delta` is 0 or the standard deviations are both 0 (any difference is then exact).
pub fn runs_needed(delta: f64, s_a: f64, s_b: f64) -> Option<usize> {
    let var = s_a * s_a + s_b * s_b;
    if delta == 0.0 || var == 0.0 {
        return None;
    }
    // The t quantiles are at least the normal ones, so the search starts at the normal approximation's n.
    let z = 1.959_963_984_540_054 + 0.841_621_233_572_914_2;
    let start = ((z * z * var / (delta * delta)).ceil() as usize).max(2);
    (start..=start.saturating_mul(4).max(100)).find(|&n| {
        let df = (2 * n - 2) as f64;
        let z = t_quantile(0.975, df) + t_quantile(0.8, df);
        n as f64 >= z * z * var / (delta * delta)
    })
}

/// Everything [`compare_runs`] says about two systems trained with several seeds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunComparison {
    /// Each run's corpus score, per system.
    pub base_scores: Vec<f64>,
    pub sys_scores: Vec<f64>,
    pub base_mean: f64,
    pub sys_mean: f64,
    /// MultEval's s_opt (standard deviation across runs) and s_sel (within the test set) per system.
    pub base_s_opt: f64,
    pub sys_s_opt: f64,
    pub base_s_sel: f64,
    pub sys_s_sel: f64,
    /// Welch's t-test (`None` with fewer than two runs a side).
    pub welch: Option<WelchResult>,
    pub permutation: PermutationResult,
    pub bootstrap: RunBootstrapResult,
    /// Runs a side to detect the observed difference (power 0.8, α = 0.05).
    pub runs_needed: Option<usize>,
}

/// The seed-level tests of system `sys` against `base` (each a list of runs' segment statistics on the same
/// test set): Welch, the label permutation, the run-and-sentence bootstrap, s_opt and s_sel.
pub fn compare_runs(
    metric: &Metric,
    base: &[Vec<Vec<f64>>],
    sys: &[Vec<Vec<f64>>],
    samples: usize,
    seed: u64,
) -> Result<RunComparison, EvalError> {
    check_runs(&[base, sys])?;
    let (bs, ss) = (corpus_scores(metric, base), corpus_scores(metric, sys));
    let welch = if bs.len() >= 2 && ss.len() >= 2 {
        Some(welch_t_test(&bs, &ss)?)
    } else {
        None
    };
    let (so_b, so_s) = (sd(&bs), sd(&ss));
    Ok(RunComparison {
        base_mean: mean(&bs),
        sys_mean: mean(&ss),
        base_s_opt: so_b,
        sys_s_opt: so_s,
        base_s_sel: s_sel(metric, base, samples, seed)?,
        sys_s_sel: s_sel(metric, sys, samples, seed.wrapping_add(1))?,
        welch,
        permutation: permutation_test(&bs, &ss, seed)?,
        bootstrap: run_bootstrap(metric, base, sys, samples, seed)?,
        runs_needed: runs_needed(mean(&ss) - mean(&bs), so_b, so_s),
        base_scores: bs,
        sys_scores: ss,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gamma_and_beta_match_closed_forms() {
        // Γ(5) = 24, Γ(1/2) = √π.
        assert!((ln_gamma(5.0) - 24f64.ln()).abs() < 1e-12);
        assert!((ln_gamma(0.5) - std::f64::consts::PI.sqrt().ln()).abs() < 1e-12);
        // I_x(1, 1) = x; I_x(a, 1) = x^a.
        assert!((incomplete_beta(0.3, 1.0, 1.0) - 0.3).abs() < 1e-12);
        assert!((incomplete_beta(0.6, 3.0, 1.0) - 0.216).abs() < 1e-12);
        // t with 1 degree of freedom is Cauchy: P(|T| ≥ 1) = 1/2.
        assert!((t_two_sided(1.0, 1.0) - 0.5).abs() < 1e-12);
        // t with 2 degrees of freedom: P(|T| ≥ t) = 1 − t / √(2 + t²).
        let t: f64 = 1.7;
        assert!((t_two_sided(t, 2.0) - (1.0 - t / (2.0 + t * t).sqrt())).abs() < 1e-12);
    }

    #[test]
    fn permutations_of_three_runs_a_side_cannot_go_below_a_tenth() {
        let r = permutation_test(&[1.0, 2.0, 3.0], &[10.0, 11.0, 12.0], 1).unwrap();
        assert_eq!((r.splits, r.exact), (20, true));
        assert!((r.p_value - 0.1).abs() < 1e-12);
        let r = permutation_test(&[1.0, 2.0], &[1.0, 2.0], 1).unwrap();
        assert_eq!(r.p_value, 1.0);
    }

    #[test]
    fn runs_needed_follows_the_t_approximation() {
        // t quantiles: t(0.975, 1) = 12.706, t(0.975, 30) = 2.042, t(0.8, 4) = 0.941.
        assert!((t_quantile(0.975, 1.0) - 12.706_204_736).abs() < 1e-6);
        assert!((t_quantile(0.975, 30.0) - 2.042_272_456).abs() < 1e-6);
        assert!((t_quantile(0.8, 4.0) - 0.940_965_04).abs() < 1e-6);
        // δ = s: about 2 × 7.85 = 15.7 with normal quantiles; the t quantiles at 2n − 2 = 30 ask for 17.
        assert_eq!(runs_needed(1.0, 1.0, 1.0), Some(17));
        // δ = 3 s: 4 runs (the normal quantiles would say 2).
        assert_eq!(runs_needed(3.0, 1.0, 1.0), Some(4));
        assert_eq!(runs_needed(10.0, 1.0, 1.0), Some(2));
        assert_eq!(runs_needed(0.0, 1.0, 1.0), None);
    }
}
