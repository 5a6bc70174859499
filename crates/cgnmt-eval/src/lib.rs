//! `cgnmt-eval`: evaluation metrics for cgnmt (context-gated NMT, Tu et al., TACL 2017).
//!
//! - [`bleu`]: corpus / sentence BLEU as sacreBLEU 2.x, NIST `mteval-v11b.pl` (the paper's
//!   metric), `mteval-v13a.pl` and Moses `multi-bleu.perl` compute it, with the tokenisers in
//!   [`tokenize`];
//! - [`chrf`]: chrF / chrF++ as sacreBLEU computes them;
//! - [`significance`]: sign test, paired bootstrap resampling and approximate randomization;
//! - [`seeds`]: tests across training runs (Welch's t, a permutation of the runs' labels, a bootstrap
//!   over runs and sentences) with MultEval's s_opt and s_sel;
//! - [`aer`]: alignment error rate on `.talp` files and soft AER on attention matrices;
//! - [`analysis`]: the paper's analyses — BLEU and output length by source-length group,
//!   gate values against sentence-BLEU improvement (Pearson), context scaling — and readers of
//!   translation dumps and training logs;
//! - [`plot`]: PNG / SVG figures (attention heatmap with gates, length groups, context
//!   scaling, training curves) with fonts compiled in;
//! - [`report`]: the evaluation over files as the `score`, `compare`, `aer`, `analyze …` and
//!   `plot …` commands run it (options in, a text or JSON report out);
//! - [`io`]: reading UTF-8 text files with errors that name file and line.
//!
//! Every metric is checked against the oracle fixtures in `shared/fixtures` (see README.md).

pub mod aer;
pub mod analysis;
pub mod bleu;
pub mod chrf;
mod error;
pub mod io;
pub mod plot;
pub mod report;
pub mod seeds;
pub mod significance;
pub mod tokenize;

pub use bleu::{
    corpus_bleu, score_from_stats, sentence_bleu, sentence_stats, BleuOptions, BleuScore,
    BleuStats, RefLen, Smooth,
};
pub use error::EvalError;
pub use tokenize::Tokenize;
