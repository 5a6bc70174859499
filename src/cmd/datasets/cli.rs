//! `cgnmt data list | get | verify`: the registry's corpora, fetched into a data directory.

use std::path::PathBuf;

use anyhow::{bail, Result};

use super::registry::{self, Registry};

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
    fn dir(&self) -> PathBuf {
        self.dir.clone().unwrap_or_else(registry::default_dir)
    }
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.0} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

pub fn run(a: DataArgs) -> Result<()> {
    match a.cmd {
        DataCmd::List(c) => {
            let r = Registry::load(c.registry.as_deref())?;
            let dir = c.dir();
            println!("data directory: {}", dir.display());
            for e in &r.corpora {
                let size: Option<u64> = e.files.iter().map(|f| f.size).sum();
                let here = dir.join(&e.name).join(registry::RECORD_FILE).is_file();
                println!(
                    "{:<28} {:<5} {}-{}  {:>9}  {}  {}",
                    e.name,
                    e.split,
                    e.src_lang,
                    e.tgt_lang,
                    size.map_or("?".into(), human),
                    if here { "fetched    " } else { "not fetched" },
                    e.description
                );
                println!("{:<28} licence: {}", "", e.licence);
            }
            Ok(())
        }
        DataCmd::Get {
            names,
            common,
            force,
            quiet,
        } => {
            let r = Registry::load(common.registry.as_deref())?;
            let dir = common.dir();
            // Every name is checked before anything is downloaded.
            let entries = names.iter().map(|n| r.get(n)).collect::<Result<Vec<_>>>()?;
            for e in entries {
                let rec = registry::get(e, &dir, force, quiet)?;
                let mut left_out = vec![];
                if rec.dropped_empty > 0 {
                    left_out.push(format!(
                        "{} lines with an empty side left out",
                        rec.dropped_empty
                    ));
                }
                if rec.filtered > 0 {
                    left_out.push(format!(
                        "{} rows not kept by the entry's filter",
                        rec.filtered
                    ));
                }
                eprintln!(
                    "{}: {} sentence pairs → {}{}",
                    e.name,
                    rec.pairs,
                    dir.join(&e.name).display(),
                    if left_out.is_empty() {
                        String::new()
                    } else {
                        format!(
                            " ({}; counted in {})",
                            left_out.join(", "),
                            registry::RECORD_FILE
                        )
                    }
                );
            }
            Ok(())
        }
        DataCmd::Verify { names, common } => {
            let r = Registry::load(common.registry.as_deref())?;
            let dir = common.dir();
            let names: Vec<String> = if names.is_empty() {
                r.corpora
                    .iter()
                    .filter(|e| dir.join(&e.name).join(registry::RECORD_FILE).is_file())
                    .map(|e| e.name.clone())
                    .collect()
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
            Ok(())
        }
    }
}
