//! Tidal's inter-node transport: the generated tonic/prost code for `proto/tidal.proto`, the
//! domain forms of its messages with checked conversions, and the cluster-secret check.
//!
//! Non-goals: no protocol decisions (tidal-cluster makes them) and no socket binding: servers take
//! an incoming connection stream and clients a connector, so the simulation can run the same code
//! over simulated TCP.
#![deny(missing_docs)]

pub mod auth;
pub mod client;
pub mod connector;
pub mod control;
pub mod message;
pub mod server;
mod ship_link;
pub mod snapshot_message;
mod stream_path;

pub use client::{NetError, Peer};
pub use connector::{Accepted, BoxStream, Connector, ControlTap, Proof, ShipTap};
pub use control::{Probe, ProbeOutcome, ProbeReply, RaftCall, RAFT_PAYLOAD_BYTES_MAX};
pub use message::{
    join_batches, split_batches, Chunk, ChunkOutcome, Pull, Ship, ShipAnswer, ShipOutcome, WireError,
    MESSAGE_BATCH_BYTES_MAX,
};
pub use server::{
    serve, ChunkStream, ElectMode, Election, Handler, NegativesPage, ServiceError, ServiceRefusal,
    SnapshotStream, NEGATIVES_PAGE_MAX,
};
pub use snapshot_message::{
    SnapshotChunk, SnapshotRequest, SNAPSHOT_BYTES_MAX, SNAPSHOT_CHUNK_BYTES, SNAPSHOT_CHUNK_BYTES_MAX,
};
pub use stream_path::NotSent;
/// The attribute a [`Handler`] implementation carries (async trait methods), so implementers need
/// no transport crate of their own.
pub use tonic::async_trait;

/// Generated messages and services (`tidal.v1`).
#[allow(missing_docs, clippy::all, clippy::unwrap_used)]
pub mod pb {
    tonic::include_proto!("tidal.v1");
}
