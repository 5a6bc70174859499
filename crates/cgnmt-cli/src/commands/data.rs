//! `cgnmt data list | get | verify`: the registry's corpora, fetched into a data directory
//! (`cgnmt_datasets::registry`).

use std::path::PathBuf;

use anyhow::{bail, Result};
use cgnmt_datasets::registry::{self, Registry};

/// Arguments of `cgnmt data`.
#[derive(clap::Args, Debug)]
pub struct DataArgs {
    #[command(subcommand)]
    pub cmd: DataCmd,
}

#[derive(clap::Subcommand, Debug)]
pub enum DataCmd {
    /// The corpora of the registry, and which are fetched into the data directory.
    List(Common),
    /// Download corpora, check their checksums and write them as line-aligned pairs DIR/NAME/{split}.{lang}.
    Get {
        /// Registry names (see `cgnmt data list`).
        #[arg(required = true)]
        names: Vec<String>,
        #[command(flatten)]
        common: Common,
        /// Fetch again what is already there.
        #[arg(long)]
        force: bool,
        /// No progress bars.
        #[arg(short, long)]
        quiet: bool,
    },
    /// Check fetched corpora (all, or the named): files unchanged since fetched and line-aligned.
    Verify {
        names: Vec<String>,
        #[command(flatten)]
        common: Common,
    },
}

#[derive(clap::Args, Debug)]
pub struct Common {
    /// Data directory (default: $CGNMT_DATA, else ~/.cache/cgnmt/data).
    #[arg(long)]
    pub dir: Option<PathBuf>,
    /// Registry file (default: the built-in configs/data/registry.toml).
    #[arg(long)]
    pub registry: Option<PathBuf>,
}

impl Common {
    fn open(&self) -> Result<(Registry, PathBuf)> {
        let r = Registry::load(self.registry.as_deref())?;
        Ok((r, self.dir.clone().unwrap_or_else(registry::default_dir)))
    }
}

pub fn run(a: DataArgs) -> Result<()> {
    match a.cmd {
        DataCmd::List(c) => {
            let (r, dir) = c.open()?;
            println!("data directory: {}", dir.display());
            for line in registry::listing(&r, &dir) {
                println!("{line}");
            }
        }
        DataCmd::Get {
            names,
            common,
            force,
            quiet,
        } => {
            let (r, dir) = common.open()?;
            // Every name is checked before anything is downloaded.
            let entries = names.iter().map(|n| r.get(n)).collect::<Result<Vec<_>>>()?;
            for e in entries {
                let rec = registry::get(e, &dir, force, quiet)?;
                eprintln!("{}", rec.summary(&e.name, &dir));
            }
        }
        DataCmd::Verify { names, common } => {
            let (r, dir) = common.open()?;
            let names = if names.is_empty() {
                registry::fetched(&r, &dir)
            } else {
                names
            };
            if names.is_empty() {
                bail!("{}: no fetched corpora to verify", dir.display());
            }
            let mut bad = 0;
            for n in &names {
                match registry::verify(&dir, n) {
                    Ok(rec) => println!("ok      {n}: {} pairs", rec.pairs),
                    Err(e) => {
                        bad += 1;
                        println!("FAILED  {n}: {e:#}");
                    }
                }
            }
            if bad > 0 {
                bail!("{bad} of {} corpora failed verification", names.len());
            }
        }
    }
    Ok(())
}
