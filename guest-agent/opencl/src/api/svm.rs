//! Shared virtual memory. SVM pointers are chosen by the vendor and embedded in
//! application data, so they cannot be re-created at the same address after the
//! vendor library is reloaded; crane forwards SVM calls, tracks the live
//! allocations, and refuses to suspend a process that holds any (the suspend
//! reports why and the application carries on untouched).

use std::ffi::c_void;
use std::sync::Mutex;

use opencl_sys::*;

use super::enqueue::{queue_of, run, wl};
use super::*;
use crate::entry;
use crate::vendor::vfn;

/// Live SVM allocations: (pointer, size).
pub static LIVE: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

pub fn live_bytes() -> (usize, usize) {
    let l = LIVE.lock().unwrap_or_else(|e| e.into_inner());
    (l.len(), l.iter().map(|&(_, s)| s).sum())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clSVMAlloc(
    c: cl_context,
    flags: cl_svm_mem_flags,
    size: usize,
    align: cl_uint,
) -> *mut c_void {
    entry::infallible(std::ptr::null_mut(), || {
        let Ok(vc) = vendor_of::<Context>(c.cast(), CL_INVALID_CONTEXT) else {
            return std::ptr::null_mut();
        };
        let Ok(f) = vfn!(vc, clSVMAlloc) else {
            return std::ptr::null_mut();
        };
        // SAFETY: forwarding.
        let p = unsafe { f(vc.cast(), flags, size, align) };
        if !p.is_null() {
            LIVE.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((p as usize, size));
        }
        p
    })
}

fn forget(p: *mut c_void) {
    LIVE.lock()
        .unwrap_or_else(|e| e.into_inner())
        .retain(|&(q, _)| q != p as usize);
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clSVMFree(c: cl_context, p: *mut c_void) {
    entry::infallible((), || {
        let Ok(vc) = vendor_of::<Context>(c.cast(), CL_INVALID_CONTEXT) else {
            return;
        };
        if let Ok(f) = vfn!(vc, clSVMFree) {
            // SAFETY: forwarding.
            unsafe { f(vc.cast(), p) };
            forget(p);
        }
    })
}

type SvmFreeCb =
    Option<unsafe extern "C" fn(cl_command_queue, cl_uint, *mut *mut c_void, *mut c_void)>;

struct SvmFreeNotify {
    func: unsafe extern "C" fn(cl_command_queue, cl_uint, *mut *mut c_void, *mut c_void),
    user_data: usize,
    queue: usize,
}

unsafe extern "C" fn svm_free_trampoline(
    _vq: cl_command_queue,
    n: cl_uint,
    ptrs: *mut *mut c_void,
    ud: *mut c_void,
) {
    // SAFETY: the Box made in clEnqueueSVMFree; the vendor calls back once.
    let b = unsafe { Box::from_raw(ud.cast::<SvmFreeNotify>()) };
    let _pass = crate::gate::enter_callback();
    entry::callback("svm_free_trampoline", || {
        // SAFETY: the application's callback with crane's queue and its own data.
        unsafe {
            (b.func)(
                b.queue as cl_command_queue,
                n,
                ptrs,
                b.user_data as *mut c_void,
            )
        }
    });
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueSVMFree(
    q: cl_command_queue,
    n_ptrs: cl_uint,
    ptrs: *mut *mut c_void,
    f: SvmFreeCb,
    ud: *mut c_void,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        let ps = entry::slice(ptrs.cast_const(), n_ptrs as usize, CL_INVALID_VALUE)?.to_vec();
        // The application's callback must see crane's queue, not the vendor's.
        let (cb, cud): (SvmFreeCb, *mut c_void) = match f {
            Some(func) => (
                Some(svm_free_trampoline),
                Box::into_raw(Box::new(SvmFreeNotify {
                    func,
                    user_data: ud as usize,
                    queue: q as usize,
                }))
                .cast(),
            ),
            None => (None, ud),
        };
        let r = run(queue, n, list, ev, CL_COMMAND_SVM_FREE, |vq, w, ve| {
            // SAFETY: forwarding.
            Ok(unsafe { vfn!(vq, clEnqueueSVMFree)?(vq, n_ptrs, ptrs, cb, cud, n, wl(w), ve) })
        });
        if r.is_err() && cb.is_some() {
            // SAFETY: the vendor refused and will not call back.
            drop(unsafe { Box::from_raw(cud.cast::<SvmFreeNotify>()) });
        }
        r?;
        for p in ps {
            forget(p);
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueSVMMemcpy(
    q: cl_command_queue,
    blocking: cl_bool,
    dst: *mut c_void,
    src: *const c_void,
    size: usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        run(queue, n, list, ev, CL_COMMAND_SVM_MEMCPY, |vq, w, ve| {
            // SAFETY: forwarding.
            Ok(
                unsafe {
                    vfn!(vq, clEnqueueSVMMemcpy)?(vq, blocking, dst, src, size, n, wl(w), ve)
                },
            )
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueSVMMemFill(
    q: cl_command_queue,
    p: *mut c_void,
    pattern: *const c_void,
    psize: usize,
    size: usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        // "CL_INVALID_VALUE if pattern is NULL". Checked here: PoCL reads the
        // pattern before checking it.
        if pattern.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        run(queue, n, list, ev, CL_COMMAND_SVM_MEMFILL, |vq, w, ve| {
            // SAFETY: forwarding.
            Ok(
                unsafe {
                    vfn!(vq, clEnqueueSVMMemFill)?(vq, p, pattern, psize, size, n, wl(w), ve)
                },
            )
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueSVMMap(
    q: cl_command_queue,
    blocking: cl_bool,
    flags: cl_map_flags,
    p: *mut c_void,
    size: usize,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        run(queue, n, list, ev, CL_COMMAND_SVM_MAP, |vq, w, ve| {
            // SAFETY: forwarding.
            Ok(unsafe { vfn!(vq, clEnqueueSVMMap)?(vq, blocking, flags, p, size, n, wl(w), ve) })
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueSVMUnmap(
    q: cl_command_queue,
    p: *mut c_void,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        run(queue, n, list, ev, CL_COMMAND_SVM_UNMAP, |vq, w, ve| {
            // SAFETY: forwarding.
            Ok(unsafe { vfn!(vq, clEnqueueSVMUnmap)?(vq, p, n, wl(w), ve) })
        })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clEnqueueSVMMigrateMem(
    q: cl_command_queue,
    n_ptrs: cl_uint,
    ptrs: *mut *const c_void,
    sizes: *const usize,
    flags: cl_mem_migration_flags,
    n: cl_uint,
    list: *const cl_event,
    ev: *mut cl_event,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_of(q)?;
        run(
            queue,
            n,
            list,
            ev,
            CL_COMMAND_SVM_MIGRATE_MEM,
            |vq, w, ve| {
                // SAFETY: forwarding.
                Ok(unsafe {
                    vfn!(vq, clEnqueueSVMMigrateMem)?(vq, n_ptrs, ptrs, sizes, flags, n, wl(w), ve)
                })
            },
        )
    })
}
