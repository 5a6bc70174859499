//! `cgnmt score`, `compare` and `aer` end to end (argument parsing, file reading, output) on the oracle
//! fixtures, plus their error paths.

use std::path::{Path, PathBuf};

use crate::common::fixtures::*;
use serde_json::Value;

/// `cgnmt ARGS`: its standard output, or its standard error as the error (a failure to parse the arguments
/// included).
fn run(args: &[&str]) -> Result<String, String> {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args(args)
        .output()
        .expect("run cgnmt");
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).expect("UTF-8 output"))
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn p(dir: &Path, rel: &str) -> String {
    dir.join(rel).display().to_string()
}

/// A file named `name` in its own temporary directory, removed when dropped.
struct TmpFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl std::ops::Deref for TmpFile {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.path
    }
}

fn tmp(name: &str, bytes: &[u8]) -> TmpFile {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    TmpFile { _dir: dir, path }
}

#[test]
fn score_json_matches_sacrebleu_and_mteval() {
    let Some(dir) = fixtures_or_skip("score_json_matches_sacrebleu_and_mteval") else {
        return;
    };
    let exp = read_json(&dir.join("bleu/gt22-multiref/expected.json"));
    let (h, r1, r2) = (
        p(&dir, "bleu/gt22-multiref/hyp.txt"),
        p(&dir, "bleu/gt22-multiref/ref1.txt"),
        p(&dir, "bleu/gt22-multiref/ref2.txt"),
    );
    let v: Value =
        serde_json::from_str(&run(&["score", "-r", &r1, "-r", &r2, "-i", &h, "--json"]).unwrap())
            .unwrap();
    let e = &exp["bleu"]["13a"];
    assert!((f(&v["score"]) - f(&e["score"])).abs() <= 0.01);
    assert_eq!(v["counts"], e["counts"]);
    assert_eq!(v["totals"], e["totals"]);
    assert_eq!(v["sys_len"], e["sys_len"]);
    assert_eq!(v["ref_len"], e["ref_len"]);
    assert!((f(&v["bp"]) - f(&e["bp"])).abs() <= 1e-6);
    assert_eq!(
        v["signature"],
        "nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:cgnmt-0.1"
    );
    for key in [
        "precisions",
        "score",
        "counts",
        "totals",
        "bp",
        "sys_len",
        "ref_len",
        "signature",
    ] {
        assert!(v.get(key).is_some(), "missing {key}");
    }

    // -lc parses as in sacreBLEU
    let v: Value = serde_json::from_str(
        &run(&["score", "-r", &r1, "-r", &r2, "-i", &h, "-lc", "--json"]).unwrap(),
    )
    .unwrap();
    assert!((f(&v["score"]) - f(&exp["bleu"]["13a-lc"]["score"])).abs() <= 0.01);

    // mteval-v11b: 31.30 (shortest reference), -c via --cased
    let v: Value = serde_json::from_str(
        &run(&[
            "score",
            "-r",
            &r1,
            "-r",
            &r2,
            "-i",
            &h,
            "--mteval-v11b",
            "--cased",
            "--json",
        ])
        .unwrap(),
    )
    .unwrap();
    assert!((f(&v["score"]) - f(&exp["mteval-v11b"]["cased"]["bleu_x100"])).abs() <= 0.01);
    let v: Value = serde_json::from_str(
        &run(&[
            "score",
            "-r",
            &r1,
            "-r",
            &r2,
            "-i",
            &h,
            "--mteval-v11b",
            "--json",
        ])
        .unwrap(),
    )
    .unwrap();
    assert!((f(&v["score"]) - f(&exp["mteval-v11b"]["uncased"]["bleu_x100"])).abs() <= 0.01);

    // tokenizers and smoothing flags
    let v: Value = serde_json::from_str(
        &run(&[
            "score",
            "-r",
            &r1,
            "-r",
            &r2,
            "-i",
            &h,
            "--tokenize",
            "none",
            "--smooth",
            "none",
            "--json",
        ])
        .unwrap(),
    )
    .unwrap();
    assert!((f(&v["score"]) - f(&exp["bleu"]["none-smooth-none"]["score"])).abs() <= 0.01);

    // chrF / chrF++
    for (m, key) in [("chrf", "chrf"), ("chrf++", "chrf++")] {
        let v: Value = serde_json::from_str(
            &run(&["score", "-r", &r1, "-r", &r2, "-i", &h, "-m", m, "--json"]).unwrap(),
        )
        .unwrap();
        assert!(
            (f(&v["score"]) - f(&exp[key]["score"])).abs() <= 0.01,
            "{m}"
        );
    }

    // human-readable one-liner
    let line = run(&["score", "-r", &r1, "-r", &r2, "-i", &h]).unwrap();
    assert!(
        line.starts_with(
            "BLEU|nrefs:2|case:mixed|eff:no|tok:13a|smooth:exp|version:cgnmt-0.1 = 30.50 "
        ),
        "{line}"
    );
}

#[test]
fn score_sentence_level() {
    let Some(dir) = fixtures_or_skip("score_sentence_level") else {
        return;
    };
    let exp = read_json(&dir.join("bleu/sentence-bleu/expected.json"));
    let out = run(&[
        "score",
        "-r",
        &p(&dir, "bleu/sentence-bleu/ref1.txt"),
        "-i",
        &p(&dir, "bleu/sentence-bleu/hyp.txt"),
        "--sentence",
        "--json",
    ])
    .unwrap();
    let lines: Vec<Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 20);
    for (i, v) in lines.iter().enumerate() {
        let e = &exp["segments"][i]["ref1"]["default"];
        assert!(
            (f(&v["score"]) - f(&e["score"])).abs() <= 1e-6,
            "segment {i}"
        );
    }
}

#[test]
fn score_errors_name_files_and_lines() {
    let Some(dir) = fixtures_or_skip("score_errors_name_files_and_lines") else {
        return;
    };
    let r = p(&dir, "bleu/edge/ref1.txt");
    let h500 = p(&dir, "bleu/nt20-perturbed/hyp.txt");
    let e = run(&["score", "-r", &r, "-i", &h500])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("500") && e.contains("12") && e.contains("ref1.txt") && e.contains("hyp.txt"),
        "{e}"
    );

    let bad = tmp("bad.txt", b"ok\nstill ok\nbad \xc3\x28\n");
    let e = run(&["score", "-r", &r, "-i", bad.to_str().unwrap()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("bad.txt:3") && e.contains("UTF-8"), "{e}");

    let empty = tmp("empty.txt", b"");
    let e = run(&["score", "-r", &r, "-i", empty.to_str().unwrap()])
        .unwrap_err()
        .to_string();
    assert!(e.contains("empty"), "{e}");

    let e = run(&["score", "-r", "/definitely/not/here.txt", "-i", &r])
        .unwrap_err()
        .to_string();
    assert!(e.contains("/definitely/not/here.txt"), "{e}");

    assert!(run(&[
        "score",
        "-r",
        &r,
        "-i",
        &r,
        "-m",
        "chrf",
        "--tokenize",
        "zh"
    ])
    .is_err());
    assert!(run(&[
        "score",
        "-r",
        &r,
        "-i",
        &r,
        "--smooth",
        "exp",
        "--smooth-value",
        "2"
    ])
    .is_err());
    assert!(run(&[
        "score",
        "-r",
        &r,
        "-i",
        &r,
        "--mteval-v11b",
        "--tokenize",
        "13a"
    ])
    .is_err());
    assert!(run(&["score", "-i", &r]).is_err()); // no reference
}

#[test]
fn compare_json_matches_sacrebleu_within_tolerance() {
    let Some(dir) = fixtures_or_skip("compare_json_matches_sacrebleu_within_tolerance") else {
        return;
    };
    let d = "significance/gt22-zh-en";
    let exp = read_json(&dir.join(d).join("expected.json"));
    let out = run(&[
        "compare",
        &p(&dir, &format!("{d}/baseline.txt")),
        &p(&dir, &format!("{d}/system1.txt")),
        &p(&dir, &format!("{d}/system2.txt")),
        "-r",
        &p(&dir, &format!("{d}/ref1.txt")),
        "-m",
        "bleu",
        "-m",
        "chrf",
        "--test",
        "bs",
        "--json",
    ])
    .unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for (res, key) in results.iter().zip(["BLEU", "chrF2"]) {
        let e = &exp["paired_bs"]["default_seed_12345"]["systems"];
        assert!((f(&res["baseline"]["score"]) - f(&e["baseline.txt"][key]["score"])).abs() <= 0.01);
        assert!((f(&res["baseline"]["bs_ci"]) - f(&e["baseline.txt"][key]["ci"])).abs() <= 0.3);
        for (row, sys) in res["systems"]
            .as_array()
            .unwrap()
            .iter()
            .zip(["system1.txt", "system2.txt"])
        {
            let es = &e[sys][key];
            assert!((f(&row["score"]) - f(&es["score"])).abs() <= 0.01);
            assert!(
                (f(&row["bootstrap"]["p_value"]) - f(&es["p_value"])).abs() <= 0.05,
                "{key} {sys}"
            );
            assert!(row["ar"].is_null() && row["sign"].is_null());
        }
    }

    // text table with all tests
    let out = run(&[
        "compare",
        &p(&dir, &format!("{d}/baseline.txt")),
        &p(&dir, &format!("{d}/system2.txt")),
        "-r",
        &p(&dir, &format!("{d}/ref1.txt")),
        "--ar-trials",
        "500",
    ])
    .unwrap();
    assert!(
        out.contains("(baseline)") && out.contains("29.67") && out.contains("24.98"),
        "{out}"
    );

    // mismatched system
    let e = run(&[
        "compare",
        &p(&dir, &format!("{d}/baseline.txt")),
        &p(&dir, "bleu/edge/hyp.txt"),
        "-r",
        &p(&dir, &format!("{d}/ref1.txt")),
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("1875") && e.contains("12"), "{e}");
}

#[test]
fn aer_json_and_soft() {
    let Some(dir) = fixtures_or_skip("aer_json_and_soft") else {
        return;
    };
    let d = dir.join("aer/tsinghua-zh-en-eflomal");
    let exp = read_json(&d.join("expected.json"));
    let out = run(&[
        "aer",
        "--gold",
        &p(&d, "gold.talp"),
        "--pred",
        &p(&d, "pred.intersect.talp"),
        "--json",
    ])
    .unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    let e = &exp["predictions"]["pred.intersect.talp"];
    for k in ["precision", "recall", "aer"] {
        assert!((f(&v[k]) - f(&e[k])).abs() <= 1e-9, "{k}");
    }
    assert_eq!(v["a"], e["counts"]["A"]);
    assert_eq!(v["a_and_p"], e["counts"]["A_and_P"]);
    assert!(v.get("saer").is_none());

    // soft: the saer-toy matrices as JSONL
    let toy = read_json(&dir.join("aer/saer-toy/expected.json"));
    let mut gold = String::new();
    let mut soft = String::new();
    for s in toy["sentences"].as_array().unwrap() {
        gold.push_str(s["gold"].as_str().unwrap());
        gold.push('\n');
        soft.push_str(
            &serde_json::json!({"attention": s["attention"], "src": s["src"], "gates": [0.5]})
                .to_string(),
        );
        soft.push('\n');
    }
    let g = tmp("toy.talp", gold.as_bytes());
    let m = tmp("toy.jsonl", soft.as_bytes());
    let out = run(&[
        "aer",
        "--gold",
        g.to_str().unwrap(),
        "--soft",
        m.to_str().unwrap(),
        "--json",
    ])
    .unwrap();
    let v: Value = serde_json::from_str(&out).unwrap();
    assert!((f(&v["saer"]) - f(&toy["corpus"]["saer"])).abs() <= 1e-9);
    assert!((f(&v["aer"]) - f(&toy["corpus"]["hard_argmax"]["aer"])).abs() <= 1e-9);

    // malformed links name file, line and link
    let bad = tmp("bad.talp", b"0-0\n1-1 3-x\n");
    let e = run(&[
        "aer",
        "--gold",
        g.to_str().unwrap(),
        "--pred",
        bad.to_str().unwrap(),
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("bad.talp:2") && e.contains("3-x"), "{e}");
    // sentence-count mismatch
    let e = run(&[
        "aer",
        "--gold",
        &p(&d, "gold.talp"),
        "--pred",
        g.to_str().unwrap(),
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("450") && e.contains('5'), "{e}");
    // out-of-range check with sentence texts
    let t1 = tmp("first.txt", b"a b\n");
    let t2 = tmp("second.txt", b"x\n");
    let g1 = tmp("g1.talp", b"0-0 1-0\n");
    let p1 = tmp("p1.talp", b"0-0 1-1\n");
    let e = run(&[
        "aer",
        "--gold",
        g1.to_str().unwrap(),
        "--pred",
        p1.to_str().unwrap(),
        "--first-text",
        t1.to_str().unwrap(),
        "--second-text",
        t2.to_str().unwrap(),
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("p1.talp:1") && e.contains("1-1"), "{e}");
    // a bad soft file
    let badm = tmp("bad.jsonl", b"{\"attention\": [[1.0]]}\nnot json\n");
    let g2 = tmp("g2.talp", b"0-0\n0-0\n");
    let e = run(&[
        "aer",
        "--gold",
        g2.to_str().unwrap(),
        "--soft",
        badm.to_str().unwrap(),
    ])
    .unwrap_err()
    .to_string();
    assert!(e.contains("bad.jsonl:2"), "{e}");
}

#[test]
fn compare_with_several_runs_a_side_adds_the_seed_level_tests() {
    // The deep plan's committed outputs: GRU and GRU + both gates, three seeds each.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../results/deep/systems");
    let runs = |s: &str| -> String {
        (1..=3)
            .map(|k| {
                root.join(s)
                    .join(format!("seed-{k}/test.hyp"))
                    .display()
                    .to_string()
            })
            .collect::<Vec<_>>()
            .join(",")
    };
    let refs = crate::common::data_dir().join("tatoeba-zh-en/test.en");
    let (a, b) = (runs("gru-chosen-on-dev"), runs("gru-both-chosen-on-dev"));
    let r = refs.to_str().unwrap();
    let v: Value = serde_json::from_str(
        &run(&["compare", &a, &b, "-r", r, "--test", "bs", "--json"]).unwrap(),
    )
    .unwrap();
    let rec = &v["results"][0];
    let c = &rec["runs"];
    assert_eq!(c["base_scores"].as_array().unwrap().len(), 3);
    // Each run's score is what `score` gives its file alone.
    let first = run(&["score", "-r", r, "-i", a.split(',').next().unwrap()]).unwrap();
    let s: f64 = first
        .split(" = ")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        (c["base_scores"][0].as_f64().unwrap() - s).abs() < 0.005,
        "{first} {c}"
    );
    // The pooled test says yes, Welch over three seeds says no: not significant.
    assert!(
        rec["pooled"]["systems"][0]["bootstrap"]["p_value"]
            .as_f64()
            .unwrap()
            < 0.01
    );
    assert!(c["welch"]["p_value"].as_f64().unwrap() > 0.05);
    assert_eq!(rec["significant"], false);
    let text = run(&["compare", &a, &b, "-r", r, "--test", "bs"]).unwrap();
    assert!(
        text.contains("seed level") && text.contains("not significant at the seed level"),
        "{text}"
    );
    // A run of another length is named.
    let short = std::env::temp_dir().join(format!("cgnmt-short-{}.hyp", std::process::id()));
    std::fs::write(&short, "a\nb\n").unwrap();
    let err = run(&[
        "compare",
        &a,
        &format!("{},{}", b.split(',').next().unwrap(), short.display()),
        "-r",
        r,
    ])
    .unwrap_err();
    assert!(err.contains(&short.display().to_string()), "{err}");
    let _ = std::fs::remove_file(short);
}
