//! The API error: a status, a contract code and a message, rendered as
//! `{"error": {"code", "message"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use tidal_types::{ErrorBody, ErrorCode, ErrorDetail};

/// An error answered to an HTTP client.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Contract code.
    pub code: ErrorCode,
    /// Human-readable message.
    pub message: String,
}

impl ApiError {
    /// A new error.
    pub fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError { status, code, message: message.into() }
    }

    /// 400 with a code.
    pub fn bad_request(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, code, message)
    }

    /// 400 invalid_argument.
    pub fn invalid(message: impl Into<String>) -> ApiError {
        ApiError::bad_request(ErrorCode::InvalidArgument, message)
    }

    /// 413 payload_too_large: nothing is written.
    pub fn too_large(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, ErrorCode::PayloadTooLarge, message)
    }

    /// 404 not_found.
    pub fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, ErrorCode::NotFound, message)
    }

    /// 500 internal: the outcome of a write is unknown.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal, message)
    }

    /// 503 with a retryable code.
    pub fn unavailable(code: ErrorCode, message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, code, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body =
            ErrorBody { error: ErrorDetail { code: self.code.as_str().to_string(), message: self.message } };
        (self.status, axum::Json(body)).into_response()
    }
}

impl From<tidal_core::Error> for ApiError {
    fn from(error: tidal_core::Error) -> ApiError {
        tracing::error!("engine error: {error:#}");
        ApiError::internal(format!("engine error: {error}"))
    }
}

impl From<tidal_cluster::Error> for ApiError {
    /// A request invalid as asked is a 400; anything else the replication side could not do now
    /// (not the leader, a change already running, a learner still catching up) is a 503 to retry.
    fn from(error: tidal_cluster::Error) -> ApiError {
        if error.is_invalid_request() {
            ApiError::invalid(error.to_string())
        } else {
            ApiError::unavailable(ErrorCode::NotReady, error.to_string())
        }
    }
}
