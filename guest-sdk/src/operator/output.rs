//! Output ports: consolidate a step's delta and encode it as JSON.

use crate::circuit::{Data, Operator, StepContext, StepInput, input};
use crate::error::Result;
use crate::{codec, zset};
use std::any::Any;
use std::marker::PhantomData;

pub(crate) struct Output<T> {
    port: usize,
    _type: PhantomData<fn() -> T>,
}

impl<T> Output<T> {
    pub(crate) fn new(port: usize) -> Self {
        Output {
            port,
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
        // Consolidated by sorting positions, not records: the delta is
        // borrowed, and a copy of it would be as large as the step.
        for (index, weight) in zset::consolidated_order(delta) {
            port.push_with(weight, |bytes| codec::write_json(bytes, &delta[index].0))?;
        }
        Ok(Box::new(()))
    }

    fn eval_owned(
        &mut self,
        cx: &mut StepContext<'_>,
        mut inputs: Vec<StepInput<'_>>,
    ) -> Result<Box<dyn Any>> {
        let input = inputs.pop().expect("an output has one input");
        if let StepInput::Shared(delta) = input {
            return self.eval(cx, &[delta]);
        }
        let mut delta = input.into_owned::<T>().expect("an input not lent is given");
        // Given the delta: consolidated in place.
        zset::consolidate(&mut delta);
        let port = &mut cx.outputs[self.port];
        for (value, weight) in &delta {
            port.push_with(*weight, |bytes| codec::write_json(bytes, value))?;
        }
        Ok(Box::new(()))
    }
}
