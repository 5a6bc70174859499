#![allow(dead_code)]
//! Helpers shared by the integration tests.

pub mod fixtures;

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor, Var};
use candle_nn::VarMap;
use cgnmt::config::{Config, ModelConfig};
use cgnmt::model::{Batch, Model};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The checkout's root (the workspace: configs/, data/, scripts/, results/).
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The data directory: `$CGNMT_DATA`, else `../shared/data` beside the checkout, else (a fresh clone
/// anywhere) a directory whose `tatoeba-zh-en` is the bundled copy: tests of other data sets then skip with
/// [`data_set_or_skip`].
pub fn data_dir() -> PathBuf {
    if let Ok(d) = std::env::var("CGNMT_DATA") {
        return PathBuf::from(d);
    }
    let shared = repo().join("../shared/data");
    if shared.join("tatoeba-zh-en").is_dir() {
        return shared;
    }
    static BUNDLED: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUNDLED
        .get_or_init(|| {
            let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("bundled-data");
            let link = root.join("tatoeba-zh-en");
            if !link.exists() {
                std::fs::create_dir_all(&root).unwrap();
                let dir = cgnmt_datasets::bundled_dir().expect("unpack the bundled data");
                std::os::unix::fs::symlink(dir, &link).unwrap();
            }
            root
        })
        .clone()
}

/// A data set of the data directory, or `None` (with a message saying the test is skipped) where it is
/// absent: only Tatoeba zh-en ships with the toolkit.
pub fn data_set_or_skip(name: &str, test: &str) -> Option<PathBuf> {
    let d = data_dir().join(name);
    if d.is_dir() {
        Some(d)
    } else {
        eprintln!(
            "!!!!! {test}: SKIPPED — data set {name} not found in {} (set CGNMT_DATA to the shared data directory) !!!!!",
            data_dir().display()
        );
        None
    }
}

pub fn tiny_model_config(sets: &[&str]) -> ModelConfig {
    let mut all: Vec<String> = vec![
        "model.embedding_dim=3".into(),
        "model.hidden_dim=4".into(),
        "model.attention_dim=3".into(),
    ];
    all.extend(sets.iter().map(|s| s.to_string()));
    Config::load(None, &all).expect("config").model
}

/// Replace every parameter by N(0, sd²) values so that no path is dead (the paper's init zeroes `v`).
pub fn randomize(varmap: &VarMap, seed: u64, sd: f64) {
    let mut rng = StdRng::seed_from_u64(seed);
    let data = varmap.data().lock().unwrap();
    let mut names: Vec<&String> = data.keys().collect();
    names.sort();
    for n in names {
        let v = &data[n];
        let vals: Vec<f64> = (0..v.elem_count())
            .map(|_| (rng.random::<f64>() * 2.0 - 1.0) * sd * 1.7)
            .collect();
        let t = Tensor::from_vec(vals, v.shape().clone(), &Device::Cpu)
            .unwrap()
            .to_dtype(v.dtype())
            .unwrap();
        v.set(&t).unwrap();
    }
}

pub fn random_seqs(
    rng: &mut StdRng,
    n: usize,
    vocab: usize,
    min: usize,
    max: usize,
) -> Vec<Vec<u32>> {
    (0..n)
        .map(|_| {
            let len = rng.random_range(min..=max);
            (0..len)
                .map(|_| rng.random_range(2..vocab as u32))
                .collect()
        })
        .collect()
}

pub fn tiny_batch(seed: u64, vs: usize, vt: usize, dtype: DType) -> Batch {
    let mut rng = StdRng::seed_from_u64(seed);
    let src = random_seqs(&mut rng, 3, vs, 1, 4);
    let tgt = random_seqs(&mut rng, 3, vt, 1, 4);
    Batch::new(&src, &tgt, 0, dtype, &Device::Cpu).unwrap()
}

pub fn sorted_vars(varmap: &VarMap) -> Vec<(String, Var)> {
    let mut v: Vec<(String, Var)> = varmap
        .data()
        .lock()
        .unwrap()
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// Compare autodiff gradients with central finite differences (f64) on up to `per_param` entries of every
/// parameter. Returns the worst relative error.
pub fn grad_check(cfg: &ModelConfig, seed: u64, per_param: usize) -> f64 {
    grad_check_with(cfg, seed, per_param, &cgnmt::model::LossOptions::default())
}

/// [`grad_check`] of the training loss with options `opts` (e.g. label smoothing).
pub fn grad_check_with(
    cfg: &ModelConfig,
    seed: u64,
    per_param: usize,
    opts: &cgnmt::model::LossOptions,
) -> f64 {
    let (vs, vt) = (7, 6);
    let (model, varmap) = Model::build(cfg, vs, vt, seed, DType::F64, &Device::Cpu).unwrap();
    randomize(&varmap, seed + 1, 0.5);
    let batch = tiny_batch(seed + 2, vs, vt, DType::F64);
    let loss = model.loss_with(&batch, opts).unwrap();
    let grads = model.backward(&loss).unwrap();
    let mut worst: f64 = 0.0;
    let eps = 1e-5;
    let mut rng = StdRng::seed_from_u64(seed + 3);
    for (name, var) in sorted_vars(&varmap) {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name}: no gradient"))
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let base = var
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        let n = base.len();
        let picks: Vec<usize> = if n <= per_param {
            (0..n).collect()
        } else {
            (0..per_param).map(|_| rng.random_range(0..n)).collect()
        };
        for k in picks {
            let eval = |delta: f64| {
                let mut v = base.clone();
                v[k] += delta;
                var.set(&Tensor::from_vec(v, var.shape().clone(), &Device::Cpu).unwrap())
                    .unwrap();
                model
                    .loss_with(&batch, opts)
                    .unwrap()
                    .to_scalar::<f64>()
                    .unwrap()
            };
            let fd = (eval(eps) - eval(-eps)) / (2.0 * eps);
            var.set(&Tensor::from_vec(base.clone(), var.shape().clone(), &Device::Cpu).unwrap())
                .unwrap();
            let err = (fd - g[k]).abs() / fd.abs().max(g[k].abs()).max(1e-3);
            assert!(
                err < 1e-5,
                "{name}[{k}]: autodiff {} vs finite difference {fd} (rel err {err:.2e})",
                g[k]
            );
            worst = worst.max(err);
        }
    }
    worst
}

/// Run `cgnmt` with `args`; its standard output (a failure panics with its standard error).
pub fn run_ok(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args(args)
        .output()
        .expect("run cgnmt");
    assert!(
        out.status.success(),
        "cgnmt {:?} failed:\n{}",
        args,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `cgnmt prepare` of the first `limit` Tatoeba zh-en training pairs (and its dev set) into `dir`.
pub fn prepare(dir: &std::path::Path, limit: usize) {
    let d = data_dir().join("tatoeba-zh-en");
    let s = |p: &str| d.join(p).display().to_string();
    run_ok(&[
        "prepare",
        "--src",
        &s("train.zh"),
        "--tgt",
        &s("train.en"),
        "--dev-src",
        &s("dev.zh"),
        "--dev-tgt",
        &s("dev.en"),
        "--limit",
        &limit.to_string(),
        "--out",
        dir.to_str().unwrap(),
        "--force",
    ]);
}

/// `cgnmt train` of a tiny model (E 16 / H 24 / A 16, no dev evaluations) on `prepared` into `out`, with
/// further `section.key=value` settings.
pub fn train_tiny(prepared: &std::path::Path, out: &std::path::Path, sets: &[&str]) {
    let mut args = vec![
        "train".to_string(),
        "--quiet".into(),
        "--out".into(),
        out.display().to_string(),
    ];
    for s in [
        format!("data.prepared={:?}", prepared.display().to_string()),
        "model.embedding_dim=16".into(),
        "model.hidden_dim=24".into(),
        "model.attention_dim=16".into(),
        "train.eval_every=0".into(),
    ]
    .into_iter()
    .chain(sets.iter().map(|s| s.to_string()))
    {
        args.push("--set".into());
        args.push(s);
    }
    run_ok(&args.iter().map(String::as_str).collect::<Vec<_>>());
}
