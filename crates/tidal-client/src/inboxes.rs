//! The inbox calls: send, receive (which may wait), ack, discard, close and show.
//!
//! A receive is the delicate one. It may be held by the node for up to its `wait_ms` before it
//! answers, so it gets its own deadline, longer than the wait, instead of the client's. Nothing
//! arriving in time is an answer (204, `None`), not an error. And a receive without a lease
//! consumes what it takes: when its answer is lost (a transport error), only a retry with the same
//! `receive_id` gets those messages back.

use std::time::Duration;

use tidal_types::{
    InboxAck, InboxAcked, InboxClosed, InboxDiscard, InboxDiscarded, InboxReceive, InboxReceived, InboxSend,
    InboxSent, InboxView,
};

use crate::streams::segment;
use crate::{Client, Error};

/// How much longer than its `wait_ms` a receive may take before the client gives up: the time to
/// reach the leader through a follower, journal the receive and send the reply back.
const RECEIVE_TIMEOUT_SLACK: Duration = Duration::from_secs(30);

impl Client {
    /// `POST /v1/inboxes/{owner}/messages`: `payload` (any JSON but null) on `topic`. A resend
    /// with the same `message_id` stores nothing and answers `duplicate: true`.
    pub async fn inbox_send(
        &self,
        owner: &str,
        topic: &str,
        payload: serde_json::Value,
        message_id: &str,
    ) -> Result<InboxSent, Error> {
        let body = InboxSend { topic: topic.to_string(), payload, message_id: message_id.to_string() };
        let builder = self.request(reqwest::Method::POST, &inbox_path(owner, "/messages")).json(&body);
        Self::send(builder).await
    }

    /// `POST /v1/inboxes/{owner}/receive`: the oldest message across `receive.topics`, waiting up
    /// to `receive.wait_ms` for one; `None` when none came in time. The request gives up after
    /// `wait_ms` plus [`RECEIVE_TIMEOUT_SLACK`], whatever the client's own timeout.
    pub async fn inbox_receive(
        &self,
        owner: &str,
        receive: &InboxReceive,
    ) -> Result<Option<InboxReceived>, Error> {
        let builder = self
            .request(reqwest::Method::POST, &inbox_path(owner, "/receive"))
            .timeout(receive_timeout(receive.wait_ms))
            .json(receive);
        let reply = Self::send_checked(builder).await?;
        if reply.status() == reqwest::StatusCode::NO_CONTENT {
            return Ok(None);
        }
        Ok(Some(reply.json::<InboxReceived>().await?))
    }

    /// `POST /v1/inboxes/{owner}/ack`: consumes what the leased receive `receive_id` took.
    pub async fn inbox_ack(&self, owner: &str, receive_id: &str) -> Result<InboxAcked, Error> {
        let body = InboxAck { receive_id: receive_id.to_string() };
        Self::send(self.request(reqwest::Method::POST, &inbox_path(owner, "/ack")).json(&body)).await
    }

    /// `POST /v1/inboxes/{owner}/discard`: drops the unconsumed messages of `topic` with an
    /// `inbox_seq` at or below `through`.
    pub async fn inbox_discard(
        &self,
        owner: &str,
        topic: &str,
        through: u64,
    ) -> Result<InboxDiscarded, Error> {
        let body = InboxDiscard { topic: topic.to_string(), through };
        Self::send(self.request(reqwest::Method::POST, &inbox_path(owner, "/discard")).json(&body)).await
    }

    /// `DELETE /v1/inboxes/{owner}`: closes the inbox; what it still held is dropped and counted.
    pub async fn inbox_close(&self, owner: &str) -> Result<InboxClosed, Error> {
        Self::send(self.request(reqwest::Method::DELETE, &inbox_path(owner, ""))).await
    }

    /// `GET /v1/inboxes/{owner}`: its live topics and counts (`not_found` if it never existed).
    pub async fn inbox_show(&self, owner: &str) -> Result<InboxView, Error> {
        Self::send(self.request(reqwest::Method::GET, &inbox_path(owner, ""))).await
    }
}

/// The path of `owner`'s inbox followed by `tail` (`""` or `/messages`, ...): the owner
/// percent-encoded, so a `/` or `?` in it names the owner and not another route.
fn inbox_path(owner: &str, tail: &str) -> String {
    format!("/v1/inboxes/{}{tail}", segment(owner))
}

/// The deadline of a receive that may wait `wait_ms`.
fn receive_timeout(wait_ms: u64) -> Duration {
    Duration::from_millis(wait_ms).saturating_add(RECEIVE_TIMEOUT_SLACK)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tidal_types::{InboxMessageView, InboxReceive, InboxReceived};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use crate::{Client, Error};

    /// Answers one request on a loopback port with `reply` (a whole HTTP response) after `delay`;
    /// returns the base URL and the task that yields the request it got, as text.
    async fn serve_once(reply: String, delay: Duration) -> (String, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.unwrap();
            let mut request = Vec::new();
            let mut buffer = [0u8; 4096];
            while !is_whole(&request) {
                let read = stream.read(&mut buffer).await.unwrap();
                assert!(read > 0, "the client closed before sending a whole request");
                request.extend_from_slice(&buffer[..read]);
            }
            tokio::time::sleep(delay).await;
            stream.write_all(reply.as_bytes()).await.unwrap();
            stream.shutdown().await.unwrap();
            String::from_utf8(request).unwrap()
        });
        (base, task)
    }

    /// Whether `request` holds its head and as much body as its Content-Length says.
    fn is_whole(request: &[u8]) -> bool {
        let text = String::from_utf8_lossy(request);
        let Some((head, body)) = text.split_once("\r\n\r\n") else { return false };
        let length = head.lines().find_map(|line| {
            let line = line.to_ascii_lowercase();
            line.strip_prefix("content-length:").map(|value| value.trim().parse::<usize>().unwrap())
        });
        body.len() >= length.unwrap_or(0)
    }

    fn reply(status: &str, body: &str) -> String {
        format!("HTTP/1.1 {status}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}", body.len())
    }

    fn receive(wait_ms: u64) -> InboxReceive {
        InboxReceive {
            topics: vec!["jobs".into()],
            wait_ms,
            receive_id: "r-1".into(),
            lease_ms: None,
            max: None,
        }
    }

    #[tokio::test]
    async fn nothing_in_time_is_none_and_the_owner_is_one_path_segment() {
        let (base, server) = serve_once(reply("204 No Content", ""), Duration::ZERO).await;
        let client = Client::new(base, Some("secret".into()));
        let got = client.inbox_receive("a/b c", &receive(0)).await.unwrap();
        assert_eq!(got, None);
        let request = server.await.unwrap();
        assert!(request.starts_with("POST /v1/inboxes/a%2Fb%20c/receive HTTP/1.1\r\n"), "{request}");
        assert!(request.to_ascii_lowercase().contains("authorization: bearer secret\r\n"), "{request}");
        let body = request.split_once("\r\n\r\n").unwrap().1;
        assert_eq!(serde_json::from_str::<InboxReceive>(body).unwrap(), receive(0));
    }

    #[tokio::test]
    async fn a_delivery_is_some() {
        let delivered = InboxReceived {
            receive_id: "r-1".into(),
            message: InboxMessageView {
                topic: "jobs".into(),
                inbox_seq: 42,
                message_id: "m-7".into(),
                sender: "alice".into(),
                payload: serde_json::json!({"n": 7}),
                created_at_ms: 1_700_000_000_000,
            },
            lease_until_ms: None,
            messages: None,
            seqno: 43,
        };
        let body = serde_json::to_string(&delivered).unwrap();
        let (base, _server) = serve_once(reply("200 OK", &body), Duration::ZERO).await;
        let got = Client::new(base, None).inbox_receive("bob", &receive(0)).await.unwrap();
        assert_eq!(got, Some(delivered));
    }

    #[tokio::test]
    async fn a_receive_outwaits_the_clients_own_timeout() {
        // The client gives up on other calls after 100 ms; the node holds this receive for 300 ms.
        let (base, _server) = serve_once(reply("204 No Content", ""), Duration::from_millis(300)).await;
        let client = Client::with_timeout(base, None, Duration::from_millis(100));
        assert_eq!(client.inbox_receive("bob", &receive(250)).await.unwrap(), None);
    }

    #[tokio::test]
    async fn a_refusal_carries_the_contract_code() {
        let body = r#"{"error":{"code":"lease_lost","message":"the lease ran out"}}"#;
        let (base, _server) = serve_once(reply("409 Conflict", body), Duration::ZERO).await;
        let error = Client::new(base, None).inbox_ack("bob", "r-1").await.unwrap_err();
        assert!(matches!(&error, Error::Api { status: 409, .. }), "{error}");
        assert_eq!(error.code(), Some("lease_lost"));
    }
}
