//! The load generator's connection: one keep-alive HTTP/1.1 connection per bench worker, driven in
//! the worker's own task.
//!
//! `tidal bench` shares the machine's cores with the nodes it measures. Through the pooled client
//! (reqwest) a write cost the bench 40–110 µs of CPU here, by load: a pool checkout, the URL parsed again, a
//! timer armed, and a connection task woken on every reply. The peers' load generators
//! (`redis-benchmark`, `pgbench`) are lean C programs, so CPU the bench burns is throughput the
//! nodes lose, unlike theirs (experiments/035). This connection has none of that: it sends pre-encoded
//! bodies on hyper's HTTP/1.1 connection, polls the connection in the same task as the request,
//! and reconnects after a failure.

use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE, HOST};
use hyper::{Method, Request};
use hyper_util::rt::TokioIo;
use std::pin::Pin;
use std::time::Duration;
use tokio::net::TcpStream;

type Conn = Connection<TokioIo<TcpStream>, Full<Bytes>>;
/// The request half and the connection half (polled along with each exchange).
type Open = (SendRequest<Full<Bytes>>, Pin<Box<Conn>>);

/// Where to connect and what every request carries.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    /// `host:port`, for the socket and the Host header.
    authority: String,
    host: HeaderValue,
    authorization: Option<HeaderValue>,
}

impl Target {
    /// `base` is `http://host:port` (the bench has no TLS client, as the node has no TLS listener).
    pub(crate) fn new(base: &str, token: Option<&str>) -> anyhow::Result<Target> {
        let authority = base
            .strip_prefix("http://")
            .with_context(|| format!("the bench drives http:// URLs, not {base}"))?
            .trim_end_matches('/');
        anyhow::ensure!(
            !authority.is_empty() && !authority.contains(|c: char| c == '/' || c.is_whitespace()),
            "the bench drives a node's base URL (http://host:port), not {base}"
        );
        let host = HeaderValue::from_str(authority).with_context(|| format!("host of {base}"))?;
        let authorization = token
            .map(|token| HeaderValue::from_str(&format!("Bearer {token}")))
            .transpose()
            .context("the token is not a valid header value")?;
        Ok(Target { authority: authority.to_string(), host, authorization })
    }
}

/// How long one exchange may take before the connection is given up (as the pooled client did):
/// a node that stops answering cannot hold a bench past its `--seconds` bound for long.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Whether `error` is a node's refusal (a non-2xx reply, [`tidal_client::Error::Api`]) rather than
/// a failure of the connection.
fn is_refusal(error: &anyhow::Error) -> bool {
    matches!(error.downcast_ref::<tidal_client::Error>(), Some(tidal_client::Error::Api { .. }))
}

/// One worker's connection; it connects on first use and again after any failure.
pub(crate) struct LeanConn {
    target: Target,
    open: Option<Open>,
    timeout: Duration,
    /// The write link this worker sends its writes on instead (`--links`).
    pub(crate) link: Option<tidal_client::Link>,
}

impl LeanConn {
    pub(crate) fn new(target: Target) -> LeanConn {
        LeanConn { target, open: None, timeout: REQUEST_TIMEOUT, link: None }
    }

    async fn connect(&self) -> anyhow::Result<Open> {
        let stream = TcpStream::connect(&self.target.authority)
            .await
            .with_context(|| format!("connect to {}", self.target.authority))?;
        stream.set_nodelay(true).context("TCP_NODELAY")?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .context("HTTP/1.1 handshake")?;
        Ok((sender, Box::pin(conn)))
    }

    /// Sends one request and reads the whole reply; `Ok` only for a 2xx. A refusal keeps the
    /// connection; after any other error (a timeout included) it is dropped and the next call opens
    /// a new one.
    pub(crate) async fn send(&mut self, method: Method, path: &str, body: Bytes) -> anyhow::Result<Bytes> {
        let result = match tokio::time::timeout(self.timeout, self.exchange(method, path, body)).await {
            Ok(result) => result,
            Err(_) => Err(anyhow::anyhow!("no reply within {:?}", self.timeout)),
        };
        if result.as_ref().is_err_and(|error| !is_refusal(error)) {
            self.open = None;
        }
        result
    }

    async fn exchange(&mut self, method: Method, path: &str, body: Bytes) -> anyhow::Result<Bytes> {
        // The request first: a path that is not a valid URI fails here, before any connection.
        let mut request = Request::builder()
            .method(method)
            .uri(path)
            .header(HOST, self.target.host.clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(authorization) = &self.target.authorization {
            request = request.header(AUTHORIZATION, authorization.clone());
        }
        let request = request.body(Full::new(body)).with_context(|| format!("request for {path}"))?;
        if self.open.is_none() {
            self.open = Some(self.connect().await?);
        }
        let (sender, conn) = self.open.as_mut().expect("connected above");
        let exchange = async {
            sender.ready().await.context("connection not ready")?;
            let reply = sender.send_request(request).await.context("send request")?;
            let status = reply.status();
            let bytes = reply.into_body().collect().await.context("read reply body")?.to_bytes();
            anyhow::Ok((status, bytes))
        };
        // The connection makes progress only while it is polled: poll it with the exchange, in this
        // task, so a reply wakes no other task.
        let (status, bytes) = tokio::select! {
            biased;
            exchange = exchange => exchange?,
            closed = conn.as_mut() => match closed {
                Ok(()) => anyhow::bail!("the node closed the connection"),
                Err(error) => return Err(anyhow::Error::new(error).context("connection failed")),
            },
        };
        if status.is_success() {
            return Ok(bytes);
        }
        Err(tidal_client::Error::from_reply(status.as_u16(), &bytes).into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_is_a_plain_http_base_url() {
        let target = Target::new("http://127.0.0.1:7070/", Some("secret")).expect("a base URL");
        assert_eq!(target.authority, "127.0.0.1:7070");
        assert_eq!(target.authorization, Some(HeaderValue::from_static("Bearer secret")));
        for bad in
            ["https://127.0.0.1:7070", "127.0.0.1:7070", "http://", "http://host:1/v1/items", "http://a b"]
        {
            assert!(Target::new(bad, None).is_err(), "{bad} accepted");
        }
        assert!(Target::new("http://127.0.0.1:1", Some("bad\ntoken")).is_err());
    }

    /// Against a real node in-process: a write is acknowledged, a refusal carries the contract's
    /// code and keeps the connection, and a dead port is an error that does not wedge the worker.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_refusals_and_reconnects_against_a_node() {
        let (url, node) = crate::bench::spawn_node(4).await.expect("spawn a node");
        let mut conn = LeanConn::new(Target::new(&url, None).expect("target"));
        for id in 1..=3u64 {
            let reply = conn
                .send(Method::PUT, &format!("/v1/items/{id}"), Bytes::from_static(br#"{"metadata":{"t":1}}"#))
                .await
                .expect("acknowledged");
            let reply: tidal_types::WriteReply = serde_json::from_slice(&reply).expect("a write reply");
            assert!(reply.seqno >= id, "seqno {} for write {id}", reply.seqno);
        }
        let refused = conn
            .send(Method::PUT, "/v1/items/4/embedding", Bytes::from_static(br#"{"vector":[1.0]}"#))
            .await
            .expect_err("wrong dimension");
        assert!(is_refusal(&refused), "a refusal, not a transport error: {refused:#}");
        let refused = refused.downcast_ref::<tidal_client::Error>().expect("a client error");
        assert!(
            matches!(refused, tidal_client::Error::Api { status: 400, code, .. } if code == "dimension_mismatch"),
            "{refused}"
        );
        assert!(conn.open.is_some(), "a refusal keeps the connection");
        let item =
            tidal_client::Client::new(url.clone(), None).get_item(3).await.expect("item 3 was written");
        assert_eq!(item.metadata, serde_json::json!({"t": 1}));
        node.stop().await.expect("the node stops");
        assert!(conn.send(Method::PUT, "/v1/items/5", Bytes::from_static(b"{}")).await.is_err());
        assert!(conn.open.is_none(), "a failed connection is dropped");
        assert!(conn.send(Method::PUT, "/v1/items/5", Bytes::from_static(b"{}")).await.is_err());
    }

    /// A peer that accepts the connection and never answers: the exchange fails at the timeout and
    /// the connection is dropped, so a silent node cannot hold a bench worker.
    #[tokio::test]
    async fn a_node_that_never_answers_times_out() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let silent = tokio::spawn(async move {
            let (socket, _) = listener.accept().await.expect("accept");
            // Hold the socket open, read nothing and answer nothing, until the test ends.
            std::future::pending::<()>().await;
            drop(socket);
        });
        let mut conn = LeanConn::new(Target::new(&format!("http://{address}"), None).expect("target"));
        conn.timeout = Duration::from_millis(200);
        let error =
            conn.send(Method::PUT, "/v1/items/1", Bytes::from_static(b"{}")).await.expect_err("no reply");
        assert!(error.to_string().contains("no reply within"), "{error:#}");
        assert!(!is_refusal(&error));
        assert!(conn.open.is_none(), "a timed-out connection is dropped");
        silent.abort();
    }
}
