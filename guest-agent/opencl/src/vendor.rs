//! The vendor OpenCL libraries crane wraps: finding them, loading them, reaching
//! their functions through the ICD dispatch table of their objects, and
//! unloading them.

use std::ffi::{CStr, c_void};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crane_vendor_loader::{DevicePolicy, UnloadReport, VendorLibrary};
use opencl_sys::cl_icd::_cl_icd_dispatch;
use opencl_sys::*;

use crate::config::{self, debug};
use crate::entry::ClResult;
use crate::handle::{self, Base};
use crate::objects::{Device, Platform};

/// The dispatch table of a vendor object.
///
/// # Safety
/// `v` must be a live object of a loaded ICD vendor library.
#[inline(always)]
pub unsafe fn disp<'a>(v: *mut c_void) -> &'a _cl_icd_dispatch {
    // SAFETY: ICD objects start with a pointer to their dispatch table, which
    // lives as long as the vendor library is loaded (caller's contract).
    unsafe { &**(v as *const *const _cl_icd_dispatch) }
}

/// Looks up a vendor function from a vendor object, or fails with
/// CL_INVALID_OPERATION if the vendor lacks it.
macro_rules! vfn {
    ($v:expr, $f:ident) => {{
        let v = $v;
        if v.is_null() {
            Err(opencl_sys::CL_INVALID_OPERATION)
        } else {
            #[allow(unused_unsafe)]
            // SAFETY: `v` is the live vendor object behind a crane handle.
            let table = unsafe { $crate::vendor::disp(v.cast()) };
            table.$f.ok_or(opencl_sys::CL_INVALID_OPERATION)
        }
    }};
}
pub(crate) use vfn;

/// Turns a vendor status into a Result.
#[inline(always)]
pub fn check(code: cl_int) -> ClResult<()> {
    if code == CL_SUCCESS {
        Ok(())
    } else {
        Err(code)
    }
}

/// Gives back crane's reference to a vendor object.
///
/// # Safety
/// `v` must be a live vendor object and `sel` pick its release function.
pub unsafe fn release<F: Copy>(v: *mut c_void, sel: impl FnOnce(&_cl_icd_dispatch) -> Option<F>) {
    type Release = unsafe extern "C" fn(*mut c_void) -> cl_int;
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<Release>());
    // SAFETY: caller's contract.
    if let Some(f) = sel(unsafe { disp(v) }) {
        // SAFETY: every clRelease* takes one object pointer and returns cl_int;
        // only the pointee type of the object differs.
        let f: Release = unsafe { std::mem::transmute_copy(&f) };
        // SAFETY: as above.
        unsafe { f(v) };
    }
}

struct Loaded {
    lib: VendorLibrary,
    platforms: Vec<cl_platform_id>,
}

// SAFETY: platform ids are vendor handles, valid from any thread.
unsafe impl Send for Loaded {}

struct State {
    /// The vendor libraries in use, fixed at first load.
    paths: Option<Vec<PathBuf>>,
    loaded: Vec<Option<Loaded>>,
    /// crane's platform objects, created at first load and kept for the life of
    /// the process.
    platforms: Vec<Arc<Platform>>,
    /// Root devices per platform (index into `platforms`), created on demand.
    devices: Vec<Vec<Arc<Device>>>,
}

static STATE: Mutex<State> = Mutex::new(State {
    paths: None,
    loaded: Vec::new(),
    platforms: Vec::new(),
    devices: Vec::new(),
});

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The path of this library, so that discovery does not wrap crane itself.
pub(crate) fn own_path() -> Option<PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr fills `info` for an address inside a loaded object.
    let ok = unsafe { libc::dladdr(own_path as *const c_void, info.as_mut_ptr()) };
    if ok == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so dli_fname is a valid C string (or null).
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: checked non-null above.
    let p = unsafe { CStr::from_ptr(info.dli_fname) };
    std::fs::canonicalize(Path::new(std::str::from_utf8(p.to_bytes()).ok()?)).ok()
}

fn is_crane(path: &str, own: Option<&Path>) -> bool {
    if path.contains("crane_opencl") {
        return true;
    }
    let resolved = if path.contains('/') {
        std::fs::canonicalize(path).ok()
    } else {
        None
    };
    matches!((resolved, own), (Some(a), Some(b)) if a == b)
}

/// The vendor libraries to wrap: `CRANE_VENDOR`, else `OCL_ICD_FILENAMES`, else
/// the ICD files in `OCL_ICD_VENDORS` (or /etc/OpenCL/vendors) and
/// /etc/crane/vendors.d, skipping crane's own entry.
pub fn discover() -> Vec<PathBuf> {
    let own = own_path();
    let keep = |s: &str| !s.is_empty() && !is_crane(s, own.as_deref());
    if let Some(v) = &config::get().vendor_override {
        return v
            .split(':')
            .filter(|s| keep(s))
            .map(PathBuf::from)
            .collect();
    }
    if let Ok(v) = std::env::var("OCL_ICD_FILENAMES") {
        let list: Vec<PathBuf> = v
            .split(':')
            .filter(|s| keep(s))
            .map(PathBuf::from)
            .collect();
        if !list.is_empty() {
            return list;
        }
    }
    let dirs = [
        std::env::var_os("OCL_ICD_VENDORS")
            .map_or_else(|| PathBuf::from("/etc/OpenCL/vendors"), PathBuf::from),
        PathBuf::from("/etc/crane/vendors.d"),
    ];
    let mut out = Vec::new();
    for dir in dirs {
        let Ok(rd) = std::fs::read_dir(&dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "icd"))
            .collect();
        files.sort();
        for f in files {
            if let Ok(s) = std::fs::read_to_string(&f) {
                let lib = s.lines().next().unwrap_or("").trim().to_string();
                if keep(&lib) && !out.iter().any(|p: &PathBuf| p.as_os_str() == lib.as_str()) {
                    out.push(PathBuf::from(lib));
                }
            }
        }
    }
    out
}

type GetPlatformIds = unsafe extern "C" fn(cl_uint, *mut cl_platform_id, *mut cl_uint) -> cl_int;
type GetExtAddr = unsafe extern "C" fn(*const std::ffi::c_char) -> *mut c_void;

fn open_vendor(path: &Path) -> Result<Loaded, String> {
    let lib = VendorLibrary::open(path).map_err(|e| e.to_string())?;
    let name = c"clIcdGetPlatformIDsKHR";
    let entry = match lib.symbol(name) {
        Some(p) => p.as_ptr(),
        None => {
            let gea = lib
                .symbol(c"clGetExtensionFunctionAddress")
                .ok_or_else(|| format!("{} exports neither clIcdGetPlatformIDsKHR nor clGetExtensionFunctionAddress", path.display()))?;
            // SAFETY: the symbol is clGetExtensionFunctionAddress of an ICD vendor.
            let gea: GetExtAddr =
                unsafe { std::mem::transmute::<*mut c_void, GetExtAddr>(gea.as_ptr()) };
            // SAFETY: a valid C string.
            unsafe { gea(name.as_ptr()) }
        }
    };
    if entry.is_null() {
        return Err(format!(
            "{} does not provide clIcdGetPlatformIDsKHR",
            path.display()
        ));
    }
    // SAFETY: clIcdGetPlatformIDsKHR has the clGetPlatformIDs signature.
    let get: GetPlatformIds = unsafe { std::mem::transmute::<*mut c_void, GetPlatformIds>(entry) };
    let mut n: cl_uint = 0;
    // SAFETY: count query with a valid out-pointer.
    let rc = unsafe { get(0, std::ptr::null_mut(), &mut n) };
    if rc != CL_SUCCESS && rc != CL_PLATFORM_NOT_FOUND_KHR {
        return Err(format!(
            "{}: clIcdGetPlatformIDsKHR failed with {rc}",
            path.display()
        ));
    }
    let mut platforms = vec![std::ptr::null_mut(); n as usize];
    if n > 0 {
        // SAFETY: `platforms` holds n entries.
        check(unsafe { get(n, platforms.as_mut_ptr(), std::ptr::null_mut()) })
            .map_err(|e| format!("{}: clIcdGetPlatformIDsKHR failed with {e}", path.display()))?;
    }
    Ok(Loaded { lib, platforms })
}

fn platform_name(v: cl_platform_id) -> String {
    info_string(v, |d| d.clGetPlatformInfo.map(|f| (f, CL_PLATFORM_NAME))).unwrap_or_default()
}

type InfoFn = unsafe extern "C" fn(*mut c_void, cl_uint, usize, *mut c_void, *mut usize) -> cl_int;

/// A string-valued info query on a vendor object.
pub fn info_string<F>(
    v: *mut c_void,
    sel: impl FnOnce(&_cl_icd_dispatch) -> Option<(F, cl_uint)>,
) -> Option<String>
where
    F: Copy,
{
    // SAFETY: `v` is a live vendor object.
    let (f, param) = sel(unsafe { disp(v) })?;
    assert_eq!(std::mem::size_of::<F>(), std::mem::size_of::<InfoFn>());
    // SAFETY: every clGet*Info function has this shape (object, param, size,
    // value, size_ret), differing only in the object's pointer type.
    let f: InfoFn = unsafe { std::mem::transmute_copy(&f) };
    let mut n = 0usize;
    // SAFETY: size query.
    if unsafe { f(v, param, 0, std::ptr::null_mut(), &mut n) } != CL_SUCCESS {
        return None;
    }
    let mut buf = vec![0u8; n];
    // SAFETY: `buf` holds n bytes.
    if unsafe { f(v, param, n, buf.as_mut_ptr().cast(), std::ptr::null_mut()) } != CL_SUCCESS {
        return None;
    }
    Some(
        CStr::from_bytes_until_nul(&buf)
            .ok()?
            .to_string_lossy()
            .into_owned(),
    )
}

/// Loads the vendor libraries (first time: discovers them and creates crane's
/// platform objects; later: reloads them and re-points every platform and root
/// device at the new vendor objects).
pub fn load() -> ClResult<()> {
    let mut st = state();
    if !st.loaded.is_empty() {
        return Ok(());
    }
    let first = st.paths.is_none();
    let paths = st.paths.get_or_insert_with(discover).clone();
    debug!("loading vendors {paths:?}");
    let mut loaded = Vec::new();
    for p in &paths {
        match open_vendor(p) {
            Ok(l) => loaded.push(Some(l)),
            Err(e) => {
                debug!("vendor {}: {e}", p.display());
                if !first
                    && st
                        .platforms
                        .iter()
                        .any(|pl| pl.vendor_index == loaded.len())
                {
                    drop(loaded);
                    return Err(CL_DEVICE_NOT_AVAILABLE);
                }
                loaded.push(None);
            }
        }
    }
    if first {
        for (vi, l) in loaded.iter().enumerate() {
            let Some(l) = l else { continue };
            for (i, &vp) in l.platforms.iter().enumerate() {
                let p = Arc::new(Platform {
                    base: Base::new(vp.cast()),
                    vendor_index: vi,
                    index: i,
                    name: platform_name(vp),
                });
                handle::publish(p.clone());
                st.platforms.push(p);
                st.devices.push(Vec::new());
            }
        }
    } else {
        for p in &st.platforms {
            let vp = loaded[p.vendor_index]
                .as_ref()
                .and_then(|l| l.platforms.get(p.index))
                .copied();
            let Some(vp) = vp else {
                return Err(CL_DEVICE_NOT_AVAILABLE);
            };
            let name = platform_name(vp);
            if name != p.name {
                debug!("platform {} is now {name}", p.name);
                return Err(CL_DEVICE_NOT_AVAILABLE);
            }
            p.base.set_vendor(vp.cast());
        }
        // Re-point root devices.
        for (pi, devs) in st.devices.iter().enumerate() {
            if devs.is_empty() {
                continue;
            }
            let now = vendor_devices(st.platforms[pi].base.vendor().cast())?;
            if now.len() < devs.len() {
                return Err(CL_DEVICE_NOT_FOUND);
            }
            for (d, &v) in devs.iter().zip(&now) {
                d.base.set_vendor(v.cast());
            }
        }
    }
    st.loaded = loaded;
    Ok(())
}

fn vendor_devices(vp: cl_platform_id) -> ClResult<Vec<cl_device_id>> {
    let f = vfn!(vp, clGetDeviceIDs)?;
    let mut n = 0;
    // SAFETY: count query on a live vendor platform.
    let rc = unsafe { f(vp, CL_DEVICE_TYPE_ALL, 0, std::ptr::null_mut(), &mut n) };
    if rc == CL_DEVICE_NOT_FOUND {
        return Ok(Vec::new());
    }
    check(rc)?;
    let mut v = vec![std::ptr::null_mut(); n as usize];
    // SAFETY: `v` holds n entries.
    check(unsafe {
        f(
            vp,
            CL_DEVICE_TYPE_ALL,
            n,
            v.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    })?;
    Ok(v)
}

/// crane's platforms, loading the vendors on first use.
pub fn platforms() -> ClResult<Vec<Arc<Platform>>> {
    load()?;
    Ok(state().platforms.clone())
}

/// crane's root devices of a platform.
pub fn root_devices(p: &Arc<Platform>) -> ClResult<Vec<Arc<Device>>> {
    let mut st = state();
    let pi = st
        .platforms
        .iter()
        .position(|q| Arc::ptr_eq(q, p))
        .ok_or(CL_INVALID_PLATFORM)?;
    if st.devices[pi].is_empty() {
        let vs = vendor_devices(p.base.vendor().cast())?;
        let devs: Vec<Arc<Device>> = vs
            .iter()
            .enumerate()
            .map(|(i, &v)| {
                let name =
                    info_string(v.cast(), |d| d.clGetDeviceInfo.map(|f| (f, CL_DEVICE_NAME)))
                        .unwrap_or_default();
                let d = Arc::new(Device {
                    base: Base::new(v.cast()),
                    platform: p.clone(),
                    parent: None,
                    index: i,
                    partition: Vec::new(),
                    name,
                });
                handle::publish(d.clone());
                d
            })
            .collect();
        st.devices[pi] = devs;
    }
    Ok(st.devices[pi].clone())
}

/// Unloads every vendor library. Crane's platform and device handles stay; their
/// vendor pointers are cleared.
pub fn unload(policy: &DevicePolicy) -> Vec<Result<UnloadReport, String>> {
    let mut st = state();
    for p in &st.platforms {
        p.base.take_vendor();
    }
    for d in st.devices.iter().flatten() {
        d.base.take_vendor();
    }
    let loaded = std::mem::take(&mut st.loaded);
    loaded
        .into_iter()
        .flatten()
        .map(|l| l.lib.close(policy).map_err(|e| e.to_string()))
        .collect()
}

pub fn is_loaded() -> bool {
    !state().loaded.is_empty()
}

pub fn loaded_paths() -> Vec<PathBuf> {
    state()
        .loaded
        .iter()
        .flatten()
        .map(|l| l.lib.path().to_path_buf())
        .collect()
}
