//! One stand-alone node (no cluster), for crash and restart tests of a single process.

use crate::process::NodeProcess;
use anyhow::Context;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitStatus;
use std::time::Instant;
use tidal_client::Client;

/// A `tidal serve --data-dir DIR --http 127.0.0.1:PORT ARGS...` process that answers `/readyz`.
pub struct SingleNode {
    process: NodeProcess,
    /// Its HTTP port, held for its life (restarts bind it again).
    _port: crate::PortLease,
    url: String,
    client: Client,
}

impl SingleNode {
    /// Starts the node on a free loopback port and waits until `/readyz` answers 200 (it has
    /// recovered its WAL and replayed). `args` are extra `tidal serve` arguments.
    pub async fn start(
        binary: &Path,
        data_dir: &Path,
        log: &Path,
        args: &[&str],
    ) -> anyhow::Result<SingleNode> {
        let lease = crate::PortLease::take(1)?;
        let port = lease.port(0);
        let mut argv: Vec<OsString> = vec!["serve".into(), "--data-dir".into(), data_dir.into()];
        argv.extend(["--http".into(), format!("127.0.0.1:{port}").into()]);
        argv.extend(args.iter().map(OsString::from));
        let mut process = NodeProcess::spawn(binary, &argv, log)?;
        let url = format!("http://127.0.0.1:{port}");
        let http = reqwest::Client::new();
        let deadline = Instant::now() + crate::DEADLINE;
        loop {
            if let Some(status) = process.exited()? {
                anyhow::bail!("tidal exited during startup ({status}):\n{}", crate::log_tail(log, 30));
            }
            let ready = http.get(format!("{url}/readyz")).send().await;
            if ready.is_ok_and(|reply| reply.status().is_success()) {
                break;
            }
            anyhow::ensure!(
                Instant::now() < deadline,
                "tidal did not become ready within {:?}:\n{}",
                crate::DEADLINE,
                crate::log_tail(log, 30)
            );
            tokio::time::sleep(crate::POLL).await;
        }
        Ok(SingleNode { process, _port: lease, client: Client::new(url.clone(), None), url })
    }

    /// Its base URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// A client for it.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// Its log file.
    pub fn log(&self) -> PathBuf {
        self.process.log().to_path_buf()
    }

    /// SIGKILL.
    pub fn kill(self) -> anyhow::Result<ExitStatus> {
        self.process.kill()
    }

    /// SIGTERM and wait for the exit status.
    pub async fn terminate(self) -> anyhow::Result<ExitStatus> {
        self.process.terminate(Instant::now() + crate::DEADLINE).await.context("graceful stop")
    }
}
