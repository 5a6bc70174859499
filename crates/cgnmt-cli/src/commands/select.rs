//! `cgnmt select`: choose a finished run's model and decoding penalties on dev ([`cgnmt::train::selection`]).

use std::path::PathBuf;

use anyhow::Result;

use cgnmt::decode::beam_search::DecodeOptions;
use cgnmt::train::selection::{choose_for_run, Tuning, DEFAULT_TOLERANCE, SELECTION_FILE};

/// Arguments of `cgnmt select`.
#[derive(clap::Args, Debug)]
pub struct SelectArgs {
    /// A finished training run directory (best/, last/, kept ckpt-STEP/, smoothed/).
    #[arg(long)]
    pub run: PathBuf,
    /// Consider only the last N kept checkpoints for the average (0: all kept).
    #[arg(long, default_value_t = 0)]
    pub last: usize,
    /// How many points of the run's selection score below its best a kept checkpoint may score and still
    /// be averaged.
    #[arg(long, default_value_t = DEFAULT_TOLERANCE)]
    pub tolerance: f64,
    /// Beam size of the dev decoding.
    #[arg(long, default_value_t = 10)]
    pub beam: usize,
    /// GNMT length penalty α the candidates are compared with (and the first of the grid).
    #[arg(long, default_value_t = 0.0)]
    pub length_penalty: f64,
    /// GNMT coverage penalty β the candidates are compared with (and the first of the grid).
    #[arg(long, default_value_t = 0.0)]
    pub coverage_penalty: f64,
    /// Also choose the length and coverage penalties on dev (the grid of α ∈ {1, 1.5, 2} × β ∈ {0, 0.2,
    /// 0.4} and the plain beam).
    #[arg(long)]
    pub tune: bool,
    /// With --tune: choose the penalties on the dev pairs whose reference has more than N words (dev's
    /// longer sentences, where short outputs cost most; 0: all dev).
    #[arg(long, default_value_t = 0, requires = "tune", value_name = "N")]
    pub tune_longer_than: usize,
    /// With --tune: choose among the penalties whose output/reference length ratio on the tuning pairs lies in
    /// LOW,HIGH (e.g. 0.95,1.05) the one with the highest BLEU (the nearest to the interval when none does).
    #[arg(long, requires = "tune", value_name = "LOW,HIGH", value_parser = parse_ratio)]
    pub length_ratio: Option<(f64, f64)>,
    /// Dev sentences to decode (evenly spaced; 0: all).
    #[arg(long, default_value_t = 0)]
    pub dev_sentences: usize,
    /// Prepared-data directory with dev.src / dev.ref (default: the run's data.prepared).
    #[arg(long)]
    pub prepared: Option<PathBuf>,
    /// Where to write the selection record (default: RUN/selection.json).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

/// `cgnmt select`: choose the run's model and (with `--tune`) penalties on dev, print what was chosen and
/// why, and write `RUN/selection.json`.
pub fn run(a: SelectArgs) -> Result<()> {
    let base = DecodeOptions {
        beam: a.beam,
        length_penalty: a.length_penalty,
        coverage_penalty: a.coverage_penalty,
        ..Default::default()
    };
    choose_for_run(
        &a.run,
        a.last,
        a.tolerance,
        &base,
        a.tune.then_some(&Tuning {
            longer_than: a.tune_longer_than,
            length_ratio: a.length_ratio,
        }),
        a.dev_sentences,
        a.prepared.as_deref(),
        &a.out.unwrap_or_else(|| a.run.join(SELECTION_FILE)),
    )?;
    Ok(())
}

/// `LOW,HIGH`: a length-ratio interval, 0 < LOW ≤ HIGH.
fn parse_ratio(s: &str) -> Result<(f64, f64), String> {
    let (lo, hi) = s
        .split_once(',')
        .ok_or_else(|| format!("{s:?}: LOW,HIGH (e.g. 0.95,1.05)"))?;
    let num = |x: &str| {
        x.trim()
            .parse::<f64>()
            .map_err(|_| format!("{x:?} is not a number (LOW,HIGH, e.g. 0.95,1.05)"))
    };
    let (lo, hi) = (num(lo)?, num(hi)?);
    if !(lo > 0.0 && lo <= hi && hi.is_finite()) {
        return Err(format!("{s:?}: need 0 < LOW ≤ HIGH"));
    }
    Ok((lo, hi))
}
