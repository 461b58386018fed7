//! Events as JSON lines, the wire format of `sluice run` files, pushes to
//! the HTTP API and output reads.
//!
//! **Input lines.** A bare JSON value is an insert of that value.
//! `{"insert": v}` and `{"delete": v}` are explicit, and either may carry
//! `"weight": n` (a positive integer) for n copies. A value that is itself
//! such an object must be wrapped: `{"insert": {"insert": 1}}`. Blank lines
//! are skipped.
//!
//! **Output lines.** `{"insert": v}` or `{"delete": v}`, plus `"weight": n`
//! when the weight's magnitude is above 1.

use crate::event::Event;
use serde::de::{DeserializeSeed, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use std::borrow::Cow;
use std::cell::Cell;

/// Why a line is not an event.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LineError(pub String);

/// Parses one input line. Returns `Ok(None)` for a blank line.
pub fn parse_input_line(line: &str) -> Result<Option<Event>, LineError> {
    Ok(parse_input_line_ref(line)?.map(|(value, weight)| Event {
        value: value.into_owned(),
        weight,
    }))
}

/// An input line's event as [`parse_input_line_ref`] gives it: its value,
/// lent from the line where it is the line itself, and its weight.
pub type EventRef<'a> = (Cow<'a, [u8]>, i64);

/// [`parse_input_line`], lending the event's value where it is the line
/// itself (trimmed): `(value, weight)`, or `Ok(None)` for a blank line.
/// What a reader that copies each value once (an input read in place)
/// uses.
pub fn parse_input_line_ref(line: &str) -> Result<Option<EventRef<'_>>, LineError> {
    let line = line.trim();
    if line.is_empty() {
        return Ok(None);
    }
    // One pass checks the line and finds what needs it built: a key
    // `insert` or `delete` at the top (an envelope), or an escape anywhere
    // (with one, what serde_json accepts depends on what it parses into: a
    // lone surrogate is no `String`). Without either, a line is its own
    // event. A line that is not JSON is built too, for the error a built
    // line gives.
    let found = Found::default();
    let mut de = serde_json::Deserializer::from_str(line);
    let checked = Check {
        found: &found,
        at: Place::Top,
    }
    .deserialize(&mut de)
    .and_then(|()| de.end());
    if checked.is_ok() && !found.escaped.get() && !found.envelope.get() {
        return Ok(Some((Cow::Borrowed(line.as_bytes()), 1)));
    }
    Ok(parse_built(line)?.map(|e| (Cow::Owned(e.value), e.weight)))
}

/// [`parse_input_line`] of a trimmed, non-blank line, through a
/// [`serde_json::Value`] of it.
fn parse_built(line: &str) -> Result<Option<Event>, LineError> {
    let value: Value =
        serde_json::from_str(line).map_err(|e| LineError(format!("not JSON: {e}")))?;
    if let Value::Object(map) = &value {
        let op = ["insert", "delete"]
            .into_iter()
            .find(|k| map.contains_key(*k));
        let only_known = map
            .keys()
            .all(|k| k == "insert" || k == "delete" || k == "weight");
        if let (Some(op), true) = (op, only_known) {
            if map.contains_key("insert") && map.contains_key("delete") {
                return Err(LineError(
                    "an event is either {\"insert\": v} or {\"delete\": v}, not both".into(),
                ));
            }
            let weight = match map.get("weight") {
                None => 1,
                Some(w) => match w.as_i64() {
                    Some(n) if n > 0 => n,
                    _ => {
                        return Err(LineError(format!(
                            "\"weight\" must be a positive integer, got {w}"
                        )));
                    }
                },
            };
            let sign = if op == "insert" { 1 } else { -1 };
            let inner = serde_json::to_vec(&map[op]).map_err(|e| LineError(e.to_string()))?;
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

/// What a [`Check`] of a line found.
#[derive(Default)]
struct Found {
    /// A string (a key or a value) with an escape in it.
    escaped: Cell<bool>,
    /// A key `insert` or `delete` (without escapes) of the top object.
    envelope: Cell<bool>,
}

/// A JSON value checked, not built: it accepts what a [`Value`] accepts,
/// as every part of the value, numbers included, is visited as `Value`
/// visits it; only nothing is kept but what [`Found`] notes. (Parsed from
/// text, a string without escapes is lent to the visitor, one with escapes
/// is not.)
struct Check<'f> {
    found: &'f Found,
    at: Place,
}

/// Where a checked value lies in its line.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    /// The line's whole value.
    Top,
    /// A key of the top object: `insert` or `delete` makes an envelope.
    TopKey,
    /// Anywhere else.
    Inner,
}

impl Check<'_> {
    fn at(&self, at: Place) -> Self {
        Check {
            found: self.found,
            at,
        }
    }
}

impl<'de> DeserializeSeed<'de> for Check<'_> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Check<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_borrowed_str<E>(self, s: &'de str) -> Result<(), E> {
        if self.at == Place::TopKey && (s == "insert" || s == "delete") {
            self.found.envelope.set(true);
        }
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        self.found.escaped.set(true);
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(self.at(Place::Inner))?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let key = match self.at {
            Place::Top => Place::TopKey,
            _ => Place::Inner,
        };
        while map.next_key_seed(self.at(key))?.is_some() {
            map.next_value_seed(self.at(Place::Inner))?;
        }
        Ok(())
    }
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
pub fn parse_output_line(line: &str) -> Result<(Value, i64), LineError> {
    match parse_input_line(line)? {
        Some(e) => {
            let v = serde_json::from_slice(&e.value).map_err(|e| LineError(e.to_string()))?;
            Ok((v, e.weight))
        }
        None => Err(LineError("blank line".into())),
    }
}

/// Why a push body holds no events.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    /// A body starting with `[` is not a JSON array.
    #[error("not a JSON array of events: {0}")]
    Json(String),
    /// One line or element is not an event; the message names it.
    #[error("{0}")]
    Event(LineError),
    /// The body holds more events than one push may.
    #[error("a push may carry at most {0} events; split the body")]
    TooMany(usize),
}

/// Parses a whole push body: JSON lines, or one JSON array whose elements
/// are events as lines would hold them. Blank lines are skipped. An error
/// names the line (from 1) or the array element (from 0).
pub fn parse_events(text: &str) -> Result<Vec<Event>, BodyError> {
    parse_events_bounded(text, usize::MAX)
}

/// Like [`parse_events`], but stops with [`BodyError::TooMany`] as soon as
/// the body holds more than `max` events, before decoding the rest: a body
/// of many tiny events costs at most `max` events of memory.
pub fn parse_events_bounded(text: &str, max: usize) -> Result<Vec<Event>, BodyError> {
    let mut events = Vec::new();
    let mut push = |e: Option<Event>| -> Result<(), BodyError> {
        if let Some(e) = e {
            if events.len() == max {
                return Err(BodyError::TooMany(max));
            }
            events.push(e);
        }
        Ok(())
    };
    if text.trim_start().starts_with('[') {
        // Element by element, never the whole array as values.
        let mut de = serde_json::Deserializer::from_str(text);
        let mut failure = None;
        let result = serde::Deserializer::deserialize_seq(
            &mut de,
            Elements {
                push: &mut push,
                failure: &mut failure,
            },
        );
        if let Some(e) = failure {
            return Err(e);
        }
        result.map_err(|e| BodyError::Json(e.to_string()))?;
        de.end().map_err(|e| BodyError::Json(e.to_string()))?;
    } else {
        for (i, line) in text.lines().enumerate() {
            let e = parse_input_line(line)
                .map_err(|m| BodyError::Event(LineError(format!("line {}: {m}", i + 1))))?;
            push(e)?;
        }
    }
    Ok(events)
}

/// Visits a JSON array's elements one at a time.
struct Elements<'a, F> {
    push: &'a mut F,
    failure: &'a mut Option<BodyError>,
}

impl<'de, F> serde::de::Visitor<'de> for Elements<'_, F>
where
    F: FnMut(Option<Event>) -> Result<(), BodyError>,
{
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an array of events")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0usize;
        while let Some(v) = seq.next_element::<Value>()? {
            let outcome = parse_input_line(&v.to_string())
                .map_err(|m| BodyError::Event(LineError(format!("element {i}: {m}"))))
                .and_then(|e| (self.push)(e));
            if let Err(e) = outcome {
                *self.failure = Some(e);
                return Err(serde::de::Error::custom("stopped"));
            }
            i += 1;
        }
        Ok(())
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

    /// The checked path accepts, rejects and keeps exactly what the built
    /// path does, on lines of every shape: envelopes or not, and objects
    /// that name `insert` elsewhere than as a top-level key.
    #[test]
    fn checked_lines_read_as_built_ones() {
        let values = [
            "1",
            "-2.5",
            "1e400",
            "-0",
            "01",
            "true",
            "null",
            "\"s\"",
            "[]",
            "[1,[2,{}]]",
            "{}",
            "{\"a\":1}",
            "{\"insert\":1}",
            "[1,",
            "{\"a\"}",
            "nul",
            "\"\u{1}\"",
        ];
        let mut lines: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        for key in ["insert", "delete", "weight", "other", "Insert"] {
            for v in values {
                lines.push(format!("{{\"{key}\": {v}}}"));
                for (key2, v2) in [
                    ("weight", "2"),
                    ("weight", "-1"),
                    ("insert", "3"),
                    ("x", "4"),
                ] {
                    lines.push(format!("{{\"{key}\": {v}, \"{key2}\": {v2}}}"));
                }
            }
        }
        lines.push("{\"insert\": 1, \"insert\": 2}".into());
        lines.push("{\"a\": {\"insert\": 1}, \"b\": \"delete\"}".into());
        lines.push("[{\"insert\": 1}]".into());
        lines.push("[1] 2".into());
        lines.push("{\"a\": 1} x".into());
        lines.push("{ \"insert\" :\t1 ,\"weight\" : 2 }".into());
        lines.push("\t[ 1 , {\"a\" : [ ] } ]  ".into());
        // Escapes in values and keys, a key `insert` spelled with one, a
        // lone surrogate, envelope keys below the top.
        lines.push(r#""a\nb""#.into());
        lines.push(r#"{"ins\u0065rt": 1}"#.into());
        lines.push(r#"{"a\\": 1, "insert": 2}"#.into());
        lines.push(r#"{"a": "\ud800"}"#.into());
        lines.push(r#"{"insert": "\ud800"}"#.into());
        lines.push(r#"["\ud83d\ude00", {"delete": 1}]"#.into());
        lines.push(r#"{"a": {"delete": 1}, "weight": 3}"#.into());
        lines.push(r#"{"weight": 2}"#.into());
        // serde_json's depth limit (128), at it and past it, bare and in
        // an envelope.
        for depth in [127, 128, 129, 200] {
            let deep = "[".repeat(depth) + &"]".repeat(depth);
            lines.push(format!("{{\"insert\": {deep}}}"));
            lines.push(deep);
        }
        for line in &lines {
            // The same event, or the same error (message and all).
            assert_eq!(parse_input_line(line), parse_built(line.trim()), "{line}");
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
        assert!(
            parse_input_line("{nope")
                .unwrap_err()
                .0
                .contains("not JSON")
        );
    }

    #[test]
    fn string_lines_are_accepted_as_a_json_value_would_be() {
        // The fast path for strings against the general one.
        for line in [
            "\"plain\"",
            "\"\"",
            "\"unterminated",
            "\"a\" trailing",
            "\"a\" \"b\"",
            "\"tab\there\"",
            "\"nul\u{0}\"",
            "\"ünïcødé 🦀\"",
            "\"a\" ",
            "\"escaped \\\" quote\"",
            "\"\\ud800 lone\"",
            "\"\\x\"",
        ] {
            let general = serde_json::from_str::<Value>(line.trim()).map(|_| ());
            let parsed = parse_input_line(line);
            assert_eq!(parsed.is_ok(), general.is_ok(), "{line:?}: {parsed:?}");
            if let Ok(event) = parsed {
                assert_eq!(event, Some(ev(line.trim(), 1)));
            }
        }
    }

    #[test]
    fn push_bodies_as_lines_or_an_array() {
        let lines = parse_events("\"a\"\n\n{\"delete\": \"b\"}\n").unwrap();
        assert_eq!(lines, vec![ev("\"a\"", 1), ev("\"b\"", -1)]);
        let array = parse_events(r#"["a", {"delete": "b"}]"#).unwrap();
        assert_eq!(array, lines);
        assert_eq!(
            parse_events("\"a\"\n{nope").unwrap_err().to_string(),
            "line 2: not JSON: key must be a string at line 1 column 2"
        );
        assert!(matches!(
            parse_events(r#"["a", {"insert": 1, "delete": 2}]"#),
            Err(BodyError::Event(LineError(m))) if m.starts_with("element 1:")
        ));
        assert!(matches!(parse_events("[1, 2"), Err(BodyError::Json(_))));
    }

    #[test]
    fn bounded_bodies_stop_at_the_bound() {
        assert_eq!(parse_events_bounded("1\n2\n3\n", 3).unwrap().len(), 3);
        assert_eq!(
            parse_events_bounded("1\n2\n3\n4\n", 3),
            Err(BodyError::TooMany(3))
        );
        assert_eq!(parse_events_bounded("[1, 2, 3]", 3).unwrap().len(), 3);
        assert_eq!(
            parse_events_bounded("[1, 2, 3, 4]", 3),
            Err(BodyError::TooMany(3))
        );
        // Blank lines are not events.
        assert_eq!(parse_events_bounded("1\n\n\n2\n", 2).unwrap().len(), 2);
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
