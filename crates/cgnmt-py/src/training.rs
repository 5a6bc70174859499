//! Preparing data, training and choosing a model, in this process: `prepare`, `train` (with `TrainSummary`),
//! `select`, and `set_threads`.

use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyMapping, PyString};

use crate::convert::{json_to_py, repr_of, usize_field};
use crate::errors::{guarded, interruptible, py_err, py_err_any};

fn to_json<T: serde::Serialize>(v: &T) -> PyResult<serde_json::Value> {
    serde_json::to_value(v).map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// Prepare a parallel corpus for training, as `cgnmt prepare` does: tokenise `src` and `tgt` (line-aligned,
/// plain or gzipped), count the words, write the vocabularies (and subword models with `bpe_src`/`bpe_tgt`)
/// into the directory `out`; `dev_*` and `test_*` files are tokenised alike. Each option left `None` takes
/// `cgnmt prepare`'s default (zh → en, the languages' tokenizers, vocabularies of 30,000, pairs of at most 80
/// tokens). `like`: a model or prepared directory whose preprocessing and vocabularies to keep (data to
/// fine-tune that model on). Returns the summary written to `out/prepare.json` as a dict.
#[pyfunction]
#[allow(clippy::too_many_arguments)]
#[pyo3(signature = (src, tgt, out, dev_src=None, dev_tgt=None, test_src=None, test_tgt=None, src_lang=None,
    tgt_lang=None, src_tok=None, tgt_tok=None, lowercase=None, src_vocab_size=None, tgt_vocab_size=None,
    max_len=None, bpe_src=None, bpe_tgt=None, limit=None, force=None, like=None, alignment=None))]
pub fn prepare(
    py: Python<'_>,
    src: PathBuf,
    tgt: PathBuf,
    out: PathBuf,
    dev_src: Option<PathBuf>,
    dev_tgt: Option<PathBuf>,
    test_src: Option<PathBuf>,
    test_tgt: Option<PathBuf>,
    src_lang: Option<String>,
    tgt_lang: Option<String>,
    src_tok: Option<String>,
    tgt_tok: Option<String>,
    lowercase: Option<bool>,
    src_vocab_size: Option<usize>,
    tgt_vocab_size: Option<usize>,
    max_len: Option<usize>,
    bpe_src: Option<usize>,
    bpe_tgt: Option<usize>,
    limit: Option<usize>,
    force: Option<bool>,
    like: Option<PathBuf>,
    alignment: Option<PathBuf>,
) -> PyResult<PyObject> {
    let tokenizer = |t: Option<String>| -> PyResult<Option<cgnmt_data::tokenize::TokenizerKind>> {
        t.map(|name| {
            serde_json::from_value(serde_json::Value::String(name.clone()))
                .map_err(|_| PyValueError::new_err(format!("unknown tokenizer {name:?}")))
        })
        .transpose()
    };
    let mut o = cgnmt_data::prepare::PrepareOptions::new(src, tgt, out);
    o.dev_src = dev_src;
    o.dev_tgt = dev_tgt;
    o.test_src = test_src;
    o.test_tgt = test_tgt;
    o.src_lang = src_lang.unwrap_or(o.src_lang);
    o.tgt_lang = tgt_lang.unwrap_or(o.tgt_lang);
    o.src_tok = tokenizer(src_tok)?.or(o.src_tok);
    o.tgt_tok = tokenizer(tgt_tok)?.or(o.tgt_tok);
    o.lowercase = lowercase.unwrap_or(o.lowercase);
    o.src_vocab_size = src_vocab_size.unwrap_or(o.src_vocab_size);
    o.tgt_vocab_size = tgt_vocab_size.unwrap_or(o.tgt_vocab_size);
    o.max_len = max_len.unwrap_or(o.max_len);
    o.bpe_src = bpe_src.or(o.bpe_src);
    o.bpe_tgt = bpe_tgt.or(o.bpe_tgt);
    o.limit = limit.or(o.limit);
    o.force = force.unwrap_or(o.force);
    o.like = like.or(o.like);
    o.alignment = alignment.or(o.alignment);
    let summary =
        py.allow_threads(|| guarded(|| cgnmt_data::prepare::prepare(&o).map_err(py_err_any)))?;
    json_to_py(py, &to_json(&summary)?)
}

/// What a training run left: its directory, parameter count, updates, epochs, best dev BLEU and the step that
/// reached it, its evaluation history, and the whole training state (`state`).
#[pyclass(frozen, get_all, module = "cgnmt")]
pub struct TrainSummary {
    pub run_dir: String,
    pub parameters: usize,
    pub steps: usize,
    pub epochs: usize,
    pub best_dev_bleu: Option<f64>,
    pub best_step: usize,
    pub history: PyObject,
    pub state: PyObject,
}

#[pymethods]
impl TrainSummary {
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        repr_of(
            slf.as_any(),
            "TrainSummary",
            &[
                "run_dir",
                "parameters",
                "steps",
                "epochs",
                "best_dev_bleu",
                "best_step",
            ],
        )
    }
}

/// `train`'s overrides: a mapping of keys to values (bools, numbers, strings, paths) or `section.key=value`
/// strings.
fn settings(set: Option<&Bound<'_, PyAny>>) -> PyResult<Vec<String>> {
    let Some(set) = set else {
        return Ok(Vec::new());
    };
    if set.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(
            "set must be a dict or a list of 'section.key=value' strings",
        ));
    }
    let Ok(map) = set.downcast::<PyMapping>() else {
        return set.extract();
    };
    let mut out = Vec::new();
    for item in map.items()?.iter() {
        let (k, v): (String, Bound<'_, PyAny>) = item.extract()?;
        let value = if v.is_instance_of::<PyBool>() {
            v.extract::<bool>()?.to_string()
        } else if v.is_instance_of::<PyInt>() || v.is_instance_of::<PyFloat>() {
            v.repr()?.to_string()
        } else if let Ok(p) = v.extract::<PathBuf>() {
            serde_json::Value::String(p.to_string_lossy().into_owned()).to_string()
        } else {
            return Err(PyTypeError::new_err(format!(
                "{k}: a bool, number, string or path, not {}",
                v.get_type().name()?
            )));
        };
        out.push(format!("{k}={value}"));
    }
    Ok(out)
}

/// Train a model in this process, as `cgnmt train` does (the same progress output, or none with `quiet`): the
/// TOML `config` (the defaults without one) with `set` overrides (a dict such as `{"train.max_steps": 3000,
/// "data.prepared": "runs/prep"}` or `section.key=value` strings), into the run directory `out`; with
/// `resume`, continue the run in `out` from its last checkpoint; with `init` (a model directory), fine-tune
/// that model: its parameters and vocabularies, a fresh optimiser, on data prepared with `prepare(...,
/// like=DIR)` (the configuration's `[model]`, if any, must be the model's). Ctrl-C stops it after the update
/// in progress with its checkpoint saved (`resume=True` continues).
#[pyfunction]
#[pyo3(signature = (config=None, set=None, out=PathBuf::from("runs/model"), resume=false, quiet=false, init=None))]
pub fn train(
    py: Python<'_>,
    config: Option<PathBuf>,
    set: Option<&Bound<'_, PyAny>>,
    out: PathBuf,
    resume: bool,
    quiet: bool,
    init: Option<PathBuf>,
) -> PyResult<TrainSummary> {
    let set = settings(set)?;
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
    let state = to_json(&summary.state)?;
    Ok(TrainSummary {
        run_dir: summary.run_dir.to_string_lossy().into_owned(),
        parameters: summary.params,
        steps: usize_field(&state, "step")?,
        epochs: usize_field(&state, "epoch")?,
        best_dev_bleu: state.get("best_bleu").and_then(serde_json::Value::as_f64),
        best_step: usize_field(&state, "best_step")?,
        history: match state.get("history") {
            Some(h) => json_to_py(py, h)?,
            None => pyo3::types::PyList::empty(py).into_any().unbind(),
        },
        state: json_to_py(py, &state)?,
    })
}

/// Choose a finished run's model on dev, as `cgnmt select`: `best/`, the average of its converged tail (the
/// last `last` kept checkpoints within `tolerance` BLEU of its best) or the moving average; with `tune`, also
/// its length and coverage penalties, on the dev pairs whose reference has more than `tune_longer_than` words
/// (0: all dev) and, with `length_ratio=(low, high)`, among the penalties whose output/reference length ratio
/// lies in that interval. Returns the selection record (also written to `RUN/selection.json`): every
/// candidate's dev BLEU, the chosen one and the penalties.
#[pyfunction]
#[pyo3(signature = (run, tune=false, last=4, tolerance=1.0, beam=10, length_penalty=0.0, coverage_penalty=0.0,
    dev_sentences=0, prepared=None, tune_longer_than=0, length_ratio=None))]
#[allow(clippy::too_many_arguments)]
pub fn select(
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
    tune_longer_than: usize,
    length_ratio: Option<(f64, f64)>,
) -> PyResult<PyObject> {
    if !tune && (tune_longer_than > 0 || length_ratio.is_some()) {
        return Err(PyValueError::new_err(
            "tune_longer_than and length_ratio choose the penalties: they need tune=True",
        ));
    }
    if let Some((lo, hi)) = length_ratio {
        if !(lo > 0.0 && lo <= hi && hi.is_finite()) {
            return Err(PyValueError::new_err(format!(
                "length_ratio ({lo}, {hi}): need 0 < low <= high"
            )));
        }
    }
    let tuning = cgnmt::train::selection::Tuning {
        longer_than: tune_longer_than,
        length_ratio,
    };
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
                tune.then_some(&tuning),
                dev_sentences,
                prepared.as_deref(),
                &record,
            )
            .map_err(py_err_any)
        })
    })?;
    json_to_py(py, &to_json(&s)?)
}

/// The threads of the library's matrix products and row loops (0: the physical cores; process-wide).
#[pyfunction]
pub fn set_threads(n: usize) {
    cgnmt::kernels::set_threads(n);
}

/// A panic inside the library, on purpose (for the tests: it must reach Python as a `RuntimeError`).
#[pyfunction]
pub fn _panic_for_test(py: Python<'_>) -> PyResult<()> {
    let stop = Arc::new(AtomicBool::new(false));
    interruptible(py, &stop, || -> PyResult<()> { panic!("a test panic") })
}
