//! The embedded RocksDB database of a pipeline: one instance per data
//! directory, shared by the embedded log, the checkpoint store and the
//! pipeline metadata, each in its own column family.

use crate::error::{Error, Result};
use rocksdb::{ColumnFamilyDescriptor, DB, Options, WriteOptions};
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

/// Opens (creating if needed) the pipeline database under `dir/db`.
///
/// Fails with [`Error::Locked`] if another process has it open.
pub fn open(dir: &Path) -> Result<Arc<DB>> {
    std::fs::create_dir_all(dir).map_err(Error::io(dir))?;
    let path = dir.join("db");
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.create_missing_column_families(true);
    opts.set_max_background_jobs(2);
    let families = FAMILIES
        .iter()
        .map(|name| ColumnFamilyDescriptor::new(*name, Options::default()));
    DB::open_cf_descriptors(&opts, &path, families)
        .map(Arc::new)
        .map_err(|source| {
            let text = source.to_string();
            if text.contains("LOCK")
                && (text.contains("lock") || text.contains("Resource temporarily"))
            {
                Error::Locked {
                    dir: dir.to_owned(),
                }
            } else {
                Error::Rocks {
                    what: format!("opening {}", path.display()),
                    source,
                }
            }
        })
}

/// Write options for anything that must be durable before it is
/// acknowledged: the write-ahead log is fsynced.
pub fn synced() -> WriteOptions {
    let mut w = WriteOptions::default();
    w.set_sync(true);
    w
}

/// Looks up a column family that [`open`] created.
pub fn cf<'a>(db: &'a DB, name: &str) -> Result<&'a rocksdb::ColumnFamily> {
    db.cf_handle(name).ok_or_else(|| Error::Corrupt {
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
