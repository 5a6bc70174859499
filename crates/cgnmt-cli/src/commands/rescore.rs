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
    /// A feature from a model directory (or a run's best model): its log-probability of each hypothesis
    /// given the source line (repeatable; needs `--src`).
    #[arg(long = "model", value_name = "NAME=DIR")]
    pub models: Vec<String>,
    /// The source sentences the n-best list translates (one line per sentence), for `--model`.
    #[arg(long)]
    pub src: Option<PathBuf>,
    /// A feature's weight (repeatable); unnamed features weigh 0, `model` 1.
    #[arg(short, long = "weight", value_name = "NAME=W")]
    pub weights: Vec<String>,
    /// Output file (one line per sentence; written whole or not at all). Default: the standard output.
    #[arg(short, long)]
    pub output: Option<PathBuf>,
}

pub fn run(a: RescoreArgs) -> Result<()> {
    let mut models = vec![];
    for m in &a.models {
        let Some((name, dir)) = m.split_once('=') else {
            anyhow::bail!("--model {m:?}: expected NAME=DIR");
        };
        models.push((
            name.to_string(),
            cgnmt::Translator::open(&[dir], &Default::default())?,
        ));
    }
    let sources = match &a.src {
        Some(p) => Some(cgnmt_data::corpus::read_lines(p)?),
        None => None,
    };
    let models: Vec<(String, &cgnmt::Translator)> =
        models.iter().map(|(k, t)| (k.clone(), t)).collect();
    let text = cgnmt::decode::rescore::rescore_file_with(
        &a.input,
        &a.features,
        &a.weights,
        &models,
        sources.as_deref(),
    )?;
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
