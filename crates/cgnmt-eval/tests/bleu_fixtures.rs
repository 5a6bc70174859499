//! Corpus BLEU against every case in `shared/fixtures/bleu/*/expected.json`: sacreBLEU 2.6.0
//! (13a, -lc, tok none/intl/zh/char, no smoothing, per-reference), mteval-v11b.pl (cased and
//! uncased, with its n-gram counts), mteval-v13a.pl (cased, uncased, international),
//! multi-bleu.perl and multi-bleu-detok.perl. Tolerances as in `fixtures/bleu/README.md`.

mod common;

use cgnmt_eval::{corpus_bleu, BleuOptions, BleuScore, Smooth, Tokenize};
use common::*;
use serde_json::Value;

const CASES: &[&str] = &[
    "nt20-refB-vs-refA",
    "nt20-refA-vs-refB",
    "nt20-perturbed",
    "gt22-multiref",
    "large-nt20-gt22",
    "gt22-en-zh",
    "edge",
    "edge-no4gram",
    "unicode",
];

struct Case {
    name: String,
    hyps: Vec<String>,
    refs: Vec<Vec<String>>,
    exp: Value,
}

fn load(dir: &std::path::Path, name: &str) -> Case {
    let d = dir.join("bleu").join(name);
    let exp = read_json(&d.join("expected.json"));
    let hyps = read_lines(&d.join("hyp.txt"));
    let refs = exp["refs"]
        .as_array()
        .expect("refs")
        .iter()
        .map(|r| read_lines(&d.join(r.as_str().expect("ref name"))))
        .collect();
    Case {
        name: name.to_string(),
        hyps,
        refs,
        exp,
    }
}

fn check_sacre(label: &str, got: &BleuScore, e: &Value) {
    let score = f(&e["score"]);
    assert!(
        (got.score - score).abs() <= 0.01,
        "{label}: BLEU {} vs expected {score}",
        got.score
    );
    assert_eq!(got.counts.to_vec(), usizes(&e["counts"]), "{label}: counts");
    assert_eq!(got.totals.to_vec(), usizes(&e["totals"]), "{label}: totals");
    assert_eq!(
        got.sys_len,
        e["sys_len"].as_u64().unwrap() as usize,
        "{label}: sys_len"
    );
    assert_eq!(
        got.ref_len,
        e["ref_len"].as_u64().unwrap() as usize,
        "{label}: ref_len"
    );
    assert!(
        (got.bp - f(&e["bp"])).abs() <= 1e-6,
        "{label}: bp {}",
        got.bp
    );
    for (n, p) in e["precisions"].as_array().unwrap().iter().enumerate() {
        assert!(
            (got.precisions[n] - f(p)).abs() <= 1e-6,
            "{label}: precision {n}"
        );
    }
    // Same signature as sacreBLEU except for the version field.
    let sig = e["signature"].as_str().unwrap();
    let stem = sig.rsplit_once("|version:").unwrap().0;
    assert!(
        got.signature.starts_with(stem),
        "{label}: signature {} vs {sig}",
        got.signature
    );
}

fn sacre_opts(variant: &str) -> BleuOptions {
    let mut o = BleuOptions::sacrebleu();
    let mut parts = variant.split('-').peekable();
    let tok = parts.next().unwrap();
    o.tokenize = Tokenize::from_name(tok).unwrap_or_else(|| panic!("tokenizer {tok}"));
    let rest: Vec<&str> = parts.collect();
    match rest.as_slice() {
        [] => {}
        ["lc"] => o.lowercase = true,
        ["smooth", "none"] => o.smooth = Smooth::None,
        other => panic!("unknown variant {variant}: {other:?}"),
    }
    o
}

#[test]
fn sacrebleu_all_cases_and_variants() {
    let Some(dir) = fixtures_or_skip("sacrebleu_all_cases_and_variants") else {
        return;
    };
    let mut checked = 0;
    for name in CASES {
        let c = load(&dir, name);
        for (variant, e) in c.exp["bleu"].as_object().unwrap() {
            let o = sacre_opts(variant);
            let got = corpus_bleu(&c.hyps, &c.refs, &o).unwrap();
            check_sacre(&format!("{}/{variant}", c.name), &got, e);
            checked += 1;
        }
        if let Some(per_ref) = c.exp.get("per_ref").and_then(Value::as_object) {
            let d = dir.join("bleu").join(name);
            for (rname, e) in per_ref {
                let r = read_lines(&d.join(rname));
                let got = corpus_bleu(&c.hyps, &[r], &BleuOptions::sacrebleu()).unwrap();
                check_sacre(&format!("{}/per_ref/{rname}", c.name), &got, &e["13a"]);
                checked += 1;
            }
        }
        // sacreBLEU CLI cross-check (4 decimals)
        let cli = &c.exp["sacrebleu_cli_check"];
        let got = corpus_bleu(&c.hyps, &c.refs, &BleuOptions::sacrebleu()).unwrap();
        assert!(
            (got.score - f(&cli["bleu"])).abs() <= 0.0001 + 1e-9,
            "{name}: cli"
        );
    }
    // 9 cases x 7 variants + 2 extra tokenizers for gt22-en-zh + 2 per-ref scores
    assert_eq!(checked, 9 * 7 + 2 + 2);
}

#[test]
fn mteval_v11b_all_cases() {
    let Some(dir) = fixtures_or_skip("mteval_v11b_all_cases") else {
        return;
    };
    for name in CASES {
        let c = load(&dir, name);
        for (variant, lowercase) in [("cased", false), ("uncased", true)] {
            let e = &c.exp["mteval-v11b"][variant];
            let mut o = BleuOptions::mteval_v11b();
            o.lowercase = lowercase;
            let got = corpus_bleu(&c.hyps, &c.refs, &o).unwrap();
            let label = format!("{name}/mteval-v11b/{variant}");
            assert_eq!(got.counts.to_vec(), usizes(&e["counts"]), "{label}: counts");
            assert_eq!(got.totals.to_vec(), usizes(&e["totals"]), "{label}: totals");
            assert!(
                (got.score - f(&e["bleu_x100"])).abs() <= 0.01,
                "{label}: {} vs {}",
                got.score,
                e["bleu_x100"]
            );
        }
    }
}

#[test]
fn mteval_v11b_shortest_reference_recomputes_31_30() {
    // fixtures/bleu/README.md, discrepancy 1: sacreBLEU's counts with the shortest reference
    // length give exactly mteval-v11b's 31.30 on gt22-multiref.
    let Some(dir) = fixtures_or_skip("mteval_v11b_shortest_reference") else {
        return;
    };
    let c = load(&dir, "gt22-multiref");
    let got = corpus_bleu(&c.hyps, &c.refs, &{
        let mut o = BleuOptions::mteval_v11b();
        o.lowercase = false;
        o
    })
    .unwrap();
    assert_eq!(got.ref_len, 51_894);
    assert!((got.score - 31.30).abs() <= 0.01, "{}", got.score);
}

#[test]
fn mteval_v13a_all_cases() {
    let Some(dir) = fixtures_or_skip("mteval_v13a_all_cases") else {
        return;
    };
    let mut checked = 0;
    for name in CASES {
        let c = load(&dir, name);
        for (variant, e) in c.exp["mteval-v13a"].as_object().unwrap() {
            let mut o = BleuOptions::mteval_v13a();
            match variant.as_str() {
                "cased" => o.lowercase = false,
                "uncased" => o.lowercase = true,
                "cased-intl" => {
                    o.lowercase = false;
                    o.tokenize = Tokenize::MtevalV13aIntl;
                }
                "cased-no-smoothing" => {
                    o.lowercase = false;
                    o.smooth = Smooth::None;
                }
                other => panic!("unknown mteval-v13a variant {other}"),
            }
            let got = corpus_bleu(&c.hyps, &c.refs, &o).unwrap();
            let label = format!("{name}/mteval-v13a/{variant}");
            let full = f(&e["bleu_full_precision"]) * 100.0;
            assert!(
                (got.score - full).abs() <= 1e-4,
                "{label}: {} vs {full}",
                got.score
            );
            if let Some(sl) = e.get("sys_len").and_then(Value::as_u64) {
                assert_eq!(got.sys_len, sl as usize, "{label}: sys_len");
                assert_eq!(
                    got.ref_len,
                    e["ref_len"].as_u64().unwrap() as usize,
                    "{label}: ref_len"
                );
            }
            checked += 1;
        }
    }
    assert!(checked >= 27, "{checked}");
}

#[test]
fn multi_bleu_perl_all_cases() {
    let Some(dir) = fixtures_or_skip("multi_bleu_perl_all_cases") else {
        return;
    };
    for name in CASES {
        let c = load(&dir, name);
        for (variant, lowercase) in [("cased", false), ("lc", true)] {
            let label = format!("{name}/multi-bleu.perl/{variant}");
            let e = &c.exp["multi-bleu.perl"][variant];
            let mut o = BleuOptions::multi_bleu();
            o.lowercase = lowercase;
            let got = corpus_bleu(&c.hyps, &c.refs, &o).unwrap();
            assert!(
                (got.score - f(&e["bleu"])).abs() <= 0.01,
                "{label}: {} vs {}",
                got.score,
                e["bleu"]
            );
            assert_eq!(
                got.sys_len,
                e["sys_len"].as_u64().unwrap() as usize,
                "{label}"
            );
            assert_eq!(
                got.ref_len,
                e["ref_len"].as_u64().unwrap() as usize,
                "{label}"
            );

            // multi-bleu-detok.perl = mteval-v13a tokenisation (Unicode `lc`), no smoothing.
            let label = format!("{name}/multi-bleu-detok.perl/{variant}");
            let e = &c.exp["multi-bleu-detok.perl"][variant];
            let mut o = BleuOptions::sacrebleu();
            o.lowercase = lowercase;
            o.smooth = Smooth::None;
            let got = corpus_bleu(&c.hyps, &c.refs, &o).unwrap();
            assert!(
                (got.score - f(&e["bleu"])).abs() <= 0.01,
                "{label}: {} vs {}",
                got.score,
                e["bleu"]
            );
            assert_eq!(
                got.sys_len,
                e["sys_len"].as_u64().unwrap() as usize,
                "{label}"
            );
            assert_eq!(
                got.ref_len,
                e["ref_len"].as_u64().unwrap() as usize,
                "{label}"
            );
        }
    }
}
