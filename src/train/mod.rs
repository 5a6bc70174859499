//! Training: data from a prepared directory, the paper's batching, fused optimiser with clipping, dev BLEU at
//! fixed intervals with best-model keeping and early stopping, resumable checkpoints.
//!
//! A run directory holds `best/` (model with the best dev BLEU), `last/` (the latest resumable checkpoint) and
//! `train.log` (JSON lines: periodic training loss and every evaluation).

pub mod averaging;
pub mod batcher;
pub mod checkpoint;
pub mod data;
pub mod data_parallel;
pub mod evaluation;
pub mod guided_alignment;
pub mod optim;
pub mod schedule;
pub mod selection;
pub mod word_aligner;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Var};
use cgnmt_data::preprocess::Preprocessor;
use cgnmt_data::vocab::{Vocab, WordCounts};
use indicatif::{ProgressBar, ProgressStyle};

use crate::cluster::Cluster;
use crate::config::Config;
use crate::error::{NmtError, Result};
use crate::model::store;
use crate::model::{Batch, Model};
use crate::train::batcher::{epoch_batches_sized, BatchSize, Corpus};
use crate::train::checkpoint::{EvalRecord, SaveRequest, TrainState};
use crate::train::optim::Optimizer;
pub use data::{load_data, read_tokenized, TrainData};
pub use evaluation::{bleu_v11b, corpus_loss, evaluate, evaluate_on, DevScores};

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
    // Guided alignment's links (the built-in aligner's made by rank 0 now, in the run directory).
    let guide = guided_alignment::load(&cfg, run_dir, data.corpus.len(), cluster, quiet)?;
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
    if tc.init.is_some() && state.step == 0 && state.history.is_empty() {
        // Fine-tuning: where the model starts, on the new dev set (and `best/` until it improves).
        evaluate(&mut state, &opt, &mut log, f64::NAN)?;
    }
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
        let batches = epoch_batches_sized(&data.corpus, BatchSize::of(&tc), tc.seed, state.epoch);
        while (state.batch_in_epoch as usize) < batches.len() {
            // An update's batches: `train.accumulate` of them (fewer at the epoch's end).
            let from = state.batch_in_epoch as usize;
            let parts = &batches[from..(from + tc.accumulate).min(batches.len())];
            let step = Step {
                model: &model,
                cfg: &cfg,
                data: &data,
                guide: guide.as_ref(),
                vars: &vars,
                cluster,
                dtype,
                dev: &dev,
            };
            opt.lr = schedule::learning_rate(&tc, &state, state.step + 1);
            let (lv, tokens, diverged) = step.update(parts, state.step, &mut opt, &mut exchange)?;
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
            state.batch_in_epoch += parts.len() as u64;
            if injected_panic(cluster.rank(), state.step) {
                panic!("injected panic after update {}", state.step);
            }
            state.seconds = base_seconds + start.elapsed().as_secs_f64();
            loss_acc.0 += lv * parts.iter().map(Vec::len).sum::<usize>() as f64;
            loss_acc.1 += tokens as usize;
            tok_acc.0 += tokens as usize;
            pb.inc(1);
            if state.step % 10 == 0 {
                let extra = window_extras(cluster, &mut exchange, &tc, &opt);
                last_loss = log_window(
                    &mut log,
                    &log_path,
                    &pb,
                    &state,
                    (&mut loss_acc, &mut tok_acc),
                    extra,
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
    let init = match &cfg.train.init {
        Some(d) => Some(initial_model(&cfg, d, dtype, dev)?),
        None => None,
    };
    let data = load_data(
        &cfg,
        init.as_ref()
            .map(|lm| (lm.src_vocab.clone(), lm.tgt_vocab.clone())),
        quiet,
    )?;
    let (mut model, varmap) = Model::build(
        &cfg.model,
        data.src_vocab.len(),
        data.tgt_vocab.len(),
        cfg.train.seed,
        dtype,
        dev,
    )?;
    if let Some(lm) = &init {
        // Fine-tuning: the model's parameters, a fresh optimiser and data position.
        let theirs = lm.varmap.data().lock().expect("varmap");
        for (name, var) in varmap.data().lock().expect("varmap").iter() {
            let w = theirs.get(name).ok_or_else(|| {
                NmtError::model_dir(&lm.dir, format!("{name} missing from the model"))
            })?;
            var.set(w.as_tensor())?;
        }
        drop(theirs);
        model.refresh_tied_output()?;
        if !quiet {
            // The new data's tokens that the model's vocabularies do not know (from the kept tokens' counts).
            let unknown = |v: &Vocab, side: &str| -> Result<f64> {
                let counts = WordCounts::load(&cfg.data.prepared.join(format!("counts.{side}")))?;
                Ok(100.0 * (1.0 - cgnmt_data::vocab::coverage(v, &counts)))
            };
            eprintln!(
                "fine-tuning {}: {:.2}% of the new data's source tokens and {:.2}% of its target tokens are \
                 unknown to its vocabularies",
                lm.dir.display(),
                unknown(&data.src_vocab, "src")?,
                unknown(&data.tgt_vocab, "tgt")?
            );
        }
    }
    Ok(Opened {
        opt: Optimizer::new(&cfg.train),
        cfg,
        model,
        varmap,
        state: TrainState::default(),
        data,
    })
}

/// The model a fine-tuning run starts from (`train.init`), checked against the run: the same architecture,
/// and `data.prepared` made with its preprocessing and vocabularies (`cgnmt prepare --like DIR`).
fn initial_model(
    cfg: &Config,
    dir: &Path,
    dtype: DType,
    dev: &Device,
) -> Result<store::LoadedModel> {
    let lm = store::load(&store::resolve_model_dir(dir), dtype, dev)?;
    if lm.config.model != cfg.model {
        return Err(NmtError::Config(format!(
            "train.init = {}: the model's architecture differs from this configuration's [model]",
            lm.dir.display()
        )));
    }
    let prepared = &cfg.data.prepared;
    let refuse = |what: &str| {
        Err(NmtError::Data(format!(
            "data.prepared = {}: its {what} differs from that of the model {} being fine-tuned; prepare the \
             new data with `cgnmt prepare --like {}`",
            prepared.display(),
            lm.dir.display(),
            lm.dir.display()
        )))
    };
    let pre = Preprocessor::load(prepared)?;
    for (side, a, b) in [
        ("source", &pre.src, &lm.preprocess.src),
        ("target", &pre.tgt, &lm.preprocess.tgt),
    ] {
        if a.tokenizer != b.tokenizer {
            return refuse(&format!("{side} tokenizer"));
        }
        match (&a.bpe, &b.bpe) {
            (None, None) => {}
            (Some(x), Some(y)) => {
                let read = |d: &Path, f: &Path| {
                    std::fs::read(d.join(f)).map_err(|e| NmtError::io(&d.join(f), e))
                };
                if read(prepared, x)? != read(&lm.dir, y)? {
                    return refuse(&format!("{side} subword model"));
                }
            }
            _ => return refuse(&format!("{side} subword model")),
        }
    }
    for (file, v) in [("vocab.src", &lm.src_vocab), ("vocab.tgt", &lm.tgt_vocab)] {
        let p = prepared.join(file);
        if !p.is_file() || &Vocab::load(&p)? != v {
            return refuse(&format!("vocabulary ({file})"));
        }
    }
    Ok(lm)
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
    // Updates per epoch (an update takes `train.accumulate` batches).
    let batches_per_epoch = (epoch_batches_sized(corpus, BatchSize::of(tc), tc.seed, 0).len()
        as u64)
        .div_ceil(tc.accumulate as u64);
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
    /// Guided alignment's links (`train.guided_alignment`).
    guide: Option<&'a guided_alignment::GuideLinks>,
    vars: &'a [(String, Var)],
    cluster: &'a Cluster,
    dtype: DType,
    dev: &'a Device,
}

impl Step<'_> {
    /// This rank's batch of the sentences `idx` (corpus indices) for update `step`: each sentence keyed by
    /// its corpus index (its dropout masks are the same at any number of ranks), with word dropout on the
    /// source words and on the target words the decoder reads.
    fn batch_of(&self, idx: &[usize], step: u64) -> Result<Batch> {
        let (data, tc) = (self.data, &self.cfg.train);
        let keys: Vec<u64> = idx.iter().map(|&i| i as u64).collect();
        let seed = crate::model::dropout::Dropout::step_seed(tc.seed, step);
        let unk = data.src_vocab.unk();
        // Each side's ids: the prepared segmentation, or (BPE-dropout) the words segmented again.
        let ids = |i: usize, side: usize| -> Result<Vec<u32>> {
            let vocab = if side == 0 {
                &data.src_vocab
            } else {
                &data.tgt_vocab
            };
            match &data.words {
                Some(w) => Ok(w.segment(i, side, tc.bpe_dropout, seed, vocab)),
                None if side == 0 => data.corpus.src(i),
                None => data.corpus.tgt(i),
            }
        };
        let srcs: Vec<Vec<u32>> = idx
            .iter()
            .map(|&i| {
                Ok(crate::model::dropout::word_dropout(
                    &ids(i, 0)?,
                    tc.source_word_dropout,
                    unk,
                    seed,
                    i as u64,
                    0,
                ))
            })
            .collect::<Result<_>>()?;
        let tgts: Vec<Vec<u32>> = idx.iter().map(|&i| ids(i, 1)).collect::<Result<_>>()?;
        let inputs: Option<Vec<Vec<u32>>> = (tc.target_word_dropout > 0.0).then(|| {
            let unk = data.tgt_vocab.unk();
            idx.iter()
                .zip(&tgts)
                .map(|(&i, t)| {
                    crate::model::dropout::word_dropout(
                        t,
                        tc.target_word_dropout,
                        unk,
                        seed,
                        i as u64,
                        1,
                    )
                })
                .collect()
        });
        let links: Option<Vec<Vec<(u32, u32)>>> = self
            .guide
            .map(|g| idx.iter().map(|&i| g.of(i).to_vec()).collect());
        Ok(Batch::keyed_with_inputs(
            &srcs,
            &tgts,
            inputs.as_deref(),
            links.as_deref(),
            &keys,
            data.tgt_vocab.eos(),
            self.dtype,
            self.dev,
        )?)
    }

    /// One update on the global batch `parts` (one batch of sentence indices, or `train.accumulate` of
    /// them) after `step` updates: this rank's share of each part, its loss and gradient weighted by the
    /// share's part of the whole update, summed over the parts and the ranks, and the optimiser's step.
    /// Returns the update's loss per sentence (summed over the ranks' weighted shares), its target tokens
    /// and, when the loss or the gradient norm is not finite (no step is then taken), what diverged.
    fn update(
        &self,
        parts: &[Vec<u32>],
        step: u64,
        opt: &mut Optimizer,
        exchange: &mut data_parallel::Exchange,
    ) -> Result<(f64, f64, Option<String>)> {
        let cluster = self.cluster;
        let total: usize = parts.iter().map(Vec::len).sum();
        let opts = crate::model::LossOptions::of(&self.cfg.train, step);
        let computing = Instant::now();
        // One part: its loss, whose backward pass waits for the divergence check. Several: each part's
        // gradient, weighted, accumulated as it comes.
        let (mut pending, mut weight, mut accumulated) = (None, 0.0, None);
        let (mut lv, mut tokens) = (0.0, 0.0);
        for part in parts {
            // This rank's share of the part (all of it in one process).
            let idx: Vec<usize> = cluster
                .share(part.len())
                .iter()
                .map(|&k| part[k] as usize)
                .collect();
            if idx.is_empty() {
                continue;
            }
            let w = idx.len() as f64 / total as f64;
            let batch = self.batch_of(&idx, step)?;
            let loss = self.model.loss_with(&batch, &opts)?;
            lv += loss.to_scalar::<f32>()? as f64 * w;
            tokens += batch.tgt_tokens as f64;
            if parts.len() == 1 {
                (pending, weight) = (Some(loss), w);
            } else {
                let g = self.model.backward(&loss)?;
                accumulated = Some(add_weighted(accumulated, g, w, self.vars)?);
            }
        }
        exchange.stats.compute_s += computing.elapsed().as_secs_f64();
        if cluster.size() > 1 {
            // (Mostly waiting for the slowest rank's forward pass: the sum is two numbers.)
            let waiting = Instant::now();
            let mut sums = [lv, tokens];
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
        let (grads, weight) = match pending {
            Some(l) => (Some(self.model.backward(&l)?), weight),
            None if parts.len() == 1 => (None, weight),
            None => (accumulated, 1.0),
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
/// `acc` (none yet: nothing) plus `w` times every gradient of `g`, parameter by parameter.
fn add_weighted(
    acc: Option<candle_core::backprop::GradStore>,
    mut g: candle_core::backprop::GradStore,
    w: f64,
    vars: &[(String, Var)],
) -> Result<candle_core::backprop::GradStore> {
    let mut acc = acc;
    for (_, v) in vars {
        let Some(t) = g.remove(v.as_tensor()) else {
            continue;
        };
        let t = t.affine(w, 0.0)?;
        match acc.as_mut() {
            Some(a) => {
                let sum = match a.get(v.as_tensor()) {
                    Some(x) => (x + &t)?,
                    None => t,
                };
                a.insert(v.as_tensor(), sum);
            }
            None => {
                g.insert(v.as_tensor(), t);
            }
        }
    }
    Ok(acc.unwrap_or(g))
}

/// What a log window records beside the loss: in an MPI job, rank 0's seconds per update in its own work,
/// waiting and exchanging; under a learning-rate schedule, the rate.
fn window_extras(
    cluster: &Cluster,
    exchange: &mut data_parallel::Exchange,
    tc: &crate::config::TrainConfig,
    opt: &Optimizer,
) -> Vec<(&'static str, serde_json::Value)> {
    let mut extra = vec![];
    if cluster.size() > 1 {
        let dp = exchange.stats.take().per_update_json();
        extra.push(("data_parallel", serde_json::Value::from(dp)));
    }
    if schedule::is_scheduled(tc) {
        extra.push(("lr", opt.lr.into()));
    }
    extra
}

fn log_window(
    log: &mut std::fs::File,
    log_path: &Path,
    pb: &ProgressBar,
    state: &TrainState,
    (loss_acc, tok_acc): (&mut (f64, usize), &mut (usize, Instant)),
    extra: Vec<(&str, serde_json::Value)>,
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
    for (k, v) in extra {
        line[k] = v;
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
    schedule::after_evaluation(tc, state);
    Ok(tc.patience > 0 && state.evals_without_improvement >= tc.patience as u64)
}
