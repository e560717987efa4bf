//! `cranectl install-icd` / `uninstall-icd`: puts libcrane_opencl.so in front
//! of the installed OpenCL vendors for applications whose ICD loader
//! (libOpenCL.so.1) enumerates `/etc/OpenCL/vendors`.
//!
//! The loader loads every `.icd` file of that directory. For an application to
//! see each vendor once, through crane, the vendors' files move to crane's own
//! directory (`/etc/crane/vendors.d`, which only crane reads) and a single
//! `crane.icd` naming the library takes their place. Uninstalling moves them
//! back. Both are idempotent, and check for conflicts before changing anything.

use std::io::ErrorKind;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};

/// The file crane's entry has in the loader's directory.
pub const CRANE_ICD: &str = "crane.icd";

/// Where the ICD loader and crane look for `.icd` files.
#[derive(Debug, Clone)]
pub struct Layout {
    /// The ICD loader's directory: `$OCL_ICD_VENDORS`, else /etc/OpenCL/vendors.
    pub vendors_dir: PathBuf,
    /// crane's directory: `$CRANE_VENDORS_DIR`, else /etc/crane/vendors.d.
    pub crane_dir: PathBuf,
}

impl Layout {
    /// The directories the library and the loader use, from the same
    /// environment variables; `root` (an image being built) prefixes both.
    pub fn from_env(root: Option<&Path>) -> Layout {
        let dir = |var: &str, default: &str| {
            let d = std::env::var_os(var)
                .filter(|v| !v.is_empty())
                .map_or_else(|| PathBuf::from(default), PathBuf::from);
            under(root, &d)
        };
        Layout {
            vendors_dir: dir("OCL_ICD_VENDORS", "/etc/OpenCL/vendors"),
            crane_dir: dir("CRANE_VENDORS_DIR", "/etc/crane/vendors.d"),
        }
    }
}

/// `path` inside `root`, or `path` itself without one.
pub fn under(root: Option<&Path>, path: &Path) -> PathBuf {
    match root {
        Some(r) => r.join(path.strip_prefix("/").unwrap_or(path)),
        None => path.to_path_buf(),
    }
}

/// What an install or uninstall did.
#[derive(Debug, Default)]
pub struct Outcome {
    /// One sentence per change, for the operator.
    pub actions: Vec<String>,
    /// The vendor ICD files crane wraps afterwards (empty after uninstall).
    pub wrapped: Vec<String>,
}

/// The `.icd` files of a directory, by name.
fn icd_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let rd = match std::fs::read_dir(dir) {
        Ok(rd) => rd,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", dir.display())),
    };
    let mut files = Vec::new();
    for e in rd {
        let p = e
            .with_context(|| format!("cannot read {}", dir.display()))?
            .path();
        if p.extension().is_some_and(|x| x == "icd") && p.is_file() {
            files.push(p);
        }
    }
    files.sort();
    Ok(files)
}

/// Whether an ICD file in the loader's directory is crane's own entry.
fn is_crane_entry(file: &Path, lib: &Path) -> bool {
    if file.file_name().is_some_and(|n| n == CRANE_ICD) {
        return true;
    }
    let named = std::fs::read_to_string(file).unwrap_or_default();
    let named = named.lines().next().unwrap_or("").trim();
    named.contains("crane_opencl") || Path::new(named) == lib
}

/// Moves `from` to `to`; a file already at `to` with the same bytes counts as
/// moved. The caller has checked that `to` is free or identical.
fn move_file(from: &Path, to: &Path) -> Result<()> {
    if to.exists() {
        std::fs::remove_file(from).with_context(|| format!("cannot remove {}", from.display()))?;
        return Ok(());
    }
    match std::fs::rename(from, to) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == ErrorKind::CrossesDevices => {
            std::fs::copy(from, to)
                .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
            std::fs::remove_file(from).with_context(|| format!("cannot remove {}", from.display()))
        }
        Err(e) => {
            Err(e).with_context(|| format!("cannot move {} to {}", from.display(), to.display()))
        }
    }
}

/// Pairs each file with its place in `dir`, refusing if a different file with
/// the same name is already there.
fn destinations(files: &[PathBuf], dir: &Path) -> Result<Vec<(PathBuf, PathBuf)>> {
    let mut out = Vec::new();
    for f in files {
        let to = dir.join(f.file_name().context("an ICD file without a name")?);
        if to.exists() && std::fs::read(&to).ok() != std::fs::read(f).ok() {
            bail!(
                "{} already exists and differs from {}; move one of them away first",
                to.display(),
                f.display()
            );
        }
        out.push((f.clone(), to));
    }
    Ok(out)
}

/// Moves every vendor ICD file from the loader's directory to crane's and
/// writes `crane.icd` naming `lib` (the path as the loader will see it).
pub fn install(layout: &Layout, lib: &Path) -> Result<Outcome> {
    if !lib.is_absolute() {
        bail!(
            "the library path {} must be absolute: the ICD loader dlopens it from any directory",
            lib.display()
        );
    }
    let mut out = Outcome::default();
    let (crane, vendors): (Vec<PathBuf>, Vec<PathBuf>) = icd_files(&layout.vendors_dir)?
        .into_iter()
        .partition(|f| is_crane_entry(f, lib));
    let moves = destinations(&vendors, &layout.crane_dir)?;
    std::fs::create_dir_all(&layout.crane_dir)
        .with_context(|| format!("cannot create {}", layout.crane_dir.display()))?;
    std::fs::create_dir_all(&layout.vendors_dir)
        .with_context(|| format!("cannot create {}", layout.vendors_dir.display()))?;
    for (from, to) in &moves {
        move_file(from, to)?;
        out.actions
            .push(format!("moved {} to {}", from.display(), to.display()));
    }
    let entry = layout.vendors_dir.join(CRANE_ICD);
    // Another entry for crane (an older install elsewhere) would make the
    // loader show every vendor twice.
    for stale in crane.iter().filter(|f| **f != entry) {
        std::fs::remove_file(stale)
            .with_context(|| format!("cannot remove {}", stale.display()))?;
        out.actions.push(format!(
            "removed {}, another entry for crane",
            stale.display()
        ));
    }
    let content = format!("{}\n", lib.display());
    if std::fs::read_to_string(&entry).ok().as_deref() == Some(content.as_str()) {
        out.actions.push(format!(
            "{} already names {}",
            entry.display(),
            lib.display()
        ));
    } else {
        // Written beside and renamed, so the loader never reads half a file.
        let tmp = layout.vendors_dir.join(format!(".{CRANE_ICD}.tmp"));
        std::fs::write(&tmp, &content)
            .with_context(|| format!("cannot write {}", tmp.display()))?;
        std::fs::rename(&tmp, &entry)
            .with_context(|| format!("cannot write {}", entry.display()))?;
        out.actions.push(format!(
            "wrote {} naming {}",
            entry.display(),
            lib.display()
        ));
    }
    out.wrapped = icd_files(&layout.crane_dir)?
        .iter()
        .filter_map(|f| f.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    Ok(out)
}

/// Removes `crane.icd` and moves the vendors' ICD files back to the loader's
/// directory.
pub fn uninstall(layout: &Layout) -> Result<Outcome> {
    let mut out = Outcome::default();
    let moves = destinations(&icd_files(&layout.crane_dir)?, &layout.vendors_dir)?;
    let entry = layout.vendors_dir.join(CRANE_ICD);
    match std::fs::remove_file(&entry) {
        Ok(()) => out.actions.push(format!("removed {}", entry.display())),
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", entry.display())),
    }
    if !moves.is_empty() {
        std::fs::create_dir_all(&layout.vendors_dir)
            .with_context(|| format!("cannot create {}", layout.vendors_dir.display()))?;
    }
    for (from, to) in &moves {
        move_file(from, to)?;
        out.actions
            .push(format!("moved {} to {}", from.display(), to.display()));
    }
    // Only an empty directory goes; anything else in it is not ours to delete.
    if std::fs::remove_dir(&layout.crane_dir).is_ok() {
        out.actions
            .push(format!("removed {}", layout.crane_dir.display()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("cranectl-icd-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn layout(root: &Path) -> Layout {
        Layout {
            vendors_dir: root.join("etc/OpenCL/vendors"),
            crane_dir: root.join("etc/crane/vendors.d"),
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        icd_files(dir)
            .unwrap()
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    }

    const LIB: &str = "/usr/lib/crane/libcrane_opencl.so";

    #[test]
    fn install_moves_vendors_and_uninstall_restores_them() {
        let root = scratch("roundtrip");
        let l = layout(&root);
        std::fs::create_dir_all(&l.vendors_dir).unwrap();
        std::fs::write(l.vendors_dir.join("pocl.icd"), "libpocl.so.2\n").unwrap();
        std::fs::write(l.vendors_dir.join("nvidia.icd"), "libnvidia-opencl.so.1\n").unwrap();
        std::fs::write(l.vendors_dir.join("README"), "not an ICD\n").unwrap();

        let out = install(&l, Path::new(LIB)).unwrap();
        assert_eq!(names(&l.vendors_dir), ["crane.icd"]);
        assert_eq!(names(&l.crane_dir), ["nvidia.icd", "pocl.icd"]);
        assert_eq!(out.wrapped, ["nvidia.icd", "pocl.icd"]);
        assert_eq!(
            std::fs::read_to_string(l.vendors_dir.join("crane.icd")).unwrap(),
            format!("{LIB}\n")
        );
        assert!(l.vendors_dir.join("README").exists());

        // A second install changes nothing.
        let again = install(&l, Path::new(LIB)).unwrap();
        assert_eq!(again.actions.len(), 1, "{:?}", again.actions);
        assert_eq!(names(&l.crane_dir), ["nvidia.icd", "pocl.icd"]);

        uninstall(&l).unwrap();
        assert_eq!(names(&l.vendors_dir), ["nvidia.icd", "pocl.icd"]);
        assert_eq!(
            std::fs::read_to_string(l.vendors_dir.join("pocl.icd")).unwrap(),
            "libpocl.so.2\n"
        );
        assert!(!l.crane_dir.exists());
        // And a second uninstall too.
        assert!(uninstall(&l).unwrap().actions.is_empty());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_vendor_installed_later_is_moved_by_the_next_install() {
        let root = scratch("later");
        let l = layout(&root);
        std::fs::create_dir_all(&l.vendors_dir).unwrap();
        std::fs::write(l.vendors_dir.join("pocl.icd"), "libpocl.so.2\n").unwrap();
        install(&l, Path::new(LIB)).unwrap();
        std::fs::write(l.vendors_dir.join("intel.icd"), "libintelocl.so\n").unwrap();
        let out = install(&l, Path::new(LIB)).unwrap();
        assert_eq!(out.wrapped, ["intel.icd", "pocl.icd"]);
        assert_eq!(names(&l.vendors_dir), ["crane.icd"]);
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn a_conflicting_file_stops_install_before_any_change() {
        let root = scratch("conflict");
        let l = layout(&root);
        std::fs::create_dir_all(&l.vendors_dir).unwrap();
        std::fs::create_dir_all(&l.crane_dir).unwrap();
        std::fs::write(l.vendors_dir.join("a.icd"), "liba.so\n").unwrap();
        std::fs::write(l.vendors_dir.join("pocl.icd"), "libpocl.so.2\n").unwrap();
        std::fs::write(l.crane_dir.join("pocl.icd"), "/opt/other/libpocl.so\n").unwrap();
        let err = install(&l, Path::new(LIB)).unwrap_err().to_string();
        assert!(err.contains("differs"), "{err}");
        assert_eq!(names(&l.vendors_dir), ["a.icd", "pocl.icd"]);
        assert!(!l.vendors_dir.join("crane.icd").exists());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn crane_is_never_wrapped_and_the_library_path_must_be_absolute() {
        let root = scratch("self");
        let l = layout(&root);
        std::fs::create_dir_all(&l.vendors_dir).unwrap();
        std::fs::write(
            l.vendors_dir.join("old-crane.icd"),
            "/opt/libcrane_opencl.so\n",
        )
        .unwrap();
        install(&l, Path::new(LIB)).unwrap();
        assert!(names(&l.crane_dir).is_empty());
        assert_eq!(names(&l.vendors_dir), ["crane.icd"]);
        assert!(install(&l, Path::new("libcrane_opencl.so")).is_err());
        std::fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn root_prefixes_the_directories() {
        assert_eq!(
            under(
                Some(Path::new("/mnt/img")),
                Path::new("/etc/OpenCL/vendors")
            ),
            Path::new("/mnt/img/etc/OpenCL/vendors")
        );
        assert_eq!(
            under(None, Path::new("/etc/OpenCL/vendors")),
            Path::new("/etc/OpenCL/vendors")
        );
    }
}
