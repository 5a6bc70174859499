//! Synchronous data parallelism over MPI ranks ([`crate::cluster::Cluster`]): the start from rank 0's
//! parameters, the summed gradient of the global batch, and the check that the replicas never drift.
//!
//! **The exchange** ([`Exchange::sum_gradients`]). Each rank's gradient of its share of the global batch,
//! weighted by that share, is summed over the ranks with the same bits left on every rank. Two sums per
//! update:
//! 1. a header: one presence flag per parameter (a rank whose share gave a parameter no gradient adds zeros),
//!    and for each *row-sparse* table (a word-embedding matrix looked up by id: only the rows of words in the
//!    batch get a gradient) one count per row of the ranks whose gradient has that row non-zero;
//! 2. the body: every dense parameter whole, and of each row-sparse table only the rows some rank touched.
//!
//! Rows no rank touched are zero on every rank, so their sum is zero and they need not travel: the result is
//! the dense sum's, bit for bit (the same values are added in the same order at rank 0). At the paper's size
//! (30K-word vocabularies, E 620) the two embedding tables are 37M of the 84M parameters, and a batch of 80
//! sentences touches a few percent of their rows.
//!
//! **Where the time goes** ([`ExchangeStats`]): per update, the seconds of this rank's forward and backward
//! pass, the seconds it waits at a barrier for the slowest rank (load imbalance), the seconds of the two sums
//! themselves (with packing), and the bytes this rank sends into them.

use std::time::Instant;

use candle_core::{DType, Device, Tensor, Var};

use crate::cluster::Cluster;
use crate::error::{NmtError, Result};

/// Every parameter, in `vars`' order, as one f32 vector.
pub fn flatten(vars: &[(String, Var)]) -> Result<Vec<f32>> {
    let mut flat = vec![];
    for (_, v) in vars {
        flat.extend(
            v.as_tensor()
                .flatten_all()?
                .to_dtype(DType::F32)?
                .to_vec1::<f32>()?,
        );
    }
    Ok(flat)
}

/// Set every parameter from [`flatten`]'s vector.
pub fn unflatten(vars: &[(String, Var)], flat: &[f32]) -> Result<()> {
    let mut at = 0;
    for (_, v) in vars {
        let n = v.elem_count();
        let t =
            Tensor::from_slice(&flat[at..at + n], v.shape(), v.device())?.to_dtype(v.dtype())?;
        v.set(&t)?;
        at += n;
    }
    Ok(())
}

/// Rank 0's parameters on every rank (the start of a run, fresh or resumed), after every rank has passed its
/// own checks (so rank 0 writes nothing for a job that another rank refuses).
pub fn start_from_rank_0(vars: &[(String, Var)], cluster: &Cluster) -> Result<()> {
    if cluster.size() > 1 {
        cluster.barrier();
        let mut flat = flatten(vars)?;
        cluster.broadcast_f32(&mut flat);
        unflatten(vars, &flat)?;
    }
    Ok(())
}

/// Every rank's parameters are the same bits: each rank's checksum (the sum of its parameters' bits as
/// integers, in f64) is gathered on all ranks and compared; a difference is an error naming the update.
pub fn check_in_step(vars: &[(String, Var)], cluster: &Cluster, step: u64) -> Result<f64> {
    let mut sum: u64 = 0;
    for x in flatten(vars)? {
        sum = sum.wrapping_add(x.to_bits() as u64);
    }
    let mut all = vec![0f64; cluster.size()];
    all[cluster.rank()] = (sum % (1u64 << 52)) as f64;
    cluster.sum_f64(&mut all);
    if all.iter().any(|&c| c != all[0]) {
        return Err(NmtError::Data(format!(
            "the ranks' parameters differ at update {step} (checksums {all:?}): the data-parallel replicas \
             drifted apart"
        )));
    }
    Ok(all[0])
}

/// Seconds and bytes of the updates since the last [`ExchangeStats::take`], on this rank.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ExchangeStats {
    pub updates: u64,
    /// Forward and backward pass of this rank's share.
    pub compute_s: f64,
    /// At the barrier before the exchange: waiting for the slowest rank.
    pub wait_s: f64,
    /// The two sums, with packing and unpacking.
    pub exchange_s: f64,
    /// Bytes this rank sent into the sums (f32 values and the header).
    pub bytes: f64,
    /// What a dense exchange of every parameter would have sent.
    pub dense_bytes: f64,
}

impl ExchangeStats {
    /// The totals so far, leaving zeros.
    pub fn take(&mut self) -> ExchangeStats {
        std::mem::take(self)
    }

    /// Means per update, as a JSON object for `train.log` (`None` before the first update).
    pub fn per_update_json(&self) -> Option<serde_json::Value> {
        let n = self.updates as f64;
        (self.updates > 0).then(|| {
            serde_json::json!({
                "compute_s": self.compute_s / n,
                "wait_s": self.wait_s / n,
                "exchange_s": self.exchange_s / n,
                "mb_sent": self.bytes / n / 1e6,
                "dense_mb": self.dense_bytes / n / 1e6,
            })
        })
    }
}

/// The gradient exchange of one training job (buffers kept from update to update).
pub struct Exchange {
    /// Per parameter (in `vars`' order): whether it is a row-sparse table, and its rows.
    sparse: Vec<Option<usize>>,
    header: Vec<f32>,
    body: Vec<f32>,
    pub stats: ExchangeStats,
}

impl Exchange {
    /// `row_sparse`: the names of the parameters that are word-embedding tables looked up by id
    /// ([`crate::model::Model::row_sparse_parameters`]). Naming a dense parameter here costs a scan and
    /// saves nothing; the sum is exact either way.
    pub fn new(vars: &[(String, Var)], row_sparse: &[String]) -> Exchange {
        let sparse = vars
            .iter()
            .map(|(name, v)| {
                (row_sparse.contains(name) && v.rank() == 2 && v.elem_count() > 0)
                    .then(|| v.dims()[0])
            })
            .collect();
        Exchange {
            sparse,
            header: vec![],
            body: vec![],
            stats: ExchangeStats::default(),
        }
    }

    /// Wait at a barrier for every rank (time counted as waiting).
    pub fn wait_for_all(&mut self, cluster: &Cluster) {
        let t = Instant::now();
        cluster.barrier();
        self.stats.wait_s += t.elapsed().as_secs_f64();
    }

    /// The global batch's gradient on every rank: each rank's gradients times its share of the batch,
    /// summed over the ranks (the same bits everywhere). A parameter gets a gradient when any rank's share
    /// gave it one (a rank with an empty share adds zeros).
    pub fn sum_gradients(
        &mut self,
        vars: &[(String, Var)],
        grads: Option<candle_core::backprop::GradStore>,
        weight: f32,
        cluster: &Cluster,
    ) -> Result<candle_core::backprop::GradStore> {
        let t = Instant::now();
        let grad_of = |v: &Var| grads.as_ref().and_then(|g| g.get(v.as_tensor()));
        // 1. The header: presence flags, then each row-sparse table's rows that are non-zero here.
        self.header.clear();
        for (_, v) in vars {
            self.header
                .push(if grad_of(v).is_some() { 1.0 } else { 0.0 });
        }
        for ((_, v), rows) in vars.iter().zip(&self.sparse) {
            let Some(rows) = *rows else { continue };
            let width = v.elem_count() / rows;
            match grad_of(v) {
                Some(g) => with_f32(g, |x| {
                    for row in x.chunks(width) {
                        self.header.push(if row.iter().any(|&a| a != 0.0) {
                            1.0
                        } else {
                            0.0
                        });
                    }
                })?,
                None => self.header.extend(std::iter::repeat_n(0.0, rows)),
            }
        }
        cluster.sum_f32(&mut self.header);
        // 2. The body: dense parameters whole, of each row-sparse table the rows some rank touched, weighted
        // by this rank's share; then zeros up to a multiple of the ranks (one block each).
        self.body.clear();
        let mut counts = vars.len();
        let mut kept: Vec<Option<Vec<bool>>> = Vec::with_capacity(vars.len());
        for ((_, v), rows) in vars.iter().zip(&self.sparse) {
            let keep: Option<Vec<bool>> = rows.map(|r| {
                let k = self.header[counts..counts + r]
                    .iter()
                    .map(|&c| c > 0.0)
                    .collect();
                counts += r;
                k
            });
            let width = keep
                .as_ref()
                .map_or(v.elem_count(), |k| v.elem_count() / k.len());
            let body = &mut self.body;
            match grad_of(v) {
                Some(g) => with_f32(g, |x| {
                    for (j, row) in x.chunks(width).enumerate() {
                        if keep.as_ref().is_none_or(|k| k[j]) {
                            body.extend(row.iter().map(|&a| a * weight));
                        }
                    }
                })?,
                None => {
                    let n = keep
                        .as_ref()
                        .map_or(v.elem_count(), |k| k.iter().filter(|&&b| b).count() * width);
                    body.extend(std::iter::repeat_n(0f32, n));
                }
            }
            kept.push(keep);
        }
        let sent = self.body.len();
        self.body
            .resize(sent.div_ceil(cluster.size()) * cluster.size(), 0.0);
        cluster.sum_f32(&mut self.body);
        let dense: usize = vars.iter().map(|(_, v)| v.elem_count()).sum();
        self.stats.bytes += 4.0 * (self.header.len() + self.body.len()) as f64;
        self.stats.dense_bytes += 4.0 * (dense + vars.len()) as f64;
        // This rank's store with the sums put in (a rank with an empty share starts from an empty store).
        let mut out = match grads {
            Some(g) => g,
            None => Tensor::zeros((), DType::F32, &Device::Cpu)?.backward()?,
        };
        let mut at = 0;
        for (k, ((_, v), keep)) in vars.iter().zip(&kept).enumerate() {
            let n = v.elem_count();
            let sum = match keep {
                None => {
                    at += n;
                    Tensor::from_slice(&self.body[at - n..at], v.shape(), v.device())?
                }
                Some(keep) => {
                    let width = n / keep.len();
                    let mut full = vec![0f32; n];
                    for (row, &kept) in full.chunks_mut(width).zip(keep) {
                        if kept {
                            row.copy_from_slice(&self.body[at..at + width]);
                            at += width;
                        }
                    }
                    Tensor::from_vec(full, v.shape(), v.device())?
                }
            };
            if self.header[k] > 0.0 {
                out.insert(v.as_tensor(), sum.to_dtype(v.dtype())?);
            } else {
                out.remove(v.as_tensor());
            }
        }
        self.stats.exchange_s += t.elapsed().as_secs_f64();
        self.stats.updates += 1;
        Ok(out)
    }
}

/// `f` on a tensor's values as f32: in place for a contiguous f32 tensor on the CPU, else from a copy.
fn with_f32(t: &Tensor, f: impl FnOnce(&[f32])) -> Result<()> {
    if t.device().is_cpu() && t.dtype() == DType::F32 {
        let (st, l) = t.storage_and_layout();
        if let (candle_core::Storage::Cpu(candle_core::CpuStorage::F32(all)), Some((a, b))) =
            (&*st, l.contiguous_offsets())
        {
            f(&all[a..b]);
            return Ok(());
        }
    }
    f(&t.flatten_all()?.to_dtype(DType::F32)?.to_vec1::<f32>()?);
    Ok(())
}
