//! A string its clones share.

use serde::de::{Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};
use std::fmt;
use std::sync::Arc;

/// A string its clones share: a clone counts a reference instead of
/// copying the text.
///
/// For a field that a circuit copies into many operators' keys or values:
/// Nexmark q16 keys about a dozen aggregates by a bid's channel, and those
/// copies were the largest share of its time as a `String` (with this
/// type its run took 22 % less at W = 1). Where a value is decoded and
/// passed on more often than it is copied, a `String` is cheaper: each
/// decode pays for one reference-counted allocation.
///
/// Encoded as a plain string, in JSON ports and in operator state alike,
/// so a `String` field that becomes a `SharedStr` keeps every byte of
/// both. The operators' state fingerprints change, though: they name the
/// state's types, so a checkpoint taken with a `String` there is refused by
/// the new circuit, naming each operator; an upgrade starts those
/// operators empty or rebuilds them from retained input. Decoding
/// allocates it once, from the text the decoder lends. It orders, compares
/// and hashes as its text, and prints (`Display` and `Debug`) as a `str`
/// does.
///
/// ```
/// use sluice_guest::SharedStr;
///
/// let channel = SharedStr::from("Google");
/// let key = (channel.clone(), 7u64); // no copy of the text
/// assert_eq!(key.0.as_str(), "Google");
/// assert_eq!(serde_json::to_string(&channel).unwrap(), "\"Google\"");
/// assert_eq!(format!("{channel:?}"), format!("{:?}", "Google"));
/// ```
#[derive(Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SharedStr(Arc<str>);

impl SharedStr {
    /// The text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::ops::Deref for SharedStr {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for SharedStr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for SharedStr {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl std::borrow::Borrow<str> for SharedStr {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<&str> for SharedStr {
    fn from(text: &str) -> Self {
        SharedStr(text.into())
    }
}

impl From<String> for SharedStr {
    fn from(text: String) -> Self {
        SharedStr(text.into())
    }
}

impl Serialize for SharedStr {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for SharedStr {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Text;
        impl Visitor<'_> for Text {
            type Value = SharedStr;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_str<E: serde::de::Error>(self, text: &str) -> Result<SharedStr, E> {
                Ok(text.into())
            }
        }
        deserializer.deserialize_str(Text)
    }
}

#[cfg(test)]
mod tests {
    use super::SharedStr;

    /// Encoded as a `String` is, in JSON and in postcard (operator state),
    /// and read back from either, escapes included.
    #[test]
    fn a_shared_string_is_encoded_as_a_string() {
        for text in ["", "Google", "a \"quoted\" \u{e9} \\ line\n"] {
            let shared = SharedStr::from(text);
            let owned = text.to_string();
            let json = serde_json::to_string(&shared).unwrap();
            assert_eq!(json, serde_json::to_string(&owned).unwrap());
            assert_eq!(serde_json::from_str::<SharedStr>(&json).unwrap(), shared);
            let bytes = postcard::to_allocvec(&shared).unwrap();
            assert_eq!(bytes, postcard::to_allocvec(&owned).unwrap());
            assert_eq!(postcard::from_bytes::<SharedStr>(&bytes).unwrap(), shared);
        }
        // A clone shares the text; order and equality are the text's.
        let a = SharedStr::from("b");
        assert!(std::ptr::eq(a.as_str(), a.clone().as_str()));
        assert!(SharedStr::from("a") < a && a == SharedStr::from(String::from("b")));
        // It is looked up by its text.
        let map = std::collections::BTreeMap::from([(SharedStr::from("x"), 1)]);
        assert_eq!(map.get("x"), Some(&1));
        let set = std::collections::HashSet::from([SharedStr::from("x")]);
        assert!(set.contains("x") && !set.contains("y"));
        // It prints as its text does.
        let text = "a \"quoted\" line\n";
        assert_eq!(format!("{:?}", SharedStr::from(text)), format!("{text:?}"));
        assert_eq!(SharedStr::from(text).to_string(), text);
    }
}
