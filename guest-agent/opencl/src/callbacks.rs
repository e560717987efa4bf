//! Trampolines between vendor callbacks and the application's: the vendor
//! calls crane with its own object, the application is called with crane's
//! handle, and each registration fires exactly once even across a suspend.
//! Crane's part of each runs inside `entry::callback`, so that a panic in it
//! never unwinds into the vendor's thread.

use std::ffi::c_void;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use opencl_sys::cl_icd::_cl_icd_dispatch;
use opencl_sys::*;

use crate::objects::Callback;
use crate::{entry, gate};

/// Build callbacks registered and not yet run: suspend waits for them, so that
/// no vendor thread calls into crane after the vendor is unloaded.
pub static PENDING_BUILDS: AtomicUsize = AtomicUsize::new(0);

type EventFn = unsafe extern "C" fn(cl_event, cl_int, *mut c_void);

/// Vendor-facing event callback. `ud` is an `Arc<Callback>` turned raw at
/// registration.
pub unsafe extern "C" fn event_trampoline(
    _vendor_event: cl_event,
    status: cl_int,
    ud: *mut c_void,
) {
    // SAFETY: `ud` was produced by Arc::into_raw in `register_event` and the
    // vendor calls each registration once.
    let cb = unsafe { Arc::from_raw(ud as *const Callback) };
    let _pass = gate::enter_callback();
    entry::callback("event_trampoline", || {
        if !cb.fired.swap(true, Ordering::AcqRel) {
            // SAFETY: `func` is the application's non-null callback of this type.
            let f: EventFn = unsafe { std::mem::transmute::<usize, EventFn>(cb.func) };
            // SAFETY: the application's callback with its own data.
            unsafe { f(cb.handle as cl_event, status, cb.user_data as *mut c_void) }
        }
    });
}

/// Registers `cb` on a vendor event.
pub fn register_event(vendor_event: *mut c_void, cb: &Arc<Callback>) -> cl_int {
    let Ok(f) = crate::vendor::vfn!(vendor_event, clSetEventCallback) else {
        return CL_INVALID_OPERATION;
    };
    let ud = Arc::into_raw(cb.clone());
    // SAFETY: a live vendor event; the trampoline matches the callback type.
    let rc = unsafe {
        f(
            vendor_event.cast(),
            cb.kind,
            Some(event_trampoline),
            ud as *mut c_void,
        )
    };
    if rc != CL_SUCCESS {
        // SAFETY: the vendor did not take the reference.
        drop(unsafe { Arc::from_raw(ud) });
    }
    rc
}

struct Destructors {
    list: Vec<Arc<Callback>>,
}

type DestructorFn = unsafe extern "C" fn(*mut c_void, *mut c_void);

unsafe extern "C" fn destructor_trampoline(_vendor_obj: *mut c_void, ud: *mut c_void) {
    // SAFETY: `ud` is the Box made in `hand_over_destructors`; called once.
    let d = unsafe { Box::from_raw(ud as *mut Destructors) };
    let _pass = gate::enter_callback();
    entry::callback("destructor_trampoline", || run_destructors(&d.list));
}

fn run_destructors(list: &[Arc<Callback>]) {
    for cb in list.iter().rev() {
        if !cb.fired.swap(true, Ordering::AcqRel) {
            // SAFETY: `func` is the application's non-null destructor callback.
            let f: DestructorFn = unsafe { std::mem::transmute::<usize, DestructorFn>(cb.func) };
            // SAFETY: the application's callback with its own data.
            unsafe { f(cb.handle as *mut c_void, cb.user_data as *mut c_void) }
        }
    }
}

type SetDestructor = unsafe extern "C" fn(*mut c_void, Option<DestructorFn>, *mut c_void) -> cl_int;

/// Hands the application's destructor callbacks to the vendor just before crane
/// releases the vendor object for good, so they run when the vendor frees it
/// (after the commands using it). Without vendor support they run at once.
pub fn hand_over_destructors(
    list: Vec<Arc<Callback>>,
    v: *mut c_void,
    sel: impl FnOnce(&_cl_icd_dispatch) -> Option<usize>,
) {
    if list.is_empty() {
        return;
    }
    // SAFETY: `v` is a live vendor object.
    let setter = sel(unsafe { crate::vendor::disp(v) });
    if let Some(s) = setter {
        // SAFETY: the selected function is a clSet*DestructorCallback, all of
        // which take (object, callback(object, user_data), user_data).
        let s: SetDestructor = unsafe { std::mem::transmute::<usize, SetDestructor>(s) };
        let ud = Box::into_raw(Box::new(Destructors { list }));
        // SAFETY: as above.
        if unsafe { s(v, Some(destructor_trampoline), ud.cast()) } == CL_SUCCESS {
            return;
        }
        // SAFETY: the vendor refused and did not keep `ud`.
        let d = unsafe { Box::from_raw(ud) };
        run_destructors(&d.list);
        return;
    }
    run_destructors(&list);
}

type BuildFn = unsafe extern "C" fn(cl_program, *mut c_void);

pub struct BuildNotify {
    pub func: BuildFn,
    pub user_data: usize,
    pub handle: usize,
}

/// Vendor-facing build/compile/link callback.
pub unsafe extern "C" fn build_trampoline(_vendor_program: cl_program, ud: *mut c_void) {
    // SAFETY: `ud` is the Box made by the registering entry point; called once.
    let n = unsafe { Box::from_raw(ud as *mut BuildNotify) };
    let pass = gate::enter_callback();
    entry::callback("build_trampoline", || {
        // SAFETY: the application's callback with its own data.
        unsafe { (n.func)(n.handle as cl_program, n.user_data as *mut c_void) }
    });
    drop(pass);
    PENDING_BUILDS.fetch_sub(1, Ordering::AcqRel);
}
