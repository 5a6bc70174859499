//! Ensemble decoding (`translate -m A -m B …`) on real models: an ensemble of a model with itself is that
//! model byte for byte (the averaging path, against the single model's) (beam search, n-best scores, int8, shortlist, the dump); an ensemble of two models
//! scores each hypothesis with the mean of the two models' log-probabilities (checked on the hypotheses the
//! three n-best lists share); models of different vocabularies are refused, naming the model.

use crate::common;

use std::collections::HashMap;

use common::{prepare, run_ok};

/// `index ||| text ||| score` lines → (index, text) → score.
fn nbest(out: &str) -> HashMap<(usize, String), f64> {
    out.lines()
        .map(|l| {
            let f: Vec<&str> = l.split(" ||| ").collect();
            assert!(f.len() >= 3, "n-best line {l:?}");
            (
                (f[0].parse().unwrap(), f[1].to_string()),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

#[test]
fn an_ensemble_averages_log_probabilities_and_of_one_model_is_that_model() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 400);
    let sets = [
        "model.embedding_dim=48",
        "model.hidden_dim=64",
        "model.attention_dim=48",
        "train.batch_size=32",
        "train.max_steps=180",
        "train.optimizer=adam",
        "train.learning_rate=0.005",
    ];
    let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
    common::train_tiny(&prepared, &a, &[&sets[..], &["train.seed=1"]].concat());
    common::train_tiny(&prepared, &b, &[&sets[..], &["train.seed=2"]].concat());
    let src =
        cgnmt_data::corpus::read_lines(&common::data_dir().join("tatoeba-zh-en/test.zh")).unwrap();
    let input = tmp.path().join("in.zh");
    std::fs::write(&input, src[..60].join("\n") + "\n").unwrap();
    let lexicon = tmp.path().join("lex.tsv");
    run_ok(&[
        "shortlist",
        "--src",
        prepared.join("train.src").to_str().unwrap(),
        "--tgt",
        prepared.join("train.tgt").to_str().unwrap(),
        "-o",
        lexicon.to_str().unwrap(),
    ]);
    let (a, b) = (a.join("last"), b.join("last"));
    let tr = |models: &[&std::path::Path], extra: &[&str]| -> String {
        let mut args = vec!["translate", "--quiet", "-i", input.to_str().unwrap()];
        for m in models {
            args.extend(["-m", m.to_str().unwrap()]);
        }
        args.extend_from_slice(extra);
        run_ok(&args)
    };
    // An ensemble of one model with itself: the model's output, byte for byte.
    for extra in [
        &["--nbest", "4", "--beam", "6"][..],
        &["--int8"],
        &["--shortlist", lexicon.to_str().unwrap()],
        &["--beam", "1"],
    ] {
        let one = tr(&[&a], extra);
        assert!(!one.trim().is_empty());
        assert_eq!(tr(&[&a, &a], extra), one, "{extra:?}");
    }
    let dump = |models: &[&std::path::Path], name: &str| {
        let p = tmp.path().join(name);
        tr(models, &["--dump", p.to_str().unwrap()]);
        std::fs::read_to_string(p).unwrap()
    };
    assert_eq!(dump(&[&a, &a], "aa.jsonl"), dump(&[&a], "a.jsonl"));

    // Two different models: each shared hypothesis scores the mean of the models' log-probabilities.
    let n = ["--nbest", "10", "--beam", "10"];
    let (sa, sb, sab) = (
        nbest(&tr(&[&a], &n)),
        nbest(&tr(&[&b], &n)),
        nbest(&tr(&[&a, &b], &n)),
    );
    assert_ne!(sab, sa);
    assert_ne!(sab, sb);
    let mut shared = 0;
    for (k, &s) in &sab {
        if let (Some(x), Some(y)) = (sa.get(k), sb.get(k)) {
            shared += 1;
            let mean = (x + y) / 2.0;
            assert!(
                (s - mean).abs() < 2e-3 * (1.0 + mean.abs()),
                "{k:?}: ensemble {s}, models {x} and {y}"
            );
        }
    }
    assert!(
        shared >= 20,
        "only {shared} hypotheses in all three n-best lists"
    );

    // A model of other vocabularies is refused, naming it.
    let other_prep = tmp.path().join("prep2");
    prepare(&other_prep, 300);
    let c = tmp.path().join("c");
    common::train_tiny(&other_prep, &c, &["train.max_steps=2"]);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args(["translate", "--quiet", "-i", input.to_str().unwrap()])
        .args(["-m", a.to_str().unwrap(), "-m"])
        .arg(c.join("last"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(c.join("last").to_str().unwrap()) && err.contains("vocabulary"),
        "{err}"
    );
    assert!(out.stdout.is_empty(), "no output on an error");
}
