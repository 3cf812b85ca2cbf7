//! `GET /ui`: the live cluster page, one self-contained HTML file (inline CSS and JavaScript, no
//! external assets) built into the binary.
//!
//! The page holds no data, so it is served without a token; it reads `GET /cluster/status` and
//! `GET /cluster/history` and calls the operator verbs with the admin token its user types in (kept
//! in the tab's sessionStorage), from the node's own origin, so the browser guard ([`super::guard`])
//! lets its requests through. Its Content-Security-Policy lets it talk to its own origin only and
//! keeps it out of frames (its buttons must not be clickable through another site's page).

use axum::http::header;
use axum::response::IntoResponse;

/// The page.
const PAGE: &str = include_str!("ui.html");

/// Only the page's own inline script and style, requests to its own origin, no framing.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'unsafe-inline'; \
     style-src 'unsafe-inline'; img-src data:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

pub(super) async fn page() -> impl IntoResponse {
    (
        [
            (header::CONTENT_TYPE, "text/html; charset=utf-8"),
            (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
            (header::X_FRAME_OPTIONS, "DENY"),
            (header::CACHE_CONTROL, "no-store"),
            (header::REFERRER_POLICY, "no-referrer"),
        ],
        PAGE,
    )
}
