//! The C-facing entry points, one file per object family. Each validates crane's
//! handles, translates them to the vendor's, forwards, and records what a
//! rebuild needs. The functions are `unsafe extern "C"` because the caller (the
//! application) vouches for its pointers, as the OpenCL specification requires.
#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

pub mod context;
pub mod enqueue;
pub mod event;
pub mod interop;
pub mod kernel;
pub mod memory;
pub mod platform;
pub mod program;
pub mod queue;
pub mod sampler;
pub mod svm;

use std::ffi::c_void;

use opencl_sys::*;

use crate::entry::ClResult;
use crate::handle::{self, ClObject};
use crate::objects::*;

macro_rules! lookup {
    ($name:ident, $t:ty, $err:expr) => {
        #[inline(always)]
        pub fn $name<'a>(h: *const c_void) -> ClResult<&'a $t> {
            handle::get::<$t>(h).ok_or($err)
        }
    };
}
lookup!(platform_ref, Platform, CL_INVALID_PLATFORM);
lookup!(device_ref, Device, CL_INVALID_DEVICE);
lookup!(context_ref, Context, CL_INVALID_CONTEXT);
lookup!(queue_ref, Queue, CL_INVALID_COMMAND_QUEUE);
lookup!(mem_ref, Mem, CL_INVALID_MEM_OBJECT);
lookup!(sampler_ref, Sampler, CL_INVALID_SAMPLER);
lookup!(program_ref, Program, CL_INVALID_PROGRAM);
lookup!(kernel_ref, Kernel, CL_INVALID_KERNEL);
lookup!(event_ref, Event, CL_INVALID_EVENT);

/// clRetain*/clRelease* for objects whose retain and release only count the
/// application's references (queues flush on release and devices count only
/// sub-devices, so they have their own).
macro_rules! retain_release {
    ($($retain:ident, $release:ident, $h:ty, $lookup:ident;)*) => {$(
        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $retain(h: $h) -> cl_int {
            crate::entry::status(true, || {
                handle::app_retain($lookup(h.cast())?);
                Ok(())
            })
        }

        #[unsafe(no_mangle)]
        pub unsafe extern "C" fn $release(h: $h) -> cl_int {
            crate::entry::status(true, || {
                handle::app_release($lookup(h.cast())?);
                Ok(())
            })
        }
    )*};
}

retain_release! {
    clRetainContext, clReleaseContext, cl_context, context_ref;
    clRetainMemObject, clReleaseMemObject, cl_mem, mem_ref;
    clRetainSampler, clReleaseSampler, cl_sampler, sampler_ref;
    clRetainProgram, clReleaseProgram, cl_program, program_ref;
    clRetainKernel, clReleaseKernel, cl_kernel, kernel_ref;
    clRetainEvent, clReleaseEvent, cl_event, event_ref;
}

/// A strong reference to the object behind a handle.
pub fn arc_of<T: ClObject>(h: *const c_void, err: cl_int) -> ClResult<std::sync::Arc<T>> {
    handle::get_arc::<T>(h).ok_or(err)
}

/// The vendor object behind a crane handle, or `err`.
#[inline(always)]
pub fn vendor_of<T: ClObject>(h: *const c_void, err: cl_int) -> ClResult<*mut c_void> {
    let v = handle::get::<T>(h).ok_or(err)?.base().vendor();
    if v.is_null() { Err(err) } else { Ok(v) }
}

/// Translates an application device list to vendor devices plus crane's objects.
pub fn devices_of(
    n: cl_uint,
    list: *const cl_device_id,
) -> ClResult<(Vec<cl_device_id>, Vec<std::sync::Arc<Device>>)> {
    // "CL_INVALID_VALUE if device_list is NULL and num_devices is greater than
    // zero, or if device_list is not NULL and num_devices is zero."
    if (n == 0) != list.is_null() {
        return Err(CL_INVALID_VALUE);
    }
    let hs = crate::entry::slice(list, n as usize, CL_INVALID_VALUE)?;
    let mut v = Vec::with_capacity(hs.len());
    let mut a = Vec::with_capacity(hs.len());
    for &h in hs {
        let d = arc_of::<Device>(h.cast(), CL_INVALID_DEVICE)?;
        v.push(d.base.vendor().cast());
        a.push(d);
    }
    Ok((v, a))
}

/// Publishes a new object and returns the application's handle.
pub fn publish<T: ClObject, H>(obj: std::sync::Arc<T>) -> *mut H {
    handle::publish(obj).cast()
}
