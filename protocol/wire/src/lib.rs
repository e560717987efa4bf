//! crane's wire protocol: how `libcrane_opencl.so`, in remoting mode, forwards
//! an application's OpenCL calls to `crane-proxy`, and how the proxy answers.
//! Both sides use this crate; docs/wire-protocol.md describes the same rules
//! in prose.
//!
//! # Framing
//! A connection carries frames in both directions. Each frame is a fixed
//! 24-byte [`Header`] (magic, body length, payload length, sequence number,
//! all little-endian), a body of `body_len` bytes holding one message encoded
//! with postcard (a [`Call`] from the client, an [`Answer`] from the proxy),
//! then `payload_len` raw bytes of bulk data (buffer contents, program IL,
//! info values). Bulk data is never part of the encoded body, so each side can
//! write it straight from, and read it straight into, the memory it belongs
//! in.
//!
//! # Session
//! The first frame from the client is [`Call::Hello`] with the protocol
//! version and the session token; the proxy answers [`Answer::Welcome`] or
//! [`Answer::Goodbye`] and closes. Versions are compatible when the major
//! numbers are equal.
//!
//! # Calls, replies and batching
//! Every call carries a sequence number (`seq`, increasing, never 0). Calls
//! for which [`Call::replies`] is true get exactly one answer frame with the
//! same `seq`; all others are *posted*: the client may batch them and does not
//! wait. Objects are named by client-assigned [`Id`]s (never 0), so creating
//! an object is a posted call too. A posted call that fails is reported by an
//! unsolicited [`Answer::Failed`] (seq 0) sent as soon as the proxy sees the
//! failure, so it reaches the client before the answer to any later call. An
//! object whose creation failed stays known to the proxy as failed: calls that
//! use it fail with the creation's error, and do not end the session.
//!
//! The proxy executes a session's calls in order. Calls that may wait for the
//! device ([`Call::Finish`], [`Call::WaitForEvents`], reads) are completed in
//! the background, so that a wait on a user event does not stop the call that
//! sets it; their answers may therefore arrive out of order.
//!
//! # Misbehaving peers
//! Anything that is not a valid frame, an unknown or mistyped id, or a
//! message out of place ends the session: the proxy sends
//! [`Answer::Goodbye`] with the reason and closes the connection. See
//! [`Limits`] for the bounds both sides enforce.

use std::io::{self, Read};

use serde::{Deserialize, Serialize};

pub mod source;

/// Bumped on incompatible changes.
pub const VERSION_MAJOR: u16 = 1;
/// Bumped on compatible additions.
pub const VERSION_MINOR: u16 = 6;

/// The first minor version with [`Call::DescribeKernel`].
pub const MINOR_DESCRIBE_KERNEL: u16 = 1;

/// The first minor version with [`Answer::Output`]: the proxy sends it only
/// to clients whose Hello names this minor or a later one.
pub const MINOR_OUTPUT: u16 = 2;

/// The first minor version with [`Call::SetProgramSource`]; from it on,
/// crane-proxy compiles no source with an include-like directive and no
/// options that read files ([`source`]).
pub const MINOR_CLIENT_INCLUDES: u16 = 3;

/// The first minor version with [`Call::SetQueueProperty`].
pub const MINOR_QUEUE_PROPERTY: u16 = 4;

/// The first minor version with [`Call::Stash`], [`Call::EnqueueWriteStash`]
/// and [`Call::Unstash`] (pre-copy to crane-proxy).
pub const MINOR_STASH: u16 = 5;

/// The first minor version with lanes: [`Call::OpenLanes`],
/// [`Call::JoinLane`], [`Call::LanePiece`] and [`Call::EnqueueWriteLane`]
/// (a move's bulk data over several connections side by side).
pub const MINOR_LANES: u16 = 6;

/// The largest [`Call::LanePiece`] crane-proxy takes: a lane holds at most
/// [`LANE_HELD`] of them not yet written, so that what lanes hold stays
/// bounded (and pinned staging is reused, not made afresh).
pub const LANE_PIECE_MAX: u64 = 16 << 20;

/// The pieces a client cuts buffers into over lanes by default; crane-proxy
/// keeps pinned staging of this size ready.
pub const LANE_PIECE: u64 = 4 << 20;

/// Pieces a lane may hold on crane-proxy before the session has written
/// them; the lane's connection is not read meanwhile.
pub const LANE_HELD: usize = 2;

/// The most lanes crane-proxy grants a session.
pub const MAX_LANES: u32 = 8;

/// Bytes of a lane secret ([`Answer::Lanes`]).
pub const LANE_SECRET_LEN: usize = 32;

/// The largest [`Call::Stash`] piece a client sends: crane-proxy keeps each
/// piece in pinned memory of at most this size (larger ones, up to
/// `max_payload`, are taken into ordinary memory).
pub const STASH_PIECE: u64 = 64 << 20;

/// First four bytes of every frame: "CRNW".
pub const MAGIC: u32 = u32::from_le_bytes(*b"CRNW");

/// Size of a frame header in bytes.
pub const HEADER_LEN: usize = 24;

/// Largest encoded message body either side accepts.
pub const MAX_BODY: u32 = 4 << 20;

/// A client-assigned object name, unique within a session. 0 means none.
pub type Id = u64;

/// Errors of the framing layer. Each one ends the session.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("the frame does not start with crane's magic number (got {0:#010x})")]
    BadMagic(u32),
    #[error("a frame body of {0} bytes exceeds the limit of {MAX_BODY}")]
    BodyTooLarge(u32),
    #[error("a frame payload of {got} bytes exceeds the limit of {limit}")]
    PayloadTooLarge { got: u64, limit: u64 },
    #[error("the message cannot be decoded: {0}")]
    Decode(#[from] postcard::Error),
    #[error("the connection failed: {0}")]
    Io(#[from] io::Error),
}

/// The fixed part of every frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub body_len: u32,
    pub payload_len: u64,
    pub seq: u64,
}

impl Header {
    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&self.body_len.to_le_bytes());
        b[8..16].copy_from_slice(&self.payload_len.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Parses and bounds-checks a header; `max_payload` is the receiver's
    /// limit for bulk data in one frame.
    pub fn parse(b: &[u8; HEADER_LEN], max_payload: u64) -> Result<Header, WireError> {
        let word = |r: std::ops::Range<usize>| {
            let mut a = [0u8; 8];
            a[..r.len()].copy_from_slice(&b[r]);
            u64::from_le_bytes(a)
        };
        let magic = word(0..4) as u32;
        if magic != MAGIC {
            return Err(WireError::BadMagic(magic));
        }
        let body_len = word(4..8) as u32;
        if body_len > MAX_BODY {
            return Err(WireError::BodyTooLarge(body_len));
        }
        let payload_len = word(8..16);
        if payload_len > max_payload {
            return Err(WireError::PayloadTooLarge {
                got: payload_len,
                limit: max_payload,
            });
        }
        Ok(Header {
            body_len,
            payload_len,
            seq: word(16..24),
        })
    }
}

/// Appends one frame's header and encoded body to `out`; the caller then
/// sends `payload_len` bytes of payload after it.
pub fn encode<T: Serialize>(
    out: &mut Vec<u8>,
    seq: u64,
    msg: &T,
    payload_len: u64,
) -> Result<(), WireError> {
    let at = out.len();
    out.extend_from_slice(&[0u8; HEADER_LEN]);
    let mut buf = std::mem::take(out);
    buf = postcard::to_extend(msg, buf)?;
    *out = buf;
    let body_len = out.len() - at - HEADER_LEN;
    if body_len > MAX_BODY as usize {
        out.truncate(at);
        return Err(WireError::BodyTooLarge(body_len as u32));
    }
    let h = Header {
        body_len: body_len as u32,
        payload_len,
        seq,
    };
    out[at..at + HEADER_LEN].copy_from_slice(&h.to_bytes());
    Ok(())
}

/// Decodes a message body. Trailing bytes are an error: a frame holds exactly
/// one message.
pub fn decode<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, WireError> {
    let (msg, rest) = postcard::take_from_bytes(body)?;
    if !rest.is_empty() {
        return Err(WireError::Decode(postcard::Error::DeserializeBadEncoding));
    }
    Ok(msg)
}

/// Reads one header and body (not the payload, which the caller reads where
/// it belongs). `Ok(None)` at a clean end of stream before a header.
pub fn read_frame(
    r: &mut impl Read,
    max_payload: u64,
    body: &mut Vec<u8>,
) -> Result<Option<Header>, WireError> {
    let mut h = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(WireError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let h = Header::parse(&h, max_payload)?;
    body.clear();
    body.resize(h.body_len as usize, 0);
    r.read_exact(body)?;
    Ok(Some(h))
}

/// Bounds the proxy enforces per session, announced in [`Answer::Welcome`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Device memory the session's buffers and images may take together.
    pub max_mem_bytes: u64,
    /// Objects the session may hold at once.
    pub max_objects: u64,
    /// Largest payload in one frame.
    pub max_payload: u64,
}

/// Which `clGet*Info` function an [`Call::GetInfo`] stands for, with the
/// extra argument some of them take.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum InfoKind {
    Platform,
    Device,
    Context,
    Queue,
    Mem,
    Image,
    Pipe,
    Sampler,
    Program,
    ProgramBuild { device: Id },
    Kernel,
    KernelWorkGroup { device: Id },
    KernelArg { index: u32 },
    KernelSubGroup { device: Id, input: Vec<u8> },
    Event,
    EventProfiling,
}

/// An argument of `clSetKernelArg` as the client understood it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KernelArg {
    /// Plain bytes, passed as they are.
    Bytes(Vec<u8>),
    /// A `__local` argument of this many bytes (value pointer NULL).
    Local(u64),
    /// A memory object, sampler or queue argument.
    Object(Id),
    /// A NULL memory object.
    NullObject,
}

/// One kernel argument as `clGetKernelArgInfo` describes it
/// ([`Answer::Kernel`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArgDesc {
    /// The status of the queries (CL_KERNEL_ARG_INFO_NOT_AVAILABLE when the
    /// program was built without `-cl-kernel-arg-info`); the rest is 0 unless
    /// it is CL_SUCCESS.
    pub status: i32,
    pub address: u32,
    pub access: u32,
    pub type_qualifier: u64,
    /// `CL_KERNEL_ARG_TYPE_NAME` (at most 255 bytes).
    pub type_name: String,
}

/// What a kernel launch on one device is checked against
/// ([`Answer::Kernel`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelDevice {
    pub device: Id,
    /// The status of the queries; the rest is 0 unless it is CL_SUCCESS.
    pub status: i32,
    /// `CL_KERNEL_WORK_GROUP_SIZE`.
    pub work_group_size: u64,
    /// `CL_KERNEL_COMPILE_WORK_GROUP_SIZE`.
    pub compile_work_group_size: [u64; 3],
    /// `CL_DEVICE_MAX_WORK_ITEM_DIMENSIONS`.
    pub max_dims: u32,
    /// `CL_DEVICE_MAX_WORK_ITEM_SIZES` (the first three).
    pub max_item_sizes: [u64; 3],
    /// `CL_DEVICE_MAX_WORK_GROUP_SIZE`.
    pub max_work_group_size: u64,
    /// Whether the device may run non-uniform work-groups (OpenCL 2.x, or
    /// 3.0 with `CL_DEVICE_NON_UNIFORM_WORK_GROUP_SUPPORT`); whether a
    /// program may, depends on how it was built.
    pub non_uniform: bool,
}

/// An image format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageFormat {
    pub order: u32,
    pub data_type: u32,
}

/// An image descriptor (`cl_image_desc`), with the buffer named by id.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageDesc {
    pub image_type: u32,
    pub width: u64,
    pub height: u64,
    pub depth: u64,
    pub array_size: u64,
    pub row_pitch: u64,
    pub slice_pitch: u64,
    pub num_mip_levels: u32,
    pub num_samples: u32,
    pub buffer: Id,
}

/// The wait list and output event of an enqueued command.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sync {
    pub waits: Vec<Id>,
    /// The event to create for the command, or 0.
    pub event: Id,
}

/// A rectangle of a buffer-rect transfer on the device side; the host side
/// of the transfer always travels tightly packed (`region` bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rect {
    pub origin: [u64; 3],
    pub region: [u64; 3],
    pub row_pitch: u64,
    pub slice_pitch: u64,
}

/// Messages from the client to the proxy. Property lists are the OpenCL
/// lists without their terminating 0, with object-valued entries (such as
/// `CL_CONTEXT_PLATFORM`) given as ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Call {
    /// Opens the session. Replies.
    Hello {
        major: u16,
        minor: u16,
        token: String,
        /// Who is calling (program name and pid), for the proxy's log.
        client: String,
    },
    /// Ends the session; the proxy releases everything it holds for it.
    Bye,

    /// The proxy's platforms, named by the ids given (as many as fit). Replies
    /// [`Answer::Count`] with the number of platforms.
    GetPlatformIds {
        ids: Vec<Id>,
    },
    /// Replies [`Answer::Count`].
    GetDeviceIds {
        platform: Id,
        device_type: u64,
        ids: Vec<Id>,
    },
    /// Replies [`Answer::Count`].
    CreateSubDevices {
        device: Id,
        props: Vec<u64>,
        ids: Vec<Id>,
    },
    /// Replies [`Answer::Info`]: the whole value as payload (the client
    /// applies the caller's size rules).
    GetInfo {
        kind: InfoKind,
        object: Id,
        param: u32,
    },
    /// Replies [`Answer::Formats`].
    GetSupportedImageFormats {
        context: Id,
        flags: u64,
        image_type: u32,
    },
    /// Replies [`Answer::Binaries`].
    GetProgramBinaries {
        program: Id,
    },

    CreateContext {
        id: Id,
        props: Vec<u64>,
        devices: Vec<Id>,
    },
    CreateContextFromType {
        id: Id,
        props: Vec<u64>,
        device_type: u64,
    },
    CreateQueue {
        id: Id,
        context: Id,
        device: Id,
        props: Vec<u64>,
    },
    /// Payload: the initial contents (`size` bytes) when `init` is set.
    CreateBuffer {
        id: Id,
        context: Id,
        flags: u64,
        size: u64,
        props: Vec<u64>,
        init: bool,
    },
    CreateSubBuffer {
        id: Id,
        parent: Id,
        flags: u64,
        origin: u64,
        size: u64,
    },
    /// Payload: the initial contents, tightly packed, when `init` is set.
    CreateImage {
        id: Id,
        context: Id,
        flags: u64,
        format: ImageFormat,
        desc: ImageDesc,
        props: Vec<u64>,
        init: bool,
    },
    CreateSampler {
        id: Id,
        context: Id,
        props: Vec<u64>,
    },
    CreateProgramWithSource {
        id: Id,
        context: Id,
        source: String,
    },
    /// Payload: the IL.
    CreateProgramWithIl {
        id: Id,
        context: Id,
    },
    /// Payload: the binaries, one after the other. Replies [`Answer::Binary`].
    CreateProgramWithBinary {
        id: Id,
        context: Id,
        devices: Vec<Id>,
        sizes: Vec<u64>,
    },
    CreateProgramWithBuiltInKernels {
        id: Id,
        context: Id,
        devices: Vec<Id>,
        names: String,
    },
    /// Replies [`Answer::Status`].
    BuildProgram {
        program: Id,
        devices: Vec<Id>,
        options: String,
    },
    /// Replies [`Answer::Status`].
    CompileProgram {
        program: Id,
        devices: Vec<Id>,
        options: String,
        headers: Vec<(Id, String)>,
    },
    /// Replies [`Answer::Status`].
    LinkProgram {
        id: Id,
        context: Id,
        devices: Vec<Id>,
        options: String,
        inputs: Vec<Id>,
    },
    SetSpecializationConstant {
        program: Id,
        spec_id: u32,
        value: Vec<u8>,
    },
    CreateKernel {
        id: Id,
        program: Id,
        name: String,
    },
    /// Replies [`Answer::Count`] with the number of kernels in the program.
    CreateKernelsInProgram {
        program: Id,
        ids: Vec<Id>,
    },
    CloneKernel {
        id: Id,
        source: Id,
    },
    SetKernelArg {
        kernel: Id,
        index: u32,
        arg: KernelArg,
    },
    CreateUserEvent {
        id: Id,
        context: Id,
    },
    SetUserEventStatus {
        event: Id,
        status: i32,
    },
    /// Asks for [`Answer::EventFired`] with `cookie` when the event reaches
    /// `status` (CL_COMPLETE, CL_RUNNING or CL_SUBMITTED) or fails.
    SetEventCallback {
        event: Id,
        status: i32,
        cookie: u64,
    },
    /// Drops the client's reference: the proxy releases its object.
    Release {
        id: Id,
    },

    EnqueueNdRange {
        queue: Id,
        kernel: Id,
        dims: u32,
        offset: Option<[u64; 3]>,
        global: [u64; 3],
        local: Option<[u64; 3]>,
        sync: Sync,
    },
    /// Payload: `size` bytes to write.
    EnqueueWriteBuffer {
        queue: Id,
        buffer: Id,
        offset: u64,
        size: u64,
        sync: Sync,
    },
    /// Replies [`Answer::Data`] once the data has been read.
    EnqueueReadBuffer {
        queue: Id,
        buffer: Id,
        offset: u64,
        size: u64,
        sync: Sync,
    },
    /// Payload: the region, tightly packed.
    EnqueueWriteBufferRect {
        queue: Id,
        buffer: Id,
        rect: Rect,
        sync: Sync,
    },
    /// Replies [`Answer::Data`]: the region, tightly packed.
    EnqueueReadBufferRect {
        queue: Id,
        buffer: Id,
        rect: Rect,
        sync: Sync,
    },
    /// Payload: the region, tightly packed.
    EnqueueWriteImage {
        queue: Id,
        image: Id,
        origin: [u64; 3],
        region: [u64; 3],
        sync: Sync,
    },
    /// Replies [`Answer::Data`]: the region, tightly packed.
    EnqueueReadImage {
        queue: Id,
        image: Id,
        origin: [u64; 3],
        region: [u64; 3],
        sync: Sync,
    },
    EnqueueFillBuffer {
        queue: Id,
        buffer: Id,
        pattern: Vec<u8>,
        offset: u64,
        size: u64,
        sync: Sync,
    },
    EnqueueFillImage {
        queue: Id,
        image: Id,
        color: [u8; 16],
        origin: [u64; 3],
        region: [u64; 3],
        sync: Sync,
    },
    EnqueueCopyBuffer {
        queue: Id,
        src: Id,
        dst: Id,
        src_offset: u64,
        dst_offset: u64,
        size: u64,
        sync: Sync,
    },
    EnqueueCopyBufferRect {
        queue: Id,
        src: Id,
        dst: Id,
        src_origin: [u64; 3],
        dst_origin: [u64; 3],
        region: [u64; 3],
        src_pitch: [u64; 2],
        dst_pitch: [u64; 2],
        sync: Sync,
    },
    EnqueueCopyImage {
        queue: Id,
        src: Id,
        dst: Id,
        src_origin: [u64; 3],
        dst_origin: [u64; 3],
        region: [u64; 3],
        sync: Sync,
    },
    EnqueueCopyImageToBuffer {
        queue: Id,
        src: Id,
        dst: Id,
        src_origin: [u64; 3],
        region: [u64; 3],
        dst_offset: u64,
        sync: Sync,
    },
    EnqueueCopyBufferToImage {
        queue: Id,
        src: Id,
        dst: Id,
        src_offset: u64,
        dst_origin: [u64; 3],
        region: [u64; 3],
        sync: Sync,
    },
    EnqueueMarker {
        queue: Id,
        sync: Sync,
    },
    EnqueueBarrier {
        queue: Id,
        sync: Sync,
    },
    EnqueueMigrate {
        queue: Id,
        mems: Vec<Id>,
        flags: u64,
        sync: Sync,
    },
    Flush {
        queue: Id,
    },
    /// Replies [`Answer::Status`] when the queue is empty.
    Finish {
        queue: Id,
    },
    /// Replies [`Answer::Status`] when all events are complete.
    WaitForEvents {
        events: Vec<Id>,
    },
    /// Replies [`Answer::Status`] once every call before it has been carried
    /// out: a round trip that flushes the batch and collects failures.
    Sync,
    /// Replies [`Answer::Kernel`]: the kernel's arguments and, for each of
    /// `devices` (at most [`MAX_DESCRIBED_DEVICES`]), its work-group limits;
    /// the client checks arguments and launches against them. Since 1.1.
    DescribeKernel {
        kernel: Id,
        devices: Vec<Id>,
    },
    /// Replaces the source of a program made with
    /// [`Call::CreateProgramWithSource`] before it is built or compiled: the
    /// client's includes resolved on the client (see [`source`]). A program
    /// with kernels keeps its source (the build then fails as natively).
    /// Since 1.3.
    SetProgramSource {
        program: Id,
        source: String,
    },
    /// `clSetCommandQueueProperty` (deprecated since OpenCL 1.1; NVIDIA
    /// carries it out, others answer `CL_INVALID_OPERATION`). Replies
    /// [`Answer::Info`]: the queue's properties before the call, 8 bytes
    /// little-endian. Since 1.4.
    SetQueueProperty {
        queue: Id,
        properties: u64,
        enable: bool,
    },
    /// Pre-copy: a piece of a blob of `total` bytes that the proxy keeps
    /// for the session under `key` (the client's choice) until
    /// [`Call::EnqueueWriteStash`] writes it into a buffer or
    /// [`Call::Unstash`] drops it; the session's memory limit counts it.
    /// Payload: the piece, at `offset` in the blob. Pieces of one blob must
    /// not overlap and must name the same total. Posted. Since 1.5.
    Stash {
        key: u64,
        total: u64,
        offset: u64,
    },
    /// Writes the whole of blob `key`, which every piece has reached, into
    /// `buffer` at `offset` (a non-blocking clEnqueueWriteBuffer), and
    /// forgets the blob. Posted. Since 1.5.
    EnqueueWriteStash {
        queue: Id,
        buffer: Id,
        offset: u64,
        key: u64,
        sync: Sync,
    },
    /// Forgets blob `key` (no error if there is none). Posted. Since 1.5.
    Unstash {
        key: u64,
    },
    /// Asks for up to `count` lanes: extra connections that carry bulk data
    /// for this session ([`Call::LanePiece`]). Replies [`Answer::Lanes`]:
    /// how many may join and the secret they join with. Asking again gives
    /// the same secret. Since 1.6.
    OpenLanes {
        count: u32,
    },
    /// The first frame of a lane's connection, in place of `Hello`: joins
    /// lane `lane` (below the count granted) of session `session`, proven
    /// by the session's lane secret. Replies [`Answer::Status`]. Since 1.6.
    JoinLane {
        session: u64,
        lane: u32,
        secret: [u8; LANE_SECRET_LEN],
    },
    /// On a lane only: a piece of bulk data (the payload, at most
    /// [`LANE_PIECE_MAX`] bytes) that the session's
    /// [`Call::EnqueueWriteLane`] with the same `key` writes. Posted. Since
    /// 1.6.
    LanePiece {
        key: u64,
    },
    /// Writes the piece `key`, which one of the session's lanes carries,
    /// into `buffer` at `offset` (a non-blocking clEnqueueWriteBuffer of
    /// the piece's length); the session waits for the piece. Posted. Since
    /// 1.6.
    EnqueueWriteLane {
        queue: Id,
        buffer: Id,
        offset: u64,
        key: u64,
        sync: Sync,
    },
}

/// The most devices one [`Call::DescribeKernel`] may name.
pub const MAX_DESCRIBED_DEVICES: usize = 64;

impl Call {
    /// Whether the proxy answers this call (otherwise it is posted).
    pub fn replies(&self) -> bool {
        use Call::*;
        matches!(
            self,
            Hello { .. }
                | GetPlatformIds { .. }
                | GetDeviceIds { .. }
                | CreateSubDevices { .. }
                | GetInfo { .. }
                | GetSupportedImageFormats { .. }
                | GetProgramBinaries { .. }
                | CreateProgramWithBinary { .. }
                | BuildProgram { .. }
                | CompileProgram { .. }
                | LinkProgram { .. }
                | CreateKernelsInProgram { .. }
                | EnqueueReadBuffer { .. }
                | EnqueueReadBufferRect { .. }
                | EnqueueReadImage { .. }
                | Finish { .. }
                | WaitForEvents { .. }
                | Sync
                | DescribeKernel { .. }
                | SetQueueProperty { .. }
                | OpenLanes { .. }
                | JoinLane { .. }
        )
    }

    /// The call's name, for logs and failure reports.
    pub fn name(&self) -> &'static str {
        use Call::*;
        match self {
            Hello { .. } => "Hello",
            Bye => "Bye",
            GetPlatformIds { .. } => "clGetPlatformIDs",
            GetDeviceIds { .. } => "clGetDeviceIDs",
            CreateSubDevices { .. } => "clCreateSubDevices",
            GetInfo { .. } => "clGet*Info",
            GetSupportedImageFormats { .. } => "clGetSupportedImageFormats",
            GetProgramBinaries { .. } => "clGetProgramInfo(CL_PROGRAM_BINARIES)",
            CreateContext { .. } => "clCreateContext",
            CreateContextFromType { .. } => "clCreateContextFromType",
            CreateQueue { .. } => "clCreateCommandQueueWithProperties",
            CreateBuffer { .. } => "clCreateBuffer",
            CreateSubBuffer { .. } => "clCreateSubBuffer",
            CreateImage { .. } => "clCreateImage",
            CreateSampler { .. } => "clCreateSamplerWithProperties",
            CreateProgramWithSource { .. } => "clCreateProgramWithSource",
            CreateProgramWithIl { .. } => "clCreateProgramWithIL",
            CreateProgramWithBinary { .. } => "clCreateProgramWithBinary",
            CreateProgramWithBuiltInKernels { .. } => "clCreateProgramWithBuiltInKernels",
            BuildProgram { .. } => "clBuildProgram",
            CompileProgram { .. } => "clCompileProgram",
            LinkProgram { .. } => "clLinkProgram",
            SetSpecializationConstant { .. } => "clSetProgramSpecializationConstant",
            CreateKernel { .. } => "clCreateKernel",
            CreateKernelsInProgram { .. } => "clCreateKernelsInProgram",
            CloneKernel { .. } => "clCloneKernel",
            SetKernelArg { .. } => "clSetKernelArg",
            CreateUserEvent { .. } => "clCreateUserEvent",
            SetUserEventStatus { .. } => "clSetUserEventStatus",
            SetEventCallback { .. } => "clSetEventCallback",
            Release { .. } => "clRelease*",
            EnqueueNdRange { .. } => "clEnqueueNDRangeKernel",
            EnqueueWriteBuffer { .. } => "clEnqueueWriteBuffer",
            EnqueueReadBuffer { .. } => "clEnqueueReadBuffer",
            EnqueueWriteBufferRect { .. } => "clEnqueueWriteBufferRect",
            EnqueueReadBufferRect { .. } => "clEnqueueReadBufferRect",
            EnqueueWriteImage { .. } => "clEnqueueWriteImage",
            EnqueueReadImage { .. } => "clEnqueueReadImage",
            EnqueueFillBuffer { .. } => "clEnqueueFillBuffer",
            EnqueueFillImage { .. } => "clEnqueueFillImage",
            EnqueueCopyBuffer { .. } => "clEnqueueCopyBuffer",
            EnqueueCopyBufferRect { .. } => "clEnqueueCopyBufferRect",
            EnqueueCopyImage { .. } => "clEnqueueCopyImage",
            EnqueueCopyImageToBuffer { .. } => "clEnqueueCopyImageToBuffer",
            EnqueueCopyBufferToImage { .. } => "clEnqueueCopyBufferToImage",
            EnqueueMarker { .. } => "clEnqueueMarkerWithWaitList",
            EnqueueBarrier { .. } => "clEnqueueBarrierWithWaitList",
            EnqueueMigrate { .. } => "clEnqueueMigrateMemObjects",
            Flush { .. } => "clFlush",
            Finish { .. } => "clFinish",
            WaitForEvents { .. } => "clWaitForEvents",
            Sync => "Sync",
            DescribeKernel { .. } => "DescribeKernel",
            SetProgramSource { .. } => "clBuildProgram (source with its includes)",
            SetQueueProperty { .. } => "clSetCommandQueueProperty",
            Stash { .. } => "Stash (pre-copy)",
            EnqueueWriteStash { .. } => "clEnqueueWriteBuffer (pre-copied)",
            Unstash { .. } => "Unstash (pre-copy)",
            OpenLanes { .. } => "OpenLanes",
            JoinLane { .. } => "JoinLane",
            LanePiece { .. } => "LanePiece",
            EnqueueWriteLane { .. } => "clEnqueueWriteBuffer (over a lane)",
        }
    }
}

/// Messages from the proxy to the client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Answer {
    /// The session is open.
    Welcome {
        major: u16,
        minor: u16,
        session: u64,
        limits: Limits,
    },
    /// The session is over (bad token, wrong version, a protocol violation, a
    /// limit that cannot be expressed as an OpenCL error, or shutdown). The
    /// proxy closes the connection after sending it.
    Goodbye { reason: String },
    /// The OpenCL status of a call that returns nothing else.
    Status(i32),
    /// A count of objects (platforms, devices, kernels), with the call's
    /// status.
    Count { status: i32, count: u32 },
    /// An info value (the payload), with the call's status.
    Info(i32),
    /// Image formats, with the call's status.
    Formats {
        status: i32,
        formats: Vec<ImageFormat>,
    },
    /// Program binaries (the payload holds them one after the other).
    Binaries { status: i32, sizes: Vec<u64> },
    /// `clCreateProgramWithBinary`'s status and per-binary status.
    Binary { status: i32, per_binary: Vec<i32> },
    /// Data read from the device (the payload), with the call's status;
    /// nothing follows when the status is not CL_SUCCESS.
    Data(i32),
    /// Unsolicited (seq 0): the posted call `seq` failed with `status`.
    Failed { seq: u64, status: i32 },
    /// Unsolicited (seq 0): an event callback registered with `cookie` is due;
    /// `status` is the event's execution status.
    EventFired { cookie: u64, status: i32 },
    /// A kernel's description ([`Call::DescribeKernel`]), with the call's
    /// status (the kernel's creation error for a kernel that failed).
    Kernel {
        status: i32,
        args: Vec<ArgDesc>,
        devices: Vec<KernelDevice>,
    },
    /// Unsolicited (seq 0): what the session's kernels wrote to the standard
    /// output (`printf`), the payload; sent before the answer of the call
    /// that waited for them (`Finish`, `WaitForEvents`, a read). Since 1.2.
    Output,
    /// [`Call::OpenLanes`]: how many lanes may join (0 with an error
    /// status) and the secret that proves them. Since 1.6.
    Lanes {
        status: i32,
        count: u32,
        secret: [u8; LANE_SECRET_LEN],
    },
}

#[cfg(test)]
mod tests;
