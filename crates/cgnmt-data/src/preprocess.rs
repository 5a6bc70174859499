//! The full text ↔ token pipeline of a trained model, stored as `preprocess.json`.
//!
//! `preprocess.json` (written by `cgnmt prepare`, to be copied next to a model) looks like
//! ```json
//! {"src":{"tokenizer":{"kind":"jieba","lowercase":false},"bpe":null},
//!  "tgt":{"tokenizer":{"kind":"punct","lowercase":true},"bpe":"bpe.tgt.json"}}
//! ```
//! `bpe` is a file name relative to the directory holding `preprocess.json`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::bpe::{merge_subwords, BpeModel};
use crate::error::DataError;
use crate::tokenize::{detokenize, Tokenizer, TokenizerConfig};
use crate::vocab::EOS_TOKEN;

/// File name of the serialized [`Preprocessor`].
pub const PREPROCESS_FILE: &str = "preprocess.json";

/// Settings of one side (source or target).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct SideConfig {
    /// Word tokenizer.
    pub tokenizer: TokenizerConfig,
    /// BPE model file, relative to the directory of `preprocess.json`; `None` = words only.
    #[serde(default)]
    pub bpe: Option<PathBuf>,
}

#[derive(Clone, Debug)]
struct Side {
    tokenizer: Tokenizer,
    bpe: Option<BpeModel>,
}

impl Side {
    fn new(cfg: &SideConfig, dir: &Path) -> Result<Side, DataError> {
        let bpe = match &cfg.bpe {
            Some(rel) => Some(BpeModel::load(&dir.join(rel))?),
            None => None,
        };
        Ok(Side {
            tokenizer: Tokenizer::new(cfg.tokenizer.clone()),
            bpe,
        })
    }

    fn words(&self, line: &str) -> Vec<String> {
        self.tokenizer.tokenize(line)
    }

    fn from_words(&self, words: &[String]) -> Vec<String> {
        let words: Vec<String> = if self.tokenizer.config().lowercase {
            words.iter().map(|w| w.to_lowercase()).collect()
        } else {
            words.to_vec()
        };
        match &self.bpe {
            Some(b) => b.apply(&words),
            None => words,
        }
    }

    fn tokens(&self, line: &str) -> Vec<String> {
        let words = self.words(line);
        match &self.bpe {
            Some(b) => b.apply(&words),
            None => words,
        }
    }
}

/// Source and target preprocessing: tokenizer + optional BPE per side.
///
/// Build it with [`Preprocessor::new`] or [`Preprocessor::load`], which also load the BPE
/// models. (A value deserialized by other means has no BPE models loaded and then only
/// tokenizes; call [`Preprocessor::with_dir`] on it.)
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct Preprocessor {
    /// Source side settings.
    pub src: SideConfig,
    /// Target side settings.
    pub tgt: SideConfig,
    #[serde(skip)]
    runtime: Option<Arc<(Side, Side)>>,
}

impl Preprocessor {
    /// Builds a preprocessor; BPE files named in the configs are loaded from `dir`.
    pub fn new(src: SideConfig, tgt: SideConfig, dir: &Path) -> Result<Self, DataError> {
        Preprocessor {
            src,
            tgt,
            runtime: None,
        }
        .with_dir(dir)
    }

    /// Loads the tokenizers and BPE models (BPE files relative to `dir`).
    pub fn with_dir(mut self, dir: &Path) -> Result<Self, DataError> {
        let s = Side::new(&self.src, dir)?;
        let t = Side::new(&self.tgt, dir)?;
        self.runtime = Some(Arc::new((s, t)));
        Ok(self)
    }

    /// Reads `dir/preprocess.json` and the BPE files it names.
    pub fn load(dir: &Path) -> Result<Self, DataError> {
        let path = dir.join(PREPROCESS_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| DataError::io("read", &path, e))?;
        let p: Preprocessor = serde_json::from_str(&text).map_err(|e| DataError::Json {
            path: path.clone(),
            source: e,
        })?;
        p.with_dir(dir)
    }

    /// Writes `dir/preprocess.json` (the BPE files must be put in `dir` separately).
    pub fn save(&self, dir: &Path) -> Result<(), DataError> {
        let path = dir.join(PREPROCESS_FILE);
        let text = serde_json::to_string_pretty(self).map_err(|e| DataError::Json {
            path: path.clone(),
            source: e,
        })?;
        std::fs::write(&path, text + "\n").map_err(|e| DataError::io("write", &path, e))
    }

    fn with_side<R>(&self, tgt: bool, f: impl FnOnce(&Side) -> R) -> R {
        match &self.runtime {
            Some(rt) => f(if tgt { &rt.1 } else { &rt.0 }),
            None => {
                let cfg = if tgt { &self.tgt } else { &self.src };
                f(&Side {
                    tokenizer: Tokenizer::new(cfg.tokenizer.clone()),
                    bpe: None,
                })
            }
        }
    }

    /// The source side's subword model, if any (loaded with the directory).
    pub fn src_subwords(&self) -> Option<&BpeModel> {
        self.runtime.as_ref().and_then(|rt| rt.0.bpe.as_ref())
    }

    /// The target side's subword model, if any.
    pub fn tgt_subwords(&self) -> Option<&BpeModel> {
        self.runtime.as_ref().and_then(|rt| rt.1.bpe.as_ref())
    }

    /// Source line → model tokens (tokenize, then BPE if configured).
    pub fn src_tokens(&self, line: &str) -> Vec<String> {
        self.with_side(false, |s| s.tokens(line))
    }

    /// Target line → model tokens (tokenize, then BPE if configured).
    pub fn tgt_tokens(&self, line: &str) -> Vec<String> {
        self.with_side(true, |s| s.tokens(line))
    }

    /// Source line → words (tokenize only, no BPE); e.g. for alignment evaluation.
    pub fn src_words(&self, line: &str) -> Vec<String> {
        self.with_side(false, |s| s.words(line))
    }

    /// Target line → words (tokenize only, no BPE).
    pub fn tgt_words(&self, line: &str) -> Vec<String> {
        self.with_side(true, |s| s.words(line))
    }

    /// Already-tokenised source words → model tokens (lowercased if the tokenizer lowercases, then BPE);
    /// used for alignment test sets whose tokens are fixed.
    pub fn src_bpe_apply(&self, words: &[String]) -> Vec<String> {
        self.with_side(false, |s| s.from_words(words))
    }

    /// Already-tokenised target words → model tokens.
    pub fn tgt_bpe_apply(&self, words: &[String]) -> Vec<String> {
        self.with_side(true, |s| s.from_words(words))
    }

    /// Model output tokens → text: drop `</s>` tokens, merge BPE subwords if the target uses
    /// BPE, then detokenize with the target tokenizer's kind (lowercasing is not undone).
    pub fn postprocess_tgt<S: AsRef<str>>(&self, tokens: &[S]) -> String {
        let tokens: Vec<&str> = tokens
            .iter()
            .map(|t| t.as_ref())
            .filter(|t| *t != EOS_TOKEN)
            .collect();
        let words: Vec<String> = if self.tgt.bpe.is_some() {
            merge_subwords(&tokens)
        } else {
            tokens.iter().map(|t| (*t).to_owned()).collect()
        };
        detokenize(&words, self.tgt.tokenizer.kind)
    }
}
