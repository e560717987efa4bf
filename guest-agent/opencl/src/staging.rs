//! Host memory behind the pointers crane's maps return.
//!
//! A map must hand out a pointer that stays valid, with its contents, across
//! a suspend (the vendor library unloaded) and a move to crane-proxy, so crane
//! serves maps from memory it owns (an anonymous mapping), never from the
//! vendor's. Fresh memory for every map cost page faults and, on NVIDIA, the
//! vendor's copy through its own staging: map + unmap of 256 MiB ran at
//! 1.2–4 GB/s against 51–55 GB/s natively (H200), and an application using a
//! mapped CL_MEM_ALLOC_HOST_PTR buffer as its pinned staging (the pattern
//! NVIDIA's guide recommends) wrote from it at 9 GB/s instead of 55.
//!
//! Measured on the H200 (NVIDIA 580): NVIDIA page-locks the host memory a
//! CL_MEM_USE_HOST_PTR buffer is made over, and any transfer from or into
//! that memory then runs at full speed (55 GB/s), as from memory the vendor
//! allocated itself; such a buffer takes about 2 MiB of device memory until
//! a kernel uses it (none does here); registering the memory with CUDA
//! (cuMemHostRegister) does not help OpenCL's transfers. So each context keeps
//! a pool of crane-owned regions, each pinned while the vendor is loaded by a
//! USE_HOST_PTR buffer of the vendor's (a "pin"). A map takes a region, an
//! unmap gives it back once the write-back has completed, and the pool keeps
//! up to `CRANE_MAP_POOL_MIB` (default 512) of idle regions for the next maps.
//!
//! Pins are vendor objects: a suspend releases them with the others
//! ([`take_pins`]); a region is pinned again when it is next handed out, and
//! the regions that live maps hold are pinned again when their context is
//! rebuilt ([`repin_held`]). On a CPU device (PoCL) and on crane-proxy nothing
//! is pinned: the pool only spares the page faults of fresh memory.

use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex, Weak};

use opencl_sys::*;

use crate::objects::Context;
use crate::vendor::{self, vfn};

/// Regions below this size are not pinned on their own: each pin is a
/// vendor buffer (NVIDIA's device memory use grew by 2 MiB with one, whatever
/// it costs for small ones), and a process may hold many small maps. Small
/// maps are slots of a [`Slab`] instead, pinned once for all of them (a small
/// non-blocking read into unpinned memory cost 15-18 µs on NVIDIA against
/// 2.6 µs into pinned memory).
const PIN_MIN: usize = 64 << 10;
/// The size of a slab of small map slots.
const SLAB: usize = 2 << 20;
/// RAM copies below this size are not pinned for their transfers at suspend
/// and resume (one temporary pin per buffer, held until the last transfer).
const TEMP_PIN_MIN: usize = 1 << 20;
/// Regions up to this size come in powers of two; larger ones in multiples of it.
const HUGE: usize = 2 << 20;
const PAGE: usize = 4096;

/// Idle bytes a pool keeps.
static KEEP: LazyLock<usize> = LazyLock::new(|| {
    std::env::var("CRANE_MAP_POOL_MIB")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .map_or(512 << 20, |m| m.saturating_mul(1 << 20))
});

/// Pins by region address: (vendor buffer, vendor context it was made on).
static PINS: LazyLock<Mutex<HashMap<usize, (usize, usize)>>> =
    LazyLock::new(|| Mutex::new(HashMap::new()));

fn pins() -> std::sync::MutexGuard<'static, HashMap<usize, (usize, usize)>> {
    PINS.lock().unwrap_or_else(|e| e.into_inner())
}

/// The size of the region that serves `len` bytes.
fn class(len: usize) -> usize {
    let len = len.max(1);
    if len <= HUGE {
        len.next_power_of_two().max(PAGE)
    } else {
        len.div_ceil(HUGE).saturating_mul(HUGE)
    }
}

/// An anonymous mapping crane owns; unpinned and unmapped when dropped.
struct Region {
    addr: usize,
    len: usize,
    backing: Backing,
}

/// Where a region's memory comes from, and so where it goes when dropped.
enum Backing {
    /// A mapping of its own: unpinned and unmapped.
    Mapped,
    /// The heap (below [`SMALL`]): unpinned and freed.
    Heap,
    /// Slot `.1` of a slab (small map memory): given back to the slab,
    /// whose pin stays.
    Slot(Arc<Slab>, usize),
}

impl Region {
    fn mapped(addr: usize, len: usize) -> Region {
        Region {
            addr,
            len,
            backing: Backing::Mapped,
        }
    }

    /// Whether this region serves a map of class `want`: big enough, at
    /// most twice as big.
    fn serves(&self, want: usize) -> bool {
        self.len >= want && self.len / 2 < want
    }
}

/// One pinned mapping cut into slots of one size, for small maps: the whole
/// slab is pinned (one vendor buffer), so each map's transfers run from and
/// into pinned memory.
struct Slab {
    region: Region,
    slot: usize,
    free: Mutex<Vec<usize>>,
}

impl Slab {
    fn new(slot: usize) -> Option<Arc<Slab>> {
        let region = Region::new(SLAB)?;
        Some(Arc::new(Slab {
            region,
            slot,
            free: Mutex::new((0..SLAB / slot).rev().collect()),
        }))
    }

    /// A free slot of `slab`, zeroed.
    fn take(slab: &Arc<Slab>) -> Option<Region> {
        let i = slab.free.lock().unwrap_or_else(|e| e.into_inner()).pop()?;
        let addr = slab.region.addr + i * slab.slot;
        // SAFETY: slot i of the slab's mapping, which no one else holds.
        unsafe { std::ptr::write_bytes(addr as *mut u8, 0, slab.slot) };
        Some(Region {
            addr,
            len: slab.slot,
            backing: Backing::Slot(slab.clone(), i),
        })
    }
}

/// Below this, memory comes from the heap: a mapping of its own costs a
/// system call, page faults and an unmap (with its TLB flush) each time,
/// several times the copy into it, and memory this small is never pinned.
const SMALL: usize = PIN_MIN;

impl Region {
    /// The region whose pin covers this one: its slab's for a slot.
    fn pinned(&self) -> &Region {
        match &self.backing {
            Backing::Slot(slab, _) => &slab.region,
            _ => self,
        }
    }

    /// `len` bytes of fresh anonymous memory. From 2 MiB on, aligned to
    /// 2 MiB and advised to use transparent huge pages: faulting in and
    /// pinning memory the first suspend reads into cost 0.3-0.6 s per GiB
    /// in 4 KiB pages.
    fn new(len: usize) -> Option<Region> {
        if len < SMALL {
            let layout = std::alloc::Layout::from_size_align(len.max(1), PAGE).ok()?;
            // SAFETY: a non-zero size and a valid alignment.
            let p = unsafe { std::alloc::alloc_zeroed(layout) };
            return (!p.is_null()).then_some(Region {
                addr: p as usize,
                len,
                backing: Backing::Heap,
            });
        }
        let huge = len >= HUGE;
        let map = if huge { len + HUGE } else { len };
        // SAFETY: a fresh private anonymous mapping; no existing memory is touched.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return None;
        }
        let start = p as usize;
        if !huge {
            return Some(Region::mapped(start, len));
        }
        let addr = start.next_multiple_of(HUGE);
        // SAFETY: the head and tail of the mapping just made, outside
        // [addr, addr + len); then advice on the part kept.
        unsafe {
            if addr > start {
                libc::munmap(start as *mut c_void, addr - start);
            }
            let end = start + map;
            if end > addr + len {
                libc::munmap((addr + len) as *mut c_void, end - addr - len);
            }
            libc::madvise(addr as *mut c_void, len, libc::MADV_HUGEPAGE);
        }
        Some(Region::mapped(addr, len))
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        match &self.backing {
            Backing::Slot(slab, i) => {
                // The slab's pin stays (slot 0 shares its address).
                slab.free.lock().unwrap_or_else(|e| e.into_inner()).push(*i);
            }
            Backing::Heap => {
                unpin(self.addr);
                let layout = std::alloc::Layout::from_size_align(self.len.max(1), PAGE)
                    .expect("the layout `new` allocated with");
                // SAFETY: the allocation made in `new` with this layout,
                // which nothing refers to any more.
                unsafe { std::alloc::dealloc(self.addr as *mut u8, layout) };
            }
            Backing::Mapped => {
                unpin(self.addr);
                // SAFETY: the mapping made in `new`, which nothing refers to
                // any more (the pin, the only vendor reference to it, is gone).
                unsafe { libc::munmap(self.addr as *mut c_void, self.len) };
            }
        }
    }
}

/// Releases the pin of the region at `addr`, if it has one.
fn unpin(addr: usize) {
    let pin = pins().remove(&addr);
    if let Some((mem, _)) = pin {
        // SAFETY: crane's one reference to the live vendor buffer pinning the region.
        unsafe { vendor::release(mem as *mut c_void, |d| d.clReleaseMemObject) };
    }
}

/// Pins `r` for the vendor context `vctx` (a no-op where pinning does not
/// apply or the region is pinned there already). A pin that cannot be made
/// only costs speed.
fn pin(r: &Region, vctx: *mut c_void, vdev: *mut c_void) {
    let min = crate::config::get().pin_min.unwrap_or(PIN_MIN);
    if r.len < min || vctx.is_null() || vendor::remote_session().is_some() {
        return;
    }
    if pins()
        .get(&r.addr)
        .is_some_and(|&(_, c)| c == vctx as usize)
    {
        return;
    }
    unpin(r.addr);
    if is_cpu(vdev) {
        return;
    }
    let Ok(create) = vfn!(vctx, clCreateBuffer) else {
        return;
    };
    let mut err = CL_SUCCESS;
    // SAFETY: a buffer over the region's `len` bytes, which stay mapped until
    // the pin is released (`Region::drop` releases it first).
    let mem = unsafe {
        create(
            vctx.cast(),
            CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR,
            r.len,
            r.addr as *mut c_void,
            &mut err,
        )
    };
    if err != CL_SUCCESS || mem.is_null() {
        crate::config::debug!("pinning {} bytes of map memory failed: {err}", r.len);
        return;
    }
    pins().insert(r.addr, (mem as usize, vctx as usize));
}

fn is_cpu(vdev: *mut c_void) -> bool {
    let mut t: cl_device_type = 0;
    let Ok(f) = vfn!(vdev, clGetDeviceInfo) else {
        return true;
    };
    // SAFETY: one cl_device_type.
    let rc = unsafe {
        f(
            vdev.cast(),
            CL_DEVICE_TYPE,
            size_of::<cl_device_type>(),
            (&raw mut t).cast(),
            std::ptr::null_mut(),
        )
    };
    rc != CL_SUCCESS || (t & CL_DEVICE_TYPE_CPU != 0 && !crate::config::get().pin_on_cpu)
}

/// A context's idle regions.
#[derive(Default)]
pub struct Pool {
    idle: Mutex<Vec<Region>>,
    /// Slabs of small map slots, by slot size.
    slabs: Mutex<Vec<Arc<Slab>>>,
}

impl Pool {
    /// Memory for a map of `len` bytes on `ctx`: an idle region that fits (at
    /// most twice the size), else one still the source of a write-back queued
    /// on the in-order vendor queue `behind` (the map's own queue: its read
    /// or marker runs after that write-back, so the memory is free by then),
    /// else a new one; pinned where that applies. None when no memory can be
    /// mapped.
    pub fn take(
        self: &Arc<Pool>,
        ctx: &Context,
        len: usize,
        behind: Option<*mut c_void>,
    ) -> Option<Staging> {
        let want = class(len);
        let find = || {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            let best = idle
                .iter()
                .enumerate()
                .filter(|(_, r)| r.serves(want))
                .min_by_key(|(_, r)| r.len)
                .map(|(i, _)| i);
            best.map(|i| idle.swap_remove(i))
        };
        // Regions whose write-back has completed since come back first.
        let found = find().or_else(|| {
            crate::lifecycle::reap_parked();
            find()
        });
        if found.is_none()
            && let Some(vq) = behind
            && let Some(s) = crate::lifecycle::take_parked_behind(vq, |s| {
                s.pool.upgrade().is_some_and(|p| Arc::ptr_eq(&p, self))
                    && s.region.as_ref().is_some_and(|r| r.serves(want))
            })
        {
            return Some(s);
        }
        let region = match found {
            Some(r) => r,
            None if want < SMALL => self.slot(want)?,
            None => Region::new(want)?,
        };
        pin(region.pinned(), ctx.base.vendor(), first_device(ctx));
        Some(Staging {
            region: Some(region),
            pool: Arc::downgrade(self),
        })
    }

    /// A slot of `len` bytes (a power of two below [`SMALL`]) from a slab of
    /// this pool, a new slab if all are full.
    fn slot(&self, len: usize) -> Option<Region> {
        let mut slabs = self.slabs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(r) = slabs.iter().filter(|s| s.slot == len).find_map(Slab::take) {
            return Some(r);
        }
        let slab = Slab::new(len)?;
        let r = Slab::take(&slab);
        slabs.push(slab);
        r
    }

    fn put(&self, r: Region) {
        let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
        let held: usize = idle.iter().map(|r| r.len).sum();
        if held + r.len <= *KEEP {
            idle.push(r);
        }
        // Otherwise `r` is dropped here: unpinned and unmapped.
    }
}

/// A region lent to a map; back to its pool when dropped (or freed if the
/// pool is gone).
pub struct Staging {
    region: Option<Region>,
    pool: Weak<Pool>,
}

impl Staging {
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.region
            .as_ref()
            .map_or(std::ptr::null_mut(), |r| r.addr as *mut u8)
    }

    pub fn len(&self) -> usize {
        self.region.as_ref().map_or(0, |r| r.len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Pins the region for `ctx`'s vendor context if it is not pinned there.
    pub fn repin(&self, ctx: &Context) {
        if let Some(r) = &self.region {
            pin(r.pinned(), ctx.base.vendor(), first_device(ctx));
        }
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if let (Some(r), Some(pool)) = (self.region.take(), self.pool.upgrade()) {
            pool.put(r);
        }
    }
}

/// Contents crane keeps in RAM (a memory object's shadow): `len` bytes of a
/// page-aligned anonymous mapping, so that they can be pinned for the
/// transfers that fill them at a suspend and empty them at a resume
/// ([`TempPin`]).
pub struct HostBytes {
    region: Region,
    len: usize,
    /// The pin kept on this memory in [`KEPT`] (0: none; see
    /// [`HostBytes::keep_pin`]).
    kept: u64,
}

/// Pins kept on RAM copies between a pre-copy, which reads into them, and
/// the stop that reads what changed since into the same memory: a read
/// into memory already pinned runs at the device's rate, where pinning it
/// for the read costs as long as the read itself (docs/benchmarks.md). By
/// id ([`HostBytes::kept`]): the vendor context and the pin. Released when
/// their memory is, and all of them before the vendor objects are given
/// back ([`drop_kept_pins`]).
static KEPT: Mutex<Vec<(u64, usize, TempPin)>> = Mutex::new(Vec::new());
static KEPT_IDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// The most memory kept pinned for the stop ([`HostBytes::keep_pin`]): a
/// quarter of the machine's memory (page-locked memory cannot be swapped
/// or moved by the kernel).
static KEPT_MAX: LazyLock<usize> = LazyLock::new(|| {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (pages.max(0) as usize).saturating_mul(page.max(0) as usize) / 4
});

fn kept() -> std::sync::MutexGuard<'static, Vec<(u64, usize, TempPin)>> {
    KEPT.lock().unwrap_or_else(|e| e.into_inner())
}

/// Releases every pin kept on RAM copies (before the vendor objects they
/// were made on are given back and the vendor unloaded); the memory stays.
pub fn drop_kept_pins() {
    let pins = std::mem::take(&mut *kept());
    drop(pins);
}

/// How many bytes kept pins hold (against [`KEPT_MAX`]).
fn kept_pinned_bytes() -> usize {
    kept().iter().map(|(_, _, p)| p.1).sum()
}

impl Drop for HostBytes {
    fn drop(&mut self) {
        // The pin goes before its memory does (the region is unmapped after
        // this, with the fields).
        drop(self.take_kept_pin());
    }
}

impl HostBytes {
    /// `len` zero bytes (the kernel's zero pages until written).
    pub fn zeroed(len: usize) -> HostBytes {
        let map = len.max(1).div_ceil(PAGE) * PAGE;
        match Region::new(map) {
            Some(region) => HostBytes {
                region,
                len,
                kept: 0,
            },
            None => std::alloc::handle_alloc_error(
                std::alloc::Layout::from_size_align(map, PAGE).expect("a page-aligned layout"),
            ),
        }
    }

    /// Fresh zeroed memory of each of `lens` bytes, for transfers into them
    /// one after another in that order, faulted in meanwhile by helper
    /// threads (at most 8) in the same order, so that each transfer finds
    /// its memory there already. A read of dirty buffers into fresh memory
    /// at a suspend or a move is bound by the page faults, and NVIDIA's
    /// pinning of the memory for each read faults in what is not yet there
    /// on one thread: 256 MiB read in 58-86 ms that way on an H200, in 27-29
    /// ms faulted in by 8 threads first (benches/dirty-read.c). Below 32 MiB
    /// in all, nothing is faulted in ahead (the transfers do it).
    pub fn fresh_in_order(lens: &[usize]) -> (Vec<HostBytes>, Faulting) {
        let v: Vec<HostBytes> = lens.iter().map(|&l| HostBytes::zeroed(l)).collect();
        let pieces: Vec<(usize, usize)> = v
            .iter()
            .filter(|h| matches!(h.region.backing, Backing::Mapped))
            .flat_map(|h| {
                let (a, n) = (h.region.addr, h.region.len);
                (a..a + n)
                    .step_by(FAULT_PIECE)
                    .map(move |p| (p, FAULT_PIECE.min(a + n - p)))
            })
            .collect();
        (v, Faulting::start(pieces))
    }

    /// This memory for `len` bytes (contents unspecified) if its mapping is
    /// big enough: a copy into memory already touched skips the page faults
    /// and zeroing that fresh memory costs (several times the copy itself).
    pub fn reuse(mut self, len: usize) -> Result<HostBytes, HostBytes> {
        if self.region.len >= len {
            self.len = len;
            Ok(self)
        } else {
            Err(self)
        }
    }

    /// Whether memory that holds `capacity` bytes is worth reusing for
    /// `len`: big enough, and not much bigger (the rest would sit idle).
    pub fn fits(capacity: usize, len: usize) -> bool {
        capacity >= len && capacity <= len.saturating_mul(2)
    }

    /// The bytes this memory can hold ([`HostBytes::reuse`]).
    pub fn capacity(&self) -> usize {
        self.region.len
    }

    pub fn from_slice(bytes: &[u8]) -> HostBytes {
        let mut h = HostBytes::zeroed(bytes.len());
        h.copy_from_slice(bytes);
        h
    }

    /// Pins these bytes on the vendor context of `ctx` until the guard is
    /// dropped (None on a CPU device, on crane-proxy, if it fails: the
    /// transfers are then only slower, or if a pin kept on them for that
    /// context holds them already).
    pub fn pin(&self, ctx: &Context) -> Option<TempPin> {
        if self.pinned_on(ctx.base.vendor()) {
            return None;
        }
        TempPin::new(
            ctx.base.vendor(),
            first_device(ctx),
            self.region.addr,
            self.region.len,
        )
    }

    /// Pins these bytes on the vendor context `vctx` (of device `vdev`)
    /// until the guard is dropped, whatever crane's objects are loaded on
    /// now: a move to crane-proxy reads local buffers while the proxy
    /// rebuilds (None on a CPU device, if it fails, or if a kept pin holds
    /// them on `vctx` already).
    pub fn pin_on(&self, vctx: *mut c_void, vdev: *mut c_void) -> Option<TempPin> {
        if self.pinned_on(vctx) {
            return None;
        }
        TempPin::make(vctx, vdev, self.region.addr, self.region.len)
    }

    /// Pins these bytes on the vendor context of `ctx` until they are
    /// dropped or [`drop_kept_pins`] (a pre-copy's RAM copies, which the
    /// stop reads into again): later [`HostBytes::pin`]s on that context
    /// find them pinned. Nothing when they cannot be pinned (as for `pin`),
    /// or when kept pins hold a quarter of the machine's memory already.
    pub fn keep_pin(&mut self, ctx: &Context) {
        let vctx = ctx.base.vendor();
        if self.pinned_on(vctx) {
            return;
        }
        if kept_pinned_bytes().saturating_add(self.region.len) > *KEPT_MAX {
            return;
        }
        let Some(pin) = TempPin::new(vctx, first_device(ctx), self.region.addr, self.region.len)
        else {
            return;
        };
        // One kept pin per memory: one on another context goes first.
        drop(self.take_kept_pin());
        let id = KEPT_IDS.fetch_add(1, Ordering::Relaxed);
        kept().push((id, vctx as usize, pin));
        self.kept = id;
    }

    /// Takes the pin kept on these bytes out (to be dropped: released on
    /// its vendor, outside the registry's lock), if there is one.
    pub fn take_kept_pin(&mut self) -> Option<TempPin> {
        let id = std::mem::take(&mut self.kept);
        if id == 0 {
            return None;
        }
        let mut k = kept();
        let i = k.iter().position(|e| e.0 == id)?;
        Some(k.swap_remove(i).2)
    }

    /// Whether a kept pin holds these bytes on the vendor context of `ctx`.
    pub fn kept_pinned(&self, ctx: &Context) -> bool {
        self.pinned_on(ctx.base.vendor())
    }

    /// Whether a kept pin holds these bytes on vendor context `vctx`.
    pub fn pinned_on(&self, vctx: *mut c_void) -> bool {
        self.kept != 0
            && !vctx.is_null()
            && kept()
                .iter()
                .any(|e| e.0 == self.kept && e.1 == vctx as usize)
    }
}

impl std::ops::Deref for HostBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: the region holds at least `len` bytes, mapped while `self` lives.
        unsafe { std::slice::from_raw_parts(self.region.addr as *const u8, self.len) }
    }
}

impl std::ops::DerefMut for HostBytes {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.region.addr as *mut u8, self.len) }
    }
}

/// What one helper faults in at a time ([`HostBytes::fresh_in_order`]).
const FAULT_PIECE: usize = 8 << 20;

/// Helper threads faulting in fresh memory ahead of transfers
/// ([`HostBytes::fresh_in_order`]). Dropped, they stop after their current
/// piece and are waited for; [`Faulting::finish`] waits for all of it.
pub struct Faulting {
    threads: Vec<std::thread::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

impl Faulting {
    fn start(pieces: Vec<(usize, usize)>) -> Faulting {
        let stop = Arc::new(AtomicBool::new(false));
        let total: usize = pieces.iter().map(|p| p.1).sum();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let n = (total / (2 * FAULT_PIECE)).min(cores).min(8);
        let mut threads = Vec::new();
        if n >= 2 {
            let pieces = Arc::new(pieces);
            let next = Arc::new(AtomicUsize::new(0));
            for _ in 0..n {
                let (pieces, next, stop) = (pieces.clone(), next.clone(), stop.clone());
                let spawned = std::thread::Builder::new()
                    .name("crane-fault".into())
                    .spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            let Some(&(addr, len)) = pieces.get(i) else {
                                break;
                            };
                            populate(addr, len);
                        }
                    });
                // One that cannot start only leaves its pieces to the others
                // (or to the transfers).
                threads.extend(spawned.ok());
            }
        }
        Faulting { threads, stop }
    }

    /// Waits until every piece is faulted in.
    pub fn finish(mut self) {
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Faulting {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Faults in `[addr, addr + len)` for writing, without changing its
/// contents: a transfer may be filling it at the same time. On kernels
/// before 5.14 (no MADV_POPULATE_WRITE) it does nothing: the transfers
/// fault the memory in as before.
///
/// The memory may be given back while a helper is at it (a read-back that
/// fails drops the copies it made before [`Faulting`] stops): the advice
/// then fails on an unmapped range, or, on a range mapped again meanwhile,
/// only faults pages in (contents untouched; device and read-only mappings
/// refuse it), so nothing is lost either way.
fn populate(addr: usize, len: usize) {
    // SAFETY: advice, not an access: it changes no byte of whatever is
    // mapped there (see above).
    unsafe { libc::madvise(addr as *mut c_void, len, libc::MADV_POPULATE_WRITE) };
}

/// The vendor device of `ctx`'s first device (null: none).
fn first_device(ctx: &Context) -> *mut c_void {
    ctx.devices
        .first()
        .map_or(std::ptr::null_mut(), |d| d.base.vendor())
}

/// A pin held for the length of a few transfers (see [`HostBytes::pin`]):
/// a vendor buffer over the memory, and its length.
pub struct TempPin(*mut c_void, usize);

// SAFETY: a vendor memory object, which OpenCL lets any thread release;
// crane holds its one reference.
unsafe impl Send for TempPin {}

impl TempPin {
    fn new(vctx: *mut c_void, vdev: *mut c_void, addr: usize, len: usize) -> Option<TempPin> {
        if vendor::remote_session().is_some() {
            return None;
        }
        Self::make(vctx, vdev, addr, len)
    }

    fn make(vctx: *mut c_void, vdev: *mut c_void, addr: usize, len: usize) -> Option<TempPin> {
        if len < crate::config::get().pin_min.unwrap_or(TEMP_PIN_MIN)
            || vctx.is_null()
            || is_cpu(vdev)
        {
            return None;
        }
        let create = vfn!(vctx, clCreateBuffer).ok()?;
        let mut err = CL_SUCCESS;
        // SAFETY: a buffer over `len` mapped bytes that outlive the guard.
        let mem = unsafe {
            create(
                vctx.cast(),
                CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR,
                len,
                addr as *mut c_void,
                &mut err,
            )
        };
        (err == CL_SUCCESS && !mem.is_null()).then_some(TempPin(mem.cast(), len))
    }
}

impl Drop for TempPin {
    fn drop(&mut self) {
        // SAFETY: the vendor buffer made in `new`, crane's one reference.
        unsafe { vendor::release(self.0, |d| d.clReleaseMemObject) };
    }
}

/// Takes every pin out (for a suspend or a move, which release them with the
/// other vendor objects): the regions stay mapped, unpinned.
pub fn take_pins() -> Vec<*mut c_void> {
    pins()
        .drain()
        .map(|(_, (mem, _))| mem as *mut c_void)
        .collect()
}

/// Pins again the regions that live maps hold, once their contexts are
/// rebuilt on a vendor (idle regions are pinned when next handed out).
pub fn repin_held() {
    for m in crate::handle::live::<crate::objects::Mem>() {
        let maps = m.maps.lock().unwrap_or_else(|e| e.into_inner());
        for s in maps.iter().filter_map(|r| r.storage.as_ref()) {
            s.repin(&m.context);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_round_to_pages_powers_of_two_then_huge_multiples() {
        assert_eq!(class(0), PAGE);
        assert_eq!(class(1), PAGE);
        assert_eq!(class(PAGE + 1), 2 * PAGE);
        assert_eq!(class(HUGE), HUGE);
        assert_eq!(class(HUGE + 1), 2 * HUGE);
        assert_eq!(class(256 << 20), 256 << 20);
        assert_eq!(class((256 << 20) + 1), (256 << 20) + HUGE);
    }

    #[test]
    fn large_regions_are_huge_page_aligned_and_whole() {
        for len in [HUGE, 3 * HUGE, class((64 << 20) + 1)] {
            let r = Region::new(len).expect("mmap");
            assert_eq!(r.addr % HUGE, 0);
            // SAFETY: the region's `len` bytes, mapped until `r` drops.
            let bytes = unsafe { std::slice::from_raw_parts_mut(r.addr as *mut u8, r.len) };
            bytes.fill(0x3c);
            assert!(bytes.iter().all(|&b| b == 0x3c));
        }
        let h = HostBytes::from_slice(&[7u8; 5 << 20]);
        assert_eq!((h.len(), h[0], h[(5 << 20) - 1]), (5 << 20, 7, 7));
    }

    #[test]
    fn a_region_is_writable_and_goes_back_to_its_pool() {
        let pool = Arc::new(Pool::default());
        let r = Region::new(class(10_000)).expect("mmap");
        let s = Staging {
            region: Some(r),
            pool: Arc::downgrade(&pool),
        };
        let p = s.as_mut_ptr();
        // SAFETY: the region's bytes.
        unsafe { std::ptr::write_bytes(p, 0xa5, s.len()) };
        let len = s.len();
        drop(s);
        let idle = pool.idle.lock().unwrap();
        assert_eq!(idle.len(), 1);
        assert_eq!((idle[0].addr, idle[0].len), (p as usize, len));
        // SAFETY: still mapped: the pool holds it.
        assert_eq!(unsafe { *p.add(len - 1) }, 0xa5);
    }

    /// Pages of `[addr, addr + len)` resident in RAM.
    fn resident(addr: usize, len: usize) -> usize {
        let pages = len.div_ceil(PAGE);
        let mut v = vec![0u8; pages];
        // SAFETY: a mapped, page-aligned range; one byte out per page.
        let rc = unsafe { libc::mincore(addr as *mut c_void, len, v.as_mut_ptr()) };
        assert_eq!(rc, 0);
        v.iter().filter(|&&b| b & 1 != 0).count()
    }

    /// Large fresh memory for reads comes faulted in (by several threads
    /// where the machine has cores), zeroed and writable; small memory is
    /// left to the transfers.
    #[test]
    fn memory_for_large_reads_comes_faulted_in() {
        let lens = [40 << 20, 24 << 20, 1 << 20];
        let (mut v, faulting) = HostBytes::fresh_in_order(&lens);
        faulting.finish();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        for (h, &len) in v.iter().zip(&lens) {
            if cores >= 2 && len >= FAULT_PIECE {
                assert_eq!(resident(h.region.addr, len), len / PAGE);
            }
            assert!(h.iter().all(|&b| b == 0));
        }
        v[0][(40 << 20) - 1] = 7;
        assert_eq!(v[0][(40 << 20) - 1], 7);
        let (small, faulting) = HostBytes::fresh_in_order(&[16 << 20]);
        faulting.finish();
        assert_eq!(resident(small[0].region.addr, 16 << 20), 0);
        let fresh = HostBytes::zeroed(64 << 20);
        assert_eq!(resident(fresh.region.addr, 64 << 20), 0);
    }
}
