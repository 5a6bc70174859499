//! `cgnmt bench` as an MPI job (`mpiexec -n N cgnmt bench …`, or `--data-parallel` in one process for the
//! comparison): where an update of synchronous data-parallel training spends its time, and what the
//! all-reduce costs by message size.
//!
//! **The exchange's cost by size.** [`Cluster::sum_f32`] (a reduce at rank 0, then a broadcast: the same bits
//! on every rank) of 1 to 2^24 floats, the median of repeated calls per size, and the straight line
//! `t = α + bytes/β` fitted to it ([`fit_alpha_beta`]): the latency α and the bandwidth β the scaling model
//! in `docs/mpi/` starts from.
//!
//! **Training updates** at the named size, exactly as `train` takes them over N ranks: every rank holds the
//! same global batch, computes forward and backward on its share (every N-th sentence), sums the loss, waits
//! at a barrier, sums the gradient ([`Exchange::sum_gradients`]: dense parameters whole, the embedding
//! tables' touched rows), and takes the optimiser step. Per rank, the median seconds of each phase; at rank 0,
//! the global batch's target tokens per second.

use std::path::Path;
use std::time::Instant;

use candle_core::{DType, Device, Var};
use serde_json::json;

use super::{median, size_preset, training_pairs, BenchOptions};
use crate::cluster::Cluster;
use crate::config::Config;
use crate::error::{NmtError, Result};
use crate::model::{Batch, Model};
use crate::train::data_parallel::{self, Exchange};
use crate::train::optim::Optimizer;

/// Least squares fit of `seconds = alpha + bytes / beta` over `(bytes, seconds)` points; `(alpha seconds,
/// beta bytes per second)`. `None` with fewer than two distinct sizes or a line that does not rise.
pub fn fit_alpha_beta(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    let n = points.len() as f64;
    if points.len() < 2 {
        return None;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    if sxx <= 0.0 || sxy <= 0.0 {
        return None;
    }
    let slope = sxy / sxx;
    Some(((my - slope * mx).max(0.0), 1.0 / slope))
}

/// Median seconds of `cluster.sum_f32` on messages of 4^k floats, k = 0..=12 (1 to 16M floats), each
/// repeated until about `budget_s` has passed (at least 3 times; the ranks agree on the count).
fn allreduce_sweep(cluster: &Cluster, budget_s: f64) -> Vec<(usize, f64)> {
    let mut out = vec![];
    for k in 0..=12u32 {
        let n = 4usize.pow(k);
        let mut buf = vec![1.0f32; n];
        cluster.sum_f32(&mut buf); // warm-up (and the buffer's pages)
                                   // Rank 0 times one call and says how many to make.
        let t = Instant::now();
        cluster.sum_f32(&mut buf);
        let mut reps =
            [((budget_s / t.elapsed().as_secs_f64().max(1e-7)) as f64).clamp(3.0, 2000.0)];
        cluster.broadcast_f64(&mut reps);
        let mut times = vec![];
        for _ in 0..reps[0] as usize {
            buf.iter_mut().for_each(|x| *x = 1.0);
            cluster.barrier();
            let t = Instant::now();
            cluster.sum_f32(&mut buf);
            times.push(t.elapsed().as_secs_f64());
        }
        out.push((n, median(&mut times)));
    }
    out
}

/// Per rank, the median seconds of each phase of an update: forward, loss sum, backward, barrier, gradient
/// exchange, optimiser, the whole update; then bytes sent per update.
const PHASES: [&str; 7] = [
    "forward",
    "loss_sum",
    "backward",
    "wait",
    "exchange",
    "optimizer",
    "update",
];

/// The benchmark; the JSON record (complete at rank 0; other ranks return their own part).
pub fn measure(
    cfg: &Config,
    data: &Path,
    opts: &BenchOptions,
    cluster: &Cluster,
) -> Result<serde_json::Value> {
    let (_, _, v, bsz, tlen) = size_preset(&opts.size)
        .ok_or_else(|| NmtError::Config(format!("unknown size {:?}", opts.size)))?;
    let (rank, size) = (cluster.rank(), cluster.size());
    let say = |m: &str| {
        if rank == 0 {
            eprintln!("{m}")
        }
    };
    let dev = Device::Cpu;
    let sweep = if size > 1 {
        say("timing the all-reduce (reduce at rank 0 + broadcast) by message size...");
        allreduce_sweep(cluster, 0.25)
    } else {
        vec![]
    };
    let big: Vec<(f64, f64)> = sweep
        .iter()
        .filter(|(n, _)| *n >= 1 << 16)
        .map(|&(n, t)| (4.0 * n as f64, t))
        .collect();
    let fit = fit_alpha_beta(&big);
    let alpha_small = sweep.first().map(|p| p.1);
    let (_, ids) = training_pairs(data, opts, v, bsz, tlen)?;
    let (model, varmap) = Model::build(&cfg.model, v, v, cfg.train.seed, DType::F32, &dev)?;
    let mut vars: Vec<(String, Var)> = varmap
        .data()
        .lock()
        .expect("vm")
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    data_parallel::start_from_rank_0(&vars, cluster)?;
    let mut exchange = Exchange::new(&vars, &model.row_sparse_parameters());
    let mut opt = Optimizer::new(&cfg.train);
    let steps = opts.steps.max(1);
    let batches: Vec<(Batch, usize)> = ids[..bsz * steps]
        .chunks(bsz)
        .map(|c| {
            let mine = cluster.share(c.len());
            let s: Vec<Vec<u32>> = mine.iter().map(|&i| c[i].0.clone()).collect();
            let t: Vec<Vec<u32>> = mine.iter().map(|&i| c[i].1.clone()).collect();
            let all: usize = c.iter().map(|p| p.1.len() + 1).sum();
            Ok((Batch::new(&s, &t, 0, DType::F32, &dev)?, all))
        })
        .collect::<Result<_>>()?;
    say(&format!(
        "training: {steps} updates of {bsz} sentences on {size} rank(s) × {} thread(s), {} parameters...",
        candle_core::utils::get_num_threads(),
        crate::model::init::count(&varmap)
    ));
    let mut phases: Vec<Vec<f64>> = vec![vec![]; PHASES.len()];
    let (mut sent, mut dense) = (vec![], vec![]);
    let mut global_tokens = 0usize;
    for (k, (b, all_tokens)) in std::iter::once(&batches[0]).chain(&batches).enumerate() {
        let weight = b.src.dim(0)? as f64 / bsz as f64;
        let t0 = Instant::now();
        let loss = model.loss_with(b, &crate::model::LossOptions::of(&cfg.train, 0))?;
        let lv = loss.to_scalar::<f32>()? as f64;
        let t1 = Instant::now();
        let mut sums = [lv * weight];
        cluster.sum_f64(&mut sums);
        let t2 = Instant::now();
        let grads = model.backward(&loss)?;
        let t3 = Instant::now();
        exchange.stats.take();
        let grads = if size > 1 {
            exchange.wait_for_all(cluster);
            exchange.sum_gradients(&vars, Some(grads), weight as f32, cluster)?
        } else {
            grads
        };
        let st = exchange.stats.take();
        let t5 = Instant::now();
        opt.step(&vars, &grads)?;
        let t6 = Instant::now();
        if k == 0 {
            continue; // warm-up
        }
        let took = [
            t1 - t0,
            t2 - t1,
            t3 - t2,
            std::time::Duration::from_secs_f64(st.wait_s),
            std::time::Duration::from_secs_f64(st.exchange_s),
            t6 - t5,
            t6 - t0,
        ];
        for (p, d) in phases.iter_mut().zip(took) {
            p.push(d.as_secs_f64());
        }
        sent.push(st.bytes);
        dense.push(st.dense_bytes);
        global_tokens = *all_tokens;
    }
    // Every rank's medians at every rank (rank r fills row r; the sum puts the rows together).
    let width = PHASES.len() + 1;
    let mut table = vec![0f64; size * width];
    for (j, p) in phases.iter_mut().enumerate() {
        table[rank * width + j] = median(p);
    }
    table[rank * width + PHASES.len()] = if sent.is_empty() {
        0.0
    } else {
        median(&mut sent)
    };
    cluster.sum_f64(&mut table);
    let per_rank: Vec<serde_json::Value> = (0..size)
        .map(|r| {
            let row = &table[r * width..(r + 1) * width];
            let mut m = serde_json::Map::new();
            for (j, name) in PHASES.iter().enumerate() {
                m.insert(format!("{name}_s"), json!(row[j]));
            }
            m.insert("mb_sent".into(), json!(row[PHASES.len()] / 1e6));
            serde_json::Value::Object(m)
        })
        .collect();
    let update_s = table[PHASES.len() - 1]; // rank 0's median update
    let compute = |r: usize| table[r * width] + table[r * width + 2];
    let rec = json!({
        "config": {"size": opts.size, "embedding_dim": cfg.model.embedding_dim, "hidden_dim": cfg.model.hidden_dim,
                   "vocab": v, "batch": bsz, "tgt_len": tlen, "decoder": cfg.model.decoder,
                   "context_gate": cfg.model.context_gate, "tied_output_embeddings": cfg.model.tied_output_embeddings,
                   "simd": crate::kernels::simd_level()},
        "params": crate::model::init::count(&varmap),
        "ranks": size,
        "threads_per_rank": candle_core::utils::get_num_threads(),
        "updates": steps,
        "update_s_median": update_s,
        "train_tgt_tok_per_s": global_tokens as f64 / update_s,
        "compute_s_median_rank0": compute(0),
        "per_rank": per_rank,
        "dense_mb_per_update": if dense.is_empty() { 0.0 } else { median(&mut dense) / 1e6 },
        "allreduce_by_size": sweep.iter().map(|&(n, t)| json!({"floats": n, "bytes": 4 * n, "seconds": t})).collect::<Vec<_>>(),
        "allreduce_fit": fit.map(|(a, b)| json!({"alpha_s": a, "beta_bytes_per_s": b, "from_floats": 1 << 16})),
        "allreduce_one_float_s": alpha_small,
    });
    if rank == 0 {
        eprintln!(
            "update {:.4} s median on rank 0 ({:.0} target tok/s of the global batch)",
            update_s,
            global_tokens as f64 / update_s
        );
        for (r, row) in table.chunks(width).enumerate() {
            eprintln!(
                "  rank {r}: forward {:.4} + loss sum {:.4} + backward {:.4} + wait {:.4} + exchange {:.4} + optimiser {:.4} s; {:.1} MB sent",
                row[0], row[1], row[2], row[3], row[4], row[5], row[7] / 1e6
            );
        }
        if let Some((a, b)) = fit {
            eprintln!(
                "all-reduce: {:.1} µs for one float; from 256 KB up, {:.1} µs + bytes / {:.2} GB/s",
                alpha_small.unwrap_or(0.0) * 1e6,
                a * 1e6,
                b / 1e9
            );
        }
    }
    Ok(rec)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fit_recovers_a_line() {
        let pts: Vec<(f64, f64)> = [1e5, 1e6, 1e7, 1e8]
            .iter()
            .map(|&b| (b, 20e-6 + b / 5e9))
            .collect();
        let (a, b) = fit_alpha_beta(&pts).unwrap();
        assert!((a - 20e-6).abs() < 1e-9, "{a}");
        assert!((b - 5e9).abs() / 5e9 < 1e-9, "{b}");
        assert!(fit_alpha_beta(&pts[..1]).is_none());
        assert!(fit_alpha_beta(&[(1.0, 2.0), (2.0, 1.0)]).is_none());
    }
}
