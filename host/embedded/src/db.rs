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
/// in bytes: past it RocksDB flushes the largest.
pub const WRITE_BUFFERS: usize = 64 << 20;

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
    // Every column family's memtables together, not 2 x 64 MiB each: a
    // host runs many pipelines, and counts this in their tenants' usage.
    opts.set_db_write_buffer_size(WRITE_BUFFERS);
    let families = FAMILIES
        .iter()
        .map(|name| ColumnFamilyDescriptor::new(*name, Options::default()));
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
/// (at most [`WRITE_BUFFERS`] together), table readers and block cache.
pub fn memory_bytes(db: &DB) -> u64 {
    const PROPERTIES: [&str; 3] = [
        "rocksdb.cur-size-all-mem-tables",
        "rocksdb.estimate-table-readers-mem",
        "rocksdb.block-cache-usage",
    ];
    FAMILIES
        .iter()
        .filter_map(|name| db.cf_handle(name))
        .flat_map(|cf| {
            PROPERTIES
                .iter()
                .map(move |p| db.property_int_value_cf(cf, *p).ok().flatten().unwrap_or(0))
        })
        .sum()
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
