//! rustpipe: the Rust member of the crane OpenCL test corpus.
//!
//! A matrix-multiply / reduction pipeline driven through raw `opencl-sys`
//! calls (linked against libOpenCL.so.1).  Each iteration: an asynchronous
//! (non-blocking) clEnqueueWriteBuffer of a band of rows of A whose event
//! gates the matmul kernel; C = A * B (wrapping u32) with B and C swapped
//! through clSetKernelArg every iteration; a row reduction with a `__local`
//! argument; a blocking read of the row sums; and every 16 iterations a
//! blocking read of the whole product.  A host model checks every read.
//! Output contract as for the C programs: `RESULT rustpipe <16 hex>` last,
//! `ERROR <call> <code>` on stderr and exit 1 for an OpenCL error.
//!
//!   rustpipe [--iters N]

#![allow(clippy::missing_safety_doc)]

use opencl_sys::*;
use std::ffi::CString;
use std::process::exit;
use std::ptr::{null, null_mut};
use std::time::Instant;

const SRC: &str = r#"
__kernel void matmul(__global const uint *a, __global const uint *b, __global uint *c, uint m, uint salt)
{
    uint j = get_global_id(0), i = get_global_id(1);
    uint acc = 0u;
    for (uint k = 0u; k < m; k++)
        acc += a[i * m + k] * b[k * m + j];
    c[i * m + j] = acc + ((i * m + j) ^ salt);
}
__kernel void rowsum(__global const uint *c, __global uint *rows, __local uint *scratch, uint m)
{
    uint row = get_group_id(0), lid = get_local_id(0), ls = get_local_size(0);
    uint acc = 0u;
    for (uint k = lid; k < m; k += ls)
        acc += c[row * m + k] * (k + 1u);
    scratch[lid] = acc;
    barrier(CLK_LOCAL_MEM_FENCE);
    for (uint s = ls / 2u; s > 0u; s >>= 1) {
        if (lid < s) scratch[lid] += scratch[lid + s];
        barrier(CLK_LOCAL_MEM_FENCE);
    }
    if (lid == 0u) rows[row] = scratch[0];
}
"#;

const PROG: &str = "rustpipe";
const M: usize = 64;
const BAND: usize = 8;

fn die(call: &str, code: cl_int) -> ! {
    eprintln!("ERROR {call} {code}");
    exit(1)
}

fn fail(what: &str) -> ! {
    eprintln!("FAIL {PROG} {what}");
    exit(1)
}

fn ck(code: cl_int, call: &str) {
    if code != CL_SUCCESS {
        die(call, code);
    }
}

struct Fnv(u64);

impl Fnv {
    fn bytes(&mut self, b: &[u8]) {
        for &x in b {
            self.0 ^= u64::from(x);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn words(&mut self, w: &[u32]) {
        for &x in w {
            self.bytes(&x.to_le_bytes());
        }
    }
}

fn xorshift(s: &mut u32) -> u32 {
    let mut x = *s;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *s = x;
    x
}

fn parse_iters() -> usize {
    let args: Vec<String> = std::env::args().collect();
    let mut iters = 6000usize;
    let mut i = 1;
    while i < args.len() {
        if args[i] == "--iters" && i + 1 < args.len() {
            iters = args[i + 1].parse().unwrap_or(1);
            i += 2;
        } else if let Some(v) = args[i].strip_prefix("--iters=") {
            iters = v.parse().unwrap_or(1);
            i += 1;
        } else {
            eprintln!("usage: {} [--iters N]", args[0]);
            exit(2);
        }
    }
    iters.max(1)
}

fn device_string(dev: cl_device_id, param: cl_device_info) -> String {
    let mut buf = vec![0u8; 512];
    let mut n: usize = 0;
    // SAFETY: buf has buf.len() bytes; the call writes at most that many.
    ck(
        unsafe { clGetDeviceInfo(dev, param, buf.len() - 1, buf.as_mut_ptr().cast(), &mut n) },
        "clGetDeviceInfo",
    );
    buf.truncate(n.saturating_sub(1).min(buf.len()));
    String::from_utf8_lossy(&buf).trim_end_matches('\0').to_string()
}

fn pick_device() -> (cl_platform_id, cl_device_id) {
    let mut np: cl_uint = 0;
    // SAFETY: count query with a null list.
    ck(unsafe { clGetPlatformIDs(0, null_mut(), &mut np) }, "clGetPlatformIDs");
    if np == 0 {
        die("clGetPlatformIDs", CL_INVALID_PLATFORM);
    }
    let mut ps = vec![null_mut(); np as usize];
    // SAFETY: ps has np entries.
    ck(unsafe { clGetPlatformIDs(np, ps.as_mut_ptr(), null_mut()) }, "clGetPlatformIDs");
    let idx: usize = std::env::var("CRANE_TEST_PLATFORM").ok().and_then(|v| v.parse().ok()).unwrap_or(0);
    if idx >= ps.len() {
        die("clGetPlatformIDs", CL_INVALID_PLATFORM);
    }
    let plat = ps[idx];
    let mut dev: cl_device_id = null_mut();
    // SAFETY: room for one device id.
    ck(
        unsafe { clGetDeviceIDs(plat, CL_DEVICE_TYPE_ALL, 1, &mut dev, null_mut()) },
        "clGetDeviceIDs",
    );
    println!(
        "{PROG}: platform {idx} device \"{}\" ({})",
        device_string(dev, CL_DEVICE_NAME),
        device_string(dev, CL_DEVICE_VERSION)
    );
    (plat, dev)
}

fn set_arg<T>(k: cl_kernel, idx: cl_uint, v: &T) {
    // SAFETY: v points to a live value of size_of::<T>() bytes.
    ck(
        unsafe { clSetKernelArg(k, idx, std::mem::size_of::<T>(), (v as *const T).cast()) },
        "clSetKernelArg",
    );
}

fn host_matmul(a: &[u32], b: &[u32], c: &mut [u32], salt: u32) {
    for i in 0..M {
        for j in 0..M {
            let mut acc = 0u32;
            for k in 0..M {
                acc = acc.wrapping_add(a[i * M + k].wrapping_mul(b[k * M + j]));
            }
            c[i * M + j] = acc.wrapping_add(((i * M + j) as u32) ^ salt);
        }
    }
}

fn host_rowsum(c: &[u32], rows: &mut [u32]) {
    for (r, out) in rows.iter_mut().enumerate() {
        let mut acc = 0u32;
        for k in 0..M {
            acc = acc.wrapping_add(c[r * M + k].wrapping_mul(k as u32 + 1));
        }
        *out = acc;
    }
}

#[allow(deprecated)]
fn main() {
    let iters = parse_iters();
    let (plat, dev) = pick_device();
    let t0 = Instant::now();
    let mut hash = Fnv(0xcbf2_9ce4_8422_2325);
    let mut err: cl_int = 0;

    // SAFETY (whole block): plain OpenCL C API calls; every pointer handed over
    // refers to a live local or heap buffer of the stated size, and host buffers
    // used by non-blocking commands stay untouched until a later blocking call
    // on the same in-order queue has returned.
    unsafe {
        let props: [cl_context_properties; 3] = [CL_CONTEXT_PLATFORM as cl_context_properties, plat as cl_context_properties, 0];
        let ctx = clCreateContext(props.as_ptr(), 1, &dev, None, null_mut(), &mut err);
        ck(err, "clCreateContext");
        let q = clCreateCommandQueue(ctx, dev, 0, &mut err);
        ck(err, "clCreateCommandQueue");

        let src = CString::new(SRC).unwrap_or_default();
        let srcp = src.as_ptr();
        let prog = clCreateProgramWithSource(ctx, 1, &srcp, null(), &mut err);
        ck(err, "clCreateProgramWithSource");
        let opts = CString::new("-cl-std=CL1.2").unwrap_or_default();
        let berr = clBuildProgram(prog, 1, &dev, opts.as_ptr(), None, null_mut());
        if berr != CL_SUCCESS {
            let mut log = vec![0u8; 65536];
            let mut n = 0usize;
            clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, log.len(), log.as_mut_ptr().cast(), &mut n);
            eprintln!("build log:\n{}", String::from_utf8_lossy(&log[..n.min(log.len())]));
            die("clBuildProgram", berr);
        }
        let kname = CString::new("matmul").unwrap_or_default();
        let kmm = clCreateKernel(prog, kname.as_ptr(), &mut err);
        ck(err, "clCreateKernel");
        let kname = CString::new("rowsum").unwrap_or_default();
        let krs = clCreateKernel(prog, kname.as_ptr(), &mut err);
        ck(err, "clCreateKernel");

        // work-group size for the reduction: a power of two <= min(64, limits)
        let mut kwg: usize = 0;
        ck(
            clGetKernelWorkGroupInfo(krs, dev, CL_KERNEL_WORK_GROUP_SIZE, std::mem::size_of::<usize>(), (&mut kwg as *mut usize).cast(), null_mut()),
            "clGetKernelWorkGroupInfo",
        );
        let mut ls = 64usize;
        while ls > 1 && ls > kwg {
            ls /= 2;
        }

        let bytes = M * M * 4;
        let mut seed = 0x7a3e_11u32;
        let mut ha: Vec<u32> = (0..M * M).map(|_| xorshift(&mut seed)).collect();
        let hb: Vec<u32> = (0..M * M).map(|_| xorshift(&mut seed)).collect();
        let mut hbc = [hb.clone(), vec![0u32; M * M]];
        let da = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, bytes, ha.as_mut_ptr().cast(), &mut err);
        ck(err, "clCreateBuffer");
        let mut dbc = [null_mut(); 2];
        for (i, d) in dbc.iter_mut().enumerate() {
            *d = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bytes, null_mut(), &mut err);
            ck(err, "clCreateBuffer");
            if i == 0 {
                ck(clEnqueueWriteBuffer(q, *d, CL_TRUE, 0, bytes, hb.as_ptr().cast(), 0, null(), null_mut()), "clEnqueueWriteBuffer");
            }
        }
        let drows = clCreateBuffer(ctx, CL_MEM_WRITE_ONLY, M * 4, null_mut(), &mut err);
        ck(err, "clCreateBuffer");

        let mut band = vec![0u32; BAND * M];
        let mut rows = vec![0u32; M];
        let mut mrows = vec![0u32; M];
        let mut full = vec![0u32; M * M];
        let mut cur = 0usize;
        let m = M as cl_uint;

        for it in 0..iters {
            // 1. asynchronous write of a band of rows of A
            let r0 = (it * 3) % (M - BAND + 1);
            for (i, v) in band.iter_mut().enumerate() {
                *v = (it as u32).wrapping_mul(0x9e37_79b9).wrapping_add(i as u32 * 2 + 1);
            }
            ha[r0 * M..(r0 + BAND) * M].copy_from_slice(&band);
            let mut ew: cl_event = null_mut();
            ck(
                clEnqueueWriteBuffer(q, da, CL_FALSE, r0 * M * 4, BAND * M * 4, band.as_ptr().cast(), 0, null(), &mut ew),
                "clEnqueueWriteBuffer",
            );

            // 2. C = A * B, gated on the write's event; B/C swapped through the arguments
            let salt = (it as u32).wrapping_mul(0x85eb_ca6b);
            set_arg(kmm, 0, &da);
            set_arg(kmm, 1, &dbc[cur]);
            set_arg(kmm, 2, &dbc[1 - cur]);
            set_arg(kmm, 3, &m);
            set_arg(kmm, 4, &salt);
            let g2 = [M, M];
            ck(clEnqueueNDRangeKernel(q, kmm, 2, null(), g2.as_ptr(), null(), 1, &ew, null_mut()), "clEnqueueNDRangeKernel");
            ck(clReleaseEvent(ew), "clReleaseEvent");

            // 3. row sums with a __local scratch argument
            set_arg(krs, 0, &dbc[1 - cur]);
            set_arg(krs, 1, &drows);
            ck(clSetKernelArg(krs, 2, ls * 4, null()), "clSetKernelArg");
            set_arg(krs, 3, &m);
            let g1 = M * ls;
            ck(clEnqueueNDRangeKernel(q, krs, 1, null(), &g1, &ls, 0, null(), null_mut()), "clEnqueueNDRangeKernel");

            // 4. blocking read of the row sums
            ck(clEnqueueReadBuffer(q, drows, CL_TRUE, 0, M * 4, rows.as_mut_ptr().cast(), 0, null(), null_mut()), "clEnqueueReadBuffer");
            hash.words(&rows);

            let (src, dst) = if cur == 0 {
                let (x, y) = hbc.split_at_mut(1);
                (&x[0], &mut y[0])
            } else {
                let (x, y) = hbc.split_at_mut(1);
                (&y[0], &mut x[0])
            };
            host_matmul(&ha, src, dst, salt);
            host_rowsum(dst, &mut mrows);
            if rows != mrows {
                fail("row sums differ from host model");
            }
            if it % 16 == 15 || it + 1 == iters {
                ck(clEnqueueReadBuffer(q, dbc[1 - cur], CL_TRUE, 0, bytes, full.as_mut_ptr().cast(), 0, null(), null_mut()), "clEnqueueReadBuffer");
                hash.words(&full);
                if full != *dst {
                    fail("product differs from host model");
                }
            }
            cur = 1 - cur;
            if it % 1000 == 999 {
                println!("{PROG}: iteration {}", it + 1);
            }
        }
        ck(clFinish(q), "clFinish");
        println!("{PROG}: host model matches (reduction work-group size {ls})");

        for mem in [da, dbc[0], dbc[1], drows] {
            ck(clReleaseMemObject(mem), "clReleaseMemObject");
        }
        ck(clReleaseKernel(kmm), "clReleaseKernel");
        ck(clReleaseKernel(krs), "clReleaseKernel");
        ck(clReleaseProgram(prog), "clReleaseProgram");
        ck(clReleaseCommandQueue(q), "clReleaseCommandQueue");
        ck(clReleaseContext(ctx), "clReleaseContext");
    }
    eprintln!("{PROG}: {iters} iterations in {:.3} s", t0.elapsed().as_secs_f64());
    println!("RESULT {PROG} {:016x}", hash.0);
}
