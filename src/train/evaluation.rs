//! Evaluations during training: dev BLEU (mteval-v11b, smoothed BLEU, chrF) of the model being trained,
//! decoded in shares across the ranks, and the dev loss.

use candle_core::{DType, Device};
use cgnmt_data::preprocess::Preprocessor;
use cgnmt_data::vocab::Vocab;

use crate::cluster::Cluster;

use crate::decode::beam_search::DecodeOptions;
use crate::decode::translate::Pipeline;
use crate::error::Result;
use crate::model::{Batch, Model};

/// Case-insensitive BLEU as NIST mteval-v11b (the paper's metric) of detokenised hypotheses.
pub fn bleu_v11b(hyps: &[String], refs: &[String]) -> f64 {
    let opts = cgnmt_eval::bleu::BleuOptions::mteval_v11b();
    match cgnmt_eval::bleu::corpus_bleu(hyps, &[refs.to_vec()], &opts) {
        Ok(s) => s.score,
        Err(_) => 0.0,
    }
}

/// The dev scores of one evaluation (see `train.select_by`).
#[derive(Debug, Clone, Copy)]
pub struct DevScores {
    /// mteval-v11b BLEU (the paper's).
    pub bleu: f64,
    /// The same with sacreBLEU's `exp` smoothing of zero n-gram matches.
    pub bleu_smoothed: f64,
    /// chrF2.
    pub chrf: f64,
}

impl DevScores {
    /// The scores of detokenised hypotheses against one reference each.
    pub fn of(hyps: &[String], refs: &[String]) -> DevScores {
        let refs = [refs.to_vec()];
        let mut smoothed = cgnmt_eval::bleu::BleuOptions::mteval_v11b();
        smoothed.smooth = cgnmt_eval::bleu::Smooth::Exp;
        DevScores {
            bleu: bleu_v11b(hyps, &refs[0]),
            bleu_smoothed: cgnmt_eval::bleu::corpus_bleu(hyps, &refs, &smoothed)
                .map_or(0.0, |s| s.score),
            chrf: cgnmt_eval::chrf::corpus_chrf(
                hyps,
                &refs,
                &cgnmt_eval::chrf::ChrfOptions::chrf(),
            )
            .map_or(0.0, |s| s.score),
        }
    }

    /// The score `select_by` names.
    pub fn selected(&self, by: crate::config::SelectBy) -> f64 {
        match by {
            crate::config::SelectBy::Bleu => self.bleu,
            crate::config::SelectBy::SmoothedBleu => self.bleu_smoothed,
            crate::config::SelectBy::Chrf => self.chrf,
        }
    }
}

/// Dev scores with beam search.
pub fn evaluate(
    model: &Model,
    src_vocab: &Vocab,
    tgt_vocab: &Vocab,
    pre: &Preprocessor,
    dev_src: &[String],
    dev_ref: &[String],
    beam: usize,
) -> Result<DevScores> {
    evaluate_on(
        model,
        src_vocab,
        tgt_vocab,
        pre,
        dev_src,
        dev_ref,
        beam,
        &Cluster::single(),
    )
}

/// [`evaluate`] sharded over the ranks of a job: each rank decodes every N-th sentence, rank 0 scores the
/// whole set and every rank gets its scores (the same decisions everywhere).
#[allow(clippy::too_many_arguments)]
pub fn evaluate_on(
    model: &Model,
    src_vocab: &Vocab,
    tgt_vocab: &Vocab,
    pre: &Preprocessor,
    dev_src: &[String],
    dev_ref: &[String],
    beam: usize,
    cluster: &Cluster,
) -> Result<DevScores> {
    let tr = Pipeline {
        model,
        others: vec![],
        src_vocab,
        tgt_vocab,
        preprocess: pre,
    };
    let opts = DecodeOptions {
        beam,
        ..Default::default()
    };
    let mine = cluster.share(dev_src.len());
    let lines: Vec<String> = mine.iter().map(|&i| dev_src[i].clone()).collect();
    let out = tr.translate(&lines, &opts, 32, true, |_| {})?;
    let hyps: Vec<String> = out.into_iter().map(|t| t.text).collect();
    if cluster.size() == 1 {
        return Ok(DevScores::of(&hyps, dev_ref));
    }
    let mut scores = [0f64; 3];
    if let Some(all) = cluster.gather(hyps.join("\n").into_bytes()) {
        // Rank r decoded lines r, r + N, r + 2N, …
        let mut whole = vec![String::new(); dev_src.len()];
        for (r, bytes) in all.iter().enumerate() {
            let text = String::from_utf8_lossy(bytes);
            let theirs: Vec<&str> = if text.is_empty() {
                vec![]
            } else {
                text.split('\n').collect()
            };
            for (k, h) in theirs.into_iter().enumerate() {
                whole[r + k * cluster.size()] = h.to_string();
            }
        }
        let s = DevScores::of(&whole, dev_ref);
        scores = [s.bleu, s.bleu_smoothed, s.chrf];
    }
    cluster.broadcast_f64(&mut scores);
    Ok(DevScores {
        bleu: scores[0],
        bleu_smoothed: scores[1],
        chrf: scores[2],
    })
}

/// Mean per-token loss (EOS included) on tokenised pairs; over the ranks of a job, each computes every N-th
/// batch of 64.
pub fn corpus_loss(
    model: &Model,
    src_vocab: &Vocab,
    tgt_vocab: &Vocab,
    src: &[String],
    tgt: &[String],
    cluster: &Cluster,
) -> Result<f64> {
    let (mut total, mut tokens) = (0.0f64, 0usize);
    let enc = |v: &Vocab, l: &String| v.encode(&l.split_whitespace().collect::<Vec<_>>());
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = src
        .iter()
        .zip(tgt)
        .map(|(s, t)| (enc(src_vocab, s), enc(tgt_vocab, t)))
        .filter(|(s, t)| !s.is_empty() && !t.is_empty())
        .collect();
    let chunks: Vec<&[(Vec<u32>, Vec<u32>)]> = pairs.chunks(64).collect();
    for k in cluster.share(chunks.len()) {
        let chunk = chunks[k];
        let s: Vec<Vec<u32>> = chunk.iter().map(|p| p.0.clone()).collect();
        let t: Vec<Vec<u32>> = chunk.iter().map(|p| p.1.clone()).collect();
        let b = Batch::new(&s, &t, tgt_vocab.eos(), DType::F32, &Device::Cpu)?;
        total += model.loss(&b)?.to_scalar::<f32>()? as f64 * s.len() as f64;
        tokens += b.tgt_tokens;
    }
    let mut sums = [total, tokens as f64];
    cluster.sum_f64(&mut sums);
    let (total, tokens) = (sums[0], sums[1]);
    Ok(if tokens > 0.0 {
        total / tokens
    } else {
        f64::NAN
    })
}
