//! Replication RPC messages as they arrive off the wire: protobuf decode, then the checked
//! conversion into tidal-net's types. Neither may panic, whatever the bytes; a refusal is an error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prost::Message;
use tidal_net::pb;

fn check<P: Message + Default, T: TryFrom<P>>(bytes: &[u8]) {
    if let Ok(message) = P::decode(bytes) {
        let _ = T::try_from(message);
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&selector, bytes)) = data.split_first() else { return };
    match selector % 7 {
        0 => check::<pb::ShipRequest, tidal_net::Ship>(bytes),
        1 => check::<pb::ShipReply, tidal_net::ShipAnswer>(bytes),
        2 => check::<pb::PullRequest, tidal_net::Pull>(bytes),
        3 => check::<pb::PullChunk, tidal_net::Chunk>(bytes),
        4 => check::<pb::SnapshotChunk, tidal_net::SnapshotChunk>(bytes),
        5 => check::<pb::ProbeReply, tidal_net::ProbeReply>(bytes),
        _ => {
            let _ = tidal_net::message::split_batches(bytes);
        }
    }
});
