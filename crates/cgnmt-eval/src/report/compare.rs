//! `cgnmt compare`: two systems against the references, with paired bootstrap, approximate randomisation and the sign test.

use super::*;

/// Which significance tests `compare` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TestArg {
    /// Sign test (Collins et al. 2005).
    Sign,
    /// Paired bootstrap resampling (Koehn 2004; sacreBLEU --paired-bs).
    Bs,
    /// Approximate randomization (sacreBLEU --paired-ar).
    Ar,
    /// All three.
    All,
}

/// `cgnmt compare`: paired significance tests of one or more systems against a baseline.
#[derive(Debug, Clone)]
pub struct CompareOptions {
    /// Baseline translation.
    pub baseline: PathBuf,
    /// System translations to compare with the baseline.
    pub systems: Vec<PathBuf>,
    /// Reference file (repeat `-r` for several references).
    pub refs: Vec<PathBuf>,
    /// Test(s) to run.
    pub test: TestArg,
    /// Random seed (bootstrap and approximate randomization).
    pub seed: u64,
    /// Metric(s); repeat `-m` for several.
    pub metrics: Vec<MetricArg>,
    /// Metric configuration.
    pub opts: MetricOptions,
    /// Number of bootstrap resamples.
    pub bs_samples: usize,
    /// Number of approximate-randomization trials.
    pub ar_trials: usize,
    /// JSON output.
    pub json: bool,
}

fn fmt_p(p: Option<f64>) -> String {
    match p {
        Some(p) => format!("{:.4}{}", p, if p < 0.05 { "*" } else { " " }),
        None => "-".into(),
    }
}

/// Runs `cgnmt compare`.
pub fn run_compare(args: &CompareOptions) -> anyhow::Result<()> {
    run_compare_to(args, &mut std::io::stdout().lock())
}

/// The significance tests of `options` (its metrics, tests, seed, resamples and trials) of `systems` (named
/// outputs) against `baseline` on the references `refs` (`refs[k][line]`): per metric, the JSON record that
/// `compare --json` prints, and the table's lines.
pub fn compare_systems(
    args: &CompareOptions,
    baseline: &(String, Vec<String>),
    systems: &[(String, Vec<String>)],
    refs: &[Vec<String>],
) -> anyhow::Result<(Vec<serde_json::Value>, Vec<String>)> {
    let want = |t: TestArg| args.test == t || args.test == TestArg::All;
    let mut report = Vec::new();
    let nw = args
        .systems
        .iter()
        .map(|p| p.display().to_string().chars().count())
        .chain(std::iter::once(baseline.0.chars().count() + 11))
        .max()
        .unwrap_or(6)
        .max(6);
    let mut table = Vec::new();
    table.push(format!(
        "{:<8} {:<nw$} {:>7} {:>17} {:>8} {:>8} {:>16} {:>8}",
        "metric", "system", "score", "bs mean ± 95%ci", "bs p", "ar p", "sign +/-/=", "sign p"
    ));
    for &m in &args.metrics {
        let metric = args.opts.metric(m)?;
        let bst = metric.segment_stats(&baseline.1, refs)?;
        let base_score = metric.corpus_score(&bst);
        let mut base_ci: Option<(f64, f64)> = None;
        let mut rows = Vec::new();
        for (name, hyps) in systems {
            let sst = metric.segment_stats(hyps, refs)?;
            let score = metric.corpus_score(&sst);
            let bs = if want(TestArg::Bs) {
                let r = significance::paired_bootstrap(
                    &metric,
                    &bst,
                    &sst,
                    args.bs_samples,
                    args.seed,
                )?;
                base_ci = Some((r.base_mean, r.base_ci));
                Some(r)
            } else {
                None
            };
            let ar = if want(TestArg::Ar) {
                Some(significance::paired_ar(
                    &metric,
                    &bst,
                    &sst,
                    args.ar_trials,
                    args.seed,
                )?)
            } else {
                None
            };
            let sign = if want(TestArg::Sign) {
                Some(significance::sign_test(&metric, &bst, &sst)?)
            } else {
                None
            };
            rows.push(json!({
                "file": name,
                "score": score,
                "bootstrap": bs,
                "ar": ar,
                "sign": sign,
            }));
            table.push(format!(
                "{:<8} {:<nw$} {:>7.2} {:>17} {:>8} {:>8} {:>16} {:>8}",
                metric.name(),
                name,
                score,
                bs.map_or("-".into(), |b| format!(
                    "{:.2} ± {:.2}",
                    b.sys_mean, b.sys_ci
                )),
                fmt_p(bs.map(|b| b.p_value)),
                fmt_p(ar.map(|a| a.p_value)),
                sign.map_or("-".into(), |s| format!(
                    "{}/{}/{}",
                    s.better, s.worse, s.ties
                )),
                fmt_p(sign.map(|s| s.p_value)),
            ));
        }
        let base_row = format!(
            "{:<8} {:<nw$} {:>7.2} {:>17} {:>8} {:>8} {:>16} {:>8}",
            metric.name(),
            format!("{} (baseline)", baseline.0),
            base_score,
            base_ci.map_or("-".into(), |(m, c)| format!("{m:.2} ± {c:.2}")),
            "-",
            "-",
            "-",
            "-"
        );
        let insert_at = table.len() - rows.len();
        table.insert(insert_at, base_row);
        report.push(json!({
            "metric": metric.name(),
            "signature": metric.signature(refs.len()),
            "seed": args.seed,
            "bs_samples": args.bs_samples,
            "ar_trials": args.ar_trials,
            "baseline": {
                "file": baseline.0,
                "score": base_score,
                "bs_mean": base_ci.map(|x| x.0),
                "bs_ci": base_ci.map(|x| x.1),
            },
            "systems": rows,
        }));
    }
    Ok((report, table))
}

/// Like [`run_compare`] but writes to `o`.
pub fn run_compare_to(args: &CompareOptions, o: &mut dyn Write) -> anyhow::Result<()> {
    let (base, refs) = read_inputs(&args.refs, Some(&args.baseline))?;
    let mut systems = Vec::with_capacity(args.systems.len());
    for s in &args.systems {
        let lines = read_nonempty_lines(s)?;
        if lines.len() != base.len() {
            return Err(EvalError::LineCountMismatch {
                a: args.baseline.clone(),
                a_lines: base.len(),
                b: s.clone(),
                b_lines: lines.len(),
            }
            .into());
        }
        systems.push((s.display().to_string(), lines));
    }
    let baseline = (args.baseline.display().to_string(), base);
    let (report, table) = compare_systems(args, &baseline, &systems, &refs)?;
    if args.json {
        writeln!(
            o,
            "{}",
            serde_json::to_string_pretty(&json!({ "results": report }))?
        )?;
    } else {
        for l in &table {
            writeln!(o, "{l}")?;
        }
        writeln!(
            o,
            "* p < 0.05 (two-sided). bs: {} resamples, ar: {} trials, seed {}.",
            args.bs_samples, args.ar_trials, args.seed
        )?;
    }
    o.flush()?;
    Ok(())
}
