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
    let batch = tiny_batch(seed + 2, 7, 6, DType::F64);
    grad_check_on(cfg, seed, per_param, opts, &batch)
}

/// A tiny batch (source vocabulary 7, target 6) whose pairs carry random guided-alignment links: about half
/// the target pieces linked to one or two source pieces, and EOS to EOS.
pub fn tiny_guided_batch(seed: u64, dtype: DType) -> Batch {
    let mut rng = StdRng::seed_from_u64(seed);
    let src = random_seqs(&mut rng, 3, 7, 1, 4);
    let tgt = random_seqs(&mut rng, 3, 6, 1, 4);
    let links: Vec<Vec<(u32, u32)>> = src
        .iter()
        .zip(&tgt)
        .map(|(s, t)| {
            let mut l = vec![];
            for i in 0..t.len() as u32 {
                for _ in 0..rng.random_range(0..3) {
                    l.push((rng.random_range(0..s.len() as u32), i));
                }
            }
            l.push((s.len() as u32, t.len() as u32));
            l
        })
        .collect();
    let keys: Vec<u64> = (0..3).collect();
    Batch::keyed_with_inputs(
        &src,
        &tgt,
        None,
        Some(&links),
        &keys,
        0,
        dtype,
        &Device::Cpu,
    )
    .unwrap()
}

/// [`grad_check_with`] on `batch` (made for vocabularies of 7 source and 6 target words).
pub fn grad_check_on(
    cfg: &ModelConfig,
    seed: u64,
    per_param: usize,
    opts: &cgnmt::model::LossOptions,
    batch: &Batch,
) -> f64 {
    let (vs, vt) = (7, 6);
    let (model, varmap) = Model::build(cfg, vs, vt, seed, DType::F64, &Device::Cpu).unwrap();
    randomize(&varmap, seed + 1, 0.5);
    let loss = model.loss_with(batch, opts).unwrap();
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
                    .loss_with(batch, opts)
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

/// A trained model `model` read by every decoding path of the command line, on 12 dev sentences of `prepared`:
/// exact beam search (the reference kernels give the same translations), `--int8` and `--shortlist` (one line
/// per input), an ensemble with `twin` (a model with the same parameters: the same translations), `--dump`
/// (attention and gates for each sentence) and `align` (one line of links per pair). Scratch files go to `tmp`.
pub fn decodes_everywhere(
    tmp: &std::path::Path,
    prepared: &std::path::Path,
    model: &std::path::Path,
    twin: &std::path::Path,
) {
    let src = tmp.join("src.txt");
    let dev: Vec<String> = std::fs::read_to_string(prepared.join("dev.src"))
        .unwrap()
        .lines()
        .take(12)
        .map(str::to_string)
        .collect();
    std::fs::write(&src, dev.join("\n") + "\n").unwrap();
    let translate = |extra: &[&str]| -> Vec<String> {
        let mut args = vec![
            "translate",
            "--quiet",
            "--pretokenized",
            "-m",
            model.to_str().unwrap(),
            "-i",
            src.to_str().unwrap(),
            "--beam",
            "4",
        ];
        args.extend(extra);
        run_ok(&args).lines().map(str::to_string).collect()
    };
    let exact = translate(&[]);
    assert_eq!(exact.len(), 12);
    assert_eq!(translate(&["--kernels", "reference"]), exact);
    assert_eq!(translate(&["--int8"]).len(), 12);
    let lex = tmp.join("lex.txt");
    run_ok(&[
        "shortlist",
        "--quiet",
        "--src",
        prepared.join("train.src").to_str().unwrap(),
        "--tgt",
        prepared.join("train.tgt").to_str().unwrap(),
        "-o",
        lex.to_str().unwrap(),
    ]);
    assert_eq!(translate(&["--shortlist", lex.to_str().unwrap()]).len(), 12);
    assert_eq!(translate(&["-m", twin.to_str().unwrap()]), exact);
    let dump = tmp.join("dump.jsonl");
    translate(&["--dump", dump.to_str().unwrap()]);
    let d = std::fs::read_to_string(&dump).unwrap();
    assert_eq!(d.lines().count(), 12);
    assert!(
        d.contains("\"attention\"") && d.contains("\"gates\""),
        "{}",
        &d[..d.len().min(400)]
    );
    let tgt = tmp.join("tgt.txt");
    std::fs::write(&tgt, exact.join("\n") + "\n").unwrap();
    let links = tmp.join("links.txt");
    run_ok(&[
        "align",
        "-m",
        model.to_str().unwrap(),
        "--src",
        src.to_str().unwrap(),
        "--tgt",
        tgt.to_str().unwrap(),
        "-o",
        links.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read_to_string(&links).unwrap().lines().count(), 12);
}

/// A tiny deep model's training arguments (2 encoder layers, a depth-2 transition, recurrent dropout, a
/// checkpoint every 5 updates) on `prepared` into `run`, for `steps` updates, with further settings `sets`.
pub fn deep_train_args(
    prepared: &std::path::Path,
    run: &std::path::Path,
    steps: usize,
    sets: &[&str],
) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "train".into(),
        "--quiet".into(),
        "--out".into(),
        run.display().to_string(),
    ];
    for s in [
        format!("data.prepared={:?}", prepared.display().to_string()),
        "model.embedding_dim=16".into(),
        "model.hidden_dim=24".into(),
        "model.attention_dim=16".into(),
        "model.encoder_layers=2".into(),
        "model.decoder_transition_depth=2".into(),
        "train.batch_size=8".into(),
        format!("train.max_steps={steps}"),
        "train.save_every=5".into(),
        "train.eval_every=0".into(),
        "train.recurrent_dropout=0.2".into(),
        "train.threads=1".into(),
    ]
    .into_iter()
    .chain(sets.iter().map(|s| s.to_string()))
    {
        v.push("--set".into());
        v.push(s);
    }
    v
}

/// [`run_ok`] of owned arguments.
pub fn run_args_ok(args: &[String]) -> String {
    run_ok(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// The parameters of a run's last complete checkpoint, by name.
pub fn saved_weights(run: &std::path::Path) -> std::collections::BTreeMap<String, Vec<f32>> {
    let dir = cgnmt::model::store::complete_dir(&run.join("last")).unwrap();
    let t =
        candle_core::safetensors::load(dir.join("model.safetensors"), &candle_core::Device::Cpu)
            .unwrap();
    t.into_iter()
        .map(|(k, v)| (k, v.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
        .collect()
}

/// Every kind of dropout at once (embeddings, annotations, readout, recurrent), the masks of seed 5: what the
/// gradient checks run with dropout.
pub fn every_dropout() -> cgnmt::model::dropout::Dropout {
    cgnmt::model::dropout::Dropout {
        embeddings: 0.3,
        annotations: 0.25,
        readout: 0.4,
        recurrent: 0.35,
        seed: 5,
    }
}
