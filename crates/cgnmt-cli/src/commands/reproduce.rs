//! `cgnmt reproduce`: the paper's experiments from one plan file, resumable: every system with several seeds
//! (child `cgnmt` processes), significance, the analyses and the report (`cgnmt_reproduce`).

use std::path::PathBuf;

use anyhow::Result;

/// Arguments of `cgnmt reproduce`.
#[derive(clap::Args, Debug)]
pub struct ReproduceArgs {
    /// Output directory (prepared data, one directory per system and seed, analyses, report).
    #[arg(long)]
    pub out: PathBuf,
    /// Plan file (TOML): data, shared settings, systems, analyses.
    #[arg(long, default_value = "configs/reproduce/tatoeba.toml")]
    pub plan: PathBuf,
    /// Train each system with this many seeds (the plan's first N; more are numbered on from its last). Fewer
    /// than the plan has write report-seeds-1-2.md (and .html, results-, figures-) beside the plan's report.
    #[arg(long, value_name = "N")]
    pub seeds: Option<usize>,
    /// Training budget per run in seconds (train.max_seconds), in addition to the plan's update limit.
    #[arg(long, value_name = "N")]
    pub budget_seconds: Option<f64>,
    /// The whole plan on the plan's tiny [quick] budget (seconds per system, one seed): for tests.
    #[arg(long)]
    pub quick: bool,
    /// Train this row again (its name as in the plan; repeatable); other finished runs are kept.
    #[arg(long, value_name = "ROW")]
    pub only: Vec<String>,
    /// Runs trained at the same time (each with cores / jobs threads).
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// Train nothing: write the analyses and report from the runs finished so far.
    #[arg(long)]
    pub report_only: bool,
    /// Data directory (default: $CGNMT_DATA or ../shared/data).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// No progress bars (one line per finished run instead).
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn run(a: ReproduceArgs) -> Result<()> {
    let data = cgnmt_datasets::DataDir::resolve(a.data.clone());
    let options = cgnmt_reproduce::ReproduceOptions {
        out: a.out,
        plan: a.plan,
        seeds: a.seeds,
        budget_seconds: a.budget_seconds,
        quick: a.quick,
        only: a.only,
        jobs: a.jobs,
        report_only: a.report_only,
        data: a.data,
        quiet: a.quiet,
    };
    cgnmt_reproduce::run(options, data)
}
