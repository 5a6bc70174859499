//! Run configuration: every model, data, training and decoding setting, with the paper's names and values as
//! defaults. A TOML file is read, `--set section.key=value` overrides are applied on top, and unknown keys or
//! ill-typed values are rejected with a message that names the key.

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use crate::error::{NmtError, Result};

/// Decoder recurrent activation `f` (model-spec §3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DecoderKind {
    /// GRU with the context as an extra input to the reset gate, the update gate and the candidate.
    Gru,
    /// `t_i = tanh(W e + U t_{i-1} + C s_i + b)`.
    Vanilla,
    /// Conditional GRU (dl4mt/Nematus): a GRU over the word, attention queried with its state, a second GRU
    /// over the context; the gate acts on the second GRU.
    Cgru,
}

/// Context-gate strategy (model-spec §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ContextGate {
    None,
    Source,
    Target,
    Both,
}

/// Where the gate's scaling is applied (model-spec §4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GateForm {
    /// The released code: the previous state is scaled before the recurrent matrices and the GRU interpolates
    /// with the scaled state; word terms (with the candidate bias) and context terms are scaled.
    Reference,
    /// The paper's equations: the projected sums `W e + U t` are scaled after the products.
    Paper,
}

/// One input of the context gate `z = σ(W_z e + U_z t + C_z s)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GateInput {
    Word,
    State,
    Context,
}

/// The encoder's layers above the first (model-spec §1; Marian's `--enc-type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EncoderType {
    /// Every layer bidirectional.
    #[serde(rename = "bidirectional")]
    Bidirectional,
    /// A bidirectional first layer, then unidirectional (forward) layers of width 2H.
    #[serde(rename = "bi-unidirectional")]
    BiUnidirectional,
}

/// Coverage model (Tu et al. 2016; model-spec §5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CoverageKind {
    None,
    Linguistic,
    Neural,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    /// Word embedding dimension E (paper 620).
    pub embedding_dim: usize,
    /// Recurrent hidden size H (paper 1000); annotations are 2H.
    pub hidden_dim: usize,
    /// Hidden size of the attention MLP (GroundHog: H).
    pub attention_dim: usize,
    pub decoder: DecoderKind,
    pub context_gate: ContextGate,
    pub gate_form: GateForm,
    pub gate_inputs: Vec<GateInput>,
    /// Xu et al.'s gating scalar `β = σ(w·t + b)` on the whole source context.
    pub gating_scalar: bool,
    /// "both" combination with an input-independent learned `z`.
    pub static_interpolation: bool,
    pub coverage: CoverageKind,
    /// Linguistic coverage: learn a fertility `Φ_j = N σ(U_f h_j)`.
    pub coverage_fertility: bool,
    /// Maximum fertility N.
    pub coverage_max_fertility: f64,
    /// Dimension d of the neural coverage vector.
    pub coverage_dim: usize,
    /// Neural coverage as a GRU (true) or a plain tanh recurrence (false).
    pub coverage_gated: bool,
    /// Tie the output layer's `W_2` `[E, V]` to the target embeddings `E_y` `[V, E]` (`W_2 = E_yᵀ`, one
    /// parameter fewer of `E·V` values); false, the paper's recipe: separate weights.
    pub tied_output_embeddings: bool,
    /// Bidirectional encoder layers N (1, the paper's: one); the layers above the first read the annotations
    /// of the layer below, and the attention reads the top layer's (Marian's `--enc-depth`).
    pub encoder_layers: usize,
    /// The layers above the first: `"bidirectional"` (default) or `"bi-unidirectional"` (forward GRUs of width
    /// 2H over the annotations; Marian's `--enc-type bi-unidirectional`).
    pub encoder_type: EncoderType,
    /// With `encoder_layers` > 1: each layer above the first adds its input to its output (a residual
    /// connection, as Marian's deep encoders; false: the plain stack).
    pub residual: bool,
    /// Transitions per target step K (1, the paper's): the decoder's transition (the cGRU's context GRU) is
    /// followed by K − 1 GRUs over the state alone (a deep transition, Miceli Barone et al. 2017; Nematus's
    /// `--dec_base_recurrence_transition_depth` / Marian's `--dec-cell-base-depth`).
    pub decoder_transition_depth: usize,
    /// Layer normalisation (Ba et al. 2016) where Nematus and Marian's `s2s` put it (`--layer-normalization`):
    /// on each block of every recurrent cell's input and recurrent products, on the attention's keys and
    /// query, and on the readout's three terms, with a learned gain and bias each (model-spec §5b). false: the
    /// paper's model. (`cgnmt reproduce`'s fingerprints of runs leave it out when false, so that those from
    /// before this key are unchanged.)
    pub layer_norm: bool,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            embedding_dim: 620,
            hidden_dim: 1000,
            attention_dim: 1000,
            decoder: DecoderKind::Gru,
            context_gate: ContextGate::Both,
            gate_form: GateForm::Reference,
            gate_inputs: vec![GateInput::Word, GateInput::State, GateInput::Context],
            gating_scalar: false,
            static_interpolation: false,
            coverage: CoverageKind::None,
            coverage_fertility: true,
            coverage_max_fertility: 2.0,
            coverage_dim: 10,
            coverage_gated: true,
            tied_output_embeddings: false,
            encoder_layers: 1,
            encoder_type: EncoderType::Bidirectional,
            residual: true,
            decoder_transition_depth: 1,
            layer_norm: false,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DataConfig {
    /// Directory written by `cgnmt prepare` (tokenised text, word counts, preprocess.json).
    pub prepared: PathBuf,
    /// K most frequent source words kept (EOS and UNK are added on top).
    pub src_vocab_size: usize,
    pub tgt_vocab_size: usize,
    /// Training pairs with more than L tokens on either side are dropped (paper 80).
    pub max_len: usize,
    /// Use at most this many training pairs (0 = all).
    pub limit: usize,
}

impl Default for DataConfig {
    fn default() -> Self {
        Self {
            prepared: PathBuf::from("runs/prepared"),
            src_vocab_size: 30000,
            tgt_vocab_size: 30000,
            max_len: 80,
            limit: 0,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OptimizerKind {
    Adadelta,
    Adam,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TrainConfig {
    pub batch_size: usize,
    /// Batches read ahead and sorted by length together (paper ~20).
    pub sort_batches: usize,
    pub optimizer: OptimizerKind,
    /// Adam learning rate (Adadelta uses ρ/ε and a unit learning rate).
    pub learning_rate: f64,
    pub adadelta_rho: f64,
    pub adadelta_eps: f64,
    /// Global gradient-norm clipping threshold (0 = off).
    pub clip_norm: f64,
    pub seed: u64,
    /// Stop after this many updates (0 = no limit).
    pub max_steps: usize,
    /// Stop after this many epochs (0 = no limit).
    pub max_epochs: usize,
    /// Stop after this many seconds of training (0 = no limit).
    pub max_seconds: f64,
    /// Evaluate dev BLEU every N updates (0 = only at the end).
    pub eval_every: usize,
    /// Stop after this many evaluations without a dev BLEU improvement (0 = never).
    pub patience: usize,
    /// Write a resumable checkpoint every N updates (0 = only at evaluations and at the end).
    pub save_every: usize,
    /// Also keep the model of each of the last N saves of `last` as `ckpt-STEP/` beside it (for `cgnmt
    /// average`; 0 = none).
    pub keep_checkpoints: usize,
    /// Beam used for dev BLEU.
    pub eval_beam: usize,
    /// Evaluate on at most this many dev sentences (0 = all).
    pub eval_max_sentences: usize,
    /// Threads for the CPU kernels (0 = all cores).
    pub threads: usize,
    /// What a non-finite loss or gradient does: `stop` training with an error naming the update (the last
    /// checkpoint stays the resumable one), or `rollback` to the last checkpoint with half the learning rate
    /// (Adam; at most 8 times).
    pub on_divergence: OnDivergence,
    /// The dev score that picks `best/` and drives `patience`: `bleu` (mteval-v11b, the paper's),
    /// `smoothed-bleu` (the same with sacreBLEU's `exp` smoothing, so that an early model whose dev output
    /// has no matching 4-gram does not score 0 like every other), or `chrf` (chrF2).
    pub select_by: SelectBy,
    /// Decoupled weight decay λ (AdamW, Adam only): each update also subtracts `lr · λ · θ` from every
    /// parameter (0, the paper's recipe: none).
    pub weight_decay: f64,
    /// The target side's padded positions in a training batch: `skipped` (the fused decoder, readout and
    /// output layer compute the words' positions only) or `computed` too, under the mask (the same loss and
    /// gradients; `cgnmt bench --compare-target-padding` times the two).
    pub target_padding: TargetPadding,
    /// Label smoothing ε in `[0, 1)`: the training loss is `−(1 − ε) log p(y) − ε · mean_k log p(k)` per word
    /// (0, the paper's recipe: the plain negative log-likelihood; dev losses are always the plain one).
    pub label_smoothing: f64,
    /// Dropout rate on the source and target word embeddings in `[0, 1)` (0, the paper's recipe: none).
    pub embedding_dropout: f64,
    /// Dropout rate on the encoder's annotations `h_j` in `[0, 1)` (0: none).
    pub annotation_dropout: f64,
    /// Dropout rate on the readout's output `t̃_i`, the output layer's input, in `[0, 1)` (0: none).
    pub readout_dropout: f64,
    /// Variational dropout rate on the recurrent connections in `[0, 1)` (0: none): the previous state where
    /// the encoder's GRUs and the decoder's transition multiply it by `U_ru` and `U`, one mask per sentence
    /// and unit for all its steps (every decoder: GRU, vanilla, cGRU, either gate form).
    pub recurrent_dropout: f64,
    /// Exponential smoothing of the parameters (an exponential moving average of the weights, kept beside
    /// them; Marian's `--exponential-smoothing`): after update `t`, `θ̄ ← θ̄ + α_t (θ − θ̄)` with
    /// `α_t = max(rate, 9 / (10 + t))`, so that early on it averages about the last ninth of training and
    /// later the last `1/rate` updates. 0 (the paper's recipe): off. The smoothed weights are saved as
    /// `RUN/smoothed/` when training ends, a candidate for the model selection on dev.
    pub exponential_smoothing: f64,
    /// Linear warm-up of the learning rate (Adam) over the first N updates: update `t` uses `lr · t / N`
    /// (0: none; Marian's `--lr-warmup`).
    pub lr_warmup: usize,
    /// How the learning rate decays: `none`; `inv-sqrt`, `lr · sqrt(N / t)` from update `N =
    /// lr_decay_start` (the warm-up's length when 0; Marian's `--lr-decay-inv-sqrt`); `stalled`, `× lr_decay_factor`
    /// after every `lr_decay_patience` evaluations without a dev improvement (Marian's
    /// `--lr-decay-strategy stalled`, Nematus's). The schedule's state is in the checkpoint.
    pub lr_decay: LrDecay,
    /// With `lr_decay = "inv-sqrt"`: the update the decay starts from (0: the warm-up's end).
    pub lr_decay_start: usize,
    /// With `lr_decay = "stalled"`: the factor each decay multiplies the learning rate by, in (0, 1).
    pub lr_decay_factor: f64,
    /// With `lr_decay = "stalled"`: evaluations without improvement before each decay.
    pub lr_decay_patience: usize,
    /// The learning rate's floor under decay (0: none; the warm-up starts below it).
    pub lr_min: f64,
    /// Batches by target tokens: each batch takes length-sorted sentences while their target tokens (EOS
    /// included) stay within N, instead of `batch_size` sentences (0: by sentences; Marian's
    /// `--mini-batch-words`). The read-ahead window sorts `sort_batches` batches' worth of tokens.
    pub batch_tokens: usize,
    /// Gradient accumulation: one update per N batches, the same update as one batch of their union
    /// (Marian's `--optimizer-delay`; 1: none).
    pub accumulate: usize,
    /// Word dropout on the source side: each input word replaced by `<unk>` with this probability, drawn
    /// per sentence and update (Nematus's `--dropout_source`; 0: none).
    pub source_word_dropout: f64,
    /// Word dropout on the target side: each previous word the decoder reads replaced by `<unk>` with this
    /// probability (the loss still scores the true words; Nematus's `--dropout_target`; 0: none).
    pub target_word_dropout: f64,
    /// BPE-dropout (Provilkov et al., 2020): every update re-segments its sentences' words with each merge
    /// dropped with this probability, per sentence and side, seeded by the update (both sides with BPE
    /// subwords; 0: none). The vocabulary then takes every subword the BPE models can produce.
    pub bpe_dropout: f64,
    /// Guided alignment (Chen et al. 2016; model-spec §6b): teach attention the word alignment. A file of links
    /// in Pharaoh form (`i-j`: source word `i`, target word `j`, 0-based), one line per line of the prepared
    /// `train.src` / `train.tgt`, over their words (subword pieces joined; `cgnmt prepare --alignment FILE`
    /// writes such a `train.align` for a corpus's own links), or `"builtin"`: the prepared pairs aligned by
    /// the built-in statistical aligner (`cgnmt align-corpus`, grow-diag-final-and) when training starts,
    /// kept in the run directory as `guided-alignment.txt`. Every piece of a linked word is linked, and the
    /// target's EOS to the source's. None (the paper's recipe): no guidance.
    pub guided_alignment: Option<String>,
    /// Guided alignment's cost between a target piece's attention row and its normalised links: `ce`
    /// (cross-entropy) or `mse` (half the squared error).
    pub guided_alignment_cost: AlignmentCost,
    /// Guided alignment's weight λ: the loss adds `λ · Σ_rows cost / B`.
    pub guided_alignment_weight: f64,
    /// Fine-tuning: start from this model directory's parameters (a fresh optimiser state and data
    /// position), with its vocabularies; its architecture (`[model]`) must be this configuration's, and
    /// `data.prepared` must have been prepared with its preprocessing (`cgnmt prepare --like DIR`).
    /// `cgnmt train --init DIR` sets it (none: a new model).
    pub init: Option<PathBuf>,
}

/// The learning rate's decay (see [`TrainConfig::lr_decay`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LrDecay {
    #[default]
    None,
    InvSqrt,
    Stalled,
}

/// Guided alignment's cost (see [`TrainConfig::guided_alignment_cost`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AlignmentCost {
    /// Cross-entropy `−Σ_j A_ij log α_ij`.
    #[default]
    Ce,
    /// Half the squared error `½ Σ_j (α_ij − A_ij)²`.
    Mse,
}

/// Whether training computes the target side's padded positions (see [`TrainConfig::target_padding`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TargetPadding {
    #[default]
    Skipped,
    Computed,
}

/// The dev score of model selection (see [`TrainConfig::select_by`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SelectBy {
    Bleu,
    SmoothedBleu,
    Chrf,
}

/// What training does when the loss or the gradient norm is not finite.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDivergence {
    Stop,
    Rollback,
}

impl Default for TrainConfig {
    fn default() -> Self {
        Self {
            batch_size: 80,
            sort_batches: 20,
            optimizer: OptimizerKind::Adadelta,
            learning_rate: 1e-3,
            adadelta_rho: 0.95,
            adadelta_eps: 1e-6,
            clip_norm: 1.0,
            seed: 1234,
            max_steps: 0,
            max_epochs: 0,
            max_seconds: 0.0,
            eval_every: 1000,
            patience: 10,
            save_every: 0,
            keep_checkpoints: 0,
            eval_beam: 10,
            eval_max_sentences: 0,
            threads: 0,
            on_divergence: OnDivergence::Stop,
            select_by: SelectBy::Bleu,
            weight_decay: 0.0,
            target_padding: TargetPadding::Skipped,
            label_smoothing: 0.0,
            embedding_dropout: 0.0,
            annotation_dropout: 0.0,
            readout_dropout: 0.0,
            recurrent_dropout: 0.0,
            exponential_smoothing: 0.0,
            lr_warmup: 0,
            lr_decay: LrDecay::None,
            lr_decay_start: 0,
            lr_decay_factor: 0.5,
            lr_decay_patience: 1,
            lr_min: 0.0,
            batch_tokens: 0,
            accumulate: 1,
            source_word_dropout: 0.0,
            target_word_dropout: 0.0,
            bpe_dropout: 0.0,
            guided_alignment: None,
            guided_alignment_cost: AlignmentCost::Ce,
            guided_alignment_weight: 0.1,
            init: None,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub model: ModelConfig,
    pub data: DataConfig,
    pub train: TrainConfig,
}

impl Config {
    /// Read a TOML file (or start from the defaults when `path` is `None`), apply `section.key=value`
    /// overrides, and validate.
    pub fn load(path: Option<&Path>, sets: &[String]) -> Result<Config> {
        let value = Self::read_table(path)?;
        Self::from_table(value, path, sets)
    }

    /// The configuration of a run that fine-tunes the model of `init_dir` (its configuration `init`):
    /// `path`'s settings (the defaults without a file) with the model's `[model]` section when `path` has
    /// none, then `sets`. The architecture must then be the model's: a difference is an error naming the
    /// keys. `train.init` names the directory.
    pub fn load_for_init(
        path: Option<&Path>,
        sets: &[String],
        init: &Config,
        init_dir: &Path,
    ) -> Result<Config> {
        let mut value = Self::read_table(path)?;
        if !value.contains_key("model") {
            let model = toml::Value::try_from(&init.model)
                .map_err(|e| NmtError::Config(format!("{}: {e}", init_dir.display())))?;
            value.insert("model".into(), model);
        }
        let mut cfg = Self::from_table(value, path, sets)?;
        if cfg.model != init.model {
            let ours = toml::Value::try_from(&cfg.model).expect("model section serialises");
            let theirs = toml::Value::try_from(&init.model).expect("model section serialises");
            let differ: Vec<String> = match (ours, theirs) {
                (toml::Value::Table(a), toml::Value::Table(b)) => a
                    .iter()
                    .filter(|(k, v)| b.get(*k) != Some(*v))
                    .map(|(k, v)| {
                        let them = b.get(k).map_or("none".to_string(), |x| x.to_string());
                        format!("model.{k} = {v} against the model's {them}")
                    })
                    .collect(),
                _ => vec![],
            };
            return Err(NmtError::Config(format!(
                "--init {}: fine-tuning keeps the model's architecture, but {} (leave the [model] section out \
                 to take the model's)",
                init_dir.display(),
                differ.join("; ")
            )));
        }
        cfg.train.init = Some(init_dir.to_path_buf());
        Ok(cfg)
    }

    fn read_table(path: Option<&Path>) -> Result<toml::Table> {
        match path {
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|e| NmtError::io(p, e))?;
                text.parse::<toml::Table>()
                    .map_err(|e| NmtError::Config(format!("{}: {e}", p.display())))
            }
            None => Ok(toml::Table::new()),
        }
    }

    fn from_table(mut value: toml::Table, path: Option<&Path>, sets: &[String]) -> Result<Config> {
        for s in sets {
            apply_set(&mut value, s)?;
        }
        default_coverage_dim(&mut value);
        let origin = path
            .map(|p| p.display().to_string())
            .unwrap_or_else(|| "configuration".into());
        let cfg: Config =
            toml::Value::Table(value.clone())
                .try_into()
                .map_err(|e: toml::de::Error| {
                    NmtError::Config(format!("{origin}: {}", explain(&value, e)))
                })?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parse a configuration saved next to a model (`config.toml`).
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Config> {
        let cfg: Config = toml::from_str(text)
            .map_err(|e| NmtError::Config(format!("{origin}: {}", e.message())))?;
        cfg.validate()?;
        Ok(cfg)
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("configuration serialises to TOML")
    }

    pub fn validate(&self) -> Result<()> {
        let m = &self.model;
        let bad = |k: &str, why: &str| Err(NmtError::Config(format!("{k}: {why}")));
        if m.embedding_dim == 0 {
            return bad("model.embedding_dim", "must be positive");
        }
        if m.hidden_dim == 0 || m.hidden_dim % 2 != 0 {
            return bad(
                "model.hidden_dim",
                "must be a positive even number (the readout uses maxout over pairs)",
            );
        }
        if m.attention_dim == 0 {
            return bad("model.attention_dim", "must be positive");
        }
        if m.decoder_transition_depth == 0 {
            return bad(
                "model.decoder_transition_depth",
                "must be at least 1 (1: the paper's one transition per step)",
            );
        }
        if m.encoder_layers == 0 {
            return bad(
                "model.encoder_layers",
                "must be at least 1 (1: the paper's one bidirectional layer)",
            );
        }
        let gated = m.context_gate != ContextGate::None;
        if [gated, m.gating_scalar, m.static_interpolation]
            .iter()
            .filter(|x| **x)
            .count()
            > 1
        {
            return bad(
                "model.context_gate",
                "context_gate, gating_scalar and static_interpolation are alternatives: choose one",
            );
        }
        if gated && m.gate_inputs.is_empty() {
            return bad(
                "model.gate_inputs",
                "a context gate needs at least one input",
            );
        }
        let mut seen = Vec::new();
        for g in &m.gate_inputs {
            if seen.contains(g) {
                return bad("model.gate_inputs", "an input is listed twice");
            }
            seen.push(*g);
        }
        if m.coverage != CoverageKind::None {
            if m.coverage_dim == 0 {
                return bad("model.coverage_dim", "must be positive");
            }
            if m.coverage == CoverageKind::Linguistic && m.coverage_dim != 1 {
                return bad(
                    "model.coverage_dim",
                    "linguistic coverage is a scalar: its dimension is 1 (leave coverage_dim out to get it)",
                );
            }
            if !(m.coverage_max_fertility > 0.0) {
                return bad("model.coverage_max_fertility", "must be positive");
            }
        }
        let d = &self.data;
        if d.src_vocab_size == 0 || d.tgt_vocab_size == 0 {
            return bad("data.src_vocab_size", "vocabulary sizes must be positive");
        }
        if d.max_len == 0 {
            return bad("data.max_len", "must be positive");
        }
        let t = &self.train;
        if t.batch_size == 0 {
            return bad("train.batch_size", "must be positive");
        }
        if t.sort_batches == 0 {
            return bad("train.sort_batches", "must be positive");
        }
        if !(0.0..1.0).contains(&t.label_smoothing) {
            return bad("train.label_smoothing", "must be in [0, 1) (0: none)");
        }
        for (key, p) in [
            ("train.embedding_dropout", t.embedding_dropout),
            ("train.annotation_dropout", t.annotation_dropout),
            ("train.readout_dropout", t.readout_dropout),
            ("train.recurrent_dropout", t.recurrent_dropout),
            ("train.source_word_dropout", t.source_word_dropout),
            ("train.target_word_dropout", t.target_word_dropout),
            ("train.bpe_dropout", t.bpe_dropout),
        ] {
            if !(0.0..1.0).contains(&p) {
                return bad(key, "must be in [0, 1) (0: none)");
            }
        }
        if !(t.guided_alignment_weight >= 0.0 && t.guided_alignment_weight.is_finite()) {
            return bad(
                "train.guided_alignment_weight",
                "must be a finite number ≥ 0",
            );
        }
        if t.guided_alignment
            .as_deref()
            .is_some_and(|g| g.trim().is_empty())
        {
            return bad(
                "train.guided_alignment",
                "give a file of links or \"builtin\" (leave the key out for no guidance)",
            );
        }
        if t.guided_alignment.is_some() && t.bpe_dropout > 0.0 {
            return bad(
                "train.guided_alignment",
                "guided alignment follows the prepared segmentation, which train.bpe_dropout changes at every \
                 update: use one or the other",
            );
        }
        if t.accumulate == 0 {
            return bad(
                "train.accumulate",
                "must be at least 1 (1: an update per batch)",
            );
        }
        let scheduled = t.lr_warmup > 0 || t.lr_decay != LrDecay::None;
        if scheduled && t.optimizer != OptimizerKind::Adam {
            return bad(
                "train.lr_warmup",
                "learning-rate schedules (lr_warmup, lr_decay) need train.optimizer = \"adam\" (Adadelta has no \
                 learning rate)",
            );
        }
        if !(t.lr_decay_factor > 0.0 && t.lr_decay_factor < 1.0) {
            return bad("train.lr_decay_factor", "must be in (0, 1)");
        }
        if t.lr_decay_patience == 0 {
            return bad("train.lr_decay_patience", "must be at least 1");
        }
        if !(t.lr_min >= 0.0 && t.lr_min.is_finite()) {
            return bad("train.lr_min", "must be a finite number ≥ 0 (0: no floor)");
        }
        if t.lr_decay == LrDecay::Stalled && t.eval_every == 0 {
            return bad(
                "train.lr_decay",
                "\"stalled\" decays after evaluations without improvement: set train.eval_every",
            );
        }

        if !(0.0..1.0).contains(&t.exponential_smoothing) {
            return bad(
                "train.exponential_smoothing",
                "must be in [0, 1) (the moving average's rate per update; 0: off)",
            );
        }
        if !(t.learning_rate > 0.0) {
            return bad("train.learning_rate", "must be positive");
        }
        if !(t.adadelta_rho > 0.0 && t.adadelta_rho < 1.0) {
            return bad("train.adadelta_rho", "must be in (0, 1)");
        }
        if !(t.adadelta_eps > 0.0) {
            return bad("train.adadelta_eps", "must be positive");
        }
        if t.clip_norm < 0.0 || !t.clip_norm.is_finite() {
            return bad("train.clip_norm", "must be ≥ 0 (0 disables clipping)");
        }
        if !(t.weight_decay >= 0.0 && t.weight_decay.is_finite()) {
            return bad("train.weight_decay", "must be ≥ 0 (0: no decay)");
        }
        if t.weight_decay > 0.0 && t.optimizer != OptimizerKind::Adam {
            return bad(
                "train.weight_decay",
                "decoupled weight decay scales Adam's learning rate: use optimizer = \"adam\"",
            );
        }
        if t.on_divergence == OnDivergence::Rollback && t.optimizer != OptimizerKind::Adam {
            return bad(
                "train.on_divergence",
                "rollback halves the learning rate, which only Adam has: use optimizer = \"adam\" or on_divergence = \"stop\"",
            );
        }
        if t.eval_beam == 0 {
            return bad("train.eval_beam", "must be at least 1");
        }
        Ok(())
    }
}

/// Name the key behind a deserialisation error: try each `section.key` on its own.
fn explain(table: &toml::Table, err: toml::de::Error) -> String {
    for (section, v) in table {
        let toml::Value::Table(keys) = v else {
            return format!("{section}: expected a [{section}] section");
        };
        for (k, val) in keys {
            let mut one = toml::Table::new();
            one.insert(k.clone(), val.clone());
            let r = match section.as_str() {
                "model" => toml::Value::Table(one)
                    .try_into::<ModelConfig>()
                    .map(|_| ()),
                "data" => toml::Value::Table(one).try_into::<DataConfig>().map(|_| ()),
                "train" => toml::Value::Table(one)
                    .try_into::<TrainConfig>()
                    .map(|_| ()),
                _ => return format!("unknown section [{section}] (expected model, data, train)"),
            };
            if let Err(e) = r {
                return format!("{section}.{k}: {}", e.message());
            }
        }
    }
    err.message().to_string()
}

/// Apply one `section.key=value` override. The value is read as a TOML value (`512`, `"gru"`, `true`,
/// `["state","context"]`); a bare word that is not valid TOML is taken as a string.
/// Each coverage model has its own default dimension (the paper's: linguistic coverage is a scalar, neural
/// coverage 10-dimensional): a linguistic model with no `coverage_dim` gets 1; only an explicit other value is
/// an error.
fn default_coverage_dim(table: &mut toml::Table) {
    if let Some(toml::Value::Table(m)) = table.get_mut("model") {
        if m.get("coverage").and_then(|v| v.as_str()) == Some("linguistic")
            && !m.contains_key("coverage_dim")
        {
            m.insert("coverage_dim".into(), toml::Value::Integer(1));
        }
    }
}

fn apply_set(table: &mut toml::Table, set: &str) -> Result<()> {
    let (key, raw) = set
        .split_once('=')
        .ok_or_else(|| NmtError::Config(format!("--set {set:?}: expected section.key=value")))?;
    let key = key.trim();
    let parts: Vec<&str> = key.split('.').collect();
    if parts.len() != 2 || parts.iter().any(|p| p.is_empty()) {
        return Err(NmtError::Config(format!(
            "--set {set:?}: the key must be section.key, e.g. model.hidden_dim"
        )));
    }
    let raw = raw.trim();
    let value = match format!("v = {raw}").parse::<toml::Table>() {
        Ok(mut t) => t.remove("v").expect("parsed key"),
        Err(_) => toml::Value::String(raw.to_string()),
    };
    let section = table
        .entry(parts[0].to_string())
        .or_insert_with(|| toml::Value::Table(toml::Table::new()));
    match section {
        toml::Value::Table(t) => {
            t.insert(parts[1].to_string(), value);
            Ok(())
        }
        _ => Err(NmtError::Config(format!(
            "--set {set:?}: {} is not a section",
            parts[0]
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_papers() {
        let c = Config::load(None, &[]).unwrap();
        assert_eq!(c.model.embedding_dim, 620);
        assert_eq!(c.model.hidden_dim, 1000);
        assert_eq!(c.model.decoder, DecoderKind::Gru);
        assert_eq!(c.data.src_vocab_size, 30000);
        assert_eq!(c.data.max_len, 80);
        assert_eq!(c.train.batch_size, 80);
        assert_eq!(c.train.optimizer, OptimizerKind::Adadelta);
        assert_eq!(c.train.clip_norm, 1.0);
    }

    #[test]
    fn sets_override_and_unknown_keys_fail() {
        let c = Config::load(
            None,
            &[
                "model.hidden_dim=64".into(),
                "model.decoder=vanilla".into(),
                "model.gate_inputs=[\"state\"]".into(),
            ],
        )
        .unwrap();
        assert_eq!(c.model.hidden_dim, 64);
        assert_eq!(c.model.decoder, DecoderKind::Vanilla);
        assert_eq!(c.model.gate_inputs, vec![GateInput::State]);
        let e = Config::load(None, &["model.hiden_dim=64".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("hiden_dim"), "{e}");
        let e = Config::load(None, &["model.hidden_dim=abc".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("hidden_dim"), "{e}");
        let e = Config::load(None, &["model.decoder=lstm".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("lstm"), "{e}");
        let e = Config::load(None, &["train.batch_size=0".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("batch_size"), "{e}");
        for key in ["model.encoder_layers", "model.decoder_transition_depth"] {
            let e = Config::load(None, &[format!("{key}=0")])
                .unwrap_err()
                .to_string();
            assert!(e.contains(key) && e.contains("at least 1"), "{e}");
        }
        let e = Config::load(None, &["train.weight_decay=0.01".into()])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("train.weight_decay") && e.contains("adam"),
            "{e}"
        );
        for bad in ["1", "-0.1", "1.5"] {
            let e = Config::load(None, &[format!("train.label_smoothing={bad}")])
                .unwrap_err()
                .to_string();
            assert!(e.contains("train.label_smoothing"), "{e}");
            for key in [
                "train.embedding_dropout",
                "train.annotation_dropout",
                "train.readout_dropout",
                "train.recurrent_dropout",
            ] {
                let e = Config::load(None, &[format!("{key}={bad}")])
                    .unwrap_err()
                    .to_string();
                assert!(e.contains(key), "{e}");
            }
        }
        let c = Config::load(None, &["train.recurrent_dropout=0.2".into()]).unwrap();
        assert_eq!(c.train.recurrent_dropout, 0.2);
        let e = Config::load(None, &["train.select_by=\"ter\"".into()])
            .unwrap_err()
            .to_string();
        assert!(e.contains("ter"), "{e}");
        let c = Config::load(
            None,
            &[
                "train.optimizer=\"adam\"".into(),
                "train.weight_decay=0.01".into(),
                "train.select_by=\"smoothed-bleu\"".into(),
            ],
        )
        .unwrap();
        assert_eq!(c.train.weight_decay, 0.01);
        assert_eq!(c.train.select_by, SelectBy::SmoothedBleu);
        let c = Config::load(None, &["train.label_smoothing=0.1".into()]).unwrap();
        assert_eq!(c.train.label_smoothing, 0.1);
    }

    /// The bundled configurations load; the small Tatoeba one is the paper's recipe plus tied output
    /// embeddings, label smoothing, recurrent dropout and kept checkpoints (on BPE-prepared data), and nothing
    /// else.
    #[test]
    fn bundled_configurations_load_and_differ_by_the_recipe_only() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("configs");
        for f in [
            "paper.toml",
            "tatoeba-small.toml",
            "tatoeba-small-paper.toml",
        ] {
            Config::load(Some(&root.join(f)), &[]).unwrap_or_else(|e| panic!("{f}: {e}"));
        }
        let improved = Config::load(Some(&root.join("tatoeba-small.toml")), &[]).unwrap();
        let paper = Config::load(
            Some(&root.join("tatoeba-small-paper.toml")),
            &[
                "model.tied_output_embeddings=true".into(),
                "train.label_smoothing=0.1".into(),
                "train.recurrent_dropout=0.2".into(),
                "train.keep_checkpoints=4".into(),
                "train.exponential_smoothing=0.001".into(),
                "data.prepared=\"runs/tat-bpe\"".into(),
            ],
        )
        .unwrap();
        assert_eq!(improved.to_toml(), paper.to_toml());
    }

    #[test]
    fn each_coverage_model_has_its_own_default_dimension() {
        let c = Config::load(None, &["model.coverage=linguistic".into()]).unwrap();
        assert_eq!(c.model.coverage_dim, 1);
        let c = Config::load(None, &["model.coverage=neural".into()]).unwrap();
        assert_eq!(c.model.coverage_dim, 10);
        let c = Config::load(
            None,
            &[
                "model.coverage=linguistic".into(),
                "model.coverage_dim=1".into(),
            ],
        )
        .unwrap();
        assert_eq!(c.model.coverage_dim, 1);
        // Only an explicit contradiction is an error.
        let e = Config::load(
            None,
            &[
                "model.coverage=linguistic".into(),
                "model.coverage_dim=10".into(),
            ],
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("coverage_dim") && e.contains("scalar"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(&p, "[model]\ncoverage = \"linguistic\"\n").unwrap();
        assert_eq!(Config::load(Some(&p), &[]).unwrap().model.coverage_dim, 1);
    }

    #[test]
    fn round_trips_through_toml() {
        let c = Config::load(None, &["model.context_gate=source".into()]).unwrap();
        let back = Config::from_toml_str(&c.to_toml(), "x").unwrap();
        assert_eq!(c, back);
    }
}
