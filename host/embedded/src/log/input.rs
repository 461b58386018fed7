//! How the embedded log reads its input: each record lent from RocksDB's
//! iterator, in offset order.

use super::{EmbeddedLog, input_key};
use crate::db::{self, CF_INPUT, rocks};
use rocksdb::ReadOptions;
use sluice_core::Event;
use sluice_core::bad_records::marked_record_error;
use sluice_storage::{
    BadRecord, InputRecord, LogBackend, RecordRef, Result, StorageError as Error,
};
use std::ops::Range;

impl EmbeddedLog {
    /// With `exact`, fails (transiently) if `range` extends past the
    /// partition's end: what an exact read checks before reading.
    pub(super) fn check_visible(
        &self,
        input: &str,
        partition: u32,
        range: &Range<u64>,
        exact: bool,
    ) -> Result<()> {
        if exact {
            let (_, high) = self.watermarks(input, partition)?;
            if high < range.end {
                return Err(sluice_storage::log::not_visible(
                    input, partition, range.end, high,
                ));
            }
        }
        Ok(())
    }

    /// The records of offsets `range` of one partition: a record stored
    /// with weight 0 (a line an ingest kept as not an event) as a
    /// [`BadRecord`], the others as events.
    pub(super) fn read_range(
        &self,
        input: &str,
        partition: u32,
        range: Range<u64>,
    ) -> Result<Vec<InputRecord>> {
        let expected = range.end.saturating_sub(range.start);
        let mut records = Vec::with_capacity(expected.min(1 << 20) as usize);
        self.scan_range(input, partition, range, &mut |record| {
            records.push(match record {
                RecordRef::Event { value, weight } => InputRecord::Event(Event {
                    value: value.to_vec(),
                    weight,
                }),
                RecordRef::Bad(bad) => InputRecord::Bad(bad),
            });
            Ok(())
        })?;
        Ok(records)
    }

    /// Lends the records at offsets `range` of a partition to `each`, in
    /// order (what [`read_range`](Self::read_range) collects); returns how
    /// many.
    pub(super) fn scan_range(
        &self,
        input: &str,
        partition: u32,
        range: Range<u64>,
        each: &mut dyn FnMut(RecordRef<'_>) -> Result<()>,
    ) -> Result<u64> {
        let (low, _) = self.watermarks(input, partition)?;
        if range.start < low && !range.is_empty() {
            return Err(Error::Trimmed {
                input: input.to_owned(),
                partition,
                from: range.start,
                low,
            });
        }
        if range.is_empty() {
            return Ok(0);
        }
        let cf = db::cf(&self.db, CF_INPUT)?;
        let mut opts = ReadOptions::default();
        opts.set_iterate_upper_bound(input_key(input, partition, range.end));
        // A raw iterator lends each record's key and value: neither is
        // copied here.
        let mut it = self.db.raw_iterator_cf_opt(cf, opts);
        // The key each record must have: the partition's prefix, then its
        // offset (embedded offsets are dense: a gap is corruption).
        let mut expected = input_key(input, partition, range.start);
        let offset_at = expected.len() - 8;
        it.seek(&expected);
        let mut offset = range.start;
        while let (Some(k), Some(v)) = (it.key(), it.value()) {
            expected[offset_at..].copy_from_slice(&offset.to_be_bytes());
            if k != expected.as_slice() {
                return Err(Error::Corrupt {
                    what: format!("input `{input}` partition {partition}"),
                    message: format!("offset {offset} is missing"),
                });
            }
            let event: StoredEvent<'_> =
                postcard::from_bytes(v).map_err(Error::corrupt("input event"))?;
            each(match event.weight {
                0 => RecordRef::Bad(BadRecord {
                    offset,
                    position: format!("{input}/{partition}@{offset}"),
                    error: marked_record_error(event.value),
                    value: Some(event.value.to_vec()),
                }),
                weight => RecordRef::Event {
                    value: event.value,
                    weight,
                },
            })?;
            offset += 1;
            it.next();
        }
        it.status().map_err(rocks("reading input"))?;
        Ok(offset - range.start)
    }
}

/// An input event as stored (an [`Event`]'s postcard encoding), its value
/// borrowed from the bytes it is read from.
#[derive(serde::Deserialize)]
struct StoredEvent<'a> {
    value: &'a [u8],
    weight: i64,
}
