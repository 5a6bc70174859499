//! Data handling for cgnmt: reading corpora, tokenization, vocabularies, optional BPE, the
//! source/target preprocessing pipeline of a model, and the `cgnmt prepare` command.
//!
//! * [`corpus`] – plain or gzipped UTF-8 corpora, line-aligned parallel files.
//! * [`tokenize`] – whitespace / jieba / punctuation / character tokenizers and detokenizers.
//! * [`vocab`] – word counts and vocabularies (EOS = 0, UNK = 1).
//! * [`bpe`] – BPE subwords with the `@@` continuation marker.
//! * [`preprocess`] – [`Preprocessor`], stored as `preprocess.json`.
//! * [`prepare`] – the `prepare` sub-command.
//!
//! Errors are [`DataError`] values that name the file (and line) concerned; nothing here
//! panics on user input.

pub mod bpe;
pub mod corpus;
pub mod error;
pub mod prepare;
pub mod preprocess;
pub mod store;
pub mod tokenize;
pub mod vocab;

pub use bpe::{merge_subwords, word_index_of_subwords, BpeModel, SubwordKind, BPE_MARKER};
pub use corpus::{read_lines, read_parallel};
pub use error::DataError;
pub use prepare::{run_prepare, PrepareOptions};
pub use preprocess::{Preprocessor, SideConfig, PREPROCESS_FILE};
pub use tokenize::{default_for_lang, detokenize, Tokenizer, TokenizerConfig, TokenizerKind};
pub use vocab::{count_tokens, coverage, Vocab, WordCounts, EOS_ID, EOS_TOKEN, UNK_ID, UNK_TOKEN};
