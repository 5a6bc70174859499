//! Property tests ("fuzzing") of what the toolkit reads besides metric files (those are in
//! `crates/cgnmt-eval/tests/fuzz.rs`): the configuration parser and `--set` overrides, the corpus reader
//! (plain and gzip), the text pipeline (jieba segmentation, tokenizers, detokenizer), vocabulary files and
//! model directories (truncated or corrupted safetensors, a configuration that no longer fits the weights,
//! vocabularies with repeated or empty words). Every case must end in a value or an error — never a panic —
//! and within a time bound (each case is timed against a limit far above its normal milliseconds).
//!
//! CI runs 1,000 cases per property; `PROPTEST_CASES=100000 cargo test --release --test fuzz` is the long run
//! (see results/reliability/README.md for what it found).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use candle_core::{DType, Device};
use cgnmt::config::Config;
use cgnmt::model::store;
use cgnmt_data::preprocess::Preprocessor;
use cgnmt_data::vocab::Vocab;
use proptest::prelude::*;

/// Every case must finish within this (a hang would show as far more).
const CASE_LIMIT: Duration = Duration::from_secs(5);

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: cases(),
        // Shrinking a failure is what matters; no persisted regressions files in the tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// A case, checked against [`CASE_LIMIT`].
fn timed<T>(what: &str, f: impl FnOnce() -> T) -> T {
    let t0 = Instant::now();
    let out = f();
    let d = t0.elapsed();
    assert!(d < CASE_LIMIT, "{what}: one case took {d:?}");
    out
}

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cgnmt")
}

/// A small trained model directory (prepared once per test process).
fn model_dir() -> &'static Path {
    static DIR: OnceLock<(tempfile::TempDir, PathBuf)> = OnceLock::new();
    &DIR.get_or_init(|| {
        let tmp = tempfile::tempdir().unwrap();
        let d = common::data_dir().join("tatoeba-zh-en");
        let s = |p: &str| d.join(p).display().to_string();
        let prep = tmp.path().join("prep");
        let run = tmp.path().join("run");
        for args in [
            vec![
                "prepare".to_string(),
                "--src".into(),
                s("train.zh"),
                "--tgt".into(),
                s("train.en"),
                "--dev-src".into(),
                s("dev.zh"),
                "--dev-tgt".into(),
                s("dev.en"),
                "--limit".into(),
                "80".into(),
                "--out".into(),
                prep.display().to_string(),
            ],
            vec![
                "train".into(),
                "--quiet".into(),
                "--out".into(),
                run.display().to_string(),
                "--set".into(),
                format!("data.prepared={:?}", prep.display().to_string()),
                "--set".into(),
                "model.embedding_dim=8".into(),
                "--set".into(),
                "model.hidden_dim=8".into(),
                "--set".into(),
                "model.attention_dim=8".into(),
                "--set".into(),
                "train.max_steps=1".into(),
                "--set".into(),
                "train.eval_every=0".into(),
            ],
        ] {
            let o = Command::new(bin()).args(&args).output().unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
        (tmp, run.join("last"))
    })
    .1
}

/// A scratch directory per test thread.
fn scratch() -> PathBuf {
    thread_local! {
        static DIR: tempfile::TempDir = tempfile::tempdir().unwrap();
    }
    DIR.with(|d| d.path().to_path_buf())
}

fn copy_dir(from: &Path, to: &Path) {
    if to.exists() {
        std::fs::remove_dir_all(to).unwrap();
    }
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// How a model directory's file is damaged.
#[derive(Debug, Clone)]
enum Damage {
    Truncate(f64),
    Flip(f64, u8),
    Replace(Vec<u8>),
    Remove,
    /// A line of a text file set to another text.
    Line(f64, String),
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        (0.0..1.0f64).prop_map(Damage::Truncate),
        (0.0..1.0f64, 1..=255u8).prop_map(|(p, x)| Damage::Flip(p, x)),
        proptest::collection::vec(any::<u8>(), 0..64).prop_map(Damage::Replace),
        Just(Damage::Remove),
        (0.0..1.0f64, "[a-z_ =\"0-9.\\[\\]\t-]{0,24}").prop_map(|(p, s)| Damage::Line(p, s)),
    ]
}

const MODEL_FILES: [&str; 6] = [
    "model.safetensors",
    "config.toml",
    "vocab.src",
    "vocab.tgt",
    "preprocess.json",
    "COMPLETE",
];

fn apply(path: &Path, d: &Damage) {
    let mut bytes = std::fs::read(path).unwrap();
    let at = |p: f64, n: usize| ((p * n as f64) as usize).min(n.saturating_sub(1));
    match d {
        Damage::Truncate(p) => bytes.truncate(at(*p, bytes.len())),
        Damage::Flip(p, x) => {
            if !bytes.is_empty() {
                let k = at(*p, bytes.len());
                bytes[k] ^= x;
            }
        }
        Damage::Replace(b) => bytes = b.clone(),
        Damage::Remove => {
            std::fs::remove_file(path).unwrap();
            return;
        }
        Damage::Line(p, s) => {
            let text = String::from_utf8_lossy(&bytes).into_owned();
            let mut lines: Vec<String> = text.lines().map(String::from).collect();
            if !lines.is_empty() {
                let k = at(*p, lines.len());
                lines[k] = s.clone();
            }
            bytes = (lines.join("\n") + "\n").into_bytes();
        }
    }
    std::fs::write(path, bytes).unwrap();
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn config_parser_never_panics(s in "\\PC*", line in 0.0..1.0f64, value in "[a-z_ =\"0-9.\\[\\],-]{0,30}") {
        timed("config text", || { let _ = Config::from_toml_str(&s, "fuzz"); });
        // A valid configuration with one line replaced.
        let text = Config::default().to_toml();
        let mut lines: Vec<&str> = text.lines().collect();
        let k = ((line * lines.len() as f64) as usize).min(lines.len() - 1);
        lines[k] = &value;
        let mutated = lines.join("\n");
        timed("config line", || {
            if let Ok(c) = Config::from_toml_str(&mutated, "fuzz") {
                // What parses writes back and parses again.
                Config::from_toml_str(&c.to_toml(), "again").unwrap();
            }
        });
        timed("--set", || { let _ = Config::load(None, &[value.clone()]); });
    }

    #[test]
    fn corpus_reader_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300), gz in any::<bool>(), cut in 0.0..1.0f64) {
        let dir = scratch();
        let p = dir.join(if gz { "c.gz" } else { "c.txt" });
        let data = if gz {
            // Real gzip of the bytes, cut short somewhere (or not).
            use std::io::Write;
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            e.write_all(&bytes).unwrap();
            let mut z = e.finish().unwrap();
            let n = z.len();
            if cut < 0.5 { z.truncate(((cut * 2.0) * n as f64) as usize); }
            z
        } else {
            bytes.clone()
        };
        std::fs::write(&p, &data).unwrap();
        timed("corpus", || {
            if let Ok(lines) = cgnmt_data::corpus::read_lines(&p) {
                prop_assert!(lines.iter().all(|l| !l.contains('\n')));
            }
            Ok(())
        })?;
    }

    #[test]
    fn text_pipeline_never_panics(s in "\\PC{0,80}", t in "[我们你好。，！？ a-zA-Z0-9'\".,!?&;\u{3000}\u{a0}-]{0,60}") {
        let pre = timed("load", || Preprocessor::load(model_dir()).unwrap());
        for x in [&s, &t] {
            timed("pipeline", || {
                let src = pre.src_tokens(x);
                let tgt = pre.tgt_tokens(x);
                prop_assert!(src.iter().chain(&tgt).all(|w| !w.is_empty() && !w.contains(char::is_whitespace)));
                let _ = pre.postprocess_tgt(&tgt);
                Ok(())
            })?;
        }
    }

    #[test]
    fn vocabulary_files_never_panic(words in proptest::collection::vec("[a-z]{0,3}|\\PC{0,4}", 0..20), raw in proptest::collection::vec(any::<u8>(), 0..100)) {
        let dir = scratch();
        let p = dir.join("vocab");
        std::fs::write(&p, words.join("\n")).unwrap();
        timed("vocab", || { let _ = Vocab::load(&p); });
        std::fs::write(&p, &raw).unwrap();
        timed("vocab bytes", || { let _ = Vocab::load(&p); });
        // Repeated and empty words are refused, naming the line.
        for (text, line) in [("</s>\n<unk>\nword\nword\n", "line 4"), ("</s>\n<unk>\nword\n\nw\n", "line 4")] {
            std::fs::write(&p, text).unwrap();
            let e = Vocab::load(&p).unwrap_err().to_string();
            prop_assert!(e.contains(line), "{}", e);
        }
    }

    #[test]
    fn damaged_model_directories_never_panic(file in 0..MODEL_FILES.len(), d in damage()) {
        let dir = scratch().join("model");
        copy_dir(model_dir(), &dir);
        apply(&dir.join(MODEL_FILES[file]), &d);
        timed("model dir", || {
            if let Err(e) = store::load(&dir, DType::F32, &Device::Cpu) {
                let msg = e.to_string();
                prop_assert!(!msg.is_empty());
            }
            Ok(())
        })?;
    }
}
