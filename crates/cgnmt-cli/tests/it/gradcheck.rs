//! Gradients of the whole model against central finite differences (f64), for the baseline and every decoder
//! variant; and, on a normal-size model, a non-zero gradient for every parameter.

use crate::common;

use candle_core::{DType, Device};
use cgnmt::config::{Config, TrainConfig};
use cgnmt::model::Model;
use cgnmt::train::optim::Optimizer;
use common::*;

#[test]
fn baseline_gru_gradients_match_finite_differences() {
    let cfg = tiny_model_config(&["model.context_gate=none"]);
    let worst = grad_check(&cfg, 11, 1000);
    assert!(worst < 1e-5);
}

/// Label smoothing (`train.label_smoothing`) in the fused output layer: the whole model's gradients of the
/// smoothed loss against finite differences, with the target padding skipped and computed.
#[test]
fn label_smoothed_gradients_match_finite_differences() {
    for (sets, padding) in [
        (
            vec!["model.context_gate=both"],
            cgnmt::config::TargetPadding::Skipped,
        ),
        (
            vec!["model.context_gate=none"],
            cgnmt::config::TargetPadding::Computed,
        ),
    ] {
        let cfg = tiny_model_config(&sets);
        let opts = cgnmt::model::LossOptions {
            target_padding: padding,
            label_smoothing: 0.1,
            ..Default::default()
        };
        let worst = grad_check_with(&cfg, 31, 40, &opts);
        assert!(worst < 1e-5);
    }
}

/// Dropout (`train.embedding_dropout`, `train.annotation_dropout`, `train.readout_dropout`; on the fused path
/// the annotations are a shared tensor, `kernels::dropout_shared`; `train.recurrent_dropout` inside the fused
/// encoder and decoder recurrences, with their hand-written backward passes): a pass's masks are fixed by its
/// seed, so the loss is a function of the parameters that finite differences can check; with the target
/// padding skipped and computed, the GRU, vanilla and cGRU decoders in both gate forms. Dropping changes the
/// loss (the recurrent masks alone too), and the same seed repeats it.
#[test]
fn dropout_gradients_match_finite_differences() {
    use cgnmt::model::dropout::Dropout;
    for (sets, padding) in [
        (
            vec!["model.context_gate=both"],
            cgnmt::config::TargetPadding::Skipped,
        ),
        (
            vec![
                "model.context_gate=source",
                "model.tied_output_embeddings=true",
            ],
            cgnmt::config::TargetPadding::Computed,
        ),
        (
            vec!["model.decoder=vanilla", "model.context_gate=target"],
            cgnmt::config::TargetPadding::Skipped,
        ),
        (
            vec!["model.gate_form=paper", "model.context_gate=both"],
            cgnmt::config::TargetPadding::Skipped,
        ),
        (
            vec![
                "model.gate_form=paper",
                "model.decoder=vanilla",
                "model.context_gate=source",
            ],
            cgnmt::config::TargetPadding::Computed,
        ),
        (
            vec!["model.decoder=cgru", "model.context_gate=both"],
            cgnmt::config::TargetPadding::Skipped,
        ),
        (
            vec![
                "model.decoder=cgru",
                "model.gate_form=paper",
                "model.context_gate=target",
            ],
            cgnmt::config::TargetPadding::Skipped,
        ),
    ] {
        let cfg = tiny_model_config(&sets);
        let d = every_dropout();
        let opts = cgnmt::model::LossOptions {
            target_padding: padding,
            dropout: Some(d),
            ..Default::default()
        };
        let worst = grad_check_with(&cfg, 41, 40, &opts);
        assert!(worst < 1e-5);

        let (vs, vt) = (7, 6);
        let (model, varmap) = Model::build(&cfg, vs, vt, 41, DType::F64, &Device::Cpu).unwrap();
        randomize(&varmap, 42, 0.5);
        let batch = tiny_batch(43, vs, vt, DType::F64);
        let loss = |o: &cgnmt::model::LossOptions| {
            model
                .loss_with(&batch, o)
                .unwrap()
                .to_scalar::<f64>()
                .unwrap()
        };
        let plain = cgnmt::model::LossOptions {
            target_padding: padding,
            ..Default::default()
        };
        let other = cgnmt::model::LossOptions {
            dropout: Some(Dropout { seed: 6, ..d }),
            ..opts
        };
        let zero = cgnmt::model::LossOptions {
            dropout: Some(Dropout {
                embeddings: 0.0,
                annotations: 0.0,
                readout: 0.0,
                recurrent: 0.0,
                ..d
            }),
            ..opts
        };
        let recurrent_only = cgnmt::model::LossOptions {
            dropout: Some(Dropout {
                embeddings: 0.0,
                annotations: 0.0,
                readout: 0.0,
                ..d
            }),
            ..opts
        };
        assert_eq!(loss(&opts), loss(&opts), "the same seed, the same masks");
        assert_ne!(loss(&opts), loss(&plain), "dropout changes the loss");
        assert_ne!(loss(&opts), loss(&other), "another seed, other masks");
        assert_eq!(loss(&zero), loss(&plain), "rates of 0 drop nothing");
        assert_ne!(
            loss(&recurrent_only),
            loss(&plain),
            "recurrent dropout changes the loss"
        );
        let worst = grad_check_with(&cfg, 44, 40, &recurrent_only);
        assert!(worst < 1e-5, "recurrent dropout alone: {worst:e}");
    }
}

#[test]
fn every_decoder_variant_gradients_match_finite_differences() {
    let mut variants: Vec<Vec<String>> = Vec::new();
    for dec in ["gru", "vanilla"] {
        for form in ["reference", "paper"] {
            for gate in ["none", "source", "target", "both"] {
                let inputs: &[&str] = if gate == "none" {
                    &["[\"word\",\"state\",\"context\"]"]
                } else {
                    &[
                        "[\"state\"]",
                        "[\"state\",\"context\"]",
                        "[\"word\",\"state\",\"context\"]",
                    ]
                };
                for inp in inputs {
                    variants.push(vec![
                        format!("model.decoder={dec}"),
                        format!("model.gate_form={form}"),
                        format!("model.context_gate={gate}"),
                        format!("model.gate_inputs={inp}"),
                    ]);
                }
            }
            variants.push(vec![
                format!("model.decoder={dec}"),
                format!("model.gate_form={form}"),
                "model.context_gate=none".into(),
                "model.gating_scalar=true".into(),
            ]);
            variants.push(vec![
                format!("model.decoder={dec}"),
                format!("model.gate_form={form}"),
                "model.context_gate=none".into(),
                "model.static_interpolation=true".into(),
            ]);
        }
    }
    for form in ["reference", "paper"] {
        for gate in ["none", "both", "source"] {
            variants.push(vec![
                "model.decoder=cgru".into(),
                format!("model.gate_form={form}"),
                format!("model.context_gate={gate}"),
            ]);
        }
        variants.push(vec![
            "model.decoder=cgru".into(),
            format!("model.gate_form={form}"),
            "model.context_gate=target".into(),
            "model.gate_inputs=[\"word\",\"state\"]".into(),
        ]);
        variants.push(vec![
            "model.decoder=cgru".into(),
            format!("model.gate_form={form}"),
            "model.context_gate=none".into(),
            "model.gating_scalar=true".into(),
        ]);
    }
    for (i, v) in variants.iter().enumerate() {
        let sets: Vec<&str> = v.iter().map(|s| s.as_str()).collect();
        let cfg = tiny_model_config(&sets);
        grad_check(&cfg, 100 + i as u64, 6);
    }
}

/// Stacked encoders (`model.encoder_layers`): every layer's parameters against finite differences, with and
/// without residual connections, bidirectional or unidirectional above the first (`model.encoder_type`), under
/// the GRU and cGRU decoders, and under every kind of dropout (each upper layer's recurrent masks drawn from a
/// stream of its own).
#[test]
fn stacked_encoder_gradients_match_finite_differences() {
    for (i, sets) in [
        vec!["model.encoder_layers=2", "model.context_gate=both"],
        vec![
            "model.encoder_layers=3",
            "model.residual=false",
            "model.context_gate=source",
        ],
        vec![
            "model.encoder_layers=2",
            "model.decoder=cgru",
            "model.context_gate=target",
        ],
        vec![
            "model.encoder_layers=3",
            "model.encoder_type=\"bi-unidirectional\"",
            "model.context_gate=both",
        ],
    ]
    .iter()
    .enumerate()
    {
        let cfg = tiny_model_config(sets);
        let worst = grad_check(&cfg, 61 + i as u64, 40);
        assert!(worst < 1e-5, "{sets:?}: {worst:e}");
        let opts = cgnmt::model::LossOptions {
            dropout: Some(every_dropout()),
            ..Default::default()
        };
        let worst = grad_check_with(&cfg, 71 + i as u64, 40, &opts);
        assert!(worst < 1e-5, "{sets:?} with dropout: {worst:e}");
    }
    // The layers' parameters exist under `encoder.layerN.*` and one layer has none of them.
    let names = |sets: &[&str]| {
        let (_m, varmap) =
            Model::build(&tiny_model_config(sets), 7, 6, 1, DType::F64, &Device::Cpu).unwrap();
        sorted_vars(&varmap)
            .into_iter()
            .map(|(n, _)| n)
            .filter(|n| n.starts_with("encoder.layer"))
            .collect::<Vec<_>>()
    };
    assert!(names(&[]).is_empty());
    let three = names(&["model.encoder_layers=3"]);
    assert_eq!(three.len(), 16, "{three:?}");
    assert!(three.contains(&"encoder.layer3.bwd.U_ru".to_string()));
}

/// Deep-transition decoders (`model.decoder_transition_depth`): every parameter against finite differences
/// under the GRU, vanilla and cGRU decoders in both gate forms, with a gate and coverage, with every dropout,
/// and with a stacked encoder; the later transitions' parameters are `decoder.cell.deepK.{b, U_ru, U}`.
#[test]
fn deep_transition_gradients_match_finite_differences() {
    let cases: Vec<Vec<&str>> = vec![
        vec![
            "model.decoder_transition_depth=2",
            "model.context_gate=both",
        ],
        vec![
            "model.decoder_transition_depth=3",
            "model.gate_form=paper",
            "model.context_gate=both",
        ],
        vec![
            "model.decoder_transition_depth=2",
            "model.decoder=vanilla",
            "model.context_gate=source",
        ],
        vec![
            "model.decoder_transition_depth=2",
            "model.decoder=vanilla",
            "model.gate_form=paper",
            "model.context_gate=target",
        ],
        vec![
            "model.decoder_transition_depth=2",
            "model.decoder=cgru",
            "model.context_gate=both",
        ],
        vec![
            "model.decoder_transition_depth=2",
            "model.decoder=cgru",
            "model.gate_form=paper",
            "model.context_gate=none",
        ],
        vec![
            "model.decoder_transition_depth=2",
            "model.encoder_layers=2",
            "model.coverage=neural",
            "model.coverage_dim=2",
            "model.context_gate=both",
        ],
    ];
    for (i, sets) in cases.iter().enumerate() {
        let cfg = tiny_model_config(sets);
        let worst = grad_check(&cfg, 81 + i as u64, 30);
        assert!(worst < 1e-5, "{sets:?}: {worst:e}");
        let opts = cgnmt::model::LossOptions {
            dropout: Some(every_dropout()),
            ..Default::default()
        };
        let worst = grad_check_with(&cfg, 91 + i as u64, 30, &opts);
        assert!(worst < 1e-5, "{sets:?} with dropout: {worst:e}");
    }
    let (_m, varmap) = Model::build(
        &tiny_model_config(&["model.decoder_transition_depth=3"]),
        7,
        6,
        1,
        DType::F64,
        &Device::Cpu,
    )
    .unwrap();
    let deep: Vec<String> = sorted_vars(&varmap)
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| n.contains(".deep"))
        .collect();
    assert_eq!(
        deep,
        [
            "decoder.cell.deep2.U",
            "decoder.cell.deep2.U_ru",
            "decoder.cell.deep2.b",
            "decoder.cell.deep3.U",
            "decoder.cell.deep3.U_ru",
            "decoder.cell.deep3.b"
        ]
    );
}

#[test]
fn every_parameter_gets_a_nonzero_gradient_at_normal_size() {
    for gate in ["none", "both"] {
        let cfg = Config::load(
            None,
            &[
                "model.embedding_dim=64".into(),
                "model.hidden_dim=128".into(),
                "model.attention_dim=96".into(),
                format!("model.context_gate={gate}"),
            ],
        )
        .unwrap();
        let (vs, vt) = (500, 400);
        let (model, varmap) =
            Model::build(&cfg.model, vs, vt, 5, DType::F32, &Device::Cpu).unwrap();
        let vars = sorted_vars(&varmap);
        let mut opt = Optimizer::new(&TrainConfig {
            optimizer: cgnmt::config::OptimizerKind::Adam,
            ..Default::default()
        });
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(9);
        let src = random_seqs(&mut rng, 16, vs, 3, 12);
        let tgt = random_seqs(&mut rng, 16, vt, 3, 12);
        let batch = cgnmt::model::Batch::new(&src, &tgt, 0, DType::F32, &Device::Cpu).unwrap();
        // The paper's initialisation sets v = 0, which makes A and B's true gradient zero at step 0: take a
        // few steps first.
        for _ in 0..3 {
            let g = model.backward(&model.loss(&batch).unwrap()).unwrap();
            opt.step(&vars, &g).unwrap();
        }
        let g = model.backward(&model.loss(&batch).unwrap()).unwrap();
        for (name, var) in &vars {
            let gt = g
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{name}: no gradient (cut graph?)"));
            let s = gt
                .abs()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(s > 0.0 && s.is_finite(), "{name}: gradient sum {s}");
        }
    }
}

#[test]
fn coverage_gradients_match_finite_differences() {
    let cases: Vec<Vec<&str>> = vec![
        vec![
            "model.coverage=linguistic",
            "model.coverage_dim=1",
            "model.coverage_fertility=false",
        ],
        vec![
            "model.coverage=linguistic",
            "model.coverage_dim=1",
            "model.coverage_fertility=true",
        ],
        vec![
            "model.coverage=neural",
            "model.coverage_dim=2",
            "model.coverage_gated=true",
        ],
        vec![
            "model.coverage=neural",
            "model.coverage_dim=2",
            "model.coverage_gated=false",
        ],
    ];
    for (i, c) in cases.iter().enumerate() {
        for gate in ["none", "both"] {
            let g = format!("model.context_gate={gate}");
            let mut sets = c.clone();
            sets.push(&g);
            grad_check(&tiny_model_config(&sets), 300 + i as u64, 8);
        }
    }
    // The cGRU with coverage (attention queried with the word GRU's state).
    for (i, c) in cases.iter().enumerate().skip(1) {
        let mut sets = c.clone();
        sets.extend(["model.decoder=cgru", "model.context_gate=both"]);
        grad_check(&tiny_model_config(&sets), 320 + i as u64, 8);
    }
}

/// With the target padding computed, the fused and the composed (reference) kernels draw the same dropout
/// masks in the same order on tensors of the same layout: the same loss and gradients, so the annotations'
/// dropout on the fused path's shared tensor (`kernels::dropout_shared`) is the composed product.
#[test]
fn dropout_is_the_same_with_fused_and_reference_kernels() {
    for sets in [
        &["model.context_gate=both"][..],
        &["model.decoder=vanilla", "model.context_gate=source"][..],
        &["model.gate_form=paper", "model.context_gate=target"][..],
        &[
            "model.gate_form=paper",
            "model.decoder=vanilla",
            "model.context_gate=both",
        ][..],
        &["model.decoder=cgru", "model.context_gate=both"][..],
        &[
            "model.decoder=cgru",
            "model.gate_form=paper",
            "model.context_gate=source",
        ][..],
    ] {
        dropout_fused_and_reference_agree(&tiny_model_config(sets));
    }
}

fn dropout_fused_and_reference_agree(cfg: &cgnmt::config::ModelConfig) {
    // The masks follow each sentence's positions, so the fused path, which keeps only the words' rows when
    // the target padding is skipped, drops what the composed one drops.
    for padding in [
        cgnmt::config::TargetPadding::Computed,
        cgnmt::config::TargetPadding::Skipped,
    ] {
        dropout_fused_and_reference_agree_with(cfg, padding);
    }
}

fn dropout_fused_and_reference_agree_with(
    cfg: &cgnmt::config::ModelConfig,
    padding: cgnmt::config::TargetPadding,
) {
    let opts = cgnmt::model::LossOptions {
        target_padding: padding,
        dropout: Some(cgnmt::model::dropout::Dropout {
            embeddings: 0.2,
            annotations: 0.3,
            readout: 0.25,
            recurrent: 0.3,
            seed: 9,
        }),
        ..Default::default()
    };
    let batch = tiny_batch(53, 7, 6, DType::F64);
    fused_and_reference_agree(cfg, &opts, &batch, (51, 52));
}

/// The loss and every parameter's gradient of `batch` under `opts` are the same with the fused kernels as with
/// the composed reference (f64), for a model built with seed `build` and randomised with seed `values`.
fn fused_and_reference_agree(
    cfg: &cgnmt::config::ModelConfig,
    opts: &cgnmt::model::LossOptions,
    batch: &cgnmt::model::Batch,
    (build, values): (u64, u64),
) {
    use cgnmt::kernels::Kernels;
    let run = |k: Kernels| {
        let (mut model, varmap) = Model::build(cfg, 7, 6, build, DType::F64, &Device::Cpu).unwrap();
        model.set_kernels(k);
        randomize(&varmap, values, 0.5);
        let loss = model.loss_with(batch, opts).unwrap();
        let g = model.backward(&loss).unwrap();
        let grads: Vec<(String, Vec<f64>)> = sorted_vars(&varmap)
            .into_iter()
            .map(|(n, v)| {
                let t = g
                    .get(v.as_tensor())
                    .unwrap_or_else(|| panic!("{n}: no gradient"));
                (n, t.flatten_all().unwrap().to_vec1::<f64>().unwrap())
            })
            .collect();
        (loss.to_scalar::<f64>().unwrap(), grads)
    };
    let (lf, gf) = run(Kernels::Fused);
    let (lr, gr) = run(Kernels::Reference);
    assert!(
        (lf - lr).abs() < 1e-9 * lr.abs(),
        "loss {lf} (fused) vs {lr}"
    );
    for ((n, a), (_, b)) in gf.iter().zip(&gr) {
        for (x, y) in a.iter().zip(b) {
            assert!(
                (x - y).abs() <= 1e-8 * (1.0 + x.abs().max(y.abs())),
                "{n}: {x} (fused) vs {y} (reference)"
            );
        }
    }
}

/// Guided alignment (`train.guided_alignment`, model-spec §6b): its cost inside the fused decoder sequence,
/// with the hand-derived gradient through the attention softmax, checked by finite differences (f64) with
/// both costs, over the GRU with both gates, coverage, the vanilla unit, the cGRU and layer normalisation
/// (whose decoder runs step by step: the composed cost); and the fused loss and gradients equal the composed
/// reference's. The guidance changes the loss by its weighted cost, and a zero weight changes nothing.
#[test]
fn guided_alignment_gradients_match_finite_differences() {
    use cgnmt::config::AlignmentCost;
    let batch = tiny_guided_batch(61, DType::F64);
    let cases: [(&[&str], AlignmentCost); 6] = [
        (&["model.context_gate=both"], AlignmentCost::Ce),
        (&["model.context_gate=both"], AlignmentCost::Mse),
        (
            &["model.coverage=neural", "model.context_gate=source"],
            AlignmentCost::Ce,
        ),
        (
            &["model.decoder=vanilla", "model.context_gate=target"],
            AlignmentCost::Mse,
        ),
        (
            &["model.decoder=cgru", "model.context_gate=both"],
            AlignmentCost::Ce,
        ),
        (
            &["model.layer_norm=true", "model.context_gate=both"],
            AlignmentCost::Ce,
        ),
    ];
    for (sets, cost) in cases {
        let cfg = tiny_model_config(sets);
        let opts = cgnmt::model::LossOptions {
            guided: Some((cost, 0.7)),
            ..Default::default()
        };
        let worst = grad_check_on(&cfg, 62, 40, &opts, &batch);
        assert!(worst < 1e-5, "{sets:?} {cost:?}: {worst}");
        fused_and_reference_agree(&cfg, &opts, &batch, (65, 66));
    }
    // The weighted cost is in the loss, and without a weight the loss is the plain one.
    let cfg = tiny_model_config(&["model.context_gate=both"]);
    let (model, varmap) = Model::build(&cfg, 7, 6, 63, DType::F64, &Device::Cpu).unwrap();
    randomize(&varmap, 64, 0.5);
    let loss = |w: Option<f64>| {
        let opts = cgnmt::model::LossOptions {
            guided: w.map(|w| (AlignmentCost::Ce, w)),
            ..Default::default()
        };
        model
            .loss_with(&batch, &opts)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    };
    let (plain, zero, one, two) = (
        loss(None),
        loss(Some(0.0)),
        loss(Some(1.0)),
        loss(Some(2.0)),
    );
    assert_eq!(plain, zero);
    assert!(one > plain + 0.1, "{one} vs {plain}");
    assert!(((two - plain) - 2.0 * (one - plain)).abs() < 1e-9);
}
