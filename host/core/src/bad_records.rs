//! Input records that are not events, and what a pipeline does with them:
//! the per-input-port [`BadRecordPolicy`], the dead-letter log a skipped
//! record goes to ([`dead_letter_log`]) and the [`DeadLetter`] entry it
//! becomes there — the same for every log backend.
//!
//! A Kafka input topic takes records from any producer, so a record there
//! may not be an event (not JSON, a malformed `sluice-weight` header). A
//! file appended by `sluice run` under `dead-letter` keeps its bad lines as
//! *marked* records (weight 0, the line as written), so the step that
//! reads them dead-letters them like a bad Kafka record, at their offset.
//!
//! A dead letter is an ordinary output entry of the log
//! `<port>.dead-letter` (on Kafka the topic `<pipeline>.<port>.dead-letter`
//! unless named), tagged with its step and worker and committed in the
//! step's own commit: once, whatever is replayed.

use crate::event::Event;
use serde::{Deserialize, Serialize};

/// What a step does with an input record that is not an event.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BadRecordPolicy {
    /// Stop the pipeline, naming the record's position (the default).
    #[default]
    Fail,
    /// Skip the record and write it, with its position and why it is not an
    /// event, to the input's dead-letter log in the step's own commit.
    DeadLetter,
}

impl std::str::FromStr for BadRecordPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fail" => Ok(BadRecordPolicy::Fail),
            "dead-letter" => Ok(BadRecordPolicy::DeadLetter),
            _ => Err(format!(
                "unknown bad-record policy {s:?}: use `fail` or `dead-letter`"
            )),
        }
    }
}

impl std::fmt::Display for BadRecordPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BadRecordPolicy::Fail => "fail",
            BadRecordPolicy::DeadLetter => "dead-letter",
        })
    }
}

/// What names a dead-letter log after its input: `<port>` + this.
pub const DEAD_LETTER_SUFFIX: &str = ".dead-letter";

/// The dead-letter log of input `port`: `<port>.dead-letter` (a name no
/// port can have: port names hold no dot).
pub fn dead_letter_log(port: &str) -> String {
    format!("{port}{DEAD_LETTER_SUFFIX}")
}

/// The input whose dead-letter log `log` is, if it is one.
pub fn dead_letter_input(log: &str) -> Option<&str> {
    log.strip_suffix(DEAD_LETTER_SUFFIX)
        .filter(|p| crate::name::validate_name("port", p).is_ok())
}

/// Why a record marked as not an event (weight 0: a line kept by an ingest
/// under `dead-letter`) is not one: the line's own parse error, found again
/// the same way wherever and whenever it is read.
pub fn marked_record_error(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        Ok(line) => match crate::wire::parse_input_line(line) {
            Err(e) => e.0,
            Ok(_) => "the line was kept as not an event".into(),
        },
        Err(e) => format!("the line is not UTF-8: {e}"),
    }
}

/// One skipped input record, as its dead-letter log holds it.
///
/// Its event's value is a JSON object: `input`, `partition`, `offset`,
/// `position` (`topic/partition@offset` on Kafka, `input/partition@offset`
/// in the embedded log), `error`, and the record's value — `value` as a
/// string when it is UTF-8 (`null` when the record had none), else
/// `value_hex`. Its weight is 1.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The input port.
    pub input: String,
    /// Its partition.
    pub partition: u32,
    /// The record's offset.
    pub offset: u64,
    /// Where the record is, as its log names it.
    pub position: String,
    /// Why it is not an event.
    pub error: String,
    /// The record's value, as it was (`None`: it had none).
    pub value: Option<Vec<u8>>,
}

/// The JSON form of a [`DeadLetter`].
#[derive(Serialize, Deserialize)]
struct Envelope {
    input: String,
    partition: u32,
    offset: u64,
    position: String,
    error: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    value_hex: Option<String>,
}

impl DeadLetter {
    /// The dead-letter log's event for it.
    pub fn to_event(&self) -> Event {
        let (value, value_hex) = match &self.value {
            None => (None, None),
            Some(v) => match std::str::from_utf8(v) {
                Ok(s) => (Some(s.to_owned()), None),
                Err(_) => (None, Some(hex(v))),
            },
        };
        let envelope = Envelope {
            input: self.input.clone(),
            partition: self.partition,
            offset: self.offset,
            position: self.position.clone(),
            error: self.error.clone(),
            value,
            value_hex,
        };
        Event {
            // Strings and numbers only: serializing cannot fail.
            value: serde_json::to_vec(&envelope).unwrap_or_default(),
            weight: 1,
        }
    }

    /// The dead letter a dead-letter log's event holds, or why it holds
    /// none (for the audit and readers).
    pub fn from_event(event: &Event) -> Result<DeadLetter, String> {
        if event.weight != 1 {
            return Err(format!("a dead letter of weight {}", event.weight));
        }
        let e: Envelope = serde_json::from_slice(&event.value)
            .map_err(|e| format!("not a dead letter's JSON: {e}"))?;
        let value = match (e.value, e.value_hex) {
            (Some(s), None) => Some(s.into_bytes()),
            (None, Some(h)) => Some(unhex(&h).ok_or("`value_hex` is not hex")?),
            (None, None) => None,
            (Some(_), Some(_)) => return Err("both `value` and `value_hex`".into()),
        };
        Ok(DeadLetter {
            input: e.input,
            partition: e.partition,
            offset: e.offset,
            position: e.position,
            error: e.error,
            value,
        })
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn letter(value: Option<&[u8]>) -> DeadLetter {
        DeadLetter {
            input: "lines".into(),
            partition: 2,
            offset: 17,
            position: "p.lines/2@17".into(),
            error: "the value is not JSON: expected value at line 1 column 1".into(),
            value: value.map(<[u8]>::to_vec),
        }
    }

    #[test]
    fn dead_letters_round_trip_as_json() {
        for value in [Some(&b"not json"[..]), Some(&[0xff, 0x00, 0x7b][..]), None] {
            let d = letter(value);
            let e = d.to_event();
            assert_eq!(e.weight, 1);
            let json: serde_json::Value = serde_json::from_slice(&e.value).unwrap();
            assert_eq!(json["position"], "p.lines/2@17");
            assert_eq!(json["offset"], 17);
            assert_eq!(DeadLetter::from_event(&e).unwrap(), d);
        }
        let e = letter(Some(b"\xff")).to_event();
        let json: serde_json::Value = serde_json::from_slice(&e.value).unwrap();
        assert_eq!(json["value_hex"], "ff");
        assert!(json["value"].is_null());
    }

    #[test]
    fn policies_and_log_names() {
        assert_eq!("dead-letter".parse(), Ok(BadRecordPolicy::DeadLetter));
        assert_eq!("fail".parse(), Ok(BadRecordPolicy::Fail));
        assert!("skip".parse::<BadRecordPolicy>().is_err());
        assert_eq!(BadRecordPolicy::DeadLetter.to_string(), "dead-letter");
        assert_eq!(
            serde_json::to_string(&BadRecordPolicy::DeadLetter).unwrap(),
            "\"dead-letter\""
        );
        assert_eq!(dead_letter_log("lines"), "lines.dead-letter");
        assert_eq!(dead_letter_input("lines.dead-letter"), Some("lines"));
        assert_eq!(dead_letter_input("counts"), None);
        assert_eq!(dead_letter_input("a.b.dead-letter"), None);
    }

    #[test]
    fn a_marked_line_says_again_why_it_is_not_an_event() {
        assert!(marked_record_error(b"{nope").starts_with("not JSON"));
        assert!(marked_record_error(br#"{"insert": 1, "delete": 2}"#).contains("not both"));
    }
}
