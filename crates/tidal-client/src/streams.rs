//! The streams calls: publish, read, consumer offsets, trim, the list, and a live subscription
//! (Server-Sent Events) that resumes where it left off.

use std::time::Duration;

use serde::Serialize;
use tidal_types::{ConsumerOffset, Published, StreamEventView, StreamEvents, StreamList, Trimmed, TxReply};

use crate::{Client, Error};

/// One event to publish.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Publish {
    /// Any JSON but `null`.
    pub payload: serde_json::Value,
    /// Carried metadata: `None` or a non-empty string.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

#[derive(Serialize)]
struct PublishMany<'a> {
    events: &'a [Publish],
}

/// A path segment with everything but unreserved characters percent-encoded, so any stream or
/// consumer name reaches the server as it is.
pub fn segment(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for byte in name.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'.' | b'_' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

impl Client {
    /// `POST /v1/streams/{stream}/events`: the events as one batch (all or none).
    pub async fn publish(
        &self,
        stream: &str,
        events: &[Publish],
        idempotency_key: Option<&str>,
    ) -> Result<Published, Error> {
        let path = format!("/v1/streams/{}/events", segment(stream));
        let builder = self.request(reqwest::Method::POST, &path).json(&PublishMany { events });
        Self::send(Self::with_key(builder, idempotency_key)).await
    }

    /// `GET /v1/streams/{stream}/events?after=N&limit=L`.
    pub async fn read_stream(&self, stream: &str, after: u64, limit: usize) -> Result<StreamEvents, Error> {
        let path = format!("/v1/streams/{}/events?after={after}&limit={limit}", segment(stream));
        Self::send(self.request(reqwest::Method::GET, &path)).await
    }

    /// `GET /v1/streams/{stream}/events?consumer=name&limit=L`: after the consumer's saved offset.
    pub async fn read_consumer(
        &self,
        stream: &str,
        consumer: &str,
        limit: usize,
    ) -> Result<StreamEvents, Error> {
        let path =
            format!("/v1/streams/{}/events?consumer={}&limit={limit}", segment(stream), segment(consumer));
        Self::send(self.request(reqwest::Method::GET, &path)).await
    }

    /// `PUT /v1/streams/{stream}/consumers/{name}`: saves `offset` if it is ahead of the saved one.
    pub async fn save_offset(
        &self,
        stream: &str,
        consumer: &str,
        offset: u64,
    ) -> Result<ConsumerOffset, Error> {
        let path = format!("/v1/streams/{}/consumers/{}", segment(stream), segment(consumer));
        let body = serde_json::json!({ "offset": offset });
        Self::send(self.request(reqwest::Method::PUT, &path).json(&body)).await
    }

    /// `GET /v1/streams/{stream}/consumers/{name}`.
    pub async fn get_offset(&self, stream: &str, consumer: &str) -> Result<ConsumerOffset, Error> {
        let path = format!("/v1/streams/{}/consumers/{}", segment(stream), segment(consumer));
        Self::send(self.request(reqwest::Method::GET, &path)).await
    }

    /// `POST /v1/streams/{stream}/trim`: deletes offsets at or below `through`.
    pub async fn trim(&self, stream: &str, through: u64) -> Result<Trimmed, Error> {
        let path = format!("/v1/streams/{}/trim", segment(stream));
        let body = serde_json::json!({ "through": through });
        Self::send(self.request(reqwest::Method::POST, &path).json(&body)).await
    }

    /// `POST /v1/tx`: the ops (`{"op": "put_item", ...}` and the rest of the API reference) as one
    /// batch, all or nothing.
    pub async fn tx(
        &self,
        ops: &[serde_json::Value],
        idempotency_key: Option<&str>,
    ) -> Result<TxReply, Error> {
        let builder = self.request(reqwest::Method::POST, "/v1/tx").json(&serde_json::json!({ "ops": ops }));
        Self::send(Self::with_key(builder, idempotency_key)).await
    }

    /// `GET /v1/streams?after=name&limit=L`.
    pub async fn streams(&self, after: &str, limit: usize) -> Result<StreamList, Error> {
        let path = format!("/v1/streams?after={}&limit={limit}", segment(after));
        Self::send(self.request(reqwest::Method::GET, &path)).await
    }

    /// `GET /v1/streams/{stream}/subscribe`, from after `after`. The subscription has no overall
    /// timeout (it lives as long as the stream does); connecting gives up after 10 s.
    pub async fn subscribe(&self, stream: &str, after: u64) -> Result<Subscription, Error> {
        let http = reqwest::Client::builder().connect_timeout(Duration::from_secs(10)).build()?;
        let url = format!("{}/v1/streams/{}/subscribe", self.base, segment(stream));
        let mut builder = http.get(url).header("Last-Event-ID", after.to_string());
        if let Some(token) = &self.token {
            builder = builder.bearer_auth(token);
        }
        let reply = Self::send_checked(builder).await?;
        Ok(Subscription { reply, buffer: Vec::new(), last_id: after })
    }
}

/// What a subscription delivers.
#[derive(Clone, Debug, PartialEq)]
pub enum Delivery {
    /// An event, in offset order.
    Event(StreamEventView),
    /// The server's last word before it ended the subscription (`lagging`, `closing`), with its
    /// data; resume with [`Subscription::last_id`].
    Ended {
        /// The SSE event name.
        reason: String,
        /// Its data (JSON).
        data: serde_json::Value,
    },
}

/// A live subscription.
pub struct Subscription {
    reply: reqwest::Response,
    buffer: Vec<u8>,
    last_id: u64,
}

impl Subscription {
    /// The offset of the last event delivered (or where it started): resume after it.
    pub fn last_id(&self) -> u64 {
        self.last_id
    }

    /// The next delivery; `None` once the server closed the stream.
    pub async fn next(&mut self) -> Result<Option<Delivery>, Error> {
        loop {
            while let Some(end) = find_blank_line(&self.buffer) {
                let block: Vec<u8> = self.buffer.drain(..end.1).collect();
                if let Some(delivery) = self.parse(&block[..end.0])? {
                    return Ok(Some(delivery));
                }
            }
            match self.reply.chunk().await? {
                Some(chunk) => self.buffer.extend_from_slice(&chunk),
                None => return Ok(None),
            }
        }
    }

    /// One SSE block: `None` for a comment (keep-alive).
    fn parse(&mut self, block: &[u8]) -> Result<Option<Delivery>, Error> {
        let text = String::from_utf8_lossy(block);
        let (mut event, mut data, mut id) = (None, String::new(), None);
        for line in text.lines() {
            if let Some(value) = line.strip_prefix("data:") {
                if !data.is_empty() {
                    data.push('\n');
                }
                data.push_str(value.strip_prefix(' ').unwrap_or(value));
            } else if let Some(value) = line.strip_prefix("event:") {
                event = Some(value.trim().to_string());
            } else if let Some(value) = line.strip_prefix("id:") {
                id = value.trim().parse::<u64>().ok();
            }
        }
        if data.is_empty() && event.is_none() {
            return Ok(None);
        }
        let bad = |e: serde_json::Error| Error::from_reply(200, format!("bad SSE data: {e}").as_bytes());
        match event {
            None => {
                let view: StreamEventView = serde_json::from_str(&data).map_err(bad)?;
                self.last_id = id.unwrap_or(view.offset);
                Ok(Some(Delivery::Event(view)))
            }
            Some(reason) => {
                let data = serde_json::from_str(&data).map_err(bad)?;
                Ok(Some(Delivery::Ended { reason, data }))
            }
        }
    }
}

/// The end of the first block in `buffer` and the end of its blank line.
fn find_blank_line(buffer: &[u8]) -> Option<(usize, usize)> {
    let at = buffer.windows(2).position(|w| w == b"\n\n")?;
    Some((at, at + 2))
}
