//! `cgnmt serve`: a translation server (HTTP + JSON) on axum/tokio. Decoding runs on tokio's blocking pool,
//! never on the async threads; requests are bounded (body size, sentences, words per sentence) with JSON
//! errors that name the limit; SIGTERM or Ctrl-C stops accepting and lets the requests in flight finish.
//!
//! Requests that arrive within a few milliseconds of each other are decoded together (dynamic batching, one
//! decoding thread whose calls decode their batches concurrently).
//!
//! API: `POST /v1/translate` `{"sentences": [...], "model"?, "beam"?, "nbest"?, "length_norm"?, "length_penalty"?, "coverage_penalty"?,
//! "context_scale"?: [a, b], "return_attention"?, "word_scores"?, "alignment"?, "target_prefix"?: [...],
//! "constraints"?: [[...]], "avoid"?: [[...]]}` → `{"model", "translations": [{"translation", "tokens",
//! "src_tokens", "score", "nbest"?, "attention"?, "gates"?, "coverage"?, "word_scores"?, "token_scores"?,
//! "word_gates"?, "alignment"?, "alignment_soft"?, "unmet_constraints"?}]}` in the order of the sentences;
//! `GET /v1/models`; `GET /healthz`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};

use cgnmt::decode::beam_search::DecodeOptions;
use cgnmt::decode::translate::Translation;

mod pages;

/// How `cgnmt serve` serves (its command-line arguments).
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// A model directory, or NAME=DIR (repeatable; the first is the default model).
    pub models: Vec<String>,
    /// Address to listen on (port 0: any free port; the address is printed).
    pub addr: SocketAddr,
    /// Sentences decoded together in one batch (a decoding call runs one such batch per core at once).
    pub max_batch: usize,
    /// Most sentences in one request (more: 413).
    pub max_sentences: usize,
    /// Most words (tokens) in one sentence (more: 413).
    pub max_input_words: usize,
    /// Largest request body in bytes (more: 413).
    pub max_body_bytes: usize,
    /// Largest beam a request may ask for.
    pub max_beam: usize,
    /// Requests arriving within this many milliseconds of each other (with the same model and options) are
    /// decoded in one batch.
    pub batch_window_ms: u64,
    /// Translation requests admitted at once (decoding or waiting); more are answered 429 with Retry-After.
    pub queue: usize,
    /// Judgement database (SQLite) of the subjective-evaluation page `/eval`; created when missing.
    pub eval_db: Option<PathBuf>,
    /// Blinded pairs to judge (`pairs.jsonl` from `cgnmt eval-pairs` or `cgnmt reproduce`); needed when the
    /// database is new, and kept in it.
    pub eval_pairs: Option<PathBuf>,
}

/// A loaded model, ready to decode from any thread.
struct Served {
    name: String,
    dir: PathBuf,
    tr: cgnmt::Translator,
}

struct AppState {
    models: Arc<Vec<Served>>,
    args: ServeOptions,
    /// The batcher's queue: requests decoded together when they arrive within `--batch-window-ms`.
    jobs: std::sync::mpsc::Sender<Job>,
    /// Translation requests answered by the decoder, and the decoding calls that answered them (fewer when
    /// requests were batched together): shown by /healthz.
    counts: Arc<Counts>,
    /// One permit per admitted translation request.
    admitted: Arc<tokio::sync::Semaphore>,
    /// The subjective evaluation's judgements (with `--eval-db`).
    eval: Option<Arc<std::sync::Mutex<cgnmt_subjective::Store>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TranslateRequest {
    sentences: Vec<String>,
    #[serde(default)]
    model: Option<String>,
    #[serde(default)]
    beam: Option<usize>,
    #[serde(default)]
    nbest: Option<usize>,
    #[serde(default)]
    length_norm: bool,
    #[serde(default)]
    length_penalty: Option<f64>,
    #[serde(default)]
    coverage_penalty: Option<f64>,
    #[serde(default)]
    context_scale: Option<(f64, f64)>,
    #[serde(default)]
    return_attention: bool,
    /// Each output word's log-probability (and mean gate value), as `translate --word-scores`.
    #[serde(default)]
    word_scores: bool,
    /// `hard`, `soft` or a probability: the word alignment, as `translate --alignment`.
    #[serde(default)]
    alignment: Option<String>,
    /// One target prefix per sentence (empty for none), as `translate --prefix`.
    #[serde(default)]
    target_prefix: Option<Vec<String>>,
    /// One list of phrases per sentence that its output must contain, as `translate --constraints`.
    #[serde(default)]
    constraints: Option<Vec<Vec<String>>>,
    /// One list of phrases per sentence that its output must not contain, as `translate --avoid`.
    #[serde(default)]
    avoid: Option<Vec<Vec<String>>>,
}

/// A request's per-sentence steering (each list empty, or one entry per sentence).
#[derive(Default)]
struct Steer {
    target_prefix: Vec<String>,
    constraints: Vec<Vec<String>>,
    avoid: Vec<Vec<String>>,
}

#[derive(Serialize)]
struct Alternative {
    translation: String,
    score: f64,
}

#[derive(Serialize)]
struct TranslationOut {
    translation: String,
    tokens: Vec<String>,
    src_tokens: Vec<String>,
    score: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    nbest: Option<Vec<Alternative>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    attention: Option<Vec<Vec<f32>>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    gates: Option<Vec<f32>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    coverage: Option<Vec<f32>>,
    /// With `word_scores`: each output word's log-probability (subword pieces merged).
    #[serde(skip_serializing_if = "Option::is_none")]
    word_scores: Option<Vec<f64>>,
    /// With `word_scores`: each output token's log-probability (`tokens`, then EOS when emitted).
    #[serde(skip_serializing_if = "Option::is_none")]
    token_scores: Option<Vec<f32>>,
    /// With `word_scores`, where the model has a gate: each output word's mean gate value.
    #[serde(skip_serializing_if = "Option::is_none")]
    word_gates: Option<Vec<f32>>,
    /// With `alignment` hard or a probability: `[source word, output word]` links.
    #[serde(skip_serializing_if = "Option::is_none")]
    alignment: Option<Vec<(usize, usize)>>,
    /// With `alignment` soft: each output word's attention over the source words.
    #[serde(skip_serializing_if = "Option::is_none")]
    alignment_soft: Option<Vec<Vec<f64>>>,
    /// With `constraints`: how many of the sentence's constraints its output does not contain (0 unless
    /// they could not all be met within the length limit).
    #[serde(skip_serializing_if = "Option::is_none")]
    unmet_constraints: Option<usize>,
}

#[derive(Serialize)]
struct TranslateResponse {
    model: String,
    translations: Vec<TranslationOut>,
}

/// An error answer: `{"error": "..."}` with its status.
struct ApiError(StatusCode, String);

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.0, Json(serde_json::json!({ "error": self.1 }))).into_response()
    }
}

fn bad(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::BAD_REQUEST, msg.into())
}

fn too_large(msg: impl Into<String>) -> ApiError {
    ApiError(StatusCode::PAYLOAD_TOO_LARGE, msg.into())
}

fn load_models(specs: &[String]) -> Result<Vec<Served>> {
    let mut out: Vec<Served> = vec![];
    for spec in specs {
        let (name, dir) = match spec.split_once('=') {
            Some((n, d)) if !n.is_empty() => (n.to_string(), PathBuf::from(d)),
            _ => {
                let d = PathBuf::from(spec);
                let name = d
                    .components()
                    .filter_map(|c| c.as_os_str().to_str())
                    .filter(|c| *c != "best" && *c != "last" && *c != ".")
                    .next_back()
                    .unwrap_or("model")
                    .to_string();
                (name, d)
            }
        };
        if out.iter().any(|m| m.name == name) {
            bail!("two models are named {name:?}: name them with -m NAME=DIR");
        }
        let tr = cgnmt::Translator::open(&[&dir], &Default::default())
            .with_context(|| format!("model {name:?}"))?;
        out.push(Served { name, dir, tr });
    }
    Ok(out)
}

/// Load the models, listen, and serve until SIGTERM or Ctrl-C.
pub fn run(args: ServeOptions) -> Result<()> {
    if args.max_batch == 0 || args.max_sentences == 0 || args.max_beam == 0 || args.queue == 0 {
        bail!("--max-batch, --max-sentences, --max-beam and --queue must be at least 1");
    }
    let models = load_models(&args.models)?;
    let eval = match &args.eval_db {
        Some(db) => {
            let store = cgnmt_subjective::Store::open(db, args.eval_pairs.as_deref())?;
            eprintln!(
                "subjective evaluation: {} items, {} judgements stored in {}",
                store.items.len(),
                store.rows()?,
                db.display()
            );
            Some(Arc::new(std::sync::Mutex::new(store)))
        }
        None => None,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.addr)
            .await
            .with_context(|| format!("cannot listen on {}", args.addr))?;
        let addr = listener.local_addr()?;
        let names: Vec<String> = models.iter().map(|m| m.name.clone()).collect();
        let models = Arc::new(models);
        let (jobs, rx) = std::sync::mpsc::channel();
        let counts = Arc::new(Counts::default());
        {
            let (models, max_batch, counts) = (models.clone(), args.max_batch, counts.clone());
            let window = std::time::Duration::from_millis(args.batch_window_ms);
            std::thread::Builder::new()
                .name("batcher".into())
                .spawn(move || batcher(&models, &rx, max_batch, window, &counts))
                .context("cannot start the decoding thread")?;
        }
        let state = Arc::new(AppState {
            models,
            jobs,
            counts,
            admitted: Arc::new(tokio::sync::Semaphore::new(args.queue)),
            eval,
            args,
        });
        let app = Router::new()
            .route("/healthz", get(health))
            .route("/v1/models", get(list_models))
            .route("/v1/openapi.json", get(|| async { Json(openapi()) }))
            .route("/v1/translate", post(translate))
            .route("/", get(pages::explorer))
            .route("/eval", get(pages::eval))
            .route("/v1/eval/items", get(pages::eval_items))
            .route("/v1/eval/judgements", post(pages::eval_judgement))
            .with_state(state);
        eprintln!(
            "listening on http://{addr} (models: {}; explorer at /, evaluation at /eval); SIGTERM or Ctrl-C stops",
            names.join(", ")
        );
        axum::serve(listener, app)
            .with_graceful_shutdown(shutdown_signal())
            .await
            .context("server error")?;
        eprintln!("stopped: every request in flight was answered");
        Ok(())
    })
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

async fn health(State(st): State<Arc<AppState>>) -> impl IntoResponse {
    let get = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    Json(serde_json::json!({
        "status": "ok",
        "requests": get(&st.counts.requests),
        "decode_calls": get(&st.counts.decode_calls),
    }))
}

async fn list_models(State(st): State<Arc<AppState>>) -> impl IntoResponse {
    let models: Vec<serde_json::Value> = st
        .models
        .iter()
        .map(|m| {
            serde_json::json!({
                "name": m.name,
                "dir": m.dir.display().to_string(),
                "decoder": format!("{:?}", m.tr.model().config.model.decoder).to_lowercase(),
                "context_gate": format!("{:?}", m.tr.model().config.model.context_gate).to_lowercase(),
                "encoder_layers": m.tr.model().config.model.encoder_layers,
                "decoder_transition_depth": m.tr.model().config.model.decoder_transition_depth,
                "layer_norm": m.tr.model().config.model.layer_norm,
                "src_vocab": m.tr.model().src_vocab.len(),
                "tgt_vocab": m.tr.model().tgt_vocab.len(),
                // The decoding settings chosen on dev that the model keeps: a request's defaults.
                "decoding": m.tr.settings(),
            })
        })
        .collect();
    Json(serde_json::json!({
        "default": st.models[0].name,
        "models": models,
    }))
}

async fn translate(State(st): State<Arc<AppState>>, body: axum::body::Body) -> Response {
    // Admitted, or 429 at once: the queue of requests is bounded.
    let Ok(permit) = st.admitted.clone().try_acquire_owned() else {
        let mut r = ApiError(
            StatusCode::TOO_MANY_REQUESTS,
            format!(
                "the server is busy: {} requests are in its queue (--queue); try again",
                st.args.queue
            ),
        )
        .into_response();
        r.headers_mut().insert(
            axum::http::header::RETRY_AFTER,
            axum::http::HeaderValue::from_static("1"),
        );
        return r;
    };
    let r = translate_admitted(st, body).await;
    drop(permit);
    match r {
        Ok(j) => j.into_response(),
        Err(e) => e.into_response(),
    }
}

async fn translate_admitted(
    st: Arc<AppState>,
    body: axum::body::Body,
) -> std::result::Result<Json<TranslateResponse>, ApiError> {
    let limit = st.args.max_body_bytes;
    let bytes = axum::body::to_bytes(body, limit).await.map_err(|_| {
        too_large(format!(
            "the request body is larger than the server's limit of {limit} bytes (--max-body-bytes)"
        ))
    })?;
    let req: TranslateRequest = serde_json::from_slice(&bytes).map_err(|e| {
        bad(format!(
            "malformed request: {e} (expected {{\"sentences\": [\"...\"], ...}})"
        ))
    })?;
    let k = match &req.model {
        None => 0,
        Some(n) => st.models.iter().position(|m| &m.name == n).ok_or_else(|| {
            ApiError(
                StatusCode::NOT_FOUND,
                format!(
                    "no model {n:?} (models: {})",
                    st.models
                        .iter()
                        .map(|m| m.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            )
        })?,
    };
    let a = &st.args;
    if req.sentences.len() > a.max_sentences {
        return Err(too_large(format!(
            "{} sentences in one request; the limit is {} (--max-sentences)",
            req.sentences.len(),
            a.max_sentences
        )));
    }
    let alignment = match &req.alignment {
        Some(a) => Some(
            a.parse::<cgnmt::decode::alignment::AlignmentMode>()
                .map_err(|e| bad(format!("alignment {e}")))?,
        ),
        None => None,
    };
    let beam = req.beam.unwrap_or(10);
    let nbest = req.nbest.unwrap_or(1);
    let vocab = st.models[k].tr.model().tgt_vocab.len();
    // The model's penalties chosen on dev, unless the request gives them.
    let defaults = st.models[k].tr.options();
    let length_penalty = req.length_penalty.unwrap_or(defaults.length_penalty);
    let coverage_penalty = req.coverage_penalty.unwrap_or(defaults.coverage_penalty);
    DecodeOptions {
        beam,
        nbest,
        length_penalty,
        coverage_penalty,
        context_scale: req.context_scale.unwrap_or((1.0, 1.0)),
        ..Default::default()
    }
    .validate(vocab, a.max_beam, |k| k.to_string())
    .map_err(bad)?;
    let steer = Steer {
        target_prefix: req.target_prefix.unwrap_or_default(),
        constraints: req.constraints.unwrap_or_default(),
        avoid: req.avoid.unwrap_or_default(),
    };
    let with_constraints = !steer.constraints.is_empty();
    {
        let tr = st.models[k].tr.pipeline();
        for (i, s) in req.sentences.iter().enumerate() {
            let n = tr.source_tokens(s, false).len();
            if n > a.max_input_words {
                return Err(too_large(format!(
                    "sentence {i} has {n} words; the limit is {} (--max-input-words)",
                    a.max_input_words
                )));
            }
        }
        let lines = cgnmt::decode::translate::LineSteering {
            prefixes: &steer.target_prefix,
            constraints: &steer.constraints,
            avoid: &steer.avoid,
        };
        if !lines.is_empty() {
            tr.check_steering(&req.sentences, lines, false, cgnmt::InputLimit::NONE)
                .map_err(|e| {
                    bad(format!(
                        "target_prefix, constraints or avoid (lines count sentences from 1): {e}"
                    ))
                })?;
        }
    }
    let key = OptionsKey {
        beam,
        nbest,
        length_norm: req.length_norm,
        length_penalty: length_penalty.to_bits(),
        coverage_penalty: coverage_penalty.to_bits(),
        context_scale: req
            .context_scale
            .map_or((1f64.to_bits(), 1f64.to_bits()), |(x, y)| {
                (x.to_bits(), y.to_bits())
            }),
        // Word scores' gates and alignments read what recording keeps.
        record: req.return_attention || req.word_scores || alignment.is_some(),
        word_scores: req.word_scores,
    };
    let (reply, answer) = tokio::sync::oneshot::channel();
    st.jobs
        .send(Job {
            k,
            key,
            sentences: req.sentences,
            steer,
            reply,
        })
        .map_err(|_| {
            ApiError(
                StatusCode::SERVICE_UNAVAILABLE,
                "the decoder has stopped".into(),
            )
        })?;
    let translated = answer
        .await
        .map_err(|_| {
            ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the decoder has stopped".into(),
            )
        })?
        .map_err(|e| {
            ApiError(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("decoding failed: {e}"),
            )
        })?;
    let asked = Asked {
        nbest,
        attention: req.return_attention,
        word_scores: req.word_scores,
        alignment,
        constraints: with_constraints,
    };
    let out = respond(&st.models[k], translated, &asked);
    Ok(Json(out))
}

/// Decoding options as a batch's key (requests with equal keys share a batch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct OptionsKey {
    beam: usize,
    nbest: usize,
    length_norm: bool,
    /// GNMT's length penalty α, as bits.
    length_penalty: u64,
    /// GNMT's coverage penalty β, as bits.
    coverage_penalty: u64,
    /// The context scale's bits (a, b).
    context_scale: (u64, u64),
    record: bool,
    word_scores: bool,
}

impl OptionsKey {
    /// The decoding options of the key, in batches of `batch` (the request's lines were checked against
    /// `--max-input-words` when it came in: no limit here).
    fn options(&self, batch: usize) -> cgnmt::TranslateOptions {
        cgnmt::TranslateOptions {
            beam: self.beam,
            nbest: self.nbest,
            length_norm: self.length_norm,
            length_penalty: f64::from_bits(self.length_penalty),
            coverage_penalty: f64::from_bits(self.coverage_penalty),
            context_scale: (
                f64::from_bits(self.context_scale.0),
                f64::from_bits(self.context_scale.1),
            ),
            record: self.record,
            word_scores: self.word_scores,
            batch,
            input_limit: cgnmt::InputLimit::NONE,
            ..Default::default()
        }
    }
}

#[derive(Default)]
struct Counts {
    requests: std::sync::atomic::AtomicU64,
    decode_calls: std::sync::atomic::AtomicU64,
}

/// One request's sentences, waiting for the batcher.
struct Job {
    k: usize,
    key: OptionsKey,
    sentences: Vec<String>,
    steer: Steer,
    reply: tokio::sync::oneshot::Sender<std::result::Result<Vec<Translation>, String>>,
}

/// The decoding thread: takes a request, gathers those that arrive within `window` (up to `max_batch`
/// sentences per core), decodes each group of one model and options as one call (its batches run concurrently), and
/// hands every request its own translations. Ends when the server's state is dropped.
fn batcher(
    models: &[Served],
    rx: &std::sync::mpsc::Receiver<Job>,
    max_batch: usize,
    window: std::time::Duration,
    counts: &Counts,
) {
    // Test hook: `CGNMT_TEST_DECODE_DELAY_MS=N` waits N ms before each decoding call (so that a test can
    // signal the server while a request is surely in flight).
    let delay = std::env::var("CGNMT_TEST_DECODE_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(std::time::Duration::from_millis);
    // A decoding call runs its batches of `max_batch` concurrently, one a core (as `translate` does): gather
    // enough sentences for every core.
    let gather = max_batch * rayon::current_num_threads().max(1);
    while let Ok(first) = rx.recv() {
        let mut n = first.sentences.len();
        let mut jobs = vec![first];
        let until = std::time::Instant::now() + window;
        while n < gather {
            let left = until.saturating_duration_since(std::time::Instant::now());
            match rx.recv_timeout(left) {
                Ok(j) => {
                    n += j.sentences.len();
                    jobs.push(j);
                }
                Err(_) => break,
            }
        }
        let mut groups: Vec<((usize, OptionsKey), Vec<Job>)> = vec![];
        for j in jobs {
            match groups.iter_mut().find(|(g, _)| *g == (j.k, j.key)) {
                Some((_, v)) => v.push(j),
                None => groups.push(((j.k, j.key), vec![j])),
            }
        }
        for ((k, key), jobs) in groups {
            let tr = &models[k].tr;
            let all: Vec<String> = jobs
                .iter()
                .flat_map(|j| j.sentences.iter().cloned())
                .collect();
            counts
                .requests
                .fetch_add(jobs.len() as u64, std::sync::atomic::Ordering::Relaxed);
            counts
                .decode_calls
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if let Some(d) = delay {
                std::thread::sleep(d);
            }
            // The requests' steering, a request without any taking empty entries.
            let mut opts = key.options(max_batch);
            if jobs.iter().any(|j| !j.steer.target_prefix.is_empty()) {
                opts.target_prefix = jobs
                    .iter()
                    .flat_map(|j| padded(&j.steer.target_prefix, j.sentences.len()))
                    .collect();
            }
            if jobs.iter().any(|j| !j.steer.constraints.is_empty()) {
                opts.constraints = jobs
                    .iter()
                    .flat_map(|j| padded(&j.steer.constraints, j.sentences.len()))
                    .collect();
            }
            if jobs.iter().any(|j| !j.steer.avoid.is_empty()) {
                opts.avoid = jobs
                    .iter()
                    .flat_map(|j| padded(&j.steer.avoid, j.sentences.len()))
                    .collect();
            }
            match tr.translate(&all, &opts) {
                Ok(out) => {
                    let mut it = out.into_iter();
                    for j in jobs {
                        let part: Vec<Translation> = it.by_ref().take(j.sentences.len()).collect();
                        let _ = j.reply.send(Ok(part));
                    }
                }
                Err(e) => {
                    for j in jobs {
                        let _ = j.reply.send(Err(format!("{e:#}")));
                    }
                }
            }
        }
    }
}

/// A request's per-sentence list, or `n` empty entries when it has none.
fn padded<T: Clone + Default>(v: &[T], n: usize) -> Vec<T> {
    if v.is_empty() {
        vec![T::default(); n]
    } else {
        v.to_vec()
    }
}

/// What a request asked for beside the translations.
struct Asked {
    nbest: usize,
    attention: bool,
    word_scores: bool,
    alignment: Option<cgnmt::decode::alignment::AlignmentMode>,
    constraints: bool,
}

fn respond(m: &Served, out: Vec<Translation>, asked: &Asked) -> TranslateResponse {
    use cgnmt::decode::alignment::{AlignmentMode, WordLevel};
    let (nbest, record) = (asked.nbest, asked.attention);
    let has_gate = !matches!(m.tr.model().model.gate, cgnmt::model::gate::Gate::None);
    let translations = out
        .into_iter()
        .map(|t| {
            let best = t.hyps.first();
            let words = (asked.word_scores || asked.alignment.is_some()).then(|| {
                WordLevel::of(
                    &t.src_tokens,
                    &t.tokens,
                    best.unwrap_or(&Default::default()),
                )
            });
            let w = words.as_ref();
            TranslationOut {
                word_scores: w
                    .filter(|_| asked.word_scores)
                    .map(|w| w.word_scores.clone()),
                token_scores: asked
                    .word_scores
                    .then(|| best.map(|h| h.word_scores.clone()).unwrap_or_default()),
                word_gates: w
                    .filter(|_| asked.word_scores && has_gate)
                    .map(|w| w.word_gates.clone()),
                alignment: match (w, asked.alignment) {
                    (Some(w), Some(a)) if a != AlignmentMode::Soft => Some(w.links(a)),
                    _ => None,
                },
                alignment_soft: match (w, asked.alignment) {
                    (Some(w), Some(AlignmentMode::Soft)) => Some(w.attention.clone()),
                    _ => None,
                },
                unmet_constraints: asked
                    .constraints
                    .then(|| best.map_or(0, |h| h.unmet_constraints)),
                score: best.map(|h| h.score),
                nbest: (nbest > 1).then(|| {
                    t.hyps
                        .iter()
                        .map(|h| Alternative {
                            translation: m.tr.hypothesis_text(h),
                            score: h.score,
                        })
                        .collect()
                }),
                attention: record.then(|| best.map(|h| h.attention.clone()).unwrap_or_default()),
                gates: record.then(|| best.map(|h| h.gates.clone()).unwrap_or_default()),
                coverage: record.then(|| best.map(|h| h.coverage.clone()).unwrap_or_default()),
                translation: t.text,
                tokens: t.tokens,
                src_tokens: t.src_tokens,
            }
        })
        .collect();
    TranslateResponse {
        model: m.name.clone(),
        translations,
    }
}

/// The API's OpenAPI 3 description (served at /v1/openapi.json).
fn openapi() -> serde_json::Value {
    let error = serde_json::json!({
        "description": "a JSON error naming the problem",
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    });
    serde_json::json!({
        "openapi": "3.0.3",
        "info": {
            "title": "cgnmt translation server",
            "version": cgnmt::VERSION,
            "description": "Context-gated RNN translation (Tu et al., 2017). Decoding with beam search; attention, gate values and coverage on request."
        },
        "paths": {
            "/healthz": {"get": {"summary": "liveness", "responses": {"200": {"description": "{\"status\": \"ok\"}"}}}},
            "/v1/models": {"get": {"summary": "the models served (the first is the default)", "responses": {"200": {"description": "{\"default\", \"models\": [{\"name\", \"dir\", \"decoder\", \"context_gate\", \"encoder_layers\", \"decoder_transition_depth\", \"layer_norm\", \"src_vocab\", \"tgt_vocab\", \"decoding\": {\"length_penalty\", \"coverage_penalty\", \"beam\", \"dev_bleu\", \"dev_sentences\"} or null}]}"}}}},
            "/v1/translate": {"post": {
                "summary": "translate sentences (answers in the same order)",
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TranslateRequest"}}}},
                "responses": {
                    "200": {"description": "translations", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/TranslateResponse"}}}},
                    "400": error, "404": error, "413": error,
                    "429": {"description": "the queue is full; see Retry-After"}
                }
            }}
        },
        "components": {"schemas": {
            "Error": {"type": "object", "properties": {"error": {"type": "string"}}},
            "TranslateRequest": {"type": "object", "required": ["sentences"], "properties": {
                "sentences": {"type": "array", "items": {"type": "string"}},
                "model": {"type": "string"},
                "beam": {"type": "integer", "minimum": 1, "default": 10},
                "nbest": {"type": "integer", "minimum": 1, "default": 1},
                "length_norm": {"type": "boolean", "default": false},
                "length_penalty": {"type": "number", "minimum": 0, "description": "GNMT's length penalty α (default: the model's, chosen on dev; else 0)"},
                "coverage_penalty": {"type": "number", "minimum": 0, "description": "GNMT's coverage penalty β (default: the model's, chosen on dev; else 0)"},
                "context_scale": {"type": "array", "items": {"type": "number", "minimum": 0, "maximum": 4}, "minItems": 2, "maxItems": 2},
                "return_attention": {"type": "boolean", "default": false},
                "word_scores": {"type": "boolean", "default": false, "description": "each output word's log-probability and mean gate value"},
                "alignment": {"type": "string", "description": "hard, soft, or a probability in (0, 1]: the word alignment from attention"},
                "target_prefix": {"type": "array", "items": {"type": "string"}, "description": "one per sentence (empty for none): the words its output starts with"},
                "constraints": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}, "description": "one list per sentence: phrases its output must contain, each once, in any order"},
                "avoid": {"type": "array", "items": {"type": "array", "items": {"type": "string"}}, "description": "one list per sentence: phrases its output must not contain"}
            }},
            "TranslateResponse": {"type": "object", "properties": {
                "model": {"type": "string"},
                "translations": {"type": "array", "items": {"type": "object", "properties": {
                    "translation": {"type": "string"},
                    "tokens": {"type": "array", "items": {"type": "string"}},
                    "src_tokens": {"type": "array", "items": {"type": "string"}},
                    "score": {"type": "number"},
                    "nbest": {"type": "array", "items": {"type": "object", "properties": {"translation": {"type": "string"}, "score": {"type": "number"}}}},
                    "attention": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                    "gates": {"type": "array", "items": {"type": "number"}},
                    "coverage": {"type": "array", "items": {"type": "number"}},
                    "word_scores": {"type": "array", "items": {"type": "number"}},
                    "token_scores": {"type": "array", "items": {"type": "number"}},
                    "word_gates": {"type": "array", "items": {"type": "number"}},
                    "alignment": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}, "minItems": 2, "maxItems": 2}},
                    "alignment_soft": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
                    "unmet_constraints": {"type": "integer", "minimum": 0}
                }}}
            }}
        }}
    })
}
