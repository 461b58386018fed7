//! Text that came from outside the host (a guest's error message, a name
//! inside a component) made safe to keep, log and show: bounded in size,
//! with control characters escaped so a log line stays one line and a
//! terminal is not driven by a guest.

/// The most bytes of a guest-controlled message the host keeps.
pub const MAX_MESSAGE: usize = 4096;

/// `text` cut to at most `max` bytes (at a character boundary), with
/// control characters other than tab escaped (`\n` as `\u{a}`), and a note
/// of how much was cut.
pub fn bounded(text: &str, max: usize) -> String {
    let mut out = String::with_capacity(text.len().min(max) + 32);
    let mut cut = None;
    for (i, c) in text.char_indices() {
        let piece_len = if c.is_control() && c != '\t' {
            c.escape_unicode().len()
        } else {
            c.len_utf8()
        };
        if out.len() + piece_len > max {
            cut = Some(i);
            break;
        }
        if c.is_control() && c != '\t' {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    if let Some(i) = cut {
        out.push_str(&format!("… ({} more bytes)", text.len() - i));
    }
    out
}

/// A guest-controlled message as the host keeps it: [`bounded`] to
/// [`MAX_MESSAGE`] bytes.
pub fn guest_message(text: &str) -> String {
    bounded(text, MAX_MESSAGE)
}

/// Text for one log line: [`bounded`] to [`MAX_MESSAGE`] bytes.
pub fn for_log(text: &str) -> String {
    bounded(text, MAX_MESSAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_and_size_is_bounded() {
        assert_eq!(bounded("a\nb\tc\u{1b}[31m", 100), "a\\u{a}b\tc\\u{1b}[31m");
        let long = "é".repeat(10_000);
        let b = bounded(&long, 4096);
        assert!(b.len() <= 4096 + 32, "{}", b.len());
        assert!(b.ends_with("more bytes)"));
        assert!(b.starts_with("éé"));
        assert_eq!(bounded("short", 4096), "short");
    }
}
