/* info-overrun: does the vendor write past the size it reports for an
 * info query, for kernel names up to 2048 bytes? (docs/conformance.md,
 * "What differs": the CTS's test_compiler kernel_name_size under switches
 * on NVIDIA ended crane-proxy with glibc's "free(): invalid next size",
 * and the in-process proxy that replayed the session too; crane-proxy
 * sizes every info buffer by the vendor's own answer.) For each name
 * length it builds the CTS's program (and a compiled-then-linked one),
 * asks every program, build and kernel query crane-proxy makes with a
 * buffer of the reported size followed by 64 KiB of a marker, and prints
 * each query whose answer went past its size.
 *
 *   gcc -O2 -o info-overrun benches/info-overrun.c -lOpenCL
 *   OCL_ICD_FILENAMES=libnvidia-opencl.so.1 ./info-overrun
 *
 * Prints "LEN QUERY: size S, N bytes past it" for each overrun, then one
 * line with the count. (PoCL 3.1 aborts on its own at 256-byte names, in
 * its kernel compilation: this is for GPU vendors.) */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SLACK 65536
#define MARK 0xA5

static int overruns;

/* Bytes written past `size` in a buffer of size + SLACK filled with MARK. */
static size_t past(const unsigned char *b, size_t size)
{
    size_t n = 0;
    for (size_t i = size; i < size + SLACK; i++)
        if (b[i] != MARK)
            n = i - size + 1;
    return n;
}

static unsigned char *marked(size_t size)
{
    unsigned char *b = malloc(size + SLACK);
    memset(b, MARK, size + SLACK);
    return b;
}

static void report(unsigned len, const char *what, size_t size, const unsigned char *b)
{
    size_t n = past(b, size);
    if (n) {
        printf("%u %s: size %zu, %zu bytes past it\n", len, what, size, n);
        overruns++;
    }
}

static void program_queries(unsigned len, const char *tag, cl_program p, cl_device_id d)
{
    static const struct { cl_program_info q; const char *name; } pq[] = {
        {CL_PROGRAM_KERNEL_NAMES, "CL_PROGRAM_KERNEL_NAMES"},
        {CL_PROGRAM_SOURCE, "CL_PROGRAM_SOURCE"},
        {CL_PROGRAM_BINARY_SIZES, "CL_PROGRAM_BINARY_SIZES"},
        {CL_PROGRAM_NUM_KERNELS, "CL_PROGRAM_NUM_KERNELS"},
    };
    char what[128];
    for (size_t i = 0; i < sizeof pq / sizeof pq[0]; i++) {
        size_t size = 0;
        if (clGetProgramInfo(p, pq[i].q, 0, NULL, &size) != CL_SUCCESS)
            continue;
        unsigned char *b = marked(size);
        clGetProgramInfo(p, pq[i].q, size, b, NULL);
        snprintf(what, sizeof what, "%s %s", tag, pq[i].name);
        report(len, what, size, b);
        free(b);
    }
    size_t bs = 0;
    if (clGetProgramInfo(p, CL_PROGRAM_BINARY_SIZES, sizeof bs, &bs, NULL) == CL_SUCCESS && bs) {
        unsigned char *b = marked(bs);
        clGetProgramInfo(p, CL_PROGRAM_BINARIES, sizeof b, &b, NULL);
        snprintf(what, sizeof what, "%s CL_PROGRAM_BINARIES", tag);
        report(len, what, bs, b);
        free(b);
    }
    static const struct { cl_program_build_info q; const char *name; } bq[] = {
        {CL_PROGRAM_BUILD_LOG, "CL_PROGRAM_BUILD_LOG"},
        {CL_PROGRAM_BUILD_OPTIONS, "CL_PROGRAM_BUILD_OPTIONS"},
    };
    for (size_t i = 0; i < sizeof bq / sizeof bq[0]; i++) {
        size_t size = 0;
        if (clGetProgramBuildInfo(p, d, bq[i].q, 0, NULL, &size) != CL_SUCCESS)
            continue;
        unsigned char *b = marked(size);
        clGetProgramBuildInfo(p, d, bq[i].q, size, b, NULL);
        snprintf(what, sizeof what, "%s %s", tag, bq[i].name);
        report(len, what, size, b);
        free(b);
    }
}

static void kernel_queries(unsigned len, const char *tag, cl_program p, const char *name)
{
    cl_int e;
    cl_kernel k = clCreateKernel(p, name, &e);
    if (e != CL_SUCCESS) {
        printf("%u %s clCreateKernel: %d\n", len, tag, e);
        return;
    }
    static const struct { cl_kernel_info q; const char *name; } kq[] = {
        {CL_KERNEL_FUNCTION_NAME, "CL_KERNEL_FUNCTION_NAME"},
        {CL_KERNEL_ATTRIBUTES, "CL_KERNEL_ATTRIBUTES"},
    };
    char what[128];
    for (size_t i = 0; i < sizeof kq / sizeof kq[0]; i++) {
        size_t size = 0;
        if (clGetKernelInfo(k, kq[i].q, 0, NULL, &size) != CL_SUCCESS)
            continue;
        unsigned char *b = marked(size);
        clGetKernelInfo(k, kq[i].q, size, b, NULL);
        snprintf(what, sizeof what, "%s %s", tag, kq[i].name);
        report(len, what, size, b);
        free(b);
    }
    for (cl_uint a = 0; a < 2; a++) {
        static const cl_kernel_arg_info aq[] = {CL_KERNEL_ARG_TYPE_NAME, CL_KERNEL_ARG_NAME};
        for (size_t i = 0; i < 2; i++) {
            size_t size = 0;
            if (clGetKernelArgInfo(k, a, aq[i], 0, NULL, &size) != CL_SUCCESS)
                continue;
            unsigned char *b = marked(size);
            clGetKernelArgInfo(k, a, aq[i], size, b, NULL);
            snprintf(what, sizeof what, "%s arg %u info 0x%x", tag, a, aq[i]);
            report(len, what, size, b);
            free(b);
        }
    }
    clReleaseKernel(k);
}

int main(void)
{
    cl_platform_id pl;
    cl_device_id d;
    cl_int e;
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (clGetPlatformIDs(1, &pl, NULL) != CL_SUCCESS ||
        clGetDeviceIDs(pl, CL_DEVICE_TYPE_ALL, 1, &d, NULL) != CL_SUCCESS) {
        fprintf(stderr, "info-overrun: no device\n");
        return 1;
    }
    cl_context c = clCreateContext(NULL, 1, &d, NULL, NULL, &e);
    for (unsigned len = 32; len <= 2048; len *= 2) {
        char *name = malloc(len + 1);
        for (unsigned i = 0; i < len; i++)
            name[i] = "abcdefghijklmnopqrstuvwxyz"[i % 26];
        name[len] = 0;
        char *src = malloc(len + 128);
        sprintf(src, "__kernel void %s(int src, __global int *dst) { dst[0] = src; }", name);
        const char *s = src;
        static const char *const opts[] = {"", "-cl-kernel-arg-info"};
        for (int o = 0; o < 2; o++) {
            cl_program p = clCreateProgramWithSource(c, 1, &s, NULL, &e);
            if (clBuildProgram(p, 1, &d, opts[o], NULL, NULL) != CL_SUCCESS) {
                printf("%u build with \"%s\" failed\n", len, opts[o]);
                clReleaseProgram(p);
                continue;
            }
            program_queries(len, o ? "built, arg info:" : "built:", p, d);
            kernel_queries(len, o ? "built, arg info:" : "built:", p, name);
            clReleaseProgram(p);
        }
        cl_program unit = clCreateProgramWithSource(c, 1, &s, NULL, &e);
        if (clCompileProgram(unit, 1, &d, "-cl-kernel-arg-info", 0, NULL, NULL, NULL, NULL) == CL_SUCCESS) {
            program_queries(len, "compiled:", unit, d);
            cl_program linked = clLinkProgram(c, 1, &d, NULL, 1, &unit, NULL, NULL, &e);
            if (e == CL_SUCCESS) {
                program_queries(len, "linked:", linked, d);
                kernel_queries(len, "linked:", linked, name);
                clReleaseProgram(linked);
            } else {
                printf("%u link failed: %d\n", len, e);
            }
        } else {
            printf("%u compile failed\n", len);
        }
        clReleaseProgram(unit);
        free(src);
        free(name);
    }
    clReleaseContext(c);
    printf("info-overrun: %d overrun(s)\n", overruns);
    return 0;
}
