//! GPU kernel modules: unloading before the GPU is detached and loading after
//! one is attached. [`KernelModules`] uses the `delete_module`/`finit_module`
//! system calls (through nix) with its own `modules.dep` lookup, so the agent
//! needs neither modprobe nor libkmod in the guest image; [`ModuleBackend`]
//! lets the migration logic run against a fake in unit tests.

use std::ffi::CString;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::kmod::{DeleteModuleFlags, ModuleInitFlags, delete_module, finit_module};

#[derive(Debug, thiserror::Error)]
pub enum ModuleError {
    #[error("module {0} is in use")]
    InUse(String),
    #[error("module {name}: {op} failed: {errno}")]
    Syscall {
        name: String,
        op: &'static str,
        errno: Errno,
    },
    #[error("module {name} not found under {root}")]
    NotFound { name: String, root: PathBuf },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("module {0} has a name that cannot be passed to the kernel")]
    BadName(String),
}

/// Loading and unloading kernel modules by name.
pub trait ModuleBackend: Send + Sync {
    fn is_loaded(&self, name: &str) -> Result<bool, ModuleError>;
    /// Unloads one module (not its dependencies); refuses when in use.
    fn unload(&self, name: &str) -> Result<(), ModuleError>;
    /// Loads a module and the modules it depends on.
    fn load(&self, name: &str) -> Result<(), ModuleError>;
}

/// The kernel's own module names use `_` where files may use `-`.
pub fn canonical(name: &str) -> String {
    name.replace('-', "_")
}

fn module_name_of(file: &str) -> Option<String> {
    let base = file.rsplit('/').next()?;
    let stem = [".ko.xz", ".ko.zst", ".ko.gz", ".ko"]
        .iter()
        .find_map(|ext| base.strip_suffix(ext))?;
    Some(canonical(stem))
}

/// One line of `modules.dep`: the module's file and its dependencies' files
/// (paths relative to the release directory), in modprobe's order: the last
/// one is loaded first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DepEntry {
    pub file: String,
    pub deps: Vec<String>,
}

/// Finds a module's entry in `modules.dep` text.
pub fn find_dep(text: &str, name: &str) -> Option<DepEntry> {
    let want = canonical(name);
    text.lines().find_map(|line| {
        let (file, deps) = line.split_once(':')?;
        (module_name_of(file.trim())? == want).then(|| DepEntry {
            file: file.trim().to_string(),
            deps: deps.split_whitespace().map(String::from).collect(),
        })
    })
}

/// The `depends=` field of an uncompressed module's `.modinfo` section
/// (used when the image carries no `modules.dep`).
pub fn modinfo_depends(bytes: &[u8]) -> Vec<String> {
    let key = b"\0depends=";
    let Some(at) = bytes.windows(key.len()).position(|w| w == key) else {
        return Vec::new();
    };
    let rest = &bytes[at + key.len()..];
    let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
    String::from_utf8_lossy(&rest[..end])
        .split(',')
        .filter(|s| !s.is_empty())
        .map(canonical)
        .collect()
}

/// Modules of the running kernel.
pub struct KernelModules {
    /// `/lib/modules/<release>`.
    release_dir: PathBuf,
    params: std::collections::BTreeMap<String, String>,
    proc_modules: PathBuf,
}

impl KernelModules {
    pub fn new(root: &Path, params: std::collections::BTreeMap<String, String>) -> KernelModules {
        let release = nix::sys::utsname::uname()
            .map(|u| u.release().to_string_lossy().into_owned())
            .unwrap_or_default();
        KernelModules {
            release_dir: root.join(release),
            params,
            proc_modules: PathBuf::from("/proc/modules"),
        }
    }

    fn read(path: &Path) -> Result<Vec<u8>, ModuleError> {
        std::fs::read(path).map_err(|source| ModuleError::Read {
            path: path.to_path_buf(),
            source,
        })
    }

    /// A module's file and the modules to load before it, dependencies first.
    fn resolve(&self, name: &str) -> Result<(PathBuf, Vec<String>), ModuleError> {
        let dep = self.release_dir.join("modules.dep");
        if let Ok(text) = std::fs::read_to_string(&dep) {
            let e = find_dep(&text, name).ok_or_else(|| ModuleError::NotFound {
                name: name.to_string(),
                root: self.release_dir.clone(),
            })?;
            let deps = e
                .deps
                .iter()
                .rev()
                .filter_map(|d| module_name_of(d))
                .collect();
            return Ok((self.release_dir.join(e.file), deps));
        }
        let file = find_file(&self.release_dir, &canonical(name), 8).ok_or_else(|| {
            ModuleError::NotFound {
                name: name.to_string(),
                root: self.release_dir.clone(),
            }
        })?;
        let deps = if file.extension().is_some_and(|e| e == "ko") {
            modinfo_depends(&Self::read(&file)?)
        } else {
            Vec::new()
        };
        Ok((file, deps))
    }

    fn insert(&self, name: &str, file: &Path) -> Result<(), ModuleError> {
        let f = File::open(file).map_err(|source| ModuleError::Read {
            path: file.to_path_buf(),
            source,
        })?;
        let params = self.params.get(name).cloned().unwrap_or_default();
        let params = CString::new(params).map_err(|_| ModuleError::BadName(name.to_string()))?;
        let compressed = file.extension().is_none_or(|e| e != "ko");
        // MODULE_INIT_COMPRESSED_FILE (Linux 6.4+): the kernel decompresses.
        let flags = if compressed {
            ModuleInitFlags::from_bits_retain(4)
        } else {
            ModuleInitFlags::empty()
        };
        match finit_module(&f, &params, flags) {
            Ok(()) | Err(Errno::EEXIST) => Ok(()),
            Err(errno) => Err(ModuleError::Syscall {
                name: name.to_string(),
                op: "finit_module",
                errno,
            }),
        }
    }
}

fn find_file(dir: &Path, name: &str, depth: u32) -> Option<PathBuf> {
    let rd = std::fs::read_dir(dir).ok()?;
    let mut subdirs = Vec::new();
    for e in rd.flatten() {
        let p = e.path();
        let ft = e.file_type().ok()?;
        if ft.is_dir() {
            subdirs.push(p);
        } else if module_name_of(&e.file_name().to_string_lossy()).as_deref() == Some(name) {
            return Some(p);
        }
    }
    if depth == 0 {
        return None;
    }
    subdirs
        .into_iter()
        .find_map(|d| find_file(&d, name, depth - 1))
}

impl ModuleBackend for KernelModules {
    fn is_loaded(&self, name: &str) -> Result<bool, ModuleError> {
        let mut text = String::new();
        match File::open(&self.proc_modules).and_then(|f| f.take(1 << 20).read_to_string(&mut text))
        {
            Ok(_) => {}
            // A kernel without loadable modules has none loaded.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(source) => {
                return Err(ModuleError::Read {
                    path: self.proc_modules.clone(),
                    source,
                });
            }
        }
        let want = canonical(name);
        Ok(text
            .lines()
            .any(|l| l.split_whitespace().next() == Some(want.as_str())))
    }

    fn unload(&self, name: &str) -> Result<(), ModuleError> {
        let c = CString::new(canonical(name)).map_err(|_| ModuleError::BadName(name.into()))?;
        match delete_module(&c, DeleteModuleFlags::O_NONBLOCK) {
            Ok(()) | Err(Errno::ENOENT) => Ok(()),
            Err(Errno::EWOULDBLOCK) | Err(Errno::EBUSY) => Err(ModuleError::InUse(name.into())),
            Err(errno) => Err(ModuleError::Syscall {
                name: name.to_string(),
                op: "delete_module",
                errno,
            }),
        }
    }

    fn load(&self, name: &str) -> Result<(), ModuleError> {
        if self.is_loaded(name)? {
            return Ok(());
        }
        let (file, deps) = self.resolve(name)?;
        for d in deps {
            if !self.is_loaded(&d)? {
                let (dfile, _) = self.resolve(&d)?;
                self.insert(&d, &dfile)?;
            }
        }
        self.insert(&canonical(name), &file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEP: &str = "kernel/drivers/video/nvidia-drm.ko: kernel/drivers/video/nvidia-modeset.ko kernel/drivers/video/nvidia.ko kernel/drivers/gpu/drm/drm_kms_helper.ko.xz kernel/drivers/gpu/drm/drm.ko.xz
kernel/drivers/video/nvidia.ko:
kernel/drivers/gpu/drm/drm.ko.xz:
";

    #[test]
    fn modules_dep_lookup() {
        let e = find_dep(DEP, "nvidia_drm").unwrap();
        assert_eq!(e.file, "kernel/drivers/video/nvidia-drm.ko");
        assert_eq!(e.deps.len(), 4);
        assert_eq!(
            find_dep(DEP, "drm").unwrap().file,
            "kernel/drivers/gpu/drm/drm.ko.xz"
        );
        assert!(find_dep(DEP, "nvidia_uvm").is_none());
        assert_eq!(
            module_name_of("a/b/nvidia-drm.ko.zst").as_deref(),
            Some("nvidia_drm")
        );
        assert_eq!(module_name_of("README"), None);
    }

    #[test]
    fn modinfo_dependencies() {
        let blob = b"\x7fELF...\0license=GPL\0depends=drm,drm-kms-helper\0vermagic=6.1\0";
        assert_eq!(modinfo_depends(blob), vec!["drm", "drm_kms_helper"]);
        assert!(modinfo_depends(b"\0depends=\0").is_empty());
        assert!(modinfo_depends(b"nothing").is_empty());
    }

    #[test]
    fn resolve_without_modules_dep_reads_modinfo() {
        let root = std::env::temp_dir().join(format!("crane-kmod-{}", std::process::id()));
        let rel = root.join("6.1.0-test/kernel/drivers");
        std::fs::create_dir_all(&rel).unwrap();
        std::fs::write(rel.join("gpu-x.ko"), b"\0depends=drm\0").unwrap();
        let km = KernelModules {
            release_dir: root.join("6.1.0-test"),
            params: Default::default(),
            proc_modules: PathBuf::from("/proc/modules"),
        };
        let (file, deps) = km.resolve("gpu_x").unwrap();
        assert_eq!(file, rel.join("gpu-x.ko"));
        assert_eq!(deps, vec!["drm"]);
        assert!(matches!(
            km.resolve("nope"),
            Err(ModuleError::NotFound { .. })
        ));
        std::fs::write(root.join("6.1.0-test/modules.dep"), DEP).unwrap();
        let (file, deps) = km.resolve("nvidia_drm").unwrap();
        assert!(file.ends_with("kernel/drivers/video/nvidia-drm.ko"));
        assert_eq!(
            deps,
            vec!["drm", "drm_kms_helper", "nvidia", "nvidia_modeset"]
        );
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn loaded_modules_are_read_from_proc() {
        let km = KernelModules::new(Path::new("/lib/modules"), Default::default());
        assert!(!km.is_loaded("crane_no_such_module").unwrap());
    }
}
