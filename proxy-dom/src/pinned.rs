//! Pinned (page-locked) host memory for staging transfers.
//!
//! The proxy's writes and reads are non-blocking, from and into host memory
//! it owns. From ordinary (pageable) memory NVIDIA copies each transfer
//! through its own staging, which made a 4 KiB write cost ~13 µs to enqueue
//! and a small read's data arrive ~90 µs after it was enqueued and flushed
//! (a native blocking read takes ~10 µs). Host memory the vendor allocated
//! itself (`CL_MEM_ALLOC_HOST_PTR`) is pinned, and transfers from and into it
//! go straight to the device: natively, the same pattern of non-blocking
//! transfers ran at full speed with it.
//!
//! So each session keeps, per context, a pool of host buffers made with
//! `CL_MEM_ALLOC_HOST_PTR` and mapped once (on a queue of the pool's own,
//! so that mapping never waits behind the client's commands), in sizes of
//! powers of two from 64 KiB. A transfer takes one of its size class (or
//! makes one), the payload of a write is read from the socket straight into
//! it and the data of a read is sent from it; it goes back to its pool when
//! the command has completed. The bytes a session has pinned are bounded
//! ([`Budget`]); a transfer larger than a chunk may be, or one that finds
//! the budget spent (after dropping the pool's idle buffers), or one whose
//! buffer cannot be made, is staged in ordinary memory as before.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use opencl_sys::*;

use crate::vendor::{VPtr, vfn};

/// The smallest chunk: smaller transfers share this size class.
const MIN_CHUNK: usize = 64 << 10;
/// The largest chunk, and the pinned bytes per session by default
/// (`CRANE_PROXY_PINNED_MIB`, 0 turns pinned staging off).
const MAX_CHUNK: u64 = 64 << 20;
const DEFAULT_BUDGET: u64 = 256 << 20;
/// Pinned bytes per session for pre-copy blobs, by default.
const DEFAULT_STASH_BUDGET: u64 = 4096 << 20;

/// Bytes from the environment variable `var` (MiB), else `default`.
fn configured(var: &str, default: u64) -> u64 {
    std::env::var(var)
        .ok()
        .and_then(|v| v.trim().parse::<u64>().ok())
        .map_or(default, |m| m.saturating_mul(1 << 20))
}

/// The pinned bytes a session may hold, idle or in use.
#[derive(Debug)]
pub(crate) struct Budget {
    used: AtomicU64,
    limit: u64,
    max_chunk: u64,
}

impl Budget {
    /// The session's budget: `CRANE_PROXY_PINNED_MIB` (or 256 MiB), at most
    /// the session's memory limit; None when pinned staging is off.
    pub fn for_session(max_mem_bytes: u64) -> Option<Arc<Budget>> {
        static CONFIGURED: std::sync::LazyLock<u64> =
            std::sync::LazyLock::new(|| configured("CRANE_PROXY_PINNED_MIB", DEFAULT_BUDGET));
        Self::within(*CONFIGURED, max_mem_bytes)
    }

    /// The budget of a session's pre-copy blobs
    /// (`CRANE_PROXY_STASH_PINNED_MIB`, or 4096 MiB, at most the session's
    /// memory limit); None when off (0).
    pub fn for_stash(max_mem_bytes: u64) -> Option<Arc<Budget>> {
        static CONFIGURED: std::sync::LazyLock<u64> = std::sync::LazyLock::new(|| {
            configured("CRANE_PROXY_STASH_PINNED_MIB", DEFAULT_STASH_BUDGET)
        });
        Self::within(*CONFIGURED, max_mem_bytes)
    }

    /// A budget of `bytes` for the whole proxy (lanes' staging); None below
    /// one chunk.
    pub fn fixed(bytes: u64) -> Option<Arc<Budget>> {
        Self::within(bytes, u64::MAX)
    }

    /// A budget of `configured` bytes, at most `max_mem_bytes`; None below
    /// one chunk.
    fn within(configured: u64, max_mem_bytes: u64) -> Option<Arc<Budget>> {
        let limit = configured.min(max_mem_bytes);
        (limit >= MIN_CHUNK as u64).then(|| {
            Arc::new(Budget {
                used: AtomicU64::new(0),
                limit,
                max_chunk: MAX_CHUNK.min(limit),
            })
        })
    }

    fn reserve(&self, bytes: u64) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(bytes).filter(|&n| n <= self.limit)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
    }
}

/// The context a pool belongs to and the pool's own queue, each with a
/// reference of the pool's.
struct Ctx {
    context: VPtr,
    queue: VPtr,
    budget: Arc<Budget>,
}

impl Drop for Ctx {
    fn drop(&mut self) {
        if let Ok(f) = vfn!(self.queue.get(), clReleaseCommandQueue) {
            // SAFETY: the pool's own reference.
            unsafe { f(self.queue.get().cast()) };
        }
        if let Ok(f) = vfn!(self.context.get(), clReleaseContext) {
            // SAFETY: the pool's own reference.
            unsafe { f(self.context.get().cast()) };
        }
    }
}

/// One pinned buffer, mapped for good at `ptr`.
struct Raw {
    mem: VPtr,
    ptr: *mut u8,
    cap: usize,
}

// SAFETY: `ptr` is host memory owned by the buffer `mem`, used by one
// transfer (or idle in its pool) at a time.
unsafe impl Send for Raw {}

impl Raw {
    fn release(self, ctx: &Ctx) {
        if let Ok(f) = vfn!(ctx.queue.get(), clEnqueueUnmapMemObject) {
            // SAFETY: `ptr` is the mapping of `mem` made on this queue; no
            // transfer uses it any more.
            unsafe {
                f(
                    ctx.queue.get().cast(),
                    self.mem.get().cast(),
                    self.ptr.cast(),
                    0,
                    std::ptr::null(),
                    std::ptr::null_mut(),
                )
            };
        }
        if let Ok(f) = vfn!(self.mem.get(), clReleaseMemObject) {
            // SAFETY: the pool's reference to its buffer.
            unsafe { f(self.mem.get().cast()) };
        }
        ctx.budget.give_back(self.cap as u64);
    }
}

/// One context's pinned buffers not in use.
pub(crate) struct Pool {
    ctx: Ctx,
    free: Mutex<Vec<Raw>>,
}

impl Pool {
    /// A pool for `context`, with its own queue on `device`; None when the
    /// vendor will not make the queue.
    pub fn new(context: VPtr, device: VPtr, budget: Arc<Budget>) -> Option<Arc<Pool>> {
        let mut err = CL_SUCCESS;
        let queue = match vfn!(context.get(), clCreateCommandQueueWithProperties) {
            // SAFETY: a live context and one of its devices; no properties.
            Ok(f) => unsafe {
                f(
                    context.get().cast(),
                    device.get().cast(),
                    std::ptr::null(),
                    &mut err,
                )
            },
            Err(_) => {
                let f = vfn!(context.get(), clCreateCommandQueue).ok()?;
                // SAFETY: as above.
                unsafe { f(context.get().cast(), device.get().cast(), 0, &mut err) }
            }
        };
        if queue.is_null() || err != CL_SUCCESS {
            return None;
        }
        let retain = vfn!(context.get(), clRetainContext).ok()?;
        // SAFETY: a live context; the pool's reference, released by Ctx.
        unsafe { retain(context.get().cast()) };
        Some(Arc::new(Pool {
            ctx: Ctx {
                context,
                queue: VPtr(queue.cast()),
                budget,
            },
            free: Mutex::new(Vec::new()),
        }))
    }

    /// The most bytes the pool's budget lets it pin.
    pub fn budget_limit(&self) -> u64 {
        self.ctx.budget.limit
    }

    /// A pinned buffer for `len` bytes, or None (too large, the budget
    /// spent, the vendor refused): the caller stages in ordinary memory.
    pub fn take(self: &Arc<Pool>, len: usize) -> Option<Chunk> {
        if len == 0 || len as u64 > self.ctx.budget.max_chunk {
            return None;
        }
        let class = len.next_power_of_two().max(MIN_CHUNK);
        let found = {
            let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
            free.iter()
                .position(|r| r.cap == class)
                .map(|i| free.swap_remove(i))
        };
        let raw = match found {
            Some(r) => r,
            None => {
                while !self.ctx.budget.reserve(class as u64) {
                    // Idle buffers of other sizes make room, largest first.
                    let victim = {
                        let mut free = self.free.lock().unwrap_or_else(|e| e.into_inner());
                        let i = (0..free.len()).max_by_key(|&i| free[i].cap)?;
                        free.swap_remove(i)
                    };
                    victim.release(&self.ctx);
                }
                let made = self.make(class);
                if made.is_none() {
                    self.ctx.budget.give_back(class as u64);
                }
                made?
            }
        };
        Some(Chunk {
            raw: Some(raw),
            len,
            home: self.clone(),
        })
    }

    /// A new mapped buffer of `cap` bytes.
    fn make(&self, cap: usize) -> Option<Raw> {
        let (ctx, q) = (self.ctx.context, self.ctx.queue);
        let create = vfn!(ctx.get(), clCreateBuffer).ok()?;
        let map = vfn!(q.get(), clEnqueueMapBuffer).ok()?;
        let mut err = CL_SUCCESS;
        // SAFETY: a live context; no host pointer.
        let mem = unsafe {
            create(
                ctx.get().cast(),
                CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR,
                cap,
                std::ptr::null_mut(),
                &mut err,
            )
        };
        if mem.is_null() || err != CL_SUCCESS {
            return None;
        }
        // SAFETY: a live queue of the buffer's context; a blocking map of
        // the whole buffer, on a queue nothing else uses.
        let ptr = unsafe {
            map(
                q.get().cast(),
                mem,
                CL_TRUE,
                CL_MAP_READ | CL_MAP_WRITE,
                0,
                cap,
                0,
                std::ptr::null(),
                std::ptr::null_mut(),
                &mut err,
            )
        };
        let mem = VPtr(mem.cast());
        if ptr.is_null() || err != CL_SUCCESS {
            if let Ok(f) = vfn!(mem.get(), clReleaseMemObject) {
                // SAFETY: the buffer just made.
                unsafe { f(mem.get().cast()) };
            }
            return None;
        }
        if crate::trace::on() {
            crate::trace::add(&crate::trace::GLOBAL.pinned_made, 1);
        }
        Some(Raw {
            mem,
            ptr: ptr.cast(),
            cap,
        })
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let free = std::mem::take(self.free.get_mut().unwrap_or_else(|e| e.into_inner()));
        for r in free {
            r.release(&self.ctx);
        }
    }
}

/// A pinned buffer in use for `len` bytes; back to its pool when dropped.
pub(crate) struct Chunk {
    raw: Option<Raw>,
    len: usize,
    home: Arc<Pool>,
}

impl Drop for Chunk {
    fn drop(&mut self) {
        if let Some(r) = self.raw.take() {
            self.home
                .free
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push(r);
        }
    }
}

/// Host memory a transfer is staged in: ordinary, or pinned.
pub(crate) enum HostBuf {
    Heap(Vec<u8>),
    Pinned(Chunk),
}

impl std::fmt::Debug for HostBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostBuf::Heap(v) => write!(f, "Heap({} bytes)", v.len()),
            HostBuf::Pinned(c) => write!(f, "Pinned({} bytes)", c.len),
        }
    }
}

impl Default for HostBuf {
    fn default() -> Self {
        HostBuf::Heap(Vec::new())
    }
}

impl HostBuf {
    /// The bytes as a vector (copied out of pinned memory).
    pub fn into_vec(self) -> Vec<u8> {
        match self {
            HostBuf::Heap(v) => v,
            HostBuf::Pinned(c) => (*c).to_vec(),
        }
    }
}

impl Deref for Chunk {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let r = self.raw.as_ref().expect("a chunk in use has its buffer");
        // SAFETY: `len` <= `cap` bytes of the mapping, initialised (the
        // vendor's memory) and used by this chunk alone.
        unsafe { std::slice::from_raw_parts(r.ptr, self.len) }
    }
}

impl DerefMut for Chunk {
    fn deref_mut(&mut self) -> &mut [u8] {
        let r = self.raw.as_ref().expect("a chunk in use has its buffer");
        // SAFETY: as above, and `&mut self` is the only access.
        unsafe { std::slice::from_raw_parts_mut(r.ptr, self.len) }
    }
}

impl Deref for HostBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            HostBuf::Heap(v) => v,
            HostBuf::Pinned(c) => c,
        }
    }
}

impl DerefMut for HostBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            HostBuf::Heap(v) => v,
            HostBuf::Pinned(c) => c,
        }
    }
}

/// The context and device of a queue.
pub(crate) fn queue_context(q: VPtr) -> Option<(VPtr, VPtr)> {
    let f = vfn!(q.get(), clGetCommandQueueInfo).ok()?;
    let get = |param| {
        let mut h: *mut std::ffi::c_void = std::ptr::null_mut();
        // SAFETY: a live queue; the value is one handle.
        let rc = unsafe {
            f(
                q.get().cast(),
                param,
                size_of::<*mut std::ffi::c_void>(),
                (&raw mut h).cast(),
                std::ptr::null_mut(),
            )
        };
        (rc == CL_SUCCESS && !h.is_null()).then_some(VPtr(h))
    };
    Some((get(CL_QUEUE_CONTEXT)?, get(CL_QUEUE_DEVICE)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_budget_bounds_what_is_pinned() {
        let b = Budget {
            used: AtomicU64::new(0),
            limit: 3 << 20,
            max_chunk: 2 << 20,
        };
        assert!(b.reserve(2 << 20));
        assert!(!b.reserve(2 << 20));
        assert!(b.reserve(1 << 20));
        b.give_back(2 << 20);
        assert!(b.reserve(2 << 20));
        assert_eq!(b.used.load(Ordering::Relaxed), 3 << 20);
    }

    #[test]
    fn ordinary_staging_is_a_plain_vector() {
        let mut h = HostBuf::Heap(vec![1, 2, 3]);
        h[0] = 7;
        assert_eq!(&*h, &[7, 2, 3]);
        assert_eq!(h.into_vec(), vec![7, 2, 3]);
        assert!(HostBuf::default().is_empty());
    }
}
