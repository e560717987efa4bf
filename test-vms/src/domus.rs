//! What the testbed's domUs run, and the images that carry it:
//!
//! - the plain domU: busybox, the stand-in's driver and the command runner (the Xen
//!   plumbing tier boots its proxy and guest from it: small images boot and migrate
//!   fastest);
//! - the GPU guest (HVM): PoCL, crane's interposer as the guest's `libOpenCL.so.1`
//!   (drop-in: `/usr/lib/crane` first in the library path, set in `/etc/profile`),
//!   `cranectl`, `crane-agent` (started at boot, `/etc/crane/agent.toml`: the
//!   stand-in's driver `e1000` is the GPU module it unloads and loads) and the OpenCL
//!   test programs in `/usr/lib/crane/testapps`;
//! - the proxy domain (PV): PoCL and `crane-proxy`, started at boot
//!   (files/crane-proxy-start) with `--tokens-from-xenstore`: its token file follows
//!   the tokens dom0's craned publishes;
//! - dom0 (see `build_images`): craned, `crane` and the xl wrapper.
//!
//! PoCL with LLVM (260 MB) comes on a read-only disk that both domains mount
//! ([`opencl_disk`]); their initramfs images hold links to it.
//!
//! The binaries come from this workspace's builds ([`CraneArtifacts::build`]): the build
//! machine is Debian 12 like the images, and the image builder checks every symbol
//! version they need against the locked libraries.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail, ensure};
use crane_images::ImageSpec;

const GUEST_PROFILE: &str = include_str!("../files/guest-profile");
const PROXY_START: &str = include_str!("../files/crane-proxy-start");
const AGENT_TOML: &str = include_str!("../files/agent.toml");
const AGENT_START: &str = include_str!("../files/crane-agent-start");

/// Where the GPU guest keeps crane's interposer; `libOpenCL.so.1` there is a link to it.
pub const GUEST_CRANE_DIR: &str = "/usr/lib/crane";
/// The test programs inside the GPU guest.
pub const GUEST_TESTAPPS_DIR: &str = "/usr/lib/crane/testapps";
/// The proxy domain's token file, written from XenStore by crane-proxy itself.
pub const PROXY_TOKEN_FILE: &str = "/run/crane/proxy/tokens";
/// The port crane-proxy listens on in the proxy domain (all addresses).
pub const PROXY_PORT: u16 = 7000;

/// The programs built from this workspace that the images carry.
#[derive(Debug, Clone)]
pub struct CraneArtifacts {
    pub interposer: PathBuf,
    pub cranectl: PathBuf,
    /// Output of testapps/build.sh (C programs only), with `programs.list`.
    pub testapps: PathBuf,
    pub proxy: PathBuf,
    pub agent: PathBuf,
    /// dom0: the service, its client `crane`, the xl wrapper.
    pub craned: PathBuf,
    pub crane: PathBuf,
    pub xl_wrapper: PathBuf,
    /// Every domain's command runner; in dom0 also `crane-guest-run`.
    pub runner: PathBuf,
}

/// The cargo target directory (`CARGO_TARGET_DIR`, or `target/` of the workspace).
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::workspace_root().join("target"))
}

/// The cargo profile of crane's programs in the testbed's images (the
/// workspace's Cargo.toml says why not release).
pub const TESTBED_PROFILE: &str = "testbed-bin";

impl CraneArtifacts {
    /// Builds crane's programs (profile [`TESTBED_PROFILE`]) and the C test programs, unless they are up
    /// to date.
    pub fn build() -> anyhow::Result<Self> {
        let root = crate::workspace_root();
        let target = target_dir();
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut command = Command::new(&cargo);
        // The build dies with the thread that wants it (`cargo xtask test` builds
        // ahead on a thread of its own, and may end early on a failing tier).
        crate::host::dies_with_parent(&mut command, libc::SIGTERM);
        let status = command
            .args([
                "build",
                "--profile",
                TESTBED_PROFILE,
                "--quiet",
                "-p",
                "crane-opencl",
                "-p",
                "cranectl",
                "-p",
                "crane-agent",
                "-p",
                "crane-proxy",
                "-p",
                "craned",
                "-p",
                "crane-xl",
                "-p",
                "crane-testbed-runner",
            ])
            .current_dir(&root)
            .status()
            .with_context(|| format!("running {cargo} build"))?;
        ensure!(
            status.success(),
            "cargo build of the guest's crane programs failed"
        );
        let testapps = target.join("testbed/testapps");
        if testapps_stale(&root.join("testapps/c"), &testapps) {
            let status = Command::new("bash")
                .arg(root.join("testapps/build.sh"))
                .arg(&testapps)
                // The guest runs the C programs; the Rust one would cost a cargo build.
                .env("CRANE_TESTAPPS_SKIP_RUST", "1")
                .stdout(std::process::Stdio::null())
                .status()
                .context("running testapps/build.sh")?;
            ensure!(status.success(), "testapps/build.sh failed");
        }
        let built = target.join(TESTBED_PROFILE);
        let out = target.join("testbed/bin");
        std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;
        let bin = |name: &str| stripped(&built.join(name), &out.join(name));
        Ok(Self {
            interposer: bin("libcrane_opencl.so")?,
            cranectl: bin("cranectl")?,
            testapps,
            proxy: bin("crane-proxy")?,
            agent: bin("crane-agent")?,
            craned: bin("craned")?,
            crane: bin("crane")?,
            xl_wrapper: bin("xl")?,
            runner: bin("crane-runner")?,
        })
    }

    /// The test programs' names (from `programs.list`).
    pub fn programs(&self) -> anyhow::Result<Vec<String>> {
        let list = self.testapps.join("programs.list");
        let text = std::fs::read_to_string(&list)
            .with_context(|| format!("reading {}", list.display()))?;
        let programs: Vec<String> = text
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(str::to_owned)
            .collect();
        if programs.is_empty() {
            bail!("{} lists no programs", list.display());
        }
        Ok(programs)
    }
}

/// A stripped copy of `binary` at `out` (made again when the binary is newer): no
/// debug information (the profiles may keep line tables for profiling) and no
/// symbol table beyond what dynamic linking needs. In an HVM guest's initramfs
/// every megabyte costs boot time, since the guest's firmware loads the initramfs
/// through emulated port I/O (18 MB took about 110 s; ~7 s per MB on a slow machine).
fn stripped(binary: &Path, out: &Path) -> anyhow::Result<PathBuf> {
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified());
    let source = modified(binary).with_context(|| format!("{} was not built", binary.display()))?;
    if modified(out).is_ok_and(|t| t >= source) {
        return Ok(out.to_path_buf());
    }
    let shared = binary.extension().is_some_and(|e| e == "so");
    let status = Command::new("strip")
        .arg(if shared {
            "--strip-unneeded"
        } else {
            "--strip-all"
        })
        .arg("-o")
        .arg(out)
        .arg(binary)
        .status()
        .context("running strip (binutils)")?;
    ensure!(status.success(), "strip {} failed", binary.display());
    Ok(out.to_path_buf())
}

/// Whether the test programs in `out` are missing or older than a source file.
fn testapps_stale(sources: &Path, out: &Path) -> bool {
    let built = std::fs::metadata(out.join("programs.list")).and_then(|m| m.modified());
    let Ok(built) = built else { return true };
    let Ok(entries) = std::fs::read_dir(sources) else {
        return true;
    };
    entries.flatten().any(|e| {
        e.metadata()
            .and_then(|m| m.modified())
            .is_ok_and(|t| t > built)
    })
}

/// Where dom0 keeps the OpenCL runtime disk, and what the domUs call and mount it as.
pub const OPENCL_DISK: &str = "/guest/opencl.sqfs";
pub const OPENCL_DISK_VDEV: &str = "xvde";
pub const OPENCL_DISK_MOUNT: &str = "/media/opencl";

/// The read-only disk with PoCL, LLVM, the ICD loader and what PoCL links kernels
/// with ([`crane_images::OPENCL_RUNTIME_PATHS`]).
pub fn opencl_disk(
    builder: &crane_images::Builder,
) -> Result<crane_images::ReadOnlyDisk, crane_images::ImageError> {
    builder.read_only_disk(
        "opencl",
        &ImageSpec::default().opencl_runtime(),
        OPENCL_DISK_VDEV,
        OPENCL_DISK_MOUNT,
    )
}

/// Every domU: the command runner (`runner`, built from test-vms/runner) on its
/// Xen console.
pub fn plain_spec(runner: &Path) -> ImageSpec {
    ImageSpec::default()
        .file(runner, "/usr/sbin/crane-runner", 0o755)
        .service("/usr/sbin/crane-runner /dev/hvc0")
}

/// The GPU guest: PoCL, crane as the drop-in `libOpenCL.so.1`, cranectl, test programs,
/// XenStore's client tools.
pub fn guest_spec(
    artifacts: &CraneArtifacts,
    opencl: &crane_images::ReadOnlyDisk,
) -> anyhow::Result<ImageSpec> {
    let mut spec = plain_spec(&artifacts.runner)
        .read_only_disk(opencl)
        // For the tier's check that the guest cannot post itself a request.
        .xenstore_client()
        .file(
            &artifacts.interposer,
            format!("{GUEST_CRANE_DIR}/libcrane_opencl.so"),
            0o755,
        )
        .symlink(
            format!("{GUEST_CRANE_DIR}/libOpenCL.so.1"),
            "libcrane_opencl.so",
        )
        .file(&artifacts.cranectl, "/usr/bin/cranectl", 0o755)
        .file(&artifacts.agent, "/usr/sbin/crane-agent", 0o755)
        .text("/etc/crane/agent.toml", AGENT_TOML, 0o644)
        .text("/usr/sbin/crane-agent-start", AGENT_START, 0o755)
        .service("/usr/sbin/crane-agent-start")
        .text("/etc/profile", GUEST_PROFILE, 0o644);
    for program in artifacts.programs()? {
        spec = spec.file(
            artifacts.testapps.join(&program),
            format!("{GUEST_TESTAPPS_DIR}/{program}"),
            0o755,
        );
    }
    Ok(spec)
}

/// The proxy domain: PoCL, the XenStore client (for operators), crane-proxy and the
/// service that starts it, following the tokens dom0 publishes.
pub fn proxy_spec(artifacts: &CraneArtifacts, opencl: &crane_images::ReadOnlyDisk) -> ImageSpec {
    plain_spec(&artifacts.runner)
        .read_only_disk(opencl)
        .xenstore_client()
        .file(&artifacts.proxy, "/usr/sbin/crane-proxy", 0o755)
        .text(
            "/etc/crane/crane-proxy.conf",
            format!("LISTEN=tcp://0.0.0.0:{PROXY_PORT}\nTOKEN_FILE={PROXY_TOKEN_FILE}\n"),
            0o644,
        )
        .text("/usr/sbin/crane-proxy-start", PROXY_START, 0o755)
        .service("/usr/sbin/crane-proxy-start")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn testapps_are_stale_when_missing_or_older_than_a_source() {
        let dir = tempfile::tempdir().unwrap();
        let sources = dir.path().join("c");
        let out = dir.path().join("out");
        std::fs::create_dir_all(&sources).unwrap();
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(sources.join("a.c"), "int main(void){return 0;}").unwrap();
        assert!(testapps_stale(&sources, &out), "nothing built yet");
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(out.join("programs.list"), "a\n").unwrap();
        assert!(!testapps_stale(&sources, &out));
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(sources.join("a.c"), "int main(void){return 1;}").unwrap();
        assert!(testapps_stale(&sources, &out), "a source changed");
    }

    #[test]
    fn proxy_image_starts_the_proxy_on_its_xenstore_tokens() {
        let artifacts = CraneArtifacts {
            interposer: "/t/libcrane_opencl.so".into(),
            cranectl: "/t/cranectl".into(),
            testapps: "/t/testapps".into(),
            proxy: "/t/crane-proxy".into(),
            agent: "/t/crane-agent".into(),
            craned: "/t/craned".into(),
            crane: "/t/crane".into(),
            xl_wrapper: "/t/xl".into(),
            runner: "/t/crane-runner".into(),
        };
        let disk = crane_images::ReadOnlyDisk {
            image: "/t/opencl.sqfs".into(),
            vdev: OPENCL_DISK_VDEV.into(),
            mountpoint: OPENCL_DISK_MOUNT.into(),
            entries: vec![("/usr/bin/clinfo".into(), None)],
        };
        let spec = proxy_spec(&artifacts, &disk);
        assert_eq!(spec.disks.len(), 1);
        assert!(spec.modules.contains(&"xen-blkfront".to_owned()));
        assert!(
            spec.services
                .contains(&"/usr/sbin/crane-proxy-start".to_owned())
        );
        assert!(
            spec.files
                .iter()
                .any(|f| f.dest == Path::new("/usr/sbin/crane-proxy")
                    && f.source == Path::new("/t/crane-proxy"))
        );
        assert!(PROXY_START.contains("--tokens-from-xenstore"));
        let conf = spec
            .texts
            .iter()
            .find(|(path, _, _)| path == Path::new("/etc/crane/crane-proxy.conf"))
            .map(|(_, text, _)| text.clone())
            .expect("the proxy's settings");
        assert!(conf.contains("LISTEN=tcp://0.0.0.0:7000\n"), "{conf}");
    }
}
