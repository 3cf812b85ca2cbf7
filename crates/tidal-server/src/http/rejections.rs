//! Every 4xx carries the contract's JSON error body (docs/API.md, "Error bodies").
//!
//! The handlers answer their own errors as [`ApiError`]s, but some 4xx are made before a handler
//! runs, by axum: a 405 for a method the path does not answer, a 400 for a path segment that does
//! not percent-decode to UTF-8. Those come back as plain text or with no body at all, and a client
//! that parses every error as JSON fails on them. [`as_json`], the last step of the router's one
//! layer (`admit` in http.rs), gives each such answer the JSON body with the code its status implies, keeping its status, its
//! other headers (`Allow` on a 405) and its text as the message.

use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use tidal_types::ErrorCode;

use crate::error::ApiError;

/// The most of a plain-text rejection kept as the message: axum's are one line.
const MESSAGE_BYTES_MAX: usize = 1024;

/// Rewrites a 4xx that is not JSON into the contract's JSON error body; everything else passes.
pub async fn as_json(response: Response) -> Response {
    if !response.status().is_client_error() || is_json(response.headers()) {
        return response;
    }
    let (parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MESSAGE_BYTES_MAX)
        .await
        .ok()
        .and_then(|bytes| String::from_utf8(bytes.to_vec()).ok())
        .map(|text| text.trim().to_string())
        .filter(|text| !text.is_empty());
    let (code, default) = code_of(parts.status);
    let mut json =
        ApiError::new(parts.status, code, text.unwrap_or_else(|| default.to_string())).into_response();
    for (name, value) in &parts.headers {
        if name != header::CONTENT_TYPE && name != header::CONTENT_LENGTH {
            json.headers_mut().append(name.clone(), value.clone());
        }
    }
    json
}

/// Whether a response already carries a JSON body.
fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.starts_with("application/json"))
}

/// The contract code, and a message for an answer without text, of a 4xx made outside a handler.
fn code_of(status: StatusCode) -> (ErrorCode, &'static str) {
    match status {
        StatusCode::NOT_FOUND => (ErrorCode::NotFound, "no such route"),
        StatusCode::METHOD_NOT_ALLOWED => {
            (ErrorCode::MethodNotAllowed, "this path does not answer this method")
        }
        StatusCode::PAYLOAD_TOO_LARGE => (ErrorCode::PayloadTooLarge, "request body too large"),
        StatusCode::UNAUTHORIZED => (ErrorCode::Unauthorized, "missing or unknown bearer token"),
        StatusCode::FORBIDDEN => (ErrorCode::Forbidden, "token lacks the scope for this route"),
        _ => (ErrorCode::InvalidArgument, "invalid request"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use axum::extract::Request;
    use axum::middleware::Next;
    use axum::routing::get;
    use axum::Router;
    use tower_service::Service as _;

    /// The router's rewriting as a layer of its own, for routes made here.
    async fn json_errors(request: Request, next: Next) -> Response {
        as_json(next.run(request).await).await
    }

    async fn call(
        router: &mut Router,
        method: &str,
        uri: &str,
    ) -> (StatusCode, HeaderMap, serde_json::Value) {
        let request = Request::builder().method(method).uri(uri).body(axum::body::Body::empty()).unwrap();
        let response = router.call(request).await.unwrap();
        let (parts, body) = response.into_parts();
        let bytes = axum::body::to_bytes(body, usize::MAX).await.unwrap();
        let json = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
        (parts.status, parts.headers, json)
    }

    #[tokio::test]
    async fn plain_rejections_become_json_and_the_rest_passes() {
        let mut router = Router::new()
            .route("/x/{name}", get(|axum::extract::Path(name): axum::extract::Path<String>| async { name }))
            .route("/teapot", get(|| async { (StatusCode::IM_A_TEAPOT, "short and stout") }))
            .route("/ok", get(|| async { "fine" }))
            .route("/api", get(|| async { ApiError::invalid("as the handler said") }))
            .layer(axum::middleware::from_fn(json_errors));
        let (status, headers, json) = call(&mut router, "POST", "/x/a").await;
        assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(json["error"]["code"], "method_not_allowed");
        assert!(headers.contains_key(header::ALLOW), "the Allow header is kept");
        assert!(is_json(&headers));
        let (status, _, json) = call(&mut router, "GET", "/x/%FF").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(json["error"]["code"], "invalid_argument");
        assert!(json["error"]["message"].as_str().unwrap().contains("UTF-8"), "{json}");
        let (status, _, json) = call(&mut router, "GET", "/teapot").await;
        assert_eq!((status, &json["error"]["message"]), (StatusCode::IM_A_TEAPOT, &"short and stout".into()));
        let (status, _, json) = call(&mut router, "GET", "/nowhere").await;
        assert_eq!((status, json["error"]["code"].as_str()), (StatusCode::NOT_FOUND, Some("not_found")));
        let (_, _, json) = call(&mut router, "GET", "/api").await;
        assert_eq!(json["error"]["message"], "as the handler said");
        let (status, headers, _) = call(&mut router, "GET", "/ok").await;
        assert_eq!(status, StatusCode::OK);
        assert!(!is_json(&headers), "a success passes untouched");
    }
}
