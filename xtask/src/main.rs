//! `cargo xtask`: the project's build, test and demo driver.
//!
//! * `cargo xtask test` — everything CI runs: formatting, clippy, unit and
//!   integration tests (the OpenCL corpus on PoCL; the test binaries
//!   `CRANE_TEST_JOBS`, default 3, at a time), then the end-to-end tier's
//!   core scenario on emulated Xen hosts with the conformance subset
//!   (`conformance --ci`) beside it at idle priority (`CRANE_E2E_FULL=1`: the
//!   full scenario; the end-to-end tier is skipped, loudly,
//!   where this machine cannot run it; `CRANE_REQUIRE_E2E=1` makes that an
//!   error).
//! * `cargo xtask demo [--hosts 2] [--app PATH [-- ARGS]]` — on emulated Xen
//!   hosts, crane as deployed (craned and the xl wrapper in dom0, crane-proxy in
//!   a proxy domain, crane-agent in an HVM guest): an OpenCL app in the guest
//!   keeps running while `xl migrate` and a XenStore request move the guest (to
//!   the same host; with `--hosts 2` the second to the other host), on
//!   crane-proxy meanwhile and back on a freshly attached GPU after, then through
//!   `xl save` / `xl restore`; its result is checked against a native run, and
//!   each move's stoppage printed. `--app` runs a program of this machine
//!   (copied into the guest image with its libraries) instead of pingpong.
//!   Where no emulated host can run, or with `--local [--app PATH -- ARGS]`: the
//!   suspend/resume cycle on this machine without a VM.
//! * `cargo xtask bench [RUNS] [--null-vendor]` — added nanoseconds per call
//!   versus native (with `--null-vendor`, on a vendor that does nothing: the
//!   loader's and crane's own costs, free of a real vendor's noise).
//! * `cargo xtask bench-remote [SECS]` — frame rate, round trip and bandwidth
//!   natively, under crane, and under crane on crane-proxy over loopback TCP.
//! * `cargo xtask bench-data [--sizes 1K,..,256M] [--rounds N]` — every way an
//!   application moves data (benches/data.c), natively and under crane, as ratios.
//! * `cargo xtask bench-stoppage [--mib 1,..,4096] [--rewrite 0,10,100]` — the
//!   application's stoppage and crane's per-phase account of suspend/resume and
//!   of moves to crane-proxy and back, by memory size and rewrite rate.
//! * `cargo xtask conformance [--modes ...] [--ci] [SUITE[:SUBTEST,...]...]` —
//!   the Khronos OpenCL CTS natively and through crane in each mode
//!   (passthrough, suspend/resume cycles, remote, remote/local switches); fails
//!   on any sub-test whose outcome differs from native (docs/conformance.md).
//! * `cargo xtask testbed ...` — the emulated Xen host (docs/testbed.md).
//! * `cargo xtask fault-matrix [--e2e]` — every test the fault matrix in
//!   docs/reliability.md names (missing ones are failures); `--e2e` adds the
//!   full end-to-end scenario.
//! * `cargo xtask proxy-image [--nvidia DIR] ...` — the proxy domain's image for a
//!   real host, with PoCL or NVIDIA's driver (docs/operations.md).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use crane_test_vms::tier::{self, Readiness};

mod bench_data;
mod bench_stoppage;
mod conformance;
mod matrix;
mod pool;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask sits in the workspace")
        .to_path_buf()
}

pub(crate) fn run(cmd: &mut Command) -> Result<()> {
    eprintln!("xtask: {cmd:?}");
    let st = cmd
        .status()
        .with_context(|| format!("cannot run {cmd:?}"))?;
    if !st.success() {
        bail!("{cmd:?} failed with {st}");
    }
    Ok(())
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

/// Debian packages the tiers need: the ICD loader and headers, PoCL as the
/// CPU vendor, gcc for the C corpus, clinfo (compared through crane and
/// natively); libxl's headers and libraries (libxen-dev) and libclang for
/// bindgen, which dom0/libxl-sys runs at build time.
const PACKAGES: &[&str] = &[
    "ocl-icd-opencl-dev",
    "ocl-icd-libopencl1",
    "opencl-headers",
    "pocl-opencl-icd",
    "clinfo",
    "gcc",
    "libxen-dev",
    "libclang-dev",
];

fn missing_packages() -> Vec<&'static str> {
    PACKAGES
        .iter()
        .copied()
        .filter(|p| {
            !Command::new("dpkg-query")
                .args(["-W", "-f=${Status}", p])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("install ok installed"))
        })
        .collect()
}

/// Installs what is missing (as root, through apt), or says what to install.
fn ensure_packages() -> Result<()> {
    let missing = missing_packages();
    if missing.is_empty() {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        bail!("missing Debian packages {missing:?}; install them with apt-get (needs root)");
    }
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))
}

fn test() -> Result<()> {
    let t = Instant::now();
    ensure_packages()?;
    // The end-to-end tier's tools and pinned packages are installed, downloaded
    // and unpacked (mostly waiting on the network), and its binaries and images
    // built on the CPU time the other tiers leave, while they run.
    let prefetch = std::thread::spawn(prefetch_testbed);
    run(cargo().args(["fmt", "--all", "--check"]))?;
    // CRANE_E2E=1 would turn the end-to-end tests on inside the fast tiers.
    run(cargo()
        .args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])
        .env_remove(tier::E2E_ENV))?;
    // The integration tier loads the cdylib, installs it with cranectl and
    // runs crane-proxy as a process; `cargo test` builds none of them.
    run(cargo().args([
        "build",
        "-p",
        "crane-opencl",
        "-p",
        "cranectl",
        "-p",
        "crane-proxy",
    ]))?;
    // `cargo test --workspace`, its test binaries several at a time (pool.rs).
    let mut build = cargo();
    build.env_remove(tier::E2E_ENV);
    let mut jobs = pool::test_binaries(build, &["--workspace"])?;
    for job in &mut jobs {
        job.cmd.env_remove(tier::E2E_ENV);
    }
    let mut doc = cargo();
    doc.args(["test", "--workspace", "--doc"])
        .env_remove(tier::E2E_ENV);
    jobs.push(pool::Job {
        name: "doc tests".into(),
        cmd: doc,
    });
    // The two benchmarks' smoke runs go into the same pool: the test binaries
    // leave cores idle. The conformance tier (the Khronos CTS subset that fits
    // CI, natively and through crane in every mode, two modes at a time) runs
    // beside the end-to-end tier, whose emulated hosts leave a core mostly
    // idle for its whole run (below).
    let (cts, benches) = conformance_tier_jobs()?;
    jobs.extend(benches);
    pool::run_all(jobs, pool::jobs_from_env()?)?;
    eprintln!(
        "xtask: unit and integration tiers passed in {:.0} s; now the end-to-end tier, the \
         conformance tier beside it",
        t.elapsed().as_secs_f64()
    );
    let waiting = Instant::now();
    match prefetch.join() {
        Ok(Ok(())) => {}
        // The tier builds its images itself and reports what fails there.
        Ok(Err(e)) => eprintln!("xtask: getting the testbed ready ahead failed: {e:#}"),
        Err(_) => eprintln!("xtask: getting the testbed ready ahead panicked"),
    }
    if waiting.elapsed() > Duration::from_secs(1) {
        eprintln!(
            "xtask: waited {:.0} s for the testbed's images",
            waiting.elapsed().as_secs_f64()
        );
    }
    match tier::prepare() {
        Readiness::Ready => {
            // At idle priority (inherited by the suites it runs): QEMU's
            // emulated hosts must never wait for it (a starved host stalls).
            let beside = std::thread::Builder::new()
                .name("conformance-tier".into())
                .spawn(move || {
                    idle_priority_for_this_thread()?;
                    pool::run_all(vec![cts], 1)
                })
                .context("starting the conformance tier")?;
            let e2e = tier::run();
            let cts = beside
                .join()
                .map_err(|_| anyhow::anyhow!("the conformance tier panicked"))?;
            match (e2e, cts) {
                (Ok(()), Ok(())) => {}
                (Err(e), Ok(())) => return Err(e),
                (Ok(()), Err(e)) => return Err(e.context("the conformance tier")),
                (Err(e), Err(c)) => bail!("{e:#}; and the conformance tier: {c:#}"),
            }
        }
        Readiness::Skip(reason) => {
            pool::run_all(vec![cts], 1)?;
            announce_skip(&reason);
            if std::env::var(tier::REQUIRE_ENV).as_deref() == Ok("1") {
                bail!(
                    "the end-to-end tier was skipped ({reason}), and {}=1 requires it",
                    tier::REQUIRE_ENV
                );
            }
            eprintln!(
                "xtask: unit, integration and conformance tiers passed in {:.0} s; the \
                 end-to-end tier was SKIPPED: {reason}",
                t.elapsed().as_secs_f64()
            );
            return Ok(());
        }
    }
    eprintln!(
        "xtask: all tiers passed, the end-to-end tier included, in {:.0} s",
        t.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The conformance tier and the benchmarks' smoke runs as pool jobs, each
/// this program run again on the debug builds made above: the CTS subset in
/// every mode (returned first, on its own); every transfer path
/// at tiny sizes natively and under crane (the benchmark cannot rot, and each
/// path's bytes are checked under crane); the stoppage benchmark at 1 MiB
/// (suspend/resume and a move to crane-proxy and back, the application's
/// memory checked at the end).
fn conformance_tier_jobs() -> Result<(pool::Job, Vec<pool::Job>)> {
    let debug = root().join("target/debug");
    let lib = debug.join("libcrane_opencl.so");
    let proxy = debug.join("crane-proxy");
    let me = std::env::current_exe().context("where is xtask")?;
    let job = |name: &str, args: &[&std::ffi::OsStr]| {
        let mut cmd = Command::new(&me);
        cmd.args(args).current_dir(root()).env_remove(tier::E2E_ENV);
        pool::Job {
            name: name.into(),
            cmd,
        }
    };
    let (lib, proxy) = (lib.as_os_str(), proxy.as_os_str());
    let o = |s: &'static str| std::ffi::OsStr::new(s);
    let cts = job(
        "xtask conformance",
        &[
            o("conformance"),
            o("--ci"),
            o("--jobs"),
            o("2"),
            o("--lib"),
            lib,
            o("--proxy"),
            proxy,
        ],
    );
    let benches = vec![
        job(
            "xtask bench-data",
            &[
                o("bench-data"),
                o("--sizes"),
                o("4K,1M"),
                o("--bytes-per-path"),
                o("4M"),
                o("--rounds"),
                o("1"),
                o("--lib"),
                lib,
            ],
        ),
        job(
            "xtask bench-stoppage",
            &[
                o("bench-stoppage"),
                o("--mib"),
                o("1"),
                o("--rewrite"),
                o("100"),
                o("--buffer-mib"),
                o("0.25"),
                o("--repeat"),
                o("1"),
                o("--lib"),
                lib,
                o("--proxy"),
                proxy,
            ],
        ),
    ];
    Ok((cts, benches))
}

/// Gets the end-to-end tier ready while the other tiers run: installs its host
/// tools if they are missing, fetches and unpacks its pinned Debian packages
/// (mostly waiting on the network), then builds crane's release binaries and the
/// images at idle priority, so that the tier itself only boots and tests. Does
/// nothing if the tier is to be skipped.
fn prefetch_testbed() -> Result<()> {
    if let Readiness::Skip(_) = tier::prepare() {
        return Ok(());
    }
    let started = Instant::now();
    // crane's own binaries need no package: their build (at idle priority,
    // like the images') starts now, beside the fetch, which mostly waits on
    // the network.
    let binaries = std::thread::Builder::new()
        .name("testbed-binaries".into())
        .spawn(|| -> Result<Duration> {
            let started = Instant::now();
            idle_priority_for_this_thread()?;
            crane_test_vms::domus::CraneArtifacts::build()?;
            Ok(started.elapsed())
        })
        .context("starting the build of crane's binaries for the testbed")?;
    let paths = crane_images::Paths::in_workspace(&root());
    crane_images::Builder::new(paths.clone()).context("fetching the testbed's pinned packages")?;
    eprintln!(
        "xtask: the testbed's pinned packages are fetched and unpacked ({:.0} s, beside the other tiers)",
        started.elapsed().as_secs_f64()
    );
    let built = binaries
        .join()
        .map_err(|_| anyhow::anyhow!("building crane's binaries for the testbed panicked"))?
        .context("building crane's binaries for the testbed")?;
    eprintln!(
        "xtask: crane's binaries for the testbed are built ({:.0} s at idle priority, beside the other tiers)",
        built.as_secs_f64()
    );
    let started = Instant::now();
    idle_priority_for_this_thread()?;
    crane_test_vms::build_images(&paths).context("building the testbed's images ahead")?;
    eprintln!(
        "xtask: the testbed's images are built ({:.0} s at idle priority, beside the other tiers)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// Puts the calling thread, and every process it starts from now on (cargo,
/// rustc, mksquashfs inherit it), under `SCHED_IDLE`: it runs only on CPU time
/// that nothing else wants, so the tiers in the foreground are not slowed, yet
/// their idle moments (a test waiting on a socket, a linker on the disk) are
/// used.
fn idle_priority_for_this_thread() -> Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: pid 0 names the calling thread; `param` is a valid sched_param that
    // outlives the call, and SCHED_IDLE requires priority 0.
    let rc = unsafe { libc::sched_setscheduler(0, libc::SCHED_IDLE, &param) };
    if rc != 0 {
        bail!(
            "sched_setscheduler(SCHED_IDLE): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

/// Says in a way nobody can miss that the end-to-end tier did not run.
fn announce_skip(reason: &str) {
    let rule = "=".repeat(78);
    eprintln!(
        "xtask: {rule}\n\
         xtask: END-TO-END TIER SKIPPED: {reason}.\n\
         xtask: Nothing ran on Xen: no VM booted, no migration was tested. The tier needs\n\
         xtask: QEMU and squashfs-tools (installed through apt when run as root).\n\
         xtask: Set {}=1 to make a skipped end-to-end tier an error.\n\
         xtask: {rule}",
        tier::REQUIRE_ENV
    );
}

fn result_line(out: &[u8]) -> String {
    String::from_utf8_lossy(out)
        .lines()
        .find(|l| l.starts_with("RESULT "))
        .unwrap_or_default()
        .to_string()
}

/// The demo: on an emulated Xen host when this machine can run one, else the local
/// cycle, saying why.
fn demo(args: &DemoArgs) -> Result<()> {
    ensure_packages()?;
    // `--app PATH [-- ARGS]`: any OpenCL program of this machine instead of pingpong.
    let app = match &args.app {
        Some(path) => Some(crane_test_vms::scenario::App::from_host(
            path,
            args.app_args.clone(),
        )?),
        None => None,
    };
    if !args.local {
        match tier::prepare() {
            Readiness::Ready => return xen_demo(args.hosts, app),
            Readiness::Skip(reason) => eprintln!(
                "xtask demo: cannot boot an emulated Xen host here: {reason}.\n\
                 xtask demo: running the LOCAL cycle instead: the app suspended and resumed on \
                 this machine, with no VM, no GPU detach and no migration."
            ),
        }
    }
    local_demo(args)
}

/// The scenario of `crane_test_vms::scenario` on `hosts` emulated Xen hosts.
fn xen_demo(hosts: usize, app: Option<crane_test_vms::scenario::App>) -> Result<()> {
    let app = app.unwrap_or_default();
    println!(
        "== crane on {hosts} emulated Xen host(s) (Debian's Xen under QEMU; an e1000 stands in \
         for the GPU)"
    );
    println!(
        "   craned and the xl wrapper in dom0, crane-proxy in a proxy domain, crane-agent in \
         an HVM guest; {} {} there natively, then under crane (the guest's libOpenCL.so.1) \
         while the guest moves: `xl migrate` through the wrapper and a request written to \
         XenStore, each {} (the program runs on crane-proxy meanwhile), then `xl save` / \
         `xl restore` (the program parked in RAM); finally the proxy domain is destroyed \
         and craned creates it again",
        app.program,
        app.args.join(" "),
        if hosts == 2 {
            "to the same host, then to the other host"
        } else {
            "to the same host (--hosts 2 sends the second to the other host)"
        }
    );
    if !app.holds() {
        println!(
            "   {} does not hold halfway like the test programs: the guest moves while it \
             runs, as often as it runs long enough; its whole output must equal the native \
             run's",
            app.program
        );
    }
    let started = Instant::now();
    let report = crane_test_vms::demo(hosts, &app)?;
    print!("{}", report.summary());
    println!(
        "== {} identical to the native run after {} move(s) of the guest; {:.0} s in all",
        if app.holds() { "result" } else { "output" },
        report.migrations.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The local cycle: run an app natively, then under crane while suspending (GPU
/// state to RAM, vendor library unloaded) and resuming it, and compare.
fn local_demo(args: &DemoArgs) -> Result<()> {
    run(cargo().args(["build", "--release", "-p", "crane-opencl", "-p", "cranectl"]))?;
    let apps = root().join("target/testapps");
    run(Command::new("bash")
        .arg(root().join("testapps/build.sh"))
        .arg(&apps))?;
    let (app, app_args): (PathBuf, Vec<String>) = match &args.app {
        Some(path) => (path.clone(), args.app_args.clone()),
        None => (
            apps.join("pingpong"),
            vec!["--iters".into(), "30000".into()],
        ),
    };
    let lib = root().join("target/release/libcrane_opencl.so");
    let cranectl = root().join("target/release/cranectl");
    let run_dir = std::env::temp_dir().join(format!("crane-demo-{}", std::process::id()));

    println!("== native run of {}", app.display());
    let t = Instant::now();
    let native = Command::new(&app).args(&app_args).output()?;
    if !native.status.success() {
        bail!(
            "the app failed natively: {}",
            String::from_utf8_lossy(&native.stderr)
        );
    }
    let want = result_line(&native.stdout);
    println!("   {want}  ({:.2} s)", t.elapsed().as_secs_f64());

    println!("== the same under libcrane_opencl.so, suspended and resumed while it runs");
    let t = Instant::now();
    let child = Command::new(&app)
        .args(&app_args)
        .env("LD_PRELOAD", &lib)
        .env("CRANE_RUN_DIR", &run_dir)
        .stdout(std::process::Stdio::piped())
        .spawn()?;
    let pid = child.id().to_string();
    let sock = run_dir.join("apps").join(format!("{pid}.sock"));
    let waiter = std::thread::spawn(move || child.wait_with_output());
    let mut cycles = 0;
    while !waiter.is_finished() && cycles < 10 {
        std::thread::sleep(Duration::from_millis(150));
        if !sock.exists() {
            continue;
        }
        let s = Command::new(&cranectl)
            .args(["suspend", &pid])
            .env("CRANE_RUN_DIR", &run_dir)
            .output()?;
        print!("   {}", String::from_utf8_lossy(&s.stdout));
        if !s.status.success() {
            continue;
        }
        let r = Command::new(&cranectl)
            .args(["resume", &pid])
            .env("CRANE_RUN_DIR", &run_dir)
            .output()?;
        print!("   {}", String::from_utf8_lossy(&r.stdout));
        cycles += 1;
    }
    let out = waiter.join().expect("waiter thread")?;
    let got = result_line(&out.stdout);
    println!(
        "   {got}  ({:.2} s, {cycles} suspend/resume cycles)",
        t.elapsed().as_secs_f64()
    );
    let _ = std::fs::remove_dir_all(&run_dir);
    if got != want || !out.status.success() {
        bail!("results differ: native {want:?}, under crane {got:?}");
    }
    if cycles == 0 {
        bail!("the app ended before any suspend landed; give it more work");
    }
    println!(
        "== identical to the native run after {cycles} cycles of suspend (vendor library unloaded) and resume"
    );
    Ok(())
}

fn bench_lines(out: &[u8]) -> Vec<(String, f64)> {
    String::from_utf8_lossy(out)
        .lines()
        .filter_map(|l| {
            let mut w = l.strip_prefix("BENCH ")?.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.parse().ok()?))
        })
        .collect()
}

/// Per-call cost crane adds on the hottest calls: benches/call_overhead.c run
/// natively and under libcrane_opencl.so, alternating, best of several runs.
/// A figure printer, not a test: the goals (docs/benchmarks.md) are read off it.
fn bench(args: &BenchArgs) -> Result<()> {
    ensure_packages()?;
    run(cargo().args(["build", "--release", "-p", "crane-opencl"]))?;
    let exe = root().join("target/bench/call_overhead");
    std::fs::create_dir_all(exe.parent().expect("has a parent"))?;
    run(Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(root().join("benches/call_overhead.c"))
        .arg("-lOpenCL"))?;
    let lib = root().join("target/release/libcrane_opencl.so");
    let BenchArgs { null_vendor, runs } = *args;
    // With --null-vendor both runs call a vendor that does nothing
    // (benches/nullvendor.c): natively the figures are the ICD loader's own
    // cost per call, under crane crane's own.
    let null_icd = root().join("target/bench/null-icd");
    if null_vendor {
        let so = root().join("target/bench/libnullvendor.so");
        run(Command::new("gcc")
            .args([
                "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o",
            ])
            .arg(&so)
            .arg(root().join("benches/nullvendor.c")))?;
        std::fs::create_dir_all(&null_icd)?;
        std::fs::write(null_icd.join("null.icd"), format!("{}\n", so.display()))?;
        println!(
            "vendor: benches/nullvendor.c (does nothing): the figures are the ICD loader's and crane's own costs"
        );
    }
    let mut best: Vec<(String, f64, f64)> = Vec::new();
    for _ in 0..runs {
        for under_crane in [false, true] {
            let mut c = Command::new(&exe);
            if null_vendor {
                c.env_remove("OCL_ICD_FILENAMES")
                    .env("OCL_ICD_VENDORS", &null_icd)
                    .env("CRANE_VENDOR", root().join("target/bench/libnullvendor.so"));
            }
            if under_crane {
                c.env("LD_PRELOAD", &lib)
                    .env("CRANE_RUN_DIR", std::env::temp_dir().join("crane-bench"));
            }
            let out = c.output()?;
            if !out.status.success() {
                bail!(
                    "{} failed: {}",
                    exe.display(),
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            for (name, ns) in bench_lines(&out.stdout) {
                let i = match best.iter().position(|b| b.0 == name) {
                    Some(i) => i,
                    None => {
                        best.push((name, f64::MAX, f64::MAX));
                        best.len() - 1
                    }
                };
                let slot = if under_crane {
                    &mut best[i].2
                } else {
                    &mut best[i].1
                };
                *slot = slot.min(ns);
            }
        }
    }
    println!(
        "{:<30} {:>12} {:>12} {:>12}",
        "call", "native ns", "crane ns", "added ns"
    );
    for (name, native, crane) in best {
        println!(
            "{name:<30} {native:>12.1} {crane:>12.1} {:>12.1}",
            crane - native
        );
    }
    Ok(())
}

/// What remoting costs an application: benches/remoting.c natively, under
/// crane locally, and under crane on a crane-proxy on loopback TCP, with and
/// without batching. A figure printer (docs/benchmarks.md), not a test.
fn bench_remote(args: &BenchRemoteArgs) -> Result<()> {
    ensure_packages()?;
    run(cargo().args([
        "build",
        "--release",
        "-p",
        "crane-opencl",
        "-p",
        "crane-proxy",
    ]))?;
    let exe = root().join("target/bench/remoting");
    std::fs::create_dir_all(exe.parent().expect("has a parent"))?;
    run(Command::new("gcc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(root().join("benches/remoting.c"))
        .arg("-lOpenCL"))?;
    let lib = root().join("target/release/libcrane_opencl.so");
    let secs = args.secs.to_string();
    let dir = std::env::temp_dir().join(format!("crane-bench-remote-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("tokens"), "bench bench\n")?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = format!("tcp://127.0.0.1:{port}");
    let mut proxy = Command::new(root().join("target/release/crane-proxy"))
        .args(["--listen", &addr, "--token-file"])
        .arg(dir.join("tokens"))
        .spawn()
        .context("starting crane-proxy")?;
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if start.elapsed() > Duration::from_secs(20) {
            let _ = proxy.kill();
            bail!("crane-proxy did not start");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let configs: [(&str, &[(&str, &str)]); 4] = [
        ("native", &[]),
        ("crane local", &[("LD_PRELOAD", "")]),
        (
            "remote, batched",
            &[("LD_PRELOAD", ""), ("CRANE_MODE", "remote")],
        ),
        (
            "remote, unbatched",
            &[
                ("LD_PRELOAD", ""),
                ("CRANE_MODE", "remote"),
                ("CRANE_REMOTE_BATCH", "0"),
            ],
        ),
    ];
    // Per configuration: (figure, value, unit) lines.
    type Figures = Vec<(String, f64, String)>;
    let mut table: Vec<(String, Figures)> = Vec::new();
    let result = (|| -> Result<()> {
        for (name, env) in configs {
            let mut c = Command::new(&exe);
            c.arg(&secs);
            for (k, v) in env {
                if *k == "LD_PRELOAD" {
                    c.env(k, &lib);
                } else {
                    c.env(k, v);
                }
            }
            c.env("CRANE_RUN_DIR", dir.join("run"))
                .env("CRANE_PROXY", &addr)
                .env("CRANE_PROXY_TOKEN", "bench");
            let out = c.output()?;
            if !out.status.success() {
                bail!("{name}: {}", String::from_utf8_lossy(&out.stderr));
            }
            let lines = String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| {
                    let mut w = l.strip_prefix("BENCH ")?.split_whitespace();
                    Some((
                        w.next()?.to_string(),
                        w.next()?.parse().ok()?,
                        w.next().unwrap_or("").to_string(),
                    ))
                })
                .collect();
            table.push((name.to_string(), lines));
        }
        Ok(())
    })();
    let _ = proxy.kill();
    let _ = proxy.wait();
    let _ = std::fs::remove_dir_all(&dir);
    result?;
    let names: Vec<(String, String)> = table[0]
        .1
        .iter()
        .map(|(n, _, u)| (n.clone(), u.clone()))
        .collect();
    print!("{:<14} {:<12}", "figure", "unit");
    for (c, _) in &table {
        print!(" {c:>18}");
    }
    println!();
    for (n, u) in &names {
        print!("{n:<14} {u:<12}");
        for (_, lines) in &table {
            let v = lines.iter().find(|l| &l.0 == n).map_or(f64::NAN, |l| l.1);
            print!(" {v:>18.1}");
        }
        println!();
    }
    let fr = |i: usize| {
        table[i]
            .1
            .iter()
            .find(|l| l.0 == "frame_rate")
            .map_or(f64::NAN, |l| l.1)
    };
    println!(
        "frame rate while remoting (batched): {:.0}% of native; unbatched: {:.0}%",
        100.0 * fr(2) / fr(0),
        100.0 * fr(3) / fr(0)
    );
    Ok(())
}

/// Builds the interposer and crane-proxy for `conformance`, returning their paths.
fn build_for_conformance(release: bool) -> Result<(PathBuf, PathBuf)> {
    ensure_packages()?;
    let mut c = cargo();
    c.args(["build", "-p", "crane-opencl", "-p", "crane-proxy"]);
    if release {
        c.arg("--release");
    }
    run(&mut c)?;
    let dir = root()
        .join("target")
        .join(if release { "release" } else { "debug" });
    Ok((dir.join("libcrane_opencl.so"), dir.join("crane-proxy")))
}

/// `cargo xtask`'s command line.
#[derive(Debug, Parser)]
#[command(
    name = "xtask",
    bin_name = "cargo xtask",
    version,
    propagate_version = true,
    about = "crane's build, test, benchmark and demo driver"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Everything CI runs: fmt, clippy, unit, integration and conformance
    /// tiers, then the end-to-end tier on emulated Xen hosts.
    Test,
    /// crane as deployed on emulated Xen hosts, an OpenCL app moving with its
    /// guest; where no emulated host can run (or with --local), the
    /// suspend/resume cycle on this machine.
    Demo(DemoArgs),
    /// Added nanoseconds per call under crane versus native
    /// (benches/call_overhead.c).
    Bench(BenchArgs),
    /// Frame rate, round trip and bandwidth natively, under crane, and under
    /// crane on crane-proxy over loopback TCP (benches/remoting.c).
    BenchRemote(BenchRemoteArgs),
    BenchData(bench_data::Args),
    BenchStoppage(bench_stoppage::Args),
    Conformance(conformance::Args),
    /// The emulated Xen testbed (docs/testbed.md).
    Testbed(crane_test_vms::Cli),
    /// Every test the fault matrix of docs/reliability.md names; missing ones
    /// are failures.
    FaultMatrix(matrix::Args),
    /// The proxy domain's image for a real Xen host, with PoCL or NVIDIA's
    /// driver (docs/operations.md).
    ProxyImage(crane_test_vms::proxy_image::Args),
}

#[derive(Debug, clap::Args)]
struct DemoArgs {
    /// Run the suspend/resume cycle on this machine, without a VM.
    #[arg(long, overrides_with = "local")]
    local: bool,
    /// Emulated Xen hosts, 1 or 2; with 2 the XenStore-requested migration goes
    /// to the other host.
    #[arg(
        long,
        default_value_t = 1,
        value_name = "N",
        value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=2)
    )]
    hosts: usize,
    /// Run this OpenCL program of this machine instead of pingpong (copied
    /// into the guest image with its libraries); its whole output must equal
    /// its native run's.
    #[arg(long, value_name = "PATH")]
    app: Option<PathBuf>,
    /// The program's arguments, after `--` (with --app only).
    #[arg(last = true, requires = "app", value_name = "ARGS")]
    app_args: Vec<String>,
}

#[derive(Debug, Clone, Copy, clap::Args)]
#[command(args_override_self = true)]
struct BenchArgs {
    /// Call a vendor that does nothing (benches/nullvendor.c): the figures are
    /// then the ICD loader's and crane's own costs.
    #[arg(long)]
    null_vendor: bool,
    /// Rounds, each running benches/call_overhead.c natively, then under crane;
    /// each figure is the best round's.
    #[arg(default_value_t = 3)]
    runs: usize,
}

#[derive(Debug, clap::Args)]
struct BenchRemoteArgs {
    /// How long each configuration's measurements run, in seconds.
    #[arg(default_value_t = 2.0)]
    secs: f64,
}

fn main() -> Result<()> {
    match Cli::parse().command {
        Cmd::Test => test(),
        Cmd::Demo(a) => demo(&a),
        Cmd::Bench(a) => bench(&a),
        Cmd::BenchRemote(a) => bench_remote(&a),
        Cmd::BenchStoppage(a) => bench_stoppage::main(a, &root(), || build_for_conformance(true)),
        Cmd::BenchData(a) => bench_data::main(a, &root(), || {
            ensure_packages()?;
            run(cargo().args(["build", "--release", "-p", "crane-opencl"]))?;
            Ok(root().join("target/release/libcrane_opencl.so"))
        }),
        Cmd::Testbed(a) => crane_test_vms::cli(a),
        Cmd::FaultMatrix(a) => matrix::main(&root(), a, cargo),
        Cmd::ProxyImage(a) => crane_test_vms::proxy_image::cli(a),
        Cmd::Conformance(a) => conformance::main(a, &root(), build_for_conformance),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use clap::error::ErrorKind;
    use crane_test_vms::CliCommand as Testbed;

    fn parse(args: &[&str]) -> Cmd {
        let argv = std::iter::once("xtask").chain(args.iter().copied());
        match Cli::try_parse_from(argv) {
            Ok(cli) => cli.command,
            Err(e) => panic!("{args:?} should parse: {e}"),
        }
    }

    fn refused(args: &[&str]) -> ErrorKind {
        let argv = std::iter::once("xtask").chain(args.iter().copied());
        match Cli::try_parse_from(argv) {
            Ok(cli) => panic!("{args:?} should be refused, parsed as {:?}", cli.command),
            Err(e) => e.kind(),
        }
    }

    fn strings(words: &[&str]) -> Vec<String> {
        words.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn help_and_version_everywhere_run_nothing() {
        let mut paths: Vec<Vec<String>> = vec![vec![]];
        for sub in Cli::command().get_subcommands() {
            paths.push(vec![sub.get_name().to_string()]);
            for nested in sub.get_subcommands() {
                paths.push(vec![
                    sub.get_name().to_string(),
                    nested.get_name().to_string(),
                ]);
            }
        }
        // Every subcommand and every testbed command.
        assert!(paths.len() > 10 + 9, "{paths:?}");
        for path in paths {
            for (flag, kind) in [
                ("--help", ErrorKind::DisplayHelp),
                ("-h", ErrorKind::DisplayHelp),
                ("--version", ErrorKind::DisplayVersion),
                ("-V", ErrorKind::DisplayVersion),
            ] {
                if path.last().is_some_and(|p| p == "help") {
                    continue;
                }
                let mut argv: Vec<&str> = path.iter().map(String::as_str).collect();
                argv.push(flag);
                assert_eq!(refused(&argv), kind, "{argv:?}");
            }
        }
        let version = Cli::try_parse_from(["xtask", "--version"]).unwrap_err();
        assert!(
            version.to_string().contains(env!("CARGO_PKG_VERSION")),
            "{version}"
        );
    }

    #[test]
    fn bench_help_is_help_not_a_run() {
        assert_eq!(refused(&["bench", "--help"]), ErrorKind::DisplayHelp);
        assert_eq!(
            refused(&["bench", "--null-vendor", "--help"]),
            ErrorKind::DisplayHelp
        );
    }

    #[test]
    fn unknown_commands_options_and_missing_values_are_errors() {
        // A missing command shows the help, as an error (exit status 2).
        assert_eq!(
            refused(&[]),
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        );
        assert_eq!(refused(&["tset"]), ErrorKind::InvalidSubcommand);
        assert_eq!(refused(&["test", "--bogus"]), ErrorKind::UnknownArgument);
        assert_eq!(refused(&["test", "extra"]), ErrorKind::UnknownArgument);
        assert_eq!(refused(&["bench", "--bogus"]), ErrorKind::UnknownArgument);
        assert_eq!(
            refused(&["bench", "--null-vender"]),
            ErrorKind::UnknownArgument
        );
        assert_eq!(refused(&["bench", "5", "7"]), ErrorKind::UnknownArgument);
        assert_eq!(refused(&["bench", "many"]), ErrorKind::ValueValidation);
        assert_eq!(
            refused(&["bench-remote", "long"]),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            refused(&["bench-remote", "2", "3"]),
            ErrorKind::UnknownArgument
        );
        assert_eq!(
            refused(&["bench-stoppage", "--mib"]),
            ErrorKind::InvalidValue
        );
        assert_eq!(
            refused(&["bench-stoppage", "--mbi", "1"]),
            ErrorKind::UnknownArgument
        );
        assert_eq!(
            refused(&["bench-data", "--rounds"]),
            ErrorKind::InvalidValue
        );
        assert_eq!(
            refused(&["conformance", "--jobs", "17"]),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            refused(&["conformance", "--modes", "bogus"]),
            ErrorKind::InvalidValue
        );
        assert_eq!(
            refused(&["demo", "--hosts", "3"]),
            ErrorKind::ValueValidation
        );
        assert_eq!(refused(&["demo", "--hosts"]), ErrorKind::InvalidValue);
        assert_eq!(refused(&["demo", "--app"]), ErrorKind::InvalidValue);
        assert_eq!(
            refused(&["demo", "--hsts", "2"]),
            ErrorKind::UnknownArgument
        );
        assert_eq!(
            refused(&["demo", "--", "--iters", "5"]),
            ErrorKind::MissingRequiredArgument
        );
        assert_eq!(
            refused(&["demo", "--app", "x", "y"]),
            ErrorKind::UnknownArgument
        );
        assert_eq!(
            refused(&["fault-matrix", "--e2f"]),
            ErrorKind::UnknownArgument
        );
        assert_eq!(
            refused(&["fault-matrix", "e2e"]),
            ErrorKind::UnknownArgument
        );
        assert_eq!(
            refused(&["testbed"]),
            ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
        );
        assert_eq!(refused(&["testbed", "upp"]), ErrorKind::InvalidSubcommand);
        assert_eq!(
            refused(&["testbed", "up", "--hosts"]),
            ErrorKind::InvalidValue
        );
        assert_eq!(
            refused(&["testbed", "up", "--hots", "2"]),
            ErrorKind::UnknownArgument
        );
        assert_eq!(
            refused(&["testbed", "run"]),
            ErrorKind::MissingRequiredArgument
        );
        assert_eq!(
            refused(&["testbed", "run", "--timeout"]),
            ErrorKind::InvalidValue
        );
        assert_eq!(
            refused(&["testbed", "run", "--hosts", "1", "ls"]),
            ErrorKind::UnknownArgument
        );
        assert_eq!(
            refused(&["testbed", "soak", "--migrations", "x"]),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            refused(&["testbed", "status", "now"]),
            ErrorKind::UnknownArgument
        );
        assert_eq!(
            refused(&["proxy-image", "--nvdia", "nv"]),
            ErrorKind::UnknownArgument
        );
        assert_eq!(refused(&["proxy-image", "--out"]), ErrorKind::InvalidValue);
        assert_eq!(
            refused(&["proxy-image", "--port", "70000"]),
            ErrorKind::ValueValidation
        );
        assert_eq!(
            refused(&["proxy-image", "extra"]),
            ErrorKind::UnknownArgument
        );
    }

    #[test]
    fn test_and_fault_matrix_parse() {
        assert!(matches!(parse(&["test"]), Cmd::Test));
        assert!(matches!(parse(&["fault-matrix"]), Cmd::FaultMatrix(a) if !a.e2e));
        assert!(matches!(parse(&["fault-matrix", "--e2e"]), Cmd::FaultMatrix(a) if a.e2e));
    }

    #[test]
    fn demo_parses_as_the_docs_use_it() {
        let demo = |args: &[&str]| match parse(args) {
            Cmd::Demo(a) => a,
            other => panic!("{other:?}"),
        };
        let a = demo(&["demo"]);
        assert!(!a.local && a.hosts == 1 && a.app.is_none() && a.app_args.is_empty());
        assert_eq!(demo(&["demo", "--hosts", "2"]).hosts, 2);
        assert_eq!(demo(&["demo", "--hosts", "1"]).hosts, 1);
        assert!(demo(&["demo", "--local"]).local);
        // Repeated --local is as good as one, as it was.
        assert!(demo(&["demo", "--local", "--local"]).local);
        let a = demo(&[
            "demo",
            "--app",
            "target/testbed/testapps/frameloop",
            "--",
            "--iters",
            "6000",
        ]);
        assert_eq!(
            a.app.as_deref(),
            Some(Path::new("target/testbed/testapps/frameloop"))
        );
        assert_eq!(a.app_args, strings(&["--iters", "6000"]));
        assert!(!a.local);
        // Flags after `--` are the program's, not the demo's.
        let a = demo(&[
            "demo", "--local", "--app", "./app", "--", "--local", "--hosts", "9",
        ]);
        assert!(a.local);
        assert_eq!(a.hosts, 1);
        assert_eq!(a.app_args, strings(&["--local", "--hosts", "9"]));
        let a = demo(&["demo", "--hosts", "2", "--app", "./app"]);
        assert_eq!((a.hosts, a.app_args.len()), (2, 0));
    }

    #[test]
    fn bench_takes_null_vendor_and_a_run_count_in_either_order() {
        let bench = |args: &[&str]| match parse(args) {
            Cmd::Bench(a) => (a.null_vendor, a.runs),
            other => panic!("{other:?}"),
        };
        assert_eq!(bench(&["bench"]), (false, 3));
        assert_eq!(bench(&["bench", "--null-vendor"]), (true, 3));
        assert_eq!(bench(&["bench", "5"]), (false, 5));
        assert_eq!(bench(&["bench", "5", "--null-vendor"]), (true, 5));
        assert_eq!(bench(&["bench", "--null-vendor", "7"]), (true, 7));
        assert_eq!(
            bench(&["bench", "--null-vendor", "--null-vendor"]),
            (true, 3)
        );
    }

    #[test]
    fn bench_remote_takes_optional_seconds() {
        let secs = |args: &[&str]| match parse(args) {
            Cmd::BenchRemote(a) => a.secs.to_string(),
            other => panic!("{other:?}"),
        };
        // The figure benches/remoting.c is given as its argument.
        assert_eq!(secs(&["bench-remote"]), "2");
        assert_eq!(secs(&["bench-remote", "5"]), "5");
        assert_eq!(secs(&["bench-remote", "0.5"]), "0.5");
    }

    #[test]
    fn bench_data_and_bench_stoppage_parse_as_scripts_call_them() {
        let Cmd::BenchData(a) = parse(&["bench-data"]) else {
            panic!()
        };
        assert_eq!(
            (a.sizes.as_str(), a.bytes_per_path.as_str(), a.rounds),
            ("1K,64K,1M,16M,256M", "1G", 2)
        );
        let Cmd::BenchData(a) = parse(&[
            "bench-data",
            "--lib",
            "d/libcrane_opencl.so",
            "--exe",
            "d/data",
            "--sizes",
            "1M,256M",
            "--rounds",
            "2",
            "--bytes-per-path",
            "512M",
            "--out",
            "w/data.json",
            "--platform",
            "NVIDIA",
        ]) else {
            panic!()
        };
        assert_eq!(a.sizes, "1M,256M");
        assert_eq!(a.bytes_per_path, "512M");
        assert_eq!(a.exe.as_deref(), Some(Path::new("d/data")));
        assert_eq!(a.out.as_deref(), Some(Path::new("w/data.json")));
        assert_eq!(a.platform.as_deref(), Some("NVIDIA"));

        let Cmd::BenchStoppage(a) = parse(&["bench-stoppage"]) else {
            panic!()
        };
        assert_eq!(
            (a.mib.as_str(), a.rewrite.as_str(), a.buffer_mib, a.repeat),
            ("1,16,256,1024,4096", "0,10,100", 8.0, 2)
        );
        assert_eq!(
            a.steps,
            strings(&["suspend", "precopy", "remote", "pc-remote"])
        );
        assert_eq!(a.precopy_rounds, 4);
        let Cmd::BenchStoppage(a) = parse(&[
            "bench-stoppage",
            "--lib",
            "d/libcrane_opencl.so",
            "--proxy",
            "d/crane-proxy",
            "--exe",
            "d/stoppage",
            "--mib",
            "1,256,1024",
            "--rewrite",
            "0,10,100",
            "--repeat",
            "2",
            "--steps",
            "remote,pc-remote",
            "--out",
            "w/stoppage.json",
            "--moves",
            "cpu,gpu",
            "--precopy-rounds",
            "3",
        ]) else {
            panic!()
        };
        assert_eq!(a.mib, "1,256,1024");
        assert_eq!(a.steps, strings(&["remote", "pc-remote"]));
        assert_eq!(a.proxy.as_deref(), Some(Path::new("d/crane-proxy")));
        assert_eq!(a.moves.as_deref(), Some("cpu,gpu"));
        assert_eq!(a.precopy_rounds, 3);
    }

    #[test]
    fn conformance_parses_as_ci_and_the_scripts_call_it() {
        let Cmd::Conformance(a) = parse(&["conformance"]) else {
            panic!()
        };
        assert_eq!(a.modes.len(), 5);
        assert_eq!(
            (a.jobs, a.timeout, a.interval.as_str()),
            (1, 1200, "500-1000")
        );
        assert!(!a.ci && a.suites.is_empty());
        let Cmd::Conformance(a) = parse(&[
            "conformance",
            "--modes",
            "native,cycles,switches",
            "--jobs",
            "2",
        ]) else {
            panic!()
        };
        assert_eq!(
            a.modes,
            [
                conformance::Mode::Native,
                conformance::Mode::Cycles,
                conformance::Mode::Switches
            ]
        );
        assert_eq!(a.jobs, 2);
        // benches/cts-gpu.sh run.
        let Cmd::Conformance(a) = parse(&[
            "conformance",
            "--cts",
            "d/cts",
            "--lib",
            "d/libcrane_opencl.so",
            "--proxy",
            "d/crane-proxy",
            "--out",
            "o/conf-t.json",
            "--logs",
            "/tmp/logs-t",
            "--jobs",
            "4",
            "--exclude",
            "test_basic:hostptr",
            "--release",
            "--timeout",
            "60",
            "test_compiler",
            "test_basic:hostptr,arraycopy",
        ]) else {
            panic!()
        };
        assert_eq!(a.cts.as_deref(), Some(Path::new("d/cts")));
        assert_eq!(a.logs.as_deref(), Some(Path::new("/tmp/logs-t")));
        assert_eq!(a.exclude, strings(&["test_basic:hostptr"]));
        assert!(a.release);
        assert_eq!(
            a.suites,
            strings(&["test_compiler", "test_basic:hostptr,arraycopy"])
        );
    }

    #[test]
    fn the_ci_tier_s_own_invocations_parse() {
        let (cts, benches) = conformance_tier_jobs().unwrap();
        assert_eq!(cts.name, "xtask conformance");
        assert_eq!(benches.len(), 2);
        for job in std::iter::once(cts).chain(benches) {
            let argv = std::iter::once(std::ffi::OsStr::new("xtask")).chain(job.cmd.get_args());
            if let Err(e) = Cli::try_parse_from(argv) {
                panic!("{}: {e}", job.name);
            }
        }
        // fault-matrix --e2e runs `cargo xtask testbed e2e`.
        assert!(matches!(
            parse(&["testbed", "e2e"]),
            Cmd::Testbed(t) if t.command == Testbed::E2e
        ));
    }

    #[test]
    fn testbed_commands_parse_as_docs_testbed_md_gives_them() {
        let tb = |args: &[&str]| match parse(args) {
            Cmd::Testbed(t) => t.command,
            other => panic!("{other:?}"),
        };
        assert_eq!(tb(&["testbed", "lock"]), Testbed::Lock);
        assert_eq!(tb(&["testbed", "images"]), Testbed::Images);
        assert_eq!(tb(&["testbed", "logs"]), Testbed::Logs);
        assert_eq!(tb(&["testbed", "status"]), Testbed::Status);
        assert_eq!(tb(&["testbed", "down"]), Testbed::Down);
        assert_eq!(
            tb(&["testbed", "up"]),
            Testbed::Up {
                hosts: 1,
                bare: false
            }
        );
        assert_eq!(
            tb(&["testbed", "up", "--bare"]),
            Testbed::Up {
                hosts: 1,
                bare: true
            }
        );
        assert_eq!(
            tb(&["testbed", "up", "--hosts", "2", "--bare"]),
            Testbed::Up {
                hosts: 2,
                bare: true
            }
        );
        // As before, the last of a repeated option counts.
        assert_eq!(
            tb(&["testbed", "up", "--hosts", "2", "--hosts", "1"]),
            Testbed::Up {
                hosts: 1,
                bare: false
            }
        );
        let run = |host: usize, timeout: u64, domain: Option<&str>, cmd: &[&str]| Testbed::Run {
            host,
            timeout,
            domain: domain.map(String::from),
            cmd: strings(cmd),
        };
        assert_eq!(
            tb(&["testbed", "run", "--", "xl", "info"]),
            run(0, 600, None, &["xl", "info"])
        );
        assert_eq!(
            tb(&["testbed", "run", "--", "xl list; exit 3"]),
            run(0, 600, None, &["xl list; exit 3"])
        );
        assert_eq!(
            tb(&["testbed", "run", "--domain", "proxy", "--", "ip", "addr"]),
            run(0, 600, Some("proxy"), &["ip", "addr"])
        );
        assert_eq!(
            tb(&["testbed", "run", "--host", "1", "--", "xl", "list"]),
            run(1, 600, None, &["xl", "list"])
        );
        assert_eq!(
            tb(&["testbed", "run", "--timeout", "30", "--host", "1", "uptime"]),
            run(1, 30, None, &["uptime"])
        );
        // Without `--` the command starts at its first word and takes
        // everything after, flags included, as before.
        assert_eq!(
            tb(&["testbed", "run", "xl", "list", "-l", "--host", "1"]),
            run(0, 600, None, &["xl", "list", "-l", "--host", "1"])
        );
        assert_eq!(
            tb(&["testbed", "run", "--", "--timeout", "5"]),
            run(0, 600, None, &["--timeout", "5"])
        );
        assert_eq!(
            tb(&["testbed", "soak"]),
            Testbed::Soak {
                hosts: 1,
                migrations: 50
            }
        );
        assert_eq!(
            tb(&["testbed", "soak", "--hosts", "2", "--migrations", "50"]),
            Testbed::Soak {
                hosts: 2,
                migrations: 50
            }
        );
        assert_eq!(
            tb(&["testbed", "soak", "--migrations", "5"]),
            Testbed::Soak {
                hosts: 1,
                migrations: 5
            }
        );
    }

    #[test]
    fn proxy_image_parses_as_docs_operations_md_gives_it() {
        let pi = |args: &[&str]| match parse(args) {
            Cmd::ProxyImage(a) => a,
            other => panic!("{other:?}"),
        };
        let a = pi(&["proxy-image"]);
        let d = crane_test_vms::proxy_image::ProxySettings::default();
        assert_eq!(
            (a.address, a.bridge, a.port, a.memory, a.install_dir, a.gpu),
            (
                d.address,
                d.bridge,
                d.listen_port,
                d.memory_mib,
                d.install_dir,
                d.gpu
            )
        );
        assert!(a.out.is_none() && a.nvidia.is_none() && !a.kernel_release);
        assert!(pi(&["proxy-image", "--kernel-release"]).kernel_release);
        let a = pi(&[
            "proxy-image",
            "--nvidia",
            "nv",
            "--gpu",
            "0000:41:00.0",
            "--address",
            "10.0.0.2/24",
            "--memory",
            "8192",
            "--out",
            "o",
            "--bridge",
            "br1",
            "--port",
            "7001",
            "--install-dir",
            "/srv/proxy",
        ]);
        assert_eq!(a.nvidia.as_deref(), Some(Path::new("nv")));
        assert_eq!(a.gpu.as_deref(), Some("0000:41:00.0"));
        assert_eq!(
            (a.address.as_str(), a.memory, a.bridge.as_str(), a.port),
            ("10.0.0.2/24", 8192, "br1", 7001)
        );
        assert_eq!(a.out.as_deref(), Some(Path::new("o")));
        assert_eq!(a.install_dir, Path::new("/srv/proxy"));
        // As before, the last of a repeated option counts.
        assert_eq!(pi(&["proxy-image", "--port", "1", "--port", "2"]).port, 2);
    }
}
