//! Every fused kernel against its composed reference: forward values equal to 1e-5 relative (f32) and
//! gradients equal (f32 to 1e-4, f64 to 1e-10), op by op and for the whole model in every decoder, gate and
//! coverage variant; decoding gives the same translations with either kernel set.

mod common;

use candle_core::{DType, Device, Tensor, Var};
use cgnmt::config::TargetPadding;
use cgnmt::decode::beam_search::{beam_search, greedy, DecodeOptions};
use cgnmt::kernels::{max_rel_diff, rec_matmul, Kernels};
use cgnmt::model::attention::{
    scores_fused, scores_reference, softmax_context_fused, softmax_context_reference,
};
use cgnmt::model::gru::{gru_update_fused, gru_update_reference};
use cgnmt::model::readout::{
    log_normaliser, log_softmax, maxout_fused, maxout_reference, output_nll_fused,
    output_nll_reference,
};
use cgnmt::model::{Batch, Model};
use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

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

#[test]
fn fused_ops_match_their_composed_reference() {
    for (dtype, ft, gt) in [(DType::F32, 1e-5, 1e-4), (DType::F64, 1e-12, 1e-10)] {
        let mut rng = StdRng::seed_from_u64(1);
        // Attention scores, with shapes that leave a remainder after the 8-lane loops.
        let (b, s, ad) = (5, 7, 37);
        let vars = [
            rand_var(&mut rng, &[b, s, ad], 1.5, dtype),
            rand_var(&mut rng, &[b, ad], 1.5, dtype),
            rand_var(&mut rng, &[ad, 1], 1.0, dtype),
        ];
        compare(
            dtype,
            &vars,
            &|x| vec![scores_fused(&x[0], &x[1], &x[2]).unwrap()],
            &|x| vec![scores_reference(&x[0], &x[1], &x[2]).unwrap()],
            ft,
            gt,
            "attention scores",
        );
        // x W + b as one node (a row count and widths that leave remainders).
        let vars = [
            rand_var(&mut rng, &[19, 13], 1.5, dtype),
            rand_var(&mut rng, &[13, 21], 1.0, dtype),
            rand_var(&mut rng, &[21], 1.0, dtype),
        ];
        compare(
            dtype,
            &vars,
            &|x| vec![cgnmt::kernels::linear(Kernels::Fused, &x[0], &x[1], &x[2]).unwrap()],
            &|x| vec![x[0].matmul(&x[1]).unwrap().broadcast_add(&x[2]).unwrap()],
            ft,
            gt,
            "linear",
        );
        // The same over some rows only, as a compact shared input read by a consumer that adds its gradient
        // into the handle: the reference's selected rows; the other rows of x get zero gradient.
        let picked = [0usize, 3, 4, 9, 18];
        let idx = Tensor::new(&[0u32, 3, 4, 9, 18], &Device::Cpu).unwrap();
        compare(
            dtype,
            &vars,
            &|x| {
                let rows = std::sync::Arc::new(picked.to_vec());
                let y =
                    cgnmt::kernels::linear_shared_rows(&x[0], &x[1], &x[2], Some(rows)).unwrap();
                vec![cgnmt::kernels::shared_rows(&y, (0..picked.len()).collect(), 0..21).unwrap()]
            },
            &|x| {
                let xr = x[0].index_select(&idx, 0).unwrap();
                vec![xr.matmul(&x[1]).unwrap().broadcast_add(&x[2]).unwrap()]
            },
            ft,
            gt,
            "linear over rows",
        );
        // The shared product over some rows of a shared input (the words' keys from the annotations' handle):
        // the reference's selected rows, and the product over all rows.
        for rows in [Some(&picked[..]), None] {
            compare(
                dtype,
                &vars[..2],
                &|x| {
                    let sx = cgnmt::kernels::Shared::new(&x[0]).unwrap();
                    let y = cgnmt::kernels::product_shared_rows(
                        &sx,
                        &x[1],
                        rows.map(|r| std::sync::Arc::new(r.to_vec())),
                    )
                    .unwrap();
                    let n = y.tensor.dim(0).unwrap();
                    vec![cgnmt::kernels::shared_rows(&y, (0..n).collect(), 0..21).unwrap()]
                },
                &|x| {
                    let xr = match rows {
                        Some(_) => x[0].index_select(&idx, 0).unwrap(),
                        None => x[0].clone(),
                    };
                    vec![xr.matmul(&x[1]).unwrap()]
                },
                ft,
                gt,
                "shared product over rows",
            );
        }
        // The readout over the decoder op's rows against its composed form on the shifted embeddings (3
        // sentences of 4 steps; widths that leave remainders).
        let (nb, tl, h, ed) = (3usize, 4usize, 6usize, 5usize);
        let n = nb * tl;
        let vars = [
            rand_var(&mut rng, &[n, 3 * h], 1.0, dtype),
            rand_var(&mut rng, &[n, ed], 1.0, dtype),
            rand_var(&mut rng, &[h, h], 0.5, dtype),
            rand_var(&mut rng, &[2 * h, h], 0.5, dtype),
            rand_var(&mut rng, &[ed, h], 0.5, dtype),
            rand_var(&mut rng, &[h], 0.5, dtype),
            rand_var(&mut rng, &[h / 2, ed], 0.5, dtype),
        ];
        let readout = |x: &[Tensor]| cgnmt::model::readout::Readout {
            u_o: x[2].clone(),
            w_o: x[3].clone(),
            v_o: x[4].clone(),
            b_o: x[5].clone(),
            w_1: x[6].clone(),
            w_2: x[6].t().unwrap(),
            b: x[5].clone(),
            hidden: h,
        };
        // The composed readout over every row, reading the shifted embeddings e(y_{i−1}).
        let reference_rows = |x: &[Tensor]| {
            let ro = readout(x);
            let e3 = x[1].reshape((nb, tl, ed)).unwrap();
            let zeros = Tensor::zeros((nb, 1, ed), dtype, &Device::Cpu).unwrap();
            let e_prev = Tensor::cat(&[&zeros, &e3.narrow(1, 0, tl - 1).unwrap()], 1)
                .unwrap()
                .reshape((n, ed))
                .unwrap();
            ro.hidden_stacked(Kernels::Reference, &x[0], &e_prev)
                .unwrap()
        };
        compare(
            dtype,
            &vars,
            &|x| {
                let ro = readout(x);
                vec![cgnmt::model::readout::hidden_rows_fused(&ro, &x[0], &x[1], tl, None).unwrap()]
            },
            &|x| vec![reference_rows(x)],
            ft,
            gt,
            "readout rows",
        );
        // The words' rows only (sentences of 4, 2 and 3 steps): the reference's rows, selected.
        let lens = [4usize, 2, 3];
        let rows: Vec<u32> = lens
            .iter()
            .enumerate()
            .flat_map(|(b, &l)| (b * tl..b * tl + l).map(|r| r as u32))
            .collect();
        let rows = Tensor::new(rows.as_slice(), &Device::Cpu).unwrap();
        compare(
            dtype,
            &vars,
            &|x| {
                let ro = readout(x);
                vec![
                    cgnmt::model::readout::hidden_rows_fused(&ro, &x[0], &x[1], tl, Some(&lens))
                        .unwrap(),
                ]
            },
            &|x| vec![reference_rows(x).index_select(&rows, 0).unwrap()],
            ft,
            gt,
            "readout over the words' rows",
        );
        // Embedding rows, with repeated ids (their gradients add) and rows never used (zero gradient).
        let ids = Tensor::new(&[3u32, 0, 3, 6, 1, 3, 0], &Device::Cpu).unwrap();
        let vars = [rand_var(&mut rng, &[8, 5], 1.0, dtype)];
        let ids2 = ids.clone();
        compare(
            dtype,
            &vars,
            &|x| vec![cgnmt::kernels::embedding(Kernels::Fused, &x[0], &ids).unwrap()],
            &|x| vec![x[0].embedding(&ids2).unwrap()],
            ft,
            gt,
            "embedding",
        );
        // Softmax + context, with masked positions.
        let mask: Vec<f64> = (0..b * s)
            .map(|i| if i % s >= s - (i / s) % 3 { -1e9 } else { 0.0 })
            .collect();
        let mask = Tensor::from_vec(mask, (b, s), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let vars = [
            rand_var(&mut rng, &[b, s], 3.0, dtype),
            rand_var(&mut rng, &[b, s, 2 * 13], 1.0, dtype),
        ];
        let m2 = mask.clone();
        compare(
            dtype,
            &vars,
            &|x| {
                let (a, c) = softmax_context_fused(&(&x[0] + &mask).unwrap(), &x[1]).unwrap();
                vec![a, c]
            },
            &|x| {
                let (a, c) = softmax_context_reference(&(&x[0] + &m2).unwrap(), &x[1]).unwrap();
                vec![a, c]
            },
            ft,
            gt,
            "attention softmax + context",
        );
        // GRU update, with and without a padding mask.
        let h = 19;
        let vars = [
            rand_var(&mut rng, &[b, 2 * h], 1.0, dtype)
                .as_tensor()
                .affine(0.5, 0.5)
                .map(|t| Var::from_tensor(&t).unwrap())
                .unwrap(),
            rand_var(&mut rng, &[b, h], 2.0, dtype),
            rand_var(&mut rng, &[b, h], 1.0, dtype),
        ];
        let m = Tensor::from_vec(vec![1.0, 0.0, 1.0, 1.0, 0.0], (b, 1), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        for mask in [None, Some(&m)] {
            compare(
                dtype,
                &vars,
                &|x| vec![gru_update_fused(&x[0], &x[1], &x[2], mask).unwrap()],
                &|x| vec![gru_update_reference(&x[0], &x[1], &x[2], mask).unwrap()],
                ft,
                gt,
                "GRU update",
            );
        }
        // The gate's scales on word and context terms (3 blocks), every strategy, with decode-time constants.
        use cgnmt::model::gate::{
            mix_fused, mix_reference, GateKinds, GateMix, Scale, Scales, ZKind,
        };
        for (ks, kt) in [
            (ZKind::Z, ZKind::One),
            (ZKind::One, ZKind::Z),
            (ZKind::Z, ZKind::OneMinusZ),
        ] {
            let vars = [
                rand_var(&mut rng, &[b, 3 * h], 1.0, dtype),
                rand_var(&mut rng, &[b, 3 * h], 1.0, dtype),
                Var::from_tensor(
                    &rand_var(&mut rng, &[b, h], 1.0, dtype)
                        .as_tensor()
                        .affine(0.4, 0.5)
                        .unwrap(),
                )
                .unwrap(),
            ];
            let (ca, cb) = (0.7, 1.3);
            let scale = |k: ZKind, c: f64, z: &Tensor| match k {
                ZKind::One => Scale::Const(c),
                ZKind::Z => Scale::T(z.affine(c, 0.0).unwrap()),
                ZKind::OneMinusZ => Scale::T(z.affine(-c, c).unwrap()),
            };
            compare(
                dtype,
                &vars,
                &|x| {
                    let m = GateMix {
                        z: x[2].clone(),
                        kinds: GateKinds {
                            src: (ks, ca),
                            tgt: (kt, cb),
                        },
                    };
                    vec![mix_fused(&x[0], &x[1], &m).unwrap()]
                },
                &|x| {
                    let sc = Scales {
                        src: scale(ks, ca, &x[2]),
                        tgt: scale(kt, cb, &x[2]),
                        gate: None,
                        mix: None,
                    };
                    vec![mix_reference(&x[0], &x[1], &sc, 3).unwrap()]
                },
                ft,
                gt,
                "gate mix",
            );
        }
        // The output layer with its loss (log-softmax + NLL), and the inference log-softmax. The op keeps its
        // logits buffer for the next pass: the shapes grow, shrink (a kept buffer with stale contents) and
        // grow again, and one pass is forward only (its buffer is kept when the op is dropped).
        let e = 11;
        for (n, v) in [(9, 301), (23, 301), (4, 57), (9, 301)] {
            let tg: Vec<u32> = (0..n).map(|_| rng.random_range(0..v as u32)).collect();
            let tg = Tensor::from_vec(tg, n, &Device::Cpu).unwrap();
            let vars2 = [
                rand_var(&mut rng, &[n, e], 1.0, dtype),
                rand_var(&mut rng, &[e, v], 1.0, dtype),
                rand_var(&mut rng, &[v], 1.0, dtype),
            ];
            if n == 4 {
                let x: Vec<&Tensor> = vars2.iter().map(|x| x.as_tensor()).collect();
                let fwd = output_nll_fused(x[0], x[1], x[2], &tg).unwrap();
                let refr = output_nll_reference(x[0], x[1], x[2], &tg).unwrap();
                let d = max_rel_diff(&fwd, &refr).unwrap();
                assert!(d < ft, "output layer + NLL, forward only: differs by {d:e}");
            }
            compare(
                dtype,
                &vars2,
                &|x| vec![output_nll_fused(&x[0], &x[1], &x[2], &tg).unwrap()],
                &|x| vec![output_nll_reference(&x[0], &x[1], &x[2], &tg).unwrap()],
                ft,
                gt,
                "output layer + NLL",
            );
            // With label smoothing (ε = 0.1, and ε = 0 is the plain loss).
            use cgnmt::model::readout::{output_nll_smoothed_fused, output_nll_smoothed_reference};
            compare(
                dtype,
                &vars2,
                &|x| vec![output_nll_smoothed_fused(&x[0], &x[1], &x[2], &tg, 0.1).unwrap()],
                &|x| vec![output_nll_smoothed_reference(&x[0], &x[1], &x[2], &tg, 0.1).unwrap()],
                ft,
                gt,
                "output layer + label-smoothed NLL",
            );
            let x: Vec<&Tensor> = vars2.iter().map(|x| x.as_tensor()).collect();
            let plain = output_nll_fused(x[0], x[1], x[2], &tg).unwrap();
            let zero = output_nll_smoothed_fused(x[0], x[1], x[2], &tg, 0.0).unwrap();
            assert_eq!(max_rel_diff(&plain, &zero).unwrap(), 0.0);
            let smoothed = output_nll_smoothed_fused(x[0], x[1], x[2], &tg, 0.1).unwrap();
            assert!(max_rel_diff(&smoothed, &plain).unwrap() > 1e-3);
        }
        let (n, v) = (9, 301);
        let vars = [rand_var(&mut rng, &[n, v], 8.0, dtype)];
        let mut r = rand_var(&mut rng, &[n, 14], 1.0, dtype)
            .as_tensor()
            .to_dtype(DType::F64)
            .unwrap()
            .to_vec2::<f64>()
            .unwrap();
        r[0][3] = r[0][2];
        r[4][0] = r[4][1];
        let r = Var::from_tensor(
            &Tensor::new(r, &Device::Cpu)
                .unwrap()
                .to_dtype(dtype)
                .unwrap(),
        )
        .unwrap();
        compare(
            dtype,
            &[r],
            &|x| vec![maxout_fused(&x[0]).unwrap()],
            &|x| vec![maxout_reference(&x[0]).unwrap()],
            ft,
            gt,
            "maxout",
        );
        // The sigmoid over a row count and width that leave remainders after the 8-lane loops.
        let x = rand_var(&mut rng, &[13, 37], 6.0, dtype);
        compare(
            dtype,
            &[x],
            &|x| vec![cgnmt::kernels::sigmoid(Kernels::Fused, &x[0]).unwrap()],
            &|x| vec![candle_nn::ops::sigmoid(&x[0]).unwrap()],
            ft,
            gt,
            "sigmoid",
        );
        // Beam search's normaliser: logit − log Σ exp equals the reference log-softmax.
        if dtype == DType::F32 {
            let x = vars[0].as_tensor();
            let rows = x.to_vec2::<f32>().unwrap();
            let lp: Vec<Vec<f32>> = rows
                .iter()
                .map(|r| {
                    let z = log_normaliser(r);
                    r.iter().map(|v| v - z).collect()
                })
                .collect();
            let lp = Tensor::new(lp, &Device::Cpu).unwrap();
            let d = max_rel_diff(&lp, &log_softmax(x).unwrap()).unwrap();
            assert!(d < ft, "beam search's log normaliser differs by {d:e}");
        }
    }
}

#[test]
fn prepared_weight_gradients_equal_per_step_gradients() {
    // h_{t+1} = tanh(h_t W + x_t) with W prepared for the pass: its gradient is formed by one GEMM over the
    // steps when the backward pass reaches it.
    let mut rng = StdRng::seed_from_u64(5);
    let dtype = DType::F64;
    let w = rand_var(&mut rng, &[6, 6], 0.5, dtype);
    let xs: Vec<Var> = (0..4)
        .map(|_| rand_var(&mut rng, &[3, 6], 1.0, dtype))
        .collect();
    let run = |k: Kernels| {
        cgnmt::kernels::begin_pass(k, &[w.as_tensor()]).unwrap();
        let mut h = Tensor::zeros((3, 6), dtype, &Device::Cpu).unwrap();
        for x in &xs {
            h = (rec_matmul(k, &h, w.as_tensor()).unwrap() + x.as_tensor())
                .unwrap()
                .tanh()
                .unwrap();
        }
        let loss = h.sqr().unwrap().sum_all().unwrap();
        let g = loss.backward().unwrap();
        cgnmt::kernels::end_pass();
        let gw = g.get(w.as_tensor()).unwrap().clone();
        let gx = g.get(xs[0].as_tensor()).unwrap().clone();
        (gw, gx)
    };
    let (fw, fx) = run(Kernels::Fused);
    let (rw, rx) = run(Kernels::Reference);
    assert!(max_rel_diff(&fw, &rw).unwrap() < 1e-12);
    assert!(max_rel_diff(&fx, &rx).unwrap() < 1e-12);
    assert!(
        rw.abs()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
            > 1e-3
    );
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

#[test]
fn whole_model_fused_equals_reference_for_every_variant() {
    for sets in variants() {
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

#[test]
fn fused_and_reference_decoding_agree() {
    for sets in variants() {
        let (model, varmap) = decoding_model(&sets, 4);
        let mut rng = StdRng::seed_from_u64(6);
        let srcs = random_seqs(&mut rng, 7, 30, 1, 9);
        let mut outs = vec![];
        for k in [Kernels::Fused, Kernels::Reference] {
            let mut m = model.frozen(&varmap).unwrap();
            m.set_kernels(k);
            let beam = beam_search(
                &m,
                &srcs,
                0,
                &DecodeOptions {
                    beam: 5,
                    nbest: 3,
                    ..Default::default()
                },
            )
            .unwrap();
            let gr = greedy(&m, &srcs, 0, (1.0, 1.0)).unwrap();
            outs.push((beam, gr));
        }
        // The fused logits rows against the composed logits.
        let m = model.frozen(&varmap).unwrap();
        let (ids, mask) = cgnmt::model::pad(&srcs, 0, DType::F32, &Device::Cpu).unwrap();
        let src = m.encode(&ids, &mask).unwrap();
        let products = m.context_products(&src).unwrap();
        assert!(products.is_some(), "{sets:?}: no context products");
        let cov = m.initial_coverage(&src).unwrap();
        let out = m.attend(&src, &src.t0, cov.as_ref()).unwrap();
        let rows: Vec<u32> = (0..srcs.len() as u32).collect();
        let ctx = m.step_context(&out, products.as_ref(), &rows).unwrap();
        let e = Tensor::randn(0f32, 1.0, (srcs.len(), 16), &Device::Cpu).unwrap();
        let mut buf = vec![];
        let v = m.logit_rows(&ctx, &src.t0, &e, &mut buf).unwrap();
        let composed = m.logits(&(&out.ctx).into(), &src.t0, &e).unwrap();
        let fused = Tensor::from_vec(buf, (srcs.len(), v), &Device::Cpu).unwrap();
        assert!(
            max_rel_diff(&fused, &composed).unwrap() < 1e-5,
            "{sets:?}: logits rows"
        );
        let ((bf, gf), (br, grr)) = (&outs[0], &outs[1]);
        assert_eq!(gf, grr, "{sets:?}: greedy output differs");
        for (a, b) in bf.iter().zip(br) {
            for (x, y) in a.iter().zip(b) {
                assert_eq!(x.tokens, y.tokens, "{sets:?}: beam output differs");
                assert!(
                    (x.score - y.score).abs() < 1e-4 * y.score.abs().max(1.0),
                    "{sets:?}: beam scores {} and {}",
                    x.score,
                    y.score
                );
            }
        }
    }
}

/// Stopping a sentence once its `nbest` is decided gives the hypotheses (tokens and scores) of decoding on
/// until the beam has shrunk to nothing, for every variant, 1-best and n-best.
#[test]
fn settled_beam_search_equals_the_full_beam() {
    for sets in variants() {
        let (model, varmap) = decoding_model(&sets, 5);
        let m = model.frozen(&varmap).unwrap();
        let mut rng = StdRng::seed_from_u64(8);
        let srcs = random_seqs(&mut rng, 9, 30, 1, 9);
        for nbest in [1usize, 3, 5] {
            let run = |settle: bool| {
                let opts = DecodeOptions {
                    beam: 5,
                    nbest,
                    settle,
                    ..Default::default()
                };
                beam_search(&m, &srcs, 0, &opts).unwrap()
            };
            let (settled, full) = (run(true), run(false));
            for (a, b) in settled.iter().zip(&full) {
                assert_eq!(a.len(), b.len(), "{sets:?}, nbest {nbest}: hypotheses");
                for (x, y) in a.iter().zip(b) {
                    assert_eq!(x.tokens, y.tokens, "{sets:?}, nbest {nbest}: tokens");
                    assert!(
                        (x.score - y.score).abs() < 1e-5 * y.score.abs().max(1.0),
                        "{sets:?}, nbest {nbest}: scores {} and {}",
                        x.score,
                        y.score
                    );
                }
            }
        }
    }
}

/// Gathering the words' terms from decoding's word table gives the hypotheses of forming them at each step,
/// exactly (the table's rows are the steps' products), for every variant, with n-best and recording on.
#[test]
fn word_table_decoding_equals_per_step_products() {
    use cgnmt::decode::beam_search::beam_search_with;
    for sets in variants() {
        let (model, varmap) = decoding_model(&sets, 6);
        let m = model.frozen(&varmap).unwrap();
        let mut rng = StdRng::seed_from_u64(9);
        let srcs = random_seqs(&mut rng, 7, 30, 1, 9);
        let prepared = m.prepare_decoding().unwrap();
        assert!(prepared.is_some(), "{sets:?}: no prepared weights");
        let table = m.word_table(prepared.as_ref()).unwrap();
        let terms = m.word_terms(&m.tgt_emb).unwrap();
        let cols = terms.proj.dim(1).unwrap()
            + terms.readout.dim(1).unwrap()
            + terms.gate.map_or(0, |g| g.dim(1).unwrap());
        assert_eq!(m.word_table_bytes(), 25 * cols * 4, "{sets:?}: table size");
        for beam in [1usize, 5] {
            let opts = DecodeOptions {
                beam,
                nbest: beam.min(3),
                record: true,
                ..Default::default()
            };
            let run = |t| beam_search_with(&m, &srcs, 0, &opts, prepared.as_ref(), t).unwrap();
            let (tabled, formed) = (run(Some(&table)), run(None));
            for (a, b) in tabled.iter().zip(&formed) {
                assert_eq!(a.len(), b.len(), "{sets:?}, beam {beam}: hypotheses");
                for (x, y) in a.iter().zip(b) {
                    assert_eq!(x.tokens, y.tokens, "{sets:?}, beam {beam}: tokens");
                    assert_eq!(x.score, y.score, "{sets:?}, beam {beam}: scores");
                    assert_eq!(x.gates, y.gates, "{sets:?}, beam {beam}: gates");
                    assert_eq!(x.attention, y.attention, "{sets:?}, beam {beam}: attention");
                }
            }
        }
    }
}

/// Int8 decoding (`DecodeOptions::int8`) for every variant: the word table's rows are the steps' int8
/// products bit for bit (same search with and without it), a search that prepares its own int8 weights is
/// the same search, the best hypotheses score
/// within 0.05 nats per word of the f32 search's (on average over the batch), and the products are not
/// f32's (some score differs). With reference kernels the option has no effect.
#[test]
fn int8_decoding_approximates_f32() {
    use cgnmt::decode::beam_search::beam_search_batches;
    if !cgnmt::kernels::quantized_gemm::available() {
        eprintln!("no AVX2 on this CPU: the int8 product is never used");
        return;
    }
    for sets in variants() {
        let (model, varmap) = decoding_model(&sets, 8);
        let mut m = model.frozen(&varmap).unwrap();
        let mut rng = StdRng::seed_from_u64(13);
        let srcs = random_seqs(&mut rng, 12, 30, 1, 9);
        let opts = |int8: bool, word_table: bool| DecodeOptions {
            beam: 5,
            int8,
            word_table,
            ..Default::default()
        };
        let batches = [srcs.clone()];
        let run = |m: &Model, o: &DecodeOptions| {
            beam_search_batches(&[m], &batches, 0, o, |_| {})
                .unwrap()
                .swap_remove(0)
        };
        let f32s = run(&m, &opts(false, true));
        let tabled = run(&m, &opts(true, true));
        let formed = run(&m, &opts(true, false));
        let direct = beam_search(&m, &srcs, 0, &opts(true, false)).unwrap();
        let (mut rel, mut differ) = (0f64, false);
        for (((q, p), d), f) in tabled.iter().zip(&formed).zip(&direct).zip(&f32s) {
            assert_eq!(q[0].tokens, p[0].tokens, "{sets:?}: word table: tokens");
            assert_eq!(q[0].score, p[0].score, "{sets:?}: word table: scores");
            assert_eq!(d[0].tokens, p[0].tokens, "{sets:?}: prepared here: tokens");
            assert_eq!(d[0].score, p[0].score, "{sets:?}: prepared here: scores");
            assert!(q[0].score <= 0.0, "{sets:?}: int8 score {}", q[0].score);
            rel += (q[0].score - f[0].score).abs() / (f[0].tokens.len() + 1) as f64;
            differ |= q[0].score != f[0].score;
        }
        let rel = rel / srcs.len() as f64;
        assert!(
            rel < 0.05,
            "{sets:?}: int8 best scores {rel:.4} nats per word from f32's"
        );
        assert!(differ, "{sets:?}: int8 scores all equal f32's");
        m.set_kernels(Kernels::Reference);
        let (a, b) = (
            beam_search(&m, &srcs, 0, &opts(true, false)).unwrap(),
            beam_search(&m, &srcs, 0, &opts(false, false)).unwrap(),
        );
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x[0].tokens, y[0].tokens, "{sets:?}: reference kernels");
            assert_eq!(x[0].score, y[0].score, "{sets:?}: reference kernels");
        }
    }
}

/// Decoding over a shortlist: one of every target word is the full search, exactly; a shorter one emits
/// only its words with log-probabilities ≤ 0, the fused and reference kernels agree on it, and its logits
/// rows are the full rows' columns bit for bit (the packed product's columns do not depend on each other),
/// for every variant.
#[test]
fn shortlist_decoding_is_the_search_over_its_words() {
    use cgnmt::decode::shortlist::Shortlist;
    use std::sync::Arc;
    for sets in variants() {
        let (model, varmap) = decoding_model(&sets, 7);
        let mut rng = StdRng::seed_from_u64(10);
        let srcs = random_seqs(&mut rng, 7, 30, 1, 9);
        let fixed = Shortlist::fixed(30, 25, 2, &[4, 7, 8, 12, 19, 24]);
        let allowed = fixed.words(&srcs, 0);
        assert_eq!(
            allowed,
            vec![0, 1, 4, 7, 8, 12, 19, 24],
            "{sets:?}: the batch's words"
        );
        let opts = |sl: Option<Shortlist>| DecodeOptions {
            beam: 5,
            nbest: 3,
            shortlist: sl.map(Arc::new),
            ..Default::default()
        };
        let mut short = vec![];
        for k in [Kernels::Fused, Kernels::Reference] {
            let mut m = model.frozen(&varmap).unwrap();
            m.set_kernels(k);
            let full = beam_search(&m, &srcs, 0, &opts(None)).unwrap();
            let every =
                beam_search(&m, &srcs, 0, &opts(Some(Shortlist::everything(30, 25)))).unwrap();
            for (a, b) in every.iter().zip(&full) {
                assert_eq!(a.len(), b.len(), "{sets:?} {k:?}: hypotheses");
                for (x, y) in a.iter().zip(b) {
                    assert_eq!(x.tokens, y.tokens, "{sets:?} {k:?}: every word: tokens");
                    assert_eq!(x.score, y.score, "{sets:?} {k:?}: every word: scores");
                }
            }
            let s = beam_search(&m, &srcs, 0, &opts(Some(fixed.clone()))).unwrap();
            for h in s.iter().flatten() {
                assert!(
                    h.tokens.iter().all(|w| allowed.contains(w)),
                    "{sets:?} {k:?}: {:?} leaves the shortlist",
                    h.tokens
                );
                assert!(h.score <= 0.0, "{sets:?} {k:?}: score {}", h.score);
            }
            short.push(s);
        }
        for (a, b) in short[0].iter().zip(&short[1]) {
            assert_eq!(a.len(), b.len(), "{sets:?}: fused and reference hypotheses");
            for (x, y) in a.iter().zip(b) {
                assert_eq!(x.tokens, y.tokens, "{sets:?}: fused and reference tokens");
                assert!(
                    (x.score - y.score).abs() < 1e-4 * y.score.abs().max(1.0),
                    "{sets:?}: fused and reference scores {} and {}",
                    x.score,
                    y.score
                );
            }
        }
        // One step's rows over the shortlist against the full rows, both through the packed weights.
        let m = model.frozen(&varmap).unwrap();
        let prepared = m.prepare_decoding().unwrap();
        let (ids, mask) = cgnmt::model::pad(&srcs, 0, DType::F32, &Device::Cpu).unwrap();
        let src = m.encode_prepared(&ids, &mask, prepared.as_ref()).unwrap();
        let products = m.context_products(&src).unwrap();
        let cov = m.initial_coverage(&src).unwrap();
        let out = m.attend(&src, &src.t0, cov.as_ref()).unwrap();
        let rows: Vec<u32> = (0..srcs.len() as u32).collect();
        let ctx = m.step_context(&out, products.as_ref(), &rows).unwrap();
        let e = Tensor::randn(0f32, 1.0, (srcs.len(), 16), &Device::Cpu).unwrap();
        let ve = m.readout.word_term(m.kernels, &e).unwrap();
        let (mut full, mut sub) = (vec![], vec![]);
        let v = m
            .readout
            .logit_rows_term(m.kernels, &ctx, &src.t0, &ve, None, &mut full)
            .unwrap();
        let words = m.readout.output_words(m.kernels, &allowed, false).unwrap();
        let w = m
            .readout
            .logit_rows_term(m.kernels, &ctx, &src.t0, &ve, Some(&words), &mut sub)
            .unwrap();
        assert_eq!((v, w), (25, allowed.len()), "{sets:?}: row widths");
        for r in 0..srcs.len() {
            for (c, &id) in allowed.iter().enumerate() {
                assert_eq!(
                    sub[r * w + c],
                    full[r * v + id as usize],
                    "{sets:?}: row {r}, word {id}"
                );
            }
        }
    }
}

/// Decoding's context products `Σ_j α_ij (h_j W)` against the products of the contexts `s_i W`, for
/// hypothesis rows that read their sentences out of order, with padding (α = 0 there).
#[test]
fn context_products_equal_products_of_the_context() {
    use cgnmt::model::attention::ContextProducts;
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
        let mut rng = StdRng::seed_from_u64(10);
        let (nsent, s, a2) = (3, 9, 14);
        let ann = rand_var(&mut rng, &[nsent, s, a2], 1.0, dtype);
        let (w1, w2, other) = (
            rand_var(&mut rng, &[a2, 21], 0.5, dtype),
            rand_var(&mut rng, &[a2, 5], 0.5, dtype),
            rand_var(&mut rng, &[a2, 5], 0.5, dtype),
        );
        let lens = [9usize, 3, 6];
        let rows = [2u32, 0, 0, 1, 2];
        let alpha: Vec<f64> = rows
            .iter()
            .flat_map(|&r| {
                let n = lens[r as usize];
                let z: f64 = (1..=n).map(|j| j as f64).sum();
                (0..s).map(move |j| if j < n { (j + 1) as f64 / z } else { 0.0 })
            })
            .collect();
        let alpha = Tensor::from_vec(alpha, (rows.len(), s), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let idx = Tensor::from_vec(rows.to_vec(), rows.len(), &Device::Cpu).unwrap();
        let ctx = alpha
            .unsqueeze(1)
            .unwrap()
            .matmul(&ann.as_tensor().index_select(&idx, 0).unwrap())
            .unwrap()
            .squeeze(1)
            .unwrap();
        let p = ContextProducts::new(ann.as_tensor(), &[w1.as_tensor(), w2.as_tensor()]).unwrap();
        let c = p.context(&ctx, &alpha, &rows).unwrap();
        for w in [&w1, &w2] {
            let want = ctx.matmul(w.as_tensor()).unwrap();
            let got = c.formed(w.as_tensor()).expect("a carried product");
            assert!(max_rel_diff(got, &want).unwrap() < tol, "{dtype:?} s W");
        }
        // A weight without a carried product is multiplied with the context.
        assert!(c.formed(other.as_tensor()).is_none());
        let want = ctx.matmul(other.as_tensor()).unwrap();
        let got = c.product(Kernels::Fused, other.as_tensor()).unwrap();
        assert!(
            max_rel_diff(&got, &want).unwrap() < tol,
            "{dtype:?} fallback"
        );
        // Selected rows keep the products asked for, and only those; the context itself is kept when one
        // of the weights asked for has no carried product.
        let pick = Tensor::from_vec(vec![4u32, 1, 1], 3, &Device::Cpu).unwrap();
        let picked = ctx.index_select(&pick, 0).unwrap();
        let sel = c.select(&pick, &[w1.as_tensor()]).unwrap();
        let want = picked.matmul(w1.as_tensor()).unwrap();
        assert!(max_rel_diff(sel.formed(w1.as_tensor()).unwrap(), &want).unwrap() < tol);
        assert!(
            sel.formed(w2.as_tensor()).is_none(),
            "{dtype:?}: a product not asked for"
        );
        assert!(
            sel.product(Kernels::Fused, other.as_tensor()).is_err(),
            "{dtype:?}: the context kept though every product asked for is carried"
        );
        let sel = c
            .select(&pick, &[w2.as_tensor(), other.as_tensor()])
            .unwrap();
        let want = picked.matmul(other.as_tensor()).unwrap();
        let got = sel.product(Kernels::Fused, other.as_tensor()).unwrap();
        assert!(
            max_rel_diff(&got, &want).unwrap() < tol,
            "{dtype:?}: kept context"
        );
        let want = picked.matmul(w2.as_tensor()).unwrap();
        assert!(max_rel_diff(sel.formed(w2.as_tensor()).unwrap(), &want).unwrap() < tol);
        // A row past the sentences is an error, not a panic.
        assert!(p.context(&ctx, &alpha, &[0, 3, 1, 1, 1]).is_err());
    }
}

#[test]
fn attention_over_sentence_rows_equals_attention_over_selected_keys() {
    for (dtype, tol) in [(DType::F32, 1e-5), (DType::F64, 1e-12)] {
        let mut rng = StdRng::seed_from_u64(9);
        // 3 sentences of up to 11 words (the shorter ones padded), attention dim 37, annotations 2H = 26.
        let (nsent, s, ad, a2) = (3, 11, 37, 26);
        let ah = rand_var(&mut rng, &[nsent, s, ad], 1.5, dtype);
        let ann = rand_var(&mut rng, &[nsent, s, a2], 1.0, dtype);
        let lens = [11usize, 4, 8];
        let mask: Vec<f64> = (0..nsent * s)
            .map(|i| if i % s < lens[i / s] { 0.0 } else { -1e9 })
            .collect();
        let mask_bias = Tensor::from_vec(mask, (nsent, s), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let keys = cgnmt::model::attention::Keys {
            ah: ah.as_tensor().clone(),
            annotations: ann.as_tensor().clone(),
            mask_bias: mask_bias.clone(),
            shared: None,
        };
        // Hypothesis rows: sentences out of order, repeated, one left out.
        let rows = [2u32, 0, 0, 2, 2, 0, 2];
        let bt = rand_var(&mut rng, &[rows.len(), ad], 1.5, dtype);
        let v = rand_var(&mut rng, &[ad, 1], 1.0, dtype);
        let (alpha, ctx) =
            cgnmt::model::attention::attend_rows(&keys, &rows, bt.as_tensor(), v.as_tensor())
                .unwrap();
        let idx = Tensor::from_vec(rows.to_vec(), rows.len(), &Device::Cpu).unwrap();
        let pre = keys.ah.index_select(&idx, 0).unwrap();
        let e = (scores_reference(&pre, bt.as_tensor(), v.as_tensor()).unwrap()
            + mask_bias.index_select(&idx, 0).unwrap())
        .unwrap();
        let (alpha_r, ctx_r) =
            softmax_context_reference(&e, &keys.annotations.index_select(&idx, 0).unwrap())
                .unwrap();
        assert!(max_rel_diff(&alpha, &alpha_r).unwrap() < tol, "{dtype:?} α");
        assert!(
            max_rel_diff(&ctx, &ctx_r).unwrap() < tol,
            "{dtype:?} context"
        );
        // Padded positions get no weight.
        let a: Vec<Vec<f64>> = alpha.to_dtype(DType::F64).unwrap().to_vec2().unwrap();
        assert!(a[0][8..].iter().all(|&x| x == 0.0) && a[0][..8].iter().sum::<f64>() > 0.99);
        // A row index past the sentences is an error, not a panic.
        assert!(cgnmt::model::attention::attend_rows(
            &keys,
            &[0, 3, 1, 1, 1, 1, 1],
            bt.as_tensor(),
            v.as_tensor()
        )
        .is_err());
    }
}

/// The bidirectional encoder as one fused op (both directions, back-propagation through time inside)
/// against the composed step-by-step GRU with padding: annotations and every input's gradient.
#[test]
fn fused_bidirectional_gru_matches_step_by_step() {
    use candle_core::IndexOp;
    use cgnmt::model::encoder::bigru_fused;
    use cgnmt::model::gru::Gru;
    // Sentence lengths 6, 4, 1, 6, 2 (the fused op runs the rows longest first, each step over the rows with a
    // word), and a mask with a gap in one row (not a run of words then padding: all rows under the mask);
    // with and without recurrent dropout's masks (each direction its own, every step the same).
    for ((gap, dropped), (dtype, ft, gt)) in
        [(false, false), (true, false), (false, true), (true, true)]
            .into_iter()
            .flat_map(|g| {
                [(DType::F32, 1e-5, 1e-4), (DType::F64, 1e-12, 1e-10)]
                    .into_iter()
                    .map(move |x| (g, x))
            })
    {
        let mut rng = StdRng::seed_from_u64(5);
        // Sizes that leave remainders after the 8-lane loops.
        let (s, b, h) = (6, 5, 11);
        let lens = [6usize, 4, 1, 6, 2];
        let mut mask: Vec<f64> = (0..s * b)
            .map(|k| if k / b < lens[k % b] { 1.0 } else { 0.0 })
            .collect();
        if gap {
            // Row 1: words at 0, 2, 3.
            mask[b + 1] = 0.0;
        }
        // x [B, S, 6H]: both directions' projected inputs side by side.
        let vars = [
            rand_var(&mut rng, &[b, s, 6 * h], 1.5, dtype),
            rand_var(&mut rng, &[h, 2 * h], 0.5, dtype),
            rand_var(&mut rng, &[h, h], 0.5, dtype),
            rand_var(&mut rng, &[h, 2 * h], 0.5, dtype),
            rand_var(&mut rng, &[h, h], 0.5, dtype),
        ];
        let m = Tensor::from_vec(mask.clone(), (s, b, 1), &Device::Cpu)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        // Recurrent dropout at rate 0.4: values 0 or 1/0.6, [B, H] per direction.
        let drop: Option<[Vec<f64>; 2]> = dropped.then(|| {
            [0, 1].map(|_| {
                (0..b * h)
                    .map(|_| {
                        if rng.random::<f64>() < 0.4 {
                            0.0
                        } else {
                            1.0 / 0.6
                        }
                    })
                    .collect()
            })
        });
        assert!(drop
            .as_ref()
            .is_none_or(|d| d[0] != d[1] && d[0].contains(&0.0)));
        let drop_t: Option<Vec<Tensor>> = drop.as_ref().map(|d| {
            d.iter()
                .map(|v| {
                    Tensor::from_vec(v.clone(), (b, h), &Device::Cpu)
                        .unwrap()
                        .to_dtype(dtype)
                        .unwrap()
                })
                .collect()
        });
        let gru = |u_ru: &Tensor, u: &Tensor| Gru {
            w: u.clone(),
            b: u.i(0).unwrap(),
            u_ru: u_ru.clone(),
            u: u.clone(),
            hidden: h,
        };
        compare(
            dtype,
            &vars,
            &|x| {
                let rows = x[0].reshape((b * s, 6 * h)).unwrap();
                vec![bigru_fused(
                    &rows,
                    b,
                    mask.clone(),
                    (&x[1], &x[2]),
                    (&x[3], &x[4]),
                    drop.clone(),
                )
                .unwrap()]
            },
            &|x| {
                let (gf, gb) = (gru(&x[1], &x[2]), gru(&x[3], &x[4]));
                let xt = |t: usize, d: usize| {
                    x[0].i((.., t))
                        .unwrap()
                        .narrow(1, d * 3 * h, 3 * h)
                        .unwrap()
                };
                let h0 = Tensor::zeros((b, h), dtype, &Device::Cpu).unwrap();
                let mut fwd = vec![];
                let mut st = h0.clone();
                for t in 0..s {
                    st = gf
                        .step_dropped(
                            Kernels::Reference,
                            &xt(t, 0),
                            &st,
                            Some(&m.i(t).unwrap()),
                            drop_t.as_ref().map(|d| &d[0]),
                        )
                        .unwrap();
                    fwd.push(st.clone());
                }
                let mut bwd = vec![h0.clone(); s];
                let mut st = h0;
                for t in (0..s).rev() {
                    st = gb
                        .step_dropped(
                            Kernels::Reference,
                            &xt(t, 1),
                            &st,
                            Some(&m.i(t).unwrap()),
                            drop_t.as_ref().map(|d| &d[1]),
                        )
                        .unwrap();
                    bwd[t] = st.clone();
                }
                vec![Tensor::cat(
                    &[
                        Tensor::stack(&fwd, 1).unwrap(),
                        Tensor::stack(&bwd, 1).unwrap(),
                    ],
                    2,
                )
                .unwrap()]
            },
            ft,
            gt,
            "bidirectional GRU sequence",
        );
    }
}

/// The packed micro-kernel GEMM against a plain triple loop (f64 sums): every instruction set this CPU
/// has, row counts around the 6-row tile, widths around the panel width, depths across the 256-deep blocks,
/// strided operands, packing from a matrix and from a transpose, overwrite and accumulate; a product into a
/// new buffer, from zero or from a bias row, equals, bit for bit, the product into a buffer that holds zeros
/// or the bias.
#[test]
fn packed_gemm_equals_plain_product() {
    use cgnmt::kernels::packed_gemm::{Isa, Packed};
    use cgnmt::kernels::Start;
    let isas: Vec<Isa> = [Isa::Avx512, Isa::Avx2]
        .into_iter()
        .filter(|i| i.available())
        .collect();
    if isas.is_empty() {
        eprintln!("no AVX2/AVX-512 on this CPU: the packed GEMM is never used");
        return;
    }
    let mut rng = StdRng::seed_from_u64(11);
    let mut rand =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect() };
    for isa in isas {
        for &(m, k, n) in &[
            (1, 1, 1),
            (5, 3, 17),
            (6, 300, 32),
            (7, 256, 33),
            (13, 513, 70),
            (64, 40, 16),
            (3, 0, 5),
        ] {
            for transposed in [false, true] {
                // B [k, n], stored row-major, or as the transpose of a row-major [n, k].
                let store = rand(k * n);
                let b_at = |i: usize, j: usize| {
                    if transposed {
                        store[j * k + i]
                    } else {
                        store[i * n + j]
                    }
                };
                let packed = if transposed {
                    Packed::new(isa, &store, k, n, 1, k)
                } else {
                    Packed::new(isa, &store, k, n, n, 1)
                };
                let (lda, ldc) = (k + 3, n + 5);
                let a = rand(m * lda);
                let bias = rand(n);
                for threads in [1, 2] {
                    let mut zeroed = vec![0f32; m * n];
                    packed.mul_into(m, &a, lda, &mut zeroed, n, true, threads);
                    assert_eq!(
                        packed.mul_new(m, &a, lda, Start::Zero, threads),
                        zeroed,
                        "{isa:?} m {m} k {k} n {n}: a new buffer from zero"
                    );
                    let mut biased: Vec<f32> = (0..m).flat_map(|_| bias.clone()).collect();
                    packed.mul_into(m, &a, lda, &mut biased, n, true, threads);
                    assert_eq!(
                        packed.mul_new(m, &a, lda, Start::Row(&bias), threads),
                        biased,
                        "{isa:?} m {m} k {k} n {n}: a new buffer from the bias"
                    );
                    let mut dst = rand(m * ldc);
                    packed.mul_from(m, &a, lda, &mut dst, ldc, Start::Row(&bias), threads);
                    for r in 0..m {
                        assert_eq!(
                            &dst[r * ldc..r * ldc + n],
                            &biased[r * n..(r + 1) * n],
                            "{isa:?} m {m} k {k} n {n}: rows from the bias"
                        );
                    }
                }
                for accumulate in [false, true] {
                    for threads in [1, 2] {
                        let before = rand(m * ldc);
                        let mut dst = before.clone();
                        packed.mul_into(m, &a, lda, &mut dst, ldc, accumulate, threads);
                        for r in 0..m {
                            for j in 0..ldc {
                                let got = dst[r * ldc + j] as f64;
                                if j >= n {
                                    assert_eq!(
                                        got,
                                        before[r * ldc + j] as f64,
                                        "{isa:?}: padding written"
                                    );
                                    continue;
                                }
                                let mut want: f64 = (0..k)
                                    .map(|i| a[r * lda + i] as f64 * b_at(i, j) as f64)
                                    .sum();
                                if accumulate {
                                    want += before[r * ldc + j] as f64;
                                }
                                assert!(
                                    (got - want).abs() <= 1e-5 * (1.0 + want.abs()) * (k as f64).sqrt(),
                                    "{isa:?} m {m} k {k} n {n} transposed {transposed} accumulate {accumulate}: \
                                     ({r}, {j}) {got} vs {want}"
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The int8 product against a plain f64 product: every element within the bound its quantisation allows
/// (per column of `B` to 8 bits, per row of `a` to 7: |Σ a b − Σ â b̂| ≤ Σ |a| δ_B + |b| δ_a + δ_a δ_B with
/// δ the half-steps), which a wrong layout, offset or scale far exceeds; rows around the 4-row tile, widths
/// around the 16-wide panel, depths not a multiple of four, packing from a matrix and from a transpose,
/// from zero, from a bias and into a destination, padding left alone; each row's result, bit for bit, that
/// of the row on its own, on one thread or two.
#[test]
fn int8_gemm_within_its_quantisation_bound() {
    use cgnmt::kernels::packed_gemm::Packed;
    use cgnmt::kernels::Start;
    if !cgnmt::kernels::quantized_gemm::available() {
        eprintln!("no AVX2 on this CPU: the int8 product is never used");
        return;
    }
    let mut rng = StdRng::seed_from_u64(12);
    let mut rand =
        |n: usize| -> Vec<f32> { (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect() };
    let mut worst = 0f64;
    for &(m, k, n) in &[
        (1, 1, 1),
        (5, 3, 17),
        (4, 300, 32),
        (7, 257, 33),
        (13, 513, 70),
        (64, 40, 16),
        (3, 0, 5),
    ] {
        for transposed in [false, true] {
            let store = rand(k * n);
            let b_at = |i: usize, j: usize| {
                if transposed {
                    store[j * k + i]
                } else {
                    store[i * n + j]
                }
            };
            let packed = if transposed {
                Packed::new_int8(&store, k, n, 1, k)
            } else {
                Packed::new_int8(&store, k, n, n, 1)
            }
            .expect("AVX2");
            assert!(packed.is_int8());
            assert_eq!(packed.dims(), (k, n));
            let (lda, ldc) = (k + 3, n + 5);
            // Rows of different magnitudes (each row has its own scale), one of them all zero.
            let mut a = rand(m * lda);
            for r in 0..m {
                let f = [1.0, 0.01, 30.0, 0.0][r % 4];
                for x in &mut a[r * lda..(r + 1) * lda] {
                    *x *= f;
                }
            }
            let bias = rand(n);
            let db: Vec<f64> = (0..n)
                .map(|j| (0..k).map(|i| b_at(i, j).abs() as f64).fold(0.0, f64::max) / 254.0)
                .collect();
            for threads in [1, 2] {
                let before = rand(m * ldc);
                let mut dst = before.clone();
                packed.mul_from(m, &a, lda, &mut dst, ldc, Start::Dst, threads);
                let zero = packed.mul_new(m, &a, lda, Start::Zero, threads);
                let biased = packed.mul_new(m, &a, lda, Start::Row(&bias), threads);
                for r in 0..m {
                    let ar = &a[r * lda..r * lda + k];
                    let da = ar.iter().map(|x| x.abs() as f64).fold(0.0, f64::max) / 126.0;
                    let alone = packed.mul_new(1, ar, k, Start::Zero, threads);
                    assert_eq!(
                        alone,
                        &zero[r * n..(r + 1) * n],
                        "m {m} k {k} n {n}: row {r} depends on the other rows"
                    );
                    for j in 0..ldc {
                        let got = dst[r * ldc + j];
                        if j >= n {
                            assert_eq!(got, before[r * ldc + j], "padding written");
                            continue;
                        }
                        let z = zero[r * n + j];
                        assert_eq!(biased[r * n + j], z + bias[j], "from the bias");
                        assert_eq!(got, z + before[r * ldc + j], "into the destination");
                        let (mut exact, mut bound, mut size) = (0f64, 0f64, 0f64);
                        for (i, &x) in ar.iter().enumerate() {
                            let (x, b) = (x as f64, b_at(i, j) as f64);
                            exact += x * b;
                            bound += x.abs() * db[j] + b.abs() * da + da * db[j];
                            size += (x * b).abs();
                        }
                        let err = (z as f64 - exact).abs();
                        assert!(
                            err <= bound * 1.0001 + 1e-5 * size + 1e-30,
                            "m {m} k {k} n {n} t {transposed}: ({r}, {j}) = {z}, exact {exact}, bound {bound}"
                        );
                        if size > 0.0 {
                            worst = worst.max(err / size);
                        }
                    }
                }
            }
        }
    }
    // Quantisation does lose something (the check above is not vacuous), but little.
    assert!(worst > 1e-5 && worst < 0.05, "worst relative error {worst}");
}

/// `--int8`'s products formed once per batch (`kernels::int8_matmul`): in a pass prepared in 8 bits the
/// weight's product is the int8 kernel's (equal to the packed int8 product, close to f32's but not equal);
/// a pass prepared in f32, or a weight not prepared, gives `None` (f32 then).
#[test]
fn int8_matmul_only_in_int8_passes() {
    use cgnmt::kernels::packed_gemm::Packed;
    use cgnmt::kernels::Start;
    use cgnmt::kernels::{begin_prepared_pass, int8_matmul, matmul_or_int8, prepare_as};
    if !cgnmt::kernels::quantized_gemm::available() {
        eprintln!("no AVX2 on this CPU: the int8 product is never used");
        return;
    }
    let mut rng = StdRng::seed_from_u64(21);
    let (m, k, n) = (37, 70, 45);
    let x = rand_var(&mut rng, &[m, k], 1.0, DType::F32)
        .as_tensor()
        .clone();
    let w = rand_var(&mut rng, &[k, n], 0.5, DType::F32)
        .as_tensor()
        .clone();
    let other = rand_var(&mut rng, &[k, n], 0.5, DType::F32)
        .as_tensor()
        .clone();
    let exact = x.matmul(&w).unwrap();
    begin_prepared_pass(&prepare_as(Kernels::Fused, &[&w], false).unwrap().unwrap());
    assert!(int8_matmul(&x, &w).unwrap().is_none(), "f32 pass");
    assert_eq!(
        max_rel_diff(&matmul_or_int8(&x, &w).unwrap(), &exact).unwrap(),
        0.0,
        "f32 pass: candle's product"
    );
    begin_prepared_pass(&prepare_as(Kernels::Fused, &[&w], true).unwrap().unwrap());
    assert!(
        int8_matmul(&x, &other).unwrap().is_none(),
        "weight not prepared"
    );
    let q = int8_matmul(&x, &w).unwrap().expect("int8 pass");
    assert_eq!(q.dims(), &[m, n]);
    let xs: Vec<f32> = x.flatten_all().unwrap().to_vec1().unwrap();
    let ws: Vec<f32> = w.flatten_all().unwrap().to_vec1().unwrap();
    let packed = Packed::new_int8(&ws, k, n, n, 1).unwrap();
    let want = packed.mul_new(m, &xs, k, Start::Zero, 1);
    assert_eq!(
        q.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
        want,
        "the int8 kernel's product"
    );
    let d = max_rel_diff(&q, &exact).unwrap();
    assert!(d > 1e-5 && d < 0.05, "int8 against f32: {d}");
    let plain: Vec<f32> = matmul_or_int8(&x, &w)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(plain, want, "matmul_or_int8 takes the int8 product");
}

/// The tiled transpose, on one thread (small) and on the pool (large), against element-wise indexing.
#[test]
fn tiled_transpose_equals_indexing() {
    for &(r, c) in &[(1, 1), (3, 70), (33, 31), (300, 517), (1000, 70)] {
        let x: Vec<f64> = (0..r * c).map(|i| i as f64).collect();
        let t = cgnmt::kernels::transposed(&x, r, c);
        for i in 0..r {
            for j in 0..c {
                assert_eq!(t[j * r + i], x[i * c + j], "[{r}, {c}] at ({i}, {j})");
            }
        }
    }
}

/// Decoding's row gather equals candle's `index_select` (f32 and f64, rank 2 and 3, repeated and empty
/// indices, a gather large enough to run on both cores), refuses an index beyond the rows, and leaves a
/// tensor that tracks gradients to `index_select`, so that its gradient still flows.
#[test]
fn select_rows_equals_index_select() {
    use cgnmt::kernels::select_rows;
    let dev = Device::Cpu;
    for dtype in [DType::F32, DType::F64] {
        for shape in [vec![7usize, 5], vec![6, 3, 4], vec![40, 3000]] {
            let x = Tensor::randn(0f32, 1.0, shape.as_slice(), &dev)
                .unwrap()
                .to_dtype(dtype)
                .unwrap();
            let r = shape[0] as u32;
            for ids in [
                vec![0u32],
                vec![r - 1, 0, 2, 2, 1],
                vec![],
                (0..r).rev().collect(),
            ] {
                let idx = Tensor::from_vec(ids.clone(), ids.len(), &dev).unwrap();
                let a = select_rows(&x, &idx).unwrap();
                let b = x.index_select(&idx, 0).unwrap();
                assert_eq!(a.dims(), b.dims(), "{dtype:?} {shape:?} {ids:?}: shape");
                let (a, b) = (
                    a.flatten_all().unwrap().to_dtype(DType::F64).unwrap(),
                    b.flatten_all().unwrap().to_dtype(DType::F64).unwrap(),
                );
                assert_eq!(
                    a.to_vec1::<f64>().unwrap(),
                    b.to_vec1::<f64>().unwrap(),
                    "{dtype:?} {shape:?} {ids:?}: values"
                );
            }
            let idx = Tensor::from_vec(vec![1u32, r], 2, &dev).unwrap();
            assert!(
                select_rows(&x, &idx).is_err(),
                "{shape:?}: row {r} accepted"
            );
        }
    }
    let v = Var::from_tensor(&Tensor::randn(0f32, 1.0, (4, 3), &dev).unwrap()).unwrap();
    let idx = Tensor::from_vec(vec![3u32, 1, 3], 3, &dev).unwrap();
    let y = select_rows(v.as_tensor(), &idx).unwrap();
    let g = y.sum_all().unwrap().backward().unwrap();
    let gv: Vec<Vec<f32>> = g.get(v.as_tensor()).unwrap().to_vec2().unwrap();
    assert_eq!(
        gv,
        vec![vec![0.0; 3], vec![1.0; 3], vec![0.0; 3], vec![2.0; 3]]
    );
}
