//! `cgnmt._cgnmt`: the Python package `cgnmt`, natively. One module per concept, each class and function
//! documented where it is defined, each default written once in its signature (the stubs in
//! `python/cgnmt/_cgnmt.pyi` are checked against them by mypy's `stubtest`); `python/cgnmt/` only re-exports.
//!
//! - [`translator`]: `Translator` (translate, score, align; CTranslate2's names) and `align`;
//! - [`streaming`]: `translate_iterable` and `translate_file` in bounded memory;
//! - [`results`]: what they return (`Translation`, `Hypothesis`, `Score`, `Alignment`, `TranslationResult`, …);
//! - [`model`]: `Model`, a model directory's description;
//! - [`training`]: `prepare`, `train` (`TrainSummary`), `select`, `set_threads`;
//! - [`metrics`]: BLEU, chrF, significance tests and AER (`cgnmt.metrics`);
//! - [`errors`]: library errors as Python exceptions, the GIL released, Ctrl-C honoured;
//! - [`convert`]: NumPy arrays and JSON records handed to Python.

mod convert;
mod errors;
mod metrics;
mod model;
mod results;
mod streaming;
mod training;
mod translator;

use pyo3::prelude::*;

#[pymodule]
fn _cgnmt(m: &Bound<'_, PyModule>) -> PyResult<()> {
    cgnmt::process::set_thread_defaults();
    m.add("__version__", cgnmt::LONG_VERSION)?;
    m.add_class::<translator::Translator>()?;
    m.add_function(wrap_pyfunction!(translator::align, m)?)?;
    m.add_class::<streaming::TranslationIterator>()?;
    m.add_class::<results::Translation>()?;
    m.add_class::<results::Hypothesis>()?;
    m.add_class::<results::Score>()?;
    m.add_class::<results::Alignment>()?;
    m.add_class::<results::TranslationResult>()?;
    m.add_class::<results::ScoringResult>()?;
    m.add_class::<results::TranslationStats>()?;
    m.add_class::<model::Model>()?;
    m.add_class::<training::TrainSummary>()?;
    m.add_function(wrap_pyfunction!(training::prepare, m)?)?;
    m.add_function(wrap_pyfunction!(training::train, m)?)?;
    m.add_function(wrap_pyfunction!(training::select, m)?)?;
    m.add_function(wrap_pyfunction!(training::set_threads, m)?)?;
    m.add_function(wrap_pyfunction!(training::_panic_for_test, m)?)?;
    m.add_class::<metrics::Signature>()?;
    m.add_class::<metrics::BLEUScore>()?;
    m.add_class::<metrics::CHRFScore>()?;
    m.add_class::<metrics::Comparison>()?;
    m.add_class::<metrics::RunsComparison>()?;
    m.add_class::<metrics::AERScore>()?;
    m.add_function(wrap_pyfunction!(metrics::bleu, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::sentence_bleu, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::chrf, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::sentence_chrf, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::compare, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::compare_runs, m)?)?;
    m.add_function(wrap_pyfunction!(metrics::aer, m)?)?;
    Ok(())
}
