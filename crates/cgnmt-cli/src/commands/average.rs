//! `cgnmt average`: the element-wise mean of checkpoints of one model, named one by one or chosen from a
//! run's kept checkpoints by the converged-tail rule ([`cgnmt::train::selection`]).

use std::path::PathBuf;

use anyhow::{bail, Result};

use cgnmt::train::averaging::average;

/// Arguments of `cgnmt average`.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["models", "run"])))]
pub struct AverageArgs {
    /// Model directories to average (two or more; one copies it).
    #[arg(short, long = "model", num_args = 1..)]
    pub models: Vec<PathBuf>,
    /// A training run: average its kept checkpoints (`ckpt-STEP/`) of the converged tail, those whose dev
    /// score is within --tolerance of the run's best (printed with the reason for each).
    #[arg(long, conflicts_with = "models")]
    pub run: Option<PathBuf>,
    /// With --run: consider only the last N kept checkpoints (0: all).
    #[arg(long, default_value_t = 0, requires = "run")]
    pub last: usize,
    /// With --run: how many points of the run's selection score (`train.select_by`) below its best a
    /// checkpoint may score and still be averaged.
    #[arg(long, default_value_t = cgnmt::train::selection::DEFAULT_TOLERANCE, requires = "run")]
    pub tolerance: f64,
    /// Output model directory (written atomically).
    #[arg(short, long)]
    pub out: PathBuf,
}

pub fn run(a: AverageArgs) -> Result<()> {
    let models = match &a.run {
        None => a.models.clone(),
        Some(run) => {
            let tail = cgnmt::train::selection::converged_tail(run, a.last, a.tolerance)?;
            eprint!("{}", tail.describe());
            let taken = tail.taken();
            if taken.is_empty() {
                bail!(
                    "{}: no kept checkpoint is within {} of the best (set train.keep_checkpoints, or raise \
                     --tolerance); the run's best/ is its best model",
                    run.display(),
                    a.tolerance
                );
            }
            taken
        }
    };
    average(&models, &a.out)?;
    eprintln!(
        "averaged {} checkpoints → {}",
        models.len(),
        a.out.display()
    );
    Ok(())
}
