//! A diverging run (a non-finite loss, injected at a chosen update) stops with a message naming the update
//! and leaves its last checkpoint intact and resumable; with `train.on_divergence = "rollback"` it goes back
//! to that checkpoint with half the learning rate and finishes.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

fn cgnmt(args: &[&str], nan_at: Option<u64>) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cgnmt"));
    c.args(args);
    match nan_at {
        Some(n) => c.env("CGNMT_INJECT_NAN_AT", n.to_string()),
        None => c.env_remove("CGNMT_INJECT_NAN_AT"),
    };
    c.output().expect("run cgnmt")
}

fn train_args<'a>(prep: &'a str, run: &'a str, extra: &[&'a str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "train",
        "--quiet",
        "--out",
        run,
        "--set",
        &format!("data.prepared={prep:?}"),
        "--set",
        "model.embedding_dim=8",
        "--set",
        "model.hidden_dim=8",
        "--set",
        "model.attention_dim=8",
        "--set",
        "data.src_vocab_size=300",
        "--set",
        "data.tgt_vocab_size=300",
        "--set",
        "train.batch_size=16",
        "--set",
        "train.optimizer=adam",
        "--set",
        "train.max_steps=20",
        "--set",
        "train.eval_every=0",
        "--set",
        "train.save_every=5",
        "--set",
        "train.eval_max_sentences=10",
        "--set",
        "train.eval_beam=2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    for e in extra {
        v.push("--set".into());
        v.push(e.to_string());
    }
    v
}

fn state(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("train_state.json")).unwrap()).unwrap()
}

#[test]
fn divergence_stops_at_its_update_or_rolls_back() {
    let tmp = tempfile::tempdir().unwrap();
    let d = common::data_dir().join("tatoeba-zh-en");
    let prep = tmp.path().join("prep");
    let o = cgnmt(
        &[
            "prepare",
            "--src",
            d.join("dev.zh").to_str().unwrap(),
            "--tgt",
            d.join("dev.en").to_str().unwrap(),
            "--out",
            prep.to_str().unwrap(),
        ],
        None,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let prep = prep.to_str().unwrap();

    // Stop: the message names the update and the intact checkpoint; the checkpoint loads and resumes.
    let run = tmp.path().join("run");
    let args = train_args(prep, run.to_str().unwrap(), &[]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = cgnmt(&argv, Some(12));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("training diverged at update 12: loss NaN"),
        "{err}"
    );
    assert!(err.contains("update 10) is intact"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(state(&run.join("last"))["step"], 10);
    let o = cgnmt(
        &["train", "--quiet", "--resume", run.to_str().unwrap()],
        None,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(state(&run.join("last"))["step"], 20);

    // Rollback: back to update 10 with half the learning rate, then on to the end.
    let run2 = tmp.path().join("run2");
    let args = train_args(
        prep,
        run2.to_str().unwrap(),
        &["train.on_divergence=\"rollback\""],
    );
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = cgnmt(&argv, Some(12));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let st = state(&run2.join("last"));
    assert_eq!(st["step"], 20);
    assert_eq!(st["rollbacks"], 1);
    assert_eq!(st["lr_scale"], 0.5);
    let log = std::fs::read_to_string(run2.join("train.log")).unwrap();
    let rb: Vec<serde_json::Value> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v.get("rollback").is_some())
        .collect();
    assert_eq!(rb.len(), 1, "{log}");
    assert_eq!(rb[0]["rollback"], 12);
    assert_eq!(rb[0]["to_step"], 10);

    // Rollback needs a learning rate to lower.
    let args = train_args(
        prep,
        tmp.path().join("run3").to_str().unwrap(),
        &[
            "train.on_divergence=\"rollback\"",
            "train.optimizer=\"adadelta\"",
        ],
    );
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = cgnmt(&argv, None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("train.on_divergence"),
        "{err}"
    );
}
