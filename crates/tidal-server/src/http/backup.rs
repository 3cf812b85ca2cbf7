//! `GET /cluster/backup`: a backup of this node's state at a committed seqno, streamed as one
//! self-checking file (format: `tidal_cluster::backup`, decisions/065).
//!
//! The cut is a full read of the state into a file under `data_dir/snapshot` (unlinked at once, so
//! the bytes go away with the stream). Headers carry what the file holds, so a client can check
//! what it received before it reads the file again: `Tidal-Backup-Seqno`, `Tidal-Backup-Term`,
//! `Tidal-Backup-Blake3` (the file's trailer checksum), `Tidal-Backup-Digest` (the state digest at
//! the seqno, as `/cluster/digest` shows it), `Tidal-Backup-Dimension`, and `Content-Length`.
//!
//! Delicate: a follower applies before commit (decisions/025), so its cut may hold a suffix a new
//! leader drops. The file is handed out only once the cut's seqno is committed; a cut that stays
//! uncommitted for [`COMMIT_WAIT`] is refused (503), never served.

use super::{AppResult, AppState};
use crate::error::ApiError;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{header, HeaderValue};
use axum::response::Response;
use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tidal_cluster::backup::{cut_backup, hex, CutBackup};
use tidal_types::ErrorCode;

/// Backups cut at once: each is a full read of the state and a file its size; a second one would
/// compete with the first and with the node's own writes for the disk.
const BACKUPS_MAX: usize = 1;
/// How long a cut waits for its seqno to be committed (a follower's applied frontier is usually
/// within a few milliseconds of the commit frontier).
const COMMIT_WAIT: Duration = Duration::from_secs(10);
/// How often the commit frontier is looked at while waiting.
const COMMIT_POLL: Duration = Duration::from_millis(20);
/// Bytes per chunk of the response body.
const CHUNK_BYTES: usize = 1024 * 1024;
/// Chunks queued between the file reader and the connection.
const CHUNKS_QUEUED: usize = 4;

static BACKUPS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(BACKUPS_MAX);
static NEXT_CUT: AtomicU64 = AtomicU64::new(0);

/// `GET /cluster/backup`.
pub(super) async fn get_backup(State(state): State<Arc<AppState>>) -> AppResult<Response> {
    let permit = BACKUPS.try_acquire().map_err(|_| {
        ApiError::unavailable(
            ErrorCode::NotReady,
            "a backup is being cut on this node; retry when it is done",
        )
    })?;
    let node = state.node.clone();
    let id = NEXT_CUT.fetch_add(1, Ordering::Relaxed);
    let cut =
        tokio::task::spawn_blocking(move || cut_backup(node.db(), node.wal(), &node.config().data_dir, id))
            .await
            .map_err(|error| ApiError::internal(format!("backup task failed: {error}")))?
            .map_err(|error| ApiError::internal(format!("cut a backup: {error}")))?;
    wait_committed(&state, cut.info.position.seqno.get()).await?;
    let response = response_head(&cut)?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(CHUNKS_QUEUED);
    let CutBackup { file, info } = cut;
    tokio::spawn(async move {
        // The permit is held until the file has been sent (or the client went away).
        let _permit = permit;
        let mut file = Some(file);
        loop {
            let Some(mut reading) = file.take() else { break };
            let read = tokio::task::spawn_blocking(move || {
                let mut chunk = Vec::with_capacity(CHUNK_BYTES);
                (&mut reading).take(CHUNK_BYTES as u64).read_to_end(&mut chunk).map(|_| (chunk, reading))
            })
            .await
            .unwrap_or_else(|error| Err(std::io::Error::other(error)));
            let chunk = match read {
                Ok((chunk, _)) if chunk.is_empty() => break,
                Ok((chunk, reading)) => {
                    file = Some(reading);
                    Ok(Bytes::from(chunk))
                }
                Err(error) => Err(error),
            };
            if let Err(error) = &chunk {
                tracing::warn!(position = %info.position, "failed to read the backup file: {error}");
            }
            let failed = chunk.is_err();
            if tx.send(chunk).await.is_err() {
                tracing::info!(position = %info.position, "the backup client went away");
                return;
            }
            if failed {
                return;
            }
        }
        tracing::info!(position = %info.position, bytes = info.bytes, "backup served");
    });
    let body = Body::from_stream(tokio_stream::wrappers::ReceiverStream::new(rx));
    response.body(body).map_err(|error| ApiError::internal(format!("backup response: {error}")))
}

/// Waits until the cut's seqno is committed on this node (always at once on a single node and on
/// a leader, whose applied frontier follows its commit frontier).
async fn wait_committed(state: &AppState, seqno: u64) -> AppResult<()> {
    let Some(replica) = state.node.replica() else { return Ok(()) };
    let deadline = Instant::now() + COMMIT_WAIT;
    while replica.commit_seqno().get() < seqno {
        if Instant::now() >= deadline {
            return Err(ApiError::unavailable(
                ErrorCode::NotReady,
                format!(
                    "the backup's seqno {seqno} is not committed after {} s (commit {}): retry, or back up the leader",
                    COMMIT_WAIT.as_secs(),
                    replica.commit_seqno()
                ),
            ));
        }
        tokio::time::sleep(COMMIT_POLL).await;
    }
    Ok(())
}

fn response_head(cut: &CutBackup) -> AppResult<axum::http::response::Builder> {
    let info = &cut.info;
    let value = |text: String| {
        HeaderValue::from_str(&text).map_err(|error| ApiError::internal(format!("backup header: {error}")))
    };
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, "application/octet-stream")
        .header(header::CONTENT_LENGTH, info.bytes)
        .header("Tidal-Backup-Seqno", info.position.seqno.get())
        .header("Tidal-Backup-Term", info.position.term.get())
        .header("Tidal-Backup-Blake3", value(hex(&info.checksum))?)
        .header("Tidal-Backup-Digest", value(hex(&info.snapshot.digest))?)
        .header("Tidal-Backup-Dimension", info.snapshot.dimension))
}
