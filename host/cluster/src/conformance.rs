//! The suite every [`Membership`] implementation passes: joining in order,
//! the first to join leading, leaving, lapsing when renewals stop, a
//! quick rejoin under the same name keeping its place, a name another
//! address holds refused, and an upgrade request pending until the leader
//! answers it, once.

use crate::{Error, Member, Membership, UpgradeAnswer, UpgradeRequest};
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
    an_upgrade_request_is_answered_once(&*make().await).await;
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

fn upgrade(to: &str) -> UpgradeRequest {
    UpgradeRequest {
        id: format!("id-{to}"),
        to: to.into(),
        start_empty: vec!["counts".into()],
        answer: None,
    }
}

/// An upgrade request is stored and read back; while it is pending another
/// is refused; only an answer for its component is kept, and only once; an
/// answered request is replaced by the next; of two asked at once, one is
/// stored.
pub async fn an_upgrade_request_is_answered_once(group: &dyn Membership) {
    assert_eq!(group.upgrade_request().await.unwrap(), None);
    // Only the leader answers.
    let answered = UpgradeRequest {
        answer: Some(UpgradeAnswer::Refused("no".into())),
        ..upgrade("aa11")
    };
    assert!(matches!(
        group.request_upgrade(&answered).await,
        Err(Error::Invalid(_))
    ));
    assert_eq!(group.upgrade_request().await.unwrap(), None);

    group.request_upgrade(&upgrade("aa11")).await.unwrap();
    assert_eq!(
        group.upgrade_request().await.unwrap(),
        Some(upgrade("aa11"))
    );
    // One at a time.
    match group.request_upgrade(&upgrade("bb22")).await {
        Err(Error::UpgradePending { to }) => assert_eq!(to, "aa11"),
        other => panic!("a second upgrade asked while one is pending: {other:?}"),
    }
    assert_eq!(
        group.upgrade_request().await.unwrap(),
        Some(upgrade("aa11"))
    );

    // An answer for another request is not kept.
    let upgraded = UpgradeAnswer::Upgraded("kept 2 operators, started 1 empty".into());
    assert!(
        !group
            .answer_upgrade("id-bb22", upgraded.clone())
            .await
            .unwrap()
    );
    assert_eq!(
        group.upgrade_request().await.unwrap(),
        Some(upgrade("aa11"))
    );
    assert!(
        group
            .answer_upgrade("id-aa11", upgraded.clone())
            .await
            .unwrap()
    );
    let done = UpgradeRequest {
        answer: Some(upgraded),
        ..upgrade("aa11")
    };
    assert_eq!(group.upgrade_request().await.unwrap(), Some(done.clone()));
    // Answered once: a second answer changes nothing.
    let refused = UpgradeAnswer::Refused("too late".into());
    assert!(
        !group
            .answer_upgrade("id-aa11", refused.clone())
            .await
            .unwrap()
    );
    assert_eq!(group.upgrade_request().await.unwrap(), Some(done));

    // The next request replaces the answered one.
    group.request_upgrade(&upgrade("bb22")).await.unwrap();
    assert_eq!(
        group.upgrade_request().await.unwrap(),
        Some(upgrade("bb22"))
    );
    assert!(group.answer_upgrade("id-bb22", refused).await.unwrap());

    // Two hosts asking at once: one request is stored, the other refused.
    let (c, d) = (upgrade("cc33"), upgrade("dd44"));
    let (asked_c, asked_d) = tokio::join!(group.request_upgrade(&c), group.request_upgrade(&d));
    let (stored, pending) = match (asked_c, asked_d) {
        (Ok(()), Err(Error::UpgradePending { to })) => (c, to),
        (Err(Error::UpgradePending { to }), Ok(())) => (d, to),
        other => panic!("two upgrades asked at once: {other:?}"),
    };
    assert_eq!(pending, stored.to, "refused for another pending request");
    assert_eq!(group.upgrade_request().await.unwrap(), Some(stored));
}
