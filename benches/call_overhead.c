/* Per-call cost of the OpenCL calls crane sits on most: clSetKernelArg,
 * clEnqueueNDRangeKernel and a small clEnqueueWriteBuffer. Run it natively and
 * under libcrane_opencl.so (cargo xtask bench does both) and compare.
 * Prints `BENCH <call> <ns per call>` lines. Platform: $CRANE_TEST_PLATFORM. */
#define _POSIX_C_SOURCE 200809L
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
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
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static const char *src =
    "__kernel void k(__global float *a, __global const float *b, __global float *c,\n"
    "                __global const float *d, int n) {\n"
    "  int i = get_global_id(0); if (i < n) { a[i] = b[i] + d[i]; c[i] = a[i]; } }\n";

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 5;
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
    cl_int err;
    cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CHECK(err);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &err);
    CHECK(err);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CHECK(err);
    CHECK(clBuildProgram(prog, 1, &dev, "", NULL, NULL));
    cl_kernel k = clCreateKernel(prog, "k", &err);
    CHECK(err);
    cl_mem b[4];
    for (int i = 0; i < 4; i++) {
        b[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err);
        CHECK(err);
    }
    int n = 64;
    float host[16] = {0};
    size_t global = 64;

    double best_set = 1e30, best_launch = 1e30, best_write = 1e30;
    for (int r = 0; r < rounds; r++) {
        const int sets = 200000;
        double t0 = now();
        for (int i = 0; i < sets; i++) {
            CHECK(clSetKernelArg(k, 0, sizeof(cl_mem), &b[i & 1]));
            CHECK(clSetKernelArg(k, 1, sizeof(cl_mem), &b[1]));
            CHECK(clSetKernelArg(k, 2, sizeof(cl_mem), &b[2]));
            CHECK(clSetKernelArg(k, 3, sizeof(cl_mem), &b[3]));
            CHECK(clSetKernelArg(k, 4, sizeof(int), &n));
        }
        double t = (now() - t0) / (sets * 5.0);
        if (t < best_set) best_set = t;

        const int launches = 4000;
        double spent = 0;
        for (int i = 0; i < launches; i++) {
            double a = now();
            CHECK(clEnqueueNDRangeKernel(q, k, 1, NULL, &global, NULL, 0, NULL, NULL));
            spent += now() - a;
            if ((i & 255) == 255) CHECK(clFinish(q));
        }
        CHECK(clFinish(q));
        t = spent / launches;
        if (t < best_launch) best_launch = t;

        const int writes = 4000;
        spent = 0;
        for (int i = 0; i < writes; i++) {
            double a = now();
            CHECK(clEnqueueWriteBuffer(q, b[1], CL_FALSE, 0, sizeof host, host, 0, NULL, NULL));
            spent += now() - a;
            if ((i & 255) == 255) CHECK(clFinish(q));
        }
        CHECK(clFinish(q));
        t = spent / writes;
        if (t < best_write) best_write = t;
    }
    printf("BENCH clSetKernelArg %.1f\n", best_set);
    printf("BENCH clEnqueueNDRangeKernel %.1f\n", best_launch);
    printf("BENCH clEnqueueWriteBuffer(64B) %.1f\n", best_write);
    for (int i = 0; i < 4; i++) clReleaseMemObject(b[i]);
    clReleaseKernel(k);
    clReleaseProgram(prog);
    clReleaseCommandQueue(q);
    clReleaseContext(ctx);
    return 0;
}
