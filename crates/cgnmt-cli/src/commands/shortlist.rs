//! `cgnmt shortlist`: the IBM Model 1 lexicon for `translate --shortlist`.

use std::path::PathBuf;

use anyhow::{bail, Result};

use cgnmt::atomic_file::write_atomic;

#[derive(clap::Args)]
pub struct ShortlistArgs {
    /// Tokenised source side of the training corpus (e.g. a prepared directory's train.src; plain or gzipped).
    #[arg(long)]
    src: PathBuf,
    /// Tokenised target side, line-aligned with --src (e.g. train.tgt).
    #[arg(long)]
    tgt: PathBuf,
    /// Lexicon to write (source<TAB>target<TAB>probability lines).
    #[arg(short, long)]
    output: PathBuf,
    /// EM iterations of IBM Model 1.
    #[arg(long, default_value_t = 5)]
    iterations: usize,
    /// Target words kept per source word (most probable first).
    #[arg(long, default_value_t = 100)]
    keep: usize,
    /// Smallest probability kept.
    #[arg(long, default_value_t = 1e-4)]
    min_prob: f32,
    /// Use the first N sentence pairs only (the tables grow with the corpus's distinct word pairs).
    #[arg(long)]
    limit: Option<usize>,
    /// No progress bar or summary.
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: ShortlistArgs) -> Result<()> {
    if a.iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    if a.keep == 0 {
        bail!("--keep must be at least 1");
    }
    if !(0.0..=1.0).contains(&a.min_prob) {
        bail!("--min-prob must be between 0 and 1");
    }
    let (src, tgt) = cgnmt_data::corpus::read_parallel(&a.src, &a.tgt)?;
    let n = a.limit.unwrap_or(src.len()).min(src.len());
    let pairs: Vec<(Vec<String>, Vec<String>)> = src
        .iter()
        .zip(&tgt)
        .take(n)
        .map(|(s, t)| {
            (
                s.split_whitespace().map(str::to_string).collect(),
                t.split_whitespace().map(str::to_string).collect(),
            )
        })
        .collect();
    let pb = if a.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let pb = indicatif::ProgressBar::new(a.iterations as u64);
        pb.set_message(format!("IBM Model 1 over {n} sentence pairs"));
        pb.set_style(
            indicatif::ProgressStyle::with_template("{msg}: iteration {pos}/{len} [{elapsed}]")
                .expect("progress template"),
        );
        pb.tick();
        pb
    };
    let lex =
        cgnmt::decode::shortlist::learn_lexicon(&pairs, a.iterations, a.keep, a.min_prob, |i| {
            pb.set_position(i as u64)
        });
    pb.finish_and_clear();
    let entries: usize = lex.entries.iter().map(|e| e.1.len()).sum();
    let comment = format!(
        "cgnmt shortlist: p(target | source) by IBM Model 1, {} iterations over {n} pairs of {} and {}",
        a.iterations,
        a.src.display(),
        a.tgt.display()
    );
    write_atomic(&a.output, lex.to_text(&comment).as_bytes())?;
    if !a.quiet {
        eprintln!(
            "wrote {} ({} source words, {entries} entries)",
            a.output.display(),
            lex.entries.len()
        );
    }
    Ok(())
}
