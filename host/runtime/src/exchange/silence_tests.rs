//! Tests of the exchange across hosts when links fail one way: a slot
//! that goes silent fails the waiters within about the session timeout, a
//! slot that is slow but heard from does not, and an abort reaches a host
//! the failing one cannot reach (passed on by the others).

use super::tests::Direct;
use super::*;
use crate::bindings::KeyedEvents;
use crate::packed::{empty, push};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

fn evs(key: &str) -> KeyedEvents {
    let mut out = empty();
    push(&mut out, key.as_bytes(), b"v", 1);
    out
}

/// A link that takes every frame and delivers none (packets dropped one
/// way).
struct Swallow;

#[async_trait::async_trait]
impl Link for Swallow {
    async fn send(&self, _: Frame) -> Result<(), String> {
        Ok(())
    }
}

type Cell = Arc<OnceLock<Weak<Exchange>>>;

/// Three slots, worker `w` on slot `w`, joined by direct links except
/// `cut` (from, to), which swallows everything; each slot may be silent
/// for `silence`. Returns the exchanges and a task that heartbeats every
/// direction but the cut one (abort it to stop).
fn three(cut: (u32, u32), silence: Duration) -> (Vec<Arc<Exchange>>, tokio::task::JoinHandle<()>) {
    let layout = Layout {
        epoch: 0,
        workers: 3,
        shards: (0..SHARDS).map(|s| s % 3).collect(),
        partitions: vec![],
    };
    let cells: Vec<Cell> = (0..3).map(|_| Arc::default()).collect();
    let xs: Vec<Arc<Exchange>> = (0..3u32)
        .map(|slot| {
            let links = (0..3u32)
                .map(|to| {
                    (to != slot).then(|| -> Arc<dyn Link> {
                        if (slot, to) == cut {
                            Arc::new(Swallow)
                        } else {
                            Arc::new(Direct(cells[to as usize].clone()))
                        }
                    })
                })
                .collect();
            Exchange::across(
                &layout,
                Placement {
                    session: 9,
                    slot,
                    slots: vec![0, 1, 2],
                    followers: Vec::new(),
                    links,
                    silence,
                },
            )
        })
        .collect();
    for (cell, x) in cells.iter().zip(&xs) {
        cell.set(Arc::downgrade(x)).unwrap();
    }
    let beating = xs.clone();
    let beat = tokio::spawn(async move {
        loop {
            for from in 0..3u32 {
                for to in 0..3u32 {
                    if from != to && (from, to) != cut {
                        beating[to as usize].heard_from(from);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
    (xs, beat)
}

/// Waits (bounded) until every exchange has failed its current step.
async fn all_failed(xs: &[Arc<Exchange>]) {
    tokio::time::timeout(Duration::from_secs(5), async {
        while xs.iter().any(|x| x.failure().is_none()) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .expect("every slot heard the step failed");
}

/// Packets B→C dropped, everything else flowing (heartbeats too): C's
/// worker waits for B's part, B is silent to C — C fails the step within
/// about the session timeout instead of waiting forever, and tells A and B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_cut_one_way_fails_the_waiting_slot_and_every_slot_hears_it() {
    let silence = Duration::from_millis(300);
    let (xs, beat) = three((1, 2), silence);
    for x in &xs {
        x.begin_step(1);
    }
    let started = Instant::now();
    let (_, _, c) = tokio::time::timeout(Duration::from_secs(10), async {
        tokio::join!(
            xs[0].shuffle(0, 1, 4, evs("k0")),
            xs[1].shuffle(1, 1, 4, evs("k1")),
            xs[2].shuffle(2, 1, 4, evs("k2"))
        )
    })
    .await
    .expect("no slot waits forever");
    let err = c.unwrap_err().to_string();
    assert!(
        started.elapsed() < silence * 2 + Duration::from_millis(200),
        "failed after {:?}",
        started.elapsed()
    );
    assert!(
        err.contains("slot 1") && err.contains("sent nothing"),
        "{err}"
    );
    all_failed(&xs).await;
    for x in &xs {
        let why = x.failure().unwrap().to_string();
        assert!(
            why.contains("sent nothing"),
            "the root cause travels: {why}"
        );
    }
    beat.abort();
}

/// A slot that is slow to contribute but keeps being heard from (its
/// heartbeats arrive) is waited for, however long: only silence fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_slot_still_heard_from_is_waited_for() {
    let silence = Duration::from_millis(200);
    let (xs, beat) = three((9, 9), silence);
    for x in &xs {
        x.begin_step(1);
    }
    let slow = {
        let x = xs[1].clone();
        async move {
            tokio::time::sleep(silence * 4).await;
            x.shuffle(1, 1, 4, evs("k1")).await
        }
    };
    let (a, b, c) = tokio::join!(
        xs[0].shuffle(0, 1, 4, evs("k0")),
        slow,
        xs[2].shuffle(2, 1, 4, evs("k2"))
    );
    assert!(a.is_ok() && b.is_ok() && c.is_ok(), "{a:?} {b:?} {c:?}");
    assert!(xs.iter().all(|x| x.failure().is_none()));
    beat.abort();
}

/// A's frames to C are dropped; A fails its step: its abort to C is lost,
/// but B, hearing it, passes it on — C's waiting worker fails with A's
/// cause long before C would take A for silent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_abort_reaches_a_slot_the_failing_one_cannot_reach() {
    let (xs, beat) = three((0, 2), Duration::from_secs(60));
    for x in &xs {
        x.begin_step(1);
    }
    let waiting = xs[2].shuffle(2, 1, 4, evs("k2"));
    let failing = async {
        tokio::time::sleep(Duration::from_millis(20)).await;
        xs[0].worker_failed(0, "its guest trapped");
    };
    let (r, ()) = tokio::join!(
        tokio::time::timeout(Duration::from_secs(5), waiting),
        failing
    );
    let err = r.expect("C heard of the failure").unwrap_err().to_string();
    assert!(err.contains("its guest trapped"), "{err}");
    all_failed(&xs).await;
    beat.abort();
}
