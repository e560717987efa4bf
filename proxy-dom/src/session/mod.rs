//! One client connection from Hello to teardown. A session's calls run on
//! its own thread, strictly in order; what waits for the device completes on
//! the session's completion thread ([`completion`]). A session that
//! misbehaves is told why (`Goodbye`) and closed; nothing it does reaches
//! another session, and a panic while serving it ends only it.

pub(crate) mod completion;
pub(crate) mod objects;

use std::ffi::c_void;
use std::net::Shutdown;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Instant;

use crane_wire::{Answer, Call, Id, MAX_BODY, Sync, VERSION_MAJOR, VERSION_MINOR};
use log::Level;
use opencl_sys::*;

use crate::conn::{self, FrameReader, ReadError, Stream, Writer};
use crate::pinned::HostBuf;
use crate::ratelimit::limited;
use crate::server::Shared;
use crate::tokens;
use crate::vendor::{VPtr, vfn};
use completion::Completion;
use objects::{Counters, Detail, Kind, Objects};

/// Largest body accepted before the Hello: a Hello is a few strings.
const HELLO_MAX_BODY: u32 = 16 << 10;

/// Why a call did not succeed.
#[derive(Debug)]
pub(crate) enum CallError {
    /// An OpenCL error, reported to the client; the session goes on.
    Cl(cl_int),
    /// A protocol violation (forged id, malformed call): the session ends.
    Violation(String),
}

impl From<cl_int> for CallError {
    fn from(e: cl_int) -> Self {
        CallError::Cl(e)
    }
}

pub(crate) type CallResult<T = ()> = Result<T, CallError>;

/// How a session ended.
enum End {
    Eof,
    Bye,
    Violation(String),
    Lost(String),
}

pub(crate) struct Session {
    pub id: u64,
    pub objects: Objects,
    pub completion: Completion,
    pub shared: Arc<Shared>,
    writer: Arc<Writer>,
    last_seq: u64,
    /// Per queue id: how far its commands are known to have completed.
    pub progress: std::collections::HashMap<Id, Arc<completion::QueueProgress>>,
    /// Pinned staging ([`crate::pinned`]): the session's budget (None when
    /// off), its pools by context, and each queue's pool (None when its
    /// context has none).
    pinned_budget: Option<Arc<crate::pinned::Budget>>,
    /// Pinned staging per vendor context, made at the context's first
    /// transfer; dropped when the client releases the context (the pool
    /// holds a reference to it).
    pub(crate) pinned_pools:
        std::collections::HashMap<crate::vendor::VPtr, Arc<crate::pinned::Pool>>,
    pub pinned_by_queue: std::collections::HashMap<Id, Option<Arc<crate::pinned::Pool>>>,
    /// Whether the client had sent nothing beyond the call being run.
    pub client_idle: bool,
    /// Pre-copied blobs by the client's key, and their bytes together.
    pub(crate) stash: std::collections::HashMap<u64, crate::api::Blob>,
    pub(crate) stash_bytes: u64,
    /// Pinned memory for blobs (`api::stash`), made at the first one
    /// (inside None: it could not be).
    pub(crate) stash_pool: Option<Option<Arc<crate::pinned::Pool>>>,
    /// Warm contexts owed for those the session took, started at its next
    /// `Sync` (after a move's rebuild and its writes: making a context
    /// slows every transfer on the device while it runs) or at its end.
    pub(crate) warm_refills: Vec<crate::warm::Refill>,
    /// The session's lanes, once it asked for them (`crate::lanes`).
    pub(crate) lanes: Option<Arc<crate::lanes::Lanes>>,
    /// Vendor bugs worked around for the session's releases: context
    /// references the vendor leaked, sub-buffers released newest first
    /// (`crate::quirks`).
    pub(crate) quirks: crate::quirks::Quirks,
}

/// Serves one accepted connection until it ends.
pub(crate) fn serve(stream: Arc<Stream>, shared: Arc<Shared>, id: u64) {
    let peer = stream.peer();
    if let Err(e) = stream.configure() {
        limited!(
            Level::Warn,
            "session {id} ({peer}): socket options cannot be set: {e}"
        );
    }
    let writer = Arc::new(Writer::new(stream.clone()));
    let deadline = Instant::now() + shared.config.hello_timeout;
    let mut reader = FrameReader::new(stream.clone(), Some(deadline));
    let (hello_seq, tenant, client, minor) = match greet(&mut reader, &shared) {
        Ok(First::Hello(seq, tenant, client, minor)) => (seq, tenant, client, minor),
        Ok(First::Lane(join)) => {
            if let Err((seq, reason)) =
                crate::lanes::serve(&stream, &mut reader, &writer, &shared, id, join)
            {
                limited!(Level::Info, "lane connection {id} ({peer}) ended: {reason}");
                goodbye(&writer, &stream, seq, &reason);
            }
            writer.close();
            stream.shutdown(Shutdown::Both);
            return;
        }
        Err((seq, reason)) if reason == CLOSED_BEFORE_HELLO => {
            // A connection that sent nothing at all: a health check (craned
            // probes the proxy with a TCP connect), not worth an info line.
            log::debug!("session {id} ({peer}): {reason}");
            let _ = seq;
            return;
        }
        Err((seq, reason)) => {
            limited!(Level::Info, "session {id} ({peer}) refused: {reason}");
            shared.count_refused();
            goodbye(&writer, &stream, seq, &reason);
            return;
        }
    };
    let started = reader
        .clear_deadline()
        .map_err(|e| e.to_string())
        .and_then(|()| {
            Completion::start(writer.clone(), id, shared.staging.clone()).map_err(|e| e.to_string())
        });
    let completion = match started {
        Ok(c) => c,
        Err(e) => {
            limited!(Level::Error, "session {id}: cannot start: {e}");
            goodbye(
                &writer,
                &stream,
                hello_seq,
                "the proxy cannot start a session now",
            );
            return;
        }
    };
    let counters = Arc::new(Counters::default());
    shared.opened(id, &tenant, &client, counters.clone());
    let limits = shared.limits;
    writer.output.configure(minor, limits.max_payload);
    let mut session = Session {
        id,
        objects: Objects::new(limits.max_objects, limits.max_mem_bytes, counters),
        completion,
        shared: shared.clone(),
        writer: writer.clone(),
        last_seq: hello_seq,
        progress: std::collections::HashMap::new(),
        pinned_budget: crate::pinned::Budget::for_session(limits.max_mem_bytes),
        pinned_pools: std::collections::HashMap::new(),
        pinned_by_queue: std::collections::HashMap::new(),
        client_idle: false,
        stash: std::collections::HashMap::new(),
        stash_bytes: 0,
        stash_pool: None,
        warm_refills: Vec::new(),
        lanes: None,
        quirks: crate::quirks::Quirks::default(),
    };
    writer.send(
        hello_seq,
        &Answer::Welcome {
            major: VERSION_MAJOR,
            minor: VERSION_MINOR,
            session: id,
            limits,
        },
        &[],
    );
    limited!(
        Level::Info,
        "session {id} opened: tenant {tenant}, client {client}, {peer}"
    );

    let end = catch_unwind(AssertUnwindSafe(|| session.run(&mut reader))).unwrap_or_else(|_| {
        shared.count_panic();
        limited!(
            Level::Error,
            "session {id}: the proxy panicked serving it; only this session ends"
        );
        End::Violation("the proxy failed internally".into())
    });
    match &end {
        End::Violation(reason) => {
            limited!(
                Level::Warn,
                "session {id} (tenant {tenant}) ended: {reason}"
            );
            goodbye(&writer, &stream, 0, reason);
        }
        End::Lost(why) => limited!(Level::Info, "session {id} (tenant {tenant}) lost: {why}"),
        End::Eof | End::Bye => {}
    }
    for r in session.warm_refills.drain(..) {
        r.start();
    }
    let started = Instant::now();
    let mut drained = true;
    match catch_unwind(AssertUnwindSafe(|| session.teardown())) {
        Ok((released, all_drained)) => {
            drained = all_drained;
            limited!(
                Level::Info,
                "session {id} (tenant {tenant}) closed{}: {released} object(s) released in {:.1} ms",
                if matches!(end, End::Bye) {
                    " by the client"
                } else {
                    ""
                },
                started.elapsed().as_secs_f64() * 1e3
            )
        }
        Err(_) => {
            shared.count_panic();
            limited!(
                Level::Error,
                "session {id}: the proxy panicked tearing it down"
            );
        }
    }
    // Kernels of queues that did not drain may still print: the session
    // stays among the printers until its drain thread has finished them, so
    // that their output is never taken for another session's.
    if drained {
        writer.output.session_ended();
    }
    writer.close();
    stream.shutdown(Shutdown::Both);
}

/// The drain thread finished the session's queues ([`Session::drain_queues`]).
const DRAIN_DONE: u8 = 1;
/// The session stopped waiting for its drain thread.
const DRAIN_GAVE_UP: u8 = 2;

/// Why a connection that closed without sending a byte ended.
const CLOSED_BEFORE_HELLO: &str = "the connection closed before Hello";

/// What a connection's first frame opens.
enum First {
    /// A session: `(seq, tenant, client, minor)` of its Hello.
    Hello(u64, String, String, u16),
    /// A lane of a session: `(seq, session, lane, secret)` of its JoinLane,
    /// checked by `crate::lanes::serve`.
    Lane((u64, u64, u32, [u8; crane_wire::LANE_SECRET_LEN])),
}

/// Reads and checks the Hello (or a lane's JoinLane), or says the first
/// frame's seq (0 if unknown) and why the connection is refused.
fn greet(reader: &mut FrameReader, shared: &Shared) -> Result<First, (u64, String)> {
    let h = match reader.next(HELLO_MAX_BODY, 0) {
        Ok(Some(h)) => h,
        Ok(None) => return Err((0, CLOSED_BEFORE_HELLO.into())),
        Err(ReadError::TimedOut) => {
            return Err((
                0,
                format!("no Hello within {:?}", shared.config.hello_timeout),
            ));
        }
        Err(e) => return Err((0, e.to_string())),
    };
    let call: Call = crane_wire::decode(&reader.body)
        .map_err(|e| (0, format!("the first message cannot be decoded: {e}")))?;
    if let Call::JoinLane {
        session,
        lane,
        secret,
    } = call
    {
        if h.seq == 0 {
            return Err((0, "calls never have sequence number 0".into()));
        }
        return Ok(First::Lane((h.seq, session, lane, secret)));
    }
    let Call::Hello {
        major,
        minor,
        token,
        client,
    } = call
    else {
        return Err((
            0,
            format!("the first message must be Hello, not {}", call.name()),
        ));
    };
    if h.seq == 0 {
        return Err((0, "calls never have sequence number 0".into()));
    }
    if major != VERSION_MAJOR {
        return Err((
            h.seq,
            format!(
                "protocol version {major}.{minor} is not supported: this proxy speaks {VERSION_MAJOR}.{VERSION_MINOR}"
            ),
        ));
    }
    match tokens::lookup(&shared.config.token_file, &token) {
        Ok(Some(t)) => Ok(First::Hello(h.seq, t.name, printable(&client), minor)),
        Ok(None) => Err((h.seq, "the token is not valid".into())),
        Err(e) => {
            limited!(Level::Error, "refusing every session: {e}");
            Err((h.seq, "the proxy cannot check tokens now".into()))
        }
    }
}

/// A client-chosen string made safe for one log line.
fn printable(s: &str) -> String {
    s.chars()
        .take(128)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Tells the client why its session ends, then lets the socket close
/// without discarding that message.
fn goodbye(writer: &Writer, stream: &Stream, seq: u64, reason: &str) {
    writer.send(
        seq,
        &Answer::Goodbye {
            reason: reason.to_string(),
        },
        &[],
    );
    writer.close();
    stream.shutdown(Shutdown::Write);
    conn::drain(stream);
}

/// The answer a call gets when it fails with an OpenCL error: posted calls
/// get `Failed` (seq 0), replying calls their usual answer with the status.
#[derive(Clone, Copy)]
enum ErrorShape {
    Failed,
    Count,
    Info,
    Formats,
    Binaries,
    Binary,
    Data,
    Status,
    Kernel,
}

impl ErrorShape {
    fn of(call: &Call) -> ErrorShape {
        use Call::*;
        match call {
            GetPlatformIds { .. }
            | GetDeviceIds { .. }
            | CreateSubDevices { .. }
            | CreateKernelsInProgram { .. } => ErrorShape::Count,
            GetInfo { .. } | SetQueueProperty { .. } => ErrorShape::Info,
            DescribeKernel { .. } => ErrorShape::Kernel,
            GetSupportedImageFormats { .. } => ErrorShape::Formats,
            GetProgramBinaries { .. } => ErrorShape::Binaries,
            CreateProgramWithBinary { .. } => ErrorShape::Binary,
            EnqueueReadBuffer { .. } | EnqueueReadBufferRect { .. } | EnqueueReadImage { .. } => {
                ErrorShape::Data
            }
            c if c.replies() => ErrorShape::Status,
            _ => ErrorShape::Failed,
        }
    }

    /// `(seq, answer)` for the call `seq` failing with `status`.
    fn answer(self, seq: u64, status: cl_int) -> (u64, Answer) {
        let a = match self {
            ErrorShape::Failed => return (0, Answer::Failed { seq, status }),
            ErrorShape::Count => Answer::Count { status, count: 0 },
            ErrorShape::Info => Answer::Info(status),
            ErrorShape::Formats => Answer::Formats {
                status,
                formats: Vec::new(),
            },
            ErrorShape::Binaries => Answer::Binaries {
                status,
                sizes: Vec::new(),
            },
            ErrorShape::Binary => Answer::Binary {
                status,
                per_binary: Vec::new(),
            },
            ErrorShape::Data => Answer::Data(status),
            ErrorShape::Status => Answer::Status(status),
            ErrorShape::Kernel => Answer::Kernel {
                status,
                args: Vec::new(),
                devices: Vec::new(),
            },
        };
        (seq, a)
    }
}

/// Calls that carry a payload.
fn takes_payload(call: &Call) -> bool {
    use Call::*;
    matches!(
        call,
        CreateBuffer { init: true, .. }
            | CreateImage { init: true, .. }
            | CreateProgramWithIl { .. }
            | CreateProgramWithBinary { .. }
            | EnqueueWriteBuffer { .. }
            | EnqueueWriteBufferRect { .. }
            | EnqueueWriteImage { .. }
            | Stash { .. }
    )
}

impl Session {
    fn run(&mut self, reader: &mut FrameReader) -> End {
        let max_payload = self.shared.limits.max_payload;
        let mut trace = crate::trace::on().then(crate::trace::Session::default);
        let end = self.serve_calls(reader, max_payload, &mut trace);
        if let Some(t) = &trace {
            t.report(self.id);
        }
        end
    }

    fn serve_calls(
        &mut self,
        reader: &mut FrameReader,
        max_payload: u64,
        trace: &mut Option<crate::trace::Session>,
    ) -> End {
        loop {
            if reader.drained() {
                // About to wait for the client: free what finished writes held.
                self.completion.inflight.reap(true);
            }
            let t0 = trace.is_some().then(Instant::now);
            let h = match reader.next(MAX_BODY, max_payload) {
                Ok(Some(h)) => h,
                Ok(None) => return End::Eof,
                Err(ReadError::Frame(r)) => return End::Violation(r),
                Err(e @ ReadError::Truncated) => return End::Violation(e.to_string()),
                Err(e) => return End::Lost(e.to_string()),
            };
            let t1 = trace.is_some().then(Instant::now);
            let call: Call = match crane_wire::decode(&reader.body) {
                Ok(c) => c,
                Err(e) => return End::Violation(format!("a message cannot be decoded: {e}")),
            };
            if let (Some(t), Some(t0), Some(t1)) = (trace.as_mut(), t0, t1) {
                t.frames += 1;
                t.wait_ns += (t1 - t0).as_nanos() as u64;
                t.decode_ns += crate::trace::ns(t1);
            }
            if h.seq <= self.last_seq {
                return End::Violation(format!(
                    "sequence number {} does not follow {}",
                    h.seq, self.last_seq
                ));
            }
            self.last_seq = h.seq;
            let pinned = match &call {
                Call::EnqueueWriteBuffer { queue, .. }
                | Call::EnqueueWriteBufferRect { queue, .. }
                | Call::EnqueueWriteImage { queue, .. } => {
                    self.pinned_staging(*queue, h.payload_len)
                }
                Call::Stash { .. } => self.stash_staging(h.payload_len),
                _ => None,
            };
            let read = match pinned {
                Some(mut b) => reader.payload_into(&mut b).map(|()| b),
                None => reader
                    .payload(h.payload_len, &self.completion.inflight.buffers)
                    .map(HostBuf::Heap),
            };
            let payload = match read {
                Ok(p) => p,
                Err(e @ (ReadError::Frame(_) | ReadError::Truncated)) => {
                    return End::Violation(e.to_string());
                }
                Err(e) => return End::Lost(e.to_string()),
            };
            self.client_idle = reader.drained();
            match call {
                Call::Bye => return End::Bye,
                Call::Hello { .. } => return End::Violation("Hello in an open session".into()),
                call => {
                    let t2 = trace.is_some().then(|| (call.name(), Instant::now()));
                    if let Err(v) = self.execute(h.seq, call, payload) {
                        return End::Violation(v);
                    }
                    if let (Some(t), Some((name, t2))) = (trace.as_mut(), t2) {
                        t.call(name, t2);
                    }
                }
            }
        }
    }

    /// Runs one call and reports its failure; `Err` ends the session.
    fn execute(&mut self, seq: u64, call: Call, payload: HostBuf) -> Result<(), String> {
        let name = call.name();
        if !payload.is_empty() && !takes_payload(&call) {
            return Err(format!("{name} carries no payload"));
        }
        let shape = ErrorShape::of(&call);
        self.writer.output.note_call(self.id, seq, &call);
        match self.dispatch(seq, call, payload) {
            Ok(()) => Ok(()),
            Err(CallError::Violation(v)) => Err(format!("{name}: {v}")),
            Err(CallError::Cl(status)) => {
                limited!(
                    Level::Debug,
                    "session {}: {name} (seq {seq}) failed with {status}",
                    self.id
                );
                let (seq, answer) = shape.answer(seq, status);
                self.reply(seq, &answer, &[]);
                Ok(())
            }
        }
    }

    fn dispatch(&mut self, seq: u64, call: Call, payload: HostBuf) -> CallResult {
        use Call::*;
        // Only transfers' payloads can be pinned (and stay so).
        let transfer = matches!(
            call,
            EnqueueWriteBuffer { .. }
                | EnqueueWriteBufferRect { .. }
                | EnqueueWriteImage { .. }
                | Stash { .. }
        );
        let (payload, staged) = if transfer {
            (Vec::new(), payload)
        } else {
            (payload.into_vec(), HostBuf::default())
        };
        match call {
            Hello { .. } | Bye => unreachable!("handled by the session loop"),
            GetPlatformIds { ids } => self.get_platform_ids(seq, &ids),
            GetDeviceIds {
                platform,
                device_type,
                ids,
            } => self.get_device_ids(seq, platform, device_type, &ids),
            CreateSubDevices { device, props, ids } => {
                self.create_sub_devices(seq, device, &props, &ids)
            }
            GetInfo {
                kind,
                object,
                param,
            } => self.get_info(seq, &kind, object, param),
            GetSupportedImageFormats {
                context,
                flags,
                image_type,
            } => self.get_supported_image_formats(seq, context, flags, image_type),
            GetProgramBinaries { program } => self.get_program_binaries(seq, program),
            CreateContext { id, props, devices } => self.create_context(id, &props, &devices),
            CreateContextFromType {
                id,
                props,
                device_type,
            } => self.create_context_from_type(id, &props, device_type),
            CreateQueue {
                id,
                context,
                device,
                props,
            } => self.create_queue(id, context, device, &props),
            CreateBuffer {
                id,
                context,
                flags,
                size,
                props,
                init,
            } => self.create_buffer(id, context, flags, size, &props, init.then_some(payload)),
            CreateSubBuffer {
                id,
                parent,
                flags,
                origin,
                size,
            } => self.create_sub_buffer(id, parent, flags, origin, size),
            CreateImage {
                id,
                context,
                flags,
                format,
                desc,
                props,
                init,
            } => self.create_image(
                id,
                context,
                flags,
                format,
                desc,
                &props,
                init.then_some(payload),
            ),
            CreateSampler { id, context, props } => self.create_sampler(id, context, &props),
            CreateProgramWithSource {
                id,
                context,
                source,
            } => self.create_program_with_source(id, context, &source),
            CreateProgramWithIl { id, context } => {
                self.create_program_with_il(id, context, &payload)
            }
            CreateProgramWithBinary {
                id,
                context,
                devices,
                sizes,
            } => self.create_program_with_binary(seq, id, context, &devices, &sizes, &payload),
            CreateProgramWithBuiltInKernels {
                id,
                context,
                devices,
                names,
            } => self.create_program_with_built_in_kernels(id, context, &devices, &names),
            BuildProgram {
                program,
                devices,
                options,
            } => self.build_program(seq, program, &devices, &options),
            CompileProgram {
                program,
                devices,
                options,
                headers,
            } => self.compile_program(seq, program, &devices, &options, &headers),
            LinkProgram {
                id,
                context,
                devices,
                options,
                inputs,
            } => self.link_program(seq, id, context, &devices, &options, &inputs),
            SetSpecializationConstant {
                program,
                spec_id,
                value,
            } => self.set_specialization_constant(program, spec_id, &value),
            CreateKernel { id, program, name } => self.create_kernel(id, program, &name),
            CreateKernelsInProgram { program, ids } => {
                self.create_kernels_in_program(seq, program, &ids)
            }
            CloneKernel { id, source } => self.clone_kernel(id, source),
            SetKernelArg { kernel, index, arg } => self.set_kernel_arg(kernel, index, &arg),
            CreateUserEvent { id, context } => self.create_user_event(id, context),
            SetUserEventStatus { event, status } => self.set_user_event_status(event, status),
            SetEventCallback {
                event,
                status,
                cookie,
            } => self.set_event_callback(event, status, cookie),
            Release { id } => self.release(id),
            EnqueueNdRange {
                queue,
                kernel,
                dims,
                offset,
                global,
                local,
                sync,
            } => self.enqueue_nd_range(queue, kernel, dims, offset, global, local, &sync),
            EnqueueWriteBuffer {
                queue,
                buffer,
                offset,
                size,
                sync,
            } => self.enqueue_write_buffer(queue, buffer, offset, size, &sync, staged),
            EnqueueReadBuffer {
                queue,
                buffer,
                offset,
                size,
                sync,
            } => self.enqueue_read_buffer(seq, queue, buffer, offset, size, &sync),
            EnqueueWriteBufferRect {
                queue,
                buffer,
                rect,
                sync,
            } => self.enqueue_write_buffer_rect(queue, buffer, &rect, &sync, staged),
            EnqueueReadBufferRect {
                queue,
                buffer,
                rect,
                sync,
            } => self.enqueue_read_buffer_rect(seq, queue, buffer, &rect, &sync),
            EnqueueWriteImage {
                queue,
                image,
                origin,
                region,
                sync,
            } => self.enqueue_write_image(queue, image, origin, region, &sync, staged),
            EnqueueReadImage {
                queue,
                image,
                origin,
                region,
                sync,
            } => self.enqueue_read_image(seq, queue, image, origin, region, &sync),
            EnqueueFillBuffer {
                queue,
                buffer,
                pattern,
                offset,
                size,
                sync,
            } => self.enqueue_fill_buffer(queue, buffer, &pattern, offset, size, &sync),
            EnqueueFillImage {
                queue,
                image,
                color,
                origin,
                region,
                sync,
            } => self.enqueue_fill_image(queue, image, &color, origin, region, &sync),
            EnqueueCopyBuffer {
                queue,
                src,
                dst,
                src_offset,
                dst_offset,
                size,
                sync,
            } => self.enqueue_copy_buffer(queue, src, dst, src_offset, dst_offset, size, &sync),
            EnqueueCopyBufferRect {
                queue,
                src,
                dst,
                src_origin,
                dst_origin,
                region,
                src_pitch,
                dst_pitch,
                sync,
            } => self.enqueue_copy_buffer_rect(
                queue, src, dst, src_origin, dst_origin, region, src_pitch, dst_pitch, &sync,
            ),
            EnqueueCopyImage {
                queue,
                src,
                dst,
                src_origin,
                dst_origin,
                region,
                sync,
            } => self.enqueue_copy_image(queue, src, dst, src_origin, dst_origin, region, &sync),
            EnqueueCopyImageToBuffer {
                queue,
                src,
                dst,
                src_origin,
                region,
                dst_offset,
                sync,
            } => self.enqueue_copy_image_to_buffer(
                queue, src, dst, src_origin, region, dst_offset, &sync,
            ),
            EnqueueCopyBufferToImage {
                queue,
                src,
                dst,
                src_offset,
                dst_origin,
                region,
                sync,
            } => self.enqueue_copy_buffer_to_image(
                queue, src, dst, src_offset, dst_origin, region, &sync,
            ),
            EnqueueMarker { queue, sync } => self.enqueue_marker(queue, &sync),
            EnqueueBarrier { queue, sync } => self.enqueue_barrier(queue, &sync),
            EnqueueMigrate {
                queue,
                mems,
                flags,
                sync,
            } => self.enqueue_migrate(queue, &mems, flags, &sync),
            Flush { queue } => self.flush(queue),
            Finish { queue } => self.finish(seq, queue),
            WaitForEvents { events } => self.wait_for_events(seq, &events),
            Sync => {
                // Calls run in order on this thread: everything before this
                // one has run, and its failures have been sent.
                self.reply(seq, &Answer::Status(CL_SUCCESS), &[]);
                for r in self.warm_refills.drain(..) {
                    r.start();
                }
                Ok(())
            }
            DescribeKernel { kernel, devices } => self.describe_kernel(seq, kernel, &devices),
            SetProgramSource { program, source } => self.set_program_source(program, &source),
            SetQueueProperty {
                queue,
                properties,
                enable,
            } => self.set_queue_property(seq, queue, properties, enable),
            Stash { key, total, offset } => self.stash(key, total, offset, staged),
            EnqueueWriteStash {
                queue,
                buffer,
                offset,
                key,
                sync,
            } => self.enqueue_write_stash(queue, buffer, offset, key, &sync),
            Unstash { key } => self.unstash(key),
            OpenLanes { count } => self.open_lanes(seq, count),
            EnqueueWriteLane {
                queue,
                buffer,
                offset,
                key,
                sync,
            } => self.enqueue_write_lane(queue, buffer, offset, key, &sync),
            JoinLane { .. } => Err(CallError::Violation(
                "JoinLane opens a lane's connection, not a call of a session".into(),
            )),
            LanePiece { .. } => Err(CallError::Violation(
                "pieces go over a lane, not the session's connection".into(),
            )),
        }
    }

    /// Pinned host memory for a transfer of `len` bytes on the queue
    /// `queue`, when the session's budget and the vendor allow; the pool of
    /// the queue's context is made at its first transfer.
    pub fn pinned_staging(&mut self, queue: Id, len: u64) -> Option<HostBuf> {
        let budget = self.pinned_budget.as_ref()?;
        let pool = match self.pinned_by_queue.get(&queue) {
            Some(p) => p.clone(),
            None => {
                let q = self.objects.handle(queue, Kind::Queue).ok()?;
                let pool = crate::pinned::queue_context(q).and_then(|(ctx, dev)| {
                    if let Some(p) = self.pinned_pools.get(&ctx) {
                        return Some(p.clone());
                    }
                    let p = crate::pinned::Pool::new(ctx, dev, budget.clone())?;
                    self.pinned_pools.insert(ctx, p.clone());
                    Some(p)
                });
                self.pinned_by_queue.insert(queue, pool.clone());
                pool
            }
        };
        let got = pool.and_then(|p| p.take(usize::try_from(len).ok()?));
        if crate::trace::on() {
            let g = &*crate::trace::GLOBAL;
            crate::trace::add(
                if got.is_some() {
                    &g.pinned
                } else {
                    &g.unpinned
                },
                1,
            );
        }
        got.map(HostBuf::Pinned)
    }

    /// Sends an answer frame.
    pub fn reply(&self, seq: u64, answer: &Answer, payload: &[u8]) {
        self.writer.send(seq, answer, payload);
    }

    /// Names a new object `id`: checks the id is fresh and the object count
    /// allows it, then runs `make`. A creation that fails with an OpenCL
    /// error leaves `id` known as failed, with that error.
    pub fn create(
        &mut self,
        id: Id,
        kind: Kind,
        make: impl FnOnce(&mut Session) -> CallResult<(VPtr, Detail)>,
    ) -> CallResult {
        self.objects.check_new(id)?;
        let made = self
            .objects
            .admit(0)
            .map_err(CallError::Cl)
            .and_then(|()| make(self));
        match made {
            Ok((h, detail)) => {
                self.objects.insert(id, kind, h, detail);
                Ok(())
            }
            Err(CallError::Cl(e)) => {
                self.objects.insert_failed(id, kind, e);
                Err(CallError::Cl(e))
            }
            Err(v) => Err(v),
        }
    }

    /// Runs an enqueue with the wait list of `sync` translated, creating the
    /// command's event when the client names one (`sync.event`) or `own` is
    /// set. With `own`, the caller gets the event and one reference to it.
    pub fn enqueue(
        &mut self,
        sync: &Sync,
        own: bool,
        run: impl FnOnce(&mut Session, &[cl_event], *mut cl_event) -> CallResult,
    ) -> CallResult<Option<VPtr>> {
        let want = sync.event != 0;
        if want {
            self.objects.check_new(sync.event)?;
        }
        let mut ev: cl_event = std::ptr::null_mut();
        let ran = (|| {
            if want {
                self.objects.admit(0)?;
            }
            let waits: Vec<cl_event> = self
                .objects
                .handles(&sync.waits, Kind::Event)?
                .into_iter()
                .map(|h| h.get().cast())
                .collect();
            let evp: *mut cl_event = if want || own {
                &mut ev
            } else {
                std::ptr::null_mut()
            };
            run(self, &waits, evp)
        })();
        match ran {
            Ok(()) => {
                let ev = VPtr(ev.cast());
                if want {
                    if ev.get().is_null() {
                        self.objects
                            .insert_failed(sync.event, Kind::Event, CL_OUT_OF_RESOURCES);
                    } else {
                        self.objects
                            .insert(sync.event, Kind::Event, ev, Detail::Plain);
                        if own {
                            retain_event(ev);
                        }
                    }
                }
                Ok(own.then_some(ev))
            }
            Err(CallError::Cl(e)) => {
                if want {
                    self.objects.insert_failed(sync.event, Kind::Event, e);
                }
                Err(CallError::Cl(e))
            }
            Err(v) => Err(v),
        }
    }

    /// Ends the session's OpenCL work: fails the user events nobody set,
    /// lets the queues drain (bounded by the teardown timeout), collects the
    /// callbacks still owed, then releases every object, dependents first.
    /// Returns how many objects were released, and whether the queues
    /// drained in time.
    fn teardown(&mut self) -> (usize, bool) {
        if let Some(l) = self.lanes.take() {
            l.end(&self.shared);
        }
        for e in self.objects.unset_user_events() {
            if let Ok(f) = vfn!(e.get(), clSetUserEventStatus) {
                // SAFETY: a live user event whose status was never set;
                // OpenCL allows setting it to a negative error.
                unsafe { f(e.get().cast(), -1) };
            }
        }
        let queues = self.objects.live_of(Kind::Queue);
        let drained = queues.is_empty() || self.drain_queues(queues);
        self.completion.drop_waits();
        self.completion.stop();
        let all = self.objects.take_for_teardown();
        let n = all.len();
        for (kind, detail, h) in all {
            self.quirks.release(&self.shared.vendor, kind, detail, h);
        }
        self.quirks.give_back_rest();
        // Pinned buffers still in use keep their pool (and its context).
        self.pinned_by_queue.clear();
        self.pinned_pools.clear();
        (n, drained)
    }

    /// Finishes the queues on a helper thread, waiting at most the teardown
    /// timeout: a queue stuck on the device must not keep the session's
    /// resources (the helper then finishes it on its own, and only then
    /// takes the session out of the kernel-output printers). Returns whether
    /// the queues drained in time.
    fn drain_queues(&self, queues: Vec<VPtr>) -> bool {
        for q in &queues {
            if let Ok(f) = vfn!(q.get(), clRetainCommandQueue) {
                // SAFETY: a live queue; the helper owns this reference.
                unsafe { f(q.get().cast()) };
            }
        }
        let (tx, rx) = mpsc::channel();
        let writer = self.writer.clone();
        // Which of the two sides finished first: the one that comes second
        // takes the session out of the printers (below).
        let handover = Arc::new(std::sync::atomic::AtomicU8::new(0));
        let theirs = handover.clone();
        let spawned = std::thread::Builder::new()
            .name(format!("crane-drain-{}", self.id))
            .spawn(move || {
                for q in queues {
                    if let Ok(f) = vfn!(q.get(), clFinish) {
                        // SAFETY: the helper holds a reference to `q`.
                        unsafe { f(q.get().cast()) };
                    }
                    release(Kind::Queue, Detail::Plain, q);
                }
                if theirs.swap(DRAIN_DONE, std::sync::atomic::Ordering::AcqRel) == DRAIN_GAVE_UP {
                    // The session gave up waiting and left this to us.
                    writer.output.session_ended();
                }
                let _ = tx.send(());
            });
        if spawned.is_err() {
            limited!(
                Level::Error,
                "session {}: cannot start a thread to drain its queues",
                self.id
            );
            return false;
        }
        let waited = rx.recv_timeout(self.shared.config.teardown_timeout);
        let drained = waited.is_ok()
            || handover.swap(DRAIN_GAVE_UP, std::sync::atomic::Ordering::AcqRel) == DRAIN_DONE;
        if !drained {
            limited!(
                Level::Warn,
                "session {}: its queues did not drain within {:?}; releasing its objects anyway",
                self.id,
                self.shared.config.teardown_timeout
            );
        }
        drained
    }
}

pub(crate) fn retain_event(e: VPtr) {
    if let Ok(f) = vfn!(e.get(), clRetainEvent) {
        // SAFETY: a live event.
        unsafe { f(e.get().cast()) };
    }
}

/// Gives back the proxy's reference to a vendor object.
pub(crate) fn release(kind: Kind, detail: Detail, h: VPtr) -> cl_int {
    type Rel = unsafe extern "C" fn(*mut c_void) -> cl_int;
    fn call<F: Copy>(f: Result<F, cl_int>, h: VPtr) -> cl_int {
        match f {
            Ok(f) => {
                assert_eq!(size_of::<F>(), size_of::<Rel>());
                // SAFETY: every clRelease* takes one object pointer and
                // returns cl_int; only the pointee type differs.
                let f: Rel = unsafe { std::mem::transmute_copy(&f) };
                // SAFETY: the proxy owns a reference to `h`.
                unsafe { f(h.get()) }
            }
            Err(e) => e,
        }
    }
    match kind {
        Kind::Platform => CL_SUCCESS,
        Kind::Device if detail == Detail::Root => CL_SUCCESS,
        Kind::Device => call(vfn!(h.get(), clReleaseDevice), h),
        Kind::Context => call(vfn!(h.get(), clReleaseContext), h),
        Kind::Queue => call(vfn!(h.get(), clReleaseCommandQueue), h),
        Kind::Mem => call(vfn!(h.get(), clReleaseMemObject), h),
        Kind::Sampler => call(vfn!(h.get(), clReleaseSampler), h),
        Kind::Program => call(vfn!(h.get(), clReleaseProgram), h),
        Kind::Kernel => call(vfn!(h.get(), clReleaseKernel), h),
        Kind::Event => call(vfn!(h.get(), clReleaseEvent), h),
    }
}
