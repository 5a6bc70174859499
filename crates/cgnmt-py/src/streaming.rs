//! Translating streams in bounded memory: CTranslate2's `translate_iterable` (results yielded in order, a few
//! batches held) and `translate_file` (a text file to a text file, appearing whole or not at all).

use std::collections::VecDeque;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use crate::errors::{io_exception, py_err, py_err_any};
use crate::results::{Translation, TranslationStats};
use crate::translator::{next_chunk, Translator};

/// Batches read ahead of the results: a stream holds `CHUNK_BATCHES · max_batch_size` sentences at a time
/// (enough for the length-sorted batches of `translate` to be full).
const CHUNK_BATCHES: usize = 16;

fn batch_size(max_batch_size: usize) -> PyResult<usize> {
    if max_batch_size == 0 {
        return Err(PyValueError::new_err(
            "max_batch_size 0: it must be at least 1",
        ));
    }
    Ok(CHUNK_BATCHES * max_batch_size)
}

/// The results of `Translator.translate_iterable`, computed a chunk at a time as they are asked for.
#[pyclass(module = "cgnmt")]
pub struct TranslationIterator {
    translator: Py<Translator>,
    source: PyObject,
    chunk: usize,
    kwargs: Py<PyDict>,
    pending: VecDeque<PyObject>,
}

impl TranslationIterator {
    pub fn new(
        translator: &Bound<'_, Translator>,
        source: &Bound<'_, PyAny>,
        max_batch_size: usize,
        batch_type: &str,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> PyResult<Self> {
        if batch_type != "examples" {
            return Err(PyValueError::new_err(format!(
                "batch_type {batch_type:?}: only \"examples\" (sentences per batch)"
            )));
        }
        let chunk = batch_size(max_batch_size)?;
        let py = translator.py();
        let kw = match kwargs {
            Some(k) => k.copy()?,
            None => PyDict::new(py),
        };
        kw.set_item("max_batch_size", max_batch_size)?;
        Ok(TranslationIterator {
            translator: translator.clone().unbind(),
            source: source.try_iter()?.into_any().unbind(),
            chunk,
            kwargs: kw.unbind(),
            pending: VecDeque::new(),
        })
    }
}

#[pymethods]
impl TranslationIterator {
    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__(&mut self, py: Python<'_>) -> PyResult<Option<PyObject>> {
        if self.pending.is_empty() {
            let chunk = next_chunk(self.source.bind(py), self.chunk)?;
            if chunk.is_empty() {
                return Ok(None);
            }
            let out = self.translator.bind(py).call_method(
                "translate_batch",
                (chunk,),
                Some(self.kwargs.bind(py)),
            )?;
            for r in out.try_iter()? {
                self.pending.push_back(r?.unbind());
            }
        }
        Ok(self.pending.pop_front())
    }
}

/// `Translator.translate_file`: the lines of `source` translated into `output`, `CHUNK_BATCHES` batches at a
/// time.
pub fn translate_file(
    translator: &Bound<'_, Translator>,
    source: &Path,
    output: &Path,
    max_batch_size: usize,
    kwargs: Option<&Bound<'_, PyDict>>,
) -> PyResult<TranslationStats> {
    let start = Instant::now();
    let py = translator.py();
    let chunk = batch_size(max_batch_size)?;
    let kw = match kwargs {
        Some(k) => k.copy()?,
        None => PyDict::new(py),
    };
    if let Some(b) = kw.get_item("beam_size")? {
        kw.del_item("beam_size")?;
        kw.set_item("beam", b)?;
    }
    kw.set_item("batch", max_batch_size)?;
    let io_err = |p: &Path, e: std::io::Error| io_exception(&e, format!("{}: {e}", p.display()));
    // The project's line reader: plain or gzipped, a BOM and CRLF endings dropped, bad UTF-8 named by line.
    let mut lines = cgnmt_data::corpus::Lines::open(source).map_err(|e| py_err(e.into()))?;
    let mut out = cgnmt::atomic_file::AtomicFile::create(output).map_err(py_err_any)?;
    let (mut examples, mut tokens) = (0usize, 0usize);
    loop {
        let batch = PyList::empty(py);
        for line in lines.by_ref().take(chunk) {
            batch.append(line.map_err(|e| py_err(e.into()))?)?;
        }
        if batch.is_empty() {
            break;
        }
        examples += batch.len();
        let done = translator.call_method("translate", (batch,), Some(&kw))?;
        for t in done.try_iter()? {
            let t = t?.downcast_into::<Translation>()?;
            let t = t.get();
            tokens += t.tokens.len();
            writeln!(out, "{}", t.text).map_err(|e| io_err(output, e))?;
        }
    }
    out.commit().map_err(py_err_any)?;
    Ok(TranslationStats {
        num_tokens: tokens,
        num_examples: examples,
        total_time_in_ms: start.elapsed().as_secs_f64() * 1000.0,
    })
}
