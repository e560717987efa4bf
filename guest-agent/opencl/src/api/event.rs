//! Events, user events and their callbacks.

use std::ffi::c_void;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex};

use opencl_sys::*;
use smallvec::SmallVec;

use super::*;
use crate::entry::{self, ClResult, bytes_of, write_info};
use crate::handle::Base;
use crate::vendor::{check, vfn};

pub fn new_event(
    context: Arc<Context>,
    queue: Option<Arc<Queue>>,
    vev: *mut c_void,
    command_type: cl_command_type,
) -> Arc<Event> {
    Arc::new(Event {
        base: Base::new(vev),
        context,
        queue,
        command_type,
        user_status: AtomicI32::new(CL_SUBMITTED),
        callbacks: Mutex::new(Vec::new()),
        profiling: Mutex::new(None),
        final_status: AtomicI32::new(CL_SUBMITTED),
    })
}

/// Vendor events for an application wait list.
pub type Waits = SmallVec<[cl_event; 8]>;

#[inline(always)]
pub fn waits(n: cl_uint, list: *const cl_event) -> ClResult<Waits> {
    if (n == 0) != list.is_null() {
        return Err(CL_INVALID_EVENT_WAIT_LIST);
    }
    let mut out = Waits::new();
    for i in 0..n as usize {
        // SAFETY: the application passes n events.
        let h = unsafe { *list.add(i) };
        let e = handle::get::<Event>(h.cast()).ok_or(CL_INVALID_EVENT_WAIT_LIST)?;
        out.push(e.base.vendor().cast());
    }
    Ok(out)
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clWaitForEvents(n: cl_uint, list: *const cl_event) -> cl_int {
    entry::status(false, || {
        if n == 0 || list.is_null() {
            return Err(CL_INVALID_VALUE);
        }
        let w = waits(n, list).map_err(|_| CL_INVALID_EVENT)?;
        // SAFETY: forwarding vendor events.
        check(unsafe { vfn!(w[0], clWaitForEvents)?(n, w.as_ptr()) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetEventInfo(
    e: cl_event,
    param: cl_event_info,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let ev = event_ref(e.cast())?;
        match param {
            CL_EVENT_COMMAND_QUEUE => {
                let h: *mut c_void = ev
                    .queue
                    .as_ref()
                    .map_or(std::ptr::null_mut(), |q| q.base.handle());
                write_info(bytes_of(&h), size, value, size_ret)
            }
            CL_EVENT_CONTEXT => write_info(
                bytes_of(&ev.context.base.handle::<c_void>()),
                size,
                value,
                size_ret,
            ),
            CL_EVENT_REFERENCE_COUNT => {
                write_info(bytes_of(&ev.base.app_refs()), size, value, size_ret)
            }
            CL_EVENT_COMMAND_TYPE => write_info(bytes_of(&ev.command_type), size, value, size_ret),
            _ => {
                let v = ev.base.vendor();
                // SAFETY: forwarding.
                check(unsafe { vfn!(v, clGetEventInfo)?(v.cast(), param, size, value, size_ret) })
            }
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateUserEvent(c: cl_context, errcode_ret: *mut cl_int) -> cl_event {
    entry::object(errcode_ret, || {
        let context = arc_of::<Context>(c.cast(), CL_INVALID_CONTEXT)?;
        let vc = context.base.vendor();
        let mut err = CL_SUCCESS;
        // SAFETY: vendor context.
        let v = unsafe { vfn!(vc, clCreateUserEvent)?(vc.cast(), &mut err) };
        check(err)?;
        Ok(publish(new_event(context, None, v.cast(), CL_COMMAND_USER)))
    })
}

/// Exempt from a quiescing gate: a suspend may be waiting for exactly this.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clSetUserEventStatus(e: cl_event, status: cl_int) -> cl_int {
    entry::status(true, || {
        let ev = event_ref(e.cast())?;
        if !ev.is_user() {
            return Err(CL_INVALID_EVENT);
        }
        if status > 0 {
            return Err(CL_INVALID_VALUE);
        }
        let v = ev.base.vendor();
        // SAFETY: forwarding.
        check(unsafe { vfn!(v, clSetUserEventStatus)?(v.cast(), status) })?;
        ev.user_status.store(status, Ordering::Release);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clSetEventCallback(
    e: cl_event,
    kind: cl_int,
    f: Option<unsafe extern "C" fn(cl_event, cl_int, *mut c_void)>,
    user_data: *mut c_void,
) -> cl_int {
    entry::status(true, || {
        let ev = event_ref(e.cast())?;
        let f = f.ok_or(CL_INVALID_VALUE)?;
        if !matches!(kind, CL_SUBMITTED | CL_RUNNING | CL_COMPLETE) {
            return Err(CL_INVALID_VALUE);
        }
        let cb = Arc::new(Callback {
            func: f as usize,
            user_data: user_data as usize,
            kind,
            fired: Default::default(),
            handle: e as usize,
        });
        check(crate::callbacks::register_event(ev.base.vendor(), &cb))?;
        ev.callbacks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(cb);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetEventProfilingInfo(
    e: cl_event,
    param: cl_profiling_info,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let ev = event_ref(e.cast())?;
        if let Some(saved) = *ev.profiling.lock().unwrap_or_else(|e| e.into_inner()) {
            let i = match param {
                CL_PROFILING_COMMAND_QUEUED => 0,
                CL_PROFILING_COMMAND_SUBMIT => 1,
                CL_PROFILING_COMMAND_START => 2,
                CL_PROFILING_COMMAND_END => 3,
                CL_PROFILING_COMMAND_COMPLETE => 4,
                _ => return Err(CL_INVALID_VALUE),
            };
            return write_info(bytes_of(&saved[i]), size, value, size_ret);
        }
        let v = ev.base.vendor();
        // SAFETY: forwarding.
        check(unsafe { vfn!(v, clGetEventProfilingInfo)?(v.cast(), param, size, value, size_ret) })
    })
}
