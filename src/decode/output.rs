//! A whole input translated into files, as `cgnmt translate` does it: decoded in chunks (so output streams
//! while batches stay full) with a progress bar, written as translations or n-best lines and, on request, one
//! JSON record per sentence with its attention, gate values and coverage (`--dump`); every output file appears
//! whole when decoding is done, or not at all. Under `mpiexec -n N` each rank decodes every N-th line and
//! rank 0 writes them all in input order, byte for byte what one process writes.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use crate::atomic_file::AtomicFile;
use crate::cluster::Cluster;
use crate::decode::alignment::{AlignmentMode, WordLevel};
use crate::decode::translate::{LongInput, Translation};
use crate::decode::translator::{TranslateOptions, Translator};

/// The input's name in messages.
fn input_name(files: &OutputFiles) -> String {
    files
        .input
        .as_ref()
        .map_or("<stdin>".to_string(), |p| p.display().to_string())
}

/// Where the translations go.
#[derive(Debug, Clone, Default)]
pub struct OutputFiles {
    /// The input's name in messages (`None`: the standard input).
    pub input: Option<PathBuf>,
    /// The translations (`None`: the standard output).
    pub output: Option<PathBuf>,
    /// The per-sentence JSON records (attention, gates, coverage).
    pub dump: Option<PathBuf>,
    /// No progress bar (warnings are printed still).
    pub quiet: bool,
}

/// What a [`translate_into`] did (this rank's share under MPI).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Decoded {
    pub lines: usize,
    pub seconds: f64,
    /// Hypothesis steps of the searches.
    pub steps: u64,
}

impl Decoded {
    /// The line `cgnmt translate` ends with: lines, seconds, sentences per second, hypothesis steps (and the
    /// rank under MPI).
    pub fn summary(&self, beam: usize, cluster: &Cluster) -> String {
        format!(
            "translated {} lines in {:.1} s ({:.1} sentences/s, beam {beam}, {} hypothesis steps){}",
            self.lines,
            self.seconds,
            self.lines as f64 / self.seconds.max(1e-9),
            self.steps,
            if cluster.size() > 1 {
                format!(" on rank {} of {}", cluster.rank(), cluster.size())
            } else {
                String::new()
            }
        )
    }
}

/// The lines of `path` (plain or gzipped), or of the standard input; an invalid line is an error naming it.
pub fn read_input(path: Option<&Path>) -> Result<Vec<String>> {
    if let Some(p) = path {
        return Ok(cgnmt_data::corpus::read_lines(p)?);
    }
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

/// Translate `all_lines` with `tr` and `opts` into `files`; under MPI (`cluster` of several ranks) this rank
/// decodes its share and rank 0 writes everything.
pub fn translate_into(
    tr: &Translator,
    all_lines: Vec<String>,
    opts: &TranslateOptions,
    files: &OutputFiles,
    cluster: &Cluster,
) -> Result<Decoded> {
    // Under MPI each rank decodes every size-th line; rank 0 writes them all back in input order.
    let total = all_lines.len();
    let mine = cluster.share(total);
    let sharded = cluster.size() > 1;
    // Prefixes and constraints checked before anything is decoded, an error naming the line among all.
    if !opts.steering().is_empty() {
        tr.pipeline()
            .check_steering(
                &all_lines,
                opts.steering(),
                opts.pretokenized,
                opts.input_limit,
            )
            .map_err(|e| anyhow::anyhow!("{}: {e}", input_name(files)))?;
    }
    let lines: Vec<String> = if sharded {
        mine.iter().map(|&i| all_lines[i].clone()).collect()
    } else {
        all_lines
    };
    // This rank's lines' steering.
    let my_opts = match sharded {
        true => opts.for_lines(mine.iter().copied()),
        false => opts.clone(),
    };
    let pb = if files.quiet || lines.len() < 50 || cluster.rank() > 0 {
        indicatif::ProgressBar::hidden()
    } else {
        indicatif::ProgressBar::new(lines.len() as u64)
    };
    // The output and the dump appear whole when decoding is done, or not at all (an error removes what was
    // written). Sharded: each sentence's output lines and dump record, by input line, gathered at rank 0 at
    // the end (whose files are made only then: a job that fails leaves nothing behind).
    let mut sink = Sink::open(files, !sharded)?;
    let mut shard: Vec<(usize, String, String)> = vec![];
    let global = |k: usize| if sharded { mine[k] } else { k };
    let chunk = 1024usize.max(4 * opts.batch);
    let started = std::time::Instant::now();
    let steps_before =
        crate::decode::beam_search::DECODER_ROWS.load(std::sync::atomic::Ordering::Relaxed);
    let mut base = 0;
    for part in lines.chunks(chunk) {
        let part_opts = my_opts.for_lines(base..base + part.len());
        let (out, long) =
            tr.translate_with(part, &part_opts, |d| pb.set_position((base + d) as u64))?;
        // (A line over the limit is named even when quiet: its output is not the whole line's.)
        for l in &long {
            let limit = opts.input_limit.max_words;
            let what = match opts.input_limit.long_input {
                LongInput::Split => format!("translated in {} pieces", l.pieces),
                LongInput::Truncate => format!("only its first {limit} translated"),
            };
            let at = files
                .input
                .as_ref()
                .map(|p| format!("{}: ", p.display()))
                .unwrap_or_default();
            let line = global(base + l.index) + 1;
            pb.suspend(|| {
                eprintln!(
                    "warning: {at}line {line}: {} tokens, more than --max-input-words {limit}: {what}",
                    l.words
                )
            });
        }
        // (A line whose output missed a constraint is named even when quiet.)
        for (k, t) in out.iter().enumerate() {
            let Some(best) = t.hyps.first().filter(|h| h.unmet_constraints > 0) else {
                continue;
            };
            let line = global(base + k) + 1;
            let at = input_name(files);
            pb.suspend(|| {
                eprintln!(
                    "warning: {at}: line {line}: {} of its {} constraints could not be met within the length limit; the output that met most of them: {}",
                    best.unmet_constraints,
                    part_opts.constraints.get(k).map_or(0, Vec::len),
                    t.text
                )
            });
        }
        for (k, t) in out.iter().enumerate() {
            let id = global(base + k);
            let text = output_lines(tr, t, id, opts);
            let record = match files.dump {
                Some(_) => dump_record(t, id)?,
                None => String::new(),
            };
            if sharded {
                shard.push((id, text, record));
            } else {
                sink.write(&text, &record)?;
            }
        }
        sink.flush()?;
        base += part.len();
    }
    pb.finish_and_clear();
    if sharded {
        if std::env::var("CGNMT_INJECT_FAIL_RANK").ok() == Some(cluster.rank().to_string()) {
            bail!("injected failure (CGNMT_INJECT_FAIL_RANK) after decoding this rank's share");
        }
        write_gathered(files, cluster, &shard, total, &mut sink)?;
    }
    sink.commit()?;
    let steps = crate::decode::beam_search::DECODER_ROWS.load(std::sync::atomic::Ordering::Relaxed)
        - steps_before;
    Ok(Decoded {
        lines: lines.len(),
        seconds: started.elapsed().as_secs_f64(),
        steps,
    })
}

/// One sentence's output lines: its translation, or with `nbest` > 1 its n-best list as
/// `id ||| text ||| score` lines (for `cgnmt rescore`); each followed by the fields `opts` asks for (see
/// [`word_fields`]).
pub fn output_lines(
    tr: &Translator,
    t: &Translation,
    id: usize,
    opts: &TranslateOptions,
) -> String {
    let mut text = String::new();
    if opts.nbest > 1 {
        for h in &t.hyps {
            let words = tr.hypothesis_text(h);
            text += &format!("{id} ||| {words} ||| {:.4}", h.score);
            text += &word_fields(tr, t, h, opts);
            text.push('\n');
        }
    } else {
        text += &t.text;
        if let Some(h) = t.hyps.first() {
            text += &word_fields(tr, t, h, opts);
        } else if opts.alignment.is_some() || opts.word_scores {
            // An empty line: empty fields, so that every line has as many.
            text += &word_fields(tr, t, &Default::default(), opts);
        }
        text.push('\n');
    }
    text
}

/// The fields `translate --alignment` and `--word-scores` add to a hypothesis's line, each after ` ||| `, over
/// words (subword pieces merged; see [`WordLevel`]): the links as `i-j` (source word, output word, 0-based)
/// or, `soft`, each output word's attention over the source words (comma-separated; words separated by
/// spaces); `WordScores=` each output word's log-probability, then `Score=` the sentence's (EOS included)
/// and, where the model has a gate, `WordGates=` each output word's mean gate value.
pub fn word_fields(
    tr: &Translator,
    t: &Translation,
    h: &crate::decode::beam_search::Hypothesis,
    opts: &TranslateOptions,
) -> String {
    if opts.alignment.is_none() && !opts.word_scores {
        return String::new();
    }
    let pieces = tr.model().tgt_vocab.decode(&h.tokens);
    let w = WordLevel::of(&t.src_tokens, &pieces, h);
    let mut out = String::new();
    match opts.alignment {
        Some(AlignmentMode::Soft) => {
            let rows: Vec<String> = w
                .attention
                .iter()
                .map(|r| {
                    r.iter()
                        .map(|a| format!("{a:.4}"))
                        .collect::<Vec<_>>()
                        .join(",")
                })
                .collect();
            out += &format!(" ||| {}", rows.join(" "));
        }
        Some(mode) => {
            let links: Vec<String> = w
                .links(mode)
                .iter()
                .map(|(i, j)| format!("{i}-{j}"))
                .collect();
            out += &format!(" ||| {}", links.join(" "));
        }
        None => {}
    }
    if opts.word_scores {
        let scores: Vec<String> = w.word_scores.iter().map(|s| format!("{s:.4}")).collect();
        out += &format!(
            " ||| WordScores= {} Score= {:.4}",
            scores.join(" "),
            h.score
        );
        if !matches!(tr.model().model.gate, crate::model::gate::Gate::None) {
            let gates: Vec<String> = w.word_gates.iter().map(|g| format!("{g:.4}")).collect();
            out += &format!(" ||| WordGates= {}", gates.join(" "));
        }
    }
    out
}

/// One sentence's `--dump` record (a JSON line): its source and output tokens with EOS, its score, the best
/// hypothesis's attention rows, gate values and coverage.
pub fn dump_record(t: &Translation, id: usize) -> Result<String> {
    let best = t.hyps.first();
    let eos = || std::iter::once("</s>".to_string());
    // The output's EOS has an attention row only when the search emitted it (a hypothesis cut at the length
    // limit has none).
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
    Ok(serde_json::to_string(&rec)? + "\n")
}

/// The output (a file written atomically, or the standard output) and the dump, with their names for
/// messages.
struct Sink {
    file: Option<AtomicFile>,
    stdout: std::io::BufWriter<std::io::StdoutLock<'static>>,
    dump: Option<AtomicFile>,
    out_name: String,
    dump_name: String,
}

impl Sink {
    /// The sink of `files`, its files created now when `create` (else at [`Sink::create_files`]).
    fn open(files: &OutputFiles, create: bool) -> Result<Sink> {
        let mut s = Sink {
            file: None,
            stdout: std::io::BufWriter::new(std::io::stdout().lock()),
            dump: None,
            out_name: match &files.output {
                Some(p) => p.display().to_string(),
                None => "the standard output".into(),
            },
            dump_name: files
                .dump
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_default(),
        };
        if create {
            s.create_files(files)?;
        }
        Ok(s)
    }

    fn create_files(&mut self, files: &OutputFiles) -> Result<()> {
        if let Some(p) = &files.output {
            self.file = Some(AtomicFile::create(p)?);
        }
        if let Some(p) = &files.dump {
            self.dump = Some(AtomicFile::create(p)?);
        }
        Ok(())
    }

    fn write(&mut self, text: &str, record: &str) -> Result<()> {
        let out: &mut dyn Write = match self.file.as_mut() {
            Some(f) => f,
            None => &mut self.stdout,
        };
        out.write_all(text.as_bytes())
            .with_context(|| format!("writing {}", self.out_name))?;
        if let Some(d) = self.dump.as_mut() {
            d.write_all(record.as_bytes())
                .with_context(|| format!("writing {}", self.dump_name))?;
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<()> {
        let out: &mut dyn Write = match self.file.as_mut() {
            Some(f) => f,
            None => &mut self.stdout,
        };
        out.flush()
            .with_context(|| format!("writing {}", self.out_name))
    }

    /// Make the files appear (output, then dump last so that a reader that sees the dump sees everything).
    fn commit(self) -> Result<()> {
        if let Some(d) = self.dump {
            d.commit()?;
        }
        if let Some(f) = self.file {
            f.commit()?;
        }
        Ok(())
    }
}

/// Rank 0: every rank's lines (`(input line, output, dump record)`) in input order into the sink (whose files
/// it creates now), whole or not at all; the other ranks send theirs.
fn write_gathered(
    files: &OutputFiles,
    cluster: &Cluster,
    shard: &[(usize, String, String)],
    total: usize,
    sink: &mut Sink,
) -> Result<()> {
    let bytes = serde_json::to_vec(&shard)?;
    let Some(all) = cluster.gather(bytes) else {
        return Ok(());
    };
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
    sink.create_files(files)?;
    for (_, text, record) in &merged {
        sink.write(text, record)?;
    }
    sink.flush()
}
