//! `cgnmt translate`: beam search over lines of text, one output line per input line (an ensemble with
//! several models; outputs written whole or not at all).

use std::path::PathBuf;

use anyhow::Result;
use cgnmt::decode::output::{read_input, translate_into, OutputFiles};
use cgnmt::decode::translator::parse_context_scale;
use cgnmt::{InputLimit, TranslateOptions, Translator, TranslatorOptions};

#[derive(clap::Args)]
pub struct TranslateArgs {
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
    /// GroundHog's; 0.6 to 1 lengthens short outputs). Default: the α chosen on dev that the model keeps
    /// (its decoding.toml, from `cgnmt select --tune`), else 0.
    #[arg(long, value_name = "ALPHA", conflicts_with = "length_norm")]
    length_penalty: Option<f64>,
    /// GNMT's coverage penalty β: add β Σ_j log(min(attention received by source word j, 1)) to each
    /// hypothesis's rank (0: none; 0.2 to 0.4 favours outputs that translate every source word). Default:
    /// the β chosen on dev that the model keeps, else 0.
    #[arg(long, value_name = "BETA")]
    coverage_penalty: Option<f64>,
    /// Decode every sentence until its beam has shrunk to nothing, as GroundHog does, instead of stopping
    /// once no live hypothesis can enter the N best (same output, more hypothesis steps).
    #[arg(long)]
    full_beam: bool,
    /// Multiply the emitted words' embeddings at every step instead of gathering their products from a
    /// table of every target word's, formed once when the input is long enough for it to pay (same output;
    /// for measurements and debugging).
    #[arg(long)]
    no_word_table: bool,
    #[command(flatten)]
    shortlist: crate::args::ShortlistArgs,
    /// Run the decoder's per-step products, the output layer and the per-batch products with the encoder's
    /// annotations (attention keys, context products, initial state) in 8-bit integers: weights quantised
    /// per column, each product's operands per row (x86-64 CPUs with AVX2; AVX-512 VNNI where present).
    /// Faster, approximate.
    #[arg(long)]
    int8: bool,
    /// Decode-time context scaling `a,b`: source-context terms × a, target-side terms × b.
    #[arg(long, value_name = "A,B", value_parser = parse_context_scale)]
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
    #[arg(long, value_enum, default_value_t = crate::args::LongInputArg::Split)]
    long_input: crate::args::LongInputArg,
    /// Input file (default: stdin).
    #[arg(short, long)]
    input: Option<PathBuf>,
    /// Output file (default: stdout); written atomically.
    #[arg(short, long)]
    output: Option<PathBuf>,
    #[command(flatten)]
    steer: crate::args::SteerArgs,
    /// Write per-sentence attention matrices, gate values and coverage as JSON lines.
    #[arg(long, value_name = "FILE")]
    dump: Option<PathBuf>,
    #[arg(short, long)]
    quiet: bool,
}

pub fn run(a: TranslateArgs, cluster: &cgnmt::cluster::Cluster) -> Result<()> {
    let shortlist = a.shortlist.options()?;
    let tr = Translator::open(
        &a.model,
        &TranslatorOptions {
            int8: a.int8,
            shortlist,
        },
    )?;
    if !a.quiet {
        for note in tr.notes() {
            eprintln!("warning: {note}");
        }
        if let (Some(s), false) = (
            tr.settings(),
            a.length_penalty.is_some() && a.coverage_penalty.is_some(),
        ) {
            eprintln!(
                "decoding with the model's penalties chosen on dev (its {}): α = {}, β = {}, unless given",
                cgnmt::decode::settings::SETTINGS_FILE,
                s.length_penalty,
                s.coverage_penalty
            );
        }
    }
    // The model's penalties chosen on dev, unless given.
    let model = tr.options();
    let mut opts = TranslateOptions {
        beam: a.beam,
        nbest: a.nbest,
        length_norm: a.length_norm,
        length_penalty: a.length_penalty.unwrap_or(model.length_penalty),
        coverage_penalty: a.coverage_penalty.unwrap_or(model.coverage_penalty),
        context_scale: a.context_scale.unwrap_or((1.0, 1.0)),
        record: a.dump.is_some(),
        full_beam: a.full_beam,
        word_table: !a.no_word_table,
        max_decoding_length: a.steer.max_decoding_length,
        min_decoding_length: a.steer.min_decoding_length,
        batch: a.batch,
        pretokenized: a.pretokenized,
        input_limit: InputLimit {
            max_words: a.max_input_words,
            long_input: a.long_input.into(),
        },
        ..model
    };
    // The options checked before the input is read, named as the command line names them.
    tr.decode_options(&opts, |k| format!("--{}", k.replace('_', "-")))?;
    let mut lines = read_input(a.input.as_deref())?;
    a.steer.apply(&mut opts, &mut lines, a.input.as_deref())?;
    let files = OutputFiles {
        input: a.input.clone(),
        output: a.output.clone(),
        dump: a.dump.clone(),
        quiet: a.quiet,
    };
    let d = translate_into(&tr, lines, &opts, &files, cluster)?;
    if !a.quiet {
        eprintln!("{}", d.summary(opts.beam, cluster));
    }
    Ok(())
}
