//! Preparing the plan's data: the shared prepared corpus, each row's own (`prepare` arguments), the test sets.

use super::*;

/// `cgnmt prepare` into `OUT/prepared` (once; the arguments' fingerprint is kept beside it), and the test
/// files the runs decode and score.
pub(super) fn prepare_data(
    plan: &Plan,
    args: &ReproduceOptions,
    data: &cgnmt_datasets::DataDir,
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
pub(super) fn test_limit(plan: &Plan, args: &ReproduceOptions) -> usize {
    if args.quick && plan.quick.test_limit > 0 {
        plan.quick.test_limit
    } else {
        usize::MAX
    }
}

/// The prepared directory of a row's own `prepare` arguments: `prepared-` and a hash of them.
pub(super) fn prepared_name(extra: &[String]) -> String {
    format!(
        "prepared-{}",
        &plan::fingerprint(&extra.join("\u{1f}"))[..8]
    )
}

/// `cgnmt prepare` of the plan's corpus into `prepared` with the plan's arguments and `extra`, unless it holds
/// that preparation already.
pub(super) fn prepare_corpus(
    plan: &Plan,
    args: &ReproduceOptions,
    data: &cgnmt_datasets::DataDir,
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
        // As a child `cgnmt prepare` (the plan's arguments are its command line); its output goes to a log.
        std::fs::create_dir_all(&prepared)
            .with_context(|| format!("{}: cannot create", prepared.display()))?;
        let log = prepared.with_extension("log");
        let exe = std::env::current_exe().context("cannot find the cgnmt executable")?;
        let _ = std::fs::remove_file(&log);
        let mut c = child(&exe, &pargs, &log, 0)?;
        c.env_remove("RAYON_NUM_THREADS");
        let status = c
            .status()
            .with_context(|| format!("cannot start {}", exe.display()))?;
        if !status.success() {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let tail: Vec<&str> = text.lines().skip(1).collect();
            bail!(
                "data.prepare: `cgnmt prepare` failed ({status}):\n    {}",
                tail.join("\n    ")
            );
        }
        std::fs::write(&fp_file, &fp)
            .with_context(|| format!("{}: cannot write", fp_file.display()))?;
    }
    Ok(())
}

/// The plan's extra test sets under `out/test/`: the pairs kept by each set's length filter (limited in quick
/// mode). Misaligned files are refused, naming them.
pub(super) fn prepare_extra_tests(
    plan: &Plan,
    args: &ReproduceOptions,
    data: &cgnmt_datasets::DataDir,
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

pub use cgnmt::atomic_file::write_atomic;
