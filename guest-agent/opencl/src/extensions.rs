//! The extensions crane advertises: the vendor's, less those whose entry
//! points crane does not track.
//!
//! An application that finds an extension in `CL_*_EXTENSIONS` may assume its
//! functions exist; `clGetExtensionFunctionAddress*` answers NULL for every
//! function crane does not wrap (`dispatch::extension_address`), because
//! objects made through them could not be rebuilt after the vendor library is
//! unloaded. So those extensions are taken out of the platform's and device's
//! extension lists (string and `_WITH_VERSION` forms alike), and an
//! application sees a consistent picture: what is advertised works, and keeps
//! working across suspend, resume and remoting.
//!
//! Extensions without entry points of their own (cl_khr_fp64, the atomics,
//! cl_khr_spir, vendor pragmas and device queries, ...) and those whose
//! functions crane wraps (cl_khr_icd, cl_khr_il_program, cl_khr_subgroups,
//! cl_khr_create_command_queue) pass through unchanged. The list below holds
//! the extensions of the Khronos registry (and of the vendors crane is used
//! with) that bring functions crane does not wrap.

use opencl_sys::{cl_name_version, cl_uint};

/// Extensions whose functions crane answers NULL for.
const UNTRACKED: &[&str] = &[
    // Khronos
    "cl_khr_command_buffer",
    "cl_khr_command_buffer_multi_device",
    "cl_khr_command_buffer_mutable_dispatch",
    "cl_khr_d3d10_sharing",
    "cl_khr_d3d11_sharing",
    "cl_khr_dx9_media_sharing",
    "cl_khr_egl_event",
    "cl_khr_egl_image",
    "cl_khr_external_memory",
    "cl_khr_external_memory_dma_buf",
    "cl_khr_external_memory_dx",
    "cl_khr_external_memory_opaque_fd",
    "cl_khr_external_memory_win32",
    "cl_khr_external_semaphore",
    "cl_khr_external_semaphore_dx_fence",
    "cl_khr_external_semaphore_opaque_fd",
    "cl_khr_external_semaphore_sync_fd",
    "cl_khr_external_semaphore_win32",
    "cl_khr_gl_event",
    "cl_khr_gl_sharing",
    "cl_khr_semaphore",
    "cl_khr_suggested_local_work_size",
    "cl_khr_terminate_context",
    // Multi-vendor
    "cl_ext_buffer_device_address",
    "cl_ext_device_fission",
    "cl_ext_image_requirements_info",
    "cl_ext_migrate_memobject",
    // Vendors
    "cl_arm_import_memory",
    "cl_arm_shared_virtual_memory",
    "cl_img_generate_mipmap",
    "cl_img_use_gralloc_ptr",
    "cl_intel_accelerator",
    "cl_intel_create_buffer_with_properties",
    "cl_intel_dx9_media_sharing",
    "cl_intel_motion_estimation",
    "cl_intel_program_scope_host_pipe",
    "cl_intel_sharing_format_query",
    "cl_intel_unified_shared_memory",
    "cl_intel_va_api_media_sharing",
    "cl_nv_create_buffer",
    "cl_pocl_command_buffer_host_buffer",
    "cl_pocl_command_buffer_svm",
    "cl_pocl_content_size",
    "cl_qcom_ext_host_ptr",
];

/// Whether crane advertises the extension `name`.
pub fn advertised(name: &[u8]) -> bool {
    !UNTRACKED.iter().any(|u| u.as_bytes() == name)
}

/// The vendor's extension string with the untracked names taken out. Each
/// name leaves with the blanks that follow it, so the vendor's own separators
/// (PoCL pads some with several spaces) and its leading and trailing blanks
/// stay as they were. `s` holds no terminating NUL.
pub fn filter_string(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() && s[i].is_ascii_whitespace() {
        i += 1;
    }
    out.extend_from_slice(&s[..i]);
    while i < s.len() {
        let start = i;
        while i < s.len() && !s[i].is_ascii_whitespace() {
            i += 1;
        }
        let name_end = i;
        while i < s.len() && s[i].is_ascii_whitespace() {
            i += 1;
        }
        if advertised(&s[start..name_end]) {
            out.extend_from_slice(&s[start..i]);
        } else if i == s.len() && out.last().is_some_and(u8::is_ascii_whitespace) {
            // The last name left: the blanks before it now end the string;
            // give them the trailing blanks the vendor had instead.
            while out.last().is_some_and(u8::is_ascii_whitespace) && out.len() > leading(s) {
                out.pop();
            }
            out.extend_from_slice(&s[name_end..i]);
        }
    }
    out
}

fn leading(s: &[u8]) -> usize {
    s.iter().take_while(|b| b.is_ascii_whitespace()).count()
}

/// Whether a `cl_name_version` entry is advertised.
pub fn advertised_version(e: &cl_name_version) -> bool {
    let len = e.name.iter().position(|&c| c == 0).unwrap_or(e.name.len());
    advertised(&e.name[..len])
}

/// Number of `cl_name_version` entries in `bytes` bytes.
pub fn version_entries(bytes: usize) -> usize {
    bytes / std::mem::size_of::<cl_name_version>()
}

/// A `cl_name_version` for tests and callers building lists.
pub fn name_version(name: &str, version: cl_uint) -> cl_name_version {
    let mut e = cl_name_version {
        version,
        name: [0; 64],
    };
    for (d, s) in e.name.iter_mut().zip(name.bytes().take(63)) {
        *d = s;
    }
    e
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f(s: &str) -> String {
        String::from_utf8(filter_string(s.as_bytes())).unwrap()
    }

    #[test]
    fn untracked_names_leave_with_their_separator() {
        assert_eq!(f("cl_khr_icd cl_pocl_content_size"), "cl_khr_icd");
        assert_eq!(f("cl_khr_icd cl_pocl_content_size "), "cl_khr_icd ");
        assert_eq!(
            f("cl_khr_3d_image_writes cl_khr_command_buffer cl_khr_spir"),
            "cl_khr_3d_image_writes cl_khr_spir"
        );
        assert_eq!(
            f("a   cl_khr_command_buffer cl_khr_fp64"),
            "a   cl_khr_fp64"
        );
        assert_eq!(f("cl_khr_command_buffer cl_khr_fp64"), "cl_khr_fp64");
        assert_eq!(f(" cl_khr_gl_sharing  "), "   ");
        assert_eq!(f(""), "");
    }

    #[test]
    fn everything_else_passes_unchanged() {
        let s = "cl_khr_byte_addressable_store cl_khr_global_int32_base_atomics   cl_khr_il_program cl_khr_subgroups cl_nv_device_attribute_query ";
        assert_eq!(f(s), s);
        // A prefix of an untracked name is another name.
        assert_eq!(f("cl_khr_command_buffer_x"), "cl_khr_command_buffer_x");
    }

    #[test]
    fn versioned_entries_by_name() {
        assert!(advertised_version(&name_version("cl_khr_fp64", 1)));
        assert!(!advertised_version(&name_version(
            "cl_intel_unified_shared_memory",
            1
        )));
        assert_eq!(
            version_entries(3 * std::mem::size_of::<cl_name_version>()),
            3
        );
    }
}
