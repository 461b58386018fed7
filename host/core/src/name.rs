//! The one rule for every name a user gives Sluice: tenants, components,
//! pipelines and a circuit's ports. Names become directory names, storage
//! keys and parts of Kafka topic names (`<tenant>.<pipeline>.<port>`), so
//! the rule is strict: 1–64 characters of `a-z 0-9 _ -`, starting with a
//! letter or digit. No dots (the topic separator, and `..`), no slashes, no
//! upper case (case-insensitive file systems).

/// A name that breaks the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid {kind} name {shown:?}: use 1-64 characters of a-z 0-9 _ - (starting with a letter or digit)"
)]
pub struct InvalidName {
    /// What was being named: "pipeline", "port", …
    pub kind: &'static str,
    /// The name as given, cut to 80 characters for display.
    pub shown: String,
}

/// Checks `name` against the rule; `kind` says what it names.
pub fn validate_name(kind: &'static str, name: &str) -> Result<(), InvalidName> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(InvalidName {
            kind,
            shown: name.chars().take(80).collect(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule() {
        for ok in [
            "a",
            "wc",
            "avg_price_per_category",
            "q-4",
            "0x",
            &"a".repeat(64),
        ] {
            assert!(validate_name("port", ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "UPPER",
            "dot.dot",
            "-dash",
            "_x",
            "../x",
            "a/b",
            "\0",
            "é",
            &"a".repeat(65),
        ] {
            let e = validate_name("port", bad).unwrap_err();
            assert!(e.to_string().starts_with("invalid port name"), "{e}");
        }
    }
}
