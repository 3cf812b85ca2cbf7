//! `POST /v1/tx`: several writes as ONE batch (a kind-9 record), all or nothing: change an item and
//! publish the event about it without a second system (the outbox pattern, built in).
//!
//! Every op is checked as its own route checks it before anything is submitted; one refused op
//! refuses the request. The ops apply in order, each seeing what the ones before it changed, and
//! each op consumes its own seqnos (a publish's offsets are among them).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::value::RawValue;
use tidal_core::{Records, StreamControl};
use tidal_types::{SignalIn, TxReply};

use super::decode::{publish_event, signal_events, Limits};
use super::streams::{check_consumer_offset, check_stream_name};
use super::{idempotency_key, json_body, metadata_bytes, vector_from_values, AppResult, AppState};
use crate::auth::Principal;
use crate::error::ApiError;

/// Most ops in one tx.
pub const TX_OPS_MAX: usize = 1_000;

/// Body of a tx: its ops, each an object tagged by `op` (parsed one by one: see [`op_records`]).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct TxBody {
    /// The ops, in order.
    #[schemars(schema_with = "ops_schema")]
    ops: Vec<Box<RawValue>>,
}

/// Every op a tx takes, by its tag.
const OP_NAMES: [&str; 6] = ["put_item", "delete_item", "put_embedding", "signals", "publish", "save_offset"];

/// The schema of `ops`: one of the op structs, each with its tag as the constant `op`.
fn ops_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    use schemars::JsonSchema;
    let shapes = [
        PutItem::json_schema(generator),
        DeleteItem::json_schema(generator),
        PutEmbedding::json_schema(generator),
        Signals::json_schema(generator),
        Publish::json_schema(generator),
        SaveOffset::json_schema(generator),
    ];
    let one_of: Vec<serde_json::Value> = OP_NAMES
        .iter()
        .zip(shapes)
        .map(|(name, shape)| {
            let mut shape = shape.to_value();
            shape["properties"]["op"] = serde_json::json!({"const": name});
            shape
        })
        .collect();
    let ops = serde_json::json!({"type": "array", "minItems": 1, "maxItems": TX_OPS_MAX, "items": {"oneOf": one_of}});
    schemars::Schema::try_from(ops).expect("an object is a schema")
}

/// Just the tag of an op, to pick its shape.
#[derive(Deserialize)]
struct OpTag {
    op: String,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct PutItem {
    #[allow(dead_code)]
    op: String,
    item: u64,
    metadata: serde_json::Value,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct DeleteItem {
    #[allow(dead_code)]
    op: String,
    item: u64,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct PutEmbedding {
    #[allow(dead_code)]
    op: String,
    item: u64,
    vector: Vec<serde_json::Value>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Signals {
    #[allow(dead_code)]
    op: String,
    signals: Vec<SignalIn>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct Publish {
    #[allow(dead_code)]
    op: String,
    stream: String,
    #[schemars(with = "Option<serde_json::Value>")]
    payload: Option<Box<RawValue>>,
    #[serde(default)]
    key: Option<String>,
}

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct SaveOffset {
    #[allow(dead_code)]
    op: String,
    stream: String,
    consumer: String,
    offset: u64,
}

fn parse<T: serde::de::DeserializeOwned>(raw: &RawValue) -> AppResult<T> {
    serde_json::from_str(raw.get()).map_err(super::json_error)
}

/// One op of the body, checked as its own route checks it.
fn op_records(state: &AppState, limits: &Limits, raw: &RawValue) -> AppResult<Records> {
    let OpTag { op } = parse(raw)?;
    Ok(match op.as_str() {
        "put_item" => {
            let PutItem { item, metadata, .. } = parse(raw)?;
            Records::ItemMetadata { item, metadata: metadata_bytes(&metadata)? }
        }
        "delete_item" => Records::ItemDelete { item: parse::<DeleteItem>(raw)?.item },
        "put_embedding" => {
            let PutEmbedding { item, vector, .. } = parse(raw)?;
            let vector = vector_from_values(state, &vector)?;
            super::check_embedding_room(state, item)?;
            Records::ItemEmbedding { item, vector }
        }
        "signals" => Records::Signals(signal_events(limits, parse::<Signals>(raw)?.signals)?),
        "publish" => {
            let Publish { stream, payload, key, .. } = parse(raw)?;
            check_stream_name("stream", &stream)?;
            Records::StreamEvents { stream, events: vec![publish_event(limits, payload, key)?] }
        }
        "save_offset" => {
            let SaveOffset { stream, consumer, offset, .. } = parse(raw)?;
            check_stream_name("stream", &stream)?;
            check_stream_name("consumer", &consumer)?;
            check_consumer_offset(state, &stream, offset)?;
            Records::StreamControl(StreamControl::SaveOffset { stream, consumer, offset })
        }
        other => {
            let known = OP_NAMES.join(", ");
            return Err(ApiError::invalid(format!("unknown op {other:?} (one of {known})")));
        }
    })
}

/// `POST /v1/tx`.
pub async fn post_tx(
    State(state): State<Arc<AppState>>,
    Extension(principal): Extension<Principal>,
    headers: HeaderMap,
    body: axum::body::Body,
) -> AppResult<Json<TxReply>> {
    let key = idempotency_key(&headers)?;
    let TxBody { ops } = json_body(&state, body).await?;
    if ops.is_empty() {
        return Err(ApiError::invalid("a tx holds at least one op"));
    }
    if ops.len() > TX_OPS_MAX {
        return Err(ApiError::too_large(format!("a tx holds at most {TX_OPS_MAX} ops")));
    }
    let limits = Limits::of(state.node.config());
    let mut records = Vec::with_capacity(ops.len());
    for (i, raw) in ops.iter().enumerate() {
        let record = op_records(&state, &limits, raw)
            .map_err(|e| ApiError { message: format!("ops[{i}]: {}", e.message), ..e })?;
        records.push(record);
    }
    let total: u64 = records.iter().map(Records::event_count).sum();
    if total > u64::from(u32::MAX) {
        return Err(ApiError::too_large("a tx consumes at most 2^32 - 1 seqnos"));
    }
    let spans: Vec<(bool, u64)> = records
        .iter()
        .map(|record| (matches!(record, Records::StreamEvents { .. }), record.event_count()))
        .collect();
    let seqno = state.node.write(&principal, key, Records::Tx(records)).await?;
    // The ops hold consecutive seqnos ending at the write's last.
    let mut first = seqno + 1 - total;
    let mut offsets = Vec::new();
    for (publish, count) in spans {
        if publish {
            offsets.extend(first..first + count);
        }
        first += count;
    }
    state.streams.published.fetch_add(offsets.len() as u64, Ordering::Relaxed);
    Ok(Json(TxReply { seqno, offsets }))
}
