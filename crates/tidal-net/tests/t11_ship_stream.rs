//! Ships on a peer's long-lived path, the ship link (decisions/071; the `ShipStream` of
//! decisions/026 for a peer without it, `t13_ship_link`): every ship gets its own reply, in order; a
//! ship abandoned between its request and its reply never hands its reply to the next ship; a
//! refused request ends the link and the next ship opens another; a server that shuts down ends
//! the links and streams it holds.
#![allow(clippy::unwrap_used)]

mod common;

use common::{matched, ship_at, start, start_serving, Matcher};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tidal_net::Peer;
use tidal_types::{NodeId, Seqno, Term};

#[tokio::test]
async fn every_ship_on_the_stream_gets_its_own_reply_in_order() {
    let (address, handler, _stop) = start(0).await;
    let peer = Peer::connect_lazy(&address, "secret-secret", "test-cluster").unwrap();
    for i in 0..200u64 {
        let first = 1 + 3 * i;
        let answer = peer.ship(&ship_at(first)).await.unwrap();
        assert_eq!(answer.outcome, matched(first), "ship {i}");
    }
    // Clones share the stream; ships from several tasks at once each get their own reply.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8u64 {
        let peer = peer.clone();
        tasks.spawn(async move {
            let first = 10_000 + 3 * i;
            (first, peer.ship(&ship_at(first)).await.unwrap())
        });
    }
    while let Some(done) = tasks.join_next().await {
        let (first, answer) = done.unwrap();
        assert_eq!(answer.outcome, matched(first));
    }
    assert_eq!(handler.ships.load(Ordering::SeqCst), 208);
}

/// The leader's queue may drop a ship's future while the follower still works on it (a new term,
/// a stop). Its reply must not become the answer to the next ship.
#[tokio::test]
async fn an_abandoned_ship_never_answers_the_next_one() {
    let (address, handler, _stop) = start(4).await;
    let peer = Peer::connect_lazy(&address, "secret-secret", "test-cluster").unwrap();
    assert_eq!(peer.ship(&ship_at(1)).await.unwrap().outcome, matched(1));
    // The ship at 4 is held by the server; its caller gives up.
    let abandoned = tokio::time::timeout(Duration::from_millis(200), peer.ship(&ship_at(4))).await;
    assert!(abandoned.is_err(), "the held ship cannot have been answered");
    handler.release.notify_one();
    // The next ship gets the reply to ITSELF, not the late reply to the ship at 4.
    assert_eq!(peer.ship(&ship_at(7)).await.unwrap().outcome, matched(7));
    assert_eq!(peer.ship(&ship_at(10)).await.unwrap().outcome, matched(10));
}

#[tokio::test]
async fn a_refused_ship_ends_the_stream_and_the_next_ship_opens_another() {
    let (address, handler, _stop) = start(0).await;
    let peer = Peer::connect_lazy(&address, "secret-secret", "test-cluster").unwrap();
    assert_eq!(peer.ship(&ship_at(1)).await.unwrap().outcome, matched(1));
    let mut other = ship_at(4);
    other.cluster_id = "other".into();
    let error = peer.ship(&other).await.unwrap_err();
    assert!(
        matches!(&error, tidal_net::NetError::Status(s) if s.code() == tonic::Code::PermissionDenied),
        "{error}"
    );
    assert_eq!(peer.ship(&ship_at(4)).await.unwrap().outcome, matched(4));
    assert_eq!(handler.ships.load(Ordering::SeqCst), 2, "the refused ship never reached the handler");
}

/// A graceful shutdown waits for every open call, and the leader never ends its streams: the server
/// ends them itself, or a stopping follower would hang (found by t50_cluster's node stops).
#[tokio::test]
async fn a_server_shuts_down_while_a_leader_holds_its_streams_open() {
    let (address, _handler, stop, served) = start_serving(0).await;
    let peer = Peer::connect_lazy(&address, "secret-secret", "test-cluster").unwrap();
    assert_eq!(peer.ship(&ship_at(1)).await.unwrap().outcome, matched(1));
    peer.commit(Term(1), NodeId(1), Seqno(3), Duration::from_secs(5)).await.unwrap();
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(20), served)
        .await
        .expect("the shutdown waited for the streams the leader holds open")
        .unwrap();
    assert!(peer.ship(&ship_at(4)).await.is_err(), "the server is gone");
}

/// Connections accepted until `stop` turns true; then the stream ends and tells `ended`.
struct UntilStop {
    listener: tokio_stream::wrappers::TcpListenerStream,
    stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
    ended: Option<tokio::sync::oneshot::Sender<()>>,
}

impl tokio_stream::Stream for UntilStop {
    type Item = std::io::Result<tokio::net::TcpStream>;

    fn poll_next(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Self::Item>> {
        if self.stop.as_mut().poll(cx).is_ready() {
            if let Some(ended) = self.ended.take() {
                let _ = ended.send(());
            }
            return std::task::Poll::Ready(None);
        }
        std::pin::Pin::new(&mut self.listener).poll_next(cx)
    }
}

/// tidal-server's node ends its listener's stream at the same shutdown it hands `serve`: when the
/// stream ends first, tonic stops polling the shutdown signal. The streams must end all the same
/// (the first version hung here, intermittently, in t50_cluster's node stops).
#[tokio::test]
async fn a_server_shuts_down_when_its_incoming_ends_before_the_signal() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let handler = Arc::new(Matcher::default());
    let (stop, stopping) = tokio::sync::watch::channel(false);
    let (ended, incoming_ended) = tokio::sync::oneshot::channel();
    let mut stopping_incoming = stopping.clone();
    let incoming = UntilStop {
        listener: tokio_stream::wrappers::TcpListenerStream::new(listener),
        stop: Box::pin(async move {
            let _ = stopping_incoming.wait_for(|stop| *stop).await;
        }),
        ended: Some(ended),
    };
    let serving = handler.clone();
    let served = tokio::spawn(async move {
        // The signal resolves only once the incoming stream has ended: the order that hung.
        tidal_net::serve(serving, "secret-secret", incoming, async {
            let _ = incoming_ended.await;
        })
        .await
        .unwrap();
    });
    let peer = Peer::connect_lazy(&address, "secret-secret", "test-cluster").unwrap();
    assert_eq!(peer.ship(&ship_at(1)).await.unwrap().outcome, matched(1));
    peer.commit(Term(1), NodeId(1), Seqno(3), Duration::from_secs(5)).await.unwrap();
    stop.send(true).unwrap();
    tokio::time::timeout(Duration::from_secs(20), served)
        .await
        .expect("the shutdown waited for the streams the leader holds open")
        .unwrap();
}
