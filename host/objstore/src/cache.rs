//! This host's copy of the segments it wrote (a directory, if the store
//! keeps one): writing a copy, reading pieces from it, and dropping what
//! no kept checkpoint needs.

use crate::manifest::step_of;
use crate::store::ObjectCheckpointStore;
use std::collections::BTreeSet;
use std::ops::Range;

impl ObjectCheckpointStore {
    /// Keeps `bytes` as this host's copy of segment `name` (best effort: a
    /// copy that cannot be written is a download later, nothing worse).
    pub(crate) fn cache_put(&self, name: &str, bytes: &[u8]) {
        let Some(dir) = &self.cache else {
            return;
        };
        let tmp = dir.join(format!(".{name}.tmp"));
        // Synced before it is renamed into place: after a crash a copy is
        // either missing (fetched instead) or whole, never garbage.
        let written = (|| {
            use std::io::Write;
            let mut file = std::fs::File::create(&tmp)?;
            file.write_all(bytes)?;
            file.sync_data()?;
            std::fs::rename(&tmp, dir.join(name))
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            tracing::debug!(segment = name, error = %e, "no local copy of a segment");
        }
    }

    /// `ranges` of this host's copy of segment `name`, if it has a whole
    /// one.
    pub(crate) fn cache_read(&self, name: &str, ranges: &[Range<u64>]) -> Option<Vec<Vec<u8>>> {
        use std::io::{Read, Seek, SeekFrom};
        let mut file = std::fs::File::open(self.cache.as_ref()?.join(name)).ok()?;
        let len = file.metadata().ok()?.len();
        ranges
            .iter()
            .map(|r| {
                if r.end > len || r.start > r.end {
                    return None;
                }
                let mut buf = vec![0; (r.end - r.start) as usize];
                file.seek(SeekFrom::Start(r.start)).ok()?;
                file.read_exact(&mut buf).ok()?;
                Some(buf)
            })
            .collect()
    }

    /// Drops from this host's copy the segments of steps below
    /// `oldest_kept` that `referenced` does not name.
    pub(crate) fn cache_collect(&self, oldest_kept: u64, referenced: &BTreeSet<String>) {
        let Some(dir) = &self.cache else {
            return;
        };
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let stale_tmp = name.starts_with('.') && name.ends_with(".tmp");
            let name_step = step_of(name.trim_start_matches('.'));
            if name_step.is_some_and(|s| s < oldest_kept)
                && (stale_tmp || !referenced.contains(&name))
            {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}
