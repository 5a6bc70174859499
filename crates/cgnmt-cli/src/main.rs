//! The `cgnmt` command-line tool.

use clap::{Parser, Subcommand};

use cgnmt::kernels::Kernels;

use args::KernelsArg;

mod args;
mod commands;

#[derive(Parser)]
#[command(
    name = "cgnmt",
    version = cgnmt::LONG_VERSION,
    about = "Context-gated neural machine translation (Tu et al., TACL 2017)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Implementation of the recurrent steps: fused CPU kernels, or the composed reference (for debugging).
    #[arg(long, global = true, value_enum, default_value_t = KernelsArg::Fused)]
    kernels: KernelsArg,
}

#[derive(Subcommand)]
enum Cmd {
    /// Tokenise a line-aligned parallel corpus, count words, build vocabularies (and BPE).
    Prepare(commands::prepare::PrepareArgs),
    /// Train a model from a TOML configuration.
    Train(commands::train::TrainArgs),
    /// Translate lines from stdin (or a file) with beam search; one output line per input line.
    Translate(commands::translate::TranslateArgs),
    /// Build the model of a configuration and print its parameter count per component.
    Info(commands::info::InfoArgs),
    /// Force-decode reference translations and write word alignments from attention (for AER/SAER).
    Align(commands::align::AlignArgs),
    /// Learn a lexicon p(target | source) from a tokenised training corpus (IBM Model 1) for
    /// `translate --shortlist`.
    Shortlist(commands::shortlist::ShortlistArgs),
    /// Word alignments of a whole parallel corpus by a statistical aligner (IBM Model 2 with fast_align's
    /// diagonal prior, both directions, symmetrised): for guided alignment, or an AER baseline
    AlignCorpus(commands::align_corpus::AlignCorpusArgs),
    /// Training and decoding throughput, peak memory and FLOP rate for a named size (prints a JSON line last).
    Bench(commands::bench::BenchArgs),
    /// Train a small context-gated model on Tatoeba zh-en, translate its test set and print BLEU.
    Demo(commands::demo::DemoArgs),
    /// Reproduce the paper from a plan: every system with several seeds, significance, the analyses, and a
    /// report (report.md, report.html, results.json). Resumable.
    Reproduce(commands::reproduce::ReproduceArgs),
    /// Average the parameters of several checkpoints of one model into a new model directory.
    Average(commands::average::AverageArgs),
    /// Choose a finished run's model on dev (best/, the average of its converged tail, the moving average)
    /// and, with --tune, its length and coverage penalties; writes RUN/selection.json.
    Select(commands::select::SelectArgs),
    /// Pick each sentence's best hypothesis of an n-best list (translate --nbest N) by weighted features:
    /// the model's log-probability, the output's length, and features that other tools add.
    Rescore(commands::rescore::RescoreArgs),
    /// Serve translations over HTTP (JSON API: /v1/translate, /v1/models, /healthz), the attention-and-gate
    /// explorer (/) and the subjective-evaluation page (/eval, with --eval-db).
    Serve(commands::serve::ServeArgs),
    /// A blinded sample of two systems' outputs for the subjective evaluation (pairs.jsonl and key.jsonl).
    EvalPairs(commands::eval_pairs::EvalPairsArgs),
    /// The subjective evaluation's report (paper Table 3): mean adequacy and fluency, better / equal / worse
    /// with the sign test.
    EvalReport(commands::eval_report::EvalReportArgs),
    /// Public corpora and test sets: list the registry, download (resumable, checksummed), verify.
    Data(commands::data::DataArgs),
    /// Corpus BLEU (NIST mteval-v11b or sacreBLEU-compatible) and chrF of hypotheses against references.
    Score(commands::score::ScoreArgs),
    /// Significance of system differences: sign test, paired bootstrap, approximate randomisation.
    Compare(commands::compare::CompareArgs),
    /// Alignment error rate (AER) and soft AER against gold Sure/Possible links.
    Aer(commands::aer::AerArgs),
    /// The paper's analyses: BLEU by source-length group, gate correlation, context scaling.
    Analyze(commands::analyze::AnalyzeArgs),
    /// Figures (PNG/SVG): attention heatmap with gate values, training curves.
    Plot(commands::plot::PlotArgs),
}

fn main() {
    cgnmt::process::set_up();
    let cli = Cli::parse();
    if matches!(cli.cmd, Cmd::Translate(_)) {
        cgnmt::process::decode_concurrently();
    }
    Kernels::set_process_default(cli.kernels.into());
    // Under `mpiexec` (a build with --features mpi), `translate` decodes a share of the lines on each rank and
    // `train` computes each update's gradient on a share of the batch; `bench` measures the data-parallel update.
    let name = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .unwrap_or_default();
    let shards = matches!(
        cli.cmd,
        Cmd::Translate(_) | Cmd::Train(_) | Cmd::Bench(_) | Cmd::Align(_)
    );
    let cluster = match cgnmt::cluster::Cluster::init(&name, shards) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::exit(1);
        }
    };
    let r = match cli.cmd {
        Cmd::Prepare(a) => commands::prepare::run(a),
        Cmd::Train(a) => commands::train::run(a, &cluster),
        Cmd::Translate(a) => commands::translate::run(a, &cluster),
        Cmd::Info(a) => commands::info::run(a),
        Cmd::Align(a) => commands::align::run(a, &cluster),
        Cmd::Shortlist(a) => commands::shortlist::run(a),
        Cmd::AlignCorpus(a) => commands::align_corpus::run(a),
        Cmd::Bench(a) => commands::bench::run(a, &cluster),
        Cmd::Demo(a) => commands::demo::run(a),
        Cmd::Reproduce(a) => commands::reproduce::run(a),
        Cmd::Average(a) => commands::average::run(a),
        Cmd::Select(a) => commands::select::run(a),
        Cmd::Rescore(a) => commands::rescore::run(a),
        Cmd::Serve(a) => commands::serve::run(a),
        Cmd::EvalPairs(a) => commands::eval_pairs::run(a),
        Cmd::EvalReport(a) => commands::eval_report::run(a),
        Cmd::Data(a) => commands::data::run(a),
        Cmd::Score(a) => commands::score::run(a),
        Cmd::Compare(a) => commands::compare::run(a),
        Cmd::Aer(a) => commands::aer::run(a),
        Cmd::Analyze(a) => commands::analyze::run(a),
        Cmd::Plot(a) => commands::plot::run(a),
    };
    if let Err(e) = r {
        if cluster.size() > 1 {
            cluster.fail(&e);
        }
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
    // Every rank finishes together (a rank that reached MPI_Finalize while rank 0 was still writing the
    // gathered output made MPICH over TCP hang there now and then), and a finalize that hangs after that is
    // left behind.
    cluster.finish();
}
