//! Parsers of the command line's values (`PORT=TOPIC`, `PORT=POLICY`,
//! `KEY=VALUE`, zone labels, `PORT=FILE`), for clap's `value_parser`.

use std::path::PathBuf;

/// `PORT=TOPIC`: an input or output port mapped to a Kafka topic.
pub(crate) fn port_topic(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((port, topic)) if !port.is_empty() && !topic.is_empty() => {
            Ok((port.to_owned(), topic.to_owned()))
        }
        _ => Err(format!("expected PORT=TOPIC, got {s:?}")),
    }
}

/// `PORT=POLICY`: what a step does with a record of input PORT that is not
/// an event.
pub(crate) fn port_policy(s: &str) -> Result<(String, sluice_core::BadRecordPolicy), String> {
    match s.split_once('=') {
        Some((port, policy)) if !port.is_empty() => Ok((port.to_owned(), policy.parse()?)),
        _ => Err(format!(
            "expected PORT=POLICY (fail or dead-letter), got {s:?}"
        )),
    }
}

/// `KEY=VALUE`.
pub(crate) fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_owned(), v.to_owned())),
        _ => Err(format!("expected KEY=VALUE, got {s:?}")),
    }
}

/// A zone label: 1 to 64 letters, digits, `.`, `-` or `_`.
pub(crate) fn zone_label(s: &str) -> Result<String, String> {
    let ok = (1..=64).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    match ok {
        true => Ok(s.to_owned()),
        false => Err(format!(
            "a zone is 1 to 64 letters, digits, '.', '-' or '_', not {s:?}"
        )),
    }
}

/// `PORT=FILE`: an input file appended to PORT, or an output written to FILE.
pub(crate) fn port_file(s: &str) -> Result<(String, PathBuf), String> {
    match s.split_once('=') {
        Some((port, file)) if !port.is_empty() && !file.is_empty() => {
            Ok((port.to_owned(), PathBuf::from(file)))
        }
        _ => Err(format!("expected PORT=FILE, got {s:?}")),
    }
}
