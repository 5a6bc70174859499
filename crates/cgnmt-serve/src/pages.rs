//! The server's pages and the subjective evaluation's API. The pages are plain HTML with their script and
//! style inline, compiled into the binary (no CDN, no internet): `/` the attention-and-gate explorer (it uses
//! `/v1/models` and `/v1/translate`), `/eval` the blinded evaluation (it uses `/v1/eval/*`).

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::{header, StatusCode};
use axum::response::{Html, IntoResponse, Response};
use axum::Json;
use serde::Deserialize;

use super::{bad, ApiError, AppState};
use cgnmt_subjective::Judgement;

const EXPLORER: &str = include_str!("explorer.html");
const EVAL: &str = include_str!("eval.html");

fn page(html: &'static str) -> Response {
    ([(header::CACHE_CONTROL, "no-cache")], Html(html)).into_response()
}

pub(super) async fn explorer() -> Response {
    page(EXPLORER)
}

pub(super) async fn eval(State(st): State<Arc<AppState>>) -> Response {
    if st.eval.is_none() {
        return (
            StatusCode::NOT_FOUND,
            Html(
                "<!doctype html><meta charset=utf-8><title>cgnmt: no evaluation</title>\
                 <p>This server has no subjective evaluation: start it with \
                 <code>--eval-db FILE --eval-pairs pairs.jsonl</code> \
                 (pairs from <code>cgnmt eval-pairs</code> or <code>cgnmt reproduce</code>).</p>",
            ),
        )
            .into_response();
    }
    page(EVAL)
}

fn store(
    st: &AppState,
) -> std::result::Result<Arc<std::sync::Mutex<cgnmt_subjective::Store>>, ApiError> {
    st.eval.clone().ok_or_else(|| {
        ApiError(
            StatusCode::NOT_FOUND,
            "this server has no subjective evaluation (start it with --eval-db and --eval-pairs)"
                .into(),
        )
    })
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
}

#[derive(Deserialize)]
pub(super) struct RaterQuery {
    #[serde(default)]
    rater: String,
}

/// `GET /v1/eval/items?rater=NAME`: the blinded items (sources, references, the two outputs as shown) and
/// the ids this rater has judged.
pub(super) async fn eval_items(
    State(st): State<Arc<AppState>>,
    Query(q): Query<RaterQuery>,
) -> std::result::Result<Json<serde_json::Value>, ApiError> {
    let store = store(&st)?;
    tokio::task::spawn_blocking(move || {
        let s = store.lock().map_err(internal)?;
        let judged = if q.rater.trim().is_empty() {
            vec![]
        } else {
            s.judged(&q.rater).map_err(internal)?
        };
        Ok(Json(serde_json::json!({
            "total": s.items.len(),
            "items": s.items,
            "judged": judged,
        })))
    })
    .await
    .map_err(internal)?
}

/// `POST /v1/eval/judgements` with a [`Judgement`]: answered once the row is on disk.
pub(super) async fn eval_judgement(
    State(st): State<Arc<AppState>>,
    body: axum::body::Body,
) -> std::result::Result<Json<serde_json::Value>, ApiError> {
    let store = store(&st)?;
    let bytes = axum::body::to_bytes(body, 64 << 10)
        .await
        .map_err(|_| super::too_large("a judgement is at most 64 KiB"))?;
    let j: Judgement = serde_json::from_slice(&bytes).map_err(|e| {
        bad(format!(
            "malformed judgement: {e} (expected {{\"rater\", \"item\", \"adequacy\": [a, b], \"fluency\": [a, b], \"preference\": \"first\"|\"second\"|\"equal\"}})"
        ))
    })?;
    tokio::task::spawn_blocking(move || {
        let s = store.lock().map_err(internal)?;
        j.check(s.items.len()).map_err(bad)?;
        let id = s.add(&j).map_err(internal)?;
        let judged = s.judged(&j.rater).map_err(internal)?;
        Ok(Json(serde_json::json!({
            "stored": id,
            "judged": judged.len(),
            "total": s.items.len(),
        })))
    })
    .await
    .map_err(internal)?
}
