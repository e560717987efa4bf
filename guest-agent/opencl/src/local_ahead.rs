//! The move back from crane-proxy, prepared ahead (`cranectl local
//! --precopy`, docs/architecture.md "Pre-copy on the way back"): while the
//! application still runs on the proxy, the local vendor libraries are
//! opened (`vendor::preload`) and the application's contexts made on the
//! devices the move will put them on, so that the stop does not wait for
//! the driver (on NVIDIA a CUDA context: 110–140 ms on an H200).
//!
//! The rebuild takes a context made here only where the devices and
//! properties it would make it with are exactly these
//! ([`take`], from `api::context::vendor_create`); the load plans the
//! devices again, so a prediction that no longer holds costs only the
//! context made for nothing. What no rebuild took is released
//! ([`discard`]) before the libraries can close.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use crane_control::DeviceSpec;
use opencl_sys::*;

use crate::config::debug;
use crate::handle;
use crate::objects::Context;
use crate::vendor::{self, vfn};

/// A context made ahead: its vendor devices and properties (terminated, or
/// empty), as the rebuild would pass them.
struct Made {
    devices: Vec<usize>,
    props: Vec<cl_context_properties>,
    context: usize,
}

static MADE: Mutex<Vec<Made>> = Mutex::new(Vec::new());

fn made() -> std::sync::MutexGuard<'static, Vec<Made>> {
    MADE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Properties a context can be made with ahead: the platform and
/// `CL_CONTEXT_INTEROP_USER_SYNC` (others name objects of other APIs, such
/// as a GL context, that belong to the moment of the call).
fn plain(props: &[cl_context_properties]) -> bool {
    props.chunks(2).all(|kv| match kv {
        [0] | [] => true,
        [k, _] => {
            *k == CL_CONTEXT_PLATFORM as cl_context_properties
                || *k == CL_CONTEXT_INTEROP_USER_SYNC as cl_context_properties
        }
        _ => false,
    })
}

/// Opens the local vendor libraries and makes each of the application's
/// contexts there that can be made ahead (see [`plain`]; none with a
/// notification callback or on sub-devices); returns how many were made.
pub fn prepare(spec: Option<&DeviceSpec>) -> Result<usize, String> {
    discard();
    vendor::preload()?;
    let plan = vendor::plan_preloaded(spec)?;
    let mut n = 0;
    for c in handle::live::<Context>() {
        if c.notify.is_some() || !plain(&c.props) {
            continue;
        }
        let planned: Option<Vec<(cl_device_id, cl_platform_id)>> = c
            .devices
            .iter()
            .map(|d| {
                plan.iter()
                    .find(|(root, ..)| Arc::ptr_eq(root, d))
                    .map(|&(_, vd, vp)| (vd, vp))
            })
            .collect();
        let Some(planned) = planned.filter(|p| !p.is_empty()) else {
            continue;
        };
        let vp = planned[0].1;
        let mut props = c.props.clone();
        for kv in props.chunks_mut(2) {
            if let [k, v] = kv
                && *k == CL_CONTEXT_PLATFORM as cl_context_properties
            {
                *v = vp as cl_context_properties;
            }
        }
        let devices: Vec<cl_device_id> = planned.iter().map(|&(vd, _)| vd).collect();
        let Ok(f) = vfn!(devices[0].cast::<c_void>(), clCreateContext) else {
            continue;
        };
        let mut err = CL_SUCCESS;
        // SAFETY: live devices of an open vendor library, a terminated
        // property list with that library's platform (or NULL), no callback.
        let v = unsafe {
            f(
                if props.is_empty() {
                    std::ptr::null()
                } else {
                    props.as_ptr()
                },
                devices.len() as cl_uint,
                devices.as_ptr(),
                None,
                std::ptr::null_mut(),
                &mut err,
            )
        };
        if err != CL_SUCCESS || v.is_null() {
            debug!("a context made ahead failed with {err}: the move back makes it");
            continue;
        }
        made().push(Made {
            devices: devices.iter().map(|&d| d as usize).collect(),
            props,
            context: v as usize,
        });
        n += 1;
    }
    Ok(n)
}

/// A context made ahead on exactly `devices` with exactly `props`, taken
/// (each is given once).
pub fn take(devices: &[cl_device_id], props: &[cl_context_properties]) -> Option<*mut c_void> {
    let mut m = made();
    let i = m.iter().position(|x| {
        x.props == props
            && x.devices.len() == devices.len()
            && x.devices
                .iter()
                .zip(devices)
                .all(|(&a, &b)| a == b as usize)
    })?;
    Some(m.swap_remove(i).context as *mut c_void)
}

/// Whether contexts made ahead wait to be taken.
pub fn any() -> bool {
    !made().is_empty()
}

/// Releases the contexts no rebuild took (their library is still open:
/// preloaded, or loaded by the rebuild).
pub fn discard() {
    let left: Vec<Made> = std::mem::take(&mut *made());
    for m in left {
        // SAFETY: a context made in `prepare`, crane's one reference.
        unsafe { crate::quirks::release_context(m.context as *mut c_void) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_platform_and_user_sync_properties_are_made_ahead() {
        let p = CL_CONTEXT_PLATFORM as cl_context_properties;
        let sync = CL_CONTEXT_INTEROP_USER_SYNC as cl_context_properties;
        assert!(plain(&[]));
        assert!(plain(&[p, 0x1234, 0]));
        assert!(plain(&[p, 0x1234, sync, 1, 0]));
        // CL_GL_CONTEXT_KHR: a GL context of the moment.
        assert!(!plain(&[p, 0x1234, 0x2008, 0x99, 0]));
    }
}
