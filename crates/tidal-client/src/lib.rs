//! HTTP client for the Tidal API (the contract in docs/API.md).
//!
//! A thin, typed layer over reqwest: every call maps a non-2xx reply to [`Error::Api`] carrying the
//! contract's error code, so callers branch on codes, not on message text. It holds no state beyond a
//! connection pool and is cheap to clone.
#![deny(missing_docs)]

mod inboxes;
mod link;
pub mod node_log;
pub use link::Link;
mod streams;

pub use streams::{segment, Delivery, Publish, Subscription};

use serde::de::DeserializeOwned;
use serde::Serialize;
use std::time::Duration;
use tidal_types::{
    ClusterStatus, DigestView, EmbeddingPut, ErrorBody, ItemPut, ItemView, RankedList, SignalIn,
    SignalsRequest, WriteReply,
};

/// What went wrong with a call.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The node answered with an error body.
    #[error("{status} {code}: {message}")]
    Api {
        /// HTTP status.
        status: u16,
        /// Contract error code.
        code: String,
        /// Message.
        message: String,
    },
    /// Transport failure or undecodable reply; the outcome of a write is unknown.
    #[error(transparent)]
    Transport(#[from] reqwest::Error),
    /// The write link failed or ended ([`Link`]); the outcome of a write it carried is unknown.
    #[error("write link: {0}")]
    Link(String),
}

impl Error {
    /// What a non-2xx reply with `body` says: the contract's code and message, or the code `http`
    /// and the body as text when it is not an error body (a proxy's page, say).
    pub fn from_reply(status: u16, body: &[u8]) -> Error {
        let (code, message) = match serde_json::from_slice::<ErrorBody>(body) {
            Ok(body) => (body.error.code, body.error.message),
            Err(_) => ("http".to_string(), String::from_utf8_lossy(body).into_owned()),
        };
        Error::Api { status, code, message }
    }

    /// The contract error code, if the node sent one.
    pub fn code(&self) -> Option<&str> {
        match self {
            Error::Api { code, .. } => Some(code),
            Error::Transport(_) | Error::Link(_) => None,
        }
    }
}

/// A client for one node.
#[derive(Clone, Debug)]
pub struct Client {
    base: String,
    token: Option<String>,
    http: reqwest::Client,
}

impl Client {
    /// A client for the node at `base` (e.g. `http://127.0.0.1:7070`); a request gives up after 30 s.
    pub fn new(base: impl Into<String>, token: Option<String>) -> Client {
        Client::with_timeout(base, token, Duration::from_secs(30))
    }

    /// A client whose every request gives up after `timeout` (a write that times out has an
    /// unknown outcome: retry it with the same Idempotency-Key).
    pub fn with_timeout(base: impl Into<String>, token: Option<String>, timeout: Duration) -> Client {
        let http = Client::builder(timeout)
            .build()
            .expect("a client with only a timeout and pool size always builds");
        Client { base: base.into().trim_end_matches('/').to_string(), token, http }
    }

    /// A client for a node that serves HTTPS with a certificate of the CA in `ca_pem` (PEM): the
    /// node's certificate is verified against that CA alone (and must name the host in `base`).
    pub fn with_ca(
        base: impl Into<String>,
        token: Option<String>,
        timeout: Duration,
        ca_pem: &[u8],
    ) -> Result<Client, Error> {
        let mut builder = Client::builder(timeout).tls_built_in_root_certs(false);
        for cert in reqwest::Certificate::from_pem_bundle(ca_pem)? {
            builder = builder.add_root_certificate(cert);
        }
        Ok(Client { base: base.into().trim_end_matches('/').to_string(), token, http: builder.build()? })
    }

    fn builder(timeout: Duration) -> reqwest::ClientBuilder {
        reqwest::Client::builder()
            .timeout(timeout)
            .pool_max_idle_per_host(256)
            // Below the node's idle timeout (60 s by default), so a pooled connection is not reused
            // just as the node closes it.
            .pool_idle_timeout(Duration::from_secs(30))
    }

    /// The bearer token, if any.
    pub fn token(&self) -> Option<&str> {
        self.token.as_deref()
    }

    /// The base URL.
    pub fn base(&self) -> &str {
        &self.base
    }

    fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        let builder = self.http.request(method, format!("{}{}", self.base, path));
        match &self.token {
            Some(token) => builder.bearer_auth(token),
            None => builder,
        }
    }

    async fn send<T: DeserializeOwned>(builder: reqwest::RequestBuilder) -> Result<T, Error> {
        Ok(Self::send_checked(builder).await?.json::<T>().await?)
    }

    /// The reply to `builder` when its status is 2xx (its body unread, for a caller to whom the
    /// status matters); the error it carries otherwise.
    async fn send_checked(builder: reqwest::RequestBuilder) -> Result<reqwest::Response, Error> {
        let reply = builder.send().await?;
        let status = reply.status();
        if status.is_success() {
            return Ok(reply);
        }
        let bytes = reply.bytes().await?;
        Err(Error::from_reply(status.as_u16(), &bytes))
    }

    fn with_key(builder: reqwest::RequestBuilder, idempotency_key: Option<&str>) -> reqwest::RequestBuilder {
        match idempotency_key {
            Some(key) => builder.header("Idempotency-Key", key),
            None => builder,
        }
    }

    /// `POST /v1/signals`: one batch.
    pub async fn post_signals(
        &self,
        signals: Vec<SignalIn>,
        idempotency_key: Option<&str>,
    ) -> Result<WriteReply, Error> {
        let builder = self.request(reqwest::Method::POST, "/v1/signals").json(&SignalsRequest { signals });
        Self::send(Self::with_key(builder, idempotency_key)).await
    }

    /// `PUT /v1/items/{id}`.
    pub async fn put_item(
        &self,
        id: u64,
        metadata: serde_json::Value,
        idempotency_key: Option<&str>,
    ) -> Result<WriteReply, Error> {
        let builder =
            self.request(reqwest::Method::PUT, &format!("/v1/items/{id}")).json(&ItemPut { metadata });
        Self::send(Self::with_key(builder, idempotency_key)).await
    }

    /// `GET /v1/items/{id}`.
    pub async fn get_item(&self, id: u64) -> Result<ItemView, Error> {
        Self::send(self.request(reqwest::Method::GET, &format!("/v1/items/{id}"))).await
    }

    /// `DELETE /v1/items/{id}`.
    pub async fn delete_item(&self, id: u64) -> Result<WriteReply, Error> {
        Self::send(self.request(reqwest::Method::DELETE, &format!("/v1/items/{id}"))).await
    }

    /// `PUT /v1/items/{id}/embedding`.
    pub async fn put_embedding(&self, id: u64, vector: Vec<f64>) -> Result<WriteReply, Error> {
        let builder = self
            .request(reqwest::Method::PUT, &format!("/v1/items/{id}/embedding"))
            .json(&EmbeddingPut { vector });
        Self::send(builder).await
    }

    /// `GET /v1/users/{user}/feed?limit=N`.
    pub async fn feed(&self, user: &str, limit: usize) -> Result<RankedList, Error> {
        let path = format!("/v1/users/{user}/feed?limit={limit}");
        Self::send(self.request(reqwest::Method::GET, &path)).await
    }

    /// `GET /v1/users/{user}/feed?limit=N&exact=B`: `exact` asks for the exact scan of every item
    /// instead of the approximate index.
    pub async fn feed_with(&self, user: &str, limit: usize, exact: bool) -> Result<RankedList, Error> {
        let path = format!("/v1/users/{user}/feed?limit={limit}&exact={exact}");
        Self::send(self.request(reqwest::Method::GET, &path)).await
    }

    /// `GET /v1/items/{id}/similar?limit=N&exact=B`.
    pub async fn similar(&self, id: u64, limit: usize, exact: bool) -> Result<RankedList, Error> {
        let path = format!("/v1/items/{id}/similar?limit={limit}&exact={exact}");
        Self::send(self.request(reqwest::Method::GET, &path)).await
    }

    /// `GET /v1/trending?limit=N`.
    pub async fn trending(&self, limit: usize) -> Result<RankedList, Error> {
        Self::send(self.request(reqwest::Method::GET, &format!("/v1/trending?limit={limit}"))).await
    }

    /// `GET /cluster/status`.
    pub async fn status(&self) -> Result<ClusterStatus, Error> {
        Self::send(self.request(reqwest::Method::GET, "/cluster/status")).await
    }

    /// `GET /cluster/digest`.
    pub async fn digest(&self) -> Result<DigestView, Error> {
        Self::send(self.request(reqwest::Method::GET, "/cluster/digest")).await
    }

    /// `GET path` whose body the caller reads itself (a download: `reply.chunk()`); the reply when
    /// its status is 2xx, the error it carries otherwise.
    pub async fn get_stream(&self, path: &str) -> Result<reqwest::Response, Error> {
        Self::send_checked(self.request(reqwest::Method::GET, path)).await
    }

    /// Any JSON request, for routes without a typed method.
    pub async fn json<B: Serialize, T: DeserializeOwned>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T, Error> {
        let builder = self.request(method, path);
        let builder = match body {
            Some(body) => builder.json(body),
            None => builder,
        };
        Self::send(builder).await
    }
}
