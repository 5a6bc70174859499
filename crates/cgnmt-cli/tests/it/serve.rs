//! `cgnmt serve` started for real on 127.0.0.1 (a free port) and asked with a real HTTP client: its
//! translations equal `cgnmt translate`'s byte for byte, concurrent clients each get their own answers, bad
//! requests get 4xx with a JSON message naming the problem (never a panic), a full queue answers 429 with
//! Retry-After, and SIGTERM lets the request in flight finish.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::{prepare, run_ok};

pub(crate) struct Server {
    child: Child,
    pub(crate) base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn start(model: &Path, extra: &[&str]) -> Server {
    start_with(model, extra, &[])
}

fn start_with(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let child = Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .envs(env.iter().copied())
        .args(["serve", "-m"])
        .arg(model)
        .args(["--addr", "127.0.0.1:0"])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Held from here, so that the server is killed if it fails to start and the test panics.
    let mut server = Server {
        child,
        base: String::new(),
    };
    let mut err = BufReader::new(server.child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "the server exited before listening"
        );
        if let Some(rest) = line.strip_prefix("listening on ") {
            server.base = rest.split_whitespace().next().unwrap().to_string();
            // Keep draining its messages.
            std::thread::spawn(move || for _ in err.lines() {});
            return server;
        }
    }
}

fn json(r: ureq::Response) -> serde_json::Value {
    serde_json::from_str(&r.into_string().unwrap()).unwrap()
}

/// POST a JSON body; (status, parsed answer).
pub(crate) fn post(base: &str, body: &str) -> (u16, serde_json::Value) {
    match ureq::post(&format!("{base}/v1/translate"))
        .set("Content-Type", "application/json")
        .send_string(body)
    {
        Ok(r) => (r.status(), json(r)),
        Err(ureq::Error::Status(code, r)) => (code, json(r)),
        Err(e) => panic!("{e}"),
    }
}

pub(crate) fn translations(v: &serde_json::Value) -> Vec<String> {
    v["translations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["translation"].as_str().unwrap().to_string())
        .collect()
}

/// The first `n` Tatoeba test sentences and what `translate` writes for them with `model` (the input file goes to
/// `dir`).
fn test_sentences_translated(dir: &Path, model: &Path, n: usize) -> (Vec<String>, Vec<String>) {
    let src =
        cgnmt_data::corpus::read_lines(&common::data_dir().join("tatoeba-zh-en/test.zh")).unwrap();
    let sentences: Vec<String> = src[..n].to_vec();
    let input = dir.join("in.zh");
    std::fs::write(&input, sentences.join("\n") + "\n").unwrap();
    let want = run_ok(&[
        "translate",
        "--quiet",
        "-m",
        model.to_str().unwrap(),
        "-i",
        input.to_str().unwrap(),
    ])
    .lines()
    .map(String::from)
    .collect();
    (sentences, want)
}

#[test]
fn serve_answers_like_translate_and_refuses_bad_requests_clearly() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 200);
    let run = tmp.path().join("run");
    common::train_tiny(
        &prepared,
        &run,
        &["model.context_gate=both", "train.max_steps=40"],
    );
    let model = run.join("last");
    let (sentences, want) = test_sentences_translated(tmp.path(), &model, 24);

    let s = start(
        &model,
        &["--max-sentences", "30", "--max-body-bytes", "4000"],
    );
    let health: serde_json::Value = ureq::get(&format!("{}/healthz", s.base))
        .call()
        .map(json)
        .unwrap();
    assert_eq!(health["status"], "ok");
    let models: serde_json::Value = ureq::get(&format!("{}/v1/models", s.base))
        .call()
        .map(json)
        .unwrap();
    assert_eq!(models["default"], "run");
    assert_eq!(models["models"][0]["context_gate"], "both");

    // The same sentences, the same batch: byte for byte what `translate` wrote.
    let body = serde_json::json!({ "sentences": sentences }).to_string();
    let (code, v) = post(&s.base, &body);
    assert_eq!(code, 200, "{v}");
    assert_eq!(translations(&v), want);
    // Attention and gates on request: one row per output word (EOS included), a gate per word.
    let (code, v) = post(
        &s.base,
        &serde_json::json!({"sentences": [sentences[0]], "return_attention": true, "nbest": 3, "beam": 5})
            .to_string(),
    );
    assert_eq!(code, 200, "{v}");
    let t = &v["translations"][0];
    let words = t["tokens"].as_array().unwrap().len();
    assert_eq!(t["attention"].as_array().unwrap().len(), words + 1);
    assert_eq!(t["gates"].as_array().unwrap().len(), words);
    assert_eq!(t["nbest"].as_array().unwrap().len(), 3);

    // Concurrent clients: every answer is its own request's (a sentence decoded alone is the same sentence
    // decoded in a batch).
    std::thread::scope(|sc| {
        for c in 0..8 {
            let (base, sentences, want) = (&s.base, &sentences, &want);
            sc.spawn(move || {
                for r in 0..5 {
                    let k = (c * 5 + r) % sentences.len();
                    let (code, v) = post(
                        base,
                        &serde_json::json!({"sentences": [sentences[k]]}).to_string(),
                    );
                    assert_eq!(code, 200, "{v}");
                    assert_eq!(translations(&v), vec![want[k].clone()], "sentence {k}");
                }
            });
        }
    });

    // They were decoded in fewer calls than requests (dynamic batching).
    let health: serde_json::Value = ureq::get(&format!("{}/healthz", s.base))
        .call()
        .map(json)
        .unwrap();
    let (requests, calls) = (
        health["requests"].as_u64().unwrap(),
        health["decode_calls"].as_u64().unwrap(),
    );
    eprintln!("{requests} requests in {calls} decoding calls");
    assert_eq!(requests, 2 + 40);
    assert!(calls < requests, "no two requests shared a batch: {health}");
    // Word scores, gates and links on request: what `translate --word-scores --alignment hard` writes.
    let cli = run_ok(&[
        "translate",
        "--quiet",
        "-m",
        model.to_str().unwrap(),
        "-i",
        tmp.path().join("in.zh").to_str().unwrap(),
        "--word-scores",
        "--alignment",
        "hard",
    ]);
    let ask = serde_json::json!({"sentences": sentences, "word_scores": true, "alignment": "hard"});
    let (code, v) = post(&s.base, &ask.to_string());
    assert_eq!(code, 200, "{v}");
    let nums = |f: &str, key: &str| -> Vec<f64> {
        let f = f.strip_prefix(key).unwrap();
        let f = f.split(" Score=").next().unwrap();
        f.split_whitespace().map(|x| x.parse().unwrap()).collect()
    };
    for (k, (line, t)) in cli
        .lines()
        .zip(v["translations"].as_array().unwrap())
        .enumerate()
    {
        let f: Vec<&str> = line.split(" ||| ").collect();
        assert_eq!(f[0], t["translation"].as_str().unwrap(), "sentence {k}");
        let links: Vec<String> = t["alignment"]
            .as_array()
            .unwrap()
            .iter()
            .map(|l| format!("{}-{}", l[0], l[1]))
            .collect();
        assert_eq!(f[1], links.join(" "), "sentence {k}");
        for (field, key, json_key) in [
            (f[2], "WordScores=", "word_scores"),
            (f[3], "WordGates=", "word_gates"),
        ] {
            let (a, b) = (nums(field, key), t[json_key].as_array().unwrap());
            assert_eq!(a.len(), b.len(), "sentence {k}: {json_key}");
            for (x, y) in a.iter().zip(b) {
                assert!(
                    (x - y.as_f64().unwrap()).abs() < 6e-5,
                    "sentence {k}: {json_key} {x} and {y}"
                );
            }
        }
    }
    let (code, v) = post(
        &s.base,
        &serde_json::json!({"sentences": [sentences[0]], "alignment": "soft"}).to_string(),
    );
    assert_eq!(code, 200, "{v}");
    for row in v["translations"][0]["alignment_soft"].as_array().unwrap() {
        let sum: f64 = row
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .sum();
        assert!((sum - 1.0).abs() < 1e-6, "{row}");
    }
    let (code, v) = post(
        &s.base,
        &serde_json::json!({"sentences": [sentences[0]], "alignment": "2"}).to_string(),
    );
    assert_eq!(code, 400, "{v}");
    assert!(v["error"].as_str().unwrap().contains("alignment"), "{v}");
    // Bad requests: 4xx with a message naming the problem.
    for (body, code, says) in [
        ("{\"sentences\": [", 400, "malformed request".to_string()),
        (
            "{\"sentence\": [\"x\"]}",
            400,
            "malformed request".to_string(),
        ),
        (
            &serde_json::json!({"sentences": vec!["你好"; 31]}).to_string()[..],
            413,
            "--max-sentences".to_string(),
        ),
        (&"x".repeat(5000)[..], 413, "--max-body-bytes".to_string()),
        (
            "{\"sentences\": [\"你好\"], \"model\": \"nope\"}",
            404,
            "no model \"nope\"".to_string(),
        ),
        (
            "{\"sentences\": [\"你好\"], \"beam\": 0}",
            400,
            "beam 0".to_string(),
        ),
        (
            "{\"sentences\": [\"你好\"], \"beam\": 4, \"nbest\": 5}",
            400,
            "nbest 5".to_string(),
        ),
        (
            "{\"sentences\": [\"你好\"], \"length_penalty\": -1}",
            400,
            "length_penalty -1".to_string(),
        ),
        (
            "{\"sentences\": [\"你好\"], \"context_scale\": [1e308, -5]}",
            400,
            "context_scale 1e308,-5.0: each scale must be a number in [0, 4]".to_string(),
        ),
    ] {
        let (got, v) = post(&s.base, body);
        assert_eq!(got, code, "{body:.60}: {v}");
        let msg = v["error"].as_str().unwrap();
        assert!(msg.contains(&says), "{body:.60}: {msg}");
    }
    let long = "我 ".repeat(250);
    let (got, v) = post(
        &s.base,
        &serde_json::json!({"sentences": ["好", long]}).to_string(),
    );
    assert_eq!(got, 413);
    assert!(
        v["error"].as_str().unwrap().contains("sentence 1 has"),
        "{v}"
    );
    // Still serving after all that.
    let (code, _) = post(
        &s.base,
        &serde_json::json!({"sentences": [sentences[1]]}).to_string(),
    );
    assert_eq!(code, 200);
}

/// A deep, layer-normalised model served: `/v1/models` names its architecture, and the server answers what
/// `translate` writes.
#[test]
fn serve_answers_a_deep_layer_normalised_model_like_translate() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 200);
    let run = tmp.path().join("run");
    common::train_tiny(
        &prepared,
        &run,
        &[
            "model.layer_norm=true",
            "model.encoder_layers=2",
            "model.decoder_transition_depth=2",
            "train.max_steps=12",
        ],
    );
    let model = run.join("last");
    let (sentences, want) = test_sentences_translated(tmp.path(), &model, 8);
    let s = start(&model, &[]);
    let models: serde_json::Value = ureq::get(&format!("{}/v1/models", s.base))
        .call()
        .map(json)
        .unwrap();
    let m = &models["models"][0];
    assert_eq!(m["layer_norm"], true, "{models}");
    assert_eq!(m["encoder_layers"], 2, "{models}");
    assert_eq!(m["decoder_transition_depth"], 2, "{models}");
    let body = serde_json::json!({ "sentences": sentences }).to_string();
    let (code, v) = post(&s.base, &body);
    assert_eq!(code, 200, "{v}");
    assert_eq!(translations(&v), want);
}

#[test]
fn sigterm_lets_the_request_in_flight_finish() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 120);
    let run = tmp.path().join("run");
    common::train_tiny(&prepared, &run, &["train.max_steps=10"]);
    // Each decoding call waits 1.5 s first: the request is surely in flight when SIGTERM comes.
    let mut s = start_with(
        &run.join("last"),
        &["--max-sentences", "2000", "--queue", "1"],
        &[("CGNMT_TEST_DECODE_DELAY_MS", "1500")],
    );
    let api: serde_json::Value = ureq::get(&format!("{}/v1/openapi.json", s.base))
        .call()
        .map(json)
        .unwrap();
    assert_eq!(api["openapi"], "3.0.3");
    assert!(api["paths"]["/v1/translate"]["post"].is_object());
    let src =
        cgnmt_data::corpus::read_lines(&common::data_dir().join("tatoeba-zh-en/test.zh")).unwrap();
    let body = serde_json::json!({ "sentences": src[..1500], "beam": 20 }).to_string();
    let base = s.base.clone();
    let pending = std::thread::spawn(move || post(&base, &body));
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(
        !pending.is_finished(),
        "the request ended before SIGTERM: make it longer"
    );
    // The queue (of one) is full: a second request is told to come back.
    match ureq::post(&format!("{}/v1/translate", s.base)).send_string("{\"sentences\": [\"你好\"]}")
    {
        Err(ureq::Error::Status(429, r)) => {
            assert_eq!(r.header("Retry-After"), Some("1"));
            assert!(json(r)["error"].as_str().unwrap().contains("--queue"));
        }
        other => panic!("expected 429, got {:?}", other.map(|r| r.status())),
    }
    unsafe {
        libc::kill(s.child.id() as i32, libc::SIGTERM);
    }
    let (code, v) = pending.join().unwrap();
    assert_eq!(code, 200, "{v}");
    assert_eq!(translations(&v).len(), 1500);
    let status = s.child.wait().unwrap();
    assert!(
        status.success(),
        "the server did not exit cleanly: {status}"
    );
}

/// A GET answered 200, parsed.
fn get(url: &str) -> serde_json::Value {
    ureq::get(url).call().map(json).unwrap()
}

/// POST a judgement; (status, parsed answer).
fn judge(base: &str, body: &serde_json::Value) -> (u16, serde_json::Value) {
    match ureq::post(&format!("{base}/v1/eval/judgements"))
        .set("Content-Type", "application/json")
        .send_string(&body.to_string())
    {
        Ok(r) => (r.status(), json(r)),
        Err(ureq::Error::Status(code, r)) => (code, json(r)),
        Err(e) => panic!("{e}"),
    }
}

/// A blinded sample of two "systems" (the references, and the references shouted) of the first 12 test
/// lines, made by `cgnmt eval-pairs`: (source file, pairs file, key file, the two systems' lines).
fn eval_sample(
    dir: &Path,
) -> (
    std::path::PathBuf,
    std::path::PathBuf,
    Vec<String>,
    Vec<String>,
) {
    let d = common::data_dir().join("tatoeba-zh-en");
    let src = cgnmt_data::corpus::read_lines(&d.join("test.zh")).unwrap()[..12].to_vec();
    let refs = cgnmt_data::corpus::read_lines(&d.join("test.en")).unwrap()[..12].to_vec();
    let shout: Vec<String> = refs.iter().map(|r| r.to_uppercase()).collect();
    let w = |name: &str, lines: &[String]| {
        let p = dir.join(name);
        std::fs::write(&p, lines.join("\n") + "\n").unwrap();
        p.display().to_string()
    };
    let (s, g, b, r) = (
        w("src.zh", &src),
        w("good.hyp", &refs),
        w("shout.hyp", &shout),
        w("ref.en", &refs),
    );
    let out = dir.join("sample");
    run_ok(&[
        "eval-pairs",
        "--src",
        &s,
        "--sys",
        &format!("GOOD={g}"),
        "--sys",
        &b,
        "--ref",
        &r,
        "--sentences",
        "8",
        "-o",
        out.to_str().unwrap(),
    ]);
    (out.join("pairs.jsonl"), out.join("key.jsonl"), refs, shout)
}

#[test]
fn evaluation_judgements_are_stored_durably_resumed_and_reported() {
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 120);
    let run = tmp.path().join("run");
    common::train_tiny(&prepared, &run, &["train.max_steps=5"]);
    let (pairs, key, good, shout) = eval_sample(tmp.path());
    // Misaligned outputs are refused, naming the file.
    let short = tmp.path().join("short.hyp");
    std::fs::write(&short, "one line\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args(["eval-pairs", "--src"])
        .arg(tmp.path().join("src.zh"))
        .arg("--sys")
        .arg(tmp.path().join("good.hyp"))
        .arg("--sys")
        .arg(&short)
        .arg("-o")
        .arg(tmp.path().join("bad-sample"))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("short.hyp: 1 lines") && err.contains("line-aligned"),
        "{err}"
    );
    assert!(!tmp.path().join("bad-sample/pairs.jsonl").exists());
    // The sample: 8 items, each showing both systems' line in the order the key gives.
    let items: Vec<serde_json::Value> = std::fs::read_to_string(&pairs)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let keys: Vec<serde_json::Value> = std::fs::read_to_string(&key)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!((items.len(), keys.len()), (8, 8));
    let mut first_good = 0;
    for (it, k) in items.iter().zip(&keys) {
        let line = it["line"].as_u64().unwrap() as usize;
        assert_eq!(k["line"], it["line"]);
        for (o, s) in it["outputs"]
            .as_array()
            .unwrap()
            .iter()
            .zip(k["systems"].as_array().unwrap())
        {
            let want = if s == "GOOD" {
                &good[line]
            } else {
                assert_eq!(s, "shout");
                &shout[line]
            };
            assert_eq!(o.as_str().unwrap(), want);
        }
        first_good += usize::from(k["systems"][0] == "GOOD");
    }
    assert!(
        0 < first_good && first_good < 8,
        "the order is not blinded: {first_good} of 8"
    );
    let good_at = |item: usize| usize::from(keys[item]["systems"][0] != "GOOD");

    let db = tmp.path().join("judgements.sqlite");
    let (p, d) = (pairs.to_str().unwrap(), db.to_str().unwrap());
    let s = start(&run.join("last"), &["--eval-db", d, "--eval-pairs", p]);
    let page = ureq::get(&format!("{}/eval", s.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    assert!(page.contains("Subjective evaluation"));
    let v = get(&format!("{}/v1/eval/items?rater=ann", s.base));
    assert_eq!(v["total"], 8);
    assert_eq!(v["judged"], serde_json::json!([]));
    assert_eq!(v["items"][3], items[3]);
    // ann judges items 0–5 (GOOD: adequacy 5, the other 2; fluency 4 both; prefers GOOD), item 0 twice
    // (first the other way round: only the latest counts); bob judges items 0–2 as equal.
    let scores = |item: usize, g: u8, o: u8| {
        let mut a = [o, o];
        a[good_at(item)] = g;
        a
    };
    let pref = |item: usize| {
        if good_at(item) == 0 {
            "first"
        } else {
            "second"
        }
    };
    let other = |item: usize| {
        if good_at(item) == 0 {
            "second"
        } else {
            "first"
        }
    };
    let (code, v) = judge(
        &s.base,
        &serde_json::json!({"rater": "ann", "item": 0, "adequacy": scores(0, 1, 5), "fluency": [4, 4], "preference": other(0)}),
    );
    assert_eq!(code, 200, "{v}");
    for item in 0..6 {
        let (code, v) = judge(
            &s.base,
            &serde_json::json!({"rater": "ann", "item": item, "adequacy": scores(item, 5, 2), "fluency": [4, 4], "preference": pref(item)}),
        );
        assert_eq!(code, 200, "{v}");
        assert_eq!(v["judged"], item as u64 + 1);
    }
    for item in 0..3 {
        let (code, v) = judge(
            &s.base,
            &serde_json::json!({"rater": "bob", "item": item, "adequacy": [3, 3], "fluency": [3, 3], "preference": "equal"}),
        );
        assert_eq!(code, 200, "{v}");
    }
    // Bad judgements: 400 naming the problem; nothing stored.
    for (body, says) in [
        (
            serde_json::json!({"rater": "ann", "item": 6, "adequacy": [0, 3], "fluency": [3, 3], "preference": "equal"}),
            "adequacy",
        ),
        (
            serde_json::json!({"rater": "ann", "item": 8, "adequacy": [3, 3], "fluency": [3, 3], "preference": "equal"}),
            "item 8",
        ),
        (
            serde_json::json!({"rater": " ", "item": 6, "adequacy": [3, 3], "fluency": [3, 3], "preference": "equal"}),
            "rater",
        ),
        (
            serde_json::json!({"rater": "ann", "item": 6, "adequacy": [3, 3], "fluency": [3, 3], "preference": "both"}),
            "preference",
        ),
        (
            serde_json::json!({"rater": "ann", "item": 6, "adequacy": [3, 3]}),
            "malformed judgement",
        ),
    ] {
        let (code, v) = judge(&s.base, &body);
        assert_eq!(code, 400, "{body}: {v}");
        assert!(v["error"].as_str().unwrap().contains(says), "{body}: {v}");
    }
    // Killed (SIGKILL) at once after the last answer: every answered judgement is on disk.
    drop(s);
    let conn = rusqlite::Connection::open(&db).unwrap();
    let rows: i64 = conn
        .query_row("SELECT COUNT(*) FROM judgement", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 1 + 6 + 3);
    drop(conn);
    // Restarted on the same database (the pairs are in it): ann resumes at item 6.
    let s = start(&run.join("last"), &["--eval-db", d]);
    let v = get(&format!("{}/v1/eval/items?rater=ann", s.base));
    assert_eq!(v["judged"], serde_json::json!([0, 1, 2, 3, 4, 5]));
    drop(s);
    // Another pairs file on this database is refused, naming the problem.
    let other_pairs = tmp.path().join("other.jsonl");
    std::fs::write(
        &other_pairs,
        std::fs::read_to_string(&pairs)
            .unwrap()
            .replace("\"id\":7", "\"id\":7 "),
    )
    .unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .args([
            "serve",
            "-m",
            run.join("last").to_str().unwrap(),
            "--addr",
            "127.0.0.1:0",
            "--eval-db",
            d,
            "--eval-pairs",
            other_pairs.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("another pairs file"));

    // The report: latest judgement per rater and item, unblinded with the key.
    let r: serde_json::Value = serde_json::from_str(&run_ok(&[
        "eval-report",
        d,
        "--key",
        key.to_str().unwrap(),
        "--baseline",
        "shout",
        "--json",
    ]))
    .unwrap();
    assert_eq!(
        (
            r["judgements"].as_u64(),
            r["items"].as_u64(),
            r["raters"].as_u64()
        ),
        (Some(9), Some(6), Some(2))
    );
    assert_eq!(
        (r["baseline"].as_str(), r["system"].as_str()),
        (Some("shout"), Some("GOOD"))
    );
    let close = |v: &serde_json::Value, x: f64| (v.as_f64().unwrap() - x).abs() < 1e-12;
    assert!(
        close(&r["adequacy"][0], 21.0 / 9.0) && close(&r["adequacy"][1], 39.0 / 9.0),
        "{r}"
    );
    assert!(
        close(&r["fluency"][0], 33.0 / 9.0) && close(&r["fluency"][1], 33.0 / 9.0),
        "{r}"
    );
    let c = &r["comparisons"];
    assert_eq!(
        (
            c[0]["criterion"].as_str(),
            c[0]["better"].as_u64(),
            c[0]["equal"].as_u64(),
            c[0]["worse"].as_u64()
        ),
        (Some("adequacy"), Some(6), Some(3), Some(0))
    );
    assert!(close(&c[0]["p_value"], 2.0 / 64.0), "{r}");
    assert_eq!(
        (
            c[1]["better"].as_u64(),
            c[1]["equal"].as_u64(),
            c[1]["worse"].as_u64()
        ),
        (Some(0), Some(9), Some(0))
    );
    assert!(close(&c[1]["p_value"], 1.0));
    assert_eq!(
        (
            c[2]["criterion"].as_str(),
            c[2]["better"].as_u64(),
            c[2]["equal"].as_u64()
        ),
        (Some("preference"), Some(6), Some(3))
    );
    let text = run_ok(&["eval-report", d, "--key", key.to_str().unwrap()]);
    assert!(
        text.contains("GOOD against shout") || text.contains("shout against GOOD"),
        "{text}"
    );
    assert!(text.contains("sign test p"), "{text}");
}

/// A headless Chromium driven through ChromeDriver's WebDriver protocol (HTTP + JSON).
struct Browser {
    driver: Child,
    url: String,
    session: String,
    _profile: tempfile::TempDir,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    /// Debian's chromium and chromium-driver (.ci/run installs them); None, with the reason printed, where
    /// they are missing.
    fn start() -> Option<Browser> {
        let (chromium, chromedriver) = ("/usr/bin/chromium", "/usr/bin/chromedriver");
        for p in [chromium, chromedriver] {
            if !Path::new(p).exists() {
                eprintln!("SKIPPED: the browser test needs {p} (Debian packages chromium and chromium-driver; .ci/run installs them)");
                return None;
            }
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let driver = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        let t0 = std::time::Instant::now();
        while ureq::get(&format!("{url}/status")).call().is_err() {
            assert!(t0.elapsed().as_secs() < 30, "chromedriver did not start");
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let profile = tempfile::tempdir().unwrap();
        let mut b = Browser {
            driver,
            url,
            session: String::new(),
            _profile: profile,
        };
        let caps = serde_json::json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": [
                "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--disable-dev-shm-usage", "--window-size=1400,1000",
                format!("--user-data-dir={}", b._profile.path().display()),
            ]}
        }}});
        let v = b.call("POST", "/session", Some(caps));
        b.session = v["sessionId"].as_str().unwrap().to_string();
        Some(b)
    }

    fn call(&self, method: &str, path: &str, body: Option<serde_json::Value>) -> serde_json::Value {
        let url = if path == "/session" {
            format!("{}{path}", self.url)
        } else {
            format!("{}/session/{}{path}", self.url, self.session)
        };
        let req = ureq::request(method, &url).set("Content-Type", "application/json");
        let r = match body {
            Some(b) => req.send_string(&b.to_string()),
            None if method == "POST" => req.send_string("{}"),
            None => req.call(),
        };
        match r {
            Ok(r) => json(r)["value"].clone(),
            Err(ureq::Error::Status(code, r)) => {
                panic!("WebDriver {method} {path}: {code} {}", json(r))
            }
            Err(e) => panic!("WebDriver {method} {path}: {e}"),
        }
    }

    fn goto(&self, url: &str) {
        self.call("POST", "/url", Some(serde_json::json!({ "url": url })));
    }

    fn find(&self, css: &str) -> String {
        let v = self.call(
            "POST",
            "/element",
            Some(serde_json::json!({"using": "css selector", "value": css})),
        );
        v[ELEMENT].as_str().unwrap().to_string()
    }

    fn click(&self, css: &str) {
        let e = self.find(css);
        self.call("POST", &format!("/element/{e}/click"), None);
    }

    fn type_in(&self, css: &str, text: &str) {
        let e = self.find(css);
        self.call(
            "POST",
            &format!("/element/{e}/value"),
            Some(serde_json::json!({ "text": text })),
        );
    }

    fn hover(&self, css: &str) {
        let e = self.find(css);
        let origin = serde_json::json!({ ELEMENT: e });
        self.call("POST", "/actions", Some(serde_json::json!({"actions": [{"type": "pointer", "id": "mouse",
            "parameters": {"pointerType": "mouse"},
            "actions": [{"type": "pointerMove", "duration": 0, "origin": origin, "x": 0, "y": 0}]}]})));
    }

    fn script(&self, js: &str) -> serde_json::Value {
        self.call(
            "POST",
            "/execute/sync",
            Some(serde_json::json!({"script": js, "args": []})),
        )
    }

    /// Wait (up to a minute) until the expression is true.
    fn wait(&self, expr: &str) {
        let t0 = std::time::Instant::now();
        while self.script(&format!("return !!({expr});")) != serde_json::Value::Bool(true) {
            assert!(t0.elapsed().as_secs() < 60, "timed out waiting for {expr}; page status: {}", self.script("return document.getElementById('status') && document.getElementById('status').textContent;"));
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// With CGNMT_SCREENSHOTS=DIR, a PNG of the page as DIR/NAME.
    fn screenshot(&self, name: &str) {
        if let Ok(dir) = std::env::var("CGNMT_SCREENSHOTS") {
            let v = self.call("GET", "/screenshot", None);
            let png = base64::decode(v.as_str().unwrap()).unwrap();
            std::fs::write(Path::new(&dir).join(name), png).unwrap();
        }
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            let _ = ureq::delete(&format!("{}/session/{}", self.url, self.session)).call();
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

#[test]
fn browser_explorer_translates_and_the_evaluation_page_stores_a_judgement() {
    let Some(b) = Browser::start() else { return };
    let tmp = tempfile::tempdir().unwrap();
    let prepared = tmp.path().join("prep");
    prepare(&prepared, 200);
    let run = tmp.path().join("run");
    common::train_tiny(
        &prepared,
        &run,
        &["model.context_gate=both", "train.max_steps=40"],
    );
    let (pairs, _, _, _) = eval_sample(tmp.path());
    let db = tmp.path().join("judgements.sqlite");
    let model = run.join("last");
    let beside = format!("again={}", model.display());
    let s = start(
        &model,
        &[
            "-m",
            &beside,
            "--eval-db",
            db.to_str().unwrap(),
            "--eval-pairs",
            pairs.to_str().unwrap(),
        ],
    );

    // The explorer: type a sentence, press Translate, read the translation and the heatmap.
    let sentence = "我喜欢蓝色。";
    b.goto(&format!("{}/", s.base));
    b.wait("document.body.dataset.ready === '1'");
    b.type_in("#src", sentence);
    b.click("#go");
    b.wait("document.body.dataset.done");
    let (code, api) = post(&s.base, &serde_json::json!({"sentences": [sentence], "beam": 10, "nbest": 5, "context_scale": [1.0, 1.0], "return_attention": true}).to_string());
    assert_eq!(code, 200);
    let t = &api["translations"][0];
    let shown = b.script("return [...document.querySelectorAll('.panel')].map(p => [p.dataset.model, p.querySelector('.translation').textContent]);");
    assert_eq!(
        shown,
        serde_json::json!([["run", t["translation"]], ["again", t["translation"]]])
    );
    // One heatmap row per output word and </s>, one cell per source word and </s>, a gate bar per word.
    let words = t["tokens"].as_array().unwrap().len();
    let src_words = t["src_tokens"].as_array().unwrap().len();
    let shape = b.script("const h = document.querySelector('.panel table.heat'); return [h.querySelectorAll('tr[data-row]').length, h.querySelectorAll('tr[data-row=\"0\"] td.cell').length, h.querySelectorAll('.bar').length];");
    assert_eq!(shape, serde_json::json!([words + 1, src_words + 1, words]));
    // Each output word is coloured by its probability, its log-probability the API's.
    let (code, scored) = post(&s.base, &serde_json::json!({"sentences": [sentence], "beam": 10, "nbest": 5, "context_scale": [1.0, 1.0], "word_scores": true}).to_string());
    assert_eq!(code, 200, "{scored}");
    let ts = scored["translations"][0]["token_scores"]
        .as_array()
        .unwrap();
    assert_eq!(ts.len(), words + 1);
    let titles = b.script("return [...document.querySelectorAll('.panel table.heat')[0].querySelectorAll('tr[data-row] th.tgt')].map(h => h.title);");
    let want: Vec<String> = ts
        .iter()
        .map(|x| format!("log p {:.3}", x.as_f64().unwrap()))
        .collect();
    assert_eq!(titles, serde_json::json!(want));
    // The cells' shades are the attention weights (the grey ramp of `cgnmt plot`).
    let w = t["attention"][0][0].as_f64().unwrap();
    let v = (255.0 * (1.0 - w)).round() as i64;
    let cell = b.script(
        "return document.querySelector('.panel tr[data-row=\"0\"] td.cell').style.backgroundColor;",
    );
    assert_eq!(cell, serde_json::json!(format!("rgb({v}, {v}, {v})")));
    // Hovering an output word marks its most-attended source word.
    let row = t["attention"][0]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect::<Vec<_>>();
    let best = (0..row.len()).fold(0, |m, j| if row[j] > row[m] { j } else { m });
    b.hover(".panel tr[data-row=\"0\"] th.tgt");
    b.wait("document.querySelector('.panel th.src.aligned')");
    let marked =
        b.script("return Number(document.querySelector('.panel th.src.aligned').dataset.col);");
    assert_eq!(marked, serde_json::json!(best));
    b.screenshot("explorer.png");
    // The source-context slider re-decodes at once: what the page shows is what the API says at a = 0.
    let done = b.script("return document.body.dataset.done;");
    b.script("const r = document.getElementById('scale-a'); r.value = '0'; r.dispatchEvent(new Event('input'));");
    b.wait(&format!("document.body.dataset.done !== {done}"));
    let (_, api0) = post(&s.base, &serde_json::json!({"sentences": [sentence], "beam": 10, "nbest": 5, "context_scale": [0.0, 1.0]}).to_string());
    let shown0 = b.script("return document.querySelector('.panel .translation').textContent;");
    assert_eq!(shown0, api0["translations"][0]["translation"]);
    assert!(b
        .script("return location.search;")
        .as_str()
        .unwrap()
        .contains("a=0"));
    // The penalty controls: empty, their placeholders give the model's own (none kept: 0); a length
    // penalty typed in re-decodes with it, as the API does.
    assert_eq!(
        b.script("return document.getElementById('lp').placeholder;"),
        serde_json::json!("model's: 0")
    );
    let done = b.script("return document.body.dataset.done;");
    b.script("const p = document.getElementById('lp'); p.value = '3'; p.dispatchEvent(new Event('change'));");
    b.wait(&format!("document.body.dataset.done !== {done}"));
    let (_, api3) = post(&s.base, &serde_json::json!({"sentences": [sentence], "beam": 10, "nbest": 5, "context_scale": [0.0, 1.0], "length_penalty": 3.0}).to_string());
    let shown3 = b.script("return document.querySelector('.panel .translation').textContent;");
    assert_eq!(shown3, api3["translations"][0]["translation"]);
    assert!(b
        .script("return location.search;")
        .as_str()
        .unwrap()
        .contains("lp=3"));

    // The evaluation page: a rater signs in, scores both outputs, prefers one, submits.
    b.goto(&format!("{}/eval", s.base));
    b.type_in("#rater", "carol");
    b.click("#login-form button");
    b.wait("document.body.dataset.ready === '1'");
    assert_eq!(
        b.script("return document.body.dataset.item;"),
        serde_json::json!("0")
    );
    let item0: serde_json::Value = serde_json::from_str(
        std::fs::read_to_string(&pairs)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    assert_eq!(
        b.script("return document.getElementById('out1').textContent;"),
        item0["outputs"][1]
    );
    assert_eq!(
        b.script("return document.getElementById('submit').disabled;"),
        serde_json::json!(true)
    );
    for css in [
        "adequacy-0\"][value=\"4",
        "fluency-0\"][value=\"5",
        "adequacy-1\"][value=\"2",
        "fluency-1\"][value=\"3",
        "pref\"][value=\"first",
    ] {
        b.click(&format!("label:has(input[name=\"{css}\"])"));
    }
    b.screenshot("eval.png");
    b.click("#submit");
    b.wait("document.body.dataset.stored");
    assert_eq!(
        b.script("return document.body.dataset.item;"),
        serde_json::json!("1")
    );
    let conn = rusqlite::Connection::open(&db).unwrap();
    let row: (String, i64, i64, i64, i64, i64, String) = conn
        .query_row("SELECT rater, item, adequacy_first, fluency_first, adequacy_second, fluency_second, preference FROM judgement", [], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?, r.get(6)?))
        })
        .unwrap();
    assert_eq!(
        row,
        ("carol".to_string(), 0, 4, 5, 2, 3, "first".to_string())
    );
    // Coming back resumes at the first item not yet judged.
    b.goto(&format!("{}/eval", s.base));
    b.wait("document.body.dataset.ready === '1'");
    assert_eq!(
        b.script("return document.body.dataset.item;"),
        serde_json::json!("1")
    );
}
