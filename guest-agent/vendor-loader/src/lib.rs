//! Loads a vendor OpenCL library (an ICD such as `libnvidia-opencl.so.1` or
//! `libpocl.so.2`) into the process, and later unloads it so completely
//! that the GPU kernel driver can be removed.
//!
//! Crane migrates a VM whose application uses a passed-through GPU. Before
//! the GPU is detached, the interposer (`libcrane_opencl.so`) releases every
//! OpenCL object and then has to drop the driver's hold on the device. A
//! plain `dlclose` of the vendor library does not: NVIDIA's OpenCL library
//! `dlopen`s `libcuda.so.1` itself and never closes it, and libcuda keeps
//! descriptors and mappings of `/dev/nvidia*` open. This crate follows the
//! Crane paper's method, made exact:
//!
//! * it `dlopen`s the vendor library and redirects the vendor's imports of
//!   `dlopen`, `dlmopen`, `dlclose` and `pthread_create` (in the vendor and
//!   in every object loaded with or by it), so it knows each library the
//!   vendor opened and each thread it started;
//! * [`VendorLibrary::close`] `dlclose`s the vendor, then the libraries it
//!   left open, drops references to them taken behind the hooks until
//!   `dlopen(RTLD_NOLOAD)` no longer finds them, closes descriptors of
//!   device nodes and unmaps mappings of them, and reports what it did and
//!   what stays (libraries pinned by `NODELETE` or `STB_GNU_UNIQUE`
//!   symbols, threads still running);
//! * [`device_residue`] and [`vendor_threads_alive`] tell at any time what
//!   still pins a device.
//!
//! Several vendor libraries may be open at once (a machine with NVIDIA's GPU
//! and PoCL's CPU device shows both platforms); they are tracked as one group
//! and closed together with [`VendorLibrary::close_all`], since what one
//! vendor left behind cannot always be told from what another still uses.
//! The rest of the process is left alone: only objects that appeared because
//! of the vendors are patched or force-closed.
//!
//! Known limits: threads or libraries that a library's *constructor* starts
//! or opens during the very first `dlopen` run before the redirection exists
//! and are not seen (the libraries are, as objects loaded with the vendor);
//! the redirected `dlopen` searches with this library's search path, not the
//! vendor's `DT_RUNPATH` (no known vendor relies on it); objects loaded into
//! another link-map namespace are closed through their handles only.
//!
//! [`quirks`] tells which vendor versions have the bugs crane works around,
//! for both sides that run calls on a vendor (the interposer and
//! crane-proxy); [`pocl_binary`] checks PoCL program binaries before PoCL,
//! which aborts on a flawed one, reads them.

mod objects;
pub mod pocl_binary;
pub mod quirks;
mod residue;
mod stacks;
mod termination;
mod threads;
mod tracker;
mod unload;

use std::collections::HashSet;
use std::ffi::{CStr, CString, c_void};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::ptr::NonNull;

pub use residue::{DeviceFd, DeviceMapping, DevicePolicy, Residue, device_residue};
pub use threads::{VendorThread, vendor_threads_alive};
pub use unload::{RetainReason, StillMapped, UnloadReport};

use objects::ObjectId;

/// Failures of [`VendorLibrary::open`].
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("The vendor library {0} is open already.")]
    AlreadyOpen(PathBuf),
    #[error("{path} is the vendor library {open}, which is open already.")]
    SameAs { path: PathBuf, open: PathBuf },
    #[error("The path {0} contains a NUL byte, so dlopen cannot be given it.")]
    PathContainsNul(PathBuf),
    #[error("dlopen could not load {path}: {message}.")]
    Dlopen { path: PathBuf, message: String },
    #[error("dlinfo found no link map for the handle of {0}.")]
    NoLinkMap(PathBuf),
}

/// Failures of [`VendorLibrary::close`].
#[derive(Debug, thiserror::Error)]
pub enum UnloadError {
    #[error("The vendor libraries {} are open too; they are closed together with these.", open.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", "))]
    OthersOpen { open: Vec<PathBuf> },
    #[error("dlclose of the vendor library {path} failed: {message}.")]
    VendorClose { path: PathBuf, message: String },
    #[error("The descriptor table /proc/self/fd could not be read.")]
    ReadFdTable(#[source] std::io::Error),
    #[error("The memory map /proc/self/maps could not be read.")]
    ReadMaps(#[source] std::io::Error),
    #[error("munmap of the device mapping {start:#x}-{end:#x} of {} failed.", path.display())]
    Unmap {
        start: usize,
        end: usize,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A vendor OpenCL library loaded so that it can be unloaded completely.
///
/// Dropping it without [`close`](Self::close) leaves the library loaded
/// (its objects may still be in use) and ends the tracking session.
#[derive(Debug)]
pub struct VendorLibrary {
    handle: NonNull<c_void>,
    path: PathBuf,
    object: ObjectId,
    /// Objects loaded before this library, to tell what appeared since.
    loaded_before: HashSet<ObjectId>,
    closed: bool,
}

// SAFETY: the handle is a process-wide dlopen handle; dlsym and dlclose may
// be called on it from any thread.
unsafe impl Send for VendorLibrary {}
// SAFETY: &self only allows dlsym, which is thread-safe.
unsafe impl Sync for VendorLibrary {}

/// The last `dlerror` message, or a placeholder.
fn dl_error() -> String {
    // SAFETY: dlerror returns null or a NUL-terminated string valid until the
    // next dl call on this thread; it is copied at once.
    let message = unsafe { libc::dlerror() };
    if message.is_null() {
        "no error message".to_owned()
    } else {
        // SAFETY: see above.
        unsafe { CStr::from_ptr(message) }
            .to_string_lossy()
            .into_owned()
    }
}

impl VendorLibrary {
    /// Loads the vendor library at `path` (`RTLD_NOW | RTLD_LOCAL`) and
    /// starts tracking what it loads and starts.
    pub fn open(path: &Path) -> Result<VendorLibrary, LoadError> {
        {
            let mut tracker = tracker::lock();
            if tracker.open_vendors.iter().any(|p| p == path) {
                return Err(LoadError::AlreadyOpen(path.to_path_buf()));
            }
            tracker.open_vendors.push(path.to_path_buf());
        }
        if let Some(open) = open_as(path) {
            forget_open(path);
            return Err(LoadError::SameAs {
                path: path.to_path_buf(),
                open,
            });
        }
        let opened = Self::load(path);
        if opened.is_err() {
            forget_open(path);
        }
        opened
    }

    fn load(path: &Path) -> Result<VendorLibrary, LoadError> {
        let c_path = CString::new(path.as_os_str().as_bytes())
            .map_err(|_| LoadError::PathContainsNul(path.to_path_buf()))?;
        tracker::prepare_backtrace();
        let loaded_before = objects::loaded_ids();
        // SAFETY: c_path is NUL-terminated; loading runs the library's
        // constructors, which is what asking for a vendor library means.
        let handle = unsafe { libc::dlopen(c_path.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        let Some(handle) = NonNull::new(handle) else {
            return Err(LoadError::Dlopen {
                path: path.to_path_buf(),
                message: dl_error(),
            });
        };
        let Some(object) = tracker::handle_target(handle) else {
            // SAFETY: the handle was just opened and is not used again.
            unsafe { libc::dlclose(handle.as_ptr()) };
            return Err(LoadError::NoLinkMap(path.to_path_buf()));
        };
        let loaded = objects::loaded_ids();
        let mut new: HashSet<ObjectId> = loaded.difference(&loaded_before).cloned().collect();
        new.insert(object.clone());
        objects::redirect_imports(&new, &tracker::hooks());
        log::info!(
            "Loaded {} with {} new objects.",
            path.display(),
            new.len() - 1
        );
        {
            let mut tracker = tracker::lock();
            tracker.forget_unloaded(&loaded);
            tracker.attribute(object.clone());
            tracker
                .vendor_objects
                .push((path.to_path_buf(), object.clone()));
            for id in new {
                tracker.attribute(id);
            }
        }
        Ok(VendorLibrary {
            handle,
            path: path.to_path_buf(),
            object,
            loaded_before,
            closed: false,
        })
    }

    /// The address of the vendor's exported symbol `name`.
    pub fn symbol(&self, name: &CStr) -> Option<NonNull<c_void>> {
        // SAFETY: the handle is open for as long as self exists; name is
        // NUL-terminated.
        NonNull::new(unsafe { libc::dlsym(self.handle.as_ptr(), name.as_ptr()) })
    }

    /// The path the library was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Unloads the vendor library and everything it left behind; see
    /// [`UnloadReport`] for what is reported. Every OpenCL object of the
    /// vendor must have been released, and no pointer into the vendor may
    /// be used afterwards.
    pub fn close(self, policy: &DevicePolicy) -> Result<UnloadReport, UnloadError> {
        Self::close_all(vec![self], policy)
    }

    /// Unloads every open vendor library, latest first, then everything they
    /// left behind, as [`close`](Self::close) does for one. `libs` must be
    /// all the open vendor libraries (else nothing is closed: what the others
    /// use could not be told apart). A vendor that stays mapped after its
    /// `dlclose` (PoCL, whose LLVM is NODELETE) keeps what it can reach: its
    /// dependencies and what it opened stay; what the other vendors left is
    /// closed.
    pub fn close_all(
        mut libs: Vec<VendorLibrary>,
        policy: &DevicePolicy,
    ) -> Result<UnloadReport, UnloadError> {
        {
            let tracker = tracker::lock();
            let others: Vec<PathBuf> = tracker
                .open_vendors
                .iter()
                .filter(|p| !libs.iter().any(|l| &l.path == *p))
                .cloned()
                .collect();
            if !others.is_empty() {
                return Err(UnloadError::OthersOpen { open: others });
            }
        }
        let loaded_before: HashSet<ObjectId> = libs
            .iter()
            .min_by_key(|l| l.loaded_before.len())
            .map(|l| l.loaded_before.clone())
            .unwrap_or_default();
        // Latest first, as a process would close them.
        libs.reverse();
        let vendors: Vec<unload::Opened> = libs
            .iter_mut()
            .map(|l| {
                l.closed = true;
                unload::Opened {
                    handle: l.handle,
                    path: l.path.clone(),
                    object: l.object.clone(),
                }
            })
            .collect();
        let result = unload::unload(&vendors, &loaded_before, policy);
        for l in &libs {
            forget_open(&l.path);
        }
        result
    }
}

fn forget_open(path: &Path) {
    let mut tracker = tracker::lock();
    tracker.open_vendors.retain(|p| p != path);
    tracker.vendor_objects.retain(|(p, _)| p != path);
}

/// The open vendor library that `path` names under another name, if any:
/// asked of the dynamic linker (`RTLD_NOLOAD`), which tells files apart by
/// device and inode, as it does when it loads them.
fn open_as(path: &Path) -> Option<PathBuf> {
    let c_path = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: c_path is NUL-terminated; RTLD_NOLOAD loads nothing, it only
    // returns (and counts a reference to) an object already loaded.
    let handle = NonNull::new(unsafe {
        libc::dlopen(c_path.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD)
    })?;
    let object = tracker::handle_target(handle);
    // SAFETY: drops the reference RTLD_NOLOAD took; the object stays loaded.
    unsafe { libc::dlclose(handle.as_ptr()) };
    let object = object?;
    tracker::lock()
        .vendor_objects
        .iter()
        .find(|(p, o)| *o == object && p != path)
        .map(|(p, _)| p.clone())
}

impl Drop for VendorLibrary {
    fn drop(&mut self) {
        if !self.closed {
            log::warn!(
                "{} was dropped without close; it stays loaded.",
                self.path.display()
            );
            forget_open(&self.path);
        }
    }
}
