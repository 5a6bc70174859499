//! `cgnmt train`: train a model from a TOML configuration (or resume a run).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};

use cgnmt::config::Config;
use cgnmt::model::store;

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
    let cfg = if resume {
        if a.config.is_some() {
            bail!("--resume takes the configuration saved in the run directory; use --set to change train.* settings");
        }
        let dir = store::complete_dir(&run_dir.join("last")).with_context(|| {
            format!(
                "{}: no complete checkpoint in last/ to resume from",
                run_dir.display()
            )
        })?;
        Config::load(Some(&dir.join(store::CONFIG_FILE)), &a.sets)?
    } else {
        Config::load(a.config.as_deref(), &a.sets)?
    };
    if a.print_config {
        print!("{}", cfg.to_toml());
        return Ok(());
    }
    cgnmt::kernels::set_threads(cfg.train.threads);
    cgnmt::train::train_on(cfg, &run_dir, resume, a.quiet, cluster, None)?;
    Ok(())
}
