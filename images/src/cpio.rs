//! A deterministic writer for the cpio "newc" format that Linux unpacks as an initramfs.
//!
//! Every entry is owned by root with modification time 0 and inode numbers given in
//! order, so the archive depends only on the file list and contents.

use std::io::{self, Write};

/// The kind and payload of one archive member.
pub enum Member<'a> {
    Dir,
    File(&'a [u8]),
    Symlink(&'a str),
}

pub struct Writer<W: Write> {
    out: W,
    written: u64,
    next_ino: u32,
}

impl<W: Write> Writer<W> {
    pub fn new(out: W) -> Self {
        Self {
            out,
            written: 0,
            next_ino: 1,
        }
    }

    fn put(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    fn pad4(&mut self) -> io::Result<()> {
        let pad = (4 - (self.written % 4) as usize) % 4;
        self.put(&[0u8; 3][..pad])
    }

    fn header(
        &mut self,
        name: &str,
        mode: u32,
        size: usize,
        ino: u32,
        nlink: u32,
    ) -> io::Result<()> {
        let header = format!(
            "070701{ino:08x}{mode:08x}{uid:08x}{gid:08x}{nlink:08x}{mtime:08x}{size:08x}\
             {dmaj:08x}{dmin:08x}{rmaj:08x}{rmin:08x}{namesize:08x}{check:08x}",
            uid = 0,
            gid = 0,
            mtime = 0,
            dmaj = 0,
            dmin = 0,
            rmaj = 0,
            rmin = 0,
            namesize = name.len() + 1,
            check = 0,
        );
        self.put(header.as_bytes())?;
        self.put(name.as_bytes())?;
        self.put(&[0])?;
        self.pad4()
    }

    /// Appends `name` (relative, no leading '/') with permission bits `perm`.
    pub fn member(&mut self, name: &str, perm: u32, member: Member<'_>) -> io::Result<()> {
        let ino = self.next_ino;
        self.next_ino += 1;
        let (kind, data, nlink): (u32, &[u8], u32) = match member {
            Member::Dir => (0o040000, &[], 2),
            Member::File(data) => (0o100000, data, 1),
            Member::Symlink(target) => (0o120000, target.as_bytes(), 1),
        };
        self.header(name, kind | (perm & 0o7777), data.len(), ino, nlink)?;
        self.put(data)?;
        self.pad4()
    }

    /// Writes the trailer and returns the underlying writer.
    pub fn finish(mut self) -> io::Result<W> {
        self.header("TRAILER!!!", 0, 0, 0, 1)?;
        Ok(self.out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_tool_lists_what_was_written() {
        let mut w = Writer::new(Vec::new());
        w.member("bin", 0o755, Member::Dir).unwrap();
        w.member("bin/sh", 0o755, Member::Symlink("busybox"))
            .unwrap();
        w.member("init", 0o755, Member::File(b"#!/bin/sh\n"))
            .unwrap();
        let bytes = w.finish().unwrap();
        assert_eq!(&bytes[..6], b"070701");
        assert_eq!(bytes.len() % 4, 0);
        let Ok(mut child) = std::process::Command::new("cpio")
            .args(["-t", "-v", "--quiet"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
        else {
            // cpio(1) is only a cross-check; the format assertions above still ran.
            return;
        };
        child.stdin.take().unwrap().write_all(&bytes).unwrap();
        let out = child.wait_with_output().unwrap();
        let listing = String::from_utf8(out.stdout).unwrap();
        assert!(listing.contains("bin/sh -> busybox"), "{listing}");
        assert!(listing.contains("-rwxr-xr-x"), "{listing}");
        assert!(listing.lines().any(|l| l.ends_with(" init")), "{listing}");
    }
}
