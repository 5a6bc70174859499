//! `cgnmt reproduce --quick` end to end on real data (Tatoeba zh-en, the bundled plan on its tiny budget):
//! every table and figure of the report comes from real runs, the report's numbers are the run files'
//! (re-scored here), a killed reproduction resumes, a finished run is never trained again, `--only` trains one
//! row again, a plan that no longer matches a finished run is refused, and the records kept under version
//! control (no checkpoints) write the same report again.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use cgnmt_eval::bleu::{corpus_bleu, BleuOptions};

fn plan() -> PathBuf {
    common::repo().join("configs/reproduce/tatoeba.toml")
}

/// The bundled plan; where the data directory lacks the Tsinghua gold alignments (a fresh clone has only
/// the bundled Tatoeba copy) a copy of it in `dir` without the alignment analysis.
fn test_plan(dir: &Path) -> (PathBuf, bool) {
    if common::data_set_or_skip("align-zh-en-tsinghua", "reproduce's alignment analysis").is_some()
    {
        return (plan(), true);
    }
    let text = std::fs::read_to_string(plan()).unwrap();
    let cut = text.find("[[analyses.alignment]]").unwrap();
    let p = dir.join("no-alignment.toml");
    std::fs::write(&p, &text[..cut]).unwrap();
    (p, false)
}

fn reproduce_with(plan: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cgnmt"));
    c.arg("reproduce")
        .arg("--quick")
        .arg("--quiet")
        .arg("--plan")
        .arg(plan)
        .arg("--data")
        .arg(common::data_dir())
        .arg("--out")
        .arg(out)
        .args(extra);
    c
}

fn reproduce(out: &Path, extra: &[&str]) -> Output {
    reproduce_with(&plan(), out, extra)
        .output()
        .expect("run cgnmt")
}

fn ok(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).to_string();
    assert!(o.status.success(), "reproduce failed:\n{err}");
    err
}

fn json(p: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn mtime(p: &Path) -> std::time::SystemTime {
    std::fs::metadata(p).unwrap().modified().unwrap()
}

/// The training processes still running in `dir` (their command line names it).
fn children_in(dir: &Path) -> usize {
    let needle = dir.display().to_string();
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| {
                    std::fs::read(e.path().join("cmdline"))
                        .map(|c| {
                            let c = String::from_utf8_lossy(&c).replace('\0', " ");
                            c.contains(" train ") && c.contains(&needle)
                        })
                        .unwrap_or(false)
                })
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn quick_reproduction_reports_real_runs_and_resumes() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("repro");
    let (plan, with_alignment) = test_plan(tmp.path());
    let reproduce =
        |out: &Path, extra: &[&str]| reproduce_with(&plan, out, extra).output().unwrap();
    let reproduce_cmd = |out: &Path, extra: &[&str]| reproduce_with(&plan, out, extra);

    // A reproduction killed while it trains leaves no training behind and resumes.
    let mut c = reproduce_cmd(&out, &[])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    while !out.join("systems/gru-source-gate").exists() && t0.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(50));
    }
    c.kill().unwrap();
    c.wait().unwrap();
    assert!(
        out.join("systems/gru/seed-1/COMPLETE").is_file(),
        "first run should have finished"
    );
    assert!(!out.join("systems/gru-source-gate/seed-1/COMPLETE").exists());
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(
        children_in(&out),
        0,
        "a killed reproduce left training running"
    );
    let gru_done = mtime(&out.join("systems/gru/seed-1/COMPLETE"));
    // A finished run is aligned before its record is complete: the killed invocation lost no alignment.
    let gru_alignment = || {
        let dir = out.join("analyses/alignment/0");
        let found: Vec<PathBuf> = std::fs::read_dir(&dir)
            .map(|d| d.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        found.into_iter().find(|p| {
            let n = p.file_name().unwrap().to_string_lossy().into_owned();
            n.starts_with("gru-seed-1-") && n.ends_with(".json")
        })
    };
    let aligned_first = if with_alignment {
        let p = gru_alignment().expect("the first run's alignment scores");
        Some((p.clone(), mtime(&p)))
    } else {
        None
    };

    let err = ok(&reproduce(&out, &[]));
    assert!(err.contains("14 of 14 runs finished"), "{err}");
    assert!(
        err.contains("13 of 14 runs to train"),
        "the finished run was trained again:\n{err}"
    );
    assert_eq!(mtime(&out.join("systems/gru/seed-1/COMPLETE")), gru_done);

    // The report's numbers are the run files': re-score a system's output.
    let results = json(&out.join("results.json"));
    let runs = results["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 14);
    assert!(results["pending"].as_array().unwrap().is_empty());
    let refs = vec![cgnmt_data::corpus::read_lines(&out.join("test/ref0.txt")).unwrap()];
    assert_eq!(
        refs[0].len(),
        80,
        "quick mode decodes the plan's 80 test sentences"
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    for r in runs {
        let dir = out.join(r["dir"].as_str().unwrap());
        let hyps = cgnmt_data::corpus::read_lines(&dir.join("test.hyp")).unwrap();
        assert_eq!(hyps.len(), 80);
        let bleu = corpus_bleu(&hyps, &refs, &BleuOptions::mteval_v11b())
            .unwrap()
            .score;
        let chrf =
            cgnmt_eval::chrf::corpus_chrf(&hyps, &refs, &cgnmt_eval::chrf::ChrfOptions::chrf())
                .unwrap()
                .score;
        assert!((r["bleu"].as_f64().unwrap() - bleu).abs() < 1e-9);
        assert!((r["chrf"].as_f64().unwrap() - chrf).abs() < 1e-9);
        assert!(chrf > 0.0, "a trained model outputs some right characters");
        let row = md
            .lines()
            .find(|l| l.starts_with(&format!("| {} |", r["system"].as_str().unwrap())))
            .unwrap_or_else(|| panic!("no row for {}", r["system"]));
        assert!(
            row.contains(&format!("| {chrf:.2} |")),
            "{row} lacks chrF {chrf:.2}"
        );
        assert!(
            row.contains(&format!("{bleu:.2} (1)")),
            "{row} lacks BLEU {bleu:.2}"
        );
        // Each run trained to the plan's quick budget and kept its best dev model.
        assert_eq!(r["steps"].as_u64().unwrap(), 24);
        assert!(dir.join("run/best/model.safetensors").is_file());
    }

    // Every table and figure of the plan is there, made from the runs.
    for section in [
        "## Translation quality (paper Table 2)",
        "## Gate architecture (paper Table 5)",
        "## Gate value and translation quality (paper Table 6)",
        "## Context scaling (paper Figure 2 and Table 1)",
        "## BLEU by source length (paper Figure 7)",
        "## Subjective evaluation sample (paper Table 3)",
        "## Wall time",
        "## Configurations",
    ] {
        assert!(md.contains(section), "report.md lacks {section}");
    }
    assert!(!md.contains("pending"), "every run finished:\n{md}");
    // The command that trained the runs, with its binary's commit (recorded in invocations.jsonl).
    let training = md
        .lines()
        .find(|l| l.contains("Training commands: `"))
        .unwrap_or_else(|| panic!("no training command in report.md:\n{md}"));
    assert!(
        training.contains(" reproduce ")
            && training.contains("--quick")
            && training.contains("(commit `"),
        "{training}"
    );
    let figures = results["figures"].as_array().unwrap();
    let files: Vec<&str> = figures
        .iter()
        .map(|f| f["file"].as_str().unwrap())
        .collect();
    for want in [
        "training.png",
        "context-scaling.png",
        "length-groups.png",
        "gate-histogram.png",
        "heatmap-0.png",
    ] {
        assert!(files.contains(&want), "no figure {want}: {files:?}");
    }
    let html = std::fs::read_to_string(out.join("report.html")).unwrap();
    for f in &files {
        let bytes = std::fs::read(out.join("figures").join(f)).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{f} is not a PNG");
        assert!(md.contains(&format!("(figures/{f})")));
    }
    assert_eq!(
        html.matches("src=\"data:image/png;base64,").count(),
        files.len()
    );
    assert!(
        !html.contains("http://") && !html.contains("https://"),
        "report.html must be self-contained"
    );
    // Significance is computed for every row with a baseline, the alignment for each listed system.
    for row in results["rows"].as_array().unwrap() {
        assert_eq!(row["baseline"].is_null(), row["tests"].is_null(), "{row}");
    }
    if with_alignment {
        assert!(md.contains("## Alignment quality of attention (paper Table 4)"));
        let al = &results["alignment"][0];
        assert_eq!(al["sentences"].as_u64().unwrap(), 450);
        for s in al["systems"].as_array().unwrap() {
            let aer = s["aer_mean"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&aer), "{s}");
        }
    }
    let pairs = std::fs::read_to_string(out.join("subjective/pairs.jsonl")).unwrap();
    assert_eq!(
        pairs.lines().count(),
        80,
        "the sample is capped at the test set's size"
    );
    let scaling = results["context_scaling"].as_array().unwrap();
    assert_eq!(scaling.len(), 2);
    assert_eq!(scaling[0]["scaling"]["runs"].as_array().unwrap().len(), 5);

    // A finished plan trains nothing again; --only trains one row again and keeps the others.
    let other = mtime(&out.join("systems/gru-both-gate/seed-1/COMPLETE"));
    let err = ok(&reproduce(&out, &["--only", "GRU"]));
    assert!(err.contains("1 of 14 runs to train"), "{err}");
    assert!(mtime(&out.join("systems/gru/seed-1/COMPLETE")) > gru_done);
    // ... and aligns it again: its old scores (same fingerprint) are not read for the new model.
    if let Some((p, t)) = &aligned_first {
        assert!(p.is_file(), "the retrained run was not aligned");
        assert!(
            mtime(p) > *t,
            "the retrained run's alignment is the old one"
        );
    }
    assert_eq!(
        mtime(&out.join("systems/gru-both-gate/seed-1/COMPLETE")),
        other
    );

    // A plan whose row no longer matches its finished run is refused, naming the row.
    let changed = tmp.path().join("changed.toml");
    let text = std::fs::read_to_string(&plan).unwrap().replace(
        "set = [\"model.decoder=vanilla\", \"model.context_gate=none\"]",
        "set = [\"model.decoder=vanilla\", \"model.context_gate=none\", \"train.clip_norm=0.5\"]",
    );
    std::fs::write(&changed, text).unwrap();
    let o = reproduce_with(&changed, &out, &[]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success());
    assert!(
        err.contains("another configuration") && err.contains("\"vanilla\""),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");

    // A larger budget goes on from each run's last checkpoint instead of training anew.
    let longer = tmp.path().join("longer.toml");
    let text = std::fs::read_to_string(&plan)
        .unwrap()
        .replace("\"train.max_steps=24\"", "\"train.max_steps=36\"");
    std::fs::write(&longer, text).unwrap();
    let err = ok(&reproduce_with(&longer, &out, &[]).output().unwrap());
    assert!(err.contains("the plan's budget grew"), "{err}");
    assert!(err.contains("14 of 14 runs to train"), "{err}");
    let results = json(&out.join("results.json"));
    for r in results["runs"].as_array().unwrap() {
        assert_eq!(r["steps"].as_u64().unwrap(), 36, "{}", r["system"]);
        let steps: Vec<u64> = r["dev_curve"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p[0].as_u64().unwrap())
            .collect();
        assert_eq!(steps, vec![12, 24, 36], "{}", r["system"]);
        // The record beside the run holds the configuration it was trained with: the longer one.
        let record =
            std::fs::read_to_string(out.join(r["dir"].as_str().unwrap()).join("config.toml"))
                .unwrap();
        assert!(record.contains("max_steps = 36"), "{record}");
    }

    // What the directory's .gitignore keeps (no checkpoints, prepared data or raw alignments) is enough to
    // tell every run finished and to write the same report again.
    let ignore = std::fs::read_to_string(out.join(".gitignore")).unwrap();
    for p in [".lock", "prepared/", "systems/*/*/run/"] {
        assert!(ignore.lines().any(|l| l == p), "{p} not in .gitignore");
    }
    let kept = tmp.path().join("kept");
    copy_kept(&out, &kept, Path::new(""));
    assert!(!kept.join("systems/gru/seed-1/run").exists());
    // Only the dumps the analyses read are kept (here: the gated systems').
    assert!(!kept.join("systems/gru/seed-1/test.dump.jsonl.gz").exists());
    assert!(kept
        .join("systems/gru-both-gate/seed-1/test.dump.jsonl.gz")
        .is_file());
    let err = ok(&reproduce_with(&longer, &kept, &["--report-only"])
        .output()
        .unwrap());
    assert!(err.contains("14 of 14 runs finished"), "{err}");
    let again = json(&kept.join("results.json"));
    for key in [
        "runs",
        "rows",
        "gate_correlation",
        "gate_histogram",
        "context_scaling",
        "length_groups",
        "alignment",
    ] {
        assert_eq!(
            again[key], results[key],
            "{key} differs when written from the kept records"
        );
    }
    // Training on from a kept record is refused by name: its checkpoints are gone.
    let o = reproduce_with(&plan, &kept, &[]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("checkpoints were not kept"),
        "{err}"
    );
}

/// Copy an output directory as version control would keep it under its `.gitignore` (the patterns
/// `cgnmt reproduce` writes: directories, `dir/*/*/run/` and `*.suffix` files).
fn copy_kept(from: &Path, to: &Path, rel: &Path) {
    let ignore = std::fs::read_to_string(from.join(".gitignore")).unwrap();
    let patterns: Vec<&str> = ignore
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect();
    let matches = |p: &str, rel: &str, is_dir: bool| -> bool {
        let (p, want_dir) = match p.strip_suffix('/') {
            Some(p) => (p, true),
            None => (p, false),
        };
        if want_dir && !is_dir {
            return false;
        }
        let ps: Vec<&str> = p.split('/').collect();
        let rs: Vec<&str> = rel.split('/').collect();
        ps.len() == rs.len()
            && ps.iter().zip(&rs).all(|(a, b)| {
                a == b || *a == "*" || a.strip_prefix('*').is_some_and(|suf| b.ends_with(suf))
            })
    };
    std::fs::create_dir_all(to.join(rel)).unwrap();
    for e in std::fs::read_dir(from.join(rel)).unwrap() {
        let e = e.unwrap();
        let r = rel.join(e.file_name());
        let rs = r.to_str().unwrap();
        let is_dir = e.file_type().unwrap().is_dir();
        // The last pattern that matches decides; `!pattern` keeps.
        let mut ignored = false;
        for p in &patterns {
            match p.strip_prefix('!') {
                Some(keep) if matches(keep, rs, is_dir) => ignored = false,
                None if matches(p, rs, is_dir) => ignored = true,
                _ => {}
            }
        }
        if ignored {
            continue;
        }
        if is_dir {
            copy_kept(from, to, &r);
        } else {
            std::fs::copy(e.path(), to.join(&r)).unwrap();
        }
    }
}

#[test]
fn reproduce_refuses_bad_arguments_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("r");
    let o = reproduce(&out, &["--only", "GRU + nothing"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("no such row") && err.contains("GRU + both gate"),
        "{err}"
    );
    let o = reproduce(&out, &["--jobs", "0"]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("--jobs"));
    let o = Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args(["reproduce", "--out"])
        .arg(&out)
        .arg("--plan")
        .arg(tmp.path().join("missing.toml"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("missing.toml"), "{err}");
    // A missing gold alignment file fails before anything trains, naming the analysis and the file.
    if common::data_set_or_skip("align-zh-en-tsinghua", "the gold-file check").is_none() {
        return;
    }
    let text = std::fs::read_to_string(plan()).unwrap();
    assert!(text.contains("gold = \"align-zh-en-tsinghua/test.talp\""));
    let bad = tmp.path().join("bad-gold.toml");
    std::fs::write(
        &bad,
        text.replace(
            "gold = \"align-zh-en-tsinghua/test.talp\"",
            "gold = \"align-zh-en-tsinghua/missing.talp\"",
        ),
    )
    .unwrap();
    let o = reproduce_with(&bad, &out, &[]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("analyses.alignment") && err.contains("missing.talp"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    assert!(
        !out.join("systems").exists(),
        "a run trained before the plan's files were checked"
    );
}

/// The recipes plan (`configs/reproduce/recipes.toml`) on its quick budget with two seeds: rows with `from`
/// train nothing and decode the source row's models otherwise (a length penalty, an average of the last
/// checkpoints, an ensemble of the seeds, each checked here against `cgnmt average` and `cgnmt translate` run
/// directly); `seeds = 1` rows train one seed; BPE rows (`prepare`) train on their own prepared data; every run also decodes the extra test set (the longer half of
/// the test set), whose table is in the report, named for the two seeds of the plan's three
/// (`report-seeds-1-2.md`); a second invocation decodes nothing again.
#[test]
fn recipes_plan_decodes_other_rows_models_and_scores_the_extra_test_set() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("recipes");
    let plan = common::repo().join("configs/reproduce/recipes.toml");
    ok(
        &reproduce_with(&plan, &out, &["--seeds", "2", "--jobs", "2"])
            .output()
            .unwrap(),
    );
    // Two of the plan's three seeds: the report is named for them, and a whole plan's report would be left as
    // it is.
    assert!(!out.join("report.md").exists() && !out.join("results.json").exists());
    assert!(!out.join("figures").exists());
    let results = json(&out.join("results-seeds-1-2.json"));
    let rows = results["rows"].as_array().unwrap();
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["system"] == name)
            .unwrap_or_else(|| panic!("no row {name}"))
            .clone()
    };
    let seeds = |name: &str| row(name)["seeds"].as_array().unwrap().len();
    assert_eq!(seeds("paper"), 2);
    assert_eq!(seeds("label smoothing"), 1, "seeds = 1 trains one seed");
    assert_eq!(seeds("tied + label smoothing + length penalty"), 2);
    assert_eq!(
        seeds("tied + label smoothing + length penalty, ensemble of the seeds"),
        1,
        "an ensemble is one result"
    );
    let sys = out.join("systems");
    let tls = sys.join("tied-label-smoothing");
    // BPE rows train on their own prepared data, with BPE models; the others on the plan's.
    let prepared_of = |row: &str| -> String {
        let c = std::fs::read_to_string(sys.join(row).join("seed-1/config.toml")).unwrap();
        let line = c
            .lines()
            .find(|l| l.starts_with("prepared = "))
            .unwrap()
            .to_string();
        let dir = line
            .trim_start_matches("prepared = ")
            .trim_matches('"')
            .to_string();
        Path::new(&dir)
            .file_name()
            .unwrap()
            .to_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(prepared_of("paper"), "prepared");
    let bpe = prepared_of("bpe");
    assert!(bpe.starts_with("prepared-"), "{bpe}");
    assert_eq!(prepared_of("tied-label-smoothing-bpe"), bpe);
    assert!(out.join(&bpe).join("bpe.src.json").is_file());
    assert!(out.join(&bpe).join("bpe.tgt.json").is_file());
    // Rows with `from` train nothing of their own.
    for r in [
        "paper-length-penalty",
        "tied-label-smoothing-length-penalty",
        "tied-label-smoothing-length-penalty-ensemble-of-the-seeds",
    ] {
        assert!(
            !sys.join(r).join("seed-1/run").exists(),
            "{r} trained a model"
        );
        assert!(sys.join(r).join("seed-1/test.hyp").is_file(), "{r}");
    }
    let test_src = out.join("test/src.txt");
    let translate = |models: &[PathBuf], extra: &[&str]| -> String {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cgnmt"));
        c.args(["translate", "--quiet", "--beam", "10", "-i"])
            .arg(&test_src);
        for m in models {
            c.arg("-m").arg(m);
        }
        let o = c.args(extra).output().unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    let hyp = |row: &str| std::fs::read_to_string(sys.join(row).join("seed-1/test.hyp")).unwrap();
    let best = |seed: u32| tls.join(format!("seed-{seed}/run/best"));
    let lp = ["--length-penalty", "1"];
    assert_eq!(
        hyp("tied-label-smoothing-length-penalty"),
        translate(&[best(1)], &lp)
    );
    assert_eq!(
        hyp("tied-label-smoothing-length-penalty-ensemble-of-the-seeds"),
        translate(&[best(1), best(2)], &lp)
    );
    // The average of the run's last four kept checkpoints.
    let average = |seed: u32| -> PathBuf {
        let kept =
            cgnmt::train::checkpoint::kept_checkpoints(&tls.join(format!("seed-{seed}/run")))
                .unwrap();
        assert!(kept.len() >= 4, "{kept:?}");
        let avg = tmp.path().join(format!("avg-{seed}"));
        let mut c = Command::new(env!("CARGO_BIN_EXE_cgnmt"));
        c.arg("average");
        for k in &kept[kept.len() - 4..] {
            c.arg("-m").arg(k);
        }
        assert!(c.arg("-o").arg(&avg).status().unwrap().success());
        avg
    };
    let avg = average(1);
    assert_eq!(
        hyp("tied-label-smoothing-length-penalty-averaging"),
        translate(&[avg.clone()], &lp)
    );
    // An ensemble of averages: each seed's average of its last four checkpoints.
    let avg2 = average(2);
    assert_eq!(
        hyp("tied-label-smoothing-length-penalty-averaging-ensemble-of-the-seeds"),
        translate(&[avg, avg2], &lp)
    );
    // The extra test set: the quick budget's first 80 pairs with references longer than 6 words.
    let long_refs = std::fs::read_to_string(out.join("test/long.ref0.txt")).unwrap();
    assert_eq!(long_refs.lines().count(), 80);
    assert!(long_refs.lines().all(|l| l.split_whitespace().count() > 6));
    for r in results["runs"].as_array().unwrap() {
        let dir = out.join(r["dir"].as_str().unwrap());
        let h = std::fs::read_to_string(dir.join("test-long.hyp")).unwrap();
        assert_eq!(h.lines().count(), 80, "{}", dir.display());
        assert_eq!(r["extra"][0]["name"], "long");
    }
    let tables = results["extra_tests"].as_array().unwrap();
    assert_eq!(tables.len(), 1);
    assert_eq!(tables[0]["sentences"], 80);
    let report = std::fs::read_to_string(out.join("report-seeds-1-2.md")).unwrap();
    assert!(out.join("report-seeds-1-2.html").is_file());
    assert!(
        report.contains("](figures-seeds-1-2/training.png)")
            && out.join("figures-seeds-1-2/training.png").is_file(),
        "{report}"
    );
    assert!(
        report.contains("## Test set \"long\": 80 sentences"),
        "{report}"
    );
    assert!(report.contains("len ratio (BLEU)"), "{report}");
    // sacreBLEU's length ratio of a row: the mean over its seeds of its outputs' 13a tokens over the
    // reference's.
    let refs: Vec<String> = std::fs::read_to_string(out.join("test/ref0.txt"))
        .unwrap()
        .lines()
        .map(String::from)
        .collect();
    let ratio = |seed: u32| {
        let h = std::fs::read_to_string(sys.join(format!("paper/seed-{seed}/test.hyp"))).unwrap();
        let hyps: Vec<String> = h.lines().map(String::from).collect();
        let b = corpus_bleu(&hyps, &[refs.clone()], &BleuOptions::sacrebleu()).unwrap();
        b.sys_len as f64 / b.ref_len as f64
    };
    let want = (ratio(1) + ratio(2)) / 2.0;
    let got = row("paper")["bleu_length_ratio"].as_f64().unwrap();
    assert!((got - want).abs() < 1e-9, "{got} against {want}");
    // Nothing is decoded again.
    let marker = sys.join("tied-label-smoothing-length-penalty-averaging/seed-1/COMPLETE");
    let before = mtime(&marker);
    let err = ok(&reproduce_with(&plan, &out, &["--seeds", "2"])
        .output()
        .unwrap());
    assert!(!err.contains("started"), "{err}");
    assert_eq!(mtime(&marker), before);
}

/// A plan row with `choose = true` decodes the model and the penalties chosen on dev (`cgnmt select --tune`),
/// and keeps the record of the choice beside its result.
#[test]
fn a_row_that_chooses_on_dev_decodes_the_chosen_model() {
    let tmp = tempfile::tempdir().unwrap();
    let recipes =
        std::fs::read_to_string(common::repo().join("configs/reproduce/recipes.toml")).unwrap();
    let head = &recipes[..recipes.find("[tables]").unwrap()];
    let plan = tmp.path().join("choose.toml");
    std::fs::write(
        &plan,
        format!(
            "{head}[tables]\n\"R\" = \"choice\"\n\n[[system]]\nname = \"base\"\ntable = \"R\"\nset = \
             [\"train.exponential_smoothing=0.01\"]\n\n[[system]]\nname = \"chosen\"\ntable = \"R\"\nfrom = \
             \"base\"\nchoose = true\naverage = 3\ndecode = [\"--length-penalty\", \"1.5\"]\nbaseline = \"base\"\n\
             select = [\"--tune-longer-than\", \"6\", \"--length-ratio\", \"0.9,1.1\"]\n"
        ),
    )
    .unwrap();
    let out = tmp.path().join("out");
    ok(&reproduce_with(&plan, &out, &[]).output().unwrap());
    let row = out.join("systems/chosen/seed-1");
    let sel = json(&row.join("selection.json"));
    let names: Vec<&str> = sel["candidates"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(names[0], "best");
    assert!(names.contains(&"moving average"), "{names:?}");
    assert_eq!(sel["compared_with"][0].as_f64(), Some(1.5));
    assert_eq!(sel["grid"].as_array().unwrap().len(), 10);
    // The row's `select` arguments reached `cgnmt select`: the penalties chosen on dev's longer pairs.
    assert_eq!(sel["tuning"]["longer_than"], 6);
    assert_eq!(sel["tuning"]["length_ratio"], serde_json::json!([0.9, 1.1]));
    // The chosen model is never below best/ on dev, and the row decoded with it and its penalties.
    let k = sel["chosen"].as_u64().unwrap() as usize;
    assert!(
        sel["candidates"][k]["dev_bleu"].as_f64().unwrap()
            >= sel["candidates"][0]["dev_bleu"].as_f64().unwrap()
    );
    let log = std::fs::read_to_string(row.join("output.log")).unwrap();
    assert!(log.contains("chosen:"), "{log}");
    let (alpha, beta) = (
        sel["length_penalty"].as_f64().unwrap().to_string(),
        sel["coverage_penalty"].as_f64().unwrap().to_string(),
    );
    let chosen = sel["candidates"][k]["dir"].as_str().unwrap();
    assert!(
        log.lines().any(|l| l.contains("translate")
            && l.contains(chosen)
            && l.contains(&format!(
                "--length-penalty {alpha} --coverage-penalty {beta}"
            ))),
        "{log}"
    );
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains("chosen on dev"), "{report}");
    // Kept under version control, the trained row's checkpoints are gone: choosing again is refused by
    // name, with the way to train the row again.
    let kept = tmp.path().join("kept");
    copy_kept(&out, &kept, Path::new(""));
    std::fs::remove_dir_all(kept.join("systems/chosen")).unwrap();
    let o = reproduce_with(&plan, &kept, &[]).output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success()
            && err.contains("checkpoints are not here")
            && err.contains("--only \"base\""),
        "{err}"
    );
    assert!(!kept.join("systems/base/seed-1/run").exists());
}
