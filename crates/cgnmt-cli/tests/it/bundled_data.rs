//! A fresh clone runs its demo anywhere: with no data directory given (no `--data`, no `$CGNMT_DATA`, no
//! `../shared/data` beside the working directory) the demo trains and scores on the Tatoeba copy compiled
//! into the binary; a named data directory that lacks the data is an error, never the bundled copy. A short
//! demo run (a few early checkpoints on one thread) ships a model that scores on dev at least as well as the
//! run's `best/`, whatever the averaging rule and the penalty grid chose.

use std::process::Command;

/// mteval-v11b BLEU of `model` decoding the first `n` evenly spaced lines of the prepared dev set with the
/// given penalties, through the command line (`translate`, then `score`).
fn dev_bleu(
    work: &std::path::Path,
    prepared: &std::path::Path,
    model: &std::path::Path,
    n: usize,
    alpha: f64,
    beta: f64,
) -> f64 {
    let read = |f: &str| {
        std::fs::read_to_string(prepared.join(f))
            .unwrap()
            .lines()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    let (src, refs) = (read("dev.src"), read("dev.ref"));
    let pick: Vec<usize> = (0..n).map(|k| k * src.len() / n).collect();
    let sub = |v: &[String]| {
        pick.iter()
            .map(|&i| v[i].clone() + "\n")
            .collect::<String>()
    };
    let (src_f, ref_f, hyp_f) = (
        work.join("sel.src"),
        work.join("sel.ref"),
        work.join("sel.hyp"),
    );
    std::fs::write(&src_f, sub(&src)).unwrap();
    std::fs::write(&ref_f, sub(&refs)).unwrap();
    let s = |p: &std::path::Path| p.display().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args([
            "translate",
            "--quiet",
            "--pretokenized",
            "-m",
            &s(model),
            "--length-penalty",
            &alpha.to_string(),
            "--coverage-penalty",
            &beta.to_string(),
            "-i",
            &s(&src_f),
            "-o",
            &s(&hyp_f),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args([
            "score",
            "--mteval-v11b",
            "--json",
            "-r",
            &s(&ref_f),
            "-i",
            &s(&hyp_f),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    v["score"].as_f64().unwrap_or_else(|| panic!("{v}"))
}

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
            "--updates",
            "600",
            "--selection-sentences",
            "120",
            "--set",
            "train.eval_every=150",
            "--set",
            "train.eval_max_sentences=60",
            "--set",
            "train.threads=1",
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
    assert_eq!(cfg.train.max_steps, 600);
    assert!(cfg.train.exponential_smoothing > 0.0);
    // What the demo chose on dev, and why.
    let run = work.join("demo/model-improved");
    let sel: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("selection.json")).unwrap())
            .unwrap();
    assert!(
        err.contains("choosing the model on dev (120 sentences"),
        "{err}"
    );
    assert!(err.contains("chosen:"), "{err}");
    let names: Vec<&str> = sel["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names[0], "best");
    assert!(names.contains(&"moving average"), "{names:?}");
    // The tail rule: the last four kept checkpoints (updates 150 to 600), each averaged exactly when its
    // dev BLEU at its evaluation is within the tolerance of the run's best.
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("last/train_state.json")).unwrap())
            .unwrap();
    let history = state["history"].as_array().unwrap();
    let best = history
        .iter()
        .map(|h| h["dev_bleu"].as_f64().unwrap())
        .fold(f64::MIN, f64::max);
    let tail = sel["tail"]["entries"].as_array().unwrap();
    assert_eq!(
        tail.iter()
            .map(|e| e["step"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        [150, 300, 450, 600]
    );
    for e in tail {
        let step = e["step"].as_u64().unwrap();
        let at = history
            .iter()
            .find(|h| h["step"].as_u64() == Some(step))
            .unwrap()["dev_bleu"]
            .as_f64()
            .unwrap();
        assert_eq!(e["taken"].as_bool().unwrap(), at >= best - 1.0, "{e}");
    }
    let taken = tail
        .iter()
        .filter(|e| e["taken"].as_bool().unwrap())
        .count();
    assert_eq!(
        names.iter().any(|n| n.starts_with("average of")),
        taken >= 2,
        "{names:?}"
    );
    // The shipped model, decoded with the chosen penalties, scores on dev at least as well as best/ with
    // the recipe's: scored again here through translate and score.
    let chosen = sel["candidates"][sel["chosen"].as_u64().unwrap() as usize]["dir"]
        .as_str()
        .unwrap()
        .to_string();
    let prepared = work.join("demo/prepared-bpe");
    let (alpha, beta) = (
        sel["length_penalty"].as_f64().unwrap(),
        sel["coverage_penalty"].as_f64().unwrap(),
    );
    let shipped = dev_bleu(&work, &prepared, &work.join(&chosen), 120, alpha, beta);
    let best_dev = dev_bleu(&work, &prepared, &run.join("best"), 120, 1.5, 0.2);
    assert_eq!(best_dev, sel["candidates"][0]["dev_bleu"].as_f64().unwrap());
    assert!(
        shipped >= best_dev && shipped > 0.0,
        "shipped {shipped} against best/ {best_dev}: {sel}"
    );
    assert!(
        err.contains(&format!("with {chosen}")) || err.contains(&chosen),
        "{err}"
    );
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

    // `--recipe best`: the improved recipe's settings and prepared data, its own run directory, 30,000
    // updates unless told (a time cap stops this one early and says so against that length).
    let out = Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .current_dir(&work)
        .env_remove("CGNMT_DATA")
        .env("CGNMT_CACHE", tmp.path().join("cache"))
        .args([
            "demo",
            "--out",
            "demo",
            "--recipe",
            "best",
            "--seconds",
            "4",
            "--selection-sentences",
            "30",
            "--set",
            "train.eval_every=20",
            "--set",
            "train.eval_max_sentences=20",
            "--set",
            "train.threads=1",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("best recipe, 30000 updates"), "{err}");
    assert!(err.contains("of 30000"), "the time cap is reported: {err}");
    assert!(
        !err.contains("== preparing"),
        "the improved recipe's prepared data is reused: {err}"
    );
    assert!(
        stdout.contains("Tatoeba zh-en test BLEU (mteval-v11b"),
        "{stdout}"
    );
    let best_cfg =
        cgnmt::config::Config::load(Some(&work.join("demo/model-best/last/config.toml")), &[])
            .unwrap();
    assert_eq!(best_cfg.train.max_steps, 30_000);
    assert_eq!(best_cfg.model, cfg.model);
    assert_eq!(best_cfg.train.label_smoothing, cfg.train.label_smoothing);
    assert_eq!(
        best_cfg.train.recurrent_dropout,
        cfg.train.recurrent_dropout
    );
    assert!(work.join("demo/model-best/selection.json").is_file());

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
