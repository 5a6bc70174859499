//! A deep model (`model.encoder_layers`, `model.decoder_transition_depth`) through the command line: it trains,
//! resumes to the same parameters, and every decoding path reads it — exact beam search, `--int8`,
//! `--shortlist`, an ensemble, `--dump` — as do `align` and `info`.

use std::path::Path;

use crate::common::*;

/// A tiny deep model's training arguments on `prepared` into `run`, for `steps` updates.
fn deep_args(prepared: &Path, run: &Path, steps: usize, sets: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "train".into(),
        "--quiet".into(),
        "--out".into(),
        run.display().to_string(),
    ];
    for s in [
        format!("data.prepared={:?}", prepared.display().to_string()),
        "model.embedding_dim=16".into(),
        "model.hidden_dim=24".into(),
        "model.attention_dim=16".into(),
        "model.encoder_layers=2".into(),
        "model.decoder_transition_depth=2".into(),
        "train.batch_size=8".into(),
        format!("train.max_steps={steps}"),
        "train.save_every=5".into(),
        "train.eval_every=0".into(),
        "train.recurrent_dropout=0.2".into(),
        "train.threads=1".into(),
    ]
    .into_iter()
    .chain(sets.iter().map(|s| s.to_string()))
    {
        v.push("--set".into());
        v.push(s);
    }
    v
}

fn run_args(args: &[String]) -> String {
    run_ok(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn weights(run: &Path) -> std::collections::BTreeMap<String, Vec<f32>> {
    let dir = cgnmt::model::store::complete_dir(&run.join("last")).unwrap();
    let t =
        candle_core::safetensors::load(dir.join("model.safetensors"), &candle_core::Device::Cpu)
            .unwrap();
    t.into_iter()
        .map(|(k, v)| (k, v.flatten_all().unwrap().to_vec1::<f32>().unwrap()))
        .collect()
}

#[test]
fn a_deep_model_trains_resumes_and_decodes_everywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 200);
    // Straight to 12 updates, and 6 then resumed to 12: the same parameters, bit for bit.
    let a = tmp.path().join("a");
    run_args(&deep_args(&prepared, &a, 12, &[]));
    let b = tmp.path().join("b");
    run_args(&deep_args(&prepared, &b, 6, &[]));
    run_ok(&[
        "train",
        "--quiet",
        "--resume",
        b.to_str().unwrap(),
        "--set",
        "train.max_steps=12",
    ]);
    let (wa, wb) = (weights(&a), weights(&b));
    for name in [
        "encoder.layer2.fwd.U_ru",
        "encoder.layer2.bwd.W",
        "decoder.cell.deep2.U",
        "decoder.cell.deep2.b",
    ] {
        assert!(wa.contains_key(name), "{name} saved");
    }
    assert_eq!(wa, wb, "a resumed deep run equals the uninterrupted one");

    let src = tmp.path().join("src.txt");
    let dev: Vec<String> = std::fs::read_to_string(prepared.join("dev.src"))
        .unwrap()
        .lines()
        .take(12)
        .map(str::to_string)
        .collect();
    std::fs::write(&src, dev.join("\n") + "\n").unwrap();
    let model = a.join("last");
    let translate = |extra: &[&str]| -> Vec<String> {
        let mut args = vec![
            "translate",
            "--quiet",
            "--pretokenized",
            "-m",
            model.to_str().unwrap(),
            "-i",
            src.to_str().unwrap(),
            "--beam",
            "4",
        ];
        args.extend(extra);
        run_ok(&args).lines().map(str::to_string).collect()
    };
    let exact = translate(&[]);
    assert_eq!(exact.len(), 12);
    // The reference kernels give the fused kernels' translations.
    assert_eq!(translate(&["--kernels", "reference"]), exact);
    // 8-bit products: one line per input.
    assert_eq!(translate(&["--int8"]).len(), 12);
    // A shortlist from the training data.
    let lex = tmp.path().join("lex.txt");
    run_ok(&[
        "shortlist",
        "--quiet",
        "--src",
        prepared.join("train.src").to_str().unwrap(),
        "--tgt",
        prepared.join("train.tgt").to_str().unwrap(),
        "-o",
        lex.to_str().unwrap(),
    ]);
    assert_eq!(translate(&["--shortlist", lex.to_str().unwrap()]).len(), 12);
    // An ensemble of the model with itself is the model.
    assert_eq!(translate(&["-m", b.join("last").to_str().unwrap()]), exact);
    // The dump records each sentence's attention and gates.
    let dump = tmp.path().join("dump.jsonl");
    translate(&["--dump", dump.to_str().unwrap()]);
    let d = std::fs::read_to_string(&dump).unwrap();
    assert_eq!(d.lines().count(), 12);
    assert!(
        d.contains("\"attention\"") && d.contains("\"gates\""),
        "{}",
        &d[..d.len().min(400)]
    );
    // Alignment from the deep model's attention.
    let tgt = tmp.path().join("tgt.txt");
    std::fs::write(&tgt, exact.join("\n") + "\n").unwrap();
    let links = tmp.path().join("links.txt");
    run_ok(&[
        "align",
        "-m",
        model.to_str().unwrap(),
        "--src",
        src.to_str().unwrap(),
        "--tgt",
        tgt.to_str().unwrap(),
        "-o",
        links.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read_to_string(&links).unwrap().lines().count(), 12);
    // `info` names the depth and counts the new parameters.
    let info = run_ok(&[
        "info",
        "--set",
        "model.encoder_layers=3",
        "--set",
        "model.decoder_transition_depth=2",
    ]);
    assert!(
        info.contains(
            "depth: 3 encoder layer(s) with residual connections, 2 transition(s) per decoder step"
        ),
        "{info}"
    );
    assert!(
        info.contains("encoder.layer2") && info.contains("encoder.layer3"),
        "{info}"
    );
}
