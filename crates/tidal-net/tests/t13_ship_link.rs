//! The ship link (decisions/071): ships on a connection of their own, told apart from HTTP/2 by its
//! first bytes. A peer that does not know the link (an older version) gets its ships on the gRPC
//! stream; a hello without the secret is refused; garbage, truncated and oversize frames end the
//! link with an error and the server goes on serving.
#![allow(clippy::unwrap_used)]

mod common;

use common::{matched, ship_at, start, SECRET};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tidal_net::Peer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PREFACE: &[u8; 16] = b"tidal-ship/1\r\n\r\n";

/// How the stand-in for an older peer answers a link's preface.
#[derive(Clone, Copy)]
enum OldPeer {
    /// Closes the connection (an HTTP/2 server on a preface it does not know).
    Closes,
    /// Writes bytes of its own first (an HTTP/2 server's SETTINGS and GOAWAY frames).
    AnswersHttp2,
}

/// A proxy in front of `server` that passes HTTP/2 connections through and answers a link's
/// preface as a peer without the link would; counts the link attempts.
async fn older_peer(server: String, answer: OldPeer) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let attempts = Arc::new(AtomicUsize::new(0));
    let counted = attempts.clone();
    tokio::spawn(async move {
        loop {
            let (mut client, _) = listener.accept().await.unwrap();
            let (server, counted) = (server.clone(), counted.clone());
            tokio::spawn(async move {
                let mut first = [0u8; 16];
                client.read_exact(&mut first).await.unwrap();
                if &first == PREFACE {
                    counted.fetch_add(1, Ordering::SeqCst);
                    if let OldPeer::AnswersHttp2 = answer {
                        // A SETTINGS frame, then a GOAWAY with PROTOCOL_ERROR.
                        let frames = [
                            &[0u8, 0, 0, 4, 0, 0, 0, 0, 0][..],
                            &[0, 0, 8, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1][..],
                        ]
                        .concat();
                        let _ = client.write_all(&frames).await;
                    }
                    return;
                }
                let mut upstream = tokio::net::TcpStream::connect(&server).await.unwrap();
                upstream.write_all(&first).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
            });
        }
    });
    (address, attempts)
}

#[tokio::test]
async fn a_peer_without_the_link_gets_its_ships_on_the_stream() {
    for answer in [OldPeer::Closes, OldPeer::AnswersHttp2] {
        let (server, handler, _stop) = start(4).await;
        let (address, attempts) = older_peer(server, answer).await;
        let peer = Peer::connect_lazy(&address, SECRET, "test-cluster").unwrap();
        assert_eq!(peer.ship(&ship_at(1)).await.unwrap().outcome, matched(1));
        // The stream's own rule holds there too: an abandoned ship never answers the next one.
        let abandoned = tokio::time::timeout(Duration::from_millis(200), peer.ship(&ship_at(4))).await;
        assert!(abandoned.is_err(), "the held ship cannot have been answered");
        handler.release.notify_one();
        for i in 0..20u64 {
            let first = 7 + 3 * i;
            assert_eq!(peer.ship(&ship_at(first)).await.unwrap().outcome, matched(first), "ship {i}");
        }
        assert_eq!(handler.ships.load(Ordering::SeqCst), 22);
        assert_eq!(attempts.load(Ordering::SeqCst), 1, "the link is not tried again at once");
    }
}

#[tokio::test]
async fn a_hello_without_the_secret_is_refused_and_counted() {
    let (address, handler, _stop) = start(0).await;
    let wrong = Peer::connect_lazy(&address, "not-the-secret", "test-cluster").unwrap();
    match wrong.ship(&ship_at(1)).await {
        Err(tidal_net::NetError::Status(status)) => assert_eq!(status.code(), tonic::Code::Unauthenticated),
        other => panic!("expected unauthenticated, got {other:?}"),
    }
    assert_eq!(handler.wrong_secret.load(Ordering::SeqCst), 1);
    assert_eq!(handler.ships.load(Ordering::SeqCst), 0);
    // The server goes on serving the right secret.
    let right = Peer::connect_lazy(&address, SECRET, "test-cluster").unwrap();
    assert_eq!(right.ship(&ship_at(1)).await.unwrap().outcome, matched(1));
}

/// Opens a link by hand and says hello with the secret.
async fn raw_link(address: &str) -> tokio::net::TcpStream {
    let mut link = tokio::net::TcpStream::connect(address).await.unwrap();
    let authorization = format!("Bearer {SECRET}");
    let mut hello = PREFACE.to_vec();
    hello.extend_from_slice(&u32::try_from(authorization.len()).unwrap().to_be_bytes());
    hello.extend_from_slice(authorization.as_bytes());
    link.write_all(&hello).await.unwrap();
    let mut welcome = [0u8; 16];
    link.read_exact(&mut welcome).await.unwrap();
    assert_eq!(&welcome, b"tidal-ship/1 ok\n");
    link
}

/// Reads an answer frame: (kind, body after the kind byte).
async fn answer_of(link: &mut tokio::net::TcpStream) -> (u8, Vec<u8>) {
    let mut len = [0u8; 4];
    link.read_exact(&mut len).await.unwrap();
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    link.read_exact(&mut body).await.unwrap();
    (body[0], body[1..].to_vec())
}

async fn closed(link: &mut tokio::net::TcpStream) -> bool {
    let mut byte = [0u8; 1];
    matches!(tokio::time::timeout(Duration::from_secs(10), link.read(&mut byte)).await, Ok(Ok(0)))
}

#[tokio::test]
async fn bad_frames_end_the_link_with_an_error_and_the_server_serves_on() {
    let (address, handler, _stop) = start(0).await;
    let invalid = tonic::Code::InvalidArgument as u8;
    // Oversize: refused from its length.
    let mut link = raw_link(&address).await;
    link.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    let (kind, body) = answer_of(&mut link).await;
    assert_eq!((kind, body[0]), (1, invalid), "{}", String::from_utf8_lossy(&body[1..]));
    assert!(closed(&mut link).await);
    // Garbage that is no ShipRequest.
    let mut link = raw_link(&address).await;
    link.write_all(&[0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff]).await.unwrap();
    let (kind, body) = answer_of(&mut link).await;
    assert_eq!((kind, body[0]), (1, invalid), "{}", String::from_utf8_lossy(&body[1..]));
    assert!(closed(&mut link).await);
    // Truncated: the client goes away mid-frame; nothing is served.
    let mut link = raw_link(&address).await;
    link.write_all(&[0, 0, 1, 0, 1, 2, 3]).await.unwrap();
    drop(link);
    // A hello whose length is over the bound is refused without an answer.
    let mut link = tokio::net::TcpStream::connect(&address).await.unwrap();
    link.write_all(PREFACE).await.unwrap();
    link.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    assert!(closed(&mut link).await);
    assert_eq!(handler.ships.load(Ordering::SeqCst), 0);
    let peer = Peer::connect_lazy(&address, SECRET, "test-cluster").unwrap();
    for i in 0..5u64 {
        let first = 1 + 3 * i;
        assert_eq!(peer.ship(&ship_at(first)).await.unwrap().outcome, matched(first));
    }
    assert_eq!(handler.ships.load(Ordering::SeqCst), 5);
}

/// A peer that takes the link and then goes silent (gone without a reset, or cut off) fails the
/// ship within seconds, as HTTP/2's pings fail a gRPC connection, not at the ship's 10 s deadline.
#[tokio::test]
async fn a_silent_link_fails_the_ship_within_seconds() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        let (mut link, _) = listener.accept().await.unwrap();
        let mut hello = [0u8; 16 + 4 + 20];
        link.read_exact(&mut hello).await.unwrap();
        link.write_all(b"tidal-ship/1 ok\n").await.unwrap();
        // Reads the ship and never answers.
        let mut sink = vec![0u8; 4096];
        while link.read(&mut sink).await.unwrap_or(0) > 0 {}
    });
    let peer = Peer::connect_lazy(&address, SECRET, "test-cluster").unwrap();
    let started = tokio::time::Instant::now();
    match peer.ship(&ship_at(1)).await {
        Err(tidal_net::NetError::Status(status)) => {
            assert!(status.message().contains("silent"), "{status:?}");
        }
        other => panic!("expected the link dropped as dead, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(9), "took {:?}", started.elapsed());
}

/// A follower that takes longer than the link's silence bound to decide a ship (a slow fsync) says
/// it is still at work, and its answer arrives.
#[tokio::test]
async fn a_slow_answer_keeps_the_link_alive() {
    let (address, handler, _stop) = start(4).await;
    let peer = Peer::connect_lazy(&address, SECRET, "test-cluster").unwrap();
    let releasing = handler.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(4)).await;
        releasing.release.notify_one();
    });
    assert_eq!(peer.ship(&ship_at(4)).await.unwrap().outcome, matched(4));
}

/// A peer whose kernel accepts the connection but whose process never answers the hello (a stopped
/// follower) fails the ship within seconds too.
#[tokio::test]
async fn a_peer_silent_at_hello_fails_the_ship_within_seconds() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (held, mut holder) = tokio::sync::mpsc::channel(1);
    tokio::spawn(async move {
        let (link, _) = listener.accept().await.unwrap();
        // Holds the connection open and says nothing.
        held.send(link).await.unwrap();
    });
    let peer = Peer::connect_lazy(&address, SECRET, "test-cluster").unwrap();
    let started = tokio::time::Instant::now();
    match peer.ship(&ship_at(1)).await {
        Err(tidal_net::NetError::Status(status)) => {
            assert!(status.message().contains("silent"), "{status:?}")
        }
        other => panic!("expected the link dropped as dead, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(9), "took {:?}", started.elapsed());
    drop(holder.recv().await);
}
