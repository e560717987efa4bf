//! Vendor bugs crane works around, each narrowed to the versions that have
//! it (docs/architecture.md, "Vendor quirks").
//!
//! PoCL before 7.0 leaks a context reference per `CL_MEM_OBJECT_IMAGE1D_BUFFER`
//! image: clCreateImage retains the context for every image, and
//! clReleaseMemObject, destroying an image made from a buffer, releases the
//! buffer and returns without releasing the context (fixed upstream in 7.0,
//! "fix memleak with 1D Image buffers"; measured on Debian's PoCL 3.1: the
//! context's count stays one higher per such image). Natively that only
//! leaks the context; under crane it keeps PoCL's devices, and so its worker
//! threads, alive after a suspend, which is then not the complete unload it
//! must be. So crane counts, per vendor context, the images of that kind it
//! releases there, and gives the context those references back with its own
//! last one: exactly what PoCL leaked, nothing more.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Mutex;

use opencl_sys::*;

use crate::vendor::{self, vfn};

// The version tests are shared with crane-proxy, which works around the same
// leak for its sessions.
use crane_vendor_loader::quirks::leaks_image1d_buffer_context;
pub use crane_vendor_loader::quirks::pocl_major;

struct State {
    /// Per vendor dispatch table (by address): whether its library has the
    /// leak.
    leaky: Vec<(usize, bool)>,
    /// Per vendor context: the references its vendor leaked in it.
    leaked: BTreeMap<usize, u32>,
}

static STATE: Mutex<State> = Mutex::new(State {
    leaky: Vec::new(),
    leaked: BTreeMap::new(),
});

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// A vendor value of type `T` from a clGet*Info function.
///
/// # Safety
/// `f` must be the info function for `v`'s kind, `T` the parameter's type.
unsafe fn info<T: Copy + Default>(f: InfoFn, v: *mut c_void, param: cl_uint) -> Option<T> {
    let mut out = T::default();
    // SAFETY: the caller's contract; `out` holds size_of::<T>() bytes.
    let rc = unsafe {
        f(
            v,
            param,
            std::mem::size_of::<T>(),
            (&mut out as *mut T).cast(),
            std::ptr::null_mut(),
        )
    };
    (rc == CL_SUCCESS).then_some(out)
}

type InfoFn = unsafe extern "C" fn(*mut c_void, cl_uint, usize, *mut c_void, *mut usize) -> cl_int;

/// Casts a clGet*Info function to the common shape (they differ only in
/// their object's pointer type).
fn as_info<F: Copy>(f: F) -> InfoFn {
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<InfoFn>());
    // SAFETY: a function pointer of the same shape, see above.
    unsafe { std::mem::transmute_copy(&f) }
}

/// Whether the vendor library of this dispatch table (by address) has the
/// leak, where already asked.
fn known(key: usize) -> Option<bool> {
    state()
        .leaky
        .iter()
        .find(|(k, _)| *k == key)
        .map(|&(_, l)| l)
}

/// Whether the vendor of context `ctx` has the leak. Asked once per vendor
/// library; never for crane-proxy's objects (crane-proxy deals with its own
/// vendor).
///
/// # Safety
/// `ctx` must be a live vendor context.
unsafe fn leaky(ctx: *mut c_void) -> bool {
    // SAFETY: the caller's contract.
    let table = unsafe { vendor::disp(ctx) };
    if std::ptr::eq(table, &crate::remote::api::DISPATCH) {
        return false;
    }
    let key = table as *const _ as usize;
    if let Some(l) = known(key) {
        return l;
    }
    let version = (|| {
        let ci = as_info(vfn!(ctx, clGetContextInfo).ok()?);
        // SAFETY: a live context; one device is enough (all of a context's
        // devices come from one platform).
        let dev: cl_device_id = unsafe { info(ci, ctx, CL_CONTEXT_DEVICES) }?;
        if dev.is_null() {
            return None;
        }
        let di = as_info(vfn!(dev, clGetDeviceInfo).ok()?);
        // SAFETY: a live device of that context.
        let p: cl_platform_id = unsafe { info(di, dev.cast(), CL_DEVICE_PLATFORM) }?;
        vendor::info_string(p.cast(), |d| {
            d.clGetPlatformInfo.map(|f| (f, CL_PLATFORM_VERSION))
        })
    })();
    let l = version.as_deref().is_some_and(leaks_image1d_buffer_context);
    if l {
        crate::config::debug!(
            "vendor quirk: {} leaks a context reference per 1D image buffer; crane gives them back",
            version.unwrap_or_default()
        );
    }
    state().leaky.push((key, l));
    l
}

/// Gives back crane's reference to vendor memory object `v`, noting the
/// context reference its vendor leaks when it destroys it.
///
/// # Safety
/// `v` must be crane's reference to a live vendor memory object.
pub unsafe fn release_mem(v: *mut c_void) {
    // SAFETY: the caller's contract.
    let table = unsafe { vendor::disp(v) };
    let noted = (|| {
        // Nothing asked of vendors without the quirk (after the first
        // object of each), nor of crane-proxy's objects (a round trip each).
        if std::ptr::eq(table, &crate::remote::api::DISPATCH)
            || known(table as *const _ as usize) == Some(false)
        {
            return None;
        }
        let mi = as_info(table.clGetMemObjectInfo?);
        // SAFETY: a live memory object.
        let ctx: cl_context = unsafe { info(mi, v, CL_MEM_CONTEXT) }?;
        // SAFETY: the context of a live object is live.
        if ctx.is_null() || !unsafe { leaky(ctx.cast()) } {
            return None;
        }
        // SAFETY: as above.
        let ty: cl_mem_object_type = unsafe { info(mi, v, CL_MEM_TYPE) }?;
        (ty == CL_MEM_OBJECT_IMAGE1D_BUFFER).then_some(ctx as usize)
    })();
    if let Some(ctx) = noted {
        *state().leaked.entry(ctx).or_default() += 1;
    }
    // SAFETY: the caller's contract.
    unsafe { vendor::release(v, |d| d.clReleaseMemObject) };
}

/// Gives back crane's reference to vendor context `v`, the last crane holds,
/// with the references its vendor leaked in it (see the module's note).
///
/// # Safety
/// `v` must be crane's one reference to a live vendor context, nothing
/// crane made in it left.
pub unsafe fn release_context(v: *mut c_void) {
    let leaked = state().leaked.remove(&(v as usize)).unwrap_or(0);
    // Crane's own reference last: the context lives through the others.
    for _ in 0..leaked {
        // SAFETY: a reference the vendor took and never gave back.
        unsafe { vendor::release(v, |d| d.clReleaseContext) };
    }
    // SAFETY: the caller's contract.
    unsafe { vendor::release(v, |d| d.clReleaseContext) };
}

/// Forgets the vendor libraries (they are being unloaded: their tables'
/// addresses may be reused) and any leak noted in contexts not released.
pub fn forget() {
    let mut s = state();
    s.leaky.clear();
    s.leaked.clear();
}
