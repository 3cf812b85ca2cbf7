//! The ship link: ships and their answers as length-prefixed protobuf frames on a connection of
//! their own to the peer's RPC port (decisions/071), beside the gRPC connection that carries
//! everything else.
//!
//! On the gRPC stream (decisions/026) a ship crossed four tasks besides its sender and its handler:
//! hyper's body pipe and the HTTP/2 connection task on the leader, the connection task and the
//! stream's task on the follower, and the same again for the answer. On the link the leader's queue
//! writes the frame to the socket itself and reads the answer itself; the follower's one task per
//! link reads a frame, decides it and writes the answer.
//!
//! Wire, after the connection (and TLS, when on) is up:
//! - client: [`PREFACE`], then a u32 (big-endian) length and the `authorization` value the gRPC
//!   calls carry (`Bearer <secret>`);
//! - server: [`WELCOME`] or [`REFUSED`] (16 bytes each);
//! - then, one at a time: client a frame (u32 length, `ShipRequest`), server a frame (u32 length,
//!   one kind byte, then a `ShipReply` or an error: one byte of gRPC status code and its message).
//!   An error answer ends the link (the server closes it), as an error status ends the gRPC stream.
//!
//! The server tells a link from an HTTP/2 connection by its first 16 bytes (an HTTP/2 client's
//! preface starts `PRI * HTTP/2.0`). A peer that does not know the link (an older version) answers
//! the preface with something else or closes: the client then ships on the gRPC stream for
//! [`UNKNOWN_RETRY`] before it tries the link again.
//!
//! Delicate, as on the stream: an exchange can be abandoned between its request and its reply. The
//! connection is taken out of its slot for the exchange and put back only once the reply is read, so
//! an abandoned exchange drops the connection and no request ever reads another's reply.

use crate::client::{NetError, CONNECT_TIMEOUT};
use crate::connector::{BoxStream, ConnectFn};
use crate::message::{WireError, MESSAGE_BATCH_BYTES_MAX};
use crate::pb;
use bytes::{Bytes, BytesMut};
use prost::Message;
use std::io;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
// tokio's clock: simulated time under turmoil.
use tokio::time::Instant;

/// What a link's client sends first.
pub(crate) const PREFACE: [u8; 16] = *b"tidal-ship/1\r\n\r\n";
/// The server's answer to a hello with the cluster secret.
const WELCOME: [u8; 16] = *b"tidal-ship/1 ok\n";
/// The server's answer to a hello without it (then it closes).
const REFUSED: [u8; 16] = *b"tidal-ship/1 no\n";
/// Largest `authorization` value a hello may carry.
const HELLO_BYTES_MAX: usize = 4096;
/// Largest request frame: a ship's batches and its header.
pub(crate) const REQUEST_BYTES_MAX: usize = MESSAGE_BATCH_BYTES_MAX + 1024 * 1024;
/// Largest answer frame (an answer carries positions, or a term history when diverged).
pub(crate) const REPLY_BYTES_MAX: usize = 16 * 1024 * 1024;
/// An answer frame's kinds.
const KIND_REPLY: u8 = 0;
const KIND_ERROR: u8 = 1;
/// Not an answer: the server is still deciding the ship (sent every [`BEAT`]).
const KIND_WORKING: u8 = 2;
/// How often a server that is still deciding a ship says so. A dead connection (a peer gone without
/// a reset, a partition) must fail the exchange within seconds, as HTTP/2's pings fail the gRPC
/// connection (decisions/008), not at the ship's 10 s deadline: writes wait on it.
const BEAT: Duration = Duration::from_secs(1);
/// How long a client waits for any byte of an answer, or for a slice of its request to leave,
/// before it drops the link as dead.
const SILENCE_MAX: Duration = crate::client::KEEPALIVE_TIMEOUT;
/// The request is written in slices of this size, each within [`SILENCE_MAX`].
const WRITE_SLICE: usize = 256 * 1024;
/// How long a peer that did not know the link is sent ships on the gRPC stream before the link is
/// tried again (a rolling upgrade brings it back).
pub(crate) const UNKNOWN_RETRY: Duration = Duration::from_secs(30);
/// Read buffer of a link's end: a ship's header and small answers in one read.
const READ_BUFFER: usize = 64 * 1024;

/// A connected link: reads through a buffer, writes straight to the stream.
type Conn = BufReader<BoxStream>;

/// What an exchange on the link came to.
pub(crate) enum Linked {
    /// The peer's reply.
    Reply(pb::ShipReply),
    /// The peer does not speak the link: ship on the gRPC stream.
    Unknown,
}

/// Why one attempt on the link failed.
enum Failure {
    /// The peer answered the preface with something else: it does not know the link.
    Unknown,
    /// Anything else: the ship's outcome is unknown, the caller's error.
    Net(NetError),
}

impl From<io::Error> for Failure {
    fn from(error: io::Error) -> Failure {
        Failure::Net(unavailable(format!("ship link: {error}")))
    }
}

impl From<NetError> for Failure {
    fn from(error: NetError) -> Failure {
        Failure::Net(error)
    }
}

impl From<WireError> for Failure {
    fn from(error: WireError) -> Failure {
        Failure::Net(NetError::Wire(error))
    }
}

fn unavailable(why: impl Into<String>) -> NetError {
    NetError::Status(tonic::Status::unavailable(why))
}

/// The client end: one link per peer, shared by the peer's clones, opened on first use and again
/// after any failure.
pub(crate) struct ShipLink {
    address: String,
    /// `Bearer <secret>`, as the gRPC calls carry it.
    authorization: String,
    connect: Option<Arc<ConnectFn>>,
    conn: tokio::sync::Mutex<Option<Conn>>,
    /// Until when the peer is taken not to know the link.
    unknown_until: std::sync::Mutex<Option<Instant>>,
}

impl ShipLink {
    /// A link to `address`, opened through `connect` (None: the OS's TCP).
    pub(crate) fn new(address: &str, secret: &str, connect: Option<Arc<ConnectFn>>) -> ShipLink {
        ShipLink {
            address: address.to_string(),
            authorization: format!("Bearer {secret}"),
            connect,
            conn: tokio::sync::Mutex::new(None),
            unknown_until: std::sync::Mutex::new(None),
        }
    }

    fn unknown(&self) -> bool {
        let until = self.unknown_until.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        until.is_some_and(|until| Instant::now() < until)
    }

    /// Sends `request` and reads its reply within `timeout`, on the open link or on one opened now.
    pub(crate) async fn exchange(
        &self,
        request: &pb::ShipRequest,
        timeout: Duration,
    ) -> Result<Linked, NetError> {
        if self.unknown() {
            return Ok(Linked::Unknown);
        }
        let frame = encode_request(request);
        let mut slot = self.conn.lock().await;
        let conn = slot.take();
        match tokio::time::timeout(timeout, self.on_link(conn, &frame)).await {
            Ok(Ok((conn, reply))) => {
                *slot = Some(conn);
                Ok(Linked::Reply(reply))
            }
            Ok(Err(Failure::Unknown)) => {
                tracing::info!(peer = %self.address, "the peer does not know the ship link (an older version): ships go on the gRPC stream");
                *self.unknown_until.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
                    Some(Instant::now() + UNKNOWN_RETRY);
                Ok(Linked::Unknown)
            }
            Ok(Err(Failure::Net(error))) => Err(error),
            Err(_) => Err(NetError::Status(tonic::Status::deadline_exceeded(format!(
                "no reply on the ship link within {timeout:?}"
            )))),
        }
    }

    async fn on_link(&self, conn: Option<Conn>, frame: &[u8]) -> Result<(Conn, pb::ShipReply), Failure> {
        let mut conn = match conn {
            Some(conn) => conn,
            None => self.open().await?,
        };
        for slice in frame.chunks(WRITE_SLICE) {
            within_silence(conn.get_mut().write_all(slice)).await??;
        }
        loop {
            let answer = within_silence(read_frame(&mut conn, REPLY_BYTES_MAX, "ship link answer")).await??;
            let answer = answer.ok_or_else(|| unavailable("the peer closed the ship link"))?;
            if answer[..] != [KIND_WORKING] {
                return Ok((conn, decode_answer(answer)?));
            }
        }
    }

    /// Connects and says hello.
    async fn open(&self) -> Result<Conn, Failure> {
        let connecting = async {
            match &self.connect {
                Some(connect) => connect(self.address.clone()).await,
                None => {
                    let stream = tokio::net::TcpStream::connect(&self.address).await?;
                    stream.set_nodelay(true)?;
                    Ok(Box::new(stream) as BoxStream)
                }
            }
        };
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, connecting).await.map_err(|_| {
            unavailable(format!("ship link: no connection to {} within {CONNECT_TIMEOUT:?}", self.address))
        })??;
        let mut conn = BufReader::with_capacity(READ_BUFFER, stream);
        // A stopped peer's kernel still accepts the connection: its silence must fail the hello
        // as soon as it would fail a ship, not at the ship's deadline.
        within_silence(conn.get_mut().write_all(&hello(&self.authorization))).await??;
        let mut answer = [0u8; 16];
        match within_silence(conn.read_exact(&mut answer)).await? {
            Ok(_) if answer == WELCOME => Ok(conn),
            Ok(_) if answer == REFUSED => Err(NetError::from(tonic::Status::unauthenticated(
                "the peer refused the ship link's cluster secret",
            ))
            .into()),
            Ok(_) => Err(Failure::Unknown),
            // An older peer's HTTP/2 server closes on a preface it does not know (a reset when
            // the rest of our hello was still unread).
            Err(error)
                if matches!(
                    error.kind(),
                    io::ErrorKind::UnexpectedEof
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::ConnectionAborted
                ) =>
            {
                Err(Failure::Unknown)
            }
            Err(error) => Err(error.into()),
        }
    }
}

/// `step`, or a failure once nothing moved for [`SILENCE_MAX`].
async fn within_silence<T>(step: impl std::future::Future<Output = T>) -> Result<T, Failure> {
    tokio::time::timeout(SILENCE_MAX, step).await.map_err(|_| {
        unavailable(format!("the ship link was silent for {SILENCE_MAX:?}: dropped as dead")).into()
    })
}

/// The client's hello: the preface and the length-prefixed authorization.
fn hello(authorization: &str) -> Vec<u8> {
    let mut hello = Vec::with_capacity(PREFACE.len() + 4 + authorization.len());
    hello.extend_from_slice(&PREFACE);
    hello.extend_from_slice(&frame_len(authorization.len()).to_be_bytes());
    hello.extend_from_slice(authorization.as_bytes());
    hello
}

fn frame_len(len: usize) -> u32 {
    u32::try_from(len).expect("a link frame is bounded far below 4 GiB")
}

/// A request frame: its length, then the message.
fn encode_request(request: &pb::ShipRequest) -> Vec<u8> {
    let len = request.encoded_len();
    let mut frame = Vec::with_capacity(4 + len);
    frame.extend_from_slice(&frame_len(len).to_be_bytes());
    request.encode(&mut frame).expect("a Vec grows to take the message");
    frame
}

/// An answer frame: its length, the kind, then a reply or an error.
fn encode_answer(answer: &Result<pb::ShipReply, tonic::Status>) -> Vec<u8> {
    let mut body = Vec::new();
    match answer {
        Ok(reply) => {
            body.push(KIND_REPLY);
            reply.encode(&mut body).expect("a Vec grows to take the message");
        }
        Err(status) => {
            body.push(KIND_ERROR);
            body.push(u8::try_from(status.code() as i32).unwrap_or(u8::MAX));
            let message = status.message().as_bytes();
            body.extend_from_slice(&message[..message.len().min(REPLY_BYTES_MAX / 2)]);
        }
    }
    let mut frame = Vec::with_capacity(4 + body.len());
    frame.extend_from_slice(&frame_len(body.len()).to_be_bytes());
    frame.extend_from_slice(&body);
    frame
}

/// The reply an answer frame carries, or the error status it carries as the caller's error.
fn decode_answer(body: Bytes) -> Result<pb::ShipReply, NetError> {
    match body.first() {
        Some(&KIND_REPLY) => pb::ShipReply::decode(body.slice(1..)).map_err(|error| {
            NetError::Wire(WireError::Invalid { what: "ship link answer", reason: error.to_string() })
        }),
        Some(&KIND_ERROR) if body.len() >= 2 => {
            let code = tonic::Code::from(i32::from(body[1]));
            Err(NetError::Status(tonic::Status::new(code, String::from_utf8_lossy(&body[2..]).into_owned())))
        }
        _ => Err(NetError::Wire(WireError::Invalid {
            what: "ship link answer",
            reason: format!("unknown kind in a {}-byte answer", body.len()),
        })),
    }
}

/// Reads one frame of at most `max` bytes. `Ok(None)`: the stream ended cleanly before a frame.
async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    max: usize,
    what: &'static str,
) -> Result<Option<Bytes>, Failure> {
    let mut len = [0u8; 4];
    match reader.read_exact(&mut len).await {
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(error) => return Err(error.into()),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(WireError::TooLarge { what, got: len, max }.into());
    }
    let mut body = BytesMut::zeroed(len);
    reader.read_exact(&mut body).await?;
    Ok(Some(body.freeze()))
}

/// How a server end answers: the secret check and the ship handler.
pub(crate) struct LinkServer<Check, Answer> {
    /// Whether a hello's authorization is the cluster's (constant time).
    pub check: Check,
    /// Decides one ship request.
    pub answer: Answer,
}

/// Serves one link whose [`PREFACE`] was read already, until the client closes it, an error ends
/// it, or `closing` turns true. `proven` is told once the hello carried the secret.
pub(crate) async fn serve_link<IO, Check, Answer, Answering>(
    io: IO,
    server: LinkServer<Check, Answer>,
    proven: impl FnOnce(),
    mut closing: tokio::sync::watch::Receiver<bool>,
) where
    IO: AsyncRead + AsyncWrite + Unpin,
    Check: Fn(&[u8]) -> bool,
    Answer: Fn(pb::ShipRequest) -> Answering,
    Answering: std::future::Future<Output = Result<pb::ShipReply, tonic::Status>>,
{
    let mut conn = BufReader::with_capacity(READ_BUFFER, io);
    let served = async {
        let Some(authorization) = read_frame(&mut conn, HELLO_BYTES_MAX, "ship link hello").await? else {
            return Ok(());
        };
        if !(server.check)(&authorization) {
            conn.get_mut().write_all(&REFUSED).await?;
            return Ok(());
        }
        proven();
        conn.get_mut().write_all(&WELCOME).await?;
        loop {
            let request = match read_frame(&mut conn, REQUEST_BYTES_MAX, "ship link request").await {
                Ok(Some(request)) => request,
                Ok(None) => return Ok(()),
                Err(Failure::Net(NetError::Wire(error))) => {
                    let refused = Err(tonic::Status::invalid_argument(error.to_string()));
                    conn.get_mut().write_all(&encode_answer(&refused)).await?;
                    return Ok(());
                }
                Err(error) => return Err(error),
            };
            let answer = match pb::ShipRequest::decode(request) {
                Ok(request) => answer_beating(conn.get_mut(), (server.answer)(request)).await?,
                Err(error) => Err(tonic::Status::invalid_argument(format!("ship link request: {error}"))),
            };
            conn.get_mut().write_all(&encode_answer(&answer)).await?;
            if answer.is_err() {
                return Ok(());
            }
        }
    };
    tokio::select! {
        served = served => if let Err(Failure::Net(error)) = served {
            tracing::debug!("a ship link ended: {error}");
        },
        _ = closing.wait_for(|closing| *closing) => {}
    }
}

/// How long an accepted connection may take to send the 16 bytes that tell a link from HTTP/2.
const SORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Sorts accepted connections by their first 16 bytes: a link is handed to `serve` (in a task of
/// its own); anything else comes out of the returned stream, the bytes read put back in front, for
/// the gRPC server. Each connection is sorted in a task of its own, so a slow one holds up no other.
pub(crate) fn sorted<I, IO, IE, Serve, Serving>(
    incoming: I,
    serve: Serve,
) -> tokio_stream::wrappers::ReceiverStream<Result<Rewound<IO>, IE>>
where
    I: tokio_stream::Stream<Item = Result<IO, IE>> + Send + 'static,
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    IE: Send + 'static,
    Serve: Fn(IO) -> Serving + Send + Sync + 'static,
    Serving: std::future::Future<Output = ()> + Send + 'static,
{
    use tokio_stream::StreamExt as _;
    let (sender, receiver) = tokio::sync::mpsc::channel(16);
    tokio::spawn(async move {
        let serve = Arc::new(serve);
        tokio::pin!(incoming);
        loop {
            // Ends once the gRPC server let go of its stream (it stopped), so the listener in
            // `incoming` is dropped with it and its port released.
            let accepted = tokio::select! {
                accepted = incoming.next() => accepted,
                () = sender.closed() => return,
            };
            let Some(accepted) = accepted else { return };
            let mut io = match accepted {
                Ok(io) => io,
                Err(error) => {
                    if sender.send(Err(error)).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let (sender, serve) = (sender.clone(), serve.clone());
            tokio::spawn(async move {
                let mut prefix = [0u8; 16];
                // Closed, failed or silent before 16 bytes: dropped (neither a link nor HTTP/2).
                let Ok(Ok(_)) = tokio::time::timeout(SORT_TIMEOUT, io.read_exact(&mut prefix)).await else {
                    return;
                };
                if prefix == PREFACE {
                    serve(io).await;
                } else {
                    let _ = sender.send(Ok(Rewound { prefix, given: 0, io })).await;
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(receiver)
}

/// An accepted connection whose first bytes were read to sort it, with them put back in front.
pub(crate) struct Rewound<IO> {
    prefix: [u8; 16],
    /// How many of `prefix` were read again.
    given: usize,
    io: IO,
}

impl<IO: AsyncRead + Unpin> AsyncRead for Rewound<IO> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        if self.given < self.prefix.len() {
            let take = (self.prefix.len() - self.given).min(buf.remaining());
            let given = self.given;
            buf.put_slice(&self.prefix[given..given + take]);
            self.given += take;
            return std::task::Poll::Ready(Ok(()));
        }
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Rewound<IO> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> std::task::Poll<io::Result<usize>> {
        std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected for Rewound<IO> {
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

/// Waits for `answering`, telling the client every [`BEAT`] that it is still at work.
async fn answer_beating<W: AsyncWrite + Unpin>(
    writer: &mut W,
    answering: impl std::future::Future<Output = Result<pb::ShipReply, tonic::Status>>,
) -> Result<Result<pb::ShipReply, tonic::Status>, Failure> {
    tokio::pin!(answering);
    loop {
        tokio::select! {
            answer = &mut answering => return Ok(answer),
            () = tokio::time::sleep(BEAT) => writer.write_all(&[0, 0, 0, 1, KIND_WORKING]).await?,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn frames_round_trip_and_bad_ones_are_errors() {
        let request =
            pb::ShipRequest { cluster_id: "c".into(), term: 3, batches: vec![7; 100], ..Default::default() };
        let frame = encode_request(&request);
        let mut reader = &frame[..];
        let body = read_frame(&mut reader, REQUEST_BYTES_MAX, "t").await.ok().flatten().unwrap();
        assert_eq!(pb::ShipRequest::decode(body).unwrap(), request);
        // Truncated: an error, not a frame (nor a clean end).
        let mut short = &frame[..frame.len() - 1];
        assert!(matches!(read_frame(&mut short, REQUEST_BYTES_MAX, "t").await, Err(Failure::Net(_))));
        let mut header_only = &frame[..2];
        assert!(matches!(read_frame(&mut header_only, REQUEST_BYTES_MAX, "t").await, Ok(None)));
        // Oversize: refused from its length, before any allocation.
        let mut huge = &u32::MAX.to_be_bytes()[..];
        assert!(matches!(
            read_frame(&mut huge, REQUEST_BYTES_MAX, "t").await,
            Err(Failure::Net(NetError::Wire(WireError::TooLarge { .. })))
        ));
    }

    #[test]
    fn answers_carry_replies_and_errors_and_garbage_is_refused() {
        let reply = pb::ShipReply { term: 9, ..Default::default() };
        let frame = encode_answer(&Ok(reply.clone()));
        assert_eq!(decode_answer(Bytes::copy_from_slice(&frame[4..])).unwrap(), reply);
        let frame = encode_answer(&Err(tonic::Status::permission_denied("wrong cluster")));
        match decode_answer(Bytes::copy_from_slice(&frame[4..])) {
            Err(NetError::Status(status)) => {
                assert_eq!(status.code(), tonic::Code::PermissionDenied);
                assert_eq!(status.message(), "wrong cluster");
            }
            other => panic!("expected the error status, got {other:?}"),
        }
        for garbage in [&b""[..], &[KIND_ERROR][..], &[9, 1, 2][..], &[KIND_REPLY, 0xff, 0xff][..]] {
            assert!(
                matches!(decode_answer(Bytes::copy_from_slice(garbage)), Err(NetError::Wire(_))),
                "{garbage:?} decoded"
            );
        }
    }
}
