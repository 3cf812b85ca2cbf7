//! Request bodies of the main write routes (signals, item metadata, stream publish, inbox send) as
//! `tidal_server::http::decode` reads them: arbitrary bytes never panic, and every refusal is a 4xx
//! (a client's fault, with its contract code), never a 5xx. What a decoder accepts stays inside the
//! limits it was given: at most the configured count of signals or events, weights bounded, payloads
//! within their byte limits.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidal_server::error::ApiError;
use tidal_server::http::decode::{self, Limits};
use tidal_types::SIGNAL_WEIGHT_MAX;

fn limits() -> Limits {
    Limits {
        signal_kinds: [("view", 0.2), ("click", 1.0), ("skip", -0.5)]
            .into_iter()
            .map(|(kind, weight)| (kind.to_string(), weight))
            .collect(),
        signals_per_request_max: 64,
        stream_events_per_request_max: 16,
        stream_event_bytes_max: 1024,
        inbox_payload_bytes_max: 1024,
        now_ms: 1_764_000_000_000,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, body)) = data.split_first() else { return };
    let limits = limits();
    let refused = |error: ApiError| {
        assert!(error.status.is_client_error(), "a body was refused with {}: {}", error.status, error.message);
    };
    match selector % 4 {
        0 => match decode::signals(body, &limits) {
            Ok(events) => {
                assert!(!events.is_empty() && events.len() <= limits.signals_per_request_max);
                for event in events {
                    assert!(event.weight.is_finite() && event.weight.abs() <= SIGNAL_WEIGHT_MAX);
                    assert!(event.ts_ms.is_none_or(|ts| ts >= 0 && ts <= limits.now_ms + 3_600_000));
                }
            }
            Err(error) => refused(error),
        },
        1 => match decode::item_metadata(body) {
            Ok(metadata) => assert!(serde_json::from_slice::<serde_json::Value>(&metadata).is_ok()),
            Err(error) => refused(error),
        },
        2 => match decode::publish(body, &limits) {
            Ok(events) => {
                assert!(!events.is_empty() && events.len() <= limits.stream_events_per_request_max);
                assert!(events.iter().all(|event| event.payload.len() <= limits.stream_event_bytes_max));
            }
            Err(error) => refused(error),
        },
        _ => match decode::inbox_send(body, &limits) {
            Ok(message) => assert!(message.payload.len() <= limits.inbox_payload_bytes_max),
            Err(error) => refused(error),
        },
    }
});

