//! Paired bootstrap resampling and approximate randomization against
//! `shared/fixtures/significance/gt22-zh-en/expected.json` (sacreBLEU 2.6.0 `--paired-bs` /
//! `--paired-ar`, seed 12345), within the fixture's tolerances: scores 0.01, p-values 0.05 (bs)
//! / 0.02 (ar), bootstrap mean and CI 0.3; and the significance decisions at α = 0.05.
//! The sign test has no oracle; its decisions are checked against the fixture's ones.

mod common;

use cgnmt_eval::chrf::ChrfOptions;
use cgnmt_eval::significance::{paired_ar, paired_bootstrap, sign_test, Metric};
use cgnmt_eval::BleuOptions;
use common::*;

#[test]
fn paired_bs_ar_and_sign_vs_sacrebleu() {
    let Some(dir) = fixtures_or_skip("paired_bs_ar_and_sign_vs_sacrebleu") else {
        return;
    };
    let d = dir.join("significance/gt22-zh-en");
    let exp = read_json(&d.join("expected.json"));
    let refs = vec![read_lines(&d.join("ref1.txt"))];
    let base = read_lines(&d.join("baseline.txt"));
    let bs_exp = &exp["paired_bs"]["default_seed_12345"]["systems"];
    let ar_exp = &exp["paired_ar"]["default_seed_12345"]["systems"];
    for (key, metric) in [
        ("BLEU", Metric::Bleu(BleuOptions::sacrebleu())),
        ("chrF2", Metric::Chrf(ChrfOptions::chrf())),
    ] {
        let bst = metric.segment_stats(&base, &refs).unwrap();
        let eb = &bs_exp["baseline.txt"][key];
        for sys in ["system1.txt", "system2.txt"] {
            let hyps = read_lines(&d.join(sys));
            let sst = metric.segment_stats(&hyps, &refs).unwrap();
            let label = format!("{sys}/{key}");

            let bs = paired_bootstrap(&metric, &bst, &sst, 1000, 12345).unwrap();
            let e = &bs_exp[sys][key];
            assert!((bs.base_score - f(&eb["score"])).abs() <= 0.01, "{label}");
            assert!((bs.sys_score - f(&e["score"])).abs() <= 0.01, "{label}");
            assert!(
                (bs.p_value - f(&e["p_value"])).abs() <= 0.05,
                "{label}: bs p {} vs {}",
                bs.p_value,
                e["p_value"]
            );
            assert!((bs.sys_mean - f(&e["mean"])).abs() <= 0.3, "{label}: mean");
            assert!(
                (bs.sys_ci - f(&e["ci"])).abs() <= 0.3,
                "{label}: ci {}",
                bs.sys_ci
            );
            assert!(
                (bs.base_mean - f(&eb["mean"])).abs() <= 0.3,
                "{label}: base mean"
            );
            assert!((bs.base_ci - f(&eb["ci"])).abs() <= 0.3, "{label}: base ci");

            let ar = paired_ar(&metric, &bst, &sst, 10000, 12345).unwrap();
            let e = &ar_exp[sys][key];
            assert!(
                (ar.p_value - f(&e["p_value"])).abs() <= 0.02,
                "{label}: ar p {} vs {}",
                ar.p_value,
                e["p_value"]
            );

            // Decisions at alpha = 0.05: only system1/BLEU is not significant.
            let significant = !(sys == "system1.txt" && key == "BLEU");
            assert_eq!(bs.p_value < 0.05, significant, "{label}: bs decision");
            assert_eq!(ar.p_value < 0.05, significant, "{label}: ar decision");
            if sys == "system2.txt" {
                assert!(bs.p_value < 0.01 && ar.p_value < 0.01, "{label}");
            }

            let sg = sign_test(&metric, &bst, &sst).unwrap();
            assert_eq!(sg.better + sg.worse + sg.ties, base.len());
            eprintln!(
                "{label}: bs p={:.4} mean={:.2}±{:.2} | ar p={:.4} | sign +{} -{} ={} p={:.4}",
                bs.p_value,
                bs.sys_mean,
                bs.sys_ci,
                ar.p_value,
                sg.better,
                sg.worse,
                sg.ties,
                sg.p_value
            );
            if sys == "system2.txt" {
                // 4.7 BLEU / 4.0 chrF worse: the sign test agrees.
                assert!(
                    sg.worse > sg.better && sg.p_value < 0.01,
                    "{label}: sign test"
                );
            }
        }
    }
}
