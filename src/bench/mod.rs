//! `cgnmt bench`: training and decoding throughput on real sentences with fixed shapes, peak memory, model
//! FLOP rate from an analytic count, and a large SGEMM measured just before as the machine's reference.

pub mod data_parallel;

use std::path::Path;
use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use serde_json::json;

use crate::config::{Config, ContextGate, CoverageKind, DecoderKind, TargetPadding};
use crate::decode::beam_search::{beam_search_batches, greedy, DecodeOptions};
use crate::error::{NmtError, Result};
use crate::model::{Batch, Model};
use crate::train::optim::Optimizer;

/// Named sizes: (E, H, V, batch, target length). A `-deep` size (`small-deep`, `paper-deep`) is its base size
/// with a deep model ([`size_model_sets`]).
pub fn size_preset(name: &str) -> Option<(usize, usize, usize, usize, usize)> {
    match name.strip_suffix("-deep").unwrap_or(name) {
        "small" => Some((256, 512, 8000, 64, 20)),
        "paper" => Some((620, 1000, 30000, 80, 30)),
        "tiny" => Some((64, 128, 2000, 16, 10)),
        _ => None,
    }
}

/// The model settings a named size adds to its dimensions: a `-deep` size has two bidirectional encoder
/// layers (with a residual connection) and a depth-2 transition in the decoder.
pub fn size_model_sets(name: &str) -> Vec<String> {
    if name.ends_with("-deep") {
        vec![
            "model.encoder_layers=2".into(),
            "model.decoder_transition_depth=2".into(),
        ]
    } else {
        vec![]
    }
}

/// Peak resident set size of this process in MiB (Linux), if known.
pub fn peak_rss_mib() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// Minor page faults of this process so far (first touches of fresh pages), if known.
pub fn minor_faults() -> Option<u64> {
    #[cfg(unix)]
    {
        // SAFETY: getrusage only writes the struct it is given.
        let mut r: libc::rusage = unsafe { std::mem::zeroed() };
        if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut r) } == 0 {
            return Some(r.ru_minflt as u64);
        }
    }
    None
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// GFLOP/s of an n×n×n f32 matmul (median of a few runs after a warm-up).
pub fn sgemm_gflops(n: usize) -> Result<f64> {
    let a = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu)?;
    let b = Tensor::randn(0f32, 1.0, (n, n), &Device::Cpu)?;
    let _ = a.matmul(&b)?;
    let mut t = vec![];
    for _ in 0..5 {
        let s = Instant::now();
        let _c = a.matmul(&b)?;
        t.push(s.elapsed().as_secs_f64());
    }
    Ok(2.0 * (n as f64).powi(3) / median(&mut t) / 1e9)
}

/// GFLOP/s of one n×n×n f32 matmul, operands allocated for it and freed after it (taken between training
/// steps, so that the step and the peak it is compared with see the same machine: on a shared machine the
/// peak drifts by a factor of two within minutes).
pub fn sgemm_gflops_once(n: usize) -> Result<f64> {
    let a = Tensor::full(0.5f32, (n, n), &Device::Cpu)?;
    let b = Tensor::full(0.25f32, (n, n), &Device::Cpu)?;
    let s = Instant::now();
    let c = a.matmul(&b)?;
    let t = s.elapsed().as_secs_f64();
    drop(c);
    Ok(2.0 * (n as f64).powi(3) / t / 1e9)
}

/// GFLOP/s of an `[m, k] × [k, n]` f32 matmul (median of 20 runs after a warm-up): what the machine gives
/// at the shapes of one recurrent step. With `col_major`, the right operand is the transposed view of a
/// contiguous `[n, k]` matrix (one of the two orientations the fused kernels can read a recurrent weight in;
/// they pick the faster one for this CPU's GEMM micro-kernels).
pub fn gemm_gflops(m: usize, k: usize, n: usize, col_major: bool) -> Result<f64> {
    let a = Tensor::randn(0f32, 1.0, (m, k), &Device::Cpu)?;
    let b = if col_major {
        Tensor::randn(0f32, 1.0, (n, k), &Device::Cpu)?.t()?
    } else {
        Tensor::randn(0f32, 1.0, (k, n), &Device::Cpu)?
    };
    let _ = a.matmul(&b)?;
    let mut t = vec![];
    for _ in 0..20 {
        let s = Instant::now();
        let _c = a.matmul(&b)?;
        t.push(s.elapsed().as_secs_f64());
    }
    Ok(2.0 * (m * k * n) as f64 / median(&mut t) / 1e9)
}

/// GFLOP/s of `[m, k] × [k, n]` with the packed micro-kernel ([`crate::kernels::packed_gemm`], the weight packed
/// once as in the recurrences); `None` where this CPU has no packed kernel.
pub fn packed_gemm_gflops(m: usize, k: usize, n: usize) -> Result<Option<f64>> {
    let Some(isa) = crate::kernels::packed_gemm::Isa::detect() else {
        return Ok(None);
    };
    packed_rate(m, k, n, |b| {
        Some(crate::kernels::packed_gemm::Packed::new(isa, b, k, n, n, 1))
    })
}

/// Multiply-adds × 2 per second (in billions, "GOP/s", comparable to GFLOP/s) of `[m, k] × [k, n]` with the
/// int8 product ([`crate::kernels::quantized_gemm`]; the weight quantised once, each call quantising its rows);
/// `None` without AVX2.
pub fn int8_gemm_gops(m: usize, k: usize, n: usize) -> Result<Option<f64>> {
    packed_rate(m, k, n, |b| {
        crate::kernels::packed_gemm::Packed::new_int8(b, k, n, n, 1)
    })
}

/// [`int8_gemm_gops`] with the AVX2 int8 kernel, where the CPU's fastest is another (VNNI); `None` otherwise.
pub fn int8_avx2_gemm_gops(m: usize, k: usize, n: usize) -> Result<Option<f64>> {
    use crate::kernels::quantized_gemm::Kernel;
    if Kernel::detect() == Some(Kernel::Avx2) {
        return Ok(None);
    }
    packed_rate(m, k, n, |b| {
        crate::kernels::packed_gemm::Packed::new_int8_with(Kernel::Avx2, b, k, n, n, 1)
    })
}

/// The median rate (2·m·k·n per second, in billions) of 20 products `[m, k] × [k, n]` with the weight that
/// `pack` makes of a random `B` (after one untimed product); `None` when it makes none.
fn packed_rate(
    m: usize,
    k: usize,
    n: usize,
    pack: impl Fn(&[f32]) -> Option<crate::kernels::packed_gemm::Packed>,
) -> Result<Option<f64>> {
    let a: Vec<f32> = Tensor::randn(0f32, 1.0, m * k, &Device::Cpu)?.to_vec1()?;
    let b: Vec<f32> = Tensor::randn(0f32, 1.0, k * n, &Device::Cpu)?.to_vec1()?;
    let Some(p) = pack(&b) else {
        return Ok(None);
    };
    let mut c = vec![0f32; m * n];
    let threads = rayon::current_num_threads();
    p.mul_into(m, &a, k, &mut c, n, false, threads);
    let mut t = vec![];
    for _ in 0..20 {
        let s = Instant::now();
        p.mul_into(m, &a, k, &mut c, n, false, threads);
        t.push(s.elapsed().as_secs_f64());
    }
    Ok(Some(2.0 * (m * k * n) as f64 / median(&mut t) / 1e9))
}

/// Forward FLOPs of one training batch (matrix products only), from the configuration and shapes.
pub fn forward_flops(cfg: &Config, v: usize, b: usize, s: usize, t: usize) -> f64 {
    encoder_flops(cfg, b, s) + decoder_step_flops(cfg, v, s) * (b * t) as f64
}

/// Forward FLOPs of the sentences of a batch, each at its own source and target length (EOS included):
/// the model's work on the words, padding not counted.
pub fn batch_forward_flops(cfg: &Config, v: usize, src_lens: &[usize], tgt_lens: &[usize]) -> f64 {
    src_lens
        .iter()
        .zip(tgt_lens)
        .map(|(&s, &t)| forward_flops(cfg, v, 1, s, t))
        .sum()
}

/// The sentence lengths (words + EOS) of `../shared/bench/torch_reference.py`'s training batch of `b`
/// sentences padded to `len`: sentence `i` has a source of `len − (i mod (len/2 + 1))` and a target of
/// `len − (3i mod (len/2 + 1))` positions.
pub fn reference_lengths(b: usize, len: usize) -> Vec<(usize, usize)> {
    let k = len / 2 + 1;
    (0..b).map(|i| (len - i % k, len - (3 * i) % k)).collect()
}

/// Real sentence pairs from Hansards fr-en for the given (source, target) lengths in positions (words + EOS):
/// each target has exactly its length's words; each source is the first words of a source sentence at
/// least that long.
fn pairs_of_lengths(
    data: &Path,
    lengths: &[(usize, usize)],
) -> Result<Vec<(Vec<String>, Vec<String>)>> {
    // Unfilled places by target word count, longest source first.
    let mut open: std::collections::BTreeMap<usize, Vec<(usize, usize)>> = Default::default();
    for (i, &(s, t)) in lengths.iter().enumerate() {
        open.entry(t.saturating_sub(1))
            .or_default()
            .push((s.saturating_sub(1), i));
    }
    for v in open.values_mut() {
        v.sort_by_key(|&(s, _)| std::cmp::Reverse(s));
    }
    let mut out: Vec<Option<(Vec<String>, Vec<String>)>> = vec![None; lengths.len()];
    let mut left = lengths.len();
    each_hansards_pair(data, |a, b| {
        let t: Vec<String> = b.split_whitespace().map(str::to_string).collect();
        if let Some(places) = open.get_mut(&t.len()) {
            let words = a.split_whitespace().count();
            if let Some(at) = places.iter().position(|&(s, _)| s <= words && s > 0) {
                let (s, i) = places.remove(at);
                out[i] = Some((
                    a.split_whitespace().take(s).map(str::to_string).collect(),
                    t,
                ));
                left -= 1;
            }
        }
        left > 0
    })?;
    if left > 0 {
        return Err(NmtError::Data(format!(
            "{}: found sentence pairs for only {} of {} requested lengths",
            data.join("hansards-en-fr").display(),
            lengths.len() - left,
            lengths.len()
        )));
    }
    Ok(out.into_iter().flatten().collect())
}

/// FLOPs of encoding `b` sentences of `s` words (with the attention keys).
pub fn encoder_flops(cfg: &Config, b: usize, s: usize) -> f64 {
    let m = &cfg.model;
    let (e, h, ad) = (
        m.embedding_dim as f64,
        m.hidden_dim as f64,
        m.attention_dim as f64,
    );
    let (b, s) = (b as f64, s as f64);
    let enc = 2.0 * (2.0 * e * 3.0 * h + 2.0 * h * 3.0 * h) * b * s;
    // Each layer above the first: both directions' input products over the 2H annotations, and recurrent.
    let upper = (m.encoder_layers.max(1) - 1) as f64
        * 2.0
        * (2.0 * 2.0 * h * 3.0 * h + 2.0 * h * 3.0 * h)
        * b
        * s;
    let keys = 2.0 * 2.0 * h * ad * b * s;
    enc + upper + keys
}

/// FLOPs of one decoder step for one hypothesis (attention over `s` source positions, transition,
/// readout over `v` words).
pub fn decoder_step_flops(cfg: &Config, v: usize, s: usize) -> f64 {
    let m = &cfg.model;
    let (e, h, ad) = (
        m.embedding_dim as f64,
        m.hidden_dim as f64,
        m.attention_dim as f64,
    );
    let (b, s, t, v) = (1.0, s as f64, 1.0, v as f64);
    let att = (2.0 * h * ad + 3.0 * ad * s + 2.0 * s * 2.0 * h) * b * t;
    let cell = match m.decoder {
        // Word, context and recurrent products of the k blocks.
        DecoderKind::Gru => 2.0 * (e + 2.0 * h + h) * 3.0 * h,
        DecoderKind::Vanilla => 2.0 * (e + 2.0 * h + h) * h,
        // The word GRU (word and state) and the context GRU (context and state).
        DecoderKind::Cgru => 2.0 * ((e + h) + (2.0 * h + h)) * 3.0 * h,
    } * b
        * t;
    // A deep transition's later GRUs: their recurrent products only (their input terms are a bias).
    let cell = cell + (m.decoder_transition_depth.max(1) - 1) as f64 * 2.0 * h * 3.0 * h * b * t;
    let gate = if m.context_gate != ContextGate::None {
        2.0 * (e + h + 2.0 * h) * h * b * t
    } else {
        0.0
    };
    let cov = if m.coverage != CoverageKind::None {
        let d = m.coverage_dim as f64;
        2.0 * (d * ad + 3.0 * d * (d + h)) * b * t * s
    } else {
        0.0
    };
    let readout = 2.0 * ((2.0 * h + h + e) * h + h / 2.0 * e + e * v) * b * t;
    att + cell + gate + cov + readout
}

/// Real sentence pairs of fixed lengths from a whitespace-tokenised corpus (Hansards fr-en): `n` pairs whose
/// target has exactly `tgt_len − 1` tokens (EOS makes `tgt_len`) and whose source is within ±3 of it.
fn fixed_length_pairs(
    data: &Path,
    n: usize,
    src_len: usize,
    tgt_len: usize,
) -> Result<Vec<(Vec<String>, Vec<String>)>> {
    let mut out = vec![];
    let mut lines = 0;
    each_hansards_pair(data, |a, b| {
        let s: Vec<String> = a.split_whitespace().map(str::to_string).collect();
        let t: Vec<String> = b.split_whitespace().map(str::to_string).collect();
        if t.len() + 1 == tgt_len && s.len().abs_diff(src_len.saturating_sub(1)) <= 3 {
            out.push((s, t));
        }
        lines += 1;
        out.len() < n && lines < 400_000
    })?;
    if out.len() < n {
        return Err(NmtError::Data(format!(
            "only {} pairs of the requested lengths found in {}",
            out.len(),
            data.join("hansards-en-fr").display()
        )));
    }
    Ok(out)
}

/// Hansards fr-en's training pairs (French, English), line by line, to `f` while it returns true.
fn each_hansards_pair(data: &Path, mut f: impl FnMut(&str, &str) -> bool) -> Result<()> {
    let dir = data.join("hansards-en-fr");
    let (fr, en) = (dir.join("train.fr.gz"), dir.join("train.en.gz"));
    if !fr.is_file() {
        return Err(NmtError::Data(format!(
            "{}: not found (set $CGNMT_DATA to the data directory)",
            fr.display()
        )));
    }
    let mut fr_r = cgnmt_data::corpus::open_text(&fr)?;
    let mut en_r = cgnmt_data::corpus::open_text(&en)?;
    let (mut a, mut b) = (String::new(), String::new());
    loop {
        a.clear();
        b.clear();
        if fr_r.read_line(&mut a).map_err(|e| NmtError::io(&fr, e))? == 0
            || en_r.read_line(&mut b).map_err(|e| NmtError::io(&en, e))? == 0
            || !f(&a, &b)
        {
            return Ok(());
        }
    }
}

use std::io::BufRead;

pub struct BenchOptions {
    pub size: String,
    pub steps: usize,
    /// Train on batches with `torch_reference.py`'s sentence lengths (see [`reference_lengths`]) instead of
    /// fixed-length targets.
    pub reference_lengths: bool,
    pub decode_sentences: usize,
    pub repeats: usize,
    /// Alternate training steps between the packed micro-kernel and the general GEMM for the recurrences'
    /// products (same process, same batches' shapes: far less noisy than comparing two runs).
    pub compare_packed_gemm: bool,
    /// Alternate training steps between skipping the target side's padded positions (the default) and
    /// computing them (same process, same batches).
    pub compare_target_padding: bool,
    /// Time the fused ops' forward and backward passes (see [`crate::kernels::profile`]) over the timed steps.
    pub profile_ops: bool,
}

/// Real sentence pairs of the benchmark's shape (`bsz` × `steps` for training, then `decode_sentences`), as ids
/// below `v` from a vocabulary built on them.
#[allow(clippy::type_complexity)]
fn training_pairs(
    data: &Path,
    opts: &BenchOptions,
    v: usize,
    bsz: usize,
    tlen: usize,
) -> Result<(cgnmt_data::vocab::Vocab, Vec<(Vec<u32>, Vec<u32>)>)> {
    let pairs = if opts.reference_lengths {
        let per_batch = reference_lengths(bsz, tlen);
        let mut lengths: Vec<(usize, usize)> = (0..opts.steps.max(1))
            .flat_map(|_| per_batch.iter().copied())
            .collect();
        lengths.extend(std::iter::repeat_n((tlen, tlen), opts.decode_sentences));
        pairs_of_lengths(data, &lengths)?
    } else {
        fixed_length_pairs(
            data,
            bsz * opts.steps.max(1) + opts.decode_sentences,
            tlen,
            tlen,
        )?
    };
    let mut counts = cgnmt_data::vocab::WordCounts::new();
    for (s, t) in &pairs {
        counts.add_sentence(s);
        counts.add_sentence(t);
    }
    let vocab = cgnmt_data::vocab::Vocab::build(&counts, v - 2);
    let ids: Vec<(Vec<u32>, Vec<u32>)> = pairs
        .iter()
        .map(|(s, t)| (vocab.encode(s), vocab.encode(t)))
        .collect();
    Ok((vocab, ids))
}

/// Run the benchmark; prints a human summary to stderr and returns the JSON record.
pub fn measure(cfg: &Config, data: &Path, opts: &BenchOptions) -> Result<serde_json::Value> {
    let (_, _, v, bsz, tlen) = size_preset(&opts.size)
        .ok_or_else(|| NmtError::Config(format!("unknown size {:?}", opts.size)))?;
    let dev = Device::Cpu;
    let threads = candle_core::utils::get_num_threads();
    eprintln!("measuring SGEMM peak ({} threads)...", threads);

    let peak = sgemm_gflops(2048)?;
    let step_gemm = step_gemms(cfg, v, bsz, tlen)?;
    eprintln!("GEMM GFLOP/s at the model's shapes: {step_gemm}");
    let (vocab, ids) = training_pairs(data, opts, v, bsz, tlen)?;
    let (model, varmap) = Model::build(&cfg.model, v, v, cfg.train.seed, DType::F32, &dev)?;
    let batches: Vec<Batch> = ids[..bsz * opts.steps.max(1)]
        .chunks(bsz)
        .map(|c| {
            let s: Vec<Vec<u32>> = c.iter().map(|p| p.0.clone()).collect();
            let t: Vec<Vec<u32>> = c.iter().map(|p| p.1.clone()).collect();
            if cfg.train.guided_alignment.is_none() {
                return Batch::new(&s, &t, 0, DType::F32, &dev);
            }
            // Guided alignment: a link per target word on the diagonal (one link per word, as an aligner's),
            // EOS to EOS.
            let links: Vec<Vec<(u32, u32)>> = s
                .iter()
                .zip(&t)
                .map(|(s, t)| {
                    (0..=t.len())
                        .map(|i| ((i * s.len()).div_ceil(t.len().max(1)) as u32, i as u32))
                        .collect()
                })
                .collect();
            let keys: Vec<u64> = (0..s.len() as u64).collect();
            Batch::keyed_with_inputs(&s, &t, None, Some(&links), &keys, 0, DType::F32, &dev)
        })
        .collect::<candle_core::Result<_>>()?;
    eprintln!(
        "training: {} steps of {} sentences, {} target tokens in {}×{} positions (source ≤ {}), V {}...",
        opts.steps,
        bsz,
        batches[0].tgt_tokens,
        bsz,
        batches[0].tgt.dim(1)?,
        batches[0].src.dim(1)?,
        v
    );
    let tr = training(cfg, v, &model, &varmap, &batches, opts)?;
    // Decoding: sentences of source length ~6 so that greedy runs ≤ 21 steps, as the reference's 20.
    let dec_pairs = fixed_length_pairs(data, opts.decode_sentences, 7, 8)?;
    let dec_src: Vec<Vec<u32>> = dec_pairs.iter().map(|(s, _)| vocab.encode(s)).collect();
    let model = model.frozen(&varmap)?;
    let de = decoding(&model, &dec_src, opts.repeats)?;
    // Model FLOPs of the decoding runs (analytic, per hypothesis step actually computed).
    let src_words: usize = dec_src.iter().map(|s| s.len() + 1).sum();
    let avg_src = src_words as f64 / dec_src.len().max(1) as f64;
    let dec_flops = |rows: u64| {
        encoder_flops(cfg, dec_src.len(), avg_src.round() as usize)
            + decoder_step_flops(cfg, v, avg_src.round() as usize) * rows as f64
    };
    let (beam_med, greedy_med) = (de.beam_s, de.greedy_s);
    let (beam_rows, greedy_rows) = (de.beam_rows, de.greedy_rows);
    let n = dec_src.len() as f64;
    let gflops = tr.gflops;
    let rec = json!({
        "config": {"size": opts.size, "embedding_dim": cfg.model.embedding_dim, "hidden_dim": cfg.model.hidden_dim,
                   "vocab": v, "batch": bsz, "tgt_len": tlen,
                   "lengths": if opts.reference_lengths { "reference" } else { "fixed" }, "decoder": cfg.model.decoder, "context_gate": cfg.model.context_gate,
                   "coverage": cfg.model.coverage, "encoder_layers": cfg.model.encoder_layers,
                   "decoder_transition_depth": cfg.model.decoder_transition_depth,
                   "optimizer": cfg.train.optimizer, "kernels": model.kernels.name(),
                   "label_smoothing": cfg.train.label_smoothing, "recurrent_dropout": cfg.train.recurrent_dropout,
                   "guided_alignment": cfg.train.guided_alignment.is_some(),
                   "simd": crate::kernels::simd_level()},
        "params": crate::model::init::count(&varmap),
        "train_step_s_median": tr.step_s,
        "train_phase_s_median": {"forward": tr.phases_s[0], "backward": tr.phases_s[1], "optimizer": tr.phases_s[2]},
        "train_tgt_tok_per_s": tr.tok_per_s,
        "train_tgt_tokens_per_step": tr.tokens,
        "train_tgt_positions_per_step": tr.positions,
        "decode_beam10_sent_per_s": n / beam_med,
        "decode_greedy_sent_per_s": n / greedy_med,
        "decode_beam10_hyp_steps": beam_rows,
        "decode_greedy_hyp_steps": greedy_rows,
        "decode_beam10_hyp_steps_per_s": beam_rows as f64 / beam_med,
        "decode_greedy_hyp_steps_per_s": greedy_rows as f64 / greedy_med,
        "decode_beam10_gflops_per_s": dec_flops(beam_rows) / beam_med / 1e9,
        "decode_beam10_int8_sent_per_s": de.int8_s.map(|s| n / s),
        "decode_beam10_int8_hyp_steps": de.int8_s.is_some().then_some(de.int8_rows),
        "decode_greedy_gflops_per_s": dec_flops(greedy_rows) / greedy_med / 1e9,
        "peak_rss_mib": peak_rss_mib(),
        "train_minor_faults_per_step_median": tr.faults_per_step,
        "threads": threads,
        "gflops_per_s": gflops,
        "sgemm_peak_gflops": peak,
        "peak_fraction": gflops / peak,
        "sgemm_peak_between_steps_gflops": tr.peak_between,
        "peak_fraction_between_steps": tr.fraction_between,
        "gemm_gflops_at_step_shapes": step_gemm,
        "op_profile": tr.op_profile,
        "packed_gemm_comparison": tr.packed_gemm_comparison,
        "target_padding_comparison": tr.padding_comparison,
    });
    eprintln!(
        "train: {:.0} target tok/s (median step {:.3} s = forward {:.3} + backward {:.3} + update {:.3}, {:.1} GFLOP/s = {:.0}% of SGEMM peak {:.1}; {:.0}% of the peak measured after each step, median {:.1}; {:.0} page faults per step); decode: beam 10 {:.1} sent/s ({:.0} hypothesis steps/s, {:.1} GFLOP/s), greedy {:.1} sent/s ({:.0} steps/s, {:.1} GFLOP/s); peak RSS {:.0} MiB",
        tr.tok_per_s, tr.step_s, tr.phases_s[0], tr.phases_s[1], tr.phases_s[2], gflops, 100.0 * gflops / peak, peak,
        100.0 * tr.fraction_between, tr.peak_between, tr.faults_per_step.unwrap_or(f64::NAN),
        rec["decode_beam10_sent_per_s"].as_f64().unwrap_or(0.0), rec["decode_beam10_hyp_steps_per_s"].as_f64().unwrap_or(0.0), rec["decode_beam10_gflops_per_s"].as_f64().unwrap_or(0.0),
        rec["decode_greedy_sent_per_s"].as_f64().unwrap_or(0.0), rec["decode_greedy_hyp_steps_per_s"].as_f64().unwrap_or(0.0), rec["decode_greedy_gflops_per_s"].as_f64().unwrap_or(0.0),
        peak_rss_mib().unwrap_or(0.0)
    );
    if let Some(r) = rec["decode_beam10_int8_sent_per_s"].as_f64() {
        eprintln!(
            "decode with int8 products (translate --int8): beam 10 {r:.1} sent/s ({} hypothesis steps)",
            de.int8_rows
        );
    }
    Ok(rec)
}

/// GFLOP/s of the products at the model's shapes: the recurrent step's `[B, 2H] × [2H, 3H]` (context) and
/// `[B, H] × [H, 2H]` (state), with a row-major and a column-major right operand (the fused kernels choose
/// by `kernels::right_col_major`), packed and int8; decoding's products over 320 hypothesis rows; a weight
/// gradient and the readout's `[B·T, E] × [E, V]`.
fn step_gemms(cfg: &Config, v: usize, bsz: usize, tlen: usize) -> Result<serde_json::Value> {
    let (e_dim, h_dim) = (cfg.model.embedding_dim, cfg.model.hidden_dim);
    Ok(json!({
        "ctx_BxC": gemm_gflops(bsz, 2 * h_dim, 3 * h_dim, false)?,
        "ctx_BxC_colmajor": gemm_gflops(bsz, 2 * h_dim, 3 * h_dim, true)?,
        "state_BxU": gemm_gflops(bsz, h_dim, 2 * h_dim, false)?,
        "state_BxU_colmajor": gemm_gflops(bsz, h_dim, 2 * h_dim, true)?,
        "ctx_BxC_packed": packed_gemm_gflops(bsz, 2 * h_dim, 3 * h_dim)?,
        "state_BxU_packed": packed_gemm_gflops(bsz, h_dim, 2 * h_dim)?,
        "ctx_BxC_int8": int8_gemm_gops(bsz, 2 * h_dim, 3 * h_dim)?,
        "state_BxU_int8": int8_gemm_gops(bsz, h_dim, 2 * h_dim)?,
        "decode_320xHx3H_packed": packed_gemm_gflops(320, h_dim, 3 * h_dim)?,
        "decode_320xHx3H_int8": int8_gemm_gops(320, h_dim, 3 * h_dim)?,
        "decode_320xHx3H_int8_avx2": int8_avx2_gemm_gops(320, h_dim, 3 * h_dim)?,
        "decode_320xExV_packed": packed_gemm_gflops(320, e_dim, v)?,
        "decode_320xExV_int8": int8_gemm_gops(320, e_dim, v)?,
        "wgrad_HxTB_x_TBx3H": gemm_gflops(h_dim, bsz * tlen, 3 * h_dim, false)?,
        "readout_BTxV": gemm_gflops(bsz * tlen, e_dim, v, false)?,
    }))
}

/// The training measurements: medians over the timed steps.
struct TrainingTimes {
    step_s: f64,
    /// Forward, backward, optimiser update.
    phases_s: [f64; 3],
    tok_per_s: f64,
    gflops: f64,
    /// The SGEMM peak measured after each step, and the step's GFLOP/s as a fraction of it.
    peak_between: f64,
    fraction_between: f64,
    faults_per_step: Option<f64>,
    /// The last timed step's target tokens and target positions.
    tokens: usize,
    positions: usize,
    op_profile: serde_json::Value,
    packed_gemm_comparison: serde_json::Value,
    padding_comparison: serde_json::Value,
}

/// Time the training steps over `batches` (after one warm-up step), with the alternations and the op
/// profile that `opts` asks for.
fn training(
    cfg: &Config,
    v: usize,
    model: &Model,
    varmap: &candle_nn::VarMap,
    batches: &[Batch],
    opts: &BenchOptions,
) -> Result<TrainingTimes> {
    let vars = crate::train::sorted_vars(varmap);
    let mut opt = Optimizer::new(&cfg.train);
    // Each batch's model FLOPs over its words (padding is not work the model needs).
    let batch_flops: Vec<f64> = batches
        .iter()
        .map(|b| {
            let lens = |m: &Tensor| -> Result<Vec<usize>> {
                Ok(crate::model::mask_lengths(m)?.unwrap_or_default())
            };
            Ok(3.0 * batch_forward_flops(cfg, v, &lens(&b.src_mask)?, &lens(&b.tgt_mask)?))
        })
        .collect::<Result<_>>()?;
    // Seconds in forward, backward and optimiser update (with the configuration's label smoothing and
    // dropout, whose masks are drawn as update 0's at every step).
    let step = |b: &Batch, opt: &mut Optimizer, padding: TargetPadding| -> Result<[f64; 3]> {
        let s = Instant::now();
        let loss = model.loss_with(
            b,
            &crate::model::LossOptions {
                target_padding: padding,
                ..crate::model::LossOptions::of(&cfg.train, 0)
            },
        )?;
        let f = s.elapsed().as_secs_f64();
        let g = model.backward(&loss)?;
        let bw = s.elapsed().as_secs_f64() - f;
        opt.step(&vars, &g)?;
        Ok([f, bw, s.elapsed().as_secs_f64() - f - bw])
    };
    step(&batches[0], &mut opt, TargetPadding::Skipped)?; // warm-up
    crate::kernels::profile::reset();
    crate::kernels::profile::set_enabled(opts.profile_ops);
    let mut times = vec![];
    let mut phases: [Vec<f64>; 3] = [vec![], vec![], vec![]];
    let (mut toks, mut positions) = (0usize, 0usize);
    // With --compare-packed-gemm, odd steps use the general GEMM (reported apart).
    let mut general_times = vec![];
    let mut padded_times = vec![];
    // Each timed step's target tokens/s, GFLOP/s, and GFLOP/s as a fraction of the SGEMM peak measured
    // just after it.
    let (mut tok_rates, mut gflop_rates) = (vec![], vec![]);
    let (mut step_vs_peak, mut peaks_between) = (vec![], vec![]);
    // Each timed step's minor page faults: fresh pages cost a fault each, several microseconds here.
    let mut faults = vec![];
    let mut phase_sums = [0.0f64; 3];
    for (bi, b) in batches.iter().enumerate() {
        let general = opts.compare_packed_gemm && bi % 2 == 1;
        crate::kernels::set_packed_gemm(!general);
        let padded = opts.compare_target_padding && bi % 2 == 1;
        let f0 = minor_faults();
        let s = Instant::now();
        let p = step(
            b,
            &mut opt,
            if padded {
                TargetPadding::Computed
            } else {
                TargetPadding::Skipped
            },
        )?;
        let took = s.elapsed().as_secs_f64();
        if let (Some(a), Some(z)) = (f0, minor_faults()) {
            faults.push((z - a) as f64);
        }
        if general {
            general_times.push(took);
            continue;
        }
        if padded {
            padded_times.push(took);
            continue;
        }
        times.push(took);
        tok_rates.push(b.tgt_tokens as f64 / took);
        gflop_rates.push(batch_flops[bi] / took / 1e9);
        // The SGEMM peak right after this step (not inside the profiled or timed work).
        crate::kernels::profile::set_enabled(false);
        let peak_now = sgemm_gflops_once(2048)?;
        crate::kernels::profile::set_enabled(opts.profile_ops);
        step_vs_peak.push(batch_flops[bi] / took / 1e9 / peak_now);
        peaks_between.push(peak_now);
        for (a, x) in phase_sums.iter_mut().zip(p) {
            *a += x;
        }
        for (v, x) in phases.iter_mut().zip(p) {
            v.push(x);
        }
        toks = b.tgt_tokens;
        positions = b.tgt.elem_count();
    }
    crate::kernels::set_packed_gemm(true);
    crate::kernels::profile::set_enabled(false);
    let step_s = median(&mut times);
    let op_profile = if opts.profile_ops {
        op_profile(batches.len(), phase_sums)
    } else {
        serde_json::Value::Null
    };
    // An alternated comparison's record (null when it did not run): the default's steps (`times`) against
    // the other setting's, each named by its JSON key stem.
    let alternated = |what: &str, (kept, other): (&str, &str), other_times: &mut [f64]| {
        if other_times.is_empty() {
            return serde_json::Value::Null;
        }
        let other_s = median(other_times);
        eprintln!(
            "{what}, alternate steps: median {:.3} s against {:.3} s ({} and {} steps)",
            step_s,
            other_s,
            times.len(),
            other_times.len()
        );
        json!({format!("{kept}_step_s_median"): step_s, format!("{other}_step_s_median"): other_s,
               format!("{kept}_steps"): times.len(), format!("{other}_steps"): other_times.len()})
    };
    let packed_gemm_comparison = alternated(
        "packed micro-kernel against the general GEMM",
        ("packed", "general_gemm"),
        &mut general_times,
    );
    let padding_comparison = alternated(
        "target padding skipped against computed",
        ("skipped", "computed"),
        &mut padded_times,
    );
    Ok(TrainingTimes {
        step_s,
        phases_s: [
            median(&mut phases[0]),
            median(&mut phases[1]),
            median(&mut phases[2]),
        ],
        tok_per_s: median(&mut tok_rates),
        gflops: median(&mut gflop_rates),
        peak_between: median(&mut peaks_between),
        fraction_between: median(&mut step_vs_peak),
        faults_per_step: (!faults.is_empty()).then(|| median(&mut faults)),
        tokens: toks,
        positions,
        op_profile,
        packed_gemm_comparison,
        padding_comparison,
    })
}

/// `--profile-ops`: each fused op's mean seconds per training step over `steps` steps, by pass, and what the
/// forward and backward phases (their sums over the steps: `phase_sums`) spent outside the fused ops
/// (candle's graph and gradient store, composed ops). Printed and returned as JSON.
fn op_profile(steps: usize, phase_sums: [f64; 3]) -> serde_json::Value {
    let n = steps.max(1) as f64;
    let rows = crate::kernels::profile::totals();
    eprintln!("mean seconds per training step, by op and pass ({steps} steps):");
    for (name, s, calls) in &rows {
        eprintln!(
            "  {name:<32} {:>8.4} s  ({:.1} calls/step)",
            s / n,
            *calls as f64 / n
        );
    }
    let mut m: serde_json::Map<String, serde_json::Value> = rows
        .iter()
        .map(|(k, s, _)| (k.to_string(), json!(s / n)))
        .collect();
    for (pass, all) in [("forward", phase_sums[0]), ("backward", phase_sums[1])] {
        let ops: f64 = rows
            .iter()
            .filter(|(k, _, _)| !k.starts_with(' ') && k.ends_with(pass))
            .map(|(_, s, _)| s)
            .sum();
        let rest = (all - ops) / n;
        eprintln!(
            "  {:<32} {:>8.4} s",
            format!("{pass} outside the fused ops"),
            rest
        );
        m.insert(format!("{pass} outside the fused ops"), json!(rest));
    }
    serde_json::Value::Object(m)
}

/// The decoding measurements: median seconds over the repeats, and the hypothesis steps of one repeat.
struct DecodingTimes {
    beam_s: f64,
    greedy_s: f64,
    /// Beam 10 with int8 products, where they run (fused kernels on an AVX2 CPU).
    int8_s: Option<f64>,
    beam_rows: u64,
    greedy_rows: u64,
    int8_rows: u64,
}

/// Decode `src` `repeats` times: beam 10 as `translate` does (batches of 32, decoded concurrently), beam 10
/// with int8 products where they run, and greedily.
fn decoding(model: &Model, src: &[Vec<u32>], repeats: usize) -> Result<DecodingTimes> {
    let dec_batches: Vec<Vec<Vec<u32>>> = src.chunks(32).map(|c| c.to_vec()).collect();
    let mut beam_t = vec![];
    let mut greedy_t = vec![];
    let int8_on =
        crate::kernels::quantized_gemm::available() && model.kernels.ops_fused_on(&Device::Cpu);
    let mut int8_t = vec![];
    let (mut beam_rows, mut greedy_rows, mut int8_rows) = (0u64, 0u64, 0u64);
    let rows =
        || crate::decode::beam_search::DECODER_ROWS.load(std::sync::atomic::Ordering::Relaxed);
    for _ in 0..repeats.max(1) {
        let r0 = rows();
        let s = Instant::now();
        beam_search_batches(
            &[model],
            &dec_batches,
            None,
            0,
            &DecodeOptions {
                beam: 10,
                ..Default::default()
            },
            |_| {},
        )?;
        beam_t.push(s.elapsed().as_secs_f64());
        beam_rows = rows() - r0;
        if int8_on {
            let r0 = rows();
            let s = Instant::now();
            beam_search_batches(
                &[model],
                &dec_batches,
                None,
                0,
                &DecodeOptions {
                    beam: 10,
                    int8: true,
                    ..Default::default()
                },
                |_| {},
            )?;
            int8_t.push(s.elapsed().as_secs_f64());
            int8_rows = rows() - r0;
        }
        let r0 = rows();
        let s = Instant::now();
        for c in src.chunks(100) {
            greedy(model, c, 0, (1.0, 1.0))?;
        }
        greedy_t.push(s.elapsed().as_secs_f64());
        greedy_rows = rows() - r0;
    }
    Ok(DecodingTimes {
        beam_s: median(&mut beam_t),
        greedy_s: median(&mut greedy_t),
        int8_s: (!int8_t.is_empty()).then(|| median(&mut int8_t)),
        beam_rows,
        greedy_rows,
        int8_rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(decoder: &str) -> Config {
        Config::load(
            None,
            &[
                "model.embedding_dim=10".into(),
                "model.hidden_dim=20".into(),
                "model.attention_dim=30".into(),
                "model.context_gate=none".into(),
                format!("model.decoder={decoder}"),
            ],
        )
        .unwrap()
    }

    /// The reference batch's lengths as `torch_reference.py` builds them: its small batch has 963 target
    /// tokens (what it prints as `tgt_tokens/step`), every length lies in [len/2, len], and a batch's FLOPs
    /// over its words are the sum of its sentences'.
    #[test]
    fn reference_lengths_are_the_torch_batchs() {
        let l = reference_lengths(64, 20);
        assert_eq!(l.iter().map(|x| x.1).sum::<usize>(), 963);
        assert!(l
            .iter()
            .all(|&(s, t)| (10..=20).contains(&s) && (10..=20).contains(&t)));
        assert_eq!(l[0], (20, 20));
        assert_eq!(l[1], (19, 17));
        assert_eq!(l[4], (16, 19));
        let c = cfg("gru");
        let both = batch_forward_flops(&c, 50, &[7, 3], &[5, 9]);
        let one = |s, t| forward_flops(&c, 50, 1, s, t);
        assert!((both - one(7, 5) - one(3, 9)).abs() < 1e-6 * both);
        // Two sentences of the same lengths are the batch of two.
        let two = batch_forward_flops(&c, 50, &[7, 7], &[5, 5]);
        assert!((two - forward_flops(&c, 50, 2, 7, 5)).abs() < 1e-6 * two);
    }

    /// The transition's products per step: vanilla `e·H + 2H·H + H·H`, GRU three blocks of the same, cGRU
    /// the GRU's plus the word GRU's second recurrent product `H·3H` (multiply-adds, ×2 FLOPs).
    #[test]
    fn decoder_flops_count_each_decoders_products() {
        let (e, h) = (10.0, 20.0);
        let f = |d: &str| decoder_step_flops(&cfg(d), 50, 7);
        let vanilla = f("vanilla");
        let gru = f("gru");
        let cgru = f("cgru");
        assert!((gru - vanilla - 2.0 * (e + 3.0 * h) * 2.0 * h).abs() < 1e-6);
        assert!((cgru - gru - 2.0 * h * 3.0 * h).abs() < 1e-6);
        // The readout: 2 ((3H + E)·H + H/2·E + E·V); the attention: 2H·Ad + 3 Ad·S + 2 S·2H.
        let readout = 2.0 * ((3.0 * h + e) * h + h / 2.0 * e + e * 50.0);
        let att = 2.0 * h * 30.0 + 3.0 * 30.0 * 7.0 + 2.0 * 7.0 * 2.0 * h;
        assert!((vanilla - readout - att - 2.0 * (e + 3.0 * h) * h).abs() < 1e-6);
    }

    /// A deep model's extra products: each encoder layer above the first `2·(2·2H·3H + 2·H·3H)` per word, each
    /// later transition `2·H·3H` per step; a `-deep` size names that model.
    #[test]
    fn deep_models_count_their_extra_products() {
        let (h, s) = (20.0, 7.0);
        let deep = |set: &str| {
            let base = cfg("gru");
            let mut c = base.clone();
            let extra = Config::load(None, &[set.to_string()]).unwrap().model;
            c.model.encoder_layers = extra.encoder_layers;
            c.model.decoder_transition_depth = extra.decoder_transition_depth;
            c
        };
        let base = cfg("gru");
        let enc3 = deep("model.encoder_layers=3");
        let d = encoder_flops(&enc3, 1, 7) - encoder_flops(&base, 1, 7);
        assert!((d - 2.0 * 2.0 * (2.0 * 2.0 * h * 3.0 * h + 2.0 * h * 3.0 * h) * s).abs() < 1e-6);
        let dt3 = deep("model.decoder_transition_depth=3");
        let d = decoder_step_flops(&dt3, 50, 7) - decoder_step_flops(&base, 50, 7);
        assert!((d - 2.0 * 2.0 * h * 3.0 * h).abs() < 1e-6);
        let c = size_config("small-deep", &[]).unwrap();
        assert_eq!((c.model.hidden_dim, c.model.encoder_layers), (512, 2));
        assert_eq!(c.model.decoder_transition_depth, 2);
        assert_eq!(size_preset("paper-deep"), size_preset("paper"));
        assert!(size_config("huge-deep", &[]).is_err());
    }
}

/// The configuration `cgnmt bench` measures: the named size's (see [`size_preset`]) with Adam, then the
/// `sets` (`section.key=value`).
pub fn size_config(size: &str, sets: &[String]) -> Result<Config> {
    let (e, h, v, b, _) = size_preset(size).ok_or_else(|| {
        NmtError::Options(format!(
            "unknown size {size:?} (small, paper or tiny, or small-deep, paper-deep, tiny-deep)"
        ))
    })?;
    let mut all = vec![
        format!("model.embedding_dim={e}"),
        format!("model.hidden_dim={h}"),
        format!("model.attention_dim={h}"),
        format!("data.src_vocab_size={}", v - 2),
        format!("data.tgt_vocab_size={}", v - 2),
        format!("train.batch_size={b}"),
        "train.optimizer=adam".to_string(),
    ];
    all.extend(size_model_sets(size));
    all.extend(sets.iter().cloned());
    Config::load(None, &all)
}
