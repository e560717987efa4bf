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

pub mod api;
mod callbacks;
pub mod config;
pub mod control;
pub mod dispatch;
mod entry;
pub mod gate;
pub mod handle;
pub mod lifecycle;
pub mod objects;
pub mod vendor;
