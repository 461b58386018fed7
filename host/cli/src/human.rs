//! What the server commands print for people: aligned tables and short
//! sentences. `--json` (or `-o json`) prints the server's JSON instead, for
//! scripts.

use comfy_table::presets::NOTHING;
use comfy_table::{CellAlignment, Table};
use serde_json::Value;

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(NOTHING).set_header(header.to_vec());
    t
}

fn align_right(t: &mut Table, columns: &[usize]) {
    for &c in columns {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
}

/// A rate: `1.2k`, `3.4M`.
pub fn rate(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.1}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else if x >= 10.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// An age in ms: `12 s ago`.
pub fn age(ms: Option<u64>) -> String {
    match ms {
        None => "–".into(),
        Some(ms) if ms < 60_000 => format!("{} s ago", ms / 1000),
        Some(ms) if ms < 3_600_000 => format!("{} min ago", ms / 60_000),
        Some(ms) => format!("{:.1} h ago", ms as f64 / 3_600_000.0),
    }
}

/// Bytes: `12.3 MiB`.
pub fn bytes(n: u64) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let (mut x, mut i) = (n as f64, 0);
    while x >= 1024.0 && i < units.len() - 1 {
        x /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{n} B")
    } else {
        format!("{x:.1} {}", units[i])
    }
}

fn checkpoint(p: &Value) -> String {
    let last = match p["last_checkpoint"].as_u64() {
        None => "none".into(),
        Some(step) => match p["last_checkpoint_age_ms"].as_u64() {
            Some(ms) => format!("step {step}, {}", age(Some(ms))),
            None => format!("step {step}"),
        },
    };
    // Checkpoint writes failing (the store is away): the steps go on.
    match p["checkpoints_behind"].as_str() {
        Some(_) => format!("{last} (behind)"),
        None => last,
    }
}

/// Shortens a message to one line of at most `max` characters.
fn one_line(s: &str, max: usize) -> String {
    let s = s.replace('\n', " ");
    if s.chars().count() <= max {
        s
    } else {
        format!("{}…", s.chars().take(max - 1).collect::<String>())
    }
}

/// The pipelines list (`GET /pipelines`).
pub fn pipelines(list: &Value) -> String {
    let Some(list) = list.as_array() else {
        return list.to_string();
    };
    if list.is_empty() {
        return "no pipelines (sluice deploy creates one)".into();
    }
    let mut t = table(&[
        "PIPELINE",
        "STATE",
        "W",
        "STEPS",
        "STEPS/S",
        "IN/S",
        "OUT/S",
        "LAG",
        "CHECKPOINT",
        "LAST ERROR",
    ]);
    for p in list {
        t.add_row(vec![
            p["name"].as_str().unwrap_or("?").to_owned(),
            p["state"].as_str().unwrap_or("?").to_owned(),
            p["workers"].to_string(),
            p["steps"].to_string(),
            rate(p["steps_per_sec"].as_f64().unwrap_or(0.0)),
            rate(p["events_in_per_sec"].as_f64().unwrap_or(0.0)),
            rate(p["events_out_per_sec"].as_f64().unwrap_or(0.0)),
            p["input_lag"].to_string(),
            checkpoint(p),
            one_line(p["last_error"].as_str().unwrap_or("–"), 60),
        ]);
    }
    align_right(&mut t, &[2, 3, 4, 5, 6, 7]);
    t.to_string()
}

/// A JSON array of strings, joined with commas.
fn list(v: &Value) -> String {
    v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .collect::<Vec<_>>()
                .join(", ")
        })
        .unwrap_or_default()
}

/// The first 12 hex digits of a hash.
fn short_hash(v: &Value) -> &str {
    let hash = v.as_str().unwrap_or("?");
    &hash[..12.min(hash.len())]
}

/// A pipeline just created (`POST /pipelines`).
pub fn deployed(p: &Value) -> String {
    format!(
        "deployed {}: component {} ({}…), {} workers, inputs [{}], outputs [{}]; it is {}",
        p["name"].as_str().unwrap_or("?"),
        p["component"].as_str().unwrap_or("?"),
        short_hash(&p["component_hash"]),
        p["workers"],
        list(&p["inputs"]),
        list(&p["outputs"]),
        p["state"].as_str().unwrap_or("?"),
    )
}

/// One pipeline (`GET /pipelines/{name}`).
pub fn pipeline(p: &Value) -> String {
    let rows = [
        ("pipeline", p["name"].as_str().unwrap_or("?").to_owned()),
        ("state", p["state"].as_str().unwrap_or("?").to_owned()),
        (
            "component",
            format!(
                "{} ({})",
                p["component"].as_str().unwrap_or("?"),
                short_hash(&p["component_hash"])
            ),
        ),
        ("workers", p["workers"].to_string()),
        ("inputs", list(&p["inputs"])),
        ("outputs", list(&p["outputs"])),
        (
            "steps",
            format!(
                "{} ({}/s)",
                p["steps"],
                rate(p["steps_per_sec"].as_f64().unwrap_or(0.0))
            ),
        ),
        (
            "events in",
            format!(
                "{} ({}/s)",
                p["events_in"],
                rate(p["events_in_per_sec"].as_f64().unwrap_or(0.0))
            ),
        ),
        (
            "events out",
            format!(
                "{} ({}/s)",
                p["events_out"],
                rate(p["events_out_per_sec"].as_f64().unwrap_or(0.0))
            ),
        ),
        ("input lag", p["input_lag"].to_string()),
        ("checkpoint", checkpoint(p)),
        ("fuel used", p["fuel_used"].to_string()),
        (
            "last error",
            p["last_error"].as_str().unwrap_or("–").to_owned(),
        ),
    ];
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    rows.iter()
        .map(|(k, v)| format!("{k:width$}  {v}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The components list (`GET /components`).
pub fn components(list: &Value) -> String {
    let Some(list) = list.as_array() else {
        return list.to_string();
    };
    if list.is_empty() {
        return "no components (sluice deploy uploads one)".into();
    }
    let mut t = table(&["COMPONENT", "SHA-256", "SIZE"]);
    for c in list {
        let hash = c["hash"].as_str().unwrap_or("?");
        t.add_row(vec![
            c["name"].as_str().unwrap_or("?").to_owned(),
            format!("{}…", &hash[..16.min(hash.len())]),
            bytes(c["size"].as_u64().unwrap_or(0)),
        ]);
    }
    align_right(&mut t, &[2]);
    t.to_string()
}

/// A tenant created or its token rotated.
pub fn tenant_token(created: &Value, verb: &str) -> String {
    format!(
        "{verb} tenant {}\ntoken: {}\n(shown once: keep it; the server stores only its hash)",
        created["name"].as_str().unwrap_or("?"),
        created["token"].as_str().unwrap_or("?")
    )
}

/// The host and its tenants (`GET /tenants`).
pub fn host(u: &Value) -> String {
    let mut out = format!(
        "memory promised {} of {}; server resident {} (host memory besides instances {}); disk {} free of {}\n\n",
        bytes(u["memory_promised_bytes"].as_u64().unwrap_or(0)),
        bytes(u["memory_budget_bytes"].as_u64().unwrap_or(0)),
        bytes(u["resident_bytes"].as_u64().unwrap_or(0)),
        bytes(u["host_memory_bytes"].as_u64().unwrap_or(0)),
        bytes(u["disk_free_bytes"].as_u64().unwrap_or(0)),
        bytes(u["disk_total_bytes"].as_u64().unwrap_or(0)),
    );
    let mut t = table(&[
        "TENANT",
        "PIPELINES",
        "DISK",
        "MEMORY PROMISED",
        "HOST MEMORY",
    ]);
    for tenant in u["tenants"].as_array().into_iter().flatten() {
        t.add_row(vec![
            tenant["name"].as_str().unwrap_or("?").to_owned(),
            format!(
                "{} / {}",
                tenant["pipelines"], tenant["limits"]["max_pipelines"]
            ),
            format!(
                "{} / {}",
                bytes(tenant["disk_used_bytes"].as_u64().unwrap_or(0)),
                bytes(tenant["disk_quota_bytes"].as_u64().unwrap_or(0))
            ),
            bytes(tenant["memory_promised_bytes"].as_u64().unwrap_or(0)),
            bytes(tenant["host_memory_bytes"].as_u64().unwrap_or(0)),
        ]);
    }
    out.push_str(&t.to_string());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn figures_read_well() {
        assert_eq!(rate(0.0), "0.0");
        assert_eq!(rate(1234.0), "1.2k");
        assert_eq!(bytes(512), "512 B");
        assert_eq!(bytes(3 << 20), "3.0 MiB");
        assert_eq!(age(Some(5_000)), "5 s ago");
        let list = serde_json::json!([{ "name": "wc", "state": "running", "workers": 2, "steps": 10,
            "steps_per_sec": 1.0, "events_in_per_sec": 2000.0, "events_out_per_sec": 3.0,
            "input_lag": 0, "last_checkpoint": 7, "last_checkpoint_age_ms": 3000, "last_error": null }]);
        let text = pipelines(&list);
        assert!(
            text.contains("PIPELINE") && text.contains("2.0k") && text.contains("step 7, 3 s ago"),
            "{text}"
        );
    }
}
