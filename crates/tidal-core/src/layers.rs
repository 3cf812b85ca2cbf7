//! Ordered reads over the layers of the applied state: sorted in-memory maps (a pending change, the
//! active overlay, the frozen one) over a fjall range, merged by key.
//!
//! The first layer (in the order given) that holds a key wins; a `None` value there is a delete
//! that hides the key in every later layer. Layers hold the same value for a key whenever none of
//! them is a newer write (stream events are never rewritten), so the rule only matters for keys a
//! later write changed or deleted.

use std::ops::Bound;

use fjall::Keyspace;

use crate::error::Error;

/// A stored entry: key, and value or `None` for a delete.
type Entry = (Vec<u8>, Option<Vec<u8>>);

/// One sorted source of entries.
pub(crate) struct Layer<'a> {
    next: Option<Entry>,
    source: Box<dyn Iterator<Item = Result<Entry, Error>> + 'a>,
}

impl<'a> Layer<'a> {
    /// A map range whose entries are all values.
    pub(crate) fn memory(entries: impl Iterator<Item = (&'a Vec<u8>, &'a Vec<u8>)> + 'a) -> Layer<'a> {
        Layer { next: None, source: Box::new(entries.map(|(k, v)| Ok((k.clone(), Some(v.clone()))))) }
    }

    /// A map range that may hold deletes.
    pub(crate) fn memory_or_deleted(
        entries: impl Iterator<Item = (&'a Vec<u8>, &'a Option<Vec<u8>>)> + 'a,
    ) -> Layer<'a> {
        Layer { next: None, source: Box::new(entries.map(|(k, v)| Ok((k.clone(), v.clone())))) }
    }

    /// fjall's entries in `range`.
    pub(crate) fn fjall(keyspace: &Keyspace, range: (Bound<Vec<u8>>, Bound<Vec<u8>>)) -> Layer<'a> {
        let entries = keyspace.range(range).map(|guard| {
            let (key, value) = guard.into_inner()?;
            Ok((key.to_vec(), Some(value.to_vec())))
        });
        Layer { next: None, source: Box::new(entries) }
    }

    fn peek_key(&mut self) -> Result<Option<&[u8]>, Error> {
        if self.next.is_none() {
            self.next = self.source.next().transpose()?;
        }
        Ok(self.next.as_ref().map(|(k, _)| k.as_slice()))
    }

    fn take(&mut self) -> Option<Vec<u8>> {
        self.next.take().and_then(|(_, value)| value)
    }
}

/// Calls `visit` with every live entry of the merged layers, in key order, until it returns false.
pub(crate) fn for_each_merged(
    layers: &mut [Layer<'_>],
    mut visit: impl FnMut(&[u8], &[u8]) -> Result<bool, Error>,
) -> Result<(), Error> {
    loop {
        let mut smallest: Option<Vec<u8>> = None;
        for layer in layers.iter_mut() {
            if let Some(key) = layer.peek_key()? {
                if smallest.as_ref().is_none_or(|s| key < s.as_slice()) {
                    smallest = Some(key.to_vec());
                }
            }
        }
        let Some(key) = smallest else { return Ok(()) };
        // The first layer holding the key decides; the others' entries for it are dropped.
        let mut value: Option<Option<Vec<u8>>> = None;
        for layer in layers.iter_mut() {
            if layer.peek_key()?.is_some_and(|k| k == key.as_slice()) {
                let taken = layer.take();
                value.get_or_insert(taken);
            }
        }
        if let Some(value) = value.flatten() {
            if !visit(&key, &value)? {
                return Ok(());
            }
        }
    }
}
