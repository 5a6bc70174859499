//! The decoder variants of the paper (Tables 2 and 5) and the coverage models: parameter counts, identities that
//! pin the semantics of the gates and of context scaling, and a loss that goes down on real data.

use crate::common;

use candle_core::{DType, Device, Tensor};
use cgnmt::config::{Config, ModelConfig, OptimizerKind, TrainConfig};
use cgnmt::model::attention::Context;
use cgnmt::model::decoder_step::SourceView;
use cgnmt::model::{Batch, Model};
use cgnmt::train::optim::Optimizer;
use common::*;

fn count(sets: &[&str]) -> usize {
    let mut s: Vec<String> = sets.iter().map(|x| x.to_string()).collect();
    s.push("data.src_vocab_size=30000".into());
    let cfg = Config::load(None, &s).unwrap();
    // V = 30000 words + EOS (+ UNK, which the paper's count leaves out: 2 × 620 + 620 + 1 parameters).
    let (_, vm) = Model::build_uninit(&cfg.model, 30001, 30001, DType::F32, &Device::Cpu).unwrap();
    cgnmt::model::init::count(&vm)
}

#[test]
fn parameter_counts_match_the_paper() {
    let gru = count(&["model.context_gate=none"]);
    let vanilla = count(&["model.context_gate=none", "model.decoder=vanilla"]);
    assert!((gru as f64 / 1e6 - 84.3).abs() < 0.05, "GRU {gru}");
    assert!(
        (vanilla as f64 / 1e6 - 77.1).abs() < 0.05,
        "vanilla {vanilla}"
    );
    // A GRU's two extra gates: W_ru (620×2000) + C_ru (2000×2000) + U_ru (1000×2000) = 7.24M.
    assert_eq!(gru - vanilla, 7_240_000);
    for dec in ["gru", "vanilla"] {
        let base = count(&["model.context_gate=none", &format!("model.decoder={dec}")]);
        for gate in ["source", "target", "both"] {
            let g = count(&[
                &format!("model.context_gate={gate}"),
                &format!("model.decoder={dec}"),
            ]);
            assert_eq!(
                g - base,
                620 * 1000 + 1000 * 1000 + 2000 * 1000,
                "{dec}/{gate}"
            );
        }
        // Table 5 ablations: state only, state + context.
        let s = count(&[
            "model.context_gate=both",
            "model.gate_inputs=[\"state\"]",
            &format!("model.decoder={dec}"),
        ]);
        assert_eq!(s - base, 1000 * 1000);
        let sc = count(&[
            "model.context_gate=both",
            "model.gate_inputs=[\"state\",\"context\"]",
            &format!("model.decoder={dec}"),
        ]);
        assert_eq!(sc - base, 3000 * 1000);
        let scalar = count(&[
            "model.context_gate=none",
            "model.gating_scalar=true",
            &format!("model.decoder={dec}"),
        ]);
        assert_eq!(scalar - base, 1001);
        let stat = count(&[
            "model.context_gate=none",
            "model.static_interpolation=true",
            &format!("model.decoder={dec}"),
        ]);
        assert_eq!(stat - base, 1000);
    }
}

/// Each encoder layer above the first is two GRUs over the `2H` annotations: `W` `[2H, 3H]`, `b` `[H]`,
/// `U_ru` `[H, 2H]`, `U` `[H, H]` per direction (18.002M at the paper's H = 1000), with or without residuals;
/// or, bi-unidirectional, one GRU of width 2H.
#[test]
fn stacked_encoder_parameter_counts() {
    let one = count(&["model.context_gate=both"]);
    let per_layer = 2 * (2000 * 3000 + 1000 + 1000 * 2000 + 1000 * 1000);
    assert_eq!(per_layer, 18_002_000);
    for (layers, residual) in [(2, true), (3, false), (4, true)] {
        let n = count(&[
            "model.context_gate=both",
            &format!("model.encoder_layers={layers}"),
            &format!("model.residual={residual}"),
        ]);
        assert_eq!(n - one, (layers - 1) * per_layer, "{layers} layers");
    }
    // A unidirectional layer: one GRU of width 2H over the 2H annotations, `W` `[2H, 6H]`, `b` `[2H]`,
    // `U_ru` `[2H, 4H]`, `U` `[2H, 2H]` (24.002M at H = 1000).
    let uni = count(&[
        "model.context_gate=both",
        "model.encoder_layers=3",
        "model.encoder_type=\"bi-unidirectional\"",
    ]);
    assert_eq!(
        uni - one,
        2 * (2000 * 6000 + 2000 + 2000 * 4000 + 2000 * 2000)
    );
}

/// Each later transition of a deep-transition decoder is a GRU over the state: `b` `[3H]`, `U_ru` `[H, 2H]`,
/// `U` `[H, H]` (3.003M at H = 1000), under every decoder.
#[test]
fn deep_transition_parameter_counts() {
    for dec in ["gru", "vanilla", "cgru"] {
        let one = count(&["model.context_gate=both", &format!("model.decoder={dec}")]);
        for depth in [2, 4] {
            let n = count(&[
                "model.context_gate=both",
                &format!("model.decoder={dec}"),
                &format!("model.decoder_transition_depth={depth}"),
            ]);
            assert_eq!(n - one, (depth - 1) * 3_003_000, "{dec}, depth {depth}");
        }
    }
}

#[test]
fn coverage_overheads_match_the_coverage_paper() {
    let base = count(&["model.context_gate=none"]);
    let cov = |sets: &[&str]| {
        let mut s = vec!["model.context_gate=none"];
        s.extend_from_slice(sets);
        count(&s) - base
    };
    let near = |got: usize, want: f64| (got as f64 - want).abs() / want < 0.05;
    let l0 = cov(&[
        "model.coverage=linguistic",
        "model.coverage_dim=1",
        "model.coverage_fertility=false",
    ]);
    let l1 = cov(&[
        "model.coverage=linguistic",
        "model.coverage_dim=1",
        "model.coverage_fertility=true",
    ]);
    let n1 = cov(&[
        "model.coverage=neural",
        "model.coverage_dim=1",
        "model.coverage_gated=false",
    ]);
    let g1 = cov(&[
        "model.coverage=neural",
        "model.coverage_dim=1",
        "model.coverage_gated=true",
    ]);
    let g10 = cov(&[
        "model.coverage=neural",
        "model.coverage_dim=10",
        "model.coverage_gated=true",
    ]);
    assert!(near(l0, 1e3), "linguistic without fertility {l0}");
    assert!(near(l1, 3e3), "linguistic with fertility {l1}");
    assert!(near(n1, 4e3), "neural d=1 without gating {n1}");
    assert!(near(g1, 10e3), "neural gated d=1 {g1}");
    assert!(near(g10, 100e3), "neural gated d=10 {g10}");
}

/// Decoder states over a teacher-forced batch with a given context scaling (the transition's output).
fn states(model: &Model, batch: &Batch, scale: (f64, f64)) -> Vec<Tensor> {
    let src = model.encode(&batch.src, &batch.src_mask).unwrap();
    let (_, t_len) = batch.tgt.dims2().unwrap();
    let view = SourceView::sentences(&src, None, &[]);
    let mut state = model.start(&src, true).unwrap();
    let mut out = vec![];
    for i in 0..t_len {
        let step = model.step(view, &state, scale, None).unwrap();
        let e = model
            .embed(&batch.tgt.narrow(1, i, 1).unwrap().squeeze(1).unwrap())
            .unwrap();
        let word = model.word_terms(&e).unwrap();
        state = model.feed(&step, None, word, scale, None).unwrap().0;
        out.push(state.t.clone());
    }
    out
}

fn max_diff(a: &[Tensor], b: &[Tensor]) -> f64 {
    a.iter()
        .zip(b)
        .map(|(x, y)| {
            (x - y)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f64>()
                .unwrap()
        })
        .fold(0.0, f64::max)
}

/// A gated model and an ungated model sharing every common parameter; the gate's weights are zero so that
/// z = σ(0) = 0.5 exactly.
/// (`depth`: `model.decoder_transition_depth` of both; `ln`: `model.layer_norm` of both.)
fn pair(
    dec: &str,
    form: &str,
    (depth, ln): (usize, bool),
    gate_sets: &[&str],
) -> (Model, Model, Batch) {
    let mut sets = vec![
        format!("model.decoder={dec}"),
        format!("model.gate_form={form}"),
        "model.context_gate=none".to_string(),
        format!("model.decoder_transition_depth={depth}"),
        format!("model.layer_norm={ln}"),
    ];
    let plain_cfg: ModelConfig =
        tiny_model_config(&sets.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    sets.extend(gate_sets.iter().map(|s| s.to_string()));
    let gated_cfg = tiny_model_config(&sets.iter().map(|s| s.as_str()).collect::<Vec<_>>());
    let (gated, gvm) = Model::build(&gated_cfg, 7, 6, 3, DType::F64, &Device::Cpu).unwrap();
    randomize(&gvm, 4, 0.5);
    let (plain, pvm) = Model::build(&plain_cfg, 7, 6, 3, DType::F64, &Device::Cpu).unwrap();
    let g = gvm.data().lock().unwrap();
    for (name, var) in pvm.data().lock().unwrap().iter() {
        var.set(g[name].as_tensor()).unwrap();
    }
    for (name, var) in g.iter() {
        if name.contains("gate") {
            var.set(&var.as_tensor().zeros_like().unwrap()).unwrap();
        }
    }
    drop(g);
    (gated, plain, tiny_batch(5, 7, 6, DType::F64))
}

/// In a deep-transition decoder (depth 2 and 3) the gate scales the inputs of the first transition only (the
/// later ones read the state alone), so the same identities hold; and with layer normalisation, whose
/// products the scales multiply after their normalisation (model-spec §5b).
#[test]
fn gates_at_one_half_reduce_to_the_ungated_cell_with_matching_scales() {
    for (dec, depth, ln) in [
        ("gru", 1, false),
        ("vanilla", 1, false),
        ("gru", 2, false),
        ("vanilla", 2, false),
        ("gru", 3, false),
        ("gru", 1, true),
        ("vanilla", 1, true),
        ("gru", 2, true),
    ] {
        for form in ["reference", "paper"] {
            // (gate settings, context scale that cancels z = 0.5, equivalent scaling of the ungated cell)
            let cases: Vec<(Vec<&str>, (f64, f64), (f64, f64))> = vec![
                (vec!["model.context_gate=source"], (2.0, 1.0), (0.5, 1.0)),
                (vec!["model.context_gate=target"], (1.0, 2.0), (1.0, 0.5)),
                (vec!["model.context_gate=both"], (2.0, 2.0), (0.5, 0.5)),
                (
                    vec!["model.context_gate=both", "model.gate_inputs=[\"state\"]"],
                    (2.0, 2.0),
                    (0.5, 0.5),
                ),
                (vec!["model.gating_scalar=true"], (2.0, 1.0), (0.5, 1.0)),
                (
                    vec!["model.static_interpolation=true"],
                    (2.0, 2.0),
                    (0.5, 0.5),
                ),
            ];
            for (sets, cancel, equiv) in cases {
                let (gated, plain, batch) = pair(dec, form, (depth, ln), &sets);
                let reference = states(&plain, &batch, (1.0, 1.0));
                let d = max_diff(&states(&gated, &batch, cancel), &reference);
                assert!(d < 1e-12, "{dec}/{form}/depth {depth}/ln {ln}/{sets:?}: z = 0.5 with scale {cancel:?} differs from ungated by {d}");
                let d = max_diff(
                    &states(&gated, &batch, (1.0, 1.0)),
                    &states(&plain, &batch, equiv),
                );
                assert!(
                    d < 1e-12,
                    "{dec}/{form}/depth {depth}/ln {ln}/{sets:?}: gate 0.5 ≠ ungated with scale {equiv:?} ({d})"
                );
                // And the gate really matters: without cancelling, the states differ.
                assert!(max_diff(&states(&gated, &batch, (1.0, 1.0)), &reference) > 1e-6);
            }
        }
    }
}

#[test]
fn context_scale_one_one_changes_nothing_and_zero_removes_the_source_context() {
    for (dec, depth) in [("gru", 1), ("vanilla", 1), ("gru", 2), ("vanilla", 3)] {
        for gate in ["none", "source", "target", "both"] {
            let cfg = tiny_model_config(&[
                &format!("model.decoder={dec}"),
                &format!("model.context_gate={gate}"),
                "model.gate_inputs=[\"word\",\"state\"]",
                &format!("model.decoder_transition_depth={depth}"),
            ]);
            let (m, vm) = Model::build(&cfg, 7, 6, 3, DType::F64, &Device::Cpu).unwrap();
            randomize(&vm, 8, 0.5);
            let batch = tiny_batch(9, 7, 6, DType::F64);
            // Scale (1,1) equals the training path (loss uses the unscaled transition).
            let a = states(&m, &batch, (1.0, 1.0));
            let t_prev = Tensor::randn(0.0f64, 1.0, (3, 4), &Device::Cpu).unwrap();
            let e = Tensor::randn(0.0f64, 1.0, (3, 3), &Device::Cpu).unwrap();
            let c1 = Tensor::randn(0.0f64, 1.0, (3, 8), &Device::Cpu).unwrap();
            let c2 = Tensor::randn(0.0f64, 1.0, (3, 8), &Device::Cpu).unwrap();
            let (c1, c2): (Context, Context) = ((&c1).into(), (&c2).into());
            let wp = m.cell.project_words(m.kernels, &e).unwrap();
            let wz = m.gate.word_term(m.kernels, &e).unwrap();
            let x = m
                .transition_terms(&t_prev, &wp, wz.as_ref(), &c1, (1.0, 1.0), None)
                .unwrap()
                .0;
            let y = m.transition(&t_prev, &e, &c1, (1.0, 1.0)).unwrap().0;
            assert!(max_diff(&[x], &[y]) == 0.0);
            assert_eq!(a.len(), batch.tgt.dim(1).unwrap());
            // (0, 1): the recurrence no longer sees the source context at all.
            let t1 = m.transition(&t_prev, &e, &c1, (0.0, 1.0)).unwrap().0;
            let t2 = m.transition(&t_prev, &e, &c2, (0.0, 1.0)).unwrap().0;
            assert!(
                max_diff(&[t1.clone()], &[t2]) == 0.0,
                "{dec}/{gate}: context leaks with scale (0,1)"
            );
            // while with (1, 1) it does.
            let u1 = m.transition(&t_prev, &e, &c1, (1.0, 1.0)).unwrap().0;
            let u2 = m.transition(&t_prev, &e, &c2, (1.0, 1.0)).unwrap().0;
            assert!(max_diff(&[u1], &[u2]) > 1e-6);
            // (1, 0) removes the target side: state and word do not matter.
            let e2 = Tensor::randn(0.0f64, 1.0, (3, 3), &Device::Cpu).unwrap();
            let tp2 = Tensor::randn(0.0f64, 1.0, (3, 4), &Device::Cpu).unwrap();
            if gate == "none" {
                // The GRU's interpolation (1−u)∘t' uses the scaled state t' = 0 in the reference form.
                let v1 = m.transition(&t_prev, &e, &c1, (1.0, 0.0)).unwrap().0;
                let v2 = m.transition(&tp2, &e2, &c1, (1.0, 0.0)).unwrap().0;
                assert!(
                    max_diff(&[v1], &[v2]) == 0.0,
                    "{dec}: target side leaks with scale (1,0)"
                );
            }
        }
    }
}

fn train_loss_curve(sets: &[&str], steps: usize) -> (f64, f64) {
    let cfg = Config::load(
        None,
        &[
            vec![
                "model.embedding_dim=32",
                "model.hidden_dim=48",
                "model.attention_dim=32",
            ],
            sets.to_vec(),
        ]
        .concat()
        .iter()
        .map(|s| s.to_string())
        .collect::<Vec<_>>(),
    )
    .unwrap();
    let d = data_dir().join("tatoeba-zh-en");
    let zh = std::fs::read_to_string(d.join("dev.zh")).unwrap();
    let en = std::fs::read_to_string(d.join("dev.en")).unwrap();
    // Character-level source and word-level target keep the test free of a tokenizer.
    let mut sv = std::collections::HashMap::new();
    let mut tv = std::collections::HashMap::new();
    let id = |m: &mut std::collections::HashMap<String, u32>, w: &str| {
        let n = m.len() as u32 + 2;
        *m.entry(w.to_string()).or_insert(n)
    };
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = zh
        .lines()
        .zip(en.lines())
        .take(160)
        .map(|(z, e)| {
            (
                z.chars().map(|c| id(&mut sv, &c.to_string())).collect(),
                e.split_whitespace().map(|w| id(&mut tv, w)).collect(),
            )
        })
        .collect();
    let (m, vm) = Model::build(
        &cfg.model,
        sv.len() + 2,
        tv.len() + 2,
        1,
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let vars = sorted_vars(&vm);
    let mut opt = Optimizer::new(&TrainConfig {
        optimizer: OptimizerKind::Adam,
        learning_rate: 0.005,
        ..Default::default()
    });
    let mut losses = vec![];
    for step in 0..steps {
        let chunk: Vec<&(Vec<u32>, Vec<u32>)> =
            pairs.iter().skip((step % 8) * 20).take(20).collect();
        let s: Vec<Vec<u32>> = chunk.iter().map(|p| p.0.clone()).collect();
        let t: Vec<Vec<u32>> = chunk.iter().map(|p| p.1.clone()).collect();
        let b = Batch::new(&s, &t, 0, DType::F32, &Device::Cpu).unwrap();
        let loss = m.loss(&b).unwrap();
        losses.push(loss.to_scalar::<f32>().unwrap() as f64 * 20.0 / b.tgt_tokens as f64);
        let g = m.backward(&loss).unwrap();
        opt.step(&vars, &g).unwrap();
    }
    let first: f64 = losses[..8].iter().sum::<f64>() / 8.0;
    let last: f64 = losses[steps - 8..].iter().sum::<f64>() / 8.0;
    (first, last)
}

#[test]
fn every_variant_learns_on_real_data() {
    let variants: Vec<Vec<&str>> = vec![
        vec!["model.decoder=gru", "model.context_gate=none"],
        vec!["model.decoder=gru", "model.context_gate=source"],
        vec!["model.decoder=gru", "model.context_gate=target"],
        vec!["model.decoder=gru", "model.context_gate=both"],
        vec![
            "model.decoder=gru",
            "model.context_gate=both",
            "model.gate_form=paper",
        ],
        vec![
            "model.decoder=gru",
            "model.context_gate=both",
            "model.gate_inputs=[\"state\"]",
        ],
        vec![
            "model.decoder=gru",
            "model.context_gate=none",
            "model.gating_scalar=true",
        ],
        vec![
            "model.decoder=gru",
            "model.context_gate=none",
            "model.static_interpolation=true",
        ],
        vec!["model.decoder=vanilla", "model.context_gate=none"],
        vec!["model.decoder=vanilla", "model.context_gate=both"],
        vec!["model.decoder=cgru", "model.context_gate=none"],
        vec!["model.decoder=cgru", "model.context_gate=both"],
        vec![
            "model.context_gate=none",
            "model.coverage=linguistic",
            "model.coverage_dim=1",
        ],
        vec!["model.context_gate=both", "model.coverage=neural"],
        vec!["model.context_gate=both", "model.encoder_layers=2"],
        vec![
            "model.context_gate=both",
            "model.encoder_layers=3",
            "model.residual=false",
        ],
        vec![
            "model.context_gate=both",
            "model.decoder_transition_depth=2",
        ],
        vec![
            "model.decoder=cgru",
            "model.context_gate=both",
            "model.decoder_transition_depth=3",
            "model.encoder_layers=2",
        ],
        vec![
            "model.context_gate=both",
            "model.encoder_layers=2",
            "model.encoder_type=\"bi-unidirectional\"",
        ],
        vec!["model.context_gate=both", "model.layer_norm=true"],
        vec![
            "model.decoder=cgru",
            "model.context_gate=both",
            "model.layer_norm=true",
            "model.decoder_transition_depth=2",
            "model.encoder_layers=2",
        ],
    ];
    for v in variants {
        let (first, last) = train_loss_curve(&v, 64);
        assert!(
            last < first * 0.8,
            "{v:?}: loss per token {first:.3} → {last:.3}"
        );
    }
}

/// Beam search carries coverage (and the cGRU's state) per hypothesis: batched decoding equals one sentence at a
/// time, and the recorded attention, gates and coverage have the right shapes.
#[test]
fn batched_beam_search_equals_single_with_coverage_and_cgru() {
    use cgnmt::decode::beam_search::{beam_search, DecodeOptions};
    let cases: Vec<Vec<&str>> = vec![
        vec![
            "model.coverage=neural",
            "model.coverage_dim=3",
            "model.context_gate=both",
        ],
        vec![
            "model.coverage=linguistic",
            "model.coverage_dim=1",
            "model.context_gate=none",
        ],
        vec!["model.decoder=cgru", "model.context_gate=both"],
    ];
    for sets in cases {
        let mut all = vec![
            "model.embedding_dim=8",
            "model.hidden_dim=12",
            "model.attention_dim=8",
        ];
        all.extend(sets.iter().copied());
        let cfg =
            Config::load(None, &all.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        let (m, vm) = Model::build(&cfg.model, 30, 25, 2, DType::F32, &Device::Cpu).unwrap();
        randomize(&vm, 6, 0.6);
        let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(4);
        let srcs = random_seqs(&mut rng, 9, 30, 1, 9);
        let opts = DecodeOptions {
            beam: 4,
            nbest: 4,
            record: true,
            ..Default::default()
        };
        let batched = beam_search(&m, &srcs, 0, &opts).unwrap();
        for (i, s) in srcs.iter().enumerate() {
            let single = beam_search(&m, std::slice::from_ref(s), 0, &opts).unwrap();
            let a: Vec<&Vec<u32>> = batched[i].iter().map(|h| &h.tokens).collect();
            let b: Vec<&Vec<u32>> = single[0].iter().map(|h| &h.tokens).collect();
            assert_eq!(a, b, "{sets:?}: sentence {i}");
            let h = &batched[i][0];
            // One row per emitted word: the tokens, plus EOS unless the hypothesis stopped at the length limit.
            assert!(
                h.attention.len() == h.tokens.len() + 1 || h.attention.len() == h.tokens.len(),
                "{sets:?}"
            );
            assert!(h.attention.iter().all(|r| r.len() == s.len() + 1));
            for row in &h.attention {
                let sum: f32 = row.iter().sum();
                assert!((sum - 1.0).abs() < 1e-4);
            }
            if cfg.model.coverage != cgnmt::config::CoverageKind::None {
                assert_eq!(h.coverage.len(), s.len() + 1);
            }
            if cfg.model.context_gate != cgnmt::config::ContextGate::None {
                assert_eq!(
                    h.gates.len(),
                    h.tokens.len(),
                    "{sets:?}: one gate value per emitted word"
                );
            }
        }
        // Linguistic coverage without fertility is exactly the sum of past attention.
        if sets.contains(&"model.coverage=linguistic") {
            let cfg2 = Config::load(
                None,
                &[
                    "model.embedding_dim=8",
                    "model.hidden_dim=12",
                    "model.attention_dim=8",
                    "model.coverage=linguistic",
                    "model.coverage_dim=1",
                    "model.coverage_fertility=false",
                    "model.context_gate=none",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>(),
            )
            .unwrap();
            let (m2, vm2) = Model::build(&cfg2.model, 30, 25, 2, DType::F32, &Device::Cpu).unwrap();
            randomize(&vm2, 7, 0.6);
            let out = beam_search(
                &m2,
                &srcs[..1],
                0,
                &DecodeOptions {
                    beam: 1,
                    record: true,
                    ..Default::default()
                },
            )
            .unwrap();
            let h = &out[0][0];
            for j in 0..srcs[0].len() + 1 {
                // Coverage is recorded after the last emitted word (EOS included when it finished).
                let sum: f32 = h.attention.iter().map(|r| r[j]).sum();
                assert!(
                    (sum - h.coverage[j]).abs() < 1e-4,
                    "coverage {} vs summed attention {sum}",
                    h.coverage[j]
                );
            }
        }
    }
}
