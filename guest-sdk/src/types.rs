//! Small value types that operators produce.

use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

/// An `f64` with a total order (IEEE 754 `totalOrder`, as
/// [`f64::total_cmp`]), so it can be a stream value. Serializes as a plain
/// JSON number.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OrdF64(pub f64);

impl PartialEq for OrdF64 {
    fn eq(&self, other: &Self) -> bool {
        self.0.total_cmp(&other.0) == Ordering::Equal
    }
}
impl Eq for OrdF64 {}
impl PartialOrd for OrdF64 {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OrdF64 {
    fn cmp(&self, other: &Self) -> Ordering {
        self.0.total_cmp(&other.0)
    }
}

/// An event-time window `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Window {
    /// First instant in the window.
    pub start: i64,
    /// First instant after the window.
    pub end: i64,
}
