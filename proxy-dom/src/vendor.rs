//! The vendor OpenCL libraries the proxy runs calls on. They are opened with
//! dlopen (never libOpenCL, so no ICD loader sits in between), their platforms
//! come from `clIcdGetPlatformIDsKHR`, and every other function is reached
//! through the ICD dispatch table that the first word of every vendor object
//! points to. Libraries stay loaded for the life of the process.

use std::ffi::{CStr, CString, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use opencl_sys::cl_icd::_cl_icd_dispatch;
use opencl_sys::*;

#[derive(Debug, thiserror::Error)]
pub enum VendorError {
    #[error(
        "no vendor OpenCL library was found (give --vendor, or set CRANE_VENDOR, OCL_ICD_FILENAMES or OCL_ICD_VENDORS)"
    )]
    NoneFound,
    #[error("{path} cannot be loaded: {reason}")]
    Open { path: PathBuf, reason: String },
    #[error("{0} exports neither clIcdGetPlatformIDsKHR nor clGetExtensionFunctionAddress")]
    NoEntry(PathBuf),
    #[error("{path}: clIcdGetPlatformIDsKHR failed with {status}")]
    Platforms { path: PathBuf, status: cl_int },
    #[error("none of the vendor libraries ({0}) offers a platform")]
    NoPlatforms(String),
}

/// A vendor object pointer, which OpenCL allows any thread to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VPtr(pub *mut c_void);

// SAFETY: OpenCL objects are thread-safe (OpenCL 1.1 and later), except
// clSetKernelArg on one kernel from several threads, which the proxy never
// does: only a session's own thread sets its kernels' arguments.
unsafe impl Send for VPtr {}
// SAFETY: as above.
unsafe impl Sync for VPtr {}

impl VPtr {
    pub fn get(self) -> *mut c_void {
        self.0
    }
}

/// The dispatch table of a vendor object.
///
/// # Safety
/// `v` must be a live object of a loaded ICD vendor library.
#[inline(always)]
pub unsafe fn dispatch<'a>(v: *mut c_void) -> &'a _cl_icd_dispatch {
    // SAFETY: ICD objects start with a pointer to their dispatch table, which
    // lives as long as the vendor library stays loaded (forever, here).
    unsafe { &**(v as *const *const _cl_icd_dispatch) }
}

/// The vendor function `$f` for the vendor object `$h`, or
/// `Err(CL_INVALID_OPERATION)` when the vendor lacks it.
macro_rules! vfn {
    ($h:expr, $f:ident) => {{
        let h: *mut std::ffi::c_void = $h.cast();
        // SAFETY: handles reach here only from a session's object table or a
        // vendor call's result: live objects of a loaded vendor library.
        let table = unsafe { $crate::vendor::dispatch(h) };
        table.$f.ok_or(opencl_sys::CL_INVALID_OPERATION)
    }};
}
pub(crate) use vfn;

/// A vendor library, loaded for good.
struct Library {
    path: PathBuf,
    platforms: Vec<VPtr>,
}

/// The loaded vendor libraries and their platforms, in discovery order.
pub struct Vendor {
    libraries: Vec<Library>,
    smallest_global_mem: Option<u64>,
    /// The dispatch tables (by address) of the platforms whose vendor leaks
    /// a context reference per destroyed 1D image buffer (`crate::quirks`).
    leaky: Vec<usize>,
    /// The dispatch tables of PoCL platforms with the binary format each
    /// reads (`crane_vendor_loader::pocl_binary`).
    pocl_formats: Vec<(usize, u32)>,
}

type GetPlatformIds = unsafe extern "C" fn(cl_uint, *mut cl_platform_id, *mut cl_uint) -> cl_int;
type GetExtAddr = unsafe extern "C" fn(*const std::ffi::c_char) -> *mut c_void;

/// The vendor libraries to load when none is given: `CRANE_VENDOR`, else
/// `OCL_ICD_FILENAMES`, else the `.icd` files in `OCL_ICD_VENDORS` (or
/// /etc/OpenCL/vendors); crane's own interposer is skipped.
pub fn discover() -> Vec<PathBuf> {
    let keep = |s: &str| !s.is_empty() && !s.contains("crane_opencl");
    for var in ["CRANE_VENDOR", "OCL_ICD_FILENAMES"] {
        if let Ok(v) = std::env::var(var) {
            let list: Vec<PathBuf> = v
                .split(':')
                .filter(|s| keep(s))
                .map(PathBuf::from)
                .collect();
            if !list.is_empty() {
                return list;
            }
        }
    }
    let dir = std::env::var_os("OCL_ICD_VENDORS")
        .map_or_else(|| PathBuf::from("/etc/OpenCL/vendors"), PathBuf::from);
    let Ok(rd) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = rd
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "icd"))
        .collect();
    files.sort();
    let mut out: Vec<PathBuf> = Vec::new();
    for f in files {
        if let Ok(s) = std::fs::read_to_string(&f) {
            let lib = s.lines().next().unwrap_or("").trim();
            if keep(lib) && !out.iter().any(|p| p.as_os_str() == lib) {
                out.push(PathBuf::from(lib));
            }
        }
    }
    out
}

fn dlerror() -> String {
    // SAFETY: dlerror returns a thread-local C string or null.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        // SAFETY: non-null dlerror results are C strings.
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

fn open(path: &Path) -> Result<Library, VendorError> {
    let open_err = |reason: String| VendorError::Open {
        path: path.to_path_buf(),
        reason,
    };
    let cpath = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| open_err("the path holds a NUL byte".into()))?;
    // SAFETY: a valid C string; the library is kept loaded for good.
    let handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if handle.is_null() {
        return Err(open_err(dlerror()));
    }
    // SAFETY: `handle` is a live dlopen handle; the name is a C string.
    let mut entry = unsafe { libc::dlsym(handle, c"clIcdGetPlatformIDsKHR".as_ptr()) };
    if entry.is_null() {
        // SAFETY: as above.
        let gea = unsafe { libc::dlsym(handle, c"clGetExtensionFunctionAddress".as_ptr()) };
        if gea.is_null() {
            return Err(VendorError::NoEntry(path.to_path_buf()));
        }
        // SAFETY: the symbol is an ICD vendor's clGetExtensionFunctionAddress.
        let gea: Option<GetExtAddr> =
            unsafe { std::mem::transmute::<*mut c_void, Option<GetExtAddr>>(gea) };
        if let Some(gea) = gea {
            // SAFETY: a valid C string.
            entry = unsafe { gea(c"clIcdGetPlatformIDsKHR".as_ptr()) };
        }
    }
    // SAFETY: clIcdGetPlatformIDsKHR has clGetPlatformIDs' signature; a null
    // pointer becomes None.
    let get: Option<GetPlatformIds> =
        unsafe { std::mem::transmute::<*mut c_void, Option<GetPlatformIds>>(entry) };
    let get = get.ok_or_else(|| VendorError::NoEntry(path.to_path_buf()))?;
    let failed = |status| VendorError::Platforms {
        path: path.to_path_buf(),
        status,
    };
    let mut n: cl_uint = 0;
    // SAFETY: a count query with a valid out-pointer.
    let rc = unsafe { get(0, std::ptr::null_mut(), &mut n) };
    if rc == CL_PLATFORM_NOT_FOUND_KHR {
        n = 0;
    } else if rc != CL_SUCCESS {
        return Err(failed(rc));
    }
    let mut platforms = vec![std::ptr::null_mut(); n as usize];
    if n > 0 {
        // SAFETY: `platforms` holds n entries.
        let rc = unsafe { get(n, platforms.as_mut_ptr(), std::ptr::null_mut()) };
        if rc != CL_SUCCESS {
            return Err(failed(rc));
        }
    }
    Ok(Library {
        path: path.to_path_buf(),
        platforms: platforms
            .into_iter()
            .filter(|p| !p.is_null())
            .map(VPtr)
            .collect(),
    })
}

impl Vendor {
    /// Loads the given libraries (or the discovered ones when `paths` is
    /// empty). A library that fails to load is logged and skipped; having no
    /// platform at all is an error.
    pub fn load(paths: &[PathBuf]) -> Result<Vendor, VendorError> {
        // Vendors initialise themselves on first use, not always safely
        // from several threads at once (PoCL does not): load one at a time.
        static LOADING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one_at_a_time = LOADING.lock().unwrap_or_else(|e| e.into_inner());
        let paths = if paths.is_empty() {
            discover()
        } else {
            paths.to_vec()
        };
        if paths.is_empty() {
            return Err(VendorError::NoneFound);
        }
        let mut libraries = Vec::new();
        let mut last_err = None;
        for p in &paths {
            match open(p) {
                Ok(lib) => {
                    log::info!(
                        "vendor {}: {} platform(s)",
                        lib.path.display(),
                        lib.platforms.len()
                    );
                    libraries.push(lib);
                }
                Err(e) => {
                    log::warn!("{e}");
                    last_err = Some(e);
                }
            }
        }
        if libraries.iter().all(|l| l.platforms.is_empty()) {
            if let (true, Some(e)) = (libraries.is_empty(), last_err) {
                return Err(e);
            }
            let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
            return Err(VendorError::NoPlatforms(names.join(", ")));
        }
        Ok(Vendor::with(libraries))
    }

    /// Libraries the embedding process has loaded (see
    /// [`crate::Config::preloaded`]), with their platforms.
    pub fn preloaded(list: &[(PathBuf, Vec<usize>)]) -> Result<Vendor, VendorError> {
        if list.iter().all(|(_, p)| p.is_empty()) {
            let names: Vec<String> = list.iter().map(|(p, _)| p.display().to_string()).collect();
            return Err(VendorError::NoPlatforms(names.join(", ")));
        }
        let libraries = list
            .iter()
            .map(|(path, platforms)| Library {
                path: path.clone(),
                platforms: platforms.iter().map(|&p| VPtr(p as *mut c_void)).collect(),
            })
            .collect();
        Ok(Vendor::with(libraries))
    }

    fn with(libraries: Vec<Library>) -> Vendor {
        let mut v = Vendor {
            libraries,
            smallest_global_mem: None,
            leaky: Vec::new(),
            pocl_formats: Vec::new(),
        };
        // Enumerating the devices here, under the lock, also completes the
        // vendor's initialisation before any session runs.
        v.smallest_global_mem = v.query_smallest_global_mem();
        v.query_quirks();
        v
    }

    /// The platforms with a quirk crane-proxy works around (`crate::quirks`):
    /// one `CL_PLATFORM_VERSION` query per platform, here at load, and
    /// nothing asked of a vendor at run time unless it has the quirk. Those
    /// that leak a context reference per destroyed 1D image buffer, and the
    /// PoCL ones whose binaries are checked before PoCL reads them, with the
    /// format each reads.
    fn query_quirks(&mut self) {
        for lib in &self.libraries {
            for &p in &lib.platforms {
                let Some(version) = platform_version(p) else {
                    continue;
                };
                let table = table_of(p);
                if crane_vendor_loader::quirks::leaks_image1d_buffer_context(&version)
                    && !self.leaky.contains(&table)
                {
                    log::info!(
                        "vendor {} ({version}) leaks a context reference per 1D image buffer; sessions give them back",
                        lib.path.display()
                    );
                    self.leaky.push(table);
                }
                if let Some(format) = crane_vendor_loader::pocl_binary::format_of_platform(&version)
                    && !self.pocl_formats.iter().any(|&(t, _)| t == table)
                {
                    self.pocl_formats.push((table, format));
                }
            }
        }
    }

    /// The PoCL binary format the vendor of object `v` reads, if it is a
    /// PoCL whose format crane knows.
    pub fn pocl_binary_format(&self, v: VPtr) -> Option<u32> {
        if self.pocl_formats.is_empty() {
            return None;
        }
        let table = table_of(v);
        self.pocl_formats
            .iter()
            .find(|&&(t, _)| t == table)
            .map(|&(_, f)| f)
    }

    /// Whether the vendor of object `v` leaks a context reference per
    /// destroyed 1D image buffer (`crate::quirks`).
    pub fn leaks_image1d_buffer_context(&self, v: VPtr) -> bool {
        if self.leaky.is_empty() {
            return false;
        }
        self.leaky.contains(&table_of(v))
    }

    /// All platforms of all libraries.
    pub fn platforms(&self) -> Vec<VPtr> {
        self.libraries
            .iter()
            .flat_map(|l| l.platforms.iter().copied())
            .collect()
    }

    /// Starts making a warm context (`crate::warm`) for every device, of the
    /// device alone (with or without its platform named).
    pub fn warm_contexts(&self) {
        for p in self.platforms() {
            for d in devices(p) {
                crate::warm::fill(d.get().cast(), Vec::new());
            }
        }
    }

    /// The first device of the first platform that has one.
    pub fn first_device(&self) -> Option<VPtr> {
        self.platforms()
            .into_iter()
            .find_map(|p| devices(p).into_iter().next())
    }

    /// The smallest `CL_DEVICE_GLOBAL_MEM_SIZE` over every device.
    pub fn smallest_global_mem(&self) -> Option<u64> {
        self.smallest_global_mem
    }

    fn query_smallest_global_mem(&self) -> Option<u64> {
        let mut smallest: Option<u64> = None;
        for p in self.platforms() {
            for d in devices(p) {
                let mut mem: cl_ulong = 0;
                let Ok(f) = vfn!(d.get(), clGetDeviceInfo) else {
                    continue;
                };
                // SAFETY: a cl_ulong query into a cl_ulong.
                let rc = unsafe {
                    f(
                        d.get().cast(),
                        CL_DEVICE_GLOBAL_MEM_SIZE,
                        size_of::<cl_ulong>(),
                        (&raw mut mem).cast(),
                        std::ptr::null_mut(),
                    )
                };
                if rc == CL_SUCCESS && mem > 0 {
                    smallest = Some(smallest.map_or(mem, |s| s.min(mem)));
                }
            }
        }
        smallest
    }
}

/// The dispatch table (by address) of live object `v` of a loaded vendor
/// library. An ICD vendor gives all its objects one dispatch table (PoCL
/// does), so an object's table is its platform's.
fn table_of(v: VPtr) -> usize {
    // SAFETY: callers pass live objects (or platforms) of a loaded vendor
    // library.
    (unsafe { dispatch(v.get()) }) as *const _cl_icd_dispatch as usize
}

/// A platform's `CL_PLATFORM_VERSION`.
fn platform_version(platform: VPtr) -> Option<String> {
    let f = vfn!(platform.get(), clGetPlatformInfo).ok()?;
    let bytes = crate::api::query(|size, value, size_ret| {
        // SAFETY: a live platform; the vendor writes at most `size` bytes
        // into `value`.
        unsafe {
            f(
                platform.get().cast(),
                CL_PLATFORM_VERSION,
                size,
                value,
                size_ret,
            )
        }
    })
    .ok()?;
    let text = bytes.split(|&b| b == 0).next().unwrap_or(&[]);
    Some(String::from_utf8_lossy(text).into_owned())
}

/// The devices of a platform (all types).
fn devices(platform: VPtr) -> Vec<VPtr> {
    let Ok(f) = vfn!(platform.get(), clGetDeviceIDs) else {
        return Vec::new();
    };
    let mut n: cl_uint = 0;
    // SAFETY: a count query.
    let rc = unsafe {
        f(
            platform.get().cast(),
            CL_DEVICE_TYPE_ALL,
            0,
            std::ptr::null_mut(),
            &mut n,
        )
    };
    if rc != CL_SUCCESS || n == 0 {
        return Vec::new();
    }
    let mut out = vec![std::ptr::null_mut(); n as usize];
    // SAFETY: `out` holds n entries.
    let rc = unsafe {
        f(
            platform.get().cast(),
            CL_DEVICE_TYPE_ALL,
            n,
            out.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    if rc != CL_SUCCESS {
        return Vec::new();
    }
    out.into_iter().map(|d| VPtr(d.cast())).collect()
}
