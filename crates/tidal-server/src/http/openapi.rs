//! `GET /openapi.json`: the API as an OpenAPI 3.1 document, generated, not written by hand.
//!
//! Paths, methods, who may call a route and where it is served come from [`ROUTES`], the table the
//! router itself is built from. Request and reply bodies are the JSON Schemas of the types the
//! handlers parse and answer with (schemars derives them from the same structs serde uses), named
//! per route in [`OPS`]. The error responses follow from the route's properties ([`errors_of`]):
//! a body, a token, an id in the path, a leader-only write, a `min_seqno`; plus the codes only that
//! route answers. A test checks that every route has its entry; `tests/t17_openapi.rs` that the
//! committed copy (`docs/openapi.json`) is this document and that the README's examples fit it.

use super::{Access, Route, Serve, ROUTES};
use axum::routing::MethodFilter;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::{json, Map, Value};
use tidal_types::ErrorCode::{self, *};

/// A query parameter: name, JSON type, what it means.
type Param = (&'static str, &'static str, &'static str);
/// Makes a schema in the document's generator (a `$ref` to `components.schemas` for a struct).
type SchemaFn = fn(&mut SchemaGenerator) -> Schema;

/// What a route answers with on success.
#[derive(Clone, Copy)]
pub(crate) enum Reply {
    /// `application/json` of this schema.
    Json(SchemaFn),
    /// `application/json` of this schema, or 204 with no body (a long poll that got nothing).
    JsonOrNothing(SchemaFn),
    /// `text/plain` (probes) or the Prometheus text format.
    Text,
    /// `text/event-stream` (a subscription).
    EventStream,
    /// `application/octet-stream` (a backup file).
    Binary,
    /// `text/html` (the live page).
    Html,
    /// 101 Switching Protocols to the write link's frames (decisions/073).
    Upgrade,
}

/// The documentation of one route beyond what [`ROUTES`] says.
pub(crate) struct Op {
    method: &'static str,
    path: &'static str,
    summary: &'static str,
    query: &'static [Param],
    body: Option<SchemaFn>,
    reply: Reply,
    /// Codes only this route answers (the common ones follow from the route, [`errors_of`]).
    errors: &'static [ErrorCode],
}

fn schema<T: JsonSchema>(generator: &mut SchemaGenerator) -> Schema {
    generator.subschema_for::<T>()
}

const MIN_SEQNO: Param =
    ("min_seqno", "integer", "wait until this node has applied this seqno (read-your-writes)");
const CONSISTENCY: Param =
    ("consistency", "string", "`applied` (default) or `linearizable` (answered by the leader)");
const READ: &[Param] = &[MIN_SEQNO, CONSISTENCY];
const LIMIT: Param = ("limit", "integer", "at most this many results");
const EXACT: Param =
    ("exact", "boolean", "`true`: rank by the exact scan of every item (audits), not the approximate index");
const DRY_RUN: Param = ("dry_run", "boolean", "`true`: say what would be done, change nothing");
const NODE: Param = ("node", "integer", "the node the verb acts on");

/// Shorthand for an [`Op`] entry.
macro_rules! op {
    ($method:literal $path:literal, $summary:literal, query: $query:expr, body: $body:expr, reply: $reply:expr, errors: $errors:expr) => {
        Op {
            method: $method,
            path: $path,
            summary: $summary,
            query: $query,
            body: $body,
            reply: $reply,
            errors: $errors,
        }
    };
}

/// The request and reply types and the route-specific codes of every route in [`ROUTES`].
pub(crate) static OPS: &[Op] = {
    use super::decode::PublishBody;
    use super::streams::{OffsetBody, TrimBody};
    use super::tx::TxBody;
    use tidal_types::*;
    use Reply::{EventStream, Json as J, Text};
    const NONE: &[ErrorCode] = &[];
    const ITEM: &[ErrorCode] = &[NotFound];
    const STREAM: &[ErrorCode] = &[InvalidName];
    const INBOX: &[ErrorCode] = &[InvalidName, InboxClosed];
    &[
        op!("post" "/v1/signals", "Log interaction signals", query: &[], body: Some(schema::<SignalsRequest>), reply: J(schema::<WriteReply>), errors: &[UnknownSignalKind, NonFiniteNumber]),
        op!("put" "/v1/items/{id}", "Create or replace an item's metadata", query: &[], body: Some(schema::<ItemPut>), reply: J(schema::<WriteReply>), errors: NONE),
        op!("get" "/v1/items/{id}", "An item's metadata", query: READ, body: None, reply: J(schema::<ItemView>), errors: ITEM),
        op!("delete" "/v1/items/{id}", "Delete an item (metadata, embedding, trending score)", query: &[], body: None, reply: J(schema::<WriteReply>), errors: NONE),
        op!("put" "/v1/items/{id}/embedding", "Set an item's embedding", query: &[], body: Some(schema::<EmbeddingPut>), reply: J(schema::<WriteReply>), errors: &[DimensionMismatch, InvalidVector, IndexFull]),
        op!("get" "/v1/items/{id}/embedding", "An item's embedding", query: READ, body: None, reply: J(schema::<EmbeddingView>), errors: ITEM),
        op!("get" "/v1/items/{id}/similar", "Items ranked by similarity to this one", query: &[LIMIT, EXACT, MIN_SEQNO, CONSISTENCY], body: None, reply: J(schema::<RankedList>), errors: ITEM),
        op!("get" "/v1/users/{user}/feed", "A user's personalized feed", query: &[LIMIT, ("exclude", "string", "item ids to leave out, comma-separated"), EXACT, MIN_SEQNO, CONSISTENCY], body: None, reply: J(schema::<RankedList>), errors: NONE),
        op!("get" "/v1/trending", "The trending items", query: &[LIMIT, MIN_SEQNO, CONSISTENCY], body: None, reply: J(schema::<RankedList>), errors: NONE),
        op!("post" "/v1/users/{user}/negatives", "Hide an item from a user's feed (hard negative)", query: &[], body: Some(schema::<NegativeAdd>), reply: J(schema::<Accepted>), errors: NONE),
        op!("get" "/v1/users/{user}/negatives", "A user's hard negatives", query: &[], body: None, reply: J(schema::<NegativesView>), errors: NONE),
        op!("delete" "/v1/users/{user}/negatives/{item}", "Remove a hard negative", query: &[], body: None, reply: J(schema::<Accepted>), errors: NONE),
        op!("get" "/v1/streams", "Streams by name", query: &[("after", "string", "start after this name"), LIMIT, MIN_SEQNO, CONSISTENCY], body: None, reply: J(schema::<StreamList>), errors: STREAM),
        op!("post" "/v1/streams/{stream}/events", "Publish events to a stream", query: &[], body: Some(schema::<PublishBody>), reply: J(schema::<Published>), errors: STREAM),
        op!("get" "/v1/streams/{stream}/events", "Read a stream's events after a position", query: &[("after", "integer", "events after this offset"), ("consumer", "string", "after this consumer's saved offset"), LIMIT, MIN_SEQNO, CONSISTENCY], body: None, reply: J(schema::<StreamEvents>), errors: STREAM),
        op!("get" "/v1/streams/{stream}/subscribe", "Follow a stream live (server-sent events)", query: &[("after", "integer", "events after this offset"), ("consumer", "string", "after this consumer's saved offset"), MIN_SEQNO], body: None, reply: EventStream, errors: &[InvalidName, Overloaded]),
        op!("put" "/v1/streams/{stream}/consumers/{name}", "Save a consumer's offset (never moves back)", query: &[], body: Some(schema::<OffsetBody>), reply: J(schema::<ConsumerOffset>), errors: &[InvalidName, InvalidOffset]),
        op!("get" "/v1/streams/{stream}/consumers/{name}", "A consumer's saved offset", query: READ, body: None, reply: J(schema::<ConsumerOffset>), errors: &[InvalidName, NotFound]),
        op!("post" "/v1/streams/{stream}/trim", "Delete a stream's events through an offset", query: &[], body: Some(schema::<TrimBody>), reply: J(schema::<Trimmed>), errors: &[InvalidName, NotFound]),
        op!("get" "/v1/link", "Upgrade to the write link: many single-record writes in flight on one connection (decisions/073)", query: &[], body: None, reply: Reply::Upgrade, errors: &[InvalidArgument]),
        op!("post" "/v1/tx", "Write several ops in one batch, all or none", query: &[], body: Some(schema::<TxBody>), reply: J(schema::<TxReply>), errors: &[InvalidName, InvalidOffset, UnknownSignalKind, NonFiniteNumber, DimensionMismatch, InvalidVector, IndexFull]),
        op!("post" "/v1/inboxes/{owner}/messages", "Send a message to an inbox topic", query: &[], body: Some(schema::<InboxSend>), reply: J(schema::<InboxSent>), errors: &[InvalidName, InboxClosed, InboxFull, TooManyTopics]),
        op!("post" "/v1/inboxes/{owner}/receive", "Receive messages under a lease (long poll)", query: &[], body: Some(schema::<InboxReceive>), reply: Reply::JsonOrNothing(schema::<InboxReceived>), errors: INBOX),
        op!("post" "/v1/inboxes/{owner}/ack", "Acknowledge a receive", query: &[], body: Some(schema::<InboxAck>), reply: J(schema::<InboxAcked>), errors: &[InvalidName, InboxClosed, UnknownReceive, LeaseLost]),
        op!("post" "/v1/inboxes/{owner}/discard", "Drop a topic's messages through a sequence", query: &[], body: Some(schema::<InboxDiscard>), reply: J(schema::<InboxDiscarded>), errors: INBOX),
        op!("delete" "/v1/inboxes/{owner}", "Close an inbox", query: &[], body: None, reply: J(schema::<InboxClosed>), errors: &[InvalidName]),
        op!("get" "/v1/inboxes/{owner}", "An inbox's topics and backlog", query: READ, body: None, reply: J(schema::<InboxView>), errors: &[InvalidName, NotFound]),
        op!("get" "/cluster/status", "This node's view of the cluster", query: &[MIN_SEQNO], body: None, reply: J(schema::<ClusterStatus>), errors: NONE),
        op!("get" "/cluster/digest", "Digest of the replicated state", query: &[MIN_SEQNO], body: None, reply: J(schema::<DigestView>), errors: NONE),
        op!("get" "/cluster/backup", "A backup of this node's state at a committed seqno (decisions/065)", query: &[], body: None, reply: Reply::Binary, errors: &[NotReady]),
        op!("post" "/cluster/heal", "Bring a follower back to the leader's log", query: &[NODE, DRY_RUN], body: None, reply: J(schema::<HealView>), errors: NONE),
        op!("post" "/cluster/catchup", "Pull missing history from the leader now", query: &[], body: None, reply: J(schema::<CatchupView>), errors: NONE),
        op!("post" "/cluster/promote", "Hand leadership to another voter", query: &[NODE, DRY_RUN], body: None, reply: J(schema::<PromoteView>), errors: NONE),
        op!("post" "/cluster/reconcile", "Reconcile hard negatives with every peer", query: &[DRY_RUN], body: None, reply: J(schema::<ReconcileView>), errors: NONE),
        op!("post" "/cluster/members/{id}", "Add a member (learner, then voter)", query: &[("http", "string", "the new node's HTTP HOST:PORT"), ("rpc", "string", "its replication HOST:PORT"), ("catch_up_s", "integer", "how long it may take to catch up, 1..=3600"), DRY_RUN], body: None, reply: J(schema::<MembersView>), errors: NONE),
        op!("delete" "/cluster/members/{id}", "Remove a member", query: &[DRY_RUN], body: None, reply: J(schema::<MembersView>), errors: NONE),
        op!("get" "/healthz", "Liveness: 200 while the node runs", query: &[], body: None, reply: Text, errors: &[NotReady]),
        op!("get" "/readyz", "Readiness: 200 while the node can serve", query: &[("max_lag_ms", "integer", "a follower is ready if it heard its leader this recently (default 5000)")], body: None, reply: Text, errors: &[NotReady]),
        op!("get" "/metrics", "Prometheus metrics", query: &[], body: None, reply: Text, errors: NONE),
        op!("get" "/ui", "The live cluster page (HTML; it holds no data)", query: &[], body: None, reply: Reply::Html, errors: NONE),
        op!("get" "/cluster/history", "The leader's recent status samples and cluster events", query: &[("since_ms", "integer", "only samples and events after this time (unix ms)")], body: None, reply: J(schema::<ClusterHistory>), errors: NONE),
        op!("get" "/openapi.json", "This document", query: &[], body: None, reply: Reply::Json(|_| Schema::from(true)), errors: NONE),
    ]
};

/// The lower-case method of a table route (each route answers one method).
pub(crate) fn method_name(methods: MethodFilter) -> &'static str {
    [
        (MethodFilter::GET, "get"),
        (MethodFilter::POST, "post"),
        (MethodFilter::PUT, "put"),
        (MethodFilter::DELETE, "delete"),
    ]
    .into_iter()
    .find_map(|(filter, name)| (filter == methods).then_some(name))
    .unwrap_or("other")
}

/// The codes `route` (documented by `op`) may answer, by status: the route's own plus those that
/// follow from what it takes and where it is served.
pub(crate) fn errors_of(route: &Route, op: &Op) -> Vec<ErrorCode> {
    let mut codes = op.errors.to_vec();
    if op.body.is_some() {
        codes.extend([MalformedJson, InvalidArgument, PayloadTooLarge, UnsupportedMediaType, Overloaded]);
    }
    if !op.query.is_empty() || route.path.contains('{') {
        codes.push(InvalidArgument);
    }
    if let Access::Needs(_) = route.access {
        codes.extend([Unauthorized, Forbidden]);
    }
    if route.serve != Serve::Anywhere {
        codes.push(NotReady);
    }
    if op.body.is_some() || route.methods != MethodFilter::GET {
        // A state change whose outcome the node cannot know (a write not committed in time).
        codes.extend([Internal, NotReady]);
    }
    if op.query.iter().any(|(name, _, _)| *name == "min_seqno") {
        codes.push(NotCaughtUp);
    }
    codes.sort_by_key(|code| (code.status(), code.as_str()));
    codes.dedup();
    codes
}

/// The whole document.
pub fn document() -> Value {
    let mut settings = schemars::generate::SchemaSettings::draft2020_12();
    settings.definitions_path = "#/components/schemas/".into();
    let mut generator = settings.into_generator();
    let error = schema::<tidal_types::ErrorBody>(&mut generator);
    let mut paths = Map::new();
    for route in ROUTES {
        let method = method_name(route.methods);
        let op = OPS.iter().find(|op| op.method == method && op.path == route.path);
        let Some(op) = op else { continue }; // the test names it
        let entry = paths.entry(route.path).or_insert_with(|| json!({}));
        entry[method] = operation(route, op, &mut generator, &error);
    }
    let mut schemas = generator.take_definitions(true);
    restrict_error_codes(&mut schemas);
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Tidal HTTP API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "Generated from the server's route table and the handlers' request and reply types. docs/API.md explains the contract in prose.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "A token from the node's token file, with the scope the route names (x-scope)"}},
        },
    })
}

/// One operation object.
fn operation(route: &Route, op: &Op, generator: &mut SchemaGenerator, error: &Schema) -> Value {
    let mut parameters: Vec<Value> = path_params(route.path)
        .map(|name| json!({"name": name, "in": "path", "required": true, "schema": {"type": "string"}}))
        .collect();
    parameters.extend(op.query.iter().map(|(name, kind, what)| {
        json!({"name": name, "in": "query", "required": false, "description": what, "schema": {"type": kind}})
    }));
    if route.methods != MethodFilter::GET && route.path.starts_with("/v1/") {
        parameters.push(json!({"name": "Idempotency-Key", "in": "header", "required": false,
            "description": "1 to 256 bytes of visible ASCII: a retry with the same key is answered as the first write, and written once",
            "schema": {"type": "string"}}));
    }
    let mut responses = Map::new();
    let ok = if let Reply::Upgrade = op.reply { "101" } else { "200" };
    responses.insert(ok.into(), success(op.reply, generator));
    if let Reply::JsonOrNothing(_) = op.reply {
        responses.insert("204".into(), json!({"description": "Nothing arrived within the wait"}));
    }
    if op.body.is_some() {
        responses.insert(
            "408".into(),
            json!({"description": "invalid_argument: the body did not arrive within body_timeout_ms",
            "content": {"application/json": {"schema": error}}}),
        );
    }
    for (status, codes) in by_status(&errors_of(route, op)) {
        let names: Vec<&str> = codes.iter().map(|code| code.as_str()).collect();
        responses.insert(
            status.to_string(),
            json!({"description": names.join(", "), "x-error-codes": names, "content": {"application/json": {"schema": error}}}),
        );
    }
    let mut operation = json!({
        "summary": op.summary,
        "operationId": format!("{}{}", op.method, route.path.replace(['/', '{', '}'], "_")),
        "parameters": parameters,
        "responses": responses,
        "x-served-on": format!("{:?}", route.serve),
    });
    match route.access {
        Access::Open => operation["security"] = json!([]),
        Access::Needs(scope) => {
            operation["security"] = json!([{"bearer": []}]);
            operation["x-scope"] = json!(format!("{scope:?}").to_lowercase());
        }
    }
    if let Some(body) = op.body {
        let body = body(generator);
        operation["requestBody"] =
            json!({"required": true, "content": {"application/json": {"schema": body}}});
    }
    operation
}

fn success(reply: Reply, generator: &mut SchemaGenerator) -> Value {
    match reply {
        Reply::Json(make) | Reply::JsonOrNothing(make) => {
            json!({"description": "OK", "content": {"application/json": {"schema": make(generator)}}})
        }
        Reply::Text => {
            json!({"description": "OK", "content": {"text/plain": {"schema": {"type": "string"}}}})
        }
        Reply::Html => json!({"description": "OK", "content": {"text/html": {"schema": {"type": "string"}}}}),
        Reply::Upgrade => {
            json!({"description": "Switching Protocols (`Upgrade: tidal-link/1`): the connection now carries the write link's frames"})
        }
        Reply::Binary => {
            json!({"description": "The backup file; its seqno, term and checksum in Tidal-Backup-* headers", "content": {"application/octet-stream": {"schema": {"type": "string", "contentEncoding": "binary"}}}})
        }
        Reply::EventStream => {
            json!({"description": "One server-sent event per stream event", "content": {"text/event-stream": {"schema": {"type": "string"}}}})
        }
    }
}

/// The `{name}` segments of an axum path.
pub(crate) fn path_params(path: &'static str) -> impl Iterator<Item = &'static str> {
    path.split('/').filter_map(|segment| segment.strip_prefix('{')?.strip_suffix('}'))
}

fn by_status(codes: &[ErrorCode]) -> Vec<(u16, Vec<ErrorCode>)> {
    let mut out: Vec<(u16, Vec<ErrorCode>)> = Vec::new();
    for code in codes {
        match out.last_mut() {
            Some((status, list)) if *status == code.status() => list.push(*code),
            _ => out.push((code.status(), vec![*code])),
        }
    }
    out
}

/// The error body's `code` is one of the contract's strings.
fn restrict_error_codes(schemas: &mut Map<String, Value>) {
    let codes: Vec<&str> = ErrorCode::ALL.iter().map(|code| code.as_str()).collect();
    if let Some(code) =
        schemas.get_mut("ErrorDetail").and_then(|detail| detail.pointer_mut("/properties/code"))
    {
        code["enum"] = json!(codes);
    }
}

/// `GET /openapi.json`.
pub async fn get() -> axum::Json<Value> {
    axum::Json(document())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_route_has_its_entry_and_every_entry_a_route() {
        for route in ROUTES {
            let method = method_name(route.methods);
            assert!(
                OPS.iter().any(|op| op.method == method && op.path == route.path),
                "route {method} {} has no entry in openapi::OPS",
                route.path
            );
        }
        for op in OPS {
            assert!(
                ROUTES.iter().any(|route| method_name(route.methods) == op.method && route.path == op.path),
                "openapi::OPS documents {} {}, which no route serves",
                op.method,
                op.path
            );
        }
    }

    #[test]
    fn every_reference_resolves_and_every_status_is_the_contracts() {
        let document = document();
        let text = document.to_string();
        for reference in text.split("\"$ref\":\"").skip(1) {
            let target = &reference[..reference.find('"').unwrap_or(0)];
            let pointer = target.strip_prefix('#').unwrap_or(target);
            assert!(document.pointer(pointer).is_some(), "unresolved $ref {target}");
        }
        for (path, item) in document["paths"].as_object().into_iter().flatten() {
            for (method, operation) in item.as_object().into_iter().flatten() {
                for (status, response) in operation["responses"].as_object().into_iter().flatten() {
                    for code in response["x-error-codes"].as_array().into_iter().flatten() {
                        let code = ErrorCode::ALL.iter().find(|c| Some(c.as_str()) == code.as_str());
                        let code = code.unwrap_or_else(|| panic!("{method} {path}: unknown code {code:?}"));
                        assert_eq!(code.status().to_string(), *status, "{method} {path}: {}", code.as_str());
                    }
                }
            }
        }
    }
}
