//! What `results.json` holds: the rows (each system's runs, mean ± sd, significance against its baseline),
//! the extra test sets' tables, the ranking's stability, the paper's analyses, and how and where it was made.
//! [`crate::analyses`] computes it from the run files; the report is rendered from it only.

use cgnmt_eval::analysis::{self, ContextScaling, LengthGroups};
use cgnmt_eval::significance::SignTestResult;
use serde::Serialize;

use crate::RunResult;

#[derive(Debug, Clone, Serialize)]
pub struct Row {
    pub system: String,
    pub table: String,
    pub baseline: Option<String>,
    pub seeds: Vec<u64>,
    /// Test BLEU (mteval-v11b) per seed, in `seeds` order.
    pub bleu: Vec<f64>,
    pub mean: Option<f64>,
    /// Sample standard deviation over seeds (n − 1); none with one seed.
    pub sd: Option<f64>,
    pub sacrebleu_mean: Option<f64>,
    pub chrf_mean: Option<f64>,
    /// Output words / reference words, mean over seeds.
    pub length_ratio: Option<f64>,
    /// sacreBLEU's length ratio (13a tokens of the output / of the reference), mean over seeds.
    pub bleu_length_ratio: Option<f64>,
    /// Mean BLEU minus the baseline's mean BLEU.
    pub delta: Option<f64>,
    pub tests: Option<Tests>,
    pub paper: Option<f64>,
    /// The paper's BLEU of this row minus its baseline's.
    pub paper_delta: Option<f64>,
    pub params: Option<usize>,
    pub train_seconds_mean: Option<f64>,
    pub decode_seconds_mean: Option<f64>,
    pub steps: Option<u64>,
    /// The seed whose test BLEU is the median (lower median): the analyses use its outputs.
    pub median_seed: Option<u64>,
}

/// The rows on an extra test set.
#[derive(Debug, Clone, Serialize)]
pub struct ExtraTable {
    pub name: String,
    pub description: String,
    pub sentences: usize,
    pub min_ref_words: usize,
    pub rows: Vec<ExtraRow>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ExtraRow {
    pub system: String,
    pub baseline: Option<String>,
    pub seeds: Vec<u64>,
    /// mteval-v11b BLEU per seed.
    pub bleu: Vec<f64>,
    pub mean: Option<f64>,
    pub sd: Option<f64>,
    pub sacrebleu_mean: Option<f64>,
    pub chrf_mean: Option<f64>,
    pub length_ratio: Option<f64>,
    /// sacreBLEU's length ratio (13a tokens of the output / of the reference), mean over seeds.
    pub bleu_length_ratio: Option<f64>,
    pub delta: Option<f64>,
    /// Paired bootstrap p against the baseline on the pooled outputs (seed s with seed s).
    pub bootstrap_p: Option<f64>,
}

/// Significance of a row against its baseline on the pooled outputs: every seed both have, the system's
/// seed s paired with the baseline's seed s, sentence by sentence.
#[derive(Debug, Clone, Serialize)]
pub struct Tests {
    pub seeds: Vec<u64>,
    pub segments: usize,
    pub base_bleu: f64,
    pub sys_bleu: f64,
    pub bootstrap_p: f64,
    pub ar_p: f64,
    pub sign: SignTestResult,
    /// The tests across training runs (Welch's t over the seeds' BLEU, the label permutation, the bootstrap
    /// over seeds and sentences, s_opt and s_sel), over every seed of each system (`None` with one seed).
    pub seed_level: Option<cgnmt_eval::seeds::RunComparison>,
}

impl Tests {
    /// Welch's p over the seeds, where there are at least two a side.
    pub fn welch_p(&self) -> Option<f64> {
        self.seed_level
            .as_ref()
            .and_then(|c| c.welch)
            .map(|w| w.p_value)
    }

    /// The difference is significant at 0.05: the paired bootstrap over the pooled outputs and Welch's test
    /// over the seeds both say so (with one seed a side there is no seed-level test, and no claim).
    pub fn significant(&self) -> bool {
        self.bootstrap_p < 0.05 && self.welch_p().is_some_and(|p| p < 0.05)
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct StabilityRow {
    pub system: String,
    /// Mean over seeds of the best dev BLEU among the evaluations up to `at_step`.
    pub dev_bleu_at: f64,
    /// Mean over seeds of the best dev BLEU of the whole run.
    pub dev_bleu_final: f64,
}

/// Would 20% more training have reordered the rows? Compared on dev BLEU (model selection's measure): the
/// rows' order at 1/1.2 of the budget against their order at the end.
#[derive(Debug, Clone, Serialize)]
pub struct Stability {
    pub at_step: u64,
    pub final_step: u64,
    pub rows: Vec<StabilityRow>,
    /// Kendall's τ between the two orders.
    pub kendall_tau: Option<f64>,
    /// Pairs of rows whose order differs.
    pub swapped_pairs: Vec<(String, String)>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GateCorrelationResult {
    pub system: String,
    pub system_seed: u64,
    pub baseline: String,
    pub baseline_seed: u64,
    pub signature: String,
    pub correlations: Vec<analysis::Correlation>,
}

#[derive(Debug, Clone, Serialize)]
pub struct GateHistogram {
    pub system: String,
    pub seed: u64,
    /// Fraction of target words whose mean gate value falls in each of 20 bins over [0, 1].
    pub fractions: Vec<f64>,
    pub words: usize,
    pub mean: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct ScalingResult {
    pub system: String,
    pub seed: u64,
    pub scaling: ContextScaling,
}

#[derive(Debug, Clone, Serialize)]
pub struct SubjectiveResult {
    pub baseline: String,
    pub system: String,
    pub pairs: usize,
    pub identical: usize,
    pub pairs_file: String,
    pub key_file: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct AlignmentSystem {
    pub system: String,
    pub seeds: Vec<u64>,
    pub aer: Vec<f64>,
    pub saer: Vec<f64>,
    pub aer_mean: Option<f64>,
    pub aer_sd: Option<f64>,
    pub saer_mean: Option<f64>,
    pub saer_sd: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct AlignmentResult {
    pub name: String,
    pub sentences: usize,
    pub systems: Vec<AlignmentSystem>,
}

#[derive(Debug, Clone, Serialize)]
pub struct FigureRef {
    /// File name under `figures/`.
    pub file: String,
    pub caption: String,
}

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Invocation {
    /// Names the invocation: its lines are written as it goes (after each finished run), the last one counts.
    #[serde(default)]
    pub id: String,
    /// A line written on the way: the invocation had not finished when it was written (if it is the last of
    /// its id, it was interrupted).
    #[serde(default)]
    pub partial: bool,
    pub wall_seconds: f64,
    /// Child processes (training, decoding, aligning) and data preparation.
    pub work_seconds: f64,
    #[serde(default)]
    pub own_seconds: f64,
    #[serde(default)]
    pub jobs: usize,
    pub report_only: bool,
    /// The command line, and the commit its binary was built from (absent in records of earlier versions).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub command: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub commit: String,
}

impl Invocation {
    /// This process's command line and its binary's commit, for a record.
    pub fn this_process() -> (String, String) {
        (
            std::env::args().collect::<Vec<_>>().join(" "),
            cgnmt::COMMIT.to_string(),
        )
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    pub commit: String,
    pub cpu: String,
    pub cores: usize,
    pub cgnmt_version: String,
    pub command: String,
    pub date: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct Results {
    pub plan: String,
    pub description: String,
    pub plan_file: String,
    pub quick: bool,
    pub seeds: Vec<u64>,
    pub beam: usize,
    pub environment: Environment,
    pub shared_settings: Vec<String>,
    pub systems: Vec<super::plan::SystemSpec>,
    pub tables: Vec<(String, String)>,
    pub test_sentences: usize,
    pub references: usize,
    pub runs: Vec<RunResult>,
    pub pending: Vec<String>,
    pub rows: Vec<Row>,
    /// The rows on each extra test set.
    #[serde(default)]
    pub extra_tests: Vec<ExtraTable>,
    pub stability: Vec<(String, Stability)>,
    pub gate_correlation: Option<GateCorrelationResult>,
    pub gate_histogram: Vec<GateHistogram>,
    pub context_scaling: Vec<ScalingResult>,
    pub length_groups: Option<LengthGroups>,
    pub subjective: Option<SubjectiveResult>,
    pub alignment: Vec<AlignmentResult>,
    pub figures: Vec<FigureRef>,
    /// Run directories whose dumps the analyses read (kept under version control; other dumps are not).
    pub dumps_read: Vec<String>,
    pub invocations: Vec<Invocation>,
}
