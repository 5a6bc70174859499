//! From text to text: preprocess source lines, decode them in length-sorted batches, restore the input order and
//! post-process the output (BPE merge, detokenisation). Exactly one output per input, empty lines included.

use cgnmt_data::preprocess::Preprocessor;
use cgnmt_data::vocab::Vocab;

use crate::beam_search::{beam_search_batches, DecodeOptions, Hypothesis};
use crate::error::Result;
use crate::model::Model;

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

pub struct Translator<'a> {
    pub model: &'a Model,
    pub src_vocab: &'a Vocab,
    pub tgt_vocab: &'a Vocab,
    pub preprocess: &'a Preprocessor,
}

impl Translator<'_> {
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
        let toks: Vec<Vec<String>> = lines
            .iter()
            .map(|l| self.source_tokens(l, pretokenized))
            .collect();
        let ids: Vec<Vec<u32>> = toks.iter().map(|t| self.src_vocab.encode(t)).collect();
        let mut order: Vec<usize> = (0..lines.len()).filter(|&i| !ids[i].is_empty()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(ids[i].len()));
        let mut out: Vec<Translation> = toks
            .iter()
            .map(|t| Translation {
                src_tokens: t.clone(),
                ..Default::default()
            })
            .collect();
        let eos = self.tgt_vocab.eos();
        let progress = std::sync::Mutex::new((lines.len() - order.len(), progress));
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
            .map(|c| c.iter().map(|&i| ids[i].clone()).collect())
            .collect();
        let hyps = beam_search_batches(self.model, &batches, eos, opts, report)?;
        for (chunk, hyps) in chunks.iter().zip(hyps) {
            for (&i, h) in chunk.iter().zip(hyps) {
                let tokens = h
                    .first()
                    .map(|b| self.tgt_vocab.decode(&b.tokens))
                    .unwrap_or_default();
                out[i].text = self.detok(&tokens);
                out[i].tokens = tokens;
                out[i].hyps = h;
            }
        }
        Ok(out)
    }
}
