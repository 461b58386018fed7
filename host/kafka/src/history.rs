//! A step history written fast, for benchmarks: what a pipeline's committed
//! divided steps leave in its step topic (step records, workers' done
//! records, checkpoint records), written in large transactions without
//! running the steps — so what a take-over costs can be measured against a
//! history of a million steps in minutes.

use crate::handle::{KafkaLog, lock};
use crate::steps::{CHECKPOINT_KEY, done_key};
use crate::transaction::Outgoing;
use sluice_core::StepRecord;
use sluice_storage::{Result, StorageError as Error};
use std::ops::Range;

/// How many steps one transaction of [`KafkaLog::write_history_for_benchmarks`]
/// writes.
const STEPS_PER_TRANSACTION: u64 = 5_000;

impl KafkaLog {
    /// Appends the records of steps `steps` to the step topic: for each,
    /// the division `record(step)` returns and one done record per worker
    /// (hash 0), and after every `checkpoint_every`-th step a checkpoint
    /// record naming the manifest `bench-<step>` — in transactions of the
    /// step producer, so the log must be fenced first and the steps must
    /// follow its last. Output topics get nothing. `progress` is called
    /// with the steps written so far. Afterwards the handle has forgotten
    /// its window (the next use reads the tail).
    ///
    /// For benchmarks only: a real pipeline's history is written by its
    /// steps, each in its own transactions.
    pub fn write_history_for_benchmarks(
        &self,
        steps: Range<u64>,
        record: &dyn Fn(u64) -> StepRecord,
        checkpoint_every: u64,
        progress: &mut dyn FnMut(u64),
    ) -> Result<()> {
        let topic = self.config.steps_topic();
        let mut s = lock(&self.steps);
        if s.epoch == 0 || s.producer.is_none() {
            return Err(Error::InvalidCommit {
                step: steps.start,
                message: "the Kafka log was not fenced (call `fence` first)".into(),
            });
        }
        let mut from = steps.start;
        while from < steps.end {
            let to = from.saturating_add(STEPS_PER_TRANSACTION).min(steps.end);
            let mut owned: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
            for step in from..to {
                let r = record(step);
                let value = postcard::to_allocvec(&r).map_err(Error::corrupt("step record"))?;
                owned.push((step.to_be_bytes().to_vec(), value));
                for w in 0..r.frontiers.len() as u32 {
                    let done = postcard::to_allocvec(&(step, w, 0u128))
                        .map_err(Error::corrupt("done record"))?;
                    owned.push((done_key(step, w).to_vec(), done));
                }
                if checkpoint_every > 0 && (step + 1).is_multiple_of(checkpoint_every) {
                    let value = postcard::to_allocvec(&(step, format!("bench-{step}")))
                        .map_err(Error::corrupt("checkpoint record"))?;
                    owned.push((format!("{CHECKPOINT_KEY}{step}").into_bytes(), value));
                }
            }
            let records = owned
                .iter()
                .map(|(k, v)| Outgoing::step_log(&topic, k, v))
                .collect();
            self.transact(&mut s.producer, "steps", None, records, None)?;
            progress(to - steps.start);
            from = to;
        }
        s.forget();
        Ok(())
    }
}
