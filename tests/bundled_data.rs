//! A fresh clone runs its demo anywhere: with no data directory given (no `--data`, no `$CGNMT_DATA`, no
//! `../shared/data` beside the working directory) the demo trains and scores on the Tatoeba copy compiled
//! into the binary; a named data directory that lacks the data is an error, never the bundled copy.

use std::process::Command;

#[test]
fn demo_runs_on_the_bundled_copy_without_a_data_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let work = tmp.path().join("elsewhere");
    std::fs::create_dir_all(&work).unwrap();
    assert!(!work.join("../shared/data").exists());
    let out = Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .current_dir(&work)
        .env_remove("CGNMT_DATA")
        .env("CGNMT_CACHE", tmp.path().join("cache"))
        .args([
            "demo",
            "--out",
            "demo",
            "--seconds",
            "30",
            "--set",
            "model.embedding_dim=16",
            "--set",
            "model.hidden_dim=32",
            "--set",
            "model.attention_dim=32",
            "--set",
            "train.max_steps=20",
            "--set",
            "train.eval_every=0",
            "--set",
            "train.eval_max_sentences=50",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("using the bundled copy"), "{err}");
    assert!(
        stdout.contains("Tatoeba zh-en test BLEU (mteval-v11b"),
        "{stdout}"
    );
    assert!(stdout.contains("pairs longer than 6 words"), "{stdout}");
    // The default recipe is the improved one: BPE, tied output embeddings and label smoothing.
    assert!(work.join("demo/prepared-bpe/bpe.tgt.json").is_file());
    let cfg = cgnmt::config::Config::load(
        Some(&work.join("demo/model-improved/last/config.toml")),
        &[],
    )
    .unwrap();
    assert!(cfg.model.tied_output_embeddings);
    assert_eq!(cfg.train.label_smoothing, 0.1);
    // It decodes the average of the checkpoints the run kept.
    assert!(err.contains("averaging the last 1 checkpoints"), "{err}");
    assert!(work
        .join("demo/model-improved/averaged/model.safetensors")
        .is_file());
    let hyp = std::fs::read_to_string(work.join("demo/model-improved/test.hyp.en")).unwrap();
    assert_eq!(
        hyp.lines().count(),
        2049,
        "one output line per test sentence"
    );
    let prep: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(work.join("demo/prepared-bpe/prepare.json")).unwrap(),
    )
    .unwrap();
    assert!(
        prep.to_string().contains("26023"),
        "all training pairs read: {prep}"
    );

    // A data directory the user names is used or refused, never silently replaced.
    let out = Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .current_dir(&work)
        .env("CGNMT_DATA", tmp.path().join("nowhere"))
        .env("CGNMT_CACHE", tmp.path().join("cache"))
        .args(["demo", "--out", "demo2"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("nowhere") && err.contains("not found"),
        "{err}"
    );
}
