//! From text to text: preprocess source lines, decode them in length-sorted batches, restore the input order and
//! post-process the output (BPE merge, detokenisation). Exactly one output per input, empty lines included.

use cgnmt_data::preprocess::Preprocessor;
use cgnmt_data::vocab::Vocab;

use crate::decode::beam_search::{beam_search_batches, length_limits, DecodeOptions, Hypothesis};
use crate::decode::constraints::Steering;
use crate::error::Result;
use crate::model::Model;

/// What to do with an input line longer than a limit (in model tokens, after tokenisation and BPE).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LongInput {
    /// Translate it in consecutive pieces of at most the limit and join their outputs.
    Split,
    /// Translate its first tokens up to the limit only.
    Truncate,
}

/// The limit on input length: `max_words` model tokens per line (0 = none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InputLimit {
    pub max_words: usize,
    pub long_input: LongInput,
}

impl InputLimit {
    pub const NONE: InputLimit = InputLimit {
        max_words: 0,
        long_input: LongInput::Split,
    };
}

/// A line that was over the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LongLine {
    /// 0-based index of the line in the call's input.
    pub index: usize,
    pub words: usize,
    /// Pieces it was translated in (1 when truncated).
    pub pieces: usize,
}

/// What steers each line's output, as text the target side is written in (tokens with `pretokenized`):
/// each list empty (nothing) or one entry per line.
#[derive(Debug, Clone, Copy, Default)]
pub struct LineSteering<'a> {
    /// Target prefixes (an empty one for none): the output starts with the prefix's words and the search
    /// goes on from them.
    pub prefixes: &'a [String],
    /// Phrases the output must contain, each once, in any order (positive constraints).
    pub constraints: &'a [Vec<String>],
    /// Phrases the output must never contain (negative constraints).
    pub avoid: &'a [Vec<String>],
}

impl LineSteering<'_> {
    /// Nothing steers any line.
    pub fn is_empty(&self) -> bool {
        self.prefixes.is_empty() && self.constraints.is_empty() && self.avoid.is_empty()
    }
}

/// One translated sentence.
#[derive(Debug, Clone, Default)]
pub struct Translation {
    /// Post-processed output text.
    pub text: String,
    /// Source tokens as the model saw them (before mapping to ids; EOS not included).
    pub src_tokens: Vec<String>,
    /// Output tokens of the best hypothesis (before post-processing).
    pub tokens: Vec<String>,
    /// All returned hypotheses, best first.
    pub hyps: Vec<Hypothesis>,
}

/// The text pipeline over decoding models (borrowed): tokenise and encode the source lines, decode them in
/// length-sorted batches, decode and post-process the outputs. [`crate::Translator`] owns the models it
/// borrows; training's evaluations build one over the model being trained.
pub struct Pipeline<'a> {
    pub model: &'a Model,
    /// The other members of an ensemble with `model` (empty: `model` alone); they share its vocabularies
    /// and preprocessing.
    pub others: Vec<&'a Model>,
    pub src_vocab: &'a Vocab,
    pub tgt_vocab: &'a Vocab,
    pub preprocess: &'a Preprocessor,
}

impl<'a> Pipeline<'a> {
    /// The pipeline of a loaded model directory, decoding with `model` (its frozen form).
    pub fn of(model: &'a Model, lm: &'a crate::model::store::LoadedModel) -> Self {
        Pipeline {
            model,
            others: vec![],
            src_vocab: &lm.src_vocab,
            tgt_vocab: &lm.tgt_vocab,
            preprocess: &lm.preprocess,
        }
    }

    /// Source tokens of a line: through the model's tokenizer/BPE, or split on whitespace when `pretokenized`.
    pub fn source_tokens(&self, line: &str, pretokenized: bool) -> Vec<String> {
        if pretokenized {
            line.split_whitespace().map(str::to_string).collect()
        } else {
            self.preprocess.src_tokens(line)
        }
    }

    pub fn detok(&self, tokens: &[String]) -> String {
        self.preprocess.postprocess_tgt(tokens)
    }

    /// Translate `lines` in batches of `batch` sentences (sorted by length inside the call; batches decoded
    /// concurrently, see [`beam_search_batches`]).
    pub fn translate(
        &self,
        lines: &[String],
        opts: &DecodeOptions,
        batch: usize,
        pretokenized: bool,
        progress: impl FnMut(usize) + Send,
    ) -> Result<Vec<Translation>> {
        Ok(self
            .translate_within(
                lines,
                LineSteering::default(),
                opts,
                batch,
                pretokenized,
                InputLimit::NONE,
                progress,
            )?
            .0)
    }

    /// [`Pipeline::translate`] with lines longer than `limit.max_words` model tokens split into pieces
    /// (each translated as a sentence, their outputs joined) or truncated; the long lines are returned so the
    /// caller can say which. A split line's n-best list holds one hypothesis, its pieces' best ones joined
    /// (scores added, attention rows placed over each piece's source positions).
    ///
    /// `steer` steers the lines ([`LineSteering`]): a split line's first piece takes its target prefix,
    /// every piece its avoided phrases, and its positive constraints are shared out over the pieces in
    /// order (of m constraints over P pieces, the j-th goes to piece ⌊j·P/m⌋). An empty source line stays
    /// empty.
    #[allow(clippy::too_many_arguments)]
    pub fn translate_within(
        &self,
        lines: &[String],
        steer: LineSteering<'_>,
        opts: &DecodeOptions,
        batch: usize,
        pretokenized: bool,
        limit: InputLimit,
        progress: impl FnMut(usize) + Send,
    ) -> Result<(Vec<Translation>, Vec<LongLine>)> {
        let mut toks: Vec<Vec<String>> = lines
            .iter()
            .map(|l| self.source_tokens(l, pretokenized))
            .collect();
        // Decoding units: (line, token range). A line within the limit is one unit.
        let mut units: Vec<(usize, std::ops::Range<usize>)> = vec![];
        let mut long = vec![];
        for (i, t) in toks.iter_mut().enumerate() {
            let n = t.len();
            let ranges = limit.pieces(n);
            if ranges.len() > 1 || ranges[0].end < n {
                long.push(LongLine {
                    index: i,
                    words: n,
                    pieces: ranges.len(),
                });
                t.truncate(ranges.last().map_or(n, |r| r.end));
            }
            units.extend(ranges.into_iter().map(|r| (i, r)));
        }
        let ids: Vec<Vec<u32>> = units
            .iter()
            .map(|(i, r)| self.src_vocab.encode(&toks[*i][r.clone()]))
            .collect();
        let steer_ids = self.steering_ids(steer, lines.len(), pretokenized)?;
        // A unit's steering: its line's, shared out over the line's pieces.
        let mut unit_steering: Vec<Steering> = Vec::with_capacity(units.len());
        if !steer_ids.is_empty() {
            let mut u = 0;
            while u < units.len() {
                let i = units[u].0;
                let pieces = units[u..].iter().take_while(|x| x.0 == i).count();
                unit_steering.extend(split_steering(&steer_ids[i], pieces));
                u += pieces;
            }
            for (u, (i, _)) in units.iter().enumerate() {
                steering_fits(*i, &unit_steering[u], ids[u].len())?;
            }
        }
        let mut order: Vec<usize> = (0..units.len()).filter(|&u| !ids[u].is_empty()).collect();
        order.sort_by_key(|&u| std::cmp::Reverse(ids[u].len()));
        let eos = self.tgt_vocab.eos();
        // Progress counts lines: a line is done with its last piece.
        let mut pieces_left = vec![0usize; lines.len()];
        for &u in &order {
            pieces_left[units[u].0] += 1;
        }
        let empty_lines = pieces_left.iter().filter(|&&n| n == 0).count();
        let progress = std::sync::Mutex::new((empty_lines, progress));
        let report = |n: usize| {
            let mut p = progress.lock().expect("progress");
            p.0 += n;
            let d = p.0;
            (p.1)(d);
        };
        report(0);
        let chunks: Vec<&[usize]> = order.chunks(batch.max(1)).collect();
        let batches: Vec<Vec<Vec<u32>>> = chunks
            .iter()
            .map(|c| c.iter().map(|&u| ids[u].clone()).collect())
            .collect();
        let steer_batches: Vec<Vec<Steering>> = match unit_steering.is_empty() {
            true => vec![],
            false => chunks
                .iter()
                .map(|c| c.iter().map(|&u| unit_steering[u].clone()).collect())
                .collect(),
        };
        let steer_batches = (!unit_steering.is_empty()).then_some(&steer_batches[..]);
        let split = !long.is_empty() && limit.long_input == LongInput::Split;
        // With split lines, progress is reported per batch as whole lines finish below; otherwise per unit.
        let mut models = vec![self.model];
        models.extend(self.others.iter().copied());
        let hyps = if split {
            beam_search_batches(&models, &batches, steer_batches, eos, opts, |_| {})?
        } else {
            beam_search_batches(&models, &batches, steer_batches, eos, opts, &report)?
        };
        let mut unit_hyps: Vec<Vec<Hypothesis>> = vec![vec![]; units.len()];
        for (chunk, hyps) in chunks.iter().zip(hyps) {
            for (&u, h) in chunk.iter().zip(hyps) {
                unit_hyps[u] = h;
            }
        }
        let mut out: Vec<Translation> = toks
            .iter()
            .map(|t| Translation {
                src_tokens: t.clone(),
                ..Default::default()
            })
            .collect();
        let mut u = 0;
        while u < units.len() {
            let i = units[u].0;
            let mut end = u + 1;
            while end < units.len() && units[end].0 == i {
                end += 1;
            }
            let h = if end - u == 1 {
                std::mem::take(&mut unit_hyps[u])
            } else {
                let parts: Vec<(usize, Option<&Hypothesis>)> = (u..end)
                    .map(|k| (units[k].1.len(), unit_hyps[k].first()))
                    .collect();
                vec![join_pieces(&parts)]
            };
            let tokens = h
                .first()
                .map(|b| self.tgt_vocab.decode(&b.tokens))
                .unwrap_or_default();
            out[i].text = self.detok(&tokens);
            out[i].tokens = tokens;
            out[i].hyps = h;
            if split {
                report(1);
            }
            u = end;
        }
        Ok((out, long))
    }
}

/// An error naming line `line` (0-based) when its piece's steering cannot fit the output of a source of
/// `n` tokens: a target prefix or a positive constraint longer than that output may be. (Constraints that
/// fit one by one but not together are decoded, and the output that met most of them is warned about.)
fn steering_fits(line: usize, st: &Steering, n: usize) -> Result<()> {
    let max = length_limits(n).1;
    if n == 0 {
        return Ok(());
    }
    if st.prefix.len() > max {
        return Err(crate::error::NmtError::Options(format!(
            "line {}: a target prefix of {} tokens, more than the {max} that the output of its {n} source tokens may have",
            line + 1,
            st.prefix.len()
        )));
    }
    if let Some(p) = st.include.iter().find(|p| p.len() > max) {
        return Err(crate::error::NmtError::Options(format!(
            "line {}: a constraint of {} tokens, more than the {max} that the output of its {n} source tokens may have",
            line + 1,
            p.len()
        )));
    }
    Ok(())
}

/// A line's steering shared out over its `pieces` (see [`Pipeline::translate_within`]).
fn split_steering(st: &Steering, pieces: usize) -> Vec<Steering> {
    let m = st.include.len();
    (0..pieces)
        .map(|q| Steering {
            prefix: if q == 0 { st.prefix.clone() } else { vec![] },
            include: (0..m)
                .filter(|j| j * pieces / m.max(1) == q)
                .map(|j| st.include[j].clone())
                .collect(),
            avoid: st.avoid.clone(),
        })
        .collect()
}

impl InputLimit {
    /// The token ranges a line of `n` model tokens is decoded in: the whole line within the limit, else its
    /// first `max_words` tokens (truncate) or equal consecutive pieces of at most `max_words` (split; equal
    /// pieces rather than full ones and a short rest).
    pub fn pieces(&self, n: usize) -> Vec<std::ops::Range<usize>> {
        if self.max_words == 0 || n <= self.max_words {
            return vec![0..n];
        }
        match self.long_input {
            LongInput::Truncate => vec![0..self.max_words],
            LongInput::Split => {
                let pieces = n.div_ceil(self.max_words);
                let size = n.div_ceil(pieces);
                (0..pieces)
                    .map(|k| k * size..((k + 1) * size).min(n))
                    .collect()
            }
        }
    }
}

impl Pipeline<'_> {
    /// Check the steering of `lines` before decoding them (as [`Pipeline::translate_within`] would), so
    /// that an error names the line among all of them: a token outside the target vocabulary, an empty
    /// phrase, a prefix or constraint longer than the output of its line (its piece) may be, or a count
    /// other than the lines'.
    pub fn check_steering(
        &self,
        lines: &[String],
        steer: LineSteering<'_>,
        pretokenized: bool,
        limit: InputLimit,
    ) -> Result<()> {
        let ids = self.steering_ids(steer, lines.len(), pretokenized)?;
        for (i, (l, st)) in lines.iter().zip(&ids).enumerate() {
            let n = self.source_tokens(l, pretokenized).len();
            let pieces = limit.pieces(n);
            for (piece, range) in split_steering(st, pieces.len()).iter().zip(&pieces) {
                steering_fits(i, piece, range.len())?;
            }
        }
        Ok(())
    }

    /// The lines' steering as target ids (none when nothing steers them); an error names a line whose
    /// prefix or phrase has a token outside the target vocabulary, an empty phrase, a phrase both required
    /// and avoided, or a list whose count is not the lines'.
    fn steering_ids(
        &self,
        steer: LineSteering<'_>,
        lines: usize,
        pretokenized: bool,
    ) -> Result<Vec<Steering>> {
        if steer.is_empty() {
            return Ok(vec![]);
        }
        for (n, what) in [
            (steer.prefixes.len(), "target prefixes"),
            (steer.constraints.len(), "constraint lists"),
            (steer.avoid.len(), "avoid lists"),
        ] {
            if n != 0 && n != lines {
                return Err(crate::error::NmtError::Options(format!(
                    "{n} {what} for {lines} lines: give one per line (an empty one for none)"
                )));
            }
        }
        let ids =
            |i: usize, text: &str, what: &str| -> Result<Vec<u32>> {
                let toks: Vec<String> = if pretokenized {
                    text.split_whitespace().map(str::to_string).collect()
                } else {
                    self.preprocess.tgt_tokens(text)
                };
                let ids = self.tgt_vocab.encode(&toks);
                // (The unknown-word symbol itself, `<unk>`, is a token like any other: a reference forced as a
                // prefix may write its unknown words so.)
                if let Some(k) = ids.iter().zip(&toks).position(|(&w, t)| {
                    w == self.tgt_vocab.unk() && t != cgnmt_data::vocab::UNK_TOKEN
                }) {
                    return Err(crate::error::NmtError::Options(format!(
                        "line {}: the {what}'s token {:?} is not in the model's target vocabulary",
                        i + 1,
                        toks[k]
                    )));
                }
                Ok(ids)
            };
        let phrases = |i: usize, list: Option<&Vec<String>>, what: &str| -> Result<Vec<Vec<u32>>> {
            list.map_or(&[][..], |l| &l[..])
                .iter()
                .map(|p| {
                    let v = ids(i, p, what)?;
                    if v.is_empty() {
                        return Err(crate::error::NmtError::Options(format!(
                            "line {}: an empty {what} ({p:?})",
                            i + 1
                        )));
                    }
                    Ok(v)
                })
                .collect()
        };
        (0..lines)
            .map(|i| {
                let st = Steering {
                    prefix: match steer.prefixes.get(i) {
                        Some(p) => ids(i, p, "target prefix")?,
                        None => vec![],
                    },
                    include: phrases(i, steer.constraints.get(i), "constraint")?,
                    avoid: phrases(i, steer.avoid.get(i), "avoided phrase")?,
                };
                if let Some(p) = st.include.iter().find(|p| st.avoid.contains(p)) {
                    return Err(crate::error::NmtError::Options(format!(
                        "line {}: the phrase {:?} is both a constraint and avoided",
                        i + 1,
                        self.tgt_vocab.decode(p).join(" ")
                    )));
                }
                Ok(st)
            })
            .collect()
    }
}

/// One hypothesis from a split line's pieces, each `(source words, its best hypothesis)`: the tokens in
/// order, the scores added, each piece's attention rows placed over its source positions (its EOS column's
/// weight on the line's EOS), only the last piece's EOS row kept, gates and coverage in order.
fn join_pieces(parts: &[(usize, Option<&Hypothesis>)]) -> Hypothesis {
    let n: usize = parts.iter().map(|p| p.0).sum();
    let mut j = Hypothesis {
        tokens: vec![],
        score: 0.0,
        attention: vec![],
        gates: vec![],
        coverage: vec![],
        attention_mass: vec![],
        word_scores: vec![],
        unmet_constraints: 0,
    };
    let mut offset = 0;
    let last = parts.len() - 1;
    for (k, (len, h)) in parts.iter().enumerate() {
        if let Some(h) = h {
            j.tokens.extend_from_slice(&h.tokens);
            j.score += h.score;
            j.unmet_constraints += h.unmet_constraints;
            let rows = if k == last {
                h.attention.len()
            } else {
                h.attention.len().min(h.tokens.len())
            };
            for row in &h.attention[..rows] {
                let mut r = vec![0.0f32; n + 1];
                r[offset..offset + len].copy_from_slice(&row[..*len]);
                r[n] += row.get(*len).copied().unwrap_or(0.0);
                j.attention.push(r);
            }
            j.gates.extend_from_slice(&h.gates);
            // Each piece's tokens' scores; its EOS's only for the last piece (the score keeps them all).
            let scored = if k == last {
                h.word_scores.len()
            } else {
                h.word_scores.len().min(h.tokens.len())
            };
            j.word_scores.extend_from_slice(&h.word_scores[..scored]);
            if !h.coverage.is_empty() {
                j.coverage.extend_from_slice(&h.coverage[..*len]);
                if k == last {
                    j.coverage.extend_from_slice(&h.coverage[*len..]);
                }
            }
        }
        offset += len;
    }
    j
}
