//! Guided alignment (`train.guided_alignment`): attention taught the word alignment aligns better on real data
//! (Hansards fr-en, AER of attention on the 447 NAACL 2003 gold pairs), with links from a file kept in step by
//! `prepare --alignment` or from the built-in aligner; the guided run resumes bit for bit, accumulated batches
//! update like one larger batch, and bad links are refused naming the file and line.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use crate::common::{self, run_ok};

/// `cgnmt` with `args`, expected to fail: its standard error.
fn run_err(args: &[&str]) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args(args)
        .output()
        .unwrap();
    assert!(!out.status.success(), "cgnmt {args:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Attention's AER (in [0, 1]) of the model `run` on the Hansards gold pairs.
fn attention_aer(tmp: &Path, run: &Path) -> f64 {
    let g = common::data_dir().join("align-en-fr-hansards");
    let out = tmp.join(format!(
        "{}.talp",
        run.file_name().unwrap().to_string_lossy()
    ));
    let s = |p: &Path| p.display().to_string();
    run_ok(&[
        "align",
        "-m",
        &s(run),
        "--src",
        &s(&g.join("test.fr")),
        "--tgt",
        &s(&g.join("test.en")),
        "--target-first",
        "-o",
        &s(&out),
    ]);
    let v: serde_json::Value = serde_json::from_str(&run_ok(&[
        "aer",
        "--gold",
        &s(&g.join("test.talp")),
        "--pred",
        &s(&out),
        "--json",
    ]))
    .unwrap();
    v["aer"].as_f64().unwrap()
}

fn hansards_head(tmp: &Path, n: usize) -> (PathBuf, PathBuf) {
    let h = common::data_dir().join("hansards-en-fr");
    let side = |name: &str| {
        let f = std::fs::File::open(h.join(format!("train.{name}.gz"))).unwrap();
        let lines: Vec<String> = BufReader::new(flate2::read::GzDecoder::new(f))
            .lines()
            .take(n)
            .map(Result::unwrap)
            .collect();
        let p = tmp.join(format!("head.{name}"));
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        p
    };
    (side("fr"), side("en"))
}

#[test]
fn guided_attention_aligns_hansards_better() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let (fr, en) = hansards_head(t, 3000);
    let s = |p: &Path| p.display().to_string();
    // The corpus's own links (the built-in aligner), kept in step by `prepare` (which drops long pairs and
    // splits the target into subwords).
    let links = t.join("links.txt");
    run_ok(&[
        "align-corpus",
        "-q",
        "--src",
        &s(&fr),
        "--tgt",
        &s(&en),
        "-o",
        &s(&links),
    ]);
    let prep = t.join("prep");
    let h = common::data_dir().join("hansards-en-fr");
    run_ok(&[
        "prepare",
        "--src",
        &s(&fr),
        "--tgt",
        &s(&en),
        "--dev-src",
        &s(&h.join("dev.fr")),
        "--dev-tgt",
        &s(&h.join("dev.en")),
        "--src-lang",
        "fr",
        "--tgt-lang",
        "en",
        "--src-tok",
        "whitespace",
        "--tgt-tok",
        "whitespace",
        "--bpe-tgt",
        "3000",
        "--max-len",
        "40",
        "--alignment",
        &s(&links),
        "--out",
        &s(&prep),
    ]);
    let kept = std::fs::read_to_string(prep.join("train.src")).unwrap();
    let align = std::fs::read_to_string(prep.join("train.align")).unwrap();
    assert_eq!(align.lines().count(), kept.lines().count());
    assert!(kept.lines().count() < 3000, "long pairs dropped");
    // The kept lines' links are the input lines' (train.lines numbers them).
    let all_text = std::fs::read_to_string(&links).unwrap();
    let all: Vec<&str> = all_text.lines().collect();
    for (k, (n, l)) in std::fs::read_to_string(prep.join("train.lines"))
        .unwrap()
        .lines()
        .zip(align.lines())
        .enumerate()
        .step_by(97)
    {
        assert_eq!(all[n.parse::<usize>().unwrap() - 1], l, "kept pair {k}");
    }
    let train = |name: &str, sets: &[&str]| {
        let out = t.join(name);
        let mut all = vec![
            "model.embedding_dim=32",
            "model.hidden_dim=48",
            "model.attention_dim=32",
            "train.batch_size=32",
            "train.max_steps=300",
            "train.optimizer=adam",
            "train.learning_rate=0.003",
            "train.threads=1",
        ];
        all.extend_from_slice(sets);
        common::train_tiny(&prep, &out, &all);
        out
    };
    let plain = train("plain", &[]);
    let file = format!("train.guided_alignment={:?}", s(&prep.join("train.align")));
    let guided = train(
        "guided",
        &[file.as_str(), "train.guided_alignment_weight=1.0"],
    );
    let builtin = train(
        "builtin",
        &[
            "train.guided_alignment=\"builtin\"",
            "train.guided_alignment_weight=1.0",
        ],
    );
    let made = std::fs::read_to_string(builtin.join("guided-alignment.txt")).unwrap();
    assert_eq!(made.lines().count(), kept.lines().count());
    let (p, g, b) = (
        attention_aer(t, &plain),
        attention_aer(t, &guided),
        attention_aer(t, &builtin),
    );
    eprintln!(
        "attention AER: unguided {p:.4}, guided by the file's links {g:.4}, built-in links {b:.4}"
    );
    assert!(g < p - 0.1, "guided {g} against unguided {p}");
    assert!(b < p - 0.1, "built-in {b} against unguided {p}");
    // A guided model translates and aligns as any other (`translate --alignment`).
    let src = t.join("few.fr");
    std::fs::write(&src, "la chambre est saisie de la motion .\nmerci .\n").unwrap();
    let out = run_ok(&[
        "translate",
        "-m",
        &s(&guided),
        "-i",
        &s(&src),
        "--alignment",
        "hard",
    ]);
    assert_eq!(out.lines().count(), 2);
    assert!(out.lines().all(|l| l.contains(" ||| ")), "{out}");
}

#[test]
fn guided_training_resumes_bit_for_bit_accumulates_and_refuses_bad_links() {
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    let prep = t.join("prep");
    common::prepare(&prep, 400);
    let run = |name: &str, sets: &[&str]| {
        let out = t.join(name);
        let mut all = vec![
            "train.sort_batches=1",
            "train.threads=1",
            "train.optimizer=adam",
            "train.learning_rate=0.003",
            "train.guided_alignment_weight=0.5",
            "model.context_gate=both",
        ];
        all.extend_from_slice(sets);
        common::train_tiny(&prep, &out, &all);
        out
    };
    let weights = |r: &Path| std::fs::read(r.join("last/model.safetensors")).unwrap();
    let builtin = "train.guided_alignment=\"builtin\"";
    let big = run(
        "big",
        &[builtin, "train.batch_size=32", "train.max_steps=12"],
    );
    // Stopped at 6 and resumed to 12: the uninterrupted run's bits (the links read again from the run).
    let half = run(
        "half",
        &[builtin, "train.batch_size=32", "train.max_steps=6"],
    );
    run_ok(&[
        "train",
        "--quiet",
        "--resume",
        half.to_str().unwrap(),
        "--set",
        "train.max_steps=12",
    ]);
    assert!(
        weights(&half) == weights(&big),
        "resumed against uninterrupted"
    );
    // The same links from a file: the same run.
    let links = big.join("guided-alignment.txt");
    let file = format!("train.guided_alignment={:?}", links.display().to_string());
    let from_file = run(
        "file",
        &[file.as_str(), "train.batch_size=32", "train.max_steps=12"],
    );
    assert!(weights(&from_file) == weights(&big));
    // Accumulated batches of 8 update like one of 32.
    let acc = run(
        "acc",
        &[
            builtin,
            "train.batch_size=8",
            "train.accumulate=4",
            "train.max_steps=12",
        ],
    );
    let load = |r: &Path| {
        candle_core::safetensors::load(r.join("last/model.safetensors"), &candle_core::Device::Cpu)
            .unwrap()
    };
    let (a, b) = (load(&acc), load(&big));
    let mut worst = 0f32;
    for (k, x) in &a {
        let d = (x - &b[k]).unwrap().abs().unwrap().max_all().unwrap();
        worst = worst.max(d.to_scalar::<f32>().unwrap());
    }
    assert!(worst < 1e-5, "accumulated against one batch: {worst}");
    // Guidance changes the model.
    let plain = run("plain", &["train.batch_size=32", "train.max_steps=12"]);
    assert!(weights(&plain) != weights(&big));
    // Bad links: refused before training, naming the file and line.
    let text = std::fs::read_to_string(&links).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let bad = |name: &str, body: String| -> String {
        let p = t.join(name);
        std::fs::write(&p, body).unwrap();
        let out = t.join(format!("run-{name}"));
        let set = format!("train.guided_alignment={:?}", p.display().to_string());
        let prepared = format!("data.prepared={:?}", prep.display().to_string());
        let e = run_err(&[
            "train",
            "--quiet",
            "--out",
            out.to_str().unwrap(),
            "--set",
            &prepared,
            "--set",
            &set,
            "--set",
            "train.max_steps=2",
        ]);
        assert!(e.contains(name), "{e}");
        assert!(!out.join("last").exists(), "{name}: trained anyway");
        e
    };
    let e = bad("short.txt", lines[1..].join("\n") + "\n");
    assert!(e.contains("lines of links"), "{e}");
    let mut far = lines.iter().map(|l| l.to_string()).collect::<Vec<_>>();
    far[2] = "0-0 99-0".into();
    let e = bad("far.txt", far.join("\n") + "\n");
    assert!(e.contains("line 3") && e.contains("99-0"), "{e}");
    far[2] = "0:0".into();
    let e = bad("form.txt", far.join("\n") + "\n");
    assert!(e.contains("line 3") && e.contains("i-j"), "{e}");
    let e = bad_prepare(t);
    assert!(e.contains("line 2") && e.contains("5-0"), "{e}");
}

/// `prepare --alignment` with a link outside line 2's pair: refused naming the file and line, no output left.
fn bad_prepare(t: &Path) -> String {
    let src = t.join("two.zh");
    let tgt = t.join("two.en");
    std::fs::write(&src, "我 很 好\n你 好\n").unwrap();
    std::fs::write(&tgt, "I am fine\nhello\n").unwrap();
    let links = t.join("two.links");
    std::fs::write(&links, "0-0 1-1\n5-0\n").unwrap();
    let out = t.join("two-prep");
    let e = run_err(&[
        "prepare",
        "--src",
        src.to_str().unwrap(),
        "--tgt",
        tgt.to_str().unwrap(),
        "--src-tok",
        "whitespace",
        "--tgt-tok",
        "whitespace",
        "--alignment",
        links.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(e.contains("two.links"), "{e}");
    assert!(!out.exists());
    e
}
