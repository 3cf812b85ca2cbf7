//! The log an operator reads and alerts on: ERROR means a person is needed, nothing else does.
//!
//! openraft reports every failed RPC at ERROR and every ignored message at WARN. During an election,
//! or while a peer is down, those are the protocol working: a failover logged hundreds of ERROR lines
//! that no one should act on. The cases that do need a person (a fatal storage fault, a halted
//! receiver, a failed office) are Tidal's own lines, and the lasting symptoms (no leader, lag, a node
//! down) are metrics the alerting rules watch. So openraft's lines are shown one level lower
//! ([`shown`]) and rate-limited per call site ([`Limiter`]); Tidal's own are shown as written.
//!
//! Each line: time, level, `node=<id>` once the node's id is known, target, message and fields.
//! No colour codes unless stderr is a terminal (a node's log is usually a file).

use std::collections::HashMap;
use std::fmt;
use std::io::IsTerminal;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use tracing::callsite::Identifier;
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The default filter: Tidal at INFO; the storage engine's own chatter only when it warns.
const DEFAULT_FILTER: &str = "info,fjall=warn,lsm_tree=warn";
/// Lines a rate-limited call site may print per window.
const LIMIT_LINES: u32 = 3;
/// The rate limit's window.
const LIMIT_WINDOW: Duration = Duration::from_secs(10);

/// The node id every line names, set once the configuration is resolved.
static NODE: OnceLock<u64> = OnceLock::new();

/// Installs the process's subscriber: the filter from `RUST_LOG` (else [`DEFAULT_FILTER`]), lines in
/// [`OperatorFormat`] on stderr.
pub fn init() {
    let filter =
        tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| DEFAULT_FILTER.into());
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .event_format(OperatorFormat::default())
        .init();
}

/// Names `node` on every later line (the first call wins: one process serves one node).
pub fn set_node(node: u64) {
    let _ = NODE.set(node);
}

/// How an event is shown: at which level, and whether its call site is rate-limited.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shown {
    /// The level printed.
    pub level: Level,
    /// Whether [`Limiter`] applies.
    pub limited: bool,
}

/// The level an operator sees for an event of `target` at `level`: openraft's one lower (ERROR to
/// WARN, WARN to INFO) and rate-limited; everything else as written.
pub fn shown(target: &str, level: Level) -> Shown {
    let openraft = target == "openraft" || target.starts_with("openraft::");
    match level {
        Level::ERROR if openraft => Shown { level: Level::WARN, limited: true },
        Level::WARN if openraft => Shown { level: Level::INFO, limited: true },
        level => Shown { level, limited: false },
    }
}

/// What [`Limiter::admit`] says about one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Print it, saying how many lines of its call site were dropped before it.
    Show {
        /// Lines dropped since the last one shown.
        dropped: u64,
    },
    /// Drop it.
    Drop,
}

/// At most [`LIMIT_LINES`] lines per call site per [`LIMIT_WINDOW`]; the first line shown after a
/// drop says how many were dropped, so a flood is visible without filling the disk.
#[derive(Debug)]
pub struct Limiter<K> {
    sites: HashMap<K, Window>,
}

impl<K> Default for Limiter<K> {
    fn default() -> Limiter<K> {
        Limiter { sites: HashMap::new() }
    }
}

#[derive(Debug)]
struct Window {
    started: Instant,
    shown: u32,
    dropped: u64,
}

impl<K: std::hash::Hash + Eq> Limiter<K> {
    /// Whether a line of call site `key` at `now` is printed.
    pub fn admit(&mut self, key: K, now: Instant) -> Admit {
        let window = self.sites.entry(key).or_insert(Window { started: now, shown: 0, dropped: 0 });
        if now.saturating_duration_since(window.started) >= LIMIT_WINDOW {
            window.started = now;
            window.shown = 0;
        }
        if window.shown >= LIMIT_LINES {
            window.dropped += 1;
            return Admit::Drop;
        }
        window.shown += 1;
        Admit::Show { dropped: std::mem::take(&mut window.dropped) }
    }
}

/// The line format of [`init`].
#[derive(Default)]
pub struct OperatorFormat {
    limiter: Mutex<Limiter<Identifier>>,
}

impl<S, N> FormatEvent<S, N> for OperatorFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let shown = shown(meta.target(), *meta.level());
        let mut dropped = 0;
        if shown.limited {
            // A poisoned lock only means another thread panicked mid-line: keep logging.
            let mut limiter = self.limiter.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            match limiter.admit(meta.callsite(), Instant::now()) {
                Admit::Drop => return Ok(()),
                Admit::Show { dropped: n } => dropped = n,
            }
        }
        SystemTime.format_time(&mut writer)?;
        write!(writer, " {:>5}", shown.level)?;
        if let Some(node) = NODE.get() {
            write!(writer, " node={node}")?;
        }
        write!(writer, " {}: ", meta.target())?;
        ctx.format_fields(writer.by_ref(), event)?;
        if dropped > 0 {
            write!(writer, " ({dropped} more like this not shown)")?;
        }
        writeln!(writer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn openraft_is_shown_a_level_lower_and_limited_and_ours_as_written() {
        assert_eq!(shown("openraft::replication", Level::ERROR), Shown { level: Level::WARN, limited: true });
        assert_eq!(shown("openraft", Level::WARN), Shown { level: Level::INFO, limited: true });
        assert_eq!(shown("openraft::core", Level::INFO), Shown { level: Level::INFO, limited: false });
        assert_eq!(shown("openraftish", Level::ERROR), Shown { level: Level::ERROR, limited: false });
        assert_eq!(shown("tidal_wal::writer", Level::ERROR), Shown { level: Level::ERROR, limited: false });
    }

    #[test]
    fn a_flood_shows_the_first_lines_then_one_line_per_window_counting_the_dropped() {
        let mut limiter = Limiter::default();
        let start = Instant::now();
        let shown: Vec<Admit> =
            (0..10).map(|i| limiter.admit("site", start + Duration::from_millis(i))).collect();
        assert_eq!(shown[..3], [Admit::Show { dropped: 0 }; 3]);
        assert!(shown[3..].iter().all(|admit| *admit == Admit::Drop), "{shown:?}");
        // Another call site has its own window.
        assert_eq!(limiter.admit("other", start), Admit::Show { dropped: 0 });
        let later = start + LIMIT_WINDOW + Duration::from_millis(5);
        assert_eq!(limiter.admit("site", later), Admit::Show { dropped: 7 });
        assert_eq!(limiter.admit("site", later), Admit::Show { dropped: 0 });
    }
}
