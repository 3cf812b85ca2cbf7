//! A small HTTP/1 client over turmoil's TCP (reqwest and `tidal_client` need OS sockets): one
//! connection per request, every request bounded by a simulated-time deadline.

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use std::time::Duration;

/// An answer: status and body.
#[derive(Debug)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// Body bytes.
    pub body: Vec<u8>,
}

impl Answer {
    /// The body as JSON.
    pub fn json<T: serde::de::DeserializeOwned>(&self) -> anyhow::Result<T> {
        Ok(serde_json::from_slice(&self.body)?)
    }
}

/// Sends one request to `host` (`name:port`) and reads the whole answer within `timeout`.
pub async fn request(
    host: &str,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
    headers: &[(&str, String)],
    timeout: Duration,
) -> anyhow::Result<Answer> {
    match tokio::time::timeout(timeout, request_inner(host, method, path, body, headers)).await {
        Ok(answer) => answer,
        Err(_) => anyhow::bail!("{method} {host}{path}: no answer within {timeout:?}"),
    }
}

async fn request_inner(
    host: &str,
    method: &str,
    path: &str,
    body: Option<Vec<u8>>,
    headers: &[(&str, String)],
) -> anyhow::Result<Answer> {
    let stream = turmoil::net::TcpStream::connect(host).await?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream)).await?;
    let driver = tokio::task::spawn_local(async move {
        let _ = connection.await;
    });
    let mut builder = hyper::Request::builder().method(method).uri(path).header("host", host);
    if body.is_some() {
        builder = builder.header("content-type", "application/json");
    }
    for (name, value) in headers {
        builder = builder.header(*name, value.as_str());
    }
    let request = builder.body(Full::new(Bytes::from(body.unwrap_or_default())))?;
    let result = async {
        let response = sender.send_request(request).await?;
        let status = response.status().as_u16();
        let body = response.into_body().collect().await?.to_bytes().to_vec();
        anyhow::Ok(Answer { status, body })
    }
    .await;
    driver.abort();
    result
}
