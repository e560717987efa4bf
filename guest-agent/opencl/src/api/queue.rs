//! Command queues.

use std::ffi::c_void;
use std::sync::Arc;

use opencl_sys::*;

use super::*;
use crate::entry::{self, ClResult, bytes_of, write_info};
use crate::handle::Base;
use crate::vendor::{check, vfn};

/// Creates the vendor queue for a crane queue (first creation and resume).
pub fn vendor_create(q: &Queue) -> ClResult<*mut c_void> {
    let vc = q.context.base.vendor();
    let vd = q.device.base.vendor();
    let mut err = CL_SUCCESS;
    let v = match q.legacy_props {
        Some(p) => {
            // SAFETY: vendor context and device.
            #[allow(deprecated)]
            unsafe {
                vfn!(vc, clCreateCommandQueue)?(vc.cast(), vd.cast(), p, &mut err)
            }
        }
        // SAFETY: vendor context, device and a zero-terminated property list.
        None => unsafe {
            vfn!(vc, clCreateCommandQueueWithProperties)?(
                vc.cast(),
                vd.cast(),
                if q.props.is_empty() {
                    std::ptr::null()
                } else {
                    q.props.as_ptr()
                },
                &mut err,
            )
        },
    };
    check(err)?;
    let set = *q.set_props.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(now) = set {
        // The queue as clSetCommandQueueProperty left it (resume).
        let was = q.properties();
        let mut old = 0;
        for (bits, enable) in [(now & !was, CL_TRUE), (was & !now, CL_FALSE)] {
            if bits != 0 {
                // SAFETY: the vendor queue just made.
                #[allow(deprecated)]
                let rc = unsafe {
                    vfn!(v, clSetCommandQueueProperty)?(v.cast(), bits, enable, &mut old)
                };
                if let Err(e) = check(rc) {
                    // SAFETY: the queue just made, not handed out.
                    unsafe { crate::vendor::release(v.cast(), |t| t.clReleaseCommandQueue) };
                    return Err(e);
                }
            }
        }
    }
    Ok(v.cast())
}

fn create(
    c: cl_context,
    d: cl_device_id,
    legacy: Option<cl_command_queue_properties>,
    props: Vec<cl_queue_properties>,
) -> ClResult<cl_command_queue> {
    let context = arc_of::<Context>(c.cast(), CL_INVALID_CONTEXT)?;
    let device = arc_of::<Device>(d.cast(), CL_INVALID_DEVICE)?;
    if !context.devices.iter().any(|x| Arc::ptr_eq(x, &device)) {
        return Err(CL_INVALID_DEVICE);
    }
    let q = Queue {
        base: Base::new(std::ptr::null_mut()),
        context,
        device,
        props,
        legacy_props: legacy,
        set_props: std::sync::Mutex::new(None),
    };
    q.base.set_vendor(vendor_create(&q)?);
    Ok(publish(Arc::new(q)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateCommandQueue(
    c: cl_context,
    d: cl_device_id,
    props: cl_command_queue_properties,
    errcode_ret: *mut cl_int,
) -> cl_command_queue {
    entry::object(errcode_ret, || create(c, d, Some(props), Vec::new()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateCommandQueueWithProperties(
    c: cl_context,
    d: cl_device_id,
    props: *const cl_queue_properties,
    errcode_ret: *mut cl_int,
) -> cl_command_queue {
    entry::object(errcode_ret, || create(c, d, None, entry::read_props(props)))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clRetainCommandQueue(q: cl_command_queue) -> cl_int {
    entry::status(true, || {
        handle::app_retain(queue_ref(q.cast())?);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clReleaseCommandQueue(q: cl_command_queue) -> cl_int {
    entry::status(true, || {
        let queue = queue_ref(q.cast())?;
        // OpenCL: releasing a queue flushes it.
        let v = queue.base.vendor();
        if queue.base.app_refs() == 1 && !v.is_null() {
            // SAFETY: live vendor queue.
            unsafe { vfn!(v, clFlush)?(v.cast()) };
        }
        handle::app_release(queue);
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetCommandQueueInfo(
    q: cl_command_queue,
    param: cl_command_queue_info,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let queue = queue_ref(q.cast())?;
        match param {
            CL_QUEUE_CONTEXT => write_info(
                bytes_of(&queue.context.base.handle::<c_void>()),
                size,
                value,
                size_ret,
            ),
            CL_QUEUE_DEVICE => write_info(
                bytes_of(&queue.device.base.handle::<c_void>()),
                size,
                value,
                size_ret,
            ),
            CL_QUEUE_REFERENCE_COUNT => {
                write_info(bytes_of(&queue.base.app_refs()), size, value, size_ret)
            }
            CL_QUEUE_DEVICE_DEFAULT => {
                let v = queue.base.vendor();
                let mut vq: *mut c_void = std::ptr::null_mut();
                // SAFETY: the vendor writes one queue handle.
                check(unsafe {
                    vfn!(v, clGetCommandQueueInfo)?(
                        v.cast(),
                        param,
                        std::mem::size_of::<*mut c_void>(),
                        (&raw mut vq).cast(),
                        std::ptr::null_mut(),
                    )
                })?;
                let h = handle::live::<Queue>()
                    .into_iter()
                    .find(|x| x.base.vendor() == vq)
                    .map_or(std::ptr::null_mut(), |x| x.base.handle::<c_void>());
                write_info(bytes_of(&h), size, value, size_ret)
            }
            _ => {
                let v = queue.base.vendor();
                // SAFETY: forwarding.
                check(unsafe {
                    vfn!(v, clGetCommandQueueInfo)?(v.cast(), param, size, value, size_ret)
                })
            }
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clSetCommandQueueProperty(
    q: cl_command_queue,
    props: cl_command_queue_properties,
    enable: cl_bool,
    old_ret: *mut cl_command_queue_properties,
) -> cl_int {
    // Deprecated since OpenCL 1.1: the vendor decides (NVIDIA carries it
    // out, others answer CL_INVALID_OPERATION); what it leaves the queue
    // with is kept so that the queue is created the same way again.
    entry::status(false, || {
        let queue = queue_ref(q.cast())?;
        let v = queue.base.vendor();
        let mut set = queue.set_props.lock().unwrap_or_else(|e| e.into_inner());
        let mut old = 0;
        // SAFETY: live vendor queue; `old` is one value.
        #[allow(deprecated)]
        check(unsafe { vfn!(v, clSetCommandQueueProperty)?(v.cast(), props, enable, &mut old) })?;
        if !old_ret.is_null() {
            // SAFETY: the application's out-parameter, one value.
            unsafe { *old_ret = old };
        }
        *set = Some(if enable != CL_FALSE {
            old | props
        } else {
            old & !props
        });
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clSetDefaultDeviceCommandQueue(
    c: cl_context,
    d: cl_device_id,
    q: cl_command_queue,
) -> cl_int {
    entry::status(false, || {
        let vc = vendor_of::<Context>(c.cast(), CL_INVALID_CONTEXT)?;
        let vd = vendor_of::<Device>(d.cast(), CL_INVALID_DEVICE)?;
        // A null queue goes to the vendor as null: whether it first answers
        // for the queue or for the device's lack of a replaceable default
        // device queue (CL_INVALID_OPERATION) is the vendor's order.
        let vq = if q.is_null() {
            std::ptr::null_mut()
        } else {
            vendor_of::<Queue>(q.cast(), CL_INVALID_COMMAND_QUEUE)?
        };
        // SAFETY: forwarding vendor objects.
        check(unsafe { vfn!(vc, clSetDefaultDeviceCommandQueue)?(vc.cast(), vd.cast(), vq.cast()) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clFlush(q: cl_command_queue) -> cl_int {
    entry::status(false, || {
        let v = vendor_of::<Queue>(q.cast(), CL_INVALID_COMMAND_QUEUE)?;
        // SAFETY: forwarding.
        check(unsafe { vfn!(v, clFlush)?(v.cast()) })
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clFinish(q: cl_command_queue) -> cl_int {
    entry::status(false, || {
        let v = vendor_of::<Queue>(q.cast(), CL_INVALID_COMMAND_QUEUE)?;
        // SAFETY: forwarding.
        check(unsafe { vfn!(v, clFinish)?(v.cast()) })
    })
}
