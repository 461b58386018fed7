//! How the embedded log stores and reads its input: events in chunks, each
//! record lent from the chunk RocksDB's iterator lends, in offset order.
//!
//! An append writes a partition's events as chunks of about
//! [`CHUNK_BYTES`]: key `[name][partition][first offset u64][CHUNK_TAG]` →
//! postcard `Vec<Event>`. One key per event (what databases written before
//! chunks hold: `[name][partition][offset]` → postcard [`Event`]) cost a
//! memtable insertion, a log record and a table entry per event, then an
//! iterator step per event to read it back. Both kinds are read, in one
//! partition too (a database written before chunks and appended to since):
//! a key's length tells them apart, and a chunk's key sorts after the
//! single event of its first offset and before the next offset's.

use super::{EmbeddedLog, be_u64, input_key};
use crate::db::{self, CF_INPUT, rocks};
use rocksdb::{ColumnFamily, DBRawIteratorWithThreadMode, ReadOptions, WriteBatch};
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
            records.push(record.into_record());
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
        // A raw iterator lends each entry's key and value: neither is
        // copied here. The first entry is the one holding `range.start`.
        let mut it = self.db.raw_iterator_cf_opt(cf, opts);
        let start = chunk_key(input, partition, range.start);
        let prefix = &start[..start.len() - 9];
        it.seek_for_prev(&start);
        let place = (input, partition);
        if !matches!(Entry::at(&it, prefix, place)?, Some(e) if e.end() > range.start) {
            // No entry holds the start: read on from the first entry past
            // it, which starts later (a gap) or is none (the end).
            it.seek(input_key(input, partition, range.start));
        }
        // An offset not found is corrupt, unless a trim took it meanwhile.
        let missing = |offset: u64| match self.watermarks(input, partition) {
            Ok((low, _)) if offset < low => Error::Trimmed {
                input: input.to_owned(),
                partition,
                from: offset,
                low,
            },
            _ => corrupt(place, format!("offset {offset} is missing")),
        };
        let bad = |offset: u64| {
            move |e: postcard::Error| {
                corrupt(
                    place,
                    format!("the event at offset {offset} does not decode: {e}"),
                )
            }
        };
        // Embedded offsets are dense: a gap is corruption.
        let mut offset = range.start;
        while offset < range.end {
            let Some(entry) = Entry::at(&it, prefix, place)? else {
                break;
            };
            if entry.first > offset || entry.end() <= offset {
                return Err(missing(offset));
            }
            let mut events = entry.events();
            let end = range.end.min(entry.end());
            for at in entry.first..offset {
                events.next().transpose().map_err(bad(at))?;
            }
            while offset < end {
                let event = (events.next().transpose().map_err(bad(offset))?)
                    .ok_or_else(|| missing(offset))?;
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
            }
            drop(events);
            it.next();
        }
        it.status().map_err(rocks("reading input"))?;
        Ok(offset - range.start)
    }

    /// The end of a partition's stored events (its high watermark as the
    /// database holds it; 0 without any).
    pub(super) fn stored_end(&self, input: &str, partition: u32) -> Result<u64> {
        let last = self.entry_before(input, partition, u64::MAX, "scanning an input partition")?;
        Ok(last.map_or(0, |(_, end)| end))
    }

    /// Where a trim of a partition below `below` may delete up to: the
    /// first offset of the entry holding `below` (a chunk is deleted
    /// whole, once all of it is below), or `below` itself when no entry
    /// holds it.
    pub(super) fn trim_cut(&self, input: &str, partition: u32, below: u64) -> Result<u64> {
        match self.entry_before(input, partition, below, "finding where to trim input")? {
            Some((first, end)) if end > below => Ok(first),
            _ => Ok(below),
        }
    }

    /// The first offset and the end of a partition's last entry starting
    /// at or before `offset` (a chunk or a single event), or `None` when
    /// none does; `doing` names the work in a RocksDB error.
    fn entry_before(
        &self,
        input: &str,
        partition: u32,
        offset: u64,
        doing: &str,
    ) -> Result<Option<(u64, u64)>> {
        let cf = db::cf(&self.db, CF_INPUT)?;
        let key = chunk_key(input, partition, offset);
        let mut it = self.db.raw_iterator_cf(cf);
        it.seek_for_prev(&key);
        match Entry::at(&it, &key[..key.len() - 9], (input, partition))? {
            Some(entry) => Ok(Some((entry.first, entry.end()))),
            None => {
                it.status().map_err(rocks(doing))?;
                Ok(None)
            }
        }
    }
}

/// The approximate size of a chunk of input events (its values'): a block
/// of the log's tables (`db::LOG_BLOCK`), so a step that starts inside a
/// chunk skips at most a block's worth of events, and a table holds about
/// one chunk per block.
pub(super) const CHUNK_BYTES: usize = 64 << 10;

/// Corruption found in a partition (`place`: input and partition).
fn corrupt((input, partition): (&str, u32), message: String) -> Error {
    Error::Corrupt {
        what: format!("input `{input}` partition {partition}"),
        message,
    }
}

/// The last byte of a chunk's key (a single event's key has none).
const CHUNK_TAG: u8 = 0xFF;

/// The key of a chunk whose first event is at `offset`.
fn chunk_key(name: &str, partition: u32, offset: u64) -> Vec<u8> {
    let mut key = input_key(name, partition, offset);
    key.push(CHUNK_TAG);
    key
}

/// Puts `events`, at offsets from `start` of a partition, into `wb` as
/// chunks of about [`CHUNK_BYTES`] (a larger event is a chunk of its own).
pub(super) fn put_chunks(
    wb: &mut WriteBatch,
    cf: &ColumnFamily,
    (input, partition): (&str, u32),
    start: u64,
    events: &[Event],
) -> Result<()> {
    // One key and one value buffer for all (the batch copies them).
    let mut key = chunk_key(input, partition, start);
    let offset_at = key.len() - 9;
    let mut value = Vec::with_capacity(CHUNK_BYTES + 64);
    let mut first = 0;
    while first < events.len() {
        let mut size = 0;
        let mut end = first;
        while end < events.len() && (end == first || size + events[end].value.len() <= CHUNK_BYTES)
        {
            size += events[end].value.len();
            end += 1;
        }
        key[offset_at..offset_at + 8].copy_from_slice(&(start + first as u64).to_be_bytes());
        value.clear();
        // `to_io` copies a value's bytes with one `extend_from_slice`.
        value =
            postcard::to_io(&events[first..end], value).map_err(Error::corrupt("input chunk"))?;
        wb.put_cf(cf, &key, &value);
        first = end;
    }
    Ok(())
}

/// One stored entry of a partition: a chunk, or a single event (written
/// before chunks), lent from an iterator.
struct Entry<'a> {
    /// The offset of its first event.
    first: u64,
    /// How many events it holds.
    count: u64,
    /// Its events' encodings: a chunk's after its count, or the one
    /// event's.
    events: &'a [u8],
}

impl<'a> Entry<'a> {
    /// The entry the iterator is at, if it is one of the partition `place`
    /// (input and partition) whose keys start with `prefix` (the
    /// partition's part of [`input_key`]).
    fn at(
        it: &'a DBRawIteratorWithThreadMode<'_, rocksdb::DB>,
        prefix: &[u8],
        place: (&str, u32),
    ) -> Result<Option<Entry<'a>>> {
        let (Some(key), Some(value)) = (it.key(), it.value()) else {
            return Ok(None);
        };
        let Some(rest) = key.strip_prefix(prefix) else {
            return Ok(None);
        };
        let (first, count, events) = match rest {
            [offset @ .., CHUNK_TAG] if offset.len() == 8 => {
                let first = be_u64(offset, "input offset")?;
                let (count, events) = postcard::take_from_bytes::<u64>(value).map_err(|e| {
                    corrupt(
                        place,
                        format!("the chunk at offset {first} has no count: {e}"),
                    )
                })?;
                (first, count, events)
            }
            offset if offset.len() == 8 => (be_u64(offset, "input offset")?, 1, value),
            _ => {
                let message = format!(
                    "a key with {} bytes after its partition's prefix (8 or 9 expected)",
                    rest.len()
                );
                return Err(corrupt(place, message));
            }
        };

        Ok(Some(Entry {
            first,
            count,
            events,
        }))
    }

    /// The offset after its last event (saturating: a corrupt count is
    /// then found short of events, not an overflow).
    fn end(&self) -> u64 {
        self.first.saturating_add(self.count)
    }

    /// Its events, decoded one by one.
    fn events(
        &self,
    ) -> impl Iterator<Item = std::result::Result<StoredEvent<'a>, postcard::Error>> + 'a {
        let mut rest = self.events;
        let mut left = self.count;
        std::iter::from_fn(move || {
            if left == 0 {
                return None;
            }
            left -= 1;
            Some(match postcard::take_from_bytes::<StoredEvent<'a>>(rest) {
                Ok((event, r)) => {
                    rest = r;
                    Ok(event)
                }
                Err(e) => Err(e),
            })
        })
    }
}

/// An input event as stored (an [`Event`]'s postcard encoding), its value
/// borrowed from the bytes it is read from.
#[derive(serde::Deserialize)]
struct StoredEvent<'a> {
    value: &'a [u8],
    weight: i64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use rocksdb::IteratorMode;
    use sluice_storage::{AppendBatch, LogBackend};

    fn open(dir: &std::path::Path) -> EmbeddedLog {
        EmbeddedLog::open(db::open(dir).unwrap()).unwrap()
    }

    fn ev(i: usize, len: usize) -> Event {
        let mut value = format!("{i}:").into_bytes();
        value.resize(len.max(value.len()), b'x');
        Event {
            value,
            weight: i as i64 % 3,
        }
    }

    fn append(log: &EmbeddedLog, events: Vec<Event>) -> Range<u64> {
        let batch = AppendBatch {
            appends: vec![("in".into(), 0, events)],
            mark: None,
            producer: None,
        };
        log.append(batch).unwrap().remove(0)
    }

    /// Every record of `range`, as (value, weight), weight 0 for a bad one.
    fn read(log: &EmbeddedLog, range: Range<u64>) -> Vec<(Vec<u8>, i64)> {
        let mut seen = Vec::new();
        let n = log
            .scan_range("in", 0, range.clone(), &mut |r| {
                seen.push(match r {
                    RecordRef::Event { value, weight } => (value.to_vec(), weight),
                    RecordRef::Bad(bad) => (bad.value.unwrap_or_default(), 0),
                });
                Ok(())
            })
            .unwrap();
        assert_eq!(n, seen.len() as u64);
        seen
    }

    fn expected(events: &[Event], range: Range<u64>) -> Vec<(Vec<u8>, i64)> {
        events[range.start as usize..range.end as usize]
            .iter()
            .map(|e| (e.value.clone(), e.weight))
            .collect()
    }

    fn keys(log: &EmbeddedLog) -> Vec<Box<[u8]>> {
        let cf = db::cf(&log.db, CF_INPUT).unwrap();
        (log.db.iterator_cf(cf, IteratorMode::Start))
            .map(|kv| kv.unwrap().0)
            .collect()
    }

    /// An append is split into chunks of about `CHUNK_BYTES` (an event
    /// larger than that is a chunk of its own); any range reads back
    /// exactly its events, from inside chunks too.
    #[test]
    fn appends_are_stored_in_chunks_and_read_from_any_offset() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path());
        log.create_input("in", 1).unwrap();
        let mut events: Vec<Event> = (0..300).map(|i| ev(i, 1000)).collect();
        events[150] = ev(150, 3 * CHUNK_BYTES);
        assert_eq!(append(&log, events[..200].to_vec()), 0..200);
        assert_eq!(append(&log, events[200..].to_vec()), 200..300);
        // 65 events of 1000 bytes fill a chunk: 150 in three chunks, the
        // large one alone, then 49, then 65 and 35.
        let chunks = keys(&log);
        assert_eq!(chunks.len(), 3 + 1 + 1 + 2, "{chunks:?}");
        assert!(chunks.iter().all(|k| k.last() == Some(&CHUNK_TAG)));
        for range in [
            0..300,
            0..1,
            64..66,
            65..130,
            149..152,
            150..151,
            199..201,
            299..300,
        ] {
            assert_eq!(read(&log, range.clone()), expected(&events, range));
        }
        assert_eq!(read(&log, 290..400).len(), 10, "reads stop at the end");
        assert!(read(&log, 300..400).is_empty());
        assert!(read(&log, 301..400).is_empty());
        assert_eq!(log.stored_end("in", 0).unwrap(), 300);
    }

    /// A trim deletes the chunks wholly below it and keeps the one holding
    /// its offset; what is above reads back, after a reopen too.
    #[test]
    fn a_trim_inside_a_chunk_keeps_the_chunk() {
        let dir = tempfile::tempdir().unwrap();
        let events: Vec<Event> = (0..200).map(|i| ev(i, 1000)).collect();
        {
            let log = open(dir.path());
            log.create_input("in", 1).unwrap();
            append(&log, events.clone());
            assert_eq!(keys(&log).len(), 4);
            log.trim("in", 0, 100).unwrap();
            assert_eq!(keys(&log).len(), 3, "the chunk of 0..65 is gone");
            assert_eq!(read(&log, 100..200), expected(&events, 100..200));
            assert!(matches!(
                log.scan_range("in", 0, 99..100, &mut |_| Ok(())),
                Err(Error::Trimmed { low: 100, .. })
            ));
            log.trim("in", 0, 130).unwrap();
            assert_eq!(keys(&log).len(), 2, "a chunk ending at the trim goes");
        }
        let log = open(dir.path());
        assert_eq!(log.watermarks("in", 0).unwrap(), (130, 200));
        assert_eq!(read(&log, 130..200), expected(&events, 130..200));
        log.trim("in", 0, 120).unwrap();
        assert_eq!(log.watermarks("in", 0).unwrap(), (130, 200), "below low");
        log.trim("in", 0, 200).unwrap();
        assert!(keys(&log).is_empty());
        assert!(read(&log, 200..300).is_empty());
        drop(log);
        let log = open(dir.path());
        assert_eq!(log.watermarks("in", 0).unwrap(), (200, 200));
        assert_eq!(append(&log, vec![ev(7, 10)]), 200..201);
        assert_eq!(read(&log, 200..201), expected(&[ev(7, 10)], 0..1));
    }

    /// A database written before chunks (one key per event) is read, and
    /// appended to, trimmed and reopened, with chunks after its events.
    #[test]
    fn events_stored_one_per_key_are_read_beside_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let events: Vec<Event> = (0..120).map(|i| ev(i, 1000)).collect();
        {
            let log = open(dir.path());
            log.create_input("in", 2).unwrap();
            let cf = db::cf(&log.db, CF_INPUT).unwrap();
            // As the version before chunks wrote them, in partition 0 and
            // (one event, which must not be read as partition 0's) in 1.
            for (i, event) in events[..10].iter().enumerate() {
                let value = postcard::to_allocvec(event).unwrap();
                log.db
                    .put_cf(cf, input_key("in", 0, i as u64), value)
                    .unwrap();
            }
            let value = postcard::to_allocvec(&ev(99, 5)).unwrap();
            log.db.put_cf(cf, input_key("in", 1, 0), value).unwrap();
        }
        let log = open(dir.path());
        assert_eq!(log.watermarks("in", 0).unwrap(), (0, 10));
        assert_eq!(log.watermarks("in", 1).unwrap(), (0, 1));
        assert_eq!(read(&log, 3..7), expected(&events, 3..7));
        assert_eq!(append(&log, events[10..].to_vec()), 10..120);
        assert_eq!(read(&log, 0..120), expected(&events, 0..120));
        assert_eq!(read(&log, 9..11), expected(&events, 9..11));
        log.trim("in", 0, 5).unwrap();
        assert_eq!(
            keys(&log).len(),
            5 + 2 + 1,
            "five single events, two chunks, partition 1"
        );
        assert_eq!(read(&log, 5..120), expected(&events, 5..120));
        log.trim("in", 0, 11).unwrap();
        assert_eq!(keys(&log).len(), 2 + 1);
        drop(log);
        let log = open(dir.path());
        assert_eq!(log.watermarks("in", 0).unwrap(), (11, 120));
        assert_eq!(read(&log, 11..120), expected(&events, 11..120));
    }

    /// A partition whose entries skip an offset is corrupt, not short.
    #[test]
    fn a_gap_between_entries_is_corruption() {
        let dir = tempfile::tempdir().unwrap();
        let log = open(dir.path());
        log.create_input("in", 1).unwrap();
        let cf = db::cf(&log.db, CF_INPUT).unwrap();
        for (first, events) in [(0, vec![ev(0, 4), ev(1, 4)]), (3, vec![ev(3, 4)])] {
            let mut wb = WriteBatch::default();
            put_chunks(&mut wb, cf, ("in", 0), first, &events).unwrap();
            log.db.write(wb).unwrap();
        }
        let err = log.scan_range("in", 0, 0..4, &mut |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("offset 2 is missing"), "{err}");
        let err = log.scan_range("in", 0, 2..4, &mut |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("offset 2 is missing"), "{err}");
        // A partition whose first entries are gone, and the one before it
        // (whose last entry must not be read as this one's).
        log.create_input("a", 2).unwrap();
        let a = db::cf(&log.db, CF_INPUT).unwrap();
        let mut wb = WriteBatch::default();
        put_chunks(&mut wb, a, ("a", 0), 0, &[ev(0, 4), ev(1, 4)]).unwrap();
        put_chunks(&mut wb, a, ("a", 1), 2, &[ev(2, 4)]).unwrap();
        log.db.write(wb).unwrap();
        let err = log.scan_range("a", 1, 0..3, &mut |_| Ok(())).unwrap_err();
        assert!(err.to_string().contains("offset 0 is missing"), "{err}");
    }

    /// The first offsets of a partition's entries, in order.
    fn firsts(log: &EmbeddedLog, partition: u32) -> Vec<u64> {
        let key = input_key("in", partition, 0);
        let prefix = &key[..key.len() - 8];
        keys(log)
            .iter()
            .filter_map(|k| k.strip_prefix(prefix))
            .map(|rest| be_u64(&rest[..8], "offset").unwrap())
            .collect()
    }

    /// One step of [`behaves_like_a_vector`]: fractions pick offsets
    /// within what the partition holds.
    #[derive(Clone, Debug)]
    enum Op {
        /// Append events of these lengths to a partition.
        Append(u32, Vec<usize>),
        /// Trim a partition below a fraction of its events.
        Trim(u32, f64),
        /// Close and open the database.
        Reopen,
    }

    fn op() -> impl Strategy<Value = Op> {
        // Mostly small events (many per chunk), some near a chunk's size,
        // a few larger than one.
        let len = prop_oneof![
            8 => 1usize..3_000,
            1 => CHUNK_BYTES - 100..CHUNK_BYTES + 100,
            1 => CHUNK_BYTES + 1..3 * CHUNK_BYTES,
        ];
        prop_oneof![
            4 => (0u32..2, prop::collection::vec(len, 1..120)).prop_map(|(p, l)| Op::Append(p, l)),
            2 => (0u32..2, 0.0f64..1.2).prop_map(|(p, f)| Op::Trim(p, f)),
            1 => Just(Op::Reopen),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Appends (after a prefix stored one event per key, as before
        /// chunks), trims and reopens of two partitions agree with a
        /// vector of events and a low watermark per partition: every
        /// range reads back its events, or `Trimmed` below the low, or
        /// stops at the end; and a trim leaves no entry wholly below it.
        #[test]
        fn behaves_like_a_vector(
            single in 0usize..20,
            ops in prop::collection::vec(op(), 1..25),
            reads in prop::collection::vec((0.0f64..1.1, 0.0f64..1.1), 8),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let mut log = open(dir.path());
            log.create_input("in", 2).unwrap();
            let mut model: [(u64, Vec<Event>); 2] = Default::default();
            let cf = db::cf(&log.db, CF_INPUT).unwrap();
            for i in 0..single {
                let event = ev(i, 100 + i * 50);
                let value = postcard::to_allocvec(&event).unwrap();
                log.db.put_cf(cf, input_key("in", 1, i as u64), value).unwrap();
                model[1].1.push(event);
            }
            let mut next = single;
            for op in ops {
                match op {
                    Op::Append(p, lens) => {
                        let events: Vec<Event> = lens.iter().map(|&l| {
                            next += 1;
                            ev(next, l)
                        }).collect();
                        let events_of = &mut model[p as usize].1;
                        let start = events_of.len() as u64;
                        let batch = AppendBatch {
                            appends: vec![("in".into(), p, events.clone())],
                            mark: None,
                            producer: None,
                        };
                        let ranges = log.append(batch).unwrap();
                        prop_assert_eq!(ranges.len(), 1);
                        prop_assert_eq!(ranges[0].clone(), start..start + events.len() as u64);
                        events_of.extend(events);
                    }
                    Op::Trim(p, f) => {
                        let (low, events) = &mut model[p as usize];
                        let below = (events.len() as f64 * f) as u64;
                        log.trim("in", p, below).unwrap();
                        *low = (*low).max(below.min(events.len() as u64));
                    }
                    Op::Reopen => {
                        drop(log);
                        log = open(dir.path());
                    }
                }
                for (p, (low, events)) in model.iter().enumerate() {
                    let (p, end) = (p as u32, events.len() as u64);
                    prop_assert_eq!(log.watermarks("in", p).unwrap(), (*low, end));
                    // (All trimmed, nothing is stored: the low says where
                    // the partition ends.)
                    let stored = if *low < end { end } else { 0 };
                    prop_assert_eq!(log.stored_end("in", p).unwrap(), stored);
                    // No entry wholly below the low: the first one holds
                    // it, the second starts above it.
                    let firsts = firsts(&log, p);
                    if *low < end {
                        prop_assert!(firsts[0] <= *low, "{:?} low {}", firsts, low);
                        prop_assert!(firsts.get(1).is_none_or(|f| *f > *low), "{:?} low {}", firsts, low);
                    } else {
                        prop_assert!(firsts.is_empty(), "{:?} with nothing to read", firsts);
                    }
                    for &(a, b) in &reads {
                        let (a, b) = ((end as f64 * a) as u64, (end as f64 * b) as u64);
                        let range = a.min(b)..a.max(b);
                        let mut seen = Vec::new();
                        let result = log.scan_range("in", p, range.clone(), &mut |r| {
                            if let RecordRef::Event { value, weight } = r {
                                seen.push((value.to_vec(), weight));
                            } else if let RecordRef::Bad(bad) = r {
                                seen.push((bad.value.unwrap_or_default(), 0));
                            }
                            Ok(())
                        });
                        if range.start < *low && !range.is_empty() {
                            prop_assert!(matches!(result, Err(Error::Trimmed { .. })), "{:?}", result);
                            prop_assert!(seen.is_empty(), "{} records before `Trimmed`", seen.len());
                        } else {
                            let upto = range.end.min(end).max(range.start);
                            prop_assert_eq!(result.unwrap(), upto - range.start);
                            if range.start < end {
                                prop_assert!(seen == expected(events, range.start..upto));
                            } else {
                                prop_assert!(seen.is_empty());
                            }
                        }
                    }
                }
            }
        }
    }
}
