//! The suite every [`Membership`] implementation passes: joining in order,
//! the first to join leading, leaving, lapsing when renewals stop, a
//! quick rejoin under the same name keeping its place, and a name another
//! address holds refused.

use crate::{Member, Membership};
use std::time::{Duration, Instant};

fn member(name: &str) -> Member {
    Member {
        name: name.into(),
        addr: format!("127.0.0.1:{}", 10_000 + name.len()),
        zone: None,
    }
}

fn names(view: &crate::View) -> Vec<&str> {
    view.members.iter().map(|m| m.name.as_str()).collect()
}

/// Runs every test, each on a fresh group from `make`.
pub async fn membership<F, Fut>(make: F)
where
    F: Fn() -> Fut,
    Fut: Future<Output = Box<dyn Membership>>,
{
    join_order_decides_the_leader(&*make().await).await;
    leaving_is_seen_at_once(&*make().await).await;
    a_member_that_stops_renewing_lapses(&*make().await).await;
    a_quick_rejoin_keeps_its_place(&*make().await).await;
    a_name_another_address_holds_is_refused(&*make().await).await;
}

/// Members appear in join order; the first leads.
pub async fn join_order_decides_the_leader(group: &dyn Membership) {
    assert!(group.view().await.unwrap().members.is_empty());
    let _a = group.join(member("a")).await.unwrap();
    let _c = group.join(member("c")).await.unwrap();
    let _b = group.join(member("b")).await.unwrap();
    let view = group.view().await.unwrap();
    assert_eq!(names(&view), ["a", "c", "b"]);
    assert_eq!(view.leader(), Some(&member("a")));
    // Renewals keep them in past the TTL.
    tokio::time::sleep(group.ttl() * 2).await;
    assert_eq!(names(&group.view().await.unwrap()), ["a", "c", "b"]);
    assert!(_a.alive() && _b.alive() && _c.alive());
}

/// A member that leaves is gone from the next view; the next leads.
pub async fn leaving_is_seen_at_once(group: &dyn Membership) {
    let a = group.join(member("a")).await.unwrap();
    let _b = group.join(member("b")).await.unwrap();
    a.leave().await.unwrap();
    let view = group.view().await.unwrap();
    assert_eq!(names(&view), ["b"]);
    assert_eq!(view.leader().map(|m| m.name.as_str()), Some("b"));
}

/// A member that stops renewing (a dead host) drops out after the TTL.
pub async fn a_member_that_stops_renewing_lapses(group: &dyn Membership) {
    let a = group.join(member("a")).await.unwrap();
    let _b = group.join(member("b")).await.unwrap();
    let dropped = Instant::now();
    drop(a);
    loop {
        let view = group.view().await.unwrap();
        if names(&view) == ["b"] {
            break;
        }
        assert!(
            dropped.elapsed() < group.ttl() * 3,
            "a dead member still listed {:?} after the TTL: {:?}",
            dropped.elapsed(),
            names(&view)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        dropped.elapsed() >= group.ttl() / 2,
        "a member lapsed before its TTL"
    );
}

/// A member restarting under its name while its membership lives keeps its
/// place: the leader stays the leader.
pub async fn a_quick_rejoin_keeps_its_place(group: &dyn Membership) {
    let a = group.join(member("a")).await.unwrap();
    let _b = group.join(member("b")).await.unwrap();
    drop(a);
    let again = group.join(member("a")).await.unwrap();
    assert_eq!(names(&group.view().await.unwrap()), ["a", "b"]);
    tokio::time::sleep(group.ttl() * 2).await;
    assert_eq!(names(&group.view().await.unwrap()), ["a", "b"]);
    assert!(again.alive());
}

/// A second host under a live member's name, at another address, is
/// refused once the first has renewed past the TTL (two hosts under one
/// name would both lead); a name whose holder died is taken once its
/// membership lapses.
pub async fn a_name_another_address_holds_is_refused(group: &dyn Membership) {
    let a = group.join(member("a")).await.unwrap();
    let elsewhere = Member {
        name: "a".into(),
        addr: "127.0.0.2:10001".into(),
        zone: None,
    };
    let asked = Instant::now();
    match group.join(elsewhere.clone()).await {
        Err(crate::Error::NameTaken { name, holder }) => {
            assert_eq!((name.as_str(), holder), ("a", member("a").addr));
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a second host joined under a live member's name"),
    }
    assert!(asked.elapsed() >= group.ttl(), "refused before the TTL");
    assert_eq!(
        group.view().await.unwrap().leader(),
        Some(&member("a")),
        "the first keeps the name"
    );
    assert!(a.alive());
    // Its holder dies: the name is free once the membership lapses.
    drop(a);
    let taken = group.join(elsewhere.clone()).await.unwrap();
    assert_eq!(group.view().await.unwrap().leader(), Some(&elsewhere));
    assert!(taken.alive());
}
