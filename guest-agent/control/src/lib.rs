//! Control-socket protocol (work in progress).
