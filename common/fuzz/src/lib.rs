//! The fuzz targets: every decoder of bytes crane takes from someone it does
//! not trust, as functions of `&[u8]` that must return (never panic, hang or
//! abort) whatever the bytes.
//!
//! * `wire_call` — crane-proxy's side of the wire protocol: frames read from a
//!   client's byte stream and their bodies decoded as calls.
//! * `wire_answer` — the interposer's side: the proxy's answers.
//! * `source` — OpenCL C source and build options, scanned for directives
//!   and options that read files (crane_wire::source, both sides).
//! * `control` — the JSON lines of the interposer's control socket, of
//!   crane-agent's socket and of craned's control socket.
//! * `xenstore` — the values crane-agent and craned read from XenStore
//!   (requests, responses, app results, agent state, admin requests and
//!   results, permissions, craned's journal, the value syntax itself).
//! * `config` — craned's and crane-agent's configuration files.
//! * `pocl_binary` — PoCL program binaries, checked before PoCL reads them
//!   (a tenant's `clCreateProgramWithBinary` on crane-proxy, the
//!   executables the interposer keeps; `crane_vendor_loader::pocl_binary`).
//!
//! `fuzz/` runs them under libFuzzer (`cargo +nightly fuzz run TARGET`);
//! this crate's tests replay their corpora (`fuzz/corpus/TARGET/`) and
//! thousands of random and mutated inputs in every `cargo test`.

use std::io::Cursor;

/// A target: takes any bytes, returns without panicking.
pub type Target = fn(&[u8]);

/// Every target by name.
pub const TARGETS: &[(&str, Target)] = &[
    ("wire_call", wire_call),
    ("wire_answer", wire_answer),
    ("source", source),
    ("control", control),
    ("xenstore", xenstore),
    ("config", config),
    ("pocl_binary", pocl_binary),
];

/// The largest payload either side accepts by default.
const MAX_PAYLOAD: u64 = 256 << 20;

/// Reads frames as a session does, until the stream ends or breaks.
fn frames(data: &[u8], mut each: impl FnMut(&[u8])) {
    let mut r = Cursor::new(data);
    let mut body = Vec::new();
    while let Ok(Some(h)) = crane_wire::read_frame(&mut r, MAX_PAYLOAD, &mut body) {
        each(&body);
        // The payload follows the body; a short one ends the stream.
        let left = data.len() as u64 - r.position();
        if h.payload_len > left {
            break;
        }
        r.set_position(r.position() + h.payload_len);
    }
}

pub fn wire_call(data: &[u8]) {
    frames(data, |body| {
        if let Ok(call) = crane_wire::decode::<crane_wire::Call>(body) {
            let _ = (call.name(), call.replies());
        }
    });
}

pub fn wire_answer(data: &[u8]) {
    frames(data, |body| {
        let _ = crane_wire::decode::<crane_wire::Answer>(body);
    });
}

pub fn source(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    for d in crane_wire::source::include_directives(&text) {
        // Spans are in bounds and on character boundaries: both sides slice
        // the source with them.
        assert!(d.start <= d.end && d.end <= text.len());
        let _ = &text[d.start..d.end];
    }
    let _ = crane_wire::source::forbidden_option(&text);
    let (dirs, rest) = crane_wire::source::take_include_dirs(&text);
    assert!(rest.len() <= text.len());
    drop(dirs);
}

pub fn control(data: &[u8]) {
    let _ = serde_json::from_slice::<crane_control::Request>(data);
    let _ = serde_json::from_slice::<crane_control::Response>(data);
    let _ = serde_json::from_slice::<crane_agent::standalone::CtlRequest>(data);
    let _ = serde_json::from_slice::<craned_control::Request>(data);
    let _ = serde_json::from_slice::<craned_control::Reply>(data);
}

pub fn xenstore(data: &[u8]) {
    use crane_xs::{admin, message, perms, value};
    let s = String::from_utf8_lossy(data);
    let _ = message::Request::parse(&s);
    let _ = message::Response::parse(&s);
    let _ = message::AppResult::parse(&s);
    let _ = message::AgentState::parse(&s);
    let _ = admin::AdminRequest::parse(&s);
    let _ = admin::AdminResult::parse(&s);
    let _ = perms::Perm::parse(&s);
    let _ = value::Fields::parse(&s, 4096);
    let _ = craned::journal::Entry::parse(&s);
    // What the agent reads from crane/proxy-now: whatever parses formats to
    // what parses to the same.
    if let Ok(now) = crane_xs::proxy::ProxyNow::parse(&s) {
        assert_eq!(
            crane_xs::proxy::ProxyNow::parse(&now.format()).ok(),
            Some(now)
        );
    }
}

pub fn config(data: &[u8]) {
    let s = String::from_utf8_lossy(data);
    let path = std::path::Path::new("/fuzz/config.toml");
    let _ = craned::config::Config::parse(path, &s);
    let _ = crane_agent::config::Config::parse(&s, path);
}

pub fn pocl_binary(data: &[u8]) {
    use crane_vendor_loader::pocl_binary::check;
    for format in [Some(9), Some(11), None] {
        let _ = check(data, format);
    }
}
