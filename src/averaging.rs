//! `cgnmt average`: checkpoint averaging. The parameters of several checkpoints of one model (e.g. the last few
//! saves of a run) are averaged element-wise into a new model directory, which usually translates a little
//! better than any one of them. The checkpoints must share the model configuration and vocabularies.

use std::collections::HashMap;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use candle_core::{DType, Device, Tensor};

use crate::checkpoint;

/// Arguments of `cgnmt average`.
#[derive(clap::Args, Debug)]
pub struct AverageArgs {
    /// Model directories to average (two or more; one copies it).
    #[arg(short, long = "model", required = true, num_args = 1..)]
    pub models: Vec<PathBuf>,
    /// Output model directory (written atomically).
    #[arg(short, long)]
    pub out: PathBuf,
}

pub fn run(a: AverageArgs) -> Result<()> {
    let first = checkpoint::load(&a.models[0], DType::F32, &Device::Cpu)?;
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
    for p in &a.models[1..] {
        let m = checkpoint::load(p, DType::F32, &Device::Cpu)?;
        if m.config.model != first.config.model {
            bail!(
                "{}: another model configuration than {} ([model] differs); only checkpoints of one model can \
                 be averaged",
                p.display(),
                a.models[0].display()
            );
        }
        if vocab_bytes(&m.dir)? != vocabs {
            bail!(
                "{}: other vocabularies than {}; only checkpoints of one model can be averaged",
                p.display(),
                a.models[0].display()
            );
        }
        for (name, var) in m.varmap.data().lock().expect("varmap").iter() {
            let s = sums
                .get_mut(name)
                .with_context(|| format!("{}: unexpected parameter {name}", p.display()))?;
            *s = (&*s + var.as_tensor().to_dtype(DType::F64)?)?;
        }
    }
    let n = a.models.len() as f64;
    for (name, var) in first.varmap.data().lock().expect("varmap").iter() {
        let mean = (sums[name].clone() / n)?.to_dtype(DType::F32)?;
        var.set(&mean)?;
    }
    checkpoint::save(
        &a.out,
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
    eprintln!(
        "averaged {} checkpoints → {}",
        a.models.len(),
        a.out.display()
    );
    Ok(())
}
