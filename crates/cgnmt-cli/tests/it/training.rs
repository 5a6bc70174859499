//! Training as Marian and Nematus users know it: learning-rate schedules (resumed bit for bit), batches by
//! target tokens, gradient accumulation (the same update as one larger batch), word dropout.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{Device, Tensor};

use crate::common;

fn params(run: &Path) -> HashMap<String, Tensor> {
    candle_core::safetensors::load(run.join("last/model.safetensors"), &Device::Cpu).unwrap()
}

/// The largest difference between two runs' parameters, relative to the largest parameter.
fn relative_difference(a: &HashMap<String, Tensor>, b: &HashMap<String, Tensor>) -> f32 {
    let (mut diff, mut size) = (0f32, 0f32);
    for (k, x) in a {
        let d = (x - &b[k]).unwrap().abs().unwrap().max_all().unwrap();
        diff = diff.max(d.to_scalar::<f32>().unwrap());
        let m = x
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar::<f32>()
            .unwrap();
        size = size.max(m);
    }
    diff / size
}

fn log_lines(run: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(run.join("train.log"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// `train.accumulate = 4` over batches of 8 is one update on their union: the same parameters as batches of
/// 32 (reading ahead one batch, both see the same sentences per update), with every dropout kind on.
#[test]
fn accumulated_batches_update_like_one_larger_batch() {
    let tmp = tempfile::tempdir().unwrap();
    let prep = tmp.path().join("prep");
    common::prepare(&prep, 400);
    let common_sets = [
        "train.sort_batches=1",
        "train.max_steps=12",
        "train.threads=1",
        "train.optimizer=adam",
        "train.learning_rate=0.003",
        "train.embedding_dropout=0.2",
        "train.recurrent_dropout=0.2",
        "train.source_word_dropout=0.1",
        "train.target_word_dropout=0.1",
        "train.label_smoothing=0.1",
        "model.context_gate=both",
    ];
    let run = |name: &str, sets: &[&str]| {
        let out = tmp.path().join(name);
        let all: Vec<&str> = common_sets.iter().chain(sets).copied().collect();
        common::train_tiny(&prep, &out, &all);
        out
    };
    let big = run("big", &["train.batch_size=32"]);
    let acc = run("acc", &["train.batch_size=8", "train.accumulate=4"]);
    let d = relative_difference(&params(&big), &params(&acc));
    eprintln!("accumulated 4 × 8 against 32: largest relative parameter difference {d:e}");
    assert!(d < 1e-6, "{d}");
    // The same losses, and the data position counts the batches consumed.
    let (lb, la) = (log_lines(&big), log_lines(&acc));
    let loss = |l: &[serde_json::Value]| -> Vec<f64> {
        l.iter()
            .filter_map(|v| v.get("loss_per_token").and_then(|x| x.as_f64()))
            .collect()
    };
    for (x, y) in loss(&lb).iter().zip(loss(&la)) {
        assert!((x - y).abs() <= 1e-5 * x.abs(), "{x} against {y}");
    }
    let state: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(acc.join("last/train_state.json")).unwrap())
            .unwrap();
    assert_eq!(state["step"], 12);
    assert_eq!(state["batch_in_epoch"], 48, "12 updates of 4 batches");
    // Word dropout changes the update; without it the run is another.
    let plain = run(
        "plain",
        &[
            "train.batch_size=32",
            "train.source_word_dropout=0",
            "train.target_word_dropout=0",
        ],
    );
    assert!(relative_difference(&params(&big), &params(&plain)) > 1e-4);
}

/// BPE-dropout: each update segments its sentences again, per sentence (so accumulated batches still update
/// like one larger batch), the same segmentation on a resumed run (bit for bit), another model than without.
#[test]
fn bpe_dropout_resegments_per_sentence_and_resumes_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let prep = tmp.path().join("prep");
    let d = common::data_dir().join("tatoeba-zh-en");
    let s = |f: &str| d.join(f).display().to_string();
    common::run_ok(&[
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
        "400",
        "--bpe-src",
        "300",
        "--bpe-tgt",
        "300",
        "--out",
        prep.to_str().unwrap(),
        "--force",
    ]);
    let run = |name: &str, sets: &[&str]| {
        let out = tmp.path().join(name);
        let all: Vec<&str> = [
            "train.sort_batches=1",
            "train.threads=1",
            "train.optimizer=adam",
            "train.bpe_dropout=0.1",
        ]
        .iter()
        .chain(sets)
        .copied()
        .collect();
        common::train_tiny(&prep, &out, &all);
        out
    };
    let big = run("big", &["train.batch_size=32", "train.max_steps=10"]);
    let acc = run(
        "acc",
        &[
            "train.batch_size=8",
            "train.accumulate=4",
            "train.max_steps=10",
        ],
    );
    let d = relative_difference(&params(&big), &params(&acc));
    assert!(
        d < 1e-6,
        "accumulated against one batch under BPE-dropout: {d}"
    );
    let other = run(
        "other",
        &[
            "train.batch_size=32",
            "train.max_steps=10",
            "train.bpe_dropout=0.3",
        ],
    );
    assert!(
        relative_difference(&params(&big), &params(&other)) > 1e-4,
        "another rate, other segmentations"
    );
    let plain = run(
        "plain",
        &[
            "train.batch_size=32",
            "train.max_steps=10",
            "train.bpe_dropout=0",
        ],
    );
    // Five updates, then five more resumed: the uninterrupted run's bits.
    let half = run("half", &["train.batch_size=32", "train.max_steps=5"]);
    common::run_ok(&[
        "train",
        "--quiet",
        "--resume",
        half.to_str().unwrap(),
        "--set",
        "train.max_steps=10",
    ]);
    assert!(
        std::fs::read(half.join("last/model.safetensors")).unwrap()
            == std::fs::read(big.join("last/model.safetensors")).unwrap()
    );
    // The vocabulary took every subword the BPE models make (the segmentations of dropout are not UNK).
    let vocab = std::fs::read_to_string(big.join("last/vocab.tgt")).unwrap();
    let plain_vocab = std::fs::read_to_string(plain.join("last/vocab.tgt")).unwrap();
    assert!(vocab.lines().count() > plain_vocab.lines().count());
}

/// Warm-up, inverse square root decay with a floor, and the stalled decay: the rates logged, and a run
/// stopped and resumed ends bit for bit where the uninterrupted run ends (the schedule's state is in the
/// checkpoint).
#[test]
fn schedules_are_logged_and_resume_bit_for_bit() {
    let tmp = tempfile::tempdir().unwrap();
    let prep = tmp.path().join("prep");
    common::prepare(&prep, 300);
    for (name, sched) in [
        (
            "inv-sqrt",
            &[
                "train.lr_warmup=8",
                "train.lr_decay=\"inv-sqrt\"",
                "train.lr_min=0.002",
            ][..],
        ),
        (
            "stalled",
            &[
                "train.lr_warmup=4",
                "train.lr_decay=\"stalled\"",
                "train.lr_decay_patience=1",
                "train.lr_decay_factor=0.5",
            ][..],
        ),
    ] {
        let sets = |steps: &str| -> Vec<String> {
            [
                "train.batch_size=16",
                "train.threads=1",
                "train.optimizer=adam",
                "train.learning_rate=0.01",
                "train.eval_every=5",
                "train.eval_max_sentences=10",
                "train.eval_beam=2",
                "train.patience=0",
                "train.batch_tokens=150",
                steps,
            ]
            .iter()
            .chain(sched)
            .map(|s| s.to_string())
            .collect()
        };
        let whole = tmp.path().join(format!("{name}-whole"));
        let s30 = sets("train.max_steps=30");
        common::train_tiny(
            &prep,
            &whole,
            &s30.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        let half = tmp.path().join(format!("{name}-half"));
        let s15 = sets("train.max_steps=15");
        common::train_tiny(
            &prep,
            &half,
            &s15.iter().map(String::as_str).collect::<Vec<_>>(),
        );
        common::run_ok(&[
            "train",
            "--quiet",
            "--resume",
            half.to_str().unwrap(),
            "--set",
            "train.max_steps=30",
        ]);
        assert!(
            std::fs::read(whole.join("last/model.safetensors")).unwrap()
                == std::fs::read(half.join("last/model.safetensors")).unwrap(),
            "{name}: resumed at 15 against uninterrupted"
        );
        let rates: Vec<f64> = log_lines(&whole)
            .iter()
            .filter_map(|v| v.get("lr").and_then(|x| x.as_f64()))
            .collect();
        assert_eq!(rates.len(), 3, "{name}: a rate per logged window");
        let state: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(whole.join("last/train_state.json")).unwrap(),
        )
        .unwrap();
        if name == "inv-sqrt" {
            // Updates 10, 20, 30: sqrt(8 / t) × 0.01, floored at 0.002.
            for (r, t) in rates.iter().zip([10.0f64, 20.0, 30.0]) {
                let want = (0.01 * (8.0 / t).sqrt()).max(0.002);
                assert!((r - want).abs() < 1e-12, "{name}: {r} against {want}");
            }
        } else {
            // Each logged rate is 0.01 halved a whole number of times, never rising; the dev score of so
            // tiny a model stalls, so the rate decayed.
            let mut last = f64::INFINITY;
            for r in &rates {
                let k = (0.01 / r).log2();
                assert!(
                    (k - k.round()).abs() < 1e-9 && *r <= last,
                    "{name}: {rates:?}"
                );
                last = *r;
            }
            let scale = state["lr_decay_scale"].as_f64().unwrap();
            assert!(
                scale < 1.0 && scale <= rates[2] / 0.01,
                "{name}: {scale} {rates:?}"
            );
        }
    }
}

/// Fine-tuning (`prepare --like`, `train --init`): a Tatoeba model trained further on a second corpus (TED
/// talks, IWSLT17 zh-en) starts where the model is (its first evaluation, at update 0, is the model's own
/// dev score) and gets better on that corpus (its dev loss); a configuration of another architecture, or data prepared
/// with other vocabularies, is refused with a message saying what to do.
#[test]
fn fine_tuning_starts_from_the_model_and_improves_on_the_new_corpus() {
    let Some(iwslt) = common::data_set_or_skip("zh-en-testsets", "fine_tuning") else {
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let prep = tmp.path().join("prep");
    common::prepare(&prep, 400);
    let base = tmp.path().join("base");
    let arch = [
        "model.embedding_dim=16",
        "model.hidden_dim=24",
        "model.attention_dim=16",
    ];
    common::train_tiny(
        &prep,
        &base,
        &[
            "train.max_steps=60",
            "train.batch_size=16",
            "train.optimizer=adam",
            "train.threads=1",
        ],
    );
    // The second corpus: the first 900 TED sentence pairs to train on, the next 200 as dev.
    let lines = |f: &str| -> Vec<String> {
        std::fs::read_to_string(iwslt.join(f))
            .unwrap()
            .lines()
            .map(String::from)
            .collect()
    };
    let (zh, en) = (lines("iwslt17-tst2016.zh"), lines("iwslt17-tst2016.en"));
    let put = |name: &str, xs: &[String]| {
        let p = tmp.path().join(name);
        std::fs::write(&p, xs.join("\n") + "\n").unwrap();
        p.display().to_string()
    };
    let (tz, te) = (put("ted.zh", &zh[..900]), put("ted.en", &en[..900]));
    let (dz, de) = (
        put("ted-dev.zh", &zh[900..1100]),
        put("ted-dev.en", &en[900..1100]),
    );
    let ted = tmp.path().join("ted");
    let best = base.join("best").display().to_string();
    let out = common::run_ok(&[
        "prepare",
        "--src",
        &tz,
        "--tgt",
        &te,
        "--dev-src",
        &dz,
        "--dev-tgt",
        &de,
        "--like",
        &best,
        "--out",
        ted.to_str().unwrap(),
    ]);
    assert!(out.contains("vocabulary"), "{out}");
    assert_eq!(
        std::fs::read(ted.join("vocab.src")).unwrap(),
        std::fs::read(base.join("best/vocab.src")).unwrap()
    );
    let tuned = tmp.path().join("tuned");
    let sets = |extra: &[&str]| -> Vec<String> {
        let mut a = vec![
            "train".to_string(),
            "--quiet".into(),
            "--init".into(),
            best.clone(),
            "--out".into(),
            tuned.display().to_string(),
        ];
        for s in [
            format!("data.prepared={:?}", ted.display().to_string()),
            "train.max_steps=80".into(),
            "train.eval_every=40".into(),
            "train.eval_beam=2".into(),
            "train.batch_size=16".into(),
            "train.optimizer=adam".into(),
            "train.threads=1".into(),
        ]
        .into_iter()
        .chain(extra.iter().map(|s| s.to_string()))
        {
            a.push("--set".into());
            a.push(s);
        }
        a
    };
    // Refused: another architecture; data prepared with its own vocabularies.
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args(sets(&["model.hidden_dim=32"]))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("model.hidden_dim") && err.contains("architecture"),
        "{err}"
    );
    let own = tmp.path().join("ted-own");
    common::run_ok(&[
        "prepare",
        "--src",
        &tz,
        "--tgt",
        &te,
        "--dev-src",
        &dz,
        "--dev-tgt",
        &de,
        "--out",
        own.to_str().unwrap(),
    ]);
    let mut other = sets(&[]);
    let k = other
        .iter()
        .position(|a| a.starts_with("data.prepared="))
        .unwrap();
    other[k] = format!("data.prepared={:?}", own.display().to_string());
    let bad = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args(&other)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        !bad.status.success() && err.contains("prepare --like"),
        "{err}"
    );
    assert!(!tuned.exists(), "a refused run writes nothing");
    // Fine-tuned (the [model] section comes from the model).
    let a = sets(&[]);
    common::run_ok(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let evals: Vec<serde_json::Value> = log_lines(&tuned)
        .into_iter()
        .filter(|v| v.get("eval").is_some())
        .collect();
    assert_eq!(
        evals
            .iter()
            .map(|v| v["eval"].as_u64().unwrap())
            .collect::<Vec<_>>(),
        vec![0, 40, 80]
    );
    // Update 0 is the model itself: its dev BLEU is the model's, decoded apart.
    let hyp = tmp.path().join("dev.hyp");
    common::run_ok(&[
        "translate",
        "-q",
        "-m",
        &best,
        "--beam",
        "2",
        "-i",
        &dz,
        "-o",
        hyp.to_str().unwrap(),
    ]);
    let score: serde_json::Value = serde_json::from_str(&common::run_ok(&[
        "score",
        "--mteval-v11b",
        "--json",
        "-r",
        &de,
        "-i",
        hyp.to_str().unwrap(),
    ]))
    .unwrap();
    let first = evals[0]["dev_bleu"].as_f64().unwrap();
    assert!(
        (first - score["score"].as_f64().unwrap()).abs() < 1e-9,
        "{first} against {score}"
    );
    // Better on the new corpus: its dev loss per token falls by more than a quarter (a model this small
    // translates nothing either way; the demo's model fine-tuned on TED talks: results/fine-tuning).
    let loss = |k: usize| evals[k]["loss_per_token"].as_f64().unwrap();
    eprintln!(
        "fine-tuning on TED: dev loss {:.3} → {:.3} → {:.3}",
        loss(0),
        loss(1),
        loss(2)
    );
    assert!(
        loss(2) < loss(1) && loss(1) < 0.75 * loss(0),
        "dev loss {} → {} → {}",
        loss(0),
        loss(1),
        loss(2)
    );
    let cfg = std::fs::read_to_string(tuned.join("last/config.toml")).unwrap();
    assert!(
        cfg.contains("init = ") && cfg.contains(&arch[1].replace("model.", "").replace('=', " = "))
    );
}

/// The token store (`train.*.store`, written by `prepare`): it holds the text's tokens; training from it
/// (read by position) gives the parameters of training from the text, bit for bit, also when pairs are left out
/// (`data.max_len`, `data.limit`); a damaged store is refused, naming it.
#[test]
fn training_from_the_token_store_equals_training_from_the_text() {
    let tmp = tempfile::tempdir().unwrap();
    let prep = tmp.path().join("prep");
    common::prepare(&prep, 600);
    // The store holds the text: each id the token's rank in the counts.
    let counts: Vec<String> = std::fs::read_to_string(prep.join("counts.tgt"))
        .unwrap()
        .lines()
        .map(|l| l.split('\t').next().unwrap().to_string())
        .collect();
    let (store, lengths) =
        cgnmt_data::store::TokenStore::open(&prep.join("train.tgt.store")).unwrap();
    let text = std::fs::read_to_string(prep.join("train.tgt")).unwrap();
    assert_eq!(store.len(), text.lines().count());
    for (i, line) in text.lines().enumerate() {
        let words: Vec<&str> = store
            .sentence(i)
            .unwrap()
            .iter()
            .map(|&id| counts[id as usize - 2].as_str())
            .collect();
        assert_eq!(words.join(" "), line, "sentence {i}");
        assert_eq!(lengths[i] as usize, words.len());
    }
    // The same directory without its stores: the text path.
    let text_only = tmp.path().join("text-only");
    std::fs::create_dir_all(&text_only).unwrap();
    for e in std::fs::read_dir(&prep).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "store") {
            continue;
        }
        std::fs::copy(&p, text_only.join(p.file_name().unwrap())).unwrap();
    }
    for sets in [
        &["train.max_steps=12", "train.batch_size=16"][..],
        &[
            "train.max_steps=12",
            "train.batch_tokens=150",
            "data.max_len=9",
            "data.limit=350",
            "data.src_vocab_size=400",
            "train.recurrent_dropout=0.2",
        ][..],
    ] {
        let a = tmp.path().join("from-store");
        let b = tmp.path().join("from-text");
        for d in [&a, &b] {
            let _ = std::fs::remove_dir_all(d);
        }
        let all: Vec<&str> = ["train.threads=1", "train.optimizer=adam"]
            .iter()
            .chain(sets)
            .copied()
            .collect();
        common::train_tiny(&prep, &a, &all);
        common::train_tiny(&text_only, &b, &all);
        assert!(
            std::fs::read(a.join("last/model.safetensors")).unwrap()
                == std::fs::read(b.join("last/model.safetensors")).unwrap(),
            "{sets:?}"
        );
    }
    // A damaged store is refused, naming it.
    let s = prep.join("train.src.store");
    let bytes = std::fs::read(&s).unwrap();
    std::fs::write(&s, &bytes[..bytes.len() - 10]).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args([
            "train",
            "--quiet",
            "--out",
            tmp.path().join("refused").to_str().unwrap(),
            "--set",
            &format!("data.prepared={:?}", prep.display().to_string()),
            "--set",
            "train.max_steps=2",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("train.src.store") && err.contains("truncated"),
        "{err}"
    );
}
