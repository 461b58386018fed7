//! Layouts: which worker owns each shard of the key space and reads each
//! input partition.
//!
//! The coordinator makes layouts; a layout has an epoch, and a change of
//! layout is committed with the record of the first step that runs under
//! it, so a replay of any step runs under that step's layout. The first
//! layout of a pipeline (epoch 0) gives shard `s` to worker `s mod W` and
//! partition `p` of every input to worker `p mod W`; later ones come from
//! [`Layout::rebalance`], which is *sticky*: a worker keeps its shards up to
//! its new quota, and only the shards of removed workers and the excess of
//! workers above quota move, to the workers under quota. Going from W to
//! W + 1 workers moves 1/(W + 1) of the shards — the least any balanced
//! layout can — where `hash mod W` would move W/(W + 1).

use crate::event::PartitionId;
use crate::shape::PipelineShape;
use serde::{Deserialize, Serialize};
pub use sluice_shard::{SHARDS, shard_of};

/// Which worker owns each shard and reads each input partition.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Layout {
    /// Bumped by every change, from 0.
    pub epoch: u64,
    /// The number of workers W.
    pub workers: u32,
    /// The owner of each shard, indexed by shard (`SHARDS` entries).
    pub shards: Vec<u32>,
    /// Per input (port order), the reader of each partition.
    pub partitions: Vec<Vec<u32>>,
}

/// Reassigns `owners` (each item's worker) to `workers` workers, moving as
/// few items as a balanced assignment allows: each worker keeps its items
/// up to its quota (⌈n/W⌉ for the workers holding most, ⌊n/W⌋ for the
/// rest), and the items of removed workers and above quota go, in item
/// order, to the workers under quota, lowest first.
fn sticky(owners: &[u32], workers: u32) -> Vec<u32> {
    let (n, w) = (owners.len(), workers as usize);
    let mut held = vec![0usize; w];
    for &o in owners {
        if (o as usize) < w {
            held[o as usize] += 1;
        }
    }
    // The workers holding most keep the extra items.
    let mut order: Vec<usize> = (0..w).collect();
    order.sort_by_key(|&i| (std::cmp::Reverse(held[i]), i));
    let mut quota = vec![n / w; w];
    for &i in order.iter().take(n % w) {
        quota[i] += 1;
    }
    let mut next = owners.to_vec();
    let mut kept = vec![0usize; w];
    let mut free = Vec::new();
    for (item, &o) in owners.iter().enumerate() {
        let o = o as usize;
        if o < w && kept[o] < quota[o] {
            kept[o] += 1;
        } else {
            free.push(item);
        }
    }
    let mut free = free.into_iter();
    for worker in 0..w {
        while kept[worker] < quota[worker] {
            let item = free.next().expect("quotas add up to the items");
            next[item] = worker as u32;
            kept[worker] += 1;
        }
    }
    next
}

impl Layout {
    /// The first layout of a pipeline of this shape: shard `s` to worker
    /// `s mod W`, partition `p` to worker `p mod W`.
    pub fn initial(shape: &PipelineShape) -> Layout {
        let w = shape.workers.max(1);
        Layout {
            epoch: 0,
            workers: w,
            shards: (0..SHARDS).map(|s| s % w).collect(),
            partitions: shape
                .inputs
                .iter()
                .map(|i| (0..i.partitions).map(|p| p % w).collect())
                .collect(),
        }
    }

    /// The next layout, for `workers` workers (at least 1): sticky for
    /// shards and for each input's partitions. The same layout, epoch
    /// unchanged, when `workers` is already W.
    pub fn rebalance(&self, workers: u32) -> Layout {
        let workers = workers.max(1);
        if workers == self.workers {
            return self.clone();
        }
        Layout {
            epoch: self.epoch + 1,
            workers,
            shards: sticky(&self.shards, workers),
            partitions: self.partitions.iter().map(|p| sticky(p, workers)).collect(),
        }
    }

    /// The `mod W` layout for `workers` workers (what the exchange did
    /// before layouts): the baseline a sticky rebalance is measured against.
    pub fn modulo(&self, workers: u32) -> Layout {
        let w = workers.max(1);
        Layout {
            epoch: self.epoch + 1,
            workers: w,
            shards: (0..SHARDS).map(|s| s % w).collect(),
            partitions: self
                .partitions
                .iter()
                .map(|p| (0..p.len() as u32).map(|i| i % w).collect())
                .collect(),
        }
    }

    /// The worker that owns `shard`.
    pub fn owner(&self, shard: u32) -> u32 {
        self.shards[shard as usize]
    }

    /// The worker that reads `partition` of input `input`.
    pub fn reader(&self, input: u32, partition: u32) -> Option<u32> {
        self.partitions
            .get(input as usize)?
            .get(partition as usize)
            .copied()
    }

    /// The shards `worker` owns, in order.
    pub fn shards_of(&self, worker: u32) -> Vec<u32> {
        (0..SHARDS).filter(|&s| self.owner(s) == worker).collect()
    }

    /// Per worker, the input partitions it reads, with their log names.
    pub fn assignment(&self, shape: &PipelineShape) -> Vec<Vec<(PartitionId, String)>> {
        let mut owned = vec![Vec::new(); self.workers as usize];
        for (i, input) in shape.inputs.iter().enumerate() {
            for p in 0..input.partitions {
                if let Some(w) = self.reader(i as u32, p) {
                    owned[w as usize].push((
                        PartitionId {
                            input: i as u32,
                            partition: p,
                        },
                        input.name.clone(),
                    ));
                }
            }
        }
        owned
    }

    /// The shards that change owner from `self` to `next`: `(shard, from,
    /// to)`, in shard order.
    pub fn moves(&self, next: &Layout) -> Vec<(u32, u32, u32)> {
        (0..SHARDS)
            .filter_map(|s| {
                let (from, to) = (self.owner(s), next.owner(s));
                (from != to).then_some((s, from, to))
            })
            .collect()
    }

    /// Checks that the layout fits `shape`: every shard and every input
    /// partition has exactly one owner, a worker below W.
    pub fn validate(&self, shape: &PipelineShape) -> Result<(), String> {
        if self.workers == 0 {
            return Err("a layout needs at least one worker".into());
        }
        if self.shards.len() != SHARDS as usize {
            return Err(format!("{} shard owners, not {SHARDS}", self.shards.len()));
        }
        if let Some(s) = self.shards.iter().position(|&w| w >= self.workers) {
            return Err(format!(
                "shard {s} is owned by worker {}, but there are {} workers",
                self.shards[s], self.workers
            ));
        }
        if self.partitions.len() != shape.inputs.len() {
            return Err(format!(
                "partition readers for {} inputs, the pipeline has {}",
                self.partitions.len(),
                shape.inputs.len()
            ));
        }
        for (input, readers) in shape.inputs.iter().zip(&self.partitions) {
            if readers.len() != input.partitions as usize {
                return Err(format!(
                    "{} readers for input `{}` of {} partitions",
                    readers.len(),
                    input.name,
                    input.partitions
                ));
            }
            if let Some(p) = readers.iter().position(|&w| w >= self.workers) {
                return Err(format!(
                    "input `{}` partition {p} is read by worker {}, but there are {} workers",
                    input.name, readers[p], self.workers
                ));
            }
        }
        Ok(())
    }

    /// A hash of the whole layout, for the step records' chain.
    pub fn digest(&self) -> u128 {
        let mut h = xxhash_rust::xxh3::Xxh3::new();
        h.update(&self.epoch.to_le_bytes());
        h.update(&self.workers.to_le_bytes());
        for s in &self.shards {
            h.update(&s.to_le_bytes());
        }
        for p in &self.partitions {
            h.update(&(p.len() as u64).to_le_bytes());
            for w in p {
                h.update(&w.to_le_bytes());
            }
        }
        h.digest128()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::CircuitPorts;

    #[test]
    fn every_partition_has_one_reader() {
        let shape = PipelineShape::new(
            &CircuitPorts {
                inputs: vec!["a".into(), "b".into()],
                outputs: vec!["out".into()],
                snapshot_version: 3,
                operators: Vec::new(),
            },
            2,
            |n| if n == "a" { 3 } else { 1 },
        )
        .unwrap();
        let owned = Layout::initial(&shape).assignment(&shape);
        assert_eq!(owned.len(), 2);
        let all: Vec<PartitionId> = owned.iter().flatten().map(|(id, _)| *id).collect();
        assert_eq!(all.len(), 4);
        assert_eq!(shape.partitions().count(), 4);
        assert_eq!(owned[1].len(), 1, "a/1");
    }

    fn shape(workers: u32, partitions: u32) -> PipelineShape {
        let ports = CircuitPorts {
            inputs: vec!["a".into(), "b".into()],
            outputs: vec!["out".into()],
            snapshot_version: 1,
            operators: Vec::new(),
        };
        PipelineShape::new(&ports, workers, |_| partitions).unwrap()
    }

    fn moved(a: &Layout, b: &Layout) -> f64 {
        a.moves(b).len() as f64 / SHARDS as f64
    }

    #[test]
    fn a_sticky_rebalance_moves_what_the_table_says() {
        // Issue #12's table: 2 → 3 and 8 → 9 with 1024 shards.
        let two = Layout::initial(&shape(2, 8));
        let three = two.rebalance(3);
        assert!(
            (moved(&two, &three) - 0.333).abs() < 0.001,
            "{}",
            moved(&two, &three)
        );
        assert!((moved(&two, &two.modulo(3)) - 0.666).abs() < 0.001);
        let eight = Layout::initial(&shape(8, 8));
        let nine = eight.rebalance(9);
        assert!(
            (moved(&eight, &nine) - 0.110).abs() < 0.002,
            "{}",
            moved(&eight, &nine)
        );
        assert!((moved(&eight, &eight.modulo(9)) - 0.883).abs() < 0.002);
    }

    #[test]
    fn every_rebalance_is_balanced_valid_and_never_moves_more_than_it_must() {
        let s = shape(1, 8);
        let mut layout = Layout::initial(&s);
        for w in [3, 4, 2, 1, 5, 8, 7, 2, 16, 3] {
            let next = layout.rebalance(w);
            next.validate(&s).unwrap();
            assert_eq!(next.epoch, layout.epoch + 1);
            let counts: Vec<usize> = (0..w).map(|i| next.shards_of(i).len()).collect();
            let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
            assert!(hi - lo <= 1, "{counts:?}");
            // At least: what removed workers held plus what the others
            // hold above their quota. A sticky layout moves exactly that.
            let mut must = 0usize;
            for worker in 0..layout.workers {
                let had = layout.shards_of(worker).len();
                if worker >= w {
                    must += had;
                } else {
                    must += had.saturating_sub(next.shards_of(worker).len());
                }
            }
            assert_eq!(layout.moves(&next).len(), must, "{} → {w}", layout.workers);
            // Partitions: every reader below W, each input spread evenly.
            for readers in &next.partitions {
                let per: Vec<usize> = (0..w)
                    .map(|i| readers.iter().filter(|&&r| r == i).count())
                    .collect();
                assert!(per.iter().max().unwrap() - per.iter().min().unwrap() <= 1);
            }
            layout = next;
        }
        assert_eq!(layout.rebalance(3), layout, "the same W changes nothing");
    }

    #[test]
    fn the_initial_layout_is_modulo_w_and_validation_catches_holes() {
        let s = shape(3, 5);
        let l = Layout::initial(&s);
        assert_eq!(l.owner(7), 1);
        assert_eq!(l.reader(1, 4), Some(1));
        assert_eq!(l.assignment(&s)[0].len(), 4, "a/0, a/3, b/0, b/3");
        let mut bad = l.clone();
        bad.shards[5] = 3;
        assert!(bad.validate(&s).unwrap_err().contains("shard 5"));
        let mut bad = l.clone();
        bad.partitions[0].pop();
        assert!(bad.validate(&s).is_err());
        assert_ne!(l.digest(), l.rebalance(2).digest());
    }
}
