//! Command-line front ends for the main `cgnmt` binary: `clap` argument structs
//! ([`ScoreArgs`], [`CompareArgs`], [`AerArgs`], and the subcommand groups [`AnalyzeArgs`]
//! (`lengths`, `gates`, `context-scaling`) and [`PlotArgs`] (`attention`, `training`)) and
//! their run functions ([`run_score`], [`run_compare`], [`run_aer`], [`run_analyze`],
//! [`run_plot`]). Mount them as subcommands, e.g.
//!
//! ```text
//! #[derive(clap::Subcommand)]
//! enum Cmd {
//!     /// Score a translation (BLEU, chrF, chrF++).
//!     Score(cgnmt_eval::cli::ScoreArgs),
//!     /// Paired significance tests of systems against a baseline.
//!     Compare(cgnmt_eval::cli::CompareArgs),
//!     /// Alignment error rate (and soft AER).
//!     Aer(cgnmt_eval::cli::AerArgs),
//!     /// The paper's analyses (length groups, gates, context scaling).
//!     Analyze(cgnmt_eval::cli::AnalyzeArgs),
//!     /// Figures (attention heatmap, training curves).
//!     Plot(cgnmt_eval::cli::PlotArgs),
//! }
//! // match cmd { Cmd::Score(a) => cgnmt_eval::cli::run_score(&a)?, ... }
//! ```
//!
//! The run functions return errors (file and line, mismatched line counts, empty files,
//! invalid UTF-8, malformed links) instead of panicking; output goes to standard output, and a
//! closed pipe is reported as an error too.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::{Args, Subcommand, ValueEnum};
use serde_json::json;

use crate::aer;
use crate::bleu::{corpus_bleu, sentence_bleu, BleuOptions, BleuScore, Smooth};
use crate::chrf::{corpus_chrf, sentence_chrf, ChrfOptions, ChrfScore};
use crate::io::{read_nonempty_lines, read_stdin_lines};
use crate::significance::{self, Metric};
use crate::tokenize::Tokenize;
use crate::EvalError;

/// Metric selection on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MetricArg {
    /// Corpus BLEU.
    Bleu,
    /// chrF2.
    Chrf,
    /// chrF2++ (word order 2).
    #[value(name = "chrf++")]
    ChrfPlusPlus,
}

/// Tokeniser selection on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TokenizeArg {
    /// sacreBLEU 13a (default).
    #[value(name = "13a")]
    T13a,
    /// sacreBLEU intl.
    Intl,
    /// sacreBLEU zh.
    Zh,
    /// sacreBLEU char.
    Char,
    /// sacreBLEU none (whitespace only).
    #[value(name = "none")]
    NoTok,
    /// NIST mteval-v11b.pl tokenisation (byte semantics).
    #[value(name = "mteval-v11b")]
    MtevalV11b,
    /// NIST mteval-v13a.pl default tokenisation.
    #[value(name = "mteval-v13a")]
    MtevalV13a,
    /// NIST mteval-v13a.pl --international-tokenization.
    #[value(name = "mteval-v13a-intl")]
    MtevalV13aIntl,
    /// Moses multi-bleu.perl (ASCII whitespace).
    #[value(name = "multi-bleu")]
    MultiBleu,
}

impl From<TokenizeArg> for Tokenize {
    fn from(t: TokenizeArg) -> Tokenize {
        match t {
            TokenizeArg::T13a => Tokenize::Tok13a,
            TokenizeArg::Intl => Tokenize::Intl,
            TokenizeArg::Zh => Tokenize::Zh,
            TokenizeArg::Char => Tokenize::Char,
            TokenizeArg::NoTok => Tokenize::None,
            TokenizeArg::MtevalV11b => Tokenize::MtevalV11b,
            TokenizeArg::MtevalV13a => Tokenize::MtevalV13a,
            TokenizeArg::MtevalV13aIntl => Tokenize::MtevalV13aIntl,
            TokenizeArg::MultiBleu => Tokenize::MultiBleu,
        }
    }
}

/// Smoothing selection on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SmoothArg {
    /// Exponential (mteval-v13a / sacreBLEU default).
    Exp,
    /// No smoothing.
    #[value(name = "none")]
    Off,
    /// Floor (value default 0.1).
    Floor,
    /// Add-k (value default 1).
    #[value(name = "add-k")]
    AddK,
}

/// Options shared by `score` and `compare` that configure BLEU / chrF.
#[derive(Debug, Clone, Args)]
pub struct MetricOptions {
    /// BLEU tokenisation (default 13a).
    #[arg(long = "tokenize", visible_alias = "tok", value_enum)]
    pub tokenize: Option<TokenizeArg>,
    /// Case-insensitive scoring (`-lc` works as in sacreBLEU).
    #[arg(short = 'l', long = "lowercase", visible_alias = "lc")]
    pub lowercase: bool,
    /// (Hidden: makes sacreBLEU's `-lc` parse as `-l -c`.)
    #[arg(short = 'c', hide = true)]
    pub lc_c: bool,
    /// BLEU smoothing (default exp).
    #[arg(long = "smooth", value_enum)]
    pub smooth: Option<SmoothArg>,
    /// Value for floor / add-k smoothing.
    #[arg(long = "smooth-value")]
    pub smooth_value: Option<f64>,
    /// NIST mteval-v11b.pl BLEU (the paper's metric): its tokenisation, shortest reference
    /// length, no smoothing, case-insensitive unless --cased.
    #[arg(long = "mteval-v11b")]
    pub mteval_v11b: bool,
    /// With --mteval-v11b: case-sensitive (mteval's `-c`).
    #[arg(long = "cased", requires = "mteval_v11b")]
    pub cased: bool,
}

impl MetricOptions {
    fn lowercase(&self) -> bool {
        self.lowercase || self.lc_c
    }

    /// The BLEU options these flags describe.
    pub fn bleu_options(&self) -> anyhow::Result<BleuOptions> {
        if self.mteval_v11b {
            if self.tokenize.is_some() || self.smooth.is_some() || self.lowercase() {
                bail!("--mteval-v11b fixes tokenisation, smoothing and case (use --cased for -c); drop --tokenize/--smooth/-lc");
            }
            let mut o = BleuOptions::mteval_v11b();
            o.lowercase = !self.cased;
            return Ok(o);
        }
        let mut o = BleuOptions::sacrebleu();
        if let Some(t) = self.tokenize {
            o.tokenize = t.into();
        }
        o.lowercase = self.lowercase();
        let v = self.smooth_value;
        o.smooth = match (self.smooth.unwrap_or(SmoothArg::Exp), v) {
            (SmoothArg::Exp, None) => Smooth::Exp,
            (SmoothArg::Off, None) => Smooth::None,
            (SmoothArg::Floor, v) => Smooth::Floor(v.unwrap_or(0.1)),
            (SmoothArg::AddK, v) => Smooth::AddK(v.unwrap_or(1.0)),
            (s, Some(_)) => {
                bail!("--smooth-value only applies to floor and add-k smoothing, not {s:?}")
            }
        };
        if let Some(x) = v {
            if !(x.is_finite() && x >= 0.0) {
                bail!("--smooth-value must be a finite non-negative number, got {x}");
            }
        }
        Ok(o)
    }

    /// The chrF options these flags describe (BLEU-only flags are rejected).
    pub fn chrf_options(&self, plus_plus: bool) -> anyhow::Result<ChrfOptions> {
        if self.tokenize.is_some()
            || self.smooth.is_some()
            || self.smooth_value.is_some()
            || self.mteval_v11b
        {
            bail!("--tokenize, --smooth, --smooth-value and --mteval-v11b apply to BLEU only");
        }
        let mut o = if plus_plus {
            ChrfOptions::chrf_plus_plus()
        } else {
            ChrfOptions::chrf()
        };
        o.lowercase = self.lowercase();
        Ok(o)
    }

    fn metric(&self, m: MetricArg) -> anyhow::Result<Metric> {
        Ok(match m {
            MetricArg::Bleu => Metric::Bleu(self.bleu_options()?),
            MetricArg::Chrf => Metric::Chrf(self.chrf_options(false)?),
            MetricArg::ChrfPlusPlus => Metric::Chrf(self.chrf_options(true)?),
        })
    }
}

/// `cgnmt score`: corpus (or per-sentence) BLEU / chrF / chrF++ of a hypothesis file.
#[derive(Debug, Clone, Args)]
pub struct ScoreArgs {
    /// Reference file (repeat `-r` for several references).
    #[arg(short = 'r', long = "ref", required = true)]
    pub refs: Vec<PathBuf>,
    /// Hypothesis file (default: standard input).
    #[arg(short = 'i', long = "input")]
    pub input: Option<PathBuf>,
    /// Metric.
    #[arg(short = 'm', long = "metric", value_enum, default_value = "bleu")]
    pub metric: MetricArg,
    /// Metric configuration.
    #[command(flatten)]
    pub opts: MetricOptions,
    /// Print one score per segment (sentence BLEU with effective order, as sacreBLEU's
    /// `sentence_bleu`; sentence chrF).
    #[arg(long = "sentence")]
    pub sentence: bool,
    /// JSON output (one object; with --sentence one object per line).
    #[arg(long = "json")]
    pub json: bool,
    /// Decimals in the human-readable output.
    #[arg(short = 'w', long = "width", default_value_t = 2)]
    pub width: usize,
}

/// Reads the references and the hypothesis (file or stdin) and checks the line counts.
fn read_inputs(
    refs: &[PathBuf],
    input: Option<&Path>,
) -> anyhow::Result<(Vec<String>, Vec<Vec<String>>)> {
    let (hyps, hyp_name) = match input {
        Some(p) => (read_nonempty_lines(p)?, p.to_path_buf()),
        None => {
            let h = read_stdin_lines()?;
            if h.is_empty() {
                return Err(EvalError::EmptyFile {
                    path: PathBuf::from("<stdin>"),
                }
                .into());
            }
            (h, PathBuf::from("<stdin>"))
        }
    };
    let mut rs = Vec::with_capacity(refs.len());
    for r in refs {
        let lines = read_nonempty_lines(r)?;
        if lines.len() != hyps.len() {
            return Err(EvalError::LineCountMismatch {
                a: hyp_name,
                a_lines: hyps.len(),
                b: r.clone(),
                b_lines: lines.len(),
            }
            .into());
        }
        rs.push(lines);
    }
    Ok((hyps, rs))
}

fn bleu_json(b: &BleuScore) -> serde_json::Value {
    json!({
        "name": "BLEU",
        "score": b.score,
        "counts": b.counts,
        "totals": b.totals,
        "precisions": b.precisions,
        "bp": b.bp,
        "sys_len": b.sys_len,
        "ref_len": b.ref_len,
        "signature": b.signature,
    })
}

fn chrf_json(c: &ChrfScore) -> serde_json::Value {
    json!({ "name": c.name, "score": c.score, "signature": c.signature })
}

fn bleu_line(b: &BleuScore, w: usize) -> String {
    let ratio = if b.ref_len > 0 {
        b.sys_len as f64 / b.ref_len as f64
    } else {
        0.0
    };
    format!(
        "BLEU|{} = {:.w$} {:.1}/{:.1}/{:.1}/{:.1} (BP = {:.3} ratio = {:.3} hyp_len = {} ref_len = {})",
        b.signature,
        b.score,
        b.precisions[0],
        b.precisions[1],
        b.precisions[2],
        b.precisions[3],
        b.bp,
        ratio,
        b.sys_len,
        b.ref_len
    )
}

/// Runs `cgnmt score`.
pub fn run_score(args: &ScoreArgs) -> anyhow::Result<()> {
    run_score_to(args, &mut std::io::stdout().lock())
}

/// Like [`run_score`] but writes to `o`.
pub fn run_score_to(args: &ScoreArgs, o: &mut dyn Write) -> anyhow::Result<()> {
    let (hyps, refs) = read_inputs(&args.refs, args.input.as_deref())?;
    let w = args.width;
    match args.metric {
        MetricArg::Bleu => {
            let mut opts = args.opts.bleu_options()?;
            if args.sentence {
                opts.effective_order = true;
                for (i, h) in hyps.iter().enumerate() {
                    let r: Vec<String> = refs.iter().map(|r| r[i].clone()).collect();
                    let b = sentence_bleu(h, &r, &opts)?;
                    if args.json {
                        writeln!(o, "{}", bleu_json(&b))?;
                    } else {
                        writeln!(o, "{}", bleu_line(&b, w))?;
                    }
                }
            } else {
                let b = corpus_bleu(&hyps, &refs, &opts)?;
                if args.json {
                    writeln!(o, "{}", serde_json::to_string_pretty(&bleu_json(&b))?)?;
                } else {
                    writeln!(o, "{}", bleu_line(&b, w))?;
                }
            }
        }
        MetricArg::Chrf | MetricArg::ChrfPlusPlus => {
            let opts = args
                .opts
                .chrf_options(args.metric == MetricArg::ChrfPlusPlus)?;
            let scores: Vec<ChrfScore> = if args.sentence {
                let mut v = Vec::with_capacity(hyps.len());
                for (i, h) in hyps.iter().enumerate() {
                    let r: Vec<String> = refs.iter().map(|r| r[i].clone()).collect();
                    v.push(sentence_chrf(h, &r, &opts)?);
                }
                v
            } else {
                vec![corpus_chrf(&hyps, &refs, &opts)?]
            };
            for c in &scores {
                if args.json && !args.sentence {
                    writeln!(o, "{}", serde_json::to_string_pretty(&chrf_json(c))?)?;
                } else if args.json {
                    writeln!(o, "{}", chrf_json(c))?;
                } else {
                    writeln!(o, "{}|{} = {:.w$}", c.name, c.signature, c.score)?;
                }
            }
        }
    }
    o.flush()?;
    Ok(())
}

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
#[derive(Debug, Clone, Args)]
pub struct CompareArgs {
    /// Baseline translation.
    pub baseline: PathBuf,
    /// System translations to compare with the baseline.
    #[arg(required = true)]
    pub systems: Vec<PathBuf>,
    /// Reference file (repeat `-r` for several references).
    #[arg(short = 'r', long = "ref", required = true)]
    pub refs: Vec<PathBuf>,
    /// Test(s) to run.
    #[arg(long = "test", value_enum, default_value = "all")]
    pub test: TestArg,
    /// Random seed (bootstrap and approximate randomization).
    #[arg(long = "seed", default_value_t = significance::DEFAULT_SEED)]
    pub seed: u64,
    /// Metric(s); repeat `-m` for several.
    #[arg(short = 'm', long = "metric", value_enum, default_values_t = vec![MetricArg::Bleu])]
    pub metrics: Vec<MetricArg>,
    /// Metric configuration.
    #[command(flatten)]
    pub opts: MetricOptions,
    /// Number of bootstrap resamples.
    #[arg(long = "bs-samples", default_value_t = significance::DEFAULT_BS_SAMPLES)]
    pub bs_samples: usize,
    /// Number of approximate-randomization trials.
    #[arg(long = "ar-trials", default_value_t = significance::DEFAULT_AR_TRIALS)]
    pub ar_trials: usize,
    /// JSON output.
    #[arg(long = "json")]
    pub json: bool,
}

fn fmt_p(p: Option<f64>) -> String {
    match p {
        Some(p) => format!("{:.4}{}", p, if p < 0.05 { "*" } else { " " }),
        None => "-".into(),
    }
}

/// Runs `cgnmt compare`.
pub fn run_compare(args: &CompareArgs) -> anyhow::Result<()> {
    run_compare_to(args, &mut std::io::stdout().lock())
}

/// Like [`run_compare`] but writes to `o`.
pub fn run_compare_to(args: &CompareArgs, o: &mut dyn Write) -> anyhow::Result<()> {
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
        systems.push(lines);
    }
    let want = |t: TestArg| args.test == t || args.test == TestArg::All;
    let mut report = Vec::new();
    let nw = args
        .systems
        .iter()
        .map(|p| p.display().to_string().chars().count())
        .chain(std::iter::once(
            args.baseline.display().to_string().chars().count() + 11,
        ))
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
        let bst = metric.segment_stats(&base, &refs)?;
        let base_score = metric.corpus_score(&bst);
        let mut base_ci: Option<(f64, f64)> = None;
        let mut rows = Vec::new();
        for (path, hyps) in args.systems.iter().zip(&systems) {
            let sst = metric.segment_stats(hyps, &refs)?;
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
                "file": path.display().to_string(),
                "score": score,
                "bootstrap": bs,
                "ar": ar,
                "sign": sign,
            }));
            table.push(format!(
                "{:<8} {:<nw$} {:>7.2} {:>17} {:>8} {:>8} {:>16} {:>8}",
                metric.name(),
                path.display().to_string(),
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
            format!("{} (baseline)", args.baseline.display()),
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
                "file": args.baseline.display().to_string(),
                "score": base_score,
                "bs_mean": base_ci.map(|x| x.0),
                "bs_ci": base_ci.map(|x| x.1),
            },
            "systems": rows,
        }));
    }
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

/// `cgnmt aer`: alignment error rate of predicted links (and soft AER of attention matrices).
#[derive(Debug, Clone, Args)]
pub struct AerArgs {
    /// Gold alignments (`.talp`: `i-j` sure, `i?j` possible, 0-based).
    #[arg(long = "gold")]
    pub gold: PathBuf,
    /// Predicted alignments (`.talp`). Without it, --soft's row-wise argmax links are scored.
    #[arg(long = "pred", required_unless_present = "soft")]
    pub pred: Option<PathBuf>,
    /// Soft alignments, JSONL: one `{"attention": [[weight per source word] per target word]}`
    /// per sentence pair (extra keys ignored). Gold links `i-j` must then have i = source,
    /// j = target.
    #[arg(long = "soft")]
    pub soft: Option<PathBuf>,
    /// Optional whitespace-tokenised sentences of the first-named language, to check that
    /// every link's first index is in range.
    #[arg(long = "first-text", requires = "second_text")]
    pub first_text: Option<PathBuf>,
    /// Optional whitespace-tokenised sentences of the second language (second index).
    #[arg(long = "second-text", requires = "first_text")]
    pub second_text: Option<PathBuf>,
    /// JSON output.
    #[arg(long = "json")]
    pub json: bool,
}

/// Runs `cgnmt aer`.
pub fn run_aer(args: &AerArgs) -> anyhow::Result<()> {
    run_aer_to(args, &mut std::io::stdout().lock())
}

/// Like [`run_aer`] but writes to `o`.
pub fn run_aer_to(args: &AerArgs, o: &mut dyn Write) -> anyhow::Result<()> {
    let gold = aer::read_gold(&args.gold)?;
    if gold.is_empty() {
        return Err(EvalError::EmptyFile {
            path: args.gold.clone(),
        }
        .into());
    }
    let soft = match &args.soft {
        Some(p) => {
            let s = aer::read_soft_jsonl(p)?;
            if s.len() != gold.len() {
                return Err(EvalError::LineCountMismatch {
                    a: args.gold.clone(),
                    a_lines: gold.len(),
                    b: p.clone(),
                    b_lines: s.len(),
                }
                .into());
            }
            Some(s)
        }
        None => None,
    };
    let (pred, pred_name) = match (&args.pred, &soft) {
        (Some(p), _) => (aer::read_pred(p)?, p.clone()),
        (None, Some(s)) => (aer::argmax_links(s), PathBuf::from("<argmax of --soft>")),
        (None, None) => bail!("give --pred and/or --soft"),
    };
    if pred.len() != gold.len() {
        return Err(EvalError::LineCountMismatch {
            a: args.gold.clone(),
            a_lines: gold.len(),
            b: pred_name,
            b_lines: pred.len(),
        }
        .into());
    }
    if let (Some(f), Some(s)) = (&args.first_text, &args.second_text) {
        let fl = crate::io::read_lines(f)?;
        let sl = crate::io::read_lines(s)?;
        if fl.len() != sl.len() {
            return Err(EvalError::LineCountMismatch {
                a: f.clone(),
                a_lines: fl.len(),
                b: s.clone(),
                b_lines: sl.len(),
            }
            .into());
        }
        let lens: Vec<(usize, usize)> = fl
            .iter()
            .zip(&sl)
            .map(|(a, b)| (a.split_whitespace().count(), b.split_whitespace().count()))
            .collect();
        aer::validate_ranges(&aer::gold_as_links(&gold), &lens, &args.gold)?;
        if let Some(p) = &args.pred {
            aer::validate_ranges(&pred, &lens, p)?;
        }
    }
    let r = aer::aer(&gold, &pred).context("computing AER")?;
    let s = match &soft {
        Some(m) => Some(aer::saer(&gold, m).with_context(|| {
            format!(
                "soft AER of {} (rows = target words, columns = source words; gold i-j = source-target)",
                args.soft.as_deref().unwrap_or(Path::new("")).display()
            )
        })?),
        None => None,
    };
    if args.json {
        let mut v = json!({
            "precision": r.precision,
            "recall": r.recall,
            "aer": r.aer,
            "a": r.a,
            "s": r.s,
            "p": r.p,
            "a_and_s": r.a_and_s,
            "a_and_p": r.a_and_p,
            "sentences": gold.len(),
        });
        if let Some(s) = &s {
            v["saer"] = json!(s.saer);
            v["saer_macro"] = json!(s.macro_saer);
            v["sum_ma"] = json!(s.totals.sum_ma);
            v["sum_ma_ms"] = json!(s.totals.sum_ma_ms);
            v["sum_ma_mp"] = json!(s.totals.sum_ma_mp);
        }
        writeln!(o, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        writeln!(
            o,
            "AER = {:.2}% (precision {:.2}%, recall {:.2}%; |A| = {}, |S| = {}, |P| = {}, |A∩S| = {}, |A∩P| = {}; {} sentences)",
            100.0 * r.aer,
            100.0 * r.precision,
            100.0 * r.recall,
            r.a,
            r.s,
            r.p,
            r.a_and_s,
            r.a_and_p,
            gold.len()
        )?;
        if let Some(s) = &s {
            writeln!(
                o,
                "SAER = {:.2}% (micro; macro {:.2}%; |M_A| = {:.4}, |M_A·M_S| = {:.4}, |M_A·M_P| = {:.4})",
                100.0 * s.saer,
                100.0 * s.macro_saer,
                s.totals.sum_ma,
                s.totals.sum_ma_ms,
                s.totals.sum_ma_mp
            )?;
        }
    }
    o.flush()?;
    Ok(())
}

// =============================================================================================
// `cgnmt analyze …` and `cgnmt plot …`
// =============================================================================================

/// BLEU flavour of the analyses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BleuFlavour {
    /// NIST mteval-v11b.pl (the paper's metric: its tokenisation, shortest reference, no
    /// smoothing).
    #[value(name = "mteval-v11b")]
    MtevalV11b,
    /// sacreBLEU default (13a tokenisation, closest reference, exp smoothing).
    #[value(name = "sacrebleu")]
    Sacrebleu,
}

/// Corpus-BLEU options of `analyze lengths` and `analyze context-scaling`.
#[derive(Debug, Clone, Args)]
pub struct AnalysisBleuArgs {
    /// BLEU flavour.
    #[arg(long = "bleu", value_enum, default_value = "mteval-v11b")]
    pub bleu: BleuFlavour,
    /// Case-sensitive BLEU (default: case-insensitive, as in the paper).
    #[arg(long = "cased")]
    pub cased: bool,
}

impl AnalysisBleuArgs {
    /// The BLEU options these flags describe.
    pub fn options(&self) -> BleuOptions {
        let mut o = match self.bleu {
            BleuFlavour::MtevalV11b => BleuOptions::mteval_v11b(),
            BleuFlavour::Sacrebleu => BleuOptions::sacrebleu(),
        };
        o.lowercase = !self.cased;
        o
    }
}

/// `NAME=FILE` on the command line.
#[derive(Debug, Clone, PartialEq)]
pub struct NamedFile {
    /// The name.
    pub name: String,
    /// The file.
    pub path: PathBuf,
}

fn parse_named_file(s: &str) -> Result<NamedFile, String> {
    match s.split_once('=') {
        Some((n, p)) if !n.trim().is_empty() && !p.is_empty() => Ok(NamedFile {
            name: n.trim().to_string(),
            path: PathBuf::from(p),
        }),
        _ => Err(format!("expected NAME=FILE, got `{s}`")),
    }
}

/// `A,B=FILE` on the command line (source scale, target scale, outputs).
#[derive(Debug, Clone, PartialEq)]
pub struct ScaledRun {
    /// Scale of the source context.
    pub a: f64,
    /// Scale of the target context.
    pub b: f64,
    /// The outputs decoded with these scales.
    pub path: PathBuf,
}

fn parse_scaled_run(s: &str) -> Result<ScaledRun, String> {
    let bad = || format!("expected A,B=FILE (e.g. 1.0,0.5=out.txt), got `{s}`");
    let (ab, p) = s.split_once('=').ok_or_else(bad)?;
    let (a, b) = ab.split_once(',').ok_or_else(bad)?;
    let num = |x: &str| {
        x.trim()
            .parse::<f64>()
            .ok()
            .filter(|v| v.is_finite())
            .ok_or_else(bad)
    };
    if p.is_empty() {
        return Err(bad());
    }
    Ok(ScaledRun {
        a: num(a)?,
        b: num(b)?,
        path: PathBuf::from(p),
    })
}

/// `cgnmt analyze lengths`: BLEU and mean output length per source-length group (paper Fig. 7).
#[derive(Debug, Clone, Args)]
pub struct LengthsArgs {
    /// Source file (one sentence per line, words separated by spaces).
    #[arg(long = "src")]
    pub src: PathBuf,
    /// Reference file (repeat `-r` for several references).
    #[arg(short = 'r', long = "ref", required = true)]
    pub refs: Vec<PathBuf>,
    /// System outputs as NAME=FILE (repeat for several systems).
    #[arg(long = "sys", required = true, value_parser = parse_named_file)]
    pub systems: Vec<NamedFile>,
    /// Bucket edges in source words (buckets <e1, e1-e2, …, ≥en).
    #[arg(long = "edges", value_delimiter = ',', default_values_t = crate::analysis::DEFAULT_EDGES.to_vec())]
    pub edges: Vec<usize>,
    /// BLEU configuration.
    #[command(flatten)]
    pub bleu: AnalysisBleuArgs,
    /// JSON output.
    #[arg(long = "json")]
    pub json: bool,
    /// Also draw the chart (BLEU and output length per group) to this .png or .svg file.
    #[arg(long = "plot")]
    pub plot: Option<PathBuf>,
}

/// `cgnmt analyze gates`: mean gate value per sentence against the sentence-BLEU improvement
/// over a baseline, with Pearson correlations (paper Table 6).
#[derive(Debug, Clone, Args)]
pub struct GatesArgs {
    /// Source file (one sentence per line; its word counts define "long" sentences).
    #[arg(long = "src")]
    pub src: PathBuf,
    /// Reference file (repeat `-r` for several references).
    #[arg(short = 'r', long = "ref", required = true)]
    pub refs: Vec<PathBuf>,
    /// Baseline outputs.
    #[arg(long = "baseline")]
    pub baseline: PathBuf,
    /// Outputs of the gated system.
    #[arg(long = "system")]
    pub system: PathBuf,
    /// Translation dump of the gated system (`cgnmt translate --dump`), JSON lines with `gates`.
    #[arg(long = "dump")]
    pub dump: PathBuf,
    /// Sentences with at least this many source words are "long".
    #[arg(long = "long", default_value_t = crate::analysis::DEFAULT_LONG)]
    pub long: usize,
    /// Case-sensitive sentence BLEU (default: case-insensitive).
    #[arg(long = "cased")]
    pub cased: bool,
    /// JSON output (with the per-sentence values).
    #[arg(long = "json")]
    pub json: bool,
}

/// `cgnmt analyze context-scaling`: translation length and BLEU of outputs decoded with the
/// source context scaled by a and the target context by b (paper Fig. 2a / Table 1).
#[derive(Debug, Clone, Args)]
pub struct ContextScalingArgs {
    /// Source file.
    #[arg(long = "src")]
    pub src: PathBuf,
    /// Reference file (repeat `-r` for several references).
    #[arg(short = 'r', long = "ref", required = true)]
    pub refs: Vec<PathBuf>,
    /// Outputs of one setting as A,B=FILE, e.g. `--run 1.0,0.5=out.b05.txt` (repeat).
    #[arg(long = "run", required = true, value_parser = parse_scaled_run)]
    pub runs: Vec<ScaledRun>,
    /// BLEU configuration.
    #[command(flatten)]
    pub bleu: AnalysisBleuArgs,
    /// JSON output.
    #[arg(long = "json")]
    pub json: bool,
    /// Also draw the chart (length ratio and BLEU per setting) to this .png or .svg file.
    #[arg(long = "plot")]
    pub plot: Option<PathBuf>,
}

/// The `analyze` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum AnalyzeCmd {
    /// BLEU and mean output length by source-length group (paper Fig. 7).
    Lengths(LengthsArgs),
    /// Gate values against sentence-BLEU improvement over a baseline (paper Table 6).
    Gates(GatesArgs),
    /// Translation length ratio and BLEU under context scaling (paper Fig. 2a / Table 1).
    ContextScaling(ContextScalingArgs),
}

/// `cgnmt analyze …`: the paper's analyses.
#[derive(Debug, Clone, Args)]
pub struct AnalyzeArgs {
    /// The analysis.
    #[command(subcommand)]
    pub cmd: AnalyzeCmd,
}

/// `cgnmt plot attention`: attention heatmap (with gate values) of one translation (Fig. 6).
#[derive(Debug, Clone, Args)]
pub struct PlotAttentionArgs {
    /// Translation dump (`cgnmt translate --dump`), JSON lines.
    #[arg(long = "dump")]
    pub dump: PathBuf,
    /// Sentence id (0-based, the record's `id`).
    #[arg(long = "id")]
    pub id: usize,
    /// Output file, .png or .svg.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
}

/// `cgnmt plot training`: loss per token and dev BLEU against the step.
#[derive(Debug, Clone, Args)]
pub struct PlotTrainingArgs {
    /// Training log (`train.log`, JSON lines).
    #[arg(long = "log")]
    pub log: PathBuf,
    /// Output file, .png or .svg.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
}

/// The `plot` subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum PlotCmd {
    /// Attention heatmap with gate values of one translation (paper Fig. 6).
    Attention(PlotAttentionArgs),
    /// Training curves: loss per token and dev BLEU against the step.
    Training(PlotTrainingArgs),
}

/// `cgnmt plot …`: figures.
#[derive(Debug, Clone, Args)]
pub struct PlotArgs {
    /// The figure.
    #[command(subcommand)]
    pub cmd: PlotCmd,
}

/// Reads the source and references and checks that they are parallel.
fn read_src_refs(src: &Path, refs: &[PathBuf]) -> anyhow::Result<(Vec<String>, Vec<Vec<String>>)> {
    let s = read_nonempty_lines(src)?;
    let mut rs = Vec::with_capacity(refs.len());
    for r in refs {
        rs.push(read_parallel(r, src, s.len())?);
    }
    Ok((s, rs))
}

/// Reads `path` and checks it has `n` lines like `like`.
fn read_parallel(path: &Path, like: &Path, n: usize) -> anyhow::Result<Vec<String>> {
    let lines = crate::io::read_lines(path)?;
    if lines.len() != n {
        return Err(EvalError::LineCountMismatch {
            a: like.to_path_buf(),
            a_lines: n,
            b: path.to_path_buf(),
            b_lines: lines.len(),
        }
        .into());
    }
    Ok(lines)
}

fn check_plot_path(p: &Option<PathBuf>) -> anyhow::Result<()> {
    if let Some(p) = p {
        crate::plot::format_of(p)?;
    }
    Ok(())
}

fn opt(v: Option<f64>, w: usize, prec: usize) -> String {
    match v {
        Some(x) => format!("{x:>w$.prec$}"),
        None => format!("{:>w$}", "-"),
    }
}

/// Runs `cgnmt analyze …`.
pub fn run_analyze(args: &AnalyzeArgs) -> anyhow::Result<()> {
    run_analyze_to(args, &mut std::io::stdout().lock())
}

/// Like [`run_analyze`] but writes to `o`.
pub fn run_analyze_to(args: &AnalyzeArgs, o: &mut dyn Write) -> anyhow::Result<()> {
    match &args.cmd {
        AnalyzeCmd::Lengths(a) => run_lengths_to(a, o),
        AnalyzeCmd::Gates(a) => run_gates_to(a, o),
        AnalyzeCmd::ContextScaling(a) => run_context_scaling_to(a, o),
    }
}

fn run_lengths_to(args: &LengthsArgs, o: &mut dyn Write) -> anyhow::Result<()> {
    check_plot_path(&args.plot)?;
    crate::analysis::check_edges(&args.edges)?;
    let (src, refs) = read_src_refs(&args.src, &args.refs)?;
    let mut systems = Vec::with_capacity(args.systems.len());
    for s in &args.systems {
        if systems
            .iter()
            .any(|(n, _): &(String, Vec<String>)| *n == s.name)
        {
            bail!("system name `{}` given twice", s.name);
        }
        systems.push((
            s.name.clone(),
            read_parallel(&s.path, &args.src, src.len())?,
        ));
    }
    let opts = args.bleu.options();
    let g = crate::analysis::length_groups(&src, &refs, &systems, &args.edges, &opts)?;
    if args.json {
        let mut v = serde_json::to_value(&g)?;
        v["src"] = json!(args.src.display().to_string());
        v["systems"] = json!(args
            .systems
            .iter()
            .map(|s| json!({"name": s.name, "file": s.path.display().to_string()}))
            .collect::<Vec<_>>());
        writeln!(o, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        writeln!(o, "BLEU|{} by source length (words)", g.signature)?;
        let mut head = format!(
            "{:<8} {:>6} {:>8} {:>8}",
            "length", "sents", "src_len", "ref_len"
        );
        let widths: Vec<usize> = systems
            .iter()
            .map(|(n, _)| n.chars().count().max(13))
            .collect();
        for ((n, _), w) in systems.iter().zip(&widths) {
            head.push_str(&format!(" | {n:^w$}"));
        }
        writeln!(o, "{head}")?;
        let mut sub = format!("{:<8} {:>6} {:>8} {:>8}", "", "", "", "");
        for w in &widths {
            sub.push_str(&format!(" | {:>6} {:>w2$}", "BLEU", "len", w2 = w - 7));
        }
        writeln!(o, "{sub}")?;
        for b in &g.buckets {
            let mut line = format!(
                "{:<8} {:>6} {} {}",
                b.label,
                b.sentences,
                opt(b.mean_src_len, 8, 2),
                opt(b.mean_ref_len, 8, 2)
            );
            for (s, w) in b.systems.iter().zip(&widths) {
                line.push_str(&format!(
                    " | {} {}",
                    opt(s.bleu, 6, 2),
                    opt(s.mean_len, w - 7, 2)
                ));
            }
            writeln!(o, "{line}")?;
        }
    }
    if let Some(p) = &args.plot {
        crate::plot::save(&crate::plot::length_groups_figure(&g), p)?;
        eprintln!("wrote {}", p.display());
    }
    o.flush()?;
    Ok(())
}

fn run_gates_to(args: &GatesArgs, o: &mut dyn Write) -> anyhow::Result<()> {
    let (src, refs) = read_src_refs(&args.src, &args.refs)?;
    let base = read_parallel(&args.baseline, &args.src, src.len())?;
    let sys = read_parallel(&args.system, &args.src, src.len())?;
    let records = crate::analysis::read_dump(&args.dump)?;
    let records = crate::analysis::dump_by_id(records, src.len(), &args.dump)?;
    let gates: Vec<Option<f64>> = records.iter().map(|r| r.mean_gate()).collect();
    if gates.iter().all(|g| g.is_none()) {
        bail!(
            "{}: no record has gate values (`gates` is empty everywhere): was the dump written by a model without a context gate?",
            args.dump.display()
        );
    }
    let mut opts = BleuOptions::sentence();
    opts.lowercase = !args.cased;
    let a = crate::analysis::gate_analysis(&src, &refs, &base, &sys, &gates, args.long, &opts)?;
    if args.json {
        let mut v = serde_json::to_value(&a)?;
        v["baseline"] = json!(args.baseline.display().to_string());
        v["system"] = json!(args.system.display().to_string());
        v["dump"] = json!(args.dump.display().to_string());
        writeln!(o, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        writeln!(
            o,
            "Mean gate value per sentence vs sentence-BLEU improvement of {} over {}",
            args.system.display(),
            args.baseline.display()
        )?;
        writeln!(o, "sentence BLEU|{}", a.signature)?;
        writeln!(
            o,
            "{:<14} {:>6} {:>10} {:>11} {:>10}",
            "sentences", "n", "mean gate", "mean ΔBLEU", "pearson r"
        )?;
        for c in &a.correlations {
            writeln!(
                o,
                "{:<14} {:>6} {} {} {}",
                c.subset,
                c.n,
                opt(c.mean_gate, 10, 4),
                match c.mean_improvement {
                    Some(x) => format!("{x:>+11.2}"),
                    None => format!("{:>11}", "-"),
                },
                match (c.r, &c.note) {
                    (Some(r), _) => format!("{r:>10.4}"),
                    (None, Some(n)) => format!("{:>10}  ({n})", "-"),
                    (None, None) => format!("{:>10}", "-"),
                }
            )?;
        }
        let missing = gates.iter().filter(|g| g.is_none()).count();
        if missing > 0 {
            writeln!(o, "({missing} sentences without gate values are left out)")?;
        }
    }
    o.flush()?;
    Ok(())
}

fn run_context_scaling_to(args: &ContextScalingArgs, o: &mut dyn Write) -> anyhow::Result<()> {
    check_plot_path(&args.plot)?;
    let (src, refs) = read_src_refs(&args.src, &args.refs)?;
    let mut runs = Vec::with_capacity(args.runs.len());
    for r in &args.runs {
        runs.push(((r.a, r.b), read_parallel(&r.path, &args.src, src.len())?));
    }
    let opts = args.bleu.options();
    let c = crate::analysis::context_scaling(&src, &refs, &runs, &opts)?;
    if args.json {
        let mut v = serde_json::to_value(&c)?;
        if let Some(arr) = v["runs"].as_array_mut() {
            for (x, r) in arr.iter_mut().zip(&args.runs) {
                x["file"] = json!(r.path.display().to_string());
            }
        }
        writeln!(o, "{}", serde_json::to_string_pretty(&v)?)?;
    } else {
        writeln!(o, "Context scaling: source context × a, target context × b")?;
        writeln!(o, "BLEU|{}", c.signature)?;
        writeln!(
            o,
            "{:<14} {:>9} {:>9} {:>9} {:>8} {:>8} {:>7}  file",
            "(a, b)", "out_words", "src_words", "ref_words", "out/src", "out/ref", "BLEU"
        )?;
        for (r, a) in c.runs.iter().zip(&args.runs) {
            writeln!(
                o,
                "{:<14} {:>9} {:>9} {:>9.1} {} {} {:>7.2}  {}",
                crate::analysis::scale_label(r.a, r.b),
                r.out_words,
                r.src_words,
                r.ref_words,
                opt(r.ratio_src, 8, 3),
                opt(r.ratio_ref, 8, 3),
                r.bleu,
                a.path.display()
            )?;
        }
    }
    if let Some(p) = &args.plot {
        crate::plot::save(&crate::plot::context_scaling_figure(&c), p)?;
        eprintln!("wrote {}", p.display());
    }
    o.flush()?;
    Ok(())
}

/// Runs `cgnmt plot …`.
pub fn run_plot(args: &PlotArgs) -> anyhow::Result<()> {
    run_plot_to(args, &mut std::io::stdout().lock())
}

/// Like [`run_plot`] but writes its one-line report to `o`.
pub fn run_plot_to(args: &PlotArgs, o: &mut dyn Write) -> anyhow::Result<()> {
    match &args.cmd {
        PlotCmd::Attention(a) => {
            crate::plot::format_of(&a.output)?;
            let records = crate::analysis::read_dump(&a.dump)?;
            if records.is_empty() {
                return Err(EvalError::EmptyFile {
                    path: a.dump.clone(),
                }
                .into());
            }
            let rec = records.iter().find(|r| r.id == Some(a.id)).ok_or_else(|| {
                let max = records.iter().filter_map(|r| r.id).max().unwrap_or(0);
                anyhow::anyhow!(
                    "{}: no record with id {} (ids go up to {max})",
                    a.dump.display(),
                    a.id
                )
            })?;
            let fig = crate::plot::AttentionFigure::from_record(rec)
                .with_context(|| format!("{}", a.dump.display()))?;
            crate::plot::save(&fig, &a.output)?;
            writeln!(o, "wrote {}", a.output.display())?;
        }
        PlotCmd::Training(a) => {
            crate::plot::format_of(&a.output)?;
            let log = crate::analysis::read_training_log(&a.log)?;
            if log.steps.is_empty() && log.evals.is_empty() {
                bail!(
                    "{}: no training (`step`) or evaluation (`eval`) lines",
                    a.log.display()
                );
            }
            let title = a
                .log
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
                .unwrap_or_default();
            let fig = crate::plot::TrainingFigure { log, title };
            crate::plot::save(&fig, &a.output)?;
            writeln!(o, "wrote {}", a.output.display())?;
        }
    }
    o.flush()?;
    Ok(())
}
