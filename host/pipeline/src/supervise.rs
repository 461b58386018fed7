//! The recovery policy, one for every pipeline: a transient error (storage
//! that may answer again) is retried by recovering — reopening the
//! coordinator from the log and the newest checkpoint, which never loses or
//! repeats an effect — after a growing pause, a bounded number of times in
//! a row. Guest failures, limits, nondeterminism, configuration conflicts
//! and fencing are final.

use crate::error::{Error, Result};
use crate::pipeline::Pipeline;
use sluice_runtime::Coordinator;
use std::time::Duration;

/// How often and how patiently a pipeline recovers from transient errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveryPolicy {
    /// Recoveries in a row (without a committed step between them) before
    /// the error is final.
    pub max_retries: u32,
    /// The pause before the first recovery; it doubles with each one in a
    /// row.
    pub first_backoff: Duration,
    /// The longest pause.
    pub max_backoff: Duration,
}

impl Default for RecoveryPolicy {
    fn default() -> Self {
        RecoveryPolicy {
            max_retries: 5,
            first_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(6_400),
        }
    }
}

/// An error that knows whether retrying may help.
pub trait Transient {
    /// Whether a retry (after recovering) may succeed.
    fn is_transient(&self) -> bool;
}

impl Transient for Error {
    fn is_transient(&self) -> bool {
        Error::is_transient(self)
    }
}

impl Transient for sluice_runtime::Error {
    fn is_transient(&self) -> bool {
        sluice_runtime::Error::is_transient(self)
    }
}

impl RecoveryPolicy {
    /// How long to wait before recovering from `error`, after `in_a_row`
    /// recoveries since the last committed step; `None` if it is final.
    pub fn retry_after(&self, error: &impl Transient, in_a_row: u32) -> Option<Duration> {
        (error.is_transient() && in_a_row < self.max_retries).then(|| self.backoff(in_a_row))
    }

    /// The pause before recovery number `in_a_row + 1`.
    pub fn backoff(&self, in_a_row: u32) -> Duration {
        self.first_backoff
            .saturating_mul(1u32 << in_a_row.min(16))
            .min(self.max_backoff)
    }
}

/// A pipeline that ran until its input was consumed and checkpointed.
pub struct Idle {
    /// The coordinator, still open.
    pub coordinator: Coordinator,
    /// Recoveries it took.
    pub recoveries: u32,
}

impl Pipeline {
    /// Opens a coordinator and runs steps until no worker has new input,
    /// then checkpoints; recovers from transient errors as `policy` says.
    /// `on_step` sees the coordinator after it opens and after every step.
    pub async fn run_until_idle(
        &self,
        policy: &RecoveryPolicy,
        on_step: impl FnMut(&Coordinator),
    ) -> Result<Idle> {
        self.run_until_idle_gated(policy, on_step, async |_| Ok(()))
            .await
    }

    /// [`run_until_idle`](Self::run_until_idle), with `gate` awaited
    /// before every step: it returns when the next step may be divided
    /// (`sluice run` holds a step back until the file being appended has
    /// given every partition a whole batch, so its steps are those it would
    /// take with the file appended first), or fails to stop the run there
    /// (a failed gate is final, never retried).
    pub async fn run_until_idle_gated(
        &self,
        policy: &RecoveryPolicy,
        mut on_step: impl FnMut(&Coordinator),
        mut gate: impl AsyncFnMut(&Coordinator) -> Result<()>,
    ) -> Result<Idle> {
        let (mut recoveries, mut in_a_row) = (0, 0);
        loop {
            let mut committed = false;
            let mut gated = false;
            let attempt = async {
                let mut c = self
                    .coordinator_keeping_w(self.options().clone(), Vec::new())
                    .await?;
                // A change of W commits a step with whatever input there is:
                // the gate comes first.
                if c.workers() != self.rescale_to().unwrap_or(c.workers()) {
                    if let Err(e) = gate(&c).await {
                        gated = true;
                        return Err(e);
                    }
                    self.rescale_if_asked(&mut c).await?;
                }
                on_step(&c);
                loop {
                    if let Err(e) = gate(&c).await {
                        gated = true;
                        // The last step's commit, still being written,
                        // ends before the run does (the gate's error is
                        // the one to tell; a failed commit is recovered by
                        // the next run).
                        let _ = c.settle().await;
                        return Err(e);
                    }
                    // Each step's commit is written while the next runs.
                    let stepped = c.step_overlapped().await?;
                    // Progress is a step committed, not one under way: a
                    // commit that fails on every attempt must not reset
                    // the count of retries in a row.
                    committed = c.stats().steps > 0;
                    if !stepped {
                        break;
                    }
                    on_step(&c);
                }
                c.finish().await?;
                Ok::<_, Error>(c)
            };
            match attempt.await {
                Ok(coordinator) => {
                    return Ok(Idle {
                        coordinator,
                        recoveries,
                    });
                }
                Err(e) => {
                    if committed {
                        in_a_row = 0;
                    }
                    if gated {
                        return Err(e);
                    }
                    let Some(pause) = policy.retry_after(&e, in_a_row) else {
                        return Err(e);
                    };
                    in_a_row += 1;
                    recoveries += 1;
                    tracing::warn!(
                        pipeline = %self.options().name,
                        "recovering after a transient error (retry {in_a_row} of {} in a row): {e}",
                        policy.max_retries
                    );
                    tokio::time::sleep(pause).await;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct E(bool);
    impl Transient for E {
        fn is_transient(&self) -> bool {
            self.0
        }
    }

    #[test]
    fn transient_errors_are_retried_with_growing_pauses_up_to_the_limit() {
        let p = RecoveryPolicy::default();
        assert_eq!(p.retry_after(&E(true), 0), Some(Duration::from_millis(100)));
        assert_eq!(p.retry_after(&E(true), 3), Some(Duration::from_millis(800)));
        assert_eq!(p.retry_after(&E(true), 5), None, "five in a row at most");
        assert_eq!(p.retry_after(&E(false), 0), None, "final errors are final");
        let patient = RecoveryPolicy {
            max_retries: 100,
            ..p
        };
        assert_eq!(patient.backoff(60), p.max_backoff, "capped");
    }
}
