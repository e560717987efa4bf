/* What an application sees of remoting. Run natively, under crane locally,
 * and under crane on crane-proxy (cargo xtask bench-remote does all three).
 * Prints `BENCH <name> <value> <unit>` lines:
 *   frame_rate  frames/s of a video-encoder-like loop: per frame a 4 KiB
 *               upload, 8 small kernels with 3 arguments each, and a 4 KiB
 *               blocking download;
 *   large_rate  iterations/s of a large-buffer loop: 16 MiB up, one kernel,
 *               16 MiB down;
 *   rtt_finish  microseconds per clFinish on an idle queue (one round trip
 *               when remote);
 *   bw_write / bw_read  MB/s of blocking 64 MiB transfers.
 * Platform: $CRANE_TEST_PLATFORM (default 0). */
#define _POSIX_C_SOURCE 200809L
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(x)                                                               \
    do {                                                                       \
        cl_int e_ = (x);                                                       \
        if (e_ != CL_SUCCESS) {                                                \
            fprintf(stderr, "ERROR %s %d\n", #x, e_);                          \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static const char *src =
    "__kernel void advance(__global uint *a, __global const uint *b, uint k) {\n"
    "  size_t i = get_global_id(0); a[i] = a[i] * 1664525u + b[i] + k; }\n";

int main(int argc, char **argv)
{
    double secs = argc > 1 ? atof(argv[1]) : 2.0;
    cl_uint np = 0;
    cl_platform_id ps[8];
    CHECK(clGetPlatformIDs(8, ps, &np));
    const char *pe = getenv("CRANE_TEST_PLATFORM");
    cl_uint pi = pe ? (cl_uint)atoi(pe) : 0;
    if (pi >= np) {
        fprintf(stderr, "no platform %u\n", pi);
        return 1;
    }
    cl_device_id dev;
    CHECK(clGetDeviceIDs(ps[pi], CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
    char dname[256] = "";
    CHECK(clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof dname - 1, dname, NULL));
    printf("DEVICE %s\n", dname);
    cl_int err;
    cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CHECK(err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    CHECK(err);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CHECK(err);
    CHECK(clBuildProgram(prog, 1, &dev, "", NULL, NULL));
    cl_kernel k = clCreateKernel(prog, "advance", &err);
    CHECK(err);

    /* Frame loop. */
    enum { FRAME = 4096, NK = 8 };
    unsigned in[FRAME / 4], out[FRAME / 4];
    cl_mem a = clCreateBuffer(ctx, CL_MEM_READ_WRITE, FRAME, NULL, &err);
    CHECK(err);
    cl_mem b = clCreateBuffer(ctx, CL_MEM_READ_ONLY, FRAME, NULL, &err);
    CHECK(err);
    CHECK(clEnqueueFillBuffer(q, a, &(cl_uint){0}, 4, 0, FRAME, 0, NULL, NULL));
    size_t gws = FRAME / 4;
    long frames = 0;
    unsigned check = 0;
    double t0 = now();
    while (now() - t0 < secs) {
        for (int i = 0; i < FRAME / 4; i++)
            in[i] = (unsigned)(frames * 31 + i);
        CHECK(clEnqueueWriteBuffer(q, b, CL_FALSE, 0, FRAME, in, 0, NULL, NULL));
        for (cl_uint j = 0; j < NK; j++) {
            CHECK(clSetKernelArg(k, 0, sizeof a, &a));
            CHECK(clSetKernelArg(k, 1, sizeof b, &b));
            CHECK(clSetKernelArg(k, 2, sizeof j, &j));
            CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &gws, NULL, 0, NULL, NULL));
        }
        CHECK(clEnqueueReadBuffer(q, a, CL_TRUE, 0, FRAME, out, 0, NULL, NULL));
        check ^= out[frames % (FRAME / 4)];
        frames++;
    }
    printf("BENCH frame_rate %.1f frames/s\n", frames / (now() - t0));

    /* Large-buffer loop. */
    size_t big = 16u << 20;
    unsigned *hb = malloc(big), *hr = malloc(big);
    memset(hb, 1, big);
    cl_mem la = clCreateBuffer(ctx, CL_MEM_READ_WRITE, big, NULL, &err);
    CHECK(err);
    cl_mem lb = clCreateBuffer(ctx, CL_MEM_READ_ONLY, big, NULL, &err);
    CHECK(err);
    size_t lg = big / 4;
    long iters = 0;
    t0 = now();
    while (now() - t0 < secs) {
        CHECK(clEnqueueWriteBuffer(q, lb, CL_TRUE, 0, big, hb, 0, NULL, NULL));
        cl_uint j = (cl_uint)iters;
        CHECK(clSetKernelArg(k, 0, sizeof la, &la));
        CHECK(clSetKernelArg(k, 1, sizeof lb, &lb));
        CHECK(clSetKernelArg(k, 2, sizeof j, &j));
        CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &lg, NULL, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(q, la, CL_TRUE, 0, big, hr, 0, NULL, NULL));
        check ^= hr[iters % lg];
        iters++;
    }
    printf("BENCH large_rate %.2f iterations/s\n", iters / (now() - t0));

    /* Round trip of one blocking call. */
    CHECK(clFinish(q));
    long n = 0;
    t0 = now();
    while (now() - t0 < secs / 2) {
        CHECK(clFinish(q));
        n++;
    }
    printf("BENCH rtt_finish %.2f us\n", (now() - t0) * 1e6 / n);

    /* Bulk bandwidth. */
    size_t bw = 64u << 20;
    unsigned *hw = malloc(bw);
    memset(hw, 7, bw);
    cl_mem bm = clCreateBuffer(ctx, CL_MEM_READ_WRITE, bw, NULL, &err);
    CHECK(err);
    CHECK(clEnqueueWriteBuffer(q, bm, CL_TRUE, 0, bw, hw, 0, NULL, NULL));
    int reps = 0;
    t0 = now();
    while (now() - t0 < secs / 2 || reps < 2) {
        CHECK(clEnqueueWriteBuffer(q, bm, CL_TRUE, 0, bw, hw, 0, NULL, NULL));
        CHECK(clFinish(q));
        reps++;
    }
    printf("BENCH bw_write %.0f MB/s\n", reps * (bw / 1e6) / (now() - t0));
    reps = 0;
    t0 = now();
    while (now() - t0 < secs / 2 || reps < 2) {
        CHECK(clEnqueueReadBuffer(q, bm, CL_TRUE, 0, bw, hw, 0, NULL, NULL));
        reps++;
    }
    printf("BENCH bw_read %.0f MB/s\n", reps * (bw / 1e6) / (now() - t0));
    printf("CHECK %u\n", check);

    free(hb);
    free(hr);
    free(hw);
    clReleaseMemObject(a);
    clReleaseMemObject(b);
    clReleaseMemObject(la);
    clReleaseMemObject(lb);
    clReleaseMemObject(bm);
    clReleaseKernel(k);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
