//! Reproducible builders for the images crane's VMs boot: the Xen hypervisor, the
//! kernel (dom0 and domUs share Debian's), the dom0 initramfs with Xen's toolstack, and
//! the initramfs of a domU (guest or proxy).
//!
//! Everything comes from Debian packages pinned in `images/packages.lock` (name,
//! version, SHA-256), fetched with `apt-get download`, unpacked with `dpkg -x` and
//! cached under `target/images/`. Archives are written deterministically (sorted,
//! owned by root, time 0), so the same lock and the same extra files give the same
//! bytes. Callers add their own programs and services through [`ImageSpec`].

pub mod apt;
pub mod cpio;
pub mod initramfs;
pub mod lock;
pub mod squashfs;
pub mod store;

use std::collections::BTreeSet;
use std::io::Read;
use std::path::{Path, PathBuf};

use initramfs::{Initramfs, InitramfsError};
use lock::{LockError, LockedPackage, Lockfile};
use store::{Store, StoreError, Sysroot};

/// The Xen hypervisor package; its `/boot/xen-4.17-amd64.gz` is the multiboot kernel.
pub const XEN_PACKAGE: &str = "xen-hypervisor-4.17-amd64";
/// Debian's meta-package that names the current kernel; relocking pins its target.
pub const KERNEL_META_PACKAGE: &str = "linux-image-amd64";
const XEN_IMAGE: &str = "/boot/xen-4.17-amd64.gz";

/// Packages every initramfs starts from: busybox for the userland, lspci (Debian's
/// busybox has none) with the PCI ID list, to show what devices a domain sees.
const BASE_PACKAGES: &[&str] = &["busybox-static", "pciutils", "pci.ids"];
/// Files every initramfs gets from those packages.
const BASE_FILES: &[&str] = &["/usr/bin/lspci", "/usr/share/misc/pci.ids"];
/// Packages dom0 needs for xl, xenstored, xenconsoled and HVM device models
/// (hvmloader, SeaBIOS, QEMU's Xen build and its ROMs), and socat as a transport for
/// `xl migrate` between hosts. `libgcc-s1` is loaded with
/// dlopen by glibc's pthread_cancel, which xl uses, so no ELF header names it.
const DOM0_PACKAGES: &[&str] = &[
    "xen-utils-4.17",
    "xen-utils-common",
    "xenstore-utils",
    "qemu-system-xen",
    "qemu-system-data",
    "seabios",
    "libgcc-s1",
    "socat",
];

const DOM0_MODULES: &[&str] = &[
    "xen-evtchn",
    "xen-gntdev",
    "xen-gntalloc",
    "xen-privcmd",
    "xenfs",
    "xen-pciback",
    "xen-netback",
    // Disk back ends: read-only image files through loop devices (files/block-crane).
    "xen-blkback",
    "loop",
    "bridge",
    "tun",
    // The NIC that links emulated hosts (virtio); never the stand-in's e1000.
    "virtio-pci",
    "virtio-net",
];
const DOMU_MODULES: &[&str] = &["xen-pcifront", "xen-netfront", "e1000"];

/// Packages for OpenCL on the CPU inside domUs: PoCL (the stand-in GPU's vendor
/// library, with LLVM), the ICD loader (for native runs beside crane) and clinfo, and
/// what PoCL runs to link every compiled kernel into a shared object: binutils' `ld`
/// and the link-time files of libc and libgcc. PoCL needs no compiler driver: it compiles with
/// the libclang-cpp in its own process and only executes `ld`.
const OPENCL_PACKAGES: &[&str] = &[
    "pocl-opencl-icd",
    "libpocl2",
    "libpocl2-common",
    "ocl-icd-libopencl1",
    "binutils",
    "binutils-x86-64-linux-gnu",
    "libc6-dev",
    "libgcc-12-dev",
    "clinfo",
];

/// The directory of PoCL's device plugins. They name each other without a run path
/// (`libpocl-devices-pthread.so` needs `libpocl-devices-basic.so`, which PoCL loads
/// first), so image builds look for libraries there too.
pub const POCL_PLUGIN_DIR: &str = "/usr/lib/x86_64-linux-gnu/pocl";

/// What a domU needs to run OpenCL programs on PoCL, found by tracing PoCL 3.1 running
/// the corpus (every file it opens and every program it executes):
/// - the ICD file, libpocl (with LLVM and clang through its ELF dependencies) and the
///   device plugins;
/// - the OpenCL C headers PoCL compiles every program with, and its kernel library
///   bitcode for the CPUs the emulated hosts show domUs (QEMU's `qemu64` model: SSE2,
///   so PoCL picks `sse2`; `GENERIC` is its fallback). The other variants (AVX and up,
///   72 MB) are left out;
/// - `ld` and the files its command line names: libc's and libm's linker scripts with
///   what they point to, libgcc, and `crtbegin.o`, by which clang's driver recognises
///   the GCC installation whose directory it passes to `ld`;
/// - the ICD loader `libOpenCL.so.1`, for running programs natively, and `clinfo`.
pub const OPENCL_RUNTIME_PATHS: &[&str] = &[
    "/etc/OpenCL/vendors/pocl.icd",
    "/usr/lib/x86_64-linux-gnu/libpocl.so.2",
    POCL_PLUGIN_DIR,
    "/usr/share/pocl/include",
    "/usr/share/pocl/kernel-x86_64-pc-linux-gnu-sse2.bc",
    "/usr/share/pocl/kernel-x86_64-pc-linux-gnu-GENERIC.bc",
    "/usr/bin/ld",
    "/usr/lib/x86_64-linux-gnu/libc.so",
    "/usr/lib/x86_64-linux-gnu/libc_nonshared.a",
    "/usr/lib/x86_64-linux-gnu/libm.so",
    "/lib/x86_64-linux-gnu/libmvec.so.1",
    "/usr/lib/gcc/x86_64-linux-gnu/12/crtbegin.o",
    "/usr/lib/gcc/x86_64-linux-gnu/12/libgcc.a",
    "/usr/lib/gcc/x86_64-linux-gnu/12/libgcc_s.so",
    "/usr/lib/x86_64-linux-gnu/libOpenCL.so.1",
    "/usr/bin/clinfo",
];

/// XenStore's command-line client inside a domU (it talks to `/dev/xen/xenbus`), for
/// services that read their settings from XenStore.
pub const XENSTORE_CLIENT_PATHS: &[&str] = &[
    "/usr/bin/xenstore-read",
    "/usr/bin/xenstore-write",
    "/usr/bin/xenstore-exists",
    "/usr/bin/xenstore-ls",
];

/// Files every dom0 needs, copied with their shared libraries.
const DOM0_FILES: &[&str] = &[
    "/usr/lib/xen-4.17/bin/xl",
    "/usr/lib/xen-4.17/bin/xenstored",
    "/usr/lib/xen-4.17/bin/xenconsoled",
    "/usr/lib/xen-4.17/bin/xenconsole",
    "/usr/lib/xen-4.17/bin/xen-init-dom0",
    "/usr/lib/xen-4.17/bin/libxl-save-helper",
    "/usr/lib/xen-4.17/boot/hvmloader",
    "/usr/bin/xenstore",
    "/usr/bin/xenstore-read",
    "/usr/bin/xenstore-write",
    "/usr/bin/xenstore-ls",
    "/usr/bin/xenstore-list",
    "/usr/bin/xenstore-rm",
    "/usr/bin/xenstore-exists",
    "/usr/bin/xenstore-watch",
    "/usr/bin/xenstore-chmod",
    // A migration transport between hosts: busybox's nc copies 1 KiB at a time
    // (3 MB/s here, against 30 MB/s for the link itself).
    "/usr/bin/socat",
    "/usr/libexec/xen-qemu-system-i386",
    "/usr/share/seabios/bios-256k.bin",
    "/usr/share/qemu/linuxboot_dma.bin",
    "/usr/share/qemu/linuxboot.bin",
    "/usr/share/qemu/kvmvapic.bin",
    "/usr/share/qemu/keymaps",
    "/etc/xen/scripts",
    "/lib/x86_64-linux-gnu/libgcc_s.so.1",
];

const RC_COMMON: &str = include_str!("../files/rc.sysinit.common");
const DOM0_RC: &str = include_str!("../files/dom0.rc.sysinit");
const GUEST_RC: &str = include_str!("../files/guest.rc.sysinit");
const VIF_SCRIPT: &str = include_str!("../files/vif-crane");
const BLOCK_SCRIPT: &str = include_str!("../files/block-crane");

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(transparent)]
    Lock(#[from] LockError),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Initramfs(#[from] InitramfsError),
    #[error(transparent)]
    Apt(#[from] apt::AptError),
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error("the lock file pins no kernel package (linux-image-*); run `cargo xtask testbed lock`")]
    NoKernelPackage,
    #[error("{0} is not a plain kernel image file in the kernel package")]
    NoKernelImage(String),
    #[error("busybox from the locked package did not list its applets: {0}")]
    Busybox(String),
    #[error(transparent)]
    Squashfs(#[from] squashfs::SquashfsError),
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ImageError + '_ {
    move |source| ImageError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Where the lock file is, where packages are cached and where images are written.
#[derive(Debug, Clone)]
pub struct Paths {
    pub lock: PathBuf,
    pub cache: PathBuf,
    pub out: PathBuf,
}

impl Paths {
    /// The standard layout of the workspace at `root`: `images/packages.lock`,
    /// `target/images/{cache,out}`.
    pub fn in_workspace(root: &Path) -> Self {
        Self {
            lock: root.join("images/packages.lock"),
            cache: root.join("target/images/cache"),
            out: root.join("target/images/out"),
        }
    }
}

/// A file of the build machine to put into an image.
#[derive(Debug, Clone)]
pub struct ExtraFile {
    pub source: PathBuf,
    pub dest: PathBuf,
    pub mode: u32,
}

/// What a caller adds to an image: files, text files, services restarted by init when
/// they exit, and boot hooks (scripts run once, in name order, after the base system is
/// up; a hook that starts a daemon puts it in the background itself).
#[derive(Debug, Clone, Default)]
pub struct ImageSpec {
    pub files: Vec<ExtraFile>,
    pub texts: Vec<(PathBuf, String, u32)>,
    /// Symbolic links: (path, target).
    pub symlinks: Vec<(PathBuf, String)>,
    pub services: Vec<String>,
    /// Extra locked packages' paths to copy (with their libraries), e.g. PoCL's files.
    pub package_paths: Vec<PathBuf>,
    /// Directories where libraries are also looked for, after an ELF file's own run
    /// paths: for plugins that name siblings their host program has loaded first.
    pub library_dirs: Vec<PathBuf>,
    /// Kernel modules to load besides the image's standard ones.
    pub modules: Vec<String>,
    /// Kernel modules built outside the kernel package (files of the build
    /// machine), loaded after `modules` (see `Initramfs::extra_modules`).
    pub module_files: Vec<PathBuf>,
    /// Read-only disks the domU mounts at boot, their files reachable at their usual
    /// paths (see [`ImageSpec::read_only_disk`]).
    pub disks: Vec<ReadOnlyDisk>,
}

/// A read-only disk image for domUs, made by [`Builder::read_only_disk`] from locked
/// files: dom0 serves it as a block device, the domU mounts it at boot.
#[derive(Debug, Clone)]
pub struct ReadOnlyDisk {
    /// The squashfs image.
    pub image: PathBuf,
    /// The domU's name for the device: the domain configuration's `vdev`.
    pub vdev: String,
    /// Where the domU mounts it.
    pub mountpoint: PathBuf,
    /// Every file and symlink on it, by installed path (symlinks with their targets).
    pub entries: Vec<(PathBuf, Option<String>)>,
}

impl ImageSpec {
    pub fn file(mut self, source: impl Into<PathBuf>, dest: impl Into<PathBuf>, mode: u32) -> Self {
        self.files.push(ExtraFile {
            source: source.into(),
            dest: dest.into(),
            mode,
        });
        self
    }

    pub fn text(mut self, dest: impl Into<PathBuf>, text: impl Into<String>, mode: u32) -> Self {
        self.texts.push((dest.into(), text.into(), mode));
        self
    }

    pub fn symlink(mut self, path: impl Into<PathBuf>, target: impl Into<String>) -> Self {
        self.symlinks.push((path.into(), target.into()));
        self
    }

    /// A boot hook: `/etc/crane/init.d/NAME`.
    pub fn hook(self, name: &str, script: impl Into<String>) -> Self {
        self.text(format!("/etc/crane/init.d/{name}"), script, 0o755)
    }

    pub fn service(mut self, command: impl Into<String>) -> Self {
        self.services.push(command.into());
        self
    }

    /// Copies a path of the locked packages (a file with its libraries, or a whole
    /// directory).
    pub fn package_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.package_paths.push(path.into());
        self
    }

    /// Looks for libraries in `dir` too (see [`ImageSpec::library_dirs`]).
    pub fn library_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.library_dirs.push(dir.into());
        self
    }

    pub fn module(mut self, name: impl Into<String>) -> Self {
        self.modules.push(name.into());
        self
    }

    /// An out-of-tree kernel module (built for the images' kernel release).
    pub fn module_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.module_files.push(path.into());
        self
    }

    /// Mounts `disk` at boot and makes its files appear at their installed paths: the
    /// initramfs gets the disk's symlinks and, for every file, a symlink into the mount
    /// point (paths the image already has keep the image's own copy). Adds the modules
    /// for the block front end and squashfs.
    pub fn read_only_disk(mut self, disk: &ReadOnlyDisk) -> Self {
        self.disks.push(disk.clone());
        self.module("xen-blkfront").module("squashfs")
    }

    /// PoCL as the OpenCL vendor, and the ICD loader (see [`OPENCL_RUNTIME_PATHS`]).
    pub fn opencl_runtime(self) -> Self {
        OPENCL_RUNTIME_PATHS
            .iter()
            .fold(self.library_dir(POCL_PLUGIN_DIR), |spec, path| {
                spec.package_path(path)
            })
    }

    /// XenStore's client tools (see [`XENSTORE_CLIENT_PATHS`]).
    pub fn xenstore_client(self) -> Self {
        XENSTORE_CLIENT_PATHS
            .iter()
            .fold(self, |spec, path| spec.package_path(path))
    }
}

/// The outputs of [`build`].
#[derive(Debug, Clone)]
pub struct Images {
    /// Xen as a plain multiboot ELF (QEMU's `-kernel`).
    pub xen: PathBuf,
    /// The Linux kernel for dom0 and every domU.
    pub kernel: PathBuf,
    pub dom0_initrd: PathBuf,
    pub guest_initrd: PathBuf,
}

/// A loaded lock with its unpacked sysroot.
pub struct Builder {
    paths: Paths,
    lock: Lockfile,
    sysroot: Sysroot,
}

impl Builder {
    /// Loads the lock, fetches (checksum-verified) and unpacks every pinned package.
    pub fn new(paths: Paths) -> Result<Self, ImageError> {
        let lock = Lockfile::load(&paths.lock)?;
        Self::with_lock(paths, lock)
    }

    fn with_lock(paths: Paths, lock: Lockfile) -> Result<Self, ImageError> {
        let store = Store::new(&paths.cache);
        let sysroot = store.sysroot(&lock.packages)?;
        std::fs::create_dir_all(&paths.out).map_err(io_err(&paths.out))?;
        Ok(Self {
            paths,
            lock,
            sysroot,
        })
    }

    pub fn out_dir(&self) -> &Path {
        &self.paths.out
    }

    fn kernel_package(&self) -> Result<&LockedPackage, ImageError> {
        self.lock
            .packages
            .iter()
            .find(|p| p.name.starts_with("linux-image-") && p.name != KERNEL_META_PACKAGE)
            .ok_or(ImageError::NoKernelPackage)
    }

    /// Xen, unzipped to a plain ELF file that QEMU's multiboot loader accepts.
    pub fn xen(&self) -> Result<PathBuf, ImageError> {
        let (_, path) = self.sysroot.resolve(Path::new(XEN_IMAGE))?;
        let Some(store::Node::File { source, .. }) = self.sysroot.entry(&path).map(|e| &e.node)
        else {
            return Err(ImageError::NoKernelImage(XEN_IMAGE.to_owned()));
        };
        let mut data = Vec::new();
        let file = std::fs::File::open(source).map_err(io_err(source))?;
        flate2::read::GzDecoder::new(file)
            .read_to_end(&mut data)
            .map_err(io_err(source))?;
        let out = self.paths.out.join("xen");
        write_if_changed(&out, &data)?;
        Ok(out)
    }

    /// The images' kernel release (`uname -r` in every domain), which out-of-tree
    /// modules must be built for.
    pub fn kernel_release(&self) -> Result<String, ImageError> {
        Ok(Initramfs::new(&self.sysroot).kernel_release()?)
    }

    /// The kernel image of the locked linux-image package.
    pub fn kernel(&self) -> Result<PathBuf, ImageError> {
        let package = self.kernel_package()?;
        let release = package.name.trim_start_matches("linux-image-");
        let image = format!("/boot/vmlinuz-{release}");
        let Some(store::Node::File { source, .. }) =
            self.sysroot.entry(Path::new(&image)).map(|e| &e.node)
        else {
            return Err(ImageError::NoKernelImage(image));
        };
        let data = std::fs::read(source).map_err(io_err(source))?;
        let out = self.paths.out.join("vmlinuz");
        write_if_changed(&out, &data)?;
        Ok(out)
    }

    fn base(
        &self,
        modules: &[&str],
        rc: &str,
        spec: &ImageSpec,
    ) -> Result<Initramfs<'_>, ImageError> {
        let mut image = Initramfs::new(&self.sysroot);
        image.library_dirs(&spec.library_dirs);
        image.from_sysroot("/bin/busybox")?;
        for applet in busybox_applets(&self.sysroot)? {
            if applet != Path::new("/bin/busybox") {
                image.symlink(&applet, "/bin/busybox");
            }
        }
        image.symlink("/init", "/bin/busybox");
        for path in BASE_FILES {
            image.from_sysroot(path)?;
        }
        let modules: Vec<&str> = modules
            .iter()
            .copied()
            .chain(spec.modules.iter().map(String::as_str))
            .collect();
        for dir in [
            "/proc",
            "/sys",
            "/dev",
            "/run",
            "/tmp",
            "/root",
            "/etc/crane/init.d",
        ] {
            image.dir(dir);
        }
        let mut order = image.modules(&modules)?;
        for path in image.extra_modules(&spec.module_files)? {
            if !order.contains(&path) {
                order.push(path);
            }
        }
        let list: String = order.iter().map(|p| format!("{}\n", p.display())).collect();
        image.bytes("/etc/crane/modules", list, 0o644);
        image.bytes("/etc/crane/rc.sysinit.common", RC_COMMON, 0o644);
        image.bytes("/etc/crane/rc.sysinit", rc, 0o755);
        let mut inittab = String::from("::sysinit:/etc/crane/rc.sysinit\n");
        for service in &spec.services {
            inittab.push_str(&format!("::respawn:{service}\n"));
        }
        inittab.push_str("::shutdown:/bin/sync\n");
        image.bytes("/etc/inittab", inittab, 0o644);
        image.bytes("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644);
        image.bytes("/etc/group", "root:x:0:\n", 0o644);
        for path in &spec.package_paths {
            image.from_sysroot(path)?;
        }
        for extra in &spec.files {
            image.host_file(&extra.source, &extra.dest, extra.mode)?;
        }
        for (dest, text, mode) in &spec.texts {
            image.bytes(dest, text.clone(), *mode);
        }
        for (path, target) in &spec.symlinks {
            image.symlink(path, target);
        }
        let mut disks = String::new();
        for disk in &spec.disks {
            for (path, link) in &disk.entries {
                if image.contains(path) {
                    continue;
                }
                let target = match link {
                    Some(target) => target.clone(),
                    None => disk
                        .mountpoint
                        .join(path.strip_prefix("/").unwrap_or(path))
                        .display()
                        .to_string(),
                };
                image.symlink(path, &target);
            }
            image.dir(&disk.mountpoint);
            disks.push_str(&format!(
                "{} squashfs {}\n",
                disk.vdev,
                disk.mountpoint.display()
            ));
        }
        if !disks.is_empty() {
            image.bytes("/etc/crane/disks", disks, 0o644);
        }
        Ok(image)
    }

    fn dom0_image(&self, spec: &ImageSpec) -> Result<Initramfs<'_>, ImageError> {
        let mut image = self.base(DOM0_MODULES, DOM0_RC, spec)?;
        for path in DOM0_FILES {
            image.from_sysroot(path)?;
        }
        image.symlink("/usr/sbin/xl", "/usr/lib/xen-4.17/bin/xl");
        image.symlink("/bin/bash", "/bin/busybox");
        image.bytes("/etc/xen/scripts/vif-crane", VIF_SCRIPT, 0o755);
        image.bytes("/etc/xen/scripts/block-crane", BLOCK_SCRIPT, 0o755);
        image.bytes("/etc/xen/xl.conf", "autoballoon=\"off\"\n", 0o644);
        Ok(image)
    }

    /// The dom0 initramfs: busybox, Xen's daemons and xl with their libraries, the
    /// HVM device model, and what `spec` adds.
    pub fn dom0(&self, spec: &ImageSpec) -> Result<PathBuf, ImageError> {
        let out = self.paths.out.join("dom0.cpio.gz");
        self.dom0_image(spec)?.write_gz(&out)?;
        Ok(out)
    }

    /// The initramfs of a domU: busybox, the front-end drivers, the stand-in device's
    /// driver, and what `spec` adds (the proxy's and guests' programs).
    pub fn domu(&self, name: &str, spec: &ImageSpec) -> Result<PathBuf, ImageError> {
        let out = self.paths.out.join(format!("{name}.cpio.gz"));
        self.base(DOMU_MODULES, GUEST_RC, spec)?.write_gz(&out)?;
        Ok(out)
    }

    /// A read-only disk holding `spec`'s package paths with their libraries, packed
    /// into `NAME.sqfs`; the domU calls the device `vdev` and mounts it at
    /// `mountpoint`. Packing is skipped when the disk's contents did not change.
    pub fn read_only_disk(
        &self,
        name: &str,
        spec: &ImageSpec,
        vdev: &str,
        mountpoint: &str,
    ) -> Result<ReadOnlyDisk, ImageError> {
        let mut tree = Initramfs::new(&self.sysroot);
        tree.library_dirs(&spec.library_dirs);
        for path in &spec.package_paths {
            tree.from_sysroot(path)?;
        }
        let out = self.paths.out.join(format!("{name}.sqfs"));
        let manifest = format!("{}\n{}", squashfs::options().join(" "), tree.manifest());
        let manifest_path = self.paths.out.join(format!("{name}.sqfs.manifest"));
        let unchanged =
            out.exists() && std::fs::read_to_string(&manifest_path).is_ok_and(|m| m == manifest);
        if !unchanged {
            // Unique per process: a test and `testbed up` may build at the same time.
            let staging = self
                .paths
                .out
                .join(format!("{name}.tree.{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&staging);
            tree.write_tree(&staging)?;
            let tmp = out.with_extension(format!("tmp{}", std::process::id()));
            let packed = squashfs::pack(&self.paths.cache, &staging, &tmp);
            let _ = std::fs::remove_dir_all(&staging);
            packed?;
            std::fs::rename(&tmp, &out).map_err(io_err(&out))?;
            std::fs::write(&manifest_path, &manifest).map_err(io_err(&manifest_path))?;
        }
        Ok(ReadOnlyDisk {
            image: out,
            vdev: vdev.to_owned(),
            mountpoint: PathBuf::from(mountpoint),
            entries: tree.files_and_links(),
        })
    }

    /// Every locked package whose files the standard images use: dom0's, and a domU
    /// with the OpenCL runtime and the XenStore client (the guest's and the proxy's).
    fn packages_used(&self) -> Result<BTreeSet<String>, ImageError> {
        let spec = ImageSpec::default();
        let mut used: BTreeSet<String> = self.dom0_image(&spec)?.packages_used().clone();
        let domu = ImageSpec::default().opencl_runtime().xenstore_client();
        used.extend(
            self.base(DOMU_MODULES, GUEST_RC, &domu)?
                .packages_used()
                .iter()
                .cloned(),
        );
        Ok(used)
    }
}

/// The applet paths of the locked busybox, asked from the binary itself (it is static,
/// so the build machine can run it).
fn busybox_applets(sysroot: &Sysroot) -> Result<Vec<PathBuf>, ImageError> {
    let (_, path) = sysroot.resolve(Path::new("/bin/busybox"))?;
    let Some(store::Node::File { source, .. }) = sysroot.entry(&path).map(|e| &e.node) else {
        return Err(ImageError::Busybox("not a file".into()));
    };
    let output = std::process::Command::new(source)
        .arg("--list-full")
        .output()
        .map_err(|e| ImageError::Busybox(e.to_string()))?;
    if !output.status.success() {
        return Err(ImageError::Busybox(
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| Path::new("/").join(l))
        .collect())
}

fn write_if_changed(path: &Path, data: &[u8]) -> Result<(), ImageError> {
    if std::fs::read(path).ok().as_deref() == Some(data) {
        return Ok(());
    }
    std::fs::write(path, data).map_err(io_err(path))
}

/// Builds the standard images (no extra files) from the lock.
pub fn build(paths: &Paths, dom0: &ImageSpec, guest: &ImageSpec) -> Result<Images, ImageError> {
    let builder = Builder::new(paths.clone())?;
    Ok(Images {
        xen: builder.xen()?,
        kernel: builder.kernel()?,
        dom0_initrd: builder.dom0(dom0)?,
        guest_initrd: builder.domu("guest", guest)?,
    })
}

/// Rewrites the lock from the archive's current versions: the root packages, plus the
/// library packages (found by following Debian's dependencies, then pruned to those
/// whose files the images really contain), each with its checksum.
pub fn relock(paths: &Paths) -> Result<Lockfile, ImageError> {
    apt::ensure_updated(&paths.cache)?;
    let kernel = apt::kernel_package(KERNEL_META_PACKAGE)?;
    let mut roots: BTreeSet<String> = BASE_PACKAGES
        .iter()
        .chain(DOM0_PACKAGES)
        .chain(OPENCL_PACKAGES)
        .map(|s| (*s).to_owned())
        .collect();
    roots.insert(XEN_PACKAGE.to_owned());
    roots.insert(kernel.clone());
    let mut candidates = apt::library_closure(&roots)?;
    candidates.extend(roots.iter().cloned());
    let mut packages = Vec::new();
    for name in &candidates {
        packages.push(apt::candidate(name)?);
    }
    let full = Lockfile::from_packages(packages)?;
    let builder = Builder::with_lock(paths.clone(), full.clone())?;
    let used = builder.packages_used()?;
    let kept: Vec<LockedPackage> = full
        .packages
        .into_iter()
        .filter(|p| roots.contains(&p.name) || used.contains(&p.name))
        .collect();
    let lock = Lockfile::from_packages(kept)?;
    lock.save(&paths.lock)?;
    Ok(lock)
}
