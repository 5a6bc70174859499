//! The error type of this crate.

use std::path::PathBuf;

/// Everything that can go wrong while reading, writing or checking data files.
///
/// Every variant that concerns a file names it, and a 1-based line number where one applies,
/// so that the message alone tells a user what to fix.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// The file does not exist.
    #[error("file not found: {}", path.display())]
    NotFound {
        /// The missing file.
        path: PathBuf,
    },
    /// Any other I/O failure (permissions, a corrupt gzip stream, a full disk, ...).
    #[error("cannot {action} {}: {source}", path.display())]
    Io {
        /// What was being done ("read", "write", "create", ...).
        action: &'static str,
        /// The file concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A line is not valid UTF-8.
    #[error("{}: line {line} is not valid UTF-8 (byte offset {valid_up_to} within the line); the corpus must be UTF-8 text", path.display())]
    InvalidUtf8 {
        /// The file concerned.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// Number of valid bytes at the start of that line.
        valid_up_to: usize,
    },
    /// The two sides of a parallel corpus do not have the same number of lines.
    #[error("parallel corpus is not line-aligned: {} has {src_lines} lines but {} has {tgt_lines} lines", src.display(), tgt.display())]
    LineCountMismatch {
        /// Source file.
        src: PathBuf,
        /// Its number of lines.
        src_lines: usize,
        /// Target file.
        tgt: PathBuf,
        /// Its number of lines.
        tgt_lines: usize,
    },
    /// A corpus file has no lines at all.
    #[error("corpus is empty: {} has no lines", path.display())]
    EmptyCorpus {
        /// The empty file.
        path: PathBuf,
    },
    /// A line of a vocabulary, counts or other text data file is malformed.
    #[error("{}: line {line}: {message}", path.display())]
    Format {
        /// The file concerned.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// A binary token store is damaged, truncated or of another format.
    #[error("{}: {message}", path.display())]
    Store {
        /// The store file.
        path: PathBuf,
        /// What is wrong with it.
        message: String,
    },
    /// A JSON file (preprocess.json, a BPE model) could not be parsed or written.
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        /// The file concerned.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: serde_json::Error,
    },
    /// Training, loading or applying a BPE model failed.
    #[error("BPE error{}: {message}", path.as_ref().map(|p| format!(" ({})", p.display())).unwrap_or_default())]
    Bpe {
        /// The model file, when one is concerned.
        path: Option<PathBuf>,
        /// What went wrong.
        message: String,
    },
    /// An invalid setting (e.g. a vocabulary size of zero).
    #[error("invalid configuration: {0}")]
    Config(String),
}

impl DataError {
    /// Wraps an I/O error, turning "not found" into [`DataError::NotFound`].
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        let path = path.into();
        if source.kind() == std::io::ErrorKind::NotFound {
            DataError::NotFound { path }
        } else {
            DataError::Io {
                action,
                path,
                source,
            }
        }
    }

    /// A [`DataError::Format`] error.
    pub fn format(path: impl Into<PathBuf>, line: usize, message: impl Into<String>) -> Self {
        DataError::Format {
            path: path.into(),
            line,
            message: message.into(),
        }
    }
}
