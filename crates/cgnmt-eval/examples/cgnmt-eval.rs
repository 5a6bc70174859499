//! Stand-alone front end for the evaluation subcommands (the main `cgnmt` binary mounts the
//! same argument structs): `cargo run --release --example cgnmt-eval -- score -r REF -i HYP`.

use cgnmt_eval::cli::{
    run_aer, run_analyze, run_compare, run_plot, run_score, AerArgs, AnalyzeArgs, CompareArgs,
    PlotArgs, ScoreArgs,
};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cgnmt-eval", about = "BLEU / chrF, significance tests and AER")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Score a translation (BLEU, chrF, chrF++).
    Score(ScoreArgs),
    /// Paired significance tests of systems against a baseline.
    Compare(CompareArgs),
    /// Alignment error rate (and soft AER).
    Aer(AerArgs),
    /// The paper's analyses: length groups, gates, context scaling.
    Analyze(AnalyzeArgs),
    /// Figures: attention heatmap, training curves.
    Plot(PlotArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let r = match &cli.cmd {
        Cmd::Score(a) => run_score(a),
        Cmd::Compare(a) => run_compare(a),
        Cmd::Aer(a) => run_aer(a),
        Cmd::Analyze(a) => run_analyze(a),
        Cmd::Plot(a) => run_plot(a),
    };
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
