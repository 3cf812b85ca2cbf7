//! Quiet commit notices (decisions/027): sent on the commit stream with nobody reading replies, so
//! the server sends none; each still reaches the handler, in order; a peer's `commit_quiet` never
//! waits, and after the stream breaks the next notice opens another.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;
use tidal_net::auth::SecretAttach;
use tidal_net::pb;
use tidal_net::pb::replication_client::ReplicationClient;
use tidal_net::{ChunkStream, Handler, Peer, Pull, Ship, ShipAnswer};
use tidal_types::{NodeId, Seqno, Term};
use tokio::sync::mpsc;

/// Reports every commit notice it is handed, and answers with the notice's commit as its term (so
/// a reply tells which notice it answers).
struct Recorder {
    commits: mpsc::UnboundedSender<u64>,
}

#[tonic::async_trait]
impl Handler for Recorder {
    fn cluster_id(&self) -> &str {
        "test-cluster"
    }

    async fn ship(&self, _ship: Ship) -> Result<ShipAnswer, tidal_net::ServiceError> {
        Err(tidal_net::ServiceError::Unimplemented("no ships here".into()))
    }

    async fn commit(
        &self,
        _term: Term,
        _leader: NodeId,
        commit: Seqno,
    ) -> Result<Term, tidal_net::ServiceError> {
        let _ = self.commits.send(commit.get());
        Ok(Term(commit.get()))
    }

    async fn pull(&self, _pull: Pull) -> Result<ChunkStream, tidal_net::ServiceError> {
        Err(tidal_net::ServiceError::Unimplemented("no pulls here".into()))
    }

    async fn nudge(&self, _reason: String) -> Result<bool, tidal_net::ServiceError> {
        Ok(false)
    }
}

type Serving = (mpsc::UnboundedReceiver<u64>, tokio::sync::oneshot::Sender<()>);

/// Serves a [`Recorder`] on `listener` until the returned sender is dropped.
fn serve_on(listener: tokio::net::TcpListener) -> Serving {
    let (commits, seen) = mpsc::unbounded_channel();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        tidal_net::serve(Arc::new(Recorder { commits }), "secret-secret", incoming, async {
            let _ = stopped.await;
        })
        .await
        .unwrap();
    });
    (seen, stop)
}

async fn start() -> (String, mpsc::UnboundedReceiver<u64>, tokio::sync::oneshot::Sender<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    let (seen, stop) = serve_on(listener);
    (address, seen, stop)
}

fn notice(commit: u64, quiet: bool) -> pb::CommitRequest {
    pb::CommitRequest {
        cluster_id: "test-cluster".into(),
        term: 1,
        leader_id: 1,
        commit_seqno: commit,
        quiet,
    }
}

async fn next_commit(seen: &mut mpsc::UnboundedReceiver<u64>) -> u64 {
    tokio::time::timeout(Duration::from_secs(10), seen.recv()).await.expect("a notice arrives").unwrap()
}

#[tokio::test]
async fn a_quiet_notice_gets_no_reply_and_an_answered_one_gets_its_own() {
    let (address, mut seen, _stop) = start().await;
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{address}")).unwrap().connect_lazy();
    let attach = SecretAttach::new("secret-secret").unwrap();
    let mut client = ReplicationClient::with_interceptor(channel, move |request| attach.attach(request));
    let (requests, outgoing) = mpsc::channel(8);
    for commit in 1..=3 {
        requests.send(notice(commit, true)).await.unwrap();
    }
    requests.send(notice(4, false)).await.unwrap();
    let mut replies = client
        .commit_stream(tokio_stream::wrappers::ReceiverStream::new(outgoing))
        .await
        .unwrap()
        .into_inner();
    // The first reply is the answered notice's: the three quiet ones before it got none.
    let reply = tokio::time::timeout(Duration::from_secs(10), replies.message()).await.unwrap().unwrap();
    assert_eq!(reply.map(|r| r.term), Some(4), "a quiet notice was answered");
    for expected in 1..=4 {
        assert_eq!(next_commit(&mut seen).await, expected, "notices reach the handler in order");
    }
    drop(requests);
    assert!(replies.message().await.unwrap().is_none(), "nothing more comes back");
}

#[tokio::test]
async fn quiet_notices_from_a_peer_arrive_in_order_and_survive_a_server_restart() {
    let (address, mut seen, stop) = start().await;
    let peer = Peer::connect_lazy(&address, "secret-secret", "test-cluster").unwrap();
    for commit in 1..=50 {
        peer.commit_quiet(Term(1), NodeId(1), Seqno(commit)).unwrap();
    }
    for expected in 1..=50 {
        assert_eq!(next_commit(&mut seen).await, expected);
    }
    // The server goes away: its stream ends. A notice sent into the dying stream may be lost (best
    // effort); once the stream is seen closed, the next notice opens another to the new server.
    drop(stop);
    let listener = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            // The old server releases its port once it has stopped: poll for it.
            match tokio::net::TcpListener::bind(&address).await {
                Ok(listener) => break listener,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        }
    })
    .await
    .expect("the old server releases its port");
    let (mut seen_again, _stop_again) = serve_on(listener);
    let mut commit = 100;
    let got = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            commit += 1;
            peer.commit_quiet(Term(1), NodeId(1), Seqno(commit)).unwrap();
            if let Ok(Some(got)) = tokio::time::timeout(Duration::from_millis(100), seen_again.recv()).await {
                break got;
            }
        }
    })
    .await
    .expect("a quiet notice reaches the restarted server");
    assert!(got > 100, "the new server sees a new notice");
}
