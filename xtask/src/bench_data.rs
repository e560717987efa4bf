//! `cargo xtask bench-data`: every way an application moves data
//! (benches/data.c), natively and under `libcrane_opencl.so` in passthrough,
//! alternating rounds in one run, best time of each per path and size; prints
//! crane's speed as a share of native's. A figure printer, not a timed test
//! (docs/benchmarks.md holds the figures and the machine); data.c checks every
//! byte it moves, so a run also shows that each path works under crane.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use serde::Serialize;

#[derive(Debug, clap::Args)]
#[command(about = "Transfer paths natively and under crane, as ratios (benches/data.c)")]
pub struct Args {
    /// Sizes to run, comma-separated (K, M, G suffixes).
    #[arg(long, default_value = "1K,64K,1M,16M,256M")]
    pub sizes: String,
    /// Bytes each path moves per size and round (at least 3 and at most 2000 operations).
    #[arg(long, default_value = "1G")]
    pub bytes_per_path: String,
    /// Rounds; each runs natively, then under crane.
    #[arg(long, default_value_t = 2)]
    pub rounds: usize,
    /// The platform whose name contains this (default: the first).
    #[arg(long)]
    pub platform: Option<String>,
    /// A prebuilt libcrane_opencl.so (default: build the release one).
    #[arg(long)]
    pub lib: Option<PathBuf>,
    /// A prebuilt benches/data.c (default: build it with gcc).
    #[arg(long)]
    pub exe: Option<PathBuf>,
    /// Write the figures as JSON here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Default, Serialize)]
struct Figure {
    path: String,
    bytes: u64,
    native_s: f64,
    crane_s: f64,
}

/// One DATA line: (path, bytes) and seconds per operation.
type Line = ((String, u64), f64);

/// Runs `exe` once; the device it names and its DATA lines.
fn one_run(exe: &Path, args: &[String], lib: Option<&Path>) -> Result<(String, Vec<Line>)> {
    let mut c = Command::new(exe);
    c.args(args);
    if let Some(lib) = lib {
        c.env("LD_PRELOAD", lib).env(
            "CRANE_RUN_DIR",
            std::env::temp_dir().join(format!("crane-bench-data-{}", std::process::id())),
        );
    }
    let out = c
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() {
        bail!(
            "{} {} failed ({}): {}{}",
            exe.display(),
            if lib.is_some() {
                "under crane"
            } else {
                "natively"
            },
            out.status,
            text.lines().last().unwrap_or(""),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let mut device = String::new();
    let mut figures = Vec::new();
    for l in text.lines() {
        if let Some(d) = l.strip_prefix("DEVICE ") {
            device = d.to_owned();
        }
        let mut w = l.split_whitespace();
        if w.next() != Some("DATA") {
            continue;
        }
        if let (Some(p), Some(b), Some(s)) = (w.next(), w.next(), w.next()) {
            figures.push(((p.to_owned(), b.parse()?), s.parse()?));
        }
    }
    Ok((device, figures))
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 && b % (1 << 30) == 0 => format!("{}G", b >> 30),
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => b.to_string(),
    }
}

/// `build` makes the release library and returns its path.
pub fn main(a: Args, root: &Path, build: impl FnOnce() -> Result<PathBuf>) -> Result<()> {
    let lib = match a.lib {
        Some(l) => l,
        None => build()?,
    };
    let exe = match a.exe {
        Some(e) => e,
        None => {
            let exe = root.join("target/bench/data");
            std::fs::create_dir_all(exe.parent().expect("has a parent"))?;
            crate::run(
                Command::new("gcc")
                    .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
                    .arg(&exe)
                    .arg(root.join("benches/data.c"))
                    .arg("-lOpenCL"),
            )?;
            exe
        }
    };
    let mut args = vec![
        "--sizes".to_owned(),
        a.sizes.clone(),
        "--bytes-per-path".to_owned(),
        a.bytes_per_path.clone(),
    ];
    if let Some(p) = &a.platform {
        args.extend(["--platform".to_owned(), p.clone()]);
    }
    // Best (smallest) time per path and size, natively and under crane.
    let mut best: BTreeMap<(String, u64), (f64, f64)> = BTreeMap::new();
    let mut order: Vec<(String, u64)> = Vec::new();
    let mut device = String::new();
    for round in 0..a.rounds.max(1) {
        for under_crane in [false, true] {
            let (d, figures) = one_run(&exe, &args, under_crane.then_some(lib.as_path()))?;
            device = d;
            for (key, s) in figures {
                if round == 0 && !under_crane {
                    order.push(key.clone());
                }
                let e = best.entry(key).or_insert((f64::MAX, f64::MAX));
                let slot = if under_crane { &mut e.1 } else { &mut e.0 };
                *slot = slot.min(s);
            }
        }
    }
    println!(
        "bench-data on {device}: best of {} round(s) each, natively and under crane (passthrough)",
        a.rounds.max(1)
    );
    println!(
        "{:<30} {:>6} {:>12} {:>12} {:>12} {:>9}",
        "path", "size", "native GB/s", "crane GB/s", "crane us/op", "crane/nat"
    );
    let mut out = Vec::new();
    for key in order {
        let Some(&(native, crane)) = best.get(&key) else {
            continue;
        };
        let gbs = |s: f64| key.1 as f64 / s / 1e9;
        println!(
            "{:<30} {:>6} {:>12.2} {:>12.2} {:>12.1} {:>8.1}%",
            key.0,
            human(key.1),
            gbs(native),
            gbs(crane),
            crane * 1e6,
            100.0 * native / crane
        );
        out.push(Figure {
            path: key.0.clone(),
            bytes: key.1,
            native_s: native,
            crane_s: crane,
        });
    }
    if let Some(path) = a.out {
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&serde_json::json!({
                "device": device,
                "rounds": a.rounds.max(1),
                "figures": out,
            }))?,
        )?;
    }
    Ok(())
}
