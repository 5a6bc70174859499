//! `cgnmt translate`: beam search over lines of text, one output line per input line (an ensemble with
//! several models; outputs written whole or not at all).

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::atomic_file::AtomicFile;
use crate::decode::translate::InputLimit;
use crate::{ShortlistOptions, TranslateOptions, Translator, TranslatorOptions};

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
    #[arg(long, value_enum, default_value_t = crate::decode::translate::LongInput::Split)]
    long_input: crate::decode::translate::LongInput,
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

pub fn run(a: TranslateArgs, cluster: &crate::cluster::Cluster) -> Result<()> {
    if a.shortlist.is_some() && a.shortlist_per_word == 0 && a.shortlist_frequent == 0 {
        bail!("--shortlist-frequent and --shortlist-per-word are both 0: the shortlist would be empty");
    }
    let tr = Translator::open(
        &a.model,
        &TranslatorOptions {
            int8: a.int8,
            shortlist: a.shortlist.as_ref().map(|p| ShortlistOptions {
                lexicon: p.clone(),
                frequent: a.shortlist_frequent,
                per_word: a.shortlist_per_word,
            }),
        },
    )?;
    if !a.quiet {
        for note in tr.notes() {
            eprintln!("warning: {note}");
        }
    }
    let topts = translate_options(&a);
    let opts = tr
        .decode_options(&topts, |k| format!("--{}", k.replace('_', "-")))
        .map_err(anyhow::Error::msg)?;
    let all_lines = read_input(a.input.as_deref())?;
    // Under MPI each rank decodes every size-th line; rank 0 writes them all back in input order.
    let total = all_lines.len();
    let mine = cluster.share(total);
    let lines: Vec<String> = if cluster.size() > 1 {
        mine.iter().map(|&i| all_lines[i].clone()).collect()
    } else {
        all_lines
    };
    let pb = if a.quiet || lines.len() < 50 || cluster.rank() > 0 {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(lines.len() as u64)
    };
    // -o and --dump appear whole when decoding is done, or not at all (an error removes what was written).
    // Sharded: each sentence's output lines and dump record, by input line, gathered at rank 0 at the end
    // (whose files are made only then: a job that fails leaves nothing behind).
    let sharded = cluster.size() > 1;
    let writes = !sharded;
    let mut file_out = match &a.output {
        Some(p) if writes => Some(AtomicFile::create(p)?),
        _ => None,
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
        Some(p) if writes => Some(AtomicFile::create(p)?),
        _ => None,
    };
    let mut shard: Vec<(usize, String, String)> = vec![];
    let global = |k: usize| if sharded { mine[k] } else { k };
    // Decode in chunks so output streams while keeping batches full.
    let chunk = 1024usize.max(4 * a.batch);
    let started = std::time::Instant::now();
    let steps_before =
        crate::decode::beam_search::DECODER_ROWS.load(std::sync::atomic::Ordering::Relaxed);
    let mut base = 0;
    for part in lines.chunks(chunk) {
        let (out, long) =
            tr.translate_with(part, &topts, |d| pb.set_position((base + d) as u64))?;
        for l in &long {
            let what = match a.long_input {
                crate::decode::translate::LongInput::Split => {
                    format!("translated in {} pieces", l.pieces)
                }
                crate::decode::translate::LongInput::Truncate => {
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
                    global(base + l.index) + 1,
                    l.words,
                    a.max_input_words
                )
            });
        }
        for (k, t) in out.iter().enumerate() {
            let id = global(base + k);
            let (text, record) = output_of(&a, &tr, t, id)?;
            if sharded {
                shard.push((id, text, record));
                continue;
            }
            sink.write_all(text.as_bytes())
                .with_context(|| format!("writing {out_name}"))?;
            if let Some(d) = dump.as_mut() {
                d.write_all(record.as_bytes()).with_context(|| {
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
    if sharded {
        if std::env::var("CGNMT_INJECT_FAIL_RANK").ok() == Some(cluster.rank().to_string()) {
            bail!("injected failure (CGNMT_INJECT_FAIL_RANK) after decoding this rank's share");
        }
        write_gathered(&a, cluster, &shard, total, sink, &out_name)?;
    }
    if let Some(d) = dump {
        d.commit()?;
    }
    if let Some(f) = file_out {
        f.commit()?;
    }
    if !a.quiet {
        let secs = started.elapsed().as_secs_f64();
        let steps = crate::decode::beam_search::DECODER_ROWS
            .load(std::sync::atomic::Ordering::Relaxed)
            - steps_before;
        eprintln!(
            "translated {} lines in {secs:.1} s ({:.1} sentences/s, beam {}, {steps} hypothesis steps){}",
            lines.len(),
            lines.len() as f64 / secs.max(1e-9),
            opts.beam,
            if sharded {
                format!(" on rank {} of {}", cluster.rank(), cluster.size())
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

/// The decoding options of the arguments.
fn translate_options(a: &TranslateArgs) -> TranslateOptions {
    TranslateOptions {
        beam: a.beam,
        nbest: a.nbest,
        length_norm: a.length_norm,
        length_penalty: a.length_penalty,
        coverage_penalty: a.coverage_penalty,
        context_scale: a.context_scale.unwrap_or((1.0, 1.0)),
        record: a.dump.is_some(),
        full_beam: a.full_beam,
        word_table: !a.no_word_table,
        batch: a.batch,
        pretokenized: a.pretokenized,
        input_limit: InputLimit {
            max_words: a.max_input_words,
            long_input: a.long_input,
        },
    }
}

/// One sentence's output lines (its translation, or its n-best list) and its `--dump` record (empty without).
fn output_of(
    a: &TranslateArgs,
    tr: &Translator,
    t: &crate::decode::translate::Translation,
    id: usize,
) -> Result<(String, String)> {
    let mut text = String::new();
    if a.nbest > 1 {
        for h in &t.hyps {
            let words = tr.hypothesis_text(h);
            text += &format!("{id} ||| {words} ||| {:.4}\n", h.score);
        }
    } else {
        text += &t.text;
        text.push('\n');
    }
    let mut record = String::new();
    if a.dump.is_some() {
        let best = t.hyps.first();
        let eos = || std::iter::once("</s>".to_string());
        // The output's EOS has an attention row only when the search emitted it (a hypothesis cut
        // at the length limit has none).
        let rows = best.map_or(0, |b| b.attention.len());
        let hyp_eos = rows != t.tokens.len();
        let rec = cgnmt_eval::analysis::DumpRecord::<f32> {
            id: Some(id),
            src: t.src_tokens.iter().cloned().chain(eos()).collect(),
            hyp: t
                .tokens
                .iter()
                .cloned()
                .chain(eos().filter(|_| hyp_eos))
                .collect(),
            score: best.map(|b| b.score),
            attention: best.map(|b| b.attention.clone()).unwrap_or_default(),
            gates: best.map(|b| b.gates.clone()).unwrap_or_default(),
            coverage: best.map(|b| b.coverage.clone()).unwrap_or_default(),
        };
        record = serde_json::to_string(&rec)? + "\n";
    }
    Ok((text, record))
}

/// Rank 0: every rank's lines (`(input line, output, dump record)`) in input order into `-o` (or `sink`) and
/// `--dump`, whole or not at all; the other ranks send theirs.
fn write_gathered(
    a: &TranslateArgs,
    cluster: &crate::cluster::Cluster,
    shard: &[(usize, String, String)],
    total: usize,
    sink: &mut dyn Write,
    out_name: &str,
) -> Result<()> {
    let bytes = serde_json::to_vec(&shard)?;
    if let Some(all) = cluster.gather(bytes) {
        let mut merged: Vec<(usize, String, String)> = vec![];
        for (r, b) in all.iter().enumerate() {
            let part: Vec<(usize, String, String)> = serde_json::from_slice(b)
                .with_context(|| format!("rank {r}'s translations are not readable"))?;
            merged.extend(part);
        }
        merged.sort_by_key(|m| m.0);
        if merged.len() != total || merged.iter().enumerate().any(|(i, m)| m.0 != i) {
            bail!("the ranks' translations do not cover the input's lines once each");
        }
        let mut file = match &a.output {
            Some(p) => Some(AtomicFile::create(p)?),
            None => None,
        };
        let out: &mut dyn Write = match file.as_mut() {
            Some(f) => f,
            None => sink,
        };
        let mut dump = match &a.dump {
            Some(p) => Some(AtomicFile::create(p)?),
            None => None,
        };
        for (_, text, record) in &merged {
            out.write_all(text.as_bytes())
                .with_context(|| format!("writing {out_name}"))?;
            if let Some(d) = dump.as_mut() {
                d.write_all(record.as_bytes())?;
            }
        }
        out.flush().with_context(|| format!("writing {out_name}"))?;
        if let Some(d) = dump {
            d.commit()?;
        }
        if let Some(f) = file {
            f.commit()?;
        }
    }
    Ok(())
}
