/* maps: clEnqueueMapBuffer / clEnqueueUnmapMemObject in every flavour.
 *
 * Buffers: ALLOC_HOST_PTR, USE_HOST_PTR (host memory owned by the app; the
 * mapped pointer must be host_ptr + offset), a plain one, and a
 * COPY_HOST_PTR | HOST_READ_ONLY one.  Each iteration maps for
 * WRITE_INVALIDATE_REGION or for WRITE with a partial host update (the rest of
 * the region must survive), maps READ|WRITE non-blocking and waits on the map
 * event, runs two kernels, then holds two overlapping READ maps of one buffer
 * at the same time.  A host mirror checks every mapped read.
 */
#include "common.h"

static const char *SRC =
    "__kernel void xform(__global const uint *a, __global const uint *b, __global uint *c, uint n, uint k)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i >= n) return;\n"
    "    c[i] = a[i] * 7u + b[(i * 13u) % n] + k;\n"
    "}\n"
    "__kernel void accum(__global const uint *c, __global uint *d, uint n)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i >= n) return;\n"
    "    d[i] = d[i] ^ (c[i] + (d[i] >> 3));\n"
    "}\n";

#define N 16384u
#define BYTES (N * 4u)

static void *map(cl_command_queue q, cl_mem m, cl_bool blocking, cl_map_flags f, size_t off, size_t size,
                 cl_event *ev)
{
    cl_int err;
    void *p = clEnqueueMapBuffer(q, m, blocking, f, off, size, 0, NULL, ev, &err);
    CKE(err, "clEnqueueMapBuffer");
    if (!p)
        die_cl("clEnqueueMapBuffer", CL_INVALID_VALUE);
    return p;
}

static void check(const void *dev, const void *host, size_t n, const char *what)
{
    hash_bytes(dev, n);
    if (memcmp(dev, host, n) != 0)
        fail(what);
}

int main(int argc, char **argv)
{
    g_prog = "maps";
    int iters = parse_iters(argc, argv, 7000);
    cl_platform_id plat;
    cl_device_id dev;
    pick_device(&plat, &dev);
    double t0 = now_s();

    cl_context ctx = make_context(plat, dev);
    cl_command_queue q = make_queue(ctx, dev, 0);
    cl_program prog = build_source(ctx, dev, SRC, "-cl-std=CL1.2");
    cl_kernel kx = make_kernel(prog, "xform");
    cl_kernel ka = make_kernel(prog, "accum");

    uint32_t *ha = xmalloc(BYTES), *hb = xmalloc(BYTES), *hc = xmalloc(BYTES), *hd = xmalloc(BYTES);
    uint32_t seed = 0x600dcafeu;
    for (uint32_t i = 0; i < N; i++) {
        ha[i] = rng_next(&seed);
        hb[i] = rng_next(&seed);
        hd[i] = rng_next(&seed);
    }
    /* USE_HOST_PTR memory belongs to the app and must outlive the buffer. */
    uint32_t *useptr = aligned_alloc(4096, BYTES);
    if (!useptr)
        fail("aligned_alloc");
    memcpy(useptr, hb, BYTES);

    cl_mem ba = make_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, BYTES, NULL);
    cl_mem bb = make_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, BYTES, useptr);
    cl_mem bc = make_buffer(ctx, CL_MEM_READ_WRITE, BYTES, NULL);
    cl_mem bd = make_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR | CL_MEM_HOST_READ_ONLY, BYTES, hd);

    /* initialise A through a blocking write-invalidate map of the whole buffer */
    uint32_t *pa = map(q, ba, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0, BYTES, NULL);
    memcpy(pa, ha, BYTES);
    CK(clEnqueueUnmapMemObject(q, ba, pa, 0, NULL, NULL));

    cl_uint n = N;
    size_t gsz = N;
    for (int it = 0; it < iters; it++) {
        /* 1. write map of a region of A */
        size_t aoff = ((size_t)it * 1024u) % (N - 2048);
        size_t alen = 1024 + ((size_t)it % 4u) * 256u;
        cl_map_flags wf = (it % 2) ? CL_MAP_WRITE : CL_MAP_WRITE_INVALIDATE_REGION;
        cl_event ev_unmap;
        pa = map(q, ba, CL_TRUE, wf, aoff * 4, alen * 4, NULL);
        size_t step = (wf == CL_MAP_WRITE) ? 3 : 1; /* partial update keeps the rest */
        for (size_t i = 0; i < alen; i += step) {
            pa[i] = (uint32_t)(it * 131071) + (uint32_t)i;
            ha[aoff + i] = pa[i];
        }
        CK(clEnqueueUnmapMemObject(q, ba, pa, 0, NULL, &ev_unmap));

        /* 2. non-blocking READ|WRITE map of B (USE_HOST_PTR), wait for the event */
        size_t boff = ((size_t)it * 512u) % (N - 512);
        cl_event ev_map;
        uint32_t *pb = map(q, bb, CL_FALSE, CL_MAP_READ | CL_MAP_WRITE, boff * 4, 512 * 4, &ev_map);
        CK(clWaitForEvents(1, &ev_map));
        CK(clReleaseEvent(ev_map));
        if (pb != useptr + boff)
            fail("USE_HOST_PTR map did not return host_ptr + offset");
        check(pb, hb + boff, 512 * 4, "B map content differs from mirror");
        for (size_t i = 0; i < 512; i += 5) {
            pb[i] += (uint32_t)it;
            hb[boff + i] = pb[i];
        }
        CK(clEnqueueUnmapMemObject(q, bb, pb, 0, NULL, NULL));

        /* 3. kernels, the first waiting on the unmap of A explicitly */
        cl_uint k = (cl_uint)it * 0x27d4eb2fu;
        CK(clSetKernelArg(kx, 0, sizeof(cl_mem), &ba));
        CK(clSetKernelArg(kx, 1, sizeof(cl_mem), &bb));
        CK(clSetKernelArg(kx, 2, sizeof(cl_mem), &bc));
        CK(clSetKernelArg(kx, 3, sizeof(cl_uint), &n));
        CK(clSetKernelArg(kx, 4, sizeof(cl_uint), &k));
        CK(clEnqueueNDRangeKernel(q, kx, 1, NULL, &gsz, NULL, 1, &ev_unmap, NULL));
        CK(clReleaseEvent(ev_unmap));
        CK(clSetKernelArg(ka, 0, sizeof(cl_mem), &bc));
        CK(clSetKernelArg(ka, 1, sizeof(cl_mem), &bd));
        CK(clSetKernelArg(ka, 2, sizeof(cl_uint), &n));
        CK(clEnqueueNDRangeKernel(q, ka, 1, NULL, &gsz, NULL, 0, NULL, NULL));
        for (uint32_t i = 0; i < N; i++)
            hc[i] = ha[i] * 7u + hb[(i * 13u) % N] + k;
        for (uint32_t i = 0; i < N; i++)
            hd[i] = hd[i] ^ (hc[i] + (hd[i] >> 3));

        /* 4. two overlapping read maps of C held at once */
        size_t c1 = ((size_t)it * 777u) % (N - 2048), c2 = c1 + 1000;
        cl_event ev_c1, ev_c2;
        uint32_t *pc1 = map(q, bc, CL_FALSE, CL_MAP_READ, c1 * 4, 2048 * 4, &ev_c1);
        uint32_t *pc2 = map(q, bc, CL_FALSE, CL_MAP_READ, c2 * 4, 1024 * 4, &ev_c2);
        cl_event both[2] = {ev_c1, ev_c2};
        CK(clWaitForEvents(2, both));
        check(pc1, hc + c1, 2048 * 4, "C map 1 differs from mirror");
        check(pc2, hc + c2, 1024 * 4, "C map 2 differs from mirror");
        CK(clEnqueueUnmapMemObject(q, bc, pc2, 0, NULL, NULL));
        CK(clEnqueueUnmapMemObject(q, bc, pc1, 0, NULL, NULL));
        CK(clReleaseEvent(ev_c1));
        CK(clReleaseEvent(ev_c2));

        /* 5. whole-buffer read map of the HOST_READ_ONLY buffer */
        if (it % 8 == 7 || it == iters - 1) {
            uint32_t *pd = map(q, bd, CL_TRUE, CL_MAP_READ, 0, BYTES, NULL);
            check(pd, hd, BYTES, "D map differs from mirror");
            CK(clEnqueueUnmapMemObject(q, bd, pd, 0, NULL, NULL));
        }
        CK(clFinish(q));
        if (it % 1000 == 999)
            printf("maps: iteration %d\n", it + 1);
    }
    /* final: read A and B through maps too */
    pa = map(q, ba, CL_TRUE, CL_MAP_READ, 0, BYTES, NULL);
    check(pa, ha, BYTES, "final A differs from mirror");
    CK(clEnqueueUnmapMemObject(q, ba, pa, 0, NULL, NULL));
    uint32_t *pb = map(q, bb, CL_TRUE, CL_MAP_READ, 0, BYTES, NULL);
    check(pb, hb, BYTES, "final B differs from mirror");
    CK(clEnqueueUnmapMemObject(q, bb, pb, 0, NULL, NULL));
    CK(clFinish(q));
    printf("maps: host mirror matches\n");

    CK(clReleaseMemObject(ba));
    CK(clReleaseMemObject(bb));
    CK(clReleaseMemObject(bc));
    CK(clReleaseMemObject(bd));
    CK(clReleaseKernel(kx));
    CK(clReleaseKernel(ka));
    CK(clReleaseProgram(prog));
    CK(clReleaseCommandQueue(q));
    CK(clReleaseContext(ctx));
    free(useptr);
    free(ha);
    free(hb);
    free(hc);
    free(hd);
    fprintf(stderr, "maps: %d iterations in %.3f s\n", iters, now_s() - t0);
    print_result();
    return 0;
}
