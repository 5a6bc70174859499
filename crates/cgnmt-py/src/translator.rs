//! `Translator`: a model directory (or an ensemble) opened for translation, scoring and alignment, with
//! CTranslate2's names (`translate_batch`, `translate_iterable`, `translate_file`, `score_batch`) over cgnmt's
//! own calls. Each default is written once, in the signature of the call that owns it: CTranslate2's names
//! pass on only what they set.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use cgnmt::decode::alignment::AlignmentMode;
use cgnmt::{InputLimit, LongInput, ShortlistOptions, TranslateOptions, TranslatorOptions};

use crate::convert::{json_to_py, Lines, PhraseLists};
use crate::errors::{guarded, interruptible, py_err};
use crate::model::{model_info, vocabulary};
use crate::results::{
    Alignment, Score, ScoringResult, Translation, TranslationResult, TranslationStats, Wanted,
};
use crate::streaming::{translate_file, TranslationIterator};

/// One model directory or a list of them (an ensemble).
#[derive(FromPyObject)]
pub enum ModelDirs {
    One(PathBuf),
    Many(Vec<PathBuf>),
}

/// A sentence as raw text or as the model's tokens (CTranslate2 takes tokens).
#[derive(FromPyObject)]
pub enum Sentence {
    Text(String),
    Tokens(Vec<String>),
}

/// `sentences` as text lines, and whether they are token lists (all one kind, or an error naming `what`).
pub fn sentence_lines(what: &str, sentences: Vec<Sentence>) -> PyResult<(Vec<String>, bool)> {
    let tokens = matches!(sentences.first(), Some(Sentence::Tokens(_)));
    sentences
        .into_iter()
        .map(|s| match (s, tokens) {
            (Sentence::Text(t), false) => Ok(t),
            (Sentence::Tokens(t), true) => Ok(t.join(" ")),
            _ => Err(PyValueError::new_err(format!(
                "{what}: all token lists or all strings, not both"
            ))),
        })
        .collect::<PyResult<Vec<_>>>()
        .map(|l| (l, tokens))
}

/// A trained model (or an ensemble of models sharing vocabularies) opened for translation.
///
/// `model_dir` is a model directory written by `cgnmt train` (a run directory means its `best/` model), or a
/// list of them for an ensemble (log-probabilities averaged at every step). `threads`: the threads of the
/// matrix products (0: the physical cores; process-wide). `int8`: the decoder's per-step products in 8-bit
/// integers (faster, approximate; x86-64 with AVX2). `shortlist`: a lexicon from `cgnmt shortlist`, to decode
/// each batch over the most frequent target words and each source word's most probable translations (faster,
/// approximate).
///
/// Raises `FileNotFoundError` when a directory or the lexicon is missing, `ValueError` when a model directory
/// is damaged or an ensemble's models do not share vocabularies.
#[pyclass(frozen, module = "cgnmt")]
pub struct Translator {
    pub inner: Arc<cgnmt::Translator>,
}

#[pymethods]
impl Translator {
    #[new]
    #[pyo3(signature = (model_dir, threads=0, int8=false, shortlist=None, shortlist_frequent=100,
        shortlist_per_word=50))]
    fn new(
        py: Python<'_>,
        model_dir: ModelDirs,
        threads: i64,
        int8: bool,
        shortlist: Option<PathBuf>,
        shortlist_frequent: usize,
        shortlist_per_word: usize,
    ) -> PyResult<Self> {
        let dirs = match model_dir {
            ModelDirs::One(d) => vec![d],
            ModelDirs::Many(d) => d,
        };
        if threads < 0 {
            return Err(PyValueError::new_err(format!(
                "threads {threads}: 0 (the physical cores) or more"
            )));
        }
        if threads > 0 {
            cgnmt::kernels::set_threads(threads as usize);
        }
        let opts = TranslatorOptions {
            int8,
            shortlist: shortlist.map(|lexicon| ShortlistOptions {
                lexicon,
                frequent: shortlist_frequent,
                per_word: shortlist_per_word,
            }),
        };
        // Decoding runs a batch per thread, each doing its own elementwise work (as `cgnmt translate`).
        if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
            std::env::set_var("CANDLE_NUM_THREADS", "1");
        }
        let inner =
            py.allow_threads(|| guarded(|| cgnmt::Translator::open(&dirs, &opts).map_err(py_err)))?;
        Ok(Translator {
            inner: Arc::new(inner),
        })
    }

    /// The directories of the models read (a run directory's `best/`), the first one first.
    #[getter]
    fn model_dirs(&self) -> Vec<PathBuf> {
        self.inner.members().iter().map(|m| m.dir.clone()).collect()
    }

    /// The decoding settings chosen on dev that the (first) model keeps (`decoding.toml`, written by
    /// `cgnmt select --tune` and the demo): `length_penalty`, `coverage_penalty`, `beam`, `dev_bleu`,
    /// `dev_sentences`; `None` when it keeps none. `translate` decodes with its penalties unless given others.
    #[getter]
    fn decoding_settings(&self, py: Python<'_>) -> PyResult<Option<PyObject>> {
        self.inner
            .settings()
            .map(|s| {
                let v = serde_json::json!({
                    "length_penalty": s.length_penalty, "coverage_penalty": s.coverage_penalty,
                    "beam": s.beam, "dev_bleu": s.dev_bleu, "dev_sentences": s.dev_sentences,
                });
                json_to_py(py, &v)
            })
            .transpose()
    }

    /// What opening noticed: int8 unavailable on this CPU, a shortlist that matches nothing.
    #[getter]
    fn notes(&self) -> Vec<String> {
        self.inner.notes().to_vec()
    }

    /// Translate `sentences` (raw text, or whitespace-tokenised with `pretokenized`): one `Translation` per
    /// sentence, in order; an empty sentence gives an empty translation.
    ///
    /// `beam`: the beam size (1: greedy). `nbest`: hypotheses per sentence (at most `beam`). `length_penalty`:
    /// GNMT's α (0: rank by total log-probability, GroundHog's way); `coverage_penalty`: GNMT's β; `None` (the
    /// default) takes the value chosen on dev that the model keeps (`decoding_settings`), else 0.
    /// `length_norm`: rank by log-probability per word instead. `context_scale`: `(a, b)` scales the
    /// source-context terms by `a` and the target-side terms by `b` at every step (the paper's Figure 2).
    /// `batch`: sentences decoded together. `max_input_words`: a longer input (in model tokens) is translated
    /// in pieces (`long_input = "split"`) or cut (`"truncate"`); 0: no limit. `return_word_scores`: each output
    /// word's log-probability and mean gate value; `alignment`: `"hard"`, `"soft"` or a probability (e.g.
    /// `"0.2"`), the word alignment from attention (see `Translation`). `target_prefix`: one string per
    /// sentence (empty for none), the words each output must start with (raw text, or tokens with
    /// `pretokenized`); the search goes on from them. `constraints`: one list of phrases per sentence (empty
    /// for none) that its output must contain, each once, in any order (lexically constrained decoding by
    /// dynamic beam allocation, the beam fixed); `avoid`: one list of phrases per sentence that its output must
    /// never contain. An output that could not meet all its constraints within the length limit has
    /// `unmet_constraints` > 0. `max_decoding_length`: at most this many output tokens (`None`: three times the
    /// source's tokens plus one); `min_decoding_length`: no end of sentence before this many (`None`: half the
    /// source's tokens plus one; never above the maximum).
    ///
    /// Raises `ValueError` for an option out of its range (a beam of 0, a negative penalty, a context scale
    /// outside [0, 4]).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (sentences, beam=10, nbest=1, length_penalty=None, coverage_penalty=None,
        length_norm=false, context_scale=(1.0, 1.0), pretokenized=false, return_attention=false,
        return_gates=false, return_coverage=false, batch=32, max_input_words=200, long_input="split",
        return_word_scores=false, alignment=None, target_prefix=None, constraints=None, avoid=None,
        max_decoding_length=None, min_decoding_length=None))]
    fn translate(
        &self,
        py: Python<'_>,
        sentences: Lines,
        beam: usize,
        nbest: usize,
        length_penalty: Option<f64>,
        coverage_penalty: Option<f64>,
        length_norm: bool,
        context_scale: (f64, f64),
        pretokenized: bool,
        return_attention: bool,
        return_gates: bool,
        return_coverage: bool,
        batch: usize,
        max_input_words: usize,
        long_input: &str,
        return_word_scores: bool,
        alignment: Option<String>,
        target_prefix: Option<Lines>,
        constraints: Option<PhraseLists>,
        avoid: Option<PhraseLists>,
        max_decoding_length: Option<usize>,
        min_decoding_length: Option<usize>,
    ) -> PyResult<Vec<Translation>> {
        let sentences = sentences.0;
        let long_input = match long_input {
            "split" => LongInput::Split,
            "truncate" => LongInput::Truncate,
            x => {
                return Err(PyValueError::new_err(format!(
                    "long_input {x:?}: \"split\" or \"truncate\""
                )))
            }
        };
        let alignment = alignment
            .map(|a| a.parse::<AlignmentMode>())
            .transpose()
            .map_err(|e| PyValueError::new_err(format!("alignment {e}")))?;
        let wanted = Wanted {
            attention: return_attention,
            gates: return_gates,
            coverage: return_coverage,
            word_scores: return_word_scores,
            alignment,
        };
        let stop = Arc::new(AtomicBool::new(false));
        // The model's penalties chosen on dev, unless given.
        let model = self.inner.options();
        let opts = TranslateOptions {
            beam,
            nbest,
            length_norm,
            length_penalty: length_penalty.unwrap_or(model.length_penalty),
            coverage_penalty: coverage_penalty.unwrap_or(model.coverage_penalty),
            context_scale,
            record: return_attention || return_gates || return_coverage,
            word_scores: return_word_scores,
            alignment,
            target_prefix: target_prefix.map(|l| l.0).unwrap_or_default(),
            constraints: constraints.map(|l| l.0).unwrap_or_default(),
            avoid: avoid.map(|l| l.0).unwrap_or_default(),
            full_beam: false,
            word_table: true,
            batch,
            pretokenized,
            input_limit: InputLimit {
                max_words: max_input_words,
                long_input,
            },
            stop: Some(stop.clone()),
            max_decoding_length,
            min_decoding_length,
        };
        self.inner
            .decode_options(&opts, str::to_string)
            .map_err(py_err)?;
        if !opts.steering().is_empty() {
            self.inner
                .pipeline()
                .check_steering(&sentences, opts.steering(), pretokenized, opts.input_limit)
                .map_err(py_err)?;
        }
        let tr = self.inner.clone();
        let out = interruptible(py, &stop, || {
            // In chunks as `cgnmt translate` decodes a file: the same batches, the same outputs.
            let chunk = 1024usize.max(4 * batch);
            let mut out = Vec::with_capacity(sentences.len());
            for (k, part) in sentences.chunks(chunk).enumerate() {
                let o = opts.for_lines(k * chunk..k * chunk + part.len());
                out.extend(tr.translate(part, &o).map_err(py_err)?);
            }
            Ok(out)
        })?;
        out.iter()
            .map(|t| Translation::of(py, &self.inner, t, wanted))
            .collect()
    }

    /// CTranslate2's `Translator.translate_batch`: `source` is a list of token lists (the model's tokens, as
    /// CTranslate2 takes them) or of raw strings; `target_prefix` one token list (or `None`) per sentence.
    /// Returns one `TranslationResult` per sentence: `hypotheses` (`num_hypotheses` token lists), `scores`
    /// (their log-probabilities, with `return_scores`), `attention` (the best hypothesis's target × source
    /// weights, with `return_attention`). `length_penalty` is GNMT's α (`None`: the model's, as in
    /// `translate`); `max_batch_size` 0 decodes `translate`'s batch at a time.
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (source, target_prefix=None, max_batch_size=0, beam_size=10, num_hypotheses=1,
        length_penalty=None, coverage_penalty=None, max_decoding_length=None, min_decoding_length=None,
        return_scores=true, return_attention=false))]
    fn translate_batch(
        slf: &Bound<'_, Self>,
        source: Vec<Sentence>,
        target_prefix: Option<Vec<Option<Sentence>>>,
        max_batch_size: usize,
        beam_size: usize,
        num_hypotheses: usize,
        length_penalty: Option<f64>,
        coverage_penalty: Option<f64>,
        max_decoding_length: Option<usize>,
        min_decoding_length: Option<usize>,
        return_scores: bool,
        return_attention: bool,
    ) -> PyResult<Vec<TranslationResult>> {
        let py = slf.py();
        let n = source.len();
        let (sentences, tokens) = sentence_lines("source", source)?;
        let kw = PyDict::new(py);
        if let Some(prefix) = target_prefix {
            if prefix.len() != n {
                return Err(PyValueError::new_err(format!(
                    "target_prefix: {} entries for {n} sentences",
                    prefix.len()
                )));
            }
            let lines = prefix
                .into_iter()
                .map(|p| match (p, tokens) {
                    (None, _) => Ok(String::new()),
                    (Some(Sentence::Text(t)), false) => Ok(t),
                    (Some(Sentence::Tokens(t)), true) => Ok(t.join(" ")),
                    _ => Err(PyValueError::new_err(
                        "target_prefix: strings for string sources, token lists for token lists",
                    )),
                })
                .collect::<PyResult<Vec<String>>>()?;
            kw.set_item("target_prefix", lines)?;
        }
        if max_batch_size > 0 {
            kw.set_item("batch", max_batch_size)?;
        }
        kw.set_item("beam", beam_size)?;
        kw.set_item("nbest", num_hypotheses)?;
        kw.set_item("length_penalty", length_penalty)?;
        kw.set_item("coverage_penalty", coverage_penalty)?;
        kw.set_item("max_decoding_length", max_decoding_length)?;
        kw.set_item("min_decoding_length", min_decoding_length)?;
        kw.set_item("pretokenized", tokens)?;
        kw.set_item("return_attention", return_attention)?;
        let out = slf.call_method("translate", (sentences,), Some(&kw))?;
        let mut results = Vec::with_capacity(n);
        for t in out.try_iter()? {
            let t = t?.downcast_into::<Translation>()?;
            let t = t.get();
            let attention = match (&t.attention, return_attention) {
                (Some(a), true) => Some(a.bind(py).call_method0("tolist")?.extract()?),
                _ => None,
            };
            results.push(TranslationResult::of(
                t,
                num_hypotheses,
                return_scores,
                attention,
            ));
        }
        Ok(results)
    }

    /// CTranslate2's `translate_iterable`: translate a stream of sentences (raw strings or token lists) and
    /// yield one `TranslationResult` per sentence, in order, holding only `16 · max_batch_size` sentences at a
    /// time (a file of any length in bounded memory). `kwargs` as `translate_batch`'s.
    #[pyo3(signature = (source, max_batch_size=32, batch_type="examples", **kwargs))]
    fn translate_iterable(
        slf: &Bound<'_, Self>,
        source: &Bound<'_, PyAny>,
        max_batch_size: usize,
        batch_type: &str,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<TranslationIterator> {
        TranslationIterator::new(slf, source, max_batch_size, batch_type, kwargs)
    }

    /// CTranslate2's `translate_file`: translate the raw text lines of `source_path` (UTF-8, plain or gzipped) into
    /// `output_path`, one line per input line (the best hypothesis, detokenised), `16 · max_batch_size` lines
    /// at a time. The output is written to a temporary file and renamed into place when every line is done
    /// (nothing partial is left). `kwargs` as `translate`'s (`beam_size` is `beam`). Returns the counts and the
    /// time taken.
    #[pyo3(signature = (source_path, output_path, max_batch_size=32, **kwargs))]
    fn translate_file(
        slf: &Bound<'_, Self>,
        source_path: PathBuf,
        output_path: PathBuf,
        max_batch_size: usize,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<TranslationStats> {
        translate_file(slf, &source_path, &output_path, max_batch_size, kwargs)
    }

    /// Score given translations: each target's log-probability given its source, word by word, by forced
    /// decoding (with an ensemble, the mean of its models' log-probabilities). Raw text on both sides goes
    /// through the model's tokenisers and subwords; with `pretokenized` both are split on whitespace and taken
    /// as the model's tokens (as `Translation.tokens`). A hypothesis of `translate` scores here its `score`
    /// (the search's total log-probability, before penalties).
    #[pyo3(signature = (sources, targets, pretokenized=false, context_scale=(1.0, 1.0), batch=32))]
    fn score(
        &self,
        py: Python<'_>,
        sources: Lines,
        targets: Lines,
        pretokenized: bool,
        context_scale: (f64, f64),
        batch: usize,
    ) -> PyResult<Vec<Score>> {
        let (sources, targets) = (sources.0, targets.0);
        let o = cgnmt::ScoreOptions {
            pretokenized,
            context_scale,
            batch,
        };
        // Checked once before the work (the same messages as the library's).
        self.inner.score(&[], &[], &o).map_err(py_err)?;
        if sources.len() != targets.len() {
            return Err(PyValueError::new_err(format!(
                "{} source sentences but {} targets: score needs one target per source",
                sources.len(),
                targets.len()
            )));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let tr = self.inner.clone();
        let out = interruptible(py, &stop, || {
            let mut out = Vec::with_capacity(sources.len());
            // Chunks of a few batches, so that Ctrl-C is honoured between them.
            let chunk = batch.saturating_mul(8);
            for (s, t) in sources.chunks(chunk).zip(targets.chunks(chunk)) {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                out.extend(tr.score(s, t, &o).map_err(py_err)?);
            }
            Ok(out)
        })?;
        out.iter().map(|s| Score::of(py, s)).collect()
    }

    /// CTranslate2's `score_batch`: each target's tokens and their log-probabilities given its source (token
    /// lists, or raw strings, on both sides alike); see `score`. `max_batch_size` 0 scores `score`'s batch at
    /// a time.
    #[pyo3(signature = (source, target, max_batch_size=0))]
    fn score_batch(
        slf: &Bound<'_, Self>,
        source: Vec<Sentence>,
        target: Vec<Sentence>,
        max_batch_size: usize,
    ) -> PyResult<Vec<ScoringResult>> {
        let (sources, tokens) = sentence_lines("source", source)?;
        let (targets, target_tokens) = sentence_lines("target", target)?;
        if tokens != target_tokens && !targets.is_empty() && !sources.is_empty() {
            return Err(PyValueError::new_err(
                "source and target: token lists on both sides or strings on both",
            ));
        }
        let kw = PyDict::new(slf.py());
        kw.set_item("pretokenized", tokens)?;
        if max_batch_size > 0 {
            kw.set_item("batch", max_batch_size)?;
        }
        let out = slf.call_method("score", (sources, targets), Some(&kw))?;
        let mut results = Vec::new();
        for s in out.try_iter()? {
            let s = s?.downcast_into::<Score>()?;
            let s = s.get();
            results.push(ScoringResult {
                tokens: s.tokens.clone(),
                log_probs: s
                    .token_scores
                    .bind(slf.py())
                    .call_method0("tolist")?
                    .extract()?,
            });
        }
        Ok(results)
    }

    /// Word alignments of the first model for sentence pairs tokenised with spaces (see the module's `align`).
    #[pyo3(signature = (sources, targets, soft=false, batch=32))]
    fn align(
        &self,
        py: Python<'_>,
        sources: Lines,
        targets: Lines,
        soft: bool,
        batch: usize,
    ) -> PyResult<Vec<Alignment>> {
        let (sources, targets) = (sources.0, targets.0);
        if sources.len() != targets.len() {
            return Err(PyValueError::new_err(format!(
                "{} source sentences but {} target sentences",
                sources.len(),
                targets.len()
            )));
        }
        if batch == 0 {
            return Err(PyValueError::new_err("batch 0: it must be at least 1"));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let tr = self.inner.clone();
        let out = interruptible(py, &stop, || {
            let mut out = Vec::with_capacity(sources.len());
            for (s, t) in sources.chunks(batch).zip(targets.chunks(batch)) {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                out.extend(tr.align(s, t, batch).map_err(py_err)?);
            }
            Ok(out)
        })?;
        out.iter().map(|a| Alignment::of(py, a, soft)).collect()
    }

    /// The source vocabulary, by id (`</s>` and `<unk>` first).
    fn source_vocabulary(&self) -> Vec<String> {
        vocabulary(&self.inner.model().src_vocab)
    }

    /// The target vocabulary, by id (`</s>` and `<unk>` first).
    fn target_vocabulary(&self) -> Vec<String> {
        vocabulary(&self.inner.model().tgt_vocab)
    }

    /// The first model's directory, configuration (TOML text) and parameter counts per component.
    fn info(&self, py: Python<'_>) -> PyResult<PyObject> {
        model_info(py, self.inner.model())
    }
}

/// Word alignments from attention (as `cgnmt align`): force-decode each `target` given its `source` (both
/// tokenised with spaces, a gold alignment's tokens; a BPE model's subwords are mapped back to them) and link
/// every target word to its most attended source word. `model_dir` is a model directory or an open
/// `Translator`; `kwargs` as `Translator.align`'s (`soft`: each pair's word-level attention matrix and gate
/// values too, for soft AER; `batch`).
#[pyfunction]
#[pyo3(signature = (model_dir, sources, targets, **kwargs))]
pub fn align<'py>(
    py: Python<'py>,
    model_dir: &Bound<'py, PyAny>,
    sources: &Bound<'py, PyAny>,
    targets: &Bound<'py, PyAny>,
    kwargs: Option<&Bound<'py, PyDict>>,
) -> PyResult<Bound<'py, PyAny>> {
    let tr = match model_dir.downcast::<Translator>() {
        Ok(t) => t.clone(),
        Err(_) => py
            .get_type::<Translator>()
            .call1((model_dir,))?
            .downcast_into()?,
    };
    tr.call_method("align", (sources, targets), kwargs)
}

/// `items` in lists of `n` from a Python iterator, read as they are needed (an empty list at its end).
pub fn next_chunk<'py>(it: &Bound<'py, PyAny>, n: usize) -> PyResult<Bound<'py, PyList>> {
    let chunk = PyList::empty(it.py());
    while chunk.len() < n {
        match it.call_method0("__next__") {
            Ok(x) => chunk.append(x)?,
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyStopIteration>(it.py()) => break,
            Err(e) => return Err(e),
        }
    }
    Ok(chunk)
}
