//! PoCL program binaries, read the way PoCL reads them but with every length
//! checked, so that a binary PoCL would abort on is refused first.
//!
//! PoCL's binary (`CL_PROGRAM_BINARIES` of a built program) is its kernel
//! cache directory serialised: a header, the program's `program.bc`, and per
//! kernel its metadata and the files of its cache directory (work-group
//! functions, host shared objects). PoCL reads it back trusting every length
//! (`lib/CL/pocl_binary.c`: no bounds checks) and asserts on what it does not
//! expect; Debian builds PoCL with assertions on, so a flawed binary aborts
//! the whole process.
//!
//! One such flaw comes from PoCL itself. Its kernel cache is shared by every
//! process of the user, and a build that finds no `program.bc` there writes
//! one by removing the file first and renaming a new one into place
//! (`pocl_write_file`). A process that serialises a program built from the
//! same source inside that window (PoCL serialises on the first
//! `CL_PROGRAM_BINARY_SIZES` query) gets a binary whose `program.bc` entry is
//! empty, and every later `clBuildProgram` with it asserts
//! (`pocl_binary_get_kernels_metadata: len > 0`). The conformance suite found
//! it: two modes built the same kernels at once, and crane-proxy aborted on
//! the executable a process had kept at a switch.
//!
//! [`check`] walks formats 9 (PoCL 3.1 to 3.x) and 11 (PoCL 4.0 to 7.x),
//! the layouts written by those versions' `pocl_binary_serialize`. Besides
//! the lengths it refuses what PoCL would turn into paths outside its cache
//! (the build hash names a directory, file names and kernel names are
//! appended to it) and counts that PoCL allocates for unchecked (`alloca` of
//! eight bytes per argument). It says nothing of the bytes of the files: on a
//! CPU device those are code PoCL runs, as is any kernel a tenant builds.

use std::fmt;

/// What PoCL 3.1 to 7.x write at the start of a binary.
const MAGIC: &[u8; 8] = b"poclbin\0";
/// The build hash: 40 letters `A`..=`P` with `/` as the third, and a NUL.
const HASH_LEN: usize = 41;
/// Format 10 and later: a `u64` of program-scope variable storage follows
/// the header when this flag is set.
const HAS_PROGRAM_SCOPE_VARS: u64 = 1 << 1;
/// Format 10 and later, per kernel: work-group and sub-group metadata.
const KERNEL_HAS_WORKG_META: u32 = 1 << 1;
const KERNEL_HAS_SUBG_META: u32 = 1 << 2;
/// Bounds on counts PoCL allocates for without a check; far above what an
/// OpenCL C program can have (arguments fill `CL_DEVICE_MAX_PARAMETER_SIZE`,
/// at least 1 KiB).
const MAX_ARGS: u32 = 4096;
const MAX_LOCALS: u32 = 4096;
const MAX_KERNELS: u32 = 1 << 16;
/// PoCL copies a file's name after the cache path into a buffer of
/// `POCL_FILENAME_LENGTH` (1024) bytes; kernel names go into paths too.
const MAX_PATH: usize = 512;

/// Why a PoCL binary is refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flaw(String);

impl fmt::Display for Flaw {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "PoCL binary refused: {}", self.0)
    }
}

impl std::error::Error for Flaw {}

fn flaw<T>(why: impl Into<String>) -> Result<T, Flaw> {
    Err(Flaw(why.into()))
}

/// The binary format the PoCL of this `CL_PLATFORM_VERSION` writes and
/// reads, where [`check`] knows it: 9 for 3.1 to 3.x, 11 for 4.0 to 7.x.
/// None for other platforms and other PoCL versions.
pub fn format_of_platform(version: &str) -> Option<u32> {
    let rest = version.split("PoCL ").nth(1)?;
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next()?.parse().ok()?;
    let minor: u32 = parts.next().and_then(|m| m.parse().ok()).unwrap_or(0);
    match (major, minor) {
        (3, 1..) => Some(9),
        (4..=7, _) => Some(11),
        _ => None,
    }
}

/// Whether `bytes` is a PoCL binary (by its magic): others (LLVM bitcode,
/// SPIR-V, another vendor's) are none of [`check`]'s business.
pub fn is_pocl_binary(bytes: &[u8]) -> bool {
    bytes.starts_with(MAGIC)
}

/// Checks PoCL binary `bytes` the way PoCL will read it. `platform_format`
/// is the format of the PoCL that will read it ([`format_of_platform`]):
/// a binary of another format is refused (PoCL 3.1 would read a format-11
/// binary with format 9's layout). With None, a binary of a format this
/// module does not know passes unchecked, as do bytes that are not a PoCL
/// binary at all.
pub fn check(bytes: &[u8], platform_format: Option<u32>) -> Result<(), Flaw> {
    if !is_pocl_binary(bytes) {
        return Ok(());
    }
    let mut r = Reader {
        bytes,
        at: MAGIC.len(),
    };
    let _device_id = r.u64()?;
    let format = r.u32()?;
    match platform_format {
        Some(p) if p != format => {
            return flaw(format!("format {format}, the platform reads format {p}"));
        }
        None if format != 9 && format != 11 => return Ok(()),
        _ => {}
    }
    let kernels = r.u32()?;
    let flags = r.u64()?;
    let root_entries = r.u32()?;
    check_hash(r.take(HASH_LEN)?)?;
    if format >= 10 && flags & HAS_PROGRAM_SCOPE_VARS != 0 {
        r.u64()?;
    }
    // PoCL's CPU devices serialise one root entry, program.bc (their
    // `serialize_entries` are the default); PoCL 3.1 asserts the count.
    if root_entries != 1 {
        return flaw(format!("{root_entries} root entries, not 1"));
    }
    let size = r.u64()?;
    if size == 0 {
        return flaw("its program.bc is missing (PoCL's cache was rewritten while it was read)");
    }
    files(r.sub(size)?)?;
    if kernels > MAX_KERNELS {
        return flaw(format!("{kernels} kernels"));
    }
    for k in 0..kernels {
        kernel(&mut r, format).map_err(|Flaw(why)| Flaw(format!("kernel {k}: {why}")))?;
    }
    Ok(())
}

/// One kernel's record: its sizes, metadata, then its cache files, ending
/// exactly where its size says.
fn kernel(r: &mut Reader<'_>, format: u32) -> Result<(), Flaw> {
    let start = r.at;
    let struct_size = r.u64()?;
    let binaries_size = r.u64()?;
    let arginfo_size = r.u32()?;
    let end = usize::try_from(struct_size)
        .ok()
        .and_then(|s| start.checked_add(s))
        .filter(|&e| e <= r.bytes.len())
        .map_or_else(|| flaw(format!("a record of {struct_size} bytes")), Ok)?;
    let files_at = usize::try_from(binaries_size)
        .ok()
        .and_then(|b| end.checked_sub(b))
        .filter(|&f| f >= r.at)
        .map_or_else(|| flaw(format!("{binaries_size} bytes of files")), Ok)?;
    let mut m = Reader {
        bytes: &r.bytes[..files_at],
        at: r.at,
    };
    check_name(m.str2()?)?;
    let args = m.u32()?;
    let locals = m.u32()?;
    if args > MAX_ARGS || locals > MAX_LOCALS {
        return flaw(format!("{args} arguments, {locals} locals"));
    }
    m.take(3 * 8)?; // the required work-group size
    m.take(locals as usize * 8)?;
    m.str2()?; // attributes
    if format >= 10 {
        m.u32()?; // has_arg_metadata
        let kflags = m.u32()?;
        if kflags & KERNEL_HAS_SUBG_META != 0 {
            m.take(2 * 4)?;
        }
        if kflags & KERNEL_HAS_WORKG_META != 0 {
            m.take(5 * 4)?;
        }
    } else {
        m.u64()?; // has_arg_metadata
    }
    let args_at = m.at;
    for _ in 0..args {
        // Access and address qualifiers (cl_uint), type qualifier
        // (cl_bitfield), type, type size; name and type name.
        m.take(4 + 4 + 8 + 4 + 4)?;
        m.str2()?;
        m.str2()?;
    }
    if m.at - args_at != arginfo_size as usize {
        return flaw(format!(
            "argument records of {} bytes, said {arginfo_size}",
            m.at - args_at
        ));
    }
    if m.at != files_at {
        return flaw(format!("metadata ends {} bytes early", files_at - m.at));
    }
    files(Reader {
        bytes: &r.bytes[..end],
        at: files_at,
    })?;
    r.at = end;
    Ok(())
}

/// Files, each a name and its contents, filling `r` exactly.
fn files(mut r: Reader<'_>) -> Result<(), Flaw> {
    while r.at < r.bytes.len() {
        check_path(r.str2()?)?;
        r.str2()?;
    }
    Ok(())
}

/// The build hash names the program's cache directory.
fn check_hash(h: &[u8]) -> Result<(), Flaw> {
    let shaped = h[HASH_LEN - 1] == 0
        && h[..HASH_LEN - 1].iter().enumerate().all(|(i, &c)| {
            if i == 2 {
                c == b'/'
            } else {
                (b'A'..=b'P').contains(&c)
            }
        });
    if shaped {
        Ok(())
    } else {
        flaw("a build hash that is not PoCL's")
    }
}

/// A file's name below the program's cache directory: absolute there, no
/// empty, `.` or `..` component.
fn check_path(p: &[u8]) -> Result<(), Flaw> {
    let ok = p.len() <= MAX_PATH
        && p.first() == Some(&b'/')
        && p[1..]
            .split(|&c| c == b'/')
            .all(|c| !c.is_empty() && c != b"." && c != b".." && !c.contains(&0));
    if ok {
        Ok(())
    } else {
        flaw(format!("a file named {:?}", String::from_utf8_lossy(p)))
    }
}

/// A kernel's name is a directory of the program's cache.
fn check_name(n: &[u8]) -> Result<(), Flaw> {
    let ok = !n.is_empty()
        && n.len() <= MAX_PATH
        && n != b"."
        && n != b".."
        && !n.iter().any(|&c| c == b'/' || c == 0);
    if ok {
        Ok(())
    } else {
        flaw(format!("a kernel named {:?}", String::from_utf8_lossy(n)))
    }
}

/// Little-endian fields of `bytes` from `at`, each checked against the end.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], Flaw> {
        match self.at.checked_add(n) {
            Some(end) if end <= self.bytes.len() => {
                let s = &self.bytes[self.at..end];
                self.at = end;
                Ok(s)
            }
            _ => flaw(format!("cut short at byte {} (needs {n} more)", self.at)),
        }
    }

    fn u32(&mut self) -> Result<u32, Flaw> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, Flaw> {
        let lo = u64::from(self.u32()?);
        Ok(lo | u64::from(self.u32()?) << 32)
    }

    /// A string as PoCL stores one: a `u32` length, then the bytes.
    fn str2(&mut self) -> Result<&'a [u8], Flaw> {
        let n = self.u32()?;
        self.take(n as usize)
    }

    /// The next `n` bytes as a reader of their own.
    fn sub(&mut self, n: u64) -> Result<Reader<'a>, Flaw> {
        let n = usize::try_from(n).map_or_else(|_| flaw("a size beyond memory"), Ok)?;
        Ok(Reader {
            bytes: self.take(n)?,
            at: 0,
        })
    }
}

/// Writes binaries for [`sample`].
struct Bin {
    out: Vec<u8>,
}

impl Bin {
    fn u32(&mut self, v: u32) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn str2(&mut self, s: &[u8]) -> &mut Self {
        self.u32(s.len() as u32);
        self.out.extend_from_slice(s);
        self
    }
}

fn hash() -> Vec<u8> {
    let mut h: Vec<u8> = (0..40).map(|i| b'A' + (i % 16) as u8).collect();
    h[2] = b'/';
    h.push(0);
    h
}

fn file(name: &[u8], content: &[u8]) -> Vec<u8> {
    let mut b = Bin { out: Vec::new() };
    b.str2(name).str2(content);
    b.out
}

fn kernel_record(format: u32, name: &[u8], files: &[u8]) -> Vec<u8> {
    let mut m = Bin { out: Vec::new() };
    m.str2(name).u32(1).u32(1); // one argument, one local
    m.u64(0).u64(0).u64(0); // reqd work-group size
    m.u64(64); // the local's size
    m.str2(b"");
    if format >= 10 {
        m.u32(0).u32(KERNEL_HAS_WORKG_META);
        for _ in 0..5 {
            m.u32(1);
        }
    } else {
        m.u64(0);
    }
    let args_at = m.out.len();
    m.u32(0).u32(0).u64(0).u32(0).u32(4).str2(b"a").str2(b"int");
    let arginfo = (m.out.len() - args_at) as u32;
    let mut k = Bin { out: Vec::new() };
    k.u64((20 + m.out.len() + files.len()) as u64)
        .u64(files.len() as u64)
        .u32(arginfo);
    k.out.extend_from_slice(&m.out);
    k.out.extend_from_slice(files);
    k.out
}

/// A binary as PoCL's `pocl_binary_serialize` writes one, for `format` (9
/// or 11), with `program_bc` as its `program.bc` (empty: the entry left
/// empty, as PoCL's cache race leaves it) and `kernels` kernels (one
/// argument, one local, one cache file each): for tests and fuzz seeds.
#[doc(hidden)]
pub fn sample(format: u32, program_bc: &[u8], kernels: u32) -> Vec<u8> {
    let mut b = Bin {
        out: MAGIC.to_vec(),
    };
    b.u64(0x1234).u32(format).u32(kernels).u64(0).u32(1);
    b.out.extend_from_slice(&hash());
    let root = if program_bc.is_empty() {
        Vec::new()
    } else {
        file(b"/program.bc", program_bc)
    };
    b.u64(root.len() as u64);
    b.out.extend_from_slice(&root);
    for k in 0..kernels {
        let name = format!("k{k}");
        let files = file(
            format!("/{name}/8-1-1/parallel.bc").as_bytes(),
            b"BC\xc0\xde..",
        );
        b.out
            .extend_from_slice(&kernel_record(format, name.as_bytes(), &files));
    }
    b.out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn well_formed_binaries_of_both_formats_pass() {
        for format in [9, 11] {
            for kernels in [0, 1, 3] {
                let b = sample(format, b"BC\xc0\xde", kernels);
                assert_eq!(check(&b, Some(format)), Ok(()), "format {format}");
                assert_eq!(check(&b, None), Ok(()));
            }
        }
    }

    #[test]
    fn a_missing_program_bc_is_refused() {
        let b = sample(9, b"", 2);
        let e = check(&b, Some(9)).unwrap_err();
        assert!(e.to_string().contains("program.bc is missing"), "{e}");
    }

    #[test]
    fn every_cut_is_refused() {
        for format in [9, 11] {
            let b = sample(format, b"BC\xc0\xde", 2);
            for n in MAGIC.len()..b.len() {
                assert!(
                    check(&b[..n], Some(format)).is_err(),
                    "cut at {n} of {}",
                    b.len()
                );
            }
        }
    }

    #[test]
    fn every_single_byte_change_is_refused_or_stays_in_bounds() {
        // Any byte may change; the checker must never read out of bounds
        // (it would panic) whatever the outcome.
        let b = sample(11, b"BC\xc0\xde", 2);
        for i in 0..b.len() {
            for v in [0u8, 1, 0x7f, 0xff] {
                let mut m = b.clone();
                m[i] = v;
                let _ = check(&m, Some(11));
            }
        }
    }

    #[test]
    fn another_format_than_the_platforms_is_refused() {
        let b = sample(11, b"BC\xc0\xde", 1);
        assert!(check(&b, Some(9)).is_err());
        // Unknown to this module and no platform format: not checked.
        let mut odd = sample(9, b"", 1);
        odd[16..20].copy_from_slice(&12u32.to_le_bytes());
        assert_eq!(check(&odd, None), Ok(()));
    }

    #[test]
    fn paths_outside_the_cache_are_refused() {
        for bad in [&b"/../../x"[..], b"x", b"/a//b", b"/./a", b"/"] {
            let mut b = Bin {
                out: MAGIC.to_vec(),
            };
            b.u64(0).u32(9).u32(0).u64(0).u32(1);
            b.out.extend_from_slice(&hash());
            let root = file(bad, b"x");
            b.u64(root.len() as u64);
            b.out.extend_from_slice(&root);
            assert!(check(&b.out, Some(9)).is_err(), "{bad:?}");
        }
        let mut h = sample(9, b"BC", 0);
        h[MAGIC.len() + 28] = b'.'; // in the build hash
        assert!(check(&h, Some(9)).is_err());
        let k = kernel_record(9, b"../x", &[]);
        let mut b = sample(9, b"BC", 0);
        b[MAGIC.len() + 12..MAGIC.len() + 16].copy_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&k);
        assert!(check(&b, Some(9)).is_err());
    }

    #[test]
    fn not_a_pocl_binary_is_not_checked() {
        assert_eq!(check(b"BC\xc0\xde garbage", Some(9)), Ok(()));
        assert_eq!(check(b"", Some(9)), Ok(()));
    }

    #[test]
    fn platform_formats() {
        let f = format_of_platform;
        assert_eq!(
            f("OpenCL 3.0 PoCL 3.1+debian  Linux, None+Asserts, RELOC, LLVM 15.0.6"),
            Some(9)
        );
        assert_eq!(f("OpenCL 3.0 PoCL 5.0+debian  Linux"), Some(11));
        assert_eq!(f("OpenCL 3.0 PoCL 7.1-pre"), Some(11));
        assert_eq!(f("OpenCL 3.0 PoCL 3.0"), None);
        assert_eq!(f("OpenCL 3.0 PoCL 8.0"), None);
        assert_eq!(f("OpenCL 3.0 CUDA 13.0.97"), None);
    }
}
