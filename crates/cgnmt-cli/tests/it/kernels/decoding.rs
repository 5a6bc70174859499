//! Decoding with the fused kernels, the word table, int8 products and shortlists against the plain search.

use super::*;
use cgnmt::model::decoder_step::SourceView;

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
        let rows: Vec<u32> = (0..srcs.len() as u32).collect();
        let view = SourceView::sentences(&src, products.as_ref(), &rows);
        // A step after a random previous word.
        let e = Tensor::randn(0f32, 1.0, (srcs.len(), 16), &Device::Cpu).unwrap();
        let mut state = m.start(&src, true).unwrap();
        state.prev = m.word_terms(&e).unwrap();
        let step = m.step(view, &state, (1.0, 1.0), None).unwrap();
        let mut buf = vec![];
        let v = m.step_logits(&step, &state, None, &mut buf).unwrap();
        let composed = m.logits(&(&step.ctx).into(), &step.t, &e).unwrap();
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
            + terms.readout.unwrap().dim(1).unwrap()
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
            beam_search_batches(&[m], &batches, None, 0, o, |_| {})
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
        let rows: Vec<u32> = (0..srcs.len() as u32).collect();
        let view = SourceView::sentences(&src, products.as_ref(), &rows);
        let step = m
            .step(view, &m.start(&src, true).unwrap(), (1.0, 1.0), None)
            .unwrap();
        let ctx = step.context;
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
