//! A padded batch of sentence pairs (`Batch`) and the padding helpers the model and decoding share.

use candle_core::{DType, Device, Result, Tensor};

/// A padded batch: ids `[B, S]` / `[B, T]` (u32; targets end with EOS) and 0/1 masks in the model dtype.
/// [`Batch::new`] puts the sentence pairs in order of decreasing target length, so that the fused decoder
/// computes, at each step, only the first rows (the sentences that still have a word there).
pub struct Batch {
    pub src: Tensor,
    pub src_mask: Tensor,
    pub tgt: Tensor,
    pub tgt_mask: Tensor,
    /// Number of target tokens (EOS included).
    pub tgt_tokens: usize,
    /// Each row's sentence key (its index in the training corpus; by default its position in the list the
    /// batch was made from): what the sentence's dropout masks are drawn from (see
    /// [`crate::model::dropout::Dropper`]).
    pub keys: Vec<u64>,
    /// The words the decoder reads as its previous words when they differ from `tgt` (target-side word
    /// dropout: some replaced by `<unk>`); `None`: `tgt` itself.
    pub tgt_in: Option<Tensor>,
    /// Guided alignment's targets `[B, T, S]` (model dtype): row `(b, i)` is target position `i`'s links over
    /// the source positions, normalised (a row of zeros: no link); `None`: no guidance.
    pub alignment: Option<Tensor>,
}

impl Batch {
    /// Pad id sequences (EOS = 0 is appended to every sentence and used as padding) into tensors, the pairs
    /// ordered by decreasing target length (a stable sort: equal lengths keep their order). The loss is a
    /// sum over sentences, so the order does not change it.
    pub fn new(
        src: &[Vec<u32>],
        tgt: &[Vec<u32>],
        eos: u32,
        dtype: DType,
        dev: &Device,
    ) -> Result<Batch> {
        let keys: Vec<u64> = (0..src.len() as u64).collect();
        Self::keyed(src, tgt, &keys, eos, dtype, dev)
    }

    /// [`Batch::new`] with each pair's key (its index in the training corpus), which its dropout masks
    /// follow wherever the pair is batched.
    pub fn keyed(
        src: &[Vec<u32>],
        tgt: &[Vec<u32>],
        keys: &[u64],
        eos: u32,
        dtype: DType,
        dev: &Device,
    ) -> Result<Batch> {
        Self::keyed_with_inputs(src, tgt, None, None, keys, eos, dtype, dev)
    }

    /// [`Batch::keyed`] whose decoder reads `inputs` as its previous words (each as long as its target:
    /// target-side word dropout) while the loss scores `tgt`, and whose attention is guided by `links` (each
    /// pair's `(source position, target position)` links, positions of its pieces, EOS being the position
    /// after the last: see [`Batch::alignment`]).
    #[allow(clippy::too_many_arguments)]
    pub fn keyed_with_inputs(
        src: &[Vec<u32>],
        tgt: &[Vec<u32>],
        inputs: Option<&[Vec<u32>]>,
        links: Option<&[Vec<(u32, u32)>]>,
        keys: &[u64],
        eos: u32,
        dtype: DType,
        dev: &Device,
    ) -> Result<Batch> {
        if src.len() != tgt.len() || keys.len() != src.len() {
            candle_core::bail!(
                "batch: {} source sentences, {} target sentences and {} keys",
                src.len(),
                tgt.len(),
                keys.len()
            );
        }
        if let Some(inp) = inputs {
            if inp.len() != tgt.len() || inp.iter().zip(tgt).any(|(a, b)| a.len() != b.len()) {
                candle_core::bail!(
                    "batch: the decoder's input words must be as long as the targets"
                );
            }
        }
        if let Some(l) = links {
            if l.len() != tgt.len() {
                candle_core::bail!("batch: {} link lists for {} pairs", l.len(), tgt.len());
            }
        }
        let mut order: Vec<usize> = (0..tgt.len()).collect();
        order.sort_by_key(|&i| std::cmp::Reverse(tgt[i].len()));
        let src: Vec<Vec<u32>> = order.iter().map(|&i| src[i].clone()).collect();
        let tgt: Vec<Vec<u32>> = order.iter().map(|&i| tgt[i].clone()).collect();
        let keys: Vec<u64> = order.iter().map(|&i| keys[i]).collect();
        let (s, sm) = pad(&src, eos, dtype, dev)?;
        let (t, tm) = pad(&tgt, eos, dtype, dev)?;
        let tgt_in = match inputs {
            Some(inp) => {
                let inp: Vec<Vec<u32>> = order.iter().map(|&i| inp[i].clone()).collect();
                Some(pad(&inp, eos, dtype, dev)?.0)
            }
            None => None,
        };
        let tgt_tokens = tgt.iter().map(|x| x.len() + 1).sum();
        let alignment = match links {
            Some(l) => {
                let (sl, tl) = (s.dim(1)?, t.dim(1)?);
                let rows: Vec<&[(u32, u32)]> = order.iter().map(|&i| &l[i][..]).collect();
                Some(alignment_targets(&rows, (sl, tl), dtype, dev)?)
            }
            None => None,
        };
        Ok(Batch {
            src: s,
            src_mask: sm,
            tgt: t,
            tgt_mask: tm,
            tgt_tokens,
            keys,
            tgt_in,
            alignment,
        })
    }
}

/// Guided alignment's targets `[B, T, S]` from each row's links `(j, i)` (source position `j`, target position
/// `i`): each target position's row normalised over its links, zero where it has none.
fn alignment_targets(
    links: &[&[(u32, u32)]],
    (s, t): (usize, usize),
    dtype: DType,
    dev: &Device,
) -> Result<Tensor> {
    let mut a = vec![0f64; links.len() * t * s];
    for (b, row) in links.iter().enumerate() {
        for &(j, i) in row.iter() {
            let (j, i) = (j as usize, i as usize);
            if j >= s || i >= t {
                candle_core::bail!("batch: link {j}-{i} outside a {s} × {t} pair");
            }
            a[(b * t + i) * s + j] = 1.0;
        }
    }
    for r in a.chunks_mut(s) {
        let n: f64 = r.iter().sum();
        if n > 0.0 {
            r.iter_mut().for_each(|x| *x /= n);
        }
    }
    Tensor::from_vec(a, (links.len(), t, s), dev)?.to_dtype(dtype)
}

/// Each sentence's length from a 0/1 mask `[B, L]` whose every row is words then padding (at least one word):
/// `None` for a mask of another form.
pub fn mask_lengths(mask: &Tensor) -> Result<Option<Vec<usize>>> {
    let l = mask.dim(1)?;
    let m: Vec<f64> = mask.to_dtype(DType::F64)?.flatten_all()?.to_vec1()?;
    let lens: Vec<usize> = m
        .chunks(l.max(1))
        .map(|row| row.iter().take_while(|&&x| x == 1.0).count())
        .collect();
    let words_then_padding = lens
        .iter()
        .zip(m.chunks(l.max(1)))
        .all(|(&n, row)| n > 0 && row[n..].iter().all(|&x| x == 0.0));
    Ok(words_then_padding.then_some(lens))
}

/// The words' rows `b·L + i` (`i` < `lengths[b]`) of a batch-major `[B·L, ·]` tensor, in order.
pub(crate) fn word_rows(lengths: &[usize], l: usize) -> crate::kernels::Rows {
    std::sync::Arc::new(
        lengths
            .iter()
            .enumerate()
            .flat_map(|(r, &n)| (0..n).map(move |i| r * l + i))
            .collect(),
    )
}

/// Rows `rows` of `x` (`[N, ·]`), in order; all of `x` without them.
pub(crate) fn gather_rows(x: &Tensor, rows: Option<&[usize]>) -> Result<Tensor> {
    match rows {
        Some(r) => {
            let ids: Vec<u32> = r.iter().map(|&i| i as u32).collect();
            let n = ids.len();
            x.index_select(&Tensor::from_vec(ids, n, x.device())?, 0)
        }
        None => Ok(x.clone()),
    }
}

/// Pad sentences (each followed by EOS) to the longest; returns ids `[B, L]` and mask `[B, L]`.
pub fn pad(seqs: &[Vec<u32>], eos: u32, dtype: DType, dev: &Device) -> Result<(Tensor, Tensor)> {
    let b = seqs.len();
    let l = seqs.iter().map(|s| s.len() + 1).max().unwrap_or(1);
    let mut ids = vec![eos; b * l];
    let mut mask = vec![0f32; b * l];
    for (i, s) in seqs.iter().enumerate() {
        ids[i * l..i * l + s.len()].copy_from_slice(s);
        for m in &mut mask[i * l..i * l + s.len() + 1] {
            *m = 1.0;
        }
    }
    Ok((
        Tensor::from_vec(ids, (b, l), dev)?,
        Tensor::from_vec(mask, (b, l), dev)?.to_dtype(dtype)?,
    ))
}
