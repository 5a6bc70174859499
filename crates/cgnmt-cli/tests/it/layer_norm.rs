//! Layer normalisation (`model.layer_norm`, model-spec §5b): every parameter against finite differences in
//! every decoder, gate form, depth and coverage, with every dropout; the parameters' names, counts and
//! initialisation; the fused ops it runs; and the command line end to end (train, resume to the same
//! bits, every decoding path, `align`, `info`).

use candle_core::{DType, Device};
use cgnmt::kernels::Kernels;
use cgnmt::model::Model;

use crate::common::*;

/// Every parameter, the gains and biases included, against finite differences (f64), without and with every
/// kind of dropout.
#[test]
fn layer_norm_gradients_match_finite_differences() {
    let cases: Vec<Vec<&str>> = vec![
        vec!["model.context_gate=both"],
        vec!["model.context_gate=both", "model.gate_form=paper"],
        vec!["model.decoder=vanilla", "model.context_gate=source"],
        vec![
            "model.decoder=vanilla",
            "model.gate_form=paper",
            "model.context_gate=target",
        ],
        vec!["model.decoder=cgru", "model.context_gate=both"],
        vec![
            "model.decoder=cgru",
            "model.gate_form=paper",
            "model.decoder_transition_depth=2",
            "model.context_gate=both",
        ],
        vec![
            "model.encoder_layers=2",
            "model.decoder_transition_depth=2",
            "model.coverage=neural",
            "model.coverage_dim=2",
            "model.context_gate=both",
        ],
        vec![
            "model.encoder_layers=2",
            "model.encoder_type=\"bi-unidirectional\"",
            "model.decoder=cgru",
            "model.decoder_transition_depth=2",
            "model.context_gate=none",
        ],
    ];
    for (i, sets) in cases.iter().enumerate() {
        let mut sets = sets.clone();
        sets.push("model.layer_norm=true");
        let cfg = tiny_model_config(&sets);
        let worst = grad_check(&cfg, 111 + i as u64, 20);
        assert!(worst < 1e-5, "{sets:?}: {worst:e}");
        let opts = cgnmt::model::LossOptions {
            dropout: Some(every_dropout()),
            ..Default::default()
        };
        let worst = grad_check_with(&cfg, 121 + i as u64, 20, &opts);
        assert!(worst < 1e-5, "{sets:?} with dropout: {worst:e}");
    }
}

/// The parameters of each normalisation are `….ln_<product>.{g, b}`, gains start at 1 and biases at 0, the
/// other parameters start as the plain model's do, and at the paper's size they add 52,000 values: 12H per
/// encoder GRU, 18H in the GRU transition, 4 × 1000 in the attention and 6H in the readout.
#[test]
fn layer_norm_parameters_are_named_counted_and_initialised() {
    let build = |sets: &[&str]| {
        Model::build(&tiny_model_config(sets), 7, 6, 3, DType::F64, &Device::Cpu).unwrap()
    };
    let (_, plain) = build(&["model.context_gate=both"]);
    let (_, normed) = build(&["model.context_gate=both", "model.layer_norm=true"]);
    let plain = sorted_vars(&plain);
    let normed = sorted_vars(&normed);
    let ln: Vec<String> = normed
        .iter()
        .map(|(n, _)| n.clone())
        .filter(|n| n.contains(".ln_"))
        .collect();
    for name in [
        "encoder.fwd.ln_W.g",
        "encoder.bwd.ln_U_ru.b",
        "encoder.bwd.ln_U.g",
        "decoder.cell.ln_W.g",
        "decoder.cell.ln_C.b",
        "decoder.cell.ln_U_ru.g",
        "decoder.cell.ln_U.b",
        "decoder.attention.ln_A.g",
        "decoder.attention.ln_B.b",
        "decoder.readout.ln_W_o.g",
        "decoder.readout.ln_U_o.g",
        "decoder.readout.ln_V_o.b",
    ] {
        assert!(ln.iter().any(|n| n == name), "{name} in {ln:?}");
    }
    assert_eq!(ln.len(), 2 * (3 + 3 + 4 + 2 + 3), "{ln:?}");
    assert_eq!(normed.len(), plain.len() + ln.len());
    for (name, var) in &normed {
        let v = var
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1::<f64>()
            .unwrap();
        if name.contains(".ln_") {
            let want = if name.ends_with(".g") { 1.0 } else { 0.0 };
            assert!(v.iter().all(|&x| x == want), "{name}: {v:?}");
        } else {
            let (_, p) = plain.iter().find(|(n, _)| n == name).unwrap();
            let pv = p
                .as_tensor()
                .flatten_all()
                .unwrap()
                .to_vec1::<f64>()
                .unwrap();
            assert_eq!(v, pv, "{name}: initialised as in the plain model");
        }
    }
    let count = |sets: &[&str]| {
        let cfg = cgnmt::config::Config::load(
            None,
            &sets.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
        .unwrap();
        let (_, vm) =
            Model::build_uninit(&cfg.model, 30002, 30002, DType::F32, &Device::Cpu).unwrap();
        cgnmt::model::init::count(&vm)
    };
    assert_eq!(
        count(&["model.layer_norm=true"]) - count(&[]),
        24_000 + 18_000 + 4_000 + 6_000
    );
    // Deeper: 24H per upper encoder layer, 6H per later transition.
    assert_eq!(
        count(&[
            "model.layer_norm=true",
            "model.encoder_layers=2",
            "model.decoder_transition_depth=2"
        ]) - count(&["model.encoder_layers=2", "model.decoder_transition_depth=2"]),
        52_000 + 24_000 + 6_000
    );
}

/// A layer-normalised model, asked for fused kernels, runs the fused row ops, the fused encoder op and the
/// fused decoder op (both normalise inside), with every decoder, gate form, depth and coverage. Reference
/// kernels when asked for them; a plain model keeps the choice.
#[test]
fn a_layer_normalised_model_runs_the_fused_ops_that_normalise() {
    use cgnmt::model::DecoderPath;
    let build = |sets: &[&str]| {
        let (mut m, _) =
            Model::build(&tiny_model_config(sets), 7, 6, 1, DType::F32, &Device::Cpu).unwrap();
        m.set_kernels(Kernels::Fused);
        m
    };
    let m = build(&["model.layer_norm=true"]);
    assert_eq!(m.kernels, Kernels::FusedOps);
    assert!(matches!(m.decoder_path(), DecoderPath::Fused { .. }));
    let deep = build(&[
        "model.layer_norm=true",
        "model.decoder_transition_depth=2",
        "model.coverage=neural",
        "model.context_gate=both",
    ]);
    assert!(matches!(deep.decoder_path(), DecoderPath::Fused { .. }));
    let cgru = build(&[
        "model.layer_norm=true",
        "model.decoder=cgru",
        "model.decoder_transition_depth=2",
    ]);
    assert!(matches!(cgru.decoder_path(), DecoderPath::Fused { .. }));
    for other in [
        &["model.gate_form=paper"][..],
        &["model.decoder=vanilla"],
        &["model.decoder=vanilla", "model.gate_form=paper"],
        &["model.decoder=cgru", "model.gate_form=paper"],
    ] {
        let m = build(&[&["model.layer_norm=true"][..], other].concat());
        assert!(
            matches!(m.decoder_path(), DecoderPath::Fused { .. }),
            "{other:?}"
        );
    }
    let mut m = m;
    m.set_kernels(Kernels::Reference);
    assert_eq!(m.kernels, Kernels::Reference);
    assert!(matches!(m.decoder_path(), DecoderPath::Composed));
    let p = build(&[]);
    assert_eq!(p.kernels, Kernels::Fused);
}

#[test]
fn a_layer_normalised_model_trains_resumes_and_decodes_everywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 200);
    let a = tmp.path().join("a");
    run_args_ok(&deep_train_args(
        &prepared,
        &a,
        12,
        &["model.layer_norm=true"],
    ));
    let b = tmp.path().join("b");
    run_args_ok(&deep_train_args(
        &prepared,
        &b,
        6,
        &["model.layer_norm=true"],
    ));
    run_ok(&[
        "train",
        "--quiet",
        "--resume",
        b.to_str().unwrap(),
        "--set",
        "train.max_steps=12",
    ]);
    let (wa, wb) = (saved_weights(&a), saved_weights(&b));
    assert!(wa.contains_key("decoder.cell.deep2.ln_U.g"));
    assert!(wa.contains_key("encoder.layer2.fwd.ln_W.b"));
    // Trained: the gains moved off 1.
    assert!(wa["decoder.cell.ln_U_ru.g"].iter().any(|&g| g != 1.0));
    assert_eq!(wa, wb, "a resumed run equals the uninterrupted one");

    decodes_everywhere(tmp.path(), &prepared, &a.join("last"), &b.join("last"));
    let info = run_ok(&["info", "--set", "model.layer_norm=true"]);
    assert!(
        info.contains("layer normalisation:") && info.contains("(52000 gains and biases)"),
        "{info}"
    );
}

/// Every key is written (`train --print-config`, a model's `config.toml`), `layer_norm` included, and a
/// configuration from before the key (without it) reads back as the paper's model; `cgnmt reproduce`'s run
/// fingerprints leave it out when false, so the runs it finished keep theirs (its unit test).
#[test]
fn the_key_is_always_written_and_a_configuration_without_it_reads_as_false() {
    let load = |sets: &[&str]| {
        cgnmt::config::Config::load(
            None,
            &sets.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
        .unwrap()
    };
    let plain = load(&[]).to_toml();
    assert!(plain.contains("\nlayer_norm = false\n"), "{plain}");
    let normed = load(&["model.layer_norm=true"]).to_toml();
    assert!(normed.contains("\nlayer_norm = true\n"), "{normed}");
    for text in [plain.clone(), normed] {
        let back = cgnmt::config::Config::from_toml_str(&text, "test").unwrap();
        assert_eq!(back.to_toml(), text);
    }
    let before: String = plain
        .lines()
        .filter(|l| !l.starts_with("layer_norm"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_ne!(before, plain);
    let back = cgnmt::config::Config::from_toml_str(&before, "test").unwrap();
    assert!(!back.model.layer_norm);
    assert_eq!(back.to_toml(), plain);
}
