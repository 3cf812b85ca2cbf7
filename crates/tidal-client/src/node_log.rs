//! The end of a node's log, for error messages (`tidal cluster up`, the process harness).

use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// At most this much of the end of a log is read.
const TAIL_BYTES_MAX: u64 = 64 * 1024;

/// The last `lines` lines of the log at `path` (read from its last 64 KiB) without backtrace frames,
/// or why it cannot be read. Under `RUST_BACKTRACE=1` (as in CI) a node's exit error or panic is
/// followed by dozens of frames that would push the message itself out of a short tail.
pub fn tail(path: &Path, lines: usize) -> String {
    let read = || -> std::io::Result<String> {
        let mut file = std::fs::File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES_MAX)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let kept = without_backtraces(&text);
            kept[kept.len().saturating_sub(lines)..].join("\n")
        }
        Err(error) => format!("(cannot read the log: {error})"),
    }
}

/// The lines of `text` without Rust backtraces: a heading (anyhow's `Stack backtrace:`, a panic's
/// `stack backtrace:`) and the numbered frames and `at` locations after it. An error's numbered
/// `Caused by:` list, which has no heading before it, is kept.
fn without_backtraces(text: &str) -> Vec<&str> {
    let mut in_trace = false;
    let mut kept = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim_start();
        if trimmed.eq_ignore_ascii_case("stack backtrace:") {
            in_trace = true;
            continue;
        }
        let indented = trimmed.len() < line.len();
        let numbered = trimmed.split_once(": ").is_some_and(|(n, _)| n.bytes().all(|b| b.is_ascii_digit()));
        if in_trace && indented && (numbered || trimmed.starts_with("at ")) {
            continue;
        }
        in_trace = false;
        kept.push(line);
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::tail;

    #[test]
    fn a_tail_drops_backtrace_frames_and_keeps_the_error_and_its_causes() {
        let dir = std::env::temp_dir().join(format!("tidal-node-log-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("n3.log");
        let mut text = String::from(
            "INFO starting\nError: bind HTTP address 127.0.0.1:1\n\nCaused by:\n    0: the socket\n    \
             1: Address already in use (os error 98)\n\nStack backtrace:\n",
        );
        for frame in 0..60 {
            text.push_str(&format!("  {frame}: tidal::serve\n             at ./src/main.rs:153:10\n"));
        }
        std::fs::write(&log, &text).unwrap();
        let got = tail(&log, 40);
        assert!(got.contains("Error: bind HTTP address"), "{got}");
        assert!(got.contains("0: the socket") && got.contains("1: Address already in use"), "{got}");
        assert!(!got.contains("main.rs") && !got.contains("acktrace"), "{got}");
        assert!(!tail(&log, 3).contains("INFO starting"), "at most the last lines");
        text.push_str("thread 'main' panicked at src/x.rs:1:1:\nboom\nstack backtrace:\n");
        for frame in 0..60 {
            text.push_str(&format!(
                "   {frame}: std::panicking::begin_panic\n             at /rustc/x/panicking.rs:1:1\n"
            ));
        }
        std::fs::write(&log, text).unwrap();
        let got = tail(&log, 40);
        assert!(got.ends_with("boom") && !got.contains("begin_panic"), "{got}");
        assert!(tail(&dir.join("missing.log"), 5).starts_with("(cannot read the log"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
