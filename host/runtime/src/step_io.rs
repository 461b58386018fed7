//! A step's input and output, the same wherever a worker runs: the input
//! ranges a worker reads ([`InputRange`], [`read_batches`]), the checks and
//! hash of its output ([`OutputChecks`], [`convert_output`]), and how a
//! share's commit error reads. Both the coordinator and a host that serves
//! workers ([`hosts`](crate::hosts)) use these, so the two build the same
//! batches and the same hashes.

use crate::bindings::Batch;
use crate::error::{Error, GuestError, Result};
use crate::packed::slices;
use serde::{Deserialize, Serialize};
use sluice_core::{Event, Frontier, PartitionId, hash_outputs};

/// One partition's part of a worker's input for one step: offsets
/// `start..end` of partition `id` of input log `name`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct InputRange {
    pub(crate) id: PartitionId,
    pub(crate) name: String,
    pub(crate) start: u64,
    pub(crate) end: u64,
}

/// The input each worker reads in a step from frontiers `from` to `to`: one
/// range per partition it owns that moved, in the order it owns them.
pub(crate) fn input_ranges(
    owned: &[Vec<(PartitionId, String)>],
    from: &[Frontier],
    to: &[Frontier],
) -> Vec<Vec<InputRange>> {
    owned
        .iter()
        .enumerate()
        .map(|(w, parts)| {
            parts
                .iter()
                .filter_map(|(id, name)| {
                    let start = from[w].get(id).copied().unwrap_or(0);
                    let end = to[w].get(id).copied().unwrap_or(start);
                    (end > start).then(|| InputRange {
                        id: *id,
                        name: name.clone(),
                        start,
                        end,
                    })
                })
                .collect()
        })
        .collect()
}

/// Reads `ranges` from `log` into one batch per input port (in the order
/// the ranges name them): what a worker steps on — built the same way
/// wherever it is read, so a worker's host reading its own input gives the
/// worker what the coordinator would have sent. With `strict` (a reader
/// other than the one that divided the step), a range past the partition's
/// end fails instead of reading short: its events are not all visible
/// here yet.
pub(crate) fn read_batches(
    log: &dyn sluice_storage::LogBackend,
    ranges: &[InputRange],
    strict: bool,
) -> Result<Vec<Batch>> {
    let mut batches: Vec<Batch> = Vec::new();
    for r in ranges {
        let (name, partition, start, end) = (&r.name, r.id.partition, r.start, r.end);
        // Offsets may be sparse (Kafka's transaction markers take
        // offsets), so the range holds at most `end - start` events; a
        // dense backend checks its own ranges.
        let events = if strict {
            log.read_exact(name, partition, start..end)?
        } else {
            log.read(name, partition, start..end)?
        };
        if events.len() as u64 > end - start {
            return Err(sluice_storage::StorageError::Corrupt {
                what: format!("input `{name}` partition {partition}"),
                message: format!("offsets {start}..{end} returned {} events", events.len()),
            }
            .into());
        }
        let i = match batches.iter().position(|b| b.port == r.id.input) {
            Some(i) => i,
            None => {
                batches.push(Batch {
                    port: r.id.input,
                    values: Vec::new(),
                    ends: Vec::new(),
                    weights: Vec::new(),
                });
                batches.len() - 1
            }
        };
        let batch = &mut batches[i];
        for e in events {
            batch.values.extend_from_slice(&e.value);
            batch.ends.push(batch.values.len() as u32);
            batch.weights.push(e.weight);
        }
    }
    Ok(batches)
}

/// What a worker's output is checked against: the circuit's output ports,
/// [`PipelineOptions::max_output_per_step`](crate::PipelineOptions::max_output_per_step)
/// and [`PipelineOptions::check_output_json`](crate::PipelineOptions::check_output_json).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OutputChecks {
    /// The circuit's output ports.
    pub ports: usize,
    /// At most this many output events per worker per step.
    pub max_output: Option<u64>,
    /// Every output value must be JSON.
    pub check_json: bool,
}

/// One worker's output of one step.
pub(crate) struct WorkerOutput {
    /// Events per output port.
    pub ports: Vec<Vec<Event>>,
    /// Their hash ([`hash_outputs`]), which the step record or the done
    /// record keeps and a replay must reproduce.
    pub hash: u128,
    /// Its host committed it, as the worker's share of a divided step:
    /// `ports` is empty, this many events went out.
    pub shared: Option<u64>,
}

/// Checks a worker's output batches (well-formed, within the limits) and
/// hashes them: where the coordinator commits the output, and on a host
/// that commits its workers' shares of divided steps.
pub(crate) fn convert_output(
    checks: &OutputChecks,
    worker: u32,
    step: u64,
    batches: Vec<Batch>,
) -> Result<WorkerOutput> {
    if let Some(limit) = checks.max_output {
        let attempted: u64 = batches.iter().map(|b| b.weights.len() as u64).sum();
        if attempted > limit {
            return Err(GuestError::OutputLimit {
                worker,
                step,
                limit,
                attempted,
            }
            .into());
        }
    }
    let refuse = |message: String| -> Error {
        GuestError::Failed {
            worker,
            call: "step",
            message,
        }
        .into()
    };
    let mut ports: Vec<Vec<Event>> = vec![Vec::new(); checks.ports];
    for batch in batches {
        let port = ports.get_mut(batch.port as usize).ok_or_else(|| {
            refuse(format!(
                "returned a batch for output port {}, but the circuit has {} output ports",
                batch.port, checks.ports
            ))
        })?;
        let values = slices(&batch.values, &batch.ends, batch.weights.len()).ok_or_else(|| {
            refuse(format!(
                "returned a malformed batch for output port {} (ends out of order or \
                         past the values, or as many ends as weights)",
                batch.port
            ))
        })?;
        port.reserve(values.len());
        for (value, weight) in values.into_iter().zip(&batch.weights) {
            if *weight == 0 {
                continue;
            }
            if checks.check_json
                && let Err(err) = serde_json::from_slice::<serde::de::IgnoredAny>(value)
            {
                return Err(refuse(format!(
                    "output port {} got a value that is not JSON: {err}",
                    batch.port
                )));
            }
            port.push(Event {
                value: value.to_vec(),
                weight: *weight,
            });
        }
    }
    let hash = hash_outputs(&ports);
    Ok(WorkerOutput {
        ports,
        hash,
        shared: None,
    })
}

/// A worker share's commit error: a done record with another hash is a
/// replay that computed other output.
pub(crate) fn share_error(e: sluice_storage::StorageError) -> Error {
    match e {
        sluice_storage::StorageError::DoneDiffers {
            step,
            worker,
            committed,
            replayed,
        } => Error::Nondeterministic {
            step,
            worker,
            committed,
            replayed,
        },
        e => e.into(),
    }
}

/// Runs blocking storage work off the async workers.
pub(crate) async fn blocking<T, E>(f: impl FnOnce() -> Result<T, E> + Send + 'static) -> Result<T>
where
    T: Send + 'static,
    E: Into<Error> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(Error::task("a storage task"))?
        .map_err(Into::into)
}
