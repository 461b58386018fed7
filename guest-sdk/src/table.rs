//! Keyed state that restores by copying: per shard, one hash table whose
//! keys lie as their encodings (the bytes the exchange routes by) back to
//! back in one byte arena, with its index — open addressing over a fixed
//! hash ([`sluice_shard::hash`]) — and its values in flat arrays.
//!
//! Why not a `BTreeMap<K, V>` per operator: a lookup there compares keys
//! O(log n) times (`memcmp` was 14.5 % of word count's profile), every key
//! is its own allocation, and a restore decodes and re-inserts every key
//! (23–61 s per GiB). Here a lookup hashes the key's encoding once and
//! compares it about once; a key is a slice of the arena; a snapshot of a
//! shard writes its arena, spans and index as they lie in memory, and a
//! restore copies them back — no per-key decode, hash or insert. Only the
//! values (small accumulators) are encoded one by one.
//!
//! The table tracks which shards changed since the last snapshot, so an
//! incremental checkpoint writes only those.
//!
//! Iteration follows insertion order (with removals swapped in from the
//! end): deterministic for the same sequence of changes, which is all a
//! replay needs; the host compares outputs as multisets.

use crate::codec;
use crate::error::{Error, Result};
use crate::state::{SHARDS, Shards};
use serde::{Serialize, de::DeserializeOwned};
use sluice_shard::{hash, shard_of_hash};

/// The format byte that starts every piece this module writes.
const PIECE_FORMAT: u8 = 1;

/// An index slot that holds no entry.
const EMPTY: u32 = 0;

/// No entry (a removed key's record) or no record (an entry's).
const NONE: u32 = u32::MAX;

/// A key first touched since the last snapshot: its entry now ([`NONE`]
/// once removed), where its bytes lie in `since_keys`, its value then.
#[derive(Clone)]
struct Since<A> {
    entry: u32,
    key: (u32, u32),
    then: A,
}

/// One shard's table.
#[derive(Clone)]
struct Table<A> {
    /// The keys' encodings back to back, with the bytes of removed keys
    /// until the next compaction.
    arena: Vec<u8>,
    /// Per entry: where its key lies in `arena` (start, length).
    spans: Vec<[u32; 2]>,
    /// Per entry: its value.
    values: Vec<A>,
    /// Per entry: the last step that touched it (not stored).
    marks: Vec<u32>,
    /// Per entry: its record in `since`, or [`NONE`] (not stored).
    since_of: Vec<u32>,
    /// Keys first touched since the last snapshot, with their values then
    /// (not stored): what a delta piece is computed from. The keys lie in
    /// `since_keys` (start, length). Recording stops once the shard is
    /// bound to be written whole (`whole`): a shard that changes a lot
    /// costs no memory for it.
    since: Vec<Since<A>>,
    since_keys: Vec<u8>,
    /// The shard changed beyond its delta budget since the last snapshot.
    whole: bool,
    /// Entries written as deltas since the shard was last written whole,
    /// in this instance or in the checkpoint it was restored from (not
    /// stored): bounds the work a restore spends merging deltas.
    chain: usize,
    /// Open addressing with linear probing: entry index + 1, or [`EMPTY`].
    /// The length is 0 or a power of two.
    index: Vec<u32>,
    /// Bytes of `arena` no entry uses.
    garbage: usize,
}

impl<A> Default for Table<A> {
    fn default() -> Self {
        Table {
            arena: Vec::new(),
            spans: Vec::new(),
            values: Vec::new(),
            marks: Vec::new(),
            since_of: Vec::new(),
            since: Vec::new(),
            since_keys: Vec::new(),
            whole: false,
            chain: 0,
            index: Vec::new(),
            garbage: 0,
        }
    }
}

/// The home slot of a key's hash in an index of `len` slots. The low bits
/// chose the shard (all keys of a table share them), so use the high ones.
fn home(hash: u64, len: usize) -> usize {
    ((hash >> 32) as usize ^ (hash >> 10) as usize) & (len - 1)
}

impl<A> Table<A> {
    /// Gives every entry its marks (a restored table has none until its
    /// first change).
    fn ensure_marks(&mut self) {
        if self.marks.len() < self.spans.len() {
            self.marks.resize(self.spans.len(), 0);
            self.since_of.resize(self.spans.len(), NONE);
        }
    }

    /// Drops the records of keys touched since the last snapshot.
    fn forget_since(&mut self) {
        for r in &self.since {
            if let Some(of) = self.since_of.get_mut(r.entry as usize) {
                *of = NONE;
            }
        }
        self.since = Vec::new();
        self.since_keys = Vec::new();
    }

    fn key(&self, entry: usize) -> &[u8] {
        let [start, len] = self.spans[entry];
        &self.arena[start as usize..(start + len) as usize]
    }

    fn len(&self) -> usize {
        self.spans.len()
    }

    /// The entry holding `key` (whose hash is `h`).
    fn find(&self, key: &[u8], h: u64) -> Option<usize> {
        if self.index.is_empty() {
            return None;
        }
        let mask = self.index.len() - 1;
        let mut pos = home(h, self.index.len());
        loop {
            let slot = self.index[pos];
            if slot == EMPTY {
                return None;
            }
            let entry = (slot - 1) as usize;
            let [_, len] = self.spans[entry];
            if len as usize == key.len() && self.key(entry) == key {
                return Some(entry);
            }
            pos = (pos + 1) & mask;
        }
    }

    /// The index position that points at `entry`.
    fn slot_of(&self, entry: usize) -> usize {
        let mask = self.index.len() - 1;
        let mut pos = home(hash(self.key(entry)), self.index.len());
        while self.index[pos] != entry as u32 + 1 {
            pos = (pos + 1) & mask;
        }
        pos
    }

    fn place(&mut self, entry: usize, h: u64) {
        let mask = self.index.len() - 1;
        let mut pos = home(h, self.index.len());
        while self.index[pos] != EMPTY {
            pos = (pos + 1) & mask;
        }
        self.index[pos] = entry as u32 + 1;
    }

    /// Doubles the index and places every entry again.
    fn grow(&mut self) {
        let len = (self.index.len() * 2).max(16);
        self.index = vec![EMPTY; len];
        for entry in 0..self.len() {
            let h = hash(self.key(entry));
            self.place(entry, h);
        }
    }

    /// Adds `key` (hash `h`, not present) with `value`; returns its entry.
    fn insert(&mut self, key: &[u8], h: u64, value: A) -> Result<usize> {
        self.ensure_marks();
        // At most half full: a key not in the table (every key of a
        // key-heavy step) is found missing after 1.5-2.5 probes on
        // average, not up to 8.5 as at 3/4 (which restored indexes written
        // before may still be at, until they grow).
        if (self.len() + 1) * 2 > self.index.len() {
            self.grow();
        }
        let start = u32::try_from(self.arena.len())
            .ok()
            .filter(|s| s.checked_add(key.len() as u32).is_some())
            .ok_or_else(|| Error::Failed("a shard's keys outgrew 4 GiB".into()))?;
        self.arena.extend_from_slice(key);
        self.spans.push([start, key.len() as u32]);
        self.values.push(value);
        self.marks.push(0);
        self.since_of.push(NONE);
        let entry = self.len() - 1;
        self.place(entry, h);
        Ok(entry)
    }

    /// Removes `entry`; the last entry takes its place (its index changes
    /// from `len - 1` to `entry`).
    fn remove(&mut self, entry: usize) {
        self.ensure_marks();
        let mask = self.index.len() - 1;
        // Backward-shift deletion: no tombstones, probe runs stay short.
        let mut hole = self.slot_of(entry);
        let mut next = (hole + 1) & mask;
        loop {
            let slot = self.index[next];
            if slot == EMPTY {
                break;
            }
            let want = home(hash(self.key((slot - 1) as usize)), self.index.len());
            // Move it into the hole unless its home lies cyclically in
            // (hole, next].
            let stays = if hole <= next {
                hole < want && want <= next
            } else {
                hole < want || want <= next
            };
            if !stays {
                self.index[hole] = slot;
                hole = next;
            }
            next = (next + 1) & mask;
        }
        self.index[hole] = EMPTY;
        let last = self.len() - 1;
        if entry != last {
            let pos = self.slot_of(last);
            self.index[pos] = entry as u32 + 1;
        }
        self.garbage += self.spans[entry][1] as usize;
        self.spans.swap_remove(entry);
        self.values.swap_remove(entry);
        self.marks.swap_remove(entry);
        // A key removed since the snapshot is now worth nothing; the entry
        // moved into its place keeps its record.
        if let Some(r) = self.since.get_mut(self.since_of[entry] as usize) {
            r.entry = NONE;
        }
        if entry != last {
            self.since_of[entry] = self.since_of[last];
            if let Some(r) = self.since.get_mut(self.since_of[entry] as usize) {
                r.entry = entry as u32;
            }
        }
        self.since_of.pop();
        if self.spans.is_empty() {
            // Keep what tracks changes; drop the storage.
            self.arena = Vec::new();
            self.index = Vec::new();
            self.garbage = 0;
        } else if self.garbage > 4096 && self.garbage * 2 > self.arena.len() {
            self.compact();
        }
    }

    /// Rewrites the arena without the bytes of removed keys.
    fn compact(&mut self) {
        let mut arena = Vec::with_capacity(self.arena.len() - self.garbage);
        for span in &mut self.spans {
            let [start, len] = *span;
            span[0] = arena.len() as u32;
            arena.extend_from_slice(&self.arena[start as usize..(start + len) as usize]);
        }
        self.arena = arena;
        self.garbage = 0;
    }
}

impl<A: Serialize + DeserializeOwned> Table<A> {
    /// The piece: format, counts, then arena, spans and index as they lie
    /// in memory (little-endian), then the values' encoding.
    fn write(&self) -> Result<Vec<u8>> {
        let mut out =
            Vec::with_capacity(13 + self.arena.len() + self.spans.len() * 8 + self.index.len() * 4);
        out.push(PIECE_FORMAT);
        for n in [self.arena.len(), self.spans.len(), self.index.len()] {
            out.extend_from_slice(&(n as u32).to_le_bytes());
        }
        out.extend_from_slice(&self.arena);
        for [start, len] in &self.spans {
            out.extend_from_slice(&start.to_le_bytes());
            out.extend_from_slice(&len.to_le_bytes());
        }
        for slot in &self.index {
            out.extend_from_slice(&slot.to_le_bytes());
        }
        postcard::to_extend(&self.values, out)
            .map_err(|e| Error::Failed(format!("encoding state: {e}")))
    }

    /// Reads a piece written by [`write`](Self::write), checking that it
    /// is consistent (a damaged piece is an error, never a panic later).
    fn read(op: &str, piece: &[u8]) -> Result<Self> {
        let bad = |what: &str| Error::IncompatibleSnapshot(format!("{op} state: {what}"));
        let (&format, rest) = piece.split_first().ok_or_else(|| bad("empty piece"))?;
        if format != PIECE_FORMAT {
            return Err(bad(&format!("piece format {format}")));
        }
        let mut counts = [0usize; 3];
        let mut rest = rest;
        for n in &mut counts {
            let (word, tail) = rest
                .split_first_chunk::<4>()
                .ok_or_else(|| bad("short header"))?;
            *n = u32::from_le_bytes(*word) as usize;
            rest = tail;
        }
        let [arena_len, entries, index_len] = counts;
        let need = arena_len + entries * 8 + index_len * 4;
        if rest.len() < need {
            return Err(bad("truncated piece"));
        }
        let (arena, rest) = rest.split_at(arena_len);
        let (spans, rest) = rest.split_at(entries * 8);
        let (index, values) = rest.split_at(index_len * 4);
        // One pass: convert, check each span lies in the arena, add up the
        // bytes in use.
        let mut used = 0usize;
        let mut within = true;
        let spans: Vec<[u32; 2]> = spans
            .chunks_exact(8)
            .map(|c| {
                let span = [
                    u32::from_le_bytes(c[..4].try_into().expect("4 bytes")),
                    u32::from_le_bytes(c[4..].try_into().expect("4 bytes")),
                ];
                let end = span[0] as usize + span[1] as usize;
                within &= end <= arena_len;
                used += span[1] as usize;
                span
            })
            .collect();
        let index: Vec<u32> = index
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        let values: Vec<A> = codec::from_state(op, values)?;
        // No index (a delta piece, merged entry by entry), or a complete one.
        let consistent = values.len() == entries
            && (index_len == 0 || index_len.is_power_of_two() && entries * 4 <= index_len * 3)
            && within
            && used <= arena_len
            && {
                // Each entry in exactly one slot: `entries` slots in use,
                // none naming an entry twice (one pass, a bit per entry).
                let mut seen = vec![0u64; entries.div_ceil(64)];
                let mut used_slots = 0;
                index.iter().all(|&s| {
                    if s == EMPTY {
                        return true;
                    }
                    used_slots += 1;
                    let e = s as usize - 1;
                    let (word, bit) = (e / 64, 1u64 << (e % 64));
                    e < entries && seen[word] & bit == 0 && {
                        seen[word] |= bit;
                        true
                    }
                }) && (used_slots == entries || index_len == 0)
            };
        if !consistent {
            return Err(bad("inconsistent piece"));
        }
        // Marks are made at the first change (see `ensure_marks`): a
        // restore writes only what it read.
        let table = Table {
            arena: arena.to_vec(),
            spans,
            values,
            index,
            garbage: arena_len - used,
            ..Table::default()
        };
        Ok(table)
    }
}

/// How many delta entries a shard of `len` keys may accumulate before it
/// is written whole again: an eighth to a half of its keys, by shard, so
/// that under changes spread evenly the shards are not all rewritten in
/// one checkpoint. It bounds what a restore merges entry by entry (at most
/// half the keys; the rest is copied) against how often a checkpoint
/// writes a shard whole.
fn delta_budget(shard: u32, len: usize) -> usize {
    (len * (1 + (shard as usize % 4)) / 8).max(64)
}

/// Values by key, split by shard. Keys are given as their encodings (see
/// [`encode_key`]); the caller decodes them when it needs them.
pub(crate) struct KeyedTable<A> {
    shards: Vec<Table<A>>,
    dirty: Shards,
    /// The current step's mark (entries touched in it carry it).
    step: u32,
    /// Whether to record, per shard, the keys changed since the last
    /// snapshot and their values then (for delta pieces).
    track: bool,
}

/// How a shard's changes since the last snapshot are written.
pub(crate) enum Change {
    /// Nothing to write: every change cancelled out.
    Nothing,
    /// A delta piece: per changed key, the value's change, which adds to
    /// the pieces written before.
    Delta(Vec<u8>),
    /// The whole shard, replacing the pieces written before.
    Whole,
}

/// Where an entry lies: shard, entry index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Slot {
    pub shard: u32,
    pub entry: u32,
}

impl<A: Default + Clone + Serialize + DeserializeOwned> KeyedTable<A> {
    /// A table; `track` records what changed since the last snapshot, for
    /// [`delta`](Self::delta) (a table that is never snapshotted skips it).
    pub(crate) fn new(track: bool) -> Self {
        KeyedTable {
            // Made at the first change: building a circuit (a worker's
            // start) allocates nothing per shard.
            shards: Vec::new(),
            dirty: Shards::none(),
            step: 0,
            track,
        }
    }

    /// The table of `shard`, to change.
    fn table_mut(&mut self, shard: u32) -> &mut Table<A> {
        if self.shards.is_empty() {
            self.shards = (0..SHARDS).map(|_| Table::default()).collect();
        }
        &mut self.shards[shard as usize]
    }

    /// Starts a step: entries are "first touched" again.
    pub(crate) fn begin_step(&mut self) {
        self.step = self.step.wrapping_add(1);
        if self.step == 0 {
            for t in &mut self.shards {
                t.marks.iter_mut().for_each(|m| *m = 0);
            }
            self.step = 1;
        }
    }

    /// The value of `key` (an encoding), created (default) if missing, to
    /// change; and whether this is the first touch of it in this step (then
    /// the value is as it was before the step). Marks the shard changed.
    pub(crate) fn touch(&mut self, key: &[u8]) -> Result<(Slot, bool, &mut A)> {
        let h = hash(key);
        let shard = shard_of_hash(h);
        self.dirty.insert(shard);
        let (step, track) = (self.step, self.track);
        let table = self.table_mut(shard);
        let entry = match table.find(key, h) {
            Some(e) => e,
            None => table.insert(key, h, A::default())?,
        };
        table.ensure_marks();
        let first = table.marks[entry] != step;
        table.marks[entry] = step;
        if track && !table.whole && table.since_of[entry] == NONE {
            if table.chain + table.since.len() >= delta_budget(shard, table.len()) {
                // Bound to be written whole: stop recording.
                table.whole = true;
                table.forget_since();
            } else {
                let start = table.since_keys.len() as u32;
                table.since_keys.extend_from_slice(key);
                table.since_of[entry] = table.since.len() as u32;
                table.since.push(Since {
                    entry: entry as u32,
                    key: (start, key.len() as u32),
                    then: table.values[entry].clone(),
                });
            }
        }
        Ok((
            Slot {
                shard,
                entry: entry as u32,
            },
            first,
            &mut table.values[entry],
        ))
    }

    /// The value and key encoding at `slot`.
    pub(crate) fn get(&self, slot: Slot) -> (&[u8], &A) {
        let t = &self.shards[slot.shard as usize];
        (t.key(slot.entry as usize), &t.values[slot.entry as usize])
    }

    /// Removes the entries at `slots`, which must be sorted and distinct
    /// (removing in reverse keeps the others' slots valid).
    pub(crate) fn remove_sorted(&mut self, slots: &[Slot]) {
        for slot in slots.iter().rev() {
            self.dirty.insert(slot.shard);
            self.shards[slot.shard as usize].remove(slot.entry as usize);
        }
    }

    /// Empties the table, keeping the memory of the shards it used.
    pub(crate) fn clear(&mut self) {
        for s in self.dirty.iter() {
            let t = &mut self.shards[s as usize];
            t.arena.clear();
            t.spans.clear();
            t.values.clear();
            t.marks.clear();
            t.since_of.clear();
            t.since.clear();
            t.since_keys.clear();
            t.whole = false;
            t.index.iter_mut().for_each(|slot| *slot = EMPTY);
            t.garbage = 0;
        }
        self.dirty = Shards::none();
    }

    /// How many keys the table holds.
    pub(crate) fn len(&self) -> usize {
        self.shards.iter().map(Table::len).sum()
    }

    /// Every (key encoding, value), shard by shard.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &A)> {
        self.shards
            .iter()
            .flat_map(|t| (0..t.len()).map(move |e| (t.key(e), &t.values[e])))
    }

    /// Per shard holding entries (of `only`, or all), its piece.
    pub(crate) fn snapshot(&self, only: Option<&Shards>) -> Result<Vec<(u32, Vec<u8>)>> {
        let mut out = Vec::new();
        for (s, t) in self.shards.iter().enumerate() {
            let s = s as u32;
            if t.len() > 0 && only.is_none_or(|o| o.contains(s)) {
                out.push((s, t.write()?));
            }
        }
        Ok(out)
    }

    /// Adds a piece of `shard` written by [`snapshot`](Self::snapshot).
    /// Into an empty shard (a recovery) the piece is copied as it lies;
    /// otherwise (pieces of one shard from several workers) each entry is
    /// merged with `merge`, and entries left `empty` are dropped.
    /// Restoring does not mark the shard changed.
    pub(crate) fn restore(
        &mut self,
        op: &str,
        shard: u32,
        piece: &[u8],
        merge: impl Fn(&mut A, &A),
        empty: impl Fn(&A) -> bool,
    ) -> Result<()> {
        if shard >= SHARDS {
            return Err(Error::IncompatibleSnapshot(format!(
                "{op} state: a piece of shard {shard}"
            )));
        }
        let piece = Table::<A>::read(op, piece)?;
        let target = self.table_mut(shard);
        if target.len() == 0 && !piece.index.is_empty() {
            // Keep what tracks changes (a restore changes nothing).
            let since = std::mem::take(&mut target.since);
            let since_keys = std::mem::take(&mut target.since_keys);
            let (whole, chain) = (target.whole, target.chain);
            *target = piece;
            target.since = since;
            target.since_keys = since_keys;
            target.whole = whole;
            target.chain = chain;
            return Ok(());
        }
        // Merged pieces (deltas, or several workers' pieces) count as a
        // chain: the next snapshot writes the shard whole once it is long.
        target.chain += piece.len();
        for e in 0..piece.len() {
            // Every key must lie in the piece's shard, or lookups would
            // miss it (a copied piece is checked for consistency, not
            // hashed again key by key).
            let key = piece.key(e);
            let h = hash(key);
            if shard_of_hash(h) != shard {
                return Err(Error::IncompatibleSnapshot(format!(
                    "{op} state: a key of another shard in a piece of shard {shard}"
                )));
            }
            let entry = match target.find(key, h) {
                Some(i) => i,
                None => target.insert(key, h, A::default())?,
            };
            merge(&mut target.values[entry], &piece.values[e]);
            if empty(&target.values[entry]) {
                target.remove(entry);
            }
        }
        Ok(())
    }

    /// Adds the entries of a piece written by [`snapshot`](Self::snapshot)
    /// under other keys (a migration): `rekey` writes each entry's new key
    /// encoding into its second argument, and the entry goes to that key's
    /// shard; entries whose new keys meet add up, merged like
    /// [`restore`](Self::restore).
    pub(crate) fn restore_rekeyed(
        &mut self,
        op: &str,
        piece: &[u8],
        mut rekey: impl FnMut(&[u8], &mut Vec<u8>) -> Result<()>,
        merge: impl Fn(&mut A, &A),
        empty: impl Fn(&A) -> bool,
    ) -> Result<()> {
        let piece = Table::<A>::read(op, piece)?;
        let mut key = Vec::new();
        for e in 0..piece.len() {
            rekey(piece.key(e), &mut key)?;
            self.restore_entry(&key, &piece.values[e], &merge, &empty)?;
        }
        Ok(())
    }

    /// Adds one entry (from a state of an earlier format); merged like
    /// [`restore`](Self::restore).
    pub(crate) fn restore_entry(
        &mut self,
        key: &[u8],
        value: &A,
        merge: impl Fn(&mut A, &A),
        empty: impl Fn(&A) -> bool,
    ) -> Result<()> {
        let h = hash(key);
        let target = self.table_mut(shard_of_hash(h));
        let entry = match target.find(key, h) {
            Some(i) => i,
            None => target.insert(key, h, A::default())?,
        };
        merge(&mut target.values[entry], value);
        if empty(&target.values[entry]) {
            target.remove(entry);
        }
        Ok(())
    }

    /// Forgets the entries of `shards` (handed off); they are written whole
    /// next.
    pub(crate) fn forget(&mut self, shards: &Shards) {
        let made = self.shards.len() as u32;
        for s in shards.iter().filter(|s| *s < made) {
            if self.shards[s as usize].len() > 0 {
                self.shards[s as usize] = Table::default();
                self.dirty.insert(s);
            }
        }
    }

    /// The shards changed since the last [`clean`](Self::clean).
    pub(crate) fn dirty(&self) -> &Shards {
        &self.dirty
    }

    /// How the changes of `shard` since the last snapshot are written: as
    /// a delta — each changed key's `diff(now, then)`, unless `empty` — or,
    /// once the deltas written since the shard was last whole would reach
    /// its size, whole.
    pub(crate) fn delta(
        &self,
        shard: u32,
        diff: impl Fn(&A, &A) -> A,
        empty: impl Fn(&A) -> bool,
    ) -> Result<Change> {
        if !self.track || !self.dirty.contains(shard) {
            return Ok(if self.dirty.contains(shard) {
                Change::Whole
            } else {
                Change::Nothing
            });
        }
        let Some(table) = self.shards.get(shard as usize) else {
            return Ok(Change::Nothing);
        };
        if table.whole || table.chain + table.since.len() > delta_budget(shard, table.len()) {
            return Ok(Change::Whole);
        }
        // A delta piece has no index: it is only ever merged, entry by
        // entry, so the entries go straight into its arena and arrays.
        let mut delta: Table<A> = Table::default();
        // A key removed and added again in the interval has two records —
        // `0 − then` for the removed entry, `now − 0` for the new one —
        // which add up to its change: no lookup, no deduplication.
        for r in &table.since {
            let (start, len) = (r.key.0 as usize, r.key.1 as usize);
            let key = &table.since_keys[start..start + len];
            let now = match table.values.get(r.entry as usize) {
                Some(v) if r.entry != NONE => v.clone(),
                _ => A::default(),
            };
            let then = &r.then;
            let change = diff(&now, then);
            if empty(&change) {
                continue;
            }
            delta
                .spans
                .push([delta.arena.len() as u32, key.len() as u32]);
            delta.arena.extend_from_slice(key);
            delta.values.push(change);
        }
        if delta.spans.is_empty() {
            return Ok(Change::Nothing);
        }
        Ok(Change::Delta(delta.write()?))
    }

    /// Marks every shard unchanged (a snapshot was taken): the shards in
    /// `whole` were written whole, the other changed ones as deltas.
    pub(crate) fn clean(&mut self, whole: &Shards) {
        for s in self.dirty.iter() {
            if let Some(t) = self.shards.get_mut(s as usize) {
                t.chain = if whole.contains(s) {
                    0
                } else {
                    t.chain + t.since.len()
                };
                t.forget_since();
                t.whole = false;
            }
        }
        self.dirty = Shards::none();
    }
}

/// Encodes `key` into `buf` (cleared first): the bytes the table and the
/// exchange know it by.
pub(crate) fn encode_key<K: Serialize>(key: &K, buf: &mut Vec<u8>) -> Result<()> {
    buf.clear();
    let out = postcard::to_extend(key, std::mem::take(buf))
        .map_err(|e| Error::Failed(format!("encoding a key: {e}")))?;
    *buf = out;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    fn key(i: u32) -> Vec<u8> {
        let mut buf = Vec::new();
        encode_key(&format!("key-{i}"), &mut buf).unwrap();
        buf
    }

    /// The table as a map, to compare with a model.
    fn contents(t: &KeyedTable<i64>) -> BTreeMap<Vec<u8>, i64> {
        t.iter().map(|(k, v)| (k.to_vec(), *v)).collect()
    }

    proptest! {
        /// Adds, removals and snapshots agree with a BTreeMap, and every
        /// snapshot restores (copied, or merged into a non-empty table) to
        /// the same contents.
        #[test]
        fn behaves_like_a_map(ops in prop::collection::vec((0u32..300, -3i64..4), 1..2000)) {
            let mut table: KeyedTable<i64> = KeyedTable::new(true);
            let mut model: BTreeMap<Vec<u8>, i64> = BTreeMap::new();
            for chunk in ops.chunks(50) {
                apply(&mut table, &mut model, chunk);
                prop_assert_eq!(contents(&table), model.clone());
                for (k, v) in &model {
                    let h = hash(k);
                    let t = &table.shards[shard_of_hash(h) as usize];
                    let e = t.find(k, h).expect("present");
                    prop_assert_eq!(t.values[e], *v);
                }
            }
            let pieces = table.snapshot(None).unwrap();
            let mut copy: KeyedTable<i64> = KeyedTable::new(true);
            let mut merged: KeyedTable<i64> = KeyedTable::new(true);
            for (s, p) in &pieces {
                copy.restore("t", *s, p, |a, b| *a += b, |a| *a == 0).unwrap();
                // Twice into one table: every value doubles.
                merged.restore("t", *s, p, |a, b| *a += b, |a| *a == 0).unwrap();
                merged.restore("t", *s, p, |a, b| *a += b, |a| *a == 0).unwrap();
            }
            prop_assert_eq!(contents(&copy), model.clone());
            let doubled: BTreeMap<Vec<u8>, i64> = model.iter().map(|(k, v)| (k.clone(), v * 2)).collect();
            prop_assert_eq!(contents(&merged), doubled);
            prop_assert!(copy.dirty().iter().next().is_none(), "restoring marks nothing changed");
        }
    }

    /// Applies `ops` as one step, removing what became empty.
    fn apply(table: &mut KeyedTable<i64>, model: &mut BTreeMap<Vec<u8>, i64>, ops: &[(u32, i64)]) {
        table.begin_step();
        let mut touched = Vec::new();
        for &(k, d) in ops {
            let (slot, _, v) = table.touch(&key(k)).unwrap();
            *v += d;
            touched.push(slot);
            *model.entry(key(k)).or_default() += d;
        }
        touched.sort();
        touched.dedup();
        touched.retain(|s| *table.get(*s).1 == 0);
        table.remove_sorted(&touched);
        model.retain(|_, v| *v != 0);
    }

    proptest! {
        /// A base snapshot plus, per changed shard, a whole piece or a
        /// delta — round after round — restores to the current contents.
        #[test]
        fn deltas_on_a_base_restore_the_contents(
            base in prop::collection::vec((0u32..400, -3i64..4), 0..1500),
            rounds in prop::collection::vec(prop::collection::vec((0u32..400, -3i64..4), 0..300), 1..6),
        ) {
            let mut table: KeyedTable<i64> = KeyedTable::new(true);
            let mut model = BTreeMap::new();
            apply(&mut table, &mut model, &base);
            let mut checkpoint: BTreeMap<u32, Vec<Vec<u8>>> = BTreeMap::new();
            for (s, p) in table.snapshot(None).unwrap() {
                checkpoint.insert(s, vec![p]);
            }
            table.clean(&Shards::all());
            for ops in &rounds {
                apply(&mut table, &mut model, ops);
                let mut whole = Shards::none();
                for s in table.dirty().clone().iter() {
                    match table.delta(s, |a, b| a - b, |a| *a == 0).unwrap() {
                        Change::Nothing => {}
                        Change::Delta(p) => checkpoint.entry(s).or_default().push(p),
                        Change::Whole => {
                            whole.insert(s);
                            checkpoint.remove(&s);
                        }
                    }
                }
                for (s, p) in table.snapshot(Some(&whole)).unwrap() {
                    checkpoint.insert(s, vec![p]);
                }
                table.clean(&whole);
                let mut restored: KeyedTable<i64> = KeyedTable::new(true);
                for (s, pieces) in &checkpoint {
                    for p in pieces {
                        restored.restore("t", *s, p, |a, b| *a += b, |a| *a == 0).unwrap();
                    }
                }
                prop_assert_eq!(contents(&restored), model.clone());
            }
        }
    }

    #[test]
    fn a_damaged_piece_is_an_error() {
        let mut t: KeyedTable<i64> = KeyedTable::new(true);
        for i in 0..100 {
            *t.touch(&key(i)).unwrap().2 += 1;
        }
        let (shard, piece) = t.snapshot(None).unwrap().remove(0);
        for cut in [0, 1, 5, 13, piece.len() / 2, piece.len() - 1] {
            let mut fresh: KeyedTable<i64> = KeyedTable::new(true);
            assert!(
                fresh
                    .restore("t", shard, &piece[..cut], |a, b| *a += b, |a| *a == 0)
                    .is_err(),
                "cut at {cut}"
            );
        }
        let mut wrong = piece.clone();
        wrong[0] = 9;
        assert!(
            KeyedTable::<i64>::new(true)
                .restore("t", shard, &wrong, |a, b| *a += b, |a| *a == 0)
                .is_err()
        );
    }

    #[test]
    fn removed_keys_are_compacted_away() {
        // Long keys of one shard, so that one table collects the garbage.
        let long = |i: u32| {
            let mut buf = Vec::new();
            encode_key(&format!("{i:0>200}"), &mut buf).unwrap();
            buf
        };
        let shard = shard_of_hash(hash(&long(0)));
        let keys: Vec<Vec<u8>> = (0..)
            .map(long)
            .filter(|k| shard_of_hash(hash(k)) == shard)
            .take(100)
            .collect();
        let mut t: KeyedTable<i64> = KeyedTable::new(true);
        for k in &keys {
            *t.touch(k).unwrap().2 += 1;
        }
        let mut slots: Vec<Slot> = keys[..90].iter().map(|k| t.touch(k).unwrap().0).collect();
        slots.sort();
        t.remove_sorted(&slots);
        assert_eq!(t.len(), 10);
        let table = &t.shards[shard as usize];
        assert!(
            table.arena.len() < 50 * 202,
            "arena {} bytes",
            table.arena.len()
        );
        for k in &keys[90..] {
            assert!(table.find(k, hash(k)).is_some());
        }
    }
}
