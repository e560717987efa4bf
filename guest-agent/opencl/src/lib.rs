//! OpenCL interposition library (work in progress).
