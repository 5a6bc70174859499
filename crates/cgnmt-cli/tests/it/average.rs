//! `cgnmt average` on real checkpoints: one checkpoint's average is that model (the same translations, byte
//! for byte), two checkpoints average element-wise, checkpoints of different models are refused, and
//! `train.keep_checkpoints` keeps the last saves to average.

use crate::common;

use std::path::Path;

use candle_core::Device;
use common::{prepare, run_ok};

fn train(prepared: &Path, out: &Path, extra: &[&str]) {
    let mut sets = vec!["train.max_steps=6"];
    sets.extend_from_slice(extra);
    common::train_tiny(prepared, out, &sets);
}

fn weights(dir: &Path) -> Vec<(String, Vec<f32>)> {
    let mut v: Vec<(String, Vec<f32>)> =
        candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)
            .unwrap()
            .into_iter()
            .map(|(k, t)| (k, t.flatten_all().unwrap().to_vec1().unwrap()))
            .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn averaging_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 80);
    let (a, b, c) = (
        tmp.path().join("a"),
        tmp.path().join("b"),
        tmp.path().join("c"),
    );
    train(&prepared, &a, &["train.seed=1"]);
    train(&prepared, &b, &["train.seed=2"]);
    train(&prepared, &c, &["model.hidden_dim=32"]);
    let (ma, mb) = (a.join("last"), b.join("last"));
    let input = tmp.path().join("in.zh");
    let src =
        cgnmt_data::corpus::read_lines(&common::data_dir().join("tatoeba-zh-en/test.zh")).unwrap();
    std::fs::write(&input, src[..15].join("\n") + "\n").unwrap();
    let translate = |m: &Path| {
        run_ok(&[
            "translate",
            "--quiet",
            "-m",
            m.to_str().unwrap(),
            "-i",
            input.to_str().unwrap(),
        ])
    };

    let one = tmp.path().join("one");
    run_ok(&[
        "average",
        "-m",
        ma.to_str().unwrap(),
        "-o",
        one.to_str().unwrap(),
    ]);
    assert_eq!(weights(&one), weights(&ma));
    assert_eq!(translate(&one), translate(&ma));

    let two = tmp.path().join("two");
    run_ok(&[
        "average",
        "-m",
        ma.to_str().unwrap(),
        mb.to_str().unwrap(),
        "-o",
        two.to_str().unwrap(),
    ]);
    let (wa, wb, w2) = (weights(&ma), weights(&mb), weights(&two));
    assert_eq!(w2.len(), wa.len());
    let mut differ = 0;
    for (((n, x), (_, y)), (_, z)) in wa.iter().zip(&wb).zip(&w2) {
        for ((x, y), z) in x.iter().zip(y).zip(z) {
            let mean = ((*x as f64 + *y as f64) / 2.0) as f32;
            assert_eq!(*z, mean, "{n}");
            differ += (x != y) as usize;
        }
    }
    assert!(differ > 0, "the two runs should differ");
    assert_eq!(translate(&two).lines().count(), 15);

    let o = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args(["average", "-m"])
        .arg(&ma)
        .arg(c.join("last"))
        .arg("-o")
        .arg(tmp.path().join("bad"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("another model configuration"),
        "{err}"
    );
    assert!(!tmp.path().join("bad").exists());

    // A run keeps its last N saves for averaging.
    let k = tmp.path().join("k");
    train(
        &prepared,
        &k,
        &["train.save_every=2", "train.keep_checkpoints=2"],
    );
    let mut kept: Vec<String> = std::fs::read_dir(&k)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().to_string())
        .filter(|n| n.starts_with("ckpt-"))
        .collect();
    kept.sort();
    assert_eq!(kept, ["ckpt-0000004", "ckpt-0000006"]);
    assert_eq!(weights(&k.join("ckpt-0000006")), weights(&k.join("last")));
    let avg = tmp.path().join("avg");
    run_ok(&[
        "average",
        "-m",
        k.join("ckpt-0000004").to_str().unwrap(),
        k.join("ckpt-0000006").to_str().unwrap(),
        "-o",
        avg.to_str().unwrap(),
    ]);
    assert_eq!(translate(&avg).lines().count(), 15);
}
