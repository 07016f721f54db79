//! GET /health, GET /v1/models, POST /tokenize, POST /detokenize.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::json;

use crate::app::{parse_body, AppState};
use crate::error::ApiError;
use crate::openai::request::{DetokenizeRequest, TokenizeRequest};

/// 200 when the model is loaded and requests are accepted; 503 while loading or stopping.
pub async fn health(State(state): State<Arc<AppState>>) -> Response {
    match state.service() {
        Ok(s) => {
            let st = s.stats();
            Json(json!({"status": "ok", "slots_idle": st.n_slots - st.busy_slots.min(st.n_slots), "slots_processing": st.busy_slots}))
                .into_response()
        }
        Err(e) => {
            let status = if matches!(e, ApiError::ShuttingDown) {
                "shutting down"
            } else {
                "loading model"
            };
            let mut r = e.into_response();
            *r.body_mut() = axum::body::Body::from(
                json!({"status": status, "error": {"message": status}}).to_string(),
            );
            r
        }
    }
}

pub async fn models(State(state): State<Arc<AppState>>) -> Result<Response, ApiError> {
    let service = state.service()?;
    let info = service.info();
    Ok(Json(json!({
        "object": "list",
        "data": [{
            "id": info.id, "object": "model", "created": info.created, "owned_by": "redline",
            "meta": {"n_ctx": info.n_ctx, "n_vocab": info.n_vocab, "n_slots": info.n_slots}
        }]
    }))
    .into_response())
}

pub async fn tokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: TokenizeRequest = parse_body(body, state.config.max_body_bytes)?;
    let service = state.service()?;
    let svc = service.clone();
    let content = req.content;
    let ids = tokio::task::spawn_blocking(move || svc.tokenize(&content, req.add_special))
        .await
        .map_err(|e| ApiError::Internal(format!("tokenize task failed: {e}")))??;
    let tokens: Vec<serde_json::Value> = if req.with_pieces {
        ids.iter()
            .map(
                |&id| json!({"id": id, "piece": String::from_utf8_lossy(&service.token_piece(id))}),
            )
            .collect()
    } else {
        ids.iter().map(|&id| json!(id)).collect()
    };
    Ok(Json(json!({ "tokens": tokens })).into_response())
}

pub async fn detokenize(
    State(state): State<Arc<AppState>>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let req: DetokenizeRequest = parse_body(body, state.config.max_body_bytes)?;
    let service = state.service()?;
    let n_vocab = service.info().n_vocab;
    let ids = req
        .tokens
        .iter()
        .map(|&t| {
            u32::try_from(t)
                .ok()
                .filter(|&id| (id as usize) < n_vocab)
                .ok_or_else(|| {
                    ApiError::invalid_param(
                        "tokens",
                        format!("{t} is not a token id below {n_vocab}"),
                    )
                })
        })
        .collect::<Result<Vec<u32>, _>>()?;
    Ok((
        StatusCode::OK,
        Json(json!({ "content": service.detokenize(&ids) })),
    )
        .into_response())
}
