//! WAL benchmark against real files (StdIo): raw append+fdatasync vs the group-commit writer.
//!
//! `cargo run --release -p tidal-wal --example wal_bench -- --help`
//!
//! Phases, each bounded by `--seconds` and `--count`:
//! - raw 100 B / raw 4 KiB: a loop of write + fdatasync on a plain file (one event per fsync);
//! - (b) writer, 1 thread of 100-byte events (append_blocking);
//! - (c) writer, `--threads` concurrent threads of 100-byte events;
//! - raw 64 KiB: sequential 64 KiB write + fdatasync bandwidth;
//! - (d) writer, `--big-writers` threads of 64 KiB records;
//! - (e) writer, `--threads` writes of 100 bytes kept in flight by completions (no thread per
//!   writer): how the server's async handlers use it, without 64 OS threads competing for 2 cores;
//! - (f) paired: (b) and (e) again, each on its own open WAL, in alternating slices of 250 ms
//!   (`--pairs` pairs, the order within a pair alternating too), and the ratio of each pair. This
//!   disk switches between fdatasyncs of ~80 µs and of 4 ms from one second to the next, so the
//!   ratio of (e) to (b), phases seconds apart, often compares two different disks; adjacent slices
//!   mostly see the same one. The median of the pairs' ratios is the group-commit figure;
//! - raw pre-zeroed 4 KiB / 64 KiB: the raw loops overwriting a 64 MiB file that was written with
//!   zeros and fsynced first (what a preallocated segment gives, decisions/017);
//! - (g) raw pre-zeroed 4 KiB from `--sync-threads` threads at once, each its own write +
//!   fdatasync at its own offset of one file: whether two fsyncs of the WAL could overlap. If the
//!   disk serves them in parallel, events/s grows with the threads and p50 stays; if it serves them
//!   one at a time, events/s stays and p50 grows with the threads (experiments/045).
//!
//! The writer phases use the default config: segments preallocated, unless `TIDAL_WAL_PREALLOCATE=0`.
//! Each waits until the writer has prepared its next segment before the clock starts (the steady
//! state: a segment is normally prepared long before it is needed).
//!
//! After the table: per writer phase, the share of drains (fsyncs) by the requests they covered,
//! and the adaptive gather's waits (experiments/021; off by default, `TIDAL_WAL_GATHER_MIN=16` turns it
//! on after drains of 16 requests or more).
//!
//! Numbers depend entirely on the disk: run it on the disk the data will live on.

// A benchmark binary: failing loudly on a broken setup is what we want.
#![allow(clippy::unwrap_used)]

use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tidal_types::RecordKind;
use tidal_wal::stats::DRAIN_REQUESTS_BUCKETS;
use tidal_wal::{AppendRequest, NoopHook, StdIo, SystemClock, Wal, WalConfig};

const USAGE: &str = "\
wal_bench: measure raw fdatasync rates and the tidal-wal group-commit writer on real files

USAGE: wal_bench [--dir DIR] [--seconds N] [--count N] [--threads N] [--big-writers N]
                 [--pairs N] [--sync-threads N]

  --dir DIR          where to create the scratch directory (default: current directory)
  --seconds N        time bound of each phase (default 3)
  --count N          bound on writes per phase (default 1000000)
  --threads N        concurrent writers of phase (c) (default 64)
  --big-writers N    concurrent writers of 64 KiB records in phase (d) (default 4)
  --pairs N          slice pairs of the paired phase (f) (default 8; 0 skips it)
  --sync-threads N   threads of write + fdatasync at once in phase (g) (default 2)
  --help             this text";

struct Args {
    dir: PathBuf,
    seconds: u64,
    count: u64,
    threads: usize,
    big_writers: usize,
    pairs: usize,
    sync_threads: usize,
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        dir: PathBuf::from("."),
        seconds: 3,
        count: 1_000_000,
        threads: 64,
        big_writers: 4,
        pairs: 8,
        sync_threads: 2,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        let value = it.next().ok_or_else(|| format!("{flag} needs a value"))?;
        let number = || value.parse::<u64>().map_err(|err| format!("{flag} {value}: {err}"));
        match flag.as_str() {
            "--dir" => args.dir = PathBuf::from(&value),
            "--seconds" => args.seconds = number()?,
            "--count" => args.count = number()?,
            "--threads" => args.threads = number()?.max(1) as usize,
            "--big-writers" => args.big_writers = number()?.max(1) as usize,
            "--pairs" => args.pairs = number()? as usize,
            "--sync-threads" => args.sync_threads = number()?.max(1) as usize,
            other => return Err(format!("unknown argument {other}\n\n{USAGE}")),
        }
    }
    Ok(args)
}

/// One row of the result table.
struct Row {
    name: String,
    events: u64,
    fsyncs: u64,
    bytes: u64,
    elapsed: Duration,
    latencies_us: Vec<u32>,
    /// Segment rotations, and how many of them found no prepared segment (writer phases).
    rotations: (u64, u64),
    /// Writer phases: drains per bucket of `DRAIN_REQUESTS_BUCKETS` (requests covered by one fsync).
    drain_requests: Vec<u64>,
    /// Writer phases: gather waits, those that saw every writer back, and their total µs.
    gathers: (u64, u64, u64),
}

impl Row {
    /// A raw phase: one event and one fsync per write of `size` bytes, one latency each.
    fn raw(name: &str, size: usize, elapsed: Duration, latencies_us: Vec<u32>) -> Row {
        let writes = latencies_us.len() as u64;
        Row {
            name: name.to_string(),
            events: writes,
            fsyncs: writes,
            bytes: writes * size as u64,
            elapsed,
            latencies_us,
            rotations: (0, 0),
            drain_requests: Vec::new(),
            gathers: (0, 0, 0),
        }
    }

    fn events_per_s(&self) -> f64 {
        self.events as f64 / self.elapsed.as_secs_f64()
    }

    fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / self.elapsed.as_secs_f64() / 1e6
    }

    fn percentile_us(&mut self, p: f64) -> u32 {
        if self.latencies_us.is_empty() {
            return 0;
        }
        self.latencies_us.sort_unstable();
        let rank = ((self.latencies_us.len() as f64 * p).ceil() as usize).clamp(1, self.latencies_us.len());
        self.latencies_us[rank - 1]
    }
}

fn micros(elapsed: Duration) -> u32 {
    u32::try_from(elapsed.as_micros()).unwrap_or(u32::MAX)
}

/// A loop of write + fdatasync of `size` bytes on a plain file.
fn raw(dir: &Path, name: &str, size: usize, args: &Args) -> Row {
    let path = dir.join(format!("raw-{size}.dat"));
    let mut file = OpenOptions::new().create(true).append(true).open(&path).unwrap();
    timed_syncs(&path, name, size, args, |buf, _| {
        file.write_all(buf).unwrap();
        file.sync_data().unwrap();
    })
}

/// Bytes of the pre-zeroed file of the raw pre-zeroed phases (one default segment).
const PREZEROED_LEN: u64 = 64 * 1024 * 1024;

/// A loop of `size`-byte positioned writes + fdatasync over a file written with zeros and fsynced
/// first, wrapping around at its end.
fn raw_prezeroed(dir: &Path, name: &str, size: usize, args: &Args) -> Row {
    let path = dir.join(format!("raw-prezeroed-{size}.dat"));
    let file = prezeroed_file(&path);
    timed_syncs(&path, name, size, args, |buf, writes| {
        file.write_all_at(buf, prezeroed_offset(writes, size)).unwrap();
        file.sync_data().unwrap();
    })
}

/// Where the `write`-th `size`-byte write of a raw pre-zeroed loop goes: one after the other,
/// wrapping around at the file's end.
fn prezeroed_offset(write: u64, size: usize) -> u64 {
    (write * size as u64) % (PREZEROED_LEN - size as u64 + 1)
}

/// A file of `PREZEROED_LEN` zeros, fsynced.
fn prezeroed_file(path: &Path) -> std::fs::File {
    let file = OpenOptions::new().create(true).truncate(true).write(true).open(path).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for at in (0..PREZEROED_LEN).step_by(zeros.len()) {
        file.write_all_at(&zeros, at).unwrap();
    }
    file.sync_data().unwrap();
    file
}

/// Phase (g): `threads` threads at once, each a loop of a `size`-byte positioned write at the next
/// free offset of one pre-zeroed file + fdatasync, until the count or the time is up.
fn raw_prezeroed_concurrent(dir: &Path, name: &str, size: usize, threads: usize, args: &Args) -> Row {
    let path = dir.join(format!("raw-concurrent-{size}.dat"));
    let file = prezeroed_file(&path);
    let next = AtomicU64::new(0);
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let latencies_us: Vec<u32> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let buf = vec![0xAB_u8; size];
                    let mut latencies_us = Vec::new();
                    while Instant::now() < deadline {
                        let write = next.fetch_add(1, Ordering::Relaxed);
                        if write >= args.count {
                            break;
                        }
                        let op = Instant::now();
                        file.write_all_at(&buf, prezeroed_offset(write, size)).unwrap();
                        file.sync_data().unwrap();
                        latencies_us.push(micros(op.elapsed()));
                    }
                    latencies_us
                })
            })
            .collect();
        handles.into_iter().flat_map(|handle| handle.join().unwrap()).collect()
    });
    let elapsed = started.elapsed();
    std::fs::remove_file(&path).unwrap();
    Row::raw(name, size, elapsed, latencies_us)
}

/// Times `write_and_sync(buf, writes so far)` of a `size`-byte buffer until the count or the time is
/// up, then removes the file at `path`.
fn timed_syncs(
    path: &Path,
    name: &str,
    size: usize,
    args: &Args,
    mut write_and_sync: impl FnMut(&[u8], u64),
) -> Row {
    let buf = vec![0xAB_u8; size];
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let mut latencies_us = Vec::new();
    let mut writes = 0u64;
    while writes < args.count && Instant::now() < deadline {
        let op = Instant::now();
        write_and_sync(&buf, writes);
        latencies_us.push(micros(op.elapsed()));
        writes += 1;
    }
    let elapsed = started.elapsed();
    std::fs::remove_file(path).unwrap();
    Row::raw(name, size, elapsed, latencies_us)
}

/// The writer phases' config: the defaults, preallocation off with `TIDAL_WAL_PREALLOCATE=0`, the
/// adaptive gather set by `TIDAL_WAL_GATHER_MIN` (0: off) and `TIDAL_WAL_GATHER_WAIT_US`.
fn wal_config(wal_dir: &Path) -> WalConfig {
    let mut config = WalConfig::new(wal_dir);
    if std::env::var("TIDAL_WAL_PREALLOCATE").is_ok_and(|value| value == "0") {
        config.preallocate_bytes = 0;
    }
    if let Some(min) = std::env::var("TIDAL_WAL_GATHER_MIN").ok().and_then(|value| value.parse().ok()) {
        config.gather_min_requests = min;
    }
    if let Some(us) = std::env::var("TIDAL_WAL_GATHER_WAIT_US").ok().and_then(|value| value.parse().ok()) {
        config.gather_wait_max = Duration::from_micros(us);
    }
    config
}

/// Opens a writer phase's WAL and waits until its next segment is prepared.
fn open_wal(wal_dir: &Path) -> Wal {
    let (wal, _) =
        Wal::open(wal_config(wal_dir), Arc::new(StdIo), Arc::new(SystemClock), Box::new(NoopHook)).unwrap();
    assert!(wal.wait_segment_prepared(Duration::from_secs(60)), "the next segment was not prepared");
    wal
}

/// `threads` threads each appending `size`-byte records with append_blocking.
fn writer(dir: &Path, name: &str, threads: usize, size: usize, args: &Args) -> Row {
    let wal_dir = dir.join(name.replace(|c: char| !c.is_ascii_alphanumeric(), "_"));
    let wal = open_wal(&wal_dir);
    let issued = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_secs(args.seconds);
    let started = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (wal, issued, count) = (wal.clone(), issued.clone(), args.count);
            std::thread::spawn(move || {
                let mut latencies_us = Vec::new();
                while Instant::now() < deadline && issued.fetch_add(1, Ordering::Relaxed) < count {
                    let request =
                        AppendRequest { kind: RecordKind::Signal, event_count: 1, payload: vec![0x5A; size] };
                    let op = Instant::now();
                    wal.append_blocking(request).unwrap();
                    latencies_us.push(micros(op.elapsed()));
                }
                latencies_us
            })
        })
        .collect();
    let mut latencies_us = Vec::new();
    for handle in handles {
        latencies_us.extend(handle.join().unwrap());
    }
    let elapsed = started.elapsed();
    let stats = wal.stats();
    wal.shutdown();
    drop(wal);
    std::fs::remove_dir_all(&wal_dir).unwrap();
    Row {
        name: name.to_string(),
        rotations: (stats.rotations, stats.rotations_unprepared),
        events: stats.events,
        fsyncs: stats.fsyncs,
        bytes: stats.bytes,
        elapsed,
        latencies_us,
        drain_requests: stats.drain_requests_buckets.to_vec(),
        gathers: (stats.gathers, stats.gathers_complete, stats.gather_wait_us_sum),
    }
}

struct Chain {
    wal: Wal,
    deadline: Instant,
    issued: AtomicU64,
    count: u64,
    size: usize,
    latencies_us: std::sync::Mutex<Vec<u32>>,
    finished: std::sync::Mutex<std::sync::mpsc::Sender<()>>,
}

/// Submits one write whose completion submits the next, until the phase's bounds are reached.
fn chain_next(chain: Arc<Chain>) {
    if Instant::now() >= chain.deadline || chain.issued.fetch_add(1, Ordering::Relaxed) >= chain.count {
        chain.finished.lock().unwrap().send(()).unwrap();
        return;
    }
    let request = AppendRequest { kind: RecordKind::Signal, event_count: 1, payload: vec![0x5A; chain.size] };
    let started = Instant::now();
    let next = chain.clone();
    chain
        .wal
        .submit(
            request,
            Box::new(move |result| {
                result.unwrap();
                next.latencies_us.lock().unwrap().push(micros(started.elapsed()));
                chain_next(next);
            }),
        )
        .unwrap();
}

/// `in_flight` writes of `size` bytes kept in flight by their completions.
fn writer_chained(dir: &Path, name: &str, in_flight: usize, size: usize, args: &Args) -> Row {
    let wal_dir = dir.join(name.replace(|c: char| !c.is_ascii_alphanumeric(), "_"));
    let wal = open_wal(&wal_dir);
    let (finished, all_done) = std::sync::mpsc::channel();
    let chain = Arc::new(Chain {
        wal: wal.clone(),
        deadline: Instant::now() + Duration::from_secs(args.seconds),
        issued: AtomicU64::new(0),
        count: args.count,
        size,
        latencies_us: std::sync::Mutex::new(Vec::new()),
        finished: std::sync::Mutex::new(finished),
    });
    let started = Instant::now();
    for _ in 0..in_flight {
        chain_next(chain.clone());
    }
    for _ in 0..in_flight {
        all_done.recv().unwrap();
    }
    let elapsed = started.elapsed();
    let stats = wal.stats();
    let latencies_us = std::mem::take(&mut *chain.latencies_us.lock().unwrap());
    drop(chain);
    wal.shutdown();
    drop(wal);
    std::fs::remove_dir_all(&wal_dir).unwrap();
    Row {
        name: name.to_string(),
        rotations: (stats.rotations, stats.rotations_unprepared),
        events: stats.events,
        fsyncs: stats.fsyncs,
        bytes: stats.bytes,
        elapsed,
        latencies_us,
        drain_requests: stats.drain_requests_buckets.to_vec(),
        gathers: (stats.gathers, stats.gathers_complete, stats.gather_wait_us_sum),
    }
}

/// Events/s of one slice: `in_flight` writes of 100 B kept in flight on `wal` for `slice`
/// (1: a single writer waiting for each write), measured by the WAL's own event counter.
fn slice_rate(wal: &Wal, in_flight: usize, slice: Duration) -> f64 {
    let before = wal.stats().events;
    let started = Instant::now();
    let (finished, all_done) = std::sync::mpsc::channel();
    let chain = Arc::new(Chain {
        wal: wal.clone(),
        deadline: started + slice,
        issued: AtomicU64::new(0),
        count: u64::MAX,
        size: 100,
        latencies_us: std::sync::Mutex::new(Vec::new()),
        finished: std::sync::Mutex::new(finished),
    });
    if in_flight == 1 {
        // The (b) way: a thread that waits for each write.
        while Instant::now() < started + slice {
            let request =
                AppendRequest { kind: RecordKind::Signal, event_count: 1, payload: vec![0x5A; 100] };
            wal.append_blocking(request).unwrap();
        }
    } else {
        for _ in 0..in_flight {
            chain_next(chain.clone());
        }
        for _ in 0..in_flight {
            all_done.recv().unwrap();
        }
    }
    (wal.stats().events - before) as f64 / started.elapsed().as_secs_f64()
}

/// Phase (f): ratios of 64-in-flight to single-writer events/s over adjacent slices.
fn paired(dir: &Path, args: &Args) -> Vec<(f64, f64)> {
    let single = open_wal(&dir.join("paired_1"));
    let many = open_wal(&dir.join("paired_64"));
    let slice = Duration::from_millis(250);
    let mut pairs = Vec::new();
    for pair in 0..args.pairs {
        let (one, sixty_four) = if pair % 2 == 0 {
            let one = slice_rate(&single, 1, slice);
            (one, slice_rate(&many, args.threads, slice))
        } else {
            let sixty_four = slice_rate(&many, args.threads, slice);
            (slice_rate(&single, 1, slice), sixty_four)
        };
        pairs.push((one, sixty_four));
    }
    for wal in [single, many] {
        wal.shutdown();
    }
    std::fs::remove_dir_all(dir.join("paired_1")).unwrap();
    std::fs::remove_dir_all(dir.join("paired_64")).unwrap();
    pairs
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn main() {
    let args = match parse_args() {
        Ok(args) => args,
        Err(message) => {
            eprintln!("{message}");
            std::process::exit(2);
        }
    };
    let scratch = args.dir.join(format!("wal-bench-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    println!(
        "wal_bench in {} ({} s and at most {} writes per phase)",
        scratch.display(),
        args.seconds,
        args.count
    );
    let mut rows = vec![
        raw(&scratch, "raw write+fdatasync 100 B", 100, &args),
        raw(&scratch, "raw write+fdatasync 4 KiB", 4096, &args),
        writer(&scratch, "(b) wal 1 thread 100 B", 1, 100, &args),
        writer(&scratch, &format!("(c) wal {} threads 100 B", args.threads), args.threads, 100, &args),
        raw(&scratch, "raw write+fdatasync 64 KiB", 64 * 1024, &args),
        writer(
            &scratch,
            &format!("(d) wal {} threads 64 KiB", args.big_writers),
            args.big_writers,
            64 * 1024,
            &args,
        ),
        writer_chained(
            &scratch,
            &format!("(e) wal {} in flight 100 B", args.threads),
            args.threads,
            100,
            &args,
        ),
        raw_prezeroed(&scratch, "raw pre-zeroed 4 KiB", 4096, &args),
        raw_prezeroed(&scratch, "raw pre-zeroed 64 KiB", 64 * 1024, &args),
        raw_prezeroed_concurrent(
            &scratch,
            &format!("(g) raw pre-zeroed 4 KiB x{}", args.sync_threads),
            4096,
            args.sync_threads,
            &args,
        ),
    ];
    let pairs = if args.pairs > 0 { paired(&scratch, &args) } else { Vec::new() };
    std::fs::remove_dir_all(&scratch).unwrap();
    println!(
        "{:<30} {:>11} {:>10} {:>10} {:>9} {:>10} {:>10}",
        "phase", "events/s", "fsyncs/s", "ev/fsync", "MB/s", "p50 ack", "p99 ack"
    );
    for row in &mut rows {
        let seconds = row.elapsed.as_secs_f64();
        let (p50, p99) = (row.percentile_us(0.50), row.percentile_us(0.99));
        println!(
            "{:<30} {:>11.0} {:>10.0} {:>10.1} {:>9.2} {:>8}us {:>8}us",
            row.name,
            row.events_per_s(),
            row.fsyncs as f64 / seconds,
            row.events as f64 / row.fsyncs.max(1) as f64,
            row.mb_per_s(),
            p50,
            p99
        );
    }
    for row in rows.iter().filter(|row| row.rotations.0 > 0) {
        println!(
            "{}: {} rotations, {} without a prepared segment",
            row.name, row.rotations.0, row.rotations.1
        );
    }
    for row in rows.iter().filter(|row| row.drain_requests.iter().sum::<u64>() > 0) {
        let drains: u64 = row.drain_requests.iter().sum();
        let histogram: Vec<String> = DRAIN_REQUESTS_BUCKETS
            .iter()
            .zip(&row.drain_requests)
            .filter(|(_, count)| **count > 0)
            .map(|(bound, count)| {
                let share = 100.0 * *count as f64 / drains as f64;
                if *bound == u64::MAX {
                    format!("more:{share:.0}%")
                } else {
                    format!("<={bound}:{share:.0}%")
                }
            })
            .collect();
        let (gathers, complete, wait_us) = row.gathers;
        println!(
            "{}: requests per drain {}; {gathers} gathers ({complete} complete, mean {:.0}us)",
            row.name,
            histogram.join(" "),
            wait_us as f64 / gathers.max(1) as f64
        );
    }
    let (b, c, raw64, d) = (&rows[2], &rows[3], &rows[4], &rows[5]);
    println!("ratio (c)/(b) events/s: {:.1}x", c.events_per_s() / b.events_per_s());
    println!("ratio (d)/raw 64 KiB MB/s: {:.2}", d.mb_per_s() / raw64.mb_per_s());
    println!("ratio (e)/(b) events/s: {:.1}x", rows[6].events_per_s() / b.events_per_s());
    println!("ratio (d)/raw pre-zeroed 64 KiB MB/s: {:.2}", d.mb_per_s() / rows[8].mb_per_s());
    let (one_rate, one_p50) = (rows[7].events_per_s(), rows[7].percentile_us(0.50));
    let (many_rate, many_p50) = (rows[9].events_per_s(), rows[9].percentile_us(0.50));
    println!(
        "ratio (g)/raw pre-zeroed 4 KiB, {} threads against 1: events/s {:.2}x, p50 {:.2}x \
         (fsyncs that overlap: events/s grows and p50 stays; one at a time: p50 grows)",
        args.sync_threads,
        many_rate / one_rate,
        f64::from(many_p50) / f64::from(one_p50.max(1))
    );
    if !pairs.is_empty() {
        let shown: Vec<String> =
            pairs.iter().map(|(one, many)| format!("{:.0}/{:.0}={:.1}x", many, one, many / one)).collect();
        println!("(f) paired slices, {} in flight / 1 writer events/s: {}", args.threads, shown.join(" "));
        println!(
            "(f) paired: median 1 writer {:.0} events/s, median {} in flight {:.0} events/s, median ratio {:.1}x",
            median(pairs.iter().map(|pair| pair.0).collect()),
            args.threads,
            median(pairs.iter().map(|pair| pair.1).collect()),
            median(pairs.iter().map(|(one, many)| many / one).collect())
        );
    }
}
