//! Z-sets: collections of records with integer weights.

use crate::Data;

/// Change in a record's multiplicity: +1 insert, −1 delete.
pub type Weight = i64;

/// A Z-set delta: records with their weight changes. The same record may
/// appear several times until the set is [consolidated](consolidate).
pub type ZSet<T> = Vec<(T, Weight)>;

/// Sorts `zset` by record, merges equal records by adding their weights and
/// drops records whose weight sums to zero. The result is canonical: two
/// Z-sets denote the same change exactly when they consolidate to the same
/// vector.
///
/// ```
/// use sluice_guest::zset::consolidate;
/// let mut z = vec![("b", 1), ("a", 2), ("b", -1), ("a", 1)];
/// consolidate(&mut z);
/// assert_eq!(z, vec![("a", 3)]);
/// ```
pub fn consolidate<T: Ord>(zset: &mut ZSet<T>) {
    // Unstable: in place (a stable sort borrows a buffer of up to half the
    // step, which stays in the instance's memory for good), faster, and
    // copies that compare equal are merged, so their order is never seen.
    zset.sort_unstable_by(|a, b| a.0.cmp(&b.0));
    // Merge runs of equal records in place (no second vector as large as
    // the step): `kept` records are done, each distinct from the next.
    let mut kept = 0;
    for read in 0..zset.len() {
        if kept > 0 && zset[kept - 1].0 == zset[read].0 {
            let weight = zset[read].1;
            zset[kept - 1].1 += weight;
        } else {
            if kept > 0 && zset[kept - 1].1 == 0 {
                kept -= 1;
            }
            zset.swap(kept, read);
            kept += 1;
        }
    }
    if kept > 0 && zset[kept - 1].1 == 0 {
        kept -= 1;
    }
    zset.truncate(kept);
}

/// The order [`consolidate`] would give `zset` without changing it: for
/// each distinct record with a non-zero total, in ascending order, the
/// position of one of its copies and the total weight. Sorting positions
/// costs 4 bytes a record where a consolidated copy costs a record.
pub fn consolidated_order<T: Ord>(zset: &[(T, Weight)]) -> Vec<(usize, Weight)> {
    let mut order: Vec<u32> = (0..zset.len() as u32).collect();
    order.sort_unstable_by(|&a, &b| zset[a as usize].0.cmp(&zset[b as usize].0));
    let mut out: Vec<(usize, Weight)> = Vec::with_capacity(order.len());
    for i in order {
        let (record, weight) = &zset[i as usize];
        match out.last_mut() {
            Some((last, w)) if zset[*last].0 == *record => *w += weight,
            _ => {
                if matches!(out.last(), Some((_, 0))) {
                    out.pop();
                }
                out.push((i as usize, *weight));
            }
        }
    }
    if matches!(out.last(), Some((_, 0))) {
        out.pop();
    }
    out
}

/// Adds `delta` into an integrated multiset `into` (record → weight), keeping
/// only non-zero weights. Used by tests and by anyone integrating an output
/// stream.
pub fn integrate<T: Data>(into: &mut std::collections::BTreeMap<T, Weight>, delta: &[(T, Weight)]) {
    for (record, weight) in delta {
        let entry = into.entry(record.clone()).or_insert(0);
        *entry += weight;
        if *entry == 0 {
            into.remove(record);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;

    proptest! {
        #[test]
        fn consolidate_is_canonical(z in proptest::collection::vec((0u8..8, -3i64..4), 0..40)) {
            let mut c = z.clone();
            consolidate(&mut c);
            // Sorted, unique, no zero weights.
            prop_assert!(c.windows(2).all(|w| w[0].0 < w[1].0));
            prop_assert!(c.iter().all(|(_, w)| *w != 0));
            // Same total per record as the input.
            let mut expect = BTreeMap::new();
            integrate(&mut expect, &z);
            let got: BTreeMap<_, _> = c.into_iter().collect();
            prop_assert_eq!(got, expect);
        }

        #[test]
        fn consolidated_order_is_consolidate(z in proptest::collection::vec((0u8..8, -3i64..4), 0..40)) {
            let mut c = z.clone();
            consolidate(&mut c);
            let ordered: ZSet<u8> = consolidated_order(&z).into_iter().map(|(i, w)| (z[i].0, w)).collect();
            prop_assert_eq!(ordered, c);
        }
    }
}
