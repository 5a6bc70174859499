//! `cgnmt align-corpus`: word alignments of a whole parallel corpus by a statistical aligner (IBM Model 2 with
//! fast_align's diagonal prior, both directions, symmetrised), for guided alignment or as an AER baseline.

use std::path::PathBuf;

use anyhow::{bail, Result};

use cgnmt::atomic_file::write_atomic;
use cgnmt::train::word_aligner::{align_corpus, AlignerOptions, Symmetrize};

#[derive(clap::Args)]
pub struct AlignCorpusArgs {
    /// Tokenised source side (plain or gzipped; e.g. a prepared directory's train.src).
    #[arg(long)]
    src: PathBuf,
    /// Tokenised target side, line-aligned with --src.
    #[arg(long)]
    tgt: PathBuf,
    /// Links to write: one line per sentence pair, `i-j` (source word i, target word j, 0-based).
    #[arg(short, long)]
    output: PathBuf,
    /// How the two directions' links are combined: grow-diag-final-and, intersection or union.
    #[arg(long, default_value = "grow-diag-final-and", value_name = "HOW")]
    symmetrize: Symmetrize,
    /// EM iterations per direction (the first is IBM Model 1).
    #[arg(long, default_value_t = 5)]
    iterations: usize,
    /// Probability of a target word aligned to no source word.
    #[arg(long, default_value_t = 0.08)]
    p0: f64,
    /// Write the links target-first (`j-i`), as some gold files are.
    #[arg(long)]
    target_first: bool,
    /// Align only the first N sentence pairs.
    #[arg(long)]
    limit: Option<usize>,
    /// No progress bar or summary.
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: AlignCorpusArgs) -> Result<()> {
    if a.iterations == 0 {
        bail!("--iterations must be at least 1");
    }
    if !(0.0..1.0).contains(&a.p0) {
        bail!("--p0 {}: it must be in [0, 1)", a.p0);
    }
    let (src, tgt) = cgnmt_data::corpus::read_parallel(&a.src, &a.tgt)?;
    let n = a.limit.unwrap_or(src.len()).min(src.len());
    let words = |l: &String| -> Vec<String> { l.split_whitespace().map(str::to_string).collect() };
    let pairs: Vec<(Vec<String>, Vec<String>)> = src
        .iter()
        .zip(&tgt)
        .take(n)
        .map(|(s, t)| (words(s), words(t)))
        .collect();
    let o = AlignerOptions {
        iterations: a.iterations,
        p0: a.p0,
        ..Default::default()
    };
    let pb = if a.quiet {
        indicatif::ProgressBar::hidden()
    } else {
        let pb = indicatif::ProgressBar::new(2 * a.iterations as u64);
        pb.set_message(format!("aligning {n} sentence pairs, both directions"));
        pb.set_style(
            indicatif::ProgressStyle::with_template("{msg}: iteration {pos}/{len} [{elapsed}]")
                .expect("progress template"),
        );
        pb.tick();
        pb
    };
    let links = align_corpus(&pairs, &o, a.symmetrize, |d, _| pb.set_position(d as u64));
    pb.finish_and_clear();
    let mut text = String::new();
    for l in &links {
        let row: Vec<String> = l
            .iter()
            .map(|&(i, j)| {
                if a.target_first {
                    format!("{j}-{i}")
                } else {
                    format!("{i}-{j}")
                }
            })
            .collect();
        text.push_str(&row.join(" "));
        text.push('\n');
    }
    write_atomic(&a.output, text.as_bytes())?;
    if !a.quiet {
        let total: usize = links.iter().map(Vec::len).sum();
        eprintln!(
            "wrote {} ({n} sentence pairs, {total} links)",
            a.output.display()
        );
    }
    Ok(())
}
