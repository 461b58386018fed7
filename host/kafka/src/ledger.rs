//! The checkpoint ledger ([`CheckpointLedger`] for [`KafkaLog`]): which
//! checkpoints of a shared store are committed, as records on the step topic.
//!
//! [`CheckpointLedger`]: sluice_storage::CheckpointLedger

use crate::handle::{KafkaLog, lock};
use crate::steps::{CHECKPOINT_KEY, lost_producer};
use crate::transaction::Outgoing;
use sluice_storage::{CheckpointLedger, Result, StorageError as Error};

/// Checkpoint commits as records on the step topic (key `checkpoint:` and
/// the step, value `(step, manifest)`), each in a transaction of the step
/// producer: a host whose producer another's `init_transactions` fenced
/// records none ([`StorageError::TransactionalProducerSuperseded`](Error::TransactionalProducerSuperseded)),
/// exactly as it commits no step.
impl CheckpointLedger for KafkaLog {
    fn record_checkpoint(&self, step: u64, manifest: &str) -> Result<()> {
        self.with_steps(|s| {
            if let Some(fenced) = s.lost {
                return Err(lost_producer(&self.config, None, fenced));
            }
            if s.epoch == 0 || s.producer.is_none() {
                return Err(Error::InvalidCommit {
                    step,
                    message: "the Kafka log was not fenced (call `fence` first), so it records \
                              no checkpoint"
                        .into(),
                });
            }
            let value = postcard::to_allocvec(&(step, manifest))
                .map_err(Error::corrupt("checkpoint record"))?;
            let key = format!("{CHECKPOINT_KEY}{step}");
            let topic = self.config.steps_topic();
            let record = Outgoing::step_log(&topic, key.as_bytes(), &value);
            match self.transact(&mut s.producer, "steps", None, vec![record], None) {
                Ok(_) => {
                    s.checkpoints.insert(step, manifest.to_owned());
                    Ok(())
                }
                Err(e) => {
                    // The producer is gone (whether the record took effect
                    // the next `fence` learns): the steps this coordinator
                    // still tries fail the same way — fenced, or worth a
                    // recovery — rather than as a misuse.
                    s.lost = Some(matches!(e, Error::TransactionalProducerSuperseded { .. }));
                    s.producer = None;
                    Err(e)
                }
            }
        })
    }

    fn recorded_checkpoints(&self, newest: usize) -> Result<Vec<(u64, String)>> {
        self.with_fresh_steps(|s| {
            // Checkpoint records follow their steps': back as far as the
            // `newest`-th newest, no further.
            self.extend_down(s, |s| s.checkpoints.len() >= newest)?;
            let mut out: Vec<(u64, String)> = s
                .checkpoints
                .iter()
                .rev()
                .take(newest)
                .map(|(step, m)| (*step, m.clone()))
                .collect();
            out.reverse();
            Ok(out)
        })
    }

    fn recorded_checkpoint(&self, step: u64) -> Result<Option<String>> {
        if let Some(m) = lock(&self.steps).checkpoints.get(&step) {
            return Ok(Some(m.clone()));
        }
        self.with_fresh_steps(|s| {
            if !s.checkpoints.contains_key(&step) && s.epoch == 0 {
                // A reader asked for a checkpoint its leader recorded: the
                // record may lie past a transaction open before it (the
                // last stable offset). Read to the true end.
                self.catch_up_to_end(s)?;
            }
            if !s.checkpoints.contains_key(&step) {
                // An older checkpoint's record follows its step's record.
                self.ensure_step(s, step)?;
            }
            Ok(s.checkpoints.get(&step).cloned())
        })
    }
}
