//! Tied output embeddings (`model.tied_output_embeddings`): `W_2 = E_yᵀ`. The gradients of the shared
//! matrix (through the embedding lookups and the output layer) against finite differences; a real training run
//! whose checkpoint holds no `W_2`, whose loss falls, and whose loaded model decodes with `W_2 = E_yᵀ`.

use crate::common;

use candle_core::{DType, Device};
use common::*;

#[test]
fn tied_output_embeddings_gradients_match_finite_differences() {
    for sets in [
        vec![
            "model.tied_output_embeddings=true",
            "model.context_gate=both",
        ],
        vec!["model.tied_output_embeddings=true", "model.decoder=cgru"],
        vec![
            "model.tied_output_embeddings=true",
            "model.coverage=neural",
            "model.context_gate=none",
        ],
    ] {
        let cfg = tiny_model_config(&sets);
        let worst = grad_check(&cfg, 41, 40);
        assert!(worst < 1e-5, "{sets:?}: {worst}");
    }
}

#[test]
fn a_tied_model_trains_saves_without_w2_and_decodes_with_the_embeddings() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 300);
    let run = tmp.path().join("run");
    train_tiny(
        &prepared,
        &run,
        &[
            "model.tied_output_embeddings=true",
            "train.max_steps=60",
            "train.optimizer=adam",
            "train.learning_rate=0.005",
        ],
    );
    let model_dir = run.join("last");
    let tensors =
        candle_core::safetensors::load(model_dir.join("model.safetensors"), &Device::Cpu).unwrap();
    assert!(
        tensors.keys().all(|k| !k.ends_with("W_2")),
        "{:?}",
        tensors.keys()
    );
    let e_y = &tensors["decoder.E"];
    // The training loss fell (the untied model's falls about as far on this data).
    let log = std::fs::read_to_string(run.join("train.log")).unwrap();
    let losses: Vec<f64> = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        // (The training records; an evaluation's record holds the dev loss.)
        .filter(|v| v.get("step").is_some())
        .filter_map(|v| v.get("loss_per_token").and_then(|x| x.as_f64()))
        .collect();
    assert!(losses.len() >= 3, "{log}");
    assert!(
        losses.last().unwrap() < &(losses[0] - 0.5),
        "loss {} → {}",
        losses[0],
        losses.last().unwrap()
    );
    // The loaded model's output layer is the embeddings' transpose.
    let lm = cgnmt::model::store::load(&model_dir, DType::F32, &Device::Cpu).unwrap();
    let w_2 = &lm.model.readout.w_2;
    let d = cgnmt::kernels::max_rel_diff(w_2, &e_y.t().unwrap()).unwrap();
    assert_eq!(d, 0.0);
    let out = run_ok(&[
        "translate",
        "--quiet",
        "-m",
        model_dir.to_str().unwrap(),
        "-i",
        prepared.join("dev.src").to_str().unwrap(),
        "--pretokenized",
    ]);
    assert!(out.lines().count() > 10 && out.lines().any(|l| !l.trim().is_empty()));
}
