/* An application for measuring stoppage: it holds --mib MiB of device memory
 * in buffers of --buffer-mib MiB, fills them all by kernel, then runs a loop
 * of short kernels with a blocking read each (an iteration every ~0.1 ms on a
 * GPU) while rewriting --rewrite percent of its memory per second by kernel.
 * The longest gap between two iterations is what a user sees of a suspend or
 * a move. At the end every byte of every buffer is checked against the
 * generation it was last written with.
 *
 *   stoppage [--mib 256] [--buffer-mib 32] [--rewrite 10] [--platform NAME]
 *
 * Prints READY once filled. SIGUSR2 makes it print "GAP <ms>" (the longest
 * gap since the last SIGUSR2) and start a new window; SIGUSR1 (or SIGTERM)
 * ends the loop: it checks its memory and prints "ITERS <n>" and "OK" (exit
 * 0) or what differs (exit 1). `cargo xtask bench-stoppage` drives it.
 */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(x)                                                                        \
    do {                                                                                \
        cl_int e_ = (x);                                                                \
        if (e_ != CL_SUCCESS) {                                                         \
            fprintf(stderr, "stoppage: %s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, e_); \
            exit(2);                                                                    \
        }                                                                               \
    } while (0)

static const char *SRC =
    "__kernel void fill(__global uint *b, uint gen, uint salt) {\n"
    "    uint j = (uint)get_global_id(0);\n"
    "    b[j] = gen * 2654435761u + j * 40503u + salt;\n"
    "}\n"
    "__kernel void tick(__global uint *t) { t[0] += 1u; }\n";

static volatile sig_atomic_t stop, report;
static void on_stop(int s) { (void)s; stop = 1; }
static void on_report(int s) { (void)s; report = 1; }

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static cl_uint expected(cl_uint gen, cl_uint j, cl_uint salt) {
    return gen * 2654435761u + j * 40503u + salt;
}

int main(int argc, char **argv) {
    double mib = 256, buffer_mib = 32, rewrite = 10;
    const char *want = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--mib")) mib = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--buffer-mib")) buffer_mib = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--rewrite")) rewrite = atof(argv[i + 1]);
        else if (!strcmp(argv[i], "--platform")) want = argv[i + 1];
        else {
            fprintf(stderr, "usage: stoppage [--mib N] [--buffer-mib N] [--rewrite PERCENT] [--platform NAME]\n");
            return 2;
        }
    }
    size_t total = (size_t)(mib * 1048576.0);
    size_t each = (size_t)(buffer_mib * 1048576.0);
    if (each > total) each = total;
    each = each / 4 * 4;
    size_t n = (total + each - 1) / each;
    signal(SIGUSR1, on_stop);
    signal(SIGTERM, on_stop);
    signal(SIGUSR2, on_report);

    cl_platform_id pl[8];
    cl_uint np = 0;
    CHECK(clGetPlatformIDs(8, pl, &np));
    cl_uint pi = 0;
    for (cl_uint i = 0; i < np && want; i++) {
        char name[256] = "";
        clGetPlatformInfo(pl[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
        if (strstr(name, want)) pi = i;
    }
    cl_device_id dev;
    CHECK(clGetDeviceIDs(pl[pi], CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
    cl_int e;
    cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &e);
    CHECK(e);
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &e);
    CHECK(e);
    cl_program prog = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &e);
    CHECK(e);
    CHECK(clBuildProgram(prog, 1, &dev, "", NULL, NULL));
    cl_kernel fill = clCreateKernel(prog, "fill", &e);
    CHECK(e);
    cl_kernel tick = clCreateKernel(prog, "tick", &e);
    CHECK(e);
    cl_mem *bufs = calloc(n, sizeof *bufs);
    cl_uint *gen = calloc(n, sizeof *gen);
    for (size_t i = 0; i < n; i++) {
        bufs[i] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, each, NULL, &e);
        CHECK(e);
    }
    cl_uint zero = 0;
    cl_mem counter = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, 4, &zero, &e);
    CHECK(e);
    CHECK(clSetKernelArg(tick, 0, sizeof counter, &counter));
    size_t items = each / 4;
    for (size_t i = 0; i < n; i++) {
        cl_uint salt = (cl_uint)i * 977u;
        gen[i] = 1;
        CHECK(clSetKernelArg(fill, 0, sizeof bufs[i], &bufs[i]));
        CHECK(clSetKernelArg(fill, 1, sizeof gen[i], &gen[i]));
        CHECK(clSetKernelArg(fill, 2, sizeof salt, &salt));
        CHECK(clEnqueueNDRangeKernel(q, fill, 1, NULL, &items, NULL, 0, NULL, NULL));
    }
    CHECK(clFinish(q));
    printf("READY %zu buffers of %zu bytes\n", n, each);
    fflush(stdout);

    double last = now(), budget = 0, gap = 0, prev = last;
    unsigned long rewrites = 0;
    size_t next = 0;
    unsigned long iters = 0;
    cl_uint ticks = 0;
    while (!stop) {
        double t = now();
        budget += rewrite / 100.0 * (double)total * (t - prev);
        prev = t;
        if (budget > (double)total) budget = (double)total;
        while (budget >= (double)each) {
            cl_uint salt = (cl_uint)next * 977u;
            gen[next]++;
            CHECK(clSetKernelArg(fill, 0, sizeof bufs[next], &bufs[next]));
            CHECK(clSetKernelArg(fill, 1, sizeof gen[next], &gen[next]));
            CHECK(clSetKernelArg(fill, 2, sizeof salt, &salt));
            CHECK(clEnqueueNDRangeKernel(q, fill, 1, NULL, &items, NULL, 0, NULL, NULL));
            next = (next + 1) % n;
            budget -= (double)each;
            rewrites++;
        }
        size_t one = 1;
        CHECK(clEnqueueNDRangeKernel(q, tick, 1, NULL, &one, NULL, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(q, counter, CL_TRUE, 0, 4, &ticks, 0, NULL, NULL));
        iters++;
        if (ticks != (cl_uint)iters) {
            fprintf(stderr, "stoppage: the counter is %u after %lu iterations\n", ticks, iters);
            return 1;
        }
        double end = now();
        if (end - last > gap) gap = end - last;
        last = end;
        if (report) {
            report = 0;
            printf("GAP %.3f\n", gap * 1e3);
            fflush(stdout);
            gap = 0;
        }
    }
    cl_uint *h = malloc(each);
    for (size_t i = 0; i < n; i++) {
        CHECK(clEnqueueReadBuffer(q, bufs[i], CL_TRUE, 0, each, h, 0, NULL, NULL));
        cl_uint salt = (cl_uint)i * 977u;
        for (size_t j = 0; j < items; j++) {
            if (h[j] != expected(gen[i], (cl_uint)j, salt)) {
                fprintf(stderr, "stoppage: buffer %zu word %zu is %u, expected %u (generation %u)\n", i, j,
                        h[j], expected(gen[i], (cl_uint)j, salt), gen[i]);
                return 1;
            }
        }
    }
    free(h);
    printf("ITERS %lu\nREWRITES %lu\nOK\n", iters, rewrites);
    for (size_t i = 0; i < n; i++) CHECK(clReleaseMemObject(bufs[i]));
    CHECK(clReleaseMemObject(counter));
    CHECK(clReleaseKernel(fill));
    CHECK(clReleaseKernel(tick));
    CHECK(clReleaseProgram(prog));
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    return 0;
}
