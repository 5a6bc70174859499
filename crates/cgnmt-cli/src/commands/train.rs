//! `cgnmt train`: train a model from a TOML configuration (or resume a run).

use std::path::PathBuf;

use anyhow::Result;

#[derive(clap::Args)]
pub struct TrainArgs {
    /// TOML configuration (keys use the paper's names; see configs/).
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// Override a setting: section.key=value (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Run directory (best/, last/, train.log).
    #[arg(short, long, default_value = "runs/model")]
    out: PathBuf,
    /// Continue the run in --out (or in the given directory) from its last checkpoint.
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = "")]
    resume: Option<PathBuf>,
    /// Fine-tune: start from this model directory's parameters (a run directory means its best/ model), with
    /// a fresh optimiser, on data prepared with `cgnmt prepare --like DIR`; the configuration's [model] must be
    /// the model's (left out, it is taken from it).
    #[arg(long, value_name = "MODEL_DIR", conflicts_with = "resume")]
    init: Option<PathBuf>,
    /// Print the fully resolved configuration and exit.
    #[arg(long)]
    print_config: bool,
    /// No progress bar or messages.
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: TrainArgs, cluster: &cgnmt::cluster::Cluster) -> Result<()> {
    let (run_dir, resume) = match &a.resume {
        Some(p) if !p.as_os_str().is_empty() => (p.clone(), true),
        Some(_) => (a.out.clone(), true),
        None => (a.out.clone(), false),
    };
    let cfg = cgnmt::train::checkpoint::run_config(
        a.config.as_deref(),
        &a.sets,
        &run_dir,
        resume,
        a.init.as_deref(),
    )?;
    if a.print_config {
        print!("{}", cfg.to_toml());
        return Ok(());
    }
    cgnmt::kernels::set_threads(cfg.train.threads);
    cgnmt::train::train_on(cfg, &run_dir, resume, a.quiet, cluster, None)?;
    Ok(())
}
