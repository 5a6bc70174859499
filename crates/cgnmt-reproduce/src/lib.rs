//! `cgnmt reproduce`: the paper's experiments from one plan file. It prepares the data, trains every system
//! with every seed (as `cgnmt train` child processes, `--jobs` at a time), decodes the test set with each best
//! model, runs the analyses (significance, gate correlation, context scaling, length groups, alignment error
//! rates, attention heatmaps, a blinded sample for subjective evaluation) and writes `results.json`,
//! `report.md` and a self-contained `report.html` (named for the seeds, `report-seeds-1-2.md`, when `--seeds`
//! asks for fewer than the plan has). Every number in the report is read from the run files.
//!
//! The output directory is resumable: a finished run (`systems/<row>/seed-<s>/COMPLETE`, whose saved training
//! configuration, read through today's `Config`, is the plan's) is never trained again, a killed training resumes from its last
//! checkpoint, and a second `reproduce` on the same directory waits for nothing: it is refused while the first
//! holds the directory's lock. `--only ROW` trains a row again.

pub mod analyses;
mod data;
pub mod demo;
mod extra_tests;
pub mod plan;
mod records;
pub mod report;
pub mod results;
mod runner;

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde::{Deserialize, Serialize};

use cgnmt::config::Config;
use cgnmt::train::checkpoint;
use plan::{slug, Plan, SystemSpec};

use data::*;
use records::*;
pub use records::{is_complete, read_result, DUMP_GZ};
use runner::*;
pub use runner::{compress_dump, fmt_duration, run_child};

/// What `cgnmt reproduce` is asked to do (its command-line arguments).
#[derive(Debug, Clone)]
pub struct ReproduceOptions {
    /// Output directory (prepared data, one directory per system and seed, analyses, report).
    pub out: PathBuf,
    /// Plan file (TOML): data, shared settings, systems, analyses.
    pub plan: PathBuf,
    /// Train each system with this many seeds (the plan's first N; more are numbered on from its last).
    pub seeds: Option<usize>,
    /// Training budget per run in seconds (train.max_seconds), in addition to the plan's update limit.
    pub budget_seconds: Option<f64>,
    /// The whole plan on the plan's tiny [quick] budget (seconds per system, one seed): for tests.
    pub quick: bool,
    /// Train this row again (its name as in the plan; repeatable); other finished runs are kept.
    pub only: Vec<String>,
    /// Runs trained at the same time (each with cores / jobs threads).
    pub jobs: usize,
    /// Train nothing: write the analyses and report from the runs finished so far.
    pub report_only: bool,
    /// Data directory (default: $CGNMT_DATA or ../shared/data).
    pub data: Option<PathBuf>,
    /// No progress bars (one line per finished run instead).
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
    pub args: ReproduceOptions,
    pub plan: Plan,
    pub plan_text: String,
    pub out: PathBuf,
    pub data: cgnmt_datasets::DataDir,
    pub exe: PathBuf,
    pub seeds: Vec<u64>,
    pub threads: usize,
    /// Test set (limited in quick mode): raw source, tokenised source, references.
    pub test_src: PathBuf,
    pub test_src_tok: PathBuf,
    pub test_refs: Vec<PathBuf>,
    pub extra_tests: Vec<ExtraTestFiles>,
}

impl Setup {
    /// What names this invocation's report: empty for the whole plan, `-seeds-1-2` (`-seed-1`) for `--seeds N`
    /// below the plan's count, whose report must not overwrite the whole plan's.
    pub fn report_suffix(&self) -> String {
        partial_suffix(&self.plan.seeds, &self.seeds, self.args.seeds.is_some())
    }

    /// `OUT/<stem><suffix>.<ext>`: `report.md`, or `report-seeds-1-2.md` for a part of the plan's seeds.
    pub fn report_file(&self, stem: &str, ext: &str) -> PathBuf {
        self.out
            .join(format!("{stem}{}.{ext}", self.report_suffix()))
    }

    /// The figures' directory under `OUT`: `figures`, or `figures-seeds-1-2` for a part of the plan's seeds.
    pub fn figures_dir_name(&self) -> String {
        format!("figures{}", self.report_suffix())
    }
}

/// `-seeds-1-2` (or `-seed-1`) when `--seeds` asked for fewer seeds than the plan has, else empty.
fn partial_suffix(plan_seeds: &[u64], seeds: &[u64], asked: bool) -> String {
    if !asked || seeds.len() >= plan_seeds.len() {
        return String::new();
    }
    let list: Vec<String> = seeds.iter().map(u64::to_string).collect();
    let word = if seeds.len() == 1 { "seed" } else { "seeds" };
    format!("-{word}-{}", list.join("-"))
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

pub fn run(args: ReproduceOptions, data_dir: cgnmt_datasets::DataDir) -> Result<()> {
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
        analyses::forget_alignments(&setup, name)?;
    }
    check_stale(&tasks)?;
    // The alignment analyses' files are read before any training: a missing one fails now, not after hours.
    for al in &setup.plan.analyses.alignment {
        analyses::gold_set(&setup, al)?;
    }
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
        // Rows that decode other rows' models run as soon as those are trained.
        run_tasks(&setup, &tasks, &clock, &log_progress)?;
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
        setup.report_file("report", "md").display(),
        setup.report_file("report", "html").display()
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
    fn every_key_is_written_but_the_fingerprint_leaves_out_keys_added_later_at_their_defaults() {
        let mut c = cgnmt::config::Config::default();
        // `train --print-config` and a model's config.toml write every key.
        assert!(c.to_toml().contains("\nlayer_norm = false\n"));
        let fp = crate::records::identity_toml(&c);
        assert!(!fp.contains("layer_norm"), "{fp}");
        assert!(!fp.contains("guided_alignment"), "{fp}");
        assert_eq!(fp.lines().count() + 3, c.to_toml().lines().count());
        c.model.layer_norm = true;
        assert!(crate::records::identity_toml(&c).contains("\nlayer_norm = true\n"));
        // Guided alignment's keys count once it is on.
        c.train.guided_alignment = Some("builtin".into());
        let fp = crate::records::identity_toml(&c);
        assert!(fp.contains("guided_alignment_weight = 0.1"), "{fp}");
        assert!(fp.contains("guided_alignment_cost = \"ce\""), "{fp}");
    }

    #[test]
    fn a_report_on_part_of_the_plans_seeds_is_named_for_them() {
        assert_eq!(partial_suffix(&[1, 2, 3], &[1, 2], true), "-seeds-1-2");
        assert_eq!(partial_suffix(&[1, 2, 3], &[1], true), "-seed-1");
        // The whole plan, more seeds than it has, or no --seeds (the quick budget's own seeds): report.md.
        assert_eq!(partial_suffix(&[1, 2, 3], &[1, 2, 3], true), "");
        assert_eq!(partial_suffix(&[1, 2, 3], &[1, 2, 3, 4], true), "");
        assert_eq!(partial_suffix(&[1, 2, 3], &[1], false), "");
    }

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
    use cgnmt::model::store;

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
                select: vec![],
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

    /// Rows of a plan as its tasks: `(row, from, seed, ensemble)`, each in `out/systems/ROW/seed-N`.
    fn tasks_of(out: &Path, rows: &[(&str, Option<&str>, u64, bool)]) -> Vec<Task> {
        let dir = |row: &str, seed: u64| out.join("systems").join(row).join(format!("seed-{seed}"));
        rows.iter()
            .map(|&(row, from, seed, ensemble)| {
                let mut t = task(&dir(row, seed), &[]);
                t.system.name = row.into();
                t.seed = seed;
                t.system.from = from.map(String::from);
                t.system.ensemble = ensemble;
                if let Some(f) = from {
                    t.run = dir(f, seed).join("run");
                    if ensemble {
                        t.members = (1..=2).map(|x| dir(f, x).join("run")).collect();
                    }
                }
                t
            })
            .collect()
    }

    #[test]
    fn a_decoding_row_starts_as_soon_as_the_runs_it_decodes_are_trained() {
        let tmp = tempfile::tempdir().unwrap();
        // As make_tasks orders them: the trained rows, then the rows decoding their models.
        let tasks = tasks_of(
            tmp.path(),
            &[
                ("a", None, 1, false),
                ("b", None, 1, false),
                ("a", None, 2, false),
                ("b", None, 2, false),
                ("a-chosen", Some("a"), 1, false),
                ("b-chosen", Some("b"), 1, false),
                ("a-chosen", Some("a"), 2, false),
                ("b-chosen", Some("b"), 2, false),
                ("a-ensemble", Some("a"), 1, true),
            ],
        );
        let todo: Vec<&Task> = tasks.iter().collect();
        let deps = dependencies(&todo);
        assert_eq!(
            deps,
            vec![
                vec![],
                vec![],
                vec![],
                vec![],
                vec![0],
                vec![1],
                vec![2],
                vec![3],
                vec![0, 2]
            ]
        );
        let decoding: Vec<bool> = todo.iter().map(|t| t.system.from.is_some()).collect();
        let mut slots = vec![runner::Slot::Waiting; todo.len()];
        let mut blocked = vec![];
        // Two workers: the first two trained runs; nothing else is ready.
        assert_eq!(
            runner::next_task(&deps, &decoding, &mut slots, &mut blocked),
            runner::Next::Start(0)
        );
        assert_eq!(
            runner::next_task(&deps, &decoding, &mut slots, &mut blocked),
            runner::Next::Start(1)
        );
        // "b" seed 1 finishes first: its decode goes before the next training run.
        slots[1] = runner::Slot::Done;
        assert_eq!(
            runner::next_task(&deps, &decoding, &mut slots, &mut blocked),
            runner::Next::Start(5)
        );
        slots[5] = runner::Slot::Done;
        assert_eq!(
            runner::next_task(&deps, &decoding, &mut slots, &mut blocked),
            runner::Next::Start(2)
        );
        // "a" seed 1 fails: what decodes it fails too (its chosen row, and the ensemble of its seeds).
        slots[0] = runner::Slot::Failed;
        assert_eq!(
            runner::next_task(&deps, &decoding, &mut slots, &mut blocked),
            runner::Next::Start(3)
        );
        assert_eq!(blocked, vec![4, 8]);
        assert_eq!(slots[4], runner::Slot::Failed);
        assert_eq!(slots[8], runner::Slot::Failed);
        // Everything waiting needs a run still training: wait.
        assert_eq!(
            runner::next_task(&deps, &decoding, &mut slots, &mut blocked),
            runner::Next::Wait
        );
        slots[2] = runner::Slot::Done;
        assert_eq!(
            runner::next_task(&deps, &decoding, &mut slots, &mut blocked),
            runner::Next::Start(6)
        );
        slots[3] = runner::Slot::Done;
        assert_eq!(
            runner::next_task(&deps, &decoding, &mut slots, &mut blocked),
            runner::Next::Start(7)
        );
        // Nothing waits: stop, even with tasks still running.
        assert_eq!(
            runner::next_task(&deps, &decoding, &mut slots, &mut blocked),
            runner::Next::Stop
        );
        slots[6] = runner::Slot::Done;
        slots[7] = runner::Slot::Done;
        assert_eq!(
            runner::next_task(&deps, &decoding, &mut slots, &mut blocked),
            runner::Next::Stop
        );
        assert_eq!(blocked, vec![4, 8]);
    }

    #[test]
    fn a_finished_run_is_no_dependency_and_an_ensemble_waits_for_every_member() {
        let tmp = tempfile::tempdir().unwrap();
        let tasks = tasks_of(
            tmp.path(),
            &[
                ("a", None, 2, false),
                ("a-ensemble", Some("a"), 1, true),
                ("a-chosen", Some("a"), 1, false),
            ],
        );
        // "a" seed 1 finished in an earlier invocation: not in the queue.
        let todo: Vec<&Task> = tasks.iter().collect();
        let deps = dependencies(&todo);
        assert_eq!(deps, vec![vec![], vec![0], vec![]]);
        let decoding = [false, true, true];
        let mut slots = vec![runner::Slot::Waiting; 3];
        let mut blocked = vec![];
        assert_eq!(
            runner::next_task(&deps, &decoding, &mut slots, &mut blocked),
            runner::Next::Start(2)
        );
        assert_eq!(
            runner::next_task(&deps, &decoding, &mut slots, &mut blocked),
            runner::Next::Start(0)
        );
        assert_eq!(
            runner::next_task(&deps, &decoding, &mut slots, &mut blocked),
            runner::Next::Wait
        );
        slots[0] = runner::Slot::Done;
        assert_eq!(
            runner::next_task(&deps, &decoding, &mut slots, &mut blocked),
            runner::Next::Start(1)
        );
        assert!(blocked.is_empty());
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
        std::fs::write(last.join(store::CONFIG_FILE), old).unwrap();
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
        std::fs::write(last.join(store::COMPLETE_FILE), "").unwrap();
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
