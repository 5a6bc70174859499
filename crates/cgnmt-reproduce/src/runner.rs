//! Running the tasks: `cgnmt` child processes (train, translate, align, select), their logs and timing.

use super::*;
use cgnmt::model::store;
use std::sync::Condvar;

/// Where a task stands in one invocation's queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    Waiting,
    Running,
    Done,
    Failed,
}

/// For each unfinished task, the unfinished training runs whose models it decodes (a `from` row's run of the
/// same seed, or an ensemble's members); a finished run is no dependency.
pub(super) fn dependencies(todo: &[&Task]) -> Vec<Vec<usize>> {
    todo.iter()
        .map(|t| {
            if t.system.from.is_none() {
                return vec![];
            }
            todo.iter()
                .enumerate()
                .filter(|(_, u)| {
                    u.system.from.is_none() && (u.run == t.run || t.members.contains(&u.run))
                })
                .map(|(j, _)| j)
                .collect()
        })
        .collect()
}

/// What a free worker does next.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Next {
    /// Start this task (now marked running).
    Start(usize),
    /// Wait for a running task: every waiting one needs a run still training.
    Wait,
    /// Nothing left to start.
    Stop,
}

/// The next task to start: the first waiting decode (`decoding`: a row that decodes other rows' models)
/// whose models are all trained, so that a row chosen on dev or averaged is decoded (and its record
/// complete) as soon as its run is, not after every other run has trained (an interrupted plan then loses
/// no decode whose checkpoints are gone); else the first waiting training run. A task whose dependency
/// failed fails too, and is returned in `blocked`.
pub(super) fn next_task(
    deps: &[Vec<usize>],
    decoding: &[bool],
    slots: &mut [Slot],
    blocked: &mut Vec<usize>,
) -> Next {
    // A failure blocks what decodes it (an ensemble's members are one level deep).
    for i in 0..slots.len() {
        if slots[i] == Slot::Waiting && deps[i].iter().any(|&j| slots[j] == Slot::Failed) {
            slots[i] = Slot::Failed;
            blocked.push(i);
        }
    }
    let ready =
        |i: usize| slots[i] == Slot::Waiting && deps[i].iter().all(|&j| slots[j] == Slot::Done);
    let pick = (0..slots.len())
        .find(|&i| decoding[i] && ready(i))
        .or_else(|| (0..slots.len()).find(|&i| ready(i)));
    if let Some(i) = pick {
        slots[i] = Slot::Running;
        return Next::Start(i);
    }
    if slots.contains(&Slot::Waiting) && slots.contains(&Slot::Running) {
        Next::Wait
    } else {
        Next::Stop
    }
}

/// Train and decode every unfinished run, `--jobs` at a time, with progress bars (or one line per run): a
/// row that decodes other rows' models starts once those are trained (`next_task`).
pub(super) fn run_tasks(
    s: &Setup,
    tasks: &[Task],
    clock: &Arc<Clock>,
    on_finished: &(dyn Fn() + Sync),
) -> Result<()> {
    let todo: Vec<&Task> = tasks.iter().filter(|t| !is_complete(t)).collect();
    if todo.is_empty() {
        return Ok(());
    }
    // The plan's progress counts updates: a row that only decodes another's models trains none.
    let steps_of = |t: &Task| {
        if t.system.from.is_some() {
            0
        } else {
            t.config.train.max_steps.max(1) as u64
        }
    };
    let total_steps: u64 = todo.iter().map(|t| steps_of(t)).sum();
    let multi = if s.args.quiet {
        MultiProgress::with_draw_target(indicatif::ProgressDrawTarget::hidden())
    } else {
        MultiProgress::new()
    };
    // Without bars (--quiet, or stderr not a terminal, e.g. a background run's log) the lines go to stderr.
    let say = |line: String| {
        if multi.is_hidden() {
            eprintln!("{line}");
        } else {
            let _ = multi.println(line);
        }
    };
    let overall = multi.add(ProgressBar::new(total_steps));
    overall.set_style(
        ProgressStyle::with_template("plan {bar:30} {percent:>3}% of the updates · {msg}")
            .expect("template"),
    );
    overall.set_message(format!("{} runs to go", todo.len()));
    say(format!(
        "== {} of {} runs to train ({} at a time, {} threads each)",
        todo.len(),
        tasks.len(),
        s.args.jobs,
        s.threads
    ));
    let deps = dependencies(&todo);
    let decoding: Vec<bool> = todo.iter().map(|t| t.system.from.is_some()).collect();
    let queue = Mutex::new(vec![Slot::Waiting; todo.len()]);
    let changed = Condvar::new();
    let started_count = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let done_steps = AtomicU64::new(0);
    let started = Instant::now();
    let failures: Mutex<Vec<String>> = Mutex::new(vec![]);
    std::thread::scope(|sc| {
        for _ in 0..s.args.jobs.min(todo.len()) {
            sc.spawn(|| {
                let bar = multi.add(ProgressBar::new(1));
                bar.set_style(
                    ProgressStyle::with_template("  {msg}").expect("template"),
                );
                loop {
                    let i = {
                        let mut slots = queue.lock().expect("queue");
                        loop {
                            let mut blocked = vec![];
                            let next = next_task(&deps, &decoding, &mut slots, &mut blocked);
                            for b in blocked {
                                let msg = format!(
                                    "{} seed {} not decoded: a run whose models it decodes failed",
                                    todo[b].system.name, todo[b].seed
                                );
                                say(format!("error: {msg}"));
                                failures.lock().expect("failures").push(msg);
                            }
                            match next {
                                Next::Start(i) => break Some(i),
                                Next::Wait => slots = changed.wait(slots).expect("queue"),
                                Next::Stop => break None,
                            }
                        }
                    };
                    let Some(i) = i else { break };
                    let t = todo[i];
                    let k = started_count.fetch_add(1, Ordering::SeqCst);
                    let mut report_step = |step: u64, phase: &str| {
                        let step = step.min(steps_of(t));
                        bar.set_message(if steps_of(t) == 0 {
                            format!("{} · seed {} · {phase}", t.system.name, t.seed)
                        } else {
                            format!(
                                "{} · seed {} · {phase} · update {step}/{}",
                                t.system.name,
                                t.seed,
                                steps_of(t)
                            )
                        });
                        overall.set_position(
                            (done_steps.load(Ordering::Relaxed) + step).min(total_steps),
                        );
                        let elapsed = started.elapsed().as_secs_f64();
                        let pos = overall.position().max(1) as f64;
                        let eta = elapsed / pos * (total_steps as f64 - pos).max(0.0);
                        overall.set_message(format!(
                            "{} of {} runs done · plan ETA {}",
                            finished.load(Ordering::Relaxed),
                            todo.len(),
                            fmt_duration(eta)
                        ));
                    };
                    let done = done_steps.load(Ordering::Relaxed);
                    let eta = if done > 0 {
                        format!(
                            "; plan ETA {}",
                            fmt_duration(
                                started.elapsed().as_secs_f64() / done as f64
                                    * (total_steps - done.min(total_steps)) as f64
                            )
                        )
                    } else {
                        String::new()
                    };
                    say(format!(
                        "started {} seed {} (run {} of {}{eta})",
                        t.system.name,
                        t.seed,
                        k + 1,
                        todo.len()
                    ));
                    let t0 = Instant::now();
                    let outcome = run_task(s, t, clock, &mut report_step);
                    queue.lock().expect("queue")[i] = if outcome.is_ok() {
                        Slot::Done
                    } else {
                        Slot::Failed
                    };
                    changed.notify_all();
                    match outcome {
                        Ok(r) => {
                            finished.fetch_add(1, Ordering::Relaxed);
                            on_finished();
                            done_steps.fetch_add(steps_of(t), Ordering::Relaxed);
                            say(format!(
                                "finished {} seed {}: test BLEU {:.2} (dev {:.2} at update {}), {} training, \
                                 {} decoding [{} of {}]",
                                t.system.name,
                                t.seed,
                                r.bleu,
                                r.best_dev_bleu.unwrap_or(0.0),
                                r.best_step,
                                fmt_duration(r.train_seconds),
                                fmt_duration(r.decode_seconds),
                                finished.load(Ordering::Relaxed),
                                todo.len()
                            ));
                        }
                        Err(e) => {
                            let msg = format!(
                                "{} seed {} failed after {}: {e:#}",
                                t.system.name,
                                t.seed,
                                fmt_duration(t0.elapsed().as_secs_f64())
                            );
                            say(format!("error: {msg}"));
                            failures.lock().expect("failures").push(msg);
                        }
                    }
                }
                bar.finish_and_clear();
            });
        }
    });
    overall.finish_and_clear();
    let failures = failures.into_inner().expect("failures");
    if !failures.is_empty() {
        eprintln!("{} runs failed:", failures.len());
        for f in &failures {
            eprintln!("  {f}");
        }
    }
    Ok(())
}

pub fn fmt_duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, (s % 3600) / 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

/// A child `cgnmt` process that dies with this one (so a killed `reproduce` leaves no training running
/// that a resumed one would collide with), its output appended to `log`.
pub(super) fn child(exe: &Path, args: &[String], log: &Path, threads: usize) -> Result<Command> {
    let f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("{}: cannot open", log.display()))?;
    // Each child's command line heads its output, so the log says what ran (which model, which settings).
    writeln!(&f, "$ cgnmt {}", args.join(" "))
        .with_context(|| format!("{}: cannot write", log.display()))?;
    let mut c = Command::new(exe);
    c.args(args)
        .env("RAYON_NUM_THREADS", threads.to_string())
        .stdin(std::process::Stdio::null())
        .stdout(f.try_clone()?)
        .stderr(f);
    #[cfg(target_os = "linux")]
    {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe; it only asks for SIGKILL when the parent dies.
        unsafe {
            c.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
    Ok(c)
}

/// Run a child to its end, calling `tick` about once a second; an error carries the end of its log.
pub fn run_child(
    exe: &Path,
    args: &[String],
    log: &Path,
    threads: usize,
    clock: &Clock,
    mut tick: impl FnMut(),
) -> Result<()> {
    let t0 = Instant::now();
    let mut c = child(exe, args, log, threads)?;
    let mut proc = c
        .spawn()
        .with_context(|| format!("cannot start {}", exe.display()))?;
    let status = loop {
        if let Some(st) = proc.try_wait()? {
            break st;
        }
        tick();
        std::thread::sleep(Duration::from_millis(500));
    };
    clock.add_work(t0.elapsed());
    if !status.success() {
        let tail = std::fs::read_to_string(log)
            .map(|t| {
                let lines: Vec<&str> = t.lines().collect();
                lines[lines.len().saturating_sub(5)..].join("\n    ")
            })
            .unwrap_or_default();
        bail!(
            "`cgnmt {}` exited with {status}; the end of {}:\n    {tail}",
            args.first().map(String::as_str).unwrap_or(""),
            log.display()
        );
    }
    Ok(())
}

/// The last update step in a training log (its periodic `{"step": N, ...}` lines).
pub(super) fn last_logged_step(log: &Path) -> Option<u64> {
    let f = std::fs::File::open(log).ok()?;
    let mut last = None;
    for line in std::io::BufReader::new(f).lines().map_while(|l| l.ok()) {
        if let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) {
            if let Some(s) = v
                .get("step")
                .or_else(|| v.get("eval"))
                .and_then(|x| x.as_u64())
            {
                last = Some(s);
            }
        }
    }
    last
}

/// Train (or resume) one run, decode the test set with its best model, score it and mark it complete.
pub(super) fn run_task(
    s: &Setup,
    t: &Task,
    clock: &Clock,
    progress: &mut dyn FnMut(u64, &str),
) -> Result<RunResult> {
    std::fs::create_dir_all(&t.dir)
        .with_context(|| format!("{}: cannot create", t.dir.display()))?;
    let run = t.run.clone();
    let log = t.dir.join("output.log");
    if let Some(f) = &t.system.from {
        // A kept record (its checkpoints not under version control) cannot be decoded again.
        let record = t.run.parent().map(|d| d.join("COMPLETE"));
        if store::complete_dir(&run.join("last")).is_none() && record.is_some_and(|r| r.is_file()) {
            bail!(
                "{}: row {:?} decodes this run's models, but its checkpoints are not here (a kept \
                 record); train it again with --only {f:?}",
                run.display(),
                t.system.name
            );
        }
    }
    let train_args = train_args(s, t)?;
    let timing_path = t.dir.join("timing.json");
    let mut timing: Timing = std::fs::read_to_string(&timing_path)
        .ok()
        .and_then(|x| serde_json::from_str(&x).ok())
        .unwrap_or_default();
    if let (Some(_), Some(f)) = (&train_args, &t.system.from) {
        bail!(
            "{}: row {f:?} has not finished training seed {}, whose models row {:?} decodes",
            run.display(),
            t.seed,
            t.system.name
        );
    }
    check_members_finished(t)?;
    if let Some(a) = train_args {
        let t0 = Instant::now();
        let train_log = run.join("train.log");
        // The training time so far is written every half minute, so that an invocation killed while the
        // run trains still counts its time when the next one resumes the run.
        let before = timing.train_seconds;
        let mut written = Instant::now();
        let save = |timing: &mut Timing| -> Result<()> {
            timing.train_seconds = before + t0.elapsed().as_secs_f64();
            write_atomic(&timing_path, serde_json::to_string(timing)?.as_bytes())
        };
        run_child(&s.exe, &a, &log, s.threads, clock, || {
            progress(last_logged_step(&train_log).unwrap_or(0), "training");
            if written.elapsed() >= Duration::from_secs(30) {
                written = Instant::now();
                if let Err(e) = save(&mut timing) {
                    eprintln!("warning: {e:#}");
                }
            }
        })?;
        save(&mut timing)?;
    }
    keep_training_record(t)?;
    progress(t.config.train.max_steps as u64, "decoding the test set");
    let t0 = Instant::now();
    let mut decode_args = t.system.decode.clone();
    let models = if t.system.choose {
        vec![choose_on_dev(s, t, clock, &mut decode_args)?]
    } else {
        models_to_decode(s, t, clock)?
    };
    let translate = |input: &Path, output: &Path, dump: Option<&Path>| -> Result<()> {
        let mut targs: Vec<String> = vec!["translate".into(), "--quiet".into()];
        for m in &models {
            targs.push("-m".into());
            targs.push(m.display().to_string());
        }
        targs.extend([
            "--beam".into(),
            s.plan.decode.beam.to_string(),
            "-i".into(),
            input.display().to_string(),
            "-o".into(),
            output.display().to_string(),
        ]);
        if let Some(d) = dump {
            targs.push("--dump".into());
            targs.push(d.display().to_string());
        }
        targs.extend(decode_args.iter().cloned());
        // A penalty the row does not set is 0, as the plan says, not the model's own chosen on dev (its
        // decoding.toml, which another row's selection may have written).
        if !targs
            .iter()
            .any(|a| a == "--length-penalty" || a == "--length-norm")
        {
            targs.extend(["--length-penalty".into(), "0".into()]);
        }
        if !targs.iter().any(|a| a == "--coverage-penalty") {
            targs.extend(["--coverage-penalty".into(), "0".into()]);
        }
        run_child(&s.exe, &targs, &log, s.threads, clock, || {})
    };
    translate(
        &s.test_src,
        &t.dir.join("test.hyp"),
        Some(&t.dir.join("test.dump.jsonl")),
    )?;
    for x in &s.extra_tests {
        translate(&x.src, &t.dir.join(format!("test-{}.hyp", x.name)), None)?;
    }
    timing.decode_seconds = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    compress_dump(&t.dir)?;
    clock.add_own(t1.elapsed());
    let t0 = Instant::now();
    let r = analyses::score_run(s, t, &run, &models[0], &timing)?;
    clock.add_own(t0.elapsed());
    write_atomic(
        &t.dir.join("result.json"),
        serde_json::to_string_pretty(&r)?.as_bytes(),
    )?;
    // Alignments need the checkpoints, which may not outlive this invocation: made before the record is
    // complete.
    analyses::align_trained_run(s, t, clock, progress)?;
    write_atomic(
        &t.dir.join("COMPLETE"),
        serde_json::to_string(&Complete {
            fingerprint: t.fingerprint.clone(),
            beam: Some(t.beam),
            test_sentences: Some(t.test_sentences),
            decode: t.decode_key.clone(),
        })?
        .as_bytes(),
    )?;
    Ok(r)
}

/// The `cgnmt train` arguments that bring the task's run to the plan's budget: a fresh run (its
/// configuration written to the task's `config.toml`), a resume of an unfinished (or shorter) one, or
/// `None` when the run finished with the plan's configuration. A run whose checkpoint cannot continue into
/// the plan's is an error that says how to train the row again.
fn train_args(s: &Setup, t: &Task) -> Result<Option<Vec<String>>> {
    let run = &t.run;
    let Some(dir) = store::complete_dir(&run.join("last")) else {
        if run.exists() {
            // Started but killed before its first checkpoint: nothing to keep.
            std::fs::remove_dir_all(run)
                .with_context(|| format!("{}: cannot remove", run.display()))?;
        }
        let mut cfg = t.config.clone();
        cfg.train.threads = s.threads;
        let cfg_path = t.dir.join("config.toml");
        write_atomic(&cfg_path, cfg.to_toml().as_bytes())?;
        return Ok(Some(vec![
            "train".into(),
            "--quiet".into(),
            "-c".into(),
            cfg_path.display().to_string(),
            "--out".into(),
            run.display().to_string(),
        ]));
    };
    let saved = Config::load(Some(&dir.join(store::CONFIG_FILE)), &[])?;
    let state = checkpoint::load_state(&dir)?;
    check_continues(&saved, &state, &t.config).map_err(|why| {
        anyhow::anyhow!(
            "{}: {why}; remove it or train the row again with --only {:?}",
            run.display(),
            t.system.name
        )
    })?;
    if state.finished && identity_toml(&saved) == identity_toml(&t.config) {
        return Ok(None);
    }
    // Unfinished, or finished with a smaller budget than the plan's now: go on from the last checkpoint
    // (with no learning-rate schedule this is the longer run itself).
    let tc = &t.config.train;
    Ok(Some(vec![
        "train".into(),
        "--quiet".into(),
        "--resume".into(),
        run.display().to_string(),
        "--set".into(),
        format!("train.threads={}", s.threads),
        "--set".into(),
        format!("train.max_steps={}", tc.max_steps),
        "--set".into(),
        format!("train.max_seconds={}", tc.max_seconds),
        "--set".into(),
        format!("train.max_epochs={}", tc.max_epochs),
    ]))
}

/// An ensemble row decodes only finished members.
fn check_members_finished(t: &Task) -> Result<()> {
    for m in &t.members {
        let dir = store::complete_dir(&m.join("last")).with_context(|| {
            format!(
                "{}: an ensemble member has no complete checkpoint",
                m.display()
            )
        })?;
        if !checkpoint::load_state(&dir)?.finished {
            bail!(
                "{}: an ensemble member has not finished training",
                m.display()
            );
        }
    }
    Ok(())
}

/// The record: the configuration the run was trained with (after a longer budget, the longer one) and its
/// training log, beside the checkpoints that are not kept under version control.
fn keep_training_record(t: &Task) -> Result<()> {
    let run = &t.run;
    let last = store::complete_dir(&run.join("last"))
        .with_context(|| format!("{}: training left no complete checkpoint", run.display()))?;
    for (from, to) in [
        (last.join(store::CONFIG_FILE), t.dir.join(RECORD_CONFIG)),
        (run.join("train.log"), t.dir.join("train.log")),
    ] {
        if from.is_file() {
            let bytes =
                std::fs::read(&from).with_context(|| format!("{}: cannot read", from.display()))?;
            write_atomic(&to, &bytes)?;
        }
    }
    Ok(())
}

/// The models a row that does not choose on dev decodes: the run's best (or the average of its last kept
/// checkpoints), or every ensemble member's.
fn models_to_decode(s: &Setup, t: &Task, clock: &Clock) -> Result<Vec<PathBuf>> {
    let best_of = |run: &Path| {
        if run.join("best").is_dir() {
            run.join("best")
        } else {
            run.join("last")
        }
    };
    if t.members.is_empty() {
        return Ok(vec![if t.system.average > 0 {
            averaged(s, t, &t.run, t.dir.join("run").join("averaged"), clock)?
        } else {
            best_of(&t.run)
        }]);
    }
    let mut v = vec![];
    for (i, m) in t.members.iter().enumerate() {
        v.push(if t.system.average > 0 {
            averaged(
                s,
                t,
                m,
                t.dir.join("run").join(format!("averaged-{i}")),
                clock,
            )?
        } else {
            best_of(m)
        });
    }
    Ok(v)
}

/// The average of the last checkpoints `run` kept, made once into `out` (beside the row's own checkpoints).
fn averaged(s: &Setup, t: &Task, run: &Path, out: PathBuf, clock: &Clock) -> Result<PathBuf> {
    if store::complete_dir(&out).is_some() {
        return Ok(out);
    }
    let kept = checkpoint::kept_checkpoints(run)?;
    if kept.len() < t.system.average {
        bail!(
            "{}: row {:?} averages the last {} checkpoints, but the run kept {} (set train.keep_checkpoints)",
            run.display(),
            t.system.name,
            t.system.average,
            kept.len()
        );
    }
    let mut aargs: Vec<String> = vec!["average".into()];
    for k in &kept[kept.len() - t.system.average..] {
        aargs.push("-m".into());
        aargs.push(k.display().to_string());
    }
    aargs.push("-o".into());
    aargs.push(out.display().to_string());
    run_child(
        &s.exe,
        &aargs,
        &t.dir.join("output.log"),
        s.threads,
        clock,
        || {},
    )?;
    Ok(out)
}

/// A row with `choose = true`: the model and its penalties chosen on dev (`cgnmt select --tune`, which
/// considers as many kept checkpoints as the run has). The row's own penalties are the grid's starting
/// point; the chosen ones replace them in `decode_args`. Returns the chosen model.
fn choose_on_dev(
    s: &Setup,
    t: &Task,
    clock: &Clock,
    decode_args: &mut Vec<String>,
) -> Result<PathBuf> {
    if !t.members.is_empty() {
        bail!(
            "row {:?}: choose = true does not go with ensemble = true",
            t.system.name
        );
    }
    let mut pick = |flag: &str| -> Result<Option<String>> {
        match decode_args.iter().position(|a| a == flag) {
            None => Ok(None),
            Some(i) if i + 1 < decode_args.len() => {
                let v = decode_args[i + 1].clone();
                decode_args.drain(i..i + 2);
                Ok(Some(v))
            }
            Some(_) => bail!("row {:?}: {flag} without a value", t.system.name),
        }
    };
    let alpha = pick("--length-penalty")?;
    let beta = pick("--coverage-penalty")?;
    let sel_file = t.dir.join(cgnmt::train::selection::SELECTION_FILE);
    let mut sargs: Vec<String> = vec![
        "select".into(),
        "--run".into(),
        t.run.display().to_string(),
        "--last".into(),
        t.system.average.to_string(),
        "--beam".into(),
        s.plan.decode.beam.to_string(),
        "--tune".into(),
        "--out".into(),
        sel_file.display().to_string(),
    ];
    if let Some(a) = alpha {
        sargs.extend(["--length-penalty".into(), a]);
    }
    if let Some(b) = beta {
        sargs.extend(["--coverage-penalty".into(), b]);
    }
    sargs.extend(t.system.select.iter().cloned());
    run_child(
        &s.exe,
        &sargs,
        &t.dir.join("output.log"),
        s.threads,
        clock,
        || {},
    )?;
    let sel: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&sel_file)
            .with_context(|| format!("{}: cannot read", sel_file.display()))?,
    )
    .with_context(|| format!("{}: not a selection record", sel_file.display()))?;
    let num = |k: &str| {
        sel[k]
            .as_f64()
            .with_context(|| format!("{}: no {k}", sel_file.display()))
    };
    decode_args.extend([
        "--length-penalty".into(),
        num("length_penalty")?.to_string(),
        "--coverage-penalty".into(),
        num("coverage_penalty")?.to_string(),
    ]);
    let k = sel["chosen"].as_u64().unwrap_or(0) as usize;
    let dir = sel["candidates"][k]["dir"]
        .as_str()
        .with_context(|| format!("{}: no chosen model", sel_file.display()))?;
    Ok(PathBuf::from(dir))
}

/// Append `later` to the `prepare` arguments `args`, a flag of `later` replacing the same flag (and its value)
/// in `args`: the quick settings' `--limit` wins over the plan's own.
pub(super) fn overriding(args: &mut Vec<String>, later: &[String]) {
    let flags: Vec<&String> = later.iter().filter(|a| a.starts_with("--")).collect();
    let mut kept = Vec::with_capacity(args.len() + later.len());
    let mut i = 0;
    while i < args.len() {
        if flags.contains(&&args[i]) {
            // Drop the flag and its value, if it has one.
            i += if args.get(i + 1).is_some_and(|v| !v.starts_with("--")) {
                2
            } else {
                1
            };
            continue;
        }
        kept.push(args[i].clone());
        i += 1;
    }
    kept.extend(later.iter().cloned());
    *args = kept;
}

/// The run's translation dump: compressed (a plain one, from earlier versions, is compressed first).
pub fn compress_dump(dir: &Path) -> Result<PathBuf> {
    let gz = dir.join(DUMP_GZ);
    let plain = dir.join("test.dump.jsonl");
    if plain.is_file() {
        let bytes =
            std::fs::read(&plain).with_context(|| format!("{}: cannot read", plain.display()))?;
        let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        enc.write_all(&bytes)?;
        write_atomic(&gz, &enc.finish()?)?;
        std::fs::remove_file(&plain)
            .with_context(|| format!("{}: cannot remove", plain.display()))?;
    }
    Ok(gz)
}
