//! The write link (`GET /v1/link`, decisions/073): one upgraded connection that carries many
//! single-record writes at once, each answered as soon as it commits. Share one [`Link`] among the
//! tasks that write (it is cheap to clone); a write's reply or refusal is exactly its HTTP route's.
//!
//! The link speaks plain `http://` only; against a node with TLS use the HTTP routes.

use crate::Error;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tidal_types::link::{self, LinkOp, LinkRequest};
use tidal_types::WriteReply;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
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

impl Link {
    /// Opens a link to the node at `base` (`http://host:port`) with `token`.
    pub async fn connect(base: &str, token: Option<&str>) -> Result<Link, Error> {
        let authority = base
            .strip_prefix("http://")
            .map(|rest| rest.trim_end_matches('/'))
            .filter(|authority| !authority.is_empty() && !authority.contains('/'))
            .ok_or_else(|| {
                Error::Link(format!("the write link needs an http://host:port base URL, not {base}"))
            })?;
        let stream = TcpStream::connect(authority)
            .await
            .map_err(|e| Error::Link(format!("connect {authority}: {e}")))?;
        stream.set_nodelay(true).map_err(|e| Error::Link(format!("TCP_NODELAY: {e}")))?;
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
    stream: &mut BufReader<TcpStream>,
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
