//! The process's memory: the allocator set for a long-running host, heap
//! handed back to the operating system, and resident figures.
//!
//! glibc's allocator keeps what a thread frees in that thread's arena for
//! its next allocation. Two of its habits make a server hold its peak:
//! after a large block (say a 24 MiB batch) is freed it raises its mmap
//! threshold to that size and its trim threshold to twice it, so later
//! blocks of up to 32 MiB land in arenas and up to 64 MiB of an arena's
//! free top is never returned; and `malloc_trim` does not cut a thread
//! arena's top at all. Measured (word count, 2 000 lines of 200 new words
//! pushed at once, W = 2; heaptrack: a heap peak of 75 MiB): `sluice
//! serve` stayed 78 MiB above where it started 10 s after the pipeline was
//! deleted, 1 MiB of it still allocated and 78 MiB free in arenas.
//!
//! [`configure`] fixes both thresholds (blocks of 1 MiB and more are mapped
//! alone and unmapped when freed; an arena's free top past 8 MiB is
//! returned), and [`give_back`] returns every free page inside arenas
//! (`malloc_trim`): the server calls it when a pipeline's instances go
//! (stop, delete) and every few seconds when much was freed since, so
//! a burst one tenant caused is not held for the others. Together: 8-15
//! MiB above the start 10 s after the delete, and a peak 20 MiB lower.
//! WebAssembly memories are not on this heap: an instance's goes back to
//! the kernel when the instance is dropped.

use std::sync::atomic::{AtomicU64, Ordering};

/// Blocks this large or larger are mapped alone (returned when freed).
const MMAP_THRESHOLD: i32 = 1 << 20;
/// An arena's free top past this is returned to the kernel.
const TRIM_THRESHOLD: i32 = 8 << 20;

/// Sets the allocator's mmap and trim thresholds for a long-running host
/// (fixed, instead of growing with the largest block freed), unless
/// `GLIBC_TUNABLES` sets malloc's own. Call it once, at start.
pub fn configure() {
    if std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc.")) {
        return;
    }
    set_thresholds();
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_thresholds() {
    // SAFETY: `mallopt` takes two integers; glibc applies them under the
    // main arena's lock.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD);
        libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_thresholds() {}

/// Returns free heap pages to the operating system, and says how much
/// resident memory that gave back (0 where nothing was returned or the
/// allocator has no such call).
pub fn give_back() -> u64 {
    let before = resident_bytes();
    trim();
    FREE_AFTER_TRIM.store(free_heap_bytes(), Ordering::Relaxed);
    before.saturating_sub(resident_bytes())
}

/// The heap's free bytes right after the last trim: pages already returned
/// still count as free, so a trim is worth it only when that figure moved.
static FREE_AFTER_TRIM: AtomicU64 = AtomicU64::new(0);

/// [`give_back`], when the heap's free bytes moved by at least `threshold`
/// since the last trim (memory freed since, or free pages taken and maybe
/// freed again); else nothing: a trim walks every arena under its lock.
pub fn give_back_over(threshold: u64) -> u64 {
    if free_heap_bytes().abs_diff(FREE_AFTER_TRIM.load(Ordering::Relaxed)) >= threshold {
        give_back()
    } else {
        0
    }
}

/// Bytes free in the allocator's heap arenas, held but not in use.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn free_heap_bytes() -> u64 {
    // SAFETY: `mallinfo2` takes no arguments and returns a plain struct.
    let info = unsafe { libc::mallinfo2() };
    info.fordblks as u64
}

/// Bytes free in the allocator's heap arenas (unknown here: 0).
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn free_heap_bytes() -> u64 {
    0
}

/// Bytes allocated on the heap and in use (arenas and large blocks mapped
/// alone).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn heap_in_use_bytes() -> u64 {
    // SAFETY: as in `free_heap_bytes`.
    let info = unsafe { libc::mallinfo2() };
    (info.uordblks + info.hblkhd) as u64
}

/// Bytes allocated on the heap (unknown here: 0).
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn heap_in_use_bytes() -> u64 {
    0
}

/// This process's resident memory, in bytes (0 where it cannot be read).
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn trim() {
    // SAFETY: `malloc_trim` takes no pointers; glibc locks each arena while
    // it releases that arena's free pages, so it is safe beside other
    // threads' allocations.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn trim() {}

#[cfg(test)]
mod tests {
    #[test]
    fn freed_heap_goes_back() {
        // 64 MiB in small blocks (below the allocator's mmap threshold, so
        // on the heap), every other one freed: the free pages sit between
        // live blocks, where only a trim returns them.
        let mut blocks: Vec<Vec<u8>> = (0..64 * 16).map(|_| vec![1u8; 64 << 10]).collect();
        let mut i = 0;
        blocks.retain(|_| {
            i += 1;
            i % 2 == 0
        });
        assert!(super::free_heap_bytes() > 16 << 20 || !cfg!(target_env = "gnu"));
        let returned = super::give_back_over(16 << 20);
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            assert!(returned > 8 << 20, "gave back only {returned} bytes");
        }
        drop(blocks);
    }
}
