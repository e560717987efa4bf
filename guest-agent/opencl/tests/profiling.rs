//! Integration tier: an event's profiling times survive more than one
//! suspend/resume cycle. A program reads CL_PROFILING_COMMAND_START after one
//! cycle and CL_PROFILING_COMMAND_END after the next; END must not come before
//! START (the second suspend used to overwrite the saved times with zeros, as
//! a restored event is a user event on the vendor). The program waits on its
//! stdin between the steps, so the cycles land exactly there.

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::Duration;

use crane_control::{Request, call, socket_path};

mod common;
use common::{library, scratch};

const PROGRAM: &str = r#"
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#define CK(x) do { cl_int e_ = (x); if (e_) { fprintf(stderr, "%s: %d\n", #x, e_); exit(1); } } while (0)
static void step(void) { char l[8]; if (!fgets(l, sizeof l, stdin)) exit(1); }
int main(void) {
    cl_platform_id p; cl_device_id d; cl_int err;
    CK(clGetPlatformIDs(1, &p, NULL));
    CK(clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL));
    cl_context c = clCreateContext(NULL, 1, &d, NULL, NULL, &err); CK(err);
    cl_queue_properties qp[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
    cl_command_queue q = clCreateCommandQueueWithProperties(c, d, qp, &err); CK(err);
    const char *src = "kernel void k(global int *a) { a[get_global_id(0)] += 1; }";
    cl_program pr = clCreateProgramWithSource(c, 1, &src, NULL, &err); CK(err);
    CK(clBuildProgram(pr, 1, &d, NULL, NULL, NULL));
    cl_kernel k = clCreateKernel(pr, "k", &err); CK(err);
    cl_mem b = clCreateBuffer(c, CL_MEM_READ_WRITE, 4096 * 4, NULL, &err); CK(err);
    CK(clSetKernelArg(k, 0, sizeof b, &b));
    size_t g = 4096;
    cl_event e;
    CK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, &e));
    CK(clWaitForEvents(1, &e));
    cl_ulong ts, te;
    printf("ready\n"); fflush(stdout); step();
    CK(clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_START, sizeof ts, &ts, NULL));
    printf("start %llu\n", (unsigned long long)ts); fflush(stdout); step();
    CK(clGetEventProfilingInfo(e, CL_PROFILING_COMMAND_END, sizeof te, &te, NULL));
    printf("end %llu\n", (unsigned long long)te);
    return 0;
}
"#;

#[test]
fn profiling_times_survive_two_cycles() {
    let scratch = scratch("profiling");
    let dir = scratch.path();
    let src = dir.join("prof.c");
    let exe = dir.join("prof");
    std::fs::write(&src, PROGRAM).unwrap();
    let cc = Command::new("gcc")
        .args(["-std=c11", "-O2", "-o"])
        .arg(&exe)
        .arg(&src)
        .arg("-lOpenCL")
        .status()
        .expect("run gcc");
    assert!(cc.success(), "compiling the profiling probe failed");

    let run_dir = dir.join("run");
    let mut child = Command::new(&exe)
        .env("LD_PRELOAD", library())
        .env("CRANE_RUN_DIR", &run_dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let sock = socket_path(&run_dir, child.id());
    let mut stdin = child.stdin.take().unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut next = || lines.next().expect("the probe ended early").unwrap();
    let cycle = || {
        for req in [
            Request::Suspend {
                deadline_ms: 20_000,
            },
            Request::RESUME,
        ] {
            let r = call(&sock, &req, Duration::from_secs(60)).unwrap();
            assert!(r.ok, "{req:?} failed: {:?}", r.error);
        }
    };

    assert_eq!(next(), "ready");
    cycle();
    stdin.write_all(b"\n").unwrap();
    let start: u64 = next().strip_prefix("start ").unwrap().parse().unwrap();
    cycle();
    stdin.write_all(b"\n").unwrap();
    let end: u64 = next().strip_prefix("end ").unwrap().parse().unwrap();
    assert!(child.wait().unwrap().success());
    assert!(start > 0, "no START time");
    assert!(end >= start, "END {end} before START {start}");
}
