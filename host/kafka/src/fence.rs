//! Taking a pipeline's logs over ([`LogBackend::fence`] on Kafka): the step
//! and ingest producers initialised anew (which fences every older host and
//! aborts their open transactions), then the step topic read to its *true*
//! end.
//!
//! The true end is the high watermark, not the last stable offset: a holder
//! of a worker that died while committing its share leaves a transaction
//! open on the step topic, and a `read_committed` read stops before it —
//! missing every record committed after it (other workers' done records, a
//! checkpoint record), so recovery would restore an older checkpoint whose
//! input may be trimmed already. Only the next holder of that worker's
//! transactional id (or the broker's transaction timeout) ends such a
//! transaction, and holders are taken only after recovery reads the log:
//! waiting would be a circular wait. So the take-over ends them itself:
//! while the last stable offset stays below the end, it initialises a
//! producer with each worker's transactional id the step log names
//! (`sluice.<pipeline>.w<worker>`) — fencing that worker's holders and
//! aborting their open transactions — and reads on.
//!
//! [`LogBackend::fence`]: sluice_storage::LogBackend::fence

use crate::errors::kafka;
use crate::handle::{KafkaLog, StepState};
use rdkafka::consumer::Consumer;
use sluice_storage::Result;
use std::collections::BTreeSet;
use std::time::Instant;

impl KafkaLog {
    /// Forgets what `s` holds of the step topic and reads its tail again
    /// (see [`reload_steps`](Self::reload_steps)), to its true end, fencing the holders of workers whose open
    /// transactions hold the last stable offset back (left unloaded if that
    /// fails). A new committer calls this once its step producer is
    /// initialised, so no step producer's transaction is open either.
    pub(crate) fn reload_steps_to_true_end(&self, s: &mut StepState) -> Result<()> {
        let read = self
            .reload_steps(s)
            .and_then(|()| self.read_past_open_holders(s));
        if read.is_err() {
            s.forget();
        }
        read
    }

    /// Reads the step topic into `s` up to its last stable offset and, while
    /// that is below the high watermark read before, fences the holders of
    /// the workers the log names that were not fenced yet, then reads on.
    /// When every such holder is fenced and a transaction is still open
    /// (one being committed or aborted right now), waits for it.
    fn read_past_open_holders(&self, s: &mut StepState) -> Result<()> {
        let topic = self.config.steps_topic();
        let started = Instant::now();
        let mut fenced: BTreeSet<u32> = BTreeSet::new();
        loop {
            let end = self.true_end(&topic)?;
            self.catch_up(s)?;
            if s.read_to >= end {
                if !fenced.is_empty() {
                    tracing::info!(
                        workers = fenced.len(),
                        took = ?started.elapsed(),
                        "the step log was read past open transactions of workers' earlier holders \
                         (fenced, their transactions aborted)"
                    );
                }
                return Ok(());
            }
            let named = workers_named(s);
            let unfenced: Vec<u32> = (0..named).filter(|w| !fenced.contains(w)).collect();
            if unfenced.is_empty() {
                // Nothing left that this take-over may end: a transaction
                // being resolved now. Read to the end, waiting for it.
                return self.catch_up_to_end(s);
            }
            tracing::debug!(
                at = s.read_to,
                end,
                workers = unfenced.len(),
                "an open transaction holds the step log back: fencing the workers' holders"
            );
            for w in unfenced {
                // Initialising aborts the holder's open transaction; the
                // producer is not used (the next session takes the worker).
                drop(self.new_producer(&format!("w{w}"))?);
                fenced.insert(w);
            }
        }
    }

    /// The step topic's true end: its high watermark, as a
    /// `read_uncommitted` client sees it (past open transactions).
    fn true_end(&self, topic: &str) -> Result<u64> {
        let (_, end) = self
            .ends
            .fetch_watermarks(topic, 0, self.config.timeout)
            .map_err(kafka(format!("reading the end of {topic}")))?;
        Ok(end.max(0) as u64)
    }
}

/// How many workers the step log read into `s` names: the most any step
/// record divides among, and one past every worker with a done record.
fn workers_named(s: &StepState) -> u32 {
    let by_records = s
        .records
        .iter()
        .flat_map(|r| r.values())
        .map(|r| r.frontiers.len() as u32)
        .max()
        .unwrap_or(0);
    let by_done = s
        .done
        .keys()
        .map(|(_, w)| w.saturating_add(1))
        .max()
        .unwrap_or(0);
    by_records.max(by_done)
}
