//! The bidirectional encoder's two GRU recurrences as one fused op (model-spec §1): both directions' steps over
//! the rows with a word at each step, and back-propagation through time inside ([`bigru_fused`]). Its composed
//! reference is the step-by-step path of [`crate::model::encoder::Encoder::forward_embedded`] with reference
//! kernels; the encoder itself is [`crate::model::encoder`].

use candle_core::{CpuStorage, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

use crate::kernels::gru::{gru_step_forward, GruActs, GruStep, RecLn, RecLnActs, RecLnSaved};
use crate::kernels::{gemm_into, Mat, Real, Shared};

/// The bidirectional encoder's two masked GRU recurrences as one fused op: projected inputs `x`
/// `[B·S, 6H]` (rows `(b, t)` of a batch of `batch` sentences, both directions' `W x + b` side by side,
/// forward first), the padding mask (`S·B` values, time-major; a state is kept where it is 0) and
/// each direction's `U_ru` `[H, 2H]`, `U` `[H, H]`; returns the annotations `[B, S, 2H]` (`[→h_j ; ←h_j]`).
/// One graph node for the whole encoder: each direction runs its steps with one GEMM per recurrent product
/// into preallocated buffers over the rows with a word at that step (see [`RowOrder`]), the two directions
/// concurrently (one core each), and the backward pass runs
/// back-propagation through time inside the op, forming `∂U_ru`, `∂U` as one GEMM each over all steps. Equal
/// to [`crate::model::gru::Gru::step_dropped`] step by step (tested against it). Inputs and gradients travel
/// through [`Shared`] handles (see `decoder_sequence`). `drop`: recurrent dropout's masks `[B, H]` (row-major, batch order) of
/// each direction.
pub fn bigru_fused<'a>(
    x: impl Into<crate::kernels::Input<'a>>,
    batch: usize,
    mask: Vec<f64>,
    fwd: (&Tensor, &Tensor),
    bwd: (&Tensor, &Tensor),
    drop: Option<[Vec<f64>; 2]>,
) -> Result<Tensor> {
    BiGru::new(x, batch, mask, fwd, bwd, drop, vec![])?.apply()
}

/// [`bigru_fused`] with layer normalisation of each direction's recurrent products (model-spec §5b): `ln`
/// holds the forward direction's, then the backward one's, gains and biases `[g_U_ru, b_U_ru, g_U, b_U]`
/// (`[2H]`, `[2H]`, `[H]`, `[H]`). Each step normalises `h U_ru` and `(r∘h) U` before the sums, as
/// [`crate::model::gru::gru_step`] does with a `RecNorm`.
pub fn bigru_fused_normed<'a>(
    x: impl Into<crate::kernels::Input<'a>>,
    batch: usize,
    mask: Vec<f64>,
    fwd: (&Tensor, &Tensor),
    bwd: (&Tensor, &Tensor),
    drop: Option<[Vec<f64>; 2]>,
    ln: [[&Tensor; 4]; 2],
) -> Result<Tensor> {
    BiGru::new(x, batch, mask, fwd, bwd, drop, ln.to_vec())?.apply()
}

pub(crate) struct BiGru {
    b: usize,
    s: usize,
    /// `[B·S, 6H]` (rows `(b, t)`), the forward direction's columns first; or, with `word_rows`, those rows
    /// only, in that order.
    x: Shared,
    word_rows: Option<crate::kernels::Rows>,
    /// With `word_rows`: each sentence's first row in `x`.
    offsets: Vec<usize>,
    /// Each direction's `U_ru`, `U`: the forward direction's, then the backward one's when there are two.
    u_ru: Vec<Shared>,
    u: Vec<Shared>,
    /// The order the recurrences run the sentences in (see [`RowOrder`]).
    order: RowOrder,
    /// Recurrent dropout's masks `[B, H]` of each direction, batch order.
    drop: Option<[Vec<f64>; 2]>,
    /// With layer normalisation, each direction's `[g_U_ru, b_U_ru, g_U, b_U]` (empty: none).
    ln: Vec<[Shared; 4]>,
    /// Whether a backward pass can follow (any input tracks gradients): keep the activations.
    save: bool,
    saved: crate::kernels::SavedSlot,
}

impl BiGru {
    fn new<'a>(
        x: impl Into<crate::kernels::Input<'a>>,
        batch: usize,
        mask: Vec<f64>,
        fwd: (&Tensor, &Tensor),
        bwd: (&Tensor, &Tensor),
        drop: Option<[Vec<f64>; 2]>,
        ln: Vec<[&Tensor; 4]>,
    ) -> Result<BiGru> {
        let x: crate::kernels::Input = x.into();
        let rows = x.tensor().dim(0)?;
        let b = batch;
        let s = if b > 0 { rows / b } else { 0 };
        if rows != b * s || mask.len() != s * b {
            candle_core::bail!(
                "fused bidirectional GRU: {rows} input rows and a mask of {} for batch {b}: the rows must be B·S \
                 and the mask S·B (S {s})",
                mask.len()
            );
        }
        let order = RowOrder::new(&mask, s, b);
        BiGru::build(x, (b, s), order, None, fwd, Some(bwd), drop, ln)
    }

    /// The op over inputs `x` of every row `(b, t)`, or of `word_rows` only (the words' rows of a
    /// words-then-padding mask, see [`RowOrder::word_rows`]). Without `bwd`, one forward recurrence (a
    /// unidirectional layer): `x` is `[·, 3H]`, the output `[B, S, H]`, and only the first dropout mask is read.
    /// `ln`: each direction's layer normalisation (see [`bigru_fused_normed`]; empty: none).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn build(
        x: crate::kernels::Input,
        (b, s): (usize, usize),
        order: RowOrder,
        word_rows: Option<crate::kernels::Rows>,
        fwd: (&Tensor, &Tensor),
        bwd: Option<(&Tensor, &Tensor)>,
        drop: Option<[Vec<f64>; 2]>,
        ln: Vec<[&Tensor; 4]>,
    ) -> Result<BiGru> {
        let dirs = if bwd.is_some() { 2 } else { 1 };
        let (rows, h6) = x.tensor().dims2()?;
        let h = h6 / (3 * dirs);
        let weights: Vec<(&Tensor, &Tensor)> = std::iter::once(fwd).chain(bwd).collect();
        let mut offsets = vec![];
        if word_rows.is_some() {
            let mut at = 0;
            for &l in &order.lens {
                offsets.push(at);
                at += l;
            }
        }
        let ok = h6 == 3 * dirs * h
            && rows == word_rows.as_ref().map_or(b * s, |r| r.len())
            && (word_rows.is_none() || (order.mask.is_none() && order.lens.len() == b))
            && weights
                .iter()
                .all(|w| w.0.dims2().ok() == Some((h, 2 * h)) && w.1.dims2().ok() == Some((h, h)))
            && drop
                .as_ref()
                .is_none_or(|d| d[..dirs].iter().all(|d| d.len() == b * h))
            && (ln.is_empty()
                || (ln.len() == dirs
                    && ln.iter().all(|p| {
                        p.iter()
                            .zip([2 * h, 2 * h, h, h])
                            .all(|(t, n)| t.dims() == [n])
                    })));
        if !ok {
            candle_core::bail!(
                "fused GRU layer ({dirs} direction(s)): for B {b} × S {s} × H {h}, the inputs are [{rows}, {h6}] \
                 (rows: B·S or the words' rows, width 3H per direction), the weights {:?} (each [H, 2H] and \
                 [H, H]), the dropout masks {:?} values (B·H each), layer normalisation's {:?} (each [2H], [2H], \
                 [H], [H])",
                weights
                    .iter()
                    .map(|w| (w.0.dims().to_vec(), w.1.dims().to_vec()))
                    .collect::<Vec<_>>(),
                drop.as_ref().map(|d| [d[0].len(), d[1].len()]),
                ln.iter()
                    .map(|p| p.iter().map(|t| t.dims().to_vec()).collect::<Vec<_>>())
                    .collect::<Vec<_>>()
            );
        }
        let mut op = BiGru {
            b,
            s,
            x: x.into_shared()?,
            word_rows,
            offsets,
            u_ru: weights
                .iter()
                .map(|w| Shared::new(w.0))
                .collect::<Result<_>>()?,
            u: weights
                .iter()
                .map(|w| Shared::new(w.1))
                .collect::<Result<_>>()?,
            order,
            drop,
            ln: ln
                .iter()
                .map(|p| {
                    Ok([
                        Shared::new(p[0])?,
                        Shared::new(p[1])?,
                        Shared::new(p[2])?,
                        Shared::new(p[3])?,
                    ])
                })
                .collect::<Result<_>>()?,
            save: false,
            saved: Default::default(),
        };
        op.save = op.tokens().iter().any(|t| t.track_op());
        Ok(op)
    }

    /// The graph handles of the inputs, in a fixed order.
    fn tokens(&self) -> Vec<&Tensor> {
        std::iter::once(&self.x)
            .chain(&self.u_ru)
            .chain(&self.u)
            .chain(self.ln.iter().flatten())
            .map(|x| &x.token)
            .collect()
    }

    /// The annotations as a graph node whose backward pass receives their gradient from candle.
    pub(crate) fn apply(self) -> Result<Tensor> {
        Tensor::cat(&self.tokens(), 0)?.apply_op1(self)
    }

    /// The annotations as a [`Shared`] handle (see [`crate::kernels::shared_output`]).
    pub(crate) fn apply_shared(self) -> Result<Shared> {
        let bundle = Tensor::cat(&self.tokens(), 0)?;
        crate::kernels::shared_output(self, &bundle)
    }

    /// `(S, B, H)`, `H` each direction's width.
    fn dims(&self) -> Result<(usize, usize, usize)> {
        Ok((self.s, self.b, self.x.tensor.dim(1)? / (3 * self.dirs())))
    }

    /// The recurrences: 2 (forward and backward) or 1 (forward).
    fn dirs(&self) -> usize {
        self.u.len()
    }

    /// Direction `d`'s recurrent dropout masks in the order the recurrences run the rows (`[B, H]`).
    fn drop_rows<T: Real>(&self, d: usize, h: usize) -> Option<Vec<T>> {
        let m = &self.drop.as_ref()?[d];
        Some(
            self.order
                .perm
                .iter()
                .flat_map(|&i| m[i * h..(i + 1) * h].iter().map(|&x| T::from_f64c(x)))
                .collect(),
        )
    }

    /// Direction `d`'s layer normalisation's gains and biases as values (`None`: none).
    fn ln_values<T: Real>(&self, d: usize) -> Result<Option<[Vec<T>; 4]>> {
        let Some(p) = self.ln.get(d) else {
            return Ok(None);
        };
        Ok(Some([
            crate::kernels::to_vec::<T>(&p[0].tensor)?,
            crate::kernels::to_vec::<T>(&p[1].tensor)?,
            crate::kernels::to_vec::<T>(&p[2].tensor)?,
            crate::kernels::to_vec::<T>(&p[3].tensor)?,
        ]))
    }

    /// The row of `x` that holds sentence `i`'s position `t` (`None`: padding, not formed).
    fn x_row(&self, i: usize, t: usize) -> Option<usize> {
        if self.word_rows.is_none() {
            return Some(i * self.s + t);
        }
        (t < self.order.lens[i]).then(|| self.offsets[i] + t)
    }

    fn forward<T: Real>(&self) -> Result<(CpuStorage, Shape)> {
        let (s, b, h) = self.dims()?;
        let dirs = self.dirs();
        let save = self.save;
        let (g_x, l_x) = self.x.tensor.storage_and_layout();
        let xs = crate::kernels::storage_slice::<T>(&g_x, l_x)?;
        let run = |d: usize| -> Result<(Vec<T>, Option<GruSaved<T>>)> {
            // This direction's columns, time-major: every step reads one contiguous `[B, 3H]` block.
            let h3 = 3 * h;
            // (Rows in the recurrences' order.)
            let mut x = crate::kernels::zeroed(s * b * h3);
            for (row, o) in x.chunks_mut(h3).enumerate() {
                let (t, p) = (row / b, row % b);
                if let Some(xr) = self.x_row(self.order.perm[p], t) {
                    let at = xr * dirs * h3 + d * h3;
                    o.copy_from_slice(&xs[at..at + h3]);
                }
            }
            let u_ru = crate::kernels::to_vec::<T>(&self.u_ru[d].tensor)?;
            let u = crate::kernels::to_vec::<T>(&self.u[d].tensor)?;
            let dm = self.drop_rows::<T>(d, h);
            let ln = self.ln_values::<T>(d)?;
            let ln = ln.as_ref().map(|p| RecLn {
                g_ru: &p[0],
                b_ru: &p[1],
                g_c: &p[2],
                b_c: &p[3],
            });
            Ok(crate::kernels::serial(|| {
                gru_dir_forward(
                    &x,
                    (&u_ru, &u),
                    &self.order,
                    (s, b, h),
                    d == 1,
                    save,
                    dm.as_deref(),
                    ln.as_ref(),
                )
            }))
        };
        let runs = crate::kernels::profile::timed("  encoder fwd: both directions", || {
            if dirs == 2 {
                let (f, r) = rayon::join(|| run(0), || run(1));
                Ok::<_, candle_core::Error>(vec![f?, r?])
            } else {
                Ok(vec![run(0)?])
            }
        })?;
        // Annotations, batch-major: [→h_j ; ←h_j] (one direction: →h_j).
        let w = dirs * h;
        let mut out = crate::kernels::zeroed(b * s * w);
        let pos = &self.order.pos;
        out.par_chunks_mut(w).enumerate().for_each(|(row, o)| {
            let (i, t) = (row / s, row % s);
            let p = pos[i];
            for (d, (states, _)) in runs.iter().enumerate() {
                o[d * h..(d + 1) * h]
                    .copy_from_slice(&states[(t * b + p) * h..(t * b + p + 1) * h]);
            }
        });
        let saved: Option<Vec<GruSaved<T>>> = runs.into_iter().map(|(_, sv)| sv).collect();
        if let Some(saved) = saved {
            *self.saved.lock().expect("saved activations") = Some(Box::new(saved));
        }
        Ok((T::to_cpu_storage_owned(out), Shape::from((b, s, w))))
    }

    fn backward<T: Real>(&self, grad: &Tensor) -> Result<()> {
        let (s, b, h) = self.dims()?;
        let dirs = self.dirs();
        let saved = crate::kernels::take_saved::<Vec<GruSaved<T>>>(&self.saved, "fused encoder")?;
        let grad = grad.contiguous()?;
        let (g_st, g_l) = grad.storage_and_layout();
        let g = crate::kernels::storage_slice::<T>(&g_st, g_l)?; // [B, S, 2H]
                                                                 // Each direction's ∂states, time-major.
        let split = |d: usize| -> Vec<T> {
            let mut out = crate::kernels::zeroed(s * b * h);
            for (row, o) in out.chunks_mut(h).enumerate() {
                let (t, p) = (row / b, row % b);
                let at = (self.order.perm[p] * s + t) * dirs * h + d * h;
                o.copy_from_slice(&g[at..at + h]);
            }
            out
        };
        let run = |d: usize, saved: GruSaved<T>| -> Result<Vec<T>> {
            let gd = split(d);
            let u_ru = crate::kernels::to_vec::<T>(&self.u_ru[d].tensor)?;
            let u = crate::kernels::to_vec::<T>(&self.u[d].tensor)?;
            let dm = self.drop_rows::<T>(d, h);
            let ln = self.ln_values::<T>(d)?;
            let (dx, dur, du, dln) = crate::kernels::serial(|| {
                gru_dir_backward(
                    saved,
                    &gd,
                    (&u_ru, &u),
                    &self.order,
                    (s, b, h),
                    d == 1,
                    dm.as_deref(),
                    ln.as_ref().map(|p| (&p[0][..], &p[2][..])),
                )
            });
            self.u_ru[d].add_grad(dur);
            self.u[d].add_grad(du);
            if let Some(dln) = dln {
                for (p, g) in self.ln[d].iter().zip(dln) {
                    p.add_grad(g);
                }
            }
            Ok(dx)
        };
        let mut saved = saved.into_iter();
        let dxs = crate::kernels::profile::timed("  encoder bwd: both directions", || {
            let fs = saved.next().expect("the forward direction's activations");
            if let Some(rs) = saved.next() {
                let (a, c) = rayon::join(|| run(0, fs), || run(1, rs));
                Ok::<_, candle_core::Error>(vec![a?, c?])
            } else {
                Ok(vec![run(0, fs)?])
            }
        })?;
        // ∂x batch-major `[B, S, 3H·dirs]` (or the words' rows) from each direction's time-major `[S, B, 3H]`.
        let h3 = 3 * h;
        let mut dx = crate::kernels::zeroed(self.x.tensor.dim(0)? * dirs * h3);
        let pos = &self.order.pos;
        dx.par_chunks_mut(dirs * h3)
            .enumerate()
            .for_each(|(row, o)| {
                let bt = self.word_rows.as_ref().map_or(row, |r| r[row]);
                let (i, t) = (bt / s, bt % s);
                for (d, dxd) in dxs.iter().enumerate() {
                    let at = (t * b + pos[i]) * h3;
                    o[d * h3..(d + 1) * h3].copy_from_slice(&dxd[at..at + h3]);
                }
            });
        self.x.add_grad(dx);
        Ok(())
    }
}

impl candle_core::CustomOp1 for BiGru {
    fn name(&self) -> &'static str {
        "fused-bidirectional-gru"
    }
    fn cpu_fwd(&self, _st: &CpuStorage, _l: &Layout) -> Result<(CpuStorage, Shape)> {
        use crate::kernels::FusedOutput;
        crate::kernels::profile::timed(self.profile_names().0, || self.forward_output())
    }
    fn bwd(&self, bundle: &Tensor, _res: &Tensor, grad: &Tensor) -> Result<Option<Tensor>> {
        use crate::kernels::FusedOutput;
        crate::kernels::profile::timed(self.profile_names().1, || {
            self.backward_output(grad)?;
            Ok(Some(bundle.zeros_like()?))
        })
    }
}

impl crate::kernels::FusedOutput for BiGru {
    fn profile_names(&self) -> (&'static str, &'static str) {
        ("encoder bigru forward", "encoder bigru backward")
    }
    fn forward_output(&self) -> Result<(CpuStorage, Shape)> {
        match self.x.tensor.dtype() {
            DType::F32 => self.forward::<f32>(),
            DType::F64 => self.forward::<f64>(),
            _ => candle_core::bail!("fused kernels support f32 and f64"),
        }
    }
    fn backward_output(&self, grad: &Tensor) -> Result<()> {
        match grad.dtype() {
            DType::F32 => self.backward::<f32>(grad),
            DType::F64 => self.backward::<f64>(grad),
            _ => candle_core::bail!("fused kernels support f32 and f64"),
        }
    }
}

/// The order in which the encoder's recurrences run a batch's sentences, and how many rows each step
/// computes. When every sentence's mask is a run of ones followed by padding (as `Batch` builds it), the
/// rows run longest first, so that the sentences with a word at step `t` are the first `active[t]` rows and
/// each step's products and row passes cover those only (padded positions keep the state, as the mask says,
/// without being computed); otherwise the batch's own order, every row at every step, under the mask.
pub(crate) struct RowOrder {
    /// `perm[p]`: the sentence run as row `p`; `pos[i]`: the row sentence `i` runs as.
    perm: Vec<usize>,
    pos: Vec<usize>,
    /// Each sentence's length (words then padding; empty when not).
    lens: Vec<usize>,
    /// Rows computed at each step; with `mask` (time-major `S·B`, in `perm` order) when not sorted.
    active: Vec<usize>,
    mask: Option<Vec<f64>>,
}

impl RowOrder {
    pub(crate) fn new(mask: &[f64], s: usize, b: usize) -> RowOrder {
        let lens: Vec<usize> = (0..b)
            .map(|i| (0..s).take_while(|&t| mask[t * b + i] == 1.0).count())
            .collect();
        let prefix = (0..b).all(|i| (lens[i]..s).all(|t| mask[t * b + i] == 0.0));
        if !prefix {
            return RowOrder {
                perm: (0..b).collect(),
                pos: (0..b).collect(),
                lens: vec![],
                active: vec![b; s],
                mask: Some(mask.to_vec()),
            };
        }
        let mut perm: Vec<usize> = (0..b).collect();
        perm.sort_by_key(|&i| std::cmp::Reverse(lens[i]));
        let mut pos = vec![0; b];
        for (p, &i) in perm.iter().enumerate() {
            pos[i] = p;
        }
        let active = (0..s)
            .map(|t| lens.iter().filter(|&&l| l > t).count())
            .collect();
        RowOrder {
            perm,
            pos,
            lens,
            active,
            mask: None,
        }
    }

    /// The words' rows `(b, t)` (`b·s + t`, in order) when the recurrences compute those only (`None`: every
    /// row is read, under the mask).
    pub(crate) fn word_rows(&self, s: usize) -> Option<Vec<usize>> {
        self.mask.is_none().then(|| {
            self.lens
                .iter()
                .enumerate()
                .flat_map(|(i, &l)| i * s..i * s + l)
                .collect()
        })
    }

    /// The rows step `t` computes and their mask (`None`: all words).
    fn step(&self, t: usize) -> (usize, Option<&[f64]>) {
        let b = self.perm.len();
        (
            self.active[t],
            self.mask.as_ref().map(|m| &m[t * b..(t + 1) * b]),
        )
    }
}

/// Per-step activations of one direction's forward pass, time-major: the gates `[r | u]` (after the
/// sigmoid), `r∘h_prev`, the candidate `tanh(·)` and `h_prev`.
struct GruSaved<T> {
    ru: Vec<T>,
    rh: Vec<T>,
    ht: Vec<T>,
    hp: Vec<T>,
    /// With layer normalisation: the products' `x̂` and `1/σ`, `[S, B, 2H]`, `[S, B]`, `[S, B, H]`, `[S, B]`.
    ln: Option<[Vec<T>; 4]>,
}

/// One direction's forward pass over `xp` `[S, B, 3H]`: the states `[S, B, H]` and, when `save`, the
/// activations the backward pass needs; `drop`: recurrent dropout's masks `[B, H]` (rows in run order);
/// `ln`: layer normalisation of the recurrent products.
#[allow(clippy::too_many_arguments)]
fn gru_dir_forward<T: Real>(
    xp: &[T],
    (u_ru, u): (&[T], &[T]),
    order: &RowOrder,
    (s, b, h): (usize, usize, usize),
    reverse: bool,
    save: bool,
    drop: Option<&[T]>,
    ln: Option<&RecLn<T>>,
) -> (Vec<T>, Option<GruSaved<T>>) {
    let h3 = 3 * h;
    let u_ru = crate::kernels::Oriented::new(u_ru, h, 2 * h);
    let u = crate::kernels::Oriented::new(u, h, h);

    let per = if save { s * b } else { b };
    let mut ru = vec![T::zero(); per * 2 * h];
    let mut rh = vec![T::zero(); per * h];
    let mut ht = vec![T::zero(); per * h];
    let mut hp = crate::kernels::zeroed(if save { s * b * h } else { 0 });
    let mut lns: Option<[Vec<T>; 4]> = ln.map(|_| {
        [
            crate::kernels::zeroed(per * 2 * h),
            crate::kernels::zeroed(per),
            crate::kernels::zeroed(per * h),
            crate::kernels::zeroed(per),
        ]
    });
    let mut out = crate::kernels::zeroed(s * b * h);
    let mut state = vec![T::zero(); b * h];
    let mut hu = vec![T::zero(); b * 2 * h];
    let mut rc = vec![T::zero(); b * h];
    for n in 0..s {
        let t = if reverse { s - 1 - n } else { n };
        let slot = if save { t } else { 0 };
        let xpt = &xp[t * b * h3..(t + 1) * b * h3];
        let (ru_t, rh_t, ht_t) = (
            &mut ru[slot * b * 2 * h..(slot + 1) * b * 2 * h],
            &mut rh[slot * b * h..(slot + 1) * b * h],
            &mut ht[slot * b * h..(slot + 1) * b * h],
        );
        if save {
            hp[t * b * h..(t + 1) * b * h].copy_from_slice(&state);
        }
        // The rows with a word at t (the others keep their state); their activations only.
        let (m, mask) = order.step(t);
        let acts = GruActs {
            ru: &mut ru_t[..m * 2 * h],
            rh: &mut rh_t[..m * h],
            ht: &mut ht_t[..m * h],
        };
        let scratch = (&mut hu[..m * 2 * h], &mut rc[..m * h]);
        let ln_step = match (ln, lns.as_mut()) {
            (Some(p), Some([xr, rr, xc, rcs])) => Some((
                p,
                RecLnActs {
                    xh_ru: &mut xr[slot * b * 2 * h..slot * b * 2 * h + m * 2 * h],
                    rs_ru: &mut rr[slot * b..slot * b + m],
                    xh_c: &mut xc[slot * b * h..slot * b * h + m * h],
                    rs_c: &mut rcs[slot * b..slot * b + m],
                },
            )),
            _ => None,
        };
        if m > 0 {
            gru_step_forward(
                h,
                &xpt[..m * h3],
                &mut state[..m * h],
                mask,
                drop.map(|d| &d[..m * h]),
                acts,
                scratch,
                &u_ru,
                &u,
                ln_step,
            );
        }
        out[t * b * h..(t + 1) * b * h].copy_from_slice(&state);
    }
    (
        out,
        save.then_some(GruSaved {
            ru,
            rh,
            ht,
            hp,
            ln: lns,
        }),
    )
}

/// Layer normalisation's gradients `[∂g_U_ru, ∂b_U_ru, ∂g_U, ∂b_U]`.
type LnGrads<T> = [Vec<T>; 4];

/// One direction's backward pass from `g` = `∂states` `[S, B, H]`: `(∂xp, ∂U_ru, ∂U)` and, with layer
/// normalisation (`ln`: the gains of `h U_ru` and `(r∘h) U`), its parameters' gradients.
#[allow(clippy::too_many_arguments)]
fn gru_dir_backward<T: Real>(
    saved: GruSaved<T>,
    g: &[T],
    (u_ru, u): (&[T], &[T]),
    order: &RowOrder,
    (s, b, h): (usize, usize, usize),
    reverse: bool,
    drop: Option<&[T]>,
    ln: Option<(&[T], &[T])>,
) -> (Vec<T>, Vec<T>, Vec<T>, Option<LnGrads<T>>) {
    let h3 = 3 * h;
    let GruSaved {
        ru,
        rh,
        ht,
        hp,
        ln: lns,
    } = saved;
    let normed = match (ln, &lns) {
        (Some(gains), Some(v)) => Some((gains, v)),
        _ => None,
    };
    // With layer normalisation: the products' gradients before it, `[S, B, 2H]` and `[S, B, H]`.
    let (mut dp_ru, mut dp_c) = if normed.is_some() {
        (
            crate::kernels::zeroed(s * b * 2 * h),
            crate::kernels::zeroed(s * b * h),
        )
    } else {
        (vec![], vec![])
    };
    let u_ru_o = crate::kernels::Oriented::new(u_ru, h, 2 * h);
    let u_o = crate::kernels::Oriented::new(u, h, h);
    let mut dxp = crate::kernels::zeroed(s * b * h3);
    let mut dh = vec![T::zero(); b * h];
    let mut drh = vec![T::zero(); b * h];
    for n in 0..s {
        // Steps in the reverse of the order the forward pass ran them.
        let t = if reverse { n } else { s - 1 - n };
        let r1 = t * b * h..(t + 1) * b * h;
        let (ru_t, ht_t, hp_t, g_t) = (
            &ru[t * b * 2 * h..(t + 1) * b * 2 * h],
            &ht[r1.clone()],
            &hp[r1.clone()],
            &g[r1],
        );
        let dxp_t = &mut dxp[t * b * h3..(t + 1) * b * h3];
        // Rows without a word at t kept their state: their gradient passes on (their ∂xp stays zero).
        let (m, mask) = order.step(t);
        for (a, &x) in dh[m * h..].iter_mut().zip(&g_t[m * h..]) {
            *a += x;
        }
        let step = GruStep {
            h,
            ru: &ru_t[..m * 2 * h],
            ht: &ht_t[..m * h],
            hp: &hp_t[..m * h],
            mask,
            drop: drop.map(|d| &d[..m * h]),
            ln: normed.map(|((g_ru, g_c), [xr, rr, xc, rc])| RecLnSaved {
                g_ru,
                g_c,
                xh_ru: &xr[t * b * 2 * h..t * b * 2 * h + m * 2 * h],
                rs_ru: &rr[t * b..t * b + m],
                xh_c: &xc[t * b * h..t * b * h + m * h],
                rs_c: &rc[t * b..t * b + m],
            }),
        };
        if m == 0 {
            continue;
        }
        let dp = normed.is_some().then(|| {
            (
                &mut dp_ru[t * b * 2 * h..t * b * 2 * h + m * 2 * h],
                &mut dp_c[t * b * h..t * b * h + m * h],
            )
        });
        step.backward(
            &g_t[..m * h],
            &mut dh[..m * h],
            &mut dxp_t[..m * h3],
            &mut drh[..m * h],
            &u_o,
            &u_ru_o,
            dp,
        );
    }
    // ∂U_ru = Σ_t h_prevᵀ ∂[r|u]_pre, ∂U = Σ_t (r∘h_prev)ᵀ ∂c_pre: one GEMM each over all steps. (Under
    // recurrent dropout the products read d∘h_prev; `rh` holds r∘d∘h_prev already.)
    let sb = s * b;
    let hp = match drop {
        Some(d) => {
            let mut hm = crate::kernels::zeroed(sb * h);
            for (o, x) in hm.chunks_mut(b * h).zip(hp.chunks(b * h)) {
                crate::kernels::gru::dropped_state(x, d, o);
            }
            hm
        }
        None => hp,
    };
    // (With layer normalisation the products' gradients are those before it.)
    let (dru, dc) = if normed.is_some() {
        (Mat::rows(&dp_ru[..], 2 * h), Mat::rows(&dp_c[..], h))
    } else {
        (
            Mat {
                data: &dxp[..],
                rs: h3,
                cs: 1,
            },
            Mat {
                data: &dxp[2 * h..],
                rs: h3,
                cs: 1,
            },
        )
    };
    let mut du_ru = vec![T::zero(); h * 2 * h];
    gemm_into(h, 2 * h, sb, &mut du_ru, 2 * h, false, Mat::t(&hp, h), dru);
    let mut du = vec![T::zero(); h * h];
    gemm_into(h, h, sb, &mut du, h, false, Mat::t(&rh, h), dc);
    let dln =
        normed.map(|(_, [xr, _, xc, _])| crate::kernels::gru::rec_ln_param_grads(&dxp, xr, xc, h));
    (dxp, du_ru, du, dln)
}
