//! A pipeline's input: durable pushes (admitted within the tenant's and the
//! server's concurrency bounds and the tenant's disk quota) and what the
//! pipeline remembers of each producer.

use super::state::{Service, lock};
use crate::error::{Result, ServiceError};
use crate::limits::Permit;
use crate::types::{PartitionRange, ProducerInfo, PushAck};
use sluice_core::Event;
use sluice_storage::{AppendBatch, IngestMark, ProducerSeq};

impl Service {
    /// Admits one push of `tenant`'s before its body is read: within the
    /// tenant's `max_concurrent_pushes` and the server's `max_pushes` (429
    /// past either), and only if the tenant has disk left for a body of
    /// `max_push_bytes` (507).
    pub async fn admit_push(&self, tenant: &str) -> Result<(Permit, crate::types::TenantLimits)> {
        let limits = self.limits(tenant)?;
        let permit = self
            .gates
            .pushes
            .try_enter(tenant, limits.max_concurrent_pushes as usize)?;
        self.check_disk(tenant, 0).await?;
        Ok((permit, limits))
    }

    /// Counts `bytes` of a push of `tenant`'s as held on the host until the
    /// returned guard is dropped (or [`PushBytes::set`] changes them): what
    /// `GET /tenants` shows of the tenant's pushes in flight.
    pub fn hold_push_bytes(&self, tenant: &str, bytes: u64) -> PushBytes<'_> {
        let mut held = PushBytes {
            service: self,
            tenant: tenant.to_owned(),
            bytes: 0,
        };
        held.set(bytes);
        held
    }

    /// Bytes `tenant`'s pushes in flight hold now.
    pub(super) fn push_bytes(&self, tenant: &str) -> u64 {
        lock(&self.pushing).get(tenant).copied().unwrap_or(0)
    }

    /// Admits one long-poll or output stream of `tenant`'s: within the
    /// tenant's `max_streams` and the server's (429 past either). The
    /// stream holds the permit while it is open.
    pub fn admit_stream(&self, tenant: &str) -> Result<Permit> {
        let limits = self.limits(tenant)?;
        self.gates
            .streams
            .try_enter(tenant, limits.max_streams as usize)
    }

    /// Appends `events` to input `port`, durably, spread over the input's
    /// partitions in contiguous chunks. A producer's push goes to the
    /// partitions its (id, seq) picks, so a retry's acknowledgement (the
    /// original offsets) names the same ones.
    pub async fn push(
        &self,
        tenant: &str,
        name: &str,
        port: &str,
        events: Vec<Event>,
        producer: Option<(ProducerSeq, Option<String>)>,
    ) -> Result<PushAck> {
        let h = self.pipeline(tenant, name)?;
        let index = h
            .ports()
            .input(port)
            .map_err(|_| ServiceError::not_found("input port", port))?;
        if h.across_hosts() {
            return Err(ServiceError::invalid(
                "across_hosts",
                format!(
                    "pipeline {name} runs across hosts: write its input to its Kafka topic \
                     for `{port}` (the pipeline's Kafka name, then `.{port}`) with any Kafka \
                     producer"
                ),
            ));
        }
        let partitions = h.shape().inputs[index].partitions;
        let n = events.len() as u64;
        let (producer, mark) = match producer {
            Some((p, mark)) => {
                let mark = mark.map(|m| IngestMark {
                    source: producer_mark_source(&p.id, port),
                    state: m.into_bytes(),
                });
                (Some(p), mark)
            }
            None => (None, None),
        };
        let first = match &producer {
            Some(p) => {
                let hash = xxhash_rust::xxh3::xxh3_64(format!("{}/{}", p.id, p.seq).as_bytes());
                (hash % partitions as u64) as u32
            }
            None => h.next_partition(),
        };
        let chunk = events.len().div_ceil(partitions as usize).max(1);
        let mut appends = Vec::new();
        let mut rest = events;
        let mut p = first % partitions;
        while !rest.is_empty() {
            let tail = rest.split_off(chunk.min(rest.len()));
            appends.push((port.to_owned(), p, rest));
            rest = tail;
            p = (p + 1) % partitions;
        }
        let parts: Vec<u32> = appends.iter().map(|(_, p, _)| *p).collect();
        let log = h.log();
        let ranges = tokio::task::spawn_blocking(move || {
            log.append(AppendBatch {
                appends,
                mark,
                producer,
            })
        })
        .await
        .map_err(|e| ServiceError::Internal(e.to_string()))?
        .map_err(sluice_pipeline::Error::from)?;
        h.input_appended();
        let appended: u64 = ranges.iter().map(|r| r.end - r.start).sum();
        Ok(PushAck {
            events: appended.min(n),
            offsets: parts
                .into_iter()
                .zip(ranges)
                .map(|(partition, r)| PartitionRange {
                    partition,
                    start: r.start,
                    end: r.end,
                })
                .collect(),
        })
    }
}

/// Where a producer's mark for `port` is kept among the ingest marks.
fn producer_mark_source(id: &str, port: &str) -> String {
    format!("producer:{port}/{id}")
}

impl Service {
    /// What the pipeline remembers of producer `id` on input `port`.
    pub async fn producer(
        &self,
        tenant: &str,
        name: &str,
        port: &str,
        id: &str,
    ) -> Result<ProducerInfo> {
        let h = self.pipeline(tenant, name)?;
        let log = h.log();
        let (id2, port2) = (id.to_owned(), port.to_owned());
        let (state, mark) = tokio::task::spawn_blocking(move || {
            let state = log.producer(&id2, &port2)?;
            let mark = log.ingest_mark(&producer_mark_source(&id2, &port2))?;
            Ok::<_, sluice_storage::StorageError>((state, mark))
        })
        .await
        .map_err(|e| ServiceError::Internal(e.to_string()))?
        .map_err(sluice_pipeline::Error::from)?;
        let state = state.unwrap_or_default();
        Ok(ProducerInfo {
            producer: id.to_owned(),
            port: port.to_owned(),
            epoch: state.epoch,
            last_seq: state.last_seq,
            mark: mark.map(|m| String::from_utf8_lossy(&m).into_owned()),
        })
    }
}

/// Bytes a push holds on the host, counted in its tenant's usage while this
/// lives.
pub struct PushBytes<'a> {
    service: &'a Service,
    tenant: String,
    bytes: u64,
}

impl PushBytes<'_> {
    /// The push now holds `bytes` (its body, then its parsed events).
    pub fn set(&mut self, bytes: u64) {
        let mut pushing = lock(&self.service.pushing);
        let held = pushing.entry(self.tenant.clone()).or_insert(0);
        *held = held.saturating_sub(self.bytes) + bytes;
        if *held == 0 {
            pushing.remove(&self.tenant);
        }
        self.bytes = bytes;
    }
}

impl Drop for PushBytes<'_> {
    fn drop(&mut self) {
        self.set(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::ServerLimits;
    use sluice_runtime::{Limits, SluiceEngine};
    use std::sync::Arc;

    #[test]
    fn a_push_counts_what_it_holds_until_it_ends() {
        let dir = tempfile::tempdir().unwrap();
        let engine =
            Arc::new(SluiceEngine::new(Limits::default(), Some(dir.path().join("cache"))).unwrap());
        let service = Service::new(
            dir.path().join("data"),
            "admin-token-admin-token",
            engine,
            None,
            ServerLimits::default(),
        )
        .unwrap();
        let mut first = service.hold_push_bytes("acme", 1000);
        let second = service.hold_push_bytes("acme", 500);
        let other = service.hold_push_bytes("zeta", 7);
        assert_eq!(service.push_bytes("acme"), 1500);
        first.set(3000);
        assert_eq!(service.push_bytes("acme"), 3500);
        drop(first);
        assert_eq!(service.push_bytes("acme"), 500);
        drop(second);
        assert_eq!(service.push_bytes("acme"), 0);
        assert_eq!(service.push_bytes("zeta"), 7);
        drop(other);
        assert!(lock(&service.pushing).is_empty());
    }
}
