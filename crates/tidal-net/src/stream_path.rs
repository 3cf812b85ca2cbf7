//! A request/reply exchange carried on one long-lived bidirectional gRPC stream (decisions/026).
//!
//! The leader sends every ship to a follower, and every commit notice, one at a time. As unary calls
//! each paid for an HTTP/2 stream: headers encoded and decoded, a stream opened and closed, a task on
//! the server, trailers. On a stream each message is one DATA frame each way. The server answers one
//! request before it reads the next, so replies come back in request order.
//!
//! Delicate: an exchange can be abandoned between its request and its reply (its caller's future
//! dropped, or its deadline passed). The stream is therefore taken out of its slot for the exchange
//! and put back only once the reply is read: an abandoned exchange drops the stream with it, and the
//! next one opens another, so no request ever reads a reply that is not its own.

use crate::client::NetError;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// An open stream: requests go in, one reply per request comes back, in order.
struct Link<Req, Rep> {
    requests: mpsc::Sender<Req>,
    replies: tonic::Streaming<Rep>,
}

/// How one kind of request reaches one peer: on its stream, or, once the peer answered that it has
/// no such RPC (an older version) or when streams are switched off, as unary calls.
pub(crate) struct StreamPath<Req, Rep> {
    link: tokio::sync::Mutex<Option<Link<Req, Rep>>>,
    unary: AtomicBool,
}

/// What an exchange on the stream came to.
pub(crate) enum Exchanged<Rep> {
    /// The peer's reply.
    Reply(Rep),
    /// The peer has no stream RPC: make a unary call instead.
    Unary,
}

impl<Req: Send + 'static, Rep> StreamPath<Req, Rep> {
    /// A path that starts on a stream (unary calls once the peer turns out to have no stream RPC).
    pub(crate) fn new() -> StreamPath<Req, Rep> {
        StreamPath { link: tokio::sync::Mutex::new(None), unary: AtomicBool::new(false) }
    }

    /// Whether requests go as unary calls (no stream).
    pub(crate) fn unary(&self) -> bool {
        self.unary.load(Ordering::Relaxed)
    }

    /// Sends `request` and reads its reply within `timeout`, on the open stream or on one `open`
    /// starts now (handed the stream of requests, the first already in it).
    pub(crate) async fn exchange<Open, Opening>(
        &self,
        request: Req,
        timeout: Duration,
        open: Open,
    ) -> Result<Exchanged<Rep>, NetError>
    where
        Open: FnOnce(ReceiverStream<Req>) -> Opening,
        Opening: Future<Output = Result<tonic::Response<tonic::Streaming<Rep>>, tonic::Status>>,
    {
        if self.unary.load(Ordering::Relaxed) {
            return Ok(Exchanged::Unary);
        }
        let mut slot = self.link.lock().await;
        let link = slot.take();
        match tokio::time::timeout(timeout, Self::on_stream(link, request, open)).await {
            Ok(Ok((link, reply))) => {
                *slot = Some(link);
                Ok(Exchanged::Reply(reply))
            }
            Ok(Err(NetError::Status(status))) if status.code() == tonic::Code::Unimplemented => {
                tracing::info!("a peer has no stream for these calls (an older version): one call each");
                self.unary.store(true, Ordering::Relaxed);
                Ok(Exchanged::Unary)
            }
            Ok(Err(error)) => Err(error),
            Err(_) => Err(NetError::Status(tonic::Status::deadline_exceeded(format!(
                "no reply on the stream within {timeout:?}"
            )))),
        }
    }

    async fn on_stream<Open, Opening>(
        link: Option<Link<Req, Rep>>,
        request: Req,
        open: Open,
    ) -> Result<(Link<Req, Rep>, Rep), NetError>
    where
        Open: FnOnce(ReceiverStream<Req>) -> Opening,
        Opening: Future<Output = Result<tonic::Response<tonic::Streaming<Rep>>, tonic::Status>>,
    {
        let mut link = match link {
            Some(link) => {
                if link.requests.send(request).await.is_err() {
                    return Err(tonic::Status::unavailable("the stream to the peer closed").into());
                }
                link
            }
            None => {
                // The first request waits in the channel, so it leaves with the call's headers.
                let (requests, outgoing) = mpsc::channel(1);
                requests.try_send(request).map_err(|_| {
                    tonic::Status::internal("a new stream's channel refused its first request")
                })?;
                let replies = open(ReceiverStream::new(outgoing)).await?.into_inner();
                Link { requests, replies }
            }
        };
        match link.replies.message().await? {
            Some(reply) => Ok((link, reply)),
            None => Err(tonic::Status::unavailable("the peer ended the stream").into()),
        }
    }
}

/// Requests sent on a long-lived stream whose replies nobody waits for (quiet commit notices,
/// decisions/027): each costs the sender one DATA frame and the receiver no answer to write, and the
/// sender never waits. Best effort: a request the stream cannot take at once (its queue is full) is
/// dropped, and one that goes into a stream that then fails is lost; what it carried must reach
/// the peer some other way too (the commit frontier rides every ship).
pub(crate) struct OneWayPath<Req> {
    link: std::sync::Mutex<Option<mpsc::Sender<Req>>>,
    /// The peer has no stream RPC for these (an older version): nothing is sent one way any more.
    unavailable: std::sync::Arc<AtomicBool>,
}

/// Requests a one-way stream holds for its peer before it drops new ones.
const ONE_WAY_QUEUE: usize = 64;

/// Why a one-way request ([`crate::Peer::commit_quiet`]) was not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NotSent {
    /// The peer has no stream for them (an older version): send them some
    /// other way.
    Unavailable,
    /// The stream's queue is full (the peer is not keeping up): dropped.
    Full,
}

impl<Req: Send + 'static> OneWayPath<Req> {
    /// A path that sends on a stream (everything `Unavailable` once the peer turns out to have none).
    pub(crate) fn new() -> OneWayPath<Req> {
        OneWayPath {
            link: std::sync::Mutex::new(None),
            unavailable: std::sync::Arc::new(AtomicBool::new(false)),
        }
    }

    /// Queues `request` on the open stream, or on one `open` starts now in a task of its own that
    /// reads (and drops) whatever the peer answers until the stream ends. Never waits.
    pub(crate) fn send<Rep, Open, Opening>(&self, request: Req, open: Open) -> Result<(), NotSent>
    where
        Rep: Send + 'static,
        Open: FnOnce(ReceiverStream<Req>) -> Opening + Send + 'static,
        Opening:
            Future<Output = Result<tonic::Response<tonic::Streaming<Rep>>, tonic::Status>> + Send + 'static,
    {
        if self.unavailable.load(Ordering::Relaxed) {
            return Err(NotSent::Unavailable);
        }
        let mut slot = self.link.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let request = match slot.as_ref() {
            None => request,
            Some(link) => match link.try_send(request) {
                Ok(()) => return Ok(()),
                Err(mpsc::error::TrySendError::Full(_)) => return Err(NotSent::Full),
                // The stream ended (its task is gone): open another.
                Err(mpsc::error::TrySendError::Closed(request)) => request,
            },
        };
        let (link, outgoing) = mpsc::channel(ONE_WAY_QUEUE);
        if link.try_send(request).is_err() {
            return Err(NotSent::Full);
        }
        *slot = Some(link);
        let unavailable = self.unavailable.clone();
        tokio::spawn(async move {
            let ended = match open(ReceiverStream::new(outgoing)).await {
                Ok(response) => {
                    let mut replies = response.into_inner();
                    // An older peer answers every request; the answers are dropped.
                    loop {
                        match replies.message().await {
                            Ok(Some(_)) => continue,
                            Ok(None) => break None,
                            Err(status) => break Some(status),
                        }
                    }
                }
                Err(status) => Some(status),
            };
            if let Some(status) = ended {
                if status.code() == tonic::Code::Unimplemented {
                    tracing::info!("a peer has no stream for one-way requests (an older version)");
                    unavailable.store(true, Ordering::Relaxed);
                } else {
                    tracing::debug!("a one-way stream ended: {status}");
                }
            }
        });
        Ok(())
    }
}
