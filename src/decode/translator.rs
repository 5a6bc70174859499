//! The library's front door for decoding: a [`Translator`] opens one model directory (or several, an
//! ensemble) and translates batches of sentences with per-call [`TranslateOptions`], returning each
//! sentence's text, tokens, score, n-best list and, on request, its attention, gate values and coverage. It
//! also force-aligns sentence pairs ([`Translator::align`]). The command line (`translate`, `align`), the
//! server and the Python package all call it.
//!
//! ```no_run
//! use cgnmt::{TranslateOptions, Translator, TranslatorOptions};
//!
//! let tr = Translator::open(&["runs/demo/model-improved/best"], &TranslatorOptions::default())?;
//! let out = tr.translate(&["我赢了。".to_string()], &TranslateOptions::default())?;
//! println!("{} ({:.2})", out[0].text, out[0].hyps[0].score);
//! # Ok::<(), cgnmt::NmtError>(())
//! ```

use std::path::{Path, PathBuf};
use std::sync::Arc;

use candle_core::{DType, Device};

use crate::decode::alignment::Alignment;
use crate::decode::beam_search::{DecodeOptions, Hypothesis};
use crate::decode::shortlist::{Lexicon, Shortlist};
use crate::decode::translate::{InputLimit, LongInput, LongLine, Pipeline, Translation};
use crate::error::{NmtError, Result};
use crate::model::store::{self, LoadedModel};
use crate::model::Model;

/// A shortlist to decode over (see [`crate::decode::shortlist`]): a lexicon from `cgnmt shortlist`, the most
/// frequent target words every batch takes and the most probable ones per source word.
#[derive(Debug, Clone, PartialEq)]
pub struct ShortlistOptions {
    pub lexicon: PathBuf,
    pub frequent: usize,
    pub per_word: usize,
}

impl ShortlistOptions {
    /// The lexicon at `lexicon` with the command line's defaults: 100 frequent words, 50 per source word.
    pub fn new(lexicon: impl Into<PathBuf>) -> Self {
        ShortlistOptions {
            lexicon: lexicon.into(),
            frequent: 100,
            per_word: 50,
        }
    }
}

/// What a [`Translator`] fixes when it is opened.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TranslatorOptions {
    /// Decode the per-step products in 8-bit integers (approximate; x86-64 with AVX2, else f32).
    pub int8: bool,
    /// Decode each batch over a shortlist of target words (approximate).
    pub shortlist: Option<ShortlistOptions>,
}

/// The decoding options of one call. The defaults are the command line's: beam 10, one hypothesis,
/// GroundHog's ranking by total log-probability, no context scaling, batches of 32 sentences, input lines of
/// more than 200 model tokens translated in pieces.
#[derive(Debug, Clone)]
pub struct TranslateOptions {
    /// Beam size (1: greedy).
    pub beam: usize,
    /// Hypotheses returned per sentence (at most `beam`).
    pub nbest: usize,
    /// Rank hypotheses by log-probability per word instead of the total.
    pub length_norm: bool,
    /// GNMT's length penalty α (0: the total log-probability).
    pub length_penalty: f64,
    /// GNMT's coverage penalty β (0: none).
    pub coverage_penalty: f64,
    /// Decode-time context scaling: source-context terms × the first, target-side terms × the second.
    pub context_scale: (f64, f64),
    /// Keep each hypothesis's attention rows, gate values and coverage.
    pub record: bool,
    /// Keep each hypothesis's log-probability of every token ([`Hypothesis::word_scores`]) and, to give
    /// each output word's mean gate value, its gate values.
    pub word_scores: bool,
    /// Keep each hypothesis's attention rows, to link output words to source words in this mode
    /// ([`crate::decode::alignment::WordLevel`]; `translate --alignment`).
    pub alignment: Option<crate::decode::alignment::AlignmentMode>,
    /// Target prefixes, one per line (empty: none): each output starts with its line's prefix, text as the
    /// target side is written (tokens when `pretokenized`), and the search goes on from it.
    pub target_prefix: Vec<String>,
    /// Positive constraints, one list per line (empty: none): phrases each line's output must contain,
    /// each once, in any order ([`crate::decode::constraints`]; text as the target side is written).
    pub constraints: Vec<Vec<String>>,
    /// Negative constraints, one list per line (empty: none): phrases each line's output must not contain.
    pub avoid: Vec<Vec<String>>,
    /// Decode until the beam has shrunk to nothing (same output, more steps).
    pub full_beam: bool,
    /// Gather the words' products from a table formed once per call (same output, faster).
    pub word_table: bool,
    /// Sentences decoded together.
    pub batch: usize,
    /// The input is already tokenised (split on whitespace; no tokeniser or BPE applied).
    pub pretokenized: bool,
    /// Longest input in model tokens (0: no limit) and what happens to a longer one.
    pub input_limit: InputLimit,
    /// A flag another thread may set to stop the call before its next batch (an error then; see
    /// [`DecodeOptions::stop`]).
    pub stop: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// At most this many target tokens per output (`None`: three times the source's length plus one; see
    /// [`DecodeOptions::max_length`]).
    pub max_decoding_length: Option<usize>,
    /// No EOS before this many target tokens (`None`: half the source's length plus one; see
    /// [`DecodeOptions::min_length`]).
    pub min_decoding_length: Option<usize>,
}

/// The options of [`Translator::score`]. The defaults: raw text on both sides (the model's tokenisers and
/// subwords applied), no context scaling, batches of 32 pairs.
#[derive(Debug, Clone)]
pub struct ScoreOptions {
    /// Both sides are already in the model's tokens (split on whitespace; no tokeniser or BPE applied).
    pub pretokenized: bool,
    /// Context scaling as in [`TranslateOptions::context_scale`].
    pub context_scale: (f64, f64),
    /// Pairs scored together.
    pub batch: usize,
}

impl Default for ScoreOptions {
    fn default() -> Self {
        ScoreOptions {
            pretokenized: false,
            context_scale: (1.0, 1.0),
            batch: 32,
        }
    }
}

/// A sentence pair's score under the model (or the ensemble's mean log-probabilities).
#[derive(Debug, Clone, PartialEq)]
pub struct Score {
    /// The target as the model's tokens (EOS not included).
    pub tokens: Vec<String>,
    /// The natural-log probability of each token and of the final EOS (`tokens.len() + 1` values).
    pub token_scores: Vec<f32>,
    /// Their sum: the log-probability of the whole target, as the beam search's total for the same
    /// hypothesis (without penalties).
    pub score: f64,
}

impl TranslateOptions {
    /// The per-line steering these options carry (prefixes, constraints, avoided phrases).
    pub fn steering(&self) -> crate::decode::translate::LineSteering<'_> {
        crate::decode::translate::LineSteering {
            prefixes: &self.target_prefix,
            constraints: &self.constraints,
            avoid: &self.avoid,
        }
    }

    /// These options for the lines `pick` (indices into the lines they were made for): the per-line lists
    /// cut to those lines, in that order.
    pub fn for_lines(&self, pick: impl Iterator<Item = usize> + Clone) -> TranslateOptions {
        fn cut<T: Clone>(v: &[T], pick: impl Iterator<Item = usize>) -> Vec<T> {
            if v.is_empty() {
                vec![]
            } else {
                pick.map(|i| v[i].clone()).collect()
            }
        }
        TranslateOptions {
            target_prefix: cut(&self.target_prefix, pick.clone()),
            constraints: cut(&self.constraints, pick.clone()),
            avoid: cut(&self.avoid, pick),
            ..self.clone()
        }
    }
}

impl Default for TranslateOptions {
    fn default() -> Self {
        TranslateOptions {
            beam: 10,
            nbest: 1,
            length_norm: false,
            length_penalty: 0.0,
            coverage_penalty: 0.0,
            context_scale: (1.0, 1.0),
            record: false,
            word_scores: false,
            alignment: None,
            target_prefix: vec![],
            constraints: vec![],
            avoid: vec![],
            full_beam: false,
            word_table: true,
            batch: 32,
            pretokenized: false,
            input_limit: InputLimit {
                max_words: 200,
                long_input: LongInput::Split,
            },
            stop: None,
            max_decoding_length: None,
            min_decoding_length: None,
        }
    }
}

/// A context scale written `a,b` (source-context terms × a, target-side terms × b), as the command line
/// takes it; the range is checked with the other decoding options.
pub fn parse_context_scale(s: &str) -> std::result::Result<(f64, f64), String> {
    let (a, b) = s
        .split_once(',')
        .ok_or_else(|| format!("expected A,B (e.g. 1.0,0.5), got {s:?}"))?;
    let num = |x: &str| {
        x.trim()
            .parse::<f64>()
            .map_err(|_| format!("not a number: {x:?}"))
    };
    Ok((num(a)?, num(b)?))
}

/// An opened model (or ensemble) ready to translate. It can be shared by threads (`&self` everywhere).
pub struct Translator {
    members: Vec<LoadedModel>,
    frozen: Vec<Model>,
    shortlist: Option<Arc<Shortlist>>,
    int8: bool,
    notes: Vec<String>,
    settings: Option<crate::decode::settings::DecodingSettings>,
}

impl Translator {
    /// Open model directories (a run directory means its `best/` model); several make an ensemble, whose
    /// models must share vocabularies and preprocessing.
    pub fn open<P: AsRef<Path>>(model_dirs: &[P], opts: &TranslatorOptions) -> Result<Translator> {
        let Some(first) = model_dirs.first() else {
            return Err(NmtError::Options("no model directory given".into()));
        };
        let load = |p: &Path| store::load(&store::resolve_model_dir(p), DType::F32, &Device::Cpu);
        let mut members = vec![load(first.as_ref())?];
        for p in &model_dirs[1..] {
            let other = load(p.as_ref())?;
            members[0].check_ensemble(&other)?;
            members.push(other);
        }
        let frozen = members
            .iter()
            .map(|m| m.model.frozen(&m.varmap))
            .collect::<candle_core::Result<Vec<_>>>()?;
        let mut notes = vec![];
        if opts.int8 && !crate::kernels::quantized_gemm::available() {
            notes.push("int8 decoding needs a CPU with AVX2; decoding in f32".to_string());
        }
        let shortlist = match &opts.shortlist {
            None => None,
            Some(s) => {
                if s.frequent == 0 && s.per_word == 0 {
                    return Err(NmtError::Options(
                        "the shortlist's frequent and per-word counts are both 0: it would be empty".into(),
                    ));
                }
                let lex = Lexicon::load(&s.lexicon)?;
                let m = &members[0];
                let sl = Shortlist::new(&lex, &m.src_vocab, &m.tgt_vocab, s.frequent, s.per_word);
                if sl.is_empty() {
                    notes.push(format!(
                        "no source word of {} is in the model's source vocabulary with a target word in its \
                         target vocabulary: each batch decodes over the {} most frequent words only",
                        s.lexicon.display(),
                        s.frequent
                    ));
                }
                Some(Arc::new(sl))
            }
        };
        let settings = crate::decode::settings::DecodingSettings::read(&members[0].dir)?;
        Ok(Translator {
            members,
            frozen,
            shortlist,
            int8: opts.int8,
            notes,
            settings,
        })
    }

    /// The decoding settings chosen on dev that the first model's directory keeps (`decoding.toml`, see
    /// [`crate::decode::settings`]), if any.
    pub fn settings(&self) -> Option<&crate::decode::settings::DecodingSettings> {
        self.settings.as_ref()
    }

    /// This model's default options: [`TranslateOptions::default`] with the length and coverage penalties
    /// chosen on dev where the model keeps them ([`Translator::settings`]).
    pub fn options(&self) -> TranslateOptions {
        let mut o = TranslateOptions::default();
        if let Some(s) = &self.settings {
            o.length_penalty = s.length_penalty;
            o.coverage_penalty = s.coverage_penalty;
        }
        o
    }

    /// The first (or only) model: its directory, configuration, vocabularies and preprocessing.
    pub fn model(&self) -> &LoadedModel {
        &self.members[0]
    }

    /// Every model of the ensemble, the first one first.
    pub fn members(&self) -> &[LoadedModel] {
        &self.members
    }

    /// What opening noticed and the user should hear (int8 unavailable, a shortlist that matches nothing).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// The text pipeline over the frozen models (tokenise, decode in batches, post-process).
    pub fn pipeline(&self) -> Pipeline<'_> {
        let m = &self.members[0];
        Pipeline {
            model: &self.frozen[0],
            others: self.frozen[1..].iter().collect(),
            src_vocab: &m.src_vocab,
            tgt_vocab: &m.tgt_vocab,
            preprocess: &m.preprocess,
        }
    }

    /// The search's settings for `o`, checked; an error names the option as `name` spells it (the command
    /// line passes `--beam`, the library and the Python package `beam`).
    pub fn decode_options(
        &self,
        o: &TranslateOptions,
        name: impl Fn(&str) -> String,
    ) -> Result<DecodeOptions> {
        let opts = DecodeOptions {
            beam: o.beam,
            length_norm: o.length_norm,
            length_penalty: o.length_penalty,
            coverage_penalty: o.coverage_penalty,
            nbest: o.nbest,
            context_scale: o.context_scale,
            // Word scores' gate values and alignments read what recording keeps.
            record: o.record || o.word_scores || o.alignment.is_some(),
            word_scores: o.word_scores,
            settle: !o.full_beam,
            word_table: o.word_table,
            shortlist: self.shortlist.clone(),
            int8: self.int8,
            stop: o.stop.clone(),
            max_length: o.max_decoding_length,
            min_length: o.min_decoding_length,
        };
        opts.validate(self.members[0].tgt_vocab.len(), usize::MAX, &name)
            .map_err(NmtError::Options)?;
        if o.batch == 0 {
            return Err(NmtError::Options(format!(
                "{} 0: it must be at least 1",
                name("batch")
            )));
        }
        Ok(opts)
    }

    /// Translate `lines`: one [`Translation`] per line, in order (an empty line gives an empty one).
    pub fn translate(&self, lines: &[String], o: &TranslateOptions) -> Result<Vec<Translation>> {
        Ok(self.translate_with(lines, o, |_| {})?.0)
    }

    /// [`Translator::translate`] reporting the lines done so far to `progress`, and returning the lines over
    /// the input limit (translated in pieces, or truncated) so the caller can name them.
    pub fn translate_with(
        &self,
        lines: &[String],
        o: &TranslateOptions,
        progress: impl FnMut(usize) + Send,
    ) -> Result<(Vec<Translation>, Vec<LongLine>)> {
        let opts = self.decode_options(o, str::to_string)?;
        self.pipeline().translate_within(
            lines,
            o.steering(),
            &opts,
            o.batch,
            o.pretokenized,
            o.input_limit,
            progress,
        )
    }

    /// A hypothesis's text (its tokens through the model's post-processing: BPE merged, detokenised).
    pub fn hypothesis_text(&self, h: &Hypothesis) -> String {
        let m = &self.members[0];
        m.preprocess.postprocess_tgt(&m.tgt_vocab.decode(&h.tokens))
    }

    /// Score given translations: each target's log-probability given its source, word by word, by forced
    /// decoding with every model of the ensemble (their mean). The source and target lists must be equally
    /// long; an empty target scores its EOS alone.
    pub fn score(
        &self,
        sources: &[String],
        targets: &[String],
        o: &ScoreOptions,
    ) -> Result<Vec<Score>> {
        if sources.len() != targets.len() {
            return Err(NmtError::Options(format!(
                "{} source sentences but {} targets: score needs one target per source",
                sources.len(),
                targets.len()
            )));
        }
        if o.batch == 0 {
            return Err(NmtError::Options("batch 0: it must be at least 1".into()));
        }
        let (a, b) = o.context_scale;
        let max = crate::decode::beam_search::MAX_CONTEXT_SCALE;
        if ![a, b]
            .iter()
            .all(|v| v.is_finite() && (0.0..=max).contains(v))
        {
            return Err(NmtError::Options(format!(
                "context_scale {a:?},{b:?}: each scale must be a number in [0, {max}] (1 is the trained model)"
            )));
        }
        let m = &self.members[0];
        let split =
            |l: &String| -> Vec<String> { l.split_whitespace().map(str::to_string).collect() };
        let mut srcs = Vec::with_capacity(sources.len());
        let mut tgts = Vec::with_capacity(targets.len());
        let mut tokens = Vec::with_capacity(targets.len());
        for (s, t) in sources.iter().zip(targets) {
            let (st, tt) = if o.pretokenized {
                (split(s), split(t))
            } else {
                (m.preprocess.src_tokens(s), m.preprocess.tgt_tokens(t))
            };
            srcs.push(m.src_vocab.encode(&st));
            tgts.push(m.tgt_vocab.encode(&tt));
            tokens.push(tt);
        }
        // Longest first, as translation batches them; results back in the input's order.
        let mut order: Vec<usize> = (0..srcs.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(srcs[i].len()));
        let s_sorted: Vec<Vec<u32>> = order.iter().map(|&i| srcs[i].clone()).collect();
        let t_sorted: Vec<Vec<u32>> = order.iter().map(|&i| tgts[i].clone()).collect();
        let models: Vec<&Model> = self.frozen.iter().collect();
        let lp = crate::decode::scoring::score_ids(
            &models,
            &s_sorted,
            &t_sorted,
            m.tgt_vocab.eos(),
            o.context_scale,
            o.batch,
        )?;
        let mut out: Vec<Option<Vec<f32>>> = vec![None; srcs.len()];
        for (&i, v) in order.iter().zip(lp) {
            out[i] = Some(v);
        }
        Ok(out
            .into_iter()
            .zip(tokens)
            .map(|(v, tokens)| {
                let token_scores = v.expect("every pair scored");
                Score {
                    tokens,
                    score: token_scores.iter().map(|&x| x as f64).sum(),
                    token_scores,
                }
            })
            .collect())
    }

    /// Word alignments of sentence pairs from the first model's attention: `sources` and `targets` are
    /// tokenised with spaces (a gold alignment's tokens); a BPE model's subwords are mapped back to them. In
    /// batches of `batch` pairs.
    pub fn align(
        &self,
        sources: &[String],
        targets: &[String],
        batch: usize,
    ) -> Result<Vec<Alignment>> {
        crate::decode::alignment::align_words(
            &self.members[0],
            &self.frozen[0],
            sources,
            targets,
            batch,
        )
    }
}
