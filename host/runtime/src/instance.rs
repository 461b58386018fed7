//! What the host keeps for one instance ([`WorkerState`], the data of its
//! wasmtime store): its WASI context, the limiter that bounds its memories
//! and tables together, its end of the exchange, its deadline and the
//! clock it sees — and the host side of the `exchange` import it calls.

use crate::bindings::{KeyedEvents, WitExchangeError, sluice};
use crate::determinism::{StepClock, StepClockView};
use crate::error::ExchangeError;
use crate::exchange::Exchange;
use std::sync::Arc;
use wasmtime::ResourceLimiter;
use wasmtime_wasi::{ResourceTable, WasiCtx, WasiCtxView, WasiView};

/// Core instances one component instance may create. A Rust component has
/// a handful (its own module, the WASI adapter, shims); a Python one built
/// by componentize-py more than 32 (CPython and its libraries are shared
/// libraries, each linked as an instance, plus their shims).
pub const MAX_INSTANCES: usize = 64;
/// Linear memories one component instance may create.
pub const MAX_MEMORIES: usize = 8;
/// Tables one component instance may create.
pub const MAX_TABLES: usize = 32;
/// What one table element counts for against the memory limit.
pub const TABLE_ELEMENT_BYTES: usize = 16;

/// Bounds what one instance holds: **all** its linear memories and tables
/// together (so a component with several memories gets no more than one
/// would), and how many instances, memories and tables it creates.
/// Remembers a refused growth, so the failure is reported as the memory
/// limit.
pub(crate) struct InstanceLimiter {
    /// The limit, in bytes.
    pub(crate) max: usize,
    /// Bytes of linear memory and table the instance holds.
    pub(crate) used: usize,
    /// The total a refused growth asked for.
    pub(crate) refused: Option<usize>,
}

impl InstanceLimiter {
    pub(crate) fn new(max: usize) -> Self {
        InstanceLimiter {
            max,
            used: 0,
            refused: None,
        }
    }

    fn grow(&mut self, current: usize, desired: usize) -> bool {
        let total = (self.used + desired).saturating_sub(current);
        if total > self.max {
            self.refused = Some(total);
            return false;
        }
        self.used = total;
        true
    }
}

impl ResourceLimiter for InstanceLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(current, desired))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(self.grow(
            current.saturating_mul(TABLE_ELEMENT_BYTES),
            desired.saturating_mul(TABLE_ELEMENT_BYTES),
        ))
    }

    fn instances(&self) -> usize {
        MAX_INSTANCES
    }

    fn memories(&self) -> usize {
        MAX_MEMORIES
    }

    fn tables(&self) -> usize {
        MAX_TABLES
    }
}

/// The host state of one instance.
pub struct WorkerState {
    pub(crate) wasi: WasiCtx,
    pub(crate) table: ResourceTable,
    pub(crate) limiter: InstanceLimiter,
    pub(crate) exchange: Option<Arc<Exchange>>,
    pub(crate) worker: u32,
    /// The step being run (rounds of the exchange are per step).
    pub(crate) step: u64,
    pub(crate) exchange_error: Option<ExchangeError>,
    /// The [`ticks`](crate::engine::ticks) after which a host call returning
    /// to the guest fails the call (its wall-clock deadline).
    pub(crate) deadline_tick: u64,
    /// The clock the guest sees (its timers follow it).
    pub(crate) clock: StepClock,
}

impl WorkerState {
    /// The guest's `wasi:clocks/monotonic-clock`.
    pub(crate) fn clock_view(&mut self) -> StepClockView<'_> {
        StepClockView {
            clock: &self.clock,
            table: &mut self.table,
        }
    }
}

impl WasiView for WorkerState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl sluice::circuit::types::Host for WorkerState {}

impl sluice::circuit::exchange::Host for WorkerState {
    async fn shuffle(
        &mut self,
        channel: u32,
        events: KeyedEvents,
    ) -> std::result::Result<KeyedEvents, ExchangeError> {
        let result = match self.exchange.clone() {
            Some(exchange) => {
                exchange
                    .shuffle(self.worker, self.step, channel, events)
                    .await
            }
            None => Err(ExchangeError::ContractViolation(
                "exchange.shuffle called outside a step".into(),
            )),
        };
        if let Err(e) = &result {
            self.exchange_error.get_or_insert_with(|| e.clone());
        }
        result
    }

    /// A failed shuffle is an error the guest sees (and the host reports
    /// whatever the guest does next), never a trap.
    fn convert_exchange_error(&mut self, err: ExchangeError) -> wasmtime::Result<WitExchangeError> {
        Ok(match err {
            ExchangeError::ContractViolation(m) => WitExchangeError::ContractViolation(m),
            // Replicas that diverged are no fault of the guest's call.
            ExchangeError::Aborted(m)
            | ExchangeError::Silent { message: m, .. }
            | ExchangeError::Diverged(m) => WitExchangeError::Aborted(m),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wasmtime::Store;

    /// A core module with `n` memories of `pages` 64 KiB pages each.
    fn memories(n: u32, pages: u64) -> Vec<u8> {
        let mut module = wasm_encoder::Module::new();
        let mut section = wasm_encoder::MemorySection::new();
        for _ in 0..n {
            section.memory(wasm_encoder::MemoryType {
                minimum: pages,
                maximum: None,
                memory64: false,
                shared: false,
                page_size_log2: None,
            });
        }
        module.section(&section);
        module.finish()
    }

    fn instantiate(bytes: &[u8], max: usize) -> std::result::Result<(), String> {
        let engine = wasmtime::Engine::default();
        let module = wasmtime::Module::new(&engine, bytes).map_err(|e| e.to_string())?;
        let mut store = Store::new(&engine, InstanceLimiter::new(max));
        store.limiter(|l| l);
        wasmtime::Instance::new(&mut store, &module, &[])
            .map(|_| ())
            .map_err(|e| format!("{e:#}"))
    }

    #[test]
    fn the_memory_limit_covers_all_memories_together() {
        // One memory of 1 MiB under a 2 MiB limit: fine.
        instantiate(&memories(1, 16), 2 << 20).unwrap();
        // Two: 2 MiB, still fine.
        instantiate(&memories(2, 16), 2 << 20).unwrap();
        // Three memories of 1 MiB each: 3 MiB, over the limit, although
        // each alone is under it.
        assert!(instantiate(&memories(3, 16), 2 << 20).is_err());
    }

    #[test]
    fn memories_are_counted() {
        instantiate(&memories(MAX_MEMORIES as u32, 0), 1 << 20).unwrap();
        assert!(instantiate(&memories(MAX_MEMORIES as u32 + 1, 0), 1 << 20).is_err());
    }
}
