//! The whole model with fused kernels against the composed reference, in every variant and at the edges.

use super::*;

#[test]
fn whole_model_fused_equals_reference_for_every_variant() {
    // And, in training only (the fused decoder op), layer normalisation in the paper form of the GRU and
    // vanilla decoders with a deep transition and coverage.
    let more = ["gru", "vanilla"].map(|dec| {
        [
            "model.layer_norm=true",
            &format!("model.decoder={dec}"),
            "model.gate_form=paper",
            "model.decoder_transition_depth=2",
            "model.coverage=neural",
            "model.coverage_dim=2",
        ]
        .map(String::from)
        .to_vec()
    });
    for sets in variants().into_iter().chain(more) {
        let cfg = tiny_model(&sets);
        for (dtype, lt, gt) in [(DType::F64, 1e-12, 1e-9), (DType::F32, 1e-5, 2e-3)] {
            assert_same(
                &format!("{sets:?} {dtype:?}"),
                &loss_and_grads(&cfg, Kernels::Fused, dtype),
                &loss_and_grads(&cfg, Kernels::Reference, dtype),
                (lt, gt),
            );
        }
    }
}

/// `Batch::new` orders the sentences by decreasing target length, and the fused decoder and readout then
/// compute the words' rows only. A batch in another order (rows reversed: lengths increasing), or with a
/// mask that is not words then padding (a masked word inside a sentence), takes the all-rows path under the
/// mask: the same loss and gradients as the reference kernels.
#[test]
fn fused_path_takes_any_row_order_and_mask() {
    let mut rng = StdRng::seed_from_u64(21);
    let src = random_seqs(&mut rng, 5, 11, 1, 6);
    let tgt = random_seqs(&mut rng, 5, 9, 1, 6);
    for sets in [
        vec![],
        vec!["model.decoder=cgru".to_string()],
        vec!["model.coverage=neural".to_string()],
    ] {
        let cfg = tiny_model(&sets);
        let dtype = DType::F64;
        let sorted = Batch::new(&src, &tgt, 0, dtype, &Device::Cpu).unwrap();
        let lens: Vec<f64> = sorted.tgt_mask.sum(1).unwrap().to_vec1().unwrap();
        assert!(
            lens.windows(2).all(|w| w[0] >= w[1]) && lens[0] > lens[4],
            "{lens:?}"
        );
        let rev = Tensor::new(&[4u32, 3, 2, 1, 0], &Device::Cpu).unwrap();
        let pick = |x: &Tensor| x.index_select(&rev, 0).unwrap();
        let reversed = Batch {
            src: pick(&sorted.src),
            src_mask: pick(&sorted.src_mask),
            tgt: pick(&sorted.tgt),
            tgt_mask: pick(&sorted.tgt_mask),
            tgt_tokens: sorted.tgt_tokens,
            keys: sorted.keys.iter().rev().copied().collect(),
            tgt_in: None,
            alignment: None,
        };
        // Sentence 0's second word masked out.
        let mut m: Vec<f64> = sorted.tgt_mask.flatten_all().unwrap().to_vec1().unwrap();
        m[1] = 0.0;
        let holed = Batch {
            src: sorted.src.clone(),
            src_mask: sorted.src_mask.clone(),
            tgt: sorted.tgt.clone(),
            tgt_mask: Tensor::from_vec(m, sorted.tgt_mask.dims(), &Device::Cpu).unwrap(),
            tgt_tokens: sorted.tgt_tokens - 1,
            keys: sorted.keys.clone(),
            tgt_in: None,
            alignment: None,
        };
        let (l_sorted, _) = loss_and_grads_for(&cfg, Kernels::Reference, dtype, &sorted, false);
        for (what, batch) in [
            ("sorted", &sorted),
            ("reversed", &reversed),
            ("holed", &holed),
        ] {
            let fused = loss_and_grads_for(&cfg, Kernels::Fused, dtype, batch, false);
            assert_same(
                &format!("{sets:?} {what}"),
                &fused,
                &loss_and_grads_for(&cfg, Kernels::Reference, dtype, batch, false),
                (1e-12, 1e-9),
            );
            let lf = fused.0;
            if what != "holed" {
                // The row order does not change the loss.
                assert!(
                    ((lf - l_sorted) / l_sorted).abs() < 1e-12,
                    "{what}: {lf} vs {l_sorted}"
                );
            }
        }
    }
}

/// Under dropout, a batch split in shares (as MPI ranks split the global batch, each padded to its own
/// lengths) gives, weighted by the shares' sizes, the whole batch's loss and gradients: each sentence's masks
/// follow its key, not its row or its batch. Every dropout kind, label smoothing, tied embeddings; fused and
/// composed kernels.
#[test]
fn dropout_masks_follow_the_sentence_across_any_split_of_the_batch() {
    let mut rng = StdRng::seed_from_u64(29);
    let src = random_seqs(&mut rng, 7, 11, 1, 7);
    let tgt = random_seqs(&mut rng, 7, 9, 1, 7);
    let keys: Vec<u64> = vec![310, 4, 77, 1202, 5, 6, 90];
    let opts = cgnmt::model::LossOptions {
        target_padding: TargetPadding::Skipped,
        label_smoothing: 0.1,
        dropout: Some(cgnmt::model::dropout::Dropout {
            embeddings: 0.2,
            annotations: 0.3,
            readout: 0.25,
            recurrent: 0.3,
            seed: cgnmt::model::dropout::Dropout::step_seed(1, 12),
        }),
        guided: None,
    };
    for (sets, kernels) in [
        (vec!["model.context_gate=both"], Kernels::Fused),
        (
            vec!["model.decoder=cgru", "model.context_gate=both"],
            Kernels::Fused,
        ),
        (
            vec![
                "model.coverage=neural",
                "model.context_gate=both",
                "model.tied_output_embeddings=true",
            ],
            Kernels::Fused,
        ),
        (vec!["model.context_gate=both"], Kernels::Reference),
        (
            vec![
                "model.layer_norm=true",
                "model.decoder_transition_depth=2",
                "model.context_gate=both",
            ],
            Kernels::Fused,
        ),
    ] {
        let cfg = tiny_model(&sets.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        let (mut model, varmap) = Model::build(&cfg, 11, 9, 7, DType::F64, &Device::Cpu).unwrap();
        model.set_kernels(kernels);
        randomize(&varmap, 8, 0.4);
        let vars = sorted_vars(&varmap);
        // The loss times the share's size (the ranks' weighting) and its gradients.
        let run = |rows: &[usize]| -> (f64, Vec<Vec<f64>>) {
            let pick = |x: &[Vec<u32>]| rows.iter().map(|&i| x[i].clone()).collect::<Vec<_>>();
            let k: Vec<u64> = rows.iter().map(|&i| keys[i]).collect();
            let batch =
                Batch::keyed(&pick(&src), &pick(&tgt), &k, 0, DType::F64, &Device::Cpu).unwrap();
            let loss = model.loss_with(&batch, &opts).unwrap();
            let g = model.backward(&loss).unwrap();
            let w = rows.len() as f64;
            let grads = vars
                .iter()
                .map(|(_, v)| match g.get(v.as_tensor()) {
                    Some(t) => (t * w).unwrap().flatten_all().unwrap().to_vec1().unwrap(),
                    None => vec![0.0; v.elem_count()],
                })
                .collect();
            (loss.to_scalar::<f64>().unwrap() * w, grads)
        };
        let whole = run(&[0, 1, 2, 3, 4, 5, 6]);
        for shares in [
            vec![vec![0, 2, 4, 6], vec![1, 3, 5]],
            vec![vec![6, 3, 0], vec![4, 1], vec![5, 2]],
        ] {
            let parts: Vec<_> = shares.iter().map(|r| run(r)).collect();
            let loss: f64 = parts.iter().map(|p| p.0).sum();
            assert!(
                (loss - whole.0).abs() < 1e-10 * whole.0.abs(),
                "{sets:?} {shares:?}: {loss} against {}",
                whole.0
            );
            for (k, (name, _)) in vars.iter().enumerate() {
                for (j, x) in whole.1[k].iter().enumerate() {
                    let y: f64 = parts.iter().map(|p| p.1[k][j]).sum();
                    assert!(
                        (x - y).abs() <= 1e-9 * (1.0 + x.abs()),
                        "{sets:?} {shares:?} {name}[{j}]: {y} against {x}"
                    );
                }
            }
        }
        // And it is dropout: another update's masks give another loss.
        let other = cgnmt::model::LossOptions {
            dropout: opts.dropout.map(|d| cgnmt::model::dropout::Dropout {
                seed: cgnmt::model::dropout::Dropout::step_seed(1, 13),
                ..d
            }),
            ..opts
        };
        let batch = Batch::keyed(&src, &tgt, &keys, 0, DType::F64, &Device::Cpu).unwrap();
        let l2 = model
            .loss_with(&batch, &other)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
        assert!(
            (l2 * 7.0 - whole.0).abs() > 1e-6,
            "{sets:?}: masks did not change"
        );
    }
}

/// `train.target_padding`: computing the padded target positions under the mask gives the loss and gradients
/// of skipping them (the fused decoder, readout and output layer over the words' rows only).
#[test]
fn target_padding_computed_equals_skipped() {
    let mut rng = StdRng::seed_from_u64(23);
    let src = random_seqs(&mut rng, 6, 11, 1, 7);
    let tgt = random_seqs(&mut rng, 6, 9, 1, 7);
    for sets in [
        vec![],
        vec!["model.context_gate=both".to_string()],
        vec!["model.decoder=cgru".to_string()],
    ] {
        let cfg = tiny_model(&sets);
        let batch = Batch::new(&src, &tgt, 0, DType::F64, &Device::Cpu).unwrap();
        let lens: Vec<f64> = batch.tgt_mask.sum(1).unwrap().to_vec1().unwrap();
        assert!(lens[0] > lens[5], "the batch has target padding: {lens:?}");
        let run = |padding: TargetPadding| {
            let (model, varmap) = Model::build(&cfg, 11, 9, 7, DType::F64, &Device::Cpu).unwrap();
            assert_eq!(model.kernels, Kernels::Fused);
            randomize(&varmap, 8, 0.4);
            let loss = model
                .loss_with(
                    &batch,
                    &cgnmt::model::LossOptions {
                        target_padding: padding,
                        ..Default::default()
                    },
                )
                .unwrap();
            let g = model.backward(&loss).unwrap();
            let grads = sorted_vars(&varmap)
                .into_iter()
                .map(|(n, v)| (n, g.get(v.as_tensor()).expect("gradient").clone()))
                .collect::<Vec<_>>();
            (loss.to_scalar::<f64>().unwrap(), grads)
        };
        assert_same(
            &format!("{sets:?}"),
            &run(TargetPadding::Computed),
            &run(TargetPadding::Skipped),
            (1e-12, 1e-9),
        );
    }
}

/// The fused sequence ops at their edges: one sentence, one-word sources, empty targets (a single step, EOS,
/// so no transition), all equal to the reference kernels.
#[test]
fn fused_sequence_ops_at_the_edges_equal_reference() {
    // One-word sources and targets (one decoder step, no transition), empty targets, mixed lengths; GRU,
    // vanilla and cGRU decoders (the cGRU's last step has no word GRU), with and without coverage.
    let coverage: [&[&str]; 8] = [
        &[],
        &[
            "model.coverage=linguistic",
            "model.coverage_dim=1",
            "model.coverage_fertility=true",
        ],
        &["model.coverage=neural", "model.coverage_dim=2"],
        &["model.decoder=vanilla"],
        &[
            "model.decoder=vanilla",
            "model.coverage=neural",
            "model.coverage_dim=2",
        ],
        &["model.decoder=cgru"],
        &["model.decoder=cgru", "model.gate_form=paper"],
        &[
            "model.decoder=cgru",
            "model.coverage=linguistic",
            "model.coverage_dim=1",
            "model.coverage_fertility=true",
        ],
    ];
    for cov in coverage {
        let mut sets = vec![
            "model.embedding_dim=6".to_string(),
            "model.hidden_dim=10".into(),
            "model.attention_dim=7".into(),
            "model.context_gate=both".into(),
        ];
        sets.extend(cov.iter().map(|s| s.to_string()));
        let cfg = cgnmt::config::Config::load(None, &sets).unwrap().model;
        let batches: Vec<(Vec<Vec<u32>>, Vec<Vec<u32>>)> = vec![
            (vec![vec![3]], vec![vec![]]),
            (vec![vec![3]], vec![vec![4, 5, 6]]),
            (vec![vec![3, 4, 5, 6], vec![7]], vec![vec![], vec![]]),
            (
                vec![vec![3, 4], vec![5], vec![6, 7, 8]],
                vec![vec![2], vec![], vec![3, 4]],
            ),
        ];
        for (src, tgt) in &batches {
            assert_same(
                &format!("{cov:?} {src:?} → {tgt:?}"),
                &loss_and_grads_on(&cfg, Kernels::Fused, DType::F64, src, tgt, true),
                &loss_and_grads_on(&cfg, Kernels::Reference, DType::F64, src, tgt, true),
                (1e-12, 1e-9),
            );
        }
    }
}
