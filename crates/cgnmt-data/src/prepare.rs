//! `cgnmt prepare`: tokenize a parallel corpus, build vocabularies (and BPE models) and write
//! everything a training run needs into one directory.
//!
//! Files written into `--out DIR` (all UTF-8, `\n` line ends):
//!
//! | file | content |
//! |---|---|
//! | `train.src`, `train.tgt` | kept training pairs, model tokens separated by single spaces, one pair per line, input order |
//! | `train.lines` | for each line of `train.src`, the 1-based line number of that pair in the input files |
//! | `dev.src`, `dev.tgt`, `test.src`, `test.tgt` | tokenized dev/test sets, every line kept (an empty line stays empty) |
//! | `dev.ref`, `test.ref` | exact copies of the raw target lines (references for BLEU) |
//! | `counts.src`, `counts.tgt` | `token<TAB>count` over the kept training tokens, count descending (see [`crate::vocab`]) |
//! | `vocab.src`, `vocab.tgt` | `</s>`, `<unk>`, then the K most frequent tokens, one per line |
//! | `bpe.src.json`, `bpe.tgt.json` | BPE models (only with `--bpe-src` / `--bpe-tgt`) |
//! | `preprocess.json` | the [`Preprocessor`] (tokenizers, BPE file names) |
//! | `prepare.json` | summary: pairs read/kept/dropped, vocabulary sizes, coverage, settings |
//!
//! Training pairs are dropped when either side has no token, or more than `--max-len` model
//! tokens (subwords when BPE is on). The directory is built as `DIR.tmp-*` beside `DIR` and
//! renamed at the end, so an error never leaves a half-written `DIR`.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use serde::Serialize;

use crate::bpe::{BpeModel, SubwordKind};
use crate::corpus::read_parallel;
use crate::preprocess::{Preprocessor, SideConfig};
use crate::tokenize::{default_for_lang, Tokenizer, TokenizerConfig, TokenizerKind};
use crate::vocab::{count_tokens, coverage, Vocab, WordCounts};

/// What `cgnmt prepare` does: the corpus files, the tokenisation, the vocabularies and subword models
/// (see [`PrepareOptions::new`] for the defaults).
#[derive(Debug, Clone)]
pub struct PrepareOptions {
    /// Training source file (plain or gzip), one sentence per line.
    pub src: PathBuf,
    /// Training target file, line-aligned with --src.
    pub tgt: PathBuf,
    /// Output directory (must not exist or be empty, unless --force).
    pub out: PathBuf,
    /// Development source file.
    pub dev_src: Option<PathBuf>,
    /// Development target (reference) file.
    pub dev_tgt: Option<PathBuf>,
    /// Test source file.
    pub test_src: Option<PathBuf>,
    /// Test target (reference) file.
    pub test_tgt: Option<PathBuf>,
    /// Source language code; chooses the default source tokenizer.
    pub src_lang: String,
    /// Target language code; chooses the default target tokenizer.
    pub tgt_lang: String,
    /// Source tokenizer (default: jieba for zh, char for ja, punct otherwise).
    pub src_tok: Option<TokenizerKind>,
    /// Target tokenizer (default: from --tgt-lang).
    pub tgt_tok: Option<TokenizerKind>,
    /// Lowercase both sides before tokenizing.
    pub lowercase: bool,
    /// Source vocabulary size K (K most frequent tokens, plus </s> and <unk>).
    pub src_vocab_size: usize,
    /// Target vocabulary size K.
    pub tgt_vocab_size: usize,
    /// Drop training pairs with a side longer than this many model tokens.
    pub max_len: usize,
    /// Learn a source BPE model with this many subword types.
    pub bpe_src: Option<usize>,
    /// Learn a target BPE model with this many subword types.
    pub bpe_tgt: Option<usize>,
    /// Learn a source unigram subword model (SentencePiece's algorithm) with this many pieces, instead of
    /// BPE.
    pub unigram_src: Option<usize>,
    /// Learn a target unigram subword model with this many pieces, instead of BPE.
    pub unigram_tgt: Option<usize>,
    /// Use only the first N training pairs.
    pub limit: Option<usize>,
    /// Replace a non-empty output directory.
    pub force: bool,
    /// Tokenise with the preprocessing (tokenizers, subword models) of this model or prepared directory and
    /// keep its vocabularies, instead of learning new ones: data to fine-tune that model on.
    pub like: Option<PathBuf>,
}

impl PrepareOptions {
    /// The command line's defaults for a training corpus `src`/`tgt` prepared into `out`: zh → en, the
    /// languages' default tokenizers, vocabularies of 30,000, pairs of at most 80 tokens, no subwords.
    pub fn new(src: impl Into<PathBuf>, tgt: impl Into<PathBuf>, out: impl Into<PathBuf>) -> Self {
        PrepareOptions {
            src: src.into(),
            tgt: tgt.into(),
            out: out.into(),
            dev_src: None,
            dev_tgt: None,
            test_src: None,
            test_tgt: None,
            src_lang: "zh".into(),
            tgt_lang: "en".into(),
            src_tok: None,
            tgt_tok: None,
            lowercase: false,
            src_vocab_size: 30000,
            tgt_vocab_size: 30000,
            max_len: 80,
            bpe_src: None,
            bpe_tgt: None,
            unigram_src: None,
            unigram_tgt: None,
            limit: None,
            force: false,
            like: None,
        }
    }
}

/// Statistics of one side, in `prepare.json`.
#[derive(Serialize, Debug, Clone)]
pub struct SideSummary {
    /// Language code.
    pub lang: String,
    /// Tokenizer used.
    pub tokenizer: TokenizerConfig,
    /// BPE model file name, if any.
    pub bpe_file: Option<String>,
    /// Number of subword types of the BPE model, if any.
    pub bpe_types: Option<usize>,
    /// Requested K.
    pub vocab_size_requested: usize,
    /// Entries of the vocabulary file, specials included (≤ K + 2).
    pub vocab_entries: usize,
    /// Distinct tokens in the kept training data.
    pub distinct_tokens: usize,
    /// Running tokens in the kept training data.
    pub running_tokens: u64,
    /// Fraction of running training tokens covered by the vocabulary.
    pub coverage: f64,
}

/// Counts of one data set, in `prepare.json`.
#[derive(Serialize, Debug, Clone, Default)]
pub struct SetSummary {
    /// Source file.
    pub src_file: String,
    /// Target file.
    pub tgt_file: String,
    /// Pairs read (after --limit for train).
    pub pairs_read: usize,
    /// Pairs written.
    pub pairs_kept: usize,
    /// Pairs dropped because a side was empty after tokenization (train only).
    pub dropped_empty: usize,
    /// Pairs dropped because a side was longer than --max-len (train only).
    pub dropped_too_long: usize,
    /// Dev and test: the fraction of running source and target tokens outside the vocabularies written here
    /// (what the model reads and must produce as `<unk>`; a model trained with a smaller vocabulary size
    /// sees more).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unk_rate: Option<[f64; 2]>,
}

/// The content of `prepare.json`.
#[derive(Serialize, Debug, Clone)]
pub struct PrepareSummary {
    /// Training set.
    pub train: SetSummary,
    /// Development set, if given.
    pub dev: Option<SetSummary>,
    /// Test set, if given.
    pub test: Option<SetSummary>,
    /// Source side.
    pub src: SideSummary,
    /// Target side.
    pub tgt: SideSummary,
    /// --max-len.
    pub max_len: usize,
    /// --limit.
    pub limit: Option<usize>,
}

/// Runs `cgnmt prepare`; see the module documentation for what it writes.
pub fn run_prepare(args: &PrepareOptions) -> Result<()> {
    let summary = prepare(args)?;
    for (name, s) in [("source", &summary.src), ("target", &summary.tgt)] {
        println!(
            "{name} vocabulary {} words covers {:.1}% of tokens ({} distinct, {} running)",
            s.vocab_entries.saturating_sub(2),
            100.0 * s.coverage,
            s.distinct_tokens,
            s.running_tokens
        );
    }
    Ok(())
}

/// Like [`run_prepare`] but returns the summary instead of printing it.
pub fn prepare(args: &PrepareOptions) -> Result<PrepareSummary> {
    if args.max_len == 0 {
        bail!("--max-len must be at least 1");
    }
    if args.src_vocab_size == 0 || args.tgt_vocab_size == 0 {
        bail!("vocabulary sizes must be at least 1");
    }
    if args.bpe_src == Some(0) || args.bpe_tgt == Some(0) {
        bail!("BPE sizes must be at least 1");
    }
    if args.unigram_src == Some(0) || args.unigram_tgt == Some(0) {
        bail!("unigram sizes must be at least 1");
    }
    if let Some(d) = &args.like {
        let own = [
            ("--bpe-src", args.bpe_src.is_some()),
            ("--bpe-tgt", args.bpe_tgt.is_some()),
            ("--unigram-src", args.unigram_src.is_some()),
            ("--unigram-tgt", args.unigram_tgt.is_some()),
            ("--src-tok", args.src_tok.is_some()),
            ("--tgt-tok", args.tgt_tok.is_some()),
            ("--lowercase", args.lowercase),
        ];
        if let Some((flag, _)) = own.iter().find(|(_, set)| *set) {
            bail!(
                "--like {} takes that directory's tokenizers, subwords and vocabularies: drop {flag}",
                d.display()
            );
        }
    }
    if (args.bpe_src.is_some() && args.unigram_src.is_some())
        || (args.bpe_tgt.is_some() && args.unigram_tgt.is_some())
    {
        bail!("a side takes BPE or unigram subwords, not both");
    }
    if args.dev_src.is_some() != args.dev_tgt.is_some() {
        bail!("--dev-src and --dev-tgt must be given together");
    }
    if args.test_src.is_some() != args.test_tgt.is_some() {
        bail!("--test-src and --test-tgt must be given together");
    }
    let out = &args.out;
    if out.exists() {
        if !out.is_dir() {
            bail!("output {} exists and is not a directory", out.display());
        }
        let non_empty = std::fs::read_dir(out)
            .with_context(|| format!("cannot list {}", out.display()))?
            .next()
            .is_some();
        if non_empty && !args.force {
            bail!(
                "output directory {} is not empty; use --force to replace it",
                out.display()
            );
        }
    }
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent)
        .with_context(|| format!("cannot create {}", parent.display()))?;
    let name = out
        .file_name()
        .with_context(|| format!("invalid output directory {}", out.display()))?
        .to_string_lossy()
        .into_owned();
    let tmp = parent.join(format!("{name}.tmp-{}", unique_suffix()));
    std::fs::create_dir(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
    let result = prepare_into(args, &tmp);
    match result {
        Ok(summary) => {
            if let Err(e) = install(&tmp, out, &parent, &name) {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(e);
            }
            Ok(summary)
        }
        Err(e) => {
            let _ = std::fs::remove_dir_all(&tmp);
            Err(e)
        }
    }
}

fn unique_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{nanos:09}", std::process::id())
}

/// Moves the finished temporary directory into place.
fn install(tmp: &Path, out: &Path, parent: &Path, name: &str) -> Result<()> {
    if out.exists() {
        // Either empty, or --force was given: move the old one aside first, then delete it.
        let old = parent.join(format!("{name}.old-{}", unique_suffix()));
        std::fs::rename(out, &old)
            .with_context(|| format!("cannot move old {} aside", out.display()))?;
        if let Err(e) = std::fs::rename(tmp, out) {
            let _ = std::fs::rename(&old, out);
            return Err(e)
                .with_context(|| format!("cannot rename {} to {}", tmp.display(), out.display()));
        }
        std::fs::remove_dir_all(&old)
            .with_context(|| format!("cannot remove old {}", old.display()))?;
    } else {
        std::fs::rename(tmp, out)
            .with_context(|| format!("cannot rename {} to {}", tmp.display(), out.display()))?;
    }
    Ok(())
}

/// Tokenizes lines with a progress bar (on stderr, shown only on a terminal and for long
/// inputs), using all cores.
fn tokenize_all(tok: &Tokenizer, lines: &[String], what: &str) -> Vec<Vec<String>> {
    let pb = if lines.len() >= 20_000 {
        let pb = indicatif::ProgressBar::new(lines.len() as u64);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg:>16} [{elapsed_precise}] {wide_bar} {pos}/{len}",
        ) {
            pb.set_style(style);
        }
        pb.set_message(format!("tokenizing {what}"));
        pb
    } else {
        indicatif::ProgressBar::hidden()
    };
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 16);
    let chunk = lines.len().div_ceil(threads).max(1);
    let mut out: Vec<Vec<String>> = Vec::with_capacity(lines.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = lines
            .chunks(chunk)
            .map(|part| {
                let pb = pb.clone();
                scope.spawn(move || {
                    let mut v = Vec::with_capacity(part.len());
                    for (i, l) in part.iter().enumerate() {
                        v.push(tok.tokenize(l));
                        if i % 1024 == 1023 {
                            pb.inc(1024);
                        }
                    }
                    pb.inc((part.len() % 1024) as u64);
                    v
                })
            })
            .collect();
        for h in handles {
            match h.join() {
                Ok(v) => out.extend(v),
                Err(p) => std::panic::resume_unwind(p),
            }
        }
    });
    pb.finish_and_clear();
    out
}

fn write_lines<I, S>(path: &Path, lines: I) -> Result<()>
where
    I: IntoIterator<Item = S>,
    S: AsRef<str>,
{
    let f = File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
    let mut w = BufWriter::new(f);
    for l in lines {
        w.write_all(l.as_ref().as_bytes())
            .and_then(|_| w.write_all(b"\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    w.flush()
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

fn write_tokens(path: &Path, sents: &[Vec<String>]) -> Result<()> {
    write_lines(path, sents.iter().map(|s| s.join(" ")))
}

struct SidePlan {
    lang: String,
    config: TokenizerConfig,
    tokenizer: Tokenizer,
    bpe_size: Option<(usize, SubwordKind)>,
    vocab_size: usize,
    suffix: &'static str,
}

fn side_plan(args: &PrepareOptions, tgt: bool) -> SidePlan {
    let (lang, tok, bpe, unigram, vs, suffix) = if tgt {
        (
            &args.tgt_lang,
            args.tgt_tok,
            args.bpe_tgt,
            args.unigram_tgt,
            args.tgt_vocab_size,
            "tgt",
        )
    } else {
        (
            &args.src_lang,
            args.src_tok,
            args.bpe_src,
            args.unigram_src,
            args.src_vocab_size,
            "src",
        )
    };
    let bpe = bpe
        .map(|n| (n, SubwordKind::Bpe))
        .or(unigram.map(|n| (n, SubwordKind::Unigram)));
    let config = TokenizerConfig {
        kind: tok.unwrap_or_else(|| default_for_lang(lang)),
        lowercase: args.lowercase,
    };
    SidePlan {
        lang: lang.clone(),
        tokenizer: Tokenizer::new(config.clone()),
        config,
        bpe_size: bpe,
        vocab_size: vs,
        suffix,
    }
}

/// The preprocessing and vocabularies of `--like` (a model or prepared directory), checked.
fn like_dir(dir: &Path) -> Result<(Preprocessor, [Vocab; 2])> {
    for f in [crate::preprocess::PREPROCESS_FILE, "vocab.src", "vocab.tgt"] {
        if !dir.join(f).is_file() {
            bail!(
                "--like {}: no {f} (expected a model directory, or a prepared one)",
                dir.display()
            );
        }
    }
    let pre = Preprocessor::load(dir)?;
    let vocabs = [
        Vocab::load(&dir.join("vocab.src"))?,
        Vocab::load(&dir.join("vocab.tgt"))?,
    ];
    Ok((pre, vocabs))
}

fn prepare_into(args: &PrepareOptions, dir: &Path) -> Result<PrepareSummary> {
    let like = match &args.like {
        Some(d) => Some(like_dir(d)?),
        None => None,
    };
    let plans = [side_plan(args, false), side_plan(args, true)];

    // Training data.
    let (mut src_lines, mut tgt_lines) = read_parallel(&args.src, &args.tgt)?;
    if let Some(n) = args.limit {
        src_lines.truncate(n);
        tgt_lines.truncate(n);
    }
    let n_read = src_lines.len();
    eprintln!("read {n_read} training pairs");
    let mut words = match &like {
        // Through the given preprocessing (its subwords included).
        Some((pre, _)) => [
            src_lines.iter().map(|l| pre.src_tokens(l)).collect(),
            tgt_lines.iter().map(|l| pre.tgt_tokens(l)).collect(),
        ],
        None => [
            tokenize_all(&plans[0].tokenizer, &src_lines, "source"),
            tokenize_all(&plans[1].tokenizer, &tgt_lines, "target"),
        ],
    };
    drop(src_lines);
    drop(tgt_lines);

    // BPE, learned on the non-empty training pairs (none with --like: its subwords are applied).
    let mut bpes: [Option<(String, BpeModel)>; 2] = [None, None];
    for side in 0..2 {
        if like.is_some() {
            continue;
        }
        if let Some((size, kind)) = plans[side].bpe_size {
            let sample: Vec<Vec<String>> = (0..n_read)
                .filter(|&i| !words[0][i].is_empty() && !words[1][i].is_empty())
                .map(|i| words[side][i].clone())
                .collect();
            let name = match kind {
                SubwordKind::Bpe => "bpe",
                SubwordKind::Unigram => "unigram",
            };
            eprintln!(
                "learning {} {name} subwords ({size} types)",
                plans[side].suffix
            );
            let model = BpeModel::train_kind(&sample, size, kind)?;
            let file = format!("{name}.{}.json", plans[side].suffix);
            model.save(&dir.join(&file))?;
            for s in words[side].iter_mut() {
                *s = model.apply(s);
            }
            bpes[side] = Some((file, model));
        }
    }

    // Filtering.
    let mut kept_lines = Vec::new();
    let (mut dropped_empty, mut dropped_long) = (0usize, 0usize);
    for (i, (a, b)) in words[0].iter().zip(&words[1]).enumerate() {
        if a.is_empty() || b.is_empty() {
            dropped_empty += 1;
        } else if a.len() > args.max_len || b.len() > args.max_len {
            dropped_long += 1;
        } else {
            kept_lines.push(i);
        }
    }
    if kept_lines.is_empty() {
        bail!(
            "no training pair left after filtering ({dropped_empty} with an empty side, {dropped_long} longer than --max-len {})",
            args.max_len
        );
    }
    let kept: [Vec<Vec<String>>; 2] = [0, 1].map(|side| {
        kept_lines
            .iter()
            .map(|&i| std::mem::take(&mut words[side][i]))
            .collect()
    });
    drop(words);
    write_tokens(&dir.join("train.src"), &kept[0])?;
    write_tokens(&dir.join("train.tgt"), &kept[1])?;
    write_lines(
        &dir.join("train.lines"),
        kept_lines.iter().map(|i| (i + 1).to_string()),
    )?;
    eprintln!(
        "kept {} pairs, dropped {dropped_empty} with an empty side and {dropped_long} longer than {} tokens",
        kept_lines.len(),
        args.max_len
    );

    // Counts and vocabularies.
    let mut side_summaries = Vec::new();
    let mut vocabs = Vec::new();
    for side in 0..2 {
        let p = &plans[side];
        let counts: WordCounts = count_tokens(&kept[side]);
        counts.save(&dir.join(format!("counts.{}", p.suffix)))?;
        let vocab = match &like {
            Some((_, v)) => v[side].clone(),
            None => Vocab::build(&counts, p.vocab_size),
        };
        vocab.save(&dir.join(format!("vocab.{}", p.suffix)))?;
        let (tokenizer, bpe_file) = match &like {
            Some((pre, _)) => {
                let sc = if side == 0 { &pre.src } else { &pre.tgt };
                (
                    sc.tokenizer.clone(),
                    sc.bpe.as_ref().map(|f| f.display().to_string()),
                )
            }
            None => (
                p.config.clone(),
                bpes[side].as_ref().map(|(f, _)| f.clone()),
            ),
        };
        side_summaries.push(SideSummary {
            lang: p.lang.clone(),
            tokenizer,
            bpe_file,
            bpe_types: bpes[side].as_ref().map(|(_, m)| m.vocab_size()),
            vocab_size_requested: p.vocab_size,
            vocab_entries: vocab.len(),
            distinct_tokens: counts.len(),
            running_tokens: counts.total(),
            coverage: coverage(&vocab, &counts),
        });
        vocabs.push(vocab);
    }
    drop(kept);

    let pre = match like {
        Some((pre, _)) => {
            // The given preprocessing, its subword models copied beside it.
            let from = args.like.as_deref().expect("like");
            for side in [&pre.src, &pre.tgt] {
                if let Some(rel) = &side.bpe {
                    std::fs::copy(from.join(rel), dir.join(rel))
                        .with_context(|| format!("cannot copy {}", from.join(rel).display()))?;
                }
            }
            pre.with_dir(dir)?
        }
        None => Preprocessor::new(
            SideConfig {
                tokenizer: plans[0].config.clone(),
                bpe: bpes[0].as_ref().map(|(f, _)| PathBuf::from(f)),
            },
            SideConfig {
                tokenizer: plans[1].config.clone(),
                bpe: bpes[1].as_ref().map(|(f, _)| PathBuf::from(f)),
            },
            dir,
        )?,
    };
    pre.save(dir)?;
    if let Some(from) = &args.like {
        eprintln!(
            "the preprocessing and vocabularies of {}: out of vocabulary, {:.2}% of the training's source \
             tokens and {:.2}% of its target tokens",
            from.display(),
            100.0 * (1.0 - side_summaries[0].coverage),
            100.0 * (1.0 - side_summaries[1].coverage)
        );
    }

    // Dev and test: tokenized like training (with BPE), nothing dropped.
    let mut eval_sets = Vec::new();
    for (name, s, t) in [
        ("dev", &args.dev_src, &args.dev_tgt),
        ("test", &args.test_src, &args.test_tgt),
    ] {
        let (Some(s), Some(t)) = (s, t) else {
            eval_sets.push(None);
            continue;
        };
        let (sl, tl) = read_parallel(s, t)?;
        let st: Vec<Vec<String>> = sl.iter().map(|l| pre.src_tokens(l)).collect();
        let tt: Vec<Vec<String>> = tl.iter().map(|l| pre.tgt_tokens(l)).collect();
        write_tokens(&dir.join(format!("{name}.src")), &st)?;
        write_tokens(&dir.join(format!("{name}.tgt")), &tt)?;
        write_lines(&dir.join(format!("{name}.ref")), &tl)?;
        let unk = |toks: &[Vec<String>], v: &Vocab| {
            let all: usize = toks.iter().map(Vec::len).sum();
            let out: usize = toks.iter().flatten().filter(|w| !v.contains(w)).count();
            out as f64 / all.max(1) as f64
        };
        let unk_rate = [unk(&st, &vocabs[0]), unk(&tt, &vocabs[1])];
        eprintln!(
            "wrote {} {name} pairs; out of vocabulary: {:.2}% of source tokens, {:.2}% of target tokens",
            sl.len(),
            100.0 * unk_rate[0],
            100.0 * unk_rate[1]
        );
        eval_sets.push(Some(SetSummary {
            src_file: s.display().to_string(),
            tgt_file: t.display().to_string(),
            pairs_read: sl.len(),
            pairs_kept: sl.len(),
            dropped_empty: 0,
            dropped_too_long: 0,
            unk_rate: Some(unk_rate),
        }));
    }

    let tgt_summary = side_summaries
        .pop()
        .context("internal: missing target summary")?;
    let src_summary = side_summaries
        .pop()
        .context("internal: missing source summary")?;
    let test = eval_sets.pop().flatten();
    let dev = eval_sets.pop().flatten();
    let summary = PrepareSummary {
        train: SetSummary {
            src_file: args.src.display().to_string(),
            tgt_file: args.tgt.display().to_string(),
            pairs_read: n_read,
            pairs_kept: kept_lines.len(),
            dropped_empty,
            dropped_too_long: dropped_long,
            unk_rate: None,
        },
        dev,
        test,
        src: src_summary,
        tgt: tgt_summary,
        max_len: args.max_len,
        limit: args.limit,
    };
    let json = serde_json::to_string_pretty(&summary)?;
    std::fs::write(dir.join("prepare.json"), json + "\n")
        .with_context(|| format!("cannot write {}", dir.join("prepare.json").display()))?;
    Ok(summary)
}
