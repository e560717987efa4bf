//! The emulated testbed's command channel, both ends inside the emulated hosts:
//!
//! - [`serve`]: the runner that init starts in every domain (dom0 on its second
//!   serial port, domUs on their Xen console): one script per request, answered
//!   with the script's stdout, stderr and exit status;
//! - [`client`]: `crane-guest-run` in dom0, which sends a request to a domU's
//!   runner through the pty xenconsoled gives that domain's console.
//!
//! The test driver speaks to dom0's runner (crane-test-vms's `control` module,
//! which uses [`proto`]).
//!
//! Both used to be shell scripts. Under emulation every process they started
//! cost dearly: a fork and exec took ~40 ms in dom0 and ~160 ms in an HVM guest
//! (nested paging emulated in software), and one request started about a dozen
//! in the domU and dozens in dom0 (`date` in every turn of a wait loop), which
//! the program under test then lacked (each emulated host has one CPU). Here a
//! request starts one shell for the script, and dom0's client two short
//! processes (`xl domid`, `xenstore-read`) besides.

pub mod client;
pub mod proto;
pub mod serve;

/// Opens a device for the channel: read-write, never as the controlling
/// terminal, and in raw mode without echo (`stty raw -echo`) if it is a
/// terminal (anything else is used as it is).
pub fn open_raw(path: &std::path::Path) -> std::io::Result<std::fs::File> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(nix::fcntl::OFlag::O_NOCTTY.bits())
        .open(path)?;
    if let Ok(mut t) = nix::sys::termios::tcgetattr(file.as_fd()) {
        nix::sys::termios::cfmakeraw(&mut t);
        nix::sys::termios::tcsetattr(file.as_fd(), nix::sys::termios::SetArg::TCSANOW, &t)?;
    }
    Ok(file)
}
