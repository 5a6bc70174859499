//! `cgnmt plot attention | training`: an attention heatmap with the gate's values (paper Figure 6), training
//! curves (`cgnmt_eval::report`).

use std::path::PathBuf;

use anyhow::Result;
use cgnmt_eval::report as R;

use crate::args::options;

#[derive(Debug, Clone, clap::Args)]
pub struct PlotAttentionArgs {
    /// Translation dump (`cgnmt translate --dump`), JSON lines.
    #[arg(long = "dump")]
    pub dump: PathBuf,
    /// Sentence id (0-based, the record's `id`).
    #[arg(long = "id")]
    pub id: usize,
    /// Output file, .png or .svg.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
}

/// `cgnmt plot training`: loss per token and dev BLEU against the step.
#[derive(Debug, Clone, clap::Args)]
pub struct PlotTrainingArgs {
    /// Training log (`train.log`, JSON lines).
    #[arg(long = "log")]
    pub log: PathBuf,
    /// Output file, .png or .svg.
    #[arg(short = 'o', long = "output")]
    pub output: PathBuf,
}

/// The `plot` subcommands.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum PlotCmd {
    /// Attention heatmap with gate values of one translation (paper Fig. 6).
    Attention(PlotAttentionArgs),
    /// Training curves: loss per token and dev BLEU against the step.
    Training(PlotTrainingArgs),
}

/// `cgnmt plot …`: figures.
#[derive(Debug, Clone, clap::Args)]
pub struct PlotArgs {
    /// The figure.
    #[command(subcommand)]
    pub cmd: PlotCmd,
}

options!(PlotAttentionArgs => R::PlotAttentionOptions { dump, id, output;  });
options!(PlotTrainingArgs => R::PlotTrainingOptions { log, output;  });
options!(enum PlotCmd => R::PlotCmd { Attention, Training });
options!(PlotArgs => R::PlotOptions { ; cmd });

pub fn run(a: PlotArgs) -> Result<()> {
    R::run_plot(&a.into())
}
