//! `cgnmt serve` started for real on 127.0.0.1 (a free port) and asked with a real HTTP client: its
//! translations equal `cgnmt translate`'s byte for byte, concurrent clients each get their own answers, bad
//! requests get 4xx with a JSON message naming the problem (never a panic), a full queue answers 429 with
//! Retry-After, and SIGTERM lets the request in flight finish.

mod common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use common::{prepare, run_ok};

struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(model: &Path, extra: &[&str]) -> Server {
    start_with(model, extra, &[])
}

fn start_with(model: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cgnmt"))
        .envs(env.iter().copied())
        .args(["serve", "-m"])
        .arg(model)
        .args(["--addr", "127.0.0.1:0"])
        .args(extra)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "the server exited before listening"
        );
        if let Some(rest) = line.strip_prefix("listening on ") {
            let base = rest.split_whitespace().next().unwrap().to_string();
            // Keep draining its messages.
            std::thread::spawn(move || for _ in err.lines() {});
            return Server { child, base };
        }
    }
}

fn json(r: ureq::Response) -> serde_json::Value {
    serde_json::from_str(&r.into_string().unwrap()).unwrap()
}

/// POST a JSON body; (status, parsed answer).
fn post(base: &str, body: &str) -> (u16, serde_json::Value) {
    match ureq::post(&format!("{base}/v1/translate"))
        .set("Content-Type", "application/json")
        .send_string(body)
    {
        Ok(r) => (r.status(), json(r)),
        Err(ureq::Error::Status(code, r)) => (code, json(r)),
        Err(e) => panic!("{e}"),
    }
}

fn translations(v: &serde_json::Value) -> Vec<String> {
    v["translations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["translation"].as_str().unwrap().to_string())
        .collect()
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
    let src =
        cgnmt_data::corpus::read_lines(&common::data_dir().join("tatoeba-zh-en/test.zh")).unwrap();
    let sentences: Vec<String> = src[..24].to_vec();
    let input = tmp.path().join("in.zh");
    std::fs::write(&input, sentences.join("\n") + "\n").unwrap();
    let want: Vec<String> = run_ok(&[
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
