//! Wire formats shared by the CLI and (later) the HTTP API: how events are
//! written as JSON lines. No wasmtime or storage types here.
//!
//! **Input lines.** A bare JSON value is an insert of that value.
//! `{"insert": v}` and `{"delete": v}` are explicit, and either may carry
//! `"weight": n` (a positive integer) for n copies. A value that is itself
//! such an object must be wrapped: `{"insert": {"insert": 1}}`. Blank lines
//! are skipped.
//!
//! **Output lines.** `{"insert": v}` or `{"delete": v}`, plus `"weight": n`
//! when the weight's magnitude is above 1.

use crate::storage::Event;
use serde_json::Value;

/// Parses one input line. Returns `Ok(None)` for a blank line.
pub fn parse_input_line(line: &str) -> Result<Option<Event>, String> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(None);
    }
    let value: Value = serde_json::from_str(line).map_err(|e| format!("not JSON: {e}"))?;
    if let Value::Object(map) = &value {
        let op = ["insert", "delete"]
            .into_iter()
            .find(|k| map.contains_key(*k));
        let only_known = map
            .keys()
            .all(|k| k == "insert" || k == "delete" || k == "weight");
        if let (Some(op), true) = (op, only_known) {
            if map.contains_key("insert") && map.contains_key("delete") {
                return Err(
                    "an event is either {\"insert\": v} or {\"delete\": v}, not both".into(),
                );
            }
            let weight = match map.get("weight") {
                None => 1,
                Some(w) => match w.as_i64() {
                    Some(n) if n > 0 => n,
                    _ => return Err(format!("\"weight\" must be a positive integer, got {w}")),
                },
            };
            let sign = if op == "insert" { 1 } else { -1 };
            let inner = serde_json::to_vec(&map[op]).map_err(|e| e.to_string())?;
            return Ok(Some(Event {
                value: inner,
                weight: sign * weight,
            }));
        }
    }
    Ok(Some(Event {
        value: line.as_bytes().to_vec(),
        weight: 1,
    }))
}

/// Writes one output event as a JSON line (with the trailing newline).
/// `event.value` must be valid JSON (the host checks every output value
/// when it commits a step).
pub fn write_output_line(out: &mut Vec<u8>, event: &Event) {
    let op: &[u8] = if event.weight >= 0 {
        b"{\"insert\":"
    } else {
        b"{\"delete\":"
    };
    out.extend_from_slice(op);
    out.extend_from_slice(&event.value);
    let n = event.weight.unsigned_abs();
    if n > 1 {
        out.extend_from_slice(format!(",\"weight\":{n}").as_bytes());
    }
    out.extend_from_slice(b"}\n");
}

/// Parses an output line written by [`write_output_line`]: returns the value
/// and its signed weight. Useful to consumers and tests.
pub fn parse_output_line(line: &str) -> Result<(Value, i64), String> {
    match parse_input_line(line)? {
        Some(e) => {
            let v = serde_json::from_slice(&e.value).map_err(|e| e.to_string())?;
            Ok((v, e.weight))
        }
        None => Err("blank line".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(v: &str, w: i64) -> Event {
        Event {
            value: v.as_bytes().to_vec(),
            weight: w,
        }
    }

    #[test]
    fn input_lines() {
        assert_eq!(parse_input_line("\"a b\"").unwrap(), Some(ev("\"a b\"", 1)));
        assert_eq!(parse_input_line("  ").unwrap(), None);
        assert_eq!(
            parse_input_line(r#"{"delete": "x"}"#).unwrap(),
            Some(ev("\"x\"", -1))
        );
        assert_eq!(
            parse_input_line(r#"{"insert": {"a":1}, "weight": 3}"#).unwrap(),
            Some(ev(r#"{"a":1}"#, 3))
        );
        assert_eq!(
            parse_input_line(r#"{"insert": 1, "other": 2}"#).unwrap(),
            Some(ev(r#"{"insert": 1, "other": 2}"#, 1))
        );
        assert!(parse_input_line(r#"{"insert": 1, "delete": 2}"#).is_err());
        assert!(parse_input_line(r#"{"delete": 1, "weight": -2}"#).is_err());
        assert!(parse_input_line("{nope").unwrap_err().contains("not JSON"));
    }

    #[test]
    fn output_lines_round_trip() {
        for (v, w) in [("\"x\"", 1), ("{\"a\":[1,2]}", -1), ("3", 4), ("null", -7)] {
            let mut buf = Vec::new();
            write_output_line(&mut buf, &ev(v, w));
            let line = String::from_utf8(buf).unwrap();
            assert!(line.ends_with('\n'));
            let (value, weight) = parse_output_line(&line).unwrap();
            assert_eq!(value, serde_json::from_str::<Value>(v).unwrap());
            assert_eq!(weight, w);
        }
    }
}
