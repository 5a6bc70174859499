//! The seed-level tests against an independent implementation (SciPy's `ttest_ind(equal_var=False)` and
//! `t.sf`, `tests/fixtures/welch.json`, made by `tests/fixtures/make_welch.py`), and the false-positive
//! rates of the pooled and the seed-level tests on synthetic systems that differ only by their seeds.

use cgnmt_eval::seeds::{compare_runs, t_two_sided, welch_t_test};
use cgnmt_eval::significance::{paired_bootstrap, Metric};
use cgnmt_eval::BleuOptions;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn welch_and_the_t_tail_match_scipy() {
    let f: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/welch.json"
        ))
        .unwrap(),
    )
    .unwrap();
    let v = |x: &serde_json::Value| -> Vec<f64> {
        x.as_array()
            .unwrap()
            .iter()
            .map(|y| y.as_f64().unwrap())
            .collect()
    };
    let cases = f["welch"].as_array().unwrap();
    assert!(cases.len() >= 50);
    for c in cases {
        let r = welch_t_test(&v(&c["a"]), &v(&c["b"])).unwrap();
        let close = |x: f64, y: f64, what: &str| {
            assert!(
                (x - y).abs() <= 1e-9 * y.abs().max(1.0),
                "{what}: {x} vs {y} in {c}"
            )
        };
        close(r.t, c["t"].as_f64().unwrap(), "t");
        close(r.df, c["df"].as_f64().unwrap(), "df");
        close(r.p_value, c["p"].as_f64().unwrap(), "p");
    }
    for c in f["t_two_sided"].as_array().unwrap() {
        let p = t_two_sided(c["t"].as_f64().unwrap(), c["df"].as_f64().unwrap());
        let want = c["p"].as_f64().unwrap();
        assert!((p - want).abs() <= 1e-10 * want.max(1e-3), "{c}: {p}");
    }
}

/// A synthetic run: `n` sentences of 12 words against a reference of 12, each n-gram matched with
/// probability `q` (the run's quality: the system's plus its seed's offset) plus the sentence's own offset.
fn synthetic_run(rng: &mut StdRng, sentence: &[f64], q: f64) -> Vec<Vec<f64>> {
    sentence
        .iter()
        .map(|&e| {
            let p = (q + e).clamp(0.02, 0.98);
            // 4 matched counts, 4 totals, hypothesis and reference length.
            let mut counts = vec![];
            let mut totals = vec![];
            for n in 1..=4 {
                let total = 12 - (n - 1);
                let p_n = p.powf(n as f64 * 0.7);
                counts.push((0..total).filter(|_| rng.random::<f64>() < p_n).count() as f64);
                totals.push(total as f64);
            }
            [counts, totals, vec![12.0, 12.0]].concat()
        })
        .collect()
}

#[test]
fn two_seeds_of_one_recipe_fool_the_pooled_bootstrap_but_not_the_seed_level_test() {
    // BLEU from the statistics above (`Metric::segment_stats`'s layout).
    let metric = Metric::Bleu(BleuOptions::sacrebleu());
    let probe = synthetic_run(&mut StdRng::seed_from_u64(0), &[0.0; 4], 0.5);
    assert_eq!(
        probe[0].len(),
        metric
            .segment_stats(&["a".to_string()], &[vec!["a".to_string()]])
            .unwrap()[0]
            .len()
    );
    let mut rng = StdRng::seed_from_u64(2011);
    let draws = 300;
    let (mut pooled_fp, mut welch_fp, mut boot_fp) = (0, 0, 0);
    for _ in 0..draws {
        // One test set (its sentences' difficulty), two systems of the same recipe: 3 seeds each, whose
        // quality varies across seeds (s_opt) more than the test set's sampling shows.
        let sentence: Vec<f64> = (0..300).map(|_| rng.random::<f64>() * 0.3 - 0.15).collect();
        let side = |rng: &mut StdRng| -> Vec<Vec<Vec<f64>>> {
            (0..3)
                .map(|_| {
                    let seed_offset = (rng.random::<f64>() - 0.5) * 0.12;
                    synthetic_run(rng, &sentence, 0.55 + seed_offset)
                })
                .collect()
        };
        let (a, b) = (side(&mut rng), side(&mut rng));
        // The pooled test, as the reports ran it: the seeds' sentences as one test set.
        let (pa, pb): (Vec<Vec<f64>>, Vec<Vec<f64>>) = (a.concat(), b.concat());
        let pooled = paired_bootstrap(&metric, &pa, &pb, 200, rng.random()).unwrap();
        pooled_fp += usize::from(pooled.p_value < 0.05);
        let c = compare_runs(&metric, &a, &b, 200, rng.random()).unwrap();
        welch_fp += usize::from(c.welch.unwrap().p_value < 0.05);
        boot_fp += usize::from(c.bootstrap.p_value < 0.05);
    }
    let rate = |k: usize| k as f64 / draws as f64;
    eprintln!(
        "false-positive rates at 0.05 over {draws} synthetic draws: pooled bootstrap {:.3}, Welch {:.3}, run bootstrap {:.3}",
        rate(pooled_fp),
        rate(welch_fp),
        rate(boot_fp)
    );
    assert!(rate(welch_fp) <= 0.07, "Welch: {}", rate(welch_fp));
    assert!(
        rate(pooled_fp) >= 0.3,
        "the synthetic case is too easy for the pooled test: {}",
        rate(pooled_fp)
    );
}
