//! `cgnmt aer`: alignment error rate (AER) of predicted links, and soft AER of attention matrices, against
//! gold sure/possible links (`cgnmt_eval::report`).

use std::path::PathBuf;

use anyhow::Result;
use cgnmt_eval::report as R;

use crate::args::options;

/// `cgnmt aer`: alignment error rate of predicted links (and soft AER of attention matrices).
#[derive(Debug, Clone, clap::Args)]
pub struct AerArgs {
    /// Gold alignments (`.talp`: `i-j` sure, `i?j` possible, 0-based).
    #[arg(long = "gold")]
    pub gold: PathBuf,
    /// Predicted alignments (`.talp`). Without it, --soft's row-wise argmax links are scored.
    #[arg(long = "pred", required_unless_present = "soft")]
    pub pred: Option<PathBuf>,
    /// Soft alignments, JSONL: one `{"attention": [[weight per source word] per target word]}`
    /// per sentence pair (extra keys ignored). Gold links `i-j` must then have i = source,
    /// j = target.
    #[arg(long = "soft")]
    pub soft: Option<PathBuf>,
    /// Optional whitespace-tokenised sentences of the first-named language, to check that
    /// every link's first index is in range.
    #[arg(long = "first-text", requires = "second_text")]
    pub first_text: Option<PathBuf>,
    /// Optional whitespace-tokenised sentences of the second language (second index).
    #[arg(long = "second-text", requires = "first_text")]
    pub second_text: Option<PathBuf>,
    /// JSON output.
    #[arg(long = "json")]
    pub json: bool,
}

options!(AerArgs => R::AerOptions { gold, pred, soft, first_text, second_text, json;  });

pub fn run(a: AerArgs) -> Result<()> {
    R::run_aer(&a.into())
}
