//! Resumable training checkpoints: a model directory ([`crate::model::store`], written atomically with a
//! generation id) plus what only training needs: `optimizer.safetensors` (the optimiser's state and the moving
//! average) and `train_state.json` (the data position, the evaluation history, the best score so far). Also
//! the run directory's kept checkpoints (`ckpt-STEP/`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use candle_nn::VarMap;
use cgnmt_data::vocab::Vocab;
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::error::{NmtError, Result};
use crate::model::store::{self, ModelFiles};
use crate::train::optim::{Optimizer, SlotState};

pub const OPTIM_FILE: &str = "optimizer.safetensors";
pub const STATE_FILE: &str = "train_state.json";

/// One dev evaluation in the training history.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EvalRecord {
    pub step: u64,
    pub epoch: u64,
    pub seconds: f64,
    /// Mean training loss per token of the last logging window (NaN, written as null, before the first).
    #[serde(deserialize_with = "nan_if_null")]
    pub train_loss: f64,
    pub dev_bleu: f64,
    /// Dev BLEU with `exp` smoothing and dev chrF2 (absent in runs from before they were computed).
    #[serde(default)]
    pub dev_bleu_smoothed: Option<f64>,
    #[serde(default)]
    pub dev_chrf: Option<f64>,
}

/// A number that JSON wrote as null because it was not finite.
fn nan_if_null<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<f64, D::Error> {
    Ok(Option::<f64>::deserialize(d)?.unwrap_or(f64::NAN))
}

/// Where training stands; with the optimiser state this is all a resumed run needs.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct TrainState {
    pub step: u64,
    pub epoch: u64,
    /// Batches of the current epoch already consumed.
    pub batch_in_epoch: u64,
    pub best_bleu: Option<f64>,
    pub best_step: u64,
    pub evals_without_improvement: u64,
    pub seconds: f64,
    pub history: Vec<EvalRecord>,
    pub finished: bool,
    /// Learning rate multiplier left by divergence rollbacks (1 without).
    #[serde(default = "one")]
    pub lr_scale: f64,
    /// Rollbacks after a non-finite loss or gradient so far.
    #[serde(default)]
    pub rollbacks: u64,
    /// The training-loss window being summed (loss × tokens, tokens) and the last window's mean per token.
    #[serde(default)]
    pub loss_window: (f64, u64),
    #[serde(default)]
    pub last_train_loss: Option<f64>,
    /// The best dev score of `train.select_by` so far (runs from before it was kept: `best_bleu`).
    #[serde(default)]
    pub best_selection: Option<f64>,
    /// The learning rate's multiplier left by `train.lr_decay = "stalled"` (1 before any decay).
    #[serde(default = "one")]
    pub lr_decay_scale: f64,
}

fn one() -> f64 {
    1.0
}

impl Default for TrainState {
    fn default() -> Self {
        Self {
            step: 0,
            epoch: 0,
            batch_in_epoch: 0,
            best_bleu: None,
            best_step: 0,
            evals_without_improvement: 0,
            seconds: 0.0,
            history: vec![],
            finished: false,
            lr_scale: 1.0,
            rollbacks: 0,
            loss_window: (0.0, 0),
            last_train_loss: None,
            best_selection: None,
            lr_decay_scale: 1.0,
        }
    }
}

/// What to write into a model/checkpoint directory.
pub struct SaveRequest<'a> {
    pub config: &'a Config,
    pub varmap: &'a VarMap,
    pub src_vocab: &'a Vocab,
    pub tgt_vocab: &'a Vocab,
    /// Directory holding `preprocess.json` (+ BPE files) to copy.
    pub preprocess_dir: &'a Path,
    pub optimizer: Option<&'a Optimizer>,
    pub state: Option<&'a TrainState>,
}

/// Write a model directory (and, with an optimiser or a state, a training checkpoint) to `dir` atomically
/// (see [`store::save`]).
pub fn save(dir: &Path, req: &SaveRequest) -> Result<()> {
    let files = ModelFiles {
        config: req.config,
        varmap: req.varmap,
        src_vocab: req.src_vocab,
        tgt_vocab: req.tgt_vocab,
        preprocess_dir: req.preprocess_dir,
    };
    store::save(dir, &files, &|tmp| {
        if let Some(opt) = req.optimizer {
            save_optimizer(opt, &tmp.join(OPTIM_FILE))
                .map_err(|e| NmtError::model_dir(tmp, format!("cannot write {OPTIM_FILE}: {e}")))?;
            store::save_pause();
        }
        if let Some(st) = req.state {
            let json = serde_json::to_string_pretty(st).expect("state serialises");
            let p = tmp.join(STATE_FILE);
            std::fs::write(&p, json.as_bytes()).map_err(|e| NmtError::io(&p, e))?;
        }
        Ok(())
    })
}

/// A run's kept `ckpt-STEP/` model directories (`train.keep_checkpoints`), oldest first.
pub fn kept_checkpoints(run_dir: &Path) -> Result<Vec<PathBuf>> {
    let mut kept: Vec<PathBuf> = std::fs::read_dir(run_dir)
        .map_err(|e| NmtError::io(run_dir, e))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                n.starts_with("ckpt-") && n[5..].chars().all(|c| c.is_ascii_digit())
            })
        })
        .collect();
    kept.sort();
    Ok(kept)
}

/// Remove all but the newest `keep` of a run's `ckpt-STEP/` model directories (`train.keep_checkpoints`).
pub fn prune_kept(run_dir: &Path, keep: usize) -> Result<()> {
    let kept = kept_checkpoints(run_dir)?;
    for old in &kept[..kept.len().saturating_sub(keep)] {
        std::fs::remove_dir_all(old).map_err(|e| NmtError::io(old, e))?;
    }
    Ok(())
}

fn save_optimizer(opt: &Optimizer, path: &Path) -> Result<()> {
    let mut tensors: HashMap<String, Tensor> = HashMap::new();
    for (name, slot) in &opt.state {
        tensors.insert(
            format!("a/{name}"),
            Tensor::from_slice(&slot.a, slot.a.len(), &Device::Cpu)?,
        );
        tensors.insert(
            format!("b/{name}"),
            Tensor::from_slice(&slot.b, slot.b.len(), &Device::Cpu)?,
        );
    }
    for (name, avg) in &opt.smoothed {
        tensors.insert(
            format!("ema/{name}"),
            Tensor::from_slice(avg, avg.len(), &Device::Cpu)?,
        );
    }
    tensors.insert(
        "step".into(),
        Tensor::from_slice(&[opt.step as i64], 1, &Device::Cpu)?,
    );
    candle_core::safetensors::save(&tensors, path)?;
    Ok(())
}

pub fn load_optimizer(opt: &mut Optimizer, path: &Path) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let t = candle_core::safetensors::load(path, &Device::Cpu)
        .map_err(|e| NmtError::model_dir(dir, format!("cannot read {}: {e}", OPTIM_FILE)))?;
    opt.state.clear();
    opt.smoothed.clear();
    for (k, v) in &t {
        if let Some(name) = k.strip_prefix("ema/") {
            opt.smoothed.insert(name.to_string(), v.to_vec1()?);
        }
        if let Some(name) = k.strip_prefix("a/") {
            let b = t.get(&format!("b/{name}")).ok_or_else(|| {
                NmtError::model_dir(dir, format!("{OPTIM_FILE}: missing b/{name}"))
            })?;
            opt.state.insert(
                name.to_string(),
                SlotState {
                    a: v.to_vec1()?,
                    b: b.to_vec1()?,
                },
            );
        }
    }
    opt.step = t
        .get("step")
        .ok_or_else(|| NmtError::model_dir(dir, format!("{OPTIM_FILE}: missing step")))?
        .to_vec1::<i64>()?[0] as u64;
    Ok(())
}

pub fn load_state(dir: &Path) -> Result<TrainState> {
    let p = dir.join(STATE_FILE);
    let text = std::fs::read_to_string(&p).map_err(|e| NmtError::io(&p, e))?;
    serde_json::from_str(&text).map_err(|e| NmtError::model_dir(dir, format!("{STATE_FILE}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_history_with_a_nan_train_loss_reads_back() {
        // A dev evaluation before the first training-loss window (or, before the window was kept across
        // resumes, the first evaluation after one) has a NaN train loss, which JSON writes as null.
        let st = TrainState {
            step: 8,
            history: vec![EvalRecord {
                step: 8,
                epoch: 0,
                seconds: 1.0,
                train_loss: f64::NAN,
                dev_bleu: 3.5,
                dev_bleu_smoothed: None,
                dev_chrf: None,
            }],
            ..Default::default()
        };
        let json = serde_json::to_string(&st).unwrap();
        assert!(json.contains("\"train_loss\":null"), "{json}");
        let back: TrainState = serde_json::from_str(&json).unwrap();
        assert!(back.history[0].train_loss.is_nan());
        assert_eq!(back.history[0].dev_bleu, 3.5);
        // A state written before the loss window was kept reads with an empty window.
        let old = json.replace(",\"loss_window\":[0.0,0],\"last_train_loss\":null", "");
        assert_ne!(old, json);
        let back: TrainState = serde_json::from_str(&old).unwrap();
        assert_eq!((back.loss_window, back.last_train_loss), ((0.0, 0), None));
    }
}

/// The configuration of a training run in `run_dir`: resumed (the configuration saved in its last
/// checkpoint, with `sets` applied; no other file may be given), fine-tuning the model of `init` (see
/// [`Config::load_for_init`]), or new (`config`, the defaults without one, and `sets`).
pub fn run_config(
    config: Option<&Path>,
    sets: &[String],
    run_dir: &Path,
    resume: bool,
    init: Option<&Path>,
) -> Result<Config> {
    if resume {
        if config.is_some() || init.is_some() {
            return Err(NmtError::Config(
                "a resumed run takes the configuration saved in its directory (and its starting model); use \
                 --set to change train.* settings"
                    .into(),
            ));
        }
        let dir = store::complete_dir(&run_dir.join("last")).ok_or_else(|| {
            NmtError::model_dir(
                &run_dir.join("last"),
                "no complete checkpoint to resume from (run `cgnmt train` without --resume)",
            )
        })?;
        return Config::load(Some(&dir.join(store::CONFIG_FILE)), sets);
    }
    match init {
        Some(d) => {
            let dir = store::resolve_model_dir(d);
            let path = dir.join(store::CONFIG_FILE);
            if !path.is_file() {
                return Err(NmtError::model_dir(
                    &dir,
                    "not a model directory (no config.toml): --init takes a model written by `cgnmt train`",
                ));
            }
            let text = std::fs::read_to_string(&path).map_err(|e| NmtError::io(&path, e))?;
            let theirs = Config::from_toml_str(&text, &path.display().to_string())?;
            Config::load_for_init(config, sets, &theirs, &dir)
        }
        None => Config::load(config, sets),
    }
}
