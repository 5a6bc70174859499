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

/// A system's runs: its outputs, one per training run (seed), named by their files.
pub type Runs = (String, Vec<Vec<String>>);

/// The files of one system's runs: a path, or several joined by commas (one per seed).
fn run_files(p: &Path) -> Vec<PathBuf> {
    let s = p.display().to_string();
    if s.contains(',') && !p.exists() {
        s.split(',').map(PathBuf::from).collect()
    } else {
        vec![p.to_path_buf()]
    }
}

/// The tests of `systems` against `baseline` when each is given as several runs (seeds): the paired tests
/// over the runs' pooled sentences (the i-th run of a system paired with the i-th of the baseline, as many as
/// both have), then per metric the seed-level tests of [`crate::seeds::compare_runs`]: a difference is
/// called significant only when the pooled bootstrap and Welch's test over the runs both say so.
pub fn compare_system_runs(
    args: &CompareOptions,
    baseline: &Runs,
    systems: &[Runs],
    refs: &[Vec<String>],
) -> anyhow::Result<(Vec<serde_json::Value>, Vec<String>)> {
    let pool = |runs: &[Vec<String>], k: usize| -> Vec<String> { runs[..k].concat() };
    let mut report = vec![];
    let mut table = vec![];
    for (name, runs) in systems {
        let k = runs.len().min(baseline.1.len());
        let pooled_refs: Vec<Vec<String>> = refs
            .iter()
            .map(|r| r.iter().cycle().take(r.len() * k).cloned().collect())
            .collect();
        let (pooled, lines) = compare_systems(
            args,
            &(
                format!("{} ({k} runs pooled)", baseline.0),
                pool(&baseline.1, k),
            ),
            &[(format!("{name} ({k} runs pooled)"), pool(runs, k))],
            &pooled_refs,
        )?;
        if table.is_empty() {
            table.extend(lines);
        } else {
            table.extend(lines.into_iter().skip(1));
        }
        for (m, pooled) in args.metrics.iter().zip(pooled) {
            let metric = args.opts.metric(*m)?;
            let stats = |rs: &[Vec<String>]| -> anyhow::Result<Vec<Vec<Vec<f64>>>> {
                rs.iter()
                    .map(|h| Ok(metric.segment_stats(h, refs)?))
                    .collect()
            };
            let c = crate::seeds::compare_runs(
                &metric,
                &stats(&baseline.1)?,
                &stats(runs)?,
                args.bs_samples,
                args.seed,
            )?;
            let pooled_p = pooled["systems"][0]["bootstrap"]["p_value"].as_f64();
            let welch_p = c.welch.map(|w| w.p_value);
            let significant =
                matches!((pooled_p, welch_p), (Some(a), Some(b)) if a < 0.05 && b < 0.05);
            table.push(format!(
                "  seed level, {} {name}: {} runs {:.2} (s_opt {:.2}, s_sel {:.2}) against {} runs {:.2} (s_opt {:.2}, s_sel {:.2}): Δ {:+.2}; Welch p {}; label permutation p {:.3} ({} splits); run bootstrap p {:.3}, 95% CI [{:+.2}, {:+.2}]; {}",
                metric.name(),
                c.sys_scores.len(),
                c.sys_mean,
                c.sys_s_opt,
                c.sys_s_sel,
                c.base_scores.len(),
                c.base_mean,
                c.base_s_opt,
                c.base_s_sel,
                c.sys_mean - c.base_mean,
                welch_p.map_or("- (one run a side)".into(), |p| format!("{p:.3}")),
                c.permutation.p_value,
                c.permutation.splits,
                c.bootstrap.p_value,
                c.bootstrap.ci_low,
                c.bootstrap.ci_high,
                match (significant, c.runs_needed) {
                    (true, _) => "significant at 0.05 (pooled bootstrap and Welch agree)".to_string(),
                    (false, Some(n)) => format!("not significant at the seed level; about {n} runs a side would detect a difference this large (power 0.8)"),
                    (false, None) => "no difference".to_string(),
                }
            ));
            report.push(json!({
                "metric": metric.name(),
                "system": name,
                "baseline": baseline.0,
                "pooled": pooled,
                "runs": c,
                "significant": significant,
                "rule": "significant when the paired bootstrap over the pooled runs and Welch's t-test over the runs' scores both give p < 0.05",
            }));
        }
    }
    Ok((report, table))
}

/// Like [`run_compare`] but writes to `o`.
pub fn run_compare_to(args: &CompareOptions, o: &mut dyn Write) -> anyhow::Result<()> {
    let base_files = run_files(&args.baseline);
    let (base, refs) = read_inputs(&args.refs, Some(&base_files[0]))?;
    let n_lines = base.len();
    let read_run = |p: &Path| -> anyhow::Result<Vec<String>> {
        let lines = read_nonempty_lines(p)?;
        if lines.len() != n_lines {
            return Err(EvalError::LineCountMismatch {
                a: base_files[0].clone(),
                a_lines: n_lines,
                b: p.to_path_buf(),
                b_lines: lines.len(),
            }
            .into());
        }
        Ok(lines)
    };
    let mut systems: Vec<Runs> = Vec::with_capacity(args.systems.len());
    for s in &args.systems {
        let runs = run_files(s)
            .iter()
            .map(|p| read_run(p))
            .collect::<anyhow::Result<Vec<_>>>()?;
        systems.push((s.display().to_string(), runs));
    }
    let mut base_runs = vec![base];
    for p in &base_files[1..] {
        base_runs.push(read_run(p)?);
    }
    let baseline: Runs = (args.baseline.display().to_string(), base_runs);
    if baseline.1.len() > 1 || systems.iter().any(|s| s.1.len() > 1) {
        let (report, table) = compare_system_runs(args, &baseline, &systems, &refs)?;
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
                "* p < 0.05 (two-sided), over the runs' pooled sentences. bs: {} resamples, ar: {} trials, seed {}.\n\
                 s_opt: the standard deviation of a system's score across its runs; s_sel: within the test set (bootstrap), averaged over the runs (Clark et al. 2011).",
                args.bs_samples, args.ar_trials, args.seed
            )?;
        }
        o.flush()?;
        return Ok(());
    }
    let systems: Vec<(String, Vec<String>)> = systems
        .into_iter()
        .map(|(n, mut r)| (n, r.remove(0)))
        .collect();
    let baseline = (
        baseline.0,
        baseline.1.into_iter().next().unwrap_or_default(),
    );
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
