//! `cgnmt._cgnmt`: the native half of the Python package `cgnmt` (its Python half, `python/cgnmt/`, wraps
//! these in classes with NumPy arrays). Every call releases the GIL while it works, turns the library's
//! errors into Python exceptions (`FileNotFoundError`, `ValueError`, `OSError`, `RuntimeError`) and a Rust
//! panic into a `RuntimeError`; long calls (translating, aligning, training) look for a `KeyboardInterrupt`
//! every 50 ms and stop at the next batch or update.

use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{
    PyFileNotFoundError, PyKeyboardInterrupt, PyOSError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use cgnmt::decode::translate::Translation;
use cgnmt::{
    InputLimit, LongInput, NmtError, ShortlistOptions, TranslateOptions, TranslatorOptions,
};

/// The Python exception a user expects of a library error, with the message `msg`: a missing file or model
/// directory is a `FileNotFoundError`, a bad setting or input a `ValueError`, another I/O failure an
/// `OSError`, an interruption a `KeyboardInterrupt`, a failure inside the computation a `RuntimeError`.
fn exception(e: &NmtError, msg: String) -> PyErr {
    match e {
        NmtError::Io { source, .. } => io_exception(source, msg),
        NmtError::ModelDir { dir, .. } if !dir.exists() => PyFileNotFoundError::new_err(msg),
        NmtError::DataCrate(d) => data_exception(d, msg),
        NmtError::ModelDir { .. }
        | NmtError::Config(_)
        | NmtError::Data(_)
        | NmtError::Options(_) => PyValueError::new_err(msg),
        NmtError::Interrupted(_) => PyKeyboardInterrupt::new_err(msg),
        NmtError::Candle(_) => PyRuntimeError::new_err(msg),
    }
}

/// A data file's error: missing is a `FileNotFoundError`, unreadable an `OSError`, malformed a `ValueError`.
fn data_exception(e: &cgnmt_data::DataError, msg: String) -> PyErr {
    match e {
        cgnmt_data::DataError::NotFound { .. } => PyFileNotFoundError::new_err(msg),
        cgnmt_data::DataError::Io { source, .. } => io_exception(source, msg),
        _ => PyValueError::new_err(msg),
    }
}

fn io_exception(e: &std::io::Error, msg: String) -> PyErr {
    if e.kind() == std::io::ErrorKind::NotFound {
        PyFileNotFoundError::new_err(msg)
    } else {
        PyOSError::new_err(msg)
    }
}

fn py_err(e: NmtError) -> PyErr {
    let msg = e.to_string();
    exception(&e, msg)
}

/// An application error (the metrics' and selection's `anyhow` errors): the first library or I/O error in
/// its chain decides the exception; the message is the whole chain's.
fn py_err_any(e: anyhow::Error) -> PyErr {
    let msg = format!("{e:#}");
    for cause in e.chain() {
        if let Some(io) = cause.downcast_ref::<std::io::Error>() {
            return io_exception(io, msg);
        }
        if let Some(n) = cause.downcast_ref::<NmtError>() {
            return exception(n, msg);
        }
        if let Some(d) = cause.downcast_ref::<cgnmt_data::DataError>() {
            return data_exception(d, msg);
        }
    }
    PyValueError::new_err(msg)
}

/// `f`'s result, a Rust panic inside it turned into a `RuntimeError` (never an abort of the interpreter).
fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
    match std::panic::catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(PyRuntimeError::new_err(format!(
            "cgnmt panicked: {}",
            panic_message(&p)
        ))),
    }
}

fn panic_message(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Run `work` on a thread of its own with the GIL released, looking for signals every 50 ms: a
/// `KeyboardInterrupt` (or any exception a signal handler raises) sets `stop`, waits for `work` to return
/// (which it does at its next batch or update) and is raised. A panic in `work` is a `RuntimeError`.
fn interruptible<T: Send>(
    py: Python<'_>,
    stop: &Arc<AtomicBool>,
    work: impl FnOnce() -> PyResult<T> + Send,
) -> PyResult<T> {
    py.allow_threads(|| {
        std::thread::scope(|s| {
            let h = s.spawn(|| guarded(work));
            let mut signal: Option<PyErr> = None;
            while !h.is_finished() {
                std::thread::sleep(Duration::from_millis(50));
                if signal.is_none() {
                    if let Err(e) = Python::with_gil(|py| py.check_signals()) {
                        stop.store(true, Ordering::Relaxed);
                        signal = Some(e);
                    }
                }
            }
            let r = h.join().unwrap_or_else(|p| {
                Err(PyRuntimeError::new_err(format!(
                    "cgnmt panicked: {}",
                    panic_message(&p)
                )))
            });
            match signal {
                Some(e) => Err(e),
                None => r,
            }
        })
    })
}

/// An opened model directory (or ensemble), shared by Python threads.
#[pyclass(frozen, module = "cgnmt._cgnmt")]
struct Translator {
    inner: Arc<cgnmt::Translator>,
}

/// A float32 vector as little-endian bytes (NumPy reads them without a copy per element).
fn f32_bytes<'py>(py: Python<'py>, v: impl Iterator<Item = f32>) -> Bound<'py, PyBytes> {
    let bytes: Vec<u8> = v.flat_map(f32::to_le_bytes).collect();
    PyBytes::new(py, &bytes)
}

/// One translation as a dict (the Python half makes it a `Translation`).
fn translation_dict<'py>(
    py: Python<'py>,
    tr: &cgnmt::Translator,
    t: &Translation,
    record: bool,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("text", &t.text)?;
    d.set_item("tokens", &t.tokens)?;
    d.set_item("source_tokens", &t.src_tokens)?;
    let hyps = PyList::empty(py);
    for h in &t.hyps {
        let tokens = tr.model().tgt_vocab.decode(&h.tokens);
        hyps.append((tr.hypothesis_text(h), tokens, h.score))?;
    }
    d.set_item("hypotheses", hyps)?;
    d.set_item(
        "unmet_constraints",
        t.hyps.first().map_or(0, |h| h.unmet_constraints),
    )?;
    if record {
        let best = t.hyps.first();
        let rows = best.map_or(0, |b| b.attention.len());
        let cols = best
            .and_then(|b| b.attention.first())
            .map_or(0, |r| r.len());
        let att = best.map(|b| b.attention.concat()).unwrap_or_default();
        d.set_item("attention", f32_bytes(py, att.into_iter()))?;
        d.set_item("attention_shape", (rows, cols))?;
        let gates = best.map(|b| b.gates.clone()).unwrap_or_default();
        d.set_item("gates", f32_bytes(py, gates.into_iter()))?;
        let cov = best.map(|b| b.coverage.clone()).unwrap_or_default();
        d.set_item("coverage", f32_bytes(py, cov.into_iter()))?;
    }
    Ok(d)
}

/// The best hypothesis's words (subword pieces merged): `word_scores` and `word_gates` with `word_scores`,
/// `alignment` (links) or `alignment_soft` (the matrix's rows) with `alignment`.
fn word_level_items(
    d: &Bound<'_, PyDict>,
    tr: &cgnmt::Translator,
    t: &Translation,
    word_scores: bool,
    alignment: Option<cgnmt::decode::alignment::AlignmentMode>,
) -> PyResult<()> {
    use cgnmt::decode::alignment::{AlignmentMode, WordLevel};
    let none = cgnmt::decode::beam_search::Hypothesis::default();
    let w = WordLevel::of(&t.src_tokens, &t.tokens, t.hyps.first().unwrap_or(&none));
    if word_scores {
        d.set_item("word_scores", w.word_scores.clone())?;
        let gated = !matches!(tr.model().model.gate, cgnmt::model::gate::Gate::None);
        d.set_item("word_gates", gated.then(|| w.word_gates.clone()))?;
    }
    match alignment {
        Some(AlignmentMode::Soft) => d.set_item("alignment_soft", w.attention.clone())?,
        Some(a) => d.set_item("alignment", w.links(a))?,
        None => {}
    }
    Ok(())
}

#[pymethods]
impl Translator {
    #[new]
    #[pyo3(signature = (model_dirs, int8=false, shortlist=None, shortlist_frequent=100, shortlist_per_word=50))]
    fn new(
        py: Python<'_>,
        model_dirs: Vec<PathBuf>,
        int8: bool,
        shortlist: Option<PathBuf>,
        shortlist_frequent: usize,
        shortlist_per_word: usize,
    ) -> PyResult<Self> {
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
        let inner = py.allow_threads(|| {
            guarded(|| cgnmt::Translator::open(&model_dirs, &opts).map_err(py_err))
        })?;
        Ok(Translator {
            inner: Arc::new(inner),
        })
    }

    /// The decoding settings chosen on dev that the first model keeps (its decoding.toml), as a dict, or
    /// `None`.
    fn decoding_settings<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyDict>>> {
        let Some(s) = self.inner.settings() else {
            return Ok(None);
        };
        let d = PyDict::new(py);
        d.set_item("length_penalty", s.length_penalty)?;
        d.set_item("coverage_penalty", s.coverage_penalty)?;
        d.set_item("beam", s.beam)?;
        d.set_item("dev_bleu", s.dev_bleu)?;
        d.set_item("dev_sentences", s.dev_sentences)?;
        Ok(Some(d))
    }

    /// What opening noticed (int8 unavailable, a shortlist that matches nothing).
    fn notes(&self) -> Vec<String> {
        self.inner.notes().to_vec()
    }

    /// The models' directories (the first is the ensemble's vocabularies' and preprocessing's).
    fn model_dirs(&self) -> Vec<PathBuf> {
        self.inner.members().iter().map(|m| m.dir.clone()).collect()
    }

    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (sentences, beam=10, nbest=1, length_norm=false, length_penalty=None, coverage_penalty=None,
        context_scale=(1.0, 1.0), pretokenized=false, record=false, batch=32, max_input_words=200,
        truncate_long=false, word_scores=false, alignment=None, target_prefix=None, constraints=None, avoid=None,
        max_decoding_length=None, min_decoding_length=None))]
    fn translate<'py>(
        &self,
        py: Python<'py>,
        sentences: Vec<String>,
        beam: usize,
        nbest: usize,
        length_norm: bool,
        length_penalty: Option<f64>,
        coverage_penalty: Option<f64>,
        context_scale: (f64, f64),
        pretokenized: bool,
        record: bool,
        batch: usize,
        max_input_words: usize,
        truncate_long: bool,
        word_scores: bool,
        alignment: Option<String>,
        target_prefix: Option<Vec<String>>,
        constraints: Option<Vec<Vec<String>>>,
        avoid: Option<Vec<Vec<String>>>,
        max_decoding_length: Option<usize>,
        min_decoding_length: Option<usize>,
    ) -> PyResult<Bound<'py, PyList>> {
        let stop = Arc::new(AtomicBool::new(false));
        let alignment = match alignment {
            Some(a) => Some(
                a.parse::<cgnmt::decode::alignment::AlignmentMode>()
                    .map_err(|e| PyValueError::new_err(format!("alignment {e}")))?,
            ),
            None => None,
        };
        // The model's penalties chosen on dev, unless given.
        let model = self.inner.options();
        let opts = TranslateOptions {
            beam,
            nbest,
            length_norm,
            length_penalty: length_penalty.unwrap_or(model.length_penalty),
            coverage_penalty: coverage_penalty.unwrap_or(model.coverage_penalty),
            context_scale,
            record,
            word_scores,
            alignment,
            target_prefix: target_prefix.unwrap_or_default(),
            constraints: constraints.unwrap_or_default(),
            avoid: avoid.unwrap_or_default(),
            full_beam: false,
            word_table: true,
            batch,
            pretokenized,
            input_limit: InputLimit {
                max_words: max_input_words,
                long_input: if truncate_long {
                    LongInput::Truncate
                } else {
                    LongInput::Split
                },
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
        let list = PyList::empty(py);
        for t in &out {
            let d = translation_dict(py, &self.inner, t, record)?;
            if word_scores || alignment.is_some() {
                word_level_items(&d, &self.inner, t, word_scores, alignment)?;
            }
            list.append(d)?;
        }
        Ok(list)
    }

    /// Word alignments of `(source, target)` pairs tokenised with spaces, from the first model's attention:
    /// per pair `(links, attention bytes, (rows, columns), gates bytes)`.
    #[pyo3(signature = (sources, targets, batch=32))]
    fn align<'py>(
        &self,
        py: Python<'py>,
        sources: Vec<String>,
        targets: Vec<String>,
        batch: usize,
    ) -> PyResult<Bound<'py, PyList>> {
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
        let list = PyList::empty(py);
        for a in &out {
            let rows = a.attention.len();
            let cols = a.attention.first().map_or(0, |r| r.len());
            let att = f32_bytes(py, a.attention.iter().flatten().map(|&x| x as f32));
            let gates = f32_bytes(py, a.gates.iter().copied());
            list.append((a.links.clone(), att, (rows, cols), gates))?;
        }
        Ok(list)
    }

    /// Each target's log-probability given its source, by forced decoding with every model (their mean):
    /// per pair `(tokens, per-token log-probabilities bytes (EOS last), total)`.
    #[pyo3(signature = (sources, targets, pretokenized=false, context_scale=(1.0, 1.0), batch=32))]
    fn score<'py>(
        &self,
        py: Python<'py>,
        sources: Vec<String>,
        targets: Vec<String>,
        pretokenized: bool,
        context_scale: (f64, f64),
        batch: usize,
    ) -> PyResult<Bound<'py, PyList>> {
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
        let list = PyList::empty(py);
        for sc in &out {
            let lp = f32_bytes(py, sc.token_scores.iter().copied());
            list.append((sc.tokens.clone(), lp, sc.score))?;
        }
        Ok(list)
    }

    fn source_vocabulary(&self) -> Vec<String> {
        vocabulary(&self.inner.model().src_vocab)
    }

    fn target_vocabulary(&self) -> Vec<String> {
        vocabulary(&self.inner.model().tgt_vocab)
    }

    /// The first model's directory, configuration (TOML) and parameter counts per component.
    fn info<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        model_info_dict(py, self.inner.model())
    }
}

fn vocabulary(v: &cgnmt_data::vocab::Vocab) -> Vec<String> {
    (0..v.len() as u32)
        .map(|i| v.token(i).unwrap_or_default().to_string())
        .collect()
}

fn model_info_dict<'py>(py: Python<'py>, m: &cgnmt::LoadedModel) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("directory", &m.dir)?;
    d.set_item("config", m.config.to_toml())?;
    let counts = cgnmt::model::init::count_by_component(&m.varmap);
    let total: usize = counts.iter().map(|(_, n)| n).sum();
    d.set_item("parameters", counts)?;
    d.set_item("total_parameters", total)?;
    d.set_item("source_vocabulary_size", m.src_vocab.len())?;
    d.set_item("target_vocabulary_size", m.tgt_vocab.len())?;
    d.set_item("source_vocabulary", vocabulary(&m.src_vocab))?;
    d.set_item("target_vocabulary", vocabulary(&m.tgt_vocab))?;
    Ok(d)
}

/// A model directory's information without decoding anything.
#[pyfunction]
fn model_info<'py>(py: Python<'py>, model_dir: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    let m = py.allow_threads(|| {
        guarded(|| {
            let dir = cgnmt::model::store::resolve_model_dir(&model_dir);
            cgnmt::model::store::load(&dir, candle_core::DType::F32, &candle_core::Device::Cpu)
                .map_err(py_err)
        })
    })?;
    model_info_dict(py, &m)
}

/// The parameter counts of the model a configuration describes (as `cgnmt info`).
#[pyfunction]
#[pyo3(signature = (config=None, set=Vec::new()))]
fn config_info(
    config: Option<PathBuf>,
    set: Vec<String>,
) -> PyResult<(String, Vec<(String, usize)>)> {
    guarded(|| {
        let cfg = cgnmt::config::Config::load(config.as_deref(), &set).map_err(py_err)?;
        let counts = cgnmt::model::init::parameter_counts(&cfg).map_err(py_err)?;
        Ok((cfg.to_toml(), counts))
    })
}

/// Train in this process: `config` (a TOML file, or the defaults) with `set` overrides, into `out`; or
/// continue the run in `out` (`resume`); or fine-tune the model of `init`. Returns the run's state as JSON
/// text.
#[pyfunction]
#[pyo3(signature = (out, config=None, set=Vec::new(), resume=false, quiet=false, init=None))]
fn train(
    py: Python<'_>,
    out: PathBuf,
    config: Option<PathBuf>,
    set: Vec<String>,
    resume: bool,
    quiet: bool,
    init: Option<PathBuf>,
) -> PyResult<String> {
    let cfg = guarded(|| {
        cgnmt::train::checkpoint::run_config(config.as_deref(), &set, &out, resume, init.as_deref())
            .map_err(py_err)
    })?;
    cgnmt::kernels::set_threads(cfg.train.threads);
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let summary = interruptible(py, &stop, move || {
        cgnmt::train::train_until(cfg, &out, resume, quiet, &flag).map_err(py_err)
    })?;
    serde_json::to_string(&serde_json::json!({
        "run_dir": summary.run_dir,
        "parameters": summary.params,
        "state": summary.state,
    }))
    .map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// Choose a finished run's model (and, with `tune`, its penalties) on dev, as `cgnmt select`; returns
/// the selection record as JSON text (also written to `RUN/selection.json`).
#[pyfunction]
#[pyo3(signature = (run, tune=false, last=4, tolerance=1.0, beam=10, length_penalty=0.0, coverage_penalty=0.0,
    dev_sentences=0, prepared=None))]
#[allow(clippy::too_many_arguments)]
fn select(
    py: Python<'_>,
    run: PathBuf,
    tune: bool,
    last: usize,
    tolerance: f64,
    beam: usize,
    length_penalty: f64,
    coverage_penalty: f64,
    dev_sentences: usize,
    prepared: Option<PathBuf>,
) -> PyResult<String> {
    let base = cgnmt::decode::beam_search::DecodeOptions {
        beam,
        length_penalty,
        coverage_penalty,
        ..Default::default()
    };
    let record = run.join(cgnmt::train::selection::SELECTION_FILE);
    let s = py.allow_threads(|| {
        guarded(|| {
            cgnmt::train::selection::choose_for_run(
                &run,
                last,
                tolerance,
                &base,
                tune,
                dev_sentences,
                prepared.as_deref(),
                &record,
            )
            .map_err(py_err_any)
        })
    })?;
    serde_json::to_string(&s).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// The metric options of the command line (`score`, `compare`), from keyword arguments.
fn metric_options(
    tokenize: Option<&str>,
    lowercase: bool,
    smooth: Option<&str>,
    smooth_value: Option<f64>,
    mteval: bool,
    cased: bool,
) -> PyResult<cgnmt_eval::report::MetricOptions> {
    use clap::ValueEnum;
    let tokenize = tokenize
        .map(|t| {
            cgnmt_eval::report::TokenizeArg::from_str(t, false)
                .map_err(|_| PyValueError::new_err(format!("unknown tokenize {t:?}")))
        })
        .transpose()?;
    let smooth = smooth
        .map(|t| {
            cgnmt_eval::report::SmoothArg::from_str(t, false)
                .map_err(|_| PyValueError::new_err(format!("unknown smooth {t:?}")))
        })
        .transpose()?;
    Ok(cgnmt_eval::report::MetricOptions {
        tokenize,
        lowercase,
        lc_c: false,
        smooth,
        smooth_value,
        mteval_v11b: mteval,
        cased,
    })
}

/// References as streams (`refs[k][line]`), each as long as the hypotheses.
fn check_refs(hyps: &[String], refs: &[Vec<String>]) -> PyResult<()> {
    if refs.is_empty() {
        return Err(PyValueError::new_err("no references"));
    }
    for (k, r) in refs.iter().enumerate() {
        if r.len() != hyps.len() {
            return Err(PyValueError::new_err(format!(
                "reference stream {k} has {} lines, the hypotheses {}",
                r.len(),
                hyps.len()
            )));
        }
    }
    Ok(())
}

/// Corpus BLEU as `cgnmt score --json` prints it (JSON text).
#[pyfunction]
#[pyo3(signature = (hyps, refs, mteval=false, lowercase=false, tokenize=None, smooth=None, smooth_value=None,
    cased=false))]
#[allow(clippy::too_many_arguments)]
fn bleu(
    hyps: Vec<String>,
    refs: Vec<Vec<String>>,
    mteval: bool,
    lowercase: bool,
    tokenize: Option<String>,
    smooth: Option<String>,
    smooth_value: Option<f64>,
    cased: bool,
) -> PyResult<String> {
    check_refs(&hyps, &refs)?;
    let o = metric_options(
        tokenize.as_deref(),
        lowercase,
        smooth.as_deref(),
        smooth_value,
        mteval,
        cased,
    )?;
    let opts = o.bleu_options().map_err(py_err_any)?;
    let b = cgnmt_eval::corpus_bleu(&hyps, &refs, &opts)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(cgnmt_eval::report::bleu_json(&b).to_string())
}

/// One sentence's BLEU as sacreBLEU's `sentence_bleu` computes it (effective order by default), as JSON text
/// (`bleu`'s fields).
#[pyfunction]
#[pyo3(signature = (hyp, refs, lowercase=false, tokenize=None, smooth=None, smooth_value=None, effective_order=true))]
fn sentence_bleu(
    hyp: String,
    refs: Vec<String>,
    lowercase: bool,
    tokenize: Option<String>,
    smooth: Option<String>,
    smooth_value: Option<f64>,
    effective_order: bool,
) -> PyResult<String> {
    let o = metric_options(
        tokenize.as_deref(),
        lowercase,
        smooth.as_deref(),
        smooth_value,
        false,
        false,
    )?;
    let mut opts = o.bleu_options().map_err(py_err_any)?;
    opts.effective_order = effective_order;
    let b = cgnmt_eval::sentence_bleu(&hyp, &refs, &opts)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(cgnmt_eval::report::bleu_json(&b).to_string())
}

/// Corpus chrF (chrF++ with `plus_plus`) as `cgnmt score --json --metric chrf` prints it (JSON text).
#[pyfunction]
#[pyo3(signature = (hyps, refs, plus_plus=false, lowercase=false))]
fn chrf(
    hyps: Vec<String>,
    refs: Vec<Vec<String>>,
    plus_plus: bool,
    lowercase: bool,
) -> PyResult<String> {
    check_refs(&hyps, &refs)?;
    let o = metric_options(None, lowercase, None, None, false, false)?;
    let opts = o.chrf_options(plus_plus).map_err(py_err_any)?;
    let c = cgnmt_eval::chrf::corpus_chrf(&hyps, &refs, &opts)
        .map_err(|e| PyValueError::new_err(e.to_string()))?;
    Ok(cgnmt_eval::report::chrf_json(&c).to_string())
}

/// Paired significance tests of `system` against `baseline`, as `cgnmt compare --json` prints them (JSON
/// text: one record per metric).
#[pyfunction]
#[pyo3(signature = (baseline, system, refs, test="all", metric="bleu", mteval=false, lowercase=false,
    tokenize=None, seed=cgnmt_eval::significance::DEFAULT_SEED,
    bs_samples=cgnmt_eval::significance::DEFAULT_BS_SAMPLES, ar_trials=cgnmt_eval::significance::DEFAULT_AR_TRIALS))]
#[allow(clippy::too_many_arguments)]
fn compare(
    py: Python<'_>,
    baseline: Vec<String>,
    system: Vec<String>,
    refs: Vec<Vec<String>>,
    test: &str,
    metric: &str,
    mteval: bool,
    lowercase: bool,
    tokenize: Option<String>,
    seed: u64,
    bs_samples: usize,
    ar_trials: usize,
) -> PyResult<String> {
    use cgnmt_eval::report::TestArg;
    check_refs(&baseline, &refs)?;
    check_refs(&system, &refs)?;
    let test = match test {
        "bootstrap" | "bs" => TestArg::Bs,
        "ar" => TestArg::Ar,
        "sign" => TestArg::Sign,
        "all" => TestArg::All,
        t => {
            return Err(PyValueError::new_err(format!(
                "test {t:?}: one of \"bootstrap\", \"ar\", \"sign\", \"all\""
            )))
        }
    };
    let opts = compare_options(
        metric,
        (mteval, lowercase, tokenize.as_deref()),
        test,
        seed,
        (bs_samples, ar_trials),
    )?;
    let report = py.allow_threads(|| {
        guarded(|| {
            cgnmt_eval::report::compare_systems(
                &opts,
                &("baseline".to_string(), baseline),
                &[("system".to_string(), system)],
                &refs,
            )
            .map(|r| r.0)
            .map_err(py_err_any)
        })
    })?;
    Ok(serde_json::Value::from(report).to_string())
}

/// `compare`'s options over in-memory texts (JSON out) for `metric` (`bleu`, `chrf`, `chrf++`) with its
/// configuration `(mteval, lowercase, tokenize)`, the tests, seed and `(resamples, trials)`.
fn compare_options(
    metric: &str,
    (mteval, lowercase, tokenize): (bool, bool, Option<&str>),
    test: cgnmt_eval::report::TestArg,
    seed: u64,
    (bs_samples, ar_trials): (usize, usize),
) -> PyResult<cgnmt_eval::report::CompareOptions> {
    use clap::ValueEnum;
    let metric = cgnmt_eval::report::MetricArg::from_str(metric, false).map_err(|_| {
        PyValueError::new_err(format!(
            "metric {metric:?}: one of \"bleu\", \"chrf\", \"chrf++\""
        ))
    })?;
    Ok(cgnmt_eval::report::CompareOptions {
        baseline: PathBuf::from("baseline"),
        systems: vec![PathBuf::from("system")],
        refs: vec![],
        test,
        seed,
        metrics: vec![metric],
        opts: metric_options(tokenize, lowercase, None, None, mteval, false)?,
        bs_samples,
        ar_trials,
        json: true,
    })
}

/// The seed-level comparison of a system's runs against a baseline's (each a list of outputs, one per seed),
/// as `cgnmt compare --json` prints it for comma-separated runs (JSON text).
#[pyfunction]
#[pyo3(signature = (baseline_runs, system_runs, refs, metric, mteval, lowercase, tokenize, seed, bs_samples))]
#[allow(clippy::too_many_arguments)]
fn compare_runs(
    py: Python<'_>,
    baseline_runs: Vec<Vec<String>>,
    system_runs: Vec<Vec<String>>,
    refs: Vec<Vec<String>>,
    metric: &str,
    mteval: bool,
    lowercase: bool,
    tokenize: Option<String>,
    seed: u64,
    bs_samples: usize,
) -> PyResult<String> {
    use cgnmt_eval::report::TestArg;
    if baseline_runs.is_empty() || system_runs.is_empty() {
        return Err(PyValueError::new_err("each system needs at least one run"));
    }
    for r in baseline_runs.iter().chain(&system_runs) {
        check_refs(r, &refs)?;
    }
    let opts = compare_options(
        metric,
        (mteval, lowercase, tokenize.as_deref()),
        TestArg::Bs,
        seed,
        (bs_samples, 1),
    )?;
    let report = py.allow_threads(|| {
        guarded(|| {
            cgnmt_eval::report::compare_system_runs(
                &opts,
                &("baseline".to_string(), baseline_runs),
                &[("system".to_string(), system_runs)],
                &refs,
            )
            .map(|r| r.0)
            .map_err(py_err_any)
        })
    })?;
    Ok(serde_json::Value::from(report).to_string())
}

/// Alignment error rate of predicted links against gold ones (`.talp` lines: `i-j` sure, `i?j` possible),
/// and soft AER of attention matrices, as `cgnmt aer --json` prints them (JSON text).
#[pyfunction]
#[pyo3(signature = (gold, pred=None, soft=None))]
fn aer(
    gold: Vec<String>,
    pred: Option<Vec<String>>,
    soft: Option<Vec<Vec<Vec<f64>>>>,
) -> PyResult<String> {
    use cgnmt_eval::aer as A;
    let value_err = |e: cgnmt_eval::EvalError| PyValueError::new_err(e.to_string());
    let gold = A::parse_gold(&(gold.join("\n") + "\n"), Path::new("gold")).map_err(value_err)?;
    let pred = match (pred, &soft) {
        (Some(p), _) => {
            A::parse_pred(&(p.join("\n") + "\n"), Path::new("pred")).map_err(value_err)?
        }
        (None, Some(s)) => A::argmax_links(s),
        (None, None) => return Err(PyValueError::new_err("give pred and/or soft")),
    };
    if pred.len() != gold.len() || soft.as_ref().is_some_and(|s| s.len() != gold.len()) {
        return Err(PyValueError::new_err(format!(
            "{} gold sentences, {} predicted{}",
            gold.len(),
            pred.len(),
            soft.as_ref()
                .map_or(String::new(), |s| format!(", {} soft", s.len()))
        )));
    }
    let (v, _) = cgnmt_eval::report::aer_report(&gold, &pred, soft.as_deref(), "soft")
        .map_err(py_err_any)?;
    Ok(v.to_string())
}

/// The number of threads the library's matrix products and row loops use (0: the physical cores).
#[pyfunction]
fn set_threads(n: usize) {
    cgnmt::kernels::set_threads(n);
}

/// A panic inside the library, on purpose (for the tests: it must reach Python as a `RuntimeError`).
#[pyfunction]
fn _panic_for_test(py: Python<'_>) -> PyResult<()> {
    let stop = Arc::new(AtomicBool::new(false));
    interruptible(py, &stop, || -> PyResult<()> { panic!("a test panic") })
}

#[pymodule]
fn _cgnmt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    cgnmt::process::set_thread_defaults();
    m.add("__version__", cgnmt::LONG_VERSION)?;
    m.add_class::<Translator>()?;
    m.add_function(wrap_pyfunction!(model_info, m)?)?;
    m.add_function(wrap_pyfunction!(config_info, m)?)?;
    m.add_function(wrap_pyfunction!(train, m)?)?;
    m.add_function(wrap_pyfunction!(select, m)?)?;
    m.add_function(wrap_pyfunction!(bleu, m)?)?;
    m.add_function(wrap_pyfunction!(sentence_bleu, m)?)?;
    m.add_function(wrap_pyfunction!(chrf, m)?)?;
    m.add_function(wrap_pyfunction!(compare, m)?)?;
    m.add_function(wrap_pyfunction!(compare_runs, m)?)?;
    m.add_function(wrap_pyfunction!(aer, m)?)?;
    m.add_function(wrap_pyfunction!(set_threads, m)?)?;
    m.add_function(wrap_pyfunction!(_panic_for_test, m)?)?;
    Ok(())
}
