//! Every example circuit, end to end through the host (`sluice run`, W=2),
//! against an independent, non-incremental computation of its query over
//! the same input. Nexmark input comes from `sluice gen nexmark`.

use crate::support::{component, sluice_cmd};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// A JSON value with object keys sorted, as a string: equal values compare
/// equal whatever order their fields were written in.
fn canonical(v: &Value) -> String {
    fn sort(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let sorted: BTreeMap<&String, Value> =
                    m.iter().map(|(k, v)| (k, sort(v))).collect();
                Value::Object(sorted.into_iter().map(|(k, v)| (k.clone(), v)).collect())
            }
            Value::Array(a) => Value::Array(a.iter().map(sort).collect()),
            other => other.clone(),
        }
    }
    sort(v).to_string()
}

pub(crate) type ZSet = BTreeMap<String, i64>;

fn zset(values: impl IntoIterator<Item = Value>) -> ZSet {
    let mut z = ZSet::new();
    for v in values {
        *z.entry(canonical(&v)).or_default() += 1;
    }
    z
}

/// Runs `crate_path` with W=2 on `inputs` and integrates output `port`.
pub(crate) fn run(crate_path: &str, dir: &Path, inputs: &[(&str, &Path)], port: &str) -> ZSet {
    let out = dir.join(format!("{}.jsonl", crate_path.replace('/', "_")));
    let mut cmd = sluice_cmd();
    cmd.arg("run")
        .arg(component(crate_path))
        .arg("--data")
        .arg(dir.join(format!("data-{}", crate_path.replace('/', "_"))))
        .args(["--workers", "2", "--max-batch", "2000", "--quiet"])
        .arg(format!("--output={port}={}", out.display()));
    for (name, file) in inputs {
        cmd.arg(format!("--input={name}={}", file.display()));
    }
    let result = cmd.output().unwrap();
    assert!(
        result.status.success(),
        "{crate_path}: {}",
        String::from_utf8_lossy(&result.stderr)
    );
    let mut z = ZSet::new();
    for line in std::fs::read_to_string(&out).unwrap().lines() {
        let (v, w) = sluice_core::wire::parse_output_line(line).unwrap();
        *z.entry(canonical(&v)).or_default() += w;
    }
    z.retain(|_, w| *w != 0);
    z
}

fn read(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// Nexmark input as `sluice gen nexmark` writes it.
pub(crate) struct Nexmark {
    pub(crate) _dir: tempfile::TempDir,
    pub(crate) person: PathBuf,
    pub(crate) auction: PathBuf,
    pub(crate) bid: PathBuf,
}

/// `events` Nexmark events at 1 000 per second of event time.
pub(crate) fn nexmark(events: u64) -> Nexmark {
    let dir = tempfile::tempdir().unwrap();
    let out = sluice_cmd()
        .args([
            "gen",
            "nexmark",
            "--events",
            &events.to_string(),
            "--rate",
            "1000",
            "--out",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Nexmark {
        person: dir.path().join("person.jsonl"),
        auction: dir.path().join("auction.jsonl"),
        bid: dir.path().join("bid.jsonl"),
        _dir: dir,
    }
}

fn u(v: &Value, field: &str) -> u64 {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in {v}"))
}

#[test]
fn nexmark_queries_equal_a_direct_computation() {
    // 20 000 events at 1 000 per second: 20 s of event time, so q7 sees two
    // 10-second windows.
    let nx = nexmark(20_000);
    let (persons, auctions, bids) = (read(&nx.person), read(&nx.auction), read(&nx.bid));
    assert!(persons.len() > 100 && auctions.len() > 500 && bids.len() > 10_000);
    let work = tempfile::tempdir().unwrap();
    let dir = work.path();

    // q0: pass-through.
    let got = run("examples/nexmark-q0", dir, &[("bid", &nx.bid)], "bids");
    assert_eq!(got, zset(bids.iter().cloned()), "q0");

    // q1: price in euro.
    let got = run("examples/nexmark-q1", dir, &[("bid", &nx.bid)], "euro_bids");
    let expected = zset(bids.iter().map(|b| {
        let mut b = b.clone();
        b["price"] = json!(u(&b, "price") * 89 / 100);
        b
    }));
    assert_eq!(got, expected, "q1");

    // q2: selection.
    let got = run("examples/nexmark-q2", dir, &[("bid", &nx.bid)], "selected");
    let expected = zset(
        bids.iter()
            .filter(|b| u(b, "auction").is_multiple_of(123))
            .map(|b| json!([u(b, "auction"), u(b, "price")])),
    );
    assert!(!expected.is_empty());
    assert_eq!(got, expected, "q2");

    // q3: people from OR/ID/CA selling in category 10.
    let got = run(
        "examples/nexmark-q3",
        dir,
        &[("person", &nx.person), ("auction", &nx.auction)],
        "suggestions",
    );
    let mut expected = Vec::new();
    for a in auctions.iter().filter(|a| u(a, "category") == 10) {
        for p in persons.iter().filter(|p| u(p, "id") == u(a, "seller")) {
            if ["or", "id", "ca"].contains(&p["state"].as_str().unwrap()) {
                expected.push(json!([p["name"], p["city"], p["state"], u(a, "id")]));
            }
        }
    }
    assert!(!expected.is_empty());
    assert_eq!(got, zset(expected), "q3");

    // q4: average winning price per category.
    let got = run(
        "examples/nexmark-q4",
        dir,
        &[("auction", &nx.auction), ("bid", &nx.bid)],
        "avg_price_per_category",
    );
    let mut winners: BTreeMap<u64, Vec<u64>> = BTreeMap::new();
    for a in &auctions {
        let open = |b: &&Value| {
            u(a, "date_time") <= u(b, "date_time") && u(b, "date_time") <= u(a, "expires")
        };
        let best = bids
            .iter()
            .filter(|b| u(b, "auction") == u(a, "id"))
            .filter(open)
            .map(|b| u(b, "price"))
            .max();
        if let Some(best) = best {
            winners.entry(u(a, "category")).or_default().push(best);
        }
    }
    assert!(!winners.is_empty());
    let expected = zset(winners.iter().map(|(category, prices)| {
        json!([
            category,
            prices.iter().sum::<u64>() as i64 as f64 / prices.len() as f64
        ])
    }));
    assert_eq!(got, expected, "q4");

    // q7: the highest bids of every 10-second window.
    let got = run(
        "examples/nexmark-q7",
        dir,
        &[("bid", &nx.bid)],
        "highest_bids",
    );
    let mut windows: BTreeMap<u64, Vec<&Value>> = BTreeMap::new();
    for b in &bids {
        windows
            .entry(u(b, "date_time") / 10_000 * 10_000)
            .or_default()
            .push(b);
    }
    let mut expected = Vec::new();
    for (start, in_window) in &windows {
        let max = in_window.iter().map(|b| u(b, "price")).max().unwrap();
        for b in in_window.iter().filter(|b| u(b, "price") == max) {
            expected.push(json!([
                start,
                u(b, "auction"),
                max,
                u(b, "bidder"),
                u(b, "date_time")
            ]));
        }
    }
    assert!(windows.len() > 1);
    assert_eq!(got, zset(expected), "q7");
}

#[test]
fn orders_join_revenue_per_region_follows_moves_and_deletes() {
    let dir = tempfile::tempdir().unwrap();
    let (orders, customers) = (
        dir.path().join("orders.jsonl"),
        dir.path().join("customers.jsonl"),
    );
    let regions = ["north", "south", "east", "west"];
    let mut order_lines = Vec::new();
    let mut live_orders: BTreeMap<u64, (u64, i64)> = BTreeMap::new();
    for id in 0..3000u64 {
        let (customer, amount) = (id * 7 % 101, (id * 37 % 1000) as i64 + 1);
        order_lines.push(json!({"id": id, "customer": customer, "amount": amount}).to_string());
        live_orders.insert(id, (customer, amount));
        if id % 10 == 9 {
            let gone = id - 5;
            let (c, a) = live_orders.remove(&gone).unwrap();
            order_lines
                .push(json!({"delete": {"id": gone, "customer": c, "amount": a}}).to_string());
        }
    }
    let mut customer_lines = Vec::new();
    let mut region_of: BTreeMap<u64, &str> = BTreeMap::new();
    for id in 0..101u64 {
        let region = regions[id as usize % 4];
        customer_lines
            .push(json!({"id": id, "name": format!("c{id}"), "region": region}).to_string());
        region_of.insert(id, region);
    }
    // Customers 0..10 move to "west".
    for id in 0..10u64 {
        let old = json!({"id": id, "name": format!("c{id}"), "region": region_of[&id]});
        customer_lines.push(json!({"delete": old}).to_string());
        customer_lines
            .push(json!({"id": id, "name": format!("c{id}"), "region": "west"}).to_string());
        region_of.insert(id, "west");
    }
    std::fs::write(&orders, order_lines.join("\n") + "\n").unwrap();
    std::fs::write(&customers, customer_lines.join("\n") + "\n").unwrap();

    let got = run(
        "examples/orders-join",
        dir.path(),
        &[("orders", &orders), ("customers", &customers)],
        "revenue",
    );
    let mut revenue: BTreeMap<&str, i64> = BTreeMap::new();
    for (customer, amount) in live_orders.values() {
        *revenue.entry(region_of[customer]).or_default() += amount;
    }
    let expected = zset(
        revenue
            .iter()
            .map(|(region, revenue)| json!({"region": region, "revenue": revenue})),
    );
    assert_eq!(expected.len(), 4);
    assert_eq!(got, expected);
}
