//! Scoring given translations: the log-probability a model (or an ensemble) gives each target word of a
//! sentence pair, EOS included, by forced decoding (the reference's words fed back, as in training).
//!
//! Each step runs the decoder as the search does (attention, the conditional transition, the readout's
//! logits, then the transition with the given word), so a hypothesis of the beam search scores here what
//! the search gave it (without penalties). An ensemble's log-probability of a word is the members' mean,
//! as in its search.

use candle_core::{Result, Tensor};

use crate::model::decoder_step::SourceView;
use crate::model::{pad, Model};

/// Per sentence pair, the log-probability of each target id and of the final EOS (`tgt.len() + 1`
/// values), under the mean of `models`' log-probabilities; pairs in batches of `batch`.
pub fn score_ids(
    models: &[&Model],
    srcs: &[Vec<u32>],
    tgts: &[Vec<u32>],
    eos: u32,
    context_scale: (f64, f64),
    batch: usize,
) -> Result<Vec<Vec<f32>>> {
    assert_eq!(srcs.len(), tgts.len(), "one target per source");
    assert!(!models.is_empty(), "at least one model");
    let mut out = Vec::with_capacity(srcs.len());
    for (s, t) in srcs.chunks(batch.max(1)).zip(tgts.chunks(batch.max(1))) {
        let mut sum: Option<Vec<Vec<f32>>> = None;
        for m in models {
            let lp = score_batch(m, s, t, eos, context_scale)?;
            sum = Some(match sum {
                None => lp,
                Some(mut acc) => {
                    for (a, b) in acc.iter_mut().zip(&lp) {
                        a.iter_mut().zip(b).for_each(|(x, y)| *x += y);
                    }
                    acc
                }
            });
        }
        let k = models.len() as f32;
        let mut lp = sum.expect("a model");
        if models.len() > 1 {
            lp.iter_mut().flatten().for_each(|x| *x /= k);
        }
        out.extend(lp);
    }
    Ok(out)
}

/// One batch with one model: forced decoding over the longest target (+ EOS); each row's values stop at
/// its own EOS.
fn score_batch(
    model: &Model,
    srcs: &[Vec<u32>],
    tgts: &[Vec<u32>],
    eos: u32,
    context_scale: (f64, f64),
) -> Result<Vec<Vec<f32>>> {
    let dev = model.tgt_emb.device().clone();
    let dtype = model.tgt_emb.dtype();
    let n = srcs.len();
    if n == 0 {
        return Ok(vec![]);
    }
    let (src_ids, src_mask) = pad(srcs, eos, dtype, &dev)?;
    let source = model.encode(&src_ids, &src_mask)?;
    let products = model.context_products(&source)?;
    let rows: Vec<u32> = (0..n as u32).collect();
    let view = SourceView::sentences(&source, products.as_ref(), &rows);
    let steps = tgts.iter().map(|t| t.len() + 1).max().unwrap_or(1);
    let mut state = model.start(&source, true)?;
    let mut out: Vec<Vec<f32>> = tgts
        .iter()
        .map(|t| Vec::with_capacity(t.len() + 1))
        .collect();
    let mut logits: Vec<f32> = Vec::new();
    for step in 0..steps {
        let st = model.step(view, &state, context_scale, None)?;
        let v = model.step_logits(&st, &state, None, &mut logits)?;
        let mut words = vec![eos; n];
        for i in 0..n {
            if step > tgts[i].len() {
                continue;
            }
            let w = tgts[i].get(step).copied().unwrap_or(eos);
            let row = &logits[i * v..(i + 1) * v];
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let norm = max + row.iter().map(|&x| (x - max).exp()).sum::<f32>().ln();
            out[i].push(row[w as usize] - norm);
            words[i] = w;
        }
        if step + 1 == steps {
            break;
        }
        let word = model.word_terms(&model.embed(&Tensor::from_vec(words, n, &dev)?)?)?;
        state = model.feed(&st, None, word, context_scale, None)?.0;
    }
    Ok(out)
}
