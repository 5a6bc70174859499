//! The `cgnmt` command-line tool.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device};
use cgnmt::atomic_file::{write_atomic, AtomicFile};
use clap::{Parser, Subcommand};

use cgnmt::beam_search::DecodeOptions;
use cgnmt::checkpoint;
use cgnmt::config::Config;
use cgnmt::kernels::Kernels;
use cgnmt::translate::Translator;

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
    Train(TrainArgs),
    /// Translate lines from stdin (or a file) with beam search; one output line per input line.
    Translate(TranslateArgs),
    /// Build the model of a configuration and print its parameter count per component.
    Info(InfoArgs),
    /// Force-decode reference translations and write word alignments from attention (for AER/SAER).
    Align(AlignArgs),
    /// Learn a lexicon p(target | source) from a tokenised training corpus (IBM Model 1) for
    /// `translate --shortlist`.
    Shortlist(ShortlistArgs),
    /// Training and decoding throughput, peak memory and FLOP rate for a named size (prints a JSON line last).
    Bench(BenchArgs),
    /// Train a small context-gated model on Tatoeba zh-en, translate its test set and print BLEU.
    Demo(cgnmt::demo::DemoArgs),
    /// Reproduce the paper from a plan: every system with several seeds, significance, the analyses, and a
    /// report (report.md, report.html, results.json). Resumable.
    Reproduce(cgnmt::reproduce::ReproduceArgs),
    /// Average the parameters of several checkpoints of one model into a new model directory.
    Average(cgnmt::averaging::AverageArgs),
    /// Choose a finished run's model on dev (best/, the average of its converged tail, the moving average)
    /// and, with --tune, its length and coverage penalties; writes RUN/selection.json.
    Select(cgnmt::selection::SelectArgs),
    /// Pick each sentence's best hypothesis of an n-best list (translate --nbest N) by weighted features:
    /// the model's log-probability, the output's length, and features that other tools add.
    Rescore(cgnmt::rescore::RescoreArgs),
    /// Serve translations over HTTP (JSON API: /v1/translate, /v1/models, /healthz), the attention-and-gate
    /// explorer (/) and the subjective-evaluation page (/eval, with --eval-db).
    Serve(cgnmt::serve::ServeArgs),
    /// A blinded sample of two systems' outputs for the subjective evaluation (pairs.jsonl and key.jsonl).
    EvalPairs(cgnmt::subjective::EvalPairsArgs),
    /// The subjective evaluation's report (paper Table 3): mean adequacy and fluency, better / equal / worse
    /// with the sign test.
    EvalReport(cgnmt::subjective::EvalReportArgs),
    /// Public corpora and test sets: list the registry, download (resumable, checksummed), verify.
    Data(cgnmt::datasets::cli::DataArgs),
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

#[derive(clap::Args)]
struct TrainArgs {
    /// TOML configuration (keys use the paper's names; see configs/).
    #[arg(short, long)]
    config: Option<PathBuf>,
    /// Override a setting: section.key=value (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Run directory (best/, last/, train.log).
    #[arg(short, long, default_value = "runs/model")]
    out: PathBuf,
    /// Continue the run in --out (or in the given directory) from its last checkpoint.
    #[arg(long, value_name = "DIR", num_args = 0..=1, default_missing_value = "")]
    resume: Option<PathBuf>,
    /// Print the fully resolved configuration and exit.
    #[arg(long)]
    print_config: bool,
    /// No progress bar or messages.
    #[arg(short, long)]
    quiet: bool,
}

#[derive(clap::Args)]
struct InfoArgs {
    #[arg(short, long)]
    config: Option<PathBuf>,
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

#[derive(clap::Args)]
struct TranslateArgs {
    /// Model directory (a run directory means its best/ model). Repeat for an ensemble: the models'
    /// log-probabilities are averaged at every step (they must share vocabularies and preprocessing).
    #[arg(short, long, required = true)]
    model: Vec<PathBuf>,
    /// Beam size (1 = greedy).
    #[arg(short, long, default_value_t = 10)]
    beam: usize,
    /// Sentences decoded together.
    #[arg(long, default_value_t = 32)]
    batch: usize,
    /// Write the N best hypotheses per sentence as `index ||| text ||| score` (for `cgnmt rescore`).
    #[arg(long, default_value_t = 1)]
    nbest: usize,
    /// Rank hypotheses by log-probability per word instead of the total.
    #[arg(long)]
    length_norm: bool,
    /// GNMT's length penalty α: rank hypotheses by log-probability / ((5 + length) / 6)^α (0: the total,
    /// GroundHog's; 0.6 to 1 lengthens short outputs).
    #[arg(
        long,
        value_name = "ALPHA",
        default_value_t = 0.0,
        conflicts_with = "length_norm"
    )]
    length_penalty: f64,
    /// GNMT's coverage penalty β: add β Σ_j log(min(attention received by source word j, 1)) to each
    /// hypothesis's rank (0: none; 0.2 to 0.4 favours outputs that translate every source word).
    #[arg(long, value_name = "BETA", default_value_t = 0.0)]
    coverage_penalty: f64,
    /// Decode every sentence until its beam has shrunk to nothing, as GroundHog does, instead of stopping
    /// once no live hypothesis can enter the N best (same output, more hypothesis steps).
    #[arg(long)]
    full_beam: bool,
    /// Multiply the emitted words' embeddings at every step instead of gathering their products from a
    /// table of every target word's, formed once when the input is long enough for it to pay (same output;
    /// for measurements and debugging).
    #[arg(long)]
    no_word_table: bool,
    /// Decode each batch over a shortlist of target words only: the most frequent ones and each source
    /// word's most probable translations in this lexicon (from `cgnmt shortlist`). Faster, approximate: the
    /// model's distribution is renormalised over the shortlist.
    #[arg(long, value_name = "LEXICON")]
    shortlist: Option<PathBuf>,
    /// With --shortlist: the most frequent target words every batch takes.
    #[arg(long, value_name = "N", default_value_t = 100, requires = "shortlist")]
    shortlist_frequent: usize,
    /// With --shortlist: the most probable target words taken per source word.
    #[arg(long, value_name = "N", default_value_t = 50, requires = "shortlist")]
    shortlist_per_word: usize,
    /// Run the decoder's per-step products, the output layer and the per-batch products with the encoder's
    /// annotations (attention keys, context products, initial state) in 8-bit integers: weights quantised
    /// per column, each product's operands per row (x86-64 CPUs with AVX2; AVX-512 VNNI where present).
    /// Faster, approximate.
    #[arg(long)]
    int8: bool,
    /// Decode-time context scaling `a,b`: source-context terms × a, target-side terms × b.
    #[arg(long, value_name = "A,B", value_parser = parse_pair)]
    context_scale: Option<(f64, f64)>,
    /// Input is already tokenised (split on whitespace; no tokenizer or BPE applied).
    #[arg(long)]
    pretokenized: bool,
    /// Longest input line in model tokens (after tokenisation and BPE); longer lines are split or truncated
    /// (--long-input) with a warning naming the line. 0 = no limit.
    #[arg(long, value_name = "N", default_value_t = 200)]
    max_input_words: usize,
    /// What to do with a line over --max-input-words: translate it in pieces and join their outputs, or
    /// translate its first N tokens only.
    #[arg(long, value_enum, default_value_t = cgnmt::translate::LongInput::Split)]
    long_input: cgnmt::translate::LongInput,
    /// Input file (default: stdin).
    #[arg(short, long)]
    input: Option<PathBuf>,
    /// Output file (default: stdout); written atomically.
    #[arg(short, long)]
    output: Option<PathBuf>,
    /// Write per-sentence attention matrices, gate values and coverage as JSON lines.
    #[arg(long, value_name = "FILE")]
    dump: Option<PathBuf>,
    #[arg(short, long)]
    quiet: bool,
}

#[derive(clap::Args)]
struct ShortlistArgs {
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

#[derive(clap::Args)]
struct AlignArgs {
    /// Model directory (a run directory means its best/ model).
    #[arg(short, long)]
    model: PathBuf,
    /// Source sentences, tokenised with spaces (the gold alignment's tokens).
    #[arg(long)]
    src: PathBuf,
    /// Target (reference) sentences, tokenised with spaces.
    #[arg(long)]
    tgt: PathBuf,
    /// Hard alignment output (`i-j` links, 0-based, one line per pair).
    #[arg(short, long)]
    output: PathBuf,
    /// Also write the word-level attention matrices (and gate values) as JSON lines, for `cgnmt aer --soft`.
    #[arg(long, value_name = "FILE")]
    soft: Option<PathBuf>,
    /// Write links target-first (`j-i`), for gold files whose first index is the target language.
    #[arg(long)]
    target_first: bool,
    #[arg(long, default_value_t = 32)]
    batch: usize,
}

#[derive(clap::Args)]
struct BenchArgs {
    /// small (E 256 / H 512 / V 8000, batch 64 × 20), paper (E 620 / H 1000 / V 30000, batch 80 × 30) or tiny.
    #[arg(long, default_value = "small")]
    size: String,
    /// Timed training steps (after one warm-up step); the median is reported.
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Sentence lengths of the training batches: `fixed` (every target as long as the size's length, the
    /// sources within ±3 of it: no target padding) or `reference` (the lengths of the batch
    /// `../shared/bench/torch_reference.py` trains on: targets and sources from half the length to all of
    /// it, padded to it; tokens/s then compare with its `tok/s` directly).
    #[arg(long, default_value = "fixed", value_parser = ["fixed", "reference"])]
    lengths: String,
    /// Sentences decoded with beam 10 and greedily.
    #[arg(long, default_value_t = 100)]
    decode_sentences: usize,
    /// Repetitions of the decoding measurement.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Alternate the timed training steps between the packed micro-kernel and the general GEMM for the
    /// recurrences' products and report both medians (the training figures then come from the packed steps).
    #[arg(long)]
    compare_packed_gemm: bool,
    /// Alternate the timed training steps between skipping the target side's padded positions (the default)
    /// and computing them, and report both medians (with `--lengths reference`: fixed lengths have none).
    #[arg(long)]
    compare_target_padding: bool,
    /// Time each fused op's forward and backward pass over the timed training steps and print the
    /// per-step means (the JSON gets `op_profile`); adds a clock read per op call.
    #[arg(long)]
    profile_ops: bool,
    /// Model/training overrides (e.g. model.context_gate=none, model.coverage=neural).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Data directory (default: $CGNMT_DATA or ../shared/data).
    #[arg(long)]
    data: Option<PathBuf>,
}

fn parse_pair(s: &str) -> std::result::Result<(f64, f64), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("expected A,B (e.g. 1.0,0.5), got {s:?}"))?;
    let a: f64 = a
        .trim()
        .parse()
        .map_err(|_| format!("not a number: {a:?}"))?;
    let b: f64 = b
        .trim()
        .parse()
        .map_err(|_| format!("not a number: {b:?}"))?;
    Ok((a, b))
}

fn main() {
    tune_allocator();
    set_thread_defaults();
    let cli = Cli::parse();
    if matches!(cli.cmd, Cmd::Translate(_)) && std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // `translate` decodes batches concurrently, one per thread: each decoder does its own elementwise
        // work instead of sharing candle's one elementwise helper pool (whose lock serialises them). Measured
        // on the Tatoeba test set (2 cores): 116–120 against 96–105 sentences/s. Matrix products still use
        // all threads.
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    Kernels::set_process_default(cli.kernels);
    let r = match cli.cmd {
        Cmd::Prepare(a) => cgnmt_data::prepare::run_prepare(&a),
        Cmd::Train(a) => cmd_train(a),
        Cmd::Translate(a) => cmd_translate(a),
        Cmd::Info(a) => cmd_info(a),
        Cmd::Demo(a) => cgnmt::demo::run(a),
        Cmd::Reproduce(a) => {
            let data = cgnmt::datasets::DataDir::resolve(a.data.clone());
            cgnmt::reproduce::run(a, data)
        }
        Cmd::Data(a) => cgnmt::datasets::cli::run(a),
        Cmd::Serve(a) => cgnmt::serve::run(a),
        Cmd::EvalPairs(a) => cgnmt::subjective::cmd_eval_pairs(&a),
        Cmd::EvalReport(a) => cgnmt::subjective::cmd_eval_report(&a),
        Cmd::Average(a) => cgnmt::averaging::run(a),
        Cmd::Select(a) => cgnmt::selection::run(a),
        Cmd::Rescore(a) => cgnmt::rescore::run(a),
        Cmd::Align(a) => cmd_align(a),
        Cmd::Shortlist(a) => cmd_shortlist(a),
        Cmd::Bench(a) => cmd_bench(a),
        Cmd::Score(a) => cgnmt_eval::cli::run_score(&a),
        Cmd::Compare(a) => cgnmt_eval::cli::run_compare(&a),
        Cmd::Aer(a) => cgnmt_eval::cli::run_aer(&a),
        Cmd::Analyze(a) => cgnmt_eval::cli::run_analyze(&a),
        Cmd::Plot(a) => cgnmt_eval::cli::run_plot(&a),
    };
    if let Err(e) = r {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}

/// candle asks for the thread count on every matmul and, without `RAYON_NUM_THREADS`, counts the physical
/// cores from /proc each time; fix it once (same default: physical cores).
fn set_thread_defaults() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var(
            "RAYON_NUM_THREADS",
            num_cpus::get_physical().max(1).to_string(),
        );
    }
}

/// Keep freed tensor buffers in the process instead of returning them to the kernel after every op: the
/// recurrent steps allocate and free the same sizes thousands of times per batch, and fresh pages cost a
/// page fault each (measured in docs/design-notes.md, "Measurements behind code choices").
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_TOP_PAD, 256 << 20);
    }
}

fn cmd_train(a: TrainArgs) -> Result<()> {
    let (run_dir, resume) = match &a.resume {
        Some(p) if !p.as_os_str().is_empty() => (p.clone(), true),
        Some(_) => (a.out.clone(), true),
        None => (a.out.clone(), false),
    };
    let cfg = if resume {
        if a.config.is_some() {
            bail!("--resume takes the configuration saved in the run directory; use --set to change train.* settings");
        }
        let dir = checkpoint::complete_dir(&run_dir.join("last")).with_context(|| {
            format!(
                "{}: no complete checkpoint in last/ to resume from",
                run_dir.display()
            )
        })?;
        Config::load(Some(&dir.join(checkpoint::CONFIG_FILE)), &a.sets)?
    } else {
        Config::load(a.config.as_deref(), &a.sets)?
    };
    if a.print_config {
        print!("{}", cfg.to_toml());
        return Ok(());
    }
    cgnmt::kernels::set_threads(cfg.train.threads);
    cgnmt::train::train(cfg, &run_dir, resume, a.quiet)?;
    Ok(())
}

fn cmd_info(a: InfoArgs) -> Result<()> {
    let cfg = Config::load(a.config.as_deref(), &a.sets)?;
    let (_m, varmap) = cgnmt::model::Model::build_uninit(
        &cfg.model,
        cfg.data.src_vocab_size + 2,
        cfg.data.tgt_vocab_size + 2,
        DType::F32,
        &Device::Cpu,
    )?;
    println!(
        "model: decoder {:?}, context_gate {:?}, gate_form {:?}, coverage {:?}; E {} H {} V {}+2 / {}+2",
        cfg.model.decoder,
        cfg.model.context_gate,
        cfg.model.gate_form,
        cfg.model.coverage,
        cfg.model.embedding_dim,
        cfg.model.hidden_dim,
        cfg.data.src_vocab_size,
        cfg.data.tgt_vocab_size
    );
    for (k, n) in cgnmt::init::count_by_component(&varmap) {
        println!("{k:<28} {n:>12}  ({:.2}M)", n as f64 / 1e6);
    }
    let total = cgnmt::init::count(&varmap);
    println!(
        "{:<28} {:>12}  ({:.1}M)",
        "total",
        total,
        total as f64 / 1e6
    );
    Ok(())
}

/// A model directory, or a run directory's best/ model.
fn resolve_model_dir(p: &Path) -> PathBuf {
    if !p.join(checkpoint::CONFIG_FILE).exists() && p.join("best").is_dir() {
        return p.join("best");
    }
    p.to_path_buf()
}

fn read_input(path: Option<&Path>) -> Result<Vec<String>> {
    match path {
        Some(p) => Ok(cgnmt_data::corpus::read_lines(p)?),
        None => {
            let mut buf = Vec::new();
            std::io::stdin()
                .lock()
                .read_to_end(&mut buf)
                .context("reading stdin")?;
            let mut out = Vec::new();
            for (i, line) in buf.split(|b| *b == b'\n').enumerate() {
                let line = line.strip_suffix(b"\r").unwrap_or(line);
                match std::str::from_utf8(line) {
                    Ok(s) => out.push(s.to_string()),
                    Err(_) => bail!("<stdin>: line {} is not valid UTF-8", i + 1),
                }
            }
            if buf.ends_with(b"\n") {
                out.pop();
            }
            Ok(out)
        }
    }
}

fn cmd_translate(a: TranslateArgs) -> Result<()> {
    let dir = resolve_model_dir(&a.model[0]);
    let lm = checkpoint::load(&dir, DType::F32, &Device::Cpu)?;
    let mut members = Vec::new();
    for m in &a.model[1..] {
        let other = checkpoint::load(&resolve_model_dir(m), DType::F32, &Device::Cpu)?;
        lm.check_ensemble(&other)?;
        members.push(other);
    }
    let lines = read_input(a.input.as_deref())?;
    let mut opts = DecodeOptions {
        beam: a.beam,
        length_norm: a.length_norm,
        length_penalty: a.length_penalty,
        coverage_penalty: a.coverage_penalty,
        nbest: a.nbest,
        context_scale: a.context_scale.unwrap_or((1.0, 1.0)),
        record: a.dump.is_some(),
        settle: !a.full_beam,
        word_table: !a.no_word_table,
        shortlist: None,
        int8: a.int8,
    };
    opts.validate(lm.tgt_vocab.len(), usize::MAX, |k| {
        format!("--{}", k.replace('_', "-"))
    })
    .map_err(anyhow::Error::msg)?;
    if a.int8 && !cgnmt::kernels::quantized_gemm::available() && !a.quiet {
        eprintln!("warning: --int8 needs a CPU with AVX2; decoding in f32");
    }
    if let Some(p) = &a.shortlist {
        if a.shortlist_per_word == 0 && a.shortlist_frequent == 0 {
            bail!("--shortlist-frequent and --shortlist-per-word are both 0: the shortlist would be empty");
        }
        let lex = cgnmt::shortlist::Lexicon::load(p)?;
        let sl = cgnmt::shortlist::Shortlist::new(
            &lex,
            &lm.src_vocab,
            &lm.tgt_vocab,
            a.shortlist_frequent,
            a.shortlist_per_word,
        );
        if sl.is_empty() && !a.quiet {
            eprintln!(
                "warning: no source word of {} is in the model's source vocabulary with a target word in its \
                 target vocabulary: each batch decodes over the {} most frequent words only",
                p.display(),
                a.shortlist_frequent
            );
        }
        opts.shortlist = Some(std::sync::Arc::new(sl));
    }
    let model = lm.model.frozen(&lm.varmap)?;
    let others = members
        .iter()
        .map(|m| m.model.frozen(&m.varmap))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let mut tr = Translator::of(&model, &lm);
    tr.others = others.iter().collect();
    let pb = if a.quiet || lines.len() < 50 {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(lines.len() as u64)
    };
    // -o and --dump appear whole when decoding is done, or not at all (an error removes what was written).
    let mut file_out = match &a.output {
        Some(p) => Some(AtomicFile::create(p)?),
        None => None,
    };
    let mut stdout_out = std::io::BufWriter::new(std::io::stdout().lock());
    let sink: &mut dyn Write = match file_out.as_mut() {
        Some(f) => f,
        None => &mut stdout_out,
    };
    let out_name = match &a.output {
        Some(p) => p.display().to_string(),
        None => "the standard output".into(),
    };
    let mut dump = match &a.dump {
        Some(p) => Some(AtomicFile::create(p)?),
        None => None,
    };
    // Decode in chunks so output streams while keeping batches full.
    let chunk = 1024usize.max(4 * a.batch);
    let started = std::time::Instant::now();
    let steps_before = cgnmt::beam_search::DECODER_ROWS.load(std::sync::atomic::Ordering::Relaxed);
    let mut base = 0;
    for part in lines.chunks(chunk) {
        let limit = cgnmt::translate::InputLimit {
            max_words: a.max_input_words,
            long_input: a.long_input,
        };
        let (out, long) =
            tr.translate_within(part, &opts, a.batch, a.pretokenized, limit, |d| {
                pb.set_position((base + d) as u64)
            })?;
        for l in &long {
            let what = match a.long_input {
                cgnmt::translate::LongInput::Split => {
                    format!("translated in {} pieces", l.pieces)
                }
                cgnmt::translate::LongInput::Truncate => {
                    format!("only its first {} translated", a.max_input_words)
                }
            };
            pb.suspend(|| {
                eprintln!(
                    "warning: {}line {}: {} tokens, more than --max-input-words {}: {what}",
                    a.input
                        .as_ref()
                        .map(|p| format!("{}: ", p.display()))
                        .unwrap_or_default(),
                    base + l.index + 1,
                    l.words,
                    a.max_input_words
                )
            });
        }
        for (k, t) in out.iter().enumerate() {
            if a.nbest > 1 {
                for h in &t.hyps {
                    let text = tr.detok(&lm.tgt_vocab.decode(&h.tokens));
                    writeln!(sink, "{} ||| {} ||| {:.4}", base + k, text, h.score)
                        .with_context(|| format!("writing {out_name}"))?;
                }
            } else {
                writeln!(sink, "{}", t.text).with_context(|| format!("writing {out_name}"))?;
            }
            if let Some(d) = dump.as_mut() {
                let best = t.hyps.first();
                let eos = || std::iter::once("</s>".to_string());
                let rec = cgnmt_eval::analysis::DumpRecord::<f32> {
                    id: Some(base + k),
                    src: t.src_tokens.iter().cloned().chain(eos()).collect(),
                    hyp: t.tokens.iter().cloned().chain(eos()).collect(),
                    score: best.map(|b| b.score),
                    attention: best.map(|b| b.attention.clone()).unwrap_or_default(),
                    gates: best.map(|b| b.gates.clone()).unwrap_or_default(),
                    coverage: best.map(|b| b.coverage.clone()).unwrap_or_default(),
                };
                writeln!(d, "{}", serde_json::to_string(&rec)?).with_context(|| {
                    format!(
                        "writing {}",
                        a.dump.as_deref().unwrap_or(Path::new("")).display()
                    )
                })?;
            }
        }
        sink.flush()
            .with_context(|| format!("writing {out_name}"))?;
        base += part.len();
    }
    pb.finish_and_clear();
    if let Some(d) = dump {
        d.commit()?;
    }
    if let Some(f) = file_out {
        f.commit()?;
    }
    if !a.quiet {
        let secs = started.elapsed().as_secs_f64();
        let steps = cgnmt::beam_search::DECODER_ROWS.load(std::sync::atomic::Ordering::Relaxed)
            - steps_before;
        eprintln!(
            "translated {} lines in {secs:.1} s ({:.1} sentences/s, beam {}, {steps} hypothesis steps)",
            lines.len(),
            lines.len() as f64 / secs.max(1e-9),
            opts.beam,
        );
    }
    Ok(())
}

fn cmd_shortlist(a: ShortlistArgs) -> Result<()> {
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
    let lex = cgnmt::shortlist::learn_lexicon(&pairs, a.iterations, a.keep, a.min_prob, |i| {
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

fn cmd_align(a: AlignArgs) -> Result<()> {
    use cgnmt_data::bpe::word_index_of_subwords;
    let dir = resolve_model_dir(&a.model);
    let lm = checkpoint::load(&dir, DType::F32, &Device::Cpu)?;
    let (src, tgt) = cgnmt_data::corpus::read_parallel(&a.src, &a.tgt)?;
    // Tokens as given; BPE (if the model has it) applied word by word and mapped back afterwards.
    let words = |l: &String| -> Vec<String> { l.split_whitespace().map(str::to_string).collect() };
    let (mut sids, mut tids, mut smap, mut tmap) = (vec![], vec![], vec![], vec![]);
    for (s, t) in src.iter().zip(&tgt) {
        let (sw, tw) = (words(s), words(t));
        let st = lm.preprocess.src_bpe_apply(&sw);
        let tt = lm.preprocess.tgt_bpe_apply(&tw);
        smap.push(word_index_of_subwords(&st));
        tmap.push(word_index_of_subwords(&tt));
        sids.push(lm.src_vocab.encode(&st));
        tids.push(lm.tgt_vocab.encode(&tt));
    }
    let res = cgnmt::alignment::force_decode_all(
        &lm.model.frozen(&lm.varmap)?,
        &sids,
        &tids,
        lm.tgt_vocab.eos(),
        a.batch,
    )?;
    let mut hard = String::new();
    let mut soft = String::new();
    for (k, (att, gates)) in res.iter().enumerate() {
        let m = cgnmt::alignment::to_words(att, &smap[k], &tmap[k]);
        let links: Vec<String> = cgnmt::alignment::argmax_links(&m)
            .into_iter()
            .map(|(i, j)| {
                if a.target_first {
                    format!("{j}-{i}")
                } else {
                    format!("{i}-{j}")
                }
            })
            .collect();
        hard += &links.join(" ");
        hard.push('\n');
        if a.soft.is_some() {
            soft += &serde_json::json!({"id": k, "attention": m, "gates": gates}).to_string();
            soft.push('\n');
        }
    }
    write_atomic(&a.output, hard.as_bytes())?;
    if let Some(p) = &a.soft {
        write_atomic(p, soft.as_bytes())?;
    }
    eprintln!(
        "aligned {} sentence pairs → {}",
        res.len(),
        a.output.display()
    );
    Ok(())
}

fn cmd_bench(a: BenchArgs) -> Result<()> {
    let (e, h, v, b, _) = cgnmt::bench::size_preset(&a.size)
        .with_context(|| format!("unknown --size {:?} (small, paper or tiny)", a.size))?;
    let mut sets = vec![
        format!("model.embedding_dim={e}"),
        format!("model.hidden_dim={h}"),
        format!("model.attention_dim={h}"),
        format!("data.src_vocab_size={}", v - 2),
        format!("data.tgt_vocab_size={}", v - 2),
        format!("train.batch_size={b}"),
        "train.optimizer=adam".to_string(),
    ];
    sets.extend(a.sets.iter().cloned());
    let cfg = Config::load(None, &sets)?;
    cgnmt::kernels::set_threads(cfg.train.threads);
    let opts = cgnmt::bench::BenchOptions {
        size: a.size.clone(),
        steps: a.steps,
        reference_lengths: a.lengths == "reference",
        decode_sentences: a.decode_sentences,
        repeats: a.repeats,
        compare_packed_gemm: a.compare_packed_gemm,
        compare_target_padding: a.compare_target_padding,
        profile_ops: a.profile_ops,
    };
    let rec = cgnmt::bench::run(&cfg, &cgnmt::datasets::DataDir::resolve(a.data).root, &opts)?;
    println!("{rec}");
    Ok(())
}
