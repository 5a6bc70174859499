//! `cgnmt eval-pairs`: a blinded sample of two systems' outputs for the subjective evaluation (paper Table 3):
//! `pairs.jsonl` for the raters and `key.jsonl` for `cgnmt eval-report` (`cgnmt_subjective`).

use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use cgnmt::atomic_file::write_atomic;
use cgnmt_subjective::{named_system, sample_files, to_jsonl};

/// Arguments of `cgnmt eval-pairs`.
#[derive(clap::Args, Debug)]
pub struct EvalPairsArgs {
    /// Source sentences (one a line).
    #[arg(long)]
    pub src: PathBuf,
    /// A system's outputs, as NAME=FILE or FILE (named after the file); exactly two.
    #[arg(long = "sys", value_name = "[NAME=]FILE", num_args = 1)]
    pub systems: Vec<String>,
    /// Reference translations shown to raters (repeatable; optional).
    #[arg(long = "ref", value_name = "FILE")]
    pub refs: Vec<PathBuf>,
    /// Sentences in the sample.
    #[arg(long, default_value_t = 200)]
    pub sentences: usize,
    /// Seed of the sample and of the blinded order.
    #[arg(long, default_value_t = 2017)]
    pub seed: u64,
    /// Output directory (pairs.jsonl for the raters, key.jsonl for eval-report).
    #[arg(short, long)]
    pub out: PathBuf,
}

pub fn run(a: EvalPairsArgs) -> Result<()> {
    let [x, y] = &a.systems[..] else {
        bail!(
            "give exactly two systems with --sys (got {})",
            a.systems.len()
        );
    };
    if a.sentences == 0 {
        bail!("--sentences must be at least 1");
    }
    let systems = [named_system(x), named_system(y)];
    let (pairs, key) = sample_files(&a.src, &systems, &a.refs, a.sentences, a.seed)?;
    std::fs::create_dir_all(&a.out)
        .with_context(|| format!("{}: cannot create", a.out.display()))?;
    write_atomic(&a.out.join("pairs.jsonl"), to_jsonl(&pairs).as_bytes())?;
    write_atomic(&a.out.join("key.jsonl"), to_jsonl(&key).as_bytes())?;
    eprintln!(
        "wrote {} blinded pairs to {} (and the key to {}; keep it from the raters)",
        pairs.len(),
        a.out.join("pairs.jsonl").display(),
        a.out.join("key.jsonl").display()
    );
    Ok(())
}
