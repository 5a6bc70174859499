//! `cgnmt reproduce`: the paper's experiments from one plan file. It prepares the data, trains every system
//! with every seed (as `cgnmt train` child processes, `--jobs` at a time), decodes the test set with each best
//! model, runs the analyses (significance, gate correlation, context scaling, length groups, alignment error
//! rates, attention heatmaps, a blinded sample for subjective evaluation) and writes `results.json`,
//! `report.md` and a self-contained `report.html`. Every number in the report is read from the run files.
//!
//! The output directory is resumable: a finished run (`systems/<row>/seed-<s>/COMPLETE`, whose saved training
//! configuration, read through today's `Config`, is the plan's) is never trained again, a killed training resumes from its last
//! checkpoint, and a second `reproduce` on the same directory waits for nothing: it is refused while the first
//! holds the directory's lock. `--only ROW` trains a row again.

pub mod analyses;
pub mod plan;
pub mod report;

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use crate::config::Config;
use crate::train::checkpoint;
use plan::{slug, Plan, SystemSpec};

/// Arguments of `cgnmt reproduce`.
#[derive(clap::Args, Debug, Clone)]
pub struct ReproduceArgs {
    /// Output directory (prepared data, one directory per system and seed, analyses, report).
    #[arg(long)]
    pub out: PathBuf,
    /// Plan file (TOML): data, shared settings, systems, analyses.
    #[arg(long, default_value = "configs/reproduce/tatoeba.toml")]
    pub plan: PathBuf,
    /// Train each system with this many seeds (the plan's first N; more are numbered on from its last).
    #[arg(long, value_name = "N")]
    pub seeds: Option<usize>,
    /// Training budget per run in seconds (train.max_seconds), in addition to the plan's update limit.
    #[arg(long, value_name = "N")]
    pub budget_seconds: Option<f64>,
    /// The whole plan on the plan's tiny [quick] budget (seconds per system, one seed): for tests.
    #[arg(long)]
    pub quick: bool,
    /// Train this row again (its name as in the plan; repeatable); other finished runs are kept.
    #[arg(long, value_name = "ROW")]
    pub only: Vec<String>,
    /// Runs trained at the same time (each with cores / jobs threads).
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// Train nothing: write the analyses and report from the runs finished so far.
    #[arg(long)]
    pub report_only: bool,
    /// Data directory (default: $CGNMT_DATA or ../shared/data).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// No progress bars (one line per finished run instead).
    #[arg(short, long)]
    pub quiet: bool,
}

/// One training run: a system at a seed.
#[derive(Debug, Clone)]
pub struct Task {
    pub system: SystemSpec,
    pub seed: u64,
    pub dir: PathBuf,
    /// The training run this task decodes: its own (`dir/run`), or that of the row it is `from`.
    pub run: PathBuf,
    /// An ensemble row's members: the source row's training runs, one per seed.
    pub members: Vec<PathBuf>,
    /// The row's own decoding (`decode`, `average`, `ensemble`) and the extra test sets, as one string: a
    /// finished run whose marker has another is decoded again.
    pub decode_key: String,
    pub config: Config,
    /// Hash of the configuration and the decoding (names the run's analysis caches).
    pub fingerprint: String,
    pub beam: usize,
    pub test_sentences: usize,
}

/// What a finished run left (`result.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    pub system: String,
    pub seed: u64,
    /// Run directory relative to the output directory.
    pub dir: String,
    pub fingerprint: String,
    pub steps: u64,
    pub epochs: u64,
    pub best_step: u64,
    pub best_dev_bleu: Option<f64>,
    pub params: usize,
    pub train_seconds: f64,
    pub decode_seconds: f64,
    /// Test BLEU, NIST mteval-v11b, case-insensitive (the paper's metric).
    pub bleu: f64,
    /// sacreBLEU 13a, cased, with its signature.
    pub sacrebleu: f64,
    pub sacrebleu_signature: String,
    pub chrf: f64,
    pub hyp_words: usize,
    pub ref_words: f64,
    /// Dev evaluations: (step, dev BLEU).
    pub dev_curve: Vec<(u64, f64)>,
    /// Scores on the plan's extra test sets, in the plan's order.
    #[serde(default)]
    pub extra: Vec<TestScore>,
}

/// A run's scores on a test set.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TestScore {
    pub name: String,
    /// NIST mteval-v11b, case-insensitive.
    pub bleu: f64,
    pub sacrebleu: f64,
    pub chrf: f64,
    pub hyp_words: usize,
    pub ref_words: f64,
}

/// An extra test set as the runs read it (filtered, limited in quick mode).
#[derive(Debug, Clone)]
pub struct ExtraTestFiles {
    pub name: String,
    pub description: String,
    pub min_ref_words: usize,
    pub src: PathBuf,
    pub refs: Vec<PathBuf>,
    pub sentences: usize,
}

/// Everything the run needs besides the plan.
pub struct Setup {
    pub args: ReproduceArgs,
    pub plan: Plan,
    pub plan_text: String,
    pub out: PathBuf,
    pub data: crate::cmd::datasets::DataDir,
    pub exe: PathBuf,
    pub seeds: Vec<u64>,
    pub threads: usize,
    /// Test set (limited in quick mode): raw source, tokenised source, references.
    pub test_src: PathBuf,
    pub test_src_tok: PathBuf,
    pub test_refs: Vec<PathBuf>,
    pub extra_tests: Vec<ExtraTestFiles>,
}

/// Seconds spent in child processes (training, decoding, aligning) and in this process's own work.
#[derive(Default)]
pub struct Clock {
    work_ms: AtomicU64,
    own_ms: AtomicU64,
}

impl Clock {
    fn add_work(&self, d: Duration) {
        self.work_ms
            .fetch_add(d.as_millis() as u64, Ordering::Relaxed);
    }
    fn add_own(&self, d: Duration) {
        self.own_ms
            .fetch_add(d.as_millis() as u64, Ordering::Relaxed);
    }
    pub fn own_seconds(&self) -> f64 {
        self.own_ms.load(Ordering::Relaxed) as f64 / 1000.0
    }
    pub fn work_seconds(&self) -> f64 {
        self.work_ms.load(Ordering::Relaxed) as f64 / 1000.0
    }
}

pub fn run(args: ReproduceArgs, data_dir: crate::cmd::datasets::DataDir) -> Result<()> {
    let started = Instant::now();
    let invocation_id = format!(
        "{}-{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        std::process::id()
    );
    let plan_text = std::fs::read_to_string(&args.plan)
        .with_context(|| format!("{}: cannot read the plan", args.plan.display()))?;
    let plan = Plan::load(&args.plan)?;
    if args.jobs == 0 {
        bail!("--jobs must be at least 1");
    }
    if let Some(b) = args.budget_seconds {
        if !(b.is_finite() && b > 0.0) {
            bail!("--budget-seconds must be a positive number of seconds");
        }
    }
    for o in &args.only {
        if plan.system(o).is_none() {
            let names: Vec<&str> = plan.systems.iter().map(|s| s.name.as_str()).collect();
            bail!(
                "--only {o:?}: the plan has no such row (rows: {})",
                names.join(", ")
            );
        }
    }
    let seeds = choose_seeds(&plan, args.quick, args.seeds)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("{}: cannot create the output directory", args.out.display()))?;
    let _lock = DirLock::acquire(&args.out)?;
    let exe = std::env::current_exe().context("cannot find the cgnmt executable")?;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = (cores / args.jobs).max(1);
    let clock = Arc::new(Clock::default());
    let t_prep = Instant::now();
    let (test_src, test_src_tok, test_refs) =
        prepare_data(&plan, &args, &data_dir, &args.out, args.quiet)?;
    let extra_tests = prepare_extra_tests(&plan, &args, &data_dir, &args.out)?;
    clock.add_work(t_prep.elapsed());
    let setup = Setup {
        plan_text,
        out: args.out.clone(),
        data: data_dir,
        exe,
        seeds,
        threads,
        test_src,
        test_src_tok,
        test_refs,
        extra_tests,
        plan,
        args,
    };
    std::fs::write(setup.out.join("plan.toml"), &setup.plan_text)
        .with_context(|| format!("{}: cannot write", setup.out.join("plan.toml").display()))?;
    write_atomic(&setup.out.join(".gitignore"), gitignore(&[]).as_bytes())?;
    let tasks = make_tasks(&setup)?;
    for name in &setup.args.only {
        let dir = setup.out.join("systems").join(slug(name));
        if dir.exists() {
            std::fs::remove_dir_all(&dir)
                .with_context(|| format!("{}: cannot remove", dir.display()))?;
            eprintln!("--only: removed {} to train {name:?} again", dir.display());
        }
    }
    check_stale(&tasks)?;
    let (command, commit) = analyses::Invocation::this_process();
    if !setup.args.report_only {
        // The invocation's account so far, after each finished run: a killed invocation's time is counted too.
        let log_progress = || {
            let inv = analyses::Invocation {
                id: invocation_id.clone(),
                partial: true,
                wall_seconds: started.elapsed().as_secs_f64(),
                work_seconds: clock.work_seconds(),
                own_seconds: clock.own_seconds(),
                jobs: setup.args.jobs,
                report_only: false,
                command: command.clone(),
                commit: commit.clone(),
            };
            if let Ok(line) = serde_json::to_string(&inv) {
                if let Err(e) = append_line(&setup.out.join("invocations.jsonl"), &line) {
                    eprintln!("warning: {e:#}");
                }
            }
        };
        // Rows that decode other rows' models run once those are trained.
        let trained = tasks.iter().filter(|t| t.system.from.is_none()).count();
        run_tasks(&setup, &tasks[..trained], &clock, &log_progress)?;
        run_tasks(&setup, &tasks[trained..], &clock, &log_progress)?;
    }
    // Reproduce's own work from here on: scoring, tests, analyses and figures, less the child processes
    // (analysis decodes) they start.
    let t_own = Instant::now();
    let work_before = clock.work_seconds();
    let mut results = analyses::collect(&setup, &tasks, &clock)?;
    report::figures(&setup, &mut results)?;
    let own =
        t_own.elapsed().as_secs_f64() - (clock.work_seconds() - work_before) + clock.own_seconds();
    let timing = analyses::Invocation {
        id: invocation_id.clone(),
        partial: false,
        wall_seconds: started.elapsed().as_secs_f64(),
        work_seconds: clock.work_seconds(),
        own_seconds: own,
        jobs: setup.args.jobs,
        report_only: setup.args.report_only,
        command,
        commit,
    };
    let results = analyses::finish(&setup, results, timing)?;
    write_atomic(
        &setup.out.join(".gitignore"),
        gitignore(&results.dumps_read).as_bytes(),
    )?;
    report::write(&setup, &results)?;
    let done = results.runs.len();
    eprintln!(
        "{} of {} runs finished; report: {} and {}",
        done,
        tasks.len(),
        setup.out.join("report.md").display(),
        setup.out.join("report.html").display()
    );
    if done < tasks.len() && !setup.args.report_only {
        bail!(
            "{} runs did not finish (see the messages above)",
            tasks.len() - done
        );
    }
    Ok(())
}

fn choose_seeds(plan: &Plan, quick: bool, n: Option<usize>) -> Result<Vec<u64>> {
    let mut seeds = if quick && !plan.quick.seeds.is_empty() {
        plan.quick.seeds.clone()
    } else if quick {
        vec![plan.seeds[0]]
    } else {
        plan.seeds.clone()
    };
    if let Some(n) = n {
        if n == 0 {
            bail!("--seeds must be at least 1");
        }
        let source = if quick { &plan.seeds } else { &seeds };
        let mut s: Vec<u64> = source.iter().copied().take(n).collect();
        while s.len() < n {
            let next = s.iter().max().copied().unwrap_or(0) + 1;
            s.push(next);
        }
        seeds = s;
    }
    Ok(seeds)
}

/// An exclusive lock on the output directory (`flock` on `DIR/.lock`), released when dropped or when the
/// process dies.
struct DirLock(#[allow(dead_code)] std::fs::File);

impl DirLock {
    fn acquire(dir: &Path) -> Result<DirLock> {
        let p = dir.join(".lock");
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&p)
            .with_context(|| format!("{}: cannot open", p.display()))?;
        #[cfg(unix)]
        {
            use std::os::unix::io::AsRawFd;
            // SAFETY: flock on a file descriptor this function owns.
            let r = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if r != 0 {
                bail!(
                    "{}: another `cgnmt reproduce` is working in this directory",
                    dir.display()
                );
            }
        }
        Ok(DirLock(f))
    }
}

/// `cgnmt prepare` into `OUT/prepared` (once; the arguments' fingerprint is kept beside it), and the test
/// files the runs decode and score.
fn prepare_data(
    plan: &Plan,
    args: &ReproduceArgs,
    data: &crate::cmd::datasets::DataDir,
    out: &Path,
    quiet: bool,
) -> Result<(PathBuf, PathBuf, Vec<PathBuf>)> {
    let d = &plan.data;
    let file = |rel: &str| {
        data.file(rel)
            .context("the plan's data paths are relative to the data directory")
    };
    let prepared = out.join("prepared");
    prepare_corpus(plan, args, data, &prepared, &[], quiet)?;
    // Rows with their own `prepare` arguments (e.g. BPE) read their own prepared directories.
    let mut done = std::collections::BTreeSet::new();
    for sys in &plan.systems {
        if !sys.prepare.is_empty() && done.insert(sys.prepare.clone()) {
            prepare_corpus(
                plan,
                args,
                data,
                &out.join(prepared_name(&sys.prepare)),
                &sys.prepare,
                quiet,
            )?;
        }
    }
    // Test files: the raw source, the tokenised source (for word counts) and the references, limited in
    // quick mode.
    let limit = test_limit(plan, args);
    let tdir = out.join("test");
    std::fs::create_dir_all(&tdir).with_context(|| format!("{}: cannot create", tdir.display()))?;
    let copy = |from: &Path, to: PathBuf| -> Result<PathBuf> {
        let lines = cgnmt_data::corpus::read_lines(from)?;
        let n = lines.len().min(limit);
        let mut text = lines[..n].join("\n");
        text.push('\n');
        write_atomic(&to, text.as_bytes())?;
        Ok(to)
    };
    let src = copy(&file(&d.test_src)?, tdir.join("src.txt"))?;
    let src_tok = copy(&prepared.join("test.src"), tdir.join("src.tok"))?;
    let mut refs = vec![];
    for (k, r) in d.test_refs.iter().enumerate() {
        refs.push(copy(&file(r)?, tdir.join(format!("ref{k}.txt")))?);
    }
    let n_src = cgnmt_data::corpus::read_lines(&src)?.len();
    for r in refs.iter().chain([&src_tok]) {
        let n = cgnmt_data::corpus::read_lines(r)?.len();
        if n != n_src {
            bail!(
                "{}: {n} lines, but the test source has {n_src}",
                r.display()
            );
        }
    }
    Ok((src, src_tok, refs))
}

/// The test sentences a run decodes at most: the quick budget's limit, else all.
fn test_limit(plan: &Plan, args: &ReproduceArgs) -> usize {
    if args.quick && plan.quick.test_limit > 0 {
        plan.quick.test_limit
    } else {
        usize::MAX
    }
}

/// The prepared directory of a row's own `prepare` arguments: `prepared-` and a hash of them.
fn prepared_name(extra: &[String]) -> String {
    format!(
        "prepared-{}",
        &plan::fingerprint(&extra.join("\u{1f}"))[..8]
    )
}

/// `cgnmt prepare` of the plan's corpus into `prepared` with the plan's arguments and `extra`, unless it holds
/// that preparation already.
fn prepare_corpus(
    plan: &Plan,
    args: &ReproduceArgs,
    data: &crate::cmd::datasets::DataDir,
    prepared: &Path,
    extra: &[String],
    quiet: bool,
) -> Result<()> {
    let d = &plan.data;
    let file = |rel: &str| {
        data.file(rel)
            .context("the plan's data paths are relative to the data directory")
    };
    let s = |p: PathBuf| p.display().to_string();
    let prepared = prepared.to_path_buf();
    let mut pargs: Vec<String> = vec![
        "prepare".into(),
        "--src".into(),
        s(file(&d.train_src)?),
        "--tgt".into(),
        s(file(&d.train_tgt)?),
        "--dev-src".into(),
        s(file(&d.dev_src)?),
        "--dev-tgt".into(),
        s(file(&d.dev_tgt)?),
        "--test-src".into(),
        s(file(&d.test_src)?),
        "--test-tgt".into(),
        s(file(
            &d.test_refs.first().context("data.test_refs is empty")?,
        )?),
        "--src-lang".into(),
        d.src_lang.clone(),
        "--tgt-lang".into(),
        d.tgt_lang.clone(),
    ];
    pargs.extend(d.prepare.iter().cloned());
    if args.quick {
        overriding(&mut pargs, &plan.quick.prepare);
    }
    overriding(&mut pargs, extra);
    // The fingerprint leaves out where the data directory is, so a moved checkout keeps its runs.
    let fp = plan::fingerprint(
        &pargs
            .iter()
            .map(|a| a.strip_prefix(&s(data.root.clone())).unwrap_or(a))
            .collect::<Vec<_>>()
            .join("\u{1f}"),
    );
    let fp_file = prepared.join("reproduce.fingerprint");
    let have = std::fs::read_to_string(&fp_file).ok();
    if have.as_deref().map(str::trim) != Some(fp.as_str()) {
        if prepared.exists() {
            if have.is_some() {
                bail!(
                    "{}: prepared with other settings (another plan, or --quick); choose another --out",
                    prepared.display()
                );
            }
            std::fs::remove_dir_all(&prepared)
                .with_context(|| format!("{}: cannot remove", prepared.display()))?;
        }
        if !quiet {
            eprintln!("== preparing the data into {}", prepared.display());
        }
        pargs.push("--out".into());
        pargs.push(s(prepared.clone()));
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: cgnmt_data::prepare::PrepareArgs,
        }
        let p = <P as clap::Parser>::try_parse_from(&pargs)
            .map_err(|e| anyhow::anyhow!("data.prepare: {e}"))?;
        cgnmt_data::prepare::run_prepare(&p.a)?;
        std::fs::write(&fp_file, &fp)
            .with_context(|| format!("{}: cannot write", fp_file.display()))?;
    }
    Ok(())
}

/// The plan's extra test sets under `out/test/`: the pairs kept by each set's length filter (limited in quick
/// mode). Misaligned files are refused, naming them.
fn prepare_extra_tests(
    plan: &Plan,
    args: &ReproduceArgs,
    data: &crate::cmd::datasets::DataDir,
    out: &Path,
) -> Result<Vec<ExtraTestFiles>> {
    let limit = test_limit(plan, args);
    let tdir = out.join("test");
    let mut sets = vec![];
    for x in &plan.data.extra_tests {
        let file = |rel: &str| {
            data.file(rel)
                .context("the plan's data paths are relative to the data directory")
        };
        let src_path = file(&x.src)?;
        let src = cgnmt_data::corpus::read_lines(&src_path)?;
        let mut refs = vec![];
        for r in &x.refs {
            let p = file(r)?;
            let lines = cgnmt_data::corpus::read_lines(&p)?;
            if lines.len() != src.len() {
                bail!(
                    "extra_test {:?}: {} has {} lines, but {} has {}",
                    x.name,
                    p.display(),
                    lines.len(),
                    src_path.display(),
                    src.len()
                );
            }
            refs.push(lines);
        }
        let keep: Vec<usize> = (0..src.len())
            .filter(|&i| refs[0][i].split_whitespace().count() > x.min_ref_words)
            .take(limit)
            .collect();
        if keep.is_empty() {
            bail!(
                "extra_test {:?}: no pair of {} has a reference longer than {} words",
                x.name,
                src_path.display(),
                x.min_ref_words
            );
        }
        std::fs::create_dir_all(&tdir)
            .with_context(|| format!("{}: cannot create", tdir.display()))?;
        let write = |lines: &[String], name: String| -> Result<PathBuf> {
            let mut text = keep
                .iter()
                .map(|&i| lines[i].as_str())
                .collect::<Vec<_>>()
                .join("\n");
            text.push('\n');
            let p = tdir.join(name);
            write_atomic(&p, text.as_bytes())?;
            Ok(p)
        };
        let src_file = write(&src, format!("{}.src.txt", x.name))?;
        let mut ref_files = vec![];
        for (k, r) in refs.iter().enumerate() {
            ref_files.push(write(r, format!("{}.ref{k}.txt", x.name))?);
        }
        sets.push(ExtraTestFiles {
            name: x.name.clone(),
            description: x.description.clone(),
            min_ref_words: x.min_ref_words,
            src: src_file,
            refs: ref_files,
            sentences: keep.len(),
        });
    }
    Ok(sets)
}

pub use crate::atomic_file::write_atomic;

/// The runs in the order they are trained: table by table, seed by seed, row by row (so a table's rows are
/// complete with every seed before the next table starts).
fn make_tasks(s: &Setup) -> Result<Vec<Task>> {
    let test_sentences = cgnmt_data::corpus::read_lines(&s.test_src)?.len();
    let seeds_of = |sys: &SystemSpec| -> Vec<u64> {
        let own = sys.seeds.unwrap_or(usize::MAX);
        let from = sys
            .from
            .as_deref()
            .and_then(|f| s.plan.system(f))
            .and_then(|f| f.seeds)
            .unwrap_or(usize::MAX);
        s.seeds.iter().copied().take(own.min(from)).collect()
    };
    let run_dir = |sys: &str, seed: u64| {
        s.out
            .join("systems")
            .join(slug(sys))
            .join(format!("seed-{seed}"))
    };
    let extra_key: String = s
        .extra_tests
        .iter()
        .map(|x| format!("{}:{}", x.name, x.sentences))
        .collect::<Vec<_>>()
        .join(",");
    let mut train = vec![];
    let mut decode = vec![];
    for table in s.plan.table_ids() {
        for &seed in &s.seeds {
            for sys in s.plan.systems.iter().filter(|x| x.table == table) {
                if !seeds_of(sys).contains(&seed) {
                    continue;
                }
                // An ensemble is one result, named by its first seed.
                if sys.ensemble && seed != seeds_of(sys)[0] {
                    continue;
                }
                let trained = sys
                    .from
                    .as_deref()
                    .and_then(|f| s.plan.system(f))
                    .unwrap_or(sys);
                let prepared = if trained.prepare.is_empty() {
                    s.out.join("prepared")
                } else {
                    s.out.join(prepared_name(&trained.prepare))
                };
                let mut sets = vec![
                    format!("data.prepared={:?}", prepared.display().to_string()),
                    format!("train.seed={seed}"),
                ];
                if let Some(b) = s.args.budget_seconds {
                    sets.push(format!("train.max_seconds={b}"));
                }
                let config = s.plan.config(sys, s.args.quick, &sets)?;
                let mut decode_key = String::new();
                if !sys.decode.is_empty() {
                    decode_key += &format!("decode={};", sys.decode.join(" "));
                }
                if sys.average > 0 {
                    decode_key += &format!("average={};", sys.average);
                }
                if sys.ensemble {
                    decode_key += &format!("ensemble={:?};", seeds_of(sys));
                }
                if sys.choose {
                    decode_key += "choose;";
                }
                if !extra_key.is_empty() {
                    decode_key += &format!("extra={extra_key};");
                }
                let fingerprint = plan::fingerprint(&format!(
                    "{}\nbeam={}\ntest={test_sentences}{}",
                    identity_toml(&config),
                    s.plan.decode.beam,
                    if decode_key.is_empty() {
                        String::new()
                    } else {
                        format!("\n{decode_key}")
                    }
                ));
                let dir = run_dir(&sys.name, seed);
                let (run, members) = match &sys.from {
                    Some(f) => (
                        run_dir(f, seed).join("run"),
                        if sys.ensemble {
                            seeds_of(sys)
                                .iter()
                                .map(|&x| run_dir(f, x).join("run"))
                                .collect()
                        } else {
                            vec![]
                        },
                    ),
                    None => (dir.join("run"), vec![]),
                };
                let task = Task {
                    dir,
                    run,
                    members,
                    decode_key,
                    system: sys.clone(),
                    seed,
                    config,
                    fingerprint,
                    beam: s.plan.decode.beam,
                    test_sentences,
                };
                if sys.from.is_some() {
                    decode.push(task);
                } else {
                    train.push(task);
                }
            }
        }
    }
    train.extend(decode);
    Ok(train)
}

/// A configuration as it decides a run's result: without the thread count and the prepared directory's
/// location.
fn identity_toml(c: &Config) -> String {
    let mut c = c.clone();
    c.train.threads = 0;
    // Its name only: `prepared`, or a row's own `prepared-HASH` of its `prepare` arguments.
    c.data.prepared = PathBuf::from(c.data.prepared.file_name().unwrap_or("prepared".as_ref()));
    c.to_toml()
}

/// The configuration a run was trained with, beside its record (a copy of its last checkpoint's).
const RECORD_CONFIG: &str = "config.toml";
/// The test set's translation dump (attention, gates), gzip-compressed.
pub const DUMP_GZ: &str = "test.dump.jsonl.gz";

/// The paths left out when an output directory is kept under version control: checkpoints, prepared data and
/// raw alignments are large and can be made again; the records (configuration, result, hypotheses, compressed
/// dump, logs) and the analysis caches are enough to write the report again and to tell a finished run.
const GITIGNORE: &str = "\
# Written by `cgnmt reproduce`: what to leave out when this directory is kept under version control.
# Checkpoints, prepared data and most dumps are large and can be made again; each run's record (config.toml,
# result.json, test.hyp, train.log, COMPLETE), the dumps the analyses read and the analysis caches are enough to
# write the report again. A run whose checkpoints are gone stays finished; a larger budget means training again.
.lock
prepared/
prepared-*/
test/
systems/*/*/run/
analyses/alignment/*/*.soft.jsonl
analyses/alignment/*/*.talp
systems/*/*/test.dump.jsonl.gz
";

/// The `.gitignore`: [`GITIGNORE`], keeping the dumps the analyses read (named by run directory).
fn gitignore(dumps_read: &[String]) -> String {
    let mut s = GITIGNORE.to_string();
    if !dumps_read.is_empty() {
        s.push_str("# The dumps the report's analyses read (the others, about 1 MB each, can be made again):\n");
        for d in dumps_read {
            s.push_str(&format!("!{d}/{DUMP_GZ}\n"));
        }
    }
    s
}

/// A finished run's marker.
#[derive(Debug, Serialize, Deserialize)]
struct Complete {
    fingerprint: String,
    /// The decoding it was scored with (absent in the markers of early versions).
    #[serde(default)]
    beam: Option<usize>,
    #[serde(default)]
    test_sentences: Option<usize>,
    /// The row's own decoding and the extra test sets ([`Task::decode_key`]; absent: none).
    #[serde(default)]
    decode: String,
}

impl Complete {
    fn decoded_as(&self, t: &Task) -> bool {
        self.beam.is_none_or(|b| b == t.beam)
            && self.test_sentences.is_none_or(|n| n == t.test_sentences)
            && self.decode == t.decode_key
    }
}

/// How a run directory's training relates to the configuration a task wants. The saved configuration is read
/// through today's `Config`, so keys added since (with their defaults) do not make a finished run stale.
enum RunMatch {
    Same,
    /// The same system with a larger budget: training goes on from the last checkpoint.
    Continues,
    Other(String),
}

fn run_match(t: &Task) -> Result<Option<RunMatch>> {
    let Some(dir) = checkpoint::complete_dir(&t.run.join("last")) else {
        // A kept record without its checkpoints (they are not put under version control): the configuration
        // it was trained with is beside it, and only the same configuration is that run.
        let record = t.dir.join(RECORD_CONFIG);
        if !record.is_file() || !t.dir.join("COMPLETE").is_file() {
            return Ok(None);
        }
        let saved = Config::load(Some(&record), &[])?;
        return Ok(Some(if identity_toml(&saved) == identity_toml(&t.config) {
            RunMatch::Same
        } else if design_toml(&saved) == design_toml(&t.config) {
            RunMatch::Other(
                "was trained with another budget and its checkpoints were not kept, so it cannot go on".into(),
            )
        } else {
            RunMatch::Other("holds a training run of another configuration".into())
        }));
    };
    let saved = Config::load(Some(&dir.join(checkpoint::CONFIG_FILE)), &[])?;
    if identity_toml(&saved) == identity_toml(&t.config) {
        return Ok(Some(RunMatch::Same));
    }
    let state = checkpoint::load_state(&dir)?;
    Ok(Some(match check_continues(&saved, &state, &t.config) {
        Ok(()) => RunMatch::Continues,
        Err(why) => RunMatch::Other(why),
    }))
}

/// A configuration without its budget (updates, seconds, epochs): what a longer run shares with a shorter.
fn design_toml(c: &Config) -> String {
    let mut c = c.clone();
    c.train.max_steps = 0;
    c.train.max_seconds = 0.0;
    c.train.max_epochs = 0;
    identity_toml(&c)
}

/// Whether a run trained with `saved` to `state` can go on to be the run of `wanted`: the same design and a
/// budget it has not passed yet.
fn check_continues(
    saved: &Config,
    state: &checkpoint::TrainState,
    wanted: &Config,
) -> std::result::Result<(), String> {
    if design_toml(saved) != design_toml(wanted) {
        return Err("holds a training run of another configuration".into());
    }
    let w = &wanted.train;
    if (w.max_steps > 0 && state.step > w.max_steps as u64)
        || (w.max_seconds > 0.0 && state.seconds > w.max_seconds + 60.0)
    {
        return Err(format!(
            "trained further ({} updates, {:.0} s) than the plan's budget",
            state.step, state.seconds
        ));
    }
    Ok(())
}

/// Finished runs that no longer match the plan: a larger budget for the same system continues the run, other
/// decoding settings decode again (their markers are removed); a run of another configuration was made by
/// another plan and is refused rather than mixed into this report.
fn check_stale(tasks: &[Task]) -> Result<()> {
    for t in tasks {
        let Some(c) = read_complete(&t.dir)? else {
            continue;
        };
        let m = run_match(t)?;
        let note = match m {
            Some(RunMatch::Same) if c.decoded_as(t) => continue,
            Some(RunMatch::Same) => "the plan decodes otherwise now; its test set is decoded again",
            Some(RunMatch::Continues) => {
                "the plan's budget grew; its run goes on from its last checkpoint"
            }
            Some(RunMatch::Other(why)) => bail!(
                "{}: {why} than the plan now gives {:?}; train it again with --only {:?}, or use another --out",
                t.dir.display(),
                t.system.name,
                t.system.name
            ),
            None => bail!(
                "{}: marked finished but neither its checkpoint nor its {RECORD_CONFIG} is there; train it again \
                 with --only {:?}",
                t.dir.display(),
                t.system.name
            ),
        };
        eprintln!("{} seed {}: {note}", t.system.name, t.seed);
        std::fs::remove_file(t.dir.join("COMPLETE"))
            .with_context(|| format!("{}: cannot remove COMPLETE", t.dir.display()))?;
    }
    Ok(())
}

fn read_complete(dir: &Path) -> Result<Option<Complete>> {
    let p = dir.join("COMPLETE");
    if !p.is_file() {
        return Ok(None);
    }
    let text =
        std::fs::read_to_string(&p).with_context(|| format!("{}: cannot read", p.display()))?;
    Ok(Some(serde_json::from_str(&text).with_context(|| {
        format!(
            "{}: not a COMPLETE marker written by cgnmt reproduce",
            p.display()
        )
    })?))
}

pub fn is_complete(t: &Task) -> bool {
    matches!(read_complete(&t.dir), Ok(Some(c)) if c.decoded_as(t))
        && matches!(run_match(t), Ok(Some(RunMatch::Same)))
}

pub fn read_result(t: &Task) -> Result<RunResult> {
    let p = t.dir.join("result.json");
    let text =
        std::fs::read_to_string(&p).with_context(|| format!("{}: cannot read", p.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{}: malformed", p.display()))
}

/// Train and decode every unfinished run, `--jobs` at a time, with progress bars (or one line per run).
fn run_tasks(
    s: &Setup,
    tasks: &[Task],
    clock: &Arc<Clock>,
    on_finished: &(dyn Fn() + Sync),
) -> Result<()> {
    let todo: Vec<&Task> = tasks.iter().filter(|t| !is_complete(t)).collect();
    if todo.is_empty() {
        return Ok(());
    }
    let steps_of = |t: &Task| t.config.train.max_steps.max(1) as u64;
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
    let next = AtomicUsize::new(0);
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
                    let k = next.fetch_add(1, Ordering::SeqCst);
                    let Some(t) = todo.get(k) else { break };
                    let mut report_step = |step: u64, phase: &str| {
                        bar.set_message(format!(
                            "{} · seed {} · {phase} · update {step}/{}",
                            t.system.name,
                            t.seed,
                            steps_of(t)
                        ));
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
                    match run_task(s, t, clock, &mut report_step) {
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
fn child(exe: &Path, args: &[String], log: &Path, threads: usize) -> Result<Command> {
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
fn last_logged_step(log: &Path) -> Option<u64> {
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
fn run_task(
    s: &Setup,
    t: &Task,
    clock: &Clock,
    progress: &mut dyn FnMut(u64, &str),
) -> Result<RunResult> {
    std::fs::create_dir_all(&t.dir)
        .with_context(|| format!("{}: cannot create", t.dir.display()))?;
    let run = t.run.clone();
    let log = t.dir.join("output.log");
    let cfg_path = t.dir.join("config.toml");
    let mut cfg = t.config.clone();
    cfg.train.threads = s.threads;
    let last = checkpoint::complete_dir(&run.join("last"));
    let train_args: Option<Vec<String>> = match &last {
        Some(dir) => {
            let saved = Config::load(Some(&dir.join(checkpoint::CONFIG_FILE)), &[])?;
            let state = checkpoint::load_state(dir)?;
            check_continues(&saved, &state, &t.config).map_err(|why| {
                anyhow::anyhow!(
                    "{}: {why}; remove it or train the row again with --only {:?}",
                    run.display(),
                    t.system.name
                )
            })?;
            if state.finished && identity_toml(&saved) == identity_toml(&t.config) {
                None
            } else {
                // Unfinished, or finished with a smaller budget than the plan's now: go on from the last
                // checkpoint (with no learning-rate schedule this is the longer run itself).
                let tc = &t.config.train;
                Some(vec![
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
                ])
            }
        }
        None => {
            if run.exists() {
                // Started but killed before its first checkpoint: nothing to keep.
                std::fs::remove_dir_all(&run)
                    .with_context(|| format!("{}: cannot remove", run.display()))?;
            }
            write_atomic(&cfg_path, cfg.to_toml().as_bytes())?;
            Some(vec![
                "train".into(),
                "--quiet".into(),
                "-c".into(),
                cfg_path.display().to_string(),
                "--out".into(),
                run.display().to_string(),
            ])
        }
    };
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
    for m in &t.members {
        if !checkpoint::load_state(&checkpoint::complete_dir(&m.join("last")).with_context(
            || {
                format!(
                    "{}: an ensemble member has no complete checkpoint",
                    m.display()
                )
            },
        )?)?
        .finished
        {
            bail!(
                "{}: an ensemble member has not finished training",
                m.display()
            );
        }
    }
    if let Some(a) = train_args {
        let t0 = Instant::now();
        let train_log = run.join("train.log");
        run_child(&s.exe, &a, &log, s.threads, clock, || {
            progress(last_logged_step(&train_log).unwrap_or(0), "training")
        })?;
        timing.train_seconds += t0.elapsed().as_secs_f64();
        write_atomic(&timing_path, serde_json::to_string(&timing)?.as_bytes())?;
    }
    // The record: the configuration the run was trained with (after a longer budget, the longer one) and its
    // training log, beside the checkpoints that are not kept under version control.
    let last = checkpoint::complete_dir(&run.join("last"))
        .with_context(|| format!("{}: training left no complete checkpoint", run.display()))?;
    for (from, to) in [
        (
            last.join(checkpoint::CONFIG_FILE),
            t.dir.join(RECORD_CONFIG),
        ),
        (run.join("train.log"), t.dir.join("train.log")),
    ] {
        if from.is_file() {
            let bytes =
                std::fs::read(&from).with_context(|| format!("{}: cannot read", from.display()))?;
            write_atomic(&to, &bytes)?;
        }
    }
    progress(t.config.train.max_steps as u64, "decoding the test set");
    let best_of = |run: &Path| {
        if run.join("best").is_dir() {
            run.join("best")
        } else {
            run.join("last")
        }
    };
    let t0 = Instant::now();
    // The average of the last checkpoints a run kept, made once into `out` (beside the row's own
    // checkpoints).
    let averaged = |run: &Path, out: PathBuf| -> Result<PathBuf> {
        if checkpoint::complete_dir(&out).is_some() {
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
        run_child(&s.exe, &aargs, &log, s.threads, clock, || {})?;
        Ok(out)
    };
    // The models that decode: the run's best (or its average), or every ensemble member's.
    let models: Vec<PathBuf> = if t.members.is_empty() {
        // (A row that chooses on dev considers the kept checkpoints itself, as many as the run kept.)
        vec![if t.system.average > 0 && !t.system.choose {
            averaged(&run, t.dir.join("run").join("averaged"))?
        } else {
            best_of(&run)
        }]
    } else {
        let mut v = vec![];
        for (i, m) in t.members.iter().enumerate() {
            v.push(if t.system.average > 0 {
                averaged(m, t.dir.join("run").join(format!("averaged-{i}")))?
            } else {
                best_of(m)
            });
        }
        v
    };
    // A row that asks for it: the model and its penalties chosen on dev.
    let mut decode_args = t.system.decode.clone();
    let models = if t.system.choose {
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
        let sel_file = t.dir.join(crate::train::selection::SELECTION_FILE);
        let mut sargs: Vec<String> = vec![
            "select".into(),
            "--run".into(),
            run.display().to_string(),
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
        run_child(&s.exe, &sargs, &log, s.threads, clock, || {})?;
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
        vec![PathBuf::from(dir)]
    } else {
        models
    };
    let best = models[0].clone();
    let hyp = t.dir.join("test.hyp");
    let dump = t.dir.join("test.dump.jsonl");
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
        run_child(&s.exe, &targs, &log, s.threads, clock, || {})
    };
    translate(&s.test_src, &hyp, Some(&dump))?;
    for x in &s.extra_tests {
        translate(&x.src, &t.dir.join(format!("test-{}.hyp", x.name)), None)?;
    }
    timing.decode_seconds = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    compress_dump(&t.dir)?;
    clock.add_own(t1.elapsed());
    let t0 = Instant::now();
    let r = analyses::score_run(s, t, &run, &best, &timing)?;
    clock.add_own(t0.elapsed());
    write_atomic(
        &t.dir.join("result.json"),
        serde_json::to_string_pretty(&r)?.as_bytes(),
    )?;
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

/// Append `later` to the `prepare` arguments `args`, a flag of `later` replacing the same flag (and its value)
/// in `args`: the quick settings' `--limit` wins over the plan's own.
fn overriding(args: &mut Vec<String>, later: &[String]) {
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

/// Wall time of a run's child processes (training adds up over resumed attempts).
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
pub struct Timing {
    pub train_seconds: f64,
    pub decode_seconds: f64,
}

/// Append a line to a file (used for the invocation log).
pub fn append_line(p: &Path, line: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(p)
        .with_context(|| format!("{}: cannot open", p.display()))?;
    writeln!(f, "{line}").with_context(|| format!("{}: cannot write", p.display()))
}

#[cfg(test)]
mod tests {
    #[test]
    fn later_prepare_flags_replace_earlier_ones() {
        let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut a = v(&[
            "--src",
            "s",
            "--limit",
            "100000",
            "--max-len",
            "50",
            "--force",
        ]);
        super::overriding(&mut a, &v(&["--limit", "1500", "--force"]));
        assert_eq!(
            a,
            v(&[
                "--src",
                "s",
                "--max-len",
                "50",
                "--limit",
                "1500",
                "--force"
            ])
        );
        let mut b = v(&["--src", "s"]);
        super::overriding(&mut b, &v(&["--bpe-src", "6000"]));
        assert_eq!(b, v(&["--src", "s", "--bpe-src", "6000"]));
    }

    use super::*;

    fn task(dir: &Path, sets: &[&str]) -> Task {
        let config = Config::load(
            None,
            &sets.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
        .unwrap();
        Task {
            system: plan::SystemSpec {
                name: "GRU".into(),
                table: "2".into(),
                set: vec![],
                baseline: None,
                paper: None,
                prepare: vec![],
                seeds: None,
                from: None,
                decode: vec![],
                average: 0,
                ensemble: false,
                choose: false,
            },
            seed: 1,
            dir: dir.to_path_buf(),
            run: dir.join("run"),
            members: vec![],
            decode_key: String::new(),
            config,
            fingerprint: "f".into(),
            beam: 10,
            test_sentences: 5,
        }
    }

    #[test]
    fn a_finished_run_stays_finished_when_configuration_keys_are_added() {
        let tmp = tempfile::tempdir().unwrap();
        let t = task(tmp.path(), &["train.max_steps=100"]);
        let last = tmp.path().join("run/last");
        std::fs::create_dir_all(&last).unwrap();
        // The configuration as an older version saved it: without a key added since.
        let old: String = t
            .config
            .to_toml()
            .lines()
            .filter(|l| !l.starts_with("on_divergence"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_ne!(old, t.config.to_toml());
        std::fs::write(last.join(checkpoint::CONFIG_FILE), old).unwrap();
        let mut state = checkpoint::TrainState {
            step: 100,
            finished: true,
            ..Default::default()
        };
        std::fs::write(
            last.join(checkpoint::STATE_FILE),
            serde_json::to_string(&state).unwrap(),
        )
        .unwrap();
        std::fs::write(last.join(checkpoint::COMPLETE_FILE), "").unwrap();
        // An early marker (fingerprint only).
        std::fs::write(tmp.path().join("COMPLETE"), r#"{"fingerprint":"0"}"#).unwrap();
        assert!(is_complete(&t));
        check_stale(std::slice::from_ref(&t)).unwrap();
        assert!(tmp.path().join("COMPLETE").is_file());
        // Another decoding decodes again; a larger budget continues; another model is refused.
        std::fs::write(
            tmp.path().join("COMPLETE"),
            r#"{"fingerprint":"0","beam":5,"test_sentences":5}"#,
        )
        .unwrap();
        assert!(!is_complete(&t));
        let longer = task(tmp.path(), &["train.max_steps=200"]);
        assert!(matches!(
            run_match(&longer).unwrap(),
            Some(RunMatch::Continues)
        ));
        state.step = 300;
        std::fs::write(
            last.join(checkpoint::STATE_FILE),
            serde_json::to_string(&state).unwrap(),
        )
        .unwrap();
        assert!(matches!(
            run_match(&longer).unwrap(),
            Some(RunMatch::Other(_))
        ));
        let other = task(tmp.path(), &["train.max_steps=100", "model.hidden_dim=8"]);
        assert!(matches!(
            run_match(&other).unwrap(),
            Some(RunMatch::Other(_))
        ));
    }

    #[test]
    fn a_kept_record_without_checkpoints_stays_finished_for_its_own_configuration_only() {
        let tmp = tempfile::tempdir().unwrap();
        let t = task(tmp.path(), &["train.max_steps=100"]);
        // No marker, no record: nothing.
        assert!(run_match(&t).unwrap().is_none());
        let mut saved = t.config.clone();
        saved.train.threads = 7;
        saved.data.prepared = PathBuf::from("/elsewhere/prepared");
        std::fs::write(tmp.path().join(RECORD_CONFIG), saved.to_toml()).unwrap();
        assert!(
            run_match(&t).unwrap().is_none(),
            "a record without its marker is not finished"
        );
        std::fs::write(
            tmp.path().join("COMPLETE"),
            r#"{"fingerprint":"f","beam":10,"test_sentences":5}"#,
        )
        .unwrap();
        assert!(is_complete(&t));
        check_stale(std::slice::from_ref(&t)).unwrap();
        assert!(tmp.path().join("COMPLETE").is_file());
        // A larger budget cannot go on without the checkpoint, and another model is another run: both are
        // refused by name rather than trained over.
        for other in [
            task(tmp.path(), &["train.max_steps=200"]),
            task(tmp.path(), &["train.max_steps=100", "model.hidden_dim=8"]),
        ] {
            assert!(matches!(
                run_match(&other).unwrap(),
                Some(RunMatch::Other(_))
            ));
            let e = check_stale(std::slice::from_ref(&other))
                .unwrap_err()
                .to_string();
            assert!(e.contains("--only \"GRU\""), "{e}");
        }
    }

    #[test]
    fn a_plain_dump_is_compressed_once_and_reads_back() {
        let tmp = tempfile::tempdir().unwrap();
        let line = r#"{"id":0,"src":["a"],"hyp":["b"],"attention":[[1.0]],"gates":[0.5]}"#;
        std::fs::write(tmp.path().join("test.dump.jsonl"), format!("{line}\n")).unwrap();
        let gz = compress_dump(tmp.path()).unwrap();
        assert!(!tmp.path().join("test.dump.jsonl").exists());
        assert_eq!(&std::fs::read(&gz).unwrap()[..2], &[0x1f, 0x8b]);
        assert_eq!(compress_dump(tmp.path()).unwrap(), gz);
        assert_eq!(
            cgnmt_data::corpus::read_lines(&gz).unwrap(),
            vec![line.to_string()]
        );
    }
}
