//! The whole translation model: encoder, initial decoder state, attention (with optional coverage), context
//! gate, recurrent transition and readout. `loss` runs teacher forcing over a batch; the step functions are
//! what beam search calls.

pub mod attention;
pub mod batch;
pub mod coverage;
pub mod decoder_cell;
pub mod decoder_sequence;
pub mod decoder_step;
pub mod dropout;
pub mod encoder;
pub mod gate;
pub mod gru;
pub mod init;
pub mod layer_norm;
pub mod readout;
pub mod store;

use candle_core::{DType, Device, IndexOp, Result, Tensor};
use candle_nn::{VarBuilder, VarMap};

use crate::config::{ModelConfig, TargetPadding};
use crate::kernels::attention::Keys;
use crate::kernels::gate::GateKinds;
use crate::kernels::readout::{output_nll_smoothed_fused, output_nll_smoothed_reference};
use crate::kernels::Kernels;
use crate::model::attention::{Attention, Context, ContextProducts};
use crate::model::batch::word_rows;
pub use crate::model::batch::{mask_lengths, pad, Batch};
use crate::model::coverage::{CovKeys, Coverage};
use crate::model::decoder_cell::DecoderCell;
use crate::model::decoder_sequence::Targets;
use crate::model::dropout::Site;
use crate::model::encoder::Encoder;
use crate::model::gate::{Gate, Scales};
use crate::model::readout::Readout;

/// How training runs the decoder (see [`Model::decoder_path`]).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum DecoderPath {
    /// Step by step from the composed pieces (the reference kernels, or a device without the fused ops).
    Composed,
    /// One fused op per batch, with the gate's scales as functions of its value (`None`: no gate).
    Fused { gate: Option<GateKinds> },
}

pub struct Model {
    pub cfg: ModelConfig,
    pub src_vocab: usize,
    pub tgt_vocab: usize,
    pub encoder: Encoder,
    pub w_init: Tensor,
    pub b_init: Tensor,
    pub attention: Attention,
    pub coverage: Option<Coverage>,
    pub tgt_emb: Tensor,
    pub gate: Gate,
    pub cell: DecoderCell,
    pub readout: Readout,
    /// Reference (composed) or fused kernels for the hot recurrent steps.
    pub kernels: Kernels,
}

/// Encoder output prepared for decoding.
pub struct Source {
    pub keys: Keys,
    pub cov_keys: Option<CovKeys>,
    pub t0: Tensor,
}

impl Source {
    /// Rows `idx` (e.g. one per beam hypothesis).
    pub fn select(&self, idx: &Tensor) -> Result<Source> {
        Ok(Source {
            keys: Keys {
                ah: crate::kernels::select_rows(&self.keys.ah, idx)?,
                annotations: crate::kernels::select_rows(&self.keys.annotations, idx)?,
                mask_bias: crate::kernels::select_rows(&self.keys.mask_bias, idx)?,
                shared: None,
            },
            cov_keys: match &self.cov_keys {
                Some(k) => Some(k.select(idx)?),
                None => None,
            },
            t0: crate::kernels::select_rows(&self.t0, idx)?,
        })
    }
}

/// What the decoder's steps read of the words `y` fed to them, `[N, ·]` each: the transition's word
/// projection `W e(y) + b` (the cGRU's word GRU's `[e W_r, e W_u, e W + b]`), the context gate's word term
/// `W_z e(y)` (`None` without one) and the readout's `V_o e(y)` (`None` in the composed training path, which
/// reads the states out all at once).
#[derive(Clone)]
pub struct WordTerms {
    pub proj: Tensor,
    pub gate: Option<Tensor>,
    pub readout: Option<Tensor>,
}

impl WordTerms {
    /// Rows `idx` (`[N]`, u32).
    pub fn select(&self, idx: &Tensor) -> Result<WordTerms> {
        Ok(WordTerms {
            proj: crate::kernels::select_rows(&self.proj, idx)?,
            gate: match &self.gate {
                Some(g) => Some(crate::kernels::select_rows(g, idx)?),
                None => None,
            },
            readout: match &self.readout {
                Some(r) => Some(crate::kernels::select_rows(r, idx)?),
                None => None,
            },
        })
    }
}

/// Every target word's [`WordTerms`] (`[V, ·]` each; see [`Model::word_table`]).
pub struct WordTable(WordTerms);

impl WordTable {
    /// The terms of words `ids` (`[N]`, u32).
    pub fn rows(&self, ids: &Tensor) -> Result<WordTerms> {
        self.0.select(ids)
    }
}

/// What one decoder step returns besides the new state.
pub struct StepOut {
    pub alpha: Tensor,
    pub ctx: Tensor,
    pub cov: Option<Tensor>,
}

impl Model {
    pub fn new(
        vb: VarBuilder,
        cfg: &ModelConfig,
        src_vocab: usize,
        tgt_vocab: usize,
    ) -> Result<Self> {
        let (e, h) = (cfg.embedding_dim, cfg.hidden_dim);
        let dec = vb.pp("decoder");
        let tgt_emb = dec.get_with_hints((tgt_vocab, e), "E", crate::model::init::ZERO)?;
        let readout = Readout::new(
            dec.pp("readout"),
            e,
            h,
            tgt_vocab,
            cfg.tied_output_embeddings.then_some(&tgt_emb),
            cfg.layer_norm,
        )?;
        Ok(Self {
            cfg: cfg.clone(),
            src_vocab,
            tgt_vocab,
            encoder: Encoder::new(
                vb.pp("encoder"),
                src_vocab,
                e,
                h,
                (
                    cfg.encoder_layers,
                    cfg.encoder_type == crate::config::EncoderType::BiUnidirectional,
                    cfg.residual,
                ),
                cfg.layer_norm,
            )?,
            w_init: dec
                .pp("init")
                .get_with_hints((h, h), "W_init", crate::model::init::ZERO)?,
            b_init: dec
                .pp("init")
                .get_with_hints(h, "b_init", crate::model::init::ZERO)?,
            attention: Attention::new(
                dec.pp("attention"),
                2 * h,
                h,
                cfg.attention_dim,
                cfg.layer_norm,
            )?,
            coverage: Coverage::new(dec.clone(), cfg)?,
            tgt_emb,
            gate: Gate::new(dec.clone(), cfg)?,
            cell: DecoderCell::new(
                dec.pp("cell"),
                (cfg.decoder, cfg.gate_form),
                e,
                h,
                (cfg.decoder_transition_depth, cfg.layer_norm),
            )?,
            readout,
            kernels: Self::kernels_for(cfg, Kernels::process_choice()),
        })
    }

    /// Tied output embeddings: the readout's `W_2` formed again from the embeddings' values now (after the
    /// variables were initialised or loaded; training forms it at every pass and decodes with a
    /// [`Model::frozen`] twin, so it never reads a stale copy). Nothing to do for separate weights.
    pub fn refresh_tied_output(&mut self) -> Result<()> {
        if self.cfg.tied_output_embeddings {
            self.readout.w_2 = self.tgt_emb.detach().t()?.contiguous()?;
        }
        Ok(())
    }

    /// Choose reference or fused kernels for every part of the model (the parts take the choice as an
    /// argument from here).
    /// A layer-normalised model (`model.layer_norm`) runs the fused row ops ([`Kernels::FusedOps`]), the fused
    /// encoder op and the fused decoder op, both of which normalise inside (see [`Model::decoder_path`]).
    pub fn set_kernels(&mut self, k: Kernels) {
        self.kernels = Self::kernels_for(&self.cfg, k);
    }

    /// The kernels a model of `cfg` runs when `k` is asked for (see [`Model::set_kernels`]).
    fn kernels_for(cfg: &ModelConfig, k: Kernels) -> Kernels {
        match (cfg.layer_norm, k) {
            (true, Kernels::Fused) => Kernels::FusedOps,
            (false, Kernels::FusedOps) => Kernels::Fused,
            _ => k,
        }
    }

    /// The parameters whose gradient has non-zero rows only for the words of the batch: the word-embedding
    /// tables looked up by id (the source's, and the target's unless it is also the output layer, whose
    /// gradient is dense). The data-parallel exchange sends only their touched rows.
    pub fn row_sparse_parameters(&self) -> Vec<String> {
        let mut names = vec!["encoder.E".to_string()];
        if !self.cfg.tied_output_embeddings {
            names.push("decoder.E".into());
        }
        names
    }

    /// The inference-only twin of this model: the same parameter storage (so it sees every optimiser
    /// update) as plain tensors rather than variables, so decoding builds no autodiff graph.
    pub fn frozen(&self, varmap: &VarMap) -> Result<Model> {
        let map: std::collections::HashMap<String, Tensor> = varmap
            .data()
            .lock()
            .expect("varmap lock")
            .iter()
            .map(|(k, v)| (k.clone(), v.as_tensor().detach()))
            .collect();
        let vb = VarBuilder::from_tensors(map, self.tgt_emb.dtype(), self.tgt_emb.device());
        let mut m = Model::new(vb, &self.cfg, self.src_vocab, self.tgt_vocab)?;
        m.set_kernels(self.kernels);
        Ok(m)
    }

    /// Build a model with fresh variables (paper initialisation from `seed`) in `varmap`.
    pub fn build(
        cfg: &ModelConfig,
        src_vocab: usize,
        tgt_vocab: usize,
        seed: u64,
        dtype: DType,
        dev: &Device,
    ) -> crate::error::Result<(Model, VarMap)> {
        let (mut model, varmap) = Self::build_uninit(cfg, src_vocab, tgt_vocab, dtype, dev)?;
        crate::model::init::init_params(&varmap, seed)?;
        model.refresh_tied_output()?;
        Ok((model, varmap))
    }

    /// Build with all-zero variables (to count parameters, or before loading weights).
    pub fn build_uninit(
        cfg: &ModelConfig,
        src_vocab: usize,
        tgt_vocab: usize,
        dtype: DType,
        dev: &Device,
    ) -> crate::error::Result<(Model, VarMap)> {
        let varmap = VarMap::new();
        let vb = VarBuilder::from_varmap(&varmap, dtype, dev);
        let model = Model::new(vb, cfg, src_vocab, tgt_vocab)?;
        Ok((model, varmap))
    }

    /// The decoder's recurrent weights (multiplied by a state or context at every step), which the per-step
    /// fused products read prepared ([`crate::kernels::begin_pass`]).
    pub fn recurrent_weights(&self) -> Vec<&Tensor> {
        // (The encoder's run inside one fused op, `encoder::bigru_fused`, which orients them itself.)
        let mut w: Vec<&Tensor> = vec![&self.attention.b, &self.cell.c, &self.cell.u];
        if let Some(u) = &self.cell.u_ru {
            w.push(u);
        }
        if let Some((word, ctx)) = &self.cell.cgru {
            w.extend([&word.u_ru, &word.u, &ctx.c, &ctx.u_ru, &ctx.u]);
        }
        if let Gate::Context { u_z, c_z, .. } = &self.gate {
            w.extend(u_z.iter().chain(c_z.iter()));
        }
        for d in &self.cell.deep {
            w.extend([&d.u_ru, &d.u]);
        }
        w
    }

    /// Encode a batch; every forward pass (training or decoding) starts here, so this is also where the
    /// fused kernels prepare the recurrent weights for the pass.
    pub fn encode(&self, src: &Tensor, src_mask: &Tensor) -> Result<Source> {
        self.encode_prepared(src, src_mask, None)
    }

    /// The weights that decoding's steps multiply with: the recurrent ones, the readout's, the output
    /// layer's, the word projections' `W` and the gate's `W_z`; with `int8` also those of the products formed
    /// once per batch, which then run in 8 bits ([`crate::kernels::int8_matmul`]): the attention's `A`, the
    /// readout's `W_o` and `W_init` (training with fused kernels encodes with `encode_shared`, whose pass
    /// prepares the recurrent ones only).
    fn decoding_weights(&self, int8: bool) -> Vec<&Tensor> {
        let mut weights = self.recurrent_weights();
        let r = &self.readout;
        weights.extend([&r.u_o, &r.v_o, &r.w_1, &r.w_2]);
        if int8 {
            weights.extend([&r.w_o, &self.attention.a, &self.w_init]);
        }
        weights.push(self.word_projection());
        if let Gate::Context { w_z: Some(w_z), .. } = &self.gate {
            weights.push(w_z);
        }
        weights
    }

    /// The transition's word projection `W` (the cGRU's: its word GRU's).
    fn word_projection(&self) -> &Tensor {
        match &self.cell.cgru {
            Some((word, _)) => &word.w,
            None => &self.cell.w,
        }
    }

    /// Start a decoding pass on this thread with decoding's weights prepared earlier, or prepared here.
    fn begin_decoding_pass(&self, prepared: Option<&crate::kernels::Prepared>) -> Result<()> {
        match prepared {
            Some(p) => crate::kernels::begin_prepared_pass(p),
            None => crate::kernels::begin_pass(self.kernels, &self.decoding_weights(false))?,
        }
        Ok(())
    }

    /// Decoding's weights prepared once for several batches (see [`crate::kernels::Prepared`]; `None`
    /// without fused kernels). The weights must not change while it is in use.
    pub fn prepare_decoding(&self) -> Result<Option<crate::kernels::Prepared>> {
        self.prepare_decoding_as(false)
    }

    /// [`Model::prepare_decoding`], the per-step products' weights quantised to 8 bits when `int8`
    /// (approximate, see [`crate::kernels::quantized_gemm`]).
    pub fn prepare_decoding_as(&self, int8: bool) -> Result<Option<crate::kernels::Prepared>> {
        crate::kernels::prepare_as(self.kernels, &self.decoding_weights(int8), int8)
    }

    /// [`Model::encode`] with decoding's weights prepared earlier ([`Model::prepare_decoding`]), or prepared
    /// for this pass when `None`.
    pub fn encode_prepared(
        &self,
        src: &Tensor,
        src_mask: &Tensor,
        prepared: Option<&crate::kernels::Prepared>,
    ) -> Result<Source> {
        self.begin_decoding_pass(prepared)?;
        let e = self.encoder.embed(self.kernels, src)?;
        self.encode_embedded(
            &e,
            src_mask,
            &crate::model::dropout::Dropper::none(),
            (0.0, 0.0),
        )
    }

    /// The source side from its embedded words `e` `[B·S, E]` (after dropout when training), with dropout at
    /// rates `(p_rec, p_ann)` on the encoder's recurrent connections and on the annotations.
    fn encode_embedded(
        &self,
        e: &Tensor,
        src_mask: &Tensor,
        drop: &crate::model::dropout::Dropper,
        (p_rec, p_ann): (f64, f64),
    ) -> Result<Source> {
        let rec = self.encoder_dropout(drop, src_mask, p_rec)?;
        let mut enc = self
            .encoder
            .forward_embedded(self.kernels, e, src_mask, &rec)?;
        if let Some(mask) = drop.mask(&enc.annotations, Site::Annotations, p_ann)? {
            enc.annotations = enc.annotations.mul(&mask)?;
            let h = enc.bwd_first.dim(1)?;
            enc.bwd_first = enc.annotations.i((.., 0))?.narrow(1, h, h)?;
        }
        let keys = self
            .attention
            .keys(self.kernels, &enc.annotations, src_mask)?;
        let t0 = self.initial_state(&enc.bwd_first)?;
        let cov_keys = match &self.coverage {
            Some(c) => Some(c.keys(&enc.annotations)?),
            None => None,
        };
        Ok(Source { keys, cov_keys, t0 })
    }

    /// Recurrent dropout's masks `[B, H]` of each encoder layer's forward and backward directions, bottom
    /// first (empty when nothing drops). The layers above the first draw from streams of their own
    /// ([`crate::model::dropout::Dropper::layer`]).
    fn encoder_dropout(
        &self,
        drop: &crate::model::dropout::Dropper,
        src_mask: &Tensor,
        p: f64,
    ) -> Result<Vec<[Tensor; 2]>> {
        let mut masks = Vec::new();
        for l in 1..=self.encoder.layers() {
            // Each direction's width: H, or 2H for a unidirectional layer.
            let width = match l {
                1 => self.encoder.hidden,
                _ => self.encoder.upper[l - 2].fwd.hidden,
            };
            let shape = (src_mask.dim(0)?, width);
            let d = drop.layer(l as u64);
            let Some(f) = d.mask_shaped(shape, src_mask, Site::EncoderForward, p)? else {
                return Ok(Vec::new());
            };
            let Some(b) = d.mask_shaped(shape, src_mask, Site::EncoderBackward, p)? else {
                return Ok(Vec::new());
            };
            masks.push([f, b]);
        }
        Ok(masks)
    }

    /// The decoder's initial state `tanh(W_init ←h_1 + b_init)` from the backward state at the first word.
    fn initial_state(&self, bwd_first: &Tensor) -> Result<Tensor> {
        crate::kernels::matmul_or_int8(bwd_first, &self.w_init)?
            .broadcast_add(&self.b_init)?
            .tanh()
    }

    /// [`Model::encode`] for training with the fused decoder sequence op: the annotations come from the fused
    /// encoder as a [`crate::kernels::Shared`] handle, and the keys `A h` and the initial state's `←h_1` are
    /// read from it by ops that add their gradients into the handle — the annotations' and the keys'
    /// gradients never enter candle's gradient store (the decoder op takes both handles as they are).
    fn encode_shared(
        &self,
        e: &Tensor,
        src_mask: &Tensor,
        drop: &crate::model::dropout::Dropper,
        (p_rec, p_ann): (f64, f64),
    ) -> Result<Source> {
        use crate::kernels::{product_shared_rows, shared_rows};
        let rec = self.encoder_dropout(drop, src_mask, p_rec)?;
        let mut ann = self
            .encoder
            .forward_shared(self.kernels, e, src_mask, &rec)?;
        if let Some(mask) = drop.mask(&ann.tensor, Site::Annotations, p_ann)? {
            ann = crate::kernels::dropout_shared(&ann, &mask)?;
        }
        let (b, s, a2) = ann.tensor.dims3()?;
        // The keys of the words' positions only (`[Σ len, Ad]`, the decoder op reads no other) when the
        // mask is words then padding; else `[B, S, Ad]`.
        let src_rows = mask_lengths(src_mask)?
            .filter(|l| l.iter().sum::<usize>() < b * s)
            .map(|l| word_rows(&l, s));
        let ah = product_shared_rows(&ann, &self.attention.a, src_rows)?;
        // With layer normalisation, the keys normalised in the handles too.
        let ah = match &self.attention.ln {
            Some((ln, _)) => {
                crate::kernels::layer_norm::layer_norm_shared(&ah, &ln.g, &ln.b, &ln.blocks)?
            }
            None => ah,
        };
        let h = a2 / 2;
        let bwd_first = shared_rows(&ann, (0..b).map(|i| i * s).collect(), h..a2)?;
        let t0 = self.initial_state(&bwd_first)?;
        let keys = Keys {
            ah: ah.tensor.clone(),
            annotations: ann.tensor.clone(),
            mask_bias: ((src_mask - 1.0)? * 1e9)?,
            shared: Some((ah, ann)),
        };
        Ok(Source {
            keys,
            cov_keys: None,
            t0,
        })
    }

    /// Attention from `t_prev` (with the coverage term), then the coverage update.
    pub fn attend(&self, src: &Source, t_prev: &Tensor, cov: Option<&Tensor>) -> Result<StepOut> {
        let term = match (&self.coverage, cov) {
            (Some(c), Some(cv)) => Some(c.attention_term(cv)?),
            _ => None,
        };
        let (alpha, ctx) = self
            .attention
            .step(self.kernels, &src.keys, t_prev, term.as_ref())?;
        let cov = match (&self.coverage, cov) {
            (Some(c), Some(cv)) => Some(c.update(
                src.cov_keys.as_ref().expect("coverage keys"),
                cv,
                &alpha,
                t_prev,
            )?),
            _ => None,
        };
        Ok(StepOut { alpha, ctx, cov })
    }

    /// Whether decoding on `dev` can attend through sentence rows ([`Model::attend_rows`]): no coverage, fused
    /// kernels on the CPU.
    pub fn attends_by_rows(&self, dev: &Device) -> bool {
        self.coverage.is_none() && self.kernels.ops_fused_on(dev)
    }

    /// Decoding with fused kernels on the CPU: each source position's products with the weights that read the
    /// attention context (see [`ContextProducts`]); `None` otherwise (the steps then form the products from
    /// the context).
    pub fn context_products(&self, src: &Source) -> Result<Option<ContextProducts>> {
        let ann = &src.keys.annotations;
        if !self.kernels.ops_fused_on(ann.device())
            || !matches!(ann.dtype(), DType::F32 | DType::F64)
        {
            return Ok(None);
        }
        // The transition's `C` (the cGRU's context GRU's), the gate's `C_z`, the readout's `W_o`.
        let mut weights = vec![&self.cell.c, &self.readout.w_o];
        if let Gate::Context { c_z: Some(c_z), .. } = &self.gate {
            weights.push(c_z);
        }
        Ok(Some(ContextProducts::new(ann, &weights)?))
    }

    /// The weights whose products with the attention context [`Model::transition_terms`] reads: the
    /// cell's `C` and the gate's `C_z` (the cGRU's transition, its word GRU, reads none).
    pub fn transition_context_weights(&self) -> Vec<&Tensor> {
        if self.is_conditional() {
            return vec![];
        }
        let mut weights = vec![&self.cell.c];
        if let Gate::Context { c_z: Some(c_z), .. } = &self.gate {
            weights.push(c_z);
        }
        weights
    }

    /// Inference, where [`Model::attends_by_rows`]: [`Model::attend`] for hypothesis rows that read the keys
    /// of sentence `rows[i]` of `src` in place (see [`crate::kernels::attention::attend_rows`]).
    pub fn attend_rows(&self, src: &Source, rows: &[u32], t_prev: &Tensor) -> Result<StepOut> {
        let (alpha, ctx) = self
            .attention
            .step_rows(self.kernels, &src.keys, rows, t_prev)?;
        Ok(StepOut {
            alpha,
            ctx,
            cov: None,
        })
    }

    /// How training runs the decoder: as one fused op per batch ([`crate::model::decoder_sequence`]) with fused
    /// kernels on the CPU (any decoder: GRU, vanilla, cGRU; either gate form; any gate; any coverage),
    /// otherwise step by step from the composed pieces.
    pub fn decoder_path(&self) -> DecoderPath {
        let dev = self.cell.u.device();
        // A layer-normalised model (fused row ops) runs the op, which normalises inside.
        let normed_op = self.cfg.layer_norm && self.kernels.ops_fused_on(dev);
        if !(self.kernels.fused_on(dev) || normed_op)
            || !matches!(self.cell.u.dtype(), DType::F32 | DType::F64)
        {
            return DecoderPath::Composed;
        }
        DecoderPath::Fused {
            gate: self.gate.kinds((1.0, 1.0)),
        }
    }

    pub fn is_conditional(&self) -> bool {
        self.cfg.decoder == crate::config::DecoderKind::Cgru
    }

    /// The products of the words' embeddings `e` `[N, E]` that the decoder's steps read (see
    /// [`WordTerms`]).
    pub fn word_terms(&self, e: &Tensor) -> Result<WordTerms> {
        Ok(WordTerms {
            proj: self.cell.project_words(self.kernels, e)?,
            gate: self.gate.word_term(self.kernels, e)?,
            readout: Some(self.readout.word_term(self.kernels, e)?),
        })
    }

    /// The size in bytes of decoding's word table (see [`Model::word_table`]).
    pub fn word_table_bytes(&self) -> usize {
        let width = |t: &Tensor| t.dims().last().copied().unwrap_or(0);
        let mut cols = width(self.word_projection()) + width(&self.readout.v_o);
        if let Gate::Context { w_z: Some(w_z), .. } = &self.gate {
            cols += width(w_z);
        }
        self.tgt_vocab * cols * self.tgt_emb.dtype().size_in_bytes()
    }

    /// Decoding's word table: every target word's [`WordTerms`], formed once (three products over the
    /// embedding table), so that each step gathers the rows of the words its hypotheses emitted instead of
    /// multiplying their embeddings. The products run with the weights as the steps' do (`prepared`, or
    /// prepared here), so the rows are those the steps would form.
    pub fn word_table(&self, prepared: Option<&crate::kernels::Prepared>) -> Result<WordTable> {
        self.begin_decoding_pass(prepared)?;
        Ok(WordTable(self.word_terms(&self.tgt_emb)?))
    }

    pub fn initial_coverage(&self, src: &Source) -> Result<Option<Tensor>> {
        match &self.coverage {
            Some(c) => {
                let (b, s, _) = src.keys.ah.dims3()?;
                Ok(Some(c.initial(b, s, &src.t0)?))
            }
            None => Ok(None),
        }
    }

    /// Target embeddings `[N, E]` of ids `[N]`.
    pub fn embed(&self, ids: &Tensor) -> Result<Tensor> {
        self.tgt_emb.embedding(ids)
    }

    pub fn logits(&self, ctx: &Context, t_prev: &Tensor, e_prev: &Tensor) -> Result<Tensor> {
        self.readout.logits(self.kernels, ctx, t_prev, e_prev)
    }

    /// The recurrent transition with the emitted word's embedding `e` `[N, E]`; returns the new state and the
    /// scales (with the gate value). Decoding runs it through [`Model::feed`].
    pub fn transition(
        &self,
        t_prev: &Tensor,
        e: &Tensor,
        ctx: &Context,
        context_scale: (f64, f64),
    ) -> Result<(Tensor, Scales)> {
        let wp = self.cell.project_words(self.kernels, e)?;
        let wz = self.gate.word_term(self.kernels, e)?;
        self.transition_terms(t_prev, &wp, wz.as_ref(), ctx, context_scale, None)
    }

    /// [`Model::transition`] from the word's terms (its projection `wp`, the gate's word term `wz`; see
    /// [`WordTerms`]), under recurrent dropout's masks `drop` `[B, H]` when given (training; see
    /// [`DecoderCell::step_dropped`]).
    pub fn transition_terms(
        &self,
        t_prev: &Tensor,
        wp: &Tensor,
        wz: Option<&Tensor>,
        ctx: &Context,
        context_scale: (f64, f64),
        drop: Option<&Tensor>,
    ) -> Result<(Tensor, Scales)> {
        if self.is_conditional() {
            return Ok((
                self.cell
                    .step_dropped(self.kernels, t_prev, wp, ctx, &Scales::none(), drop)?,
                Scales::none(),
            ));
        }
        let sc = self
            .gate
            .scales(self.kernels, wz, t_prev, ctx, context_scale)?;
        let t = self
            .cell
            .step_dropped(self.kernels, t_prev, wp, ctx, &sc, drop)?;
        let t = self.cell.deep_steps(self.kernels, t, drop)?;
        Ok((t, sc))
    }

    /// Gradients of `loss` (from [`Model::loss`]) for every parameter; releases the weights the pass
    /// prepared.
    pub fn backward(&self, loss: &Tensor) -> Result<candle_core::backprop::GradStore> {
        let grads = crate::kernels::backward(loss)?;
        crate::kernels::end_pass();
        Ok(grads)
    }

    /// Summed token negative log-likelihood (EOS included) divided by the batch size (model-spec §6).
    pub fn loss(&self, batch: &Batch) -> Result<Tensor> {
        self.loss_with(batch, &LossOptions::default())
    }

    /// [`Model::loss`] with the training options `opts`: the target side's padded positions computed too
    /// (`train.target_padding`; the same value either way), label smoothing (`train.label_smoothing`). The
    /// steps: encode, embed the target words, run
    /// the decoder's recurrence (one fused op, or step by step), the readout over all steps, the output
    /// layer's negative log-likelihood.
    pub fn loss_with(&self, batch: &Batch, opts: &LossOptions) -> Result<Tensor> {
        let (b, t_len) = batch.tgt.dims2()?;
        let path = self.decoder_path();
        let fused = matches!(path, DecoderPath::Fused { .. });
        // Dropout's masks, drawn per sentence and site from the sentence's key.
        let drop = crate::model::dropout::Dropper::new(opts.dropout.as_ref(), &batch.keys);
        let (p_emb, p_ann, p_readout, p_rec) = opts.dropout.map_or((0.0, 0.0, 0.0, 0.0), |d| {
            (d.embeddings, d.annotations, d.readout, d.recurrent)
        });
        // The encoder's annotations and the keys through shared handles when the fused encoder runs (with
        // layer normalisation under the fused row ops alone, they are graph tensors, normalised outside the
        // op).
        let normed = self.cfg.layer_norm;
        let mut src = if fused && self.kernels.fused_on(batch.src.device()) {
            if normed {
                // (The layer-normalised model's pass prepares the readout's and word projections' weights too.)
                self.begin_decoding_pass(None)?;
            } else {
                crate::kernels::begin_pass(self.kernels, &self.recurrent_weights())?;
            }
            let e = self.encoder.embed(self.kernels, &batch.src)?;
            let e = drop.apply(&e, Site::SourceEmbeddings, p_emb)?;
            self.encode_shared(&e, &batch.src_mask, &drop, (p_rec, p_ann))?
        } else {
            self.begin_decoding_pass(None)?;
            let e = self.encoder.embed(self.kernels, &batch.src)?;
            let e = drop.apply(&e, Site::SourceEmbeddings, p_emb)?;
            self.encode_embedded(&e, &batch.src_mask, &drop, (p_rec, p_ann))?
        };
        if (fused || self.kernels.fused_on(src.keys.ah.device())) && src.keys.shared.is_none() {
            // Every step reads the same keys and annotations: accumulate their gradients in place.
            src.keys.shared = Some((
                crate::kernels::Shared::new(&src.keys.ah)?,
                crate::kernels::Shared::new(&src.keys.annotations)?,
            ));
        }
        // The decoder's previous words: the targets, or their word-dropped copy.
        let inputs = batch.tgt_in.as_ref().unwrap_or(&batch.tgt);
        let e_all = drop.apply(
            &crate::kernels::embedding(self.kernels, &self.tgt_emb, &inputs.flatten_all()?)?,
            Site::TargetEmbeddings,
            p_emb,
        )?; // [B*T, E]
        let dec_drop = drop.mask_shaped((b, self.cell.hidden), &e_all, Site::Decoder, p_rec)?;
        // The previous word's embedding e(y_{i−1}) of every position (zero at i = 0), batch-major, formed
        // once: the step-by-step readout and the cGRU's gate read it (the fused readout shifts in place).
        let e_prev = if !fused || self.is_conditional() {
            Some(previous_words(&e_all, b, t_len)?)
        } else {
            None
        };
        // With the fused decoder op, the sentences' target lengths: the op, the readout and the output layer
        // then compute the words' positions only (when the mask is words then padding).
        let lengths = if fused && opts.target_padding == TargetPadding::Skipped {
            mask_lengths(&batch.tgt_mask)?
        } else {
            None
        };
        // Guided alignment: its targets and cell (the fused op computes the cost in its passes), and the cost
        // as a graph node.
        let guidance = match (opts.guided, &batch.alignment) {
            (Some((cost, weight)), Some(a)) if fused => {
                Some(crate::kernels::guided_alignment::Guidance {
                    targets: a.clone(),
                    cost,
                    scale: weight / b as f64,
                    cell: Default::default(),
                })
            }
            _ => None,
        };
        let mut guided: Option<Tensor> = None;
        let hid = match path {
            DecoderPath::Fused { gate } => {
                let rows = self.decoder_sequence(
                    &src,
                    &e_all,
                    e_prev.as_ref(),
                    Targets {
                        positions: t_len,
                        lengths: lengths.as_deref(),
                        guidance: guidance.as_ref(),
                    },
                    gate,
                    dec_drop.as_ref(),
                )?;
                if let Some(g) = &guidance {
                    guided = Some(crate::kernels::guided_alignment::loss_node(
                        &rows.token,
                        g.cell.clone(),
                    )?);
                }
                crate::kernels::readout::hidden_rows_fused(
                    self.readout.rows_weights(),
                    rows,
                    &e_all,
                    t_len,
                    lengths.as_deref(),
                )?
            }
            DecoderPath::Composed => {
                let (states, ctxs, alphas) =
                    self.decoder_steps(&src, &e_all, b, dec_drop.as_ref())?;
                if let (Some((cost, weight)), Some(a)) = (opts.guided, &batch.alignment) {
                    // The composed reference of the fused op's guided-alignment cost.
                    let alphas = Tensor::stack(&alphas, 1)?;
                    let c = crate::kernels::guided_alignment::cost_reference(&alphas, a, cost)?;
                    guided = Some(c.affine(weight / b as f64, 0.0)?);
                }
                let e_prev = e_prev.as_ref().expect("formed for the step-by-step path");
                self.readout
                    .hidden(self.kernels, &(&ctxs).into(), &states, e_prev)?
            }
        };
        // (Fused with the lengths, the readout keeps each sentence's words' rows only.)
        let hid = match &lengths {
            Some(l) if hid.dim(0)? != b * t_len => {
                let d = hid.dim(1)?;
                let counts: Vec<usize> = l.iter().map(|&n| n * d).collect();
                match drop.mask_ragged(&counts, hid.shape(), &hid, Site::Readout, p_readout)? {
                    Some(m) => hid.mul(&m)?,
                    None => hid,
                }
            }
            _ => drop.apply(&hid, Site::Readout, p_readout)?,
        };
        let nll = self.output_nll(&hid, batch, lengths.as_deref(), opts.label_smoothing)?;
        match guided {
            Some(g) => nll + g.reshape(())?,
            None => Ok(nll),
        }
    }

    /// The whole decoder recurrence as one fused op (see `decoder_sequence`) over the target words'
    /// embeddings `e_all` `[B·T, E]`: its rows `[t_{i−1} | s_i]` for the readout; `drop`: recurrent dropout's
    /// masks `[B, H]` on the transition's recurrent products.
    fn decoder_sequence(
        &self,
        src: &Source,
        e_all: &Tensor,
        e_prev: Option<&Tensor>,
        targets: Targets,
        gate: Option<GateKinds>,
        drop: Option<&Tensor>,
    ) -> Result<crate::kernels::Shared> {
        let lengths = targets.lengths;
        let (ah, ann) = src
            .keys
            .shared
            .as_ref()
            .expect("shared keys with fused kernels");
        let t_len = e_all.dim(0)? / src.t0.dim(0)?;
        let b = src.t0.dim(0)?;
        let w = crate::model::decoder_sequence::DecoderWeights {
            attention: self.attention.sequence_weights(),
            transition: self.cell.sequence_weights(),
            gate: self.gate.sequence_weights(),
            ln: self.sequence_ln(),
        };
        // The word projections as shared inputs, batch-major rows `(b, i)`: the words' positions only
        // when the lengths come in decreasing order (as `Batch` puts them; see
        // `decoder_sequence::Targets`), else every position.
        let tgt_rows = lengths
            .filter(|l| l.windows(2).all(|w| w[0] >= w[1]) && l.iter().sum::<usize>() < b * t_len)
            .map(|l| word_rows(l, t_len));
        let wp = self.cell.project_words_shared(e_all, tgt_rows.clone())?;
        // (The cGRU's gate reads the previous word e(y_{i−1}).)
        let wz = match (self.is_conditional(), e_prev) {
            (true, Some(e_prev)) => self.gate.word_term_shared(e_prev, tgt_rows)?,
            _ => self.gate.word_term_shared(e_all, tgt_rows)?,
        };
        let cov = match &self.coverage {
            Some(c) => Some(c.sequence_inputs(ann)?),
            None => None,
        };
        crate::model::decoder_sequence::decoder_sequence_fused(
            wp,
            wz.map(Into::into),
            &src.t0,
            ah,
            ann,
            &src.keys.mask_bias,
            targets,
            &w,
            gate,
            cov,
            drop,
        )
    }

    /// The layer normalisations the fused decoder op runs inside (see
    /// [`crate::model::decoder_sequence::LnWeights`]); `None` without layer normalisation.
    fn sequence_ln(&self) -> Option<crate::model::decoder_sequence::LnWeights<'_>> {
        let (_, q) = self.attention.ln.as_ref()?;
        use crate::model::layer_norm::LayerNorm;
        fn rec<'a>(u_ru: &'a LayerNorm, u: &'a LayerNorm) -> [&'a Tensor; 4] {
            [&u_ru.g, &u_ru.b, &u.g, &u.b]
        }
        // (The vanilla unit has one recurrent product, `U t`.)
        let deep = self
            .cell
            .deep
            .iter()
            .map(|d| d.ln.as_ref().map(|n| rec(&n.u_ru, &n.u)))
            .collect::<Option<Vec<_>>>()?;
        // The cGRU's context GRU normalises `s C` and its products, its word GRU its own products.
        let (context, rec_w, word) = match &self.cell.cgru {
            Some((word, ctx)) => {
                let (c, r) = ctx.ln.as_ref()?;
                let w = &word.ln.as_ref()?.rec;
                (
                    [&c.g, &c.b],
                    rec(&r.u_ru, &r.u).to_vec(),
                    Some(rec(&w.u_ru, &w.u)),
                )
            }
            None => {
                let c = self.cell.ln.as_ref()?;
                let r = match &c.u_ru {
                    Some(u_ru) => rec(u_ru, &c.u).to_vec(),
                    None => vec![&c.u.g, &c.u.b],
                };
                ([&c.c.g, &c.c.b], r, None)
            }
        };
        Some(crate::model::decoder_sequence::LnWeights {
            query: [&q.g, &q.b],
            context,
            rec: rec_w,
            deep,
            word,
        })
    }

    /// The decoder's recurrence step by step through the one decoder step ([`Model::step`], [`Model::feed`];
    /// composed ops: the reference of the fused op, and its form on other devices): the states `t_{i−1}` and contexts `s_i` of every position, batch-major `[B·T, ·]`;
    /// `drop`: recurrent dropout's masks `[B, H]` on the transition's recurrent products.
    fn decoder_steps(
        &self,
        src: &Source,
        e_all: &Tensor,
        b: usize,
        drop: Option<&Tensor>,
    ) -> Result<(Tensor, Tensor, Vec<Tensor>)> {
        let t_len = e_all.dim(0)? / b;
        // Batch-major rows `(b, i)`; the steps take time-major copies.
        let wp = self.cell.project_words(self.kernels, e_all)?;
        let wz = self.gate.word_term(self.kernels, e_all)?;
        // Per-step slices of the batched projections (shared handles with fused kernels; see `Shared`).
        let fused = self.kernels.fused_on(wp.device());
        let steps = |x: &Tensor| -> Result<Vec<Tensor>> {
            if fused {
                let sh = crate::kernels::Shared::new(x)?;
                (0..t_len).map(|i| sh.index(i)).collect()
            } else {
                (0..t_len).map(|i| x.i(i)).collect()
            }
        };
        let time_major = |x: &Tensor| {
            x.reshape((b, t_len, x.dim(1)?))?
                .transpose(0, 1)?
                .contiguous()
        };
        let wp_steps = steps(&time_major(&wp)?)?;
        let wz_steps = match &wz {
            Some(w) => Some(steps(&time_major(w)?)?),
            None => None,
        };
        // The conditional GRU reads the word's gate term in its next context step, formed per step (as
        // decoding forms it) from the word's embedding.
        let e_steps = if self.is_conditional() {
            steps(&time_major(e_all)?)?
        } else {
            vec![]
        };
        let view = decoder_step::SourceView::sentences(src, None, &[]);
        let mut state = self.start(src, false)?;
        let mut states = Vec::with_capacity(t_len);
        let mut ctxs = Vec::with_capacity(t_len);
        let mut alphas = Vec::with_capacity(t_len);
        for i in 0..t_len {
            let step = self.step(view, &state, (1.0, 1.0), drop)?;
            states.push(step.t.clone());
            ctxs.push(step.ctx.clone());
            alphas.push(step.alpha.clone());
            if i + 1 < t_len {
                // The word `y_i`'s terms: the transition's projection, and the gate's word term (read by this
                // transition, or by the conditional GRU's next context step).
                let gate = if self.is_conditional() {
                    self.gate.word_term(self.kernels, &e_steps[i])?
                } else {
                    wz_steps.as_ref().map(|w| w[i].clone())
                };
                let word = WordTerms {
                    proj: wp_steps[i].clone(),
                    gate,
                    readout: None,
                };
                state = self.feed(&step, None, word, (1.0, 1.0), drop)?.0;
            }
        }
        Ok((
            Tensor::stack(&states, 1)?.reshape((b * t_len, ()))?,
            Tensor::stack(&ctxs, 1)?.reshape((b * t_len, ()))?,
            alphas,
        ))
    }

    /// The output layer's summed negative log-likelihood of the targets over the readout's rows `hid`
    /// (the words' rows only when `lengths` is given, else every position under the mask), with label
    /// smoothing `eps`, divided by the batch size.
    fn output_nll(
        &self,
        hid: &Tensor,
        batch: &Batch,
        lengths: Option<&[usize]>,
        eps: f64,
    ) -> Result<Tensor> {
        let (b, t_len) = batch.tgt.dims2()?;
        // Tied output embeddings: `W_2 = E_yᵀ` formed from the embeddings' current values at every pass (the
        // readout's copy is for decoding, by a model built after the last update).
        let tied;
        let w_2 = if self.cfg.tied_output_embeddings {
            tied = self.tgt_emb.t()?.contiguous()?;
            &tied
        } else {
            &self.readout.w_2
        };
        let b_out = &self.readout.b;
        if let Some(lens) = lengths {
            // The words' rows only: their targets, and no mask.
            let ids: Vec<u32> = batch.tgt.flatten_all()?.to_vec1()?;
            let targets: Vec<u32> = lens
                .iter()
                .enumerate()
                .flat_map(|(r, &n)| ids[r * t_len..r * t_len + n].iter().copied())
                .collect();
            let targets = Tensor::from_vec(targets, hid.dim(0)?, hid.device())?;
            return output_nll_smoothed_fused(hid, w_2, b_out, &targets, eps)?
                .sum_all()?
                .affine(1.0 / b as f64, 0.0);
        }
        let targets = batch.tgt.flatten_all()?;
        let nll = if self.kernels.ops_fused_on(hid.device()) {
            output_nll_smoothed_fused(hid, w_2, b_out, &targets, eps)?
        } else {
            output_nll_smoothed_reference(hid, w_2, b_out, &targets, eps)?
        };
        (nll * batch.tgt_mask.flatten_all()?)?
            .sum_all()?
            .affine(1.0 / b as f64, 0.0)
    }
}

/// Training options of [`Model::loss_with`] (from `[train]`; the defaults give [`Model::loss`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LossOptions {
    pub target_padding: TargetPadding,
    pub label_smoothing: f64,
    /// Dropout's rates and this pass's mask seed (`None`: nothing dropped).
    pub dropout: Option<crate::model::dropout::Dropout>,
    /// Guided alignment's cost and weight (`train.guided_alignment_cost`, `train.guided_alignment_weight`),
    /// applied to a batch with alignment targets ([`Batch::alignment`]); `None`: no guidance.
    pub guided: Option<(crate::config::AlignmentCost, f64)>,
}

impl LossOptions {
    /// The options of training update `step` (its dropout masks are seeded by `train.seed` and `step`).
    pub fn of(t: &crate::config::TrainConfig, step: u64) -> Self {
        let d = crate::model::dropout::Dropout {
            embeddings: t.embedding_dropout,
            annotations: t.annotation_dropout,
            readout: t.readout_dropout,
            recurrent: t.recurrent_dropout,
            seed: crate::model::dropout::Dropout::step_seed(t.seed, step),
        };
        LossOptions {
            target_padding: t.target_padding,
            label_smoothing: t.label_smoothing,
            dropout: d.is_active().then_some(d),
            guided: t
                .guided_alignment
                .is_some()
                .then_some((t.guided_alignment_cost, t.guided_alignment_weight)),
        }
    }
}

/// The previous word's embedding `e(y_{i−1})` of every position of `e_all` `[B·T, E]` (batch-major rows
/// `(b, i)`), zero at `i = 0`.
fn previous_words(e_all: &Tensor, b: usize, t_len: usize) -> Result<Tensor> {
    let e_dim = e_all.dim(1)?;
    let e3 = e_all.reshape((b, t_len, e_dim))?;
    Tensor::cat(
        &[
            Tensor::zeros((b, 1, e_dim), e_all.dtype(), e_all.device())?,
            e3.narrow(1, 0, t_len - 1)?,
        ],
        1,
    )?
    .reshape((b * t_len, e_dim))
}
