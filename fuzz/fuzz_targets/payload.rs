//! Record payloads: `decode_payload` never panics, and what it accepts survives an encode and a
//! second decode unchanged (the applier, a follower and a replay all decode the same bytes).
#![no_main]

use libfuzzer_sys::fuzz_target;
use tidal_core::record::{decode_payload, encode_payload};
use tidal_types::RecordKind;

fuzz_target!(|data: &[u8]| {
    let Some((&selector, payload)) = data.split_first() else { return };
    let kind = RecordKind::ALL[usize::from(selector) % RecordKind::ALL.len()];
    let Ok((envelope, records)) = decode_payload(kind, payload) else { return };
    let encoded = encode_payload(&envelope, &records);
    assert_eq!(encoded.kind, kind, "the records decoded as {kind:?} encode as another kind");
    let (envelope_again, records_again) =
        decode_payload(kind, &encoded.payload).expect("an encoded payload decodes");
    assert_eq!(envelope_again, envelope);
    assert_eq!(records_again, records);
});
