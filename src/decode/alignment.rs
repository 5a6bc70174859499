//! Word alignments from attention (model-spec §8): force-decode the reference, take `α`, and link every target
//! word to its most attended source word. With subword (BPE) models the matrix is first mapped back to the
//! given words: a word's column is the sum of its subwords' columns, a word's row the sum of its subwords'
//! rows. The EOS row and column are left out and each row renormalised over the real source words.

use candle_core::{DType, Result};

use crate::decode::beam_search::Hypothesis;
use crate::model::decoder_step::SourceView;
use crate::model::store::LoadedModel;
use crate::model::{pad, Model};

/// One sentence pair's word alignment from attention.
#[derive(Debug, Clone, PartialEq)]
pub struct Alignment {
    /// Hard links `(source word, target word)`, 0-based.
    pub links: Vec<(usize, usize)>,
    /// Attention `[target word][source word]` over the given words (EOS left out), rows summing to 1.
    pub attention: Vec<Vec<f64>>,
    /// Mean gate value per target token (empty without a context gate).
    pub gates: Vec<f32>,
}

/// Word alignments of `(source, target)` pairs tokenised with spaces (a gold alignment's tokens) from the
/// attention of `model` (`lm`'s frozen model): each side through `lm`'s BPE word by word, force-decoded in
/// batches of `batch` pairs, the matrix mapped back to the words, each target word linked to its most
/// attended source word.
pub fn align_words(
    lm: &LoadedModel,
    model: &Model,
    sources: &[String],
    targets: &[String],
    batch: usize,
) -> crate::error::Result<Vec<Alignment>> {
    use cgnmt_data::bpe::word_index_of_subwords;
    if sources.len() != targets.len() {
        return Err(crate::error::NmtError::Data(format!(
            "{} source sentences but {} target sentences",
            sources.len(),
            targets.len()
        )));
    }
    let words = |l: &String| -> Vec<String> { l.split_whitespace().map(str::to_string).collect() };
    let (mut sids, mut tids, mut smap, mut tmap) = (vec![], vec![], vec![], vec![]);
    for (s, t) in sources.iter().zip(targets) {
        let st = lm.preprocess.src_bpe_apply(&words(s));
        let tt = lm.preprocess.tgt_bpe_apply(&words(t));
        smap.push(word_index_of_subwords(&st));
        tmap.push(word_index_of_subwords(&tt));
        sids.push(lm.src_vocab.encode(&st));
        tids.push(lm.tgt_vocab.encode(&tt));
    }
    let res = force_decode_all(model, &sids, &tids, lm.tgt_vocab.eos(), batch)?;
    Ok(res
        .into_iter()
        .enumerate()
        .map(|(k, (att, gates))| {
            let attention = to_words(&att, &smap[k], &tmap[k]);
            Alignment {
                links: argmax_links(&attention),
                attention,
                gates,
            }
        })
        .collect())
}

/// Attention `[target token][source token]` (EOS included on both sides) and mean gate values per target
/// token (empty when the model has no gate), from teacher forcing on `(src, tgt)` pairs.
pub fn force_decode(
    model: &Model,
    srcs: &[Vec<u32>],
    tgts: &[Vec<u32>],
    eos: u32,
) -> Result<Vec<(Vec<Vec<f32>>, Vec<f32>)>> {
    let dev = model.tgt_emb.device().clone();
    let dtype = model.tgt_emb.dtype();
    let (s_ids, s_mask) = pad(srcs, eos, dtype, &dev)?;
    let (t_ids, _) = pad(tgts, eos, dtype, &dev)?;
    let src = model.encode(&s_ids, &s_mask)?;
    let (b, t_len) = t_ids.dims2()?;
    let view = SourceView::sentences(&src, None, &[]);
    let mut state = model.start(&src, true)?;
    let mut alphas: Vec<Vec<Vec<f32>>> = Vec::with_capacity(t_len);
    let mut gates: Vec<Option<Vec<f32>>> = Vec::with_capacity(t_len);
    for i in 0..t_len {
        let step = model.step(view, &state, (1.0, 1.0), None)?;
        alphas.push(step.alpha.to_dtype(DType::F32)?.to_vec2()?);
        let word = model.word_terms(&model.embed(&t_ids.narrow(1, i, 1)?.squeeze(1)?)?)?;
        let (next, sc) = model.feed(&step, None, word, (1.0, 1.0), None)?;
        gates.push(match step.gate.or(sc.gate) {
            Some(g) if g.rank() == 2 => Some(g.to_dtype(DType::F32)?.mean(1)?.to_vec1()?),
            Some(g) => Some(vec![g.to_dtype(DType::F32)?.mean_all()?.to_scalar()?; b]),
            None => None,
        });
        state = next;
    }
    let mut out = Vec::with_capacity(b);
    for k in 0..b {
        let (ls, lt) = (srcs[k].len() + 1, tgts[k].len() + 1);
        let att: Vec<Vec<f32>> = (0..lt).map(|i| alphas[i][k][..ls].to_vec()).collect();
        let g: Vec<f32> = (0..lt - 1)
            .filter_map(|i| gates[i].as_ref().map(|v| v[k]))
            .collect();
        out.push((att, g));
    }
    Ok(out)
}

/// Map a token-level matrix (EOS row/column last, ignored) to words: `src_word[i]` / `tgt_word[j]` give the
/// word of each non-EOS token. Returns `[target word][source word]`, rows renormalised to sum to 1.
pub fn to_words(att: &[Vec<f32>], src_word: &[usize], tgt_word: &[usize]) -> Vec<Vec<f64>> {
    let nsw = src_word.iter().max().map(|m| m + 1).unwrap_or(0);
    let ntw = tgt_word.iter().max().map(|m| m + 1).unwrap_or(0);
    let mut m = vec![vec![0.0f64; nsw]; ntw];
    let mut rows = vec![0usize; ntw];
    for (j, &tw) in tgt_word.iter().enumerate() {
        rows[tw] += 1;
        for (i, &sw) in src_word.iter().enumerate() {
            m[tw][sw] += att[j][i] as f64;
        }
    }
    for (row, n) in m.iter_mut().zip(rows) {
        let s: f64 = row.iter().sum();
        if n > 0 && s > 0.0 {
            row.iter_mut().for_each(|x| *x /= s);
        }
    }
    m
}

/// Hard links `(source word, target word)`: the argmax source word of every target word row, the first
/// on ties (the one rule of the toolkit: [`cgnmt_eval::aer::argmax_links`], which `aer --soft` applies too).
pub fn argmax_links(m: &[Vec<f64>]) -> Vec<(usize, usize)> {
    cgnmt_eval::aer::argmax_links(std::slice::from_ref(&m.to_vec()))
        .pop()
        .unwrap_or_default()
}

/// How `translate --alignment` links output words to source words.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AlignmentMode {
    /// Each output word to its most attended source word (the first on ties), as `cgnmt align` does.
    Hard,
    /// Every link whose attention is at least this probability (in (0, 1]).
    Threshold(f64),
    /// Each output word's attention over the source words (the word-level matrix).
    Soft,
}

impl std::str::FromStr for AlignmentMode {
    type Err = String;

    /// `hard`, `soft`, or a probability `P` in (0, 1].
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "hard" => Ok(AlignmentMode::Hard),
            "soft" => Ok(AlignmentMode::Soft),
            _ => match s.parse::<f64>() {
                Ok(p) if p > 0.0 && p <= 1.0 => Ok(AlignmentMode::Threshold(p)),
                _ => Err(format!(
                    "{s:?}: expected hard, soft or a probability in (0, 1] (links with at least that attention)"
                )),
            },
        }
    }
}

/// A translation at the level of words, subword pieces merged as [`align_words`] merges them: a word's
/// attention column is the sum of its pieces', its row the sum of its pieces' rows (renormalised over the
/// source words), its log-probability the sum of its pieces' and its gate value their mean.
#[derive(Debug, Clone, PartialEq)]
pub struct WordLevel {
    /// Attention `[output word][source word]` (EOS left out), rows summing to 1; empty when the
    /// hypothesis recorded no attention.
    pub attention: Vec<Vec<f64>>,
    /// Each output word's log-probability (empty when the hypothesis recorded none).
    pub word_scores: Vec<f64>,
    /// Each output word's mean gate value (empty without a gate, or when none was recorded).
    pub word_gates: Vec<f32>,
}

impl WordLevel {
    /// The word-level view of hypothesis `h`, whose source and output are the model's tokens `src_pieces` and
    /// `out_pieces` (the hypothesis's own tokens, BPE pieces marked as `cgnmt_data::bpe` marks them).
    pub fn of(src_pieces: &[String], out_pieces: &[String], h: &Hypothesis) -> WordLevel {
        use cgnmt_data::bpe::word_index_of_subwords;
        let smap = word_index_of_subwords(src_pieces);
        let tmap = word_index_of_subwords(out_pieces);
        let nw = tmap.last().map_or(0, |w| w + 1);
        let attention = if h.attention.len() >= out_pieces.len() && !out_pieces.is_empty() {
            to_words(&h.attention, &smap, &tmap)
        } else {
            vec![]
        };
        let mut word_scores = vec![];
        if h.word_scores.len() >= out_pieces.len() {
            word_scores = vec![0.0f64; nw];
            for (k, &w) in tmap.iter().enumerate() {
                word_scores[w] += h.word_scores[k] as f64;
            }
        }
        let mut word_gates = vec![];
        if !h.gates.is_empty() && h.gates.len() >= out_pieces.len() {
            let (mut sum, mut n) = (vec![0.0f32; nw], vec![0usize; nw]);
            for (k, &w) in tmap.iter().enumerate() {
                sum[w] += h.gates[k];
                n[w] += 1;
            }
            word_gates = sum.iter().zip(&n).map(|(s, &c)| s / c as f32).collect();
        }
        WordLevel {
            attention,
            word_scores,
            word_gates,
        }
    }

    /// The links `(source word, output word)` of `mode` (none for [`AlignmentMode::Soft`]), in output word
    /// order, then source word order.
    pub fn links(&self, mode: AlignmentMode) -> Vec<(usize, usize)> {
        match mode {
            AlignmentMode::Hard => argmax_links(&self.attention),
            AlignmentMode::Threshold(p) => self
                .attention
                .iter()
                .enumerate()
                .flat_map(|(j, row)| {
                    row.iter()
                        .enumerate()
                        .filter(move |(_, &a)| a >= p)
                        .map(move |(i, _)| (i, j))
                })
                .collect(),
            AlignmentMode::Soft => vec![],
        }
    }
}

/// Force-decode in batches; a convenience over [`force_decode`].
pub fn force_decode_all(
    model: &Model,
    srcs: &[Vec<u32>],
    tgts: &[Vec<u32>],
    eos: u32,
    batch: usize,
) -> Result<Vec<(Vec<Vec<f32>>, Vec<f32>)>> {
    let mut out = Vec::with_capacity(srcs.len());
    for (s, t) in srcs.chunks(batch.max(1)).zip(tgts.chunks(batch.max(1))) {
        out.extend(force_decode(model, s, t, eos)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_from_subwords_and_argmax() {
        // Source tokens: a@@ b | c | </s>  → words 0,0,1,2 ; target tokens: x | y@@ z | </s> → 0,1,1,2
        let att = vec![
            vec![0.1, 0.1, 0.7, 0.1],
            vec![0.4, 0.4, 0.1, 0.1],
            vec![0.2, 0.2, 0.5, 0.1],
            vec![0.0, 0.0, 0.0, 1.0],
        ];
        let m = to_words(&att, &[0, 0, 1], &[0, 1, 1]);
        assert_eq!(m.len(), 2);
        assert!((m[0][0] - 0.2 / 0.9).abs() < 1e-6 && (m[0][1] - 0.7 / 0.9).abs() < 1e-6);
        // Row 1 sums token rows 1 and 2: word0 = 0.8 + 0.4, word1 = 0.1 + 0.5, renormalised.
        assert!((m[1][0] - 1.2 / 1.8).abs() < 1e-6 && (m[1][1] - 0.6 / 1.8).abs() < 1e-6);
        assert_eq!(argmax_links(&m), vec![(1, 0), (0, 1)]);
    }

    #[test]
    fn ties_go_to_the_first_source_word_as_in_aer() {
        let m = vec![
            vec![0.5, 0.5, 0.0],
            vec![0.2, 0.4, 0.4],
            vec![0.0, 0.0, 0.0],
        ];
        assert_eq!(argmax_links(&m), vec![(0, 0), (1, 1), (0, 2)]);
        assert_eq!(
            argmax_links(&m),
            cgnmt_eval::aer::argmax_links(std::slice::from_ref(&m))[0]
        );
    }
}
