//! Large host buffers kept for reuse within a session. A fresh allocation
//! of megabytes is mapped anew and faults in every page as the data
//! arrives, which held transfers to about 1.5 GB/s over loopback where
//! reused memory carries 3–6 GB/s; applications repeat transfers of the
//! same sizes, so a few buffers of exactly the sizes last used are kept.

use std::sync::Mutex;

/// Smaller buffers come from malloc's free lists anyway.
const MIN_POOLED: usize = 1 << 20;
/// What one session keeps at most.
const MAX_BUFFERS: usize = 4;
const MAX_BYTES: usize = 128 << 20;

#[derive(Debug, Default)]
pub(crate) struct BufferPool {
    buffers: Mutex<Vec<Vec<u8>>>,
}

impl BufferPool {
    /// `len` bytes: a kept buffer of exactly that size (old contents), or a
    /// fresh zeroed one; None when the memory cannot be had.
    pub fn take(&self, len: usize) -> Option<Vec<u8>> {
        if len >= MIN_POOLED {
            let mut bufs = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(i) = bufs.iter().position(|b| b.len() == len) {
                return Some(bufs.swap_remove(i));
            }
        }
        zeroed(len)
    }

    /// Keeps a buffer for a later `take` of its size, if there is room;
    /// the oldest kept buffer makes room for it otherwise.
    pub fn give(&self, v: Vec<u8>) {
        if v.len() < MIN_POOLED || v.len() != v.capacity() || v.len() > MAX_BYTES {
            return;
        }
        let mut bufs = self.buffers.lock().unwrap_or_else(|e| e.into_inner());
        bufs.push(v);
        while bufs.len() > MAX_BUFFERS || bufs.iter().map(Vec::len).sum::<usize>() > MAX_BYTES {
            bufs.remove(0);
        }
    }
}

impl BufferPool {
    /// Takes back a transfer's host memory: ordinary memory is kept as by
    /// `give`, pinned memory goes back to its own pool.
    pub fn recycle(&self, b: crate::pinned::HostBuf) {
        if let crate::pinned::HostBuf::Heap(v) = b {
            self.give(v);
        }
    }
}

/// `len` zero bytes, or None when the memory cannot be had. Large sizes
/// come as fresh mappings, not written with zeros.
pub(crate) fn zeroed(len: usize) -> Option<Vec<u8>> {
    if len == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(len).ok()?;
    // SAFETY: a non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` was allocated by the global allocator with the layout of
    // `len` bytes, all initialised (zero); the Vec takes ownership.
    Some(unsafe { Vec::from_raw_parts(p, len, len) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffers_of_the_same_size_are_reused_and_the_pool_stays_bounded() {
        let pool = BufferPool::default();
        let mut a = pool.take(2 << 20).unwrap();
        a[0] = 42;
        let at = a.as_ptr();
        pool.give(a);
        let b = pool.take(2 << 20).unwrap();
        assert_eq!((b.as_ptr(), b[0]), (at, 42));
        let other = pool.take(3 << 20).unwrap();
        assert_ne!(other.as_ptr(), at);
        pool.give(b);
        for _ in 0..10 {
            pool.give(vec![0; 40 << 20]);
        }
        let kept = pool.buffers.lock().unwrap();
        assert!(kept.len() <= MAX_BUFFERS);
        assert!(kept.iter().map(Vec::len).sum::<usize>() <= MAX_BYTES);
        drop(kept);
        // Small buffers are not kept.
        pool.give(vec![0; 100]);
        assert!(
            pool.buffers
                .lock()
                .unwrap()
                .iter()
                .all(|b| b.len() >= MIN_POOLED)
        );
        assert_eq!(pool.take(0).unwrap().len(), 0);
    }
}
