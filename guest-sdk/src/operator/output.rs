//! Output ports: encode a step's delta as JSON and consolidate it by its
//! encodings.

use crate::circuit::{Data, Operator, StepContext, input};
use crate::codec;
use crate::error::Result;
use std::any::Any;
use std::marker::PhantomData;

pub(crate) struct Output<T> {
    port: usize,
    /// Scratch space of the consolidation, kept from step to step.
    index: Vec<u32>,
    _type: PhantomData<fn() -> T>,
}

impl<T> Output<T> {
    pub(crate) fn new(port: usize) -> Self {
        Output {
            port,
            index: Vec::new(),
            _type: PhantomData,
        }
    }
}

impl<T: Data> Operator for Output<T> {
    fn name(&self) -> &'static str {
        "output"
    }

    fn eval(&mut self, cx: &mut StepContext<'_>, inputs: &[&dyn Any]) -> Result<Box<dyn Any>> {
        let delta = input::<T>(inputs, 0);
        let port = &mut cx.outputs[self.port];
        let first = port.len();
        for (value, weight) in delta {
            if *weight != 0 {
                port.push_with(*weight, |bytes| codec::write_json(bytes, value))?;
            }
        }
        // Consolidated by encoding, not by sorting the records: what the
        // log holds is the encodings, and sorting compared records
        // O(n log n) times (a step's output order is not part of its
        // meaning; the host compares outputs as multisets).
        port.consolidate_from(first, &mut self.index);
        Ok(Box::new(()))
    }
}
