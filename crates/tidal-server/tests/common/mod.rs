//! A node started in-process on a loopback port, for HTTP tests.
#![allow(dead_code, clippy::unwrap_used)]

pub mod cluster;
pub mod schema;

use std::path::Path;
use std::time::Duration;
use tidal_client::Client;
use tidal_server::config::{ServeArgs, ServeConfig};

/// Test logs through the test writer, at `RUST_LOG` (default `warn`); once per test binary.
pub fn trace() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()))
        .with_test_writer()
        .try_init();
}

pub struct TestNode {
    pub url: String,
    pub client: Client,
    pub http: reqwest::Client,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

pub fn config(dir: &Path, dimension: u32) -> ServeConfig {
    let args =
        ServeArgs { data_dir: Some(dir.to_path_buf()), dimension: Some(dimension), ..Default::default() };
    let mut config = ServeConfig::resolve(&args).unwrap();
    // Preallocate a little of each segment: the path is exercised without writing 128 MiB per node.
    config.wal_preallocate_bytes = TEST_PREALLOCATE_BYTES;
    config
}

/// Zeros each test node writes ahead in its WAL segments (decisions/017).
pub const TEST_PREALLOCATE_BYTES: u64 = 256 * 1024;

impl TestNode {
    pub async fn start(config: ServeConfig) -> TestNode {
        TestNode::start_with_token(config, None).await
    }

    pub async fn start_with_token(config: ServeConfig, token: Option<String>) -> TestNode {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (shutdown, on_shutdown) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(tidal_server::run(config, listener, None, async move {
            let _ = on_shutdown.await;
        }));
        let http = reqwest::Client::new();
        // The listener is bound before `run` starts, so connections queue; wait until the node has
        // replayed and answers.
        for _ in 0..600 {
            if task.is_finished() {
                panic!("node exited during startup: {:?}", task.await);
            }
            if http.get(format!("{url}/healthz")).send().await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        TestNode {
            client: Client::new(url.clone(), token),
            url,
            http,
            shutdown: Some(shutdown),
            task: Some(task),
        }
    }

    pub async fn stop(mut self) {
        let _ = self.shutdown.take().unwrap().send(());
        self.task.take().unwrap().await.unwrap().unwrap();
    }

    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&str>,
        headers: &[(&str, &str)],
    ) -> (u16, serde_json::Value) {
        let mut builder = self.http.request(method, format!("{}{}", self.url, path));
        for (name, value) in headers {
            builder = builder.header(*name, *value);
        }
        if let Some(body) = body {
            builder = builder.header("content-type", "application/json").body(body.to_string());
        }
        let reply = builder.send().await.unwrap();
        let status = reply.status().as_u16();
        let text = reply.text().await.unwrap();
        let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
        (status, json)
    }
}

pub fn error_code(body: &serde_json::Value) -> &str {
    body["error"]["code"].as_str().unwrap_or("<no code>")
}
