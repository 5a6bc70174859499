//! Every fused kernel against its composed reference: forward values equal to 1e-5 relative (f32) and
//! gradients equal (f32 to 1e-4, f64 to 1e-10), op by op and for the whole model in every decoder, gate and
//! coverage variant; decoding gives the same translations with either kernel set.

use crate::common::*;
use candle_core::{DType, Device, Tensor, Var};
use cgnmt::config::TargetPadding;
use cgnmt::decode::beam_search::{beam_search, greedy, DecodeOptions};
use cgnmt::kernels::attention::{
    scores_fused, scores_reference, softmax_context_fused, softmax_context_reference,
};
use cgnmt::kernels::gru::{gru_update_fused, gru_update_reference};
use cgnmt::kernels::readout::{
    log_normaliser, log_softmax, maxout_fused, maxout_reference, output_nll_fused,
    output_nll_reference,
};
use cgnmt::kernels::{max_rel_diff, rec_matmul, Kernels};
use cgnmt::model::{Batch, Model};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

mod decoding;
mod encoder;
mod model;
mod ops;

fn rand_var(rng: &mut StdRng, shape: &[usize], scale: f64, dtype: DType) -> Var {
    let n: usize = shape.iter().product();
    let v: Vec<f64> = (0..n)
        .map(|_| (rng.random::<f64>() * 2.0 - 1.0) * scale)
        .collect();
    let t = Tensor::from_vec(v, shape, &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    Var::from_tensor(&t).unwrap()
}

/// Forward outputs and the gradients of `Σ out ⊙ R` (R random) for the inputs, with both implementations.
fn compare(
    dtype: DType,
    inputs: &[Var],
    fused: &dyn Fn(&[Tensor]) -> Vec<Tensor>,
    reference: &dyn Fn(&[Tensor]) -> Vec<Tensor>,
    fwd_tol: f64,
    grad_tol: f64,
    what: &str,
) {
    let xs: Vec<Tensor> = inputs.iter().map(|v| v.as_tensor().clone()).collect();
    let of = fused(&xs);
    let or = reference(&xs);
    let mut rng = StdRng::seed_from_u64(99);
    let mut lf = Tensor::zeros((), dtype, &Device::Cpu).unwrap();
    let mut lr = lf.clone();
    for (a, b) in of.iter().zip(&or) {
        let d = max_rel_diff(a, b).unwrap();
        assert!(d < fwd_tol, "{what}: forward differs by {d:e}");
        let r = rand_var(&mut rng, a.dims(), 1.0, dtype);
        lf = (lf + (a * r.as_tensor()).unwrap().sum_all().unwrap()).unwrap();
        lr = (lr + (b * r.as_tensor()).unwrap().sum_all().unwrap()).unwrap();
    }
    let gf = cgnmt::kernels::backward(&lf).unwrap();
    let gr = lr.backward().unwrap();
    for (i, x) in xs.iter().enumerate() {
        let (a, b) = (gf.get(x), gr.get(x));
        match (a, b) {
            (Some(a), Some(b)) => {
                let d = max_rel_diff(a, b).unwrap();
                assert!(
                    d < grad_tol,
                    "{what}: gradient of input {i} differs by {d:e}"
                );
            }
            (None, None) => {}
            _ => panic!("{what}: input {i} has a gradient in only one implementation"),
        }
    }
}

/// Model variants covered by the whole-model comparison.
fn variants() -> Vec<Vec<String>> {
    let mut v: Vec<Vec<String>> = Vec::new();
    for dec in ["gru", "vanilla", "cgru"] {
        for form in ["reference", "paper"] {
            for gate in ["none", "source", "target", "both"] {
                v.push(vec![
                    format!("model.decoder={dec}"),
                    format!("model.gate_form={form}"),
                    format!("model.context_gate={gate}"),
                ]);
            }
        }
    }
    for extra in [
        "model.gating_scalar=true",
        "model.static_interpolation=true",
    ] {
        v.push(vec!["model.context_gate=none".into(), extra.into()]);
    }
    v.push(vec!["model.gate_inputs=[\"state\"]".into()]);
    // The cGRU (its context GRU in the fused decoder op, the word GRU after it) with the other gates and
    // with coverage.
    for extra in [
        vec!["model.context_gate=none", "model.gating_scalar=true"],
        vec![
            "model.context_gate=none",
            "model.static_interpolation=true",
            "model.gate_form=paper",
        ],
        vec!["model.gate_inputs=[\"word\",\"state\"]"],
        vec!["model.coverage=neural", "model.coverage_dim=3"],
        vec!["model.coverage=linguistic", "model.coverage_dim=1"],
    ] {
        let mut x = vec!["model.decoder=cgru".to_string()];
        x.extend(extra.iter().map(|s| s.to_string()));
        v.push(x);
    }
    for cov in [
        vec!["model.coverage=linguistic", "model.coverage_dim=1"],
        vec![
            "model.coverage=linguistic",
            "model.coverage_dim=1",
            "model.coverage_fertility=true",
        ],
        vec!["model.coverage=neural", "model.coverage_dim=3"],
        vec![
            "model.coverage=neural",
            "model.coverage_dim=3",
            "model.coverage_gated=false",
        ],
    ] {
        let mut x: Vec<String> = cov.iter().map(|s| s.to_string()).collect();
        x.push("model.context_gate=both".into());
        v.push(x);
    }
    // Coverage's state term `t W_h` stacked after the gate's `U_z` (present or not) in the fused decoder's
    // query product.
    for gate in [
        vec!["model.context_gate=none"],
        vec![
            "model.context_gate=source",
            "model.gate_inputs=[\"word\",\"context\"]",
        ],
        vec!["model.context_gate=target", "model.gate_inputs=[\"state\"]"],
    ] {
        let mut x: Vec<String> = ["model.coverage=neural", "model.coverage_dim=2"]
            .iter()
            .chain(&gate)
            .map(|s| s.to_string())
            .collect();
        x.push("model.coverage_gated=true".into());
        v.push(x);
    }
    // Stacked encoders (`model.encoder_layers`), with and without residual connections, under each decoder.
    for (layers, residual, dec) in [
        (2, true, "gru"),
        (3, false, "gru"),
        (2, true, "cgru"),
        (2, false, "vanilla"),
    ] {
        v.push(vec![
            format!("model.encoder_layers={layers}"),
            format!("model.residual={residual}"),
            format!("model.decoder={dec}"),
            "model.context_gate=both".into(),
        ]);
    }
    v.push(vec![
        "model.encoder_layers=2".into(),
        "model.coverage=neural".into(),
        "model.coverage_dim=2".into(),
    ]);
    // Unidirectional layers above the first (Marian's bi-unidirectional encoder).
    for (layers, residual, dec) in [(2, true, "gru"), (3, false, "cgru")] {
        v.push(vec![
            format!("model.encoder_layers={layers}"),
            "model.encoder_type=\"bi-unidirectional\"".into(),
            format!("model.residual={residual}"),
            format!("model.decoder={dec}"),
        ]);
    }
    // Deep transitions (`model.decoder_transition_depth`) under every decoder and form, with and without a
    // gate, with coverage, and with a stacked encoder.
    for dec in ["gru", "vanilla", "cgru"] {
        for form in ["reference", "paper"] {
            for gate in ["none", "both"] {
                v.push(vec![
                    "model.decoder_transition_depth=2".into(),
                    format!("model.decoder={dec}"),
                    format!("model.gate_form={form}"),
                    format!("model.context_gate={gate}"),
                ]);
            }
        }
    }
    v.push(vec![
        "model.decoder_transition_depth=3".into(),
        "model.encoder_layers=2".into(),
        "model.coverage=neural".into(),
        "model.coverage_dim=2".into(),
    ]);
    v.push(vec![
        "model.decoder_transition_depth=3".into(),
        "model.decoder=cgru".into(),
        "model.context_gate=none".into(),
        "model.gating_scalar=true".into(),
    ]);
    // Layer normalisation (asked for fused kernels, its models run the fused row ops, the fused encoder op and
    // the fused decoder op, each normalising inside): each decoder and form, gated, with coverage, depth and a
    // stacked encoder.
    for dec in ["gru", "vanilla", "cgru"] {
        for form in ["reference", "paper"] {
            v.push(vec![
                "model.layer_norm=true".into(),
                format!("model.decoder={dec}"),
                format!("model.gate_form={form}"),
                "model.context_gate=both".into(),
            ]);
        }
    }
    v.push(vec![
        "model.layer_norm=true".into(),
        "model.decoder_transition_depth=2".into(),
        "model.encoder_layers=2".into(),
        "model.coverage=neural".into(),
        "model.coverage_dim=2".into(),
    ]);

    v
}

fn loss_and_grads(
    cfg: &cgnmt::config::ModelConfig,
    k: Kernels,
    dtype: DType,
) -> (f64, Vec<(String, Tensor)>) {
    let mut rng = StdRng::seed_from_u64(9);
    let src = random_seqs(&mut rng, 4, 11, 1, 6);
    let tgt = random_seqs(&mut rng, 4, 9, 1, 5);
    loss_and_grads_on(cfg, k, dtype, &src, &tgt, false)
}

/// Loss and every parameter's gradient on the batch `src` → `tgt` (vocabularies 11 / 9); a parameter without
/// a gradient fails unless `unused_is_zero` (then its gradient is zero: weights a one-step batch never uses).
fn loss_and_grads_on(
    cfg: &cgnmt::config::ModelConfig,
    k: Kernels,
    dtype: DType,
    src: &[Vec<u32>],
    tgt: &[Vec<u32>],
    unused_is_zero: bool,
) -> (f64, Vec<(String, Tensor)>) {
    let batch = Batch::new(src, tgt, 0, dtype, &Device::Cpu).unwrap();
    loss_and_grads_for(cfg, k, dtype, &batch, unused_is_zero)
}

/// [`loss_and_grads_on`] for a batch as given.
fn loss_and_grads_for(
    cfg: &cgnmt::config::ModelConfig,
    k: Kernels,
    dtype: DType,
    batch: &Batch,
    unused_is_zero: bool,
) -> (f64, Vec<(String, Tensor)>) {
    let (vs, vt) = (11, 9);
    let (mut model, varmap) = Model::build(cfg, vs, vt, 7, dtype, &Device::Cpu).unwrap();
    model.set_kernels(k);
    randomize(&varmap, 8, 0.4);
    let loss = model.loss(batch).unwrap();
    let g = model.backward(&loss).unwrap();
    let grads = sorted_vars(&varmap)
        .into_iter()
        .map(|(n, v)| {
            let gt = match g.get(v.as_tensor()) {
                Some(t) => t.clone(),
                None if unused_is_zero => v.as_tensor().zeros_like().unwrap(),
                None => panic!("{n}: no gradient with {k:?} kernels"),
            };
            (n, gt)
        })
        .collect();
    let l = loss
        .to_dtype(DType::F64)
        .unwrap()
        .to_scalar::<f64>()
        .unwrap();
    (l, grads)
}

/// The fused kernels' loss and every parameter's gradient (`fused`) equal the reference kernels' to relative
/// tolerances `(loss, gradient)`; `what` names the case in a failure.
fn assert_same(
    what: &str,
    (lf, gf): &(f64, Vec<(String, Tensor)>),
    (lr, gr): &(f64, Vec<(String, Tensor)>),
    (lt, gt): (f64, f64),
) {
    assert!(
        ((lf - lr) / lr).abs() < lt,
        "{what}: loss {lf} (fused) vs {lr} (reference)"
    );
    for ((n, a), (_, b)) in gf.iter().zip(gr) {
        let d = max_rel_diff(a, b).unwrap();
        assert!(d < gt, "{what}: gradient of {n} differs by {d:e}");
    }
}

/// A tiny model's configuration (E 6, H 10, attention 7) with the overrides `sets`.
fn tiny_model(sets: &[String]) -> cgnmt::config::ModelConfig {
    let mut all = vec![
        "model.embedding_dim=6".to_string(),
        "model.hidden_dim=10".into(),
        "model.attention_dim=7".into(),
    ];
    all.extend(sets.iter().cloned());
    cgnmt::config::Config::load(None, &all).unwrap().model
}

/// Decoding with the fused kernels (attention over sentence rows, the context's products from each source
/// position's, the logits into rows with a packed output layer) gives the reference kernels' translations and
/// scores, for every decoder, gate and coverage variant.
/// A small model for the decoding tests (E 16, H 24, attention 20; vocabularies 30 and 25) with the
/// overrides `sets`, its parameters drawn from N(0, 0.5²) with `seed`: a weight scale at which the
/// recurrences do not amplify the kernels' rounding differences from step to step (the vanilla unit at 0.6
/// drifts by 3e-4 of a score over a sentence).
fn decoding_model(sets: &[String], seed: u64) -> (Model, candle_nn::VarMap) {
    let mut all = vec![
        "model.embedding_dim=16".to_string(),
        "model.hidden_dim=24".into(),
        "model.attention_dim=20".into(),
    ];
    all.extend(sets.iter().cloned());
    let cfg = cgnmt::config::Config::load(None, &all).unwrap().model;
    let (model, varmap) = Model::build(&cfg, 30, 25, 3, DType::F32, &Device::Cpu).unwrap();
    randomize(&varmap, seed, 0.5);
    (model, varmap)
}
