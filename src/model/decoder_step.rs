//! The decoder's one step (model-spec §4–5): every caller that runs the decoder word by word — beam search,
//! greedy search, forced decoding for scores and for alignments, and the composed training path — goes
//! through [`Model::step`] and [`Model::feed`], so attention, the context, the context gate, the recurrent
//! transition and the readout are sequenced in this file only.
//!
//! A step is split where the caller chooses the word:
//! 1. [`Model::step`] reads the state `t_{i−1}`: attention `α_i` (with the coverage term) and the context
//!    `s_i`, then, for the conditional GRU, its context GRU (with the gate) — the state the readout reads;
//! 2. [`Model::step_logits`] / [`Model::step_logits_tensor`]: the readout's logits from that state, `s_i` and the
//!    previous word `y_{i−1}`;
//! 3. the caller picks `y_i` (an argmax, a beam's top k, the reference);
//! 4. [`Model::feed`] runs the recurrent transition with `y_i` (the context gate scaling its source and
//!    target inputs), optionally first taking the rows of the chosen parents (a beam), and returns the next
//!    state.
//!
//! Training's fused sequence op ([`crate::model::decoder_sequence`]) computes the same recurrence for a whole
//! batch in one op; it is tied to this step by the gradient checks and the fused-against-composed loss tests.

use candle_core::{Result, Tensor};

use crate::kernels::select_rows;
use crate::model::attention::{Context, ContextProducts};
use crate::model::readout::OutputWords;
use crate::model::{Model, Source, WordTerms};

/// Where a step reads the source: the encoded batch and, per state row, its sentence.
#[derive(Clone, Copy)]
pub struct SourceView<'a> {
    /// The encoded source: one row per sentence when `by_rows`, else one row per state row.
    pub source: &'a Source,
    /// The context's products with the weights that read it, per sentence (decoding with fused kernels; see
    /// [`Model::context_products`]).
    pub products: Option<&'a ContextProducts>,
    /// Each state row's sentence (a row of `products`, and of `source` when `by_rows`).
    pub rows: &'a [u32],
    /// Attention reads sentence `rows[i]`'s keys in place (see [`Model::attends_by_rows`]).
    pub by_rows: bool,
}

impl<'a> SourceView<'a> {
    /// One state row per sentence of `source`, in order (`rows` = `0..N`), with `products` when given.
    pub fn sentences(
        source: &'a Source,
        products: Option<&'a ContextProducts>,
        rows: &'a [u32],
    ) -> Self {
        SourceView {
            source,
            products,
            rows,
            by_rows: false,
        }
    }
}

/// The decoder's state between two steps, over `N` rows (sentences or hypotheses).
#[derive(Clone)]
pub struct DecoderState {
    /// `t_{i−1}` `[N, H]`.
    pub t: Tensor,
    /// The coverage after the last step (`[N, S, ·]`), with a coverage model.
    pub cov: Option<Tensor>,
    /// What the next step reads of the word fed last, `y_{i−1}` (at the start, of a zero embedding).
    pub prev: WordTerms,
}

impl DecoderState {
    /// Rows `idx` (`[M]`, u32) of the state.
    pub fn select(&self, idx: &Tensor) -> Result<DecoderState> {
        Ok(DecoderState {
            t: select_rows(&self.t, idx)?,
            cov: self.cov.as_ref().map(|c| select_rows(c, idx)).transpose()?,
            prev: self.prev.select(idx)?,
        })
    }
}

/// What [`Model::step`] computed before the word is chosen.
pub struct Step {
    /// Attention weights `α_i` `[N, S]`.
    pub alpha: Tensor,
    /// The context `s_i` `[N, 2H]`.
    pub ctx: Tensor,
    /// `s_i` with the products its readers take, where carried.
    pub context: Context,
    /// The coverage after this step.
    pub cov: Option<Tensor>,
    /// The state the readout and the transition read: `t_{i−1}`, or for the conditional GRU its context
    /// GRU's output.
    pub t: Tensor,
    /// The conditional GRU's gate value in this step (`None` for the other decoders or without a gate).
    pub gate: Option<Tensor>,
}

impl Model {
    /// The state before the first word, over the rows of `source` (`t_0`, the initial coverage, the terms of a
    /// zero embedding). `readout`: whether the readout's word term is formed (decoding), or left out (the
    /// composed training path, which reads the states out all at once).
    pub fn start(&self, source: &Source, readout: bool) -> Result<DecoderState> {
        let n = source.t0.dim(0)?;
        let zeros = Tensor::zeros(
            (n, self.tgt_emb.dim(1)?),
            self.tgt_emb.dtype(),
            self.tgt_emb.device(),
        )?;
        Ok(DecoderState {
            t: source.t0.clone(),
            cov: self.initial_coverage(source)?,
            prev: if readout {
                self.word_terms(&zeros)?
            } else {
                WordTerms {
                    proj: zeros.clone(),
                    gate: self.gate.word_term(self.kernels, &zeros)?,
                    readout: None,
                }
            },
        })
    }

    /// The first half of a step from `state`: attention and the context, then the conditional GRU's context
    /// GRU (with the gate). `drop`: recurrent dropout's masks (training).
    pub fn step(
        &self,
        view: SourceView,
        state: &DecoderState,
        context_scale: (f64, f64),
        drop: Option<&Tensor>,
    ) -> Result<Step> {
        let out = if view.by_rows {
            self.attend_rows(view.source, view.rows, &state.t)?
        } else {
            self.attend(view.source, &state.t, state.cov.as_ref())?
        };
        let context = match view.products {
            Some(p) => p.context(&out.ctx, &out.alpha, view.rows)?,
            None => (&out.ctx).into(),
        };
        let (t, gate) = if self.is_conditional() {
            let sc = self.gate.scales(
                self.kernels,
                state.prev.gate.as_ref(),
                &state.t,
                &context,
                context_scale,
            )?;
            let t = self
                .cell
                .context_step_dropped(self.kernels, &state.t, &context, &sc, drop)?;
            (self.cell.deep_steps(self.kernels, t, drop)?, sc.gate)
        } else {
            (state.t.clone(), None)
        };
        Ok(Step {
            alpha: out.alpha,
            ctx: out.ctx,
            context,
            cov: out.cov,
            t,
            gate,
        })
    }

    /// The step's logits as f32 rows in `buf` (see [`crate::model::readout::Readout::logit_rows_term`]), over
    /// the vocabulary or `words`; returns the rows' width.
    pub fn step_logits(
        &self,
        step: &Step,
        state: &DecoderState,
        words: Option<&OutputWords>,
        buf: &mut Vec<f32>,
    ) -> Result<usize> {
        self.readout.logit_rows_term(
            self.kernels,
            &step.context,
            &step.t,
            readout_term(state)?,
            words,
            buf,
        )
    }

    /// The step's logits as a tensor `[N, V]` (composed kernels).
    pub fn step_logits_tensor(
        &self,
        step: &Step,
        state: &DecoderState,
        words: Option<&OutputWords>,
    ) -> Result<Tensor> {
        self.readout.logits_term(
            self.kernels,
            &step.context,
            &step.t,
            readout_term(state)?,
            words,
        )
    }

    /// The second half of a step: the recurrent transition from `step` with the chosen words' terms `word`
    /// (one row per new state row), from the rows `parents` of the step when given (a beam's continuing
    /// hypotheses). Returns the next state and the transition's scales (with the gate value). `drop`:
    /// recurrent dropout's masks (training).
    pub fn feed(
        &self,
        step: &Step,
        parents: Option<&Tensor>,
        word: WordTerms,
        context_scale: (f64, f64),
        drop: Option<&Tensor>,
    ) -> Result<(DecoderState, crate::model::gate::Scales)> {
        let (t_prev, context, cov) = match parents {
            Some(p) => (
                select_rows(&step.t, p)?,
                // The parents' rows of what the transition reads of the context.
                step.context.select(p, &self.transition_context_weights())?,
                step.cov.as_ref().map(|c| select_rows(c, p)).transpose()?,
            ),
            None => (step.t.clone(), step.context.clone(), step.cov.clone()),
        };
        let (t, sc) = self.transition_terms(
            &t_prev,
            &word.proj,
            word.gate.as_ref(),
            &context,
            context_scale,
            drop,
        )?;
        Ok((DecoderState { t, cov, prev: word }, sc))
    }
}

fn readout_term(state: &DecoderState) -> Result<&Tensor> {
    match &state.prev.readout {
        Some(r) => Ok(r),
        None => candle_core::bail!("the decoder state carries no readout term (a training state)"),
    }
}
