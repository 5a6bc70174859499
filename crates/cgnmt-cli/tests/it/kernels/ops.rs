//! The fused ops and products against their composed references, op by op.

use super::*;

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
            ln: None,
        };
        // The shifted embeddings e(y_{i−1}) of every row (zero at i = 0).
        let shifted = |e: &Tensor| {
            let e3 = e.reshape((nb, tl, ed)).unwrap();
            let zeros = Tensor::zeros((nb, 1, ed), dtype, &Device::Cpu).unwrap();
            Tensor::cat(&[&zeros, &e3.narrow(1, 0, tl - 1).unwrap()], 1)
                .unwrap()
                .reshape((n, ed))
                .unwrap()
        };
        // The composed readout over every row, reading the shifted embeddings.
        let reference_rows = |x: &[Tensor]| {
            readout(x)
                .hidden_stacked(Kernels::Reference, &x[0], &shifted(&x[1]))
                .unwrap()
        };
        compare(
            dtype,
            &vars,
            &|x| {
                let ro = readout(x);
                vec![cgnmt::kernels::readout::hidden_rows_fused(
                    ro.rows_weights(),
                    &x[0],
                    &x[1],
                    tl,
                    None,
                )
                .unwrap()]
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
                vec![cgnmt::kernels::readout::hidden_rows_fused(
                    ro.rows_weights(),
                    &x[0],
                    &x[1],
                    tl,
                    Some(&lens),
                )
                .unwrap()]
            },
            &|x| vec![reference_rows(x).index_select(&rows, 0).unwrap()],
            ft,
            gt,
            "readout over the words' rows",
        );
        // Layer-normalised (model-spec §5b): each term normalised before the sum, against the composed
        // readout (gains and biases away from 1 and 0), over every row and over the words' rows.
        let mut normed_vars = vars.to_vec();
        for _ in 0..3 {
            normed_vars.push(rand_var(&mut rng, &[h], 0.5, dtype));
            normed_vars.push(rand_var(&mut rng, &[h], 0.5, dtype));
        }
        let normed = |x: &[Tensor]| {
            let mut ro = readout(x);
            ro.ln = Some([0, 1, 2].map(|j| cgnmt::model::layer_norm::LayerNorm {
                g: (&x[7 + 2 * j] + 1.0).unwrap(),
                b: x[8 + 2 * j].clone(),
                blocks: vec![h],
            }));
            ro
        };
        let normed_reference = |x: &[Tensor]| {
            let e_prev = shifted(&x[1]);
            let s = x[0].narrow(1, h, 2 * h).unwrap();
            normed(x)
                .hidden(
                    Kernels::Reference,
                    &(&s).into(),
                    &x[0].narrow(1, 0, h).unwrap(),
                    &e_prev,
                )
                .unwrap()
        };
        for lengths in [None, Some(&lens[..])] {
            compare(
                dtype,
                &normed_vars,
                &|x| {
                    let ro = normed(x);
                    vec![cgnmt::kernels::readout::hidden_rows_fused(
                        ro.rows_weights(),
                        &x[0],
                        &x[1],
                        tl,
                        lengths,
                    )
                    .unwrap()]
                },
                &|x| {
                    let r = normed_reference(x);
                    vec![match lengths {
                        Some(_) => r.index_select(&rows, 0).unwrap(),
                        None => r,
                    }]
                },
                ft,
                gt,
                "layer-normalised readout rows",
            );
        }
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
        use cgnmt::kernels::gate::{mix_fused, GateKinds, GateMix, ZKind};
        use cgnmt::model::gate::{mix_reference, Scale, Scales};
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
            use cgnmt::kernels::readout::{
                output_nll_smoothed_fused, output_nll_smoothed_reference,
            };
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
        let keys = cgnmt::kernels::attention::Keys {
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
            cgnmt::kernels::attention::attend_rows(&keys, &rows, bt.as_tensor(), v.as_tensor())
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
        assert!(cgnmt::kernels::attention::attend_rows(
            &keys,
            &[0, 3, 1, 1, 1, 1, 1],
            bt.as_tensor(),
            v.as_tensor()
        )
        .is_err());
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

#[test]
fn a_shape_error_names_the_sizes_it_expected_and_got() {
    // B 2 × H 4: [r | u] must hold 16 values; give it 2 × 6.
    let dev = Device::Cpu;
    let ru = Tensor::zeros((2, 6), DType::F32, &dev).unwrap();
    let pre = Tensor::zeros((2, 4), DType::F32, &dev).unwrap();
    let base = Tensor::zeros((2, 4), DType::F32, &dev).unwrap();
    let err = gru_update_fused(&ru, &pre, &base, None)
        .unwrap_err()
        .to_string();
    for part in ["B 2", "H 4", "2·B·H = 16", "has 12"] {
        assert!(err.contains(part), "{part:?} missing from: {err}");
    }
}

/// Layer normalisation of a row's blocks (`kernels::layer_norm`, the building block of a layer-normalised GRU):
/// the fused op against its composed reference (forward to 1e-5 in f32, gradients to 1e-10 in f64, with a
/// width that leaves remainders, GRU-like blocks `[2H | H]` and rows over several of the op's parallel chunks), the fused gradients against central finite
/// differences in f64, each block normalised on its own (mean 0, variance 1 before the gain), and bad blocks
/// refused.
#[test]
fn layer_norm_matches_its_reference_and_finite_differences() {
    use cgnmt::kernels::layer_norm::{layer_norm_fused, layer_norm_reference};
    for (dtype, ft, gt) in [(DType::F32, 1e-5, 1e-4), (DType::F64, 1e-12, 1e-10)] {
        for blocks in [vec![14, 7], vec![21], vec![3, 5, 13]] {
            let mut rng = StdRng::seed_from_u64(17);
            let vars = [
                // (75 rows: the op's chunks of 32 rows, and a remainder.)
                rand_var(&mut rng, &[75, 21], 2.0, dtype),
                rand_var(&mut rng, &[21], 1.5, dtype),
                rand_var(&mut rng, &[21], 1.0, dtype),
            ];
            compare(
                dtype,
                &vars,
                &|x| vec![layer_norm_fused(&x[0], &x[1], &x[2], &blocks).unwrap()],
                &|x| vec![layer_norm_reference(&x[0], &x[1], &x[2], &blocks).unwrap()],
                ft,
                gt,
                &format!("layer norm {blocks:?}"),
            );
        }
    }
    // Finite differences of Σ r∘LN(x) in f64, every input.
    let mut rng = StdRng::seed_from_u64(23);
    let blocks = [6, 3];
    let xs = [
        rand_var(&mut rng, &[4, 9], 2.0, DType::F64),
        rand_var(&mut rng, &[9], 1.5, DType::F64),
        rand_var(&mut rng, &[9], 1.0, DType::F64),
    ];
    let r = rand_var(&mut rng, &[4, 9], 1.0, DType::F64);
    let loss = |x: &[Tensor]| {
        (layer_norm_fused(&x[0], &x[1], &x[2], &blocks).unwrap() * r.as_tensor())
            .unwrap()
            .sum_all()
            .unwrap()
    };
    let ts: Vec<Tensor> = xs.iter().map(|v| v.as_tensor().clone()).collect();
    let grads = cgnmt::kernels::backward(&loss(&ts)).unwrap();
    let mut worst: f64 = 0.0;
    for (i, v) in xs.iter().enumerate() {
        let g: Vec<f64> = grads
            .get(v.as_tensor())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let base: Vec<f64> = v.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
        for k in 0..base.len() {
            let at = |d: f64| {
                let mut p = base.clone();
                p[k] += d;
                let mut x = ts.clone();
                x[i] = Tensor::from_vec(p, v.shape(), &Device::Cpu).unwrap();
                loss(&x).to_scalar::<f64>().unwrap()
            };
            let fd = (at(1e-6) - at(-1e-6)) / 2e-6;
            worst = worst.max((fd - g[k]).abs() / (1e-3 + fd.abs().max(g[k].abs())));
        }
    }
    assert!(
        worst < 1e-6,
        "layer norm gradients against finite differences: {worst:e}"
    );
    // With unit gain and zero bias each block has mean 0 and variance 1 (up to ε).
    let x = rand_var(&mut rng, &[5, 9], 3.0, DType::F64);
    let ones = Tensor::ones(9, DType::F64, &Device::Cpu).unwrap();
    let zeros = Tensor::zeros(9, DType::F64, &Device::Cpu).unwrap();
    let y: Vec<Vec<f64>> = layer_norm_fused(x.as_tensor(), &ones, &zeros, &blocks)
        .unwrap()
        .to_vec2()
        .unwrap();
    for row in &y {
        for (from, n) in [(0, 6), (6, 3)] {
            let b = &row[from..from + n];
            let mean = b.iter().sum::<f64>() / n as f64;
            let var = b.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / n as f64;
            assert!(
                mean.abs() < 1e-12 && (var - 1.0).abs() < 1e-3,
                "{mean} {var}"
            );
        }
    }
    let err = layer_norm_fused(x.as_tensor(), &ones, &zeros, &[6, 4]).unwrap_err();
    assert!(err.to_string().contains("do not tile"), "{err}");
}
