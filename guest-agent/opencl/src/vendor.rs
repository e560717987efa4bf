//! The vendor OpenCL libraries crane wraps: finding them, loading them, reaching
//! their functions through the ICD dispatch table of their objects, and
//! unloading them.

use std::ffi::{CStr, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crane_vendor_loader::{DevicePolicy, UnloadReport, VendorLibrary};
use opencl_sys::cl_icd::_cl_icd_dispatch;
use opencl_sys::*;

use crate::config::{self, debug, warn};
use crate::entry::ClResult;
use crate::handle::{self, Base};
use crate::objects::{Device, DeviceId, Platform};
use crate::remote;
use crane_control::{DeviceFacts, DeviceSpec};

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

/// Where a loaded "vendor" lives.
enum Backend {
    /// A vendor library in this process.
    Native(VendorLibrary),
    /// crane-proxy, reached over the wire protocol (see `remote`).
    Remote(Arc<remote::Session>),
}

struct Loaded {
    backend: Backend,
    platforms: Vec<cl_platform_id>,
}

/// Where the next `load` takes the process's OpenCL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// The vendor libraries on this machine.
    Local,
    /// crane-proxy at `addr` (`tcp://HOST:PORT` or `unix:/path`).
    Remote { addr: String, token: String },
}

// SAFETY: platform ids are vendor handles, valid from any thread.
unsafe impl Send for Loaded {}

struct State {
    target: Option<Target>,
    /// Why the last `load` failed, when there is more to say than an error
    /// code (for the control socket's answer).
    load_error: Option<String>,
    /// The vendor libraries in use, fixed at first load.
    paths: Option<Vec<PathBuf>>,
    loaded: Vec<Option<Loaded>>,
    /// crane's platform objects, created at first load and kept for the life of
    /// the process.
    platforms: Vec<Arc<Platform>>,
    /// Root devices per platform (index into `platforms`), created on demand.
    devices: Vec<Vec<Arc<Device>>>,
    /// Where the process's devices go at the next load (None: where they are).
    spec: Option<DeviceSpec>,
    /// The devices the last load put behind another physical device.
    moved: Vec<Moved>,
}

/// A root device the last load moved onto another physical device.
pub struct Moved {
    pub device: Arc<Device>,
    pub from: DeviceId,
}

static STATE: Mutex<State> = Mutex::new(State {
    target: None,
    load_error: None,
    paths: None,
    loaded: Vec::new(),
    platforms: Vec::new(),
    devices: Vec::new(),
    spec: None,
    moved: Vec::new(),
});

fn state() -> std::sync::MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(|e| e.into_inner())
}

/// The file of the loaded object that holds `addr`, as the dynamic linker
/// names it.
fn object_file(addr: *const c_void) -> Option<PathBuf> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: dladdr fills `info` for an address inside a loaded object.
    if unsafe { libc::dladdr(addr, info.as_mut_ptr()) } == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so dli_fname is a valid C string (or null).
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: checked non-null above.
    let p = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(p.to_bytes())))
}

/// The path of this library, so that discovery does not wrap crane itself.
pub(crate) fn own_path() -> Option<PathBuf> {
    std::fs::canonicalize(object_file(own_path as *const c_void)?).ok()
}

/// Symbol `name` of an already loaded `libOpenCL.so.1` (null if none is
/// loaded or it lacks the symbol), found even where the application opened
/// it with `RTLD_LOCAL`.
fn loaded_libopencl_symbol(name: &CStr) -> *mut c_void {
    // SAFETY: RTLD_NOLOAD only looks up an object already loaded.
    let h = unsafe {
        libc::dlopen(
            c"libOpenCL.so.1".as_ptr(),
            libc::RTLD_LAZY | libc::RTLD_NOLOAD,
        )
    };
    if h.is_null() {
        return std::ptr::null_mut();
    }
    // SAFETY: `h` is a live handle; dlclose drops the reference RTLD_NOLOAD took.
    let p = unsafe { libc::dlsym(h, name.as_ptr()) };
    // SAFETY: as above.
    unsafe { libc::dlclose(h) };
    p
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

/// Whether crane was loaded as an ICD behind an ICD loader (ICD mode). The
/// application's OpenCL calls then bind to another library's `clGetPlatformIDs`:
/// the loader's, found in the global scope, or, where the application opened
/// the loader with `RTLD_LOCAL`, in the loaded `libOpenCL.so.1`. Preloaded or
/// standing in for `libOpenCL.so.1`, crane's own comes first.
pub fn behind_icd_loader() -> bool {
    let ours = crate::api::platform::clGetPlatformIDs as *mut c_void;
    let name = c"clGetPlatformIDs";
    // SAFETY: dlsym with the RTLD_DEFAULT pseudo-handle and a C string.
    let global = unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) };
    if !global.is_null() {
        return global != ours;
    }
    let theirs = loaded_libopencl_symbol(name);
    !theirs.is_null() && theirs != ours
}

/// The library named on the first line of an ICD file.
fn icd_library(file: &Path) -> Option<String> {
    let s = std::fs::read_to_string(file).ok()?;
    let lib = s.lines().next()?.trim();
    (!lib.is_empty()).then(|| lib.to_string())
}

/// The libraries named by the `.icd` files of a directory, in file-name order.
fn icd_dir(dir: &Path) -> Vec<String> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "icd"))
        .collect();
    files.sort();
    files.iter().filter_map(|f| icd_library(f)).collect()
}

/// What ocl-icd would load from `OCL_ICD_VENDORS`: the `.icd` files of a
/// directory, the one library an `.icd` file names, or a library.
fn ocl_icd_vendors(v: &std::ffi::OsStr) -> Vec<String> {
    let p = Path::new(v);
    if p.is_dir() {
        icd_dir(p)
    } else if p.extension().is_some_and(|e| e == "icd") {
        icd_library(p).into_iter().collect()
    } else {
        vec![v.to_string_lossy().into_owned()]
    }
}

/// The system's ICD directory, which ocl-icd reads unless `OCL_ICD_VENDORS`
/// names another.
const SYSTEM_VENDORS: &str = "/etc/OpenCL/vendors";

/// Behind a loader with no `CRANE_VENDORS_DIR`: the vendors of the system
/// directory `system`, unless the loader reads that directory itself (no
/// `OCL_ICD_VENDORS`, or that directory), less those it loads itself from
/// `OCL_ICD_VENDORS` and `OCL_ICD_FILENAMES`. So a loader pointed at a folder
/// holding only crane's `.icd` still sees the system's vendors, through
/// crane, and none twice.
fn beside_loader(
    vendors: Option<std::ffi::OsString>,
    filenames: Option<String>,
    system: &Path,
) -> Vec<String> {
    let Some(v) = vendors else {
        return Vec::new();
    };
    let same = |a: &Path, b: &Path| match (a.canonicalize(), b.canonicalize()) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    };
    if same(Path::new(&v), system) {
        return Vec::new();
    }
    let mut loaders_own = ocl_icd_vendors(&v);
    if let Some(f) = filenames {
        loaders_own.extend(f.split(':').map(str::to_string));
    }
    icd_dir(system)
        .into_iter()
        .filter(|lib| !loaders_own.contains(lib))
        .collect()
}

/// How the process's own ICD loader finds vendors, as far as crane, standing
/// in front of it, must find the same ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LoaderKind {
    /// `OCL_ICD_FILENAMES` first, then the ICD directory (`OCL_ICD_VENDORS`
    /// or /etc/OpenCL/vendors): the Khronos loader (CUDA's libOpenCL.so.1, for
    /// one). Also what crane does where the process has no loader of its own.
    FilenamesThenDirectory,
    /// The ICD directory only: ocl-icd (Debian's and Ubuntu's
    /// libOpenCL.so.1), for which `OCL_ICD_FILENAMES` means nothing.
    DirectoryOnly,
}

/// The file of the ICD loader in this process other than crane: the next
/// `clGetPlatformIDs` after crane's (crane preloaded in front of the
/// application's loader), the global one (crane loaded as an ICD behind
/// it), or a loaded `libOpenCL.so.1`.
fn loader_file() -> Option<PathBuf> {
    let ours = crate::api::platform::clGetPlatformIDs as *mut c_void;
    let name = c"clGetPlatformIDs";
    let found = [libc::RTLD_NEXT, libc::RTLD_DEFAULT]
        .into_iter()
        // SAFETY: dlsym with pseudo-handles and a C string; RTLD_NEXT looks
        // in the objects after crane's.
        .map(|h| unsafe { libc::dlsym(h, name.as_ptr()) })
        .chain(std::iter::once_with(|| loaded_libopencl_symbol(name)))
        .find(|&p| !p.is_null() && p != ours)?;
    object_file(found)
}

/// Which kind of loader `file` is: one that reads `OCL_ICD_FILENAMES` names
/// the variable in its code (the Khronos loader); ocl-icd does not. Without a
/// loader (crane is the process's libOpenCL), the Khronos loader's rules.
fn loader_kind(file: Option<&Path>) -> LoaderKind {
    let Some(bytes) = file.and_then(|f| std::fs::read(f).ok()) else {
        return LoaderKind::FilenamesThenDirectory;
    };
    let needle = b"OCL_ICD_FILENAMES\0";
    if bytes.windows(needle.len()).any(|w| w == needle) {
        LoaderKind::FilenamesThenDirectory
    } else {
        LoaderKind::DirectoryOnly
    }
}

/// The vendors the process's loader of `kind` would load, for crane standing
/// in front of it: `OCL_ICD_FILENAMES` first where that loader reads it, then
/// the ICD directory (`OCL_ICD_VENDORS`, else `system`), then crane's own
/// `crane_dir`. Names of one file twice (a soname and the file an `.icd`
/// names) are told apart at load, as the dynamic linker does.
fn in_front_of_loader(
    kind: LoaderKind,
    filenames: Option<String>,
    vendors: Option<std::ffi::OsString>,
    system: &Path,
    crane_dir: &Path,
) -> Vec<String> {
    let mut found: Vec<String> = Vec::new();
    if kind == LoaderKind::FilenamesThenDirectory
        && let Some(f) = filenames
    {
        found.extend(f.split(':').filter(|s| !s.is_empty()).map(str::to_string));
    }
    found.extend(match vendors {
        Some(v) => ocl_icd_vendors(&v),
        None => icd_dir(system),
    });
    found.extend(icd_dir(crane_dir));
    found
}

/// The vendor libraries to wrap, crane's own entry skipped:
/// * `CRANE_VENDOR`, if set;
/// * in ICD mode (`behind_icd_loader`), the ICD files in `CRANE_VENDORS_DIR`
///   only: the loader itself loads those in its own directory and, if it
///   reads it, `OCL_ICD_FILENAMES`, and wrapping them as well would show
///   each vendor twice (see `cranectl install-icd`); if that directory does
///   not exist, the system directory's vendors the loader does not load
///   (`beside_loader`);
/// * otherwise crane stands in front of the process's loader (or is its
///   OpenCL library) and finds the vendors that loader would
///   (`in_front_of_loader`).
pub fn discover() -> Vec<PathBuf> {
    let own = own_path();
    let keep = |s: &str| !s.is_empty() && !is_crane(s, own.as_deref());
    let cfg = config::get();
    let mut found: Vec<String> = Vec::new();
    let vendors_env = || std::env::var_os("OCL_ICD_VENDORS").filter(|v| !v.is_empty());
    if let Some(v) = &cfg.vendor_override {
        found.extend(v.split(':').map(str::to_string));
    } else if behind_icd_loader() {
        if cfg.vendors_dir.is_dir() {
            debug!(
                "loaded by an ICD loader: wrapping the vendors in {}",
                cfg.vendors_dir.display()
            );
            found = icd_dir(&cfg.vendors_dir);
        } else {
            let reads_filenames =
                loader_kind(loader_file().as_deref()) == LoaderKind::FilenamesThenDirectory;
            found = beside_loader(
                vendors_env(),
                std::env::var("OCL_ICD_FILENAMES")
                    .ok()
                    .filter(|_| reads_filenames),
                Path::new(SYSTEM_VENDORS),
            );
            debug!(
                "loaded by an ICD loader, {} missing: wrapping {found:?} from {SYSTEM_VENDORS}",
                cfg.vendors_dir.display()
            );
        }
    } else {
        let loader = loader_file();
        let kind = loader_kind(loader.as_deref());
        debug!("in front of {loader:?} ({kind:?})");
        found = in_front_of_loader(
            kind,
            std::env::var("OCL_ICD_FILENAMES").ok(),
            vendors_env(),
            Path::new(SYSTEM_VENDORS),
            &cfg.vendors_dir,
        );
    }
    let mut out: Vec<PathBuf> = Vec::new();
    for lib in found {
        if keep(&lib) && !out.iter().any(|p| p.as_os_str() == lib.as_str()) {
            out.push(PathBuf::from(lib));
        }
    }
    out
}

type GetPlatformIds = unsafe extern "C" fn(cl_uint, *mut cl_platform_id, *mut cl_uint) -> cl_int;
type GetExtAddr = unsafe extern "C" fn(*const std::ffi::c_char) -> *mut c_void;

/// Vendor libraries opened ahead of a load, with crane's tracking loader, for
/// the in-process crane-proxy of the local fallback (`remote::fallback`): the
/// next load takes them instead of opening them again (they are open), so that
/// there is one tracked copy, unloaded as usual at the next suspend.
static PRELOADED: Mutex<Vec<(PathBuf, Loaded)>> = Mutex::new(Vec::new());

fn preloaded() -> std::sync::MutexGuard<'static, Vec<(PathBuf, Loaded)>> {
    PRELOADED.lock().unwrap_or_else(|e| e.into_inner())
}

/// Opens the local vendor libraries ahead of a load (see [`PRELOADED`]);
/// returns each library's path and platforms (addresses). Fails when none
/// offers a platform, or while the process is on them already.
pub fn preload() -> Result<Vec<(PathBuf, Vec<usize>)>, String> {
    let paths = {
        let mut st = state();
        if st
            .loaded
            .iter()
            .flatten()
            .any(|l| matches!(l.backend, Backend::Native(_)))
        {
            return Err("the local vendor libraries are loaded already".into());
        }
        st.paths.get_or_insert_with(discover).clone()
    };
    let mut pre = preloaded();
    if pre.is_empty() {
        for p in &paths {
            match open_native(p) {
                Ok(l) => pre.push((p.clone(), l)),
                Err(e) => debug!("vendor {}: {e}", p.display()),
            }
        }
    }
    if pre.iter().all(|(_, l)| l.platforms.is_empty()) {
        drop(pre);
        drop_preloaded();
        return Err(format!(
            "no local vendor library offers a platform ({paths:?})"
        ));
    }
    Ok(pre
        .iter()
        .map(|(p, l)| (p.clone(), l.platforms.iter().map(|&x| x as usize).collect()))
        .collect())
}

/// Where a load of the libraries [`preload`] opened would put each of the
/// process's root devices in use: its vendor device and platform there, as
/// [`plan_devices`] decides for `spec`. What a move back may make ahead
/// (`crate::local_ahead`); the load itself plans again.
pub fn plan_preloaded(
    spec: Option<&DeviceSpec>,
) -> Result<Vec<(Arc<Device>, cl_device_id, cl_platform_id)>, String> {
    // The lock order of `load_once`: the state, then the preloaded.
    let st = state();
    let pre = preloaded();
    if pre.is_empty() {
        return Err("no local vendor library is open ahead".into());
    }
    let offered = offered_by(pre.iter().map(|(_, l)| l));
    drop(pre);
    let used = used_of(&st.devices);
    let plan = plan_devices(&st.devices, &used, &offered, spec)?;
    Ok(plan
        .into_iter()
        .filter(|(d, _)| used.iter().any(|u| Arc::ptr_eq(u, d)))
        .map(|(d, i)| (d, offered[i].vd, offered[i].vp))
        .collect())
}

/// Unloads what [`preload`] opened and no load took.
pub fn drop_preloaded() {
    let left: Vec<Option<Loaded>> = preloaded().drain(..).map(|(_, l)| Some(l)).collect();
    if !left.is_empty() {
        close_all(left);
    }
}

fn open_vendor(path: &Path) -> Result<Loaded, String> {
    let mut pre = preloaded();
    if let Some(i) = pre.iter().position(|(p, _)| p == path) {
        return Ok(pre.remove(i).1);
    }
    drop(pre);
    open_native(path)
}

fn open_native(path: &Path) -> Result<Loaded, String> {
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
        check(unsafe { get(n, platforms.as_mut_ptr(), std::ptr::null_mut()) }).map_err(|e| {
            format!(
                "{}: clIcdGetPlatformIDsKHR failed with {}",
                path.display(),
                crate::entry::error_text(e)
            )
        })?;
    }
    Ok(Loaded {
        backend: Backend::Native(lib),
        platforms,
    })
}

fn open_remote(addr: &str, token: &str) -> Result<Loaded, String> {
    // A pre-copy's session to the same proxy holds its blobs.
    let s = match remote::ahead::take_session(addr, token) {
        Some(s) => s,
        None => remote::Session::open(addr, token)?,
    };
    match remote::platforms(&s) {
        Ok(platforms) if crate::gate::is_open() => {
            // The application's own session (CRANE_MODE=remote): everything
            // it sends is the application's, so a replay can start from the
            // beginning. Sessions made by a move start at their first
            // checkpoint, at the end of the move.
            s.arm_journal();
            Ok(Loaded {
                backend: Backend::Remote(s),
                platforms,
            })
        }
        Ok(platforms) => Ok(Loaded {
            backend: Backend::Remote(s),
            platforms,
        }),
        Err(e) => {
            let why = s.broken().unwrap_or_else(|| {
                format!(
                    "crane-proxy at {addr}: listing platforms failed with OpenCL error {}",
                    crate::entry::error_text(e)
                )
            });
            s.close();
            Err(why)
        }
    }
}

/// Where the process's OpenCL goes: set by `CRANE_MODE=remote` at start, and by
/// the transitions of `lifecycle`.
pub fn target() -> Target {
    let mut st = state();
    st.target.get_or_insert_with(config::initial_target).clone()
}

/// Why the last `load` failed, if it said.
pub fn take_load_error() -> Option<String> {
    state().load_error.take()
}

pub fn set_target(t: Target) {
    state().target = Some(t);
}

/// Where the process's devices go at the next load (that load only): the
/// devices a spec names, or (None, the default) the devices they are on now.
pub fn set_device(spec: Option<DeviceSpec>) {
    state().spec = spec;
}

/// The devices the last load moved onto another physical device.
pub fn take_moved() -> Vec<Moved> {
    std::mem::take(&mut state().moved)
}

/// What OpenCL says a vendor device of the vendor platform `vp` is. (The
/// platform is the one the device was listed under, not asked of the device:
/// crane-proxy answers `CL_DEVICE_PLATFORM` with its own handle.)
pub fn device_id(vp: cl_platform_id, vd: cl_device_id) -> DeviceId {
    DeviceId {
        platform: platform_name(vp),
        name: device_string(vd, CL_DEVICE_NAME).unwrap_or_default(),
        driver: device_string(vd, CL_DRIVER_VERSION).unwrap_or_default(),
    }
}

/// A fixed-size device info answer (`T` must be the parameter's type).
pub fn device_value<T: Copy + Default>(vd: cl_device_id, param: cl_device_info) -> Option<T> {
    let f = vfn!(vd, clGetDeviceInfo).ok()?;
    let mut v = T::default();
    // SAFETY: room for one `T`, the parameter's size.
    let rc = unsafe {
        f(
            vd,
            param,
            size_of::<T>(),
            (&raw mut v).cast(),
            std::ptr::null_mut(),
        )
    };
    (rc == CL_SUCCESS).then_some(v)
}

/// A string device info answer.
pub fn device_string(vd: cl_device_id, param: cl_device_info) -> Option<String> {
    info_string(vd.cast(), |d| d.clGetDeviceInfo.map(|f| (f, param)))
}

/// A device the loaded vendors offer.
struct Offered {
    vp: cl_platform_id,
    vd: cl_device_id,
    id: DeviceId,
    vendor: String,
    cl_type: cl_device_type,
}

impl Offered {
    fn facts(&self) -> DeviceFacts<'_> {
        DeviceFacts {
            platform: &self.id.platform,
            vendor: &self.vendor,
            name: &self.id.name,
            cl_type: self.cl_type,
        }
    }
}

fn offered(loaded: &[Option<Loaded>]) -> Vec<Offered> {
    offered_by(loaded.iter().flatten())
}

fn offered_by<'a>(loaded: impl Iterator<Item = &'a Loaded>) -> Vec<Offered> {
    let mut out = Vec::new();
    for &vp in loaded.flat_map(|l| l.platforms.iter()) {
        for vd in vendor_devices(vp).unwrap_or_default() {
            out.push(Offered {
                vp,
                vd,
                id: device_id(vp, vd),
                vendor: device_string(vd, CL_DEVICE_VENDOR).unwrap_or_default(),
                cl_type: device_value(vd, CL_DEVICE_TYPE).unwrap_or(0),
            });
        }
    }
    out
}

/// The root devices the process has made contexts with, platform by platform.
pub fn used_roots() -> Vec<Arc<Device>> {
    used_of(&state().devices)
}

fn used_of(devices: &[Vec<Arc<Device>>]) -> Vec<Arc<Device>> {
    devices
        .iter()
        .flatten()
        .filter(|d| d.used.load(std::sync::atomic::Ordering::Relaxed))
        .cloned()
        .collect()
}

/// Decides which offered device each of the process's root devices goes to
/// (index into `offered`), or why it cannot go anywhere.
///
/// Devices in use go, in order, to the devices `spec` names (`Home`: the
/// devices they started on; none: the devices they are on now, else the
/// device of the same platform name and position). Devices the process
/// listed but does not use follow the same rule where they can, else go to
/// the first device offered, so that their handles keep answering queries.
fn plan_devices(
    devices: &[Vec<Arc<Device>>],
    used: &[Arc<Device>],
    offered: &[Offered],
    spec: Option<&DeviceSpec>,
) -> Result<Vec<(Arc<Device>, usize)>, String> {
    if offered.is_empty() {
        return Err(NO_DEVICE.into());
    }
    let mut taken = vec![false; offered.len()];
    let mut plan = Vec::new();
    let same_place = |d: &Device, taken: &[bool]| {
        offered
            .iter()
            .enumerate()
            .filter(|(_, o)| o.id.platform == d.platform.name)
            .nth(d.index)
            .map(|(i, _)| i)
            .filter(|&i| !taken[i])
    };
    let by_id = |id: &DeviceId, taken: &[bool]| {
        (0..offered.len()).find(|&i| !taken[i] && offered[i].id == *id)
    };
    let named: Vec<usize> = match spec {
        Some(s @ (DeviceSpec::Type(_) | DeviceSpec::Named(_))) => {
            let n: Vec<usize> = (0..offered.len())
                .filter(|&i| s.matches(&offered[i].facts()))
                .collect();
            if n.len() < used.len() {
                let what: Vec<String> = offered.iter().map(|o| o.id.to_string()).collect();
                return Err(format!(
                    "device spec {s:?} names {} of its devices ({}), and the process uses {}",
                    n.len(),
                    what.join(", "),
                    used.len()
                ));
            }
            n
        }
        _ => Vec::new(),
    };
    for (k, d) in used.iter().enumerate() {
        let i = match spec {
            Some(DeviceSpec::Type(_) | DeviceSpec::Named(_)) => Some(named[k]),
            Some(DeviceSpec::Home) => by_id(&d.home, &taken).or_else(|| same_place(d, &taken)),
            None => by_id(&d.now(), &taken).or_else(|| same_place(d, &taken)),
        };
        let Some(i) = i else {
            let want = if matches!(spec, Some(DeviceSpec::Home)) {
                d.home.clone()
            } else {
                d.now()
            };
            return Err(format!("device {want} of this process is not offered"));
        };
        taken[i] = true;
        plan.push((d.clone(), i));
    }
    for d in devices.iter().flatten() {
        if used.iter().any(|u| Arc::ptr_eq(u, d)) {
            continue;
        }
        let free = vec![false; offered.len()];
        let i = by_id(&d.now(), &free)
            .or_else(|| same_place(d, &free))
            .or_else(|| named.first().copied())
            .unwrap_or(0);
        plan.push((d.clone(), i));
    }
    Ok(plan)
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
    // Room beyond the reported size, offered to the vendor: one that
    // writes past its own answer writes there (docs/conformance.md,
    // kernel_name_size on NVIDIA).
    let mut buf = vec![0u8; n + 4096];
    // SAFETY: `buf` holds buf.len() bytes.
    if unsafe {
        f(
            v,
            param,
            buf.len(),
            buf.as_mut_ptr().cast(),
            std::ptr::null_mut(),
        )
    } != CL_SUCCESS
    {
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
    // A driver reloaded a moment ago, or busy with other processes starting
    // up, can answer with no device once (NVIDIA did, once in 148
    // suspend/resume cycles of the CTS with three other CUDA processes
    // starting and stopping beside it): a reload that finds the local vendor
    // without a device is tried again a few times before the process is told
    // it cannot resume.
    let mut wait = Duration::from_millis(100);
    for attempt in 1.. {
        let spec = state().spec.clone();
        match load_once() {
            Err(_) if attempt < LOAD_ATTEMPTS && no_device_yet() => {
                warn!(
                    "the local vendor offers no device yet (attempt {attempt} of {LOAD_ATTEMPTS}); trying again in {} ms",
                    wait.as_millis()
                );
                std::thread::sleep(wait);
                wait *= 2;
                let mut st = state();
                st.load_error = None;
                st.spec = spec;
            }
            r => return r,
        }
    }
    unreachable!()
}

/// How many times [`load`] tries a local vendor that offers no device.
const LOAD_ATTEMPTS: u32 = 4;

/// Whether the last load failed because the local vendor offered no device.
fn no_device_yet() -> bool {
    let st = state();
    st.target == Some(Target::Local)
        && st
            .load_error
            .as_deref()
            .is_some_and(|e| e.ends_with(NO_DEVICE))
}

const NO_DEVICE: &str = "it offers no device";

fn load_once() -> ClResult<()> {
    let mut st = state();
    if !st.loaded.is_empty() {
        return Ok(());
    }
    let first = st.platforms.is_empty();
    let target = st.target.get_or_insert_with(config::initial_target).clone();
    let mut loaded = Vec::new();
    match &target {
        Target::Remote { addr, token } => match open_remote(addr, token) {
            Ok(l) => loaded.push(Some(l)),
            Err(e) => {
                warn!("{e}");
                st.load_error = Some(e);
                return Err(CL_DEVICE_NOT_AVAILABLE);
            }
        },
        Target::Local => {
            let paths = st.paths.get_or_insert_with(discover).clone();
            debug!("loading vendors {paths:?}");
            for p in &paths {
                match open_vendor(p) {
                    Ok(l) => loaded.push(Some(l)),
                    Err(e) => {
                        debug!("vendor {}: {e}", p.display());
                        loaded.push(None);
                    }
                }
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
    } else if let Err(why) = {
        let spec = st.spec.take();
        retarget(&mut st, &loaded, spec.as_ref())
    } {
        let why = broken(&loaded).unwrap_or_else(|| format!("on {}: {why}", describe(&target)));
        warn!("{why}");
        st.load_error = Some(why);
        for p in &st.platforms {
            p.base.take_vendor();
        }
        close_all(loaded);
        return Err(CL_DEVICE_NOT_AVAILABLE);
    }
    st.loaded = loaded;
    Ok(())
}

/// Re-points crane's platforms and root devices at the newly loaded vendor
/// objects (see [`plan_devices`]) and notes which devices moved.
fn retarget(
    st: &mut State,
    loaded: &[Option<Loaded>],
    spec: Option<&DeviceSpec>,
) -> Result<(), String> {
    let offered = if crate::fault::reload_without_device() {
        Vec::new()
    } else {
        offered(loaded)
    };
    let used = used_of(&st.devices);
    let plan = plan_devices(&st.devices, &used, &offered, spec)?;
    // Platforms: that of their first device in use, else the platform of the
    // same name, else that of their first device, else the first offered.
    let named_platforms: Vec<(String, cl_platform_id)> = loaded
        .iter()
        .flatten()
        .flat_map(|l| l.platforms.iter().map(|&vp| (platform_name(vp), vp)))
        .collect();
    let mut platform_vendor = Vec::with_capacity(st.platforms.len());
    for (pi, p) in st.platforms.iter().enumerate() {
        let mine = |d: &Arc<Device>| st.devices[pi].iter().any(|x| Arc::ptr_eq(x, d));
        let in_use = plan
            .iter()
            .find(|(d, _)| mine(d) && used.iter().any(|u| Arc::ptr_eq(u, d)));
        let vp = in_use
            .map(|&(_, i)| offered[i].vp)
            .or_else(|| {
                named_platforms
                    .iter()
                    .find(|(n, _)| *n == p.name)
                    .map(|&(_, vp)| vp)
            })
            .or_else(|| {
                plan.iter()
                    .find(|(d, _)| mine(d))
                    .map(|&(_, i)| offered[i].vp)
            })
            .unwrap_or(offered[0].vp);
        platform_vendor.push(vp);
    }
    for (p, vp) in st.platforms.iter().zip(platform_vendor) {
        p.base.set_vendor(vp.cast());
    }
    st.moved.clear();
    for (d, i) in plan {
        let o = &offered[i];
        d.base.set_vendor(o.vd.cast());
        let mut now = d.now.lock().unwrap_or_else(|e| e.into_inner());
        if *now != o.id {
            let from = std::mem::replace(&mut *now, o.id.clone());
            drop(now);
            // Only the devices the process made contexts with move anything
            // of its (the others are handles that answer queries).
            if used.iter().any(|u| Arc::ptr_eq(u, &d)) {
                debug!("device {from} now runs on {}", o.id);
                st.moved.push(Moved { device: d, from });
            }
        }
    }
    Ok(())
}

/// Why loading failed, if it was a connection to crane-proxy that broke on
/// the way (its platform and device queries then fail too).
fn broken(loaded: &[Option<Loaded>]) -> Option<String> {
    loaded.iter().flatten().find_map(|l| match &l.backend {
        Backend::Remote(s) => s.broken(),
        Backend::Native(_) => None,
    })
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
                let id = device_id(p.base.vendor().cast(), v);
                let d = Arc::new(Device {
                    base: Base::new(v.cast()),
                    platform: p.clone(),
                    parent: None,
                    index: i,
                    partition: Vec::new(),
                    home: id.clone(),
                    now: std::sync::Mutex::new(id),
                    used: Default::default(),
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
    detach().close(policy)
}

/// The loaded vendors, taken out of crane's state by [`detach`]: crane is left
/// with nothing loaded (the next [`load`] opens its target afresh) while these
/// are given back, possibly on another thread (a move to crane-proxy releases
/// the local objects and unloads the local vendor while the proxy rebuilds
/// them).
pub struct Detached {
    /// crane's platforms and their vendor handles.
    platforms: Vec<(Arc<Platform>, *mut c_void)>,
    /// crane's root devices and their vendor handles.
    devices: Vec<(Arc<Device>, *mut c_void)>,
    loaded: Vec<Option<Loaded>>,
}

// SAFETY: vendor handles and libraries may be used from any thread; crane's
// state no longer refers to them.
unsafe impl Send for Detached {}

/// Takes the loaded vendors and the vendor handles of crane's platforms and
/// devices out of crane's state.
pub fn detach() -> Detached {
    let mut st = state();
    let platforms = st
        .platforms
        .iter()
        .map(|p| (p.clone(), p.base.take_vendor()))
        .collect();
    let devices = st
        .devices
        .iter()
        .flatten()
        .map(|d| (d.clone(), d.base.take_vendor()))
        .collect();
    Detached {
        platforms,
        devices,
        loaded: std::mem::take(&mut st.loaded),
    }
}

/// Puts detached vendors back as they were (a move to crane-proxy that could
/// not read the device's memory goes back to them, nothing released). The
/// caller has unloaded whatever was loaded since.
pub fn reattach(d: Detached) {
    let mut st = state();
    for p in &st.platforms {
        p.base.set_vendor(std::ptr::null_mut());
    }
    for dev in st.devices.iter().flatten() {
        dev.base.set_vendor(std::ptr::null_mut());
    }
    for (p, v) in d.platforms {
        p.base.set_vendor(v);
    }
    for (dev, v) in d.devices {
        dev.base.set_vendor(v);
    }
    st.loaded = d.loaded;
}

impl Detached {
    /// The vendor platforms (null where a vendor had none loaded).
    pub fn platforms(&self) -> Vec<*mut c_void> {
        self.platforms.iter().map(|(_, v)| *v).collect()
    }

    /// Closes the vendor libraries (a remote session: frees crane's remote
    /// platform and device objects and ends the session).
    pub fn close(self, policy: &DevicePolicy) -> Vec<Result<UnloadReport, String>> {
        // Their objects are given back by now; their dispatch tables' addresses
        // mean nothing once the libraries are closed.
        crate::quirks::forget();
        let remote = self
            .loaded
            .iter()
            .flatten()
            .any(|l| matches!(l.backend, Backend::Remote(_)));
        if remote {
            // Remote platforms and devices are crane's own objects: free them.
            for v in self
                .platforms
                .into_iter()
                .map(|(_, v)| v)
                .chain(self.devices.into_iter().map(|(_, v)| v))
                .filter(|v| !v.is_null())
            {
                remote::release(v);
            }
        }
        close_libraries(self.loaded, policy)
    }
}

fn describe(t: &Target) -> String {
    match t {
        Target::Local => "the local vendor libraries".into(),
        Target::Remote { addr, .. } => format!("crane-proxy at {addr}"),
    }
}

/// Ends remote sessions and unloads the vendor libraries, all of them
/// together (crane_vendor_loader tracks the vendors of a process as one
/// group: what one left behind cannot always be told from what another
/// uses); one report for the group.
fn close_libraries(
    loaded: Vec<Option<Loaded>>,
    policy: &DevicePolicy,
) -> Vec<Result<UnloadReport, String>> {
    let mut libs = Vec::new();
    for l in loaded.into_iter().flatten() {
        match l.backend {
            Backend::Native(lib) => libs.push(lib),
            Backend::Remote(s) => s.close(),
        }
    }
    if libs.is_empty() {
        return Vec::new();
    }
    vec![VendorLibrary::close_all(libs, policy).map_err(|e| e.to_string())]
}

/// Gives back what a failed `load` opened.
fn close_all(loaded: Vec<Option<Loaded>>) {
    let _ = close_libraries(loaded, &DevicePolicy::default());
}

/// The session with crane-proxy, while remoting.
pub fn remote_session() -> Option<Arc<remote::Session>> {
    state()
        .loaded
        .iter()
        .flatten()
        .find_map(|l| match &l.backend {
            Backend::Remote(s) => Some(s.clone()),
            Backend::Native(_) => None,
        })
}

pub fn is_loaded() -> bool {
    !state().loaded.is_empty()
}

pub fn loaded_paths() -> Vec<PathBuf> {
    state()
        .loaded
        .iter()
        .flatten()
        .map(|l| match &l.backend {
            Backend::Native(lib) => lib.path().to_path_buf(),
            Backend::Remote(s) => PathBuf::from(format!("crane-proxy at {}", s.addr())),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crane_control::DeviceType;

    fn platform(name: &str) -> Arc<Platform> {
        Arc::new(Platform {
            base: Base::new(std::ptr::null_mut()),
            vendor_index: 0,
            index: 0,
            name: name.into(),
        })
    }

    fn id(platform: &str, name: &str) -> DeviceId {
        DeviceId {
            platform: platform.into(),
            name: name.into(),
            driver: "1".into(),
        }
    }

    fn device(p: &Arc<Platform>, index: usize, name: &str, used: bool) -> Arc<Device> {
        Arc::new(Device {
            base: Base::new(std::ptr::null_mut()),
            platform: p.clone(),
            parent: None,
            index,
            partition: Vec::new(),
            home: id(&p.name, name),
            now: Mutex::new(id(&p.name, name)),
            used: AtomicBool::new(used),
        })
    }

    fn offer(platform: &str, name: &str, cl_type: cl_device_type) -> Offered {
        Offered {
            vp: std::ptr::null_mut(),
            vd: std::ptr::null_mut(),
            id: id(platform, name),
            vendor: "v".into(),
            cl_type,
        }
    }

    /// Where each device goes, as names of offered devices.
    fn plan(
        devices: &[Vec<Arc<Device>>],
        offered: &[Offered],
        spec: Option<&DeviceSpec>,
    ) -> Result<Vec<(String, String)>, String> {
        let used = used_of(devices);
        Ok(plan_devices(devices, &used, offered, spec)?
            .into_iter()
            .map(|(d, i)| (d.home.name.clone(), offered[i].id.name.clone()))
            .collect())
    }

    #[test]
    fn devices_go_where_the_spec_says_and_stay_put_without_one() {
        let nv = platform("NVIDIA CUDA");
        let pocl = platform("PoCL");
        let devices = vec![
            vec![device(&nv, 0, "H100", true), device(&nv, 1, "H100", false)],
            vec![device(&pocl, 0, "cpu", false)],
        ];
        let all = [
            offer("NVIDIA CUDA", "H100", CL_DEVICE_TYPE_GPU),
            offer("NVIDIA CUDA", "H100", CL_DEVICE_TYPE_GPU),
            offer("PoCL", "cpu", CL_DEVICE_TYPE_CPU),
        ];
        let pair = |a: &str, b: &str| (a.to_string(), b.to_string());
        // No spec: each where it is (the two H100s keep their order).
        let p = plan(&devices, &all, None).unwrap();
        assert_eq!(
            p,
            [
                pair("H100", "H100"),
                pair("H100", "H100"),
                pair("cpu", "cpu")
            ]
        );
        // To the CPU: the device in use goes; the others keep answering.
        let cpu = DeviceSpec::Type(DeviceType::Cpu);
        let p = plan(&devices, &all, Some(&cpu)).unwrap();
        assert_eq!(p[0], pair("H100", "cpu"));
        // Arrived where no GPU is offered: only the CPU; a plain resume
        // cannot find the GPU, the spec moves it, the unused GPU handle
        // answers as the CPU.
        let cpu_only = [offer("PoCL", "cpu", CL_DEVICE_TYPE_CPU)];
        let err = plan(&devices, &cpu_only, None).unwrap_err();
        assert!(err.contains("\"H100\" of \"NVIDIA CUDA\""), "{err}");
        let p = plan(&devices, &cpu_only, Some(&cpu)).unwrap();
        assert_eq!(
            p,
            [pair("H100", "cpu"), pair("H100", "cpu"), pair("cpu", "cpu")]
        );
        // A spec naming fewer devices than are in use, or none, is refused.
        let gpu = DeviceSpec::Type(DeviceType::Gpu);
        let err = plan(&devices, &cpu_only, Some(&gpu)).unwrap_err();
        assert!(err.contains("names 0 of its devices"), "{err}");
        assert!(plan(&devices, &[], None).is_err());
        // Home: back to the device it started on, once moved away.
        *devices[0][0].now.lock().unwrap() = id("PoCL", "cpu");
        let p = plan(&devices, &all, None).unwrap();
        assert_eq!(p[0], pair("H100", "cpu"), "no spec: it stays where it is");
        let p = plan(&devices, &all, Some(&DeviceSpec::Home)).unwrap();
        assert_eq!(p[0], pair("H100", "H100"));
    }

    #[test]
    fn devices_in_use_each_get_their_own() {
        let pocl = platform("PoCL");
        let devices = vec![vec![
            device(&pocl, 0, "basic", true),
            device(&pocl, 1, "pthread", true),
        ]];
        let two_gpus = [
            offer("X", "gpu-a", CL_DEVICE_TYPE_GPU),
            offer("X", "gpu-b", CL_DEVICE_TYPE_GPU),
        ];
        let gpu = DeviceSpec::Type(DeviceType::Gpu);
        let p = plan(&devices, &two_gpus, Some(&gpu)).unwrap();
        assert_eq!(p[0].1, "gpu-a");
        assert_eq!(p[1].1, "gpu-b");
        let err = plan(&devices, &two_gpus[..1], Some(&gpu)).unwrap_err();
        assert!(err.contains("the process uses 2"), "{err}");
    }

    #[test]
    fn the_loader_kind_is_whether_it_reads_ocl_icd_filenames() {
        let dir = std::env::temp_dir().join(format!("crane-loader-kind-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let khronos = dir.join("khronos.so");
        std::fs::write(&khronos, b"\x7fELF..OCL_ICD_VENDORS\0OCL_ICD_FILENAMES\0..").unwrap();
        let ocl_icd = dir.join("ocl-icd.so");
        std::fs::write(
            &ocl_icd,
            b"\x7fELF..OCL_ICD_VENDORS\0OCL_ICD_PLATFORM_SORT\0",
        )
        .unwrap();
        assert_eq!(
            loader_kind(Some(&khronos)),
            LoaderKind::FilenamesThenDirectory
        );
        assert_eq!(loader_kind(Some(&ocl_icd)), LoaderKind::DirectoryOnly);
        // No loader in the process: the Khronos loader's rules.
        assert_eq!(loader_kind(None), LoaderKind::FilenamesThenDirectory);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn in_front_of_a_loader_crane_finds_what_that_loader_would() {
        let dir = std::env::temp_dir().join(format!("crane-in-front-{}", std::process::id()));
        let (system, other, crane) = (dir.join("system"), dir.join("other"), dir.join("crane"));
        for (d, lib) in [
            (&system, "libsys.so"),
            (&other, "libother.so"),
            (&crane, "libmoved.so"),
        ] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("v.icd"), format!("{lib}\n")).unwrap();
        }
        let files = || Some("liba.so:libb.so".to_string());
        use LoaderKind::*;
        assert_eq!(
            in_front_of_loader(FilenamesThenDirectory, files(), None, &system, &crane),
            ["liba.so", "libb.so", "libsys.so", "libmoved.so"]
        );
        assert_eq!(
            in_front_of_loader(DirectoryOnly, files(), None, &system, &crane),
            ["libsys.so", "libmoved.so"]
        );
        assert_eq!(
            in_front_of_loader(
                FilenamesThenDirectory,
                files(),
                Some(other.clone().into()),
                &system,
                &crane
            ),
            ["liba.so", "libb.so", "libother.so", "libmoved.so"]
        );
        assert_eq!(
            in_front_of_loader(DirectoryOnly, None, Some(other.into()), &system, &crane),
            ["libother.so", "libmoved.so"]
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
