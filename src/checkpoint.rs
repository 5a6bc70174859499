//! Model directories and resumable training checkpoints.
//!
//! A model directory holds everything `translate` needs: `config.toml` (the resolved configuration),
//! `model.safetensors` (weights, named by their parameter paths), `vocab.src`, `vocab.tgt`, `preprocess.json`
//! (+ BPE files it names). A training checkpoint adds `optimizer.safetensors` and `train_state.json`.
//! Directories are written atomically: into `NAME.tmp`, then the old `NAME` is moved aside and the new one
//! renamed into place, so a crash never leaves a half-written model where a complete one is expected.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use candle_nn::VarMap;
use cgnmt_data::preprocess::Preprocessor;
use cgnmt_data::vocab::Vocab;
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::error::{NmtError, Result};
use crate::model::Model;
use crate::optim::{Optimizer, SlotState};

pub const CONFIG_FILE: &str = "config.toml";
pub const WEIGHTS_FILE: &str = "model.safetensors";
pub const OPTIM_FILE: &str = "optimizer.safetensors";
pub const STATE_FILE: &str = "train_state.json";
pub const COMPLETE_FILE: &str = "COMPLETE";

/// One dev evaluation in the training history.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct EvalRecord {
    pub step: u64,
    pub epoch: u64,
    pub seconds: f64,
    pub train_loss: f64,
    pub dev_bleu: f64,
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
        }
    }
}

/// A loaded model with its vocabularies and text pipeline.
pub struct LoadedModel {
    pub dir: PathBuf,
    pub config: Config,
    pub model: Model,
    pub varmap: VarMap,
    pub src_vocab: Vocab,
    pub tgt_vocab: Vocab,
    pub preprocess: Preprocessor,
}

fn copy_preprocess(from_dir: &Path, to_dir: &Path) -> Result<()> {
    let pre = Preprocessor::load(from_dir)?;
    pre.save(to_dir)?;
    for side in [&pre.src, &pre.tgt] {
        if let Some(rel) = &side.bpe {
            let (a, b) = (from_dir.join(rel), to_dir.join(rel));
            if a != b {
                std::fs::copy(&a, &b).map_err(|e| NmtError::io(&a, e))?;
            }
        }
    }
    Ok(())
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

/// Write a model (and optionally a training checkpoint) to `dir` atomically.
pub fn save(dir: &Path, req: &SaveRequest) -> Result<()> {
    let tmp = with_suffix(dir, "tmp");
    let old = with_suffix(dir, "old");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| NmtError::io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| NmtError::io(&tmp, e))?;
    std::fs::write(tmp.join(CONFIG_FILE), req.config.to_toml())
        .map_err(|e| NmtError::io(&tmp, e))?;
    req.varmap.save(tmp.join(WEIGHTS_FILE))?;
    req.src_vocab.save(&tmp.join("vocab.src"))?;
    req.tgt_vocab.save(&tmp.join("vocab.tgt"))?;
    copy_preprocess(req.preprocess_dir, &tmp)?;
    if let Some(opt) = req.optimizer {
        save_optimizer(opt, &tmp.join(OPTIM_FILE))?;
    }
    if let Some(st) = req.state {
        let json = serde_json::to_string_pretty(st).expect("state serialises");
        std::fs::write(tmp.join(STATE_FILE), json).map_err(|e| NmtError::io(&tmp, e))?;
    }
    std::fs::write(tmp.join(COMPLETE_FILE), b"").map_err(|e| NmtError::io(&tmp, e))?;
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(|e| NmtError::io(&old, e))?;
    }
    if dir.exists() {
        std::fs::rename(dir, &old).map_err(|e| NmtError::io(dir, e))?;
    }
    std::fs::rename(&tmp, dir).map_err(|e| NmtError::io(dir, e))?;
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(|e| NmtError::io(&old, e))?;
    }
    Ok(())
}

fn with_suffix(dir: &Path, suffix: &str) -> PathBuf {
    let mut s = dir.as_os_str().to_os_string();
    s.push(".");
    s.push(suffix);
    PathBuf::from(s)
}

/// The complete directory to read: `dir` itself, or `dir.old` when a crash happened between the two renames.
pub fn complete_dir(dir: &Path) -> Option<PathBuf> {
    if dir.join(COMPLETE_FILE).exists() {
        return Some(dir.to_path_buf());
    }
    let old = with_suffix(dir, "old");
    if old.join(COMPLETE_FILE).exists() {
        return Some(old);
    }
    None
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
    for (k, v) in &t {
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

/// Load a model directory (weights checked against the configuration: every tensor present, right shape).
pub fn load(dir: &Path, dtype: DType, dev: &Device) -> Result<LoadedModel> {
    if !dir.is_dir() {
        return Err(NmtError::model_dir(
            dir,
            "not a directory (expected a model directory written by `cgnmt train`)",
        ));
    }
    let dir = complete_dir(dir).unwrap_or_else(|| dir.to_path_buf());
    let need = |f: &str| -> Result<PathBuf> {
        let p = dir.join(f);
        if p.is_file() {
            Ok(p)
        } else {
            Err(NmtError::model_dir(&dir, format!("missing file {f}")))
        }
    };
    let cfg_path = need(CONFIG_FILE)?;
    let text = std::fs::read_to_string(&cfg_path).map_err(|e| NmtError::io(&cfg_path, e))?;
    let config = Config::from_toml_str(&text, &cfg_path.display().to_string())?;
    let src_vocab = Vocab::load(&need("vocab.src")?)?;
    let tgt_vocab = Vocab::load(&need("vocab.tgt")?)?;
    need(cgnmt_data::preprocess::PREPROCESS_FILE)?;
    let preprocess = Preprocessor::load(&dir)?;
    let weights = need(WEIGHTS_FILE)?;
    let (model, mut varmap) =
        Model::build_uninit(&config.model, src_vocab.len(), tgt_vocab.len(), dtype, dev)?;
    varmap.load(&weights).map_err(|e| {
        NmtError::model_dir(
            &dir,
            format!("{WEIGHTS_FILE} does not match config.toml/vocabularies: {e}"),
        )
    })?;
    Ok(LoadedModel {
        dir,
        config,
        model,
        varmap,
        src_vocab,
        tgt_vocab,
        preprocess,
    })
}
