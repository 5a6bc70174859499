//! Search options on a real model: GNMT's length penalty (`translate --length-penalty`) at 0 is the plain
//! search byte for byte, and a positive α lengthens the outputs the total log-probability keeps short.

mod common;

use common::{prepare, run_ok};

#[test]
fn length_penalty_lengthens_outputs_and_zero_changes_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 400);
    let run = tmp.path().join("run");
    common::train_tiny(
        &prepared,
        &run,
        &[
            "model.embedding_dim=48",
            "model.hidden_dim=64",
            "model.attention_dim=48",
            "train.batch_size=32",
            "train.max_steps=180",
            "train.optimizer=adam",
            "train.learning_rate=0.005",
        ],
    );
    let src =
        cgnmt_data::corpus::read_lines(&common::data_dir().join("tatoeba-zh-en/test.zh")).unwrap();
    let input = tmp.path().join("in.zh");
    std::fs::write(&input, src[..120].join("\n") + "\n").unwrap();
    let model = run.join("last");
    let tr = |extra: &[&str]| -> Vec<String> {
        let mut args = vec![
            "translate",
            "--quiet",
            "-m",
            model.to_str().unwrap(),
            "-i",
            input.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        run_ok(&args).lines().map(String::from).collect()
    };
    let plain = tr(&[]);
    assert_eq!(tr(&["--length-penalty", "0"]), plain);
    let words = |v: &[String]| {
        v.iter()
            .map(|l| l.split_whitespace().count())
            .sum::<usize>()
    };
    let long = tr(&["--length-penalty", "2"]);
    assert_eq!(long.len(), plain.len());
    assert!(
        words(&long) > words(&plain),
        "{} words with α = 2 against {} without",
        words(&long),
        words(&plain)
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args([
            "translate",
            "-m",
            model.to_str().unwrap(),
            "-i",
            input.to_str().unwrap(),
            "--length-penalty=-1",
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--length-penalty -1"));
}
