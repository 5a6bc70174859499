//! Model selection by another dev score (`train.select_by`): every evaluation logs mteval BLEU, smoothed
//! BLEU and chrF; `best/` is the evaluation with the highest score of the chosen kind.

use crate::common;

use common::prepare;

fn evals(log: &std::path::Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(log)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v.get("eval").is_some())
        .collect()
}

#[test]
fn best_checkpoint_is_the_evaluation_with_the_highest_selected_score() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 400);
    for (by, key) in [
        ("chrf", "dev_chrf"),
        ("smoothed-bleu", "dev_bleu_smoothed"),
        ("bleu", "dev_bleu"),
    ] {
        let run = tmp.path().join(by);
        common::train_tiny(
            &prepared,
            &run,
            &[
                "model.embedding_dim=48",
                "model.hidden_dim=64",
                "model.attention_dim=48",
                "train.batch_size=32",
                "train.max_steps=180",
                "train.eval_every=30",
                "train.eval_max_sentences=80",
                "train.eval_beam=2",
                "train.patience=0",
                "train.optimizer=adam",
                "train.learning_rate=0.005",
                &format!("train.select_by={by:?}"),
            ],
        );
        let ev = evals(&run.join("train.log"));
        assert_eq!(ev.len(), 6, "{by}");
        let scores: Vec<f64> = ev.iter().map(|e| e[key].as_f64().unwrap()).collect();
        for e in &ev {
            let (b, s, c) = (
                e["dev_bleu"].as_f64().unwrap(),
                e["dev_bleu_smoothed"].as_f64().unwrap(),
                e["dev_chrf"].as_f64().unwrap(),
            );
            assert!(s >= b && (0.0..=100.0).contains(&c), "{e}");
        }
        // The first evaluation with the highest score (a later tie is not an improvement).
        let best = (0..scores.len()).fold(0, |m, i| if scores[i] > scores[m] { i } else { m });
        let state = cgnmt::train::checkpoint::load_state(&run.join("last")).unwrap();
        assert!(run.join("best/model.safetensors").is_file());
        assert_eq!(
            state.best_step,
            ev[best]["eval"].as_u64().unwrap(),
            "{by}: {scores:?}"
        );
        assert_eq!(state.best_selection, Some(scores[best]), "{by}");
        assert_eq!(state.best_bleu, ev[best]["dev_bleu"].as_f64(), "{by}");
        if by == "chrf" {
            // chrF tells these early models apart (it is not the same at every evaluation).
            assert!(scores.iter().any(|&x| x != scores[0]), "{scores:?}");
        }
    }
}

/// `cgnmt select --tune --tune-longer-than N --length-ratio LOW,HIGH`: the penalties are chosen on dev's pairs
/// whose reference has more than N words, among those whose output/reference length ratio there lies in the
/// interval (the nearest when none does); the grid's BLEU and ratio are those of translating exactly those
/// pairs with the chosen model and penalties, as `cgnmt translate` and `cgnmt score --mteval-v11b` give them.
#[test]
fn penalties_chosen_on_the_longer_dev_pairs_under_a_length_ratio() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 400);
    let run = tmp.path().join("run");
    common::train_tiny(
        &prepared,
        &run,
        &[
            "model.embedding_dim=32",
            "model.hidden_dim=48",
            "model.attention_dim=32",
            "train.batch_size=32",
            "train.max_steps=120",
            "train.eval_every=40",
            "train.eval_max_sentences=40",
            "train.eval_beam=2",
            "train.optimizer=adam",
            "train.learning_rate=0.005",
        ],
    );
    let dev_src = std::fs::read_to_string(prepared.join("dev.src")).unwrap();
    let dev_ref = std::fs::read_to_string(prepared.join("dev.ref")).unwrap();
    let long: Vec<usize> = dev_ref
        .lines()
        .enumerate()
        .filter(|(_, r)| r.split_whitespace().count() > 6)
        .map(|(i, _)| i)
        .collect();
    assert!(!long.is_empty() && long.len() < dev_ref.lines().count());
    let record = tmp.path().join("selection.json");
    let r = |p: &std::path::Path| p.display().to_string();
    let select = |extra: &[&str]| {
        let mut args = vec![
            "select".to_string(),
            "--run".into(),
            r(&run),
            "--beam".into(),
            "3".into(),
            "--tune".into(),
            "--out".into(),
            r(&record),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
            .args(&args)
            .output()
            .unwrap()
    };
    let out = select(&["--tune-longer-than", "6", "--length-ratio", "0.95,1.05"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sel: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&record).unwrap()).unwrap();
    assert_eq!(sel["tuning"]["longer_than"], 6);
    assert_eq!(
        sel["tuning"]["length_ratio"],
        serde_json::json!([0.95, 1.05])
    );
    assert_eq!(sel["tuning_sentences"].as_u64(), Some(long.len() as u64));
    let grid: Vec<[f64; 4]> = sel["grid"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| serde_json::from_value(g.clone()).unwrap())
        .collect();
    assert_eq!(grid.len(), 10);
    assert!(grid.iter().all(|g| g[3] > 0.0), "{grid:?}");
    // The rule, recomputed: the nearest to [0.95, 1.05] (0 inside), then the highest BLEU, the first on ties.
    let miss = |x: f64| (0.95 - x).max(x - 1.05).max(0.0);
    let mut k = 0;
    for (i, g) in grid.iter().enumerate() {
        if miss(g[3]) < miss(grid[k][3]) || (miss(g[3]) == miss(grid[k][3]) && g[2] > grid[k][2]) {
            k = i;
        }
    }
    let (alpha, beta) = (grid[k][0], grid[k][1]);
    assert_eq!(sel["length_penalty"].as_f64(), Some(alpha), "{grid:?}");
    assert_eq!(sel["coverage_penalty"].as_f64(), Some(beta), "{grid:?}");
    // The chosen point's BLEU and ratio: the longer pairs translated by the chosen model with those penalties.
    let chosen = sel["candidates"][sel["chosen"].as_u64().unwrap() as usize]["dir"]
        .as_str()
        .unwrap()
        .to_string();
    let pick = |text: &str| -> String {
        let lines: Vec<&str> = text.lines().collect();
        long.iter().map(|&i| format!("{}\n", lines[i])).collect()
    };
    let (src, refs, hyp) = (
        tmp.path().join("long.src"),
        tmp.path().join("long.ref"),
        tmp.path().join("long.hyp"),
    );
    std::fs::write(&src, pick(&dev_src)).unwrap();
    std::fs::write(&refs, pick(&dev_ref)).unwrap();
    common::run_ok(&[
        "translate",
        "-q",
        "-m",
        &chosen,
        "-i",
        &r(&src),
        "-o",
        &r(&hyp),
        "--pretokenized",
        "--beam",
        "3",
        "--length-penalty",
        &alpha.to_string(),
        "--coverage-penalty",
        &beta.to_string(),
    ]);
    let score: serde_json::Value = serde_json::from_str(&common::run_ok(&[
        "score",
        "-r",
        &r(&refs),
        "-i",
        &r(&hyp),
        "--mteval-v11b",
        "--json",
    ]))
    .unwrap();
    let bleu = score["score"].as_f64().unwrap();
    let ratio = score["sys_len"].as_f64().unwrap() / score["ref_len"].as_f64().unwrap();
    assert!(
        (bleu - grid[k][2]).abs() < 1e-6,
        "{bleu} against {:?}",
        grid[k]
    );
    assert!(
        (ratio - grid[k][3]).abs() < 1e-9,
        "{ratio} against {:?}",
        grid[k]
    );
    // The penalties travel with the model, with the number of pairs they were chosen on.
    let kept =
        std::fs::read_to_string(std::path::Path::new(&chosen).join("decoding.toml")).unwrap();
    assert!(
        kept.contains(&format!("dev_sentences = {}", long.len())),
        "{kept}"
    );
    // Bad requests are refused by name, before any decoding.
    let bad = select(&["--length-ratio", "1.1,0.9"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("LOW ≤ HIGH"));
    let bad = select(&["--tune-longer-than", "1000"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("longer than 1000 words"));
    let without_tune = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args(["select", "--run", &r(&run), "--tune-longer-than", "6"])
        .output()
        .unwrap();
    assert!(!without_tune.status.success());
    assert!(String::from_utf8_lossy(&without_tune.stderr).contains("--tune"));
}
