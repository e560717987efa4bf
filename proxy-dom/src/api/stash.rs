//! Pre-copy (wire 1.5): blobs a client sends ahead of a move while its
//! application still runs on its own GPU, kept in the session's memory and
//! written into the buffers the move makes (docs/wire-protocol.md,
//! "Pre-copy").
//!
//! A blob is kept as the pieces it came in, each read from the socket
//! straight into pinned host memory where the session's stash budget allows
//! (`CRANE_PROXY_STASH_PINNED_MIB`, default 4096, at most the session's
//! memory limit): the write at the move then runs at the device's pinned
//! rate (55 GB/s on the H200 against 6.7 from ordinary memory). The pinned
//! buffers belong to a context of the proxy's own on its first device
//! (NVIDIA's pinned memory is pinned for every context: measured), made once
//! and never given to a session.

use std::sync::{Arc, OnceLock};

use crane_wire::{Id, Sync};
use opencl_sys::*;

use crate::pinned::{Budget, HostBuf, Pool};
use crate::session::{CallError, CallResult, Session};
use crate::vendor::{VPtr, vfn};

/// A blob being received or waiting to be written.
pub(crate) struct Blob {
    total: u64,
    /// Bytes received so far (pieces come in order).
    filled: u64,
    pieces: Vec<HostBuf>,
}

/// The proxy's own context for pinned stash memory, and its device (None:
/// none could be made; blobs then stay in ordinary memory).
static STASH_CONTEXT: OnceLock<Option<(VPtr, VPtr)>> = OnceLock::new();

/// Made for the stash alone, never one of the warm contexts (`crate::warm`):
/// a move takes the warm context, which the stash would otherwise have
/// taken, leaving the move to wait for a context of its own (~100 ms on
/// NVIDIA).
pub(crate) fn stash_context(first_device: Option<VPtr>) -> Option<(VPtr, VPtr)> {
    *STASH_CONTEXT.get_or_init(|| {
        let d = first_device?;
        let f = vfn!(d.get(), clCreateContext).ok()?;
        let mut err = CL_SUCCESS;
        let dev: cl_device_id = d.get().cast();
        // SAFETY: one live device, no properties, no callback.
        let c = unsafe {
            f(
                std::ptr::null(),
                1,
                &dev,
                None,
                std::ptr::null_mut(),
                &mut err,
            )
        };
        (err == CL_SUCCESS && !c.is_null()).then(|| (VPtr(c.cast()), d))
    })
}

impl Session {
    /// Pinned memory for a stash piece of `len` bytes, if the session's
    /// stash budget and the vendor allow.
    pub(crate) fn stash_staging(&mut self, len: u64) -> Option<HostBuf> {
        if self.stash_pool.is_none() {
            let made = Budget::for_stash(self.shared.limits.max_mem_bytes)
                .ok_or("the stash budget is 0")
                .and_then(|budget| {
                    let (ctx, dev) = stash_context(self.shared.vendor.first_device())
                        .ok_or("no context could be made for it")?;
                    Pool::new(ctx, dev, budget).ok_or("the vendor made no queue for it")
                });
            if let Err(why) = &made {
                log::info!(
                    "session {}: pre-copy blobs are kept in ordinary memory: {why}",
                    self.id
                );
            }
            self.stash_pool = Some(made.ok());
        }
        let pool: &Arc<Pool> = self.stash_pool.as_ref()?.as_ref()?;
        let got = pool.take(usize::try_from(len).ok()?).map(HostBuf::Pinned);
        if got.is_none() {
            log::debug!(
                "session {}: a pre-copy piece of {len} bytes in ordinary memory (budget spent or too large)",
                self.id
            );
        }
        got
    }

    /// One piece of blob `key`. Pieces come in order; the session's memory
    /// limit bounds the bytes the blobs hold together, its object limit
    /// their number.
    pub(crate) fn stash(
        &mut self,
        key: u64,
        total: u64,
        offset: u64,
        piece: HostBuf,
    ) -> CallResult {
        let len = piece.len() as u64;
        let end = offset
            .checked_add(len)
            .ok_or(CallError::Cl(CL_INVALID_VALUE))?;
        if end > total || len == 0 {
            return Err(CallError::Cl(CL_INVALID_VALUE));
        }
        let limits = self.shared.limits;
        let known = self.stash.contains_key(&key);
        if !known && offset != 0 {
            return Err(CallError::Cl(CL_INVALID_VALUE));
        }
        if !known && self.stash.len() as u64 >= limits.max_objects {
            return Err(CallError::Cl(CL_OUT_OF_RESOURCES));
        }
        if self.stash_bytes.saturating_add(len) > limits.max_mem_bytes {
            return Err(CallError::Cl(CL_OUT_OF_HOST_MEMORY));
        }
        let b = self.stash.entry(key).or_insert(Blob {
            total,
            filled: 0,
            pieces: Vec::new(),
        });
        if b.total != total || offset != b.filled {
            return Err(CallError::Cl(CL_INVALID_VALUE));
        }
        b.filled = end;
        b.pieces.push(piece);
        self.stash_bytes += len;
        Ok(())
    }

    /// Writes blob `key`, complete, into `buffer` at `offset` (a
    /// non-blocking write per piece, each freed when it completes) and
    /// forgets it; an incomplete one is forgotten too, and the write fails.
    /// The wait list holds for every piece; an event only for a blob of one
    /// piece.
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
        self.stash_bytes -= b.filled;
        if b.filled != b.total || (sync.event != 0 && b.pieces.len() > 1) {
            return Err(CallError::Cl(CL_INVALID_VALUE));
        }
        let (_, extent) = self.buffer(buffer)?;
        if offset.checked_add(b.total).is_none_or(|end| end > extent) {
            return Err(CallError::Cl(CL_INVALID_VALUE));
        }
        let mut at = offset;
        for piece in b.pieces {
            let len = piece.len() as u64;
            self.enqueue_write_buffer(queue, buffer, at, len, sync, piece)?;
            at += len;
        }
        Ok(())
    }

    /// Forgets blob `key`, if there is one.
    pub(crate) fn unstash(&mut self, key: u64) -> CallResult {
        if let Some(b) = self.stash.remove(&key) {
            self.stash_bytes -= b.filled;
        }
        Ok(())
    }
}

impl Session {
    /// Grants lanes (`crate::lanes`): the first time, registers the
    /// session's lanes under a fresh secret.
    pub(crate) fn open_lanes(&mut self, seq: u64, count: u32) -> CallResult {
        let lanes = match &self.lanes {
            Some(l) => l.clone(),
            None => {
                let l = crate::lanes::Lanes::open(&self.shared, self.id).map_err(|e| {
                    log::warn!("session {}: no lanes: {e}", self.id);
                    CallError::Cl(CL_OUT_OF_RESOURCES)
                })?;
                self.lanes = Some(l.clone());
                l
            }
        };
        let (count, secret) = lanes.grant(count);
        self.reply(
            seq,
            &crane_wire::Answer::Lanes {
                status: CL_SUCCESS,
                count,
                secret,
            },
            &[],
        );
        Ok(())
    }

    /// Writes the piece `key` a lane carries into `buffer` at `offset`,
    /// once it has come (a non-blocking write, freed when it completes).
    pub(crate) fn enqueue_write_lane(
        &mut self,
        queue: Id,
        buffer: Id,
        offset: u64,
        key: u64,
        sync: &Sync,
    ) -> CallResult {
        let lanes = self.lanes.clone().ok_or_else(|| {
            CallError::Violation("a write over a lane in a session without lanes".into())
        })?;
        let piece = lanes.take(key).map_err(CallError::Cl)?;
        let len = piece.len() as u64;
        self.enqueue_write_buffer(queue, buffer, offset, len, sync, piece)
    }
}
