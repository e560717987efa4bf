/* Shared helpers for the crane OpenCL test corpus.
 *
 * Every program:
 *   - picks platform $CRANE_TEST_PLATFORM (index, default 0) and its first
 *     device of any type;
 *   - takes `--iters N`;
 *   - hashes every result byte it reads back with 64-bit FNV-1a and ends with
 *     exactly one line `RESULT <program> <16 hex digits>` on stdout, exit 0;
 *   - on any OpenCL error prints `ERROR <call> <code>` to stderr, exit 1;
 *   - on a self-check failure prints `FAIL <program> <what>` to stderr, exit 1;
 *   - when the device lacks a feature the whole program needs, prints
 *     `SKIP <program> <reason>` and still ends with a RESULT line (hash of the
 *     bytes read so far), exit 0.
 */
#ifndef CRANE_TESTAPP_COMMON_H
#define CRANE_TESTAPP_COMMON_H

#define _POSIX_C_SOURCE 200809L
#define CL_TARGET_OPENCL_VERSION 300
/* clCreateCommandQueue / clCreateSampler are used on purpose (old apps do). */
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char *g_prog = "?";
static uint64_t g_hash = 0xcbf29ce484222325ULL;

static inline void hash_bytes(const void *p, size_t n)
{
    const unsigned char *b = (const unsigned char *)p;
    uint64_t h = g_hash;
    for (size_t i = 0; i < n; i++) {
        h ^= b[i];
        h *= 0x100000001b3ULL;
    }
    g_hash = h;
}

static inline void hash_u64(uint64_t v)
{
    unsigned char b[8];
    for (int i = 0; i < 8; i++)
        b[i] = (unsigned char)(v >> (8 * i));
    hash_bytes(b, 8);
}

static inline void print_result(void)
{
    printf("RESULT %s %016llx\n", g_prog, (unsigned long long)g_hash);
    fflush(stdout);
}

static inline void die_cl(const char *call, cl_int code)
{
    fflush(stdout);
    fprintf(stderr, "ERROR %s %d\n", call, (int)code);
    exit(1);
}

/* `expr` is the stringified call; keep only the function name. */
static inline void die_expr(const char *expr, cl_int code)
{
    char name[96];
    size_t i = 0;
    while (expr[i] && (isalnum((unsigned char)expr[i]) || expr[i] == '_') && i + 1 < sizeof name) {
        name[i] = expr[i];
        i++;
    }
    name[i] = 0;
    die_cl(name, code);
}

/* Check a call returning cl_int. */
#define CK(expr)                                                                                   \
    do {                                                                                           \
        cl_int ck_e_ = (expr);                                                                     \
        if (ck_e_ != CL_SUCCESS)                                                                   \
            die_expr(#expr, ck_e_);                                                                \
    } while (0)

/* Check an errcode_ret filled by a create call. */
#define CKE(err, name)                                                                             \
    do {                                                                                           \
        if ((err) != CL_SUCCESS)                                                                   \
            die_cl((name), (err));                                                                 \
    } while (0)

static inline void fail(const char *what)
{
    fflush(stdout);
    fprintf(stderr, "FAIL %s %s\n", g_prog, what);
    exit(1);
}

static inline void skip_all(const char *reason)
{
    printf("SKIP %s %s\n", g_prog, reason);
    print_result();
    exit(0);
}

static inline void *xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        fail("out of host memory");
    return p;
}

static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

/* TESTAPP_HOLD=FILE: at iteration `it` == iters / 2, create FILE.held and
 * wait (sleeping, no OpenCL calls) until FILE exists, so that a test's
 * requests find the program still running, halfway, however fast the
 * machine. The result is that of a run without the hold. (pingpong has its
 * own hold, which keeps reading the device meanwhile.) */
static inline void hold_if_asked(const char *prog, int it, int iters)
{
    const char *hold = getenv("TESTAPP_HOLD");
    if (!hold || it != iters / 2)
        return;
    char held[4096];
    snprintf(held, sizeof held, "%s.held", hold);
    FILE *f = fopen(held, "w");
    if (f)
        fclose(f);
    fprintf(stderr, "%s: holding at iteration %d until %s exists\n", prog, it, hold);
    while (access(hold, F_OK) != 0)
        sleep_us(20000);
    fprintf(stderr, "%s: released\n", prog);
}

static inline int parse_iters(int argc, char **argv, int def)
{
    int iters = def;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            iters = atoi(argv[++i]);
        } else if (strncmp(argv[i], "--iters=", 8) == 0) {
            iters = atoi(argv[i] + 8);
        } else {
            fprintf(stderr, "usage: %s [--iters N]\n", argv[0]);
            exit(2);
        }
    }
    if (iters < 1)
        iters = 1;
    return iters;
}

/* Deterministic PRNG (xorshift32). */
static inline uint32_t rng_next(uint32_t *s)
{
    uint32_t x = *s;
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    *s = x;
    return x;
}

static inline void pick_device(cl_platform_id *platform, cl_device_id *device)
{
    cl_uint np = 0;
    CK(clGetPlatformIDs(0, NULL, &np));
    if (np == 0)
        die_cl("clGetPlatformIDs", CL_INVALID_PLATFORM);
    cl_platform_id *ps = xmalloc(sizeof(cl_platform_id) * np);
    CK(clGetPlatformIDs(np, ps, NULL));
    const char *env = getenv("CRANE_TEST_PLATFORM");
    cl_uint idx = env && *env ? (cl_uint)atoi(env) : 0;
    if (idx >= np)
        die_cl("clGetPlatformIDs", CL_INVALID_PLATFORM);
    *platform = ps[idx];
    free(ps);
    cl_uint nd = 0;
    CK(clGetDeviceIDs(*platform, CL_DEVICE_TYPE_ALL, 1, device, &nd));
    char name[256] = {0};
    CK(clGetDeviceInfo(*device, CL_DEVICE_NAME, sizeof name - 1, name, NULL));
    char ver[256] = {0};
    CK(clGetDeviceInfo(*device, CL_DEVICE_VERSION, sizeof ver - 1, ver, NULL));
    printf("%s: platform %u device \"%s\" (%s)\n", g_prog, idx, name, ver);
}

/* Parses "OpenCL X.Y ..." into X*10+Y (e.g. 30 for 3.0). */
static inline int parse_cl_version(const char *s)
{
    int maj = 0, min = 0;
    if (sscanf(s, "OpenCL %d.%d", &maj, &min) != 2)
        return 0;
    return maj * 10 + min;
}

static inline int device_version(cl_device_id dev)
{
    char ver[256] = {0};
    CK(clGetDeviceInfo(dev, CL_DEVICE_VERSION, sizeof ver - 1, ver, NULL));
    return parse_cl_version(ver);
}

static inline int platform_version(cl_platform_id p)
{
    char ver[256] = {0};
    CK(clGetPlatformInfo(p, CL_PLATFORM_VERSION, sizeof ver - 1, ver, NULL));
    return parse_cl_version(ver);
}

static inline cl_context make_context(cl_platform_id p, cl_device_id d)
{
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)p, 0};
    cl_int err;
    cl_context ctx = clCreateContext(props, 1, &d, NULL, NULL, &err);
    CKE(err, "clCreateContext");
    return ctx;
}

static inline void print_build_log(cl_program prog, cl_device_id dev)
{
    size_t n = 0;
    if (clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, 0, NULL, &n) != CL_SUCCESS || n == 0)
        return;
    char *log = xmalloc(n + 1);
    if (clGetProgramBuildInfo(prog, dev, CL_PROGRAM_BUILD_LOG, n, log, NULL) == CL_SUCCESS) {
        log[n] = 0;
        fprintf(stderr, "build log:\n%s\n", log);
    }
    free(log);
}

static inline cl_program build_source(cl_context ctx, cl_device_id dev, const char *src, const char *opts)
{
    cl_int err;
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CKE(err, "clCreateProgramWithSource");
    err = clBuildProgram(prog, 1, &dev, opts, NULL, NULL);
    if (err != CL_SUCCESS) {
        print_build_log(prog, dev);
        die_cl("clBuildProgram", err);
    }
    return prog;
}

static inline cl_kernel make_kernel(cl_program prog, const char *name)
{
    cl_int err;
    cl_kernel k = clCreateKernel(prog, name, &err);
    CKE(err, "clCreateKernel");
    return k;
}

static inline cl_mem make_buffer(cl_context ctx, cl_mem_flags flags, size_t size, void *host)
{
    cl_int err;
    cl_mem m = clCreateBuffer(ctx, flags, size, host, &err);
    CKE(err, "clCreateBuffer");
    return m;
}

static inline cl_command_queue make_queue(cl_context ctx, cl_device_id dev, cl_command_queue_properties props)
{
    cl_int err;
    cl_command_queue q = clCreateCommandQueue(ctx, dev, props, &err);
    CKE(err, "clCreateCommandQueue");
    return q;
}

static inline size_t round_up(size_t v, size_t m)
{
    return (v + m - 1) / m * m;
}

#endif
