//! One `tidal` child process: started with its output appended to a log file, signalled only by the
//! pid this harness got from spawning it.

use anyhow::Context;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Instant;

/// The nodes' log filter: info, so tests can find the lines that show an effect (a pull done, a
/// heal nudge); `TIDAL_PROCS_RUST_LOG` overrides it.
const NODE_RUST_LOG: &str = "info,fjall=warn,lsm_tree=warn,openraft=warn";

/// A spawned `tidal` process. Dropping it SIGKILLs the process if it still runs.
pub struct NodeProcess {
    child: Child,
    log: PathBuf,
}

impl NodeProcess {
    /// Starts `binary` with `args`; stdout and stderr are appended to `log` (kept across restarts,
    /// so one file tells a node's whole story), with `RUST_LOG` set to [`NODE_RUST_LOG`].
    pub fn spawn(binary: &Path, args: &[OsString], log: &Path) -> anyhow::Result<NodeProcess> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("open log {}", log.display()))?;
        let rust_log = std::env::var("TIDAL_PROCS_RUST_LOG").unwrap_or_else(|_| NODE_RUST_LOG.to_string());
        let child = Command::new(binary)
            .args(args)
            .env("RUST_LOG", rust_log)
            .stdin(Stdio::null())
            .stdout(file.try_clone().context("clone log handle")?)
            .stderr(file)
            .spawn()
            .with_context(|| format!("start {}", binary.display()))?;
        Ok(NodeProcess { child, log: log.to_path_buf() })
    }

    /// The pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        self.child.try_wait().context("poll child")
    }

    /// SIGKILL, then reap it.
    pub fn kill(mut self) -> anyhow::Result<ExitStatus> {
        self.kill_in_place()
    }

    fn kill_in_place(&mut self) -> anyhow::Result<ExitStatus> {
        // std's `Child::kill` sends SIGKILL to this child's pid (and is a no-op once it exited).
        self.child.kill().context("SIGKILL")?;
        self.child.wait().context("reap child")
    }

    /// SIGTERM (a graceful stop: drain, checkpoint), then waits up to `deadline` for it to exit.
    pub async fn terminate(mut self, deadline: Instant) -> anyhow::Result<ExitStatus> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .context("run kill -TERM")?;
        anyhow::ensure!(status.success(), "kill -TERM {} failed: {status}", self.child.id());
        loop {
            if let Some(status) = self.exited()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                let status = self.kill_in_place()?;
                anyhow::bail!("pid {} did not exit after SIGTERM; killed ({status})", self.child.id());
            }
            tokio::time::sleep(crate::POLL).await;
        }
    }
}

impl Drop for NodeProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.kill_in_place();
        }
    }
}
