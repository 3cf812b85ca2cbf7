//! Progress lines for long verbs (`tidal backup`, `tidal catchup --wait`, `tidal heal --wait`):
//! done/total, percent, rate and time left, on stderr, at most once a second.
//!
//! Shown only when stderr is a terminal or `--progress` asks for it, so a script that captures a
//! verb's output gets its result and nothing else. On a terminal the line is redrawn in place
//! (`\r`); with `--progress` into a file or pipe each update is its own line, which a log keeps.
//! The result of a verb goes to stdout; progress never does.

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Shortest time between two progress lines.
pub const PRINT_INTERVAL: Duration = Duration::from_secs(1);

/// What is counted: seqnos (`412,000/1,000,000 seqnos`) or bytes (`41.2/100.0 MiB`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    /// Log positions.
    Seqnos,
    /// Bytes, shown in MiB.
    Bytes,
}

/// One progress line, redrawn as work advances.
pub struct Progress {
    label: String,
    unit: Unit,
    shown: bool,
    in_place: bool,
    started: Instant,
    last_print: Option<Instant>,
    printed: bool,
}

impl Progress {
    /// A progress line labelled `label`; shown when stderr is a terminal or `forced`.
    pub fn new(label: &str, unit: Unit, forced: bool) -> Progress {
        let terminal = std::io::stderr().is_terminal();
        Progress {
            label: label.to_string(),
            unit,
            shown: terminal || forced,
            in_place: terminal,
            started: Instant::now(),
            last_print: None,
            printed: false,
        }
    }

    /// Reports `done` of `total` (`total` 0: unknown); prints if a second has passed since the
    /// last line. `note` is appended (a phase, like `installing a snapshot`).
    pub fn update(&mut self, done: u64, total: u64, note: &str) {
        if !self.shown || self.last_print.is_some_and(|at| at.elapsed() < PRINT_INTERVAL) {
            return;
        }
        self.last_print = Some(Instant::now());
        self.print(&line(&self.label, self.unit, done, total, self.started.elapsed(), note));
    }

    /// Prints the last line (whatever the interval) and ends it.
    pub fn finish(&mut self, done: u64, total: u64, note: &str) {
        if !self.shown {
            return;
        }
        self.print(&line(&self.label, self.unit, done, total, self.started.elapsed(), note));
        if self.in_place {
            eprintln!();
        }
        self.printed = false;
    }

    fn print(&mut self, text: &str) {
        let mut stderr = std::io::stderr().lock();
        // Padding clears what a longer earlier line left on a terminal.
        let _ = if self.in_place { write!(stderr, "\r{text:<78}") } else { writeln!(stderr, "{text}") };
        let _ = stderr.flush();
        self.printed = true;
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        // A verb that fails mid-way ends the in-place line, so its error starts a line of its own.
        if self.printed && self.in_place {
            eprintln!();
        }
    }
}

/// `label: 412,000/1,000,000 seqnos (41%), 85,000/s, ~7 s left`, from the work done in `elapsed`
/// (the average rate since the start: steadier than the last second's).
pub fn line(label: &str, unit: Unit, done: u64, total: u64, elapsed: Duration, note: &str) -> String {
    let seconds = elapsed.as_secs_f64().max(1e-3);
    let rate = done as f64 / seconds;
    let amount = match (unit, total) {
        (Unit::Seqnos, 0) => format!("{} seqnos", grouped(done)),
        (Unit::Seqnos, _) => format!("{}/{} seqnos", grouped(done), grouped(total)),
        (Unit::Bytes, 0) => format!("{:.1} MiB", mib(done)),
        // Small files in KiB: "0.0/0.0 MiB" says nothing.
        (Unit::Bytes, _) if total < 1 << 20 => {
            format!("{}/{} KiB", done.div_ceil(1024), total.div_ceil(1024))
        }
        (Unit::Bytes, _) => format!("{:.1}/{:.1} MiB", mib(done), mib(total)),
    };
    let mut out = format!("{label}: {amount}");
    if let Some(percent) = (done.min(total) * 100).checked_div(total) {
        out.push_str(&format!(" ({percent}%)"));
    }
    out.push_str(&match unit {
        Unit::Seqnos => format!(", {}/s", grouped(rate.round() as u64)),
        Unit::Bytes => format!(", {:.1} MiB/s", mib(rate.round() as u64)),
    });
    if total > done && rate > 0.0 {
        out.push_str(&format!(", ~{} left", left(((total - done) as f64 / rate).ceil() as u64)));
    }
    if !note.is_empty() {
        out.push_str(&format!(" ({note})"));
    }
    out
}

/// `1234567` as `1,234,567`.
pub fn grouped(value: u64) -> String {
    let digits = value.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn left(seconds: u64) -> String {
    match seconds {
        0..=99 => format!("{seconds} s"),
        100..=5999 => format!("{} min {} s", seconds / 60, seconds % 60),
        _ => format!("{} h {} min", seconds / 3600, seconds % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_has_done_total_percent_rate_and_time_left() {
        assert_eq!(
            line("catchup", Unit::Seqnos, 412_000, 1_000_000, Duration::from_millis(4847), ""),
            "catchup: 412,000/1,000,000 seqnos (41%), 85,001/s, ~7 s left"
        );
        assert_eq!(
            line("backup", Unit::Bytes, 50 << 20, 100 << 20, Duration::from_secs(5), ""),
            "backup: 50.0/100.0 MiB (50%), 10.0 MiB/s, ~5 s left"
        );
        assert_eq!(
            line("catchup", Unit::Seqnos, 10, 10, Duration::from_secs(1), "done"),
            "catchup: 10/10 seqnos (100%), 10/s (done)"
        );
        assert_eq!(
            line("heal", Unit::Seqnos, 0, 0, Duration::ZERO, "installing a snapshot"),
            "heal: 0 seqnos, 0/s (installing a snapshot)"
        );
    }

    #[test]
    fn numbers_are_grouped_and_long_waits_in_minutes() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(1_234_567), "1,234,567");
        assert_eq!(left(59), "59 s");
        assert_eq!(left(125), "2 min 5 s");
        assert_eq!(left(7300), "2 h 1 min");
    }
}
