//! `tidal backup` and `tidal restore` (decisions/065): a node's state at a committed seqno as one
//! self-checking file, and a new data dir made from it.
//!
//! `backup` downloads `GET /cluster/backup` into `OUT.tmp` beside `OUT`, checks it against the
//! response headers and verifies it whole (trailer checksum, footer, every snapshot record, the
//! state digest), then fsyncs it, renames it to `OUT` and fsyncs the directory: `OUT` is either
//! absent or a verified backup, never a part of one. `restore` verifies a backup and writes a data
//! dir the node's first start finishes installing (`tidal_cluster::backup`).

use crate::ops::VerbArgs;
use crate::progress::{Progress, Unit};
use anyhow::Context;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tidal_cluster::backup::{hex, restore_backup, verify_backup, BackupInfo};

/// A whole backup download may take this long (tens of GiB on a slow link).
const DOWNLOAD_TIMEOUT: Duration = Duration::from_secs(4 * 60 * 60);

/// `tidal backup`.
#[derive(Clone, Debug, clap::Args)]
pub struct BackupArgs {
    #[command(flatten)]
    verb: VerbArgs,
    /// The file to write (refused if it exists: a backup never overwrites another).
    #[arg(long)]
    out: PathBuf,
    /// Print progress lines on stderr even when it is not a terminal.
    #[arg(long)]
    progress: bool,
}

/// `tidal restore`.
#[derive(Clone, Debug, clap::Args)]
pub struct RestoreArgs {
    /// The backup file (`tidal backup --out`).
    #[arg(long)]
    from: PathBuf,
    /// The new node's data dir: must not exist or be empty.
    #[arg(long)]
    data_dir: PathBuf,
    /// Verify the backup and say what it holds; write nothing.
    #[arg(long)]
    dry_run: bool,
}

/// `tidal backup --url URL --out FILE`: downloads and verifies a backup, writes it atomically.
pub async fn backup(args: BackupArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        !args.out.exists(),
        "{} exists: a backup never overwrites a file (choose another name or remove it)",
        args.out.display()
    );
    let temp = temp_path(&args.out);
    let started = Instant::now();
    let downloaded = download(&args, &temp).await;
    let checked = match downloaded {
        Ok(expected) => check_download(&temp, &expected).await,
        Err(error) => Err(error),
    };
    let info = match checked {
        Ok(info) => info,
        Err(error) => {
            let _ = std::fs::remove_file(&temp);
            return Err(error);
        }
    };
    std::fs::rename(&temp, &args.out)
        .with_context(|| format!("rename {} to {}", temp.display(), args.out.display()))?;
    sync_dir(&args.out)?;
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "backup: seqno {} (term {}), {} bytes in {seconds:.1} s ({:.1} MiB/s), dimension {}, state digest {}, blake3 {} -> {}",
        info.position.seqno,
        info.position.term.get(),
        info.bytes,
        info.bytes as f64 / (1024.0 * 1024.0) / seconds.max(1e-3),
        info.snapshot.dimension,
        hex(&info.snapshot.digest),
        hex(&info.checksum),
        args.out.display()
    );
    Ok(())
}

/// `tidal restore --from FILE --data-dir DIR`: verifies the backup and makes DIR a data dir that
/// starts at the backup's seqno.
pub async fn restore(args: RestoreArgs) -> anyhow::Result<()> {
    let (from, data_dir, dry_run) = (args.from.clone(), args.data_dir.clone(), args.dry_run);
    let info = tokio::task::spawn_blocking(move || {
        if dry_run {
            verify_backup(&from)
        } else {
            restore_backup(&from, &data_dir)
        }
    })
    .await
    .context("restore task")??;
    let what = if dry_run { "verified (nothing written)" } else { "restored" };
    println!(
        "restore: {} {what}: seqno {} (term {}), {} entries, dimension {}, state digest {}",
        args.from.display(),
        info.position.seqno,
        info.position.term.get(),
        info.snapshot.entries,
        info.snapshot.dimension,
        hex(&info.snapshot.digest)
    );
    if !dry_run {
        println!(
            "next: start a NEW node on {dir} (its first start installs the state; the node records the identity it is started with):\n  \
             single node:   tidal serve --data-dir {dir} --dimension {dim}\n  \
             cluster member: give it a node id no member has or had, start it with `tidal serve --cluster FILE --node-id N --data-dir {dir} --dimension {dim} --join`,\n                  \
             then `tidal members add --node N --http H:P --rpc H:P`: it pulls the log from seqno {next} on (or installs a snapshot if the leader purged it)",
            dir = args.data_dir.display(),
            dim = info.snapshot.dimension,
            next = info.position.seqno.get() + 1,
        );
    }
    Ok(())
}

/// What the response headers promise about the file.
struct Expected {
    bytes: u64,
    seqno: u64,
    checksum: String,
}

/// Streams the backup into `temp` (created new), with a progress line; fsyncs it.
async fn download(args: &BackupArgs, temp: &Path) -> anyhow::Result<Expected> {
    let client = args.verb.client_with_timeout(&args.verb.url, DOWNLOAD_TIMEOUT)?;
    let mut reply = client
        .get_stream("/cluster/backup")
        .await
        .with_context(|| format!("GET {}/cluster/backup", args.verb.url))?;
    let header = |name: &str| -> anyhow::Result<String> {
        let value = reply.headers().get(name).with_context(|| format!("the reply has no {name} header"))?;
        Ok(value.to_str().with_context(|| format!("header {name}"))?.to_string())
    };
    let expected = Expected {
        bytes: header("content-length")?.parse().context("Content-Length")?,
        seqno: header("tidal-backup-seqno")?.parse().context("Tidal-Backup-Seqno")?,
        checksum: header("tidal-backup-blake3")?,
    };
    let mut file =
        std::fs::OpenOptions::new().write(true).create_new(true).open(temp).with_context(|| {
            format!("create {} (a leftover of an earlier backup? remove it)", temp.display())
        })?;
    let mut progress = Progress::new("backup", Unit::Bytes, args.progress);
    let mut received = 0u64;
    while let Some(chunk) = reply.chunk().await.context("read the backup stream")? {
        file.write_all(&chunk).with_context(|| format!("write {}", temp.display()))?;
        received += chunk.len() as u64;
        progress.update(received, expected.bytes, "");
    }
    progress.finish(received, expected.bytes, "downloaded, verifying");
    anyhow::ensure!(
        received == expected.bytes,
        "the backup stream ended after {received} of {} bytes",
        expected.bytes
    );
    file.sync_all().with_context(|| format!("fsync {}", temp.display()))?;
    Ok(expected)
}

/// Verifies the downloaded file whole and against the headers.
async fn check_download(temp: &Path, expected: &Expected) -> anyhow::Result<BackupInfo> {
    let path = temp.to_path_buf();
    let info = tokio::task::spawn_blocking(move || verify_backup(&path)).await.context("verify task")??;
    anyhow::ensure!(
        hex(&info.checksum) == expected.checksum && info.position.seqno.get() == expected.seqno,
        "the downloaded backup holds seqno {} with checksum {}, the node announced seqno {} with checksum {}",
        info.position.seqno,
        hex(&info.checksum),
        expected.seqno,
        expected.checksum
    );
    Ok(info)
}

fn temp_path(out: &Path) -> PathBuf {
    let mut temp = out.as_os_str().to_owned();
    temp.push(".tmp");
    PathBuf::from(temp)
}

fn sync_dir(file: &Path) -> anyhow::Result<()> {
    let dir = file.parent().filter(|dir| !dir.as_os_str().is_empty()).unwrap_or(Path::new("."));
    std::fs::File::open(dir)
        .and_then(|dir| dir.sync_all())
        .with_context(|| format!("fsync {}", dir.display()))
}
