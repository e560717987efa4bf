//! Socket writes that cannot end the application with SIGPIPE.
//!
//! This library runs inside programs that leave SIGPIPE at its default (the
//! process ends). std's plain socket `write` passes `MSG_NOSIGNAL`, but its
//! `write_vectored` is `writev`, which raises SIGPIPE when the peer has gone
//! (the test below shows both): crane's frames (header and payload in one
//! call) were sent that way, so a crane-proxy killed during a move could end
//! the application instead of failing the move. A dead crane-proxy or a
//! `cranectl` that left before its answer must be an `EPIPE` error here,
//! never the application's end, so every socket write of the interposer
//! goes through `send`/`sendmsg` with `MSG_NOSIGNAL`. Changing the
//! application's SIGPIPE disposition instead would change its behaviour on
//! its own pipes and sockets.

use std::io::{self, IoSlice};
use std::os::fd::AsFd;

use socket2::SockRef;

/// `send(2)` with `MSG_NOSIGNAL`.
pub fn send(s: &impl AsFd, buf: &[u8]) -> io::Result<usize> {
    SockRef::from(s).send_with_flags(buf, libc::MSG_NOSIGNAL)
}

/// `sendmsg(2)` of `bufs` with `MSG_NOSIGNAL`.
pub fn send_vectored(s: &impl AsFd, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
    SockRef::from(s).send_vectored_with_flags(bufs, libc::MSG_NOSIGNAL)
}

/// All of `buf`, retrying short sends and interruptions.
pub fn send_all(s: &impl AsFd, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match send(s, buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;

    /// Runs `write` in a child process whose SIGPIPE is the default (as in
    /// most C programs; Rust's test harness ignores it) against a socket
    /// whose peer is closed; returns how the child ended: 0 if the write
    /// failed with EPIPE, 1 if it failed otherwise or succeeded, or the
    /// signal that ended it, negated.
    fn write_to_closed_peer(write: fn(&UnixStream) -> io::Result<()>) -> i32 {
        let (a, b) = UnixStream::pair().unwrap();
        drop(b);
        // SAFETY: the child only makes system calls (signal, the write,
        // _exit) before it ends; nothing it inherits locked is touched.
        match unsafe { libc::fork() } {
            0 => {
                // SAFETY: setting a disposition in the single-threaded child.
                unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
                let code = match write(&a) {
                    Err(e) if e.raw_os_error() == Some(libc::EPIPE) => 0,
                    _ => 1,
                };
                // SAFETY: ends the child without running the parent's
                // destructors or atexit handlers.
                unsafe { libc::_exit(code) }
            }
            pid => {
                assert!(pid > 0, "fork: {}", io::Error::last_os_error());
                let mut status = 0;
                // SAFETY: waits for the child just forked; `status` is ours.
                let r = unsafe { libc::waitpid(pid, &mut status, 0) };
                assert_eq!(r, pid);
                if libc::WIFSIGNALED(status) {
                    -libc::WTERMSIG(status)
                } else {
                    libc::WEXITSTATUS(status)
                }
            }
        }
    }

    #[test]
    fn a_closed_peer_is_an_error_not_sigpipe() {
        // Why this module exists: std's vectored write raises SIGPIPE (not
        // asserted strictly: a std that stops doing so is no failure here).
        let std_write = write_to_closed_peer(|s| {
            use std::io::Write;
            (&*s)
                .write_vectored(&[IoSlice::new(b"a"), IoSlice::new(b"b")])
                .map(drop)
        });
        assert!(
            std_write == -libc::SIGPIPE || std_write == 0,
            "std's write_vectored ended the child with {std_write}"
        );
        assert_eq!(write_to_closed_peer(|s| send_all(s, b"x")), 0);
        assert_eq!(
            write_to_closed_peer(
                |s| send_vectored(s, &[IoSlice::new(b"a"), IoSlice::new(b"b")]).map(drop)
            ),
            0
        );
    }
}
