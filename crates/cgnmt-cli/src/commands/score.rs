//! `cgnmt score`: corpus (or per-sentence) BLEU (sacreBLEU-compatible or NIST mteval-v11b), chrF and
//! chrF++ of a hypothesis file against one or more references (`cgnmt_eval::report`).

use std::path::PathBuf;

use anyhow::Result;
use cgnmt_eval::report as R;
use cgnmt_eval::report::MetricArg;

use crate::args::{options, MetricArgs};

/// `cgnmt score`: corpus (or per-sentence) BLEU / chrF / chrF++ of a hypothesis file.
#[derive(Debug, Clone, clap::Args)]
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
    pub opts: MetricArgs,
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

options!(ScoreArgs => R::ScoreOptions { refs, input, metric, sentence, json, width; opts });

pub fn run(a: ScoreArgs) -> Result<()> {
    R::run_score(&a.into())
}
