//! Reading output logs from a position: what `sluice read`, the HTTP API's
//! output reads and its server-sent events are built on.

use crate::error::Result;
use crate::log::LogBackend;
use sluice_core::{OutputPosition, PositionedEvent};

/// Reads up to `limit` events of output log `output` after position `after`
/// (from the start if `None`), in position order.
pub fn read_output(
    log: &dyn LogBackend,
    output: &str,
    after: Option<OutputPosition>,
    limit: usize,
) -> Result<Vec<PositionedEvent>> {
    let mut out = Vec::new();
    log.scan_output(output, after.map_or(0, |a| a.step), &mut |entry| {
        for (i, event) in entry.events.into_iter().enumerate() {
            let position = OutputPosition {
                step: entry.step,
                worker: entry.worker,
                index: i as u32,
            };
            if out.len() == limit {
                return Ok(std::ops::ControlFlow::Break(()));
            }
            if after.is_none_or(|a| position > a) {
                out.push(PositionedEvent {
                    position,
                    frontier: entry.frontier.clone(),
                    event,
                });
            }
        }
        // The entry is done: stop once the read is full.
        Ok(if out.len() == limit {
            std::ops::ControlFlow::Break(())
        } else {
            std::ops::ControlFlow::Continue(())
        })
    })?;
    Ok(out)
}
