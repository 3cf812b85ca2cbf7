//! Streams in the engine: the keys and values of the `streams` and `stream_events` keyspaces, what
//! a publish, a consumer offset and a trim change, and reads that merge the overlays over fjall.
//!
//! ```text
//! keyspace       key                                          value
//! streams        0x01 | stream                                StreamMeta (40 bytes)
//! streams        0x02 | len u8 | stream | consumer            offset u64 LE
//! stream_events  len u8 | stream | offset u64 BE              created_at i64 LE | key tag u8
//!                                                             (1: u16 LE len | key) | payload JSON
//! ```
//!
//! Delicate:
//! - An event's offset is its seqno: global, never renumbered. Events are only ever added (by a
//!   publish) or deleted (by a trim); nothing rewrites one, so a key found in two layers (fjall and
//!   the frozen overlay, between a flush's commit and its retirement) holds the same value in both.
//! - A trim moves the stream's horizon (log-derived, in its meta) at apply and deletes what the
//!   active overlay holds at or below it; fjall's copies are deleted by the flush of the trim's
//!   window ([`delete_trimmed`]), right after the batch that records the new horizon and counts
//!   commits, and before the flush counts as done. Until then reads skip everything at or below
//!   the horizon, so no reader ever sees a trimmed event, and the digest (which waits for the
//!   flush) sees storage without them. A crash between the commit and the deletes leaves events
//!   below a committed horizon: [`sweep_below_horizons`] deletes them at the next open. (Deleting
//!   before the commit would let the replay of the trim count fewer events than the first apply
//!   did, and the counts are in the digest.)
//! - A trim's counts (events and bytes it removed) are counted at apply over the range it removes,
//!   so the meta stays log-derived: the same on every node at one applied seqno.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::error::Error;
use crate::layers::{for_each_merged, Layer};
use crate::overlay::OverlayView;
use crate::record::PublishEvent;
use crate::stores::Stores;

/// Longest stream or consumer name: the name's length is one byte in event and consumer keys.
pub const STREAM_NAME_BYTES_MAX: usize = u8::MAX as usize;

/// Most removes in one fjall batch when a flush deletes trimmed events.
const TRIM_DELETES_PER_BATCH: usize = 16_384;

const TAG_META: u8 = 0x01;
const TAG_CONSUMER: u8 = 0x02;
const META_LEN: usize = 40;

/// What a stream's meta entry holds. Log-derived.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StreamMeta {
    /// Offset of the last event ever published (0 before the first).
    pub last_offset: u64,
    /// Every offset at or below this was trimmed (0: never trimmed).
    pub horizon: u64,
    /// Events stored (published and not trimmed).
    pub events: u64,
    /// Payload bytes of those events.
    pub bytes: u64,
    /// Consumers with a saved offset.
    pub consumers: u64,
}

impl StreamMeta {
    pub(crate) fn encode(&self) -> Vec<u8> {
        [self.last_offset, self.horizon, self.events, self.bytes, self.consumers]
            .iter()
            .flat_map(|n| n.to_le_bytes())
            .collect()
    }

    fn decode(value: &[u8]) -> Result<StreamMeta, Error> {
        if value.len() != META_LEN {
            return Err(corrupt(format!("stream meta of {} bytes, not {META_LEN}", value.len())));
        }
        let n = |i: usize| u64::from_le_bytes(value[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        Ok(StreamMeta { last_offset: n(0), horizon: n(1), events: n(2), bytes: n(3), consumers: n(4) })
    }
}

/// One stored event, as reads return it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredEvent {
    /// The event's seqno.
    pub offset: u64,
    /// Carried metadata.
    pub key: Option<String>,
    /// JSON text.
    pub payload: Vec<u8>,
    /// The leader's logged time of the publish, in unix seconds.
    pub created_at: i64,
}

/// A stream as `GET /v1/streams` lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StreamInfo {
    /// The stream's name.
    pub name: String,
    /// Its meta.
    pub meta: StreamMeta,
    /// The first event still stored, if any.
    pub first_offset: Option<u64>,
}

/// What one stream record changes, computed before anything changes.
#[derive(Debug, Default)]
pub struct StreamChange {
    /// `streams` entries to set.
    pub writes: Vec<(Vec<u8>, Vec<u8>)>,
    /// `stream_events` entries to add.
    pub events: Vec<(Vec<u8>, Vec<u8>)>,
    /// A trim: the stream's event key prefix, the old horizon and the new one.
    pub trim: Option<(Vec<u8>, u64, u64)>,
}

/// Checks a name that goes into keys; the API refuses such names long before.
pub(crate) fn name_prefix(stream: &str) -> Result<Vec<u8>, Error> {
    let len = u8::try_from(stream.len()).map_err(|_| {
        corrupt(format!("stream name of {} bytes over {STREAM_NAME_BYTES_MAX}", stream.len()))
    })?;
    let mut prefix = Vec::with_capacity(1 + stream.len() + 8);
    prefix.push(len);
    prefix.extend_from_slice(stream.as_bytes());
    Ok(prefix)
}

pub(crate) fn meta_key(stream: &str) -> Vec<u8> {
    let mut key = Vec::with_capacity(1 + stream.len());
    key.push(TAG_META);
    key.extend_from_slice(stream.as_bytes());
    key
}

pub(crate) fn consumer_key(stream: &str, consumer: &str) -> Result<Vec<u8>, Error> {
    let mut key = vec![TAG_CONSUMER];
    key.extend_from_slice(&name_prefix(stream)?);
    key.extend_from_slice(consumer.as_bytes());
    Ok(key)
}

pub(crate) fn event_key(prefix: &[u8], offset: u64) -> Vec<u8> {
    let mut key = Vec::with_capacity(prefix.len() + 8);
    key.extend_from_slice(prefix);
    key.extend_from_slice(&offset.to_be_bytes());
    key
}

pub(crate) fn event_value(created_at: i64, event: &PublishEvent) -> Vec<u8> {
    let key_len = event.key.as_ref().map_or(0, |key| 2 + key.len());
    let mut value = Vec::with_capacity(9 + key_len + event.payload.len());
    value.extend_from_slice(&created_at.to_le_bytes());
    match &event.key {
        None => value.push(0),
        Some(key) => {
            value.push(1);
            value.extend_from_slice(&(key.len() as u16).to_le_bytes());
            value.extend_from_slice(key.as_bytes());
        }
    }
    value.extend_from_slice(&event.payload);
    value
}

/// Decodes a stored event; `offset` comes from its key.
fn decode_event(offset: u64, value: &[u8]) -> Result<StoredEvent, Error> {
    let malformed = || corrupt(format!("event {offset} is malformed"));
    let start = payload_start(value).ok_or_else(malformed)?;
    let created_at = i64::from_le_bytes(value[..8].try_into().expect("payload_start checked 9 bytes"));
    let key = match value[8] {
        0 => None,
        _ => Some(String::from_utf8(value[11..start].to_vec()).map_err(|_| malformed())?),
    };
    Ok(StoredEvent { offset, key, payload: value[start..].to_vec(), created_at })
}

/// Payload bytes of a stored event value (for the meta's byte count).
fn payload_len(value: &[u8]) -> u64 {
    payload_start(value).map_or(0, |start| (value.len() - start) as u64)
}

/// Where the payload starts in a stored event value (after `created_at`, the key tag and the key);
/// `None` if the value is too short for what its tag says.
fn payload_start(value: &[u8]) -> Option<usize> {
    match value.get(8)? {
        0 => Some(9),
        1 => {
            let len = value.get(9..11)?;
            let end = 11 + usize::from(u16::from_le_bytes([len[0], len[1]]));
            (end <= value.len()).then_some(end)
        }
        _ => None,
    }
}

fn offset_of(key: &[u8]) -> Result<u64, Error> {
    let tail =
        key.len().checked_sub(8).map(|at| &key[at..]).ok_or_else(|| corrupt("short event key".into()))?;
    Ok(u64::from_be_bytes(tail.try_into().expect("8 bytes")))
}

fn corrupt(reason: String) -> Error {
    Error::Corrupt { keyspace: "streams", reason }
}

impl<'a> OverlayView<'a> {
    /// A `streams` entry: the active overlay's, the frozen one's, else fjall's.
    fn stream_value(&self, stores: &Stores, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        if let Some(value) =
            self.active.streams.get(key).or_else(|| self.frozen.and_then(|f| f.streams.get(key)))
        {
            return Ok(Some(value.clone()));
        }
        Ok(stores.streams.get(key)?.map(|slice| slice.to_vec()))
    }

    /// A stream's meta, if it was ever published to or had a consumer saved.
    pub fn stream_meta(&self, stores: &Stores, stream: &str) -> Result<Option<StreamMeta>, Error> {
        self.stream_value(stores, &meta_key(stream))?.map(|value| StreamMeta::decode(&value)).transpose()
    }

    /// A consumer's saved offset.
    pub fn consumer_offset(
        &self,
        stores: &Stores,
        stream: &str,
        consumer: &str,
    ) -> Result<Option<u64>, Error> {
        let value = self.stream_value(stores, &consumer_key(stream, consumer)?)?;
        value
            .map(|value| {
                value
                    .as_slice()
                    .try_into()
                    .map(u64::from_le_bytes)
                    .map_err(|_| corrupt("consumer offset".into()))
            })
            .transpose()
    }

    /// Calls `visit` with each stored event of `stream` with an offset in `(after, through]`, in
    /// offset order, until it returns false. Skips nothing: the caller bounds `after` by the horizon.
    pub fn for_each_event(
        &self,
        stores: &Stores,
        stream: &str,
        after: u64,
        through: u64,
        mut visit: impl FnMut(u64, &[u8]) -> Result<bool, Error>,
    ) -> Result<(), Error> {
        if after >= through {
            return Ok(());
        }
        let prefix = name_prefix(stream)?;
        let (from, to) = (event_key(&prefix, after + 1), event_key(&prefix, through));
        let range = (Bound::Included(from.clone()), Bound::Included(to.clone()));
        let mut layers = [
            Layer::memory(self.active.stream_events.range::<Vec<u8>, _>(range.clone())),
            Layer::memory(
                self.frozen.into_iter().flat_map(|f| f.stream_events.range::<Vec<u8>, _>(range.clone())),
            ),
            Layer::fjall(&stores.stream_events, (Bound::Included(from), Bound::Included(to))),
        ];
        for_each_merged(&mut layers, |key, value| visit(offset_of(key)?, value))
    }

    /// Up to `limit` events of `stream` after `after` (and after the horizon), in offset order.
    pub fn stream_events(
        &self,
        stores: &Stores,
        stream: &str,
        after: u64,
        limit: usize,
    ) -> Result<Vec<StoredEvent>, Error> {
        let Some(meta) = self.stream_meta(stores, stream)? else { return Ok(Vec::new()) };
        let mut events = Vec::new();
        self.for_each_event(stores, stream, after.max(meta.horizon), meta.last_offset, |offset, value| {
            events.push(decode_event(offset, value)?);
            Ok(events.len() < limit)
        })?;
        Ok(events)
    }

    /// What publishing `events` at seqnos `first..` changes.
    pub fn fold_publish(
        &self,
        stores: &Stores,
        stream: &str,
        first: u64,
        time_ms: u64,
        events: &[PublishEvent],
    ) -> Result<StreamChange, Error> {
        let prefix = name_prefix(stream)?;
        let mut meta = self.stream_meta(stores, stream)?.unwrap_or_default();
        let created_at = i64::try_from(time_ms / 1000).unwrap_or(i64::MAX);
        let mut change = StreamChange::default();
        for (i, event) in events.iter().enumerate() {
            let offset = first + i as u64;
            change.events.push((event_key(&prefix, offset), event_value(created_at, event)));
            meta.bytes += event.payload.len() as u64;
        }
        meta.events += events.len() as u64;
        meta.last_offset = first + events.len() as u64 - 1;
        change.writes.push((meta_key(stream), meta.encode()));
        Ok(change)
    }

    /// What saving `offset` for `consumer` changes: the offset only moves forward, and never past
    /// the stream's last offset.
    pub fn fold_save_offset(
        &self,
        stores: &Stores,
        stream: &str,
        consumer: &str,
        offset: u64,
    ) -> Result<StreamChange, Error> {
        let existing = self.stream_meta(stores, stream)?;
        let mut meta = existing.unwrap_or_default();
        let current = self.consumer_offset(stores, stream, consumer)?;
        let saved = current.unwrap_or(0).max(offset.min(meta.last_offset));
        let mut change = StreamChange::default();
        if current.is_none() || existing.is_none() {
            meta.consumers += u64::from(current.is_none());
            change.writes.push((meta_key(stream), meta.encode()));
        }
        if current != Some(saved) {
            change.writes.push((consumer_key(stream, consumer)?, saved.to_le_bytes().to_vec()));
        }
        Ok(change)
    }

    /// What trimming `stream` through `through` changes: the horizon moves forward to at most the
    /// last offset; the events it passes leave the counts.
    pub fn fold_trim(&self, stores: &Stores, stream: &str, through: u64) -> Result<StreamChange, Error> {
        let Some(mut meta) = self.stream_meta(stores, stream)? else { return Ok(StreamChange::default()) };
        let horizon = meta.horizon.max(through.min(meta.last_offset));
        if horizon == meta.horizon {
            return Ok(StreamChange::default());
        }
        let (mut events, mut bytes) = (0, 0);
        self.for_each_event(stores, stream, meta.horizon, horizon, |_, value| {
            events += 1;
            bytes += payload_len(value);
            Ok(true)
        })?;
        let old = meta.horizon;
        meta.horizon = horizon;
        meta.events -= events;
        meta.bytes -= bytes;
        let writes = vec![(meta_key(stream), meta.encode())];
        Ok(StreamChange {
            writes,
            trim: Some((name_prefix(stream)?, old, horizon)),
            ..StreamChange::default()
        })
    }

    /// The offset to trim `stream` through so it keeps at most `keep_events` events and none
    /// created before `cutoff_s` (unix seconds), looking at no more than `scan_max` events; `None`
    /// when nothing is due.
    pub fn retention_point(
        &self,
        stores: &Stores,
        stream: &str,
        keep_events: Option<u64>,
        cutoff_s: Option<i64>,
        scan_max: u64,
    ) -> Result<Option<u64>, Error> {
        let Some(meta) = self.stream_meta(stores, stream)? else { return Ok(None) };
        let over = keep_events.map_or(0, |keep| meta.events.saturating_sub(keep)).min(scan_max);
        let (mut seen, mut through) = (0u64, None);
        self.for_each_event(stores, stream, meta.horizon, meta.last_offset, |offset, value| {
            let old = cutoff_s.is_some_and(|cutoff| {
                value.get(..8).is_some_and(|at| i64::from_le_bytes(at.try_into().expect("8 bytes")) < cutoff)
            });
            if seen >= scan_max || (seen >= over && !old) {
                return Ok(false);
            }
            seen += 1;
            through = Some(offset);
            Ok(true)
        })?;
        Ok(through)
    }

    /// Every consumer of `stream` with its offset, by name.
    pub fn consumers(&self, stores: &Stores, stream: &str) -> Result<Vec<(String, u64)>, Error> {
        let prefix = consumer_key(stream, "")?;
        let mut found: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        for guard in stores.streams.prefix(&prefix) {
            let (key, value) = guard.into_inner()?;
            found.insert(key.to_vec(), value.to_vec());
        }
        for overlay in self.frozen.into_iter().chain([self.active]) {
            let upper = (Bound::Included(prefix.clone()), Bound::Unbounded);
            for (key, value) in
                overlay.streams.range::<Vec<u8>, _>(upper).take_while(|(k, _)| k.starts_with(&prefix))
            {
                found.insert(key.clone(), value.clone());
            }
        }
        found
            .into_iter()
            .map(|(key, value)| {
                let name = String::from_utf8(key[prefix.len()..].to_vec())
                    .map_err(|_| corrupt("consumer name".into()))?;
                let offset = value
                    .as_slice()
                    .try_into()
                    .map(u64::from_le_bytes)
                    .map_err(|_| corrupt("offset".into()))?;
                Ok((name, offset))
            })
            .collect()
    }

    /// Up to `limit` streams with names after `after`, by name, with their first stored offset.
    pub fn streams(&self, stores: &Stores, after: &str, limit: usize) -> Result<Vec<StreamInfo>, Error> {
        let from = meta_key(after);
        let mut names: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        let range = (Bound::Excluded(from.clone()), Bound::Excluded(vec![TAG_META + 1]));
        for guard in stores.streams.range(range.clone()).take(limit) {
            let (key, value) = guard.into_inner()?;
            names.insert(key.to_vec(), value.to_vec());
        }
        for overlay in self.frozen.into_iter().chain([self.active]) {
            for (key, value) in overlay.streams.range::<Vec<u8>, _>(range.clone()).take(limit) {
                names.insert(key.clone(), value.clone());
            }
        }
        let mut infos = Vec::new();
        for (key, value) in names.into_iter().take(limit) {
            let name = String::from_utf8(key[1..].to_vec()).map_err(|_| corrupt("stream name".into()))?;
            let meta = StreamMeta::decode(&value)?;
            let mut first_offset = None;
            self.for_each_event(stores, &name, meta.horizon, meta.last_offset, |offset, _| {
                first_offset = Some(offset);
                Ok(false)
            })?;
            infos.push(StreamInfo { name, meta, first_offset });
        }
        Ok(infos)
    }
}

/// Deletes from fjall the stored events at or below each trim's horizon, in batches of at most
/// [`TRIM_DELETES_PER_BATCH`], after the flush that records the trims committed. The count of
/// events deleted.
pub fn delete_trimmed(stores: &Stores, trims: &[(Vec<u8>, u64)]) -> Result<usize, fjall::Error> {
    let mut deleted = 0;
    for (prefix, horizon) in trims {
        loop {
            let mut batch = stores.database.batch();
            for guard in stores
                .stream_events
                .range(event_key(prefix, 0)..=event_key(prefix, *horizon))
                .take(TRIM_DELETES_PER_BATCH)
            {
                batch.remove(&stores.stream_events, guard.key()?);
            }
            let count = batch.len();
            if count == 0 {
                break;
            }
            batch.commit()?;
            deleted += count;
        }
    }
    Ok(deleted)
}

/// The shape a `streams` entry of a snapshot must have to load.
pub fn check_stream_entry(key: &[u8], value: &[u8]) -> Result<(), Error> {
    let utf8 = |bytes: &[u8], what: &str| {
        std::str::from_utf8(bytes).map(|_| ()).map_err(|_| corrupt(format!("{what} is not UTF-8")))
    };
    match key.first() {
        Some(&TAG_META) => {
            utf8(&key[1..], "stream name")?;
            StreamMeta::decode(value).map(|_| ())
        }
        Some(&TAG_CONSUMER) => {
            let short = || corrupt("consumer key too short".into());
            let len = usize::from(*key.get(1).ok_or_else(short)?);
            utf8(key.get(2..2 + len).ok_or_else(short)?, "stream name")?;
            utf8(&key[2 + len..], "consumer name")?;
            (value.len() == 8).then_some(()).ok_or_else(|| corrupt("consumer offset is not a u64".into()))
        }
        _ => Err(corrupt("unknown streams key tag".into())),
    }
}

/// The shape a `stream_events` entry of a snapshot must have to load.
pub fn check_event_entry(key: &[u8], value: &[u8]) -> Result<(), Error> {
    let len = usize::from(*key.first().ok_or_else(|| corrupt("empty event key".into()))?);
    if key.len() != 1 + len + 8 {
        return Err(corrupt("malformed event key".into()));
    }
    std::str::from_utf8(&key[1..1 + len]).map_err(|_| corrupt("stream name is not UTF-8".into()))?;
    decode_event(offset_of(key)?, value).map(|_| ())
}

/// How many entries of `stream` the `stream_events` keyspace holds.
pub fn stored_event_count(stores: &Stores, stream: &str) -> Result<usize, Error> {
    let mut count = 0;
    for guard in stores.stream_events.prefix(name_prefix(stream)?) {
        guard.key()?;
        count += 1;
    }
    Ok(count)
}

/// Deletes the events every stream holds at or below its horizon: what a crash between a trim's
/// flush and its deletes left behind. At open, before anything reads; one range probe per stream
/// when there is nothing to delete. The count of events deleted.
pub fn sweep_below_horizons(stores: &Stores) -> Result<usize, Error> {
    let mut trims = Vec::new();
    for guard in stores.streams.prefix([TAG_META]) {
        let (key, value) = guard.into_inner()?;
        let meta = StreamMeta::decode(&value)?;
        if meta.horizon > 0 {
            let stream =
                std::str::from_utf8(&key[1..]).map_err(|_| corrupt("stream name is not UTF-8".into()))?;
            trims.push((name_prefix(stream)?, meta.horizon));
        }
    }
    Ok(delete_trimmed(stores, &trims)?)
}

/// Every stream's horizon in a fjall snapshot, by event key prefix: which stored events a trim has
/// passed (still in storage between a flush's commit and its deletes).
pub struct Horizons(std::collections::HashMap<Vec<u8>, u64>);

impl Horizons {
    /// The horizons `snapshot` holds.
    pub fn of(stores: &Stores, snapshot: &fjall::Snapshot) -> Result<Horizons, Error> {
        use fjall::Readable;
        let mut horizons = std::collections::HashMap::new();
        for guard in snapshot.prefix(&stores.streams, [TAG_META]) {
            let (key, value) = guard.into_inner()?;
            let horizon = StreamMeta::decode(&value)?.horizon;
            if horizon > 0 {
                let stream =
                    std::str::from_utf8(&key[1..]).map_err(|_| corrupt("stream name is not UTF-8".into()))?;
                horizons.insert(name_prefix(stream)?, horizon);
            }
        }
        Ok(Horizons(horizons))
    }

    /// Whether the event stored under `key` is above its stream's horizon.
    pub fn keeps(&self, key: &[u8]) -> bool {
        let Some(at) = key.len().checked_sub(8) else { return true };
        let offset = u64::from_be_bytes(key[at..].try_into().expect("8 bytes"));
        self.0.get(&key[..at]).is_none_or(|horizon| offset > *horizon)
    }
}
