//! `libcrane_opencl.so`: the OpenCL interposition library.
//!
//! Loaded into an unmodified OpenCL application (LD_PRELOAD, as a drop-in
//! `libOpenCL.so.1`, or as an ICD), it forwards every call to the vendor library
//! while recording what is needed to rebuild each object, and it can at any
//! moment park all GPU state in RAM, unload the vendor library completely, and
//! later rebuild everything on a freshly loaded one (see `lifecycle`).
//!
//! Layout follows Rusticl: `api/` holds the C entry points, one file per object
//! family; `objects` the shadow objects; `handle` crane's handles; `gate` the
//! suspend gate every call passes.

// Handles reach crane's internal functions as raw pointers; each is checked
// against crane's handle arena (`handle::slot_of`) before anything is read
// through it, and vendor pointers are only passed back to the vendor.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod api;
mod callbacks;
pub mod config;
pub mod control;
pub mod dispatch;
mod entry;
pub mod extensions;
mod fault;
pub mod gate;
pub mod handle;
pub mod lifecycle;
mod local_ahead;
mod nosignal;
pub mod objects;
mod quirks;
pub mod remote;
mod retarget;
pub mod staging;
pub mod vendor;

// Every entry point turns a panic into an error code with catch_unwind, which
// only works if panics unwind.
#[cfg(panic = "abort")]
compile_error!("libcrane_opencl.so must be built with panic = \"unwind\" (see entry.rs)");

/// Runs when the library is loaded. PoCL joins its worker threads on
/// clUnloadPlatformCompiler only if POCL_ENABLE_UNINIT is set in the
/// environment, and the environment may only be changed safely while no other
/// thread can read it. Preloaded or as a drop-in libOpenCL.so.1, crane is
/// loaded before `main`; as an ICD, when the application's first OpenCL call
/// makes the loader open it, and the variable is then set only if the process
/// still has a single thread (otherwise PoCL's workers outlive a suspend, which
/// the suspend reply reports).
/// The panic hook is crane's only when crane is a shared object of its own (a
/// test program linking the rlib keeps the usual one).
extern "C" fn on_load() {
    if std::env::var_os("POCL_ENABLE_UNINIT").is_some() {
        return;
    }
    let threads = std::fs::read_dir("/proc/self/task").map_or(0, Iterator::count);
    if threads == 1 {
        // SAFETY: only this thread exists, so none reads the environment now.
        unsafe { std::env::set_var("POCL_ENABLE_UNINIT", "1") };
    } else {
        config::debug!("{threads} threads at load: POCL_ENABLE_UNINIT left unset");
    }
    let exe = std::env::current_exe().and_then(std::fs::canonicalize).ok();
    if vendor::own_path().is_some_and(|own| Some(own) != exe) {
        entry::install_panic_hook();
    }
}

#[used]
#[unsafe(link_section = ".init_array")]
static ON_LOAD: extern "C" fn() = on_load;
