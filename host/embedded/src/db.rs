//! The embedded RocksDB database of a pipeline: one instance per data
//! directory, shared by the embedded log, the checkpoint store and the
//! pipeline metadata, each in its own column family.

use rocksdb::{ColumnFamilyDescriptor, DB, Options, WriteOptions};
use sluice_storage::{Result, StorageError};
use std::path::Path;
use std::sync::Arc;

/// Column family of input events.
pub const CF_INPUT: &str = "input";
/// Column family of output entries.
pub const CF_OUTPUT: &str = "output";
/// Column family of step records.
pub const CF_STEPS: &str = "steps";
/// Column family of ingest marks (what was appended from where).
pub const CF_INGEST: &str = "ingest";
/// Column family of checkpoints.
pub const CF_CHECKPOINTS: &str = "checkpoints";
/// Column family of pipeline metadata.
pub const CF_META: &str = "meta";

const FAMILIES: [&str; 6] = [
    CF_INPUT,
    CF_OUTPUT,
    CF_STEPS,
    CF_INGEST,
    CF_CHECKPOINTS,
    CF_META,
];

/// The memtables of a pipeline's database, all column families together,
/// in bytes: past it RocksDB flushes the largest. (A key-heavy run of
/// `sluice run` held 64 MiB of memtables with the former limit, more than
/// dbsp's whole process holds of the same keys; flushing sooner costs a
/// few more small files, which compaction merges.)
pub const WRITE_BUFFERS: usize = 16 << 20;

/// The block cache of a pipeline's database, in bytes, shared by its column
/// families, holding their index and filter blocks too (so that table
/// readers do not grow with the data).
pub const BLOCK_CACHE: usize = 8 << 20;

/// One column family's memtable, in bytes: it is flushed once full, and a
/// family has at most two (one written, one being flushed; writes to the
/// family wait for the flush past that).
pub(crate) const FAMILY_BUFFER: usize = WRITE_BUFFERS / 4;

/// The data block size of the log families (input and output), in bytes.
const LOG_BLOCK: usize = 64 << 10;

/// The size of RocksDB's writes to its files, in bytes (see [`open`]).
pub(crate) const WRITE_CHUNK: usize = 16 << 10;

/// Files on level 0 of a log's column family (input or output) before they
/// are compacted (RocksDB's default is 4).
const LOG_LEVEL0_FILES: i32 = 32;

/// What a pipeline's database holds in memory at most, in bytes, for the
/// host's memory budget: every family's two memtables and the block cache
/// (56 MiB). Flushes start well before (past [`WRITE_BUFFERS`] together);
/// a single write larger than a memtable (a step's whole output) is held
/// until it is flushed.
pub const MEMORY_BOUND: u64 = (FAMILIES.len() * 2 * FAMILY_BUFFER + BLOCK_CACHE) as u64;

/// A pipeline's open database, with the lock on its data directory: while
/// this exists, no other process can open the pipeline.
pub struct PipelineDb {
    db: DB,
    _lock: std::fs::File,
}

impl std::ops::Deref for PipelineDb {
    type Target = DB;

    fn deref(&self) -> &DB {
        &self.db
    }
}

/// Who holds a data directory: written into its lock file by the holder.
fn holder_description() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let since = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!(
        "pid {} on host {} since unix time {since}",
        std::process::id(),
        host.trim()
    )
}

/// Takes the data directory's lock file (`dir/sluice.lock`), or explains who
/// holds it.
fn lock(dir: &Path) -> Result<std::fs::File> {
    use std::io::{Read, Seek, Write};
    let path = dir.join("sluice.lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(StorageError::io(&path))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let holder = if holder.trim().is_empty() {
                "another process".to_owned()
            } else {
                holder.trim().to_owned()
            };
            return Err(StorageError::Locked {
                dir: dir.to_owned(),
                holder,
            });
        }
        Err(std::fs::TryLockError::Error(e)) => return Err(StorageError::io(&path)(e)),
    }
    file.set_len(0).map_err(StorageError::io(&path))?;
    file.rewind().map_err(StorageError::io(&path))?;
    file.write_all(holder_description().as_bytes())
        .map_err(StorageError::io(&path))?;
    Ok(file)
}

/// Opens (creating if needed) the pipeline database under `dir/db`.
///
/// Fails with [`StorageError::Locked`], naming the holder, if another process has
/// the pipeline open.
pub fn open(dir: &Path) -> Result<Arc<PipelineDb>> {
    std::fs::create_dir_all(dir).map_err(StorageError::io(dir))?;
    let lock = lock(dir)?;
    let path = dir.join("db");
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.set_max_background_jobs(2);
    // After a crash of the machine, the write-ahead log is replayed up to
    // its first damaged or missing record, no further (RocksDB's default,
    // named because the input's lazy appends rely on it: a prefix of them
    // survives, never a later one without an earlier).
    opts.set_wal_recovery_mode(rocksdb::DBRecoveryMode::PointInTime);
    // Tables are written at most 16 KiB at a time, the write-ahead log at
    // most 32 KiB (its block); RocksDB's default buffer is 1 MiB, and a
    // large value is written whole. The kernel caches a larger write in a
    // larger folio (ext4, Linux 6.x), taken from the high orders of the
    // page allocator. On a VM whose free memory the host takes back
    // (virtio-balloon free page reporting: free blocks of 2 MiB and up),
    // those pages fault in on the host again at first touch: measured on
    // this project's machines, 1 MiB writes into new cache pages fall from
    // 4.5 GB/s to ~110 MB/s past the first few hundred MB, while 16 KiB
    // writes (folios of the orders the allocator keeps per CPU) stay at
    // 3.6 GB/s. The buffer bounds the writes of small entries; a step's
    // output is one large value per worker, which the flush writes whole
    // unless its writes are cut: the rate limiter cuts flush and compaction
    // writes into requests of one refill, `WRITE_CHUNK` bytes per
    // microsecond. Its nominal rate (16 GB/s) is not what would bind: a
    // request that finds the bucket empty refills it when a microsecond
    // has passed, and waits only when a flush and a compaction meet in
    // one. Here the input family's flushes ran at 0.2–0.6 GB/s with and
    // without it, and a Nexmark q0 run's output flushes (20–30 MB each)
    // took 45–53 ms instead of 100–350 ms; q0 and q1 ran 1.9 → 1.7 s. On
    // bare metal it costs more `write` calls (about 60 000 per GB).
    opts.set_writable_file_max_buffer_size(WRITE_CHUNK as u64);
    opts.set_ratelimiter(WRITE_CHUNK as i64 * 1_000_000, 1, 10);
    // Every column family's memtables together, not 2 x 64 MiB each: a
    // host runs many pipelines, and counts this in their tenants' usage.
    // Past the limit RocksDB flushes the largest. Writers never wait for a
    // flush (a stalling write-buffer manager would hold them until memory
    // drops, and memtables an open iterator pins do not drop): each
    // family's own memtables are kept small instead (with 8 MiB each, six
    // families written at once reached 70 MiB before the flushes caught up).
    opts.set_db_write_buffer_size(WRITE_BUFFERS);
    // One block cache for the database, with the index and filter blocks
    // in it: the database's memory stays within `MEMORY_BOUND`.
    let cache = rocksdb::Cache::new_lru_cache(BLOCK_CACHE);
    let mut table = rocksdb::BlockBasedOptions::default();
    table.set_block_cache(&cache);
    table.set_cache_index_and_filter_blocks(true);
    table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    // The logs are read in order, record after record: larger blocks mean
    // fewer reads and block-cache entries per record (4 KiB, RocksDB's
    // default, is some 16 input records; a step reads thousands).
    let mut log_table = rocksdb::BlockBasedOptions::default();
    log_table.set_block_cache(&cache);
    log_table.set_cache_index_and_filter_blocks(true);
    log_table.set_pin_l0_filter_and_index_blocks_in_cache(true);
    log_table.set_block_size(LOG_BLOCK);
    let family = |name: &str| {
        let mut o = Options::default();
        o.set_write_buffer_size(FAMILY_BUFFER);
        o.set_max_write_buffer_number(2);
        o.set_block_based_table_factory(&table);
        if name == CF_INPUT || name == CF_OUTPUT {
            o.set_block_based_table_factory(&log_table);
            // The logs: each flush holds keys of many partitions (an append
            // spans up to 8), so level 0's files overlap and each compaction
            // merges them all into the last level again, rewriting it: with
            // 4 MiB memtables, a 90 MB file ingested was written ~4 times
            // over. Compacting past many files instead rewrites it about
            // once per `LOG_LEVEL0_FILES` flushes. A step's read seeks
            // about that many files (up to 3x if compaction falls behind),
            // each by one index lookup; their index blocks, pinned in the
            // block cache, are some 1.5 KiB per 4 MiB file (64 KiB data
            // blocks). Trimmed input
            // leaves the disk at the next compaction, so up to
            // `LOG_LEVEL0_FILES` memtables' worth (128 MiB) later.
            o.set_level_zero_file_num_compaction_trigger(LOG_LEVEL0_FILES);
            o.set_level_zero_slowdown_writes_trigger(LOG_LEVEL0_FILES * 2);
            o.set_level_zero_stop_writes_trigger(LOG_LEVEL0_FILES * 3);
        }
        o
    };
    opts.set_block_based_table_factory(&table);
    let families = FAMILIES
        .iter()
        .map(|name| ColumnFamilyDescriptor::new(*name, family(name)));
    let db = DB::open_cf_descriptors(&opts, &path, families).map_err(|source| {
        let text = source.to_string();
        if text.contains("LOCK") && (text.contains("lock") || text.contains("Resource temporarily"))
        {
            StorageError::Locked {
                dir: dir.to_owned(),
                holder: "this process".into(),
            }
        } else {
            rocks(format!("opening {}", path.display()))(source)
        }
    })?;
    Ok(Arc::new(PipelineDb { db, _lock: lock }))
}

/// Write options for anything that must be durable before it is
/// acknowledged: the write-ahead log is fsynced.
pub fn synced() -> WriteOptions {
    let mut w = WriteOptions::default();
    w.set_sync(true);
    w
}

/// Memory the database holds, in bytes: every column family's memtables
/// (flushed past [`WRITE_BUFFERS`] together) and table readers, and the
/// block cache they share (counted once).
pub fn memory_bytes(db: &DB) -> u64 {
    const PER_FAMILY: [&str; 2] = [
        "rocksdb.cur-size-all-mem-tables",
        "rocksdb.estimate-table-readers-mem",
    ];
    let property = |cf, p: &str| db.property_int_value_cf(cf, p).ok().flatten().unwrap_or(0);
    let families: Vec<_> = FAMILIES
        .iter()
        .filter_map(|name| db.cf_handle(name))
        .collect();
    let cache = families
        .first()
        .map_or(0, |cf| property(*cf, "rocksdb.block-cache-usage"));
    families
        .iter()
        .flat_map(|cf| PER_FAMILY.iter().map(|p| property(*cf, p)))
        .sum::<u64>()
        + cache
}

/// Looks up a column family that [`open`] created.
pub fn cf<'a>(db: &'a DB, name: &str) -> Result<&'a rocksdb::ColumnFamily> {
    db.cf_handle(name).ok_or_else(|| StorageError::Corrupt {
        what: "database".into(),
        message: format!("column family `{name}` is missing"),
    })
}

/// Appends a length-prefixed name to a key, so keys of different names never
/// share a prefix by accident.
pub fn push_name(key: &mut Vec<u8>, name: &str) {
    key.push(name.len() as u8);
    key.extend_from_slice(name.as_bytes());
}

/// A closure turning RocksDB's error while doing `what` into a transient
/// [`StorageError::Backend`]: a failed write or read may succeed after the
/// pipeline recovers.
pub fn rocks(what: impl Into<String>) -> impl FnOnce(rocksdb::Error) -> StorageError {
    let what = what.into();
    move |source| StorageError::backend("RocksDB", what, true, source)
}

/// Writes each of `tables` (a file name and its entries, in strictly
/// ascending key order) as a table file of that name beside the database's
/// directory, on its file system, and ingests them all into column family
/// `family` at once (atomically): the files are moved in, not copied, and
/// RocksDB syncs them, the directory and the manifest that lists them
/// before this returns. For a large write this spares the write-ahead log
/// and a memtable, which would each hold it once more (and the flush write
/// it again). `what` names the write in errors.
///
/// The entries are visible once ingested, not atomically with any other
/// write: callers keep them out of reach until a later write says they
/// count, and collect them when it never comes. A table's range should not
/// span keys the memtable holds (another log's, between two of its own):
/// RocksDB would flush the memtable first, holding every write meanwhile.
/// A file of a table's name left by a crash may be a second name of a table
/// the ingestion moved in (it drops the name last): it is unlinked, never
/// written through.
pub(crate) fn ingest_tables<K, V, E>(
    db: &PipelineDb,
    family: &str,
    tables: impl IntoIterator<Item = (String, E)>,
    what: &str,
) -> Result<()>
where
    K: AsRef<[u8]>,
    V: AsRef<[u8]>,
    E: IntoIterator<Item = (K, V)>,
{
    let cf = cf(db, family)?;
    let mut paths = Vec::new();
    let written = (|| {
        for (file, entries) in tables {
            let path = db.path().with_file_name(file);
            match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(StorageError::io(&path)(e));
                }
                _ => {}
            }
            paths.push(path.clone());
            let mut opts = Options::default();
            opts.set_writable_file_max_buffer_size(WRITE_CHUNK as u64);
            let mut table = rocksdb::SstFileWriter::create(&opts);
            table
                .open(&path)
                .map_err(rocks(format!("opening a table for {what}")))?;
            for (key, value) in entries {
                table
                    .put(key, value)
                    .map_err(rocks(format!("writing {what}")))?;
            }
            // Synced by `finish`; the ingestion syncs the directory and the
            // manifest that lists the file.
            table
                .finish()
                .map_err(rocks(format!("finishing the table of {what}")))?;
        }
        let mut ingest = rocksdb::IngestExternalFileOptions::default();
        ingest.set_move_files(true);
        db.ingest_external_file_cf_opts(cf, &ingest, paths.iter().collect())
            .map_err(rocks(format!("ingesting {what}")))
    })();
    for path in &paths {
        let _ = std::fs::remove_file(path);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pipeline's database holds at most `MEMORY_BOUND` whatever passes
    /// through it: 256 MiB written to every column family in batches of
    /// 4 MiB, each read back, with the memory measured after every batch.
    #[test]
    fn the_database_stays_within_its_memory_bound() {
        let dir = tempfile::tempdir().unwrap();
        let db = open(dir.path()).unwrap();
        let value = vec![b'7'; 1000];
        let mut highest = 0;
        for batch in 0..64u32 {
            let name = FAMILIES[batch as usize % FAMILIES.len()];
            let family = cf(&db, name).unwrap();
            let mut wb = rocksdb::WriteBatch::default();
            for i in 0..4096u32 {
                let key = [batch.to_be_bytes(), i.to_be_bytes()].concat();
                wb.put_cf(family, key, &value);
            }
            db.write(wb).unwrap();
            let key = [batch.to_be_bytes(), 7u32.to_be_bytes()].concat();
            assert_eq!(db.get_cf(family, key).unwrap().as_deref(), Some(&value[..]));
            highest = highest.max(memory_bytes(&db));
        }
        assert!(highest > 0, "the database reports no memory");
        assert!(
            highest <= MEMORY_BOUND,
            "the database held {} MiB, over its bound of {} MiB",
            highest >> 20,
            MEMORY_BOUND >> 20
        );
    }
}
