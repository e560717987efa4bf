//! Whole OpenCL jobs run remotely through the proxy (PoCL in CI), with
//! results compared bit for bit against the same computation on the host;
//! batching, failure reports, event callbacks, and waits that only the
//! session's later calls can release.

mod common;

use std::time::Duration;

use common::*;
use crane_wire::{
    Answer, ArgDesc, Call, ImageDesc, ImageFormat, InfoKind, KernelArg, KernelDevice, Rect, Sync,
};
use rand::{Rng, SeedableRng, rngs::StdRng};

const SOURCE: &str = r#"
__kernel void shifted_fma(__global const float *x, __global const float *y,
                          __global float *out, float a, __local float *scratch,
                          uint n) {
    size_t g = get_global_id(0), l = get_local_id(0), ls = get_local_size(0);
    scratch[l] = x[g];
    barrier(CLK_LOCAL_MEM_FENCE);
    if (g < n)
        out[g] = fma(a, scratch[(l + 1) % ls], y[g]);
}

__kernel void fill_pattern(__global uint *out, uint seed) {
    size_t g = get_global_id(0);
    out[g] = (uint)g * 2654435761u ^ seed;
}
"#;

const N: usize = 4096;
const LOCAL: usize = 64;

/// What `shifted_fma` computes, on the host.
fn shifted_fma_host(x: &[f32], y: &[f32], a: f32) -> Vec<f32> {
    (0..x.len())
        .map(|g| {
            let group = g / LOCAL * LOCAL;
            let neighbour = group + (g % LOCAL + 1) % LOCAL;
            a.mul_add(x[neighbour], y[g])
        })
        .collect()
}

#[test]
fn a_full_job_runs_remotely_with_bit_identical_results() {
    let p = TestProxy::start(|_| {});
    let mut c = p.client(TOKEN_A);
    let env = setup(&mut c);

    let mut rng = StdRng::seed_from_u64(7);
    let x: Vec<f32> = (0..N).map(|_| rng.random_range(-1e3..1e3)).collect();
    let y: Vec<f32> = (0..N).map(|_| rng.random_range(-1e3..1e3)).collect();
    let a = 1.618_034_f32;
    let bytes = (N * 4) as u64;

    // Everything up to the build is posted in one batch.
    let bx = create_buffer(&mut c, &env, CL_MEM_READ_ONLY, bytes, Some(&f32_bytes(&x)));
    let by = create_buffer(&mut c, &env, CL_MEM_READ_ONLY, bytes, Some(&f32_bytes(&y)));
    let bo = create_buffer(&mut c, &env, CL_MEM_WRITE_ONLY, bytes, None);
    let program = build(&mut c, &env, SOURCE);

    let kernel = c.id();
    c.post(
        Call::CreateKernel {
            id: kernel,
            program,
            name: "shifted_fma".into(),
        },
        &[],
    );
    let args = [
        KernelArg::Object(bx),
        KernelArg::Object(by),
        KernelArg::Object(bo),
        KernelArg::Bytes(a.to_ne_bytes().to_vec()),
        KernelArg::Local((LOCAL * 4) as u64),
        KernelArg::Bytes((N as u32).to_ne_bytes().to_vec()),
    ];
    for (index, arg) in args.into_iter().enumerate() {
        c.post(
            Call::SetKernelArg {
                kernel,
                index: index as u32,
                arg,
            },
            &[],
        );
    }
    let done = c.id();
    c.post(
        Call::EnqueueNdRange {
            queue: env.queue,
            kernel,
            dims: 1,
            offset: None,
            global: [N as u64, 1, 1],
            local: Some([LOCAL as u64, 1, 1]),
            sync: Sync {
                waits: vec![],
                event: done,
            },
        },
        &[],
    );
    c.post(
        Call::SetEventCallback {
            event: done,
            status: CL_COMPLETE,
            cookie: 0xc0ffee,
        },
        &[],
    );
    let got = read(&mut c, &env, bo, bytes, vec![done]);
    let want = f32_bytes(&shifted_fma_host(&x, &y, a));
    assert!(got == want, "the device's results differ from the host's");
    assert_eq!(c.fired(0xc0ffee, LONG), Some(CL_COMPLETE));

    // Info values come back whole.
    let (a, name) = c.call(
        Call::GetInfo {
            kind: InfoKind::Device,
            object: env.device,
            param: 0x102B, // CL_DEVICE_NAME
        },
        &[],
    );
    assert_eq!(a, Answer::Info(CL_SUCCESS));
    assert!(name.len() > 1 && name.ends_with(&[0]), "{name:?}");
    let (a, nargs) = c.call(
        Call::GetInfo {
            kind: InfoKind::Kernel,
            object: kernel,
            param: 0x1191, // CL_KERNEL_NUM_ARGS
        },
        &[],
    );
    assert_eq!(
        (a, nargs),
        (Answer::Info(CL_SUCCESS), 6u32.to_ne_bytes().to_vec())
    );
    // Handle-valued parameters are the client's business.
    let (a, _) = c.call(
        Call::GetInfo {
            kind: InfoKind::Device,
            object: env.device,
            param: 0x1031, // CL_DEVICE_PLATFORM
        },
        &[],
    );
    assert_eq!(a, Answer::Info(-30)); // CL_INVALID_VALUE

    assert_eq!(
        c.call(Call::Finish { queue: env.queue }, &[]).0,
        Answer::Status(CL_SUCCESS)
    );
    assert_eq!(c.sync(), vec![]);
}

#[test]
fn failures_of_posted_calls_arrive_before_later_answers_and_stick_to_the_object() {
    let p = TestProxy::start(|_| {});
    let mut c = p.client(TOKEN_A);
    let env = setup(&mut c);
    let program = build(&mut c, &env, SOURCE);
    let kernel = c.id();
    let bad = c.post(
        Call::CreateKernel {
            id: kernel,
            program,
            name: "no_such_kernel".into(),
        },
        &[],
    );
    let uses = c.post(
        Call::SetKernelArg {
            kernel,
            index: 0,
            arg: KernelArg::Bytes(vec![0; 4]),
        },
        &[],
    );
    // Sync collects both reports: they were sent before its answer.
    assert_eq!(c.sync(), vec![(bad, -46), (uses, -46)]); // CL_INVALID_KERNEL_NAME
    // The session goes on, and the failed id can be released.
    c.post(Call::Release { id: kernel }, &[]);
    let buf = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, 64, Some(&[5; 64]));
    assert_eq!(read(&mut c, &env, buf, 64, vec![]), vec![5; 64]);
    assert_eq!(c.sync(), vec![]);
}

#[test]
fn a_wait_on_a_user_event_is_answered_after_the_set_that_follows_it() {
    let p = TestProxy::start(|_| {});
    let mut c = p.client(TOKEN_A);
    let env = setup(&mut c);
    let gate = c.id();
    c.post(
        Call::CreateUserEvent {
            id: gate,
            context: env.context,
        },
        &[],
    );
    let buf = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, 256, Some(&[1; 256]));
    c.post(
        Call::EnqueueWriteBuffer {
            queue: env.queue,
            buffer: buf,
            offset: 0,
            size: 256,
            sync: Sync {
                waits: vec![gate],
                event: 0,
            },
        },
        &[2; 256],
    );
    c.post(
        Call::SetEventCallback {
            event: gate,
            status: CL_COMPLETE,
            cookie: 1,
        },
        &[],
    );
    let read_seq = c.send(
        Call::EnqueueReadBuffer {
            queue: env.queue,
            buffer: buf,
            offset: 0,
            size: 256,
            sync: Sync {
                waits: vec![gate],
                event: 0,
            },
        },
        &[],
    );
    let wait_seq = c.send(Call::WaitForEvents { events: vec![gate] }, &[]);
    let finish_seq = c.send(Call::Finish { queue: env.queue }, &[]);
    // The session thread is not stuck behind those waits: a Sync still
    // gets through, and the waits stay unanswered.
    assert_eq!(c.sync(), vec![]);
    std::thread::sleep(Duration::from_millis(300));
    for seq in [read_seq, wait_seq, finish_seq] {
        assert!(
            !c.has_answer(seq),
            "call {seq} was answered before the event was set"
        );
    }
    assert_eq!(c.fired(1, Duration::ZERO), None);

    c.send(
        Call::SetUserEventStatus {
            event: gate,
            status: CL_COMPLETE,
        },
        &[],
    );
    assert_eq!(
        c.wait(wait_seq, LONG).unwrap().0,
        Answer::Status(CL_SUCCESS)
    );
    let (a, data) = c.wait(read_seq, LONG).unwrap();
    assert_eq!((a, data), (Answer::Data(CL_SUCCESS), vec![2; 256]));
    assert_eq!(
        c.wait(finish_seq, LONG).unwrap().0,
        Answer::Status(CL_SUCCESS)
    );
    assert_eq!(c.fired(1, LONG), Some(CL_COMPLETE));
    assert_eq!(c.sync(), vec![]);
}

#[test]
fn images_rects_fills_and_copies_round_trip_tightly_packed() {
    let p = TestProxy::start(|_| {});
    let mut c = p.client(TOKEN_A);
    let env = setup(&mut c);
    let (w, h) = (37u64, 11u64);
    let format = ImageFormat {
        order: 0x10B5,     // CL_RGBA
        data_type: 0x10D2, // CL_UNORM_INT8
    };
    let desc = ImageDesc {
        image_type: 0x10F1, // CL_MEM_OBJECT_IMAGE2D
        width: w,
        height: h,
        depth: 0,
        array_size: 0,
        row_pitch: 0,
        slice_pitch: 0,
        num_mip_levels: 0,
        num_samples: 0,
        buffer: 0,
    };
    let pixels: Vec<u8> = (0..w * h * 4).map(|i| (i * 7 % 251) as u8).collect();
    let img = c.id();
    c.post(
        Call::CreateImage {
            id: img,
            context: env.context,
            flags: CL_MEM_READ_WRITE,
            format,
            desc,
            props: vec![],
            init: true,
        },
        &pixels,
    );
    let region = [w, h, 1];
    let (a, back) = c.call(
        Call::EnqueueReadImage {
            queue: env.queue,
            image: img,
            origin: [0; 3],
            region,
            sync: Sync::default(),
        },
        &[],
    );
    assert_eq!(a, Answer::Data(CL_SUCCESS));
    assert!(back == pixels);

    // A sub-rectangle written, then the whole image copied to a buffer.
    let patch = vec![0xAB; 3 * 2 * 4];
    c.post(
        Call::EnqueueWriteImage {
            queue: env.queue,
            image: img,
            origin: [5, 4, 0],
            region: [3, 2, 1],
            sync: Sync::default(),
        },
        &patch,
    );
    let buf = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, w * h * 4, None);
    c.post(
        Call::EnqueueCopyImageToBuffer {
            queue: env.queue,
            src: img,
            dst: buf,
            src_origin: [0; 3],
            region,
            dst_offset: 0,
            sync: Sync::default(),
        },
        &[],
    );
    let mut want = pixels.clone();
    for row in 4..6 {
        for col in 5..8 {
            let at = ((row * w + col) * 4) as usize;
            want[at..at + 4].copy_from_slice(&[0xAB; 4]);
        }
    }
    assert!(read(&mut c, &env, buf, w * h * 4, vec![]) == want);

    // A rect of the buffer, read tightly packed: rows 1..3, bytes 8..20.
    let rect = Rect {
        origin: [8, 1, 0],
        region: [12, 2, 1],
        row_pitch: w * 4,
        slice_pitch: 0,
    };
    let (a, got) = c.call(
        Call::EnqueueReadBufferRect {
            queue: env.queue,
            buffer: buf,
            rect,
            sync: Sync::default(),
        },
        &[],
    );
    assert_eq!(a, Answer::Data(CL_SUCCESS));
    let row = (w * 4) as usize;
    let mut want_rect = want[row + 8..row + 20].to_vec();
    want_rect.extend_from_slice(&want[2 * row + 8..2 * row + 20]);
    assert_eq!(got, want_rect);

    // A fill and a buffer copy.
    let dst = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, 64, None);
    c.post(
        Call::EnqueueFillBuffer {
            queue: env.queue,
            buffer: dst,
            pattern: vec![1, 2, 3, 4],
            offset: 0,
            size: 64,
            sync: Sync::default(),
        },
        &[],
    );
    c.post(
        Call::EnqueueCopyBuffer {
            queue: env.queue,
            src: buf,
            dst,
            src_offset: 0,
            dst_offset: 32,
            size: 16,
            sync: Sync::default(),
        },
        &[],
    );
    let got = read(&mut c, &env, dst, 64, vec![]);
    assert_eq!(&got[..32], [1, 2, 3, 4].repeat(8).as_slice());
    assert_eq!(&got[32..48], &want[..16]);
    assert_eq!(&got[48..], [1, 2, 3, 4].repeat(4).as_slice());

    let (a, _) = c.call(
        Call::GetSupportedImageFormats {
            context: env.context,
            flags: CL_MEM_READ_WRITE,
            image_type: 0x10F1,
        },
        &[],
    );
    assert!(
        matches!(&a, Answer::Formats { status: 0, formats } if formats.contains(&format)),
        "{a:?}"
    );
    assert_eq!(c.sync(), vec![]);
}

#[test]
fn sessions_over_unix_sockets_work_the_same() {
    let p = TestProxy::start(|_| {});
    let mut c = Client::connect_unix(&p.unix(), TOKEN_B).unwrap();
    let env = setup(&mut c);
    let program = build(&mut c, &env, SOURCE);
    let kernel = c.id();
    c.post(
        Call::CreateKernel {
            id: kernel,
            program,
            name: "fill_pattern".into(),
        },
        &[],
    );
    let out = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, 1024 * 4, None);
    c.post(
        Call::SetKernelArg {
            kernel,
            index: 0,
            arg: KernelArg::Object(out),
        },
        &[],
    );
    c.post(
        Call::SetKernelArg {
            kernel,
            index: 1,
            arg: KernelArg::Bytes(99u32.to_ne_bytes().to_vec()),
        },
        &[],
    );
    c.post(
        Call::EnqueueNdRange {
            queue: env.queue,
            kernel,
            dims: 1,
            offset: None,
            global: [1024, 1, 1],
            local: None,
            sync: Sync::default(),
        },
        &[],
    );
    let want: Vec<u32> = (0..1024u32)
        .map(|g| g.wrapping_mul(2654435761) ^ 99)
        .collect();
    assert_eq!(read(&mut c, &env, out, 4096, vec![]), u32_bytes(&want));
    c.send(Call::Bye, &[]);
    assert_eq!(c.closed(LONG), None);
    assert!(p.wait_idle(LONG));
}

#[test]
fn commands_behind_a_failed_user_event_are_answered_with_an_error() {
    let p = TestProxy::start(|_| {});
    let mut c = p.client(TOKEN_A);
    let env = setup(&mut c);
    let gate = c.id();
    c.post(
        Call::CreateUserEvent {
            id: gate,
            context: env.context,
        },
        &[],
    );
    let buf = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, 64, Some(&[1; 64]));
    let written = c.id();
    c.post(
        Call::EnqueueWriteBuffer {
            queue: env.queue,
            buffer: buf,
            offset: 0,
            size: 64,
            sync: Sync {
                waits: vec![gate],
                event: written,
            },
        },
        &[2; 64],
    );
    c.post(
        Call::SetEventCallback {
            event: written,
            status: CL_COMPLETE,
            cookie: 9,
        },
        &[],
    );
    let read_seq = c.send(
        Call::EnqueueReadBuffer {
            queue: env.queue,
            buffer: buf,
            offset: 0,
            size: 64,
            sync: Sync {
                waits: vec![gate],
                event: 0,
            },
        },
        &[],
    );
    let wait_seq = c.send(
        Call::WaitForEvents {
            events: vec![written],
        },
        &[],
    );
    c.send(
        Call::SetUserEventStatus {
            event: gate,
            status: -1,
        },
        &[],
    );
    let (a, data) = c.wait(read_seq, LONG).expect("the read is answered");
    assert!(matches!(a, Answer::Data(s) if s < 0), "{a:?}");
    assert!(data.is_empty());
    let (a, _) = c.wait(wait_seq, LONG).expect("the wait is answered");
    assert_eq!(a, Answer::Status(-14)); // CL_EXEC_STATUS_ERROR_FOR_EVENTS_IN_WAIT_LIST
    assert!(matches!(c.fired(9, LONG), Some(s) if s < 0));
    assert_eq!(c.sync(), vec![]);
}

/// `DescribeKernel` answers the arguments and per-device work-group limits
/// the client checks posted calls against; a failed kernel's description
/// is its creation error. A zero local size (which PoCL divides by) fails
/// instead of killing the proxy.
#[test]
fn a_kernel_is_described_and_a_zero_local_size_is_refused() {
    let p = TestProxy::start(|_| {});
    let mut c = p.client(TOKEN_A);
    let env = setup(&mut c);
    // Argument information needs -cl-kernel-arg-info (crane adds it).
    let program = c.id();
    c.post(
        Call::CreateProgramWithSource {
            id: program,
            context: env.context,
            source: SOURCE.into(),
        },
        &[],
    );
    let (a, _) = c.call(
        Call::BuildProgram {
            program,
            devices: vec![env.device],
            options: "-cl-kernel-arg-info".into(),
        },
        &[],
    );
    assert_eq!(a, Answer::Status(0));
    let kernel = c.id();
    c.post(
        Call::CreateKernel {
            id: kernel,
            program,
            name: "fill_pattern".into(),
        },
        &[],
    );
    let (a, _) = c.call(
        Call::DescribeKernel {
            kernel,
            devices: vec![env.device],
        },
        &[],
    );
    let Answer::Kernel {
        status: 0,
        args,
        devices,
    } = a
    else {
        panic!("{a:?}");
    };
    assert_eq!(args.len(), 2);
    let ArgDesc {
        status,
        address,
        type_name,
        ..
    } = &args[0];
    assert_eq!((*status, *address), (0, 0x119B)); // CL_KERNEL_ARG_ADDRESS_GLOBAL
    assert_eq!(type_name, "uint*");
    assert_eq!(args[1].type_name, "uint");
    assert_eq!(args[1].address, 0x119E); // CL_KERNEL_ARG_ADDRESS_PRIVATE
    let [
        KernelDevice {
            device,
            status: 0,
            max_dims,
            max_work_group_size,
            work_group_size,
            ..
        },
    ] = devices[..]
    else {
        panic!("{devices:?}");
    };
    assert_eq!(device, env.device);
    assert!(max_dims >= 3 && max_work_group_size >= 1 && work_group_size >= 1);

    let buf = create_buffer(&mut c, &env, CL_MEM_READ_WRITE, 64, None);
    c.post(
        Call::SetKernelArg {
            kernel,
            index: 0,
            arg: KernelArg::Object(buf),
        },
        &[],
    );
    c.post(
        Call::SetKernelArg {
            kernel,
            index: 1,
            arg: KernelArg::Bytes(vec![0; 4]),
        },
        &[],
    );
    let zero = c.post(
        Call::EnqueueNdRange {
            queue: env.queue,
            kernel,
            dims: 1,
            offset: None,
            global: [16, 1, 1],
            local: Some([0, 1, 1]),
            sync: Sync::default(),
        },
        &[],
    );
    assert_eq!(c.sync(), vec![(zero, -54)]); // CL_INVALID_WORK_GROUP_SIZE

    let bad = c.id();
    c.post(
        Call::CreateKernel {
            id: bad,
            program,
            name: "no_such_kernel".into(),
        },
        &[],
    );
    let (a, _) = c.call(
        Call::DescribeKernel {
            kernel: bad,
            devices: vec![],
        },
        &[],
    );
    assert_eq!(
        a,
        Answer::Kernel {
            status: -46, // CL_INVALID_KERNEL_NAME
            args: vec![],
            devices: vec![]
        }
    );
    assert_eq!(c.sync().len(), 1);
}
