//! `cgnmt bench` runs end to end on real data with either kernel set and reports what the issue asks for
//! (a functional check: speed itself is measured by running the command, never asserted in tests).

use crate::common;

use std::process::Command;

fn bench(kernels: &str, extra: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args([
            "--kernels",
            kernels,
            "bench",
            "--size",
            "tiny",
            "--steps",
            "2",
            "--repeats",
            "1",
            "--decode-sentences",
            "4",
            "--data",
        ])
        .arg(common::data_dir())
        .args(extra)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(stdout.lines().last().unwrap()).unwrap()
}

#[test]
fn bench_reports_throughput_flops_and_memory_for_both_kernel_sets() {
    if common::data_set_or_skip(
        "hansards-en-fr",
        "bench_reports_throughput_flops_and_memory_for_both_kernel_sets",
    )
    .is_none()
    {
        return;
    }
    for k in ["fused", "reference"] {
        let r = bench(k, &[]);
        assert_eq!(r["config"]["kernels"], k);
        for key in [
            "train_tgt_tok_per_s",
            "decode_beam10_sent_per_s",
            "decode_greedy_sent_per_s",
            "decode_beam10_gflops_per_s",
            "peak_rss_mib",
            "gflops_per_s",
            "sgemm_peak_gflops",
            "sgemm_peak_between_steps_gflops",
            "peak_fraction",
            "peak_fraction_between_steps",
        ] {
            let v = r[key].as_f64().unwrap_or(f64::NAN);
            assert!(v.is_finite() && v > 0.0, "{k}: {key} = {}", r[key]);
        }
        // The fraction is the model's rate over the peak measured just before.
        let (g, peak) = (
            r["gflops_per_s"].as_f64().unwrap(),
            r["sgemm_peak_gflops"].as_f64().unwrap(),
        );
        assert!((r["peak_fraction"].as_f64().unwrap() - g / peak).abs() < 1e-9 * (g / peak));
        assert!(r["threads"].as_u64().unwrap() >= 1);
        // Int8 decoding runs with fused kernels on AVX2 CPUs only.
        let int8 = &r["decode_beam10_int8_sent_per_s"];
        if k == "fused" && cgnmt::kernels::quantized_gemm::available() {
            assert!(int8.as_f64().unwrap_or(0.0) > 0.0, "{k}: int8 {int8}");
            assert!(r["decode_beam10_int8_hyp_steps"].as_u64().unwrap() >= 4);
        } else {
            assert!(int8.is_null(), "{k}: int8 {int8}");
        }
        assert!(r["decode_beam10_hyp_steps"].as_u64().unwrap() >= 4);
        // Greedy decodes each of the 4 sentences for at least one step, and both rates are over the same
        // seconds: steps/s over sentences/s is the steps per sentence.
        let greedy_steps = r["decode_greedy_hyp_steps"].as_u64().unwrap() as f64;
        assert!(greedy_steps >= 4.0);
        let (sps, sent) = (
            r["decode_greedy_hyp_steps_per_s"].as_f64().unwrap(),
            r["decode_greedy_sent_per_s"].as_f64().unwrap(),
        );
        assert!((sps / sent - greedy_steps / 4.0).abs() < 1e-9 * greedy_steps);
        let p = &r["train_phase_s_median"];
        assert!(p["forward"].as_f64().unwrap() > 0.0 && p["backward"].as_f64().unwrap() > 0.0);
    }
}

/// `--lengths reference` trains on batches with `torch_reference.py`'s lengths: the tokens per step are the
/// words of those lengths (tiny: 16 sentences padded to 10), fewer than the padded positions.
#[test]
fn bench_trains_on_the_reference_lengths() {
    if common::data_set_or_skip("hansards-en-fr", "bench_trains_on_the_reference_lengths").is_none()
    {
        return;
    }
    let r = bench("fused", &["--lengths", "reference"]);
    assert_eq!(r["config"]["lengths"], "reference");
    let want: usize = cgnmt::bench::reference_lengths(16, 10)
        .iter()
        .map(|x| x.1)
        .sum();
    assert_eq!(r["train_tgt_tokens_per_step"].as_u64(), Some(want as u64));
    assert_eq!(r["train_tgt_positions_per_step"].as_u64(), Some(160));
    assert!(r["train_tgt_tok_per_s"].as_f64().unwrap() > 0.0);
    let fixed = bench("fused", &[]);
    assert_eq!(fixed["config"]["lengths"], "fixed");
    assert_eq!(fixed["train_tgt_tokens_per_step"].as_u64(), Some(160));
}

/// `--compare-target-padding` alternates the training steps between skipping and computing the target
/// side's padded positions and reports both medians.
#[test]
fn bench_compares_skipped_and_computed_target_padding() {
    if common::data_set_or_skip(
        "hansards-en-fr",
        "bench_compares_skipped_and_computed_target_padding",
    )
    .is_none()
    {
        return;
    }
    let r = bench(
        "fused",
        &["--lengths", "reference", "--compare-target-padding"],
    );
    let c = &r["target_padding_comparison"];
    assert_eq!(c["skipped_steps"], 1, "{c}");
    assert_eq!(c["computed_steps"], 1, "{c}");
    for key in ["skipped_step_s_median", "computed_step_s_median"] {
        assert!(c[key].as_f64().unwrap_or(0.0) > 0.0, "{key}: {c}");
    }
    assert!(bench("fused", &[])["target_padding_comparison"].is_null());
}

/// `--compare-packed-gemm` alternates the training steps between the packed micro-kernel and the general
/// GEMM and reports both medians.
#[test]
fn bench_compares_packed_and_general_gemm_steps() {
    if common::data_set_or_skip(
        "hansards-en-fr",
        "bench_compares_packed_and_general_gemm_steps",
    )
    .is_none()
    {
        return;
    }
    let r = bench("fused", &["--compare-packed-gemm"]); // 2 timed steps: one each
    let c = &r["packed_gemm_comparison"];
    assert_eq!(c["packed_steps"], 1, "{c}");
    assert_eq!(c["general_gemm_steps"], 1, "{c}");
    for key in ["packed_step_s_median", "general_gemm_step_s_median"] {
        assert!(c[key].as_f64().unwrap_or(0.0) > 0.0, "{key}: {c}");
    }
    assert!(bench("fused", &[])["packed_gemm_comparison"].is_null());
}

/// `--profile-ops` times every fused op's passes: each top-level entry is a positive per-step mean, the
/// decoder's, encoder's and output layer's parts add up to at most their op, and what the phases spent outside the
/// fused ops is reported.
#[test]
fn bench_profiles_the_fused_ops() {
    if common::data_set_or_skip("hansards-en-fr", "bench_profiles_the_fused_ops").is_none() {
        return;
    }
    let r = bench("fused", &["--profile-ops"]);
    let p = r["op_profile"].as_object().expect("op_profile object");
    let get = |k: &str| p.get(k).and_then(|v| v.as_f64()).unwrap_or(f64::NAN);
    for op in [
        "encoder bigru",
        "decoder sequence",
        "linear",
        "readout",
        "output nll",
    ] {
        for pass in ["forward", "backward"] {
            let v = get(&format!("{op} {pass}"));
            assert!(v.is_finite() && v > 0.0, "{op} {pass} = {v}: {p:?}");
        }
    }
    for (whole, prefix) in [
        ("decoder sequence forward", "  decoder fwd: "),
        ("decoder sequence backward", "  decoder bwd: "),
        ("encoder bigru forward", "  encoder fwd: "),
        ("encoder bigru backward", "  encoder bwd: "),
        ("output nll forward", "  output nll fwd: "),
        ("output nll backward", "  output nll bwd: "),
    ] {
        let parts: Vec<f64> = p
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .map(|(_, v)| v.as_f64().unwrap())
            .collect();
        assert!(!parts.is_empty(), "no parts of {whole}: {p:?}");
        let sum: f64 = parts.iter().sum();
        assert!(
            sum <= get(whole) * 1.001 + 1e-6,
            "{whole}: parts {sum} > {}",
            get(whole)
        );
    }
    for pass in ["forward", "backward"] {
        assert!(get(&format!("{pass} outside the fused ops")).is_finite());
    }
    // Without the flag the timers stay off.
    assert!(bench("fused", &[])["op_profile"].is_null());
}

/// `--data-parallel` in one process times the data-parallel update's phases (the figures 2 ranks are compared
/// with): no exchange, no waiting, and the global batch's tokens per second.
#[test]
fn bench_times_the_data_parallel_update_in_one_process() {
    if common::data_set_or_skip("hansards-en-fr", "bench_times_the_data_parallel_update").is_none()
    {
        return;
    }
    let r = bench("fused", &["--data-parallel"]);
    assert_eq!(r["ranks"].as_u64(), Some(1));
    assert_eq!(r["updates"].as_u64(), Some(2));
    let p = &r["per_rank"][0];
    for k in ["forward_s", "backward_s", "optimizer_s", "update_s"] {
        assert!(p[k].as_f64().unwrap() > 0.0, "{k}: {p}");
    }
    assert_eq!(p["exchange_s"].as_f64(), Some(0.0));
    assert_eq!(p["mb_sent"].as_f64(), Some(0.0));
    let sum: f64 = ["forward_s", "backward_s", "optimizer_s"]
        .iter()
        .map(|k| p[k].as_f64().unwrap())
        .sum();
    assert!(sum <= p["update_s"].as_f64().unwrap() * 1.5, "{p}");
    assert!(r["train_tgt_tok_per_s"].as_f64().unwrap() > 0.0);
    assert!(r["allreduce_by_size"].as_array().unwrap().is_empty());
}
