//! Image builders (work in progress).
