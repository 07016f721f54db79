//! Server-sent events helpers shared by the streaming routes.

use std::time::{SystemTime, UNIX_EPOCH};

use axum::response::sse::Event;
use serde::Serialize;

use crate::error::ApiError;

pub fn json_event<T: Serialize>(value: &T) -> Event {
    Event::default()
        .data(serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")))
}

pub fn error_event(e: &ApiError) -> Event {
    Event::default().data(e.body().to_string())
}

pub fn done_event() -> Event {
    Event::default().data("[DONE]")
}

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// A unique-enough response id: time in nanoseconds plus a process-wide counter.
pub fn response_id(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    format!(
        "{prefix}-{nanos:x}{:04x}",
        COUNTER.fetch_add(1, Ordering::Relaxed) & 0xffff
    )
}
