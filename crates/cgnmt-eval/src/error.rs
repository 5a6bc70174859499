//! Error type of the evaluation library.

use std::path::PathBuf;

/// Everything that can go wrong while reading evaluation inputs or computing a metric.
///
/// Every variant carries enough context (file, line, offending token) to be shown to a
/// user as is; no function of this crate panics on malformed user input.
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// A file could not be opened or read.
    #[error("{path}: cannot read: {source}", path = .path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A line of a text file is not valid UTF-8.
    #[error("{path}:{line}: invalid UTF-8 ({detail})", path = .path.display())]
    InvalidUtf8 {
        /// The file (`<stdin>` for standard input).
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What the decoder said.
        detail: String,
    },
    /// A file that must hold at least one line is empty.
    #[error("{path}: file is empty", path = .path.display())]
    EmptyFile {
        /// The file.
        path: PathBuf,
    },
    /// Two files that must be parallel have different numbers of lines.
    #[error(
        "line count mismatch: {a} has {a_lines} lines but {b} has {b_lines}",
        a = .a.display(),
        b = .b.display()
    )]
    LineCountMismatch {
        /// First file.
        a: PathBuf,
        /// Its number of lines.
        a_lines: usize,
        /// Second file.
        b: PathBuf,
        /// Its number of lines.
        b_lines: usize,
    },
    /// In-memory inputs that must be parallel have different lengths.
    #[error("length mismatch: {what}: expected {expected}, got {got}")]
    LengthMismatch {
        /// What was being compared.
        what: String,
        /// The expected length.
        expected: usize,
        /// The length found.
        got: usize,
    },
    /// No reference was given.
    #[error("at least one reference is required")]
    NoReferences,
    /// No segment at all (empty corpus).
    #[error("empty corpus: no segments to score")]
    EmptyCorpus,
    /// A malformed alignment link in a `.talp` file.
    #[error("{path}:{line}: malformed link `{link}`: {reason}", path = .path.display())]
    MalformedLink {
        /// The file (`<input>` for in-memory text).
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The offending link text.
        link: String,
        /// Why it is malformed.
        reason: String,
    },
    /// An alignment link whose index is outside the sentence.
    #[error(
        "{path}:{line}: link `{link}` out of range (first sentence has {len_first} words, second has {len_second})",
        path = .path.display()
    )]
    LinkOutOfRange {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The offending link.
        link: String,
        /// Length of the sentence the first index refers to.
        len_first: usize,
        /// Length of the sentence the second index refers to.
        len_second: usize,
    },
    /// A malformed soft-alignment (attention) record.
    #[error("{path}:{line}: invalid soft alignment: {reason}", path = .path.display())]
    SoftAlignment {
        /// The file.
        path: PathBuf,
        /// 1-based line number (sentence index + 1 for in-memory input).
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// A malformed line of a JSON-lines file (translation dump, training log).
    #[error("{path}:{line}: {reason}", path = .path.display())]
    JsonLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// An invalid option value or combination.
    #[error("invalid option: {0}")]
    InvalidOption(String),
}
