//! `cgnmt compare`: paired significance tests of systems against a baseline: sign test, paired bootstrap,
//! approximate randomisation (`cgnmt_eval::report`).

use std::path::PathBuf;

use anyhow::Result;
use cgnmt_eval::report as R;
use cgnmt_eval::report::{MetricArg, TestArg};

use crate::args::{options, MetricArgs};

/// `cgnmt compare`: paired significance tests of one or more systems against a baseline.
#[derive(Debug, Clone, clap::Args)]
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
    #[arg(long = "seed", default_value_t = cgnmt_eval::significance::DEFAULT_SEED)]
    pub seed: u64,
    /// Metric(s); repeat `-m` for several.
    #[arg(short = 'm', long = "metric", value_enum, default_values_t = vec![MetricArg::Bleu])]
    pub metrics: Vec<MetricArg>,
    /// Metric configuration.
    #[command(flatten)]
    pub opts: MetricArgs,
    /// Number of bootstrap resamples.
    #[arg(long = "bs-samples", default_value_t = cgnmt_eval::significance::DEFAULT_BS_SAMPLES)]
    pub bs_samples: usize,
    /// Number of approximate-randomization trials.
    #[arg(long = "ar-trials", default_value_t = cgnmt_eval::significance::DEFAULT_AR_TRIALS)]
    pub ar_trials: usize,
    /// JSON output.
    #[arg(long = "json")]
    pub json: bool,
}

options!(CompareArgs => R::CompareOptions { baseline, systems, refs, test, seed, metrics, bs_samples, ar_trials, json; opts });

pub fn run(a: CompareArgs) -> Result<()> {
    R::run_compare(&a.into())
}
