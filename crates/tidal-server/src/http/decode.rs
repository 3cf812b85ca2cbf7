//! The request body decoders of the main write routes, as pure functions of the body's bytes and
//! the node's limits: JSON to the records a write submits, every check that needs no state done.
//! The handlers call them; the fuzz target `http_request` (fuzz/) feeds them arbitrary bytes.
//!
//! Each answers an [`ApiError`] (a 4xx with its contract code) for any input it refuses, and never
//! panics: a body is client input.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::value::RawValue;
use tidal_core::{PublishEvent, SignalEvent};
use tidal_types::{ItemPut, SignalIn, SignalsRequest, USER_BYTES_MAX};

use super::streams::{check_key, check_stream_name, compact_json};
use super::{check_name, check_signal, metadata_bytes, parse_json, prefix, AppResult};
use crate::config::ServeConfig;
use crate::error::ApiError;

/// What the decoders check a body against: the node's configured limits, and its clock.
#[derive(Clone, Debug)]
pub struct Limits {
    /// The signal kinds and their default weights.
    pub signal_kinds: BTreeMap<String, f64>,
    /// Most signals per request.
    pub signals_per_request_max: usize,
    /// Most events per publish.
    pub stream_events_per_request_max: usize,
    /// Largest event payload, compacted.
    pub stream_event_bytes_max: usize,
    /// Largest inbox message payload, compacted.
    pub inbox_payload_bytes_max: usize,
    /// The node's clock (unix ms), for a signal's `ts` bound.
    pub now_ms: i64,
}

impl Limits {
    /// A node's limits, with its WAL clock read now.
    pub fn of(config: &ServeConfig) -> Limits {
        Limits {
            signal_kinds: config.signal_kinds.clone(),
            signals_per_request_max: config.signals_per_request_max,
            stream_events_per_request_max: config.stream_events_per_request_max,
            stream_event_bytes_max: config.stream_event_bytes_max,
            inbox_payload_bytes_max: config.inbox.payload_bytes_max as usize,
            now_ms: i64::try_from(config.io.wal_clock.now_ms()).unwrap_or(i64::MAX),
        }
    }
}

/// `POST /v1/signals`: the events, checked.
pub fn signals(bytes: &[u8], limits: &Limits) -> AppResult<Vec<SignalEvent>> {
    let request: SignalsRequest = parse_json(bytes)?;
    signal_events(limits, request.signals)
}

/// The signals of a write, checked: 1..=max of them, known kinds, bounded finite weights, plausible
/// times. The signals route and the tx's `signals` op both check here.
pub fn signal_events(limits: &Limits, signals: Vec<SignalIn>) -> AppResult<Vec<SignalEvent>> {
    if signals.is_empty() {
        return Err(ApiError::invalid("signals must not be empty"));
    }
    if signals.len() > limits.signals_per_request_max {
        let max = limits.signals_per_request_max;
        return Err(ApiError::too_large(format!("at most {max} signals per request")));
    }
    let mut events = Vec::with_capacity(signals.len());
    for (i, signal) in signals.into_iter().enumerate() {
        check_name("user", &signal.user, USER_BYTES_MAX).map_err(|e| prefix(e, i))?;
        let Some(default_weight) = limits.signal_kinds.get(&signal.kind) else {
            return Err(ApiError::bad_request(
                tidal_types::ErrorCode::UnknownSignalKind,
                format!("signals[{i}]: unknown signal kind {:?}", signal.kind),
            ));
        };
        let weight = signal.weight.unwrap_or(*default_weight);
        check_signal(weight, signal.ts, limits.now_ms).map_err(|e| prefix(e, i))?;
        events.push(SignalEvent {
            user: signal.user,
            item: signal.item,
            kind: signal.kind,
            weight,
            ts_ms: signal.ts,
        });
    }
    Ok(events)
}

/// `PUT /v1/items/{id}`: the metadata as stored.
pub fn item_metadata(bytes: &[u8]) -> AppResult<Vec<u8>> {
    let request: ItemPut = parse_json(bytes)?;
    metadata_bytes(&request.metadata)
}

/// `{"payload", "key"}` or `{"events": [...]}`.
/// Body of a publish: one event (`payload`, `key`) or several (`events`), not both.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct PublishBody {
    /// One event's payload: any JSON but null.
    #[schemars(with = "Option<serde_json::Value>")]
    payload: Option<Box<RawValue>>,
    /// That event's key.
    #[serde(default)]
    key: Option<String>,
    /// Several events, each with its own payload and key.
    events: Option<Vec<EventIn>>,
}

/// One event of `events`.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct EventIn {
    /// Any JSON but null.
    #[schemars(with = "Option<serde_json::Value>")]
    payload: Option<Box<RawValue>>,
    #[serde(default)]
    key: Option<String>,
}

/// `POST /v1/streams/{stream}/events`: the events, checked: 1..=max events, keys, payload sizes.
pub fn publish(bytes: &[u8], limits: &Limits) -> AppResult<Vec<PublishEvent>> {
    let body: PublishBody = parse_json(bytes)?;
    let list = match (body.payload, body.events) {
        (Some(payload), None) => vec![EventIn { payload: Some(payload), key: body.key }],
        (None, Some(events)) if body.key.is_none() => events,
        (None, Some(_)) => return Err(ApiError::invalid("a key goes on each event of \"events\"")),
        (Some(_), Some(_)) => return Err(ApiError::invalid("send \"payload\" or \"events\", not both")),
        (None, None) => return Err(ApiError::invalid("\"payload\" (not null) or \"events\" is required")),
    };
    if list.is_empty() {
        return Err(ApiError::invalid("events must not be empty"));
    }
    if list.len() > limits.stream_events_per_request_max {
        let max = limits.stream_events_per_request_max;
        return Err(ApiError::too_large(format!("at most {max} events per publish")));
    }
    let mut events = Vec::with_capacity(list.len());
    for (i, event) in list.into_iter().enumerate() {
        let at = |e: ApiError| ApiError { message: format!("events[{i}]: {}", e.message), ..e };
        events.push(publish_event(limits, event.payload, event.key).map_err(at)?);
    }
    Ok(events)
}

/// One event to publish, checked: its key, a payload that is not null, compacted, within
/// `stream_event_bytes_max`. The publish route and the tx's `publish` op both build events here.
pub fn publish_event(
    limits: &Limits,
    payload: Option<Box<RawValue>>,
    key: Option<String>,
) -> AppResult<PublishEvent> {
    check_key(&key)?;
    let payload = compact_json(payload.ok_or_else(|| ApiError::invalid("payload must not be null"))?.get());
    let max = limits.stream_event_bytes_max;
    if payload.len() > max {
        return Err(ApiError::too_large(format!("payload over {max} bytes")));
    }
    Ok(PublishEvent { key, payload })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SendBody {
    topic: String,
    payload: Option<Box<RawValue>>,
    message_id: String,
}

/// What an inbox send carries, checked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InboxMessage {
    /// The topic.
    pub topic: String,
    /// The sender's id for it (deduplication).
    pub message_id: String,
    /// The payload, compacted.
    pub payload: Vec<u8>,
}

/// `POST /v1/inboxes/{owner}/messages`: the topic, the message id and the compacted payload, checked.
pub fn inbox_send(bytes: &[u8], limits: &Limits) -> AppResult<InboxMessage> {
    let body: SendBody = parse_json(bytes)?;
    check_stream_name("topic", &body.topic)?;
    super::inboxes::check_id("message_id", &body.message_id)?;
    let payload =
        compact_json(body.payload.ok_or_else(|| ApiError::invalid("payload must not be null"))?.get());
    if payload.len() > limits.inbox_payload_bytes_max {
        return Err(ApiError::too_large(format!("payload over {} bytes", limits.inbox_payload_bytes_max)));
    }
    Ok(InboxMessage { topic: body.topic, message_id: body.message_id, payload })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const NOW_MS: i64 = 1_764_000_000_000;

    fn limits() -> Limits {
        Limits {
            signal_kinds: [("click".to_string(), 1.0)].into_iter().collect(),
            signals_per_request_max: 3,
            stream_events_per_request_max: 2,
            stream_event_bytes_max: 32,
            inbox_payload_bytes_max: 32,
            now_ms: NOW_MS,
        }
    }

    /// Runs `body` through every decoder; each answers or refuses with a 4xx, never panics.
    fn all(body: &[u8]) -> [Result<(), ApiError>; 4] {
        let limits = limits();
        [
            signals(body, &limits).map(drop),
            item_metadata(body).map(drop),
            publish(body, &limits).map(drop),
            inbox_send(body, &limits).map(drop),
        ]
    }

    fn refused_with_4xx(body: &[u8]) -> bool {
        all(body).iter().all(|result| result.as_ref().is_err_and(|e| e.status.is_client_error()))
    }

    const VALID: [&str; 4] = [
        r#"{"signals":[{"user":"u","item":1,"kind":"click","weight":2.5,"ts":1764000000000}]}"#,
        r#"{"metadata":{"title":"hello","tags":["a"]}}"#,
        r#"{"events":[{"payload":{"id":9},"key":"k"},{"payload":"text"}]}"#,
        r#"{"topic":"t","payload":[1, 2],"message_id":"m"}"#,
    ];

    #[test]
    fn valid_bodies_decode() {
        let limits = limits();
        let events = signals(VALID[0].as_bytes(), &limits).unwrap();
        assert_eq!((events[0].item, events[0].weight, events[0].ts_ms), (1, 2.5, Some(1_764_000_000_000)));
        assert_eq!(item_metadata(VALID[1].as_bytes()).unwrap(), br#"{"tags":["a"],"title":"hello"}"#);
        let published = publish(VALID[2].as_bytes(), &limits).unwrap();
        assert_eq!(published[0].payload, br#"{"id":9}"#);
        let message = inbox_send(VALID[3].as_bytes(), &limits).unwrap();
        assert_eq!((message.topic.as_str(), message.payload.as_slice()), ("t", &b"[1,2]"[..]));
    }

    #[test]
    fn every_truncation_is_refused() {
        for (decoder, body) in VALID.iter().enumerate() {
            for end in 0..body.len() {
                let result = &all(&body.as_bytes()[..end])[decoder];
                assert!(result.as_ref().is_err_and(|e| e.status.is_client_error()), "{:?}", &body[..end]);
            }
        }
    }

    #[test]
    fn garbage_and_mutations_are_refused_or_decoded_never_a_panic() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        for _ in 0..2000 {
            let len = (next() % 200) as usize;
            let garbage: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            assert!(refused_with_4xx(&garbage), "{garbage:?}");
        }
        for body in VALID {
            for _ in 0..500 {
                let mut mutated = body.as_bytes().to_vec();
                let at = (next() % mutated.len() as u64) as usize;
                mutated[at] = next() as u8;
                for result in all(&mutated) {
                    assert!(result.is_ok() || result.as_ref().is_err_and(|e| e.status.is_client_error()));
                }
            }
        }
        for deep in [vec![b'['; 100_000], vec![b'{'; 100_000], b"{\"metadata\":".repeat(10_000)] {
            assert!(refused_with_4xx(&deep), "deep nesting is refused, not a stack overflow");
        }
    }

    #[test]
    fn oversize_input_is_413_and_out_of_range_input_400() {
        let limits = limits();
        let status = |result: AppResult<()>| result.unwrap_err().status.as_u16();
        let signal = r#"{"user":"u","item":1,"kind":"click"}"#;
        let four = format!(r#"{{"signals":[{}]}}"#, [signal; 4].join(","));
        assert_eq!(status(signals(four.as_bytes(), &limits).map(drop)), 413);
        let heavy = r#"{"signals":[{"user":"u","item":1,"kind":"click","weight":1e308}]}"#;
        assert_eq!(status(signals(heavy.as_bytes(), &limits).map(drop)), 400);
        let future =
            format!(r#"{{"signals":[{{"user":"u","item":1,"kind":"click","ts":{}}}]}}"#, NOW_MS + 3_600_001);
        assert_eq!(status(signals(future.as_bytes(), &limits).map(drop)), 400);
        let big = format!(r#"{{"payload":"{}"}}"#, "x".repeat(40));
        assert_eq!(status(publish(big.as_bytes(), &limits).map(drop)), 413);
        let three = r#"{"events":[{"payload":1},{"payload":2},{"payload":3}]}"#;
        assert_eq!(status(publish(three.as_bytes(), &limits).map(drop)), 413);
        let send = format!(r#"{{"topic":"t","payload":"{}","message_id":"m"}}"#, "x".repeat(40));
        assert_eq!(status(inbox_send(send.as_bytes(), &limits).map(drop)), 413);
        let metadata = format!(r#"{{"metadata":"{}"}}"#, "x".repeat(1024 * 1024));
        assert_eq!(status(item_metadata(metadata.as_bytes()).map(drop)), 413);
    }
}
