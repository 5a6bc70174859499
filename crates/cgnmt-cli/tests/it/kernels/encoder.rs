//! The fused encoder op against its composed reference.

use super::*;

/// The bidirectional encoder as one fused op (both directions, back-propagation through time inside)
/// against the composed step-by-step GRU with padding: annotations and every input's gradient; with layer
/// normalisation of the recurrent products too (gains and biases among the inputs).
#[test]
fn fused_bidirectional_gru_matches_step_by_step() {
    use candle_core::IndexOp;
    use cgnmt::kernels::encoder::{bigru_fused, bigru_fused_normed};
    use cgnmt::model::gru::{Gru, GruNorm, RecNorm};
    use cgnmt::model::layer_norm::LayerNorm;
    // Sentence lengths 6, 4, 1, 6, 2 (the fused op runs the rows longest first, each step over the rows with a
    // word), and a mask with a gap in one row (not a run of words then padding: all rows under the mask);
    // with and without recurrent dropout's masks (each direction its own, every step the same).
    for (((gap, dropped), normed), (dtype, ft, gt)) in [
        ((false, false), false),
        ((true, false), false),
        ((false, true), false),
        ((true, true), false),
        ((false, false), true),
        ((true, true), true),
    ]
    .into_iter()
    .flat_map(|g| {
        [(DType::F32, 1e-5, 1e-4), (DType::F64, 1e-12, 1e-10)]
            .into_iter()
            .map(move |x| (g, x))
    }) {
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
        let mut vars = vec![
            rand_var(&mut rng, &[b, s, 6 * h], 1.5, dtype),
            rand_var(&mut rng, &[h, 2 * h], 0.5, dtype),
            rand_var(&mut rng, &[h, h], 0.5, dtype),
            rand_var(&mut rng, &[h, 2 * h], 0.5, dtype),
            rand_var(&mut rng, &[h, h], 0.5, dtype),
        ];
        if normed {
            // Each direction's gain and bias of h U_ru and of (r∘h) U: gains near 1, biases near 0.
            for _ in 0..2 {
                for n in [2 * h, h] {
                    let g = rand_var(&mut rng, &[n], 0.3, dtype);
                    vars.push(Var::from_tensor(&(g.as_tensor() + 1.0).unwrap()).unwrap());
                    vars.push(rand_var(&mut rng, &[n], 0.2, dtype));
                }
            }
        }
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
        // Direction d's layer normalisation (the inputs after the weights: g_ru, b_ru, g, b per direction).
        let rec_ln = |x: &[Tensor], d: usize| {
            let p = |i: usize| x[5 + 4 * d + i].clone();
            let ln = |g: Tensor, b: Tensor, n: usize| LayerNorm {
                g,
                b,
                blocks: vec![n],
            };
            GruNorm {
                // (The projections are the op's inputs: this one is not read.)
                w: ln(p(0), p(1), 2 * h),
                rec: RecNorm {
                    u_ru: ln(p(0), p(1), 2 * h),
                    u: ln(p(2), p(3), h),
                },
            }
        };
        let gru = |x: &[Tensor], d: usize| Gru {
            w: x[2 + 2 * d].clone(),
            b: x[2 + 2 * d].i(0).unwrap(),
            u_ru: x[1 + 2 * d].clone(),
            u: x[2 + 2 * d].clone(),
            hidden: h,
            ln: normed.then(|| rec_ln(x, d)),
        };
        compare(
            dtype,
            &vars,
            &|x| {
                let rows = x[0].reshape((b * s, 6 * h)).unwrap();
                vec![if normed {
                    bigru_fused_normed(
                        &rows,
                        b,
                        mask.clone(),
                        (&x[1], &x[2]),
                        (&x[3], &x[4]),
                        drop.clone(),
                        [
                            [&x[5], &x[6], &x[7], &x[8]],
                            [&x[9], &x[10], &x[11], &x[12]],
                        ],
                    )
                } else {
                    bigru_fused(
                        &rows,
                        b,
                        mask.clone(),
                        (&x[1], &x[2]),
                        (&x[3], &x[4]),
                        drop.clone(),
                    )
                }
                .unwrap()]
            },
            &|x| {
                let (gf, gb) = (gru(x, 0), gru(x, 1));
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
