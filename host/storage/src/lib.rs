//! # sluice-storage: every durable byte of a pipeline goes through here
//!
//! The traits a backend implements, and everything the host builds on them
//! without knowing which backend it is:
//!
//! - [`LogBackend`] ([`log`]): input logs, output logs and step records, and
//!   the atomic **step commit**. Backends: `sluice-embedded` (RocksDB, the
//!   default) and `sluice-kafka`.
//! - [`CheckpointStore`] ([`checkpoint`]): all workers' state at a step
//!   boundary, committed at once.
//! - [`Guarded`] ([`guarded`]): storage behind the host's enforcement of
//!   I1–I3 over any pair of backends, including **the trim rule**
//!   ([`Guarded::trim`]); the runtime talks to storage only through it.
//! - [`audit`]: the offline check behind `sluice verify`, from what any
//!   backend stores.
//! - [`ingest`]: appending JSON-lines files to input logs exactly once;
//!   [`in_place`]: reading them as input logs where they are instead.
//! - [`read_output`] ([`read`]): output events after a position.
//! - [`records`]: input records as a step reads them — events, and
//!   records that are not events ([`BadRecord`]).
//! - [`faults`]: wrappers that inject errors and delays into any backend.
//! - [`conformance`]: the suites every backend passes.
//!
//! ```
//! use sluice_storage::{StorageError, Result};
//! fn retry_worthy(r: &Result<()>) -> bool {
//!     r.as_ref().is_err_and(StorageError::is_transient)
//! }
//! # assert!(!retry_worthy(&Ok(())));
//! ```

pub mod audit;
pub mod checkpoint;
pub mod conformance;
pub mod error;
pub mod faults;
pub mod guarded;
pub mod in_place;
pub mod ingest;
pub mod log;
pub mod read;
pub mod records;

pub use checkpoint::{
    Carried, Checkpoint, CheckpointLedger, CheckpointMeta, CheckpointStore, MemoryLedger,
    ReadBytes, Staged, StatePiece,
};
pub use error::{BoxError, Result, StorageError};
pub use guarded::{Guarded, layout_after};
pub use log::{
    AppendBatch, IngestMark, LogBackend, ProducerCheck, ProducerSeq, ProducerState, WorkerCommit,
    WorkerCommitter, WorkerDone, check_producer, check_worker_commit, decide_share,
};
pub use read::read_output;
pub use records::{BadRecord, InputRecord, RecordRef};
