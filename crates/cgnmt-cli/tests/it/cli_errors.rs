//! Bad input gives a clear message naming the file (and line), a non-zero exit, no panic and nothing
//! half-written.

use crate::common;

use std::path::Path;
use std::process::{Command, Output};

fn cgnmt(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args(args)
        .output()
        .expect("run cgnmt")
}

fn cgnmt_stdin(args: &[&str], input: &[u8]) -> Output {
    use std::io::Write;
    let mut c = Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args(args)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The process may exit before reading its input (e.g. a bad model directory).
    let _ = c.stdin.take().unwrap().write_all(input);
    c.wait_with_output().unwrap()
}

/// Fails cleanly: non-zero exit, no panic, and stderr contains every `needle`.
fn fails_with(out: &Output, needles: &[&str]) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "expected failure, got success; stderr: {err}"
    );
    assert!(!err.contains("panicked"), "panic: {err}");
    for n in needles {
        assert!(err.contains(n), "stderr does not mention {n:?}:\n{err}");
    }
}

fn write(p: &Path, b: &[u8]) {
    std::fs::write(p, b).unwrap();
}

#[test]
fn prepare_rejects_bad_corpora() {
    let t = tempfile::tempdir().unwrap();
    let p = |n: &str| t.path().join(n);
    write(&p("a.zh"), "我 爱 你\n你 好\n".as_bytes());
    write(&p("a.en"), b"I love you\n");
    let out_dir = p("prep");
    let o = |s: &str, tg: &str| {
        cgnmt(&[
            "prepare",
            "--src",
            p(s).to_str().unwrap(),
            "--tgt",
            p(tg).to_str().unwrap(),
            "--out",
            out_dir.to_str().unwrap(),
        ])
    };
    // Different line counts: both files and both counts.
    fails_with(&o("a.zh", "a.en"), &["a.zh", "a.en", "2", "1"]);
    assert!(!out_dir.exists(), "nothing half-written");
    // Invalid UTF-8: file and line.
    write(&p("b.en"), b"fine\n\xff\xfe bad\n");
    fails_with(&o("a.zh", "b.en"), &["b.en", "line 2"]);
    // Missing file.
    fails_with(&o("a.zh", "missing.en"), &["missing.en"]);
    // Empty corpus.
    write(&p("e.zh"), b"");
    write(&p("e.en"), b"");
    fails_with(&o("e.zh", "e.en"), &["e.zh", "empty"]);
    assert!(!out_dir.exists(), "nothing half-written");
}

#[test]
fn train_rejects_bad_configs() {
    let t = tempfile::tempdir().unwrap();
    let cfg = t.path().join("c.toml");
    write(&cfg, b"[model]\nhiden_dim = 10\n");
    let run = t.path().join("run");
    fails_with(
        &cgnmt(&[
            "train",
            "-c",
            cfg.to_str().unwrap(),
            "--out",
            run.to_str().unwrap(),
        ]),
        &["c.toml", "hiden_dim"],
    );
    write(&cfg, b"[model]\nhidden_dim = \"big\"\n");
    fails_with(
        &cgnmt(&[
            "train",
            "-c",
            cfg.to_str().unwrap(),
            "--out",
            run.to_str().unwrap(),
        ]),
        &["c.toml", "hidden_dim"],
    );
    fails_with(
        &cgnmt(&[
            "train",
            "--set",
            "train.optimizer=sgd",
            "--out",
            run.to_str().unwrap(),
        ]),
        &["sgd"],
    );
    fails_with(
        &cgnmt(&[
            "train",
            "--set",
            "model.context_gate=both",
            "--set",
            "model.gating_scalar=true",
        ]),
        &["gating_scalar"],
    );
    fails_with(
        &cgnmt(&[
            "train",
            "--set",
            "data.prepared=/nonexistent/prep",
            "--out",
            run.to_str().unwrap(),
        ]),
        &["/nonexistent/prep"],
    );
    fails_with(
        &cgnmt(&["train", "-c", t.path().join("nope.toml").to_str().unwrap()]),
        &["nope.toml"],
    );
    fails_with(
        &cgnmt(&["info", "--set", "model.hidden_dim=7"]),
        &["hidden_dim"],
    );
    assert!(!run.join("last").exists());
}

#[test]
fn translate_rejects_bad_model_dirs_and_input() {
    let t = tempfile::tempdir().unwrap();
    let m = t.path().join("model");
    // Not a directory.
    fails_with(
        &cgnmt_stdin(&["translate", "-m", m.to_str().unwrap()], b"x\n"),
        &["model"],
    );
    // A directory with missing files.
    std::fs::create_dir_all(&m).unwrap();
    fails_with(
        &cgnmt_stdin(&["translate", "-m", m.to_str().unwrap()], b"x\n"),
        &["config.toml"],
    );
    // Build a real tiny model directory by training 2 steps, then corrupt it.
    let prep = t.path().join("prep");
    let d = common::data_dir().join("tatoeba-zh-en");
    let ok = cgnmt(&[
        "prepare",
        "--src",
        d.join("dev.zh").to_str().unwrap(),
        "--tgt",
        d.join("dev.en").to_str().unwrap(),
        "--out",
        prep.to_str().unwrap(),
    ]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let run = t.path().join("run");
    let ok = cgnmt(&[
        "train",
        "--quiet",
        "--out",
        run.to_str().unwrap(),
        "--set",
        &format!("data.prepared={:?}", prep.display().to_string()),
        "--set",
        "model.embedding_dim=8",
        "--set",
        "model.hidden_dim=8",
        "--set",
        "model.attention_dim=8",
        "--set",
        "train.max_steps=2",
        "--set",
        "train.eval_every=0",
    ]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let best = run.join("best");
    let good = cgnmt_stdin(
        &["translate", "-m", best.to_str().unwrap(), "--beam", "2"],
        "你好。\n".as_bytes(),
    );
    assert!(
        good.status.success(),
        "{}",
        String::from_utf8_lossy(&good.stderr)
    );
    // Invalid UTF-8 on stdin: line number, and no output at all.
    let bad = cgnmt_stdin(&["translate", "-m", best.to_str().unwrap()], b"ok\n\xff\n");
    fails_with(&bad, &["line 2"]);
    assert!(bad.stdout.is_empty(), "no partial output");
    // Corrupt weights.
    let broken = t.path().join("broken");
    std::fs::create_dir_all(&broken).unwrap();
    for f in std::fs::read_dir(&best).unwrap() {
        let f = f.unwrap().path();
        std::fs::copy(&f, broken.join(f.file_name().unwrap())).unwrap();
    }
    write(&broken.join("model.safetensors"), b"not a safetensors file");
    fails_with(
        &cgnmt_stdin(&["translate", "-m", broken.to_str().unwrap()], b"x\n"),
        &["model.safetensors"],
    );
    // Missing vocabulary.
    std::fs::copy(
        best.join("model.safetensors"),
        broken.join("model.safetensors"),
    )
    .unwrap();
    std::fs::remove_file(broken.join("vocab.tgt")).unwrap();
    fails_with(
        &cgnmt_stdin(&["translate", "-m", broken.to_str().unwrap()], b"x\n"),
        &["vocab.tgt"],
    );
    // Config that does not match the weights.
    std::fs::copy(best.join("vocab.tgt"), broken.join("vocab.tgt")).unwrap();
    let cfg = std::fs::read_to_string(best.join("config.toml"))
        .unwrap()
        .replace("hidden_dim = 8", "hidden_dim = 10");
    write(&broken.join("config.toml"), cfg.as_bytes());
    fails_with(
        &cgnmt_stdin(&["translate", "-m", broken.to_str().unwrap()], b"x\n"),
        &["model.safetensors"],
    );
    // Bad option values.
    fails_with(
        &cgnmt_stdin(
            &["translate", "-m", best.to_str().unwrap(), "--beam", "0"],
            b"x\n",
        ),
        &["beam"],
    );
    fails_with(
        &cgnmt_stdin(
            &[
                "translate",
                "-m",
                best.to_str().unwrap(),
                "--context-scale",
                "1",
            ],
            b"x\n",
        ),
        &["A,B"],
    );
    // The range checks the server shares (DecodeOptions::validate).
    for (flag, value, says) in [
        (
            "--context-scale",
            "1e308,-5",
            "--context-scale 1e308,-5.0: each scale",
        ),
        ("--length-penalty=-1", "", "--length-penalty -1"),
        (
            "--nbest",
            "20",
            "--nbest 20: it must be between 1 and the beam (10)",
        ),
        (
            "--beam",
            "100000",
            "--beam 100000: it must be between 1 and",
        ),
    ] {
        fails_with(
            &cgnmt_stdin(
                &[
                    &["translate", "-m", best.to_str().unwrap(), flag][..],
                    &[value][..],
                ]
                .concat()
                .into_iter()
                .filter(|a| !a.is_empty())
                .collect::<Vec<_>>(),
                b"x\n",
            ),
            &[says],
        );
    }
    // A shortlist lexicon learnt from the prepared corpus decodes; a broken one is named with its line, and
    // a misaligned corpus is refused by `shortlist`.
    let lex = t.path().join("lex.tsv");
    let ok = cgnmt(&[
        "shortlist",
        "--quiet",
        "--src",
        prep.join("train.src").to_str().unwrap(),
        "--tgt",
        prep.join("train.tgt").to_str().unwrap(),
        "-o",
        lex.to_str().unwrap(),
    ]);
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    let short = cgnmt_stdin(
        &[
            "translate",
            "-m",
            best.to_str().unwrap(),
            "--shortlist",
            lex.to_str().unwrap(),
        ],
        "你好。\n我们走吧。\n".as_bytes(),
    );
    assert!(
        short.status.success(),
        "{}",
        String::from_utf8_lossy(&short.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&short.stdout).lines().count(), 2);
    let bad_lex = t.path().join("bad-lex.tsv");
    write(&bad_lex, "# a comment\n你\tyou\t0.5\n好\tgood\n".as_bytes());
    fails_with(
        &cgnmt_stdin(
            &[
                "translate",
                "-m",
                best.to_str().unwrap(),
                "--shortlist",
                bad_lex.to_str().unwrap(),
            ],
            b"x\n",
        ),
        &["bad-lex.tsv", "line 3"],
    );
    let short_src = t.path().join("short.src");
    write(&short_src, b"a b\n");
    fails_with(
        &cgnmt(&[
            "shortlist",
            "--src",
            short_src.to_str().unwrap(),
            "--tgt",
            prep.join("train.tgt").to_str().unwrap(),
            "-o",
            t.path().join("never.tsv").to_str().unwrap(),
        ]),
        &["not line-aligned"],
    );
    assert!(!t.path().join("never.tsv").exists());
    // Output file is only created on success.
    let outp = t.path().join("out.txt");
    let bad = cgnmt_stdin(
        &[
            "translate",
            "-m",
            best.to_str().unwrap(),
            "-o",
            outp.to_str().unwrap(),
        ],
        b"\xff\n",
    );
    fails_with(&bad, &["line 1"]);
    assert!(!outp.exists());
}

#[test]
fn resume_without_checkpoint_is_an_error() {
    let t = tempfile::tempdir().unwrap();
    fails_with(
        &cgnmt(&["train", "--resume", t.path().to_str().unwrap()]),
        &["checkpoint"],
    );
}

/// A binary built without MPI that `mpiexec` starts as one of several processes says so and stops, instead of
/// running N copies that each do all the work (the launcher's variables are set by hand here: no MPI needed).
#[cfg(not(feature = "mpi"))]
#[test]
fn a_build_without_mpi_refuses_to_run_as_one_of_several_processes() {
    for (var, n) in [("PMI_SIZE", "2"), ("OMPI_COMM_WORLD_SIZE", "4")] {
        let out = Command::new(env!("CARGO_BIN_EXE_cgnmt"))
            .args(["info"])
            .env(var, n)
            .output()
            .unwrap();
        fails_with(
            &out,
            &[&format!("one of {n} MPI processes"), "--features mpi"],
        );
    }
    // One process is fine.
    let out = Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args(["info"])
        .env("PMI_SIZE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
