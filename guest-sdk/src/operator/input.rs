//! Input ports: decode the host's JSON events into a typed Z-set.

use crate::circuit::{Data, Operator, StepContext};
use crate::error::{Error, Result};
use crate::{ZSet, codec};
use std::any::Any;
use std::marker::PhantomData;

pub(crate) struct Input<T> {
    port: usize,
    name: String,
    _type: PhantomData<fn() -> T>,
}

impl<T> Input<T> {
    pub(crate) fn new(port: usize, name: &str) -> Self {
        Input {
            port,
            name: name.to_owned(),
            _type: PhantomData,
        }
    }
}

impl<T: Data> Operator for Input<T> {
    fn name(&self) -> &'static str {
        "input"
    }

    fn eval(&mut self, cx: &mut StepContext<'_>, _: &[&dyn Any]) -> Result<Box<dyn Any>> {
        let events = &cx.inputs[self.port];
        let mut out: ZSet<T> = Vec::with_capacity(events.len());
        for (index, (bytes, weight)) in events.iter().enumerate() {
            let value = codec::from_json(bytes).map_err(|message| Error::BadInput {
                port: self.name.clone(),
                index,
                message,
            })?;
            out.push((value, weight));
        }
        Ok(Box::new(out))
    }
}
