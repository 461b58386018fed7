//! Tests of the exchange: routing by key owner in worker order, contract
//! violations, and exchanges across hosts joined by in-memory links.

use super::*;
use crate::bindings::KeyedEvents;
use crate::packed::{empty, push, unpack};
use std::sync::Arc;

/// Packs `(key, value)` events of weight 1.
fn evs<'a>(events: impl IntoIterator<Item = (&'a str, u8)>) -> KeyedEvents {
    let mut out = empty();
    for (k, v) in events {
        push(&mut out, k.as_bytes(), &[v], 1);
    }
    out
}

fn owner(key: &[u8], layout: &Layout) -> u32 {
    layout.owner(shard_of(key))
}

fn two_workers() -> Layout {
    Layout {
        epoch: 0,
        workers: 2,
        shards: (0..SHARDS).map(|s| (s * 7 / 3) % 2).collect(),
        partitions: vec![],
    }
}

#[tokio::test]
async fn routes_by_key_owner_in_worker_order() {
    let layout = two_workers();
    let x = Exchange::new(&layout);
    x.begin_step(1);
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let send = |w: u8| evs(keys.iter().map(|k| (k.as_str(), w)));
    let (a, b) = tokio::join!(x.shuffle(0, 1, 7, send(0)), x.shuffle(1, 1, 7, send(1)));
    for (w, got) in [a.unwrap(), b.unwrap()].into_iter().enumerate() {
        let got = unpack(&got).unwrap();
        assert!(got.iter().all(|(k, _, _)| owner(k, &layout) == w as u32));
        // Worker 0's contributions come first.
        let sources: Vec<u8> = got.iter().map(|(_, v, _)| v[0]).collect();
        assert!(sources.windows(2).all(|p| p[0] <= p[1]));
        assert_eq!(
            got.len(),
            2 * keys
                .iter()
                .filter(|k| owner(k.as_bytes(), &layout) == w as u32)
                .count()
        );
    }
}

#[tokio::test]
async fn a_worker_that_skips_a_channel_fails_the_waiters() {
    let x = Exchange::new(&two_workers());
    x.begin_step(1);
    let waiting = x.shuffle(0, 1, 1, evs([("a", 0)]));
    let finishing = async {
        tokio::task::yield_now().await;
        x.worker_finished(1);
    };
    let (r, ()) = tokio::join!(waiting, finishing);
    assert!(
        r.unwrap_err()
            .to_string()
            .contains("without calling shuffle on channel 1")
    );
}

#[tokio::test]
async fn a_malformed_batch_fails_the_step() {
    let x = Exchange::new(&two_workers());
    x.begin_step(1);
    let mut bad = evs([("a", 0), ("b", 1)]);
    bad.ends.reverse();
    let err = x.shuffle(0, 1, 1, bad).await.unwrap_err();
    assert!(err.to_string().contains("malformed batch"), "{err}");
    let mut short = evs([("a", 0)]);
    short.weights.push(1);
    x.begin_step(2);
    assert!(x.shuffle(0, 2, 1, short).await.is_err());
}

/// A link straight into another exchange in this process.
pub(super) struct Direct(pub(super) Arc<std::sync::OnceLock<std::sync::Weak<Exchange>>>);

#[async_trait::async_trait]
impl Link for Direct {
    async fn send(&self, frame: Frame) -> Result<(), String> {
        match self.0.get().and_then(std::sync::Weak::upgrade) {
            Some(x) => {
                x.receive(frame);
                Ok(())
            }
            None => Err("gone".into()),
        }
    }
}

/// A link that always fails.
struct Broken;

#[async_trait::async_trait]
impl Link for Broken {
    async fn send(&self, _: Frame) -> Result<(), String> {
        Err("connection refused".into())
    }
}

/// The exchanges of `hosts` slots joined by direct links, worker `w` on
/// slot `w mod hosts`.
fn mesh(layout: &Layout, hosts: u32) -> Vec<Arc<Exchange>> {
    replicated_mesh(layout, hosts, 1)
}

fn five_workers() -> Layout {
    Layout {
        epoch: 0,
        workers: 5,
        shards: (0..SHARDS).map(|s| (s * 13 / 7) % 5).collect(),
        partitions: vec![],
    }
}

/// Every worker shuffles distinct events on channels 3 and 9, for two
/// steps; returns what each received, by (step, channel, worker).
async fn run_rounds(xs: &[Arc<Exchange>], workers: u32) -> Vec<Vec<(Vec<u8>, Vec<u8>, i64)>> {
    let host = |w: u32| xs[(w as usize) % xs.len()].clone();
    let mut got = Vec::new();
    for step in 1..=2u64 {
        for x in xs {
            x.begin_step(step);
        }
        for channel in [3u32, 9] {
            let calls = (0..workers).map(|w| {
                let x = host(w);
                let events = sent_by(w, step, channel);
                tokio::spawn(async move { x.shuffle(w, step, channel, events).await })
            });
            let calls: Vec<_> = calls.collect();
            for call in calls {
                let r = call.await.unwrap().unwrap();
                got.push(
                    unpack(&r)
                        .unwrap()
                        .into_iter()
                        .map(|(k, v, w)| (k.to_vec(), v.to_vec(), w))
                        .collect(),
                );
            }
        }
        for w in 0..workers {
            host(w).worker_finished(w);
        }
    }
    got
}

#[tokio::test]
async fn across_hosts_each_worker_gets_what_one_host_gives_it() {
    let layout = five_workers();
    let one = run_rounds(&[Exchange::new(&layout)], 5).await;
    assert!(one.iter().any(|r| !r.is_empty()));
    for hosts in [2, 3, 5] {
        let across = run_rounds(&mesh(&layout, hosts), 5).await;
        assert_eq!(across, one, "on {hosts} hosts");
    }
}

#[tokio::test]
async fn a_worker_on_another_host_that_skips_a_channel_fails_the_waiters() {
    let xs = mesh(&two_workers(), 2);
    for x in &xs {
        x.begin_step(1);
    }
    let waiting = xs[0].shuffle(0, 1, 1, evs([("a", 0)]));
    let finishing = async {
        tokio::task::yield_now().await;
        xs[1].worker_finished(1);
    };
    let (r, ()) = tokio::join!(waiting, finishing);
    let err = r.unwrap_err().to_string();
    assert!(
        err.contains("without calling shuffle on channel 1"),
        "{err}"
    );
    // The next step starts clean on both hosts.
    for x in &xs {
        x.begin_step(2);
    }
    let (a, b) = tokio::join!(
        xs[0].shuffle(0, 2, 1, evs([("a", 0)])),
        xs[1].shuffle(1, 2, 1, evs([("b", 1)]))
    );
    assert!(a.is_ok() && b.is_ok());
}

#[tokio::test]
async fn an_unreachable_host_fails_the_step() {
    let layout = two_workers();
    let x = Exchange::across(
        &layout,
        Placement {
            session: 1,
            slot: 0,
            slots: vec![0, 1],
            followers: Vec::new(),
            links: vec![None, Some(Arc::new(Broken))],
            silence: std::time::Duration::from_secs(60),
        },
    );
    x.begin_step(1);
    let err = x.shuffle(0, 1, 1, evs([("a", 0)])).await.unwrap_err();
    assert!(err.to_string().contains("cannot be reached"), "{err}");
    assert!(x.failure().is_some());
}

/// A link whose queue stays full: sending never completes.
struct Full;

#[async_trait::async_trait]
impl Link for Full {
    async fn send(&self, _: Frame) -> Result<(), String> {
        std::future::pending().await
    }
}

#[tokio::test]
async fn a_sender_stuck_on_a_full_link_gives_up_when_the_step_fails() {
    let x = Exchange::across(
        &two_workers(),
        Placement {
            session: 1,
            slot: 0,
            slots: vec![0, 1],
            followers: Vec::new(),
            links: vec![None, Some(Arc::new(Full))],
            silence: std::time::Duration::from_secs(60),
        },
    );
    x.begin_step(1);
    let stuck = x.shuffle(0, 1, 1, evs([("a", 0)]));
    let failing = async {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        x.worker_failed(1, "its host was lost");
    };
    let limit = std::time::Duration::from_secs(5);
    let (r, ()) = tokio::join!(tokio::time::timeout(limit, stuck), failing);
    let err = r.expect("the sender gave up").unwrap_err().to_string();
    assert!(err.contains("its host was lost"), "{err}");
}

#[tokio::test]
async fn frames_of_another_session_or_an_earlier_step_are_dropped() {
    let xs = mesh(&two_workers(), 2);
    xs[0].begin_step(5);
    for (session, step) in [(8, 5), (7, 4)] {
        xs[0].receive(Frame {
            session,
            step,
            channel: 1,
            from: 1,
            body: FrameBody::Abort(ExchangeError::Aborted("stale".into())),
        });
    }
    assert_eq!(xs[0].failure(), None);
}

/// [`mesh`] with replicas: worker `w`'s primary on slot `w mod hosts`,
/// its followers on the next `replicas - 1` slots.
fn replicated_mesh(layout: &Layout, hosts: u32, replicas: u32) -> Vec<Arc<Exchange>> {
    let cells: Vec<Arc<std::sync::OnceLock<std::sync::Weak<Exchange>>>> =
        (0..hosts).map(|_| Arc::default()).collect();
    let followers: Vec<Vec<u32>> = (0..layout.workers)
        .map(|w| (1..replicas).map(|r| (w + r) % hosts).collect())
        .collect();
    let xs: Vec<Arc<Exchange>> = (0..hosts)
        .map(|slot| {
            let links = (0..hosts)
                .map(|s| {
                    (s != slot)
                        .then(|| Arc::new(Direct(cells[s as usize].clone())) as Arc<dyn Link>)
                })
                .collect();
            Exchange::across(
                layout,
                Placement {
                    session: 7,
                    slot,
                    slots: (0..layout.workers).map(|w| w % hosts).collect(),
                    followers: followers.clone(),
                    links,
                    silence: std::time::Duration::from_secs(60),
                },
            )
        })
        .collect();
    for (cell, x) in cells.iter().zip(&xs) {
        cell.set(Arc::downgrade(x)).unwrap();
    }
    xs
}

/// What worker `w` sends on `channel` in `step` ([`run_rounds`]'s events).
fn sent_by(w: u32, step: u64, channel: u32) -> KeyedEvents {
    let mut events = empty();
    for i in 0..40u32 {
        let key = format!("k{}", (i * 7 + w * 3 + channel) % 23);
        push(
            &mut events,
            key.as_bytes(),
            &[w as u8, i as u8],
            i64::from(step as u32),
        );
    }
    events
}

#[tokio::test]
async fn every_replica_of_a_worker_gets_what_one_host_gives_it() {
    let layout = five_workers();
    let one = run_rounds(&[Exchange::new(&layout)], 5).await;
    let (hosts, replicas) = (3u32, 2u32);
    let xs = replicated_mesh(&layout, hosts, replicas);
    for x in &xs {
        x.begin_step(1);
    }
    // Every replica of every worker shuffles on channel 3 of step 1.
    let mut calls = Vec::new();
    for w in 0..5u32 {
        for r in 0..replicas {
            let x = xs[((w + r) % hosts) as usize].clone();
            calls.push((
                w,
                tokio::spawn(async move { x.shuffle(w, 1, 3, sent_by(w, 1, 3)).await }),
            ));
        }
    }
    for (w, call) in calls {
        let got: Vec<(Vec<u8>, Vec<u8>, i64)> = unpack(&call.await.unwrap().unwrap())
            .unwrap()
            .into_iter()
            .map(|(k, v, w)| (k.to_vec(), v.to_vec(), w))
            .collect();
        // run_rounds records (step 1, channel 3) first, in worker order.
        assert_eq!(got, one[w as usize], "worker {w}");
    }
}

#[tokio::test]
async fn replicas_that_send_different_events_fail_the_step_as_nondeterministic() {
    let layout = two_workers();
    // Worker 0 on slots 0 and 1, worker 1 on slots 1 and 0.
    let xs = replicated_mesh(&layout, 2, 2);
    for x in &xs {
        x.begin_step(1);
    }
    let other = evs([("a", 9)]);
    let (a, b, c, d) = tokio::join!(
        xs[0].shuffle(0, 1, 1, evs([("a", 0)])),
        xs[1].shuffle(0, 1, 1, other),
        xs[0].shuffle(1, 1, 1, evs([("b", 1)])),
        xs[1].shuffle(1, 1, 1, evs([("b", 1)])),
    );
    for r in [a, b, c, d] {
        let err = r.unwrap_err();
        assert!(matches!(err, ExchangeError::Diverged(_)), "{err}");
        assert!(
            err.to_string().contains("replicas of worker 0"),
            "names the worker: {err}"
        );
    }
    // A replica that sends nothing where the other sent events is caught
    // too (empty parts travel with replicas).
    for x in &xs {
        x.begin_step(2);
    }
    let (a, b, c, d) = tokio::join!(
        xs[0].shuffle(0, 2, 1, evs([("a", 0)])),
        xs[1].shuffle(0, 2, 1, empty()),
        xs[0].shuffle(1, 2, 1, empty()),
        xs[1].shuffle(1, 2, 1, empty()),
    );
    for r in [a, b, c, d] {
        assert!(matches!(r, Err(ExchangeError::Diverged(_))), "{r:?}");
    }
}
