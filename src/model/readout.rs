//! Readout and output layer (model-spec §3 step 2): `r~ = W_o s_i + U_o t_{i−1} + V_o e(y_{i−1}) + b_o`,
//! `r = maxout_2(r~)` (H → H/2), `logits = W_2 (W_1 r) + b` (H/2 → E → V). The readout is never gated.
//! Its row kernels, fused ops (maxout, output layer + NLL, the fused readout rows) and their composed
//! references are in [`crate::kernels::readout`].

use candle_core::{DType, Result, Tensor};
use rayon::prelude::*;

use crate::kernels::readout::{maxout_fused, maxout_reference, ReadoutWeights};
use crate::kernels::Kernels;
use crate::model::attention::Context;
use crate::model::layer_norm::{norm, LayerNorm};
use candle_nn::VarBuilder;

pub struct Readout {
    pub w_o: Tensor,
    pub u_o: Tensor,
    pub v_o: Tensor,
    pub b_o: Tensor,
    pub w_1: Tensor,
    pub w_2: Tensor,
    pub b: Tensor,
    pub hidden: usize,
    /// Layer normalisation (model-spec §5b) of the three terms of `r~`: `ln_W_o`, `ln_U_o`, `ln_V_o`.
    pub ln: Option<[LayerNorm; 3]>,
}

impl Readout {
    /// `tied`: the target embeddings `[V, E]` when the output layer's `W_2` is their transpose (a copy of
    /// their values now: training forms `W_2` from them at every pass, see `Model::loss`).
    pub fn new(
        vb: VarBuilder,
        emb: usize,
        hidden: usize,
        vocab: usize,
        tied: Option<&Tensor>,
        layer_norm: bool,
    ) -> Result<Self> {
        let ln = if layer_norm {
            Some([
                LayerNorm::new(vb.pp("ln_W_o"), &[hidden])?,
                LayerNorm::new(vb.pp("ln_U_o"), &[hidden])?,
                LayerNorm::new(vb.pp("ln_V_o"), &[hidden])?,
            ])
        } else {
            None
        };
        Ok(Self {
            w_o: vb.get_with_hints((2 * hidden, hidden), "W_o", crate::model::init::ZERO)?,
            u_o: vb.get_with_hints((hidden, hidden), "U_o", crate::model::init::ZERO)?,
            v_o: vb.get_with_hints((emb, hidden), "V_o", crate::model::init::ZERO)?,
            b_o: vb.get_with_hints(hidden, "b_o", crate::model::init::ZERO)?,
            w_1: vb.get_with_hints((hidden / 2, emb), "W_1", crate::model::init::ZERO)?,
            w_2: match tied {
                Some(e) => e.detach().t()?.contiguous()?,
                None => vb.get_with_hints((emb, vocab), "W_2", crate::model::init::ZERO)?,
            },
            b: vb.get_with_hints(vocab, "b", crate::model::init::ZERO)?,
            hidden,
            ln,
        })
    }

    /// The readout's hidden layer `W_1 maxout(r~)` `[N, E]` from contexts `[N, 2H]`, previous states `[N, H]`
    /// and previous-word embeddings `[N, E]`.
    pub fn hidden(
        &self,
        k: Kernels,
        ctx: &Context,
        t_prev: &Tensor,
        e_prev: &Tensor,
    ) -> Result<Tensor> {
        self.hidden_term(k, ctx, t_prev, &self.word_term(k, e_prev)?)
    }

    /// The readout's word term `V_o e(y_{i−1})` `[N, H]` of embeddings `[N, E]`.
    pub fn word_term(&self, k: Kernels, e: &Tensor) -> Result<Tensor> {
        norm(
            k,
            self.norm(2),
            crate::kernels::rec_matmul(k, e, &self.v_o)?,
        )
    }

    /// The layer normalisation of term `i` of `r~` (0: `W_o s`, 1: `U_o t`, 2: `V_o e`), if any.
    fn norm(&self, i: usize) -> Option<&LayerNorm> {
        self.ln.as_ref().map(|l| &l[i])
    }

    /// [`Readout::hidden`] with the word term `V_o e(y_{i−1})` given ([`Readout::word_term`], or its rows of
    /// decoding's word table).
    pub fn hidden_term(
        &self,
        k: Kernels,
        ctx: &Context,
        t_prev: &Tensor,
        ve_prev: &Tensor,
    ) -> Result<Tensor> {
        let s_w = norm(k, self.norm(0), ctx.product(k, &self.w_o)?)?;
        let t_u = norm(
            k,
            self.norm(1),
            crate::kernels::rec_matmul(k, t_prev, &self.u_o)?,
        )?;
        let r = (s_w + t_u + ve_prev)?.broadcast_add(&self.b_o)?;
        self.hidden_from(k, &r)
    }

    /// [`Readout::hidden`] from rows `[t_{i−1} | s_i]` `[N, 3H]` (the fused decoder's output): the state and
    /// context terms as one product with `[U_o; W_o]`, no copies of the two halves.
    pub fn hidden_stacked(&self, k: Kernels, ts: &Tensor, e_prev: &Tensor) -> Result<Tensor> {
        if self.ln.is_some() {
            candle_core::bail!(
                "the stacked readout does not normalise its terms (the composed path does)"
            );
        }
        let uw = Tensor::cat(&[&self.u_o, &self.w_o], 0)?;
        let r = (crate::kernels::linear(k, ts, &uw, &self.b_o)? + e_prev.matmul(&self.v_o)?)?;
        self.hidden_from(k, &r)
    }

    /// The weights the fused readout rows read ([`crate::kernels::readout::hidden_rows_fused`]).
    pub fn rows_weights(&self) -> ReadoutWeights<'_> {
        ReadoutWeights {
            u_o: &self.u_o,
            w_o: &self.w_o,
            v_o: &self.v_o,
            b_o: &self.b_o,
            w_1: &self.w_1,
            hidden: self.hidden,
            ln: self
                .ln
                .as_ref()
                .map(|l| [0, 1, 2].map(|i| [&l[i].g, &l[i].b])),
        }
    }

    /// `W_1 maxout(r~)`.
    fn hidden_from(&self, k: Kernels, r: &Tensor) -> Result<Tensor> {
        let m = if k.ops_fused_on(r.device()) {
            maxout_fused(r)?
        } else {
            maxout_reference(r)?
        };
        crate::kernels::rec_matmul(k, &m, &self.w_1)
    }

    /// Logits `[N, V]` from contexts `[N, 2H]`, previous states `[N, H]` and previous-word embeddings `[N, E]`.
    pub fn logits(
        &self,
        k: Kernels,
        ctx: &Context,
        t_prev: &Tensor,
        e_prev: &Tensor,
    ) -> Result<Tensor> {
        self.logits_term(k, ctx, t_prev, &self.word_term(k, e_prev)?, None)
    }

    /// [`Readout::logits`] with the word term given (see [`Readout::hidden_term`]), over the vocabulary or over
    /// the words of `words` (their columns, in its order).
    pub fn logits_term(
        &self,
        k: Kernels,
        ctx: &Context,
        t_prev: &Tensor,
        ve_prev: &Tensor,
        words: Option<&OutputWords>,
    ) -> Result<Tensor> {
        let (w_2, b) = self.output(words);
        self.hidden_term(k, ctx, t_prev, ve_prev)?
            .matmul(w_2)?
            .broadcast_add(b)
    }

    /// The output layer's weight and bias, over the vocabulary or `words`.
    fn output<'a>(&'a self, words: Option<&'a OutputWords>) -> (&'a Tensor, &'a Tensor) {
        match words {
            Some(o) => (&o.w_2, &o.b),
            None => (&self.w_2, &self.b),
        }
    }

    /// Decoding: [`Readout::logits`] as f32 rows `[N, V]` in `buf` (its allocation kept from step to step);
    /// returns `V`. With fused kernels and an f32 model, one GEMM writes `b + x W_2` into the rows — with `W_2`
    /// packed once per decoding call where [`crate::kernels::prepared_mul_into`] has it, which adds each sum to
    /// the bias as it stores it — so no `[N, V]` tensor is made, added to or copied.
    pub fn logit_rows(
        &self,
        k: Kernels,
        ctx: &Context,
        t_prev: &Tensor,
        e_prev: &Tensor,
        buf: &mut Vec<f32>,
    ) -> Result<usize> {
        self.logit_rows_term(k, ctx, t_prev, &self.word_term(k, e_prev)?, None, buf)
    }

    /// [`Readout::logit_rows`] with the word term given (see [`Readout::hidden_term`]), over the vocabulary
    /// or over `words` (rows `[N, words.ids.len()]`, with its packed columns).
    pub fn logit_rows_term(
        &self,
        k: Kernels,
        ctx: &Context,
        t_prev: &Tensor,
        ve_prev: &Tensor,
        words: Option<&OutputWords>,
        buf: &mut Vec<f32>,
    ) -> Result<usize> {
        let x = self.hidden_term(k, ctx, t_prev, ve_prev)?;
        let (w_2, b) = self.output(words);
        let (n, e) = x.dims2()?;
        let v = w_2.dim(1)?;
        if !k.ops_fused_on(x.device()) || x.dtype() != DType::F32 {
            let logits = x.matmul(w_2)?.broadcast_add(b)?;
            *buf = logits
                .to_dtype(DType::F32)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            return Ok(v);
        }
        // The packed product writes every element (bias + x W_2), so only a larger buffer is filled first.
        buf.resize(n * v, 0.0);
        let bias = b.to_vec1::<f32>()?;
        let x = x.contiguous()?;
        let (xs, xl) = x.storage_and_layout();
        let xv = crate::kernels::storage_slice::<f32>(&xs, xl)?;
        let start = crate::kernels::Start::Row(&bias);
        let packed = match words {
            Some(o) => match &o.packed {
                Some(p) => {
                    crate::kernels::packed_mul_into(p, n, xv, buf, start)?;
                    true
                }
                None => false,
            },
            None => crate::kernels::prepared_mul_into(w_2, n, xv, buf, start)?,
        };
        if !packed {
            buf.par_chunks_mut(v.max(1))
                .for_each(|row| row.copy_from_slice(&bias));
            let w2 = w_2.contiguous()?;
            let (ws, wl) = w2.storage_and_layout();
            let wv = crate::kernels::storage_slice::<f32>(&ws, wl)?;
            crate::kernels::gemm_into(
                n,
                v,
                e,
                buf,
                v,
                true,
                crate::kernels::Mat::rows(xv, e),
                crate::kernels::Mat::rows(wv, v),
            );
        }
        Ok(v)
    }

    /// The output layer over the target words `ids` only (a decoding shortlist, see
    /// [`crate::decode::shortlist`]): their columns of `W_2` and `b`, packed once for the batch that decodes over them.
    /// `int8`: the columns packed quantised to 8 bits (see [`crate::kernels::quantized_gemm`]).
    pub fn output_words(&self, k: Kernels, ids: &[u32], int8: bool) -> Result<OutputWords> {
        let v = self.w_2.dim(1)?;
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= v) {
            candle_core::bail!("output words: id {bad} is outside the vocabulary of {v}");
        }
        let idx = Tensor::from_vec(ids.to_vec(), ids.len(), self.w_2.device())?;
        let w_2 = self.w_2.index_select(&idx, 1)?.contiguous()?;
        let b = self.b.index_select(&idx, 0)?;
        let packed = if k.ops_fused_on(w_2.device()) {
            crate::kernels::packed_as(&w_2, int8)?
        } else {
            None
        };
        Ok(OutputWords {
            ids: ids.to_vec(),
            w_2,
            b,
            packed,
        })
    }
}

/// The output layer's columns for some target words (see [`Readout::output_words`]).
pub struct OutputWords {
    /// The target ids, in the order of the columns.
    pub ids: Vec<u32>,
    w_2: Tensor,
    b: Tensor,
    packed: Option<crate::kernels::packed_gemm::Packed>,
}
