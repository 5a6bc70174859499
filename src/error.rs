//! Library error type.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum NmtError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("configuration error: {0}")]
    Config(String),
    #[error("model directory {dir}: {msg}")]
    ModelDir { dir: PathBuf, msg: String },
    #[error("{0}")]
    Data(String),
    /// An option out of its range (a beam of 0, a negative penalty): the message names the option.
    #[error("{0}")]
    Options(String),
    /// Stopped on request (an interrupted caller) before the work was done.
    #[error("{0}")]
    Interrupted(String),
    #[error(transparent)]
    DataCrate(#[from] cgnmt_data::DataError),
    #[error("tensor error: {0}")]
    Candle(#[from] candle_core::Error),
}

impl NmtError {
    pub fn io(path: &Path, source: std::io::Error) -> Self {
        NmtError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
    pub fn model_dir(dir: &Path, msg: impl Into<String>) -> Self {
        NmtError::ModelDir {
            dir: dir.to_path_buf(),
            msg: msg.into(),
        }
    }
}

pub type Result<T> = std::result::Result<T, NmtError>;
