//! Contexts.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use opencl_sys::*;

use super::*;
use crate::entry::{self, ClResult, bytes_of, bytes_of_slice, write_info};
use crate::handle::Base;
use crate::vendor::{self, check, vfn};

/// The property list with crane's platform handle replaced by the vendor's.
fn vendor_props(props: &[cl_context_properties]) -> ClResult<Vec<cl_context_properties>> {
    let mut out = props.to_vec();
    let mut i = 0;
    while i + 1 < out.len() {
        if out[i] == CL_CONTEXT_PLATFORM as cl_context_properties {
            out[i + 1] = vendor_of::<Platform>(out[i + 1] as *const c_void, CL_INVALID_PLATFORM)?
                as cl_context_properties;
        }
        i += 2;
    }
    Ok(out)
}

fn props_platform(props: &[cl_context_properties]) -> ClResult<Option<Arc<Platform>>> {
    let mut i = 0;
    while i + 1 < props.len() {
        if props[i] == CL_CONTEXT_PLATFORM as cl_context_properties {
            return Ok(Some(arc_of::<Platform>(
                props[i + 1] as *const c_void,
                CL_INVALID_PLATFORM,
            )?));
        }
        i += 2;
    }
    Ok(None)
}

/// Creates the vendor context for a crane context (first creation and resume).
pub fn vendor_create(c: &Context) -> ClResult<*mut c_void> {
    for d in &c.devices {
        d.root()
            .used
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }
    let vprops = vendor_props(&c.props)?;
    let vdevs: Vec<cl_device_id> = c.devices.iter().map(|d| d.base.vendor().cast()).collect();
    let first = *vdevs.first().ok_or(CL_INVALID_VALUE)?;
    // Made ahead by a move back from crane-proxy on exactly these devices
    // with exactly these properties (`crate::local_ahead`).
    if c.notify.is_none()
        && let Some(v) = crate::local_ahead::take(&vdevs, &vprops)
    {
        return Ok(v);
    }
    let f = vfn!(first, clCreateContext)?;
    let mut err = CL_SUCCESS;
    // SAFETY: vendor devices and a zero-terminated property list (or null).
    let v = unsafe {
        f(
            if vprops.is_empty() {
                std::ptr::null()
            } else {
                vprops.as_ptr()
            },
            vdevs.len() as cl_uint,
            vdevs.as_ptr(),
            c.notify,
            c.notify_data as *mut c_void,
            &mut err,
        )
    };
    check(err)?;
    Ok(v.cast())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateContext(
    props: *const cl_context_properties,
    n: cl_uint,
    devices: *const cl_device_id,
    notify: crate::objects::ContextNotify,
    user_data: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_context {
    entry::object(errcode_ret, || {
        if n == 0 || devices.is_null() || (notify.is_none() && !user_data.is_null()) {
            return Err(CL_INVALID_VALUE);
        }
        let props = entry::read_props(props);
        let (_, devs) = devices_of(n, devices)?;
        let platform = match props_platform(&props)? {
            Some(p) => p,
            None => devs[0].platform.clone(),
        };
        if devs.iter().any(|d| !Arc::ptr_eq(&d.platform, &platform)) {
            return Err(CL_INVALID_DEVICE);
        }
        let c = Context {
            base: Base::new(std::ptr::null_mut()),
            props,
            platform,
            devices: devs,
            notify,
            notify_data: user_data as usize,
            destructors: Mutex::new(Vec::new()),
            staging: Default::default(),
        };
        c.base.set_vendor(vendor_create(&c)?);
        Ok(publish(Arc::new(c)))
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clCreateContextFromType(
    props: *const cl_context_properties,
    ty: cl_device_type,
    notify: crate::objects::ContextNotify,
    user_data: *mut c_void,
    errcode_ret: *mut cl_int,
) -> cl_context {
    entry::object(errcode_ret, || {
        let p = entry::read_props(props);
        let platform = match props_platform(&p)? {
            Some(p) => p,
            // "CL_INVALID_PLATFORM if properties is NULL and no platform could
            // be selected or if platform value specified in properties is not
            // a valid platform." Which platform a list without
            // CL_CONTEXT_PLATFORM selects is up to the ICD loader; ocl-icd
            // selects none and answers CL_INVALID_PLATFORM, so crane does too.
            None if !props.is_null() => return Err(CL_INVALID_PLATFORM),
            None => vendor::platforms()?
                .into_iter()
                .next()
                .ok_or(CL_INVALID_PLATFORM)?,
        };
        // "CL_INVALID_DEVICE_TYPE if device_type is not a valid value."
        if ty == 0 {
            return Err(CL_INVALID_DEVICE_TYPE);
        }
        let mut ids: [cl_device_id; 64] = [std::ptr::null_mut(); 64];
        let mut n = 0;
        // SAFETY: a crane platform handle and room for 64 devices.
        let rc = unsafe {
            super::platform::clGetDeviceIDs(
                platform.base.handle(),
                ty,
                64,
                ids.as_mut_ptr(),
                &mut n,
            )
        };
        check(if rc == CL_DEVICE_NOT_FOUND {
            CL_DEVICE_NOT_FOUND
        } else {
            rc
        })?;
        let mut err = CL_SUCCESS;
        // SAFETY: crane's own entry point with valid arguments; nested calls pass the gate.
        let c =
            unsafe { clCreateContext(props, n.min(64), ids.as_ptr(), notify, user_data, &mut err) };
        check(err)?;
        Ok(c)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn clGetContextInfo(
    c: cl_context,
    param: cl_context_info,
    size: usize,
    value: *mut c_void,
    size_ret: *mut usize,
) -> cl_int {
    entry::status(false, || {
        let ctx = context_ref(c.cast())?;
        match param {
            CL_CONTEXT_REFERENCE_COUNT => {
                write_info(bytes_of(&ctx.base.app_refs()), size, value, size_ret)
            }
            CL_CONTEXT_DEVICES => {
                let hs: Vec<cl_device_id> = ctx.devices.iter().map(|d| d.base.handle()).collect();
                write_info(bytes_of_slice(&hs), size, value, size_ret)
            }
            CL_CONTEXT_NUM_DEVICES => write_info(
                bytes_of(&(ctx.devices.len() as cl_uint)),
                size,
                value,
                size_ret,
            ),
            CL_CONTEXT_PROPERTIES => write_info(bytes_of_slice(&ctx.props), size, value, size_ret),
            _ => {
                let v = ctx.base.vendor();
                // SAFETY: forwarding.
                check(unsafe { vfn!(v, clGetContextInfo)?(v.cast(), param, size, value, size_ret) })
            }
        }
    })
}

type DestructorFn = Option<unsafe extern "C" fn(cl_context, *mut c_void)>;

/// Context destructor callbacks are kept by crane and called when the
/// application's context really goes away, not when crane releases the vendor's
/// context at suspend.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn clSetContextDestructorCallback(
    c: cl_context,
    f: DestructorFn,
    user_data: *mut c_void,
) -> cl_int {
    entry::status(false, || {
        let ctx = context_ref(c.cast())?;
        let f = f.ok_or(CL_INVALID_VALUE)?;
        ctx.destructors
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::new(Callback {
                func: f as usize,
                user_data: user_data as usize,
                kind: 0,
                fired: Default::default(),
                handle: c as usize,
            }));
        Ok(())
    })
}

/// When the application's context finally goes, its destructor callbacks are
/// handed to the vendor so that they run when the vendor really frees it.
pub fn before_release(c: &Context, v: *mut c_void) {
    let list = std::mem::take(&mut *c.destructors.lock().unwrap_or_else(|e| e.into_inner()));
    crate::callbacks::hand_over_destructors(list, v, |d| {
        d.clSetContextDestructorCallback.map(|f| f as usize)
    });
}
