//! Crane's own OpenCL handles.
//!
//! Every handle crane gives the application is the address of a [`Slot`] in one
//! contiguous arena that crane maps at start-up. Two properties follow and the
//! rest of the library relies on them:
//!
//! * A handle stays valid across unloading and reloading the vendor library: the
//!   slot, not the vendor object, is what the application holds.
//! * Whether an arbitrary pointer-sized value is one of crane's handles is an
//!   address range check followed by reading a tag inside memory crane owns. That
//!   is O(1), never dereferences foreign memory, and is what lets `clSetKernelArg`
//!   tell a `cl_mem` from plain bytes without a hash lookup (the cost the Crane
//!   paper measured at 12.5% on a video encoder).
//!
//! The first field of a slot is the ICD dispatch pointer, so the same handles work
//! when an ICD loader dispatches to crane.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use opencl_sys::cl_icd::_cl_icd_dispatch;

/// Size of one slot; handles are aligned to it.
pub const SLOT_SIZE: usize = 32;
/// Virtual size of the arena (reserved, not committed: pages are touched on use).
const ARENA_SLOTS: usize = 1 << 24;

/// The kinds of object crane hands out. Zero means a free slot.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Platform = 0x43_52_01,
    Device = 0x43_52_02,
    Context = 0x43_52_03,
    Queue = 0x43_52_04,
    Mem = 0x43_52_05,
    Sampler = 0x43_52_06,
    Program = 0x43_52_07,
    Kernel = 0x43_52_08,
    Event = 0x43_52_09,
    /// Objects of unit tests only.
    #[cfg(test)]
    Test = 0x43_52_7f,
}

/// One handle as the application sees it.
#[repr(C)]
pub struct Slot {
    /// ICD dispatch table; must stay the first field.
    dispatch: AtomicPtr<_cl_icd_dispatch>,
    kind: AtomicU32,
    generation: AtomicU32,
    object: AtomicPtr<c_void>,
    _reserved: usize,
}

const _: () = assert!(std::mem::size_of::<Slot>() == SLOT_SIZE);

struct Arena {
    base: *mut Slot,
    free: Mutex<FreeList>,
}

struct FreeList {
    next_unused: usize,
    recycled: std::collections::VecDeque<usize>,
}

// SAFETY: `base` points to a process-lifetime mapping that is never unmapped; all
// mutation of slots goes through atomics or the free-list mutex.
unsafe impl Send for Arena {}
// SAFETY: as for Send.
unsafe impl Sync for Arena {}

static ARENA_BASE: AtomicUsize = AtomicUsize::new(0);
/// Bytes of the arena handed out so far (the high-water mark of slots).
static ARENA_USED: AtomicUsize = AtomicUsize::new(0);
static ARENA: std::sync::OnceLock<Arena> = std::sync::OnceLock::new();

fn arena() -> &'static Arena {
    ARENA.get_or_init(|| {
        // SAFETY: an anonymous private mapping with no fixed address; the kernel
        // picks the range. MAP_NORESERVE: only touched pages cost memory.
        let base = unsafe {
            libc::mmap(
                ptr::null_mut(),
                ARENA_SLOTS * SLOT_SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert!(
            base != libc::MAP_FAILED,
            "crane: cannot reserve the handle arena"
        );
        ARENA_BASE.store(base as usize, Ordering::Release);
        Arena {
            base: base.cast(),
            free: Mutex::new(FreeList {
                next_unused: 0,
                recycled: Default::default(),
            }),
        }
    })
}

/// The slot behind `p` if `p` is a live crane handle of kind `kind`.
#[inline(always)]
pub fn slot_of(p: *const c_void, kind: Kind) -> Option<&'static Slot> {
    let off = (p as usize).wrapping_sub(ARENA_BASE.load(Ordering::Relaxed));
    if off >= ARENA_USED.load(Ordering::Acquire) || !off.is_multiple_of(SLOT_SIZE) {
        return None;
    }
    // SAFETY: `off` lies inside the part of the arena handed out so far, which is
    // mapped for the life of the process, and is slot-aligned.
    let slot = unsafe { &*(p as *const Slot) };
    (slot.kind.load(Ordering::Acquire) == kind as u32).then_some(slot)
}

/// A tracked object: something a slot can point to.
pub trait ClObject: Sized + Send + Sync + 'static {
    const KIND: Kind;
    fn base(&self) -> &Base;
}

/// State common to every tracked object.
pub struct Base {
    slot: AtomicPtr<Slot>,
    /// References the application holds (OpenCL's reference count).
    app_refs: AtomicU32,
    /// The vendor's object, replaced when the vendor library is reloaded; null
    /// while suspended or when the application has released it.
    vendor: AtomicPtr<c_void>,
    /// When it was made, among all tracked objects (see [`live`]).
    seq: u64,
}

/// The next [`Base::seq`].
static NEXT_SEQ: AtomicU64 = AtomicU64::new(0);

impl Base {
    pub fn new(vendor: *mut c_void) -> Base {
        Base {
            slot: AtomicPtr::new(ptr::null_mut()),
            app_refs: AtomicU32::new(1),
            vendor: AtomicPtr::new(vendor),
            seq: NEXT_SEQ.fetch_add(1, Ordering::Relaxed),
        }
    }
    #[inline(always)]
    pub fn vendor(&self) -> *mut c_void {
        self.vendor.load(Ordering::Acquire)
    }
    pub fn set_vendor(&self, v: *mut c_void) {
        self.vendor.store(v, Ordering::Release)
    }
    pub fn take_vendor(&self) -> *mut c_void {
        self.vendor.swap(ptr::null_mut(), Ordering::AcqRel)
    }
    pub fn app_refs(&self) -> u32 {
        self.app_refs.load(Ordering::Acquire)
    }
    /// The handle the application uses for this object.
    pub fn handle<H>(&self) -> *mut H {
        self.slot.load(Ordering::Acquire).cast()
    }
}

/// Allocates a slot for `obj` and returns the application's handle. The slot owns
/// one strong reference, which stands for all of the application's references.
pub fn publish<T: ClObject>(obj: Arc<T>) -> *mut Slot {
    let a = arena();
    let index = {
        let mut free = a.free.lock().unwrap_or_else(|e| e.into_inner());
        // Recycle only once enough slots are free, so that a stale handle is
        // unlikely to alias a fresh object of the same kind.
        if free.recycled.len() > 1024 {
            free.recycled.pop_front().expect("non-empty")
        } else {
            assert!(
                free.next_unused < ARENA_SLOTS,
                "crane: handle arena exhausted"
            );
            free.next_unused += 1;
            ARENA_USED.store(free.next_unused * SLOT_SIZE, Ordering::Release);
            free.next_unused - 1
        }
    };
    // SAFETY: index < ARENA_SLOTS, so the slot is inside the mapping.
    let slot = unsafe { &*a.base.add(index) };
    slot.dispatch.store(
        ptr::from_ref(&crate::dispatch::DISPATCH).cast_mut(),
        Ordering::Relaxed,
    );
    slot.generation.fetch_add(1, Ordering::Relaxed);
    // The slot keeps a weak reference until the object's drop frees it, so
    // that [`live`] can take a strong one only from an object that is not
    // already dying (see there).
    let _ = Weak::into_raw(Arc::downgrade(&obj));
    let raw = Arc::into_raw(obj);
    // SAFETY: `raw` came from Arc::into_raw just above and is alive.
    let base = unsafe { (*raw).base() };
    let slot_ptr = ptr::from_ref(slot).cast_mut();
    base.slot.store(slot_ptr, Ordering::Release);
    slot.object.store(raw as *mut c_void, Ordering::Release);
    slot.kind.store(T::KIND as u32, Ordering::Release);
    slot_ptr
}

/// Frees the slot of a T being dropped and gives back its weak reference,
/// under the arena's lock, which [`live`] holds while it takes references.
fn free_slot<T: ClObject>(slot: &Slot) {
    let a = arena();
    let index = (ptr::from_ref(slot) as usize - a.base as usize) / SLOT_SIZE;
    let mut free = a.free.lock().unwrap_or_else(|e| e.into_inner());
    slot.kind.store(0, Ordering::Release);
    let obj = slot.object.swap(ptr::null_mut(), Ordering::AcqRel) as *const T;
    if !obj.is_null() {
        // SAFETY: the weak reference `publish` made for this slot; the
        // allocation outlives it (the Arc being dropped holds its own weak
        // reference until the drop completes).
        drop(unsafe { Weak::from_raw(obj) });
    }
    free.recycled.push_back(index);
}

/// Borrow of the object behind a live handle.
#[inline(always)]
pub fn get<'a, T: ClObject>(p: *const c_void) -> Option<&'a T> {
    let slot = slot_of(p, T::KIND)?;
    let obj = slot.object.load(Ordering::Acquire);
    // SAFETY: a slot of kind T::KIND points to a live T (published by `publish`
    // and cleared before the T is dropped). The application must not use a handle
    // after its last release, as in OpenCL.
    (!obj.is_null()).then(|| unsafe { &*(obj as *const T) })
}

/// The object behind a live handle together with its slot, from one check.
#[inline(always)]
pub fn get_with_slot<'a, T: ClObject>(p: *const c_void) -> Option<(&'a T, *const Slot)> {
    let slot = slot_of(p, T::KIND)?;
    let obj = slot.object.load(Ordering::Acquire);
    // SAFETY: as in `get`.
    (!obj.is_null()).then(|| (unsafe { &*(obj as *const T) }, ptr::from_ref(slot)))
}

/// A new strong reference to the object behind a live handle.
pub fn get_arc<T: ClObject>(p: *const c_void) -> Option<Arc<T>> {
    let slot = slot_of(p, T::KIND)?;
    let obj = slot.object.load(Ordering::Acquire) as *const T;
    if obj.is_null() {
        return None;
    }
    // SAFETY: the slot's strong reference keeps `obj` alive while the slot is of
    // kind T; we add one more for the returned Arc.
    unsafe {
        Arc::increment_strong_count(obj);
        Some(Arc::from_raw(obj))
    }
}

/// The generation of a slot, so that a stored handle can later be checked for
/// still naming the same object.
#[inline(always)]
pub fn generation(slot: *const Slot) -> u32 {
    // SAFETY: callers pass slots obtained from `slot_of`, which are arena slots.
    unsafe { (*slot).generation.load(Ordering::Relaxed) }
}

/// The object a (slot, generation) pair recorded earlier still names, if any.
pub fn resolve<'a, T: ClObject>(slot: *const Slot, generation_: u32) -> Option<&'a T> {
    let t = get::<T>(slot.cast())?;
    (generation(slot) == generation_).then_some(t)
}

/// Application retain: OpenCL's clRetain*.
pub fn app_retain<T: ClObject>(obj: &T) {
    let b = obj.base();
    if b.app_refs.fetch_add(1, Ordering::AcqRel) == 0 {
        // The object was kept alive only by dependents (e.g. a program returned by
        // CL_KERNEL_PROGRAM after the application released it): take the
        // application's strong reference again.
        // SAFETY: `obj` is alive (we hold a borrow) and was made by Arc.
        unsafe { Arc::increment_strong_count(ptr::from_ref(obj)) };
    }
}

/// Application release: OpenCL's clRelease*. Returns true when this dropped the
/// application's last reference (the vendor object goes when the shadow object
/// drops, which may be later if dependents still hold it).
pub fn app_release<T: ClObject>(obj: &T) -> bool {
    let b = obj.base();
    let prev = b.app_refs.fetch_sub(1, Ordering::AcqRel);
    if prev == 0 {
        b.app_refs.fetch_add(1, Ordering::AcqRel);
        return false;
    }
    if prev == 1 {
        // SAFETY: this gives back the strong reference the application held.
        unsafe { Arc::decrement_strong_count(ptr::from_ref(obj)) };
        return true;
    }
    false
}

/// Called from each object's Drop: the slot dies with the object.
pub fn on_drop<T: ClObject>(base: &Base) {
    let slot = base.slot.load(Ordering::Acquire);
    if !slot.is_null() {
        // SAFETY: the slot was set by `publish` and belongs to this object.
        free_slot::<T>(unsafe { &*slot });
    }
}

/// Every live object of kind T, oldest first, as strong references. Used
/// while the gate is closed (suspend/resume/list), never on a hot path.
///
/// Oldest first, not in slot order (slots are recycled): a resume remakes
/// objects in this order and a suspend gives some back in its reverse, so
/// that the vendor sees them made and released in the order the program
/// made them. NVIDIA (580.159.04) crashes in clReleaseMemObject when
/// overlapping sub-buffers are released oldest first, natively too
/// (benches/subbuf-release.c); after a resume that had remade them in slot
/// order, the program's own newest-first release was that order for the
/// vendor (the CTS's test_buffers under suspend/resume cycles).
///
/// The gate stops the application's calls, not crane's own threads, which
/// drop objects meanwhile (a command's event once it completes, on the
/// thread that saw it complete); such an object's slot is freed only at the
/// end of its drop, after its vendor object's release (a round trip on
/// crane-proxy). Taking a strong reference from the slot's pointer then
/// revived a dying object, which was freed twice: checkpoints every few
/// milliseconds on crane-proxy crashed `events` on NVIDIA that way. So
/// the slot keeps a weak reference, and this upgrades it (no reference from
/// an object whose last strong one is gone) under the arena's lock, which
/// the slot's freeing takes before giving the weak reference back.
pub fn live<T: ClObject>() -> Vec<Arc<T>> {
    let Some(a) = ARENA.get() else {
        return Vec::new();
    };
    let _free = a.free.lock().unwrap_or_else(|e| e.into_inner());
    let used = ARENA_USED.load(Ordering::Acquire) / SLOT_SIZE;
    let mut all = (0..used)
        .filter_map(|i| {
            // SAFETY: i < used <= ARENA_SLOTS.
            let slot = unsafe { &*a.base.add(i) };
            if slot.kind.load(Ordering::Acquire) != T::KIND as u32 {
                return None;
            }
            let obj = slot.object.load(Ordering::Acquire) as *const T;
            if obj.is_null() {
                return None;
            }
            // SAFETY: the slot's weak reference (made in `publish`, given back
            // only under the lock held here) keeps the allocation; upgrading
            // a borrowed copy of it leaves that reference as it is.
            let weak = std::mem::ManuallyDrop::new(unsafe { Weak::from_raw(obj) });
            weak.upgrade()
        })
        .collect::<Vec<Arc<T>>>();
    all.sort_unstable_by_key(|o| o.base().seq);
    all
}

/// How many objects of kind `T` are alive, without taking a reference to
/// any: [`live`]'s references, taken outside the gate (a status query),
/// would make the application's release of such an object end on this
/// thread, after its call returned (a kernel then still attached to its
/// program when the application builds it again).
pub fn count<T: ClObject>() -> usize {
    let Some(a) = ARENA.get() else {
        return 0;
    };
    let _free = a.free.lock().unwrap_or_else(|e| e.into_inner());
    let used = ARENA_USED.load(Ordering::Acquire) / SLOT_SIZE;
    (0..used)
        .filter(|&i| {
            // SAFETY: i < used <= ARENA_SLOTS.
            let slot = unsafe { &*a.base.add(i) };
            if slot.kind.load(Ordering::Acquire) != T::KIND as u32 {
                return false;
            }
            let obj = slot.object.load(Ordering::Acquire) as *const T;
            // SAFETY: as in `live`: the slot's weak reference keeps the
            // allocation while the lock is held.
            !obj.is_null()
                && std::mem::ManuallyDrop::new(unsafe { Weak::from_raw(obj) }).strong_count() > 0
        })
        .count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    /// No unit test publishes samplers; this stands in for one whose drop
    /// looks at the live samplers before its slot is freed, as a checkpoint
    /// on another thread may while an object is being dropped.
    struct Dying {
        base: Base,
        revived: Arc<AtomicBool>,
    }

    impl ClObject for Dying {
        const KIND: Kind = Kind::Sampler;
        fn base(&self) -> &Base {
            &self.base
        }
    }

    impl Drop for Dying {
        fn drop(&mut self) {
            let me: *const Dying = self;
            let seen = live::<Dying>();
            if seen.iter().any(|d| Arc::as_ptr(d) == me) {
                self.revived.store(true, Ordering::Relaxed);
                // Keep the revived reference from dropping this a second time.
                std::mem::forget(seen);
            }
            on_drop::<Dying>(&self.base);
        }
    }

    #[test]
    fn a_dying_object_is_not_revived_by_live() {
        let revived = Arc::new(AtomicBool::new(false));
        let obj = Arc::new(Dying {
            base: Base::new(ptr::null_mut()),
            revived: revived.clone(),
        });
        let keep = obj.clone();
        let slot = publish(obj);
        assert_eq!(live::<Dying>().len(), 1);
        assert!(get::<Dying>(slot.cast()).is_some());
        // The application's release, then crane's last reference: the drop
        // runs with the slot still published.
        assert!(app_release(&*keep));
        drop(keep);
        assert!(
            !revived.load(Ordering::Relaxed),
            "live() revived a dying object"
        );
        assert!(live::<Dying>().is_empty());
        assert!(get::<Dying>(slot.cast()).is_none());
    }

    struct Made {
        base: Base,
    }

    impl ClObject for Made {
        const KIND: Kind = Kind::Test;
        fn base(&self) -> &Base {
            &self.base
        }
    }

    impl Drop for Made {
        fn drop(&mut self) {
            on_drop::<Made>(&self.base);
        }
    }

    /// Once slots are recycled, a new object can sit in a slot before older
    /// ones: `live` still lists them oldest first (what a resume remakes
    /// them in, and a suspend gives sub-buffers back in reverse of).
    #[test]
    fn live_lists_objects_oldest_first_whatever_their_slots() {
        let make = || {
            let o = Arc::new(Made {
                base: Base::new(ptr::null_mut()),
            });
            publish(o.clone());
            o
        };
        let release = |o: Arc<Made>| {
            assert!(app_release(&*o));
        };
        let mut gone: Vec<Arc<Made>> = (0..1100).map(|_| make()).collect();
        let kept = gone.split_off(1090);
        for o in gone {
            release(o);
        }
        let newer: Vec<Arc<Made>> = (0..3).map(|_| make()).collect();
        let slot = |o: &Arc<Made>| o.base.handle::<c_void>() as usize;
        assert!(
            newer.iter().any(|n| kept.iter().any(|k| slot(n) < slot(k))),
            "no new object took a recycled slot: the test shows nothing"
        );
        let want: Vec<*const Made> = kept.iter().chain(&newer).map(Arc::as_ptr).collect();
        let got: Vec<*const Made> = live::<Made>().iter().map(Arc::as_ptr).collect();
        assert_eq!(got, want);
        for o in kept.into_iter().chain(newer) {
            release(o);
        }
        assert!(live::<Made>().is_empty());
    }
}
