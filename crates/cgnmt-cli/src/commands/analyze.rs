//! `cgnmt analyze lengths | gates | context-scaling`: the paper's analyses: BLEU by source-length group
//! (Figure 7), gate values against the sentence-BLEU gain (Table 6), context scaling (`cgnmt_eval::report`).

use std::path::PathBuf;

use anyhow::Result;
use cgnmt_eval::report as R;
use cgnmt_eval::report::{parse_named_file, parse_scaled_run, BleuFlavour, NamedFile, ScaledRun};

use crate::args::options;

/// Corpus-BLEU options of `analyze lengths` and `analyze context-scaling`.
#[derive(Debug, Clone, clap::Args)]
pub struct AnalysisBleuArgs {
    /// BLEU flavour.
    #[arg(long = "bleu", value_enum, default_value = "mteval-v11b")]
    pub bleu: BleuFlavour,
    /// Case-sensitive BLEU (default: case-insensitive, as in the paper).
    #[arg(long = "cased")]
    pub cased: bool,
}

/// `cgnmt analyze lengths`: BLEU and mean output length per source-length group (paper Fig. 7).
#[derive(Debug, Clone, clap::Args)]
pub struct LengthsArgs {
    /// Source file (one sentence per line, words separated by spaces).
    #[arg(long = "src")]
    pub src: PathBuf,
    /// Reference file (repeat `-r` for several references).
    #[arg(short = 'r', long = "ref", required = true)]
    pub refs: Vec<PathBuf>,
    /// System outputs as NAME=FILE (repeat for several systems).
    #[arg(long = "sys", required = true, value_parser = parse_named_file)]
    pub systems: Vec<NamedFile>,
    /// Bucket edges in source words (buckets <e1, e1-e2, …, ≥en).
    #[arg(long = "edges", value_delimiter = ',', default_values_t = cgnmt_eval::analysis::DEFAULT_EDGES.to_vec())]
    pub edges: Vec<usize>,
    /// BLEU configuration.
    #[command(flatten)]
    pub bleu: AnalysisBleuArgs,
    /// JSON output.
    #[arg(long = "json")]
    pub json: bool,
    /// Also draw the chart (BLEU and output length per group) to this .png or .svg file.
    #[arg(long = "plot")]
    pub plot: Option<PathBuf>,
}

/// `cgnmt analyze gates`: mean gate value per sentence against the sentence-BLEU improvement
/// over a baseline, with Pearson correlations (paper Table 6).
#[derive(Debug, Clone, clap::Args)]
pub struct GatesArgs {
    /// Source file (one sentence per line; its word counts define "long" sentences).
    #[arg(long = "src")]
    pub src: PathBuf,
    /// Reference file (repeat `-r` for several references).
    #[arg(short = 'r', long = "ref", required = true)]
    pub refs: Vec<PathBuf>,
    /// Baseline outputs.
    #[arg(long = "baseline")]
    pub baseline: PathBuf,
    /// Outputs of the gated system.
    #[arg(long = "system")]
    pub system: PathBuf,
    /// Translation dump of the gated system (`cgnmt translate --dump`), JSON lines with `gates`.
    #[arg(long = "dump")]
    pub dump: PathBuf,
    /// Sentences with at least this many source words are "long".
    #[arg(long = "long", default_value_t = cgnmt_eval::analysis::DEFAULT_LONG)]
    pub long: usize,
    /// Case-sensitive sentence BLEU (default: case-insensitive).
    #[arg(long = "cased")]
    pub cased: bool,
    /// JSON output (with the per-sentence values).
    #[arg(long = "json")]
    pub json: bool,
}

/// `cgnmt analyze context-scaling`: translation length and BLEU of outputs decoded with the
/// source context scaled by a and the target context by b (paper Fig. 2a / Table 1).
#[derive(Debug, Clone, clap::Args)]
pub struct ContextScalingArgs {
    /// Source file.
    #[arg(long = "src")]
    pub src: PathBuf,
    /// Reference file (repeat `-r` for several references).
    #[arg(short = 'r', long = "ref", required = true)]
    pub refs: Vec<PathBuf>,
    /// Outputs of one setting as A,B=FILE, e.g. `--run 1.0,0.5=out.b05.txt` (repeat).
    #[arg(long = "run", required = true, value_parser = parse_scaled_run)]
    pub runs: Vec<ScaledRun>,
    /// BLEU configuration.
    #[command(flatten)]
    pub bleu: AnalysisBleuArgs,
    /// JSON output.
    #[arg(long = "json")]
    pub json: bool,
    /// Also draw the chart (length ratio and BLEU per setting) to this .png or .svg file.
    #[arg(long = "plot")]
    pub plot: Option<PathBuf>,
}

/// The `analyze` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum AnalyzeCmd {
    /// BLEU and mean output length by source-length group (paper Fig. 7).
    Lengths(LengthsArgs),
    /// Gate values against sentence-BLEU improvement over a baseline (paper Table 6).
    Gates(GatesArgs),
    /// Translation length ratio and BLEU under context scaling (paper Fig. 2a / Table 1).
    ContextScaling(ContextScalingArgs),
}

/// `cgnmt analyze …`: the paper's analyses.
#[derive(Debug, Clone, clap::Args)]
pub struct AnalyzeArgs {
    /// The analysis.
    #[command(subcommand)]
    pub cmd: AnalyzeCmd,
}

options!(AnalysisBleuArgs => R::AnalysisBleuOptions { bleu, cased;  });
options!(LengthsArgs => R::LengthsOptions { src, refs, systems, edges, json, plot; bleu });
options!(GatesArgs => R::GatesOptions { src, refs, baseline, system, dump, long, cased, json;  });
options!(ContextScalingArgs => R::ContextScalingOptions { src, refs, runs, json, plot; bleu });
options!(enum AnalyzeCmd => R::AnalyzeCmd { Lengths, Gates, ContextScaling });
options!(AnalyzeArgs => R::AnalyzeOptions { ; cmd });

pub fn run(a: AnalyzeArgs) -> Result<()> {
    R::run_analyze(&a.into())
}
