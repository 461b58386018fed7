//! Output ports: consolidate a step's delta and encode it as JSON.

use crate::circuit::{Data, Operator, StepContext, input};
use crate::error::Result;
use crate::exchange::RawEvent;
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
        let mut delta = input::<T>(inputs, 0).clone();
        zset::consolidate(&mut delta);
        let port = &mut cx.outputs[self.port];
        for (value, weight) in &delta {
            port.push(RawEvent {
                key: Vec::new(),
                value: codec::to_json(value)?,
                weight: *weight,
            });
        }
        Ok(Box::new(()))
    }
}
