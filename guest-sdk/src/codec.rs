//! Encodings: JSON at the ports (what users and the host see), postcard inside
//! the circuit (exchange and snapshots: compact and deterministic).

use crate::error::{Error, Result};
use serde::{Serialize, de::DeserializeOwned};

/// Appends the JSON encoding of a port value to `out`.
pub fn write_json<T: Serialize>(out: &mut Vec<u8>, value: &T) -> Result<()> {
    serde_json::to_writer(Appender(out), value)
        .map_err(|e| Error::Failed(format!("encoding output as JSON: {e}")))
}

/// Encodes a port value as JSON.
pub fn to_json<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    write_json(&mut out, value)?;
    Ok(out)
}

/// Decodes a port value from JSON.
pub fn from_json<T: DeserializeOwned>(bytes: &[u8]) -> std::result::Result<T, String> {
    // Checked as UTF-8 once, whole, the value is parsed as text: a parse of
    // bytes checks each string it reads on its own (q2's keys cost it 3 %
    // of its samples). Bytes that are not UTF-8 are parsed as bytes, which
    // accepts and refuses what it did (a string it skips is not checked).
    match std::str::from_utf8(bytes) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_slice(bytes),
    }
    .map_err(|e| e.to_string())
}

/// Appends the postcard encoding of `value` to `out` (what
/// [`to_bytes`] returns, without a vector of its own).
pub fn write_bytes<T: Serialize>(out: &mut Vec<u8>, value: &T) -> Result<()> {
    postcard::to_io(value, Appender(out))
        .map(|_| ())
        .map_err(|e| Error::Failed(format!("encoding state: {e}")))
}

/// Encodes internal data (exchange keys and values, operator state).
pub fn to_bytes<T: Serialize>(value: &T) -> Result<Vec<u8>> {
    let failed = |e: postcard::Error| Error::Failed(format!("encoding state: {e}"));
    // Sized first (a walk that copies nothing): a snapshot's envelope
    // holds a shard's whole state, which a buffer grown by doubling would
    // copy about once more, into memory the instance then keeps.
    let size = postcard::experimental::serialized_size(value).map_err(failed)?;
    let mut out = Vec::with_capacity(size);
    postcard::to_io(value, Appender(&mut out)).map_err(failed)?;
    Ok(out)
}

/// Decodes internal data written by [`to_bytes`].
pub fn from_bytes<T: DeserializeOwned>(bytes: &[u8]) -> std::result::Result<T, String> {
    postcard::from_bytes(bytes).map_err(|e| e.to_string())
}

/// Decodes operator `op`'s snapshot state; a mismatch is an
/// [`Error::IncompatibleSnapshot`] naming the operator.
pub(crate) fn from_state<T: DeserializeOwned>(op: &str, state: &[u8]) -> Result<T> {
    from_bytes(state).map_err(|e| Error::IncompatibleSnapshot(format!("{op} state: {e}")))
}

/// Like [`from_state`], but borrowing from `state`: byte strings (written
/// with `serde_bytes`) decode without a copy.
pub(crate) fn from_state_borrowed<'a, T: serde::Deserialize<'a>>(
    op: &str,
    state: &'a [u8],
) -> Result<T> {
    postcard::from_bytes(state).map_err(|e| Error::IncompatibleSnapshot(format!("{op} state: {e}")))
}

/// Decodes a map written by [`to_bytes`] of a `BTreeMap`, building the map
/// in one pass from its sorted entries (postcard writes a map exactly like
/// a sequence of pairs) instead of inserting entry by entry.
pub(crate) fn from_state_map<K: Ord + DeserializeOwned, V: DeserializeOwned>(
    op: &str,
    state: &[u8],
) -> Result<std::collections::BTreeMap<K, V>> {
    let pairs: Vec<(K, V)> = from_state(op, state)?;
    Ok(pairs.into_iter().collect())
}

/// Appends `bytes` to `out`; up to 16 bytes by word loads and stores.
///
/// A copy of a run-time length compiles to WebAssembly's `memory.copy`,
/// which the runtime executes as a call out of the instance into the host
/// (its checks, then `memmove`): tens of instructions around a copy of a
/// few bytes. Encoding JSON makes such copies for every key, number and
/// short string it writes (a Nexmark bid's encoding made about a dozen).
/// The short ones are done here in at most two loads and two stores.
#[inline(always)]
fn append(out: &mut Vec<u8>, bytes: &[u8]) {
    let n = bytes.len();
    if n > 16 {
        out.extend_from_slice(bytes);
        return;
    }
    out.reserve(n);
    // SAFETY: `reserve` made room for `n` bytes past the length; every
    // store below lies within them and every load within `bytes` (the two
    // words of a copy of 8-16 bytes, or of 4-7, overlap in the middle), and
    // the `n` bytes are written before the length covers them.
    unsafe {
        let dst = out.as_mut_ptr().add(out.len());
        let src = bytes.as_ptr();
        if n >= 8 {
            let head = src.cast::<u64>().read_unaligned();
            let tail = src.add(n - 8).cast::<u64>().read_unaligned();
            dst.cast::<u64>().write_unaligned(head);
            dst.add(n - 8).cast::<u64>().write_unaligned(tail);
        } else if n >= 4 {
            let head = src.cast::<u32>().read_unaligned();
            let tail = src.add(n - 4).cast::<u32>().read_unaligned();
            dst.cast::<u32>().write_unaligned(head);
            dst.add(n - 4).cast::<u32>().write_unaligned(tail);
        } else if n > 0 {
            // One to three bytes: first, middle and last (some the same).
            *dst = *src;
            *dst.add(n / 2) = *src.add(n / 2);
            *dst.add(n - 1) = *src.add(n - 1);
        }
        out.set_len(out.len() + n);
    }
}

/// A writer that [appends](append) to a vector: what JSON and postcard
/// (a state's or an exchanged value's strings and varints) are encoded
/// into.
struct Appender<'a>(&'a mut Vec<u8>);

impl std::io::Write for Appender<'_> {
    #[inline]
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        append(self.0, buf);
        Ok(buf.len())
    }

    #[inline]
    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        append(self.0, buf);
        Ok(())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn appends_every_short_length_and_a_long_one() {
        let bytes: Vec<u8> = (0..40u8).collect();
        for n in 0..=40 {
            let mut out = b"ab".to_vec();
            super::append(&mut out, &bytes[..n]);
            assert_eq!(&out[..2], b"ab", "n = {n}");
            assert_eq!(&out[2..], &bytes[..n], "n = {n}");
        }
    }

    /// State and exchange encodings written through the appender are
    /// postcard's own bytes: snapshots taken before it restore, and hosts
    /// compare what workers exchange byte for byte.
    #[test]
    fn postcard_through_the_appender_is_postcard() {
        use std::collections::BTreeMap;
        let words: Vec<String> = (0..40)
            .map(|n| "é".repeat(n % 7) + &"x".repeat(n))
            .collect();
        type Value = (Vec<String>, BTreeMap<u64, (i64, String)>, Option<f64>);
        let value: Value = (
            words.clone(),
            (0..300u64)
                .map(|k| (k * 977, (-(k as i64), words[k as usize % 40].clone())))
                .collect(),
            Some(0.908),
        );
        let expected = postcard::to_allocvec(&value).unwrap();
        assert_eq!(super::to_bytes(&value).unwrap(), expected);
        let mut out = b"head".to_vec();
        super::write_bytes(&mut out, &value).unwrap();
        assert_eq!(&out[4..], &expected[..]);
    }
}
