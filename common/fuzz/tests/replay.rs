//! Every fuzz target, in every `cargo test`: its corpus (`fuzz/corpus/TARGET/`,
//! what libFuzzer found worth keeping), then random inputs and mutations of
//! the corpus and of built-in seeds. A panic fails the test with the input
//! that caused it written to `target/fuzz-failures/`. `CRANE_FUZZ_ROUNDS`
//! (default 3000) sets the random inputs per target;
//! `CRANE_FUZZ_WRITE_SEEDS=1` writes the built-in seeds into the corpus.

use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng, rngs::StdRng};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Well-formed inputs, so that mutations start from something the decoder
/// takes far.
fn seeds(target: &str) -> Vec<Vec<u8>> {
    use crane_wire::{Answer, Call, Sync};
    let frame = |seq: u64, call: &Call, payload: &[u8]| {
        let mut out = Vec::new();
        crane_wire::encode(&mut out, seq, call, payload.len() as u64).unwrap();
        out.extend_from_slice(payload);
        out
    };
    if target == "pocl_binary" {
        use crane_vendor_loader::pocl_binary::sample;
        return vec![
            sample(9, b"BC\xc0\xde", 2),
            sample(11, b"BC\xc0\xde", 1),
            sample(9, b"", 1),
        ];
    }
    match target {
        "wire_call" => vec![
            frame(
                1,
                &Call::Hello {
                    major: 1,
                    minor: 3,
                    token: "t".into(),
                    client: "fuzz".into(),
                },
                &[],
            ),
            frame(
                2,
                &Call::CreateProgramWithSource {
                    id: 7,
                    context: 3,
                    source: "#include \"a.h\"\n__kernel void k() {}".into(),
                },
                &[],
            ),
            frame(
                3,
                &Call::EnqueueWriteBuffer {
                    queue: 4,
                    buffer: 5,
                    offset: 0,
                    size: 8,
                    sync: Sync::default(),
                },
                &[1, 2, 3, 4, 5, 6, 7, 8],
            ),
            frame(
                4,
                &Call::SetProgramSource {
                    program: 7,
                    source: "__kernel void k() {}".into(),
                },
                &[],
            ),
        ],
        "wire_answer" => {
            let mut a = Vec::new();
            crane_wire::encode(&mut a, 1, &Answer::Status(-11), 0).unwrap();
            crane_wire::encode(&mut a, 0, &Answer::Failed { seq: 3, status: -5 }, 0).unwrap();
            crane_wire::encode(&mut a, 2, &Answer::Data(0), 4).unwrap();
            a.extend_from_slice(&[9, 9, 9, 9]);
            vec![a]
        }
        "source" => vec![
            b"#include \"a.h\"\n  %:include <b.h>\n/* c */ #/**/include \\\n \"d\"\n".to_vec(),
            b"char *s = \"/*\"; // x\n??=include \"e\"\n#define X \"f\"\n#include X\n".to_vec(),
            b"-I /x -Ifoo -include bar @file -cl-std=CL2.0 -DX=1".to_vec(),
            // A literal whose backslash is the last byte (the scanner once
            // stepped past the end there).
            b"#include \"a\\".to_vec(),
        ],
        "control" => vec![
            br#"{"op":"suspend","deadline_ms":100}"#.to_vec(),
            br#"{"op":"remote","proxy":"tcp://h:1","token":"t","deadline_ms":5}"#.to_vec(),
            br#"{"ok":true,"phases":[{"name":"drain","ms":1.0,"bytes":0}]}"#.to_vec(),
        ],
        "xenstore" => vec![
            b"seq=3 op=prepare-migrate mode=remote proxy=tcp%3A%2F%2F10.0.0.2%3A7000 deadline-ms=5000"
                .to_vec(),
            b"seq=3 outcome=ready-for-detach ms=12.5 apps=1 phases=apps:3.1,modules:4".to_vec(),
            b"state=passthrough last-seq=3".to_vec(),
            // craned's journal: a resume on arrival to be tried again.
            b"phase=resuming domid=9 gpus=0000:65:00.0 seq=4 started-ms=1700000000000 tries=2 retry-ms=1700000010000"
                .to_vec(),
        ],
        "config" => vec![
            b"[migration]\nmode = \"remote\"\nno_free_gpu = \"wait\"\n[proxy]\naddress = \"tcp://10.0.0.2:7000\"\n"
                .to_vec(),
            b"unload_modules = [\"nvidia_uvm\", \"nvidia\"]\ndeadline_ms = 5000\n".to_vec(),
        ],
        _ => vec![],
    }
}

fn corpus(target: &str) -> Vec<Vec<u8>> {
    let dir = repo().join("fuzz/corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    files.iter().filter_map(|p| std::fs::read(p).ok()).collect()
}

fn mutate(rng: &mut StdRng, input: &[u8]) -> Vec<u8> {
    let mut v = input.to_vec();
    for _ in 0..rng.random_range(1..6) {
        match rng.random_range(0..6) {
            0 if !v.is_empty() => {
                let i = rng.random_range(0..v.len());
                v[i] ^= 1 << rng.random_range(0..8);
            }
            1 if !v.is_empty() => {
                let i = rng.random_range(0..v.len());
                v[i] = rng.random();
            }
            2 => {
                let at = rng.random_range(0..=v.len());
                v.truncate(at);
            }
            3 if !v.is_empty() => {
                let a = rng.random_range(0..v.len());
                let b = rng.random_range(a..v.len());
                let chunk = v[a..=b].to_vec();
                let at = rng.random_range(0..=v.len());
                v.splice(at..at, chunk);
            }
            4 => {
                let at = rng.random_range(0..=v.len());
                let byte = *[b'\n', b'\\', b'"', b'#', b'/', b'*', 0xff, 0, b'=', b'%']
                    .get(rng.random_range(0..10))
                    .unwrap();
                v.insert(at, byte);
            }
            _ => {
                let at = rng.random_range(0..=v.len());
                let n = rng.random_range(0..16);
                let junk: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                v.splice(at..at, junk);
            }
        }
    }
    v
}

fn run(target: &str, f: fn(&[u8]), input: &[u8]) {
    if std::panic::catch_unwind(|| f(input)).is_err() {
        let dir = repo().join("target/fuzz-failures");
        let _ = std::fs::create_dir_all(&dir);
        let path = dir.join(format!("{target}-{:016x}", fxhash(input)));
        let _ = std::fs::write(&path, input);
        panic!(
            "fuzz target {target} panicked on {} (input {:?})",
            path.display(),
            input
        );
    }
}

fn fxhash(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3)
    })
}

#[test]
fn every_target_survives_its_corpus_and_random_inputs() {
    let rounds: usize = std::env::var("CRANE_FUZZ_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3000);
    for &(name, f) in crane_fuzz::TARGETS {
        let seeds = seeds(name);
        if std::env::var_os("CRANE_FUZZ_WRITE_SEEDS").is_some() {
            let dir = repo().join("fuzz/corpus").join(name);
            std::fs::create_dir_all(&dir).unwrap();
            for s in &seeds {
                std::fs::write(dir.join(format!("seed-{:016x}", fxhash(s))), s).unwrap();
            }
        }
        let mut pool = corpus(name);
        pool.extend(seeds);
        for input in &pool {
            run(name, f, input);
        }
        let mut rng = StdRng::seed_from_u64(0x5eed ^ fxhash(name.as_bytes()));
        for i in 0..rounds {
            let input = if pool.is_empty() || i % 4 == 0 {
                let n = rng.random_range(0..256);
                (0..n).map(|_| rng.random()).collect()
            } else {
                let base = &pool[rng.random_range(0..pool.len())];
                mutate(&mut rng, base)
            };
            run(name, f, &input);
        }
    }
}

#[test]
fn the_targets_are_the_ones_fuzz_builds() {
    // fuzz/Cargo.toml names one binary per target; a target missing there
    // would never be fuzzed.
    let manifest = std::fs::read_to_string(repo().join("fuzz/Cargo.toml")).unwrap();
    for (name, _) in crane_fuzz::TARGETS {
        assert!(
            manifest.contains(&format!("name = \"{name}\"")),
            "{name} is not in fuzz/Cargo.toml"
        );
        assert!(
            repo()
                .join(format!("fuzz/fuzz_targets/{name}.rs"))
                .is_file(),
            "{name}"
        );
    }
}
