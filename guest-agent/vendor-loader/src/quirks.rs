//! Which vendor versions have the bugs crane works around
//! (docs/architecture.md, "Vendor quirks"). Both sides that run calls on a
//! vendor use it: the interposer (`crane-opencl`'s `quirks.rs`) and
//! crane-proxy (its `quirks.rs`); each does its own bookkeeping, the version
//! tests live here once.

/// The PoCL major version in a `CL_PLATFORM_VERSION` ("OpenCL 3.0 PoCL
/// 3.1+debian ..."): None when the platform is not PoCL, `u32::MAX` when
/// the number cannot be read.
pub fn pocl_major(version: &str) -> Option<u32> {
    let rest = version.split("PoCL ").nth(1)?;
    Some(
        rest.chars()
            .take_while(char::is_ascii_digit)
            .collect::<String>()
            .parse()
            .unwrap_or(u32::MAX),
    )
}

/// Whether a platform of this `CL_PLATFORM_VERSION` leaks a context
/// reference per destroyed 1D image buffer (`CL_MEM_OBJECT_IMAGE1D_BUFFER`):
/// PoCL 1 to 6. Its clCreateImage retains the context for every image, and
/// its clReleaseMemObject, destroying an image made from a buffer, releases
/// the buffer and returns without releasing the context (fixed upstream in
/// 7.0, "fix memleak with 1D Image buffers").
pub fn leaks_image1d_buffer_context(version: &str) -> bool {
    pocl_major(version).is_some_and(|m| (1..7).contains(&m))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pocl_before_7_leaks() {
        assert!(leaks_image1d_buffer_context(
            "OpenCL 3.0 PoCL 3.1+debian  Linux, None+Asserts, RELOC, SPIR, LLVM 15.0.6, SLEEF, DISTRO, POCL_DEBUG"
        ));
        assert!(leaks_image1d_buffer_context(
            "OpenCL 3.0 PoCL 5.0+debian  Linux"
        ));
        assert!(leaks_image1d_buffer_context("OpenCL 3.0 PoCL 6.0  Linux"));
        assert!(!leaks_image1d_buffer_context("OpenCL 3.0 PoCL 7.0  Linux"));
        assert!(!leaks_image1d_buffer_context("OpenCL 3.0 PoCL 7.1-pre"));
        assert!(!leaks_image1d_buffer_context("OpenCL 3.0 CUDA 13.0.97"));
        assert!(!leaks_image1d_buffer_context("OpenCL 3.0 PoCL x"));
    }

    #[test]
    fn pocl_major_reads_the_number_after_pocl() {
        assert_eq!(pocl_major("OpenCL 3.0 PoCL 3.1+debian  Linux"), Some(3));
        assert_eq!(pocl_major("OpenCL 3.0 PoCL 12.0"), Some(12));
        assert_eq!(pocl_major("OpenCL 3.0 PoCL x"), Some(u32::MAX));
        assert_eq!(pocl_major("OpenCL 3.0 CUDA 13.0.97"), None);
    }
}
