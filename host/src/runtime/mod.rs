//! The pipeline runtime: the engine, the workers, the exchange between them
//! and the coordinator that runs the step protocol.

pub(crate) mod bindings;
pub mod coordinator;
pub mod crash;
pub mod determinism;
pub mod engine;
pub mod exchange;
pub mod pipeline;
pub mod worker;

pub use coordinator::{Coordinator, Layout, PipelineOptions, Stats};
pub use engine::{Limits, LoadedComponent, SluiceEngine};
pub use worker::{CircuitShape, Worker};
