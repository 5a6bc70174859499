//! `cgnmt average`: checkpoint averaging. The parameters of several checkpoints of one model (e.g. the last few
//! saves of a run) are averaged element-wise into a new model directory, which usually translates a little
//! better than any one of them. The checkpoints must share the model configuration and vocabularies.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};

use crate::model::store;
use crate::train::checkpoint;

/// Average the parameters of `models` (checkpoints of one model) into the model directory `out`.
pub fn average(models: &[PathBuf], out: &Path) -> Result<()> {
    if models.is_empty() {
        bail!("no checkpoints to average into {}", out.display());
    }
    let first = store::load(&models[0], DType::F32, &Device::Cpu)?;
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
        let m = store::load(p, DType::F32, &Device::Cpu)?;
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
