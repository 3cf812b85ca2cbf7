//! What keeps a web page from using a node through its visitor's browser.
//!
//! A browser sends some cross-site requests without asking first (a "simple" request: GET, HEAD,
//! or POST with a form or text body) and lets any page point it at `localhost`. A node without a
//! token file (the quick start, on loopback) would obey such a request. So:
//! - a request that changes state and carries a body must say `content-type: application/json`,
//!   which no page can send cross-site without the browser's preflight (which a node never
//!   approves);
//! - a state-changing request a browser marks as coming from another site (`Origin` not the
//!   node's own, `Sec-Fetch-Site` cross-site or same-site) is refused;
//! - a node in open mode answers only loopback `Host` names, so a page that rebinds its own DNS
//!   name to 127.0.0.1 gets nothing (the `Host` it sends is its own name).
//!
//! DELETE and PUT always need a preflight, but they follow the same rules for one simple story.

use axum::http::{header, HeaderMap, Method, StatusCode};

/// Why a request was refused.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// A state-changing request with a body that is not JSON (415).
    NotJson,
    /// A browser request from another site (403).
    CrossSite(String),
    /// Open mode and a `Host` that is not a loopback name (403).
    HostNotLoopback(String),
}

impl Refusal {
    /// The answer's status.
    pub fn status(&self) -> StatusCode {
        match self {
            Refusal::NotJson => StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Refusal::CrossSite(_) | Refusal::HostNotLoopback(_) => StatusCode::FORBIDDEN,
        }
    }

    /// The answer's message.
    pub fn message(&self) -> String {
        match self {
            Refusal::NotJson => "a request body must be JSON: send content-type: application/json".into(),
            Refusal::CrossSite(origin) => format!("refused a browser request from another site ({origin})"),
            Refusal::HostNotLoopback(host) => format!(
                "a node without a token file answers only loopback host names, not {host:?}; \
                 add a token file to serve other names"
            ),
        }
    }
}

fn changes_state(method: &Method) -> bool {
    !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS)
}

fn has_body(headers: &HeaderMap) -> bool {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .is_some_and(|value| value.trim() != "0");
    declared || headers.contains_key(header::TRANSFER_ENCODING)
}

fn is_json(headers: &HeaderMap) -> bool {
    let Some(value) = headers.get(header::CONTENT_TYPE).and_then(|value| value.to_str().ok()) else {
        return false;
    };
    let essence = value.split(';').next().unwrap_or("").trim();
    essence.eq_ignore_ascii_case("application/json")
}

/// The host part of a `Host` value or of an origin's authority (`[::1]:7070` → `::1`).
fn host_of(authority: &str) -> &str {
    let authority = authority.trim();
    if let Some(rest) = authority.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    authority.rsplit_once(':').map_or(authority, |(host, _)| host)
}

/// Whether `host` names this machine: `localhost` (and its subdomains), 127.0.0.0/8, `::1`.
pub fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    if host == "localhost" || host.ends_with(".localhost") {
        return true;
    }
    host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// The rules above for one request. `open` is a node without tokens and without `--insecure`.
pub fn check(method: &Method, headers: &HeaderMap, open: bool) -> Result<(), Refusal> {
    let host = headers.get(header::HOST).and_then(|value| value.to_str().ok()).unwrap_or("");
    if open && !is_loopback_host(host_of(host)) {
        return Err(Refusal::HostNotLoopback(host.to_string()));
    }
    if !changes_state(method) {
        return Ok(());
    }
    if let Some(site) = headers.get("sec-fetch-site").and_then(|value| value.to_str().ok()) {
        if site.eq_ignore_ascii_case("cross-site") || site.eq_ignore_ascii_case("same-site") {
            return Err(Refusal::CrossSite(format!("Sec-Fetch-Site: {site}")));
        }
    }
    if let Some(origin) = headers.get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("");
        // "null" is what a sandboxed frame or a file:// page sends: never this node.
        let authority = origin.split_once("://").map_or("", |(_, rest)| rest);
        if authority.is_empty() || !authority.eq_ignore_ascii_case(host.trim()) {
            return Err(Refusal::CrossSite(format!("Origin: {origin}")));
        }
    }
    if has_body(headers) && !is_json(headers) {
        return Err(Refusal::NotJson);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_static(value));
        }
        map
    }

    #[test]
    fn a_browser_simple_post_is_refused() {
        let form = headers(&[
            ("host", "127.0.0.1:7070"),
            ("content-type", "text/plain;charset=UTF-8"),
            ("content-length", "12"),
        ]);
        assert_eq!(check(&Method::POST, &form, true), Err(Refusal::NotJson));
        let cross = headers(&[
            ("host", "127.0.0.1:7070"),
            ("origin", "http://evil.example"),
            ("content-type", "application/json"),
            ("content-length", "2"),
        ]);
        assert!(matches!(check(&Method::POST, &cross, false), Err(Refusal::CrossSite(_))));
        let bodyless = headers(&[("host", "localhost:7070"), ("sec-fetch-site", "cross-site")]);
        assert!(matches!(check(&Method::POST, &bodyless, true), Err(Refusal::CrossSite(_))));
        let null_origin = headers(&[("host", "localhost:7070"), ("origin", "null")]);
        assert!(matches!(check(&Method::DELETE, &null_origin, true), Err(Refusal::CrossSite(_))));
    }

    #[test]
    fn a_rebound_name_gets_nothing_in_open_mode() {
        let rebound = headers(&[("host", "attacker.example:7070")]);
        assert!(matches!(check(&Method::GET, &rebound, true), Err(Refusal::HostNotLoopback(_))));
        assert_eq!(check(&Method::GET, &rebound, false), Ok(()), "with tokens a name is fine");
    }

    #[test]
    fn clients_and_same_origin_pages_pass() {
        let client = headers(&[
            ("host", "127.0.0.1:7070"),
            ("content-type", "application/json; charset=utf-8"),
            ("content-length", "20"),
        ]);
        assert_eq!(check(&Method::PUT, &client, true), Ok(()));
        let verb = headers(&[("host", "[::1]:7070")]);
        assert_eq!(check(&Method::POST, &verb, true), Ok(()), "a bodyless verb needs no content type");
        let same = headers(&[
            ("host", "localhost:7070"),
            ("origin", "http://localhost:7070"),
            ("sec-fetch-site", "same-origin"),
            ("content-type", "application/json"),
            ("content-length", "2"),
        ]);
        assert_eq!(check(&Method::POST, &same, true), Ok(()));
        assert!(
            is_loopback_host("127.3.2.1")
                && is_loopback_host("app.localhost")
                && !is_loopback_host("10.0.0.1")
        );
    }
}
