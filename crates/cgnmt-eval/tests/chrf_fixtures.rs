//! chrF / chrF++ against every `shared/fixtures/bleu/*/expected.json` (sacreBLEU 2.6.0), the
//! per-reference chrF of the two-reference case, and `sacrebleu.sentence_chrf` per segment.

mod common;

use cgnmt_eval::chrf::{corpus_chrf, sentence_chrf, ChrfOptions};
use common::*;

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

#[test]
fn chrf_and_chrfpp_all_cases() {
    let Some(dir) = fixtures_or_skip("chrf_and_chrfpp_all_cases") else {
        return;
    };
    let mut checked = 0;
    for name in CASES {
        let d = dir.join("bleu").join(name);
        let exp = read_json(&d.join("expected.json"));
        let hyps = read_lines(&d.join("hyp.txt"));
        let refs: Vec<Vec<String>> = exp["refs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| read_lines(&d.join(r.as_str().unwrap())))
            .collect();
        for (key, opts) in [
            ("chrf", ChrfOptions::chrf()),
            ("chrf++", ChrfOptions::chrf_plus_plus()),
        ] {
            let got = corpus_chrf(&hyps, &refs, &opts).unwrap();
            let e = &exp[key];
            assert!(
                (got.score - f(&e["score"])).abs() <= 0.01,
                "{name}/{key}: {} vs {}",
                got.score,
                e["score"]
            );
            let sig = e["signature"].as_str().unwrap();
            assert!(got
                .signature
                .starts_with(sig.rsplit_once("|version:").unwrap().0));
            checked += 1;
        }
        if let Some(per_ref) = exp.get("per_ref").and_then(|v| v.as_object()) {
            for (rname, e) in per_ref {
                let r = read_lines(&d.join(rname));
                let got = corpus_chrf(&hyps, &[r], &ChrfOptions::chrf()).unwrap();
                assert!(
                    (got.score - f(&e["chrf"]["score"])).abs() <= 0.01,
                    "{name}/per_ref/{rname}"
                );
                checked += 1;
            }
        }
    }
    assert_eq!(checked, 9 * 2 + 2);
}

#[test]
fn sentence_chrf_all_segments() {
    let Some(dir) = fixtures_or_skip("sentence_chrf_all_segments") else {
        return;
    };
    let d = dir.join("bleu/sentence-bleu");
    let exp = read_json(&d.join("expected.json"));
    let hyps = read_lines(&d.join("hyp.txt"));
    let r1 = read_lines(&d.join("ref1.txt"));
    let r2 = read_lines(&d.join("ref2.txt"));
    let segs = exp["segments"].as_array().unwrap();
    assert_eq!(segs.len(), 20);
    for (i, seg) in segs.iter().enumerate() {
        for (key, refs) in [
            ("ref1", vec![r1[i].clone()]),
            ("ref1+ref2", vec![r1[i].clone(), r2[i].clone()]),
        ] {
            let got = sentence_chrf(&hyps[i], &refs, &ChrfOptions::chrf()).unwrap();
            let want = f(&seg[key]["chrf"]);
            assert!(
                (got.score - want).abs() <= 1e-6,
                "segment {i} {key}: {} vs {want}",
                got.score
            );
        }
    }
}
