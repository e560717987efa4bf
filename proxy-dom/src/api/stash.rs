//! Pre-copy (wire 1.5): blobs a client sends ahead of a move while its
//! application still runs on its own GPU, kept in the session's memory and
//! written into the buffers the move makes (docs/wire-protocol.md,
//! "Pre-copy").

use crane_wire::{Id, Sync};
use opencl_sys::*;

use crate::pinned::HostBuf;
use crate::session::{CallError, CallResult, Session};

/// A blob being received or waiting to be written.
pub(crate) struct Blob {
    data: Vec<u8>,
    /// Bytes received so far (pieces come in order).
    filled: u64,
}

/// `n` zero bytes, or None if they cannot be had. Zeroed by the allocator
/// (calloc: large blocks come as fresh pages), so that the memory a blob
/// holds is the memory its pieces have filled, not its announced total.
fn zeroed(n: usize) -> Option<Vec<u8>> {
    if n == 0 {
        return Some(Vec::new());
    }
    let layout = std::alloc::Layout::array::<u8>(n).ok()?;
    // SAFETY: a layout of non-zero size.
    let p = unsafe { std::alloc::alloc_zeroed(layout) };
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` comes from the global allocator with the layout of `n`
    // bytes, all of them initialised (zero).
    Some(unsafe { Vec::from_raw_parts(p, n, n) })
}

impl Session {
    /// One piece of blob `key`. Pieces come in order; the session's memory
    /// limit bounds the blobs together, its object limit their number.
    pub(crate) fn stash(
        &mut self,
        key: u64,
        total: u64,
        offset: u64,
        piece: Vec<u8>,
    ) -> CallResult {
        let len = piece.len() as u64;
        let end = offset
            .checked_add(len)
            .ok_or(CallError::Cl(CL_INVALID_VALUE))?;
        if end > total {
            return Err(CallError::Cl(CL_INVALID_VALUE));
        }
        if let Some(b) = self.stash.get_mut(&key) {
            if b.data.len() as u64 != total || offset != b.filled {
                return Err(CallError::Cl(CL_INVALID_VALUE));
            }
            b.data[offset as usize..end as usize].copy_from_slice(&piece);
            b.filled = end;
            return Ok(());
        }
        if offset != 0 {
            return Err(CallError::Cl(CL_INVALID_VALUE));
        }
        let limits = self.shared.limits;
        if self.stash.len() as u64 >= limits.max_objects {
            return Err(CallError::Cl(CL_OUT_OF_RESOURCES));
        }
        if self.stash_bytes.saturating_add(total) > limits.max_mem_bytes {
            return Err(CallError::Cl(CL_OUT_OF_HOST_MEMORY));
        }
        let total_usize =
            usize::try_from(total).map_err(|_| CallError::Cl(CL_OUT_OF_HOST_MEMORY))?;
        // The whole blob in one piece (the usual case below the frame
        // limit) is kept as it came.
        let data = if len == total {
            piece
        } else {
            let mut d = zeroed(total_usize).ok_or(CallError::Cl(CL_OUT_OF_HOST_MEMORY))?;
            d[..len as usize].copy_from_slice(&piece);
            d
        };
        self.stash_bytes += total;
        self.stash.insert(key, Blob { data, filled: end });
        Ok(())
    }

    /// Writes blob `key`, complete, into `buffer` at `offset` and forgets
    /// it (an incomplete one is forgotten too, and the write fails).
    pub(crate) fn enqueue_write_stash(
        &mut self,
        queue: Id,
        buffer: Id,
        offset: u64,
        key: u64,
        sync: &Sync,
    ) -> CallResult {
        let b = self
            .stash
            .remove(&key)
            .ok_or(CallError::Cl(CL_INVALID_VALUE))?;
        let total = b.data.len() as u64;
        self.stash_bytes -= total;
        if b.filled != total {
            return Err(CallError::Cl(CL_INVALID_VALUE));
        }
        self.enqueue_write_buffer(queue, buffer, offset, total, sync, HostBuf::Heap(b.data))
    }

    /// Forgets blob `key`, if there is one.
    pub(crate) fn unstash(&mut self, key: u64) -> CallResult {
        if let Some(b) = self.stash.remove(&key) {
            self.stash_bytes -= b.data.len() as u64;
        }
        Ok(())
    }
}
