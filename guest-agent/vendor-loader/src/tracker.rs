//! What the vendor library does behind our back, recorded as it happens.
//!
//! The vendor's imports of `dlopen`, `dlmopen`, `dlclose` and
//! `pthread_create` (and those of every object it brings in) are redirected
//! to the hooks below. They record each handle the vendor opens, defer each
//! handle it closes until [`crate::VendorLibrary::close`], and register each
//! thread it starts, so that unloading can be exact instead of guessing from
//! library names.
//!
//! Lock order: the tracker lock is never held while calling into the dynamic
//! linker (which takes the loader lock, and whose constructors may call the
//! hooks); code under the tracker lock only touches the tracker.

use std::collections::HashSet;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard};

use crate::objects::{self, ObjectId};

/// One successful `dlopen`/`dlmopen` made by vendor code.
#[derive(Debug, Clone)]
pub(crate) struct HandleEntry {
    pub serial: u64,
    pub handle: usize,
    pub target: ObjectId,
    /// The object whose code called `dlopen`, when the call site was found.
    pub opener: Option<ObjectId>,
    pub nodelete: bool,
    /// The vendor called `dlclose` on it; the close waits for unloading.
    pub closed_by_vendor: bool,
}

/// A thread started by vendor code.
#[derive(Debug, Clone)]
pub(crate) struct ThreadEntry {
    pub serial: u64,
    /// Filled in by the thread itself as its first action.
    pub task: Option<Task>,
    /// The object that holds the thread's start routine.
    pub start_object: Option<ObjectId>,
    /// The thread's `pthread_t`, filled in with `task`.
    pub pthread: Option<libc::pthread_t>,
}

/// A kernel task, identified across tid reuse by its start time (when
/// procfs could tell it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Task {
    pub tid: libc::pid_t,
    pub start_time: Option<u64>,
}

#[derive(Debug)]
pub(crate) struct Tracker {
    /// The paths of the vendor libraries open now, in the order they were
    /// opened (they are tracked, and closed, together).
    pub open_vendors: Vec<PathBuf>,
    /// The object each open vendor library is, by its path: another name
    /// for the same file (a soname and the file it links to) is the same
    /// library, which the dynamic linker does not load twice.
    pub vendor_objects: Vec<(PathBuf, ObjectId)>,
    /// The objects that came with or from the vendor (loaded with it or
    /// through its `dlopen`), in the order they appeared.
    pub objects: Vec<ObjectId>,
    pub handles: Vec<HandleEntry>,
    pub threads: Vec<ThreadEntry>,
    next_serial: u64,
}

static TRACKER: Mutex<Tracker> = Mutex::new(Tracker {
    open_vendors: Vec::new(),
    vendor_objects: Vec::new(),
    objects: Vec::new(),
    handles: Vec::new(),
    threads: Vec::new(),
    next_serial: 0,
});

/// The tracker, even if a panic poisoned its lock: every update leaves it
/// consistent.
pub(crate) fn lock() -> MutexGuard<'static, Tracker> {
    TRACKER
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Tracker {
    pub fn attribute(&mut self, id: ObjectId) {
        if !self.objects.contains(&id) {
            self.objects.push(id);
        }
    }

    fn serial(&mut self) -> u64 {
        self.next_serial += 1;
        self.next_serial
    }

    /// Forgets objects (and handles to them) that are no longer loaded.
    pub fn forget_unloaded(&mut self, loaded: &HashSet<ObjectId>) {
        self.objects.retain(|o| loaded.contains(o));
        self.handles.retain(|h| loaded.contains(&h.target));
    }
}

/// The functions whose imports are redirected, with their hooks.
pub(crate) fn hooks() -> [(&'static CStr, usize); 4] {
    [
        (c"dlopen", hooked_dlopen as *const () as usize),
        (c"dlmopen", hooked_dlmopen as *const () as usize),
        (c"dlclose", hooked_dlclose as *const () as usize),
        (
            c"pthread_create",
            hooked_pthread_create as *const () as usize,
        ),
    ]
}

/// The link map entry of a `dlopen` handle.
#[repr(C)]
struct LinkMap {
    l_addr: usize,
    l_name: *const c_char,
    l_ld: *mut c_void,
    l_next: *mut LinkMap,
    l_prev: *mut LinkMap,
}

/// The object a valid `dlopen` handle refers to.
pub(crate) fn handle_target(handle: NonNull<c_void>) -> Option<ObjectId> {
    let mut map: *mut LinkMap = std::ptr::null_mut();
    // SAFETY: handle is a live handle returned by dlopen; RTLD_DI_LINKMAP
    // stores a struct link_map pointer into `map`.
    let rc = unsafe {
        libc::dlinfo(
            handle.as_ptr(),
            libc::RTLD_DI_LINKMAP,
            (&raw mut map).cast::<c_void>(),
        )
    };
    if rc != 0 || map.is_null() {
        return None;
    }
    // SAFETY: dlinfo returned the handle's link map, which stays valid while
    // the handle is open; l_name is a NUL-terminated string it owns.
    let (base, name) = unsafe { ((*map).l_addr, (*map).l_name) };
    let path = if name.is_null() {
        PathBuf::new()
    } else {
        // SAFETY: see above.
        let name = unsafe { CStr::from_ptr(name) };
        PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes()))
    };
    Some(ObjectId { path, base })
}

/// The return address into whoever called the hook that calls this.
#[inline(never)]
fn hook_caller() -> Option<usize> {
    let mut frames = [std::ptr::null_mut::<c_void>(); 3];
    // SAFETY: the buffer holds the 3 entries asked for. Frame 0 is this
    // function, 1 the hook, 2 the hook's caller.
    let depth = unsafe { libc::backtrace(frames.as_mut_ptr(), 3) };
    (depth == 3 && !frames[2].is_null()).then(|| frames[2] as usize)
}

/// Makes sure `backtrace` has loaded its unwinder before a hook needs it, so
/// that the first hook call does not load a library of its own.
pub(crate) fn prepare_backtrace() {
    let mut frame = [std::ptr::null_mut::<c_void>(); 1];
    // SAFETY: the buffer holds the one entry asked for.
    unsafe { libc::backtrace(frame.as_mut_ptr(), 1) };
}

/// Records what a successful `dlopen`/`dlmopen` by vendor code brought in,
/// and extends the redirection to the new objects.
fn after_vendor_open(
    handle: NonNull<c_void>,
    flags: c_int,
    caller: Option<usize>,
    before: &HashSet<ObjectId>,
) {
    let loaded = objects::loaded_ids();
    let new: HashSet<ObjectId> = loaded.difference(before).cloned().collect();
    if !new.is_empty() {
        objects::redirect_imports(&new, &hooks());
    }
    let opener = caller.and_then(|address| objects::object_containing(address - 1));
    let Some(target) = handle_target(handle) else {
        log::warn!("A handle opened by the vendor has no link map; it is not tracked.");
        return;
    };
    log::debug!(
        "{} opened {} ({} new objects).",
        opener
            .as_ref()
            .map_or_else(|| "Vendor code".into(), |o| o.path.display().to_string()),
        target.path.display(),
        new.len()
    );
    let mut tracker = lock();
    tracker.forget_unloaded(&loaded);
    for id in new {
        tracker.attribute(id);
    }
    let serial = tracker.serial();
    tracker.handles.push(HandleEntry {
        serial,
        handle: handle.as_ptr() as usize,
        target,
        opener,
        nodelete: flags & libc::RTLD_NODELETE != 0,
        closed_by_vendor: false,
    });
}

/// Runs the bookkeeping part of a hook; a panic there must neither unwind
/// into the vendor's C code nor abort the application.
fn bookkeeping(what: &str, work: impl FnOnce()) {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(work)).is_err() {
        log::error!("Tracking of a vendor {what} call panicked; the call itself went through.");
    }
}

unsafe extern "C" fn hooked_dlopen(filename: *const c_char, flags: c_int) -> *mut c_void {
    let caller = hook_caller();
    let mut before = HashSet::new();
    bookkeeping("dlopen", || before = objects::loaded_ids());
    // SAFETY: the vendor's own call, passed through unchanged.
    let handle = unsafe { libc::dlopen(filename, flags) };
    if let Some(handle) = NonNull::new(handle) {
        bookkeeping("dlopen", || {
            after_vendor_open(handle, flags, caller, &before)
        });
    }
    handle
}

unsafe extern "C" fn hooked_dlmopen(
    namespace: libc::Lmid_t,
    filename: *const c_char,
    flags: c_int,
) -> *mut c_void {
    let caller = hook_caller();
    let mut before = HashSet::new();
    bookkeeping("dlmopen", || before = objects::loaded_ids());
    // SAFETY: the vendor's own call, passed through unchanged.
    let handle = unsafe { libc::dlmopen(namespace, filename, flags) };
    if let Some(handle) = NonNull::new(handle) {
        bookkeeping("dlmopen", || {
            after_vendor_open(handle, flags, caller, &before)
        });
    }
    handle
}

unsafe extern "C" fn hooked_dlclose(handle: *mut c_void) -> c_int {
    let mut deferred = false;
    bookkeeping("dlclose", || {
        let mut tracker = lock();
        let address = handle as usize;
        let known = tracker.handles.iter().any(|h| h.handle == address);
        if let Some(entry) = tracker
            .handles
            .iter_mut()
            .rev()
            .find(|h| h.handle == address && !h.closed_by_vendor)
        {
            entry.closed_by_vendor = true;
        } else if known {
            log::debug!("The vendor closed a handle more often than it opened it; ignored.");
        }
        deferred = known;
    });
    if deferred {
        // A vendor that stays mapped (PoCL 3.1 after POCL_ENABLE_UNINIT)
        // keeps calling into libraries it closed; closing waits for the
        // vendor to be unloaded.
        return 0;
    }
    // SAFETY: a handle this tracker did not see opened: the vendor's own
    // call, passed through unchanged.
    unsafe { libc::dlclose(handle) }
}

type StartRoutine = unsafe extern "C" fn(*mut c_void) -> *mut c_void;

/// What a hooked thread needs to register itself and run the vendor's
/// start routine.
struct ThreadStart {
    start: StartRoutine,
    arg: *mut c_void,
    serial: u64,
}

unsafe extern "C" fn hooked_pthread_create(
    thread: *mut libc::pthread_t,
    attr: *const libc::pthread_attr_t,
    start: Option<StartRoutine>,
    arg: *mut c_void,
) -> c_int {
    let Some(start) = start else {
        return libc::EINVAL;
    };
    let mut serial = None;
    bookkeeping("pthread_create", || {
        let start_object = objects::object_containing(start as usize);
        let mut tracker = lock();
        let next = tracker.serial();
        // Registered before the thread exists, so that no observer can miss
        // a thread that has been created but not yet scheduled.
        tracker.threads.push(ThreadEntry {
            serial: next,
            task: None,
            start_object,
            pthread: None,
        });
        serial = Some(next);
    });
    let Some(serial) = serial else {
        // SAFETY: the vendor's own call, passed through unchanged.
        return unsafe { libc::pthread_create(thread, attr, as_c_start(start), arg) };
    };
    let payload = Box::into_raw(Box::new(ThreadStart { start, arg, serial }));
    // SAFETY: thread and attr come from the vendor's call; the payload is
    // handed over to vendor_thread_main, which frees it.
    let rc = unsafe { libc::pthread_create(thread, attr, vendor_thread_main, payload.cast()) };
    if rc != 0 {
        // SAFETY: the thread was not created, so the payload is still ours.
        drop(unsafe { Box::from_raw(payload) });
        lock().threads.retain(|t| t.serial != serial);
    }
    rc
}

fn as_c_start(start: StartRoutine) -> extern "C" fn(*mut c_void) -> *mut c_void {
    // SAFETY: both are C-ABI functions of the same signature; the libc crate
    // merely declares the parameter without `unsafe`.
    unsafe { std::mem::transmute::<StartRoutine, extern "C" fn(*mut c_void) -> *mut c_void>(start) }
}

extern "C" fn vendor_thread_main(payload: *mut c_void) -> *mut c_void {
    // SAFETY: hooked_pthread_create passed a leaked Box<ThreadStart>, which
    // only this thread takes back.
    let ThreadStart { start, arg, serial } =
        *unsafe { Box::from_raw(payload.cast::<ThreadStart>()) };
    bookkeeping("thread start", || {
        let task = crate::threads::current_task();
        // SAFETY: pthread_self has no preconditions.
        let pthread = unsafe { libc::pthread_self() };
        if let Some(entry) = lock().threads.iter_mut().find(|t| t.serial == serial) {
            entry.task = Some(task);
            entry.pthread = Some(pthread);
        }
    });
    // Nothing with a destructor is alive here: if the vendor ends the thread
    // with pthread_exit, or unloading cancels it (threads::cancel_threads),
    // the forced unwind crosses a plain frame.
    // SAFETY: the vendor's start routine and argument, as it passed them.
    unsafe { start(arg) }
}
