//! The streams workloads of `tidal bench`: publish (pre-encoded batches), stream-lag (publish on
//! the leader, time until every follower's SSE subscriber has the event) and stream-read (pages of
//! 1000 events from one node).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::Context;
use hyper::Method;
use tidal_client::{Client, Delivery, Publish};

use crate::bench::BenchArgs;
use crate::bench_conn::LeanConn;

/// Where the publish workload writes.
pub const PUBLISH_PATH: &str = "/v1/streams/bench/events";
/// The stream of [`PUBLISH_PATH`], for the write link.
pub const PUBLISH_STREAM: &str = "bench";
/// Events a stream-read request asks for.
const READ_PAGE: u64 = 1000;
/// Distinct pre-encoded publish bodies.
const PUBLISH_BODIES: u64 = 512;
/// How long a stream-lag sample waits for every subscriber.
const LAG_WAIT: Duration = Duration::from_secs(10);

/// The publish workload's bodies, encoded before the clock starts: `--batch` events of ~100 bytes.
pub fn publish_bodies(args: &BenchArgs) -> anyhow::Result<Vec<bytes::Bytes>> {
    (0..PUBLISH_BODIES.min(args.requests_max.max(1)))
        .map(|n| {
            let events: Vec<Publish> = (0..args.batch as u64)
                .map(|i| Publish {
                    payload: serde_json::json!({"order": n * 100_000 + i, "sku": "sku-0042", "qty": 3, "note": "x".repeat(40)}),
                    key: None,
                })
                .collect();
            Ok(bytes::Bytes::from(serde_json::to_vec(&serde_json::json!({ "events": events }))?))
        })
        .collect()
}

/// A unique stream name for this run.
fn fresh_stream(prefix: &str) -> String {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis());
    format!("{prefix}-{ms}")
}

/// Publishes `--items` events (batches of 1000) to a fresh stream for stream-read; returns the
/// stream and its first offset. Fails unless the offsets came out contiguous (a quiet cluster):
/// a read then counts its events from the last offset of its page.
pub async fn preload(client: &Client, args: &BenchArgs) -> anyhow::Result<(String, u64)> {
    let stream = fresh_stream("bench-read");
    let total = args.items.max(READ_PAGE * 2);
    if !args.quiet {
        eprintln!("bench: publishing {total} events to {stream}");
    }
    let (mut first, mut next) = (None, None);
    for chunk in 0..total.div_ceil(1000) {
        let events: Vec<Publish> = (0..1000u64)
            .map(|i| Publish {
                payload: serde_json::json!({"n": chunk * 1000 + i, "pad": "p".repeat(60)}),
                key: None,
            })
            .collect();
        let reply = client.publish(&stream, &events, None).await.context("preload publish")?;
        anyhow::ensure!(
            next.is_none_or(|next| reply.offsets[0] == next),
            "other writes interleaved with the preload"
        );
        first.get_or_insert(reply.offsets[0]);
        next = Some(reply.seqno + 1);
    }
    Ok((stream, first.unwrap_or(1)))
}

/// One stream-read request: a page of 1000 events at a place drawn from `n`. The events are
/// counted from the last offset in the page (the preload's offsets are contiguous), so the bench
/// does not parse what it measures.
pub async fn read_page(conn: &mut LeanConn, args: &BenchArgs, n: u64) -> anyhow::Result<u64> {
    let (stream, first) = args.stream_read.as_ref().context("stream-read preloads its stream")?;
    let total = args.items.max(READ_PAGE * 2);
    let after = first - 1 + (n * READ_PAGE * 7) % (total - READ_PAGE);
    let path = format!("/v1/streams/{stream}/events?after={after}&limit={READ_PAGE}");
    let body = conn.send(Method::GET, &path, bytes::Bytes::new()).await?;
    let tail = body.len().saturating_sub(64 * 1024);
    let last = find_last_offset(&body[tail..]).context("a page without events")?;
    Ok(last - after)
}

/// The offset of the last event in (the end of) a page's JSON.
fn find_last_offset(bytes: &[u8]) -> Option<u64> {
    const MARK: &[u8] = b"{\"offset\":";
    let at = bytes.windows(MARK.len()).rposition(|window| window == MARK)? + MARK.len();
    let digits = bytes[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(&bytes[at..at + digits]).ok()?.parse().ok()
}

/// The followers' subscriptions: when each event reached each of them.
pub struct LagBoard {
    stream: String,
    readers: usize,
    arrivals: Mutex<HashMap<u64, Vec<Instant>>>,
    arrived: tokio::sync::Notify,
}

impl LagBoard {
    /// Subscribes on every follower to a fresh stream, before any event is published.
    pub async fn follow(followers: &[String], token: Option<String>) -> anyhow::Result<Arc<LagBoard>> {
        let board = Arc::new(LagBoard {
            stream: fresh_stream("bench-lag"),
            readers: followers.len(),
            arrivals: Mutex::new(HashMap::new()),
            arrived: tokio::sync::Notify::new(),
        });
        for url in followers {
            let mut subscription = Client::new(url.clone(), token.clone())
                .subscribe(&board.stream, 0)
                .await
                .with_context(|| format!("subscribe on {url}"))?;
            let board = board.clone();
            tokio::spawn(async move {
                while let Ok(Some(Delivery::Event(event))) = subscription.next().await {
                    let now = Instant::now();
                    board
                        .arrivals
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .entry(event.offset)
                        .or_default()
                        .push(now);
                    board.arrived.notify_waiters();
                }
            });
        }
        Ok(board)
    }

    /// Publishes one event and waits until every subscriber has it; the times in µs from the
    /// acknowledgement until the last and the first subscriber had it (0 if before).
    pub async fn publish_and_wait(&self, client: &Client) -> anyhow::Result<(u32, u32)> {
        let event = Publish { payload: serde_json::json!({"lag": true, "pad": "p".repeat(60)}), key: None };
        let reply = client.publish(&self.stream, &[event], None).await?;
        let acked = Instant::now();
        let offset = reply.offsets[0];
        let deadline = tokio::time::Instant::now() + LAG_WAIT;
        loop {
            let notified = self.arrived.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let done = {
                let mut arrivals = self.arrivals.lock().unwrap_or_else(PoisonError::into_inner);
                match arrivals.get(&offset) {
                    Some(times) if times.len() >= self.readers => arrivals.remove(&offset),
                    _ => None,
                }
            };
            if let Some(times) = done {
                let since = |at: &Instant| at.saturating_duration_since(acked).as_micros();
                let micros = |us: u128| u32::try_from(us).unwrap_or(u32::MAX);
                let last = times.iter().map(since).max().unwrap_or(0);
                let first = times.iter().map(since).min().unwrap_or(0);
                return Ok((micros(last), micros(first)));
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                anyhow::bail!("offset {offset} did not reach every subscriber within {LAG_WAIT:?}");
            }
        }
    }
}
