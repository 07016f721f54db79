//! The server's one error type, and the one place it becomes an HTTP status and an
//! OpenAI-style error body: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, thiserror::Error, Clone, PartialEq)]
pub enum ApiError {
    /// A field has the wrong type or value; `param` names it when known.
    #[error("{message}")]
    InvalidRequest {
        message: String,
        param: Option<String>,
    },
    #[error("{0}")]
    ContextLengthExceeded(String),
    #[error("invalid or missing API key")]
    Unauthorized,
    #[error("{0}")]
    NotFound(String),
    #[error("request body is larger than {0} bytes")]
    PayloadTooLarge(usize),
    /// Every slot is busy and the queue is full; retry after this many seconds.
    #[error("the server is busy ({0}); retry later")]
    Overloaded(String, u64),
    #[error("the model is still loading")]
    Loading,
    #[error("the server is shutting down")]
    ShuttingDown,
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::InvalidRequest {
            message: message.into(),
            param: None,
        }
    }

    pub fn invalid_param(param: &str, message: impl Into<String>) -> ApiError {
        ApiError::InvalidRequest {
            message: message.into(),
            param: Some(param.to_string()),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest { .. } | ApiError::ContextLengthExceeded(_) => {
                StatusCode::BAD_REQUEST
            }
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::PayloadTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::Overloaded(..) | ApiError::Loading | ApiError::ShuttingDown => {
                StatusCode::SERVICE_UNAVAILABLE
            }
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// OpenAI's `error.type`.
    pub fn kind(&self) -> &'static str {
        match self {
            ApiError::InvalidRequest { .. }
            | ApiError::ContextLengthExceeded(_)
            | ApiError::PayloadTooLarge(_) => "invalid_request_error",
            ApiError::Unauthorized => "authentication_error",
            ApiError::NotFound(_) => "not_found_error",
            ApiError::Overloaded(..) | ApiError::Loading | ApiError::ShuttingDown => {
                "unavailable_error"
            }
            ApiError::Internal(_) => "server_error",
        }
    }

    /// OpenAI's `error.code`.
    pub fn code(&self) -> Option<&'static str> {
        match self {
            ApiError::ContextLengthExceeded(_) => Some("context_length_exceeded"),
            ApiError::Unauthorized => Some("invalid_api_key"),
            ApiError::Overloaded(..) => Some("server_overloaded"),
            _ => None,
        }
    }

    /// The error object as OpenAI sends it (also used inside an SSE stream).
    pub fn body(&self) -> serde_json::Value {
        let param = match self {
            ApiError::InvalidRequest { param, .. } => param.clone(),
            _ => None,
        };
        json!({ "error": { "message": self.to_string(), "type": self.kind(), "param": param, "code": self.code() } })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut response = (self.status(), axum::Json(self.body())).into_response();
        let headers = response.headers_mut();
        match &self {
            ApiError::Overloaded(_, secs) => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(*secs));
            }
            ApiError::Loading | ApiError::ShuttingDown => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from(5u64));
            }
            ApiError::Unauthorized => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            _ => {}
        }
        response
    }
}

impl From<engine::scheduler::SchedulerError> for ApiError {
    fn from(e: engine::scheduler::SchedulerError) -> ApiError {
        use engine::scheduler::SchedulerError as S;
        match e {
            S::QueueFull(_) => ApiError::Overloaded(e.to_string(), 1),
            S::ShuttingDown => ApiError::ShuttingDown,
            S::EmptyPrompt => ApiError::invalid_param("prompt", e.to_string()),
            S::ContextExceeded { .. } => ApiError::ContextLengthExceeded(e.to_string()),
            S::Config(_) => ApiError::Internal(e.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_error_maps_to_its_status_and_openai_body() {
        let cases = [
            (
                ApiError::invalid_param("temperature", "too hot"),
                400,
                "invalid_request_error",
            ),
            (
                ApiError::ContextLengthExceeded("long".into()),
                400,
                "invalid_request_error",
            ),
            (ApiError::Unauthorized, 401, "authentication_error"),
            (ApiError::NotFound("x".into()), 404, "not_found_error"),
            (ApiError::PayloadTooLarge(10), 413, "invalid_request_error"),
            (
                ApiError::Overloaded("q".into(), 2),
                503,
                "unavailable_error",
            ),
            (ApiError::Loading, 503, "unavailable_error"),
            (ApiError::Internal("bug".into()), 500, "server_error"),
        ];
        for (e, status, kind) in cases {
            assert_eq!(e.status().as_u16(), status, "{e:?}");
            assert_eq!(e.body()["error"]["type"], kind);
            assert_eq!(e.body()["error"]["message"], e.to_string());
        }
        assert_eq!(
            ApiError::invalid_param("temperature", "x").body()["error"]["param"],
            "temperature"
        );
        let r = ApiError::Overloaded("q".into(), 2).into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
    }

    #[test]
    fn scheduler_errors_map_to_the_right_status() {
        use engine::scheduler::SchedulerError as S;
        assert_eq!(ApiError::from(S::QueueFull(3)).status().as_u16(), 503);
        assert_eq!(ApiError::from(S::ShuttingDown).status().as_u16(), 503);
        let ctx = ApiError::from(S::ContextExceeded {
            prompt: 10,
            max_tokens: 5,
            n_ctx: 12,
        });
        assert_eq!(ctx.status().as_u16(), 400);
        assert_eq!(ctx.body()["error"]["code"], "context_length_exceeded");
    }
}
