//! Assembles an initramfs from files of the [`Sysroot`] (with the shared libraries every
//! ELF program needs, found the way the dynamic loader finds them), kernel modules (with
//! the modules they depend on), files from the build machine and generated text.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};

use flate2::Compression;
use flate2::write::GzEncoder;

use crate::cpio;
use crate::store::{Node, StoreError, Sysroot, normalize};

/// Directories the dynamic loader searches when a program names no run path (Debian's
/// multiarch layout; see ld.so(8)).
const DEFAULT_LIBRARY_DIRS: &[&str] = &[
    "/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu",
    "/lib",
    "/usr/lib",
    "/lib64",
];

#[derive(Debug, thiserror::Error)]
pub enum InitramfsError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("{path} is not a valid ELF file: {source}")]
    Elf {
        path: String,
        source: goblin::error::Error,
    },
    #[error(
        "{needed_by} needs {library}, which no locked package provides; add the package \
         that ships it to the image's packages and run `cargo xtask testbed lock`"
    )]
    MissingLibrary { library: String, needed_by: String },
    #[error(
        "{needed_by} needs version {version} of {library}, which the locked {library} \
         does not define: build it against the images' Debian release (or statically)"
    )]
    MissingSymbolVersion {
        needed_by: String,
        library: String,
        version: String,
    },
    #[error("kernel module {0} is not in the locked kernel package")]
    MissingModule(String),
    #[error(
        "{path} was built for kernel {built_for:?}, the images run {release}: build it \
         against the headers of that release"
    )]
    ModuleRelease {
        path: String,
        built_for: String,
        release: String,
    },
    #[error("{0} has no .modinfo section: not a kernel module")]
    NotAModule(String),
    #[error("kernel modules {0} depend on each other in a cycle")]
    ModuleCycle(String),
    #[error("the locked packages contain no kernel modules under /lib/modules")]
    NoKernel,
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> InitramfsError + '_ {
    move |source| InitramfsError::Io {
        path: path.display().to_string(),
        source,
    }
}

enum Content {
    Dir,
    File { data: FileData, mode: u32 },
    Symlink(String),
}

enum FileData {
    Path(PathBuf),
    Bytes(Vec<u8>),
}

/// The file tree of one initramfs under construction.
pub struct Initramfs<'s> {
    sysroot: &'s Sysroot,
    entries: BTreeMap<PathBuf, Content>,
    packages_used: BTreeSet<String>,
    elf_done: BTreeSet<PathBuf>,
    library_dirs: Vec<String>,
}

impl<'s> Initramfs<'s> {
    pub fn new(sysroot: &'s Sysroot) -> Self {
        Self {
            sysroot,
            entries: BTreeMap::new(),
            packages_used: BTreeSet::new(),
            elf_done: BTreeSet::new(),
            library_dirs: Vec::new(),
        }
    }

    /// Directories searched for libraries after an ELF file's own run paths and before
    /// the default ones, for plugins that rely on siblings their host loaded first.
    pub fn library_dirs(&mut self, dirs: &[PathBuf]) -> &mut Self {
        self.library_dirs = dirs.iter().map(|d| d.display().to_string()).collect();
        self
    }

    /// Names of the locked packages that supplied at least one file.
    pub fn packages_used(&self) -> &BTreeSet<String> {
        &self.packages_used
    }

    pub fn dir(&mut self, path: impl AsRef<Path>) -> &mut Self {
        self.entries.insert(normalize(path.as_ref()), Content::Dir);
        self
    }

    pub fn bytes(
        &mut self,
        path: impl AsRef<Path>,
        data: impl Into<Vec<u8>>,
        mode: u32,
    ) -> &mut Self {
        self.entries.insert(
            normalize(path.as_ref()),
            Content::File {
                data: FileData::Bytes(data.into()),
                mode,
            },
        );
        self
    }

    pub fn symlink(&mut self, path: impl AsRef<Path>, target: &str) -> &mut Self {
        self.entries.insert(
            normalize(path.as_ref()),
            Content::Symlink(target.to_owned()),
        );
        self
    }

    /// Copies an installed path (following and recreating its symlinks); ELF files bring
    /// their interpreter and shared libraries, directories their whole contents.
    pub fn from_sysroot(&mut self, path: impl AsRef<Path>) -> Result<&mut Self, InitramfsError> {
        let (links, target) = self.sysroot.resolve(path.as_ref())?;
        for link in links {
            let entry = self
                .sysroot
                .entry(&link)
                .expect("resolve returned an indexed link");
            if let Node::Symlink { target } = &entry.node {
                self.packages_used.insert(entry.package.clone());
                let target = target.display().to_string();
                self.symlink(&link, &target);
            }
        }
        let entry = self
            .sysroot
            .entry(&target)
            .expect("resolve returned an indexed path");
        self.packages_used.insert(entry.package.clone());
        match entry.node.clone() {
            Node::Dir => {
                let children: Vec<PathBuf> = self
                    .sysroot
                    .walk(&target)
                    .filter(|(p, _)| p.parent() == Some(target.as_path()))
                    .map(|(p, _)| p.clone())
                    .collect();
                self.dir(&target);
                for child in children {
                    self.from_sysroot(child)?;
                }
            }
            Node::File { source, mode } => {
                self.entries.insert(
                    target.clone(),
                    Content::File {
                        data: FileData::Path(source.clone()),
                        mode,
                    },
                );
                self.add_elf_dependencies(&target, &source)?;
            }
            Node::Symlink { .. } => unreachable!("resolve follows every symlink"),
        }
        Ok(self)
    }

    /// Copies a file of the build machine to `dest`; an ELF program brings its shared
    /// libraries from the sysroot (not from the build machine), so the image only holds
    /// locked files besides the ones named here.
    pub fn host_file(
        &mut self,
        source: &Path,
        dest: impl AsRef<Path>,
        mode: u32,
    ) -> Result<&mut Self, InitramfsError> {
        let dest = normalize(dest.as_ref());
        if !source.is_file() {
            return Err(InitramfsError::Io {
                path: source.display().to_string(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "not a file"),
            });
        }
        self.entries.insert(
            dest.clone(),
            Content::File {
                data: FileData::Path(source.to_path_buf()),
                mode,
            },
        );
        self.add_elf_dependencies(&dest, source)?;
        self.check_symbol_versions(&dest, source)?;
        Ok(self)
    }

    /// Checks that every symbol version an ELF file of the build machine needs (e.g.
    /// `GLIBC_2.34` of libc.so.6) is defined by the locked library it will meet in the
    /// image: a program built against a newer libc than the image's would fail to
    /// start, so the build fails instead, naming the version.
    fn check_symbol_versions(&self, installed: &Path, source: &Path) -> Result<(), InitramfsError> {
        let data = std::fs::read(source).map_err(io_err(source))?;
        if !data.starts_with(b"\x7fELF") {
            return Ok(());
        }
        for (library, versions) in needed_versions(&data, source)? {
            let Some(lib_path) = DEFAULT_LIBRARY_DIRS
                .iter()
                .map(|dir| Path::new(dir).join(&library))
                .find(|candidate| self.sysroot.resolve(candidate).is_ok())
            else {
                continue;
            };
            let (_, target) = self.sysroot.resolve(&lib_path)?;
            let Some(Node::File {
                source: lib_source, ..
            }) = self.sysroot.entry(&target).map(|e| &e.node)
            else {
                continue;
            };
            let lib_data = std::fs::read(lib_source).map_err(io_err(lib_source))?;
            let defined = defined_versions(&lib_data, lib_source)?;
            if let Some(missing) = versions.into_iter().find(|v| !defined.contains(v)) {
                return Err(InitramfsError::MissingSymbolVersion {
                    needed_by: installed.display().to_string(),
                    library,
                    version: missing,
                });
            }
        }
        Ok(())
    }

    fn add_elf_dependencies(
        &mut self,
        installed: &Path,
        source: &Path,
    ) -> Result<(), InitramfsError> {
        if !self.elf_done.insert(installed.to_path_buf()) {
            return Ok(());
        }
        let data = std::fs::read(source).map_err(io_err(source))?;
        if !data.starts_with(b"\x7fELF") {
            return Ok(());
        }
        let elf = goblin::elf::Elf::parse(&data).map_err(|e| InitramfsError::Elf {
            path: source.display().to_string(),
            source: e,
        })?;
        if let Some(interpreter) = elf.interpreter {
            self.from_sysroot(interpreter)?;
        }
        let origin = installed
            .parent()
            .unwrap_or(Path::new("/"))
            .display()
            .to_string();
        let run_paths: Vec<String> = elf
            .runpaths
            .iter()
            .chain(elf.rpaths.iter())
            .flat_map(|p| p.split(':'))
            .map(|p| p.replace("$ORIGIN", &origin).replace("${ORIGIN}", &origin))
            .collect();
        let libraries: Vec<String> = elf.libraries.iter().map(|s| (*s).to_owned()).collect();
        for library in libraries {
            let found = run_paths
                .iter()
                .chain(self.library_dirs.iter())
                .map(String::as_str)
                .chain(DEFAULT_LIBRARY_DIRS.iter().copied())
                .map(|dir| Path::new(dir).join(&library))
                .find(|candidate| self.sysroot.resolve(candidate).is_ok());
            match found {
                Some(path) => {
                    self.from_sysroot(path)?;
                }
                None => {
                    return Err(InitramfsError::MissingLibrary {
                        library,
                        needed_by: installed.display().to_string(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The kernel release whose modules the sysroot holds (the single directory under
    /// /lib/modules).
    pub fn kernel_release(&self) -> Result<String, InitramfsError> {
        self.sysroot
            .walk(Path::new("/lib/modules"))
            .find_map(|(p, _)| {
                let rest = p.strip_prefix("/lib/modules").ok()?;
                (rest.components().count() == 1).then(|| rest.display().to_string())
            })
            .ok_or(InitramfsError::NoKernel)
    }

    /// Adds kernel modules and those they depend on (read from each module's
    /// `.modinfo`, since Debian's package ships no modules.dep). Returns the installed
    /// paths in an order `insmod` can load them in.
    pub fn modules(&mut self, names: &[&str]) -> Result<Vec<PathBuf>, InitramfsError> {
        let release = self.kernel_release()?;
        let base = PathBuf::from("/lib/modules").join(&release);
        let index: BTreeMap<String, PathBuf> = self
            .sysroot
            .walk(&base)
            .filter_map(|(p, _)| {
                let file = p.file_name()?.to_str()?;
                let name = file.strip_suffix(".ko")?;
                Some((name.replace('-', "_"), p.clone()))
            })
            .collect();
        let mut order = Vec::new();
        for name in names {
            self.load_module(&index, &name.replace('-', "_"), &mut order)?;
        }
        Ok(order)
    }

    /// Adds kernel modules built outside the kernel package (a GPU driver's), at
    /// `/lib/modules/RELEASE/updates/`, after the in-tree modules they depend on
    /// and each other in dependency order. Each must have been built for the
    /// images' kernel release (its `vermagic`). Returns the installed paths in an
    /// order `insmod` can load them in.
    pub fn extra_modules(&mut self, files: &[PathBuf]) -> Result<Vec<PathBuf>, InitramfsError> {
        if files.is_empty() {
            return Ok(Vec::new());
        }
        let release = self.kernel_release()?;
        let mut extra: BTreeMap<String, (PathBuf, Vec<String>)> = BTreeMap::new();
        for file in files {
            let data = std::fs::read(file).map_err(io_err(file))?;
            let info = modinfo(&data, file)?
                .ok_or_else(|| InitramfsError::NotAModule(file.display().to_string()))?;
            let built_for = field(&info, "vermagic").unwrap_or_default();
            if built_for.split_whitespace().next() != Some(release.as_str()) {
                return Err(InitramfsError::ModuleRelease {
                    path: file.display().to_string(),
                    built_for: built_for.to_owned(),
                    release,
                });
            }
            extra.insert(
                module_name(file),
                (file.clone(), module_dependencies(&data, file)?),
            );
        }
        let base = PathBuf::from("/lib/modules").join(&release);
        let index: BTreeMap<String, PathBuf> = self
            .sysroot
            .walk(&base)
            .map(|(p, _)| (module_name(p), p.clone()))
            .filter(|(name, p)| !name.is_empty() && p.extension().is_some_and(|e| e == "ko"))
            .collect();
        let mut order = Vec::new();
        let mut in_tree = Vec::new();
        let names: Vec<String> = extra.keys().cloned().collect();
        for name in names {
            self.load_extra(
                &index,
                &extra,
                &base,
                &name,
                &mut Vec::new(),
                &mut in_tree,
                &mut order,
            )?;
        }
        Ok(in_tree.into_iter().chain(order).collect())
    }

    #[allow(clippy::too_many_arguments)]
    fn load_extra(
        &mut self,
        index: &BTreeMap<String, PathBuf>,
        extra: &BTreeMap<String, (PathBuf, Vec<String>)>,
        base: &Path,
        name: &str,
        visiting: &mut Vec<String>,
        in_tree: &mut Vec<PathBuf>,
        order: &mut Vec<PathBuf>,
    ) -> Result<(), InitramfsError> {
        let Some((file, deps)) = extra.get(name) else {
            return self.load_module(index, name, in_tree);
        };
        let dest = base
            .join("updates")
            .join(file.file_name().unwrap_or_default());
        if order.contains(&dest) {
            return Ok(());
        }
        if visiting.iter().any(|v| v == name) {
            return Err(InitramfsError::ModuleCycle(visiting.join(" -> ")));
        }
        visiting.push(name.to_owned());
        for dep in deps {
            let dep = dep.replace('-', "_");
            self.load_extra(index, extra, base, &dep, visiting, in_tree, order)?;
        }
        visiting.pop();
        self.entries.insert(
            dest.clone(),
            Content::File {
                data: FileData::Path(file.clone()),
                mode: 0o644,
            },
        );
        order.push(dest);
        Ok(())
    }

    fn load_module(
        &mut self,
        index: &BTreeMap<String, PathBuf>,
        name: &str,
        order: &mut Vec<PathBuf>,
    ) -> Result<(), InitramfsError> {
        let path = index
            .get(name)
            .ok_or_else(|| InitramfsError::MissingModule(name.to_owned()))?
            .clone();
        if order.contains(&path) {
            return Ok(());
        }
        let Some(Node::File { source, .. }) = self.sysroot.entry(&path).map(|e| e.node.clone())
        else {
            return Err(InitramfsError::MissingModule(name.to_owned()));
        };
        let data = std::fs::read(&source).map_err(io_err(&source))?;
        for dependency in module_dependencies(&data, &source)? {
            self.load_module(index, &dependency.replace('-', "_"), order)?;
        }
        self.from_sysroot(&path)?;
        order.push(path);
        Ok(())
    }

    /// Whether the image already has something at `path`.
    pub fn contains(&self, path: impl AsRef<Path>) -> bool {
        self.entries.contains_key(&normalize(path.as_ref()))
    }

    /// The image's files and symlinks (directories left out): each path with its
    /// symlink target, if it is one.
    pub fn files_and_links(&self) -> Vec<(PathBuf, Option<String>)> {
        self.entries
            .iter()
            .filter_map(|(path, content)| match content {
                Content::Dir => None,
                Content::File { .. } => Some((path.clone(), None)),
                Content::Symlink(target) => Some((path.clone(), Some(target.clone()))),
            })
            .collect()
    }

    /// One line per entry (path, kind, mode, and the source file's size and mtime or
    /// the bytes' length and hash): equal manifests give equal archives, so builds can
    /// skip work whose inputs did not change.
    pub fn manifest(&self) -> String {
        let mut out = String::new();
        for (path, content) in &self.entries {
            let line = match content {
                Content::Dir => format!("{} dir\n", path.display()),
                Content::Symlink(target) => format!("{} link {target}\n", path.display()),
                Content::File { data, mode } => match data {
                    FileData::Path(source) => {
                        let meta = std::fs::metadata(source).ok();
                        let size = meta.as_ref().map_or(0, std::fs::Metadata::len);
                        let mtime = meta
                            .and_then(|m| m.modified().ok())
                            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                            .map_or(0, |d| d.as_nanos());
                        format!(
                            "{} file {mode:o} {} {size} {mtime}\n",
                            path.display(),
                            source.display()
                        )
                    }
                    FileData::Bytes(bytes) => {
                        let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
                            (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3)
                        });
                        format!(
                            "{} bytes {mode:o} {} {hash:016x}\n",
                            path.display(),
                            bytes.len()
                        )
                    }
                },
            };
            out.push_str(&line);
        }
        out
    }

    /// Writes the tree into the empty directory `dir` (as input for a file-system image
    /// builder): files are hard links to the unpacked packages where the mode allows,
    /// copies otherwise.
    pub fn write_tree(&self, dir: &Path) -> Result<(), InitramfsError> {
        use std::os::unix::fs::PermissionsExt;
        for (path, content) in &self.entries {
            let dest = dir.join(path.strip_prefix("/").unwrap_or(path));
            if let Some(parent) = dest.parent() {
                std::fs::create_dir_all(parent).map_err(io_err(parent))?;
            }
            match content {
                Content::Dir => std::fs::create_dir_all(&dest).map_err(io_err(&dest))?,
                Content::Symlink(target) => {
                    std::os::unix::fs::symlink(target, &dest).map_err(io_err(&dest))?;
                }
                Content::File { data, mode } => {
                    match data {
                        FileData::Path(source) => {
                            let same_mode = std::fs::metadata(source)
                                .is_ok_and(|m| m.permissions().mode() & 0o7777 == *mode);
                            if !(same_mode && std::fs::hard_link(source, &dest).is_ok()) {
                                std::fs::copy(source, &dest).map_err(io_err(source))?;
                            }
                        }
                        FileData::Bytes(bytes) => {
                            std::fs::write(&dest, bytes).map_err(io_err(&dest))?;
                        }
                    }
                    std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(*mode))
                        .map_err(io_err(&dest))?;
                }
            }
        }
        Ok(())
    }

    /// Writes the gzip-compressed newc archive; every directory on the way to an entry
    /// is included, so the archive unpacks without relying on the kernel's defaults.
    pub fn write_gz(&self, out: &Path) -> Result<(), InitramfsError> {
        let mut all: BTreeMap<PathBuf, &Content> = BTreeMap::new();
        static DIR: Content = Content::Dir;
        for (path, content) in &self.entries {
            for ancestor in path.ancestors().skip(1) {
                if ancestor != Path::new("/") {
                    all.entry(ancestor.to_path_buf()).or_insert(&DIR);
                }
            }
            all.insert(path.clone(), content);
        }
        // Unique per process: two builds (a test and `testbed up`) may share `out`.
        let tmp = out.with_extension(format!("tmp{}", std::process::id()));
        let file = std::fs::File::create(&tmp).map_err(io_err(&tmp))?;
        let gz = GzEncoder::new(std::io::BufWriter::new(file), Compression::new(6));
        let mut writer = cpio::Writer::new(gz);
        for (path, content) in all {
            let name = path
                .strip_prefix("/")
                .unwrap_or(&path)
                .display()
                .to_string();
            let result = match content {
                Content::Dir => writer.member(&name, 0o755, cpio::Member::Dir),
                Content::Symlink(target) => {
                    writer.member(&name, 0o777, cpio::Member::Symlink(target))
                }
                Content::File { data, mode } => {
                    let bytes = match data {
                        FileData::Bytes(b) => std::borrow::Cow::Borrowed(b.as_slice()),
                        FileData::Path(p) => {
                            std::borrow::Cow::Owned(std::fs::read(p).map_err(io_err(p))?)
                        }
                    };
                    writer.member(&name, *mode, cpio::Member::File(&bytes))
                }
            };
            result.map_err(io_err(out))?;
        }
        let mut buffered = writer
            .finish()
            .and_then(|gz| gz.finish())
            .map_err(io_err(out))?;
        buffered.flush().map_err(io_err(out))?;
        drop(buffered);
        std::fs::rename(&tmp, out).map_err(io_err(out))
    }
}

fn parse_elf<'a>(data: &'a [u8], path: &Path) -> Result<goblin::elf::Elf<'a>, InitramfsError> {
    goblin::elf::Elf::parse(data).map_err(|e| InitramfsError::Elf {
        path: path.display().to_string(),
        source: e,
    })
}

/// The symbol versions an ELF file needs, by library (its `.gnu.version_r`).
fn needed_versions(
    data: &[u8],
    path: &Path,
) -> Result<BTreeMap<String, BTreeSet<String>>, InitramfsError> {
    let elf = parse_elf(data, path)?;
    let mut needed: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    if let Some(verneed) = &elf.verneed {
        for need in verneed.iter() {
            let Some(library) = elf.dynstrtab.get_at(need.vn_file) else {
                continue;
            };
            let versions = needed.entry(library.to_owned()).or_default();
            for aux in need.iter() {
                if let Some(version) = elf.dynstrtab.get_at(aux.vna_name) {
                    versions.insert(version.to_owned());
                }
            }
        }
    }
    Ok(needed)
}

/// The symbol versions a shared library defines (its `.gnu.version_d`).
fn defined_versions(data: &[u8], path: &Path) -> Result<BTreeSet<String>, InitramfsError> {
    let elf = parse_elf(data, path)?;
    let mut defined = BTreeSet::new();
    if let Some(verdef) = &elf.verdef {
        for def in verdef.iter() {
            for aux in def.iter() {
                if let Some(version) = elf.dynstrtab.get_at(aux.vda_name) {
                    defined.insert(version.to_owned());
                }
            }
        }
    }
    Ok(defined)
}

/// The `depends=` list of a kernel module's `.modinfo` section.
/// The fields of a kernel module's `.modinfo` section (`key=value` strings), or
/// None when it has none.
fn modinfo(data: &[u8], path: &Path) -> Result<Option<Vec<(String, String)>>, InitramfsError> {
    let elf = goblin::elf::Elf::parse(data).map_err(|e| InitramfsError::Elf {
        path: path.display().to_string(),
        source: e,
    })?;
    for section in &elf.section_headers {
        if elf.shdr_strtab.get_at(section.sh_name) != Some(".modinfo") {
            continue;
        }
        let start = section.sh_offset as usize;
        let end = start + section.sh_size as usize;
        let Some(bytes) = data.get(start..end) else {
            break;
        };
        return Ok(Some(
            bytes
                .split(|b| *b == 0)
                .filter_map(|field| {
                    let text = String::from_utf8_lossy(field);
                    let (k, v) = text.split_once('=')?;
                    Some((k.to_owned(), v.to_owned()))
                })
                .collect(),
        ));
    }
    Ok(None)
}

fn field<'a>(info: &'a [(String, String)], key: &str) -> Option<&'a str> {
    info.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

fn module_dependencies(data: &[u8], path: &Path) -> Result<Vec<String>, InitramfsError> {
    let info = modinfo(data, path)?.unwrap_or_default();
    Ok(field(&info, "depends")
        .unwrap_or_default()
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect())
}

/// A module's name as the kernel knows it (dashes are underscores).
fn module_name(path: &Path) -> String {
    path.file_name()
        .and_then(|f| f.to_str())
        .map(|f| f.strip_suffix(".ko").unwrap_or(f).replace('-', "_"))
        .unwrap_or_default()
}

/// An ELF shared library's DT_SONAME.
pub fn soname(path: &Path) -> Result<Option<String>, InitramfsError> {
    let data = std::fs::read(path).map_err(io_err(path))?;
    let elf = goblin::elf::Elf::parse(&data).map_err(|e| InitramfsError::Elf {
        path: path.display().to_string(),
        source: e,
    })?;
    Ok(elf.soname.map(str::to_owned))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    /// Names and symlink targets of a gzip'ed newc archive, in order.
    fn list_archive(path: &Path) -> Vec<(String, Option<String>)> {
        let mut data = Vec::new();
        flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
            .read_to_end(&mut data)
            .unwrap();
        let mut out = Vec::new();
        let mut pos = 0;
        let field = |d: &[u8], i: usize| {
            usize::from_str_radix(std::str::from_utf8(&d[i..i + 8]).unwrap(), 16).unwrap()
        };
        let align = |n: usize| (n + 3) & !3;
        loop {
            assert_eq!(&data[pos..pos + 6], b"070701");
            let mode = field(&data, pos + 14);
            let size = field(&data, pos + 54);
            let namesize = field(&data, pos + 94);
            let name = std::str::from_utf8(&data[pos + 110..pos + 110 + namesize - 1])
                .unwrap()
                .to_owned();
            let body = align(pos + 110 + namesize);
            if name == "TRAILER!!!" {
                return out;
            }
            let target = (mode & 0o170000 == 0o120000)
                .then(|| String::from_utf8(data[body..body + size].to_vec()).unwrap());
            out.push((name, target));
            pos = align(body + size);
        }
    }

    /// A sysroot laid out like Debian's libc6 package plus one program, made from the
    /// build machine's own /usr/bin/true and its libraries.
    fn fake_sysroot(dir: &Path) -> Sysroot {
        let libc6 = dir.join("libc6");
        let coreutils = dir.join("coreutils");
        let multiarch = libc6.join("lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&multiarch).unwrap();
        std::fs::create_dir_all(libc6.join("lib64")).unwrap();
        std::fs::create_dir_all(coreutils.join("usr/bin")).unwrap();
        for lib in ["libc.so.6", "ld-linux-x86-64.so.2"] {
            std::fs::copy(
                Path::new("/lib/x86_64-linux-gnu").join(lib),
                multiarch.join(lib),
            )
            .unwrap();
        }
        std::os::unix::fs::symlink(
            "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
            libc6.join("lib64/ld-linux-x86-64.so.2"),
        )
        .unwrap();
        std::fs::copy("/usr/bin/true", coreutils.join("usr/bin/true")).unwrap();
        let mut sysroot = Sysroot::default();
        sysroot.add_package("coreutils", &coreutils).unwrap();
        sysroot.add_package("libc6", &libc6).unwrap();
        sysroot
    }

    /// A kernel module stand-in: an ELF object whose .modinfo says `fields`
    /// (built with the build machine's gcc).
    fn fake_module(dir: &Path, file: &str, fields: &[&str]) -> PathBuf {
        let c = dir.join(format!("{file}.c"));
        let info: String = fields.iter().map(|f| format!("{f}\\0")).collect();
        std::fs::write(
            &c,
            format!(
                "__attribute__((section(\".modinfo\"), used)) static const char m[] = \"{info}\";\n"
            ),
        )
        .unwrap();
        let out = dir.join(file);
        let status = std::process::Command::new("gcc")
            .arg("-c")
            .arg("-o")
            .arg(&out)
            .arg(&c)
            .status()
            .expect("run gcc");
        assert!(status.success());
        out
    }

    #[test]
    fn out_of_tree_modules_come_after_what_they_depend_on() {
        let dir = tempfile::tempdir().unwrap();
        let kernel = dir.path().join("linux-image");
        let drivers = kernel.join("lib/modules/6.1.0-9-amd64/kernel/drivers");
        std::fs::create_dir_all(&drivers).unwrap();
        let drm = fake_module(
            dir.path(),
            "drm.ko",
            &["depends=", "vermagic=6.1.0-9-amd64 SMP"],
        );
        std::fs::copy(&drm, drivers.join("drm.ko")).unwrap();
        let mut sysroot = Sysroot::default();
        sysroot.add_package("linux-image", &kernel).unwrap();
        let gpu = dir.path().join("gpu");
        std::fs::create_dir_all(&gpu).unwrap();
        let magic = "vermagic=6.1.0-9-amd64 SMP preempt mod_unload modversions";
        let nvidia = fake_module(&gpu, "nvidia.ko", &["depends=", magic]);
        let uvm = fake_module(&gpu, "nvidia-uvm.ko", &["depends=nvidia", magic]);
        let modeset = fake_module(&gpu, "nvidia-modeset.ko", &["depends=nvidia", magic]);
        let nvdrm = fake_module(
            &gpu,
            "nvidia-drm.ko",
            &["depends=nvidia-modeset,drm", magic],
        );
        let mut image = Initramfs::new(&sysroot);
        let order = image
            .extra_modules(&[nvdrm.clone(), uvm.clone(), nvidia.clone(), modeset.clone()])
            .unwrap();
        let base = "/lib/modules/6.1.0-9-amd64";
        let names: Vec<String> = order.iter().map(|p| p.display().to_string()).collect();
        assert_eq!(
            names,
            [
                format!("{base}/kernel/drivers/drm.ko"),
                format!("{base}/updates/nvidia.ko"),
                format!("{base}/updates/nvidia-modeset.ko"),
                format!("{base}/updates/nvidia-drm.ko"),
                format!("{base}/updates/nvidia-uvm.ko"),
            ]
        );
        for path in &order {
            assert!(image.contains(path), "{} not in the image", path.display());
        }

        // Built for another kernel: refused, naming both releases.
        let other = fake_module(&gpu, "other.ko", &["vermagic=6.12.0-1-amd64 SMP"]);
        let e = Initramfs::new(&sysroot)
            .extra_modules(&[other])
            .unwrap_err();
        assert!(
            e.to_string().contains("6.12.0-1-amd64") && e.to_string().contains("6.1.0-9-amd64"),
            "{e}"
        );
        // Not a module at all.
        let e = Initramfs::new(&sysroot)
            .extra_modules(&[PathBuf::from("/usr/bin/true")])
            .unwrap_err();
        assert!(matches!(e, InitramfsError::NotAModule(_)), "{e}");
        // A cycle.
        let a = fake_module(&gpu, "a.ko", &["depends=b", magic]);
        let b = fake_module(&gpu, "b.ko", &["depends=a", magic]);
        let e = Initramfs::new(&sysroot).extra_modules(&[a, b]).unwrap_err();
        assert!(matches!(e, InitramfsError::ModuleCycle(_)), "{e}");
    }

    #[test]
    fn programs_bring_their_interpreter_and_libraries() {
        let dir = tempfile::tempdir().unwrap();
        let sysroot = fake_sysroot(dir.path());
        let mut image = Initramfs::new(&sysroot);
        image.from_sysroot("/usr/bin/true").unwrap();
        image.bytes("/etc/motd", "hi\n", 0o644);
        let used: Vec<&str> = image.packages_used().iter().map(String::as_str).collect();
        assert_eq!(used, ["coreutils", "libc6"]);
        let out = dir.path().join("image.cpio.gz");
        image.write_gz(&out).unwrap();
        let listing = list_archive(&out);
        let names: Vec<&str> = listing.iter().map(|(n, _)| n.as_str()).collect();
        for wanted in [
            "etc",
            "etc/motd",
            "lib",
            "lib/x86_64-linux-gnu",
            "lib/x86_64-linux-gnu/libc.so.6",
            "lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
            "lib64/ld-linux-x86-64.so.2",
            "usr/bin/true",
        ] {
            assert!(names.contains(&wanted), "{wanted} missing from {names:?}");
        }
        let link = listing
            .iter()
            .find(|(n, _)| n == "lib64/ld-linux-x86-64.so.2")
            .unwrap();
        assert_eq!(
            link.1.as_deref(),
            Some("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2")
        );
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted, "parents come before children");

        // Same inputs, same bytes.
        let again = dir.path().join("again.cpio.gz");
        image.write_gz(&again).unwrap();
        assert_eq!(std::fs::read(&out).unwrap(), std::fs::read(&again).unwrap());
    }

    #[test]
    fn host_programs_must_find_their_symbol_versions_in_the_locked_libc() {
        let dir = tempfile::tempdir().unwrap();
        let sysroot = fake_sysroot(dir.path());
        let mut image = Initramfs::new(&sysroot);
        image
            .host_file(Path::new("/usr/bin/true"), "/bin/true", 0o755)
            .expect("the build machine's true runs on its own libc");

        // A "libc" that lacks versions true needs: libm defines neither GLIBC_2.14
        // (memcpy) nor GLIBC_2.34 (__libc_start_main). The first missing one, in
        // name order, is reported.
        let old = tempfile::tempdir().unwrap();
        let libc6 = old.path().join("libc6/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&libc6).unwrap();
        std::fs::copy("/lib/x86_64-linux-gnu/libm.so.6", libc6.join("libc.so.6")).unwrap();
        std::fs::copy(
            "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
            libc6.join("ld-linux-x86-64.so.2"),
        )
        .unwrap();
        std::fs::create_dir_all(old.path().join("libc6/lib64")).unwrap();
        std::os::unix::fs::symlink(
            "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
            old.path().join("libc6/lib64/ld-linux-x86-64.so.2"),
        )
        .unwrap();
        let mut old_root = Sysroot::default();
        old_root
            .add_package("libc6", &old.path().join("libc6"))
            .unwrap();
        let err = Initramfs::new(&old_root)
            .host_file(Path::new("/usr/bin/true"), "/bin/true", 0o755)
            .err()
            .expect("GLIBC_2.14 and GLIBC_2.34 are missing");
        match err {
            InitramfsError::MissingSymbolVersion {
                library, version, ..
            } => {
                assert_eq!(library, "libc.so.6");
                assert_eq!(version, "GLIBC_2.14");
            }
            other => panic!("{other}"),
        }
    }

    #[test]
    fn library_dirs_resolve_plugins_without_run_paths() {
        // Like PoCL's device plugins: a library needing a sibling by bare name, with
        // no run path; here libm.so.6 and the libc.so.6 it needs sit in /opt/x.
        let dir = tempfile::tempdir().unwrap();
        let package = dir.path().join("only");
        let opt = package.join("opt/x");
        let multiarch = package.join("lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&opt).unwrap();
        std::fs::create_dir_all(&multiarch).unwrap();
        std::fs::create_dir_all(package.join("lib64")).unwrap();
        for lib in ["libm.so.6", "libc.so.6"] {
            std::fs::copy(Path::new("/lib/x86_64-linux-gnu").join(lib), opt.join(lib)).unwrap();
        }
        std::fs::copy(
            "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
            multiarch.join("ld-linux-x86-64.so.2"),
        )
        .unwrap();
        std::os::unix::fs::symlink(
            "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2",
            package.join("lib64/ld-linux-x86-64.so.2"),
        )
        .unwrap();
        let mut root = Sysroot::default();
        root.add_package("only", &package).unwrap();
        let err = Initramfs::new(&root)
            .from_sysroot("/opt/x/libm.so.6")
            .err()
            .expect("no run path names /opt/x");
        assert!(
            matches!(err, InitramfsError::MissingLibrary { ref library, .. } if library == "libc.so.6"),
            "{err}"
        );
        let mut image = Initramfs::new(&root);
        image.library_dirs(&[PathBuf::from("/opt/x")]);
        image
            .from_sysroot("/opt/x/libm.so.6")
            .expect("found through the library dir");
        assert!(image.entries.contains_key(Path::new("/opt/x/libc.so.6")));
    }

    #[test]
    fn a_library_outside_the_sysroot_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let sysroot = fake_sysroot(dir.path());
        let mut image = Initramfs::new(&sysroot);
        // /usr/bin/ls needs more than libc (libselinux at least): not in the fake sysroot.
        let err = image
            .host_file(Path::new("/usr/bin/ls"), "/bin/ls", 0o755)
            .err()
            .expect("ls needs libraries the sysroot lacks");
        assert!(
            matches!(err, InitramfsError::MissingLibrary { .. }),
            "{err}"
        );
    }
}
