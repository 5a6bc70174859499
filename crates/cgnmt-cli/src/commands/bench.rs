//! `cgnmt bench`: training and decoding throughput, peak memory and FLOP rate of a named size, as a JSON
//! record (`cgnmt::bench`); under `mpiexec -n N`, the data-parallel update phase by phase.

use std::path::PathBuf;

use anyhow::Result;
use cgnmt::bench::{data_parallel, measure, size_config, BenchOptions};
use cgnmt::cluster::Cluster;

#[derive(clap::Args)]
pub struct BenchArgs {
    /// small (E 256 / H 512 / V 8000, batch 64 × 20), paper (E 620 / H 1000 / V 30000, batch 80 × 30) or tiny.
    #[arg(long, default_value = "small")]
    size: String,
    /// Timed training steps (after one warm-up step); the median is reported.
    #[arg(long, default_value_t = 5)]
    steps: usize,
    /// Sentence lengths of the training batches: `fixed` (every target as long as the size's length, the
    /// sources within ±3 of it: no target padding) or `reference` (the lengths of the batch
    /// `../shared/bench/torch_reference.py` trains on: targets and sources from half the length to all of
    /// it, padded to it; tokens/s then compare with its `tok/s` directly).
    #[arg(long, default_value = "fixed", value_parser = ["fixed", "reference"])]
    lengths: String,
    /// Sentences decoded with beam 10 and greedily.
    #[arg(long, default_value_t = 100)]
    decode_sentences: usize,
    /// Repetitions of the decoding measurement.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Alternate the timed training steps between the packed micro-kernel and the general GEMM for the
    /// recurrences' products and report both medians (the training figures then come from the packed steps).
    #[arg(long)]
    compare_packed_gemm: bool,
    /// Alternate the timed training steps between skipping the target side's padded positions (the default)
    /// and computing them, and report both medians (with `--lengths reference`: fixed lengths have none).
    #[arg(long)]
    compare_target_padding: bool,
    /// Time each fused op's forward and backward pass over the timed training steps and print the
    /// per-step means (the JSON gets `op_profile`); adds a clock read per op call.
    #[arg(long)]
    profile_ops: bool,
    /// Measure synchronous data-parallel training updates (forward, loss sum, backward, waiting, gradient
    /// exchange, optimiser) instead of the single-process benchmark. Implied under `mpiexec -n N` with N > 1
    /// (a build with `--features mpi`), where it also times the all-reduce by message size; in one process
    /// it gives the same loop's figures to compare with.
    #[arg(long)]
    data_parallel: bool,
    /// Model/training overrides (e.g. model.context_gate=none, model.coverage=neural).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Data directory (default: $CGNMT_DATA or ../shared/data).
    #[arg(long)]
    data: Option<PathBuf>,
}

pub fn run(a: BenchArgs, cluster: &Cluster) -> Result<()> {
    let cfg = size_config(&a.size, &a.sets)?;
    cgnmt::kernels::set_threads(cfg.train.threads);
    let opts = BenchOptions {
        size: a.size.clone(),
        steps: a.steps,
        reference_lengths: a.lengths == "reference",
        decode_sentences: a.decode_sentences,
        repeats: a.repeats,
        compare_packed_gemm: a.compare_packed_gemm,
        compare_target_padding: a.compare_target_padding,
        profile_ops: a.profile_ops,
    };
    let data = cgnmt_datasets::DataDir::resolve(a.data).root;
    if a.data_parallel || cluster.size() > 1 {
        let rec = match data_parallel::measure(&cfg, &data, &opts, cluster) {
            Ok(r) => r,
            Err(e) => cluster.fail(&e.into()),
        };
        if cluster.rank() == 0 {
            println!("{rec}");
        }
        return Ok(());
    }
    println!("{}", measure(&cfg, &data, &opts)?);
    Ok(())
}
