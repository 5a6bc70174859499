//! Model directories: the library's unit of exchange between training, decoding and any other user.
//!
//! A model directory holds everything decoding needs: `config.toml` (the resolved configuration),
//! `model.safetensors` (weights, named by their parameter paths), `vocab.src`, `vocab.tgt`, `preprocess.json`
//! (+ BPE files it names). Training adds its own files to the directories it saves (see
//! `train::checkpoint`), through [`save`]'s `extra` hook.
//!
//! Directories are written atomically: into `NAME.tmp`, then the old `NAME` is moved aside and the new one
//! renamed into place, so a crash never leaves a half-written model where a complete one is expected. A
//! write that fails (a full disk) removes its `NAME.tmp` and leaves `NAME` as it was.
//!
//! Readers and a writer may share a directory (`translate` while `train` saves into it): every save writes a
//! new generation id into `COMPLETE`, and [`load`] reads the id before and after the files, reading again when
//! a save replaced the directory meanwhile, so a load is never half one save and half the next.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device};
use candle_nn::VarMap;
use cgnmt_data::preprocess::Preprocessor;
use cgnmt_data::vocab::Vocab;

use crate::config::Config;
use crate::error::{NmtError, Result};
use crate::model::Model;

pub const CONFIG_FILE: &str = "config.toml";
pub const WEIGHTS_FILE: &str = "model.safetensors";
pub const COMPLETE_FILE: &str = "COMPLETE";

/// A loaded model directory: the configuration, the model with its parameters, the vocabularies and the
/// text pipeline (tokenisers, BPE).
pub struct LoadedModel {
    /// The directory read (a run directory's `best/`, or `NAME.old` after a crash between two renames).
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

/// What a model directory holds, to write it.
pub struct ModelFiles<'a> {
    pub config: &'a Config,
    pub varmap: &'a VarMap,
    pub src_vocab: &'a Vocab,
    pub tgt_vocab: &'a Vocab,
    /// Directory holding `preprocess.json` (+ BPE files) to copy.
    pub preprocess_dir: &'a Path,
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

/// Test hook: `CGNMT_TEST_SAVE_PAUSE_MS=N` sleeps N ms after each file a save writes and between its renames,
/// widening the windows a kill or a concurrent reader can fall into (the fault tests use it).
pub fn save_pause() {
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

/// Write a model directory to `dir` atomically, with the files `extra` writes into the new directory before
/// it is marked complete (a training checkpoint's optimiser and state). On an error (e.g. a full disk) the
/// partial `dir.tmp` is removed and `dir` keeps the previous save.
pub fn save(dir: &Path, files: &ModelFiles, extra: &dyn Fn(&Path) -> Result<()>) -> Result<()> {
    let tmp = with_suffix(dir, "tmp");
    let written = write_files(&tmp, files, extra);
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
fn write_files(tmp: &Path, files: &ModelFiles, extra: &dyn Fn(&Path) -> Result<()>) -> Result<()> {
    if tmp.exists() {
        std::fs::remove_dir_all(tmp).map_err(|e| NmtError::io(tmp, e))?;
    }
    std::fs::create_dir_all(tmp).map_err(|e| NmtError::io(tmp, e))?;
    let write = |name: &str, bytes: &[u8]| -> Result<()> {
        let p = tmp.join(name);
        std::fs::write(&p, bytes).map_err(|e| NmtError::io(&p, e))
    };
    write(CONFIG_FILE, files.config.to_toml().as_bytes())?;
    save_pause();
    let weights = tmp.join(WEIGHTS_FILE);
    files
        .varmap
        .save(&weights)
        .map_err(|e| NmtError::model_dir(tmp, format!("cannot write {WEIGHTS_FILE}: {e}")))?;
    save_pause();
    files.src_vocab.save(&tmp.join("vocab.src"))?;
    files.tgt_vocab.save(&tmp.join("vocab.tgt"))?;
    copy_preprocess(files.preprocess_dir, tmp)?;
    save_pause();
    extra(tmp)?;
    write(COMPLETE_FILE, generation_id().as_bytes())?;
    save_pause();
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

/// A model directory, or a run directory's best/ model.
pub fn resolve_model_dir(p: &Path) -> PathBuf {
    if !p.join(CONFIG_FILE).exists() && p.join("best").is_dir() {
        return p.join("best");
    }
    p.to_path_buf()
}

/// Load a model directory (weights checked against the configuration: every tensor present, right shape).
/// A save into the directory while it is read (a training run writing its checkpoints) makes it read again:
/// the model returned is one complete save.
pub fn load(dir: &Path, dtype: DType, dev: &Device) -> Result<LoadedModel> {
    // How long a load keeps trying while saves replace the directory. A save changes the directory only
    // for its renames, so a load normally fits between two saves at the first or second attempt; on a busy
    // machine, with a writer saving back to back, it may take many.
    const PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);
    let start = std::time::Instant::now();
    let mut attempt: u64 = 0;
    loop {
        attempt += 1;
        let before = complete_dir(dir).and_then(|d| generation(&d).map(|g| (d, g)));
        let loaded = load_once(dir, dtype, dev);
        let after = complete_dir(dir).and_then(|d| generation(&d).map(|g| (d, g)));
        // (Neither before nor after: a directory that never had a COMPLETE, so no writer to wait for.)
        let steady = before == after;
        let out_of_time = start.elapsed() >= PATIENCE;
        match loaded {
            // The same generation in the same place before and after: every file was of it.
            Ok(m) if steady => return Ok(m),
            // No writer in sight (no complete directory before or after, or an error that stays): the error
            // is the answer. (A `None` after a `Some` is no such sign: a save's rename can fall between the
            // check for `COMPLETE` and its reading; the next attempt sees the directory steady.)
            Err(e) if steady || out_of_time => return Err(e),
            Ok(_) if out_of_time => {
                return Err(NmtError::model_dir(
                    dir,
                    "kept changing while it was read (a training run saving into it?); try again",
                ))
            }
            _ => std::thread::sleep(std::time::Duration::from_millis((5 * attempt).min(50))),
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
