//! `cargo xtask proxy-image`: the proxy domain's image for a real Xen host, an
//! operator tool (docs/operations.md, "The proxy domain's image").
//!
//! The image is the testbed's proxy image without the testbed's command channel:
//! a kernel and an initramfs from the locked Debian packages, `crane-proxy` started
//! at boot (restarted by init whenever it ends) on the tokens dom0's craned publishes
//! in XenStore, and an OpenCL vendor:
//!
//! - PoCL (default): on a read-only squashfs disk, as in the testbed;
//! - NVIDIA (`--nvidia DIR`): the driver's user-space libraries, its kernel modules
//!   built for the image's kernel release (`--kernel-release` prints it) and its
//!   firmware, all from DIR; an ICD file names `libnvidia-opencl.so.1`, and a boot
//!   hook makes the device nodes that NVIDIA's installer or nvidia-modprobe would.
//!
//! Next to the images it writes an xl configuration to start from
//! (`crane-proxy.cfg`): craned's `[proxy] config` points at it.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, ensure};
use crane_images::{ImageSpec, Paths};

use crate::domus;

const PROXY_START: &str = include_str!("../files/crane-proxy-start");

/// Makes `/dev/nvidiactl`, `/dev/nvidiaN` (one per GPU the driver found) and the
/// UVM nodes, with the major numbers the driver registered (`/proc/devices`).
const NVIDIA_NODES: &str = r#"#!/bin/sh
# Device nodes of NVIDIA's driver (its installer or nvidia-modprobe makes them
# elsewhere): control node 255 and one minor per GPU on the nvidia major (195),
# and nvidia-uvm's own major.
major=$(awk '$2 == "nvidia-frontend" || $2 == "nvidia" { print $1; exit }' /proc/devices)
[ -n "$major" ] || { echo "crane: the nvidia module registered no device"; exit 0; }
mknod -m 666 /dev/nvidiactl c "$major" 255
n=0
for gpu in /proc/driver/nvidia/gpus/*; do
    [ -e "$gpu" ] || continue
    mknod -m 666 "/dev/nvidia$n" c "$major" "$n"
    n=$((n + 1))
done
uvm=$(awk '$2 == "nvidia-uvm" { print $1; exit }' /proc/devices)
if [ -n "$uvm" ]; then
    mknod -m 666 /dev/nvidia-uvm c "$uvm" 0
    mknod -m 666 /dev/nvidia-uvm-tools c "$uvm" 1
fi
echo "crane: $n NVIDIA GPU(s), device nodes made"
"#;

/// Where the image puts the driver's libraries (Debian's multiarch directory).
const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";

/// An NVIDIA driver's files for the proxy image, from a directory the operator
/// assembled (layout in docs/operations.md).
#[derive(Debug, Clone, PartialEq)]
pub struct NvidiaDriver {
    /// Shared libraries (`lib/*.so*`), each with its DT_SONAME when it differs from
    /// the file name (the image links the soname to the file).
    pub libraries: Vec<(PathBuf, Option<String>)>,
    /// Kernel modules (`modules/*.ko`).
    pub modules: Vec<PathBuf>,
    /// Firmware files (`firmware/**`), each with its path under /lib/firmware/nvidia.
    pub firmware: Vec<(PathBuf, PathBuf)>,
}

impl NvidiaDriver {
    pub fn from_dir(dir: &Path) -> anyhow::Result<Self> {
        let mut libraries = Vec::new();
        let lib = dir.join("lib");
        for entry in sorted_dir(&lib)? {
            let name = entry.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !name.contains(".so") || !entry.is_file() {
                continue;
            }
            let soname = crane_images::initramfs::soname(&entry)
                .with_context(|| format!("reading {}", entry.display()))?
                .filter(|s| s != name);
            libraries.push((entry, soname));
        }
        ensure!(
            libraries.iter().any(|(p, soname)| {
                soname.as_deref() == Some("libnvidia-opencl.so.1")
                    || p.file_name().is_some_and(|n| n == "libnvidia-opencl.so.1")
            }),
            "{} holds no libnvidia-opencl.so.1 (NVIDIA's OpenCL library)",
            lib.display()
        );
        let modules: Vec<PathBuf> = sorted_dir(&dir.join("modules"))?
            .into_iter()
            .filter(|p| p.extension().is_some_and(|e| e == "ko"))
            .collect();
        ensure!(
            modules
                .iter()
                .any(|p| p.file_name().is_some_and(|n| n == "nvidia.ko")),
            "{} holds no nvidia.ko (the driver's kernel module, built for the images' \
             kernel: see `cargo xtask proxy-image --kernel-release`)",
            dir.join("modules").display()
        );
        let mut firmware = Vec::new();
        let fw = dir.join("firmware");
        if fw.is_dir() {
            walk_files(&fw, &mut |path| {
                let rel = path.strip_prefix(&fw).unwrap_or(path).to_path_buf();
                firmware.push((path.to_path_buf(), rel));
            })?;
            firmware.sort();
        }
        Ok(NvidiaDriver {
            libraries,
            modules,
            firmware,
        })
    }
}

fn sorted_dir(dir: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .with_context(|| format!("reading {}", dir.display()))?;
    out.sort();
    Ok(out)
}

fn walk_files(dir: &Path, f: &mut dyn FnMut(&Path)) -> anyhow::Result<()> {
    for path in sorted_dir(dir)? {
        if path.is_dir() {
            walk_files(&path, f)?;
        } else if path.is_file() {
            f(&path);
        }
    }
    Ok(())
}

/// What the image's crane-proxy serves and how the domain is set up.
#[derive(Debug, Clone)]
pub struct ProxySettings {
    pub listen_port: u16,
    /// The proxy domain's address on dom0's bridge (`ADDR/PREFIX`).
    pub address: String,
    pub bridge: String,
    pub memory_mib: u32,
    /// Where the operator installs the files in dom0 (the xl configuration names
    /// them there).
    pub install_dir: PathBuf,
    /// The GPU given to the proxy domain (PCI address), if known.
    pub gpu: Option<String>,
}

impl Default for ProxySettings {
    fn default() -> Self {
        ProxySettings {
            listen_port: domus::PROXY_PORT,
            address: "192.168.122.2/24".into(),
            bridge: "xenbr0".into(),
            memory_mib: 4096,
            install_dir: PathBuf::from("/var/lib/crane/proxy"),
            gpu: None,
        }
    }
}

/// The vendor-independent part of the image: crane-proxy and its service, the
/// XenStore client for operators.
fn base_spec(proxy: &Path, settings: &ProxySettings) -> ImageSpec {
    ImageSpec::default()
        .xenstore_client()
        .file(proxy, "/usr/sbin/crane-proxy", 0o755)
        .text(
            "/etc/crane/crane-proxy.conf",
            format!(
                "LISTEN=tcp://0.0.0.0:{}\nTOKEN_FILE={}\n",
                settings.listen_port,
                domus::PROXY_TOKEN_FILE
            ),
            0o644,
        )
        .text("/usr/sbin/crane-proxy-start", PROXY_START, 0o755)
        .service("/usr/sbin/crane-proxy-start")
}

/// The proxy image with NVIDIA's driver.
pub fn nvidia_spec(proxy: &Path, driver: &NvidiaDriver, settings: &ProxySettings) -> ImageSpec {
    let mut spec = base_spec(proxy, settings);
    for (lib, soname) in &driver.libraries {
        let name = lib.file_name().unwrap_or_default().to_string_lossy();
        spec = spec.file(lib, format!("{LIB_DIR}/{name}"), 0o755);
        if let Some(soname) = soname {
            spec = spec.symlink(format!("{LIB_DIR}/{soname}"), name.into_owned());
        }
    }
    for module in &driver.modules {
        spec = spec.module_file(module);
    }
    for (file, rel) in &driver.firmware {
        spec = spec.file(file, Path::new("/lib/firmware/nvidia").join(rel), 0o644);
    }
    spec.text(
        "/etc/OpenCL/vendors/nvidia.icd",
        "libnvidia-opencl.so.1\n",
        0o644,
    )
    .hook("10-nvidia-nodes", NVIDIA_NODES)
}

/// xl's configuration for the proxy domain: HVM (GPUs need it for passthrough)
/// booting the image's kernel directly, one bridge interface, the GPU.
pub fn xl_config(settings: &ProxySettings, with_disk: bool) -> String {
    let dir = settings.install_dir.display();
    let mut cfg = String::new();
    let _ = writeln!(
        cfg,
        "# crane's proxy domain (written by `cargo xtask proxy-image`)."
    );
    let _ = writeln!(cfg, "name = \"crane-proxy\"\ntype = \"hvm\"");
    let _ = writeln!(cfg, "memory = {}\nvcpus = 4", settings.memory_mib);
    let _ = writeln!(
        cfg,
        "kernel = \"{dir}/vmlinuz\"\nramdisk = \"{dir}/crane-proxy.cpio.gz\""
    );
    let _ = writeln!(
        cfg,
        "extra = \"console=ttyS0 quiet crane.hostname=crane-proxy crane.ip={}\"",
        settings.address
    );
    let _ = writeln!(cfg, "serial = \"pty\"\nvnc = 0\nvga = \"none\"");
    // A fixed MAC: craned recreates a proxy domain that dies, and the guests'
    // ARP caches must stay right for their sessions to reconnect.
    let _ = writeln!(
        cfg,
        "vif = [ \"bridge={},mac={}\" ]",
        settings.bridge,
        crate::xl::stable_mac(&settings.address)
    );
    if with_disk {
        let _ = writeln!(
            cfg,
            "disk = [ \"format=raw,vdev={},access=ro,target={dir}/opencl.sqfs\" ]",
            domus::OPENCL_DISK_VDEV
        );
    }
    match &settings.gpu {
        Some(gpu) => {
            let _ = writeln!(cfg, "pci = [ \"{gpu}\" ]");
        }
        None => {
            let _ = writeln!(
                cfg,
                "# The proxy's own GPU (craned attaches [proxy] gpu if this is left out):\n\
                 # pci = [ \"0000:XX:00.0\" ]"
            );
        }
    }
    let _ = writeln!(cfg, "passthrough = \"enabled\"\non_crash = \"preserve\"");
    cfg
}

/// Builds crane-proxy (release) and a copy without debug information.
fn build_proxy_binary() -> anyhow::Result<PathBuf> {
    let root = crate::workspace_root();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(&cargo)
        .args(["build", "--release", "--quiet", "-p", "crane-proxy"])
        .current_dir(&root)
        .status()
        .with_context(|| format!("running {cargo} build"))?;
    ensure!(status.success(), "cargo build -p crane-proxy failed");
    let target = domus::target_dir();
    let out = target.join("proxy-image-bin");
    std::fs::create_dir_all(&out)?;
    let stripped = out.join("crane-proxy");
    let status = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&stripped)
        .arg(target.join("release/crane-proxy"))
        .status()
        .context("running strip (binutils)")?;
    ensure!(status.success(), "strip failed");
    Ok(stripped)
}

/// `cargo xtask proxy-image`'s arguments.
#[derive(Debug, clap::Args)]
#[command(args_override_self = true)]
pub struct Args {
    /// Where to write the images and crane-proxy.cfg (default: proxy-image in
    /// the target folder, $CARGO_TARGET_DIR or target/).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// NVIDIA's driver instead of PoCL: DIR/lib (user-space libraries),
    /// DIR/modules (*.ko built for the images' kernel), DIR/firmware
    /// (optional); see docs/operations.md.
    #[arg(long, value_name = "DIR")]
    pub nvidia: Option<PathBuf>,
    /// The proxy domain's address on dom0's bridge.
    #[arg(long, value_name = "ADDR/PFX", default_value_t = ProxySettings::default().address)]
    pub address: String,
    /// dom0's bridge.
    #[arg(long, value_name = "NAME", default_value_t = ProxySettings::default().bridge)]
    pub bridge: String,
    /// crane-proxy's port.
    #[arg(long, value_name = "N", default_value_t = ProxySettings::default().listen_port)]
    pub port: u16,
    /// The domain's memory, MiB.
    #[arg(long, value_name = "MIB", default_value_t = ProxySettings::default().memory_mib)]
    pub memory: u32,
    /// The proxy's GPU (PCI address), written into the xl configuration.
    #[arg(long, value_name = "BDF")]
    pub gpu: Option<String>,
    /// Where the files go in dom0.
    #[arg(long, value_name = "DIR", default_value_os_t = ProxySettings::default().install_dir)]
    pub install_dir: PathBuf,
    /// Print the images' kernel release and exit.
    #[arg(long)]
    pub kernel_release: bool,
}

/// Entry point for `cargo xtask proxy-image ...`.
pub fn cli(args: Args) -> anyhow::Result<()> {
    let root = crate::workspace_root();
    let out = args
        .out
        .unwrap_or_else(|| domus::target_dir().join("proxy-image"));
    let nvidia = args.nvidia;
    let settings = ProxySettings {
        listen_port: args.port,
        address: args.address,
        bridge: args.bridge,
        memory_mib: args.memory,
        install_dir: args.install_dir,
        gpu: args.gpu,
    };
    let release_only = args.kernel_release;
    let paths = Paths {
        out: out.clone(),
        ..Paths::in_workspace(&root)
    };
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
    let builder = crane_images::Builder::new(paths).context("loading the image lock")?;
    if release_only {
        println!("{}", builder.kernel_release()?);
        return Ok(());
    }
    let proxy = build_proxy_binary()?;
    let mut written = vec![builder.kernel()?];
    let with_disk = match &nvidia {
        Some(dir) => {
            let driver = NvidiaDriver::from_dir(dir)?;
            let spec = nvidia_spec(&proxy, &driver, &settings);
            written.push(builder.domu("crane-proxy", &spec)?);
            false
        }
        None => {
            let opencl = domus::opencl_disk(&builder).context("building the PoCL disk")?;
            let spec = base_spec(&proxy, &settings).read_only_disk(&opencl);
            written.push(builder.domu("crane-proxy", &spec)?);
            written.push(opencl.image);
            true
        }
    };
    let cfg = out.join("crane-proxy.cfg");
    std::fs::write(&cfg, xl_config(&settings, with_disk))
        .with_context(|| format!("writing {}", cfg.display()))?;
    written.push(cfg);
    for path in &written {
        println!(
            "{}  {}",
            crane_images::store::sha256_file(path)?,
            path.display()
        );
    }
    eprintln!(
        "install these in dom0 under {} and set craned's [proxy] config to {}/crane-proxy.cfg",
        settings.install_dir.display(),
        settings.install_dir.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shared library with a soname, built by the build machine's gcc.
    fn library(dir: &Path, file: &str, soname: &str) -> PathBuf {
        let c = dir.join("lib.c");
        std::fs::write(&c, "int crane_test_symbol(void) { return 1; }\n").unwrap();
        let out = dir.join(file);
        let status = Command::new("gcc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&out)
            .arg(format!("-Wl,-soname,{soname}"))
            .arg(&c)
            .status()
            .expect("run gcc");
        assert!(status.success());
        out
    }

    #[test]
    fn an_nvidia_directory_becomes_libraries_modules_firmware_and_an_icd() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for sub in ["lib", "modules", "firmware/580.95.05"] {
            std::fs::create_dir_all(d.join(sub)).unwrap();
        }
        let ocl = library(
            &d.join("lib"),
            "libnvidia-opencl.so.580.95.05",
            "libnvidia-opencl.so.1",
        );
        let cuda = library(&d.join("lib"), "libcuda.so.580.95.05", "libcuda.so.1");
        std::fs::write(d.join("modules/nvidia.ko"), b"").unwrap();
        std::fs::write(d.join("modules/nvidia-uvm.ko"), b"").unwrap();
        std::fs::write(d.join("modules/README"), b"").unwrap();
        std::fs::write(d.join("firmware/580.95.05/gsp_ga10x.bin"), b"fw").unwrap();
        let driver = NvidiaDriver::from_dir(d).unwrap();
        assert_eq!(
            driver.libraries,
            [
                (cuda.clone(), Some("libcuda.so.1".to_owned())),
                (ocl.clone(), Some("libnvidia-opencl.so.1".to_owned())),
            ]
        );
        assert_eq!(
            driver.modules,
            [d.join("modules/nvidia-uvm.ko"), d.join("modules/nvidia.ko")]
        );
        assert_eq!(
            driver.firmware,
            [(
                d.join("firmware/580.95.05/gsp_ga10x.bin"),
                PathBuf::from("580.95.05/gsp_ga10x.bin")
            )]
        );
        let spec = nvidia_spec(
            Path::new("/t/crane-proxy"),
            &driver,
            &ProxySettings::default(),
        );
        assert!(spec.symlinks.contains(&(
            PathBuf::from("/usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1"),
            "libnvidia-opencl.so.580.95.05".to_owned()
        )));
        assert!(spec.files.iter().any(|f| f.source == ocl
            && f.dest == Path::new("/usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.580.95.05")));
        assert!(
            spec.files
                .iter()
                .any(|f| f.dest == Path::new("/lib/firmware/nvidia/580.95.05/gsp_ga10x.bin"))
        );
        assert_eq!(spec.module_files, driver.modules);
        assert!(
            spec.texts
                .iter()
                .any(|(p, t, _)| p == Path::new("/etc/OpenCL/vendors/nvidia.icd")
                    && t == "libnvidia-opencl.so.1\n")
        );
        assert!(
            spec.services
                .contains(&"/usr/sbin/crane-proxy-start".to_owned())
        );
        assert!(spec.disks.is_empty(), "NVIDIA's image needs no PoCL disk");

        // What is missing is named.
        std::fs::remove_file(&ocl).unwrap();
        let e = NvidiaDriver::from_dir(d).unwrap_err().to_string();
        assert!(e.contains("libnvidia-opencl.so.1"), "{e}");
        library(
            &d.join("lib"),
            "libnvidia-opencl.so.1",
            "libnvidia-opencl.so.1",
        );
        std::fs::remove_file(d.join("modules/nvidia.ko")).unwrap();
        let e = NvidiaDriver::from_dir(d).unwrap_err().to_string();
        assert!(
            e.contains("nvidia.ko") && e.contains("--kernel-release"),
            "{e}"
        );
    }

    #[test]
    fn the_xl_configuration_boots_the_image_with_its_gpu() {
        let settings = ProxySettings {
            gpu: Some("0000:41:00.0".into()),
            ..ProxySettings::default()
        };
        let cfg = xl_config(&settings, false);
        for want in [
            "type = \"hvm\"",
            "kernel = \"/var/lib/crane/proxy/vmlinuz\"",
            "ramdisk = \"/var/lib/crane/proxy/crane-proxy.cpio.gz\"",
            "crane.ip=192.168.122.2/24",
            "vif = [ \"bridge=xenbr0,mac=00:16:3e:",
            "pci = [ \"0000:41:00.0\" ]",
        ] {
            assert!(cfg.contains(want), "{want} missing from\n{cfg}");
        }
        assert!(!cfg.contains("\ndisk ="), "{cfg}");
        assert!(
            xl_config(&ProxySettings::default(), true)
                .contains("target=/var/lib/crane/proxy/opencl.sqfs")
        );
        assert!(xl_config(&ProxySettings::default(), true).contains("# pci = "));
    }
}
