//! End to end on real data: a model overfits 200 Tatoeba pairs (loss → ~0, greedy BLEU > 90); greedy decoding
//! equals beam 1; batched beam search equals one sentence at a time; save → load → translate is byte-identical;
//! a training run killed with SIGKILL and resumed ends with the same parameters as an uninterrupted one.

use crate::common;

use common::{prepare, run_ok};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use candle_core::{DType, Device};
use cgnmt::decode::beam_search::{beam_search, greedy, DecodeOptions};
use cgnmt::model::store;
use cgnmt::train::checkpoint;

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_cgnmt")
}

struct Overfit {
    prepared: PathBuf,
    run: PathBuf,
}

/// 200 Tatoeba pairs with distinct sources (the corpus has many sources with several translations, which no
/// model can fit to zero loss), written as a small corpus.
fn distinct_pairs(dir: &Path) -> (PathBuf, PathBuf) {
    let d = common::data_dir().join("tatoeba-zh-en");
    let zh = lines(&d.join("train.zh"));
    let en = lines(&d.join("train.en"));
    let mut seen = std::collections::HashSet::new();
    let (mut s, mut t) = (String::new(), String::new());
    let mut n = 0;
    for (a, b) in zh.iter().zip(&en).skip(5000) {
        if seen.insert(a.clone()) {
            s += &format!("{a}\n");
            t += &format!("{b}\n");
            n += 1;
            if n == 200 {
                break;
            }
        }
    }
    std::fs::create_dir_all(dir).unwrap();
    let (ps, pt) = (dir.join("sub.zh"), dir.join("sub.en"));
    std::fs::write(&ps, s).unwrap();
    std::fs::write(&pt, t).unwrap();
    (ps, pt)
}

/// Train once (shared by the tests of this file): 200 pairs, small model, Adam.
fn overfit() -> &'static Overfit {
    static CELL: OnceLock<Overfit> = OnceLock::new();
    CELL.get_or_init(|| {
        // A static is never dropped, so a temporary directory here would be left behind after every run: use
        // one fixed directory under the target directory, rebuilt by each run.
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("pipeline-overfit");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).unwrap();
        let prepared = root.join("prep");
        let (zs, es) = distinct_pairs(&root.join("sub"));
        let d = common::data_dir().join("tatoeba-zh-en");
        run_ok(&[
            "prepare",
            "--src",
            zs.to_str().unwrap(),
            "--tgt",
            es.to_str().unwrap(),
            "--dev-src",
            d.join("dev.zh").to_str().unwrap(),
            "--dev-tgt",
            d.join("dev.en").to_str().unwrap(),
            "--out",
            prepared.to_str().unwrap(),
            "--force",
        ]);
        let run = root.join("run");
        run_ok(&[
            "train",
            "--quiet",
            "--out",
            run.to_str().unwrap(),
            "--set",
            &format!("data.prepared={:?}", prepared.display().to_string()),
            "--set",
            "model.embedding_dim=64",
            "--set",
            "model.hidden_dim=128",
            "--set",
            "model.attention_dim=128",
            "--set",
            "train.batch_size=20",
            "--set",
            "train.optimizer=adam",
            "--set",
            "train.learning_rate=0.005",
            "--set",
            "train.max_steps=1400",
            "--set",
            "train.eval_every=0",
            "--set",
            "train.eval_max_sentences=20",
            "--set",
            "train.eval_beam=2",
        ]);
        Overfit { prepared, run }
    })
}

fn lines(p: &Path) -> Vec<String> {
    std::fs::read_to_string(p)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn overfits_200_pairs_to_near_zero_loss_and_bleu_above_90() {
    let o = overfit();
    // Mean per-token loss of the final model over the whole training set.
    let lm = store::load(&o.run.join("best"), DType::F32, &Device::Cpu).unwrap();
    let tok = |p: &str| -> Vec<Vec<u32>> {
        let v = if p == "src" {
            &lm.src_vocab
        } else {
            &lm.tgt_vocab
        };
        lines(&o.prepared.join(format!("train.{p}")))
            .iter()
            .map(|l| v.encode(&l.split(' ').collect::<Vec<_>>()))
            .collect()
    };
    let (srcs, tgts) = (tok("src"), tok("tgt"));
    let (mut total, mut tokens) = (0.0f64, 0usize);
    for (s, t) in srcs.chunks(50).zip(tgts.chunks(50)) {
        let b = cgnmt::model::Batch::new(s, t, 0, DType::F32, &Device::Cpu).unwrap();
        total += lm.model.loss(&b).unwrap().to_scalar::<f32>().unwrap() as f64 * s.len() as f64;
        tokens += b.tgt_tokens;
    }
    let loss = total / tokens as f64;
    assert!(loss < 0.15, "final training loss per token {loss}");
    // Greedy translation of the training sources, scored on tokens.
    let out = run_ok(&[
        "translate",
        "-m",
        o.run.to_str().unwrap(),
        "--beam",
        "1",
        "--pretokenized",
        "--quiet",
        "-i",
        o.prepared.join("train.src").to_str().unwrap(),
    ]);
    let hyps: Vec<String> = out.lines().map(str::to_string).collect();
    let refs = lines(&o.prepared.join("train.tgt"));
    assert_eq!(hyps.len(), refs.len());
    // Detokenised output vs detokenised references (the tokenised references detokenise exactly).
    let pre = cgnmt_data::preprocess::Preprocessor::load(&o.prepared).unwrap();
    let refs: Vec<String> = refs
        .iter()
        .map(|r| pre.postprocess_tgt(&r.split(' ').collect::<Vec<_>>()))
        .collect();
    let bleu = cgnmt_eval::bleu::corpus_bleu(
        &hyps,
        &[refs],
        &cgnmt_eval::bleu::BleuOptions::mteval_v11b(),
    )
    .unwrap();
    eprintln!(
        "overfit: loss/token {loss:.4}, greedy BLEU {:.2}",
        bleu.score
    );
    assert!(
        bleu.score > 90.0,
        "greedy BLEU on the training pairs {:.2}",
        bleu.score
    );
}

fn dev_ids(o: &Overfit, lm: &store::LoadedModel, n: usize) -> Vec<Vec<u32>> {
    lines(&o.prepared.join("dev.src"))
        .iter()
        .chain(lines(&o.prepared.join("train.src")).iter())
        .take(n)
        .map(|l| {
            lm.src_vocab
                .encode(&l.split_whitespace().collect::<Vec<_>>())
        })
        .filter(|v| !v.is_empty())
        .collect()
}

#[test]
fn greedy_equals_beam_one_and_batched_equals_single() {
    let o = overfit();
    let lm = store::load(&o.run.join("best"), DType::F32, &Device::Cpu).unwrap();
    let srcs = dev_ids(o, &lm, 60);
    let eos = lm.tgt_vocab.eos();
    let g = greedy(&lm.model, &srcs, eos, (1.0, 1.0)).unwrap();
    let b1 = cgnmt::decode::beam_search::translate_ids(
        &lm.model,
        &srcs,
        eos,
        &DecodeOptions {
            beam: 1,
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(g, b1, "greedy and beam 1 differ");
    for beam in [1usize, 5] {
        let opts = DecodeOptions {
            beam,
            nbest: beam,
            ..Default::default()
        };
        let batched = beam_search(&lm.model, &srcs, eos, &opts).unwrap();
        for (i, s) in srcs.iter().enumerate() {
            let single = beam_search(&lm.model, std::slice::from_ref(s), eos, &opts).unwrap();
            let a: Vec<&Vec<u32>> = batched[i].iter().map(|h| &h.tokens).collect();
            let b: Vec<&Vec<u32>> = single[0].iter().map(|h| &h.tokens).collect();
            assert_eq!(
                a, b,
                "beam {beam}, sentence {i}: batched and single decoding differ"
            );
            for (x, y) in batched[i].iter().zip(&single[0]) {
                assert!(
                    (x.score - y.score).abs() < 1e-3,
                    "scores {} vs {}",
                    x.score,
                    y.score
                );
            }
        }
    }
    // Beam constraints: every hypothesis respects the length limits.
    let out = beam_search(
        &lm.model,
        &srcs,
        eos,
        &DecodeOptions {
            beam: 5,
            ..Default::default()
        },
    )
    .unwrap();
    for (s, h) in srcs.iter().zip(&out) {
        let (min, max) = cgnmt::decode::beam_search::length_limits(s.len());
        assert!(h[0].tokens.len() <= max);
        assert!(h[0].tokens.len() >= min || h[0].tokens.len() == max);
    }
}

#[test]
fn save_load_translate_is_byte_identical() {
    let o = overfit();
    let input = o.prepared.join("dev.src");
    let tmp = tempfile::tempdir().unwrap();
    // In memory: load once, translate, save to a new directory, load that, translate again.
    let lm = store::load(&o.run.join("best"), DType::F32, &Device::Cpu).unwrap();
    let resaved = tmp.path().join("copy");
    checkpoint::save(
        &resaved,
        &checkpoint::SaveRequest {
            config: &lm.config,
            varmap: &lm.varmap,
            src_vocab: &lm.src_vocab,
            tgt_vocab: &lm.tgt_vocab,
            preprocess_dir: &lm.dir,
            optimizer: None,
            state: None,
        },
    )
    .unwrap();
    let a = run_ok(&[
        "translate",
        "-m",
        o.run.join("best").to_str().unwrap(),
        "--pretokenized",
        "--quiet",
        "-i",
        input.to_str().unwrap(),
    ]);
    let b = run_ok(&[
        "translate",
        "-m",
        resaved.to_str().unwrap(),
        "--pretokenized",
        "--quiet",
        "-i",
        input.to_str().unwrap(),
    ]);
    assert_eq!(a.lines().count(), lines(&input).len());
    assert_eq!(a, b);
    // The composed reference kernels translate the same way as the fused ones.
    let c = run_ok(&[
        "--kernels",
        "reference",
        "translate",
        "-m",
        o.run.join("best").to_str().unwrap(),
        "--pretokenized",
        "--quiet",
        "-i",
        input.to_str().unwrap(),
    ]);
    assert_eq!(a, c, "fused and reference kernels translate differently");
    let w1 = std::fs::read(o.run.join("best").join("model.safetensors")).unwrap();
    let w2 = std::fs::read(resaved.join("model.safetensors")).unwrap();
    assert_eq!(w1, w2, "weights changed across save/load");
}

#[test]
fn empty_lines_stay_aligned() {
    let o = overfit();
    let tmp = tempfile::tempdir().unwrap();
    let inp = tmp.path().join("in.txt");
    std::fs::write(&inp, "我 爱 你 。\n\n你好 。\n   \n").unwrap();
    let out = run_ok(&[
        "translate",
        "-m",
        o.run.to_str().unwrap(),
        "--pretokenized",
        "--quiet",
        "-i",
        inp.to_str().unwrap(),
    ]);
    let l: Vec<&str> = out.split('\n').collect();
    assert_eq!(l.len(), 5, "{out:?}"); // 4 lines + trailing newline
    assert!(!l[0].is_empty() && l[1].is_empty() && !l[2].is_empty() && l[3].is_empty());
}

fn tiny_train_args(prepared: &Path, run: &Path, extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "train".into(),
        "--quiet".into(),
        "--out".into(),
        run.display().to_string(),
        "--set".into(),
        format!("data.prepared={:?}", prepared.display().to_string()),
        "--set".into(),
        "model.embedding_dim=16".into(),
        "--set".into(),
        "model.hidden_dim=24".into(),
        "--set".into(),
        "model.attention_dim=16".into(),
        "--set".into(),
        "train.batch_size=8".into(),
        "--set".into(),
        "train.max_steps=60".into(),
        "--set".into(),
        "train.save_every=4".into(),
        "--set".into(),
        "train.eval_every=25".into(),
        "--set".into(),
        "train.eval_max_sentences=8".into(),
        "--set".into(),
        "train.eval_beam=2".into(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

/// Training with a moving average of the parameters (resumed runs must continue it exactly).
const SMOOTHED: &[&str] = &["--set", "train.exponential_smoothing=0.05"];

#[test]
fn kill_and_resume_gives_the_same_parameters() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 120);
    // Uninterrupted.
    let a = tmp.path().join("a");
    let out = Command::new(bin())
        .args(tiny_train_args(&prepared, &a, SMOOTHED))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Killed with SIGKILL part-way (after some checkpoint), then resumed, possibly several times.
    let b = tmp.path().join("b");
    let mut kills = 0;
    // A fast machine can finish the 60 steps between two polls: start again from scratch (a few times).
    for _attempt in 0..5 {
        if kills > 0 {
            break;
        }
        let _ = std::fs::remove_dir_all(&b);
        for _ in 0..2 {
            let args = if b.join("last").exists() {
                vec![
                    "train".to_string(),
                    "--quiet".into(),
                    "--resume".into(),
                    b.display().to_string(),
                ]
            } else {
                tiny_train_args(&prepared, &b, SMOOTHED)
            };
            let mut child = Command::new(bin()).args(&args).spawn().unwrap();
            let start_step = store::complete_dir(&b.join("last"))
                .map(|d| checkpoint::load_state(&d).unwrap().step)
                .unwrap_or(0);
            loop {
                std::thread::sleep(std::time::Duration::from_millis(5));
                if let Some(st) = child.try_wait().unwrap() {
                    assert!(st.success());
                    break;
                }
                if let Some(d) = store::complete_dir(&b.join("last")) {
                    if let Ok(s) = checkpoint::load_state(&d) {
                        if s.step >= start_step + 4 && !s.finished {
                            child.kill().unwrap(); // SIGKILL
                            child.wait().unwrap();
                            kills += 1;
                            break;
                        }
                    }
                }
            }
        }
    }
    assert!(kills >= 1, "the run finished before it could be killed");
    let out = Command::new(bin())
        .args(["train", "--quiet", "--resume", b.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let sa = checkpoint::load_state(&a.join("last")).unwrap();
    let sb = checkpoint::load_state(&b.join("last")).unwrap();
    assert_eq!(sa.step, 60);
    assert_eq!(sb.step, 60);
    // The parameters, and their moving average (kept in the resumable checkpoint, saved as smoothed/).
    for file in ["last/model.safetensors", "smoothed/model.safetensors"] {
        let ta = candle_core::safetensors::load(a.join(file), &Device::Cpu).unwrap();
        let tb = candle_core::safetensors::load(b.join(file), &Device::Cpu).unwrap();
        assert_eq!(ta.len(), tb.len());
        for (k, x) in &ta {
            let y = &tb[k];
            let d = (x - y)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert_eq!(
                d, 0.0,
                "{file}: {k} differs after kill + resume (max abs diff {d})"
            );
        }
    }
    let smoothed =
        candle_core::safetensors::load(a.join("smoothed/model.safetensors"), &Device::Cpu).unwrap();
    let last =
        candle_core::safetensors::load(a.join("last/model.safetensors"), &Device::Cpu).unwrap();
    assert!(
        smoothed.iter().any(|(k, x)| {
            (x - &last[k])
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
                > 0.0
        }),
        "the moving average is not the last parameters"
    );
    let hist_a: Vec<f64> = sa.history.iter().map(|h| h.dev_bleu).collect();
    let hist_b: Vec<f64> = sb.history.iter().map(|h| h.dev_bleu).collect();
    assert_eq!(hist_a, hist_b);
}

#[test]
fn align_writes_valid_links_and_soft_matrices_for_aer() {
    let Some(a) = common::data_set_or_skip(
        "align-zh-en-tsinghua",
        "align_writes_valid_links_and_soft_matrices_for_aer",
    ) else {
        return;
    };
    let o = overfit();
    let tmp = tempfile::tempdir().unwrap();
    let links = tmp.path().join("links.talp");
    let soft = tmp.path().join("soft.jsonl");
    run_ok(&[
        "align",
        "-m",
        o.run.to_str().unwrap(),
        "--src",
        a.join("test.zh").to_str().unwrap(),
        "--tgt",
        a.join("test.en").to_str().unwrap(),
        "-o",
        links.to_str().unwrap(),
        "--soft",
        soft.to_str().unwrap(),
    ]);
    let src = lines(&a.join("test.zh"));
    let tgt = lines(&a.join("test.en"));
    let l = lines(&links);
    assert_eq!(l.len(), src.len());
    for (k, line) in l.iter().enumerate() {
        let (ns, nt) = (
            src[k].split_whitespace().count(),
            tgt[k].split_whitespace().count(),
        );
        let pairs: Vec<(usize, usize)> = line
            .split_whitespace()
            .map(|p| {
                let (i, j) = p.split_once('-').unwrap();
                (i.parse().unwrap(), j.parse().unwrap())
            })
            .collect();
        // Exactly one link per target word, inside the sentence.
        assert_eq!(pairs.len(), nt, "pair {k}");
        assert!(pairs.iter().all(|&(i, j)| i < ns && j < nt));
    }
    for (k, rec) in lines(&soft).iter().enumerate() {
        let v: serde_json::Value = serde_json::from_str(rec).unwrap();
        let m = v["attention"].as_array().unwrap();
        assert_eq!(m.len(), tgt[k].split_whitespace().count());
        for row in m {
            let s: f64 = row
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .sum();
            assert!((s - 1.0).abs() < 1e-6);
        }
    }
    // The AER scorer accepts both files.
    let out = run_ok(&[
        "aer",
        "--gold",
        a.join("test.talp").to_str().unwrap(),
        "--pred",
        links.to_str().unwrap(),
        "--soft",
        soft.to_str().unwrap(),
        "--json",
    ]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let aer = v["aer"].as_f64().unwrap();
    assert!((0.0..=1.0).contains(&aer));
    assert!(v["saer"].as_f64().is_some());
}

#[test]
fn long_inputs_are_split_or_truncated_and_the_beam_is_bounded() {
    use cgnmt::decode::translate::{InputLimit, LongInput, Pipeline};
    let o = overfit();
    let lm = store::load(&o.run.join("best"), DType::F32, &Device::Cpu).unwrap();
    let tr = Pipeline {
        model: &lm.model,
        others: vec![],
        src_vocab: &lm.src_vocab,
        tgt_vocab: &lm.tgt_vocab,
        preprocess: &lm.preprocess,
    };
    let train = lines(&o.prepared.join("train.src"));
    // A long line: five training sources one after another (21+ tokens); limit 8.
    let long: Vec<&str> = train[..5]
        .iter()
        .flat_map(|l| l.split_whitespace())
        .collect();
    let n = long.len();
    assert!(n > 16, "{n}");
    let input = vec![train[5].clone(), long.join(" ")];
    let opts = DecodeOptions {
        record: true,
        ..Default::default()
    };
    let lim = |long_input| InputLimit {
        max_words: 8,
        long_input,
    };
    let (split, which) = tr
        .translate_within(
            &input,
            Default::default(),
            &opts,
            4,
            true,
            lim(LongInput::Split),
            |_| {},
        )
        .unwrap();
    let pieces = n.div_ceil(8);
    let size = n.div_ceil(pieces);
    assert_eq!(
        which,
        vec![cgnmt::decode::translate::LongLine {
            index: 1,
            words: n,
            pieces
        }]
    );
    // Each piece translated as a sentence of its own, the outputs joined in order.
    let parts: Vec<String> = long.chunks(size).map(|c| c.join(" ")).collect();
    let alone = tr.translate(&parts, &opts, 4, true, |_| {}).unwrap();
    let joined: Vec<String> = alone.iter().flat_map(|t| t.tokens.clone()).collect();
    assert_eq!(split[1].tokens, joined);
    let score: f64 = alone.iter().map(|t| t.hyps[0].score).sum();
    assert!((split[1].hyps[0].score - score).abs() < 1e-9);
    // The joined attention covers the whole line: one row per output word and the final EOS, each a
    // distribution over the line's words and EOS.
    let att = &split[1].hyps[0].attention;
    assert_eq!(att.len(), joined.len() + 1);
    for row in att {
        assert_eq!(row.len(), n + 1);
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-4);
    }
    // The short line is untouched.
    let plain = tr.translate(&input[..1], &opts, 4, true, |_| {}).unwrap();
    assert_eq!(split[0].tokens, plain[0].tokens);
    // Truncation translates the first 8 tokens.
    let (cut, _) = tr
        .translate_within(
            &input,
            Default::default(),
            &opts,
            4,
            true,
            lim(LongInput::Truncate),
            |_| {},
        )
        .unwrap();
    let first = tr
        .translate(&[long[..8].join(" ")], &opts, 4, true, |_| {})
        .unwrap();
    assert_eq!(cut[1].tokens, first[0].tokens);
    assert_eq!(cut[1].src_tokens.len(), 8);

    // The command line: a warning naming the line, one output line per input line.
    let tmp = tempfile::tempdir().unwrap();
    let inp = tmp.path().join("in.txt");
    std::fs::write(&inp, input.join("\n") + "\n").unwrap();
    let m = o.run.to_str().unwrap();
    let out = Command::new(bin())
        .args([
            "translate",
            "-m",
            m,
            "--pretokenized",
            "--quiet",
            "--max-input-words",
            "8",
            "-i",
        ])
        .arg(&inp)
        .output()
        .unwrap();
    assert!(out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("in.txt: line 2:") && err.contains(&format!("{n} tokens")),
        "{err}"
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).lines().count(), 2);
    let out = Command::new(bin())
        .args(["translate", "-m", m, "--beam", "100000", "-i"])
        .arg(&inp)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("--beam 100000: it must be between 1 and")
            && err.contains("target vocabulary"),
        "{err}"
    );
}

/// What the README claims of determinism: a configuration that names its updates trains to the same bits at
/// the same thread count (run after run, whatever else the machine does); another thread count sums in
/// another order, so it starts off by float rounding only (and the runs then drift apart like two seeds).
#[test]
fn training_is_bitwise_reproducible_at_one_thread_count() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 160);
    let train = |name: &str, threads: usize| {
        let run = tmp.path().join(name);
        let t = format!("train.threads={threads}");
        let out = Command::new(bin())
            .args(tiny_train_args(
                &prepared,
                &run,
                &[
                    "--set",
                    &t,
                    "--set",
                    "model.hidden_dim=64",
                    "--set",
                    "train.batch_size=32",
                ],
            ))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let losses: Vec<f64> = lines(&run.join("train.log"))
            .iter()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v.get("step").is_some())
            .map(|v| v["loss_per_token"].as_f64().unwrap())
            .collect();
        (
            std::fs::read(run.join("last/model.safetensors")).unwrap(),
            losses,
        )
    };
    let (a, la) = train("a", 2);
    let (b, lb) = train("b", 2);
    assert_eq!(la, lb, "the same thread count logs the same losses");
    assert!(a == b, "the same thread count trains to the same bits");
    let (_, l1) = train("c", 1);
    assert_eq!(l1.len(), la.len());
    // The first logged window (updates 1–10): equal up to summation order.
    let rel = (l1[0] - la[0]).abs() / la[0];
    assert!(
        rel < 1e-5,
        "1 against 2 threads: {} against {}",
        l1[0],
        la[0]
    );
}
