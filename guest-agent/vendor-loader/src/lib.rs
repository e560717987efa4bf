//! Loading and complete unloading of a vendor OpenCL library (work in progress).
