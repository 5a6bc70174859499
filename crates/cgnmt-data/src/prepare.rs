//! `cgnmt prepare`: tokenize a parallel corpus, build vocabularies (and BPE models) and write
//! everything a training run needs into one directory.
//!
//! Files written into `--out DIR` (all UTF-8, `\n` line ends):
//!
//! | file | content |
//! |---|---|
//! | `train.src`, `train.tgt` | kept training pairs, model tokens separated by single spaces, one pair per line, input order |
//! | `train.src.store`, `train.tgt.store` | the same tokens as ids in a binary [`crate::store`] (what training reads, sentence by sentence) |
//! | `train.lines` | for each line of `train.src`, the 1-based line number of that pair in the input files |
//! | `dev.src`, `dev.tgt`, `test.src`, `test.tgt` | tokenized dev/test sets, every line kept (an empty line stays empty) |
//! | `dev.ref`, `test.ref` | exact copies of the raw target lines (references for BLEU) |
//! | `counts.src`, `counts.tgt` | `token<TAB>count` over the kept training tokens, count descending (see [`crate::vocab`]) |
//! | `vocab.src`, `vocab.tgt` | `</s>`, `<unk>`, then the K most frequent tokens, one per line |
//! | `bpe.src.json`, `bpe.tgt.json` | BPE models (only with `--bpe-src` / `--bpe-tgt`) |
//! | `preprocess.json` | the [`Preprocessor`] (tokenizers, BPE file names) |
//! | `prepare.json` | summary: pairs read/kept/dropped, vocabulary sizes, coverage, settings |
//!
//! The corpus is never held in memory: a first pass counts words (spilling each side's tokenised words to a
//! temporary file), the subword models are learnt from the counts, and a second pass segments, filters and
//! writes the pairs in chunks of sentences tokenised in parallel; the stores are written from the filtered
//! text last. Memory grows with the number of distinct words, not with the corpus.
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
use crate::corpus::{read_parallel, Lines, PairChunks};
use crate::preprocess::{Preprocessor, SideConfig};
use crate::tokenize::{default_for_lang, Tokenizer, TokenizerConfig, TokenizerKind};
use crate::vocab::{coverage, Vocab, WordCounts};

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
    /// Word alignments of the training pairs (Pharaoh `i-j` links, 0-based, one line per pair, over the words
    /// the tokenizers make; `--src-tok whitespace --tgt-tok whitespace` keeps a pre-tokenised corpus's own
    /// words): checked, and the kept pairs' lines written to `train.align`, in step with `train.src` (for
    /// guided alignment, `train.guided_alignment`).
    pub alignment: Option<PathBuf>,
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
            alignment: None,
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
    if args.like.is_some() && args.alignment.is_some() {
        bail!("--alignment goes with a corpus prepared on its own: drop --like (or align the prepared pairs)");
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
/// Pairs read and processed at a time.
const CHUNK: usize = 50_000;

/// A progress bar over `total` pairs (hidden for small corpora).
fn pairs_bar(total: Option<usize>, what: &str) -> indicatif::ProgressBar {
    let pb = match total {
        Some(n) if n >= 20_000 => indicatif::ProgressBar::new(n as u64),
        Some(_) => return indicatif::ProgressBar::hidden(),
        None => indicatif::ProgressBar::new_spinner(),
    };
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg:>16} [{elapsed_precise}] {wide_bar} {pos}/{len}",
    ) {
        pb.set_style(style);
    }
    pb.set_message(what.to_string());
    pb
}

/// Pass 1: the training pairs (the first `--limit`) tokenised into `dir/words.src` and `dir/words.tgt`, a
/// line per pair (with `--like`, its whole preprocessing, subwords included); the number of pairs read, and
/// per side the counts of the words of the pairs with two non-empty sides (to learn subwords from). Every
/// line of both files is read, so that misaligned files are refused even with `--limit`.
fn words_pass(
    args: &PrepareOptions,
    dir: &Path,
    plans: &[SidePlan; 2],
    like: Option<&Preprocessor>,
) -> Result<(usize, [WordCounts; 2])> {
    let learn = like.is_none() && plans.iter().any(|p| p.bpe_size.is_some());
    let mut counts = [WordCounts::new(), WordCounts::new()];
    let mut out = [
        BufWriter::new(create(&dir.join("words.src"))?),
        BufWriter::new(create(&dir.join("words.tgt"))?),
    ];
    let mut n_read = 0usize;
    let pb = pairs_bar(None, "tokenizing");
    for chunk in PairChunks::open(&args.src, &args.tgt, CHUNK)? {
        let chunk = chunk?;
        let take = match args.limit {
            Some(l) => l.saturating_sub(n_read).min(chunk.len()),
            None => chunk.len(),
        };
        if take == 0 {
            continue;
        }
        let (src, tgt): (Vec<String>, Vec<String>) = chunk.into_iter().take(take).unzip();
        let words = match like {
            Some(pre) => [
                src.iter().map(|l| pre.src_tokens(l)).collect(),
                tgt.iter().map(|l| pre.tgt_tokens(l)).collect(),
            ],
            None => [
                tokenize_all(&plans[0].tokenizer, &src, "source"),
                tokenize_all(&plans[1].tokenizer, &tgt, "target"),
            ],
        };
        for (i, (a, b)) in words[0].iter().zip(&words[1]).enumerate() {
            for (side, w) in [a, b].into_iter().enumerate() {
                writeln!(out[side], "{}", w.join(" "))
                    .with_context(|| format!("cannot write {}", dir.display()))?;
            }
            if learn && !a.is_empty() && !b.is_empty() {
                counts[0].add_sentence(&words[0][i]);
                counts[1].add_sentence(&words[1][i]);
            }
        }
        n_read += take;
        pb.set_position(n_read as u64);
    }
    pb.finish_and_clear();
    for (w, side) in out.iter_mut().zip(["src", "tgt"]) {
        w.flush().with_context(|| {
            format!(
                "cannot write {}",
                dir.join(format!("words.{side}")).display()
            )
        })?;
    }
    Ok((n_read, counts))
}

/// What pass 2 kept.
struct Kept {
    pairs: usize,
    dropped_empty: usize,
    dropped_long: usize,
    /// The kept tokens' counts, per side.
    counts: [WordCounts; 2],
}

/// Pass 2: the words of pass 1 through the subword models, the pairs with an empty side or a side longer
/// than `--max-len` left out, the rest written to `train.src`, `train.tgt` and `train.lines` (the 1-based
/// line of each in the input) and their tokens counted; `words.*` are removed.
fn filter_pass(
    args: &PrepareOptions,
    dir: &Path,
    subwords: [Option<&BpeModel>; 2],
    n_read: usize,
) -> Result<Kept> {
    let mut kept = Kept {
        pairs: 0,
        dropped_empty: 0,
        dropped_long: 0,
        counts: [WordCounts::new(), WordCounts::new()],
    };
    let mut out = [
        BufWriter::new(create(&dir.join("train.src"))?),
        BufWriter::new(create(&dir.join("train.tgt"))?),
    ];
    let mut lines_out = BufWriter::new(create(&dir.join("train.lines"))?);
    let mut words = [
        Lines::open(&dir.join("words.src"))?,
        Lines::open(&dir.join("words.tgt"))?,
    ];
    // The word alignments, read in step with the pairs (see `PrepareOptions::alignment`).
    let mut links = match &args.alignment {
        Some(p) => Some((
            Lines::open(p)?,
            BufWriter::new(create(&dir.join("train.align"))?),
        )),
        None => None,
    };
    let pb = pairs_bar(Some(n_read), "subwords");
    let mut line = 0usize;
    loop {
        // A chunk of pairs, segmented in parallel.
        let mut chunk: [Vec<Vec<String>>; 2] = [vec![], vec![]];
        for side in 0..2 {
            for l in words[side].by_ref().take(CHUNK) {
                chunk[side].push(l?.split_whitespace().map(str::to_string).collect());
            }
        }
        if chunk[0].is_empty() {
            break;
        }
        let link_lines = match &mut links {
            Some((lines, _)) => Some(read_links(
                lines,
                args.alignment.as_deref().unwrap_or(Path::new("")),
                &chunk,
                line,
            )?),
            None => None,
        };
        for side in 0..2 {
            if let Some(m) = subwords[side] {
                chunk[side] = par_map(&chunk[side], |w| m.apply(w));
            }
        }
        for (k, (a, b)) in chunk[0].iter().zip(&chunk[1]).enumerate() {
            line += 1;
            if a.is_empty() || b.is_empty() {
                kept.dropped_empty += 1;
                continue;
            }
            if a.len() > args.max_len || b.len() > args.max_len {
                kept.dropped_long += 1;
                continue;
            }
            for (side, toks) in [a, b].into_iter().enumerate() {
                writeln!(out[side], "{}", toks.join(" "))
                    .with_context(|| format!("cannot write {}", dir.display()))?;
                kept.counts[side].add_sentence(toks);
            }
            writeln!(lines_out, "{line}")
                .with_context(|| format!("cannot write {}", dir.display()))?;
            if let (Some((_, w)), Some(l)) = (&mut links, &link_lines) {
                writeln!(w, "{}", l[k])
                    .with_context(|| format!("cannot write {}", dir.display()))?;
            }
            kept.pairs += 1;
        }
        pb.set_position(line as u64);
    }
    pb.finish_and_clear();
    if let Some((mut lines, mut w)) = links {
        // One line per pair of the corpus (with --limit, at least the pairs read).
        let path = args.alignment.as_deref().unwrap_or(Path::new(""));
        if args.limit.is_none() && lines.next().is_some() {
            bail!(
                "{}: more lines of links than the corpus's {line} sentence pairs",
                path.display()
            );
        }
        w.flush()
            .with_context(|| format!("cannot write {}", dir.display()))?;
    }
    for w in out.iter_mut().chain(std::iter::once(&mut lines_out)) {
        w.flush()
            .with_context(|| format!("cannot write {}", dir.display()))?;
    }
    for side in ["src", "tgt"] {
        let p = dir.join(format!("words.{side}"));
        std::fs::remove_file(&p).with_context(|| format!("cannot remove {}", p.display()))?;
    }
    if kept.pairs == 0 {
        bail!(
            "no training pair left after filtering ({} with an empty side, {} longer than --max-len {})",
            kept.dropped_empty,
            kept.dropped_long,
            args.max_len
        );
    }
    Ok(kept)
}

/// The lines of links of the pairs of `chunk` (their words, before subwords; the first is the corpus's line
/// `before + 1`) from `lines` (the file `path`), each checked against its pair (indices within its words),
/// normalised (`i-j` separated by single spaces).
fn read_links(
    lines: &mut Lines,
    path: &Path,
    chunk: &[Vec<Vec<String>>; 2],
    before: usize,
) -> Result<Vec<String>> {
    let mut out = Vec::with_capacity(chunk[0].len());
    for (k, (a, b)) in chunk[0].iter().zip(&chunk[1]).enumerate() {
        let at = before + k + 1;
        let Some(l) = lines.next() else {
            bail!(
                "{}: {} lines of links, but the corpus has more sentence pairs (one line per pair)",
                path.display(),
                at - 1
            );
        };
        let l = l?;
        let mut norm = Vec::new();
        for tok in l.split_whitespace() {
            let ij = tok
                .split_once('-')
                .and_then(|(i, j)| Some((i.parse::<usize>().ok()?, j.parse::<usize>().ok()?)));
            match ij {
                Some((i, j)) if i < a.len() && j < b.len() => norm.push(format!("{i}-{j}")),
                Some(_) => bail!(
                    "{} line {at}: link {tok:?}: the pair has {} source and {} target words after \
                     tokenisation (indices from 0; --src-tok whitespace --tgt-tok whitespace keep a \
                     pre-tokenised corpus's own words)",
                    path.display(),
                    a.len(),
                    b.len()
                ),
                None => bail!(
                    "{} line {at}: link {tok:?} is not of the form i-j (two 0-based word indices)",
                    path.display()
                ),
            }
        }
        out.push(norm.join(" "));
    }
    Ok(out)
}

/// Pass 3: the side's `train.SUFFIX` as a token store, `train.SUFFIX.store` (see [`crate::store`]): each
/// token's id its rank in `counts` (the order of [`Vocab::build`]).
fn store_pass(dir: &Path, suffix: &str, counts: &WordCounts) -> Result<()> {
    let all = Vocab::build(counts, usize::MAX);
    let mut w = crate::store::StoreWriter::create(
        &dir.join(format!("train.{suffix}.store")),
        all.len() as u64,
    )?;
    for l in Lines::open(&dir.join(format!("train.{suffix}")))? {
        let l = l?;
        let toks: Vec<&str> = l.split_whitespace().collect();
        w.push(&all.encode(&toks))?;
    }
    w.finish()?;
    Ok(())
}

fn create(path: &Path) -> Result<File> {
    File::create(path).with_context(|| format!("cannot create {}", path.display()))
}

/// `f` over `items` on the available cores, in order.
fn par_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let threads = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .clamp(1, 16);
    let chunk = items.len().div_ceil(threads).max(1);
    let f = &f;
    std::thread::scope(|scope| {
        let handles: Vec<_> = items
            .chunks(chunk)
            .map(|part| scope.spawn(move || part.iter().map(f).collect::<Vec<R>>()))
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    })
}

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

    // Training data, in passes over the corpus with bounded memory (chunks of pairs, each tokenised in
    // parallel): (1) the words of every pair into `words.*` (and their counts, to learn subwords from);
    // (2) subwords applied, pairs filtered, `train.*` written and their tokens counted; (3) the token store.
    let (n_read, word_counts) = words_pass(args, dir, &plans, like.as_ref().map(|(p, _)| p))?;
    eprintln!("read {n_read} training pairs");

    // Subword models, learned from the words of the pairs with two non-empty sides.
    let mut bpes: [Option<(String, BpeModel)>; 2] = [None, None];
    for side in 0..2 {
        if like.is_some() {
            continue;
        }
        if let Some((size, kind)) = plans[side].bpe_size {
            let name = match kind {
                SubwordKind::Bpe => "bpe",
                SubwordKind::Unigram => "unigram",
            };
            eprintln!(
                "learning {} {name} subwords ({size} types)",
                plans[side].suffix
            );
            let model = BpeModel::train_counts(&word_counts[side], size, kind)?;
            let file = format!("{name}.{}.json", plans[side].suffix);
            model.save(&dir.join(&file))?;
            bpes[side] = Some((file, model));
        }
    }
    drop(word_counts);

    let subwords = [
        bpes[0].as_ref().map(|b| &b.1),
        bpes[1].as_ref().map(|b| &b.1),
    ];
    let kept = filter_pass(args, dir, subwords, n_read)?;
    eprintln!(
        "kept {} pairs, dropped {} with an empty side and {} longer than {} tokens",
        kept.pairs, kept.dropped_empty, kept.dropped_long, args.max_len
    );

    // Counts and vocabularies.
    let mut side_summaries = Vec::new();
    let mut vocabs = Vec::new();
    for side in 0..2 {
        let p = &plans[side];
        let counts: &WordCounts = &kept.counts[side];
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
            coverage: coverage(&vocab, counts),
        });
        vocabs.push(vocab);
        store_pass(dir, p.suffix, counts)?;
    }

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
            pairs_kept: kept.pairs,
            dropped_empty: kept.dropped_empty,
            dropped_too_long: kept.dropped_long,
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
