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
