//! cgnmt: context-gated neural machine translation (Tu et al., TACL 2017) on candle.
//!
//! Folders by role: [`model`] (one module per concept of the paper: encoder, attention, gate, coverage, GRU,
//! decoder cell, readout, the fused decoder sequence), [`kernels`] (row maths and custom ops), [`decode`]
//! (beam search, translation, shortlists, rescoring, alignment), [`train`] (the training loop, optimiser,
//! batches, checkpoints, averaging, model selection) and [`cmd`] (the applications behind the subcommands:
//! demo, reproduce, serve, bench, data, subjective evaluation); configuration in [`config`]. Data preparation
//! lives in the `cgnmt-data` crate and the evaluation metrics (BLEU, chrF, significance tests, AER) in
//! `cgnmt-eval`. What each part computes: `docs/model-spec.md`.

pub mod atomic_file;
pub mod bench;
pub mod cluster;
pub mod config;
pub mod decode;
pub mod error;
pub mod kernels;
pub mod model;
pub mod process;
pub mod train;

pub use cgnmt_data;
pub use cgnmt_eval;

pub use decode::alignment::Alignment;
pub use decode::translate::{InputLimit, LongInput, LongLine, Translation};
pub use decode::translator::{ShortlistOptions, TranslateOptions, Translator, TranslatorOptions};
pub use error::{NmtError, Result};
pub use model::store::LoadedModel;

/// The commit this library was built from (`-modified` when the working tree differed; "unknown" outside a
/// git checkout), for records and reports.
pub const COMMIT: &str = env!("CGNMT_COMMIT");

/// The library's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The version and the commit, as `cgnmt --version` prints them.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("CGNMT_COMMIT"),
    ")"
);
