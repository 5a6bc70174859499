//! Several processes under `mpiexec` (built with `--features mpi`; `.ci/run` installs MPICH and runs this file
//! after the default suite): sharded `translate` writes what one process writes, byte for byte, over shared
//! memory and over TCP on 127.0.0.1; a rank that fails ends the job fast, naming itself, and leaves no output.
//! Every `mpiexec` runs under a timeout.
#![cfg(feature = "mpi")]

mod common;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

/// The transports a test runs over: MPICH's shared memory (the default on one machine), and TCP over the
/// loopback device only (no local shortcut, UCX restricted to `tcp` on `lo`).
const TRANSPORTS: [(&str, &[(&str, &str)]); 2] = [
    ("shared memory", &[]),
    (
        "tcp loopback",
        &[
            ("MPIR_CVAR_NOLOCAL", "1"),
            ("UCX_TLS", "tcp,self"),
            ("UCX_NET_DEVICES", "lo"),
        ],
    ),
];

/// `mpiexec -n N cgnmt ARGS` under a 120 s timeout, with extra environment variables.
fn mpiexec(n: usize, args: &[&str], env: &[(&str, &str)]) -> (Output, Duration) {
    let t0 = Instant::now();
    let out = Command::new("timeout")
        .args(["120", "mpiexec", "-n", &n.to_string()])
        .arg(env!("CARGO_BIN_EXE_cgnmt"))
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run mpiexec (install MPICH: apt-get install mpich)");
    (out, t0.elapsed())
}

fn tiny_model(dir: &Path) -> std::path::PathBuf {
    let prepared = dir.join("prep");
    common::prepare(&prepared, 300);
    let run = dir.join("run");
    common::train_tiny(
        &prepared,
        &run,
        &["train.max_steps=30", "train.batch_size=16"],
    );
    run.join("last")
}

#[test]
fn sharded_translate_is_byte_identical_to_one_process() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let src = tmp.path().join("prep/dev.src");
    let s = |p: &Path| p.display().to_string();
    let one = tmp.path().join("one.txt");
    let one_dump = tmp.path().join("one.jsonl");
    common::run_ok(&[
        "translate",
        "--quiet",
        "--pretokenized",
        "--nbest",
        "3",
        "-m",
        &s(&model),
        "-i",
        &s(&src),
        "-o",
        &s(&one),
        "--dump",
        &s(&one_dump),
    ]);
    let expect = std::fs::read(&one).unwrap();
    let expect_dump = std::fs::read(&one_dump).unwrap();
    assert!(expect.len() > 1000);
    for (name, env) in TRANSPORTS {
        // Over TCP, 2 ranks: Debian's MPICH 4.0.2 (ch4:ucx) hangs in MPI_Finalize with 3 or more ranks on `lo`
        // alone (a ten-line C program that only all-reduces does the same), after the output is written.
        let ranks: &[usize] = if env.is_empty() { &[2, 3] } else { &[2] };
        for &n in ranks {
            let (o, d) = (
                tmp.path().join(format!("{n}.txt")),
                tmp.path().join(format!("{n}.jsonl")),
            );
            let (out, _) = mpiexec(
                n,
                &[
                    "translate",
                    "--quiet",
                    "--pretokenized",
                    "--nbest",
                    "3",
                    "-m",
                    &s(&model),
                    "-i",
                    &s(&src),
                    "-o",
                    &s(&o),
                    "--dump",
                    &s(&d),
                ],
                env,
            );
            assert!(
                out.status.success(),
                "{name}, {n} ranks: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                std::fs::read(&o).unwrap() == expect,
                "{name}, {n} ranks: output differs"
            );
            assert!(
                std::fs::read(&d).unwrap() == expect_dump,
                "{name}, {n} ranks: dump differs"
            );
        }
    }
    // Standard output too, and only rank 0 writes it.
    let (out, _) = mpiexec(
        2,
        &[
            "translate",
            "--quiet",
            "--pretokenized",
            "-m",
            &s(&model),
            "-i",
            &s(&src),
        ],
        &[],
    );
    assert!(out.status.success());
    let single = common::run_ok(&[
        "translate",
        "--quiet",
        "--pretokenized",
        "-m",
        &s(&model),
        "-i",
        &s(&src),
    ]);
    assert_eq!(String::from_utf8(out.stdout).unwrap(), single);
}

#[test]
fn a_failing_rank_ends_the_job_fast_and_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let model = tiny_model(tmp.path());
    let src = tmp.path().join("prep/dev.src");
    let s = |p: &Path| p.display().to_string();
    for (name, env) in TRANSPORTS {
        for rank in ["0", "1"] {
            let o = tmp.path().join(format!("fail-{rank}.txt"));
            let mut env = env.to_vec();
            env.push(("CGNMT_INJECT_FAIL_RANK", rank));
            let (out, took) = mpiexec(
                2,
                &[
                    "translate",
                    "--quiet",
                    "--pretokenized",
                    "-m",
                    &s(&model),
                    "-i",
                    &s(&src),
                    "-o",
                    &s(&o),
                ],
                &env,
            );
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                !out.status.success(),
                "{name}: rank {rank} failed, the job did not"
            );
            assert_ne!(out.status.code(), Some(124), "{name}: the job hung: {err}");
            assert!(took < Duration::from_secs(60), "{name}: {took:?}");
            assert!(
                err.contains(&format!("error (rank {rank} of 2)"))
                    && err.contains("injected failure"),
                "{name}: {err}"
            );
            let left: Vec<_> = std::fs::read_dir(tmp.path())
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .filter(|f| f.starts_with(&format!("fail-{rank}")))
                .collect();
            assert!(left.is_empty(), "{name}: left behind {left:?}");
        }
    }
    // A command that does not shard says so and stops every rank.
    let (out, _) = mpiexec(2, &["info"], &[]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("does not run as several MPI processes"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
