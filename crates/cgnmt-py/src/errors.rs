//! Library errors as the Python exceptions a user expects, panics caught, and long calls run with the GIL
//! released and Ctrl-C honoured.

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{
    PyFileNotFoundError, PyKeyboardInterrupt, PyOSError, PyRuntimeError, PyValueError,
};
use pyo3::prelude::*;

use cgnmt::NmtError;

/// The Python exception a user expects of a library error, with the message `msg`: a missing file or model
/// directory is a `FileNotFoundError`, a bad setting or input a `ValueError`, another I/O failure an
/// `OSError`, an interruption a `KeyboardInterrupt`, a failure inside the computation a `RuntimeError`.
pub fn exception(e: &NmtError, msg: String) -> PyErr {
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

pub fn io_exception(e: &std::io::Error, msg: String) -> PyErr {
    if e.kind() == std::io::ErrorKind::NotFound {
        PyFileNotFoundError::new_err(msg)
    } else {
        PyOSError::new_err(msg)
    }
}

pub fn py_err(e: NmtError) -> PyErr {
    let msg = e.to_string();
    exception(&e, msg)
}

/// An application error (the metrics' and selection's `anyhow` errors): the first library or I/O error in
/// its chain decides the exception; the message is the whole chain's.
pub fn py_err_any(e: anyhow::Error) -> PyErr {
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
pub fn guarded<T>(f: impl FnOnce() -> PyResult<T>) -> PyResult<T> {
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
pub fn interruptible<T: Send>(
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
