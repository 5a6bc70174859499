//! The paper's analyses (Tu et al., TACL 2017; model spec §8): BLEU and output length by
//! source-length group (Fig. 7), per-sentence gate values against the sentence-BLEU
//! improvement over a baseline (Table 6), translation length under context scaling (Fig. 2a /
//! Table 1), plus the readers for the model's translation dumps and training logs.
//!
//! Everything here is a pure function of in-memory data except the `read_*` / `parse_*`
//! readers, whose errors name file and line. Words are whitespace-separated tokens of the
//! plain-text files (the `--src` file is the source as the model saw it, e.g. segmented
//! Chinese).

use std::path::Path;

use serde::{Deserialize, Deserializer, Serialize};

use crate::bleu::{corpus_bleu, sentence_bleu, BleuOptions};
use crate::EvalError;

/// The paper's length-group edges: `<10, 10–20, 20–30, 30–40, 40–50, ≥50`.
pub const DEFAULT_EDGES: [usize; 5] = [10, 20, 30, 40, 50];

/// Default threshold (source words) of the "long sentences" correlation of the gate analysis.
pub const DEFAULT_LONG: usize = 30;

/// Number of whitespace-separated words of a line.
pub fn word_count(line: &str) -> usize {
    line.split_whitespace().count()
}

// ---------------------------------------------------------------------------------------------
// Pearson correlation
// ---------------------------------------------------------------------------------------------

/// Why a Pearson correlation is undefined.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub enum PearsonError {
    /// The two samples differ in length.
    LengthMismatch(usize, usize),
    /// Fewer than two points.
    TooFew(usize),
    /// A sample is constant (named `"x"` or `"y"`).
    ZeroVariance(&'static str),
    /// A value is NaN or infinite.
    NonFinite,
}

impl std::fmt::Display for PearsonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PearsonError::LengthMismatch(a, b) => {
                write!(f, "samples differ in length ({a} vs {b})")
            }
            PearsonError::TooFew(n) => write!(f, "undefined: needs at least 2 sentences, got {n}"),
            PearsonError::ZeroVariance(w) => {
                write!(f, "undefined: all {w} values are equal (zero variance)")
            }
            PearsonError::NonFinite => write!(f, "undefined: a value is NaN or infinite"),
        }
    }
}

impl std::error::Error for PearsonError {}

/// Pearson's correlation coefficient `r` of two paired samples (two-pass, clamped to [-1, 1]).
pub fn pearson(x: &[f64], y: &[f64]) -> Result<f64, PearsonError> {
    if x.len() != y.len() {
        return Err(PearsonError::LengthMismatch(x.len(), y.len()));
    }
    let n = x.len();
    if n < 2 {
        return Err(PearsonError::TooFew(n));
    }
    if x.iter().chain(y).any(|v| !v.is_finite()) {
        return Err(PearsonError::NonFinite);
    }
    let mx = x.iter().sum::<f64>() / n as f64;
    let my = y.iter().sum::<f64>() / n as f64;
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        let (dx, dy) = (a - mx, b - my);
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    // Relative tolerance: a sample whose spread is at rounding level is constant.
    let tiny = |s: f64, m: f64| s <= (1e-12 * (1.0 + m.abs())).powi(2) * n as f64;
    if tiny(sxx, mx) {
        return Err(PearsonError::ZeroVariance("x"));
    }
    if tiny(syy, my) {
        return Err(PearsonError::ZeroVariance("y"));
    }
    Ok((sxy / (sxx.sqrt() * syy.sqrt())).clamp(-1.0, 1.0))
}

// ---------------------------------------------------------------------------------------------
// Length groups (Fig. 7)
// ---------------------------------------------------------------------------------------------

/// Checks that bucket edges are non-empty, positive and strictly increasing.
pub fn check_edges(edges: &[usize]) -> Result<(), EvalError> {
    if edges.is_empty() {
        return Err(EvalError::InvalidOption(
            "length-group edges: give at least one edge, e.g. 10,20,30,40,50".into(),
        ));
    }
    if edges[0] == 0 {
        return Err(EvalError::InvalidOption(
            "length-group edges must be positive".into(),
        ));
    }
    if edges.windows(2).any(|w| w[0] >= w[1]) {
        return Err(EvalError::InvalidOption(format!(
            "length-group edges must be strictly increasing, got {edges:?}"
        )));
    }
    Ok(())
}

/// Index of the bucket of a sentence with `len` source words: the number of edges `<= len`
/// (bucket 0 is `< edges[0]`, the last is `>= edges[last]`).
pub fn bucket_index(len: usize, edges: &[usize]) -> usize {
    edges.iter().take_while(|&&e| e <= len).count()
}

/// Labels of the `edges.len() + 1` buckets: `<10`, `10-20`, …, `≥50`.
pub fn bucket_labels(edges: &[usize]) -> Vec<String> {
    let mut v = Vec::with_capacity(edges.len() + 1);
    if let Some(&first) = edges.first() {
        v.push(format!("<{first}"));
    }
    for w in edges.windows(2) {
        v.push(format!("{}-{}", w[0], w[1]));
    }
    if let Some(&last) = edges.last() {
        v.push(format!("≥{last}"));
    }
    v
}

/// One system's result in one length bucket.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SystemBucket {
    /// System name.
    pub name: String,
    /// Corpus BLEU of the bucket's sentences (0–100); `None` for an empty bucket.
    pub bleu: Option<f64>,
    /// Mean output length in words; `None` for an empty bucket.
    pub mean_len: Option<f64>,
    /// Total output words.
    pub words: usize,
}

/// One length bucket.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LengthBucket {
    /// Label (`<10`, `10-20`, …, `≥50`).
    pub label: String,
    /// Smallest source length in the bucket (inclusive).
    pub lo: usize,
    /// Upper edge (exclusive); `None` for the last, open bucket.
    pub hi: Option<usize>,
    /// Number of sentences.
    pub sentences: usize,
    /// Mean source length in words; `None` for an empty bucket.
    pub mean_src_len: Option<f64>,
    /// Mean length of the references in words (averaged over references); `None` if empty.
    pub mean_ref_len: Option<f64>,
    /// One entry per system, in the order given.
    pub systems: Vec<SystemBucket>,
}

/// Result of [`length_groups`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LengthGroups {
    /// BLEU signature of the scores.
    pub signature: String,
    /// The bucket edges.
    pub edges: Vec<usize>,
    /// The buckets, shortest first.
    pub buckets: Vec<LengthBucket>,
}

fn check_parallel(what: &str, expected: usize, got: usize) -> Result<(), EvalError> {
    if expected != got {
        return Err(EvalError::LengthMismatch {
            what: what.to_string(),
            expected,
            got,
        });
    }
    Ok(())
}

/// BLEU and mean output length per source-length bucket for each system (paper Fig. 7).
///
/// `refs[r][i]` is reference `r` of sentence `i`; `systems` are `(name, outputs)`. An empty
/// bucket gets `bleu = None`.
pub fn length_groups(
    src: &[String],
    refs: &[Vec<String>],
    systems: &[(String, Vec<String>)],
    edges: &[usize],
    opts: &BleuOptions,
) -> Result<LengthGroups, EvalError> {
    check_edges(edges)?;
    if refs.is_empty() {
        return Err(EvalError::NoReferences);
    }
    if src.is_empty() {
        return Err(EvalError::EmptyCorpus);
    }
    for (k, r) in refs.iter().enumerate() {
        check_parallel(
            &format!("reference {} vs source", k + 1),
            src.len(),
            r.len(),
        )?;
    }
    for (name, out) in systems {
        check_parallel(&format!("system {name} vs source"), src.len(), out.len())?;
    }
    let nb = edges.len() + 1;
    let mut members: Vec<Vec<usize>> = vec![Vec::new(); nb];
    let src_lens: Vec<usize> = src.iter().map(|s| word_count(s)).collect();
    for (i, &l) in src_lens.iter().enumerate() {
        members[bucket_index(l, edges)].push(i);
    }
    let labels = bucket_labels(edges);
    let mut buckets = Vec::with_capacity(nb);
    for (b, idx) in members.iter().enumerate() {
        let n = idx.len();
        let mean = |total: f64| if n == 0 { None } else { Some(total / n as f64) };
        let src_total: usize = idx.iter().map(|&i| src_lens[i]).sum();
        let ref_total: f64 = refs
            .iter()
            .map(|r| idx.iter().map(|&i| word_count(&r[i])).sum::<usize>() as f64)
            .sum::<f64>()
            / refs.len() as f64;
        let sub_refs: Vec<Vec<String>> = refs
            .iter()
            .map(|r| idx.iter().map(|&i| r[i].clone()).collect())
            .collect();
        let mut sys = Vec::with_capacity(systems.len());
        for (name, out) in systems {
            let hyps: Vec<String> = idx.iter().map(|&i| out[i].clone()).collect();
            let words: usize = hyps.iter().map(|h| word_count(h)).sum();
            let bleu = if n == 0 {
                None
            } else {
                Some(corpus_bleu(&hyps, &sub_refs, opts)?.score)
            };
            sys.push(SystemBucket {
                name: name.clone(),
                bleu,
                mean_len: mean(words as f64),
                words,
            });
        }
        buckets.push(LengthBucket {
            label: labels[b].clone(),
            lo: if b == 0 { 0 } else { edges[b - 1] },
            hi: edges.get(b).copied(),
            sentences: n,
            mean_src_len: mean(src_total as f64),
            mean_ref_len: mean(ref_total),
            systems: sys,
        });
    }
    Ok(LengthGroups {
        signature: opts.signature(refs.len()),
        edges: edges.to_vec(),
        buckets,
    })
}

// ---------------------------------------------------------------------------------------------
// Translation dumps
// ---------------------------------------------------------------------------------------------

/// The number type of a dump's weights: `f32` where `translate` writes them (each value printed as the
/// shortest decimal that reads back as the same `f32`), `f64` where the analyses read them.
pub trait DumpFloat: Copy + Serialize + for<'de> Deserialize<'de> {
    const NAN: Self;
}

impl DumpFloat for f32 {
    const NAN: Self = f32::NAN;
}

impl DumpFloat for f64 {
    const NAN: Self = f64::NAN;
}

/// Deserialises a list of numbers where `null` (how JSON writers spell NaN) becomes NaN.
fn nullable_vec<'de, D: Deserializer<'de>, F: DumpFloat>(d: D) -> Result<Vec<F>, D::Error> {
    let v: Option<Vec<Option<F>>> = Option::deserialize(d)?;
    Ok(v.unwrap_or_default()
        .into_iter()
        .map(|x| x.unwrap_or(F::NAN))
        .collect())
}

fn nullable_matrix<'de, D: Deserializer<'de>, F: DumpFloat>(d: D) -> Result<Vec<Vec<F>>, D::Error> {
    let v: Option<Vec<Vec<Option<F>>>> = Option::deserialize(d)?;
    Ok(v.unwrap_or_default()
        .into_iter()
        .map(|r| r.into_iter().map(|x| x.unwrap_or(F::NAN)).collect())
        .collect())
}

fn nullable_tokens<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    let v: Option<Vec<String>> = Option::deserialize(d)?;
    Ok(v.unwrap_or_default())
}

/// One line of a translation dump: written by `cgnmt translate --dump FILE` (as `DumpRecord<f32>`) and read
/// by the analyses, plots and `reproduce` (as `DumpRecord`, in f64). The one definition of the format.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(bound(deserialize = "F: DumpFloat", serialize = "F: DumpFloat"))]
pub struct DumpRecord<F: DumpFloat = f64> {
    /// 0-based sentence index (the line's position when absent).
    #[serde(default)]
    pub id: Option<usize>,
    /// Source tokens (usually ending in `</s>`).
    #[serde(default, deserialize_with = "nullable_tokens")]
    pub src: Vec<String>,
    /// Output tokens (usually ending in `</s>`).
    #[serde(default, deserialize_with = "nullable_tokens")]
    pub hyp: Vec<String>,
    /// Model score (log-probability).
    #[serde(default)]
    pub score: Option<f64>,
    /// Attention weights: one row per output token, one weight per source token.
    #[serde(default, deserialize_with = "nullable_matrix")]
    pub attention: Vec<Vec<F>>,
    /// Mean gate value per output token except the final `</s>` (empty without a gate).
    #[serde(default, deserialize_with = "nullable_vec")]
    pub gates: Vec<F>,
    /// Final coverage per source token (may be empty).
    #[serde(default, deserialize_with = "nullable_vec")]
    pub coverage: Vec<F>,
}

impl DumpRecord {
    /// Mean of the finite gate values; `None` when there are none.
    pub fn mean_gate(&self) -> Option<f64> {
        mean_finite(&self.gates)
    }
}

/// Mean of the finite values of `v`; `None` when there are none.
pub fn mean_finite(v: &[f64]) -> Option<f64> {
    let (s, n) = v
        .iter()
        .filter(|x| x.is_finite())
        .fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    (n > 0).then(|| s / n as f64)
}

/// Parses a translation dump; blank lines are skipped, a malformed line is an error naming
/// `path` and its 1-based line. Records keep the file order; see [`dump_by_id`].
pub fn parse_dump(text: &str, path: &Path) -> Result<Vec<DumpRecord>, EvalError> {
    let mut out = Vec::new();
    for (k, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let mut r: DumpRecord = serde_json::from_str(line).map_err(|e| EvalError::JsonLine {
            path: path.to_path_buf(),
            line: k + 1,
            reason: format!("malformed dump record: {e}"),
        })?;
        if r.id.is_none() {
            r.id = Some(out.len());
        }
        out.push(r);
    }
    Ok(out)
}

/// Reads a translation dump file (see [`parse_dump`]).
pub fn read_dump(path: &Path) -> Result<Vec<DumpRecord>, EvalError> {
    let bytes = std::fs::read(path).map_err(|source| EvalError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let text = crate::io::lines_from_bytes(&bytes, path)?.join("\n");
    parse_dump(&text, path)
}

/// Orders dump records by `id` so that record `i` is sentence `i` of an `n`-sentence corpus;
/// missing, duplicate or out-of-range ids are errors naming the dump file.
pub fn dump_by_id(
    records: Vec<DumpRecord>,
    n: usize,
    path: &Path,
) -> Result<Vec<DumpRecord>, EvalError> {
    let bad = |reason: String| EvalError::InvalidOption(format!("{}: {reason}", path.display()));
    if records.len() != n {
        return Err(bad(format!(
            "dump has {} records but the text files have {n} lines",
            records.len()
        )));
    }
    let mut slots: Vec<Option<DumpRecord>> = vec![None; n];
    for r in records {
        let id = r.id.unwrap_or(usize::MAX);
        if id >= n {
            return Err(bad(format!("record id {id} out of range (0..{n})")));
        }
        if slots[id].is_some() {
            return Err(bad(format!("duplicate record id {id}")));
        }
        slots[id] = Some(r);
    }
    Ok(slots.into_iter().flatten().collect())
}

// ---------------------------------------------------------------------------------------------
// Gate analysis (Table 6)
// ---------------------------------------------------------------------------------------------

/// One sentence of the gate analysis.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GateSentence {
    /// 0-based sentence index.
    pub id: usize,
    /// Source length in words.
    pub src_len: usize,
    /// Mean gate value (`None`: the dump has no gate values for this sentence).
    pub gate: Option<f64>,
    /// Sentence BLEU of the baseline (0–100).
    pub bleu_baseline: f64,
    /// Sentence BLEU of the system (0–100).
    pub bleu_system: f64,
    /// `bleu_system - bleu_baseline`.
    pub improvement: f64,
}

/// A correlation over a subset of sentences.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Correlation {
    /// Which sentences (e.g. `all`, `src_len>=30`).
    pub subset: String,
    /// Number of sentences with a gate value in the subset.
    pub n: usize,
    /// Pearson's r, when defined.
    pub r: Option<f64>,
    /// Why `r` is undefined.
    pub note: Option<String>,
    /// Mean gate value of the subset.
    pub mean_gate: Option<f64>,
    /// Mean sentence-BLEU improvement of the subset.
    pub mean_improvement: Option<f64>,
}

/// Result of [`gate_analysis`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GateAnalysis {
    /// Signature of the sentence BLEU.
    pub signature: String,
    /// Long-sentence threshold (source words, inclusive).
    pub long: usize,
    /// Correlations: all sentences, then sentences with `src_len >= long`.
    pub correlations: Vec<Correlation>,
    /// Per-sentence values.
    pub sentences: Vec<GateSentence>,
}

fn correlation(subset: String, rows: &[&GateSentence]) -> Correlation {
    let (g, d): (Vec<f64>, Vec<f64>) = rows
        .iter()
        .filter_map(|s| s.gate.map(|g| (g, s.improvement)))
        .unzip();
    let n = g.len();
    let (r, note) = match pearson(&g, &d) {
        Ok(r) => (Some(r), None),
        Err(e) => (None, Some(e.to_string())),
    };
    Correlation {
        subset,
        n,
        r,
        note,
        mean_gate: mean_finite(&g),
        mean_improvement: mean_finite(&d),
    }
}

/// Per-sentence mean gate value against the sentence-BLEU improvement of `system` over
/// `baseline`, and their Pearson correlation over all sentences and over sentences with at
/// least `long` source words (paper Table 6).
///
/// `gates[i]` is the mean gate of sentence `i` (`None` when the dump has none); `opts` are the
/// sentence-BLEU options (e.g. [`BleuOptions::sentence`]). Undefined correlations (fewer than
/// two sentences, constant values) are reported in [`Correlation::note`], never as NaN.
pub fn gate_analysis(
    src: &[String],
    refs: &[Vec<String>],
    baseline: &[String],
    system: &[String],
    gates: &[Option<f64>],
    long: usize,
    opts: &BleuOptions,
) -> Result<GateAnalysis, EvalError> {
    if refs.is_empty() {
        return Err(EvalError::NoReferences);
    }
    if src.is_empty() {
        return Err(EvalError::EmptyCorpus);
    }
    for (k, r) in refs.iter().enumerate() {
        check_parallel(
            &format!("reference {} vs source", k + 1),
            src.len(),
            r.len(),
        )?;
    }
    check_parallel("baseline vs source", src.len(), baseline.len())?;
    check_parallel("system vs source", src.len(), system.len())?;
    check_parallel("gate values vs source", src.len(), gates.len())?;
    let mut sentences = Vec::with_capacity(src.len());
    for i in 0..src.len() {
        let r: Vec<String> = refs.iter().map(|r| r[i].clone()).collect();
        let b = sentence_bleu(&baseline[i], &r, opts)?.score;
        let s = sentence_bleu(&system[i], &r, opts)?.score;
        sentences.push(GateSentence {
            id: i,
            src_len: word_count(&src[i]),
            gate: gates[i].filter(|g| g.is_finite()),
            bleu_baseline: b,
            bleu_system: s,
            improvement: s - b,
        });
    }
    let all: Vec<&GateSentence> = sentences.iter().collect();
    let longs: Vec<&GateSentence> = sentences.iter().filter(|s| s.src_len >= long).collect();
    let correlations = vec![
        correlation("all".into(), &all),
        correlation(format!("src_len>={long}"), &longs),
    ];
    Ok(GateAnalysis {
        signature: opts.signature(refs.len()),
        long,
        correlations,
        sentences,
    })
}

// ---------------------------------------------------------------------------------------------
// Context scaling (Fig. 2a / Table 1)
// ---------------------------------------------------------------------------------------------

/// Label of a context-scaling setting, e.g. `(1.0, 0.5)`.
pub fn scale_label(a: f64, b: f64) -> String {
    let f = |x: f64| {
        if x.fract() == 0.0 && x.abs() < 1e15 {
            format!("{x:.1}")
        } else {
            format!("{x}")
        }
    };
    format!("({}, {})", f(a), f(b))
}

/// One context-scaling setting.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ScalingRun {
    /// Scale of the source context.
    pub a: f64,
    /// Scale of the target context.
    pub b: f64,
    /// Total output words.
    pub out_words: usize,
    /// Total source words.
    pub src_words: usize,
    /// Total reference words (mean over references).
    pub ref_words: f64,
    /// `out_words / src_words` (`None` if the source has no words).
    pub ratio_src: Option<f64>,
    /// `out_words / ref_words` (`None` if the references have no words).
    pub ratio_ref: Option<f64>,
    /// Corpus BLEU (0–100).
    pub bleu: f64,
}

/// Result of [`context_scaling`].
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContextScaling {
    /// BLEU signature.
    pub signature: String,
    /// One entry per setting, in the order given.
    pub runs: Vec<ScalingRun>,
}

/// Translation length ratios and BLEU of outputs decoded with the source context scaled by
/// `a` and the target context by `b` (paper Fig. 2a / Table 1). `runs` are `((a, b), outputs)`.
pub fn context_scaling(
    src: &[String],
    refs: &[Vec<String>],
    runs: &[((f64, f64), Vec<String>)],
    opts: &BleuOptions,
) -> Result<ContextScaling, EvalError> {
    if refs.is_empty() {
        return Err(EvalError::NoReferences);
    }
    if src.is_empty() {
        return Err(EvalError::EmptyCorpus);
    }
    for (k, r) in refs.iter().enumerate() {
        check_parallel(
            &format!("reference {} vs source", k + 1),
            src.len(),
            r.len(),
        )?;
    }
    let src_words: usize = src.iter().map(|s| word_count(s)).sum();
    let ref_words: f64 = refs
        .iter()
        .map(|r| r.iter().map(|s| word_count(s)).sum::<usize>() as f64)
        .sum::<f64>()
        / refs.len() as f64;
    let mut out = Vec::with_capacity(runs.len());
    for ((a, b), hyps) in runs {
        check_parallel(
            &format!("outputs of ({a}, {b}) vs source"),
            src.len(),
            hyps.len(),
        )?;
        let out_words: usize = hyps.iter().map(|s| word_count(s)).sum();
        let ratio = |d: f64| (d > 0.0).then(|| out_words as f64 / d);
        out.push(ScalingRun {
            a: *a,
            b: *b,
            out_words,
            src_words,
            ref_words,
            ratio_src: ratio(src_words as f64),
            ratio_ref: ratio(ref_words),
            bleu: corpus_bleu(hyps, refs, opts)?.score,
        });
    }
    Ok(ContextScaling {
        signature: opts.signature(refs.len()),
        runs: out,
    })
}

// ---------------------------------------------------------------------------------------------
// Training logs
// ---------------------------------------------------------------------------------------------

/// A periodic training line `{"step":N,"epoch":E,"seconds":S,"loss_per_token":L,"tgt_tok_per_s":T}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepPoint {
    /// Update step.
    pub step: f64,
    /// Epoch, if logged.
    pub epoch: Option<f64>,
    /// Wall-clock seconds, if logged.
    pub seconds: Option<f64>,
    /// Training loss per target token.
    pub loss_per_token: f64,
    /// Throughput, if logged.
    pub tgt_tok_per_s: Option<f64>,
}

/// An evaluation line `{"eval":N,"epoch":E,"seconds":S,"loss_per_token":L,"dev_bleu":B}`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct EvalPoint {
    /// Step of the evaluation.
    pub step: f64,
    /// Epoch, if logged.
    pub epoch: Option<f64>,
    /// Wall-clock seconds, if logged.
    pub seconds: Option<f64>,
    /// Dev loss per token, if logged.
    pub loss_per_token: Option<f64>,
    /// Dev BLEU, if logged.
    pub dev_bleu: Option<f64>,
}

/// A parsed training log.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct TrainingLog {
    /// Periodic training lines.
    pub steps: Vec<StepPoint>,
    /// Evaluation lines.
    pub evals: Vec<EvalPoint>,
}

/// Parses a `train.log` (JSON lines). Lines with a `step` key are training points (they need a
/// numeric `loss_per_token`), lines with an `eval` key are evaluations; other JSON objects
/// (e.g. a logged configuration) and blank lines are skipped. Anything that is not a JSON
/// object is an error naming `path` and the 1-based line.
pub fn parse_training_log(text: &str, path: &Path) -> Result<TrainingLog, EvalError> {
    let mut log = TrainingLog::default();
    for (k, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let err = |reason: String| EvalError::JsonLine {
            path: path.to_path_buf(),
            line: k + 1,
            reason,
        };
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|e| err(format!("malformed JSON: {e}")))?;
        let obj = v
            .as_object()
            .ok_or_else(|| err("expected a JSON object".into()))?;
        let num = |key: &str| -> Result<Option<f64>, EvalError> {
            match obj.get(key) {
                None | Some(serde_json::Value::Null) => Ok(None),
                Some(x) => x
                    .as_f64()
                    .map(Some)
                    .ok_or_else(|| err(format!("`{key}` is not a number: {x}"))),
            }
        };
        if obj.contains_key("step") {
            let step = num("step")?.ok_or_else(|| err("`step` is null".into()))?;
            let loss = num("loss_per_token")?
                .ok_or_else(|| err("training line without `loss_per_token`".into()))?;
            log.steps.push(StepPoint {
                step,
                epoch: num("epoch")?,
                seconds: num("seconds")?,
                loss_per_token: loss,
                tgt_tok_per_s: num("tgt_tok_per_s")?,
            });
        } else if obj.contains_key("eval") {
            let step = num("eval")?.ok_or_else(|| err("`eval` is null".into()))?;
            log.evals.push(EvalPoint {
                step,
                epoch: num("epoch")?,
                seconds: num("seconds")?,
                loss_per_token: num("loss_per_token")?,
                dev_bleu: num("dev_bleu")?,
            });
        }
    }
    Ok(log)
}

/// Reads a training log file (see [`parse_training_log`]).
pub fn read_training_log(path: &Path) -> Result<TrainingLog, EvalError> {
    let bytes = std::fs::read(path).map_err(|source| EvalError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let text = crate::io::lines_from_bytes(&bytes, path)?.join("\n");
    parse_training_log(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(v: &[&str]) -> Vec<String> {
        v.iter().map(|x| x.to_string()).collect()
    }

    #[test]
    fn pearson_hand_computed() {
        // x = 1,2,3,4; y = 2,4,5,4: mx = 2.5, my = 3.75; sxy = 3.5, sxx = 5, syy = 4.75.
        let r = pearson(&[1.0, 2.0, 3.0, 4.0], &[2.0, 4.0, 5.0, 4.0]).unwrap();
        let want = 3.5 / (5.0f64.sqrt() * 4.75f64.sqrt());
        assert!((r - want).abs() < 1e-12, "{r} vs {want}");
        assert!((want - 0.718_184_5).abs() < 1e-6);
        assert!((pearson(&[1.0, 2.0, 3.0], &[6.0, 4.0, 2.0]).unwrap() + 1.0).abs() < 1e-12);
        assert!((pearson(&[0.1, 0.2], &[5.0, 7.0]).unwrap() - 1.0).abs() < 1e-12);
        assert_eq!(pearson(&[1.0], &[2.0]), Err(PearsonError::TooFew(1)));
        assert_eq!(pearson(&[], &[]), Err(PearsonError::TooFew(0)));
        assert_eq!(
            pearson(&[0.5, 0.5, 0.5], &[1.0, 2.0, 3.0]),
            Err(PearsonError::ZeroVariance("x"))
        );
        assert_eq!(
            pearson(&[1.0, 2.0], &[3.0, 3.0]),
            Err(PearsonError::ZeroVariance("y"))
        );
        assert_eq!(
            pearson(&[1.0, 2.0], &[3.0]),
            Err(PearsonError::LengthMismatch(2, 1))
        );
        assert_eq!(
            pearson(&[1.0, f64::NAN], &[3.0, 4.0]),
            Err(PearsonError::NonFinite)
        );
        assert!(PearsonError::TooFew(1).to_string().contains("at least 2"));
    }

    #[test]
    fn buckets_and_labels() {
        let e = DEFAULT_EDGES;
        assert_eq!(bucket_index(0, &e), 0);
        assert_eq!(bucket_index(9, &e), 0);
        assert_eq!(bucket_index(10, &e), 1);
        assert_eq!(bucket_index(29, &e), 2);
        assert_eq!(bucket_index(50, &e), 5);
        assert_eq!(bucket_index(400, &e), 5);
        assert_eq!(
            bucket_labels(&e),
            vec!["<10", "10-20", "20-30", "30-40", "40-50", "≥50"]
        );
        assert_eq!(bucket_labels(&[3]), vec!["<3", "≥3"]);
        assert!(check_edges(&[]).is_err());
        assert!(check_edges(&[0, 5]).is_err());
        assert!(check_edges(&[5, 5]).is_err());
        assert!(check_edges(&[10, 5]).is_err());
        assert!(check_edges(&[2, 4]).is_ok());
    }

    #[test]
    fn length_groups_hand_computed() {
        // Edges [3]: sentences 0 and 2 have 2 source words (<3), sentence 1 has 4 (≥3).
        let src = s(&["a b", "a b c d", "c d"]);
        let refs = vec![s(&[
            "the cat sat on the mat",
            "one two three four",
            "x y z w",
        ])];
        let sys_a = s(&["the cat sat on the mat", "one two three four", "p q"]);
        let sys_b = s(&["dog", "one two three four five", "x y z w"]);
        let opts = BleuOptions::mteval_v11b();
        let g = length_groups(
            &src,
            &refs,
            &[("A".into(), sys_a.clone()), ("B".into(), sys_b)],
            &[3],
            &opts,
        )
        .unwrap();
        assert_eq!(g.buckets.len(), 2);
        let short = &g.buckets[0];
        assert_eq!(
            (short.label.as_str(), short.lo, short.hi),
            ("<3", 0, Some(3))
        );
        assert_eq!(short.sentences, 2);
        assert_eq!(short.mean_src_len, Some(2.0));
        assert_eq!(short.mean_ref_len, Some(5.0));
        // A, short bucket: "the cat sat on the mat" (exact: 6,5,4,3 n-grams) + "p q" (2,1,0,0
        // n-grams, no match): matches 6,5,4,3 of 8,6,4,3; ref len 6+4 = 10, hyp len 8.
        let p = [6.0 / 8.0, 5.0 / 6.0, 4.0 / 4.0, 3.0 / 3.0];
        let geo = (p.iter().map(|x: &f64| x.ln()).sum::<f64>() / 4.0).exp();
        let want = 100.0 * (1.0f64 - 10.0 / 8.0).exp() * geo;
        let a = &short.systems[0];
        assert_eq!(a.name, "A");
        assert!(
            (a.bleu.unwrap() - want).abs() < 1e-9,
            "{:?} vs {want}",
            a.bleu
        );
        assert_eq!(a.words, 8);
        assert_eq!(a.mean_len, Some(4.0));
        // B, short bucket: "dog" + "x y z w" (exact): matches 4,3,2,1 of totals 5,3,2,1; ref 10 hyp 5.
        let p = [4.0 / 5.0, 1.0, 1.0, 1.0];
        let geo = (p.iter().map(|x: &f64| x.ln()).sum::<f64>() / 4.0).exp();
        let want = 100.0 * (1.0f64 - 10.0 / 5.0).exp() * geo;
        assert!((short.systems[1].bleu.unwrap() - want).abs() < 1e-9);
        assert_eq!(short.systems[1].mean_len, Some(2.5));
        // Long bucket: A exact -> 100; B one extra word: 4/5, 3/4, 2/3, 1/2, BP 1.
        let long = &g.buckets[1];
        assert_eq!((long.sentences, long.hi), (1, None));
        assert!((long.systems[0].bleu.unwrap() - 100.0).abs() < 1e-9);
        let p = [0.8f64, 0.75, 2.0 / 3.0, 0.5];
        let want = 100.0 * (p.iter().map(|x| x.ln()).sum::<f64>() / 4.0).exp();
        assert!((long.systems[1].bleu.unwrap() - want).abs() < 1e-9);
        assert_eq!(long.systems[1].mean_len, Some(5.0));
        assert!(g.signature.contains("nrefs:1"));

        // Empty buckets get None, not NaN; mismatched inputs are errors.
        let g = length_groups(
            &src,
            &refs,
            &[("A".into(), sys_a.clone())],
            &[10, 20],
            &opts,
        )
        .unwrap();
        assert_eq!(g.buckets[0].sentences, 3);
        assert_eq!(g.buckets[1].systems[0].bleu, None);
        assert_eq!(g.buckets[2].mean_src_len, None);
        let e = length_groups(&src, &refs, &[("A".into(), s(&["x"]))], &[3], &opts).unwrap_err();
        assert!(e.to_string().contains("system A"), "{e}");
        assert!(length_groups(&src, &[], &[], &[3], &opts).is_err());
        assert!(length_groups(&src, &refs, &[], &[], &opts).is_err());
    }

    #[test]
    fn gate_analysis_hand_computed() {
        let src = s(&["a b c", "a b c d e", "a", "a b c d e f"]);
        let refs = vec![s(&["w x y z", "w x y z", "w x y z", "w x y z"])];
        let base = s(&["q", "q", "w x y z", "q"]);
        let sys = s(&["w x y z", "q", "q", "w x y z"]);
        let gates = vec![Some(0.8), Some(0.5), None, Some(0.6)];
        let opts = BleuOptions::sentence();
        let a = gate_analysis(&src, &refs, &base, &sys, &gates, 5, &opts).unwrap();
        let imp: Vec<f64> = a.sentences.iter().map(|x| x.improvement).collect();
        // "q" scores 0 (no unigram match), "w x y z" 100.
        for (got, want) in imp.iter().zip([100.0, 0.0, -100.0, 100.0]) {
            assert!((got - want).abs() < 1e-9, "{imp:?}");
        }
        assert_eq!(a.sentences[2].gate, None);
        let all = &a.correlations[0];
        assert_eq!((all.subset.as_str(), all.n), ("all", 3));
        // gates 0.8, 0.5, 0.6 vs 100, 0, 100: mx = 19/30, my = 200/3.
        let want = pearson(&[0.8, 0.5, 0.6], &[100.0, 0.0, 100.0]).unwrap();
        assert!((all.r.unwrap() - want).abs() < 1e-12);
        // dx = 1/6, -2/15, -1/30; dy = 100/3, -200/3, 100/3 -> sxy = 100/3*(1/6+4/15-1/30)=40/3
        // sxx = 1/36+4/225+1/900 = 0.046666.., syy = 20000/3 -> r = 0.7559289...
        assert!((want - 0.755_928_946).abs() < 1e-6, "{want}");
        assert!((all.mean_gate.unwrap() - 19.0 / 30.0).abs() < 1e-12);
        // Long (>= 5 words): sentences 1 and 3 -> gates 0.5, 0.6 vs 0, 100 -> r = 1.
        let long = &a.correlations[1];
        assert_eq!((long.subset.as_str(), long.n), ("src_len>=5", 2));
        assert!((long.r.unwrap() - 1.0).abs() < 1e-12);
        // Threshold leaving one sentence: a note, no NaN.
        let a = gate_analysis(&src, &refs, &base, &sys, &gates, 6, &opts).unwrap();
        assert_eq!(a.correlations[1].r, None);
        assert!(a.correlations[1]
            .note
            .as_deref()
            .unwrap()
            .contains("at least 2"));
        // No gates at all.
        let a = gate_analysis(&src, &refs, &base, &sys, &[None; 4], 5, &opts).unwrap();
        assert_eq!(a.correlations[0].n, 0);
        assert!(a.correlations[0].note.is_some());
        assert!(gate_analysis(&src, &refs, &base, &sys, &gates[..3], 5, &opts).is_err());
    }

    #[test]
    fn context_scaling_hand_computed() {
        let src = s(&["a b c", "d e"]);
        let refs = vec![s(&["x y z w", "u v"]), s(&["x y", "u v"])];
        let runs = vec![
            ((1.0, 1.0), s(&["x y z w", "u v"])),
            ((1.0, 0.5), s(&["x y z w x y z w", "u v u"])),
        ];
        let c = context_scaling(&src, &refs, &runs, &BleuOptions::mteval_v11b()).unwrap();
        assert_eq!(c.runs.len(), 2);
        let r0 = &c.runs[0];
        assert_eq!((r0.out_words, r0.src_words), (6, 5));
        assert_eq!(r0.ref_words, 5.0); // (6 + 4) / 2
        assert!((r0.ratio_src.unwrap() - 1.2).abs() < 1e-12);
        assert!((r0.ratio_ref.unwrap() - 1.2).abs() < 1e-12);
        assert!((r0.bleu - 100.0).abs() < 1e-9);
        let r1 = &c.runs[1];
        assert_eq!(r1.out_words, 11);
        assert!((r1.ratio_src.unwrap() - 2.2).abs() < 1e-12);
        assert!(r1.bleu < 100.0);
        assert_eq!((r1.a, r1.b), (1.0, 0.5));
        assert_eq!(scale_label(1.0, 0.5), "(1.0, 0.5)");
        assert_eq!(scale_label(0.25, 2.0), "(0.25, 2.0)");
        let bad = vec![((1.0, 1.0), s(&["x"]))];
        assert!(context_scaling(&src, &refs, &bad, &BleuOptions::mteval_v11b()).is_err());
    }

    #[test]
    fn dumps_parse_and_order() {
        let p = Path::new("d.jsonl");
        let text = concat!(
            r#"{"id":1,"src":["我","爱","</s>"],"hyp":["I","love","</s>"],"score":-1.5,"attention":[[0.9,0.1,0.0],[0.1,0.8,0.1],[0,0,1]],"gates":[0.2,0.4],"coverage":[1.0,0.9,1.1]}"#,
            "\n\n",
            r#"{"id":0,"src":["</s>"],"hyp":["</s>"],"attention":[[1.0]],"gates":[],"coverage":[]}"#,
            "\n"
        );
        let d = parse_dump(text, p).unwrap();
        assert_eq!(d.len(), 2);
        assert_eq!(d[0].mean_gate(), Some(0.30000000000000004));
        assert_eq!(d[1].mean_gate(), None);
        let d = dump_by_id(d, 2, p).unwrap();
        assert_eq!(d[0].id, Some(0));
        assert_eq!(d[1].hyp, s(&["I", "love", "</s>"]));
        // Missing keys and nulls are tolerated.
        let d = parse_dump(r#"{"gates":[0.5,null],"attention":null}"#, p).unwrap();
        assert_eq!(d[0].id, Some(0));
        assert_eq!(d[0].mean_gate(), Some(0.5));
        assert!(d[0].attention.is_empty());
        // Malformed line: file and line.
        let e = parse_dump("{\"id\":0}\n{\"id\":1,\"gates\":[0.1,\n", p).unwrap_err();
        assert!(e.to_string().starts_with("d.jsonl:2:"), "{e}");
        let e = parse_dump("{\"id\":0,\"gates\":\"x\"}\n", p).unwrap_err();
        assert!(e.to_string().starts_with("d.jsonl:1:"), "{e}");
        // Bad ids.
        let two = parse_dump("{\"id\":0}\n{\"id\":0}\n", p).unwrap();
        assert!(dump_by_id(two.clone(), 2, p)
            .unwrap_err()
            .to_string()
            .contains("duplicate"));
        assert!(dump_by_id(two, 3, p)
            .unwrap_err()
            .to_string()
            .contains("3 lines"));
        let far = parse_dump("{\"id\":7}\n", p).unwrap();
        assert!(dump_by_id(far, 1, p)
            .unwrap_err()
            .to_string()
            .contains("out of range"));
    }

    #[test]
    fn training_log_parses() {
        let p = Path::new("train.log");
        let text = concat!(
            r#"{"config":{"lr":1.0}}"#,
            "\n",
            r#"{"step":100,"epoch":0,"seconds":12.5,"loss_per_token":5.25,"tgt_tok_per_s":900}"#,
            "\n",
            r#"{"step":200,"epoch":0,"seconds":25,"loss_per_token":4.5}"#,
            "\n\n",
            r#"{"eval":200,"epoch":0,"seconds":30,"loss_per_token":4.75,"dev_bleu":3.5}"#,
            "\n"
        );
        let log = parse_training_log(text, p).unwrap();
        assert_eq!(log.steps.len(), 2);
        assert_eq!(log.steps[0].step, 100.0);
        assert_eq!(log.steps[1].loss_per_token, 4.5);
        assert_eq!(log.steps[1].tgt_tok_per_s, None);
        assert_eq!(log.evals.len(), 1);
        assert_eq!(log.evals[0].dev_bleu, Some(3.5));
        let e = parse_training_log("{\"step\":1,\"loss_per_token\":2}\nnot json\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("train.log:2:"), "{e}");
        let e = parse_training_log("{\"step\":1}\n", p)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("train.log:1:") && e.contains("loss_per_token"),
            "{e}"
        );
        let e = parse_training_log("[1,2]\n", p).unwrap_err().to_string();
        assert!(e.contains("JSON object"), "{e}");
        let e = parse_training_log("{\"step\":\"x\",\"loss_per_token\":1}\n", p)
            .unwrap_err()
            .to_string();
        assert!(e.contains("`step` is not a number"), "{e}");
    }
}
