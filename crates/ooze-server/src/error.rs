//! One error body for every endpoint, OpenAI's shape: `{"error": {"message", "type", "code"}}`.
//! The code is stable (clients and metrics match on it); the HTTP status comes from it in one place.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use ooze_engine::{EngineError, ParamError};

#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub code: &'static str,
    pub message: String,
}

impl ApiError {
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError {
            code: "invalid_request",
            message: message.into(),
        }
    }

    pub fn status(&self) -> StatusCode {
        match self.code {
            "invalid_request" | "invalid_json" | "context_length_exceeded" => {
                StatusCode::BAD_REQUEST
            }
            "not_found" => StatusCode::NOT_FOUND,
            "invalid_api_key" => StatusCode::UNAUTHORIZED,
            // Not 429: clients retry that, and a spent budget stays spent.
            "budget_exhausted" => StatusCode::FORBIDDEN,
            "request_timeout" => StatusCode::REQUEST_TIMEOUT,
            "timeout" => StatusCode::GATEWAY_TIMEOUT,
            "busy" => StatusCode::CONFLICT,
            "unavailable" => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }
}

impl ApiError {
    /// The response body: `{"error": {"message", "type", "code"}}`.
    pub fn body(&self) -> serde_json::Value {
        let kind = if self.status().is_client_error() {
            "invalid_request_error"
        } else {
            "server_error"
        };
        serde_json::json!({"error": {"message": self.message, "type": kind, "code": self.code}})
    }

    /// The whole HTTP/1.1 response, for a connection refused before hyper serves it; it asks the
    /// client to close.
    pub fn raw_response(&self) -> Vec<u8> {
        let body = self.body().to_string();
        let status = self.status();
        format!(
            "HTTP/1.1 {} {}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            status.as_u16(),
            status.canonical_reason().unwrap_or(""),
            body.len()
        )
        .into_bytes()
    }

    /// The error as a chunk of a stream that already started (its status line is long sent).
    pub fn stream_chunk(&self) -> serde_json::Value {
        serde_json::json!({"error": {"message": self.message, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status(), axum::Json(self.body())).into_response()
    }
}

impl From<ParamError> for ApiError {
    fn from(err: ParamError) -> ApiError {
        ApiError::invalid(err.to_string())
    }
}

impl From<EngineError> for ApiError {
    fn from(err: EngineError) -> ApiError {
        let code = match err {
            EngineError::EmptyInput
            | EngineError::TokenOutOfVocab(..)
            | EngineError::PromptLogProbStart { .. } => "invalid_request",
            EngineError::TooLong { .. } => "context_length_exceeded",
            EngineError::WeightUpdate(_) => "invalid_request",
            EngineError::Stopped => "unavailable",
        };
        ApiError {
            code,
            message: err.to_string(),
        }
    }
}

impl From<ooze_model::ModelError> for ApiError {
    fn from(err: ooze_model::ModelError) -> ApiError {
        ApiError::invalid(err.to_string())
    }
}
