//! A rate limit for log lines that outsiders can cause (refused requests, refused RPCs): whoever
//! sends them must not be able to flood the log. At most `lines` lines per `window`; the events
//! beyond are counted, and the count goes out with the next line written. Pure: the caller passes
//! the time.

/// The limit.
#[derive(Debug)]
pub struct LogLimit {
    lines: u32,
    window: std::time::Duration,
    state: std::sync::Mutex<LimitState>,
}

#[derive(Debug, Default)]
struct LimitState {
    window_start: Option<std::time::Instant>,
    written: u32,
    suppressed: u64,
}

impl LogLimit {
    /// At most `lines` lines in each `window`.
    pub fn new(lines: u32, window: std::time::Duration) -> LogLimit {
        LogLimit { lines, window, state: Default::default() }
    }

    /// Whether an event at `now` gets a line: `Some(n)` with the `n` events not logged since the
    /// last line written, `None` when this one is suppressed (and counted).
    pub fn admit(&self, now: std::time::Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let expired =
            state.window_start.is_none_or(|start| now.saturating_duration_since(start) >= self.window);
        if expired {
            state.window_start = Some(now);
            state.written = 0;
        }
        if state.written >= self.lines {
            state.suppressed += 1;
            return None;
        }
        state.written += 1;
        Some(std::mem::take(&mut state.suppressed))
    }
}
