//! Faults a long training run meets, on real data (Tatoeba zh-en): readers of a checkpoint directory while a
//! training run saves into it (never half one checkpoint and half the next), a full disk (a clear error, the
//! previous checkpoint intact, no partial files) and a kill soak (SIGKILL at random moments, in the middle of
//! checkpoint writes too, each followed by a resume: the end is bit-identical to an uninterrupted run).
//!
//! `CGNMT_KILL_SOAK=N` sets the soak's number of kills (6 by default, for CI; the figure is N >= 50),
//! `CGNMT_KILL_SOAK_PAUSE_MS=MS` the pause after each file a save writes (4 by default: most kills then land in
//! a save; 0: most land in training steps) and `CGNMT_KILL_SOAK_REPORT=FILE` writes its figures as JSON.

use crate::common;

use common::{prepare, run_ok};

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use cgnmt::model::store;
use cgnmt::train::checkpoint;
use rand::{Rng, SeedableRng};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cgnmt")
}

fn train_args(prepared: &Path, run: &Path, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "train".into(),
        "--quiet".into(),
        "--out".into(),
        run.display().to_string(),
    ];
    for s in [
        format!("data.prepared={:?}", prepared.display().to_string()),
        "model.embedding_dim=16".into(),
        "model.hidden_dim=24".into(),
        "model.attention_dim=16".into(),
        "train.batch_size=8".into(),
        "train.max_steps=60".into(),
        "train.save_every=4".into(),
        "train.eval_every=25".into(),
        "train.eval_max_sentences=8".into(),
        "train.eval_beam=2".into(),
    ] {
        v.push("--set".into());
        v.push(s);
    }
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// A few source lines of the test set.
fn test_input(dir: &Path, n: usize) -> PathBuf {
    let src = common::data_dir().join("tatoeba-zh-en/test.zh");
    let lines = cgnmt_data::corpus::read_lines(&src).unwrap();
    let p = dir.join("input.zh");
    std::fs::write(&p, format!("{}\n", lines[..n].join("\n"))).unwrap();
    p
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![];
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                out.extend(files_under(&p));
            }
            out.push(p);
        }
    }
    out
}

// ---- concurrent readers -----------------------------------------------------------------------------------

#[test]
fn loads_never_mix_two_checkpoints() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 60);
    let run = tmp.path().join("run");
    run_ok(
        &train_args(&prepared, &run, &["--set", "train.max_steps=2"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    // Widen every window of a save (each file written, each rename).
    std::env::set_var("CGNMT_TEST_SAVE_PAUSE_MS", "1");
    let mut lm = store::load(&run.join("last"), DType::F32, &Device::Cpu).unwrap();
    let shared = tmp.path().join("shared");
    let saves = 120u64;
    // Generation k: every weight is k, the configuration's seed is k, the state's step is k.
    let save = |lm: &mut store::LoadedModel, k: u64| {
        for var in lm.varmap.all_vars() {
            var.set(&Tensor::full(k as f32, var.shape(), &Device::Cpu).unwrap())
                .unwrap();
        }
        lm.config.train.seed = k;
        let state = checkpoint::TrainState {
            step: k,
            ..Default::default()
        };
        checkpoint::save(
            &shared,
            &checkpoint::SaveRequest {
                config: &lm.config,
                varmap: &lm.varmap,
                src_vocab: &lm.src_vocab,
                tgt_vocab: &lm.tgt_vocab,
                preprocess_dir: &run.join("last"),
                optimizer: None,
                state: Some(&state),
            },
        )
        .unwrap();
    };
    save(&mut lm, 1);
    let done = std::sync::atomic::AtomicBool::new(false);
    let (loads, generations) = std::thread::scope(|sc| {
        let readers: Vec<_> = (0..2)
            .map(|_| {
                sc.spawn(|| {
                    let mut loads = 0usize;
                    let mut seen = std::collections::BTreeSet::new();
                    while !done.load(std::sync::atomic::Ordering::Relaxed) {
                        let m = store::load(&shared, DType::F32, &Device::Cpu)
                            .unwrap_or_else(|e| panic!("a load failed while saves went on: {e}"));
                        let k = m.config.train.seed;
                        for var in m.varmap.all_vars() {
                            let v: Vec<f32> = var.flatten_all().unwrap().to_vec1().unwrap();
                            assert!(
                                v.iter().all(|&x| x == k as f32),
                                "configuration of generation {k} loaded with weights of another"
                            );
                        }
                        loads += 1;
                        seen.insert(k);
                    }
                    (loads, seen)
                })
            })
            .collect();
        for k in 2..=saves {
            save(&mut lm, k);
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        let mut loads = 0;
        let mut seen = std::collections::BTreeSet::new();
        for r in readers {
            let (l, s) = r.join().unwrap();
            loads += l;
            seen.extend(s);
        }
        (loads, seen)
    });
    eprintln!(
        "{loads} loads during {saves} saves saw {} generations, each whole",
        generations.len()
    );
    assert!(loads >= 20, "only {loads} loads");
    assert!(generations.len() >= 5, "the readers saw too few saves");
}

#[test]
fn translate_reads_whole_checkpoints_while_training_saves_into_them() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 120);
    let run = tmp.path().join("run");
    let input = test_input(tmp.path(), 20);
    let mut train = Command::new(bin())
        .args(train_args(
            &prepared,
            &run,
            &[
                "--set",
                "train.save_every=1",
                "--set",
                "train.max_steps=400",
            ],
        ))
        .env("CGNMT_TEST_SAVE_PAUSE_MS", "3")
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while store::complete_dir(&run.join("last")).is_none() {
        assert!(t0.elapsed() < Duration::from_secs(120), "no checkpoint");
        std::thread::sleep(Duration::from_millis(20));
    }
    let translate = || {
        Command::new(bin())
            .args(["translate", "--quiet", "-m"])
            .arg(run.join("last"))
            .arg("-i")
            .arg(&input)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut rounds = 0;
    while train.try_wait().unwrap().is_none() && rounds < 40 {
        // Two translations at once, on the directory being saved into.
        let (a, b) = (translate(), translate());
        for c in [a, b] {
            let o = c.wait_with_output().unwrap();
            assert!(
                o.status.success(),
                "translate failed while training saved: {}",
                String::from_utf8_lossy(&o.stderr)
            );
            assert_eq!(String::from_utf8(o.stdout).unwrap().lines().count(), 20);
        }
        rounds += 1;
    }
    let _ = train.kill();
    train.wait().unwrap();
    eprintln!("{rounds} rounds of two translations while training saved after every update");
    assert!(rounds >= 3, "training ended before the readers ran");
}

#[test]
fn a_run_killed_between_the_renames_of_a_save_resumes_and_is_not_started_over() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 60);
    let run = tmp.path().join("run");
    let args = train_args(&prepared, &run, &["--set", "train.max_steps=4"]);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    run_ok(&args);
    // What a kill between `last` → `last.old` and `last.tmp` → `last` leaves.
    std::fs::rename(run.join("last"), run.join("last.old")).unwrap();
    let o = Command::new(bin()).args(&args).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("--resume"),
        "a fresh start over a resumable run: {err}"
    );
    assert!(
        run.join("last.old/COMPLETE").is_file(),
        "the checkpoint was touched"
    );
    run_ok(&[
        "train",
        "--quiet",
        "--resume",
        run.to_str().unwrap(),
        "--set",
        "train.max_steps=8",
    ]);
    assert_eq!(checkpoint::load_state(&run.join("last")).unwrap().step, 8);
    assert!(!run.join("last.old").exists());
}

// ---- a full disk ------------------------------------------------------------------------------------------

/// Runs `script` with `sh` in a private mount namespace where a tmpfs of `size` is mounted at `dir` (as root,
/// or in an unprivileged user namespace); `None`, with the reason printed, where neither is allowed.
fn with_small_fs(dir: &Path, size: &str, script: &str) -> Option<Output> {
    std::fs::create_dir_all(dir).unwrap();
    let root = unsafe { libc::geteuid() } == 0;
    let flags = if root { "-m" } else { "-rm" };
    let full = format!(
        "mount -t tmpfs -o size={size} tmpfs '{}' || exit 97\n{script}",
        dir.display()
    );
    match Command::new("unshare")
        .args([flags, "sh", "-c", &full])
        .output()
    {
        Ok(o)
            if o.status.code() == Some(97)
                || (o.status.code() == Some(1)
                    && o.stdout.is_empty()
                    && String::from_utf8_lossy(&o.stderr).contains("unshare")) =>
        {
            eprintln!(
                "skipped: cannot mount a small filesystem here ({})",
                String::from_utf8_lossy(&o.stderr).trim()
            );
            None
        }
        Ok(o) => Some(o),
        Err(e) => {
            eprintln!("skipped: no unshare ({e})");
            None
        }
    }
}

fn dir_bytes(dir: &Path) -> u64 {
    files_under(dir)
        .iter()
        .filter(|p| p.is_file())
        .map(|p| p.metadata().unwrap().len())
        .sum()
}

#[test]
fn training_on_a_full_disk_fails_clearly_and_keeps_its_last_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 120);
    // One checkpoint's size, measured.
    let probe = tmp.path().join("probe");
    run_ok(
        &train_args(&prepared, &probe, &["--set", "train.max_steps=4"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let one = dir_bytes(&probe.join("last"));
    // Room for one checkpoint and a half: the first save fits, the second (written beside the first) cannot.
    let size = (one * 3 / 2 + 4095) / 4096 * 4096;
    let fs = tmp.path().join("fs");
    let kept = tmp.path().join("kept");
    std::fs::create_dir_all(&kept).unwrap();
    let args: Vec<String> =
        train_args(&prepared, &fs.join("run"), &["--set", "train.max_steps=40"])
            .into_iter()
            .map(|a| format!("'{a}'"))
            .collect();
    let script = format!(
        "'{bin}' {args} 2> '{k}/train.err'; echo $? > '{k}/train.rc'\ncp -a '{fs}/.' '{k}/fs'",
        bin = bin(),
        args = args.join(" "),
        k = kept.display(),
        fs = fs.display()
    );
    let Some(o) = with_small_fs(&fs, &size.to_string(), &script) else {
        return;
    };
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rc: i32 = std::fs::read_to_string(kept.join("train.rc"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let err = std::fs::read_to_string(kept.join("train.err")).unwrap();
    assert_ne!(rc, 0, "training on a full disk succeeded?");
    assert!(err.contains("No space left on device"), "{err}");
    assert!(err.contains("last.tmp"), "the error names the file: {err}");
    assert!(!err.contains("panicked"), "{err}");
    eprintln!("training on a full disk: {}", err.trim());
    // The previous checkpoint is there, whole and loadable; nothing partial is left.
    let run = kept.join("fs/run");
    let last = store::complete_dir(&run.join("last")).expect("a complete checkpoint");
    assert_eq!(last, run.join("last"));
    assert_eq!(checkpoint::load_state(&last).unwrap().step, 4);
    store::load(&last, DType::F32, &Device::Cpu).unwrap();
    let leftovers: Vec<_> = files_under(&run)
        .into_iter()
        .filter(|p| {
            let s = p.strip_prefix(&run).unwrap().display().to_string();
            s.contains(".tmp") || s.contains(".old")
        })
        .collect();
    assert!(leftovers.is_empty(), "partial files left: {leftovers:?}");
    // And it resumes once there is room.
    let resumed = tmp.path().join("resumed");
    std::fs::create_dir_all(&resumed).unwrap();
    let o = Command::new("cp")
        .args(["-a"])
        .arg(&run)
        .arg(resumed.join("run"))
        .output()
        .unwrap();
    assert!(o.status.success());
    run_ok(&[
        "train",
        "--quiet",
        "--resume",
        resumed.join("run").to_str().unwrap(),
        "--set",
        "train.max_steps=8",
    ]);
    assert_eq!(
        checkpoint::load_state(&resumed.join("run/last"))
            .unwrap_or_else(|e| panic!("{e}: {:?}", files_under(&resumed)))
            .step,
        8
    );
}

#[test]
fn translating_onto_a_full_disk_leaves_no_truncated_output() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 60);
    let run = tmp.path().join("run");
    run_ok(
        &train_args(&prepared, &run, &["--set", "train.max_steps=4"])
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
    );
    let input = test_input(tmp.path(), 300);
    let fs = tmp.path().join("fs");
    let kept = tmp.path().join("kept");
    std::fs::create_dir_all(&kept).unwrap();
    // 8 KiB: too little for 300 sentences' 5-best lists, or for their attention dump.
    let script = format!(
        "for what in '--nbest 5 --beam 5' '--dump {fs}/dump.jsonl'; do\n\
         '{bin}' translate --quiet -m '{m}' -i '{i}' -o '{fs}/out.txt' $what 2>> '{k}/err'; echo $? >> '{k}/rc'\n\
         done\ncp -a '{fs}/.' '{k}/fs'",
        bin = bin(),
        m = run.join("last").display(),
        i = input.display(),
        fs = fs.display(),
        k = kept.display()
    );
    let Some(o) = with_small_fs(&fs, "8k", &script) else {
        return;
    };
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let rcs = std::fs::read_to_string(kept.join("rc")).unwrap();
    let err = std::fs::read_to_string(kept.join("err")).unwrap();
    assert!(
        rcs.lines().all(|l| l.trim() != "0") && rcs.lines().count() == 2,
        "exit codes {rcs:?}: {err}"
    );
    assert_eq!(err.matches("No space left on device").count(), 2, "{err}");
    assert!(!err.contains("panicked"), "{err}");
    eprintln!("translating onto a full disk:\n{}", err.trim());
    let left: Vec<_> = files_under(&kept.join("fs"));
    assert!(left.is_empty(), "a failed translation left files: {left:?}");
}

// ---- kill soak --------------------------------------------------------------------------------------------

#[derive(serde::Serialize)]
struct SoakReport {
    /// The pause after each file a checkpoint save writes (widens the save's window).
    save_pause_ms: String,
    kills_tried: usize,
    /// Kills that landed while a checkpoint was being written (`last.tmp` or `last.old` present).
    kills_during_save: usize,
    /// Kills before the first checkpoint (training started again from nothing).
    kills_before_first_checkpoint: usize,
    resumes: usize,
    survived: usize,
    parameters_identical: bool,
    optimizer_identical: bool,
    dev_history_identical: bool,
    seconds: f64,
}

fn tensors(p: &Path) -> Vec<(String, Vec<f32>)> {
    let mut v: Vec<(String, Vec<f32>)> = candle_core::safetensors::load(p, &Device::Cpu)
        .unwrap()
        .into_iter()
        .filter(|(_, t)| t.dtype() == DType::F32)
        .map(|(k, t)| (k, t.flatten_all().unwrap().to_vec1().unwrap()))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn kill_soak_ends_bit_identical_to_an_uninterrupted_run() {
    let n: usize = std::env::var("CGNMT_KILL_SOAK")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let started = Instant::now();
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 120);
    let pause_ms = std::env::var("CGNMT_KILL_SOAK_PAUSE_MS").unwrap_or_else(|_| "4".into());
    let pause = [("CGNMT_TEST_SAVE_PAUSE_MS", pause_ms.as_str())];
    let a = tmp.path().join("a");
    let t0 = Instant::now();
    let o = Command::new(bin())
        .args(train_args(&prepared, &a, &[]))
        .envs(pause)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let whole = t0.elapsed();
    let b = tmp.path().join("b");
    let mut rng = rand::rngs::StdRng::seed_from_u64(2017);
    let mut r = SoakReport {
        save_pause_ms: pause_ms.clone(),
        kills_tried: 0,
        kills_during_save: 0,
        kills_before_first_checkpoint: 0,
        resumes: 0,
        survived: 0,
        parameters_identical: false,
        optimizer_identical: false,
        dev_history_identical: false,
        seconds: 0.0,
    };
    let last = b.join("last");
    // A kill is survived when the next start (a resume, or a fresh start before any checkpoint) runs on
    // without an error: it is killed in turn while running, or finishes.
    let mut after_kill = false;
    while r.kills_tried < n {
        let resume = store::complete_dir(&last).is_some();
        let args = if resume {
            vec![
                "train".to_string(),
                "--quiet".into(),
                "--resume".into(),
                b.display().to_string(),
            ]
        } else {
            train_args(&prepared, &b, &[])
        };
        let mut child = Command::new(bin())
            .args(&args)
            .envs(pause)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if resume {
            r.resumes += 1;
        }
        // A random moment within the run's length (startup included).
        let wait = Duration::from_secs_f64(rng.random_range(0.0..whole.as_secs_f64()));
        let t = Instant::now();
        let mut exited = None;
        while t.elapsed() < wait {
            if let Some(st) = child.try_wait().unwrap() {
                exited = Some(st);
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        match exited {
            Some(st) => {
                let o = child.wait_with_output().unwrap();
                assert!(
                    st.success(),
                    "a resumed run failed: {}",
                    String::from_utf8_lossy(&o.stderr)
                );
                if after_kill {
                    r.survived += 1;
                    after_kill = false;
                }
                // Finished before the kill: start this run again from nothing to go on killing.
                std::fs::remove_dir_all(&b).unwrap();
            }
            None => {
                let during_save = b.join("last.tmp").exists() || b.join("last.old").exists();
                child.kill().unwrap(); // SIGKILL
                child.wait().unwrap();
                if after_kill {
                    r.survived += 1;
                }
                after_kill = true;
                r.kills_tried += 1;
                if during_save {
                    r.kills_during_save += 1;
                }
                if store::complete_dir(&last).is_none() {
                    r.kills_before_first_checkpoint += 1;
                }
            }
        }
    }
    // The last resume runs to the end.
    let o = if store::complete_dir(&last).is_some() {
        r.resumes += 1;
        Command::new(bin())
            .args(["train", "--quiet", "--resume", b.to_str().unwrap()])
            .output()
            .unwrap()
    } else {
        Command::new(bin())
            .args(train_args(&prepared, &b, &[]))
            .output()
            .unwrap()
    };
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    if after_kill {
        r.survived += 1;
    }
    let sa = checkpoint::load_state(&a.join("last")).unwrap();
    let sb = checkpoint::load_state(&b.join("last")).unwrap();
    assert_eq!((sa.step, sb.step), (60, 60));
    r.parameters_identical =
        tensors(&a.join("last/model.safetensors")) == tensors(&b.join("last/model.safetensors"));
    r.optimizer_identical = std::fs::read(a.join("last/optimizer.safetensors")).unwrap()
        == std::fs::read(b.join("last/optimizer.safetensors")).unwrap();
    // (Bits: a train loss before the first logging window is NaN.)
    let bits = |s: &checkpoint::TrainState| -> Vec<(u64, u64, u64)> {
        s.history
            .iter()
            .map(|h| (h.step, h.dev_bleu.to_bits(), h.train_loss.to_bits()))
            .collect()
    };
    // Everything but wall-clock seconds.
    let place = |s: &checkpoint::TrainState| {
        (
            s.step,
            s.epoch,
            s.batch_in_epoch,
            s.best_bleu.map(f64::to_bits),
            s.best_step,
            s.loss_window.0.to_bits(),
            s.loss_window.1,
            s.last_train_loss.map(f64::to_bits),
        )
    };
    r.dev_history_identical = bits(&sa) == bits(&sb) && place(&sa) == place(&sb);
    r.seconds = started.elapsed().as_secs_f64();
    let json = serde_json::to_string_pretty(&r).unwrap();
    eprintln!("kill soak: {json}");
    if let Ok(p) = std::env::var("CGNMT_KILL_SOAK_REPORT") {
        std::fs::write(p, &json).unwrap();
    }
    assert!(r.parameters_identical, "parameters differ after the soak");
    assert!(
        r.optimizer_identical,
        "optimiser state differs after the soak"
    );
    assert!(
        r.dev_history_identical,
        "dev history differs after the soak"
    );
    assert_eq!(
        r.survived, r.kills_tried,
        "every kill was followed by a start that ran on"
    );
}
