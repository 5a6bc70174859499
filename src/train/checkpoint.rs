//! Model directories and resumable training checkpoints.
//!
//! A model directory holds everything `translate` needs: `config.toml` (the resolved configuration),
//! `model.safetensors` (weights, named by their parameter paths), `vocab.src`, `vocab.tgt`, `preprocess.json`
//! (+ BPE files it names). A training checkpoint adds `optimizer.safetensors` and `train_state.json`.
//! Directories are written atomically: into `NAME.tmp`, then the old `NAME` is moved aside and the new one
//! renamed into place, so a crash never leaves a half-written model where a complete one is expected. A
//! write that fails (a full disk) removes its `NAME.tmp` and leaves `NAME` as it was.
//!
//! Readers and a writer may share a directory (`translate` while `train` saves into it): every save writes a
//! new generation id into `COMPLETE`, and [`load`] reads the id before and after the files, reading again when
//! a save replaced the directory meanwhile, so a load is never half one checkpoint and half the next.

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
use crate::train::optim::{Optimizer, SlotState};

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

impl LoadedModel {
    /// Whether `other` can decode in an ensemble with this model: the same source and target vocabularies
    /// and the same preprocessing (tokenisers, BPE models). The error names `other`'s directory and what
    /// differs.
    pub fn check_ensemble(&self, other: &LoadedModel) -> Result<()> {
        let differ = |what: &str| {
            Err(NmtError::model_dir(
                &other.dir,
                format!(
                    "its {what} differs from that of {}: an ensemble's models must share vocabularies and \
                     preprocessing (train them from the same prepared data)",
                    self.dir.display()
                ),
            ))
        };
        if self.src_vocab != other.src_vocab {
            return differ("source vocabulary");
        }
        if self.tgt_vocab != other.tgt_vocab {
            return differ("target vocabulary");
        }
        for (side, a, b) in [
            ("source", &self.preprocess.src, &other.preprocess.src),
            ("target", &self.preprocess.tgt, &other.preprocess.tgt),
        ] {
            let json = |c| serde_json::to_string(c).unwrap_or_default();
            if json(a) != json(b) {
                return differ(&format!("{side} preprocessing"));
            }
            if let (Some(x), Some(y)) = (&a.bpe, &b.bpe) {
                let read = |d: &Path, rel| {
                    std::fs::read(d.join(rel)).map_err(|e| NmtError::io(&d.join(rel), e))
                };
                if read(&self.dir, x)? != read(&other.dir, y)? {
                    return differ(&format!("{side} BPE model"));
                }
            }
        }
        Ok(())
    }
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

/// Test hook: `CGNMT_TEST_SAVE_PAUSE_MS=N` sleeps N ms after each file a save writes and between its renames,
/// widening the windows a kill or a concurrent reader can fall into (the fault tests use it).
fn save_pause() {
    static PAUSE: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    let ms = *PAUSE.get_or_init(|| {
        std::env::var("CGNMT_TEST_SAVE_PAUSE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    });
    if ms > 0 {
        std::thread::sleep(std::time::Duration::from_millis(ms));
    }
}

/// A new generation id for `COMPLETE`: unique to this save (time, process, a counter).
fn generation_id() -> String {
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let k = COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{nanos}-{}-{k}", std::process::id())
}

/// Write a model (and optionally a training checkpoint) to `dir` atomically. On an error (e.g. a full disk)
/// the partial `dir.tmp` is removed and `dir` keeps the previous checkpoint.
pub fn save(dir: &Path, req: &SaveRequest) -> Result<()> {
    let tmp = with_suffix(dir, "tmp");
    let written = write_files(&tmp, req);
    if let Err(e) = written {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    let old = with_suffix(dir, "old");
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(|e| NmtError::io(&old, e))?;
    }
    if dir.exists() {
        std::fs::rename(dir, &old).map_err(|e| NmtError::io(dir, e))?;
        save_pause();
    }
    std::fs::rename(&tmp, dir).map_err(|e| NmtError::io(dir, e))?;
    save_pause();
    if old.exists() {
        std::fs::remove_dir_all(&old).map_err(|e| NmtError::io(&old, e))?;
    }
    Ok(())
}

/// The files of a save, into `tmp` (emptied first), `COMPLETE` last.
fn write_files(tmp: &Path, req: &SaveRequest) -> Result<()> {
    if tmp.exists() {
        std::fs::remove_dir_all(tmp).map_err(|e| NmtError::io(tmp, e))?;
    }
    std::fs::create_dir_all(tmp).map_err(|e| NmtError::io(tmp, e))?;
    let write = |name: &str, bytes: &[u8]| -> Result<()> {
        let p = tmp.join(name);
        std::fs::write(&p, bytes).map_err(|e| NmtError::io(&p, e))
    };
    write(CONFIG_FILE, req.config.to_toml().as_bytes())?;
    save_pause();
    let weights = tmp.join(WEIGHTS_FILE);
    req.varmap
        .save(&weights)
        .map_err(|e| NmtError::model_dir(tmp, format!("cannot write {WEIGHTS_FILE}: {e}")))?;
    save_pause();
    req.src_vocab.save(&tmp.join("vocab.src"))?;
    req.tgt_vocab.save(&tmp.join("vocab.tgt"))?;
    copy_preprocess(req.preprocess_dir, tmp)?;
    save_pause();
    if let Some(opt) = req.optimizer {
        save_optimizer(opt, &tmp.join(OPTIM_FILE))
            .map_err(|e| NmtError::model_dir(tmp, format!("cannot write {OPTIM_FILE}: {e}")))?;
        save_pause();
    }
    if let Some(st) = req.state {
        let json = serde_json::to_string_pretty(st).expect("state serialises");
        write(STATE_FILE, json.as_bytes())?;
    }
    write(COMPLETE_FILE, generation_id().as_bytes())?;
    save_pause();
    Ok(())
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

/// The generation id in a directory's `COMPLETE` (empty from versions that wrote none).
fn generation(dir: &Path) -> Option<String> {
    std::fs::read_to_string(dir.join(COMPLETE_FILE)).ok()
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

/// Load a model directory (weights checked against the configuration: every tensor present, right shape).
/// A save into the directory while it is read (a training run writing its checkpoints) makes it read again:
/// the model returned is one complete checkpoint.
pub fn load(dir: &Path, dtype: DType, dev: &Device) -> Result<LoadedModel> {
    const ATTEMPTS: usize = 20;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let before = complete_dir(dir).and_then(|d| generation(&d).map(|g| (d, g)));
        let loaded = load_once(dir, dtype, dev);
        let after = complete_dir(dir).and_then(|d| generation(&d).map(|g| (d, g)));
        // (Neither before nor after: a directory that never had a COMPLETE, so no writer to wait for.)
        let steady = before == after;
        match loaded {
            // The same generation in the same place before and after: every file was of it.
            Ok(m) if steady => return Ok(m),
            // No writer in sight (no complete directory at all, or an error that stays): the error is the answer.
            Err(e) if steady || after.is_none() || attempt >= ATTEMPTS => return Err(e),
            Ok(_) if attempt >= ATTEMPTS => {
                return Err(NmtError::model_dir(
                    dir,
                    "kept changing while it was read (a training run saving into it?); try again",
                ))
            }
            _ => std::thread::sleep(std::time::Duration::from_millis(5 * attempt as u64)),
        }
    }
}

fn load_once(dir: &Path, dtype: DType, dev: &Device) -> Result<LoadedModel> {
    let resolved = complete_dir(dir);
    if !dir.is_dir() && resolved.is_none() {
        return Err(NmtError::model_dir(
            dir,
            "not a directory (expected a model directory written by `cgnmt train`)",
        ));
    }
    let dir = resolved.unwrap_or_else(|| dir.to_path_buf());
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
    let (mut model, mut varmap) =
        Model::build_uninit(&config.model, src_vocab.len(), tgt_vocab.len(), dtype, dev)?;
    varmap.load(&weights).map_err(|e| {
        NmtError::model_dir(
            &dir,
            format!("{WEIGHTS_FILE} does not match config.toml/vocabularies: {e}"),
        )
    })?;
    model.refresh_tied_output()?;
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

/// A model directory, or a run directory's best/ model.
pub fn resolve_model_dir(p: &Path) -> PathBuf {
    if !p.join(CONFIG_FILE).exists() && p.join("best").is_dir() {
        return p.join("best");
    }
    p.to_path_buf()
}
