//! cgnmt: context-gated neural machine translation (Tu et al., TACL 2017) on candle.
//!
//! The front door: a model directory (written by training) opened as a [`Translator`], which translates
//! batches of sentences ([`TranslateOptions`]: beam, n-best, penalties, context scaling; on request each
//! output word's attention, the context gate's values and the coverage), scores given translations (each
//! word's log-probability) and force-aligns sentence pairs.
//! Training is [`train::train`]; the metrics are in the `cgnmt-eval` crate, data preparation in `cgnmt-data`.
//!
//! The whole path on a toy corpus (prepare, train 30 updates, translate with attention and gates, align):
//!
//! ```
//! use cgnmt::{ScoreOptions, TranslateOptions, Translator, TranslatorOptions};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = std::env::temp_dir().join(format!("cgnmt-doc-{}", std::process::id()));
//! std::fs::create_dir_all(&dir)?;
//! // A toy parallel corpus: "a3 b1" → "x3 y1", …
//! let (mut src, mut tgt) = (String::new(), String::new());
//! for i in 0..60 {
//!     src += &format!("a{} b{}\n", i % 7, i % 5);
//!     tgt += &format!("x{} y{}\n", i % 7, i % 5);
//! }
//! for (name, text) in [("train.src", &src), ("train.tgt", &tgt)] {
//!     std::fs::write(dir.join(name), text)?;
//! }
//! let mut prep = cgnmt_data::PrepareOptions::new(dir.join("train.src"), dir.join("train.tgt"), dir.join("prep"));
//! (prep.dev_src, prep.dev_tgt) = (Some(dir.join("train.src")), Some(dir.join("train.tgt")));
//! (prep.src_tok, prep.tgt_tok) = (Some(cgnmt_data::TokenizerKind::Whitespace), Some(cgnmt_data::TokenizerKind::Whitespace));
//! prep.force = true;
//! cgnmt_data::prepare::prepare(&prep)?;
//!
//! let sets: Vec<String> = [
//!     format!("data.prepared={:?}", dir.join("prep").display().to_string()),
//!     "model.embedding_dim=8".into(), "model.hidden_dim=12".into(), "model.attention_dim=8".into(),
//!     "model.context_gate=both".into(), "train.batch_size=12".into(), "train.max_steps=30".into(),
//!     "train.optimizer=adam".into(), "train.eval_every=0".into(), "train.threads=1".into(),
//! ]
//! .into();
//! let config = cgnmt::config::Config::load(None, &sets)?;
//! let run = cgnmt::train::train(config, &dir.join("run"), false, true)?;
//! assert_eq!(run.state.step, 30);
//!
//! let tr = Translator::open(&[dir.join("run")], &TranslatorOptions::default())?;
//! let opts = TranslateOptions { beam: 3, nbest: 2, record: true, ..Default::default() };
//! let out = tr.translate(&["a3 b1".to_string(), String::new()], &opts)?;
//! let best = &out[0].hyps[0];
//! assert_eq!(out[0].hyps.len(), 2);
//! // One attention row per emitted word (EOS included), over the source words and EOS, summing to 1; one
//! // gate value per output word.
//! for row in &best.attention {
//!     assert_eq!(row.len(), 3);
//!     assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-4);
//! }
//! assert_eq!(best.gates.len(), out[0].tokens.len());
//! assert!(out[1].text.is_empty() && out[1].hyps.is_empty());
//!
//! // The best hypothesis scored again by forced decoding: per word and EOS, summing to the search's total.
//! let so = ScoreOptions { pretokenized: true, ..Default::default() };
//! let scored = tr.score(&["a3 b1".to_string()], &[out[0].tokens.join(" ")], &so)?;
//! assert_eq!(scored[0].token_scores.len(), out[0].tokens.len() + 1);
//! assert!((scored[0].score - best.score).abs() < 1e-3);
//!
//! let links = tr.align(&["a3 b1".to_string()], &["x3 y1".to_string()], 8)?;
//! assert_eq!(links[0].links.len(), 2); // each target word linked to a source word
//! std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```
//!
//! Folders by role: [`model`] (one module per concept of the paper: encoder, attention, gate, coverage, GRU,
//! decoder cell, readout, the fused decoder sequence; [`model::store`], the model directory), [`kernels`]
//! (row maths and custom ops), [`decode`] (beam search, the text pipeline, the [`Translator`], shortlists,
//! rescoring, alignment), [`train`] (the training loop, optimiser, batches, checkpoints, averaging, model
//! selection), [`cluster`] (several processes under MPI) and [`bench`] (what `cgnmt bench` measures);
//! configuration in [`config`]. What each part computes: `docs/model-spec.md`.

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
pub use decode::translator::{
    Score, ScoreOptions, ShortlistOptions, TranslateOptions, Translator, TranslatorOptions,
};
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
