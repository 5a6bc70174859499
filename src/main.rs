//! The `cgnmt` command-line tool.

use clap::{Parser, Subcommand};

use cgnmt::kernels::Kernels;

#[derive(Parser)]
#[command(
    name = "cgnmt",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("CGNMT_COMMIT"), ")"),
    about = "Context-gated neural machine translation (Tu et al., TACL 2017)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// Implementation of the recurrent steps: fused CPU kernels, or the composed reference (for debugging).
    #[arg(long, global = true, value_enum, default_value_t = Kernels::Fused)]
    kernels: Kernels,
}

#[derive(Subcommand)]
enum Cmd {
    /// Tokenise a line-aligned parallel corpus, count words, build vocabularies (and BPE).
    Prepare(cgnmt_data::prepare::PrepareArgs),
    /// Train a model from a TOML configuration.
    Train(cgnmt::cmd::train::TrainArgs),
    /// Translate lines from stdin (or a file) with beam search; one output line per input line.
    Translate(cgnmt::cmd::translate::TranslateArgs),
    /// Build the model of a configuration and print its parameter count per component.
    Info(cgnmt::cmd::info::InfoArgs),
    /// Force-decode reference translations and write word alignments from attention (for AER/SAER).
    Align(cgnmt::cmd::align::AlignArgs),
    /// Learn a lexicon p(target | source) from a tokenised training corpus (IBM Model 1) for
    /// `translate --shortlist`.
    Shortlist(cgnmt::cmd::shortlist::ShortlistArgs),
    /// Training and decoding throughput, peak memory and FLOP rate for a named size (prints a JSON line last).
    Bench(cgnmt::cmd::bench::BenchArgs),
    /// Train a small context-gated model on Tatoeba zh-en, translate its test set and print BLEU.
    Demo(cgnmt::cmd::demo::DemoArgs),
    /// Reproduce the paper from a plan: every system with several seeds, significance, the analyses, and a
    /// report (report.md, report.html, results.json). Resumable.
    Reproduce(cgnmt::cmd::reproduce::ReproduceArgs),
    /// Average the parameters of several checkpoints of one model into a new model directory.
    Average(cgnmt::cmd::average::AverageArgs),
    /// Choose a finished run's model on dev (best/, the average of its converged tail, the moving average)
    /// and, with --tune, its length and coverage penalties; writes RUN/selection.json.
    Select(cgnmt::cmd::select::SelectArgs),
    /// Pick each sentence's best hypothesis of an n-best list (translate --nbest N) by weighted features:
    /// the model's log-probability, the output's length, and features that other tools add.
    Rescore(cgnmt::decode::rescore::RescoreArgs),
    /// Serve translations over HTTP (JSON API: /v1/translate, /v1/models, /healthz), the attention-and-gate
    /// explorer (/) and the subjective-evaluation page (/eval, with --eval-db).
    Serve(cgnmt::cmd::serve::ServeArgs),
    /// A blinded sample of two systems' outputs for the subjective evaluation (pairs.jsonl and key.jsonl).
    EvalPairs(cgnmt::cmd::subjective::EvalPairsArgs),
    /// The subjective evaluation's report (paper Table 3): mean adequacy and fluency, better / equal / worse
    /// with the sign test.
    EvalReport(cgnmt::cmd::subjective::EvalReportArgs),
    /// Public corpora and test sets: list the registry, download (resumable, checksummed), verify.
    Data(cgnmt::cmd::datasets::cli::DataArgs),
    /// Corpus BLEU (NIST mteval-v11b or sacreBLEU-compatible) and chrF of hypotheses against references.
    Score(cgnmt_eval::cli::ScoreArgs),
    /// Significance of system differences: sign test, paired bootstrap, approximate randomisation.
    Compare(cgnmt_eval::cli::CompareArgs),
    /// Alignment error rate (AER) and soft AER against gold Sure/Possible links.
    Aer(cgnmt_eval::cli::AerArgs),
    /// The paper's analyses: BLEU by source-length group, gate correlation, context scaling.
    Analyze(cgnmt_eval::cli::AnalyzeArgs),
    /// Figures (PNG/SVG): attention heatmap with gate values, training curves.
    Plot(cgnmt_eval::cli::PlotArgs),
}

fn main() {
    cgnmt::cmd::process::set_up();
    let cli = Cli::parse();
    if matches!(cli.cmd, Cmd::Translate(_)) {
        cgnmt::cmd::process::decode_concurrently();
    }
    Kernels::set_process_default(cli.kernels);
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
        Cmd::Prepare(a) => cgnmt_data::prepare::run_prepare(&a),
        Cmd::Train(a) => cgnmt::cmd::train::run(a, &cluster),
        Cmd::Translate(a) => cgnmt::cmd::translate::run(a, &cluster),
        Cmd::Info(a) => cgnmt::cmd::info::run(a),
        Cmd::Demo(a) => cgnmt::cmd::demo::run(a),
        Cmd::Reproduce(a) => {
            let data = cgnmt::cmd::datasets::DataDir::resolve(a.data.clone());
            cgnmt::cmd::reproduce::run(a, data)
        }
        Cmd::Data(a) => cgnmt::cmd::datasets::cli::run(a),
        Cmd::Serve(a) => cgnmt::cmd::serve::run(a),
        Cmd::EvalPairs(a) => cgnmt::cmd::subjective::cmd_eval_pairs(&a),
        Cmd::EvalReport(a) => cgnmt::cmd::subjective::cmd_eval_report(&a),
        Cmd::Average(a) => cgnmt::cmd::average::run(a),
        Cmd::Select(a) => cgnmt::cmd::select::run(a),
        Cmd::Rescore(a) => cgnmt::decode::rescore::run(a),
        Cmd::Align(a) => cgnmt::cmd::align::run(a, &cluster),
        Cmd::Shortlist(a) => cgnmt::cmd::shortlist::run(a),
        Cmd::Bench(a) => cgnmt::cmd::bench::run(a, &cluster),
        Cmd::Score(a) => cgnmt_eval::cli::run_score(&a),
        Cmd::Compare(a) => cgnmt_eval::cli::run_compare(&a),
        Cmd::Aer(a) => cgnmt_eval::cli::run_aer(&a),
        Cmd::Analyze(a) => cgnmt_eval::cli::run_analyze(&a),
        Cmd::Plot(a) => cgnmt_eval::cli::run_plot(&a),
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
