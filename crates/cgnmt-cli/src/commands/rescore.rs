//! `cgnmt rescore`: each sentence's best hypothesis of an n-best list (`translate --nbest N`) by weighted
//! features: the model's log-probability, the output's length, and features other tools add
//! (`cgnmt::decode::rescore`).

use std::path::PathBuf;

use anyhow::{Context, Result};

/// Arguments of `cgnmt rescore`.
#[derive(clap::Args, Debug)]
pub struct RescoreArgs {
    /// The n-best list (`INDEX ||| TEXT ||| SCORE [||| name=value ...]`, as `translate --nbest N` writes it,
    /// one sentence's hypotheses after another's, indices from 0); plain or gzipped.
    #[arg(short, long)]
    pub input: PathBuf,
    /// A feature from a file: one number per line of the n-best list, in its order (repeatable).
    #[arg(long = "feature", value_name = "NAME=FILE")]
    pub features: Vec<String>,
    /// A feature's weight (repeatable); unnamed features weigh 0, `model` 1.
    #[arg(short, long = "weight", value_name = "NAME=W")]
    pub weights: Vec<String>,
    /// Output file (one line per sentence; written whole or not at all). Default: the standard output.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

pub fn run(a: RescoreArgs) -> Result<()> {
    let text = cgnmt::decode::rescore::rescore_file(&a.input, &a.features, &a.weights)?;
    match &a.output {
        Some(p) => cgnmt::atomic_file::write_atomic(p, text.as_bytes())
            .with_context(|| format!("writing {}", p.display()))?,
        None => {
            use std::io::Write;
            std::io::stdout()
                .lock()
                .write_all(text.as_bytes())
                .context("writing the standard output")?;
        }
    }
    Ok(())
}
