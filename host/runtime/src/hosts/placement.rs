//! Where workers run: the slot of each worker (slot 0 the coordinator's
//! process, slot `i` its `i`-th host), the arithmetic that keeps a
//! placement sticky as hosts come and go, and the plan each host is told
//! ([`MeshPlan`]).

use super::wire::WireMesh;

/// Where a pipeline's workers run, for one exchange session: what the
/// coordinator tells each host it places workers on.
#[derive(Debug, Clone)]
pub(crate) struct MeshPlan {
    session: u64,
    slots: Vec<u32>,
    followers: Vec<Vec<u32>>,
    addrs: Vec<String>,
    owners: Vec<u32>,
}

impl MeshPlan {
    /// The plan of exchange `session`: worker `w` on slot `slots[w]` (and
    /// its followers on `followers[w]`), slot `s` reached at `addrs[s]`
    /// (slot 0, the coordinator's, over its connection), shard `i` owned
    /// by worker `owners[i]`.
    pub(crate) fn new(
        session: u64,
        slots: Vec<u32>,
        followers: Vec<Vec<u32>>,
        addrs: Vec<String>,
        owners: Vec<u32>,
    ) -> Self {
        MeshPlan {
            session,
            slots,
            followers,
            addrs,
            owners,
        }
    }

    /// The slot worker `w` runs on (its primary).
    pub(crate) fn slot(&self, w: u32) -> u32 {
        self.slots.get(w as usize).copied().unwrap_or(0)
    }

    /// What the host at `addr` (as [`RemoteHost::addr`](super::RemoteHost::addr))
    /// is told.
    pub(crate) fn for_host(&self, addr: &str) -> WireMesh {
        WireMesh {
            session: self.session,
            slot: self.addrs.iter().position(|a| a == addr).unwrap_or(0) as u32,
            slots: self.slots.clone(),
            followers: self.followers.clone(),
            addrs: self.addrs.clone(),
            owners: self.owners.clone(),
        }
    }
}

/// The first placement of `workers` workers with `hosts` other hosts:
/// worker `w` on slot `w mod (hosts + 1)` — slot 0 the coordinator's
/// process, slot `i` `hosts[i - 1]`.
pub(crate) fn round_robin(workers: u32, hosts: usize) -> Vec<u32> {
    (0..workers).map(|w| w % (hosts as u32 + 1)).collect()
}

/// The slot with the least workers (ties: the highest, so the
/// coordinator's own process is the last to take more).
fn least_loaded(load: &[u32]) -> usize {
    let min = load.iter().min().copied().unwrap_or(0);
    load.iter().rposition(|l| *l == min).unwrap_or(0)
}

/// The placement after the hosts change from `from` to `to` (addresses;
/// slot 0, this process, stays): every worker whose host stays keeps it,
/// the workers of hosts that left go to the least loaded slots, then
/// workers move from the most to the least loaded slot until no two slots
/// differ by more than one worker. So a host leaving moves only its own
/// workers, and a host joining takes only its share.
pub(crate) fn replace_placement(placement: &[u32], from: &[&str], to: &[&str]) -> Vec<u32> {
    let slots = to.len() + 1;
    let mut next: Vec<Option<usize>> = placement
        .iter()
        .map(|s| match *s as usize {
            0 => Some(0),
            s => from
                .get(s - 1)
                .and_then(|addr| to.iter().position(|a| a == addr))
                .map(|i| i + 1),
        })
        .collect();
    let mut load = vec![0u32; slots];
    for s in next.iter().flatten() {
        load[*s] += 1;
    }
    for slot in next.iter_mut().filter(|s| s.is_none()) {
        let s = least_loaded(&load);
        *slot = Some(s);
        load[s] += 1;
    }
    loop {
        let max = load.iter().max().copied().unwrap_or(0);
        let low = least_loaded(&load);
        if max <= load[low] + 1 {
            break;
        }
        let high = load.iter().rposition(|l| *l == max).unwrap_or(0);
        // The highest-numbered worker of the fullest slot moves.
        let Some(w) = next.iter().rposition(|s| *s == Some(high)) else {
            break;
        };
        next[w] = Some(low);
        load[high] -= 1;
        load[low] += 1;
    }
    next.into_iter().map(|s| s.unwrap_or(0) as u32).collect()
}

/// The first placement of `workers` workers on this process and the hosts
/// at addresses `hosts`:
/// where `hint` says they ran, for those whose host is among `hosts` (the
/// others spread to the least loaded, then balanced), or round robin
/// without a hint of this W.
pub(crate) fn placement_from_hint(hint: &[String], workers: u32, hosts: &[&str]) -> Vec<u32> {
    if hint.len() != workers as usize {
        return round_robin(workers, hosts.len());
    }
    let mut before: Vec<&str> = Vec::new();
    let slots: Vec<u32> = hint
        .iter()
        .map(|addr| {
            if addr.is_empty() {
                return 0;
            }
            let i = before.iter().position(|a| a == addr).unwrap_or_else(|| {
                before.push(addr);
                before.len() - 1
            });
            i as u32 + 1
        })
        .collect();
    replace_placement(&slots, &before, hosts)
}

/// A slot for one more worker on `slots` slots placed as `placement`.
pub(crate) fn place_one(placement: &[u32], slots: usize) -> u32 {
    let mut load = vec![0u32; slots.max(1)];
    for s in placement {
        if let Some(l) = load.get_mut(*s as usize) {
            *l += 1;
        }
    }
    least_loaded(&load) as u32
}

/// The slot for one more replica of a worker whose replicas run on
/// `taken`, among `load.len()` slots loaded as `load`: a slot in a zone
/// none of them is in first (`zone` of a slot; a slot without a zone is a
/// zone of its own), then the least loaded; ties: the highest slot, so the
/// coordinator's own process is the last to take more. `None` when every
/// slot runs one already.
pub(crate) fn replica_slot<'z>(
    taken: &[u32],
    load: &[u32],
    zone: impl Fn(u32) -> Option<&'z str>,
) -> Option<u32> {
    let shares_a_zone = |s: u32| zone(s).is_some_and(|z| taken.iter().any(|t| zone(*t) == Some(z)));
    (0..load.len() as u32)
        .filter(|s| !taken.contains(s))
        .min_by_key(|s| (shares_a_zone(*s), load[*s as usize], std::cmp::Reverse(*s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_goes_to_another_zone_first_then_to_the_least_loaded_slot() {
        // Slots 0 and 1 in zone a, 2 and 3 in zone b.
        let zones = ["a", "a", "b", "b"];
        let zone = |s: u32| zones.get(s as usize).copied();
        // The primary on 0 (zone a): the follower goes to zone b, the less
        // loaded of its slots.
        assert_eq!(replica_slot(&[0], &[1, 0, 3, 2], zone), Some(3));
        // With both zones taken, the least loaded slot left.
        assert_eq!(replica_slot(&[0, 3], &[1, 0, 3, 2], zone), Some(1));
        // Without zones: the least loaded, ties to the highest slot.
        assert_eq!(replica_slot(&[0], &[1, 1, 1, 1], |_| None), Some(3));
        assert_eq!(replica_slot(&[0], &[1, 0, 1, 1], |_| None), Some(1));
        // A slot without a zone is a zone of its own.
        let partial = [Some("a"), Some("a"), None];
        let zone = |s: u32| partial[s as usize];
        assert_eq!(replica_slot(&[0], &[1, 0, 5], zone), Some(2));
        // Every slot runs one already.
        assert_eq!(replica_slot(&[0, 1, 2], &[1, 1, 1], zone), None);
    }

    fn loads(placement: &[u32], slots: usize) -> Vec<u32> {
        let mut l = vec![0; slots];
        for s in placement {
            l[*s as usize] += 1;
        }
        l
    }

    fn moved(a: &[u32], from: &[&str], b: &[u32], to: &[&str]) -> usize {
        let addr = |s: u32, hosts: &[&str]| (s > 0).then(|| hosts[s as usize - 1].to_owned());
        a.iter()
            .zip(b)
            .filter(|(x, y)| addr(**x, from) != addr(**y, to))
            .count()
    }

    #[test]
    fn a_joining_host_takes_its_share_and_a_leaving_one_gives_only_its_own() {
        // W = 6 on the coordinator and one host: 3 and 3.
        let two = round_robin(6, 1);
        assert_eq!(loads(&two, 2), [3, 3]);
        // A host joins: it takes two workers, one from each.
        let three = replace_placement(&two, &["a"], &["a", "b"]);
        assert_eq!(loads(&three, 3), [2, 2, 2]);
        assert_eq!(moved(&two, &["a"], &three, &["a", "b"]), 2);
        // Another joins: 6 on 4 slots moves one (the ideal is 1.5).
        let four = replace_placement(&three, &["a", "b"], &["a", "b", "c"]);
        assert_eq!(loads(&four, 4).iter().max(), Some(&2));
        assert_eq!(moved(&three, &["a", "b"], &four, &["a", "b", "c"]), 1);
        // Host "a" leaves: only its workers move.
        let left = replace_placement(&four, &["a", "b", "c"], &["b", "c"]);
        let a_had = four.iter().filter(|s| **s == 1).count();
        assert_eq!(moved(&four, &["a", "b", "c"], &left, &["b", "c"]), a_had);
        assert_eq!(loads(&left, 3), [2, 2, 2]);
        // The same hosts: nothing moves.
        assert_eq!(replace_placement(&left, &["b", "c"], &["b", "c"]), left);
    }

    #[test]
    fn an_added_worker_goes_to_the_least_loaded_slot() {
        assert_eq!(place_one(&[0, 1, 0], 3), 2);
        assert_eq!(place_one(&[0, 1, 2], 3), 2);
        assert_eq!(place_one(&[], 1), 0);
    }
}
