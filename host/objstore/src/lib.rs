//! Checkpoints in an object store: a shared directory, or S3 (any
//! S3-protocol server) through the `object_store` crate.
//!
//! A host that runs a pipeline keeps its checkpoints here when another
//! machine must be able to take the pipeline over (its logs on Kafka):
//! nothing of the pipeline then lives only on one machine.
//!
//! # Layout
//!
//! Under the store's prefix:
//!
//! - `segments/{step:020}-{nonce:016x}-w{worker:05}`: the pieces worker
//!   `worker` wrote for checkpoint `step`, concatenated. Immutable: a
//!   checkpoint written again (same step) writes new segments (the nonce
//!   differs), so a manifest never points into bytes that changed.
//! - `manifests/{step:020}`: the commit mark of checkpoint `step` — its
//!   metadata and, per piece in restore order, the segment and byte range
//!   that hold it. A piece an incremental checkpoint carries is a reference
//!   to the segment an earlier checkpoint wrote, so it is stored once.
//!   Written last, in one PUT (atomic on S3 and on a local file system,
//!   which writes a temporary file and renames it).
//! - `manifests/{step:020}-{nonce:016x}`, instead, for a store whose commits
//!   a [`CheckpointLedger`] decides ([`ObjectCheckpointStore::with_ledger`]:
//!   a pipeline on Kafka). The PUT then commits nothing: the checkpoint is
//!   committed when the ledger records that manifest's name, which a
//!   committer another host has fenced cannot do. Names are never reused,
//!   so a fenced committer's late manifest overwrites nothing; it is an
//!   orphan, collected like the segments of a write that crashed.
//! - `components/{sha256}.wasm`: component files by the SHA-256 (lower-case
//!   hex) of their bytes, written once, never collected
//!   ([`ObjectCheckpointStore::put_component`]): the hosts of a pipeline
//!   fetch from here a new version of the circuit that another host
//!   published.
//!
//! # Collection
//!
//! After committing a manifest, the store keeps the [`KEPT`] newest
//! manifests, deletes the others (and, with a ledger, every manifest of an
//! older step, recorded or not), then deletes every segment of a step
//! below the oldest kept checkpoint that no kept manifest references — the
//! segments of dropped checkpoints, and those of a write that crashed
//! before its manifest. Segments of newer steps are never collected: they
//! may belong to a checkpoint being written. Components are never
//! collected.
//!
//! # Reading some shards
//!
//! [`CheckpointStore::pieces`] with shards reads the manifest, then only the
//! byte ranges of those shards' pieces (ranged GETs, coalesced by the
//! client): a host taking a few shards over downloads only those.
//!
//! [`CheckpointLedger`]: sluice_storage::CheckpointLedger
//! [`KEPT`]: sluice_storage::checkpoint::KEPT
//! [`CheckpointStore::pieces`]: sluice_storage::CheckpointStore::pieces

/// This host's local copy of the segments it wrote.
mod cache;
/// Collecting the manifests and segments no kept checkpoint needs.
mod collect;
/// Components: WebAssembly component files kept by the hash of their bytes.
mod components;
/// Backend errors of the object store, and refusals of a checkpoint.
mod error;
/// The commit mark of a checkpoint: its manifest, where its pieces lie,
/// and the names of manifests.
mod manifest;
/// Reading committed checkpoints: their steps, manifests and pieces.
mod read;
/// Segments: one worker's pieces of one checkpoint, concatenated, under a
/// name no other write draws.
mod segment;
/// The store: opening it, its requests, and its `CheckpointStore` methods.
mod store;
/// The store's tests.
#[cfg(test)]
mod tests;
/// Writing a checkpoint: its segments, then its manifest (the commit).
mod write;

pub use store::ObjectCheckpointStore;
