//! Shared state and the router: routes, API-key check, body limit, one log line per request.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use engine::scheduler::SamplingParams;

use crate::error::ApiError;
use crate::routes;
use crate::service::InferenceService;

/// Settings fixed at start.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// Bearer key required on every route but `/health` and the static page.
    pub api_key: Option<String>,
    /// Sampling used for fields a request leaves out.
    pub defaults: SamplingParams,
    /// Largest accepted request body.
    pub max_body_bytes: usize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            api_key: None,
            defaults: SamplingParams::default(),
            max_body_bytes: 4 << 20,
        }
    }
}

/// HTTP-side counters for `/metrics`.
#[derive(Default)]
pub struct HttpMetrics {
    /// (route, status) -> count
    pub requests: Mutex<BTreeMap<(String, u16), u64>>,
    /// Time-to-first-token histogram: counts per bucket upper bound (seconds), sum, count.
    pub ttft: Mutex<Histogram>,
}

pub const TTFT_BUCKETS: [f64; 10] = [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

#[derive(Default, Clone)]
pub struct Histogram {
    pub buckets: [u64; TTFT_BUCKETS.len()],
    pub sum: f64,
    pub count: u64,
}

impl Histogram {
    pub fn observe(&mut self, v: f64) {
        for (b, &le) in self.buckets.iter_mut().zip(&TTFT_BUCKETS) {
            if v <= le {
                *b += 1;
            }
        }
        self.sum += v;
        self.count += 1;
    }
}

pub struct AppState {
    /// Set once the model has loaded; until then inference routes answer 503.
    service: OnceLock<Arc<dyn InferenceService>>,
    pub config: ServerConfig,
    pub metrics: HttpMetrics,
    shutting_down: AtomicBool,
}

impl AppState {
    pub fn new(config: ServerConfig) -> Arc<AppState> {
        Arc::new(AppState {
            service: OnceLock::new(),
            config,
            metrics: HttpMetrics::default(),
            shutting_down: AtomicBool::new(false),
        })
    }

    /// Makes the model available (once).
    pub fn set_service(&self, service: Arc<dyn InferenceService>) {
        let _ = self.service.set(service);
    }

    pub fn service(&self) -> Result<Arc<dyn InferenceService>, ApiError> {
        if self.shutting_down.load(Ordering::Acquire) {
            return Err(ApiError::ShuttingDown);
        }
        self.service.get().cloned().ok_or(ApiError::Loading)
    }

    pub fn loaded_service(&self) -> Option<&Arc<dyn InferenceService>> {
        self.service.get()
    }

    /// Stops accepting generation requests (running streams go on).
    pub fn begin_shutdown(&self) {
        self.shutting_down.store(true, Ordering::Release);
        if let Some(s) = self.service.get() {
            s.shutdown();
        }
    }

    pub fn is_shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }
}

/// A JSON body, with a too-large body reported as OpenAI's 413 and bad JSON as a 400.
pub fn parse_body<T: serde::de::DeserializeOwned>(
    body: Result<Bytes, BytesRejection>,
    limit: usize,
) -> Result<T, ApiError> {
    let bytes = body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge(limit)
        } else {
            ApiError::invalid(format!("cannot read the request body: {e}"))
        }
    })?;
    serde_json::from_slice(&bytes)
        .map_err(|e| ApiError::invalid(format!("invalid request body: {e}")))
}

/// Compares without an early exit, so the time taken does not reveal how much matched.
pub fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = (a.len() ^ b.len()) as u8 | ((a.len() ^ b.len()) >> 8) as u8;
    // Walk the expected key's length whatever the candidate's length is.
    for (i, &x) in b.iter().enumerate() {
        let y = a.get(i).copied().unwrap_or(0);
        diff |= x ^ y;
    }
    std::hint::black_box(diff) == 0 && a.len() == b.len()
}

async fn check_api_key(
    State(state): State<Arc<AppState>>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path();
    let open = path == "/health"
        || path == "/"
        || path == "/favicon.ico"
        || request.method() == Method::OPTIONS;
    if let (Some(key), false) = (&state.config.api_key, open) {
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                v.strip_prefix("Bearer ")
                    .or_else(|| v.strip_prefix("bearer "))
            })
            .map(str::trim)
            .or_else(|| {
                request
                    .headers()
                    .get("x-api-key")
                    .and_then(|v| v.to_str().ok())
            });
        if !given.is_some_and(|g| constant_time_eq(g.as_bytes(), key.as_bytes())) {
            return ApiError::Unauthorized.into_response();
        }
    }
    next.run(request).await
}

/// Marks a response whose stream logs its own line when it ends.
#[derive(Clone, Copy)]
pub struct LoggedByStream;

/// Extra words (token counts, speed) for a request's log line.
#[derive(Clone)]
pub struct LogNote(pub String);

async fn log_request(State(state): State<Arc<AppState>>, request: Request, next: Next) -> Response {
    let t0 = Instant::now();
    let method = request.method().clone();
    let path = request.uri().path().to_string();
    let response = next.run(request).await;
    let status = response.status().as_u16();
    let route = match path.as_str() {
        "/"
        | "/health"
        | "/metrics"
        | "/tokenize"
        | "/detokenize"
        | "/v1/models"
        | "/v1/chat/completions"
        | "/v1/completions" => path.clone(),
        "/models" | "/chat/completions" | "/completions" => format!("/v1{path}"),
        _ => "other".into(),
    };
    if let Ok(mut m) = state.metrics.requests.lock() {
        *m.entry((route, status)).or_insert(0) += 1;
    }
    if response.extensions().get::<LoggedByStream>().is_none()
        && path != "/health"
        && path != "/metrics"
    {
        let note = response
            .extensions()
            .get::<LogNote>()
            .map_or("", |n| n.0.as_str());
        tracing::info!(
            "{method} {path} {status} {:.1}ms {note}",
            t0.elapsed().as_secs_f64() * 1e3
        );
    }
    response
}

async fn not_found() -> ApiError {
    ApiError::NotFound("no such route".into())
}

pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/", get(routes::page::index))
        .route("/health", get(routes::info::health))
        .route("/metrics", get(routes::metrics::metrics))
        .route("/v1/models", get(routes::info::models))
        .route("/models", get(routes::info::models))
        .route("/tokenize", post(routes::info::tokenize))
        .route("/detokenize", post(routes::info::detokenize))
        .route("/v1/chat/completions", post(routes::chat::chat_completions))
        .route("/chat/completions", post(routes::chat::chat_completions))
        .route("/v1/completions", post(routes::completions::completions))
        .route("/completions", post(routes::completions::completions))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(state.config.max_body_bytes))
        .layer(middleware::from_fn_with_state(state.clone(), check_api_key))
        .layer(middleware::from_fn_with_state(state.clone(), log_request))
        .with_state(state)
}

#[cfg(test)]
mod tests {
    use super::constant_time_eq;

    #[test]
    fn key_comparison() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secreT", b"secret"));
        assert!(!constant_time_eq(b"secret-longer", b"secret"));
        assert!(!constant_time_eq(b"sec", b"secret"));
        assert!(!constant_time_eq(b"", b"secret"));
        // 256 bytes longer must not wrap the length check to "equal".
        assert!(!constant_time_eq(&[b'a'; 257], &[b'a'; 1]));
    }
}
