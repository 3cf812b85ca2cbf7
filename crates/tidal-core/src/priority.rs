//! The CPU priority of the engine's background threads.
//!
//! The flusher's commit of a frozen overlay and fjall's memtable flushes and compactions come in
//! bursts of CPU (a flush took up to 0.1–0.3 s at 25,000 writes/s here). At the priority of the
//! threads that answer writes, a burst takes a core from them on a small machine, and the writes
//! queued behind it make the ack's tail. A
//! higher nice value on the background threads lets the scheduler prefer the request path whenever
//! both want a core; the background still gets every idle cycle, and under full load a share (the
//! scheduler weighs a thread at nice 10 about a tenth of one at nice 0), so it is slowed, never
//! stopped.
//!
//! Linux keeps a nice value per thread, so the process's other threads keep theirs. A thread's nice
//! value is only ever raised here: an unprivileged process may not lower it again, which is why the
//! node does this once, when its startup replay is done (the replay wants the flusher at full
//! speed). Without `/proc` (elsewhere than Linux) no thread is found and nothing changes.

use std::io;

/// The highest nice value Linux allows (the lowest priority).
pub const NICE_MAX: i32 = 19;

/// The kernel's id of the calling thread (from `/proc/thread-self`), if the platform has one.
pub fn this_thread() -> Option<i32> {
    let link = std::fs::read_link("/proc/thread-self").ok()?;
    link.file_name()?.to_str()?.parse().ok()
}

/// The ids of this process's threads named `name` exactly (the name a thread was given, as
/// `/proc` shows it, at most 15 bytes). Threads that end while the list is read are left out; none
/// without `/proc`.
pub fn threads_named(name: &str) -> io::Result<Vec<i32>> {
    let tasks = match std::fs::read_dir("/proc/self/task") {
        Ok(tasks) => tasks,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(error) => return Err(error),
    };
    let mut found = Vec::new();
    for entry in tasks {
        let Ok(entry) = entry else { continue };
        let Ok(comm) = std::fs::read_to_string(entry.path().join("comm")) else { continue };
        if comm.trim_end_matches('\n') == name {
            if let Some(tid) = entry.file_name().to_str().and_then(|tid| tid.parse().ok()) {
                found.push(tid);
            }
        }
    }
    Ok(found)
}

/// The nice value of thread `tid` of this process (field 19 of its `stat`).
pub fn nice_of(tid: i32) -> io::Result<i32> {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat"))?;
    // The name (field 2) may hold spaces and parentheses: the fields after it start past its last ')'.
    let after_name = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default();
    let bad =
        || io::Error::new(io::ErrorKind::InvalidData, format!("thread {tid}: unreadable stat {stat:?}"));
    after_name.split_whitespace().nth(16).ok_or_else(bad)?.parse().map_err(|_| bad())
}

/// Raises thread `tid`'s nice value by `by` levels (at most to [`NICE_MAX`]; never lowers it) and
/// returns the new value; `Ok(None)` if the thread has ended meanwhile.
pub fn lower(tid: i32, by: i32) -> io::Result<Option<i32>> {
    let current = match nice_of(tid) {
        Ok(nice) => nice,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error),
    };
    let target = current.saturating_add(by.max(0)).min(NICE_MAX);
    if target == current {
        return Ok(Some(current));
    }
    match set_nice(tid, target) {
        Ok(()) => Ok(Some(target)),
        Err(error) if error.raw_os_error() == Some(libc::ESRCH) => Ok(None),
        Err(error) => Err(error),
    }
}

#[cfg(target_os = "linux")]
fn set_nice(tid: i32, nice: i32) -> io::Result<()> {
    let who = libc::id_t::try_from(tid)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("thread id {tid}")))?;
    // SAFETY: setpriority takes plain integers and touches no memory of ours; with PRIO_PROCESS and
    // a thread id it changes only that thread (Linux's per-thread nice value).
    #[allow(unsafe_code)]
    let status = unsafe { libc::setpriority(libc::PRIO_PROCESS, who, nice) };
    if status == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(not(target_os = "linux"))]
fn set_nice(_tid: i32, _nice: i32) -> io::Result<()> {
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread's nice value goes up by the given levels, stops at the maximum, and the calling
    /// thread keeps its own.
    #[test]
    fn lowers_one_thread_only() {
        let mine = this_thread().expect("a thread id on Linux");
        let before = nice_of(mine).expect("own nice value");
        let (tid_tx, tid_rx) = std::sync::mpsc::channel();
        let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
        let other = std::thread::Builder::new()
            .name("tidal-nice-test".into())
            .spawn(move || {
                tid_tx.send(this_thread().expect("a thread id")).expect("test channel");
                let _ = done_rx.recv();
            })
            .expect("spawn");
        let tid = tid_rx.recv().expect("the thread's id");
        assert_eq!(threads_named("tidal-nice-test").expect("list threads"), vec![tid]);
        let start = nice_of(tid).expect("its nice value");
        assert_eq!(lower(tid, 3).expect("lower"), Some((start + 3).min(NICE_MAX)));
        assert_eq!(nice_of(tid).expect("its nice value"), (start + 3).min(NICE_MAX));
        assert_eq!(lower(tid, 100).expect("lower"), Some(NICE_MAX), "capped at {NICE_MAX}");
        assert_eq!(lower(tid, -5).expect("never raised"), Some(NICE_MAX));
        assert_eq!(nice_of(mine).expect("own nice value"), before, "the caller keeps its nice value");
        drop(done_tx);
        other.join().expect("join");
        assert_eq!(lower(tid, 1).expect("an ended thread"), None);
    }
}
