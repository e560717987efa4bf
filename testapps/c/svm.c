/* svm: OpenCL 2.0 coarse-grained shared virtual memory.
 *
 * clSVMAlloc'd buffers are written and read by the host only under
 * clEnqueueSVMMap / clEnqueueSVMUnmap (blocking and non-blocking, sub-ranges),
 * passed to kernels with clSetKernelArgSVMPointer (including pointers offset
 * into an allocation), filled with clEnqueueSVMMemFill (pattern sizes 4..128)
 * and copied with clEnqueueSVMMemcpy (SVM<->SVM and SVM<->host).  A temporary
 * allocation per iteration is freed with clEnqueueSVMFree, every other time
 * through a free callback whose calls are counted.  Skips (with a RESULT line)
 * where the device has no coarse-grain buffer SVM.
 */
#include "common.h"

#include <stdatomic.h>

static const char *SRC =
    "__kernel void svm_step(__global const uint *a, __global uint *b, __global uint *c, uint n, uint k)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i >= n) return;\n"
    "    uint v = a[i] * 9u + (b[i] ^ k);\n"
    "    c[i] = v;\n"
    "    b[i] = b[i] + (v >> 5);\n"
    "}\n";

#define N 8192u
#define BYTES (N * 4u)

static atomic_int g_free_cb;

static void CL_CALLBACK free_cb(cl_command_queue q, cl_uint n, void *ptrs[], void *user)
{
    (void)q;
    cl_context ctx = (cl_context)user;
    for (cl_uint i = 0; i < n; i++)
        clSVMFree(ctx, ptrs[i]);
    atomic_fetch_add(&g_free_cb, 1);
}

static void *svm_alloc(cl_context ctx, size_t size)
{
    void *p = clSVMAlloc(ctx, CL_MEM_READ_WRITE, size, 0);
    if (!p)
        die_cl("clSVMAlloc", CL_MEM_OBJECT_ALLOCATION_FAILURE);
    return p;
}

int main(int argc, char **argv)
{
    g_prog = "svm";
    int iters = parse_iters(argc, argv, 10000);
    cl_platform_id plat;
    cl_device_id dev;
    pick_device(&plat, &dev);
    double t0 = now_s();

    if (device_version(dev) < 20 || platform_version(plat) < 20)
        skip_all("SVM needs OpenCL 2.0");
    cl_device_svm_capabilities caps = 0;
    CK(clGetDeviceInfo(dev, CL_DEVICE_SVM_CAPABILITIES, sizeof caps, &caps, NULL));
    if (!(caps & CL_DEVICE_SVM_COARSE_GRAIN_BUFFER))
        skip_all("device has no coarse-grain buffer SVM");
    printf("svm: capabilities 0x%llx\n", (unsigned long long)caps);

    cl_context ctx = make_context(plat, dev);
    cl_command_queue q = make_queue(ctx, dev, 0);
    cl_program prog = build_source(ctx, dev, SRC, "-cl-std=CL1.2");
    cl_kernel k = make_kernel(prog, "svm_step");

    uint32_t *sa = svm_alloc(ctx, BYTES), *sb = svm_alloc(ctx, BYTES), *sc = svm_alloc(ctx, BYTES);
    uint32_t *ha = xmalloc(BYTES), *hb = xmalloc(BYTES), *hc = xmalloc(BYTES);
    uint32_t seed = 0x5151u;
    CK(clEnqueueSVMMap(q, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, sa, BYTES, 0, NULL, NULL));
    CK(clEnqueueSVMMap(q, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, sb, BYTES, 0, NULL, NULL));
    for (uint32_t i = 0; i < N; i++) {
        sa[i] = ha[i] = rng_next(&seed);
        sb[i] = hb[i] = rng_next(&seed);
    }
    CK(clEnqueueSVMUnmap(q, sa, 0, NULL, NULL));
    CK(clEnqueueSVMUnmap(q, sb, 0, NULL, NULL));
    cl_uint zero = 0;
    CK(clEnqueueSVMMemFill(q, sc, &zero, sizeof zero, BYTES, 0, NULL, NULL));
    memset(hc, 0, BYTES);

    unsigned char pattern[128];
    uint32_t probe[256];
    int frees_with_cb = 0;

    for (int it = 0; it < iters; it++) {
        /* 1. host write into a sub-range of A under a blocking map */
        size_t moff = ((size_t)it * 320u) % (N - 512);
        CK(clEnqueueSVMMap(q, CL_TRUE, CL_MAP_WRITE, sa + moff, 512 * 4, 0, NULL, NULL));
        for (size_t i = 0; i < 512; i += 2) { /* write-only: every other word must survive */
            ha[moff + i] += (uint32_t)it;
            sa[moff + i] = ha[moff + i];
        }
        CK(clEnqueueSVMUnmap(q, sa + moff, 0, NULL, NULL));

        /* 2. fill part of B */
        size_t ps = (size_t)4 << (it % 6);
        for (size_t i = 0; i < ps; i++)
            pattern[i] = (unsigned char)(it * 5 + (int)i);
        size_t foff = round_up(((size_t)it * 1000u) % (BYTES / 2), ps);
        size_t fsize = round_up(128 + ((size_t)it * 37u) % 1024u, ps);
        CK(clEnqueueSVMMemFill(q, (char *)sb + foff, pattern, ps, fsize, 0, NULL, NULL));
        for (size_t i = 0; i < fsize; i += ps)
            memcpy((char *)hb + foff + i, pattern, ps);

        /* 3. kernel on SVM pointers, A offset into its allocation */
        cl_uint shift = (cl_uint)(it % 4) * 16u;
        cl_uint n = N - 64u;
        cl_uint kk = (cl_uint)it * 0x3c6ef372u;
        CK(clSetKernelArgSVMPointer(k, 0, sa + shift));
        CK(clSetKernelArgSVMPointer(k, 1, sb));
        CK(clSetKernelArgSVMPointer(k, 2, sc));
        CK(clSetKernelArg(k, 3, sizeof(cl_uint), &n));
        CK(clSetKernelArg(k, 4, sizeof(cl_uint), &kk));
        size_t g = n;
        CK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL));
        for (uint32_t i = 0; i < n; i++) {
            uint32_t v = ha[shift + i] * 9u + (hb[i] ^ kk);
            hc[i] = v;
            hb[i] = hb[i] + (v >> 5);
        }

        /* 4. SVM -> SVM copy (non-blocking, event), feeding C back into A */
        cl_event ecopy;
        size_t cdst = ((size_t)it * 64u) % (N / 2);
        CK(clEnqueueSVMMemcpy(q, CL_FALSE, sa + cdst, sc, (N / 2) * 4, 0, NULL, &ecopy));
        CK(clWaitForEvents(1, &ecopy));
        CK(clReleaseEvent(ecopy));
        memcpy(ha + cdst, hc, (N / 2) * 4);

        /* 5. SVM -> host copy (blocking) */
        size_t poff = ((size_t)it * 97u) % (N - 256);
        CK(clEnqueueSVMMemcpy(q, CL_TRUE, probe, sc + poff, sizeof probe, 0, NULL, NULL));
        hash_bytes(probe, sizeof probe);
        if (memcmp(probe, hc + poff, sizeof probe) != 0)
            fail("SVM memcpy probe differs from host model");

        /* 6. non-blocking read map of B */
        cl_event emap;
        CK(clEnqueueSVMMap(q, CL_FALSE, CL_MAP_READ, sb, BYTES, 0, NULL, &emap));
        CK(clWaitForEvents(1, &emap));
        CK(clReleaseEvent(emap));
        hash_bytes(sb + poff, sizeof probe);
        if (memcmp(sb, hb, BYTES) != 0)
            fail("mapped B differs from host model");
        CK(clEnqueueSVMUnmap(q, sb, 0, NULL, NULL));

        /* 7. temporary allocation: host -> SVM copy, SVM -> host, enqueue free */
        uint32_t *tmp = svm_alloc(ctx, 4096);
        CK(clEnqueueSVMMemcpy(q, CL_FALSE, tmp, hc + 128, 4096, 0, NULL, NULL));
        CK(clEnqueueSVMMemcpy(q, CL_TRUE, probe, tmp + 64, sizeof probe, 0, NULL, NULL));
        if (memcmp(probe, hc + 128 + 64, sizeof probe) != 0)
            fail("temporary SVM copy differs");
        void *fl[1] = {tmp};
        if (it % 2) {
            CK(clEnqueueSVMFree(q, 1, fl, free_cb, ctx, 0, NULL, NULL));
            frees_with_cb++;
        } else {
            CK(clEnqueueSVMFree(q, 1, fl, NULL, NULL, 0, NULL, NULL));
        }
        CK(clFlush(q));
        if (it % 2500 == 2499)
            printf("svm: iteration %d\n", it + 1);
    }
    CK(clFinish(q));
    /* final state of all three allocations through maps */
    uint32_t *all[3] = {sa, sb, sc};
    uint32_t *mir[3] = {ha, hb, hc};
    for (int i = 0; i < 3; i++) {
        CK(clEnqueueSVMMap(q, CL_TRUE, CL_MAP_READ, all[i], BYTES, 0, NULL, NULL));
        hash_bytes(all[i], BYTES);
        if (memcmp(all[i], mir[i], BYTES) != 0)
            fail("final SVM content differs from host model");
        CK(clEnqueueSVMUnmap(q, all[i], 0, NULL, NULL));
    }
    CK(clFinish(q));
    double tw = now_s();
    while (atomic_load(&g_free_cb) < frees_with_cb && now_s() - tw < 30.0)
        sleep_us(100);
    int got = atomic_load(&g_free_cb);
    printf("svm: host model matches, free callbacks %d/%d\n", got, frees_with_cb);
    if (got != frees_with_cb)
        fail("SVM free callback count differs");
    hash_u64((uint64_t)got);

    clSVMFree(ctx, sa);
    clSVMFree(ctx, sb);
    clSVMFree(ctx, sc);
    CK(clReleaseKernel(k));
    CK(clReleaseProgram(prog));
    CK(clReleaseCommandQueue(q));
    CK(clReleaseContext(ctx));
    free(ha);
    free(hb);
    free(hc);
    fprintf(stderr, "svm: %d iterations in %.3f s\n", iters, now_s() - t0);
    print_result();
    return 0;
}
