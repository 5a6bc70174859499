//! The evaluation over files, as the `score`, `compare`, `aer`, `analyze` and `plot` commands run it: read
//! the files (checking line counts, encodings and formats), compute, and write the report as text or JSON.
//! Each takes its options ([`ScoreOptions`], [`CompareOptions`], [`AerOptions`], [`AnalyzeOptions`] with the
//! analyses `lengths`, `gates`, `context-scaling`, and [`PlotOptions`] with `attention` and `training`) and a
//! writer: [`run_score_to`], [`run_compare_to`], [`run_aer_to`], [`run_analyze_to`], [`run_plot_to`] (the
//! `run_*` forms write to standard output).
//!
//! The run functions return errors (file and line, mismatched line counts, empty files,
//! invalid UTF-8, malformed links) instead of panicking; a closed pipe is reported as an error too.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use clap::ValueEnum;
use serde_json::json;

use crate::aer;
use crate::bleu::{corpus_bleu, sentence_bleu, BleuOptions, BleuScore, Smooth};
use crate::chrf::{corpus_chrf, sentence_chrf, ChrfOptions, ChrfScore};
use crate::io::{read_nonempty_lines, read_stdin_lines};
use crate::significance::{self, Metric};
use crate::tokenize::Tokenize;
use crate::EvalError;

mod alignment;
mod analyze;
mod compare;
mod plot;
mod score;

pub use alignment::*;
pub use analyze::*;
pub use compare::*;
pub use plot::*;
pub use score::*;

/// Metric selection on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum MetricArg {
    /// Corpus BLEU.
    Bleu,
    /// chrF2.
    Chrf,
    /// chrF2++ (word order 2).
    #[value(name = "chrf++")]
    ChrfPlusPlus,
}

/// Tokeniser selection on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TokenizeArg {
    /// sacreBLEU 13a (default).
    #[value(name = "13a")]
    T13a,
    /// sacreBLEU intl.
    Intl,
    /// sacreBLEU zh.
    Zh,
    /// sacreBLEU char.
    Char,
    /// sacreBLEU none (whitespace only).
    #[value(name = "none")]
    NoTok,
    /// NIST mteval-v11b.pl tokenisation (byte semantics).
    #[value(name = "mteval-v11b")]
    MtevalV11b,
    /// NIST mteval-v13a.pl default tokenisation.
    #[value(name = "mteval-v13a")]
    MtevalV13a,
    /// NIST mteval-v13a.pl --international-tokenization.
    #[value(name = "mteval-v13a-intl")]
    MtevalV13aIntl,
    /// Moses multi-bleu.perl (ASCII whitespace).
    #[value(name = "multi-bleu")]
    MultiBleu,
}

impl From<TokenizeArg> for Tokenize {
    fn from(t: TokenizeArg) -> Tokenize {
        match t {
            TokenizeArg::T13a => Tokenize::Tok13a,
            TokenizeArg::Intl => Tokenize::Intl,
            TokenizeArg::Zh => Tokenize::Zh,
            TokenizeArg::Char => Tokenize::Char,
            TokenizeArg::NoTok => Tokenize::None,
            TokenizeArg::MtevalV11b => Tokenize::MtevalV11b,
            TokenizeArg::MtevalV13a => Tokenize::MtevalV13a,
            TokenizeArg::MtevalV13aIntl => Tokenize::MtevalV13aIntl,
            TokenizeArg::MultiBleu => Tokenize::MultiBleu,
        }
    }
}

/// Smoothing selection on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SmoothArg {
    /// Exponential (mteval-v13a / sacreBLEU default).
    Exp,
    /// No smoothing.
    #[value(name = "none")]
    Off,
    /// Floor (value default 0.1).
    Floor,
    /// Add-k (value default 1).
    #[value(name = "add-k")]
    AddK,
}

/// Options shared by `score` and `compare` that configure BLEU / chrF.
#[derive(Debug, Clone)]
pub struct MetricOptions {
    /// BLEU tokenisation (default 13a).
    pub tokenize: Option<TokenizeArg>,
    /// Case-insensitive scoring (`-lc` works as in sacreBLEU).
    pub lowercase: bool,
    /// (Hidden: makes sacreBLEU's `-lc` parse as `-l -c`.)
    pub lc_c: bool,
    /// BLEU smoothing (default exp).
    pub smooth: Option<SmoothArg>,
    /// Value for floor / add-k smoothing.
    pub smooth_value: Option<f64>,
    /// NIST mteval-v11b.pl BLEU (the paper's metric): its tokenisation, shortest reference
    /// length, no smoothing, case-insensitive unless --cased.
    pub mteval_v11b: bool,
    /// With --mteval-v11b: case-sensitive (mteval's `-c`).
    pub cased: bool,
}

impl MetricOptions {
    fn lowercase(&self) -> bool {
        self.lowercase || self.lc_c
    }

    /// The BLEU options these flags describe.
    pub fn bleu_options(&self) -> anyhow::Result<BleuOptions> {
        if self.mteval_v11b {
            if self.tokenize.is_some() || self.smooth.is_some() || self.lowercase() {
                bail!("--mteval-v11b fixes tokenisation, smoothing and case (use --cased for -c); drop --tokenize/--smooth/-lc");
            }
            let mut o = BleuOptions::mteval_v11b();
            o.lowercase = !self.cased;
            return Ok(o);
        }
        let mut o = BleuOptions::sacrebleu();
        if let Some(t) = self.tokenize {
            o.tokenize = t.into();
        }
        o.lowercase = self.lowercase();
        let v = self.smooth_value;
        o.smooth = match (self.smooth.unwrap_or(SmoothArg::Exp), v) {
            (SmoothArg::Exp, None) => Smooth::Exp,
            (SmoothArg::Off, None) => Smooth::None,
            (SmoothArg::Floor, v) => Smooth::Floor(v.unwrap_or(0.1)),
            (SmoothArg::AddK, v) => Smooth::AddK(v.unwrap_or(1.0)),
            (s, Some(_)) => {
                bail!("--smooth-value only applies to floor and add-k smoothing, not {s:?}")
            }
        };
        if let Some(x) = v {
            if !(x.is_finite() && x >= 0.0) {
                bail!("--smooth-value must be a finite non-negative number, got {x}");
            }
        }
        Ok(o)
    }

    /// The chrF options these flags describe (BLEU-only flags are rejected).
    pub fn chrf_options(&self, plus_plus: bool) -> anyhow::Result<ChrfOptions> {
        if self.tokenize.is_some()
            || self.smooth.is_some()
            || self.smooth_value.is_some()
            || self.mteval_v11b
        {
            bail!("--tokenize, --smooth, --smooth-value and --mteval-v11b apply to BLEU only");
        }
        let mut o = if plus_plus {
            ChrfOptions::chrf_plus_plus()
        } else {
            ChrfOptions::chrf()
        };
        o.lowercase = self.lowercase();
        Ok(o)
    }

    fn metric(&self, m: MetricArg) -> anyhow::Result<Metric> {
        Ok(match m {
            MetricArg::Bleu => Metric::Bleu(self.bleu_options()?),
            MetricArg::Chrf => Metric::Chrf(self.chrf_options(false)?),
            MetricArg::ChrfPlusPlus => Metric::Chrf(self.chrf_options(true)?),
        })
    }
}
