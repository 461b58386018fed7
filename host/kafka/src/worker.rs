//! A worker's holder in a pipeline across hosts ([`KafkaWorker`]): commits
//! the worker's share of a divided step as its own transaction, with a done
//! record on the step topic.
//!
//! [`KafkaWorker`]: crate::worker::KafkaWorker

use crate::handle::{KafkaLog, TxnProducer};
use crate::records::EntryTexts;
use crate::steps::done_key;
use crate::transaction::Outgoing;
use sluice_storage::{Result, StorageError as Error, WorkerCommit, WorkerDone, decide_share};
use std::sync::Arc;

/// One worker of a Kafka pipeline's divided steps, taken: its producer
/// (transactional id `sluice.<pipeline>.w<worker>`) was initialised after
/// every earlier holder's, which fenced them.
pub(crate) struct KafkaWorker {
    /// The log it commits to.
    pub(crate) log: Arc<KafkaLog>,
    /// The worker it holds.
    pub(crate) worker: u32,
    /// `None` once a transaction failed: a holder never re-initialises
    /// (that would fence whoever took the worker since); it is taken anew.
    pub(crate) producer: Option<TxnProducer>,
    /// Whether it read the step topic to its true end since it was taken.
    pub(crate) synced: bool,
}

impl sluice_storage::WorkerCommitter for KafkaWorker {
    fn worker(&self) -> u32 {
        self.worker
    }

    fn commit(&mut self, commit: &WorkerCommit) -> Result<WorkerDone> {
        let (step, worker) = (commit.step, commit.worker);
        let log = &self.log;
        // Everything any earlier holder committed, once (taking the worker
        // ended their transactions); then the division, read from the step
        // topic if this handle has not seen it yet (another host recorded
        // it).
        let synced = self.synced;
        let (record, done) = log.with_steps(|s| {
            if !synced {
                log.catch_up_to_end(s)?;
            }
            let known = s.records.as_ref().and_then(|r| r.get(&step)).is_some();
            if !known {
                log.catch_up(s)?;
                // A replayed share may be of a step older than the window.
                log.ensure_step(s, step)?;
            }
            Ok((
                s.records.as_ref().and_then(|r| r.get(&step)).cloned(),
                s.done.get(&(step, worker)).map(|(h, _)| *h),
            ))
        })?;
        self.synced = true;
        if let Some(done) = decide_share(self.worker, record.as_ref(), done, commit)? {
            return Ok(done);
        }
        let role = format!("w{worker}");
        if self.producer.is_none() {
            return Err(Error::backend(
                "Kafka",
                format!("committing worker {worker}'s share of step {step}"),
                true,
                "an earlier transaction of this holder failed: the worker must be taken again",
            ));
        }
        // The outputs and the dead letters, with the done record.
        let topics = log.output_topics(commit.logs().map(|(name, _)| name))?;
        let texts: Vec<EntryTexts> = commit.logs().map(|(_, e)| EntryTexts::of(e)).collect();
        let mut records = Vec::new();
        for (((_, entry), (topic, n)), texts) in commit.logs().zip(&topics).zip(&texts) {
            KafkaLog::entry_records(topic, *n, entry, texts, &mut records);
        }
        let value = postcard::to_allocvec(&(step, worker, commit.hash))
            .map_err(Error::corrupt("done record"))?;
        let key = done_key(step, worker);
        let steps_topic = log.config.steps_topic();
        records.push(Outgoing::step_log(&steps_topic, &key, &value));
        log.transact(&mut self.producer, &role, Some(step), records, None)
            .map_err(|e| match e {
                // Another holder took the worker: this one is a zombie, the
                // pipeline is not taken over (a recovery takes it anew).
                Error::TransactionalProducerSuperseded { .. } => {
                    Error::WorkerTaken { worker, step }
                }
                e => e,
            })?;
        log.with_steps(|s| {
            s.done.entry((step, worker)).or_insert((commit.hash, None));
            Ok(())
        })?;
        Ok(WorkerDone::Committed)
    }
}
