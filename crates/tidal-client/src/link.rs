//! The write link (`GET /v1/link`, decisions/073): one upgraded connection that carries many
//! single-record writes at once, each answered as soon as it commits. Share one [`Link`] among the
//! tasks that write (it is cheap to clone); a write's reply or refusal is exactly its HTTP route's.
//!
//! [`Link::connect`] opens it on `http://`; [`Link::connect_with_ca`] on `https://`, verifying the
//! node's certificate against a CA, as [`crate::Client::with_ca`] does for the HTTP routes.

use crate::Error;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tidal_types::link::{self, LinkOp, LinkRequest};
use tidal_types::WriteReply;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};

/// The longest reply frame a client reads. Most replies are a few dozen bytes, but a publish's
/// lists every offset it assigned: up to about 21 bytes per event of a body of up to 16 MiB.
const REPLY_FRAME_MAX: usize = 64 * 1024 * 1024;

/// The longest answer head to the upgrade a client reads.
const UPGRADE_HEAD_MAX: usize = 16 * 1024;

type Waiters = Arc<Mutex<Waiting>>;

/// Writes sent and not yet answered; `closed` once the link has ended (and why).
#[derive(Default)]
struct Waiting {
    replies: HashMap<u64, oneshot::Sender<Result<Vec<u8>, Error>>>,
    closed: Option<String>,
}

/// A write link to one node. Cloning shares it.
#[derive(Clone)]
pub struct Link {
    frames: mpsc::UnboundedSender<Vec<u8>>,
    waiting: Waiters,
    next_id: Arc<AtomicU64>,
}

/// What a link runs on: a TCP connection, or TLS over one.
trait LinkStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}
impl<S: AsyncRead + AsyncWrite + Unpin + Send + 'static> LinkStream for S {}

impl Link {
    /// Opens a link to the node at `base` (`http://host:port`) with `token`.
    pub async fn connect(base: &str, token: Option<&str>) -> Result<Link, Error> {
        let authority = authority(base, "http://")?;
        let stream = connect_tcp(authority).await?;
        Link::start(stream, authority, token).await
    }

    /// Opens a link to the node at `base` (`https://host:port`) with `token`, over TLS: the node's
    /// certificate must chain to a CA in `ca_pem` (PEM) alone and name the host in `base`.
    pub async fn connect_with_ca(base: &str, token: Option<&str>, ca_pem: &[u8]) -> Result<Link, Error> {
        let authority = authority(base, "https://")?;
        let config = tls_config(ca_pem)?;
        let host = host_of(authority);
        let name = rustls_pki_types::ServerName::try_from(host.to_string())
            .map_err(|e| Error::Link(format!("{host} is not a name a certificate can carry: {e}")))?;
        let tcp = connect_tcp(authority).await?;
        let stream = tokio_rustls::TlsConnector::from(config)
            .connect(name, tcp)
            .await
            .map_err(|e| Error::Link(format!("TLS with {authority}: {e}")))?;
        Link::start(stream, authority, token).await
    }

    /// Upgrades `stream` to a link and starts its writing and reading halves.
    async fn start(stream: impl LinkStream, authority: &str, token: Option<&str>) -> Result<Link, Error> {
        let mut stream = BufReader::new(stream);
        upgrade(&mut stream, authority, token).await?;
        let (read, write) = tokio::io::split(stream);
        let waiting: Waiters = Arc::default();
        let (frames, queued) = mpsc::unbounded_channel();
        tokio::spawn(send_frames(write, queued, waiting.clone()));
        tokio::spawn(read_replies(read, waiting.clone()));
        Ok(Link { frames, waiting, next_id: Arc::new(AtomicU64::new(1)) })
    }

    /// `PUT /v1/items/{id}` with `body` (`{"metadata": ...}`).
    pub async fn put_item(
        &self,
        id: u64,
        body: &[u8],
        idempotency_key: Option<&str>,
    ) -> Result<WriteReply, Error> {
        self.write(LinkOp::PutItem, &id.to_string(), body, idempotency_key).await
    }

    /// `POST /v1/signals` with `body` (`{"signals": [...]}`).
    pub async fn post_signals(
        &self,
        body: &[u8],
        idempotency_key: Option<&str>,
    ) -> Result<WriteReply, Error> {
        self.write(LinkOp::PostSignals, "", body, idempotency_key).await
    }

    /// `POST /v1/streams/{stream}/events` with `body`.
    pub async fn publish(
        &self,
        stream: &str,
        body: &[u8],
        idempotency_key: Option<&str>,
    ) -> Result<tidal_types::Published, Error> {
        self.write(LinkOp::Publish, stream, body, idempotency_key).await
    }

    async fn write<T: serde::de::DeserializeOwned>(
        &self,
        op: LinkOp,
        argument: &str,
        body: &[u8],
        idempotency_key: Option<&str>,
    ) -> Result<T, Error> {
        let reply = self.send(op, argument, body, idempotency_key).await?;
        serde_json::from_slice(&reply).map_err(|e| Error::Link(format!("an undecodable reply: {e}")))
    }

    /// Sends one write and waits for its reply: the body of a 2xx, else the node's refusal.
    pub async fn send(
        &self,
        op: LinkOp,
        argument: &str,
        body: &[u8],
        idempotency_key: Option<&str>,
    ) -> Result<Vec<u8>, Error> {
        if argument.len() > u16::MAX as usize
            || idempotency_key.is_some_and(|key| key.len() > u16::MAX as usize)
        {
            return Err(Error::Link("an argument or key over 65,535 bytes".into()));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut frame = Vec::new();
        link::encode_request(&LinkRequest { id, op, idempotency_key, argument, body }, &mut frame);
        let (done, reply) = oneshot::channel();
        {
            let mut waiting = self.waiting.lock().expect("link lock is never held across a panic");
            if let Some(why) = &waiting.closed {
                return Err(Error::Link(why.clone()));
            }
            waiting.replies.insert(id, done);
        }
        if self.frames.send(frame).is_err() {
            return Err(Error::Link("the link is closed".into()));
        }
        reply.await.unwrap_or_else(|_| Err(Error::Link("the link closed before the reply".into())))
    }
}

/// Sends `GET /v1/link` with the upgrade and reads the answer's head; `Ok` on 101.
async fn upgrade(
    stream: &mut BufReader<impl LinkStream>,
    authority: &str,
    token: Option<&str>,
) -> Result<(), Error> {
    let authorization = token.map(|token| format!("Authorization: Bearer {token}\r\n")).unwrap_or_default();
    let head = format!(
        "GET {} HTTP/1.1\r\nHost: {authority}\r\nConnection: Upgrade\r\nUpgrade: {}\r\n{authorization}Content-Length: 0\r\n\r\n",
        link::LINK_PATH,
        link::LINK_PROTOCOL
    );
    let failed = |e: std::io::Error| Error::Link(format!("the upgrade failed: {e}"));
    stream.get_mut().write_all(head.as_bytes()).await.map_err(failed)?;
    let mut answer = Vec::new();
    while !answer.ends_with(b"\r\n\r\n") {
        if answer.len() > UPGRADE_HEAD_MAX
            || stream.read_until(b'\n', &mut answer).await.map_err(failed)? == 0
        {
            return Err(Error::Link("the node closed the connection during the upgrade".into()));
        }
    }
    let text = String::from_utf8_lossy(&answer);
    let status: u16 = text.split_whitespace().nth(1).and_then(|code| code.parse().ok()).unwrap_or(0);
    if status == 101 {
        return Ok(());
    }
    // A refusal: its body, by Content-Length, carries the contract's error.
    let length = text
        .lines()
        .find_map(|line| line.split_once(':').filter(|(name, _)| name.eq_ignore_ascii_case("content-length")))
        .and_then(|(_, value)| value.trim().parse::<usize>().ok())
        .unwrap_or(0)
        .min(UPGRADE_HEAD_MAX);
    let mut body = vec![0; length];
    stream.read_exact(&mut body).await.map_err(failed)?;
    Err(Error::from_reply(status, &body))
}

/// The `host:port` of `base`, which must start with `scheme` and name nothing after the port.
fn authority<'a>(base: &'a str, scheme: &str) -> Result<&'a str, Error> {
    base.strip_prefix(scheme)
        .map(|rest| rest.trim_end_matches('/'))
        .filter(|authority| !authority.is_empty() && !authority.contains('/'))
        .ok_or_else(|| {
            Error::Link(format!("the write link needs a base URL of the form {scheme}host:port, not {base}"))
        })
}

/// The host of `host:port` (`[::1]:7070` gives `::1`).
fn host_of(authority: &str) -> &str {
    let host = authority.rsplit_once(':').map_or(authority, |(host, _)| host);
    host.trim_start_matches('[').trim_end_matches(']')
}

async fn connect_tcp(authority: &str) -> Result<TcpStream, Error> {
    let stream =
        TcpStream::connect(authority).await.map_err(|e| Error::Link(format!("connect {authority}: {e}")))?;
    stream.set_nodelay(true).map_err(|e| Error::Link(format!("TCP_NODELAY: {e}")))?;
    Ok(stream)
}

/// A TLS client configuration trusting only the CAs in `ca_pem`, offering HTTP/1.1 (the upgrade
/// is an HTTP/1.1 request; the node's HTTP port agrees to nothing else).
fn tls_config(ca_pem: &[u8]) -> Result<Arc<rustls::ClientConfig>, Error> {
    use rustls_pki_types::pem::PemObject as _;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pki_types::CertificateDer::pem_slice_iter(ca_pem) {
        let cert = cert.map_err(|e| Error::Link(format!("the CA file: {e}")))?;
        roots.add(cert).map_err(|e| Error::Link(format!("the CA file: {e}")))?;
    }
    if roots.is_empty() {
        return Err(Error::Link("the CA file holds no certificate".into()));
    }
    let mut config = rustls::ClientConfig::builder_with_provider(ring_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Link(format!("TLS: {e}")))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// ring, as the node uses (it builds with the C compiler alone); rustls deprecates it for lacking
/// post-quantum key exchange, which the node's ports do not offer either.
#[allow(deprecated)]
fn ring_provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Sends queued frames, all that are ready in one write.
async fn send_frames<W: tokio::io::AsyncWrite + Unpin>(
    mut write: W,
    mut queued: mpsc::UnboundedReceiver<Vec<u8>>,
    waiting: Waiters,
) {
    let mut buffer = Vec::with_capacity(16 * 1024);
    while let Some(first) = queued.recv().await {
        buffer.clear();
        buffer.extend_from_slice(&first);
        while let Ok(more) = queued.try_recv() {
            buffer.extend_from_slice(&more);
        }
        if let Err(error) = write.write_all(&buffer).await {
            close(&waiting, format!("the link failed: {error}"));
            return;
        }
    }
    // Every clone of the Link is gone: tell the node, which answers nothing more and closes, and
    // the reading half ends with it.
    let _ = write.shutdown().await;
}

/// Reads replies and hands each to its waiter until the link ends, then fails every write still
/// waiting (its outcome unknown).
async fn read_replies<R: tokio::io::AsyncRead + Unpin>(read: R, waiting: Waiters) {
    let mut read = BufReader::with_capacity(64 * 1024, read);
    let why = loop {
        let mut prefix = [0u8; link::FRAME_PREFIX_BYTES];
        if let Err(error) = read.read_exact(&mut prefix).await {
            break format!("the link ended: {error}");
        }
        let length = match link::frame_length(prefix, REPLY_FRAME_MAX) {
            Ok(length) => length,
            Err(error) => break error.to_string(),
        };
        let mut frame = vec![0; length];
        if let Err(error) = read.read_exact(&mut frame).await {
            break format!("the link ended inside a reply: {error}");
        }
        let reply = match link::decode_reply(&frame) {
            Ok(reply) => reply,
            Err(error) => break error.to_string(),
        };
        if reply.id == link::NODE_REPLY_ID {
            break format!("the node closed the link: {}", Error::from_reply(reply.status, reply.body));
        }
        let result = match reply.status {
            200..=299 => Ok(reply.body.to_vec()),
            status => Err(Error::from_reply(status, reply.body)),
        };
        let waiter =
            waiting.lock().expect("link lock is never held across a panic").replies.remove(&reply.id);
        if let Some(waiter) = waiter {
            let _ = waiter.send(result);
        }
    };
    close(&waiting, why);
}

/// Ends the link: every waiting write fails with `why` and no new one is sent.
fn close(waiting: &Waiters, why: String) {
    let mut waiting = waiting.lock().expect("link lock is never held across a panic");
    for (_, waiter) in waiting.replies.drain() {
        let _ = waiter.send(Err(Error::Link(why.clone())));
    }
    waiting.closed.get_or_insert(why);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_base_url_gives_its_authority_and_host_or_a_clear_error() {
        assert_eq!(authority("http://127.0.0.1:7070/", "http://").unwrap(), "127.0.0.1:7070");
        assert_eq!(authority("https://node-1:7443", "https://").unwrap(), "node-1:7443");
        for (base, scheme) in [
            ("https://127.0.0.1:7070", "http://"),
            ("http://127.0.0.1:7070", "https://"),
            ("http://", "http://"),
            ("http://127.0.0.1:7070/v1", "http://"),
        ] {
            let error = authority(base, scheme).unwrap_err().to_string();
            assert!(error.contains(scheme) && error.contains(base), "{base} as {scheme}: {error}");
        }
        assert_eq!(host_of("127.0.0.1:7070"), "127.0.0.1");
        assert_eq!(host_of("[::1]:7070"), "::1");
        assert_eq!(host_of("node-1"), "node-1");
    }

    #[test]
    fn a_ca_file_without_a_certificate_is_refused() {
        for pem in [
            &b""[..],
            b"not a certificate",
            b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
        ] {
            let error = tls_config(pem).expect_err("a CA file without a certificate was taken").to_string();
            assert!(error.contains("CA file"), "{error}");
        }
    }
}
