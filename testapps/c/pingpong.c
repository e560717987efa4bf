/* pingpong: kernel arguments swapped every iteration.
 *
 * Three buffers rotate roles (src, dst, aux) each iteration; clSetKernelArg is
 * called for every buffer and scalar argument before every enqueue.  Small
 * non-blocking probe reads land in a host ring that is hashed after each
 * clFinish; full blocking reads every 32 iterations.  A host mirror of the
 * computation checks the final buffers.  Program built with -D defines and
 * -cl-std=CL1.2.
 */
#include "common.h"
#include <unistd.h>

static const char *SRC =
    "__kernel void advance(__global const uint *src, __global uint *dst, uint n, uint iter)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i >= n) return;\n"
    "    uint l = src[i == 0 ? n - 1 : i - 1];\n"
    "    uint c = src[i];\n"
    "    uint r = src[i + 1 == n ? 0 : i + 1];\n"
    "    dst[i] = (l ^ (c * STEP_MUL)) + rotate(r, (uint)STEP_ROT) + iter * STEP_ADD;\n"
    "}\n"
    "__kernel void blend(__global uint *a, __global const uint *b, uint n, uint salt)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i >= n) return;\n"
    "    a[i] = a[i] + (b[n - 1 - i] ^ salt);\n"
    "}\n";

#define STEP_MUL 2654435761u
#define STEP_ROT 7u
#define STEP_ADD 40503u
#define N 16384u
#define PROBE 16u
#define RING 8u

static uint32_t rotl(uint32_t v, uint32_t r)
{
    return (v << r) | (v >> (32 - r));
}

static void host_step(const uint32_t *src, uint32_t *dst, uint32_t n, uint32_t iter)
{
    for (uint32_t i = 0; i < n; i++) {
        uint32_t l = src[i == 0 ? n - 1 : i - 1];
        uint32_t c = src[i];
        uint32_t r = src[i + 1 == n ? 0 : i + 1];
        dst[i] = (l ^ (c * STEP_MUL)) + rotl(r, STEP_ROT) + iter * STEP_ADD;
    }
}

static void host_mix(uint32_t *a, const uint32_t *b, uint32_t n, uint32_t salt)
{
    for (uint32_t i = 0; i < n; i++)
        a[i] = a[i] + (b[n - 1 - i] ^ salt);
}

int main(int argc, char **argv)
{
    g_prog = "pingpong";
    int iters = parse_iters(argc, argv, 30000);
    cl_platform_id plat;
    cl_device_id dev;
    pick_device(&plat, &dev);
    double t0 = now_s();

    cl_context ctx = make_context(plat, dev);
    cl_command_queue q = make_queue(ctx, dev, 0);
    char opts[256];
    snprintf(opts, sizeof opts, "-cl-std=CL1.2 -DSTEP_MUL=%uu -DSTEP_ROT=%uu -DSTEP_ADD=%uu", STEP_MUL, STEP_ROT,
             STEP_ADD);
    cl_program prog = build_source(ctx, dev, SRC, opts);
    cl_kernel kstep = make_kernel(prog, "advance");
    cl_kernel kmix = make_kernel(prog, "blend");

    const size_t bytes = N * sizeof(uint32_t);
    uint32_t *host[3];
    cl_mem buf[3];
    uint32_t seed = 0x1234567u;
    for (int b = 0; b < 3; b++) {
        host[b] = xmalloc(bytes);
        for (uint32_t i = 0; i < N; i++)
            host[b][i] = rng_next(&seed);
        buf[b] = make_buffer(ctx, CL_MEM_READ_WRITE, bytes, NULL);
        CK(clEnqueueWriteBuffer(q, buf[b], CL_TRUE, 0, bytes, host[b], 0, NULL, NULL));
    }
    uint32_t *readback = xmalloc(bytes);
    uint32_t ring[RING][PROBE];
    size_t ring_off[RING];
    int cur = 0, nxt = 1, aux = 2;
    cl_uint n = N;
    size_t gsz = N;

    /* TESTAPP_HOLD=FILE (the end-to-end tier): halfway through, keep checking
     * the device against the host mirror with small blocking reads, one every
     * 20 ms (TESTAPP_HOLD_MS), until FILE exists. The reads are not hashed, so the result is
     * that of a run without the hold; while the guest migrates they are what
     * the program asks of crane (forwarded to the proxy, or held while parked). */
    const char *hold = getenv("TESTAPP_HOLD");
    const char *hold_ms = getenv("TESTAPP_HOLD_MS");
    long every_us = hold_ms && atol(hold_ms) > 0 ? atol(hold_ms) * 1000 : 20000;
    for (int it = 0; it < iters; it++) {
        if (hold && it == iters / 2) {
            fprintf(stderr, "pingpong: holding at iteration %d until %s exists\n", it, hold);
            long checks = 0;
            uint32_t probe[PROBE];
            while (access(hold, F_OK) != 0) {
                CK(clEnqueueReadBuffer(q, buf[cur], CL_TRUE, 0, sizeof probe, probe, 0, NULL, NULL));
                if (memcmp(probe, host[cur], sizeof probe) != 0)
                    fail("device buffer differs from host mirror while held");
                checks++;
                sleep_us(every_us);
            }
            fprintf(stderr, "pingpong: released after %ld checks\n", checks);
        }
        cl_uint iter = (cl_uint)it;
        cl_uint salt = (cl_uint)it * 0x9e3779b9u;
        CK(clSetKernelArg(kstep, 0, sizeof(cl_mem), &buf[cur]));
        CK(clSetKernelArg(kstep, 1, sizeof(cl_mem), &buf[nxt]));
        CK(clSetKernelArg(kstep, 2, sizeof(cl_uint), &n));
        CK(clSetKernelArg(kstep, 3, sizeof(cl_uint), &iter));
        CK(clEnqueueNDRangeKernel(q, kstep, 1, NULL, &gsz, NULL, 0, NULL, NULL));
        CK(clSetKernelArg(kmix, 0, sizeof(cl_mem), &buf[nxt]));
        CK(clSetKernelArg(kmix, 1, sizeof(cl_mem), &buf[aux]));
        CK(clSetKernelArg(kmix, 2, sizeof(cl_uint), &n));
        CK(clSetKernelArg(kmix, 3, sizeof(cl_uint), &salt));
        CK(clEnqueueNDRangeKernel(q, kmix, 1, NULL, &gsz, NULL, 0, NULL, NULL));

        host_step(host[cur], host[nxt], N, iter);
        host_mix(host[nxt], host[aux], N, salt);

        int t = cur;
        cur = nxt;
        nxt = aux;
        aux = t;

        unsigned slot = (unsigned)it % RING;
        ring_off[slot] = ((size_t)it * 977u) % (N - PROBE);
        CK(clEnqueueReadBuffer(q, buf[cur], CL_FALSE, ring_off[slot] * 4, PROBE * 4, ring[slot], 0, NULL, NULL));
        if (slot == RING - 1 || it == iters - 1) {
            CK(clFinish(q));
            for (unsigned s = 0; s <= slot; s++)
                hash_bytes(ring[s], sizeof ring[s]);
        }
        if (it % 32 == 31) {
            CK(clEnqueueReadBuffer(q, buf[cur], CL_TRUE, 0, bytes, readback, 0, NULL, NULL));
            hash_bytes(readback, bytes);
            if (memcmp(readback, host[cur], bytes) != 0)
                fail("device buffer differs from host mirror");
        }
        if (it % 10000 == 9999)
            printf("pingpong: iteration %d\n", it + 1);
    }

    for (int b = 0; b < 3; b++) {
        int idx = b == 0 ? cur : b == 1 ? nxt : aux;
        CK(clEnqueueReadBuffer(q, buf[idx], CL_TRUE, 0, bytes, readback, 0, NULL, NULL));
        hash_bytes(readback, bytes);
        if (memcmp(readback, host[idx], bytes) != 0)
            fail("final buffer differs from host mirror");
    }
    printf("pingpong: host mirror matches\n");

    for (int b = 0; b < 3; b++) {
        CK(clReleaseMemObject(buf[b]));
        free(host[b]);
    }
    free(readback);
    CK(clReleaseKernel(kstep));
    CK(clReleaseKernel(kmix));
    CK(clReleaseProgram(prog));
    CK(clReleaseCommandQueue(q));
    CK(clReleaseContext(ctx));
    fprintf(stderr, "pingpong: %d iterations in %.3f s\n", iters, now_s() - t0);
    print_result();
    return 0;
}
