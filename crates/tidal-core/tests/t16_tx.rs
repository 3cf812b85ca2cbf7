//! Kind 9, the tx: its ops applied in order as one batch give the state the same ops give as
//! separate batches at the same seqnos; a tx that cannot apply whole changes nothing.
#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use proptest::prelude::*;
use tidal_core::{Error, PublishEvent, Records, SignalEvent, StreamControl};
use tidal_types::Seqno;

fn any_op() -> impl Strategy<Value = Records> {
    prop_oneof![
        prop::collection::vec((0u8..3, 0u64..4, 0.5f64..2.0), 1..6).prop_map(|events| {
            Records::Signals(
                events
                    .into_iter()
                    .map(|(user, item, weight)| SignalEvent {
                        user: format!("u{user}"),
                        item,
                        kind: "click".into(),
                        weight,
                        ts_ms: None,
                    })
                    .collect(),
            )
        }),
        (0u64..4, 0u8..9).prop_map(|(item, n)| Records::ItemMetadata {
            item,
            metadata: format!("{{\"n\":{n}}}").into_bytes()
        }),
        (0u64..4, prop::collection::vec(-1.0f32..1.0, DIM as usize))
            .prop_map(|(item, vector)| Records::ItemEmbedding { item, vector }),
        (0u64..4).prop_map(|item| Records::ItemDelete { item }),
        (0u8..2, 1usize..3).prop_map(|(stream, n)| Records::StreamEvents {
            stream: format!("s{stream}"),
            events: vec![PublishEvent { key: None, payload: b"{}".to_vec() }; n],
        }),
        (0u8..2, 0u64..40).prop_map(|(stream, offset)| Records::StreamControl(StreamControl::SaveOffset {
            stream: format!("s{stream}"),
            consumer: "c".into(),
            offset,
        })),
        (0u8..2, 0u64..40).prop_map(|(stream, through)| Records::StreamControl(StreamControl::Trim {
            stream: format!("s{stream}"),
            through,
        })),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// The ops of each tx see what the ops before them changed (a signal on an item embedded in the
    /// same tx moves the user's profile, a publish after a trim keeps its offset...), exactly as if
    /// each op had been its own batch at the same seqnos.
    #[test]
    fn a_tx_is_its_ops_in_order(txs in prop::collection::vec(prop::collection::vec(any_op(), 1..6), 1..6)) {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let (as_tx, as_batches) = (open(a.path()), open(b.path()));
        let (mut tx_log, mut batch_log) = (Log::new(), Log::new());
        let mut time = T0;
        for ops in txs {
            let tx = tx_log.push(time, Records::Tx(ops.clone()));
            as_tx.apply(&tx).unwrap();
            for op in ops {
                as_batches.apply(&batch_log.push(time, op)).unwrap();
            }
            prop_assert_eq!(tx_log.next, batch_log.next);
            for stream in ["s0", "s1"] {
                prop_assert_eq!(as_tx.stream_events(stream, 0, 100).unwrap(), as_batches.stream_events(stream, 0, 100).unwrap());
            }
            time += HOUR;
        }
        prop_assert_eq!(as_tx.digest().unwrap(), as_batches.digest().unwrap());
        prop_assert_eq!(sizes(&as_tx), sizes(&as_batches));
    }
}

#[test]
fn a_tx_that_cannot_apply_whole_changes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let db = open(dir.path());
    let mut log = Log::new();
    db.apply(&log.item(T0, 1, "{}")).unwrap();
    let before = db.digest().unwrap();
    let publish = Records::StreamEvents {
        stream: "s".into(),
        events: vec![PublishEvent { key: None, payload: b"1".to_vec() }],
    };
    let bad = vec![
        Records::ItemMetadata { item: 2, metadata: b"{}".to_vec() },
        publish.clone(),
        Records::ItemEmbedding { item: 2, vector: vec![1.0; DIM as usize + 1] },
    ];
    let mut retry = Log { next: log.next, batches: Vec::new() };
    let tx = log.push(T0, Records::Tx(bad));
    assert!(matches!(db.apply(&tx), Err(Error::EmbeddingDimension { .. })));
    assert_eq!(db.digest().unwrap(), before);
    assert_eq!(db.applied_seqno(), Seqno(1));
    assert!(db.get_item(2).unwrap().is_none());
    assert!(db.stream_meta("s").unwrap().is_none());
    // The same seqnos, a tx that fits: applies whole.
    let good = vec![Records::ItemMetadata { item: 2, metadata: b"{}".to_vec() }, publish];
    db.apply(&retry.push(T0, Records::Tx(good))).unwrap();
    assert_eq!(db.get_item(2).unwrap().unwrap().seqno, Seqno(2), "each op has its own seqno");
    assert_eq!(db.stream_events("s", 0, 10).unwrap()[0].offset, 3);
}
