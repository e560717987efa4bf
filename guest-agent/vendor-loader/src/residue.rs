//! Descriptors and mappings of GPU device nodes held by the process.
//!
//! These, not the library code, pin a GPU kernel driver: as long as one
//! descriptor of `/dev/nvidia0` is open or one page of it is mapped, the
//! module cannot be removed. They are found by path in `/proc/self/fd` and
//! `/proc/self/maps`.

use std::ffi::OsStr;
use std::io;
use std::os::fd::RawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::UnloadError;

/// Which files count as GPU device nodes, and how long unloading waits for
/// vendor threads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DevicePolicy {
    /// A descriptor or mapping belongs to a device when its path starts with
    /// one of these (as a string: `/dev/nvidia` covers `/dev/nvidia0`,
    /// `/dev/nvidiactl` and `/dev/nvidia-uvm`).
    pub device_prefixes: Vec<PathBuf>,
    /// How long [`crate::VendorLibrary::close`] waits, once the vendor is
    /// unmapped, for threads it started to end before closing the libraries
    /// they run in (a library a thread still runs in is left mapped and
    /// reported). When the vendor stays mapped it does not wait.
    pub thread_exit_timeout: Duration,
}

impl Default for DevicePolicy {
    fn default() -> Self {
        Self {
            device_prefixes: ["/dev/nvidia", "/dev/dri/", "/dev/kfd"]
                .into_iter()
                .map(PathBuf::from)
                .collect(),
            thread_exit_timeout: Duration::from_secs(1),
        }
    }
}

impl DevicePolicy {
    /// Whether `path` names a device node under this policy.
    pub fn is_device(&self, path: &Path) -> bool {
        let path = path.as_os_str().as_bytes();
        self.device_prefixes
            .iter()
            .any(|prefix| path.starts_with(prefix.as_os_str().as_bytes()))
    }
}

/// An open descriptor of a device node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceFd {
    pub fd: RawFd,
    pub target: PathBuf,
}

/// A mapping of a device node, `start..end` in the address space.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceMapping {
    pub start: usize,
    pub end: usize,
    pub path: PathBuf,
}

/// The device descriptors and mappings the process holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Residue {
    pub fds: Vec<DeviceFd>,
    pub mappings: Vec<DeviceMapping>,
}

impl Residue {
    /// True when nothing in the process pins a device.
    pub fn is_empty(&self) -> bool {
        self.fds.is_empty() && self.mappings.is_empty()
    }
}

/// Lists the device descriptors and mappings the process holds now.
pub fn device_residue(policy: &DevicePolicy) -> io::Result<Residue> {
    Ok(Residue {
        fds: device_fds(policy)?,
        mappings: device_mappings(policy)?,
    })
}

fn device_fds(policy: &DevicePolicy) -> io::Result<Vec<DeviceFd>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let entry = entry?;
        let Some(fd) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        // The descriptor may be gone by now (the directory's own one is).
        let Ok(target) = std::fs::read_link(entry.path()) else {
            continue;
        };
        if policy.is_device(&target) {
            found.push(DeviceFd { fd, target });
        }
    }
    found.sort_by_key(|d| d.fd);
    Ok(found)
}

fn device_mappings(policy: &DevicePolicy) -> io::Result<Vec<DeviceMapping>> {
    let maps = std::fs::read("/proc/self/maps")?;
    Ok(maps
        .split(|&b| b == b'\n')
        .filter_map(parse_maps_line)
        .filter(|m| policy.is_device(&m.path))
        .collect())
}

/// Parses `start-end perms offset dev inode   path` from `/proc/self/maps`.
/// The path is everything after the inode, and may contain spaces.
fn parse_maps_line(line: &[u8]) -> Option<DeviceMapping> {
    let mut rest = line;
    let mut fields = [&[][..]; 5];
    for field in &mut fields {
        rest = rest.trim_ascii_start();
        let end = rest.iter().position(|b| b.is_ascii_whitespace())?;
        *field = &rest[..end];
        rest = &rest[end..];
    }
    let path = rest.trim_ascii();
    if path.is_empty() {
        return None;
    }
    let range = std::str::from_utf8(fields[0]).ok()?;
    let (start, end) = range.split_once('-')?;
    Some(DeviceMapping {
        start: usize::from_str_radix(start, 16).ok()?,
        end: usize::from_str_radix(end, 16).ok()?,
        path: PathBuf::from(OsStr::from_bytes(path)),
    })
}

/// Closes every device descriptor; returns those closed.
pub(crate) fn close_device_fds(policy: &DevicePolicy) -> Result<Vec<DeviceFd>, UnloadError> {
    let fds = device_fds(policy).map_err(UnloadError::ReadFdTable)?;
    for device in &fds {
        // SAFETY: closing a descriptor is what unloading is for; the vendor
        // that owned it is unloaded (or told to stop using devices).
        // Linux releases the descriptor even when close reports an error.
        if unsafe { libc::close(device.fd) } != 0 {
            log::warn!(
                "close of descriptor {} ({}) reported: {}.",
                device.fd,
                device.target.display(),
                io::Error::last_os_error()
            );
        }
    }
    Ok(fds)
}

/// Unmaps every device mapping; returns those unmapped.
pub(crate) fn unmap_device_mappings(
    policy: &DevicePolicy,
) -> Result<Vec<DeviceMapping>, UnloadError> {
    let mappings = device_mappings(policy).map_err(UnloadError::ReadMaps)?;
    for mapping in &mappings {
        // SAFETY: the range is a mapping of a device node as listed by the
        // kernel; nothing of the vendor that used it is left running in it.
        let rc = unsafe {
            libc::munmap(
                mapping.start as *mut libc::c_void,
                mapping.end - mapping.start,
            )
        };
        if rc != 0 {
            return Err(UnloadError::Unmap {
                start: mapping.start,
                end: mapping.end,
                path: mapping.path.clone(),
                source: io::Error::last_os_error(),
            });
        }
    }
    Ok(mappings)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_lines_are_parsed_with_paths_that_contain_spaces() {
        let line = b"7f12a0000000-7f12a0201000 rw-s 00000000 00:05 1043   /dev/nvidia0 (deleted)";
        assert_eq!(
            parse_maps_line(line),
            Some(DeviceMapping {
                start: 0x7f12a0000000,
                end: 0x7f12a0201000,
                path: PathBuf::from("/dev/nvidia0 (deleted)"),
            })
        );
        assert_eq!(
            parse_maps_line(b"7ffd1000-7ffd3000 rw-p 00000000 00:00 0 "),
            None,
            "anonymous mappings have no path"
        );
    }

    #[test]
    fn prefixes_match_as_strings_not_as_path_components() {
        let policy = DevicePolicy::default();
        for device in [
            "/dev/nvidia0",
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/dri/renderD128",
            "/dev/kfd",
        ] {
            assert!(policy.is_device(Path::new(device)), "{device}");
        }
        for other in ["/dev/null", "/dev/driver", "/usr/lib/libnvidia-opencl.so.1"] {
            assert!(!policy.is_device(Path::new(other)), "{other}");
        }
    }

    #[test]
    fn residue_lists_a_descriptor_and_a_mapping_of_a_device_file() {
        let dir = std::env::temp_dir().join(format!("crane-vl-residue-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let device = dir.join("fake0");
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&device)
            .unwrap();
        file.set_len(4096).unwrap();
        let policy = DevicePolicy {
            device_prefixes: vec![dir.clone()],
            ..DevicePolicy::default()
        };
        use std::os::fd::AsRawFd;
        // SAFETY: maps one page of a file this test owns, shared, and unmaps
        // it below.
        let page = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        assert_ne!(page, libc::MAP_FAILED);
        let residue = device_residue(&policy).unwrap();
        // SAFETY: the page mapped above.
        unsafe { libc::munmap(page, 4096) };
        drop(file);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(residue.fds.len(), 1, "{residue:?}");
        assert_eq!(residue.fds[0].target, device);
        assert_eq!(residue.mappings.len(), 1, "{residue:?}");
        assert_eq!(residue.mappings[0].start, page as usize);
        assert!(device_residue(&policy).unwrap().is_empty());
    }
}
