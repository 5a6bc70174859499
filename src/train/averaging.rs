//! `cgnmt average`: checkpoint averaging. The parameters of several checkpoints of one model (e.g. the last few
//! saves of a run) are averaged element-wise into a new model directory, which usually translates a little
//! better than any one of them. The checkpoints must share the model configuration and vocabularies.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};

use crate::train::checkpoint;

/// Arguments of `cgnmt average`.
#[derive(clap::Args, Debug)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["models", "run"])))]
pub struct AverageArgs {
    /// Model directories to average (two or more; one copies it).
    #[arg(short, long = "model", num_args = 1..)]
    pub models: Vec<PathBuf>,
    /// A training run: average its kept checkpoints (`ckpt-STEP/`) of the converged tail, those whose dev
    /// score is within --tolerance of the run's best (printed with the reason for each).
    #[arg(long, conflicts_with = "models")]
    pub run: Option<PathBuf>,
    /// With --run: consider only the last N kept checkpoints (0: all).
    #[arg(long, default_value_t = 0, requires = "run")]
    pub last: usize,
    /// With --run: how many points of the run's selection score (`train.select_by`) below its best a
    /// checkpoint may score and still be averaged.
    #[arg(long, default_value_t = crate::train::selection::DEFAULT_TOLERANCE, requires = "run")]
    pub tolerance: f64,
    /// Output model directory (written atomically).
    #[arg(short, long)]
    pub out: PathBuf,
}

pub fn run(a: AverageArgs) -> Result<()> {
    let models = match &a.run {
        None => a.models.clone(),
        Some(run) => {
            let tail = crate::train::selection::converged_tail(run, a.last, a.tolerance)?;
            eprint!("{}", tail.describe());
            let taken = tail.taken();
            if taken.is_empty() {
                bail!(
                    "{}: no kept checkpoint is within {} of the best (set train.keep_checkpoints, or raise \
                     --tolerance); the run's best/ is its best model",
                    run.display(),
                    a.tolerance
                );
            }
            taken
        }
    };
    average(&models, &a.out)?;
    eprintln!(
        "averaged {} checkpoints → {}",
        models.len(),
        a.out.display()
    );
    Ok(())
}

/// Average the parameters of `models` (checkpoints of one model) into the model directory `out`.
pub fn average(models: &[PathBuf], out: &Path) -> Result<()> {
    if models.is_empty() {
        bail!("no checkpoints to average into {}", out.display());
    }
    let first = checkpoint::load(&models[0], DType::F32, &Device::Cpu)?;
    let vocab_bytes = |dir: &std::path::Path| -> Result<(Vec<u8>, Vec<u8>)> {
        let read = |f: &str| {
            std::fs::read(dir.join(f))
                .with_context(|| format!("{}: cannot read {f}", dir.display()))
        };
        Ok((read("vocab.src")?, read("vocab.tgt")?))
    };
    let vocabs = vocab_bytes(&first.dir)?;
    // Sums in f64 (one checkpoint's "average" is that checkpoint, bit for bit).
    let mut sums: HashMap<String, Tensor> = HashMap::new();
    for (name, var) in first.varmap.data().lock().expect("varmap").iter() {
        sums.insert(name.clone(), var.as_tensor().to_dtype(DType::F64)?);
    }
    for p in &models[1..] {
        let m = checkpoint::load(p, DType::F32, &Device::Cpu)?;
        if m.config.model != first.config.model {
            bail!(
                "{}: another model configuration than {} ([model] differs); only checkpoints of one model can \
                 be averaged",
                p.display(),
                models[0].display()
            );
        }
        if vocab_bytes(&m.dir)? != vocabs {
            bail!(
                "{}: other vocabularies than {}; only checkpoints of one model can be averaged",
                p.display(),
                models[0].display()
            );
        }
        for (name, var) in m.varmap.data().lock().expect("varmap").iter() {
            let s = sums
                .get_mut(name)
                .with_context(|| format!("{}: unexpected parameter {name}", p.display()))?;
            *s = (&*s + var.as_tensor().to_dtype(DType::F64)?)?;
        }
    }
    let n = models.len() as f64;
    for (name, var) in first.varmap.data().lock().expect("varmap").iter() {
        let mean = (sums[name].clone() / n)?.to_dtype(DType::F32)?;
        var.set(&mean)?;
    }
    checkpoint::save(
        out,
        &checkpoint::SaveRequest {
            config: &first.config,
            varmap: &first.varmap,
            src_vocab: &first.src_vocab,
            tgt_vocab: &first.tgt_vocab,
            preprocess_dir: &first.dir,
            optimizer: None,
            state: None,
        },
    )?;
    Ok(())
}
