//! A follower's forwarding of the requests its leader serves (writes, leader-only verbs,
//! linearizable reads, long-polled receives): the caller's request goes to the leader with the
//! caller's own credential, and the leader's answer comes back as this node's.
//!
//! Forwarding runs on keep-alive HTTP/1.1 connections of our own, each one driven by the task of
//! the request it carries. A pooled client (reqwest) cost a forwarding follower more CPU per write
//! than the leader spent on the write itself (docs/measurements.md, 2026-12-06 18:34–): the URL
//! parsed again on every request, a pool checkout, a timer armed, and a connection task woken for
//! every request and every reply. Here the request's task writes the request and reads the reply
//! itself, so a forwarded write wakes no task besides its own.
//!
//! Delicate: a forwarded write must never be sent twice. A request is retried, once and on a new
//! connection, only when hyper hands it back unsent (a pooled connection the leader had closed);
//! any failure after the request may have left is the caller's 503, as before.

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{Connection, SendRequest};
use hyper_util::rt::TokioIo;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::time::Instant;

/// Idle connections kept for reuse, across leaders: enough for the clients a follower forwards for
/// at once under load (each request in flight holds its own).
const IDLE_MAX: usize = 64;
/// An idle connection older than this is closed rather than reused: before the leader's own idle
/// timeout (60 s by default) can close it while a request is on its way.
const IDLE_FOR_MAX: Duration = Duration::from_secs(30);

/// Headers a forwarded request keeps.
const FORWARDED_HEADERS: [HeaderName; 4] = [
    axum::http::header::AUTHORIZATION,
    HeaderName::from_static("idempotency-key"),
    axum::http::header::CONTENT_TYPE,
    HeaderName::from_static("last-event-id"),
];
/// Headers of the leader's reply a forwarded request passes back.
const REPLY_HEADERS: [HeaderName; 2] =
    [axum::http::header::CONTENT_TYPE, HeaderName::from_static("tidal-applied-seqno")];

/// The byte stream of a connection to the leader: TCP, or TLS over it.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}
type Stream = TokioIo<Box<dyn Io>>;
type Body = Full<Bytes>;

/// One keep-alive connection to a leader; its `io` half is polled only by the request it carries.
struct Conn {
    authority: String,
    sender: SendRequest<Body>,
    io: Pin<Box<Connection<Stream, Body>>>,
    idle_since: Instant,
}

/// A request to forward: what the caller sent, the headers kept, the body read whole.
pub struct Forwarded {
    /// The caller's method.
    pub method: Method,
    /// The caller's path and query.
    pub path_and_query: String,
    /// The caller's headers (only [`FORWARDED_HEADERS`] go on).
    pub headers: HeaderMap,
    /// The caller's body.
    pub body: Bytes,
}

/// The leader's answer.
#[derive(Debug)]
pub struct Reply {
    /// Its status.
    pub status: StatusCode,
    /// The [`REPLY_HEADERS`] it carried.
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Its body.
    pub body: Bytes,
}

/// Why a forwarded request got no answer from the leader.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// No TCP connection to the leader.
    #[error("connect: {0}")]
    Connect(std::io::Error),
    /// The leader's host is not a name TLS can verify.
    #[error("the leader's host {0:?} is not a TLS server name")]
    ServerName(String),
    /// The TLS handshake failed.
    #[error("TLS: {0}")]
    Tls(std::io::Error),
    /// The caller's request cannot be written as an HTTP request.
    #[error("the forwarded request: {0}")]
    Request(#[from] axum::http::Error),
    /// The connection failed, or the leader's answer is not HTTP.
    #[error("{0}")]
    Http(#[from] hyper::Error),
    /// The leader closed the connection before the request went out.
    #[error("the leader closed the connection")]
    Closed,
    /// The leader's answer broke off.
    #[error("the leader's answer was cut: {0}")]
    Cut(hyper::Error),
    /// No answer within the request's time.
    #[error("no answer within {} ms", .0.as_millis())]
    Timeout(Duration),
}

/// What one attempt on one connection came to.
enum Attempt {
    Reply(Reply),
    /// The request never left: it may go on another connection.
    NotSent(Box<hyper::Request<Body>>, ForwardError),
    /// The request may have reached the leader: never sent again.
    Failed(ForwardError),
}

/// Connections to the leader (any leader: the pool keeps each one with its address).
pub struct LeaderConns {
    tls: Option<tokio_rustls::TlsConnector>,
    idle: Mutex<Vec<Conn>>,
}

impl LeaderConns {
    /// Plain HTTP, or HTTPS verified by `tls` (the cluster CA) when the nodes serve TLS.
    pub fn new(tls: Option<rustls::ClientConfig>) -> LeaderConns {
        let tls = tls.map(|config| tokio_rustls::TlsConnector::from(Arc::new(config)));
        LeaderConns { tls, idle: Mutex::new(Vec::new()) }
    }

    /// `http` or `https`, for messages.
    pub fn scheme(&self) -> &'static str {
        if self.tls.is_some() {
            "https"
        } else {
            "http"
        }
    }

    /// Sends `request` to the leader at `authority` (`host:port`) and reads its whole answer,
    /// within `timeout` (connecting included).
    pub async fn send(
        &self,
        authority: &str,
        request: Forwarded,
        timeout: Duration,
    ) -> Result<Reply, ForwardError> {
        tokio::time::timeout(timeout, self.send_untimed(authority, request))
            .await
            .unwrap_or(Err(ForwardError::Timeout(timeout)))
    }

    async fn send_untimed(&self, authority: &str, request: Forwarded) -> Result<Reply, ForwardError> {
        let mut request = build(authority, request)?;
        let mut pooled = self.checkout(authority);
        loop {
            let reused = pooled.is_some();
            let conn = match pooled.take() {
                Some(conn) => conn,
                None => self.connect(authority).await?,
            };
            let (attempt, conn) = exchange(conn, request).await;
            match attempt {
                Attempt::Reply(reply) => {
                    if let Some(conn) = conn {
                        self.checkin(conn);
                    }
                    return Ok(reply);
                }
                Attempt::NotSent(back, _) if reused => request = *back,
                Attempt::NotSent(_, error) | Attempt::Failed(error) => return Err(error),
            }
        }
    }

    /// An idle connection to `authority`, if one is still fit for use; the unfit ones are closed.
    fn checkout(&self, authority: &str) -> Option<Conn> {
        let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        idle.retain(|conn| !conn.sender.is_closed() && conn.idle_since.elapsed() < IDLE_FOR_MAX);
        let at = idle.iter().rposition(|conn| conn.authority == authority)?;
        Some(idle.swap_remove(at))
    }

    fn checkin(&self, mut conn: Conn) {
        if conn.sender.is_closed() {
            return;
        }
        conn.idle_since = Instant::now();
        let mut idle = self.idle.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if idle.len() < IDLE_MAX {
            idle.push(conn);
        }
    }

    async fn connect(&self, authority: &str) -> Result<Conn, ForwardError> {
        let tcp = tokio::net::TcpStream::connect(authority).await.map_err(ForwardError::Connect)?;
        // Small requests and answers: never held back by Nagle's algorithm.
        tcp.set_nodelay(true).map_err(ForwardError::Connect)?;
        let stream: Box<dyn Io> = match &self.tls {
            None => Box::new(tcp),
            Some(connector) => {
                let host = authority.rsplit_once(':').map_or(authority, |(host, _)| host);
                let host = host.trim_start_matches('[').trim_end_matches(']');
                let name = rustls_pki_types::ServerName::try_from(host.to_string())
                    .map_err(|_| ForwardError::ServerName(host.to_string()))?;
                Box::new(connector.connect(name, tcp).await.map_err(ForwardError::Tls)?)
            }
        };
        let (sender, io) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        Ok(Conn { authority: authority.to_string(), sender, io: Box::pin(io), idle_since: Instant::now() })
    }
}

/// The request for the leader: the caller's method, path, kept headers and body, to `authority`.
fn build(authority: &str, request: Forwarded) -> Result<hyper::Request<Body>, ForwardError> {
    let mut builder = hyper::Request::builder()
        .method(request.method)
        .uri(request.path_and_query)
        .header(axum::http::header::HOST, authority);
    for name in FORWARDED_HEADERS {
        if let Some(value) = request.headers.get(&name) {
            builder = builder.header(name, value);
        }
    }
    Ok(builder.body(Full::new(request.body))?)
}

/// One attempt on `conn`: waits until it can take a request, sends it and reads the whole answer,
/// polling the connection in this task all along (nothing else polls it). The connection comes
/// back while it can carry another request.
async fn exchange(conn: Conn, request: hyper::Request<Body>) -> (Attempt, Option<Conn>) {
    let Conn { authority, mut sender, mut io, idle_since } = conn;
    // Until it is ready the request stays ours: a connection the leader closed gives it back.
    let ready = tokio::select! {
        biased;
        ready = sender.ready() => ready.map_err(ForwardError::Http),
        ended = io.as_mut() => Err(ended_why(ended)),
    };
    if let Err(error) = ready {
        return (Attempt::NotSent(Box::new(request), error), None);
    }
    let mut io = Some(io);
    let attempt = send_on(&mut sender, &mut io, &authority, request).await;
    let conn = io.map(|io| Conn { authority, sender, io, idle_since });
    (attempt, conn)
}

/// Sends `request` on a ready connection and reads its answer, polling `io` alongside.
async fn send_on(
    sender: &mut SendRequest<Body>,
    io: &mut Option<Pin<Box<Connection<Stream, Body>>>>,
    authority: &str,
    request: hyper::Request<Body>,
) -> Attempt {
    let work = async {
        let response = match sender.try_send_request(request).await {
            Ok(response) => response,
            Err(mut error) => {
                return match error.take_message() {
                    Some(back) => Attempt::NotSent(Box::new(back), error.into_error().into()),
                    None => Attempt::Failed(error.into_error().into()),
                };
            }
        };
        let (parts, body) = response.into_parts();
        match body.collect().await {
            Ok(body) => Attempt::Reply(Reply {
                status: parts.status,
                headers: REPLY_HEADERS
                    .iter()
                    .filter_map(|name| parts.headers.get(name).map(|value| (name.clone(), value.clone())))
                    .collect(),
                body: body.to_bytes(),
            }),
            Err(error) => Attempt::Failed(ForwardError::Cut(error)),
        }
    };
    tokio::pin!(work);
    loop {
        let Some(live) = io.as_mut() else { break (&mut work).await };
        let ended = tokio::select! {
            biased;
            attempt = &mut work => break attempt,
            ended = live.as_mut() => ended_why(ended),
        };
        // A connection that ended (the leader closed it while it sat in the pool) may still hold
        // our request unsent: dropping it hands the request back to `work`, or fails it if hyper
        // had begun to write it.
        tracing::debug!(%authority, "a connection to the leader ended during a request: {ended}");
        *io = None;
    }
}

fn ended_why(ended: hyper::Result<()>) -> ForwardError {
    ended.map_or_else(ForwardError::Http, |()| ForwardError::Closed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    const ANSWER: &[u8] = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntidal-applied-seqno: 7\r\n\
        x-other: dropped\r\ncontent-length: 11\r\n\r\n{\"seqno\":7}";

    /// Reads one HTTP/1.1 request from the socket: its head and body, or None at end of stream.
    async fn read_request(socket: &mut TcpStream) -> Option<(String, Vec<u8>)> {
        let mut bytes = Vec::new();
        let head_end = loop {
            if let Some(at) = bytes.windows(4).position(|w| w == b"\r\n\r\n") {
                break at + 4;
            }
            let mut chunk = [0u8; 4096];
            let read = socket.read(&mut chunk).await.ok()?;
            if read == 0 {
                return None;
            }
            bytes.extend_from_slice(&chunk[..read]);
        };
        let head = String::from_utf8_lossy(&bytes[..head_end]).to_lowercase();
        let length = head
            .lines()
            .find_map(|line| line.strip_prefix("content-length:"))
            .map_or(0, |value| value.trim().parse::<usize>().expect("a length"));
        while bytes.len() < head_end + length {
            let mut chunk = [0u8; 4096];
            let read = socket.read(&mut chunk).await.ok()?;
            if read == 0 {
                return None;
            }
            bytes.extend_from_slice(&chunk[..read]);
        }
        Some((head, bytes[head_end..head_end + length].to_vec()))
    }

    fn request(body: &'static str) -> Forwarded {
        let mut headers = HeaderMap::new();
        headers.insert("authorization", HeaderValue::from_static("Bearer t"));
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        headers.insert("cookie", HeaderValue::from_static("not forwarded"));
        Forwarded {
            method: Method::PUT,
            path_and_query: "/v1/items/1?x=1".into(),
            headers,
            body: Bytes::from_static(body.as_bytes()),
        }
    }

    async fn bind_leader() -> (TcpListener, String) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let authority = listener.local_addr().expect("address").to_string();
        (listener, authority)
    }

    /// A connection the listener took before now, if any (connects finish in the kernel before
    /// their accept, so once the client is done, every connection it made is waiting here).
    async fn accepted_now(listener: &TcpListener) -> bool {
        tokio::select! {
            biased;
            accepted = listener.accept() => accepted.is_ok(),
            () = std::future::ready(()) => false,
        }
    }

    const WAIT: Duration = Duration::from_secs(10);

    /// Two requests in a row share one connection; the request carries the caller's method, path,
    /// kept headers and body, and the answer only the headers a forwarded answer keeps.
    #[tokio::test]
    async fn requests_reuse_one_connection_and_carry_what_the_leader_needs() {
        let (listener, authority) = bind_leader().await;
        let leader = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            let mut seen = Vec::new();
            for _ in 0..2 {
                seen.push(read_request(&mut socket).await.expect("a request"));
                socket.write_all(ANSWER).await.expect("answer");
            }
            (listener, seen)
        });
        let conns = LeaderConns::new(None);
        let first = conns.send(&authority, request("{\"a\":1}"), WAIT).await.expect("first");
        let second = conns.send(&authority, request("{\"b\":2}"), WAIT).await.expect("second");
        let (listener, seen) = leader.await.expect("the leader");
        assert!(!accepted_now(&listener).await, "a second connection was opened");
        assert_eq!(first.status, StatusCode::OK);
        assert_eq!(&first.body[..], b"{\"seqno\":7}");
        let names: Vec<_> = second.headers.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names, ["content-type", "tidal-applied-seqno"]);
        let (head, body) = &seen[0];
        assert!(head.starts_with("put /v1/items/1?x=1 http/1.1\r\n"), "{head}");
        assert!(head.contains(&format!("host: {authority}\r\n")), "{head}");
        assert!(head.contains("authorization: bearer t\r\n") && !head.contains("cookie"), "{head}");
        assert_eq!((&body[..], &seen[1].1[..]), (&b"{\"a\":1}"[..], &b"{\"b\":2}"[..]));
    }

    /// The leader closed a pooled connection (its idle timeout, a restart) after the client had
    /// put it back in the pool: the next request finds out on it, comes back unsent, and goes once,
    /// on a new connection.
    #[tokio::test]
    async fn a_pooled_connection_the_leader_closed_hands_the_request_to_a_new_one() {
        let (listener, authority) = bind_leader().await;
        let (pooled_tx, pooled) = tokio::sync::oneshot::channel::<()>();
        let (closed_tx, closed) = tokio::sync::oneshot::channel();
        let leader = tokio::spawn(async move {
            let (mut first, _) = listener.accept().await.expect("accept");
            let (_, body) = read_request(&mut first).await.expect("the first request");
            first.write_all(ANSWER).await.expect("answer");
            pooled.await.expect("the client pooled the connection");
            first.shutdown().await.expect("close");
            drop(first);
            closed_tx.send(()).expect("the test waits");
            let (mut second, _) = listener.accept().await.expect("accept again");
            let (_, again) = read_request(&mut second).await.expect("the second request");
            second.write_all(ANSWER).await.expect("answer");
            (listener, [body, again])
        });
        let conns = LeaderConns::new(None);
        conns.send(&authority, request("first"), WAIT).await.expect("first");
        assert_eq!(conns.idle.lock().expect("pool").len(), 1, "the connection is pooled");
        pooled_tx.send(()).expect("the leader waits");
        closed.await.expect("the leader closed the connection");
        let reply =
            conns.send(&authority, request("second"), WAIT).await.expect("the request, on a new connection");
        assert_eq!(reply.status, StatusCode::OK);
        let (listener, bodies) = leader.await.expect("the leader");
        assert_eq!(bodies, [b"first".to_vec(), b"second".to_vec()]);
        assert!(!accepted_now(&listener).await, "the request went out more than once");
    }

    /// A request the leader may have read (it closed the connection without answering) is the
    /// caller's error and is never sent again, on a pooled connection as on a new one.
    #[tokio::test]
    async fn a_request_the_leader_may_have_read_is_never_sent_again() {
        let (listener, authority) = bind_leader().await;
        let leader = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            read_request(&mut socket).await.expect("the first request");
            socket.write_all(ANSWER).await.expect("answer");
            read_request(&mut socket).await.expect("the second request");
            drop(socket);
            let (mut socket, _) = listener.accept().await.expect("accept");
            read_request(&mut socket).await.expect("the third request");
            drop(socket);
            listener
        });
        let conns = LeaderConns::new(None);
        conns.send(&authority, request("first"), WAIT).await.expect("first");
        let pooled = conns.send(&authority, request("second"), WAIT).await.expect_err("no answer");
        let fresh = conns.send(&authority, request("third"), WAIT).await.expect_err("no answer");
        let listener = leader.await.expect("the leader");
        assert!(!accepted_now(&listener).await, "a request went out twice ({pooled}; {fresh})");
    }

    /// Garbage for an answer, a leader that never answers, and no leader at all: each an error
    /// that says so, within the timeout.
    #[tokio::test]
    async fn garbage_silence_and_no_listener_are_errors() {
        let (listener, authority) = bind_leader().await;
        let leader = tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.expect("accept");
            read_request(&mut socket).await.expect("a request");
            socket.write_all(b"SSH-2.0-not-http\r\n\r\n").await.expect("garbage");
            let (mut silent, _) = listener.accept().await.expect("accept");
            read_request(&mut silent).await.expect("a request");
            // Held open, unanswered, until the client gives up.
            let _ = read_request(&mut silent).await;
        });
        let conns = LeaderConns::new(None);
        let garbage = conns.send(&authority, request("x"), WAIT).await.expect_err("garbage");
        assert!(matches!(&garbage, ForwardError::Http(e) if e.is_parse()), "{garbage}");
        let silent =
            conns.send(&authority, request("y"), Duration::from_millis(200)).await.expect_err("silence");
        assert_eq!(silent.to_string(), "no answer within 200 ms");
        leader.await.expect("the leader");
        let (gone, authority) = bind_leader().await;
        drop(gone);
        let refused = conns.send(&authority, request("z"), WAIT).await.expect_err("nobody listens");
        assert!(matches!(refused, ForwardError::Connect(_)), "{refused}");
    }
}
