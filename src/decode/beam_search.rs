//! Batched beam search (model-spec §7) and a separate greedy decoder. Beam 10 by default; at most
//! `3 × (n + 1)` target words for a source of n words; EOS forbidden before `(n + 1) / 2` words; a finished
//! hypothesis shrinks the beam by one; the best hypothesis by total log-probability (length normalisation as an
//! option). Coverage is carried per hypothesis. Attention weights and gate values can be recorded per step.

use candle_core::{Device, IndexOp, Result, Tensor};

use crate::decode::constraints::{allocate, Progress, Steering};
use crate::decode::penalties::Ranking;
use crate::kernels::readout::{log_normaliser, log_softmax};
use crate::kernels::top_k;
use crate::model::decoder_step::{DecoderState, SourceView, Step};
use crate::model::{pad, Model, WordTable};

/// Decoder steps computed so far in this process, counted per hypothesis (`cgnmt bench` turns this into
/// a FLOP rate for decoding).
pub static DECODER_ROWS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

#[derive(Debug, Clone)]
pub struct DecodeOptions {
    pub beam: usize,
    /// Rank finished hypotheses by log-probability / (length + 1) instead of the total.
    pub length_norm: bool,
    /// GNMT's length penalty α (Wu et al., 2016): rank finished hypotheses by log-probability /
    /// ((5 + length + 1) / 6)^α; 0 (the default, GroundHog's) ranks by the total. Ignored with `length_norm`.
    pub length_penalty: f64,
    /// GNMT's coverage penalty β (Wu et al., 2016): rank finished hypotheses by the above plus
    /// `β Σ_j log(min(Σ_i α_ij, 1))` over the source positions `j` (EOS included) and the hypothesis's steps
    /// `i` (its EOS included), which favours translations that attend to every source word; 0 (the
    /// default) adds nothing.
    pub coverage_penalty: f64,
    /// How many hypotheses to return per sentence (≤ beam).
    pub nbest: usize,
    /// Decode-time context scaling `(a, b)`: source terms × a, target terms × b.
    pub context_scale: (f64, f64),
    /// Record attention weights, gate values and final coverage.
    pub record: bool,
    /// Record each hypothesis's log-probability of every token ([`Hypothesis::word_scores`]).
    pub word_scores: bool,
    /// Stop decoding a sentence once no live hypothesis can enter its `nbest` any more (ranking by total
    /// log-probability; with `length_norm` every hypothesis runs to its end). The results are those of
    /// decoding on until the beam has shrunk to nothing (tested); `false` does that.
    pub settle: bool,
    /// In [`beam_search_batches`], gather the words' terms from a table of every target word's, formed once
    /// for the call ([`Model::word_table`]), when the call decodes enough words for it to pay and the table
    /// takes at most [`WORD_TABLE_MAX_BYTES`]. The results are the same (tested); `false` forms the terms at
    /// every step.
    pub word_table: bool,
    /// Decode each batch over a shortlist of target words only ([`crate::decode::shortlist`]): an approximate
    /// search (the steps' distributions are renormalised over the shortlist), `None` (the default) decodes
    /// over the whole vocabulary.
    pub shortlist: Option<std::sync::Arc<crate::decode::shortlist::Shortlist>>,
    /// Run the decoder's per-step products (and the output layer, and the products formed once per batch
    /// with the annotations) with weights quantised to 8 bits per column and each product's operands to 7
    /// bits per row ([`crate::kernels::quantized_gemm`]): an approximate search,
    /// on CPUs with AVX2 and fused kernels (elsewhere the products stay f32). `false` (the default) is f32.
    pub int8: bool,
    /// A flag that, once set (by another thread: an interrupted caller), makes [`beam_search_batches`] start
    /// no further batch and return an error (`None`, the default: never).
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// At most this many target tokens per output (EOS not counted; `None`, the default: `3 × (n + 1)` for a
    /// source of `n` tokens; CTranslate2's `max_decoding_length`).
    pub max_length: Option<usize>,
    /// EOS forbidden before this many target tokens (`None`, the default: `(n + 1) / 2`; CTranslate2's
    /// `min_decoding_length`). Never above the maximum.
    pub min_length: Option<usize>,
}

/// The largest word table [`beam_search_batches`] forms (see [`DecodeOptions::word_table`]): 512 MiB (a
/// small model's, 8000 words × 2560 columns, takes 78 MiB; the paper-size model's, 30000 × 5000, 572 MiB).
pub const WORD_TABLE_MAX_BYTES: usize = 512 << 20;

/// The largest context scale accepted: the paper's Figure 2 scales each context within [0, 2]; four times the
/// trained input is far outside anything the model saw.
pub const MAX_CONTEXT_SCALE: f64 = 4.0;

impl DecodeOptions {
    /// Check the options a user chose (the command line and the server share these checks): the beam
    /// between 1 and `max_beam` (and the target vocabulary's size), `nbest` between 1 and the beam, the
    /// penalties finite and ≥ 0, each context scale in `[0, MAX_CONTEXT_SCALE]`. The message names the
    /// option as `name` spells it (`--beam` or `beam`, say).
    pub fn validate(
        &self,
        vocab: usize,
        max_beam: usize,
        name: impl Fn(&str) -> String,
    ) -> std::result::Result<(), String> {
        let limit = max_beam.min(vocab);
        if self.beam == 0 || self.beam > limit {
            return Err(format!(
                "{} {}: it must be between 1 and {limit} ({})",
                name("beam"),
                self.beam,
                if vocab <= max_beam {
                    format!("the model's target vocabulary has {vocab} words")
                } else {
                    "the largest beam allowed".to_string()
                }
            ));
        }
        if self.max_length == Some(0) {
            return Err(format!(
                "{} 0: it must be at least 1",
                name("max_decoding_length")
            ));
        }
        if let (Some(lo), Some(hi)) = (self.min_length, self.max_length) {
            if lo > hi {
                return Err(format!(
                    "{} {lo}: it must not exceed {} {hi}",
                    name("min_decoding_length"),
                    name("max_decoding_length")
                ));
            }
        }
        if self.nbest == 0 || self.nbest > self.beam {
            return Err(format!(
                "{} {}: it must be between 1 and the beam ({})",
                name("nbest"),
                self.nbest,
                self.beam
            ));
        }
        for (key, v) in [
            ("length_penalty", self.length_penalty),
            ("coverage_penalty", self.coverage_penalty),
        ] {
            if !(v.is_finite() && v >= 0.0) {
                return Err(format!("{} {v}: it must be a number ≥ 0", name(key)));
            }
        }
        let (a, b) = self.context_scale;
        for v in [a, b] {
            if !(v.is_finite() && (0.0..=MAX_CONTEXT_SCALE).contains(&v)) {
                return Err(format!(
                    "{} {a:?},{b:?}: each scale must be a number in [0, {MAX_CONTEXT_SCALE}] (1 is the trained model)",
                    name("context_scale")
                ));
            }
        }
        Ok(())
    }
}

impl DecodeOptions {
    /// How these options rank finished hypotheses.
    pub fn ranking(&self) -> Ranking {
        Ranking {
            length_norm: self.length_norm,
            length_penalty: self.length_penalty,
            coverage_penalty: self.coverage_penalty,
        }
    }
}

impl Default for DecodeOptions {
    fn default() -> Self {
        Self {
            beam: 10,
            length_norm: false,
            length_penalty: 0.0,
            coverage_penalty: 0.0,
            nbest: 1,
            context_scale: (1.0, 1.0),
            record: false,
            word_scores: false,
            settle: true,
            word_table: true,
            shortlist: None,
            int8: false,
            stop: None,
            max_length: None,
            min_length: None,
        }
    }
}

impl DecodeOptions {
    /// The length limits for a source of `n` tokens, (minimum words before EOS, maximum words): the fixed
    /// ones where set, else [`length_limits`]'s.
    pub fn length_limits(&self, n: usize) -> (usize, usize) {
        let (lo, hi) = length_limits(n);
        let hi = self.max_length.unwrap_or(hi);
        (self.min_length.unwrap_or(lo).min(hi), hi)
    }
}

#[derive(Debug, Clone, Default)]
pub struct Hypothesis {
    /// Target ids without the final EOS.
    pub tokens: Vec<u32>,
    /// Total log-probability (EOS included when the hypothesis finished with it).
    pub score: f64,
    /// Per emitted word (EOS included): attention over the source positions (EOS included).
    pub attention: Vec<Vec<f32>>,
    /// Per emitted non-EOS word: mean gate value of the transition that consumed it (empty when ungated).
    pub gates: Vec<f32>,
    /// Final coverage per source position (first coverage dimension), when coverage is on.
    pub coverage: Vec<f32>,
    /// With a coverage penalty: the attention each source position received over the steps so far.
    pub attention_mass: Vec<f64>,
    /// With [`DecodeOptions::word_scores`]: the log-probability of each emitted token (EOS included when the
    /// hypothesis finished with it) as the search scored it: an ensemble's mean, over a shortlist
    /// renormalised over it. Their sum is `score` (for a line translated in pieces, less the inner pieces'
    /// EOS).
    pub word_scores: Vec<f32>,
    /// With positive constraints ([`Steering::include`]): how many of them the hypothesis did not meet (0
    /// unless it was stopped at the length limit).
    pub unmet_constraints: usize,
}

/// Length limits for a source of `n` words: (minimum words before EOS, maximum words).
pub fn length_limits(n: usize) -> (usize, usize) {
    ((n + 1) / 2, 3 * (n + 1))
}

fn mean_rows(t: &Tensor) -> Result<Vec<f32>> {
    let t = t.to_dtype(candle_core::DType::F32)?;
    match t.rank() {
        1 => {
            // A static gate: one vector for all hypotheses.
            let m = t.mean_all()?.to_scalar::<f32>()?;
            Ok(vec![m])
        }
        _ => t.mean(1)?.to_vec1::<f32>(),
    }
}

struct Live {
    sent: usize,
    hyp: Hypothesis,
    /// Its progress through its sentence's positive constraints.
    progress: Progress,
}

/// Beam search over a batch of source sentences (ids without EOS). Returns up to `nbest` hypotheses per
/// sentence, best first.
pub fn beam_search(
    model: &Model,
    srcs: &[Vec<u32>],
    eos: u32,
    opts: &DecodeOptions,
) -> Result<Vec<Vec<Hypothesis>>> {
    beam_search_with(model, srcs, eos, opts, None, None)
}

/// [`beam_search`] with decoding's weights prepared earlier (see [`Model::prepare_decoding`]) and, when
/// given, the words' terms gathered from the word table (see [`Model::word_table`]) instead of formed at
/// each step. Either way the results are the same.
pub fn beam_search_with(
    model: &Model,
    srcs: &[Vec<u32>],
    eos: u32,
    opts: &DecodeOptions,
    prepared: Option<&crate::kernels::Prepared>,
    table: Option<&WordTable>,
) -> Result<Vec<Vec<Hypothesis>>> {
    beam_search_ensemble(
        &[Member {
            model,
            prepared,
            table,
        }],
        srcs,
        &[],
        eos,
        opts,
    )
}

/// One model of an ensemble, with what [`beam_search_with`] takes beside it.
#[derive(Clone, Copy)]
pub struct Member<'a> {
    pub model: &'a Model,
    pub prepared: Option<&'a crate::kernels::Prepared>,
    pub table: Option<&'a WordTable>,
}

/// A member's decoding state over the live hypotheses.
struct MemberState<'a> {
    m: Member<'a>,
    /// The encoded batch: one row per sentence when `row_keys`, else one row per live hypothesis.
    cur: crate::model::Source,
    products: Option<crate::model::attention::ContextProducts>,
    row_keys: bool,
    state: DecoderState,
    words: Option<crate::model::readout::OutputWords>,
    /// The step computed over the live hypotheses, until the words are fed.
    step: Option<Step>,
    /// The step's rows of logits (fused kernels) or log-probabilities, and their width.
    scores: Vec<f32>,
    vocab: usize,
    /// In an ensemble with fused kernels, the normaliser `log Σ exp` of each row of logits.
    norm: Vec<f32>,
}

impl<'a> MemberState<'a> {
    /// Encode the batch with member `m` (its decoding weights `prepared`) and start one hypothesis per
    /// sentence.
    fn start(
        m: Member<'a>,
        srcs: &[Vec<u32>],
        steering: &[Steering],
        (src_ids, src_mask): (&Tensor, &Tensor),
        eos: u32,
        opts: &DecodeOptions,
    ) -> Result<Self> {
        let model = m.model;
        let dev = src_ids.device();
        let nsent = srcs.len();
        let idx0 = Tensor::from_vec((0..nsent as u32).collect::<Vec<_>>(), nsent, dev)?;
        let source = model.encode_prepared(src_ids, src_mask, m.prepared)?;
        let products = model.context_products(&source)?;
        let cur = source.select(&idx0)?;
        Ok(MemberState {
            m,
            products,
            // Without coverage, fused attention reads each hypothesis's sentence keys in place (`cur`
            // keeps one row per sentence); otherwise `cur` holds one row per live hypothesis.
            row_keys: model.attends_by_rows(dev),
            state: model.start(&cur, true)?,
            cur,
            // With a shortlist, the batch's output layer covers its words only; rows then hold their
            // columns (the same ones for every member), and the target prefixes' and constraints' words.
            words: match &opts.shortlist {
                Some(sl) => {
                    let mut ids = sl.words(srcs, eos);
                    if steering.iter().any(|p| !p.is_empty()) {
                        ids.extend(steering.iter().flat_map(Steering::words));
                        ids.sort_unstable();
                        ids.dedup();
                    }
                    Some(model.readout.output_words(model.kernels, &ids, opts.int8)?)
                }
                None => None,
            },
            step: None,
            scores: Vec::new(),
            vocab: 0,
            norm: Vec::new(),
        })
    }

    /// One step over the live hypotheses (`rows`: each one's sentence; see [`Model::step`]) and the output
    /// layer's rows into `scores` (logits with fused kernels, with their normalisers in `norm` unless
    /// `single`, the search's only member; log-probabilities otherwise). Returns the conditional GRU's gate
    /// values, where it has a gate.
    fn step(
        &mut self,
        rows: &[u32],
        opts: &DecodeOptions,
        single: bool,
        dev: &Device,
    ) -> Result<Option<Tensor>> {
        let model = self.m.model;
        let view = SourceView {
            source: &self.cur,
            products: self.products.as_ref(),
            rows,
            by_rows: self.row_keys,
        };
        let step = model.step(view, &self.state, opts.context_scale, None)?;
        if model.kernels.ops_fused_on(dev) {
            self.vocab =
                model.step_logits(&step, &self.state, self.words.as_ref(), &mut self.scores)?;
            if !single {
                // An ensemble member's rows' normalisers.
                use rayon::prelude::*;
                self.norm = self
                    .scores
                    .par_chunks(self.vocab.max(1))
                    .map(log_normaliser)
                    .collect();
            }
        } else {
            let lp =
                log_softmax(&model.step_logits_tensor(&step, &self.state, self.words.as_ref())?)?;
            self.scores = lp
                .to_dtype(candle_core::DType::F32)?
                .flatten_all()?
                .to_vec1()?;
            self.vocab = lp.dim(1)?;
        }
        let gate = step.gate.clone();
        self.step = Some(step);
        Ok(gate)
    }

    /// The step's attention weights, one row per live hypothesis.
    fn attention(&self) -> Result<Vec<Vec<f32>>> {
        self.stepped()
            .alpha
            .to_dtype(candle_core::DType::F32)?
            .to_vec2()
    }

    fn stepped(&self) -> &Step {
        self.step.as_ref().expect("stepped")
    }

    /// The transition of each continuing hypothesis: from its parent's row (`parents`) over its new word
    /// (`words`). Returns the transition's gate values per row, when `gates` asks for them and there is a
    /// gate.
    fn advance(
        &mut self,
        parents: &Tensor,
        words: &Tensor,
        opts: &DecodeOptions,
        gates: bool,
    ) -> Result<Option<Vec<f32>>> {
        let model = self.m.model;
        let step = self.step.take().expect("stepped");
        let w = match self.m.table {
            Some(table) => table.rows(words)?,
            None => model.word_terms(&model.embed(words)?)?,
        };
        let (state, sc) = model.feed(&step, Some(parents), w, opts.context_scale, None)?;
        let means = match &sc.gate {
            Some(g) if gates => Some(mean_rows(g)?),
            _ => None,
        };
        if !self.row_keys {
            self.cur = self.cur.select(parents)?;
        }
        self.state = state;
        Ok(means)
    }

    /// Keep the rows `keep` of the live hypotheses' state.
    fn keep_rows(&mut self, keep: &Tensor) -> Result<()> {
        self.state = self.state.select(keep)?;
        if !self.row_keys {
            self.cur = self.cur.select(keep)?;
        }
        Ok(())
    }
}

/// What one search keeps beside the hypotheses: its options and each sentence's limits.
struct Search<'o> {
    opts: &'o DecodeOptions,
    ranking: Ranking,
    eos: u32,
    beam: usize,
    /// Stop a sentence once its result is decided: exact for the ranking by total log-probability.
    settle: bool,
    nbest: usize,
    /// EOS's column in a row (a shortlist holds it).
    eos_column: Option<u32>,
    /// The rows are one model's logits (fused kernels): the top-k of a row are the same words, and only the
    /// chosen ones are normalised (log p = logit − log Σ exp), so no [N, V] log-probabilities are written.
    fused: bool,
    /// Per sentence: (minimum words before EOS, maximum words), and the source length with EOS.
    limits: Vec<(usize, usize)>,
    src_lens: Vec<usize>,
    /// Per sentence, what steers it: the words its output starts with (a target prefix), the phrases it
    /// must and must not contain (empty: nothing steers any sentence).
    steering: &'o [Steering],
}

/// The hypotheses a step's candidates make: the continuing ones (new rows), each one's parent row and word.
struct Grown {
    live: Vec<Live>,
    parents: Vec<u32>,
    words: Vec<u32>,
}

impl Search<'_> {
    /// The `k` best words of every row (`k` = the row's sentence's remaining beam) as `(log-probability,
    /// word)`, in parallel. `norms` are an ensemble's averaged normalisers (subtracted from the chosen
    /// words' averaged logits); `words` maps a shortlist's columns to word ids.
    fn row_top(
        &self,
        scores: &[f32],
        vocab: usize,
        live: &[Live],
        finished: &[Vec<Hypothesis>],
        step: usize,
        norms: &[f32],
        words: Option<&crate::model::readout::OutputWords>,
    ) -> Vec<Vec<(f32, u32)>> {
        use rayon::prelude::*;
        scores
            .par_chunks(vocab.max(1))
            .enumerate()
            .map(|(r, row)| {
                let s = live[r].sent;
                let k = self.beam.saturating_sub(finished[s].len());
                // EOS once the minimum length is reached and every positive constraint met.
                let eos_ok = step >= self.limits[s].0 && live[r].progress.done();
                let steer = self.steering.get(s);
                // A word's column (a shortlist holds the prefixes' and constraints' words).
                let column = |w: u32| -> u32 {
                    let c = words.map_or(Some(w as usize), |o| o.ids.binary_search(&w).ok());
                    c.expect("a shortlist holds the steering's words") as u32
                };
                let forced = steer.and_then(|p| p.prefix.get(step));
                let mut top = match (forced, steer) {
                    // Within a target prefix: its word, the only candidate.
                    (Some(&w), _) => vec![(row[column(w) as usize], column(w))],
                    (None, Some(st)) if !st.include.is_empty() || !st.avoid.is_empty() => {
                        let eos = if eos_ok { None } else { self.eos_column };
                        let banned: Vec<u32> = st
                            .banned_after(&live[r].hyp.tokens)
                            .into_iter()
                            .filter_map(|w| {
                                words.map_or(Some(w), |o| {
                                    o.ids.binary_search(&w).ok().map(|c| c as u32)
                                })
                            })
                            .collect();
                        let mut top = top_k(row, k + banned.len(), eos);
                        top.retain(|c| !banned.contains(&c.1));
                        top.truncate(k);
                        // The words that advance an unmet constraint are candidates too.
                        for w in live[r].progress.advancing(&st.include) {
                            let c = column(w);
                            if !banned.contains(&c) && !top.iter().any(|t| t.1 == c) {
                                top.push((row[c as usize], c));
                            }
                        }
                        top
                    }
                    _ => top_k(row, k, if eos_ok { None } else { self.eos_column }),
                };
                let lse = if self.fused {
                    log_normaliser(row)
                } else {
                    norms.get(r).copied().unwrap_or(0.0)
                };
                if lse != 0.0 {
                    for c in &mut top {
                        c.0 -= lse;
                    }
                }
                if let Some(o) = words {
                    for c in &mut top {
                        c.1 = o.ids[c.1 as usize];
                    }
                }
                top
            })
            .collect()
    }

    /// Each sentence's best `k` continuations (`k` = its remaining beam) among its rows' candidates, as
    /// `(parent row, word, score, the word's log-probability)` (rows of one sentence are contiguous).
    fn best_per_sentence(
        &self,
        live: &[Live],
        row_top: &[Vec<(f32, u32)>],
        finished: &[Vec<Hypothesis>],
    ) -> Vec<(usize, u32, f64, f32)> {
        let mut next = Vec::new();
        let mut row = 0;
        while row < live.len() {
            let s = live[row].sent;
            let mut end = row;
            while end < live.len() && live[end].sent == s {
                end += 1;
            }
            let k = self.beam.saturating_sub(finished[s].len());
            // The rows' top-k candidates, merged.
            let mut cands: Vec<(f64, usize, u32, f32)> = Vec::new();
            for r in row..end {
                let base = live[r].hyp.score;
                cands.extend(
                    row_top[r]
                        .iter()
                        .map(|&(lp, w)| (base + lp as f64, r, w, lp)),
                );
            }
            cands.sort_by(|a, b| {
                b.0.partial_cmp(&a.0)
                    .unwrap_or(std::cmp::Ordering::Equal)
                    .then(a.1.cmp(&b.1))
            });
            match self.steering.get(s).filter(|st| !st.include.is_empty()) {
                // Positive constraints: the beam allocated over the banks of constraint words met.
                Some(st) => {
                    let banked: Vec<(f64, usize)> = cands
                        .iter()
                        .map(|&(score, r, w, _)| {
                            let p = &live[r].progress;
                            let bank = if w == self.eos {
                                p.met_words(&st.include)
                            } else {
                                p.after(&st.include, w).met_words(&st.include)
                            };
                            (score, bank)
                        })
                        .collect();
                    for i in allocate(&banked, k, st.constraint_words() + 1) {
                        let (score, r, w, lp) = cands[i];
                        next.push((r, w, score, lp));
                    }
                }
                None => {
                    cands.truncate(k);
                    for (score, r, w, lp) in cands {
                        next.push((r, w, score, lp));
                    }
                }
            }
            row = end;
        }
        next
    }

    /// Grow the chosen continuations `next` into hypotheses: those ending in EOS finish, the others go on.
    /// `alpha` is the step's attention (with a coverage penalty or recording), `gate` the conditional
    /// term's gate values and `cov` the step's coverage (both recorded).
    fn grow(
        &self,
        live: &[Live],
        next: Vec<(usize, u32, f64, f32)>,
        alpha: Option<&[Vec<f32>]>,
        gate: Option<&[f32]>,
        cov: Option<&Tensor>,
        finished: &mut [Vec<Hypothesis>],
    ) -> Result<Grown> {
        let opts = self.opts;
        let mut grown = Grown {
            live: Vec::new(),
            parents: Vec::new(),
            words: Vec::new(),
        };
        for (r, w, score, lp) in next {
            let s = live[r].sent;
            let mut hyp = Hypothesis {
                score,
                ..Default::default()
            };
            hyp.tokens = live[r].hyp.tokens.clone();
            if opts.word_scores {
                hyp.word_scores = live[r].hyp.word_scores.clone();
                hyp.word_scores.push(lp);
            }
            if self.ranking.needs_attention_mass() {
                let a = &alpha.expect("fetched")[r][..self.src_lens[s]];
                let parent = &live[r].hyp.attention_mass;
                hyp.attention_mass = if parent.is_empty() {
                    a.iter().map(|&x| x as f64).collect()
                } else {
                    parent.iter().zip(a).map(|(&m, &x)| m + x as f64).collect()
                };
            }
            if opts.record {
                hyp.attention = live[r].hyp.attention.clone();
                hyp.attention
                    .push(alpha.expect("recorded")[r][..self.src_lens[s]].to_vec());
                hyp.gates = live[r].hyp.gates.clone();
                if let Some(g) = gate {
                    if w != self.eos {
                        hyp.gates.push(if g.len() == 1 { g[0] } else { g[r] });
                    }
                }
            }
            if w == self.eos {
                if opts.record {
                    if let Some(c) = cov {
                        hyp.coverage = coverage_row(c, r, self.src_lens[s])?;
                    }
                }
                hyp.unmet_constraints = live[r].progress.unmet();
                finished[s].push(hyp);
            } else {
                hyp.tokens.push(w);
                let progress = match self.steering.get(s) {
                    Some(st) if !st.include.is_empty() => live[r].progress.after(&st.include, w),
                    _ => Progress::default(),
                };
                grown.live.push(Live {
                    sent: s,
                    hyp,
                    progress,
                });
                grown.parents.push(r as u32);
                grown.words.push(w);
            }
        }
        Ok(grown)
    }

    /// Hypotheses that reached the maximum length, or whose sentence's beam is full, finish (without EOS;
    /// `cov` is the state's coverage, recorded). Returns the rows that go on and their hypotheses.
    fn retire(
        &self,
        grown: Vec<Live>,
        cov: Option<&Tensor>,
        finished: &mut [Vec<Hypothesis>],
    ) -> Result<(Vec<u32>, Vec<Live>)> {
        let mut keep: Vec<u32> = Vec::new();
        let mut kept: Vec<Live> = Vec::new();
        for (i, l) in grown.into_iter().enumerate() {
            if l.hyp.tokens.len() >= self.limits[l.sent].1 || finished[l.sent].len() >= self.beam {
                if finished[l.sent].len() < self.beam {
                    let mut h = l.hyp;
                    h.unmet_constraints = l.progress.unmet();
                    if self.opts.record {
                        if let Some(c) = cov {
                            h.coverage = coverage_row(c, i, self.src_lens[l.sent])?;
                        }
                    }
                    finished[l.sent].push(h);
                }
            } else {
                keep.push(i as u32);
                kept.push(l);
            }
        }
        Ok((keep, kept))
    }

    /// Drop the live hypotheses of settled sentences. A sentence whose `nbest`-th best finished hypothesis
    /// scores at least as high as its best live one is settled: log-probabilities are ≤ 0, so a live
    /// hypothesis only loses score as it grows, and none of them could enter the result any more (a later
    /// one of equal score ranks after). Decoding it on (as GroundHog does, until the beam has shrunk to
    /// nothing) only costs steps.
    fn drop_settled(
        &self,
        keep: Vec<u32>,
        kept: Vec<Live>,
        finished: &[Vec<Hypothesis>],
    ) -> (Vec<u32>, Vec<Live>) {
        let mut best_live = vec![f64::NEG_INFINITY; finished.len()];
        for l in &kept {
            best_live[l.sent] = best_live[l.sent].max(l.hyp.score);
        }
        let settled: Vec<bool> = finished
            .iter()
            .zip(&best_live)
            .map(|(f, &best)| {
                f.len() >= self.nbest && {
                    let mut scores: Vec<f64> = f.iter().map(|h| h.score).collect();
                    scores.sort_by(|a, b| b.partial_cmp(a).unwrap_or(std::cmp::Ordering::Equal));
                    scores[self.nbest - 1] >= best
                }
            })
            .collect();
        if !kept.iter().any(|l| settled[l.sent]) {
            return (keep, kept);
        }
        keep.into_iter()
            .zip(kept)
            .filter(|(_, l)| !settled[l.sent])
            .unzip()
    }

    /// A sentence's finished hypotheses, best first under the ranking, cut to `nbest`. With positive
    /// constraints, those that met them all, if any (the list may then be shorter); else those that met
    /// most first.
    fn ranked(&self, mut f: Vec<Hypothesis>) -> Vec<Hypothesis> {
        if f.iter().any(|h| h.unmet_constraints == 0) {
            f.retain(|h| h.unmet_constraints == 0);
        }
        let key = |h: &Hypothesis| {
            self.ranking
                .key(h.score, h.tokens.len() + 1, &h.attention_mass)
        };
        f.sort_by(|a, b| {
            a.unmet_constraints.cmp(&b.unmet_constraints).then(
                key(b)
                    .partial_cmp(&key(a))
                    .unwrap_or(std::cmp::Ordering::Equal),
            )
        });
        f.truncate(self.opts.nbest.max(1));
        f
    }
}

/// The members' mean attention weights of the step, one row per live hypothesis.
fn mean_attention(states: &[MemberState]) -> Result<Vec<Vec<f32>>> {
    let mut a: Vec<Vec<f32>> = Vec::new();
    for (i, st) in states.iter().enumerate() {
        let x = st.attention()?;
        if i == 0 {
            a = x;
        } else {
            for (ra, rx) in a.iter_mut().zip(&x) {
                for (p, q) in ra.iter_mut().zip(rx) {
                    *p += q;
                }
            }
        }
    }
    if states.len() > 1 {
        let k = states.len() as f32;
        a.iter_mut().flatten().for_each(|p| *p /= k);
    }
    Ok(a)
}

/// Beam search with an ensemble (model-spec §7 with several models): every member runs its own decoder over
/// the same hypotheses, and a step's word scores are the members' log-probabilities averaged (a hypothesis's
/// score is the sum of those averages). The members must share the source and target vocabularies. Recorded
/// attention, and the attention mass of the coverage penalty, are the members' mean; recorded gates and
/// coverage are the first member's. With one member this is [`beam_search_with`].
///
/// Each step: step every member, combine their scores, take each row's top k, each sentence's best
/// continuations, grow them into finished and continuing hypotheses, advance every member's state to the
/// continuing ones, retire those at their length limit and drop settled sentences.
///
/// `steering` (empty, or one per sentence) steers the sentences: an output starts with its target prefix's
/// words (scored by the model like any other) and the search goes on from them; it contains each positive
/// constraint and no avoided phrase ([`crate::decode::constraints`]).
pub fn beam_search_ensemble(
    members: &[Member],
    srcs: &[Vec<u32>],
    steering: &[Steering],
    eos: u32,
    opts: &DecodeOptions,
) -> Result<Vec<Vec<Hypothesis>>> {
    let Some(first) = members.first() else {
        candle_core::bail!("beam search needs at least one model");
    };
    let dev: Device = first.model.tgt_emb.device().clone();
    let dtype = first.model.tgt_emb.dtype();
    let nsent = srcs.len();
    if nsent == 0 {
        return Ok(vec![]);
    }
    let limits: Vec<(usize, usize)> = srcs.iter().map(|s| opts.length_limits(s.len())).collect();
    check_steering(steering, &limits, eos)?;
    let (src_ids, src_mask) = pad(srcs, eos, dtype, &dev)?;
    // Int8 products need their weights quantised: prepare them for this call where the caller did not.
    let mut owned: Vec<Option<crate::kernels::Prepared>> = Vec::with_capacity(members.len());
    for m in members {
        owned.push(match m.prepared {
            None if opts.int8 => m.model.prepare_decoding_as(true)?,
            _ => None,
        });
    }
    let mut states: Vec<MemberState> = Vec::with_capacity(members.len());
    for (m, own) in members.iter().zip(&owned) {
        if m.model.tgt_vocab != first.model.tgt_vocab {
            candle_core::bail!(
                "ensemble: the members' target vocabularies differ ({} and {} words)",
                first.model.tgt_vocab,
                m.model.tgt_vocab
            );
        }
        let prepared = m.prepared.or(own.as_ref());
        let m = Member { prepared, ..*m };
        states.push(MemberState::start(
            m,
            srcs,
            steering,
            (&src_ids, &src_mask),
            eos,
            opts,
        )?);
    }
    let beam = opts.beam.max(1);
    let ranking = opts.ranking();
    let search = Search {
        opts,
        ranking,
        eos,
        beam,
        settle: opts.settle && ranking.by_total(),
        nbest: opts.nbest.clamp(1, beam),
        eos_column: match &states[0].words {
            Some(o) => o.ids.binary_search(&eos).ok().map(|c| c as u32),
            None => Some(eos),
        },
        fused: first.model.kernels.ops_fused_on(&dev) && members.len() == 1,
        limits,
        src_lens: srcs.iter().map(|s| s.len() + 1).collect(),
        steering,
    };

    let mut finished: Vec<Vec<Hypothesis>> = vec![vec![]; nsent];
    let mut live: Vec<Live> = (0..nsent)
        .map(|s| Live {
            sent: s,
            hyp: Hypothesis::default(),
            progress: Progress::new(steering.get(s).map_or(0, |st| st.include.len())),
        })
        .collect();
    let mut step = 0usize;
    // An ensemble's averaged rows and normalisers.
    let (mut mean, mut mean_norm): (Vec<f32>, Vec<f32>) = (Vec::new(), Vec::new());
    while !live.is_empty() {
        DECODER_ROWS.fetch_add(
            (live.len() * members.len()) as u64,
            std::sync::atomic::Ordering::Relaxed,
        );
        // Step every member over the live hypotheses (each one's sentence: `rows`).
        let rows: Vec<u32> = live.iter().map(|l| l.sent as u32).collect();
        let mut cond_gate = None;
        for (i, st) in states.iter_mut().enumerate() {
            let gate = st.step(&rows, opts, search.fused, &dev)?;
            if i == 0 && opts.record {
                cond_gate = gate.map(|g| mean_rows(&g)).transpose()?;
            }
        }
        // Combine the scores. An ensemble's rows: the members' logits averaged, and their normalisers
        // averaged (subtracted from the chosen words' below), which is averaging the log-probabilities;
        // without fused kernels the members' log-probabilities averaged.
        let scores: &[f32] = if members.len() == 1 {
            &states[0].scores
        } else {
            mean_into(&mut mean, states.iter().map(|st| &st.scores[..]));
            mean_into(&mut mean_norm, states.iter().map(|st| &st.norm[..]));
            &mean
        };
        let row_top = search.row_top(
            scores,
            states[0].vocab,
            &live,
            &finished,
            step,
            &mean_norm,
            states[0].words.as_ref(),
        );
        let alpha = if opts.record || ranking.needs_attention_mass() {
            Some(mean_attention(&states)?)
        } else {
            None
        };
        let next = search.best_per_sentence(&live, &row_top, &finished);
        let step_cov = states[0].stepped().cov.as_ref();
        let grown = search.grow(
            &live,
            next,
            alpha.as_deref(),
            cond_gate.as_deref(),
            step_cov,
            &mut finished,
        )?;
        step += 1;
        if grown.live.is_empty() {
            break;
        }
        // Advance every member's state to the continuing hypotheses.
        let Grown {
            live: mut new_live,
            parents,
            words,
        } = grown;
        let pidx = Tensor::from_vec(parents.clone(), parents.len(), &dev)?;
        let wids = Tensor::from_vec(words, parents.len(), &dev)?;
        for (i, st) in states.iter_mut().enumerate() {
            if let Some(means) = st.advance(&pidx, &wids, opts, opts.record && i == 0)? {
                for (i, l) in new_live.iter_mut().enumerate() {
                    l.hyp
                        .gates
                        .push(if means.len() == 1 { means[0] } else { means[i] });
                }
            }
        }
        let (mut keep, mut kept) =
            search.retire(new_live, states[0].state.cov.as_ref(), &mut finished)?;
        if search.settle {
            (keep, kept) = search.drop_settled(keep, kept, &finished);
        }
        if kept.len() != parents.len() {
            if kept.is_empty() {
                break;
            }
            let kidx = Tensor::from_vec(keep.clone(), keep.len(), &dev)?;
            for st in states.iter_mut() {
                st.keep_rows(&kidx)?;
            }
        }
        live = kept;
    }
    Ok(finished.into_iter().map(|f| search.ranked(f)).collect())
}

/// The steering fits its sentences: none at all, or one per sentence whose target prefix has at most its
/// maximum length (`limits`), whose phrases are not empty, and none of them with EOS.
fn check_steering(steering: &[Steering], limits: &[(usize, usize)], eos: u32) -> Result<()> {
    if !steering.is_empty() && steering.len() != limits.len() {
        candle_core::bail!(
            "steering for {} sentences, but {} sentences",
            steering.len(),
            limits.len()
        );
    }
    for (k, (st, l)) in steering.iter().zip(limits).enumerate() {
        let p = &st.prefix;
        if p.len() > l.1
            || st.words().any(|w| w == eos)
            || st.avoid.iter().flatten().any(|&w| w == eos)
        {
            candle_core::bail!(
                "sentence {k}: a target prefix of {} words (at most {} for its source), or EOS in a prefix or phrase",
                p.len(),
                l.1
            );
        }
        if st.include.iter().chain(&st.avoid).any(Vec::is_empty) {
            candle_core::bail!("sentence {k}: an empty constraint phrase");
        }
    }
    Ok(())
}

/// The element-wise mean of equally long `parts`, into `out`.
fn mean_into<'a>(out: &mut Vec<f32>, mut parts: impl ExactSizeIterator<Item = &'a [f32]>) {
    let k = parts.len() as f32;
    out.clear();
    if let Some(first) = parts.next() {
        out.extend_from_slice(first);
    }
    for p in parts {
        for (a, b) in out.iter_mut().zip(p) {
            *a += b;
        }
    }
    for a in out.iter_mut() {
        *a /= k;
    }
}

fn coverage_row(c: &Tensor, row: usize, len: usize) -> Result<Vec<f32>> {
    let v: Vec<f32> = c
        .i((row, .., 0))?
        .to_dtype(candle_core::DType::F32)?
        .to_vec1()?;
    Ok(v[..len].to_vec())
}

/// Greedy decoding written independently of the beam search: argmax at every step under the same length
/// limits. `beam_search` with beam 1 must produce the same output.
pub fn greedy(
    model: &Model,
    srcs: &[Vec<u32>],
    eos: u32,
    context_scale: (f64, f64),
) -> Result<Vec<Vec<u32>>> {
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
    let limits: Vec<(usize, usize)> = srcs.iter().map(|s| length_limits(s.len())).collect();
    let max_steps = limits.iter().map(|l| l.1).max().unwrap_or(0);
    let mut state = model.start(&source, true)?;
    let mut out: Vec<Vec<u32>> = vec![vec![]; n];
    let mut done = vec![false; n];
    let mut logits: Vec<f32> = Vec::new();
    for step in 0..max_steps {
        DECODER_ROWS.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        let st = model.step(view, &state, context_scale, None)?;
        let v = model.step_logits(&st, &state, None, &mut logits)?;
        let mut words = vec![eos; n];
        for i in 0..n {
            if done[i] {
                continue;
            }
            let mut best = (f32::NEG_INFINITY, eos);
            for (w, &v) in logits[i * v..(i + 1) * v].iter().enumerate() {
                if w as u32 == eos && step < limits[i].0 {
                    continue;
                }
                if v > best.0 {
                    best = (v, w as u32);
                }
            }
            if best.1 == eos {
                done[i] = true;
            } else {
                out[i].push(best.1);
                words[i] = best.1;
                if out[i].len() >= limits[i].1 {
                    done[i] = true;
                }
            }
        }
        if done.iter().all(|d| *d) {
            break;
        }
        let word = model.word_terms(&model.embed(&Tensor::from_vec(words, n, &dev)?)?)?;
        state = model.feed(&st, None, word, context_scale, None)?.0;
    }
    Ok(out)
}

/// [`beam_search`] over several batches, decoded concurrently, one per thread of the pool: each decoder's
/// serial work (beam bookkeeping, small ops) overlaps the others', and their matrix products share the
/// pool. Results are those of decoding the batches one after the other. `done(n)` is called as each batch
/// of `n` sentences finishes. The weights are prepared (transposed, packed) once for all the batches.
/// Several `models` decode as an ensemble ([`beam_search_ensemble`]).
pub fn beam_search_batches(
    models: &[&Model],
    batches: &[Vec<Vec<u32>>],
    steering: Option<&[Vec<Steering>]>,
    eos: u32,
    opts: &DecodeOptions,
    done: impl Fn(usize) + Sync,
) -> Result<Vec<Vec<Vec<Hypothesis>>>> {
    use rayon::prelude::*;
    // The table costs a product of each of its weights over the vocabulary, the steps' would cover about
    // beam × (length + 1) words per sentence: form it when those are at least twice the vocabulary.
    let words: usize = batches.iter().flatten().map(|s| s.len() + 1).sum();
    let mut prepared = Vec::with_capacity(models.len());
    let mut tables = Vec::with_capacity(models.len());
    for model in models {
        let p = model.prepare_decoding_as(opts.int8)?;
        tables.push(
            if opts.word_table
                && p.is_some()
                && model.word_table_bytes() <= WORD_TABLE_MAX_BYTES
                && opts.beam.max(1) * words >= 2 * model.tgt_vocab
            {
                Some(model.word_table(p.as_ref())?)
            } else {
                None
            },
        );
        prepared.push(p);
    }
    let members: Vec<Member> = models
        .iter()
        .zip(prepared.iter().zip(&tables))
        .map(|(model, (p, t))| Member {
            model,
            prepared: p.as_ref(),
            table: t.as_ref(),
        })
        .collect();
    if steering.is_some_and(|p| p.len() != batches.len()) {
        candle_core::bail!("steering for another number of batches");
    }
    batches
        .par_iter()
        .enumerate()
        .map(|(i, b)| {
            if opts
                .stop
                .as_ref()
                .is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed))
            {
                candle_core::bail!("decoding stopped");
            }
            let steer = steering.map_or(&[][..], |p| &p[i][..]);
            let h = beam_search_ensemble(&members, b, steer, eos, opts)?;
            done(b.len());
            Ok(h)
        })
        .collect()
}

/// Convenience: the 1-best token ids of `beam_search`.
pub fn translate_ids(
    model: &Model,
    srcs: &[Vec<u32>],
    eos: u32,
    opts: &DecodeOptions,
) -> Result<Vec<Vec<u32>>> {
    Ok(beam_search(model, srcs, eos, opts)?
        .into_iter()
        .map(|mut v| {
            if v.is_empty() {
                vec![]
            } else {
                v.swap_remove(0).tokens
            }
        })
        .collect())
}
