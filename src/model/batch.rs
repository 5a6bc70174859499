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
        Self::keyed_with_inputs(src, tgt, None, keys, eos, dtype, dev)
    }

    /// [`Batch::keyed`] whose decoder reads `inputs` as its previous words (each as long as its target:
    /// target-side word dropout) while the loss scores `tgt`.
    pub fn keyed_with_inputs(
        src: &[Vec<u32>],
        tgt: &[Vec<u32>],
        inputs: Option<&[Vec<u32>]>,
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
        Ok(Batch {
            src: s,
            src_mask: sm,
            tgt: t,
            tgt_mask: tm,
            tgt_tokens,
            keys,
            tgt_in,
        })
    }
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
