//! Sluice's records in Kafka: the headers of input and output records, an
//! input record decoded into an event, an output entry encoded into records
//! (and its frontier into JSON), and back.

use crate::handle::KafkaLog;
use crate::transaction::Outgoing;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders, OwnedMessage};
use sluice_core::bad_records::marked_record_error;
use sluice_core::{Event, Frontier, OutputEntry, PartitionId};
use sluice_storage::{BadRecord, InputRecord, Result, StorageError as Error};

/// Header carrying an event's weight (decimal; `1` when absent).
pub const WEIGHT_HEADER: &str = "sluice-weight";
/// Header carrying the step that produced an output record.
pub const STEP_HEADER: &str = "sluice-step";
/// Header carrying the worker that produced an output record.
pub const WORKER_HEADER: &str = "sluice-worker";
/// Header carrying the input frontier an output record's entry covers.
pub const FRONTIER_HEADER: &str = "sluice-frontier";

/// The header texts of one output entry.
pub(crate) struct EntryTexts {
    step: String,
    worker: String,
    frontier: Vec<u8>,
    weights: Vec<String>,
}

impl EntryTexts {
    /// The header texts of `entry`.
    pub(crate) fn of(entry: &OutputEntry) -> Self {
        EntryTexts {
            step: entry.step.to_string(),
            worker: entry.worker.to_string(),
            frontier: frontier_json(&entry.frontier),
            weights: entry.events.iter().map(|e| e.weight.to_string()).collect(),
        }
    }
}

impl KafkaLog {
    /// The output records of one entry (one per event) into `out`.
    pub(crate) fn entry_records<'a>(
        topic: &'a str,
        partitions: u32,
        entry: &'a OutputEntry,
        texts: &'a EntryTexts,
        out: &mut Vec<Outgoing<'a>>,
    ) {
        for (event, w) in entry.events.iter().zip(&texts.weights) {
            let headers = OwnedHeaders::new_with_capacity(4)
                .insert(Header {
                    key: STEP_HEADER,
                    value: Some(texts.step.as_bytes()),
                })
                .insert(Header {
                    key: WORKER_HEADER,
                    value: Some(texts.worker.as_bytes()),
                })
                .insert(Header {
                    key: WEIGHT_HEADER,
                    value: Some(w.as_bytes()),
                })
                .insert(Header {
                    key: FRONTIER_HEADER,
                    value: Some(texts.frontier.as_slice()),
                });
            out.push(Outgoing {
                topic,
                partition: (entry.worker % partitions) as i32,
                key: None,
                value: &event.value,
                headers: Some(headers),
            });
        }
    }
}
/// The step, worker and weight headers of an output record.
pub(crate) fn output_headers(topic: &str, p: u32, msg: &OwnedMessage) -> Result<(u64, u32, i64)> {
    let step = header(msg, STEP_HEADER).and_then(number::<u64>);
    let worker = header(msg, WORKER_HEADER).and_then(number::<u32>);
    let weight = header(msg, WEIGHT_HEADER).and_then(number::<i64>);
    match (step, worker, weight) {
        (Some(step), Some(worker), Some(weight)) => Ok((step, worker, weight)),
        _ => Err(Error::Corrupt {
            what: format!("output record {topic}/{p}@{}", msg.offset()),
            message: format!(
                "missing or malformed `{STEP_HEADER}`, `{WORKER_HEADER}` or `{WEIGHT_HEADER}` \
                 header (was the topic written by another producer?)"
            ),
        }),
    }
}

fn header<'a>(msg: &'a OwnedMessage, key: &str) -> Option<&'a [u8]> {
    let headers = msg.headers()?;
    (0..headers.count())
        .filter_map(|i| headers.try_get(i))
        .find(|h| h.key == key)
        .and_then(|h| h.value)
}

fn number<T: std::str::FromStr>(bytes: &[u8]) -> Option<T> {
    std::str::from_utf8(bytes).ok()?.trim().parse().ok()
}

/// Decodes an input record: an event when the value is JSON and the
/// weight header, if present, a non-zero integer; else a [`BadRecord`]
/// saying why, at `topic/partition@offset`. A weight of 0 marks a line an
/// ingest kept as not an event (its error is the line's own).
pub(crate) fn decode_record(topic: &str, partition: u32, msg: &OwnedMessage) -> InputRecord {
    let offset = msg.offset().max(0) as u64;
    let bad = |error: String| {
        InputRecord::Bad(BadRecord {
            offset,
            position: format!("{topic}/{partition}@{offset}"),
            error,
            value: msg.payload().map(<[u8]>::to_vec),
        })
    };
    let Some(value) = msg.payload() else {
        return bad("the record has no value (Sluice input records carry a JSON value)".into());
    };
    let weight = match header(msg, WEIGHT_HEADER) {
        None => 1,
        Some(w) => match number::<i64>(w) {
            Some(0) => return bad(marked_record_error(value)),
            Some(n) => n,
            None => {
                return bad(format!(
                    "header `{WEIGHT_HEADER}` must be a non-zero integer, got {:?}",
                    String::from_utf8_lossy(w)
                ));
            }
        },
    };
    if let Err(e) = serde_json::from_slice::<serde::de::IgnoredAny>(value) {
        return bad(format!("the value is not JSON: {e}"));
    }
    InputRecord::Event(Event {
        value: value.to_vec(),
        weight,
    })
}

fn frontier_json(f: &Frontier) -> Vec<u8> {
    let v: Vec<[u64; 3]> = f
        .iter()
        .map(|(id, o)| [id.input as u64, id.partition as u64, *o])
        .collect();
    serde_json::to_vec(&v).unwrap_or_default()
}

/// Parses a `sluice-frontier` header (for consumers and tests).
pub fn parse_frontier(bytes: &[u8]) -> Option<Frontier> {
    let v: Vec<[u64; 3]> = serde_json::from_slice(bytes).ok()?;
    Some(
        v.into_iter()
            .map(|[i, p, o]| {
                (
                    PartitionId {
                        input: i as u32,
                        partition: p as u32,
                    },
                    o,
                )
            })
            .collect(),
    )
}
