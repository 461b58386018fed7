//! `memcmp` for the guest, eight bytes at a time.
//!
//! Every comparison of strings and byte strings in a circuit (sorting a
//! batch, searching an operator's `BTreeMap`, comparing a key's encoding)
//! ends in `memcmp`. The C library the `wasm32-wasip2` target links
//! (wasi-libc, from musl) compares a byte per loop turn; in q16 that loop
//! was a tenth of the run. This one compares eight bytes per turn, and the
//! link takes it instead of the library's (an archive's member is linked
//! only for a symbol nothing else defines; wasi-libc's `bcmp` calls
//! `memcmp` too).
//!
//! Native builds use their own C library's, which is already fast; they
//! compile the comparison for its tests only.

/// The sign of the first differing byte of `x` and `y`, two little-endian
/// words that differ.
#[inline(always)]
fn first_difference(x: u64, y: u64) -> i32 {
    // The lowest differing byte comes first in memory.
    let shift = (x ^ y).trailing_zeros() & !7;
    ((x >> shift) & 0xff) as i32 - ((y >> shift) & 0xff) as i32
}

/// The WebAssembly build's `memcmp`: [`compare`].
///
/// # Safety
///
/// `a` and `b` must be valid for reads of `n` bytes (C's contract).
#[cfg(all(target_arch = "wasm32", target_os = "wasi"))]
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: the caller's contract is `compare`'s.
    unsafe { compare(a, b, n) }
}

/// Compares `n` bytes at `a` and `b` as unsigned bytes: negative, zero or
/// positive as the first difference is smaller or larger in `a`.
///
/// # Safety
///
/// `a` and `b` must be valid for reads of `n` bytes.
#[inline]
unsafe fn compare(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: every read below lies within the first `n` bytes of `a` and
    // `b`, which the caller guarantees readable; reads are unaligned.
    unsafe {
        let mut i = 0;
        while i + 8 <= n {
            let x = a.add(i).cast::<u64>().read_unaligned();
            let y = b.add(i).cast::<u64>().read_unaligned();
            if x != y {
                return first_difference(x, y);
            }
            i += 8;
        }
        // The last 0-7 bytes, in at most three reads and no loop (a byte
        // loop here could be turned back into a call to `memcmp`).
        if i + 4 <= n {
            let x = u64::from(a.add(i).cast::<u32>().read_unaligned());
            let y = u64::from(b.add(i).cast::<u32>().read_unaligned());
            if x != y {
                return first_difference(x, y);
            }
            i += 4;
        }
        if i + 2 <= n {
            let x = u64::from(a.add(i).cast::<u16>().read_unaligned());
            let y = u64::from(b.add(i).cast::<u16>().read_unaligned());
            if x != y {
                return first_difference(x, y);
            }
            i += 2;
        }
        if i < n {
            return i32::from(*a.add(i)) - i32::from(*b.add(i));
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use std::cmp::Ordering;

    /// [`super::compare`] of two slices of one length.
    fn compare(a: &[u8], b: &[u8]) -> Ordering {
        assert_eq!(a.len(), b.len());
        // SAFETY: both slices hold `a.len()` bytes.
        unsafe { super::compare(a.as_ptr(), b.as_ptr(), a.len()) }.cmp(&0)
    }

    #[test]
    fn every_length_and_position_of_a_difference() {
        for n in 0..40 {
            let a: Vec<u8> = (0..n).map(|i| i as u8 ^ 0x5a).collect();
            assert_eq!(compare(&a, &a), Ordering::Equal, "n = {n}");
            for at in 0..n {
                for (x, y) in [(0x00, 0xff), (0x7f, 0x80), (0x41, 0x42)] {
                    let (mut l, mut r) = (a.clone(), a.clone());
                    l[at] = x;
                    r[at] = y;
                    // A later byte that differs the other way must not count.
                    if at + 1 < n {
                        l[n - 1] = 0xff;
                        r[n - 1] = 0x00;
                    }
                    assert_eq!(compare(&l, &r), Ordering::Less, "n = {n}, at = {at}");
                    assert_eq!(compare(&r, &l), Ordering::Greater, "n = {n}, at = {at}");
                }
            }
        }
    }

    proptest! {
        #[test]
        fn orders_as_slices_do(
            a in proptest::collection::vec(any::<u8>(), 0..64),
            b in proptest::collection::vec(any::<u8>(), 0..64),
            common in 0usize..64,
        ) {
            // A shared prefix makes the first difference land anywhere.
            let n = a.len().min(b.len());
            let mut b = b;
            let shared = common.min(n);
            b[..shared].copy_from_slice(&a[..shared]);
            prop_assert_eq!(compare(&a[..n], &b[..n]), a[..n].cmp(&b[..n]));
        }
    }
}
