//! The workloads of the one-host campaign ([`local`](super::local)): a
//! trial's input written to files, its circuit, and the integrated output a
//! from-scratch computation expects.

use super::Rng;
use serde_json::json;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// What one trial runs: its circuit, its input files and output, and the
/// integrated output a from-scratch computation expects.
pub(super) struct Workload {
    /// The component to run.
    pub(super) component: PathBuf,
    /// Each input port and the file of its events.
    pub(super) inputs: Vec<(&'static str, PathBuf)>,
    /// The output port and the file it is written to.
    pub(super) output: (&'static str, PathBuf),
    /// Integrated output: the key each event counts under → its weight.
    pub(super) expected: BTreeMap<String, i64>,
    /// The key an output value counts under.
    pub(super) key: fn(&serde_json::Value) -> String,
}

/// The orders-join workload (`orders` orders, the circuit `component`):
/// writes a trial's input, returns the workload.
pub(super) fn orders_join(
    dir: &Path,
    rng: &mut Rng,
    orders: u32,
    component: &Path,
) -> anyhow::Result<Workload> {
    let regions = ["north", "south", "east", "west", "central"];
    let customers = 1 + orders as u64 / 20;
    let mut region_of: BTreeMap<u64, usize> = BTreeMap::new();
    let mut customer_lines = Vec::new();
    for id in 0..customers {
        let r = rng.below(regions.len() as u64) as usize;
        customer_lines
            .push(json!({"id": id, "name": format!("c{id}"), "region": regions[r]}).to_string());
        region_of.insert(id, r);
    }
    let mut live: BTreeMap<u64, (u64, i64)> = BTreeMap::new();
    let mut order_lines = Vec::new();
    for id in 0..orders as u64 {
        let (customer, amount) = (rng.below(customers), 1 + rng.below(500) as i64);
        order_lines.push(json!({"id": id, "customer": customer, "amount": amount}).to_string());
        live.insert(id, (customer, amount));
        if rng.below(8) == 0 && !live.is_empty() {
            let victim = *live
                .keys()
                .nth(rng.below(live.len() as u64) as usize)
                .expect("non-empty");
            let (c, a) = live.remove(&victim).expect("present");
            order_lines
                .push(json!({"delete": {"id": victim, "customer": c, "amount": a}}).to_string());
        }
        if rng.below(40) == 0 {
            let c = rng.below(customers);
            let (old, new) = (region_of[&c], rng.below(regions.len() as u64) as usize);
            customer_lines.push(
                json!({"delete": {"id": c, "name": format!("c{c}"), "region": regions[old]}})
                    .to_string(),
            );
            customer_lines.push(
                json!({"id": c, "name": format!("c{c}"), "region": regions[new]}).to_string(),
            );
            region_of.insert(c, new);
        }
    }
    std::fs::write(dir.join("orders.jsonl"), order_lines.join("\n") + "\n")?;
    std::fs::write(
        dir.join("customers.jsonl"),
        customer_lines.join("\n") + "\n",
    )?;
    let mut revenue: BTreeMap<&str, i64> = BTreeMap::new();
    for (customer, amount) in live.values() {
        *revenue.entry(regions[region_of[customer]]).or_default() += amount;
    }
    Ok(Workload {
        component: component.to_owned(),
        inputs: vec![
            ("orders", dir.join("orders.jsonl")),
            ("customers", dir.join("customers.jsonl")),
        ],
        output: ("revenue", dir.join("revenue.jsonl")),
        expected: revenue
            .into_iter()
            .map(|(region, revenue)| (json!({"region": region, "revenue": revenue}).to_string(), 1))
            .collect(),
        key: |v| v.to_string(),
    })
}

/// The noisy workload: values from a small vocabulary, inserted and
/// sometimes deleted; each output event counts under its `v`, whatever
/// time, random number and step count it carries.
pub(super) fn noisy(
    dir: &Path,
    rng: &mut Rng,
    orders: u32,
    component: &Path,
) -> anyhow::Result<Workload> {
    let mut live: BTreeMap<String, i64> = BTreeMap::new();
    let mut lines = Vec::new();
    for _ in 0..orders {
        let v = format!("x{}", rng.below(60));
        if rng.below(6) == 0 && live.get(&v).is_some_and(|n| *n > 0) {
            lines.push(json!({"delete": v}).to_string());
            *live.entry(v).or_default() -= 1;
        } else {
            lines.push(json!(v).to_string());
            *live.entry(v).or_default() += 1;
        }
    }
    std::fs::write(dir.join("values.jsonl"), lines.join("\n") + "\n")?;
    live.retain(|_, n| *n != 0);
    Ok(Workload {
        component: component.to_owned(),
        inputs: vec![("in", dir.join("values.jsonl"))],
        output: ("out", dir.join("out.jsonl")),
        expected: live
            .into_iter()
            .map(|(v, n)| (json!(v).to_string(), n))
            .collect(),
        key: |v| v["v"].to_string(),
    })
}

/// The word-count workload (any word-count component, Rust or Python):
/// `lines` lines of words from a small vocabulary, in mixed case and with
/// punctuation, some deleted later; the expected output is the count of
/// every word of the live lines as `wordcount::words` splits them.
pub(super) fn wordcount(
    dir: &Path,
    rng: &mut Rng,
    lines: u32,
    component: &Path,
) -> anyhow::Result<Workload> {
    const VOCABULARY: [&str; 12] = [
        "stream", "Sluice", "state", "shard", "WORKER", "step", "log", "trim", "replay", "fence",
        "exactly", "once",
    ];
    let mut live: Vec<String> = Vec::new();
    let mut input = Vec::new();
    for _ in 0..lines {
        if rng.below(7) == 0 && !live.is_empty() {
            let line = live.swap_remove(rng.below(live.len() as u64) as usize);
            input.push(json!({ "delete": line }).to_string());
            continue;
        }
        let n = 1 + rng.below(6);
        let words: Vec<String> = (0..n)
            .map(|_| {
                let w = VOCABULARY[rng.below(VOCABULARY.len() as u64) as usize];
                match rng.below(5) {
                    0 => format!("{w},"),
                    1 => format!("({w})"),
                    2 => format!("{w}{}", rng.below(40)),
                    _ => w.to_owned(),
                }
            })
            .collect();
        let line = words.join(" ");
        input.push(json!(line).to_string());
        live.push(line);
    }
    std::fs::write(dir.join("lines.jsonl"), input.join("\n") + "\n")?;
    let mut counts: BTreeMap<String, i64> = BTreeMap::new();
    for line in &live {
        for w in wordcount::words(line) {
            *counts.entry(w).or_default() += 1;
        }
    }
    Ok(Workload {
        component: component.to_owned(),
        inputs: vec![("lines", dir.join("lines.jsonl"))],
        output: ("counts", dir.join("counts.jsonl")),
        expected: counts
            .into_iter()
            .map(|(word, count)| (json!({"word": word, "count": count}).to_string(), 1))
            .collect(),
        key: |v| v.to_string(),
    })
}
