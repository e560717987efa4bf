/* subbuf-release: does NVIDIA's OpenCL crash releasing overlapping
 * sub-buffers in creation order without crane? (docs/conformance.md,
 * "What differs": test_buffers sub_buffers_overlapping crashed in NVIDIA's
 * clReleaseMemObject of one of its 16 sub-buffers, under crane's
 * suspend/resume cycles.) Each round does what that test and crane's
 * suspend do to one context: a 32 MiB parent, 16 random overlapping
 * CL_MEM_READ_ONLY sub-buffers, the parent written, half the sub-buffers
 * read by a kernel and half by clEnqueueReadBuffer, then crane's suspend:
 * the parent read into a pinned RAM copy (a CL_MEM_USE_HOST_PTR buffer over
 * it, where `pin` is given), the kernels and programs released, the
 * sub-buffers released in the order given, the parent, queue and context.
 *
 *   gcc -O2 -o subbuf-release benches/subbuf-release.c -lOpenCL
 *   ./subbuf-release ROUNDS creation|newest [pin]
 *
 * Prints each round on stderr and one line at the end (or dies of the
 * crash). */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define CK(x) do { cl_int e_ = (x); if (e_) { printf("%s:%d err %d\n", __FILE__, __LINE__, e_); exit(1); } } while (0)

static const char *SRC =
    "__kernel void copy(__global const char *in, __global char *out) {"
    "  size_t i = get_global_id(0); out[i] = in[i]; }";

static unsigned long long rng = 0x9E3779B97F4A7C15ull;
static size_t below(size_t n) {
    rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17;
    return n ? (size_t)(rng % n) : 0;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 100;
    int newest = argc > 2 && !strcmp(argv[2], "newest");
    int pin = argc > 3 && !strcmp(argv[3], "pin");
    cl_platform_id pl; cl_device_id dev; cl_int e;
    CK(clGetPlatformIDs(1, &pl, NULL));
    CK(clGetDeviceIDs(pl, CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
    cl_uint align_bits;
    CK(clGetDeviceInfo(dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL));
    size_t align = align_bits / 8, size = 32 << 20;
    char *contents = malloc(size), *tmp = malloc(size);
    for (size_t i = 0; i < size; i++) contents[i] = (char)below(256);
    char *copy = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    int bad = 0;
    for (int r = 0; r < rounds; r++) {
        cl_context ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &e); CK(e);
        cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &e); CK(e);
        cl_mem parent = clCreateBuffer(ctx, CL_MEM_READ_WRITE, size, NULL, &e); CK(e);
        cl_mem sub[16];
        size_t org[16], len[16];
        for (int i = 0; i < 16; i++) {
            org[i] = below(size / align) * align;
            len[i] = (1 + below((size - org[i]) / align)) * align;
            cl_buffer_region reg = {org[i], len[i]};
            sub[i] = clCreateSubBuffer(parent, CL_MEM_READ_ONLY, CL_BUFFER_CREATE_TYPE_REGION, &reg, &e); CK(e);
        }
        CK(clEnqueueWriteBuffer(q, parent, CL_TRUE, 0, size, contents, 0, NULL, NULL));
        cl_program progs[16]; cl_kernel ks[16]; cl_mem outs[16]; int nk = 0;
        for (int i = 0; i < 16; i++) {
            if (below(2)) {
                CK(clEnqueueReadBuffer(q, sub[i], CL_TRUE, 0, len[i], tmp, 0, NULL, NULL));
            } else {
                progs[nk] = clCreateProgramWithSource(ctx, 1, &SRC, NULL, &e); CK(e);
                CK(clBuildProgram(progs[nk], 1, &dev, NULL, NULL, NULL));
                ks[nk] = clCreateKernel(progs[nk], "copy", &e); CK(e);
                outs[nk] = clCreateBuffer(ctx, CL_MEM_READ_WRITE, len[i], NULL, &e); CK(e);
                CK(clSetKernelArg(ks[nk], 0, sizeof(cl_mem), &sub[i]));
                CK(clSetKernelArg(ks[nk], 1, sizeof(cl_mem), &outs[nk]));
                CK(clEnqueueNDRangeKernel(q, ks[nk], 1, NULL, &len[i], NULL, 0, NULL, NULL));
                CK(clEnqueueReadBuffer(q, outs[nk], CL_TRUE, 0, len[i], tmp, 0, NULL, NULL));
                nk++;
            }
            if (memcmp(tmp, contents + org[i], len[i])) bad++;
        }
        fprintf(stderr, "round %d\n", r);
        /* crane's suspend */
        CK(clFinish(q));
        cl_mem p = NULL;
        if (pin) { p = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, size, copy, &e); CK(e); }
        CK(clEnqueueReadBuffer(q, parent, CL_TRUE, 0, size, copy, 0, NULL, NULL));
        if (p) clReleaseMemObject(p);
        if (memcmp(copy, contents, size)) bad++;
        CK(clFinish(q));
        for (int i = 0; i < nk; i++) { clReleaseKernel(ks[i]); }
        for (int i = 0; i < 16; i++) CK(clReleaseMemObject(sub[newest ? 15 - i : i]));
        for (int i = 0; i < nk; i++) { clReleaseMemObject(outs[i]); }
        CK(clReleaseMemObject(parent));
        for (int i = 0; i < nk; i++) { clReleaseProgram(progs[i]); }
        clReleaseCommandQueue(q);
        clReleaseContext(ctx);
    }
    printf("%d rounds, %s order%s: %d mismatches, no crash\n", rounds,
           newest ? "newest-first" : "creation", pin ? ", pinned read" : "", bad);
    return bad != 0;
}
