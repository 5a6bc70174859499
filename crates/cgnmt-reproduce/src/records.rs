//! The runs as tasks, and their records on disk: which run is finished, resumable or stale, and what it decided.

use super::*;
use cgnmt::model::store;

/// The runs in the order they are trained: table by table, seed by seed, row by row (so a table's rows are
/// complete with every seed before the next table starts).
pub(super) fn make_tasks(s: &Setup) -> Result<Vec<Task>> {
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
                if !sys.select.is_empty() {
                    decode_key += &format!("select={};", sys.select.join(" "));
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
pub(super) fn identity_toml(c: &Config) -> String {
    let mut c = c.clone();
    c.train.threads = 0;
    // Its name only: `prepared`, or a row's own `prepared-HASH` of its `prepare` arguments.
    c.data.prepared = PathBuf::from(c.data.prepared.file_name().unwrap_or("prepared".as_ref()));
    // Keys added after runs were fingerprinted count only when set, so those runs keep their fingerprints.
    let mut t = c.to_toml().replace("\nlayer_norm = false\n", "\n");
    if c.train.guided_alignment.is_none() {
        // (Guided alignment's cost and weight count only with guidance.)
        for key in ["guided_alignment_cost", "guided_alignment_weight"] {
            t = t
                .lines()
                .filter(|l| !l.starts_with(&format!("{key} =")))
                .map(|l| format!("{l}\n"))
                .collect();
        }
    }
    t
}

/// The configuration a run was trained with, beside its record (a copy of its last checkpoint's).
pub(super) const RECORD_CONFIG: &str = "config.toml";
/// The test set's translation dump (attention, gates), gzip-compressed.
pub const DUMP_GZ: &str = "test.dump.jsonl.gz";

/// The paths left out when an output directory is kept under version control: checkpoints, prepared data and
/// raw alignments are large and can be made again; the records (configuration, result, hypotheses, compressed
/// dump, logs) and the analysis caches are enough to write the report again and to tell a finished run.
pub(super) const GITIGNORE: &str = "\
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
pub(super) fn gitignore(dumps_read: &[String]) -> String {
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
pub(super) struct Complete {
    pub(super) fingerprint: String,
    /// The decoding it was scored with (absent in the markers of early versions).
    #[serde(default)]
    pub(super) beam: Option<usize>,
    #[serde(default)]
    pub(super) test_sentences: Option<usize>,
    /// The row's own decoding and the extra test sets ([`Task::decode_key`]; absent: none).
    #[serde(default)]
    pub(super) decode: String,
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
pub(super) enum RunMatch {
    Same,
    /// The same system with a larger budget: training goes on from the last checkpoint.
    Continues,
    Other(String),
}

pub(super) fn run_match(t: &Task) -> Result<Option<RunMatch>> {
    let Some(dir) = store::complete_dir(&t.run.join("last")) else {
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
    let saved = Config::load(Some(&dir.join(store::CONFIG_FILE)), &[])?;
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
pub(super) fn design_toml(c: &Config) -> String {
    let mut c = c.clone();
    c.train.max_steps = 0;
    c.train.max_seconds = 0.0;
    c.train.max_epochs = 0;
    identity_toml(&c)
}

/// Whether a run trained with `saved` to `state` can go on to be the run of `wanted`: the same design and a
/// budget it has not passed yet.
pub(super) fn check_continues(
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
pub(super) fn check_stale(tasks: &[Task]) -> Result<()> {
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

pub(super) fn read_complete(dir: &Path) -> Result<Option<Complete>> {
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
