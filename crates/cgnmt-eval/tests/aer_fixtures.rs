//! AER against every prediction file of `shared/fixtures/aer/{hansards-en-fr,tsinghua-zh-en}-eflomal`
//! (counts exactly, precision / recall / AER within 1e-9) and soft AER against every sentence and
//! the corpus values of `shared/fixtures/aer/saer-toy` (1e-9).

mod common;

use cgnmt_eval::aer::{aer, argmax_links, parse_gold, read_gold, read_pred, saer, Link};
use common::*;
use std::path::Path;

#[test]
fn aer_all_prediction_files() {
    let Some(dir) = fixtures_or_skip("aer_all_prediction_files") else {
        return;
    };
    let mut checked = 0;
    for case in ["hansards-en-fr-eflomal", "tsinghua-zh-en-eflomal"] {
        let d = dir.join("aer").join(case);
        let exp = read_json(&d.join("expected.json"));
        let gold = read_gold(&d.join("gold.talp")).unwrap();
        assert_eq!(gold.len() as u64, exp["n_sentences"].as_u64().unwrap());
        for (file, e) in exp["predictions"].as_object().unwrap() {
            let pred = read_pred(&d.join(file)).unwrap();
            let r = aer(&gold, &pred).unwrap();
            let c = &e["counts"];
            let label = format!("{case}/{file}");
            assert_eq!(r.a as u64, c["A"].as_u64().unwrap(), "{label} A");
            assert_eq!(r.s as u64, c["S"].as_u64().unwrap(), "{label} S");
            assert_eq!(r.p as u64, c["P"].as_u64().unwrap(), "{label} P");
            assert_eq!(r.a_and_s as u64, c["A_and_S"].as_u64().unwrap(), "{label}");
            assert_eq!(r.a_and_p as u64, c["A_and_P"].as_u64().unwrap(), "{label}");
            assert!((r.precision - f(&e["precision"])).abs() <= 1e-9, "{label}");
            assert!((r.recall - f(&e["recall"])).abs() <= 1e-9, "{label}");
            assert!((r.aer - f(&e["aer"])).abs() <= 1e-9, "{label}");
            checked += 1;
        }
    }
    assert_eq!(checked, 8);
}

fn matrix(v: &serde_json::Value) -> Vec<Vec<f64>> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_array().unwrap().iter().map(f).collect())
        .collect()
}

#[test]
fn saer_toy_every_sentence_and_corpus() {
    let Some(dir) = fixtures_or_skip("saer_toy_every_sentence_and_corpus") else {
        return;
    };
    let exp = read_json(&dir.join("aer/saer-toy/expected.json"));
    let sents = exp["sentences"].as_array().unwrap();
    assert_eq!(sents.len(), 5);
    let mut all_gold = Vec::new();
    let mut all_soft = Vec::new();
    for s in sents {
        let gold = parse_gold(s["gold"].as_str().unwrap(), Path::new("saer-toy")).unwrap();
        let m = matrix(&s["attention"]);
        let r = saer(&gold, std::slice::from_ref(&m)).unwrap();
        let e = &s["soft"];
        let id = &s["id"];
        assert!((r.totals.sum_ma - f(&e["sum_MA"])).abs() <= 1e-9, "{id}");
        assert!((r.totals.sum_ms - f(&e["sum_MS"])).abs() <= 1e-9, "{id}");
        assert!(
            (r.totals.sum_ma_ms - f(&e["sum_MA_times_MS"])).abs() <= 1e-9,
            "{id}"
        );
        assert!(
            (r.totals.sum_ma_mp - f(&e["sum_MA_times_MP"])).abs() <= 1e-9,
            "{id}"
        );
        assert!((r.saer - f(&e["saer"])).abs() <= 1e-9, "{id}: {}", r.saer);
        // hard AER from the row-wise argmax
        let h = &s["hard_argmax"];
        let links = argmax_links(std::slice::from_ref(&m));
        let want: Vec<Link> = parse_gold(h["links"].as_str().unwrap(), Path::new("x")).unwrap()[0]
            .sure
            .iter()
            .copied()
            .collect();
        let mut got = links[0].clone();
        got.sort();
        assert_eq!(got, want, "{id}: argmax links");
        let a = aer(&gold, &links).unwrap();
        assert_eq!(a.a as u64, h["A"].as_u64().unwrap());
        assert_eq!(a.a_and_s as u64, h["A_and_S"].as_u64().unwrap());
        assert_eq!(a.a_and_p as u64, h["A_and_P"].as_u64().unwrap());
        assert!((a.aer - f(&h["aer"])).abs() <= 1e-9, "{id}: aer");
        all_gold.extend(gold);
        all_soft.push(m);
    }
    let r = saer(&all_gold, &all_soft).unwrap();
    let a = aer(&all_gold, &argmax_links(&all_soft)).unwrap();
    let c = &exp["corpus"];
    assert!((r.saer - f(&c["saer"])).abs() <= 1e-9, "{}", r.saer);
    assert!((r.saer - 41.0 / 120.0).abs() <= 1e-9);
    assert!((r.macro_saer - f(&c["saer_macro_mean_of_sentences"])).abs() <= 1e-9);
    assert!((r.totals.sum_ma - f(&c["sum_MA"])).abs() <= 1e-9);
    assert!((r.totals.sum_ms - f(&c["sum_MS"])).abs() <= 1e-9);
    assert!((r.totals.sum_ma_ms - f(&c["sum_MA_times_MS"])).abs() <= 1e-9);
    assert!((r.totals.sum_ma_mp - f(&c["sum_MA_times_MP"])).abs() <= 1e-9);
    let h = &c["hard_argmax"];
    assert_eq!(a.a as u64, h["A"].as_u64().unwrap());
    assert_eq!(a.s as u64, h["S"].as_u64().unwrap());
    assert_eq!(a.a_and_s as u64, h["A_and_S"].as_u64().unwrap());
    assert_eq!(a.a_and_p as u64, h["A_and_P"].as_u64().unwrap());
    assert!((a.aer - f(&h["aer"])).abs() <= 1e-9, "{}", a.aer);
}
