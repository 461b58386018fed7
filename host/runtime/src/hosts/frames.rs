//! Frames between hosts: postcard with a length prefix, read and written
//! under a bound on *progress*, never on the whole frame — a read (or a
//! write) that moves bytes goes on however long the frame is; one that
//! moves nothing for the connection's timeout fails. And a bound on the
//! length, checked before anything is allocated: small while the other end
//! has proved nothing ([`HANDSHAKE_MAX`]), [`MAX_FRAME`] after.

use serde::{Deserialize, Serialize};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest frame either end accepts once the other end proved it
/// knows the pipeline's secret (a worker's whole snapshot travels in one).
pub(crate) const MAX_FRAME: u64 = 8 << 30;

/// The largest frame read before the other end proved anything (the
/// handshake's: a few dozen bytes each).
pub(crate) const HANDSHAKE_MAX: u64 = 4 << 10;

/// A frame is read and written this much at a time: each piece under the
/// timeout, and the buffer grows with what arrived, never with what the
/// length prefix claims.
const CHUNK: usize = 64 << 10;

fn timed_out(idle: Duration, what: &str) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("nothing {what} for {idle:?}"),
    )
}

/// Writes one frame, each piece of it within `idle` (a peer that takes
/// nothing for that long fails the write); returns its size on the wire.
pub(crate) async fn write_frame<W, T>(w: &mut W, value: &T, idle: Duration) -> std::io::Result<u64>
where
    W: AsyncWrite + Unpin + ?Sized,
    T: Serialize,
{
    let bytes = postcard::to_allocvec(value)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    let len = (bytes.len() as u64).to_le_bytes();
    for piece in std::iter::once(&len[..]).chain(bytes.chunks(CHUNK)) {
        tokio::time::timeout(idle, w.write_all(piece))
            .await
            .map_err(|_| timed_out(idle, "was taken"))??;
    }
    tokio::time::timeout(idle, w.flush())
        .await
        .map_err(|_| timed_out(idle, "was taken"))??;
    Ok(bytes.len() as u64 + 8)
}

/// Reads one frame of at most `max` bytes, with its size on the wire:
/// fails when nothing arrives for `idle` (between frames or within one),
/// and before reading the body when the length is over `max`. `progress`
/// is called whenever bytes arrive (the other end is alive).
pub(crate) async fn read_frame_within<R, T>(
    r: &mut R,
    idle: Duration,
    max: u64,
    progress: &mut (dyn FnMut() + Send),
) -> std::io::Result<(T, u64)>
where
    R: AsyncRead + Unpin + ?Sized,
    T: for<'de> Deserialize<'de>,
{
    let mut len = [0u8; 8];
    let mut got = 0;
    while got < len.len() {
        let n = tokio::time::timeout(idle, r.read(&mut len[got..]))
            .await
            .map_err(|_| timed_out(idle, "arrived"))??;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        got += n;
        progress();
    }
    let len = u64::from_le_bytes(len);
    if len > max {
        let before = if max == HANDSHAKE_MAX {
            " before the other end proved it knows the pipeline's secret"
        } else {
            ""
        };
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame of {len} bytes announced (at most {max}{before}): refused unread"),
        ));
    }
    let len_usize = usize::try_from(len)
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, "a frame too long"))?;
    let mut bytes: Vec<u8> = Vec::with_capacity(len_usize.min(CHUNK));
    while bytes.len() < len_usize {
        let want = (len_usize - bytes.len()).min(CHUNK);
        let start = bytes.len();
        bytes.resize(start + want, 0);
        let n = tokio::time::timeout(idle, r.read(&mut bytes[start..]))
            .await
            .map_err(|_| timed_out(idle, "arrived"))??;
        bytes.truncate(start + n);
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        progress();
    }
    postcard::from_bytes(&bytes)
        .map(|v| (v, len + 8))
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Instant;

    /// A frame several times the chunk, trickling in over three times the
    /// timeout, is read whole; a frame whose sender goes quiet midway
    /// fails within about the timeout. (Timed as a whole — a timeout
    /// around one read, as the coordinator's reader was — the first would
    /// be cut.)
    #[tokio::test]
    async fn a_frame_that_keeps_flowing_is_read_whole_and_a_silent_one_fails() {
        let idle = Duration::from_millis(300);
        let value: Vec<u8> = (0..4 * CHUNK).map(|i| i as u8).collect();
        let wire = {
            let mut w: Vec<u8> = Vec::new();
            write_frame(&mut w, &value, idle).await.unwrap();
            w
        };
        let (mut near, mut far) = tokio::io::duplex(1 << 10);
        let sending = wire.clone();
        let sender = tokio::spawn(async move {
            // ~1 s in all, never more than 100 ms without a byte.
            for piece in sending.chunks(sending.len() / 10 + 1) {
                far.write_all(piece).await.unwrap();
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            far
        });
        let started = Instant::now();
        let seen = Arc::new(AtomicUsize::new(0));
        let s = seen.clone();
        let (got, n): (Vec<u8>, u64) = read_frame_within(&mut near, idle, MAX_FRAME, &mut || {
            s.fetch_add(1, Ordering::Relaxed);
        })
        .await
        .expect("a frame that keeps flowing is not cut");
        assert!(started.elapsed() > idle * 3, "{:?}", started.elapsed());
        assert_eq!(got, value);
        assert_eq!(n, wire.len() as u64);
        assert!(seen.load(Ordering::Relaxed) > 10, "progress is reported");
        let _far = sender.await.unwrap();

        // Half a frame, then silence.
        let (mut near, mut far) = tokio::io::duplex(1 << 20);
        far.write_all(&wire[..wire.len() / 2]).await.unwrap();
        let started = Instant::now();
        let err = read_frame_within::<_, Vec<u8>>(&mut near, idle, MAX_FRAME, &mut || {})
            .await
            .unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
        assert!(started.elapsed() < idle * 3, "{:?}", started.elapsed());
        drop(far);
    }

    /// A length over the bound is refused as soon as it is read: nothing
    /// of the body is awaited (nor allocated).
    #[tokio::test]
    async fn a_length_over_the_bound_is_refused_unread() {
        let (mut near, mut far) = tokio::io::duplex(64);
        far.write_all(&(1u64 << 30).to_le_bytes()).await.unwrap();
        let err = tokio::time::timeout(
            Duration::from_secs(5),
            read_frame_within::<_, Vec<u8>>(
                &mut near,
                Duration::from_secs(30),
                HANDSHAKE_MAX,
                &mut || {},
            ),
        )
        .await
        .expect("refused at once, not after waiting for the body")
        .unwrap_err();
        assert!(err.to_string().contains("at most 4096"), "{err}");
        drop(far);
    }
}
