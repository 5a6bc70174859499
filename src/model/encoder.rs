//! Bidirectional GRU encoder (model-spec §1): shared source embedding `E[x] + b_e`, a forward and a backward GRU,
//! annotations `h_j = [→h_j ; ←h_j]`; with `model.encoder_layers = N`, N − 1 bidirectional layers above it, each
//! over the annotations of the one below, with residual connections (`model.residual`). Input projections of
//! all time steps are one matmul per direction.
//! Both recurrences as one fused op are in [`crate::kernels::encoder`]; the step-by-step path here is its
//! composed reference.

use candle_core::{DType, IndexOp, Result, Tensor, D};

use crate::kernels::encoder::{BiGru, RowOrder};
use crate::kernels::{Kernels, Shared};
use crate::model::gru::Gru;
use candle_nn::VarBuilder;

pub struct Encoder {
    pub emb: Tensor,
    pub emb_b: Tensor,
    pub fwd: Gru,
    pub bwd: Gru,
    pub hidden: usize,
    /// The layers above the first (`model.encoder_layers` − 1; `encoder.layer2.*`, `encoder.layer3.*`, …):
    /// bidirectional GRUs over the annotations of the layer below.
    pub upper: Vec<Layer>,
    /// Whether an upper layer adds its input to its output (`model.residual`).
    pub residual: bool,
}

/// One layer above the first, reading the `2H`-wide annotations of the layer below: a forward and a backward
/// GRU of width `H` (bidirectional), or one forward GRU of width `2H` (unidirectional, `bwd` = `None`).
pub struct Layer {
    pub fwd: Gru,
    pub bwd: Option<Gru>,
}

/// What the encoder hands to the decoder.
pub struct Encoded {
    /// `[B, S, 2H]`
    pub annotations: Tensor,
    /// Backward state at the first word `←h_1`, `[B, H]`.
    pub bwd_first: Tensor,
}

impl Encoder {
    /// Both directions' input projections as one product, both recurrences as one fused op (see
    /// [`crate::kernels::encoder::bigru_fused`]), for the embedded words `e` `[B·S, E]` (rows `(b, t)`).
    fn bigru_op(
        &self,
        e: &Tensor,
        b: usize,
        mask: &Tensor,
        drop: Option<&[Tensor; 2]>,
    ) -> Result<BiGru> {
        bigru_layer_op(
            Kernels::Fused,
            (&self.fwd, Some(&self.bwd)),
            e,
            b,
            mask,
            drop,
        )
    }

    /// Training with fused kernels on the CPU: the annotations `[B, S, 2H]` as a [`Shared`] output of the fused
    /// encoder, formed outside the graph, whose consumers (the decoder's attention, the keys `A h`, the initial
    /// state) add their gradients into the handle; the encoder's backward pass reads the sum from there, so
    /// the annotations' gradient never enters candle's gradient store. (With layers above the first, the top
    /// layer's annotations are a graph tensor handed over the same way: [`Shared::new`].)
    /// `e`: the embedded words `[B·S, E]` ([`Encoder::embed`], after dropout); `drop`: recurrent dropout's
    /// masks `[B, H]` of each layer's forward and backward direction, bottom first (empty: none; see
    /// [`crate::model::gru::Gru::step_dropped`]).
    pub fn forward_shared(
        &self,
        k: Kernels,
        e: &Tensor,
        mask: &Tensor,
        drop: &[[Tensor; 2]],
    ) -> Result<Shared> {
        let (b, _) = mask.dims2()?;
        if !k.fused_on(e.device()) {
            candle_core::bail!("shared annotations need the fused kernels on the CPU");
        }
        self.check_drop(drop)?;
        if self.upper.is_empty() {
            return self.bigru_op(e, b, mask, drop.first())?.apply_shared();
        }
        Shared::new(&self.forward_embedded(k, e, mask, drop)?.annotations)
    }

    /// `layers` layers (`model.encoder_layers`; the first, bidirectional, reads the embeddings, each above it
    /// the annotations of the one below, bidirectional or not as `uni` says, adding them to its output when
    /// `residual`).
    pub fn new(
        vb: VarBuilder,
        vocab: usize,
        emb_dim: usize,
        hidden: usize,
        (layers, uni, residual): (usize, bool, bool),
        layer_norm: bool,
    ) -> Result<Self> {
        let gru = |v: VarBuilder, input: usize, width: usize| {
            Gru::new_normed(v, input, width, layer_norm)
        };
        let upper = (2..=layers)
            .map(|l| {
                let v = vb.pp(format!("layer{l}"));
                Ok(if uni {
                    Layer {
                        fwd: gru(v.pp("fwd"), 2 * hidden, 2 * hidden)?,
                        bwd: None,
                    }
                } else {
                    Layer {
                        fwd: gru(v.pp("fwd"), 2 * hidden, hidden)?,
                        bwd: Some(gru(v.pp("bwd"), 2 * hidden, hidden)?),
                    }
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            emb: vb.get_with_hints((vocab, emb_dim), "E", crate::model::init::ZERO)?,
            emb_b: vb.get_with_hints(emb_dim, "b_e", crate::model::init::ZERO)?,
            fwd: gru(vb.pp("fwd"), emb_dim, hidden)?,
            bwd: gru(vb.pp("bwd"), emb_dim, hidden)?,
            hidden,
            upper,
            residual,
        })
    }

    /// The number of bidirectional layers.
    pub fn layers(&self) -> usize {
        1 + self.upper.len()
    }

    /// `src`: `[B, S]` u32 ids, `mask`: `[B, S]` (1 = word, 0 = padding), in the model dtype.
    pub fn forward(&self, k: Kernels, src: &Tensor, mask: &Tensor) -> Result<Encoded> {
        self.forward_embedded(k, &self.embed(k, src)?, mask, &[])
    }

    /// The source words' embeddings `E[x] + b_e`, `[B·S, E]` (rows `(b, t)`) of `src` `[B, S]`.
    pub fn embed(&self, k: Kernels, src: &Tensor) -> Result<Tensor> {
        crate::kernels::embedding(k, &self.emb, &src.flatten_all()?)?.broadcast_add(&self.emb_b)
    }

    /// [`Encoder::forward`] from the embedded words `e` `[B·S, E]` ([`Encoder::embed`], after dropout), with
    /// recurrent dropout's masks `drop` (see [`Encoder::forward_shared`]). With layers above the first, the
    /// attention reads the top layer's annotations `a_N`, `a_l = BiGRU_l(a_{l−1}) (+ a_{l−1} when residual)`,
    /// and `←h_1` is the backward half of `a_N` at the first word.
    pub fn forward_embedded(
        &self,
        k: Kernels,
        e: &Tensor,
        mask: &Tensor,
        drop: &[[Tensor; 2]],
    ) -> Result<Encoded> {
        self.check_drop(drop)?;
        let (b, s) = mask.dims2()?;
        let h = self.hidden;
        let mut annotations = self.layer(k, (&self.fwd, Some(&self.bwd)), e, mask, drop.first())?;
        for (l, layer) in self.upper.iter().enumerate() {
            let x = annotations.reshape((b * s, 2 * h))?;
            let out = self.layer(
                k,
                (&layer.fwd, layer.bwd.as_ref()),
                &x,
                mask,
                drop.get(l + 1),
            )?;
            annotations = if self.residual {
                (out + annotations)?
            } else {
                out
            };
        }
        let bwd_first = annotations.i((.., 0))?.narrow(1, h, h)?;
        Ok(Encoded {
            annotations,
            bwd_first,
        })
    }

    fn check_drop(&self, drop: &[[Tensor; 2]]) -> Result<()> {
        if !drop.is_empty() && drop.len() != self.layers() {
            candle_core::bail!(
                "encoder: recurrent dropout's masks for {} layers given to {} layers",
                drop.len(),
                self.layers()
            );
        }
        Ok(())
    }

    /// One layer's annotations `[B, S, 2H]` of its inputs `e` `[B·S, in]` (rows `(b, t)`), bidirectional or
    /// (without `bwd`) forward only: the fused op (with layer normalisation too, when the fused row ops are
    /// asked for), or step by step (reference kernels, or a device without the fused ones).
    fn layer(
        &self,
        k: Kernels,
        (fwd, bwd): (&Gru, Option<&Gru>),
        e: &Tensor,
        mask: &Tensor,
        drop: Option<&[Tensor; 2]>,
    ) -> Result<Tensor> {
        let (b, s) = mask.dims2()?;
        if k.fused_on(e.device()) || (k.ops_fused_on(e.device()) && fwd.ln.is_some()) {
            return bigru_layer_op(k, (fwd, bwd), e, b, mask, drop)?.apply();
        }
        let m = mask.transpose(0, 1)?.contiguous()?.unsqueeze(D::Minus1)?; // [S, B, 1]
                                                                           // One direction's states `[B, S, width]`, step by step over a time-major copy of its projections.
        let run = |g: &Gru, reverse: bool, d: Option<&Tensor>| -> Result<Tensor> {
            let x = g
                .project(k, e)?
                .reshape((b, s, 3 * g.hidden))?
                .transpose(0, 1)?
                .contiguous()?;
            let h0 = Tensor::zeros((b, g.hidden), e.dtype(), e.device())?;
            let mut states = vec![h0.clone(); s];
            let mut h = h0;
            let order: Vec<usize> = if reverse {
                (0..s).rev().collect()
            } else {
                (0..s).collect()
            };
            for t in order {
                h = g.step_dropped(k, &x.i(t)?, &h, Some(&m.i(t)?), d)?;
                states[t] = h.clone();
            }
            Tensor::stack(&states, 1)
        };
        let f = run(fwd, false, drop.map(|d| &d[0]))?;
        match bwd {
            Some(g) => Tensor::cat(&[f, run(g, true, drop.map(|d| &d[1]))?], 2),
            None => Ok(f),
        }
    }
}

/// One bidirectional layer as the fused op: both directions' input projections of the layer's inputs `e`
/// `[B·S, in]` (rows `(b, t)`) as one product, both recurrences as one op (see
/// [`crate::kernels::encoder::bigru_fused`]). With layer normalisation, the projections are normalised by the
/// fused row op (`k`) in each direction's blocks `[2H | H]`, and the recurrences normalise their products.
fn bigru_layer_op(
    k: Kernels,
    (fwd, bwd): (&Gru, Option<&Gru>),
    e: &Tensor,
    b: usize,
    mask: &Tensor,
    drop: Option<&[Tensor; 2]>,
) -> Result<BiGru> {
    let h = fwd.hidden;
    let zeros = Tensor::zeros(2 * h, fwd.b.dtype(), fwd.b.device())?;
    let (w, bias) = match bwd {
        Some(bwd) => (
            Tensor::cat(&[&fwd.w, &bwd.w], 1)?,
            Tensor::cat(&[&zeros, &fwd.b, &zeros, &bwd.b], 0)?,
        ),
        None => (fwd.w.clone(), Tensor::cat(&[&zeros, &fwd.b], 0)?),
    };
    let m: Vec<f64> = crate::kernels::to_vec(&mask.t()?.to_dtype(DType::F64)?)?;
    let s = mask.dim(1)?;
    let order = RowOrder::new(&m, s, b);
    // The words' rows `(b, t)` only when the recurrences read no other (padding is not computed), read
    // through a shared handle: no `[B·S, 6H]` gradient in candle's store.
    let rows = order.word_rows(s).map(std::sync::Arc::new);
    let grus: Vec<&Gru> = std::iter::once(fwd).chain(bwd).collect();
    let norms: Option<Vec<&crate::model::gru::GruNorm>> =
        grus.iter().map(|g| g.ln.as_ref()).collect();
    let Some(norms) = norms else {
        if fwd.ln.is_some() || bwd.is_some_and(|g| g.ln.is_some()) {
            candle_core::bail!(
                "encoder layer: one direction is layer-normalised and the other is not"
            );
        }
        let x = crate::kernels::linear_shared_rows(e, &w, &bias, rows.clone())?;
        return BiGru::build(
            x.into(),
            (b, s),
            order,
            rows,
            (&fwd.u_ru, &fwd.u),
            bwd.map(|g| (&g.u_ru, &g.u)),
            drop_values(drop)?,
            vec![],
        );
    };
    // The words' rows' projections, normalised in each direction's blocks [2H | H]: with the fused row ops
    // read through shared handles, as the plain layer's are (no `[·, 6H]` gradient in candle's store).
    let cat = |f: fn(&crate::model::layer_norm::LayerNorm) -> &Tensor| {
        Tensor::cat(&norms.iter().map(|n| f(&n.w)).collect::<Vec<_>>(), 0)
    };
    let blocks: Vec<usize> = norms.iter().flat_map(|n| n.w.blocks.clone()).collect();
    let (g, beta) = (cat(|n| &n.g)?, cat(|n| &n.b)?);
    if k.ops_fused_on(e.device()) {
        let x = crate::kernels::linear_shared_rows(e, &w, &bias, rows.clone())?;
        let x = crate::kernels::layer_norm::layer_norm_shared(&x, &g, &beta, &blocks)?;
        return build_normed(x.into(), (b, s), order, rows, (fwd, bwd), drop, &norms);
    }
    let e_rows = crate::model::batch::gather_rows(e, rows.as_deref().map(|r| &r[..]))?;
    let x = crate::kernels::layer_norm::layer_norm(
        k,
        &crate::kernels::linear(k, &e_rows, &w, &bias)?,
        &g,
        &beta,
        &blocks,
    )?;
    build_normed((&x).into(), (b, s), order, rows, (fwd, bwd), drop, &norms)
}

/// [`BiGru::build`] for a layer-normalised layer from its normalised projections `x`.
fn build_normed(
    x: crate::kernels::Input,
    (b, s): (usize, usize),
    order: RowOrder,
    rows: Option<crate::kernels::Rows>,
    (fwd, bwd): (&Gru, Option<&Gru>),
    drop: Option<&[Tensor; 2]>,
    norms: &[&crate::model::gru::GruNorm],
) -> Result<BiGru> {
    let ln = norms
        .iter()
        .map(|n| [&n.rec.u_ru.g, &n.rec.u_ru.b, &n.rec.u.g, &n.rec.u.b])
        .collect();
    BiGru::build(
        x,
        (b, s),
        order,
        rows,
        (&fwd.u_ru, &fwd.u),
        bwd.map(|g| (&g.u_ru, &g.u)),
        drop_values(drop)?,
        ln,
    )
}

/// Recurrent dropout's masks as values (batch order).
fn drop_values(drop: Option<&[Tensor; 2]>) -> Result<Option<[Vec<f64>; 2]>> {
    let Some([f, b]) = drop else {
        return Ok(None);
    };
    let v = |x: &Tensor| crate::kernels::to_vec::<f64>(&x.to_dtype(DType::F64)?);
    Ok(Some([v(f)?, v(b)?]))
}
