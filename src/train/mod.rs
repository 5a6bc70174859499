//! Training: data from a prepared directory, the paper's batching, fused optimiser with clipping, dev BLEU at
//! fixed intervals with best-model keeping and early stopping, resumable checkpoints.
//!
//! A run directory holds `best/` (model with the best dev BLEU), `last/` (the latest resumable checkpoint) and
//! `train.log` (JSON lines: periodic training loss and every evaluation).

pub mod averaging;
pub mod batcher;
pub mod checkpoint;
pub mod data_parallel;
pub mod optim;
pub mod selection;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Var};
use cgnmt_data::preprocess::Preprocessor;
use cgnmt_data::vocab::{Vocab, WordCounts};
use indicatif::{ProgressBar, ProgressStyle};

use crate::cluster::Cluster;
use crate::config::Config;
use crate::decode::beam_search::DecodeOptions;
use crate::decode::translate::Pipeline;
use crate::error::{NmtError, Result};
use crate::model::store;
use crate::model::{Batch, Model};
use crate::train::batcher::{epoch_batches, Corpus};
use crate::train::checkpoint::{EvalRecord, SaveRequest, TrainState};
use crate::train::optim::Optimizer;

/// The run's subdirectory with the parameters' moving average (`train.exponential_smoothing`).
pub const SMOOTHED_DIR: &str = "smoothed";

/// Rollbacks after divergence before training gives up (the learning rate is then 1/256 of the configured).
pub const MAX_ROLLBACKS: u64 = 8;

/// Test hook: `CGNMT_INJECT_NAN_AT=N` makes the loss of update N not a number, once per process (fault
/// injection for the divergence tests).
fn injected_nan(step: u64) -> bool {
    use std::sync::atomic::{AtomicBool, Ordering};
    static DONE: AtomicBool = AtomicBool::new(false);
    std::env::var("CGNMT_INJECT_NAN_AT")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        == Some(step)
        && !DONE.swap(true, Ordering::Relaxed)
}

/// Test hook: `CGNMT_INJECT_PANIC_AT=N` panics after update N on rank `CGNMT_INJECT_FAIL_RANK` (0 by default):
/// how a failing rank of an MPI job is tested.
fn injected_panic(rank: usize, step: u64) -> bool {
    let var = |k: &str| std::env::var(k).ok().and_then(|v| v.parse::<u64>().ok());
    var("CGNMT_INJECT_PANIC_AT") == Some(step)
        && var("CGNMT_INJECT_FAIL_RANK").unwrap_or(0) == rank as u64
}

/// Tokenised sentences of a prepared-data file (one per line, tokens separated by spaces).
pub fn read_tokenized(path: &Path) -> Result<Vec<Vec<String>>> {
    Ok(cgnmt_data::corpus::read_lines(path)?
        .into_iter()
        .map(|l| l.split_whitespace().map(str::to_string).collect())
        .collect())
}

/// Training data prepared for the model.
pub struct TrainData {
    pub corpus: Corpus,
    pub src_vocab: Vocab,
    pub tgt_vocab: Vocab,
    pub dev_src: Vec<String>,
    pub dev_ref: Vec<String>,
    /// Tokenised dev targets (for the dev loss), aligned with `dev_src`; empty when `dev.tgt` is absent.
    pub dev_tgt: Vec<String>,
    pub dropped_long: usize,
}

/// Load `data.prepared`: vocabularies of the K most frequent words (or the given ones on resume), training pairs
/// filtered by `data.max_len`, the dev set.
pub fn load_data(cfg: &Config, vocabs: Option<(Vocab, Vocab)>, quiet: bool) -> Result<TrainData> {
    let dir = &cfg.data.prepared;
    if !dir.is_dir() {
        return Err(NmtError::Data(format!(
            "data.prepared = {}: not a directory; create it with `cgnmt prepare`",
            dir.display()
        )));
    }
    let (src_vocab, tgt_vocab) = match vocabs {
        Some(v) => v,
        None => {
            let cs = WordCounts::load(&dir.join("counts.src"))?;
            let ct = WordCounts::load(&dir.join("counts.tgt"))?;
            let vs = Vocab::build(&cs, cfg.data.src_vocab_size);
            let vt = Vocab::build(&ct, cfg.data.tgt_vocab_size);
            if !quiet {
                eprintln!(
                    "vocabulary: source {} words cover {:.1}% of training tokens, target {} words cover {:.1}%",
                    vs.len() - 2,
                    100.0 * cgnmt_data::vocab::coverage(&vs, &cs),
                    vt.len() - 2,
                    100.0 * cgnmt_data::vocab::coverage(&vt, &ct)
                );
            }
            (vs, vt)
        }
    };
    let src = read_tokenized(&dir.join("train.src"))?;
    let tgt = read_tokenized(&dir.join("train.tgt"))?;
    if src.len() != tgt.len() {
        return Err(NmtError::Data(format!(
            "{}: train.src has {} lines but train.tgt has {}",
            dir.display(),
            src.len(),
            tgt.len()
        )));
    }
    let mut corpus = Corpus {
        src: vec![],
        tgt: vec![],
    };
    let mut dropped_long = 0;
    for (s, t) in src.iter().zip(&tgt) {
        if s.is_empty() || t.is_empty() {
            continue;
        }
        if s.len() > cfg.data.max_len || t.len() > cfg.data.max_len {
            dropped_long += 1;
            continue;
        }
        corpus.src.push(src_vocab.encode(s));
        corpus.tgt.push(tgt_vocab.encode(t));
        if cfg.data.limit > 0 && corpus.len() >= cfg.data.limit {
            break;
        }
    }
    if corpus.is_empty() {
        return Err(NmtError::Data(format!(
            "{}: no training pairs left after filtering",
            dir.display()
        )));
    }
    if !quiet {
        eprintln!(
            "training pairs: {} ({} dropped as longer than data.max_len = {})",
            corpus.len(),
            dropped_long,
            cfg.data.max_len
        );
    }
    let (dev_src, dev_ref, dev_tgt) =
        if dir.join("dev.src").is_file() && dir.join("dev.ref").is_file() {
            let mut s = cgnmt_data::corpus::read_lines(&dir.join("dev.src"))?;
            let mut r = cgnmt_data::corpus::read_lines(&dir.join("dev.ref"))?;
            let mut t = if dir.join("dev.tgt").is_file() {
                cgnmt_data::corpus::read_lines(&dir.join("dev.tgt"))?
            } else {
                vec![]
            };
            if !t.is_empty() && t.len() != s.len() {
                return Err(NmtError::Data(format!(
                    "{}: dev.src and dev.tgt differ in line count",
                    dir.display()
                )));
            }
            if s.len() != r.len() {
                return Err(NmtError::Data(format!(
                    "{}: dev.src and dev.ref differ in line count",
                    dir.display()
                )));
            }
            let n = cfg.train.eval_max_sentences;
            if n > 0 && s.len() > n {
                // An evenly spaced subset: dev sets are often sorted by length, and a prefix would hold only the
                // shortest sentences.
                let pick: Vec<usize> = (0..n).map(|k| k * s.len() / n).collect();
                s = pick.iter().map(|&i| s[i].clone()).collect();
                r = pick.iter().map(|&i| r[i].clone()).collect();
                if !t.is_empty() {
                    t = pick.iter().map(|&i| t[i].clone()).collect();
                }
            }
            (s, r, t)
        } else {
            (vec![], vec![], vec![])
        };
    Ok(TrainData {
        corpus,
        src_vocab,
        tgt_vocab,
        dev_src,
        dev_ref,
        dev_tgt,
        dropped_long,
    })
}

/// Case-insensitive BLEU as NIST mteval-v11b (the paper's metric) of detokenised hypotheses.
pub fn bleu_v11b(hyps: &[String], refs: &[String]) -> f64 {
    let opts = cgnmt_eval::bleu::BleuOptions::mteval_v11b();
    match cgnmt_eval::bleu::corpus_bleu(hyps, &[refs.to_vec()], &opts) {
        Ok(s) => s.score,
        Err(_) => 0.0,
    }
}

/// The dev scores of one evaluation (see `train.select_by`).
#[derive(Debug, Clone, Copy)]
pub struct DevScores {
    /// mteval-v11b BLEU (the paper's).
    pub bleu: f64,
    /// The same with sacreBLEU's `exp` smoothing of zero n-gram matches.
    pub bleu_smoothed: f64,
    /// chrF2.
    pub chrf: f64,
}

impl DevScores {
    /// The scores of detokenised hypotheses against one reference each.
    pub fn of(hyps: &[String], refs: &[String]) -> DevScores {
        let refs = [refs.to_vec()];
        let mut smoothed = cgnmt_eval::bleu::BleuOptions::mteval_v11b();
        smoothed.smooth = cgnmt_eval::bleu::Smooth::Exp;
        DevScores {
            bleu: bleu_v11b(hyps, &refs[0]),
            bleu_smoothed: cgnmt_eval::bleu::corpus_bleu(hyps, &refs, &smoothed)
                .map_or(0.0, |s| s.score),
            chrf: cgnmt_eval::chrf::corpus_chrf(
                hyps,
                &refs,
                &cgnmt_eval::chrf::ChrfOptions::chrf(),
            )
            .map_or(0.0, |s| s.score),
        }
    }

    /// The score `select_by` names.
    pub fn selected(&self, by: crate::config::SelectBy) -> f64 {
        match by {
            crate::config::SelectBy::Bleu => self.bleu,
            crate::config::SelectBy::SmoothedBleu => self.bleu_smoothed,
            crate::config::SelectBy::Chrf => self.chrf,
        }
    }
}

/// Dev scores with beam search.
pub fn evaluate(
    model: &Model,
    src_vocab: &Vocab,
    tgt_vocab: &Vocab,
    pre: &Preprocessor,
    dev_src: &[String],
    dev_ref: &[String],
    beam: usize,
) -> Result<DevScores> {
    evaluate_on(
        model,
        src_vocab,
        tgt_vocab,
        pre,
        dev_src,
        dev_ref,
        beam,
        &Cluster::single(),
    )
}

/// [`evaluate`] sharded over the ranks of a job: each rank decodes every N-th sentence, rank 0 scores the
/// whole set and every rank gets its scores (the same decisions everywhere).
#[allow(clippy::too_many_arguments)]
pub fn evaluate_on(
    model: &Model,
    src_vocab: &Vocab,
    tgt_vocab: &Vocab,
    pre: &Preprocessor,
    dev_src: &[String],
    dev_ref: &[String],
    beam: usize,
    cluster: &Cluster,
) -> Result<DevScores> {
    let tr = Pipeline {
        model,
        others: vec![],
        src_vocab,
        tgt_vocab,
        preprocess: pre,
    };
    let opts = DecodeOptions {
        beam,
        ..Default::default()
    };
    let mine = cluster.share(dev_src.len());
    let lines: Vec<String> = mine.iter().map(|&i| dev_src[i].clone()).collect();
    let out = tr.translate(&lines, &opts, 32, true, |_| {})?;
    let hyps: Vec<String> = out.into_iter().map(|t| t.text).collect();
    if cluster.size() == 1 {
        return Ok(DevScores::of(&hyps, dev_ref));
    }
    let mut scores = [0f64; 3];
    if let Some(all) = cluster.gather(hyps.join("\n").into_bytes()) {
        // Rank r decoded lines r, r + N, r + 2N, …
        let mut whole = vec![String::new(); dev_src.len()];
        for (r, bytes) in all.iter().enumerate() {
            let text = String::from_utf8_lossy(bytes);
            let theirs: Vec<&str> = if text.is_empty() {
                vec![]
            } else {
                text.split('\n').collect()
            };
            for (k, h) in theirs.into_iter().enumerate() {
                whole[r + k * cluster.size()] = h.to_string();
            }
        }
        let s = DevScores::of(&whole, dev_ref);
        scores = [s.bleu, s.bleu_smoothed, s.chrf];
    }
    cluster.broadcast_f64(&mut scores);
    Ok(DevScores {
        bleu: scores[0],
        bleu_smoothed: scores[1],
        chrf: scores[2],
    })
}

/// Mean per-token loss (EOS included) on tokenised pairs; over the ranks of a job, each computes every N-th
/// batch of 64.
pub fn corpus_loss(
    model: &Model,
    src_vocab: &Vocab,
    tgt_vocab: &Vocab,
    src: &[String],
    tgt: &[String],
    cluster: &Cluster,
) -> Result<f64> {
    let (mut total, mut tokens) = (0.0f64, 0usize);
    let enc = |v: &Vocab, l: &String| v.encode(&l.split_whitespace().collect::<Vec<_>>());
    let pairs: Vec<(Vec<u32>, Vec<u32>)> = src
        .iter()
        .zip(tgt)
        .map(|(s, t)| (enc(src_vocab, s), enc(tgt_vocab, t)))
        .filter(|(s, t)| !s.is_empty() && !t.is_empty())
        .collect();
    let chunks: Vec<&[(Vec<u32>, Vec<u32>)]> = pairs.chunks(64).collect();
    for k in cluster.share(chunks.len()) {
        let chunk = chunks[k];
        let s: Vec<Vec<u32>> = chunk.iter().map(|p| p.0.clone()).collect();
        let t: Vec<Vec<u32>> = chunk.iter().map(|p| p.1.clone()).collect();
        let b = Batch::new(&s, &t, tgt_vocab.eos(), DType::F32, &Device::Cpu)?;
        total += model.loss(&b)?.to_scalar::<f32>()? as f64 * s.len() as f64;
        tokens += b.tgt_tokens;
    }
    let mut sums = [total, tokens as f64];
    cluster.sum_f64(&mut sums);
    let (total, tokens) = (sums[0], sums[1]);
    Ok(if tokens > 0.0 {
        total / tokens
    } else {
        f64::NAN
    })
}

pub struct TrainSummary {
    pub state: TrainState,
    pub run_dir: PathBuf,
    pub params: usize,
}

/// Train into `run_dir`. With `resume`, continue from `run_dir/last` (configuration, weights, optimiser state,
/// data position) with the given overrides applied to its configuration.
pub fn train(cfg: Config, run_dir: &Path, resume: bool, quiet: bool) -> Result<TrainSummary> {
    train_on(cfg, run_dir, resume, quiet, &Cluster::single(), None)
}

/// [`train`] that another thread can stop: once `stop` is set, the run saves its checkpoint after the update
/// in progress (`last/`, resumable) and returns [`NmtError::Interrupted`].
pub fn train_until(
    cfg: Config,
    run_dir: &Path,
    resume: bool,
    quiet: bool,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<TrainSummary> {
    train_on(cfg, run_dir, resume, quiet, &Cluster::single(), Some(stop))
}

/// [`train`] as one rank of an MPI job (`mpiexec -n N cgnmt train …`): synchronous data parallelism. Rank 0's
/// initial parameters go to every rank; each update, every rank computes the gradient of its share of the
/// global batch (`train.batch_size` stays the global batch: every N-th sentence of it, by position), the shares'
/// gradients (weighted by their share of the batch), losses and token counts are summed over the ranks, and
/// every rank takes the same optimiser step. Every evaluation compares a checksum of every rank's parameters
/// (a difference is an error naming the update). Rank 0 alone writes the log and the checkpoints; each rank
/// decodes a share of dev and all get rank 0's scores (the same decisions everywhere). The data position is
/// global, so a run resumes at any N (see [`data_parallel`]).
pub fn train_on(
    cfg: Config,
    run_dir: &Path,
    resume: bool,
    quiet: bool,
    cluster: &Cluster,
    stop: Option<&std::sync::atomic::AtomicBool>,
) -> Result<TrainSummary> {
    let quiet = quiet || cluster.rank() > 0;
    let writer = cluster.rank() == 0;
    let dev = Device::Cpu;
    let dtype = DType::F32;
    let last_dir = run_dir.join("last");
    let best_dir = run_dir.join("best");
    let Opened {
        cfg,
        model,
        varmap,
        mut opt,
        mut state,
        data,
    } = open_run(cfg, run_dir, resume, quiet, dtype, &dev)?;
    std::fs::create_dir_all(run_dir).map_err(|e| NmtError::io(run_dir, e))?;
    let pre = Preprocessor::load(&cfg.data.prepared)?;
    let vars = sorted_vars(&varmap);
    // Every rank has passed its checks of the run directory before rank 0 writes anything.
    data_parallel::start_from_rank_0(&vars, cluster)?;
    let mut exchange = data_parallel::Exchange::new(&vars, &model.row_sparse_parameters());
    let params = crate::model::init::count(&varmap);
    if !quiet {
        eprintln!(
            "model: {params} parameters; run directory {}",
            run_dir.display()
        );
    }
    let log_path = run_dir.join("train.log");
    let mut log = open_log(&log_path, writer)?;
    let tc = cfg.train.clone();
    let pb = progress_bar(&tc, &data.corpus, quiet, state.step);
    let start = Instant::now();
    let base_seconds = state.seconds;
    // The training-loss window (and the last window's mean) go on across a resume, so the log and the dev
    // history of a resumed run are the uninterrupted run's.
    let mut loss_acc = (state.loss_window.0, state.loss_window.1 as usize);
    let mut tok_acc = (0usize, Instant::now());
    let mut last_loss = state.last_train_loss.unwrap_or(f64::NAN);
    let saver = Saver {
        cfg: &cfg,
        varmap: &varmap,
        data: &data,
        run_dir,
        writer,
    };
    let save = |state: &TrainState, opt: &Optimizer, dir: &Path, with_train: bool| {
        saver.save(state, opt, dir, with_train)
    };
    // Dev BLEU, keeping the best model; true when patience is exhausted.
    let evaluate = |state: &mut TrainState,
                    opt: &Optimizer,
                    log: &mut std::fs::File,
                    last_loss: f64|
     -> Result<bool> {
        eval_and_keep(
            &model.frozen(&varmap)?,
            &data,
            &pre,
            &tc,
            state,
            last_loss,
            &pb,
            log,
            &log_path,
            &save,
            opt,
            quiet,
            cluster,
        )
    };
    let stop_reason;
    let rollback = tc.on_divergence == crate::config::OnDivergence::Rollback;
    if rollback && store::complete_dir(&last_dir).is_none() {
        // Something to roll back to before the first evaluation.
        save(&state, &opt, &last_dir, true)?;
    }
    'outer: loop {
        if tc.max_epochs > 0 && state.epoch >= tc.max_epochs as u64 {
            stop_reason = format!("reached train.max_epochs = {}", tc.max_epochs);
            break;
        }
        let batches = epoch_batches(
            &data.corpus,
            tc.batch_size,
            tc.sort_batches,
            tc.seed,
            state.epoch,
        );
        while (state.batch_in_epoch as usize) < batches.len() {
            let all = &batches[state.batch_in_epoch as usize];
            let step = Step {
                model: &model,
                cfg: &cfg,
                data: &data,
                vars: &vars,
                cluster,
                dtype,
                dev: &dev,
            };
            let (lv, tokens, diverged) = step.update(all, state.step, &mut opt, &mut exchange)?;
            if let Some(what) = diverged {
                let at = state.step + 1;
                let to =
                    step.roll_back(&last_dir, rollback, &what, &mut state, &mut opt, &pb, quiet)?;
                writeln!(
                    log,
                    "{}",
                    serde_json::json!({"rollback": at, "reason": what, "to_step": to,
                        "lr_scale": state.lr_scale})
                )
                .map_err(|e| NmtError::io(&log_path, e))?;
                pb.set_position(state.step);
                continue 'outer;
            }
            state.step += 1;
            state.batch_in_epoch += 1;
            if injected_panic(cluster.rank(), state.step) {
                panic!("injected panic after update {}", state.step);
            }
            state.seconds = base_seconds + start.elapsed().as_secs_f64();
            loss_acc.0 += lv * all.len() as f64;
            loss_acc.1 += tokens as usize;
            tok_acc.0 += tokens as usize;
            pb.inc(1);
            if state.step % 10 == 0 {
                // In an MPI job, rank 0's seconds per update in its own work, waiting and exchanging.
                let data_parallel = (cluster.size() > 1)
                    .then(|| serde_json::Value::from(exchange.stats.take().per_update_json()));
                last_loss = log_window(
                    &mut log,
                    &log_path,
                    &pb,
                    &state,
                    (&mut loss_acc, &mut tok_acc),
                    data_parallel,
                )?;
            }
            state.loss_window = (loss_acc.0, loss_acc.1 as u64);
            state.last_train_loss = last_loss.is_finite().then_some(last_loss);
            let at_limit = (tc.max_steps > 0 && state.step >= tc.max_steps as u64)
                || (tc.max_seconds > 0.0 && state.seconds >= tc.max_seconds);
            if cluster.size() > 1 && tc.eval_every > 0 && state.step % tc.eval_every as u64 == 0 {
                log_ranks_agree(&mut log, &log_path, &vars, cluster, state.step)?;
            }
            if tc.eval_every > 0 && state.step % tc.eval_every as u64 == 0 && !at_limit {
                if evaluate(&mut state, &opt, &mut log, last_loss)? {
                    stop_reason = format!("no dev BLEU improvement in {} evaluations", tc.patience);
                    break 'outer;
                }
                save(&state, &opt, &last_dir, true)?;
            } else if tc.save_every > 0 && state.step % tc.save_every as u64 == 0 {
                save(&state, &opt, &last_dir, true)?;
            }
            if at_limit {
                stop_reason = limit_reason(&tc, &state);
                break 'outer;
            }
            if stop.is_some_and(|s| s.load(std::sync::atomic::Ordering::Relaxed)) {
                pb.finish_and_clear();
                save(&state, &opt, &last_dir, true)?;
                return Err(NmtError::Interrupted(format!(
                    "training stopped after update {}; its checkpoint is in {} (resume to continue)",
                    state.step,
                    last_dir.display()
                )));
            }
        }
        state.epoch += 1;
        state.batch_in_epoch = 0;
    }
    pb.finish_and_clear();
    // Final evaluation unless this step was just evaluated.
    if state.history.last().map(|h| h.step) != Some(state.step) {
        evaluate(&mut state, &opt, &mut log, last_loss)?;
    }
    if cluster.size() > 1 {
        log_ranks_agree(&mut log, &log_path, &vars, cluster, state.step)?;
    }
    state.finished = true;
    saver.finish(&state, &opt, &vars)?;
    if !quiet {
        eprintln!("{}", stopped(&state, &stop_reason, &best_dir));
    }
    Ok(TrainSummary {
        state,
        run_dir: run_dir.to_path_buf(),
        params,
    })
}

/// Where and what a run saves (rank 0 alone writes).
struct Saver<'a> {
    cfg: &'a Config,
    varmap: &'a candle_nn::VarMap,
    data: &'a TrainData,
    run_dir: &'a Path,
    writer: bool,
}

impl Saver<'_> {
    /// Save the model into `dir`, with the optimiser and the training state (`with_train`: a resumable
    /// checkpoint) or without. Each save into `last/` also keeps a model-only `ckpt-NNNNNNN/`, as many as
    /// `train.keep_checkpoints` says.
    fn save(
        &self,
        state: &TrainState,
        opt: &Optimizer,
        dir: &Path,
        with_train: bool,
    ) -> Result<()> {
        if !self.writer {
            return Ok(());
        }
        let cfg = self.cfg;
        let request = |with_train: bool| SaveRequest {
            config: cfg,
            varmap: self.varmap,
            src_vocab: &self.data.src_vocab,
            tgt_vocab: &self.data.tgt_vocab,
            preprocess_dir: &cfg.data.prepared,
            optimizer: if with_train { Some(opt) } else { None },
            state: if with_train { Some(state) } else { None },
        };
        checkpoint::save(dir, &request(with_train))?;
        if dir == self.run_dir.join("last") && cfg.train.keep_checkpoints > 0 {
            checkpoint::save(
                &self.run_dir.join(format!("ckpt-{:07}", state.step)),
                &request(false),
            )?;
            checkpoint::prune_kept(self.run_dir, cfg.train.keep_checkpoints)?;
        }
        Ok(())
    }

    /// The finished run's saves: `last/`, `best/` when no evaluation made one, and the moving average's
    /// model (`smoothed/`) when the run keeps one.
    fn finish(&self, state: &TrainState, opt: &Optimizer, vars: &[(String, Var)]) -> Result<()> {
        self.save(state, opt, &self.run_dir.join("last"), true)?;
        let best_dir = self.run_dir.join("best");
        if !best_dir.exists() {
            self.save(state, opt, &best_dir, false)?;
        }
        if self.writer && !opt.smoothed.is_empty() {
            let dir = self.run_dir.join(SMOOTHED_DIR);
            save_smoothed(
                &dir,
                self.cfg,
                self.data,
                vars,
                opt,
                DType::F32,
                &Device::Cpu,
            )?;
        }
        Ok(())
    }
}

/// What a run starts from: a fresh model, or the last checkpoint's model, optimiser and state.
struct Opened {
    cfg: Config,
    model: Model,
    varmap: candle_nn::VarMap,
    opt: Optimizer,
    state: TrainState,
    data: TrainData,
}

/// Build a fresh model for `run_dir` (which must not hold a run), or with `resume` load its last complete
/// checkpoint (its configuration is `cfg`, the resumed one with the overrides applied).
fn open_run(
    cfg: Config,
    run_dir: &Path,
    resume: bool,
    quiet: bool,
    dtype: DType,
    dev: &Device,
) -> Result<Opened> {
    let last_dir = run_dir.join("last");
    if resume {
        let dir = store::complete_dir(&last_dir).ok_or_else(|| {
            NmtError::model_dir(
                &last_dir,
                "no complete checkpoint to resume from (run `cgnmt train` without --resume)",
            )
        })?;
        let lm = store::load(&dir, dtype, dev)?;
        let mut opt = Optimizer::new(&cfg.train);
        checkpoint::load_optimizer(&mut opt, &dir.join(checkpoint::OPTIM_FILE))?;
        let state = checkpoint::load_state(&dir)?;
        opt.scale_learning_rate(state.lr_scale);
        let data = load_data(&cfg, Some((lm.src_vocab, lm.tgt_vocab)), quiet)?;
        return Ok(Opened {
            cfg,
            model: lm.model,
            varmap: lm.varmap,
            opt,
            state,
            data,
        });
    }
    // (`last.old` alone: killed between the two renames of a save; it is the checkpoint to resume.)
    if last_dir.exists() || store::complete_dir(&last_dir).is_some() {
        return Err(NmtError::model_dir(
            run_dir,
            "already holds a training run (last/); use --resume to continue it or choose another --out",
        ));
    }
    let data = load_data(&cfg, None, quiet)?;
    let (model, varmap) = Model::build(
        &cfg.model,
        data.src_vocab.len(),
        data.tgt_vocab.len(),
        cfg.train.seed,
        dtype,
        dev,
    )?;
    Ok(Opened {
        opt: Optimizer::new(&cfg.train),
        cfg,
        model,
        varmap,
        state: TrainState::default(),
        data,
    })
}

/// The model's variables sorted by name (the order every rank sums and checks them in).
pub(crate) fn sorted_vars(varmap: &candle_nn::VarMap) -> Vec<(String, Var)> {
    let mut vars: Vec<(String, Var)> = varmap
        .data()
        .lock()
        .expect("varmap")
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars
}

/// The training log, appended to (ranks other than 0 log nowhere).
fn open_log(log_path: &Path, writer: bool) -> Result<std::fs::File> {
    let log_file = if writer {
        log_path.to_path_buf()
    } else {
        PathBuf::from("/dev/null")
    };
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_file)
        .map_err(|e| NmtError::io(&log_file, e))
}

/// The progress bar over the run's updates (a spinner when neither a step nor an epoch limit is set).
fn progress_bar(
    tc: &crate::config::TrainConfig,
    corpus: &Corpus,
    quiet: bool,
    at: u64,
) -> ProgressBar {
    let batches_per_epoch =
        epoch_batches(corpus, tc.batch_size, tc.sort_batches, tc.seed, 0).len() as u64;
    let total = if tc.max_steps > 0 {
        tc.max_steps as u64
    } else if tc.max_epochs > 0 {
        tc.max_epochs as u64 * batches_per_epoch
    } else {
        0
    };
    let pb = if quiet {
        ProgressBar::hidden()
    } else if total > 0 {
        ProgressBar::new(total)
    } else {
        ProgressBar::new_spinner()
    };
    pb.set_style(
        ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} steps (ETA {eta}) {msg}",
        )
        .expect("template"),
    );
    pb.set_position(at);
    pb
}

/// What one update reads: the model and its variables, the data, and this process's place in the job.
struct Step<'a> {
    model: &'a Model,
    cfg: &'a Config,
    data: &'a TrainData,
    vars: &'a [(String, Var)],
    cluster: &'a Cluster,
    dtype: DType,
    dev: &'a Device,
}

impl Step<'_> {
    /// One update on the global batch `all` (sentence indices) after `step` updates: this rank's share's
    /// loss and gradient, summed over the ranks, and the optimiser's step. Returns the batch's loss per
    /// target token (summed over the ranks' weighted shares), its target tokens and, when the loss or the
    /// gradient norm is not finite (no step is then taken), what diverged.
    fn update(
        &self,
        all: &[usize],
        step: u64,
        opt: &mut Optimizer,
        exchange: &mut data_parallel::Exchange,
    ) -> Result<(f64, f64, Option<String>)> {
        let (data, cluster) = (self.data, self.cluster);
        // This rank's share of the global batch (all of it in one process).
        let idx: Vec<usize> = cluster.share(all.len()).iter().map(|&k| all[k]).collect();
        let weight = idx.len() as f64 / all.len() as f64;
        let srcs: Vec<Vec<u32>> = idx.iter().map(|&i| data.corpus.src[i].clone()).collect();
        let tgts: Vec<Vec<u32>> = idx.iter().map(|&i| data.corpus.tgt[i].clone()).collect();
        let computing = Instant::now();
        let (loss, mut lv, mut tokens) = if idx.is_empty() {
            (None, 0.0, 0.0)
        } else {
            // Each sentence's key is its corpus index: its dropout masks are the same at any number of ranks.
            let keys: Vec<u64> = idx.iter().map(|&i| i as u64).collect();
            let batch = Batch::keyed(
                &srcs,
                &tgts,
                &keys,
                data.tgt_vocab.eos(),
                self.dtype,
                self.dev,
            )?;
            let loss = self.model.loss_with(
                &batch,
                &crate::model::LossOptions::of(&self.cfg.train, step),
            )?;
            let lv = loss.to_scalar::<f32>()? as f64;
            (Some(loss), lv, batch.tgt_tokens as f64)
        };
        exchange.stats.compute_s += computing.elapsed().as_secs_f64();
        if cluster.size() > 1 {
            // (Mostly waiting for the slowest rank's forward pass: the sum is two numbers.)
            let waiting = Instant::now();
            let mut sums = [lv * weight, tokens];
            cluster.sum_f64(&mut sums);
            (lv, tokens) = (sums[0], sums[1]);
            exchange.stats.wait_s += waiting.elapsed().as_secs_f64();
        }
        if injected_nan(step + 1) {
            lv = f64::NAN;
        }
        if !lv.is_finite() {
            return Ok((lv, tokens, Some(format!("loss {lv}"))));
        }
        let computing = Instant::now();
        let grads = match &loss {
            Some(l) => Some(self.model.backward(l)?),
            None => None,
        };
        exchange.stats.compute_s += computing.elapsed().as_secs_f64();
        let grads = if cluster.size() > 1 {
            exchange.wait_for_all(cluster);
            exchange.sum_gradients(self.vars, grads, weight as f32, cluster)?
        } else {
            grads.expect("one process has the whole batch")
        };
        let norm = opt.step(self.vars, &grads)?;
        Ok((
            lv,
            tokens,
            (!norm.is_finite()).then(|| format!("gradient norm {norm}")),
        ))
    }

    /// After a divergence (`what`) at the next update: back to the last checkpoint (weights, optimiser,
    /// data position) with half the learning rate, where `rollback` is on, a checkpoint exists and fewer
    /// than [`MAX_ROLLBACKS`] were made; otherwise an error naming the update and what is intact. Returns
    /// the update it rolled back to.
    #[allow(clippy::too_many_arguments)]
    fn roll_back(
        &self,
        last_dir: &Path,
        rollback: bool,
        what: &str,
        state: &mut TrainState,
        opt: &mut Optimizer,
        pb: &ProgressBar,
        quiet: bool,
    ) -> Result<u64> {
        let at = state.step + 1;
        let last = store::complete_dir(last_dir);
        let kept = match &last {
            Some(d) => format!(
                "the last checkpoint ({}, update {}) is intact",
                d.display(),
                checkpoint::load_state(d).map(|s| s.step).unwrap_or(0)
            ),
            None => "no checkpoint was written yet".into(),
        };
        let (Some(dir), true) = (last, rollback && state.rollbacks < MAX_ROLLBACKS) else {
            pb.finish_and_clear();
            return Err(NmtError::Data(format!(
                "training diverged at update {at}: {what}; {kept}{}",
                if rollback {
                    format!(" (after {} rollbacks)", state.rollbacks)
                } else {
                    "; resume it with a lower train.learning_rate, or set \
                     train.on_divergence = \"rollback\""
                        .into()
                }
            )));
        };
        let weights = candle_core::safetensors::load(dir.join(store::WEIGHTS_FILE), self.dev)?;
        for (name, var) in self.vars {
            let w = weights.get(name).ok_or_else(|| {
                NmtError::model_dir(&dir, format!("{name} missing from the checkpoint"))
            })?;
            var.set(&w.to_dtype(self.dtype)?)?;
        }
        let (seconds, rollbacks, scale) =
            (state.seconds, state.rollbacks + 1, state.lr_scale * 0.5);
        *state = checkpoint::load_state(&dir)?;
        state.seconds = seconds;
        state.rollbacks = rollbacks;
        state.lr_scale = scale;
        state.finished = false;
        *opt = Optimizer::new(&self.cfg.train);
        checkpoint::load_optimizer(opt, &dir.join(checkpoint::OPTIM_FILE))?;
        opt.scale_learning_rate(scale);
        let msg = format!(
            "update {at}: {what}; rolled back to update {} with learning rate × {scale}",
            state.step
        );
        if !quiet {
            pb.suspend(|| eprintln!("warning: {msg}"));
        }
        Ok(state.step)
    }
}

/// The training-loss window's line of the log (and the progress bar's message): the mean loss per target
/// token since the last line and the target tokens per second, with `data_parallel`'s timings in an MPI
/// job. Starts the next window; returns the loss.
fn log_window(
    log: &mut std::fs::File,
    log_path: &Path,
    pb: &ProgressBar,
    state: &TrainState,
    (loss_acc, tok_acc): (&mut (f64, usize), &mut (usize, Instant)),
    data_parallel: Option<serde_json::Value>,
) -> Result<f64> {
    let el = tok_acc.1.elapsed().as_secs_f64();
    let tps = tok_acc.0 as f64 / el.max(1e-9);
    let last_loss = loss_acc.0 / loss_acc.1.max(1) as f64;
    pb.set_message(format!(
        "loss/token {last_loss:.3} | {tps:.0} tgt tok/s | epoch {}",
        state.epoch + 1
    ));
    let mut line = serde_json::json!({"step": state.step, "epoch": state.epoch,
        "seconds": state.seconds, "loss_per_token": last_loss, "tgt_tok_per_s": tps});
    if let Some(dp) = data_parallel {
        line["data_parallel"] = dp;
    }
    writeln!(log, "{line}").map_err(|e| NmtError::io(log_path, e))?;
    *loss_acc = (0.0, 0);
    *tok_acc = (0, Instant::now());
    Ok(last_loss)
}

/// The line that ends a run: why it stopped, and its best model.
fn stopped(state: &TrainState, why: &str, best_dir: &Path) -> String {
    format!(
        "stopped after {} steps ({:.0} s): {why}; best dev BLEU {} at step {}; best model in {}",
        state.step,
        state.seconds,
        state
            .best_bleu
            .map(|b| format!("{b:.2}"))
            .unwrap_or_else(|| "n/a".into()),
        state.best_step,
        best_dir.display()
    )
}

/// Why a run that reached its update or time limit stopped.
fn limit_reason(tc: &crate::config::TrainConfig, state: &TrainState) -> String {
    if tc.max_steps > 0 && state.step >= tc.max_steps as u64 {
        format!("reached train.max_steps = {}", tc.max_steps)
    } else if tc.max_steps > 0 {
        format!(
            "reached train.max_seconds = {} at update {} of train.max_steps = {} ({:.0}%): the \
             model is less trained than planned; `--resume` with a larger cap finishes it",
            tc.max_seconds,
            state.step,
            tc.max_steps,
            100.0 * state.step as f64 / tc.max_steps as f64
        )
    } else {
        format!("reached train.max_seconds = {}", tc.max_seconds)
    }
}

/// In an MPI job: every rank's parameters compared by checksum (an error names the update), logged.
fn log_ranks_agree(
    log: &mut std::fs::File,
    log_path: &Path,
    vars: &[(String, Var)],
    cluster: &Cluster,
    step: u64,
) -> Result<()> {
    let c = data_parallel::check_in_step(vars, cluster, step)?;
    writeln!(
        log,
        "{}",
        serde_json::json!({"ranks_agree": step, "ranks": cluster.size(), "parameter_checksum": c})
    )
    .map_err(|e| NmtError::io(log_path, e))
}

/// The parameters' moving average as a model of its own (in `dir`), a candidate for selection on dev.
fn save_smoothed(
    dir: &Path,
    cfg: &Config,
    data: &TrainData,
    vars: &[(String, Var)],
    opt: &Optimizer,
    dtype: DType,
    dev: &Device,
) -> Result<()> {
    let smoothed = candle_nn::VarMap::new();
    {
        let mut d = smoothed.data().lock().expect("varmap");
        for (name, var) in vars {
            let avg = opt.smoothed.get(name).ok_or_else(|| {
                NmtError::Data(format!("the moving average lacks parameter {name}"))
            })?;
            let t = candle_core::Tensor::from_slice(avg, var.shape(), dev)?.to_dtype(dtype)?;
            d.insert(name.clone(), Var::from_tensor(&t)?);
        }
    }
    checkpoint::save(
        dir,
        &SaveRequest {
            config: cfg,
            varmap: &smoothed,
            src_vocab: &data.src_vocab,
            tgt_vocab: &data.tgt_vocab,
            preprocess_dir: &cfg.data.prepared,
            optimizer: None,
            state: None,
        },
    )
}

/// Evaluate dev BLEU, keep the best model; returns true when patience is exhausted.
#[allow(clippy::too_many_arguments)]
fn eval_and_keep(
    model: &Model,
    data: &TrainData,
    pre: &Preprocessor,
    tc: &crate::config::TrainConfig,
    state: &mut TrainState,
    train_loss: f64,
    pb: &ProgressBar,
    log: &mut std::fs::File,
    log_path: &Path,
    save: &dyn Fn(&TrainState, &Optimizer, &Path, bool) -> Result<()>,
    opt: &Optimizer,
    quiet: bool,
    cluster: &Cluster,
) -> Result<bool> {
    if data.dev_src.is_empty() {
        return Ok(false);
    }
    pb.set_message(format!(
        "evaluating dev BLEU on {} sentences",
        data.dev_src.len()
    ));
    let scores = evaluate_on(
        model,
        &data.src_vocab,
        &data.tgt_vocab,
        pre,
        &data.dev_src,
        &data.dev_ref,
        tc.eval_beam,
        cluster,
    )?;
    let bleu = scores.bleu;
    let dev_loss = if data.dev_tgt.is_empty() {
        None
    } else {
        Some(corpus_loss(
            model,
            &data.src_vocab,
            &data.tgt_vocab,
            &data.dev_src,
            &data.dev_tgt,
            cluster,
        )?)
    };
    let rec = EvalRecord {
        step: state.step,
        epoch: state.epoch,
        seconds: state.seconds,
        train_loss,
        dev_bleu: bleu,
        dev_bleu_smoothed: Some(scores.bleu_smoothed),
        dev_chrf: Some(scores.chrf),
    };
    writeln!(
        log,
        "{}",
        serde_json::json!({"eval": rec.step, "epoch": rec.epoch, "seconds": rec.seconds,
        "loss_per_token": dev_loss, "train_loss_per_token": train_loss, "dev_bleu": bleu,
        "dev_bleu_smoothed": scores.bleu_smoothed, "dev_chrf": scores.chrf})
    )
    .map_err(|e| NmtError::io(log_path, e))?;
    state.history.push(rec);
    let by = tc.select_by;
    let score = scores.selected(by);
    let best = state
        .best_selection
        .or(if by == crate::config::SelectBy::Bleu {
            state.best_bleu
        } else {
            None
        });
    let improved = best.map(|b| score > b).unwrap_or(true);
    let line = format!(
        "step {}: dev BLEU {bleu:.2}{}{}{}",
        state.step,
        match by {
            crate::config::SelectBy::Bleu => String::new(),
            crate::config::SelectBy::SmoothedBleu => format!(", smoothed BLEU {score:.2}"),
            crate::config::SelectBy::Chrf => format!(", chrF {score:.2}"),
        },
        dev_loss
            .map(|l| format!(", dev loss/token {l:.3}"))
            .unwrap_or_default(),
        if improved { " (best so far)" } else { "" }
    );
    // A hidden bar (no terminal, or --quiet) prints nothing; messages must still reach the log reader.
    if !quiet {
        if pb.is_hidden() {
            eprintln!("{line}");
        } else {
            pb.println(line);
        }
    }
    if improved {
        state.best_bleu = Some(bleu);
        state.best_selection = Some(score);
        state.best_step = state.step;
        state.evals_without_improvement = 0;
        let best = log_path.parent().expect("run dir").join("best");
        save(state, opt, &best, false)?;
    } else {
        state.evals_without_improvement += 1;
    }
    Ok(tc.patience > 0 && state.evals_without_improvement >= tc.patience as u64)
}
