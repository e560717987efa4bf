/* localmem: __local kernel arguments (clSetKernelArg with a size and NULL).
 *
 * A work-group tree reduction (one __local arg), a Hillis-Steele scan (two
 * __local args whose pointers are swapped inside the kernel) and a tiled
 * 2D transpose (one __local tile, padded) run every iteration with a
 * work-group size that changes from iteration to iteration, so the __local
 * sizes change too.  Integer arithmetic only; a host model checks the
 * results.
 */
#include "common.h"

static const char *SRC =
    "__kernel void wg_reduce(__global const uint *in, __global uint *out, __local uint *scratch, uint n)\n"
    "{\n"
    "    uint lid = get_local_id(0), gid = get_global_id(0), ls = get_local_size(0);\n"
    "    scratch[lid] = gid < n ? in[gid] * (gid | 1u) : 0u;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    for (uint s = ls / 2u; s > 0u; s >>= 1) {\n"
    "        if (lid < s) scratch[lid] += scratch[lid + s] ^ s;\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    }\n"
    "    if (lid == 0u) out[get_group_id(0)] = scratch[0];\n"
    "}\n"
    "__kernel void wg_scan(__global const uint *in, __global uint *out, __local uint *a, __local uint *b, uint n)\n"
    "{\n"
    "    uint lid = get_local_id(0), gid = get_global_id(0), ls = get_local_size(0);\n"
    "    a[lid] = gid < n ? in[gid] : 0u;\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    __local uint *src = a;\n"
    "    __local uint *dst = b;\n"
    "    for (uint off = 1u; off < ls; off <<= 1) {\n"
    "        dst[lid] = src[lid] + (lid >= off ? src[lid - off] : 0u);\n"
    "        barrier(CLK_LOCAL_MEM_FENCE);\n"
    "        __local uint *t = src; src = dst; dst = t;\n"
    "    }\n"
    "    if (gid < n) out[gid] = src[lid];\n"
    "}\n"
    "__kernel void tile_transpose(__global const uint *in, __global uint *out, __local uint *tile, uint w, uint h)\n"
    "{\n"
    "    uint ts = get_local_size(0);\n"
    "    uint gx = get_global_id(0), gy = get_global_id(1);\n"
    "    uint lx = get_local_id(0), ly = get_local_id(1);\n"
    "    tile[ly * (ts + 1u) + lx] = in[gy * w + gx];\n"
    "    barrier(CLK_LOCAL_MEM_FENCE);\n"
    "    uint ox = get_group_id(1) * ts + lx, oy = get_group_id(0) * ts + ly;\n"
    "    out[oy * h + ox] = tile[lx * (ts + 1u) + ly] * 3u + 1u;\n"
    "}\n";

#define NMAX 8192u
#define TW 256u
#define TH 128u

static size_t kernel_wg(cl_kernel k, cl_device_id dev)
{
    size_t wg = 0;
    CK(clGetKernelWorkGroupInfo(k, dev, CL_KERNEL_WORK_GROUP_SIZE, sizeof wg, &wg, NULL));
    return wg;
}

int main(int argc, char **argv)
{
    g_prog = "localmem";
    int iters = parse_iters(argc, argv, 4000);
    cl_platform_id plat;
    cl_device_id dev;
    pick_device(&plat, &dev);
    double t0 = now_s();

    cl_context ctx = make_context(plat, dev);
    cl_command_queue q = make_queue(ctx, dev, 0);
    cl_program prog = build_source(ctx, dev, SRC, "-cl-std=CL1.2");
    cl_kernel kred = make_kernel(prog, "wg_reduce");
    cl_kernel kscan = make_kernel(prog, "wg_scan");
    cl_kernel ktr = make_kernel(prog, "tile_transpose");

    size_t dev_wg = 0, dims[3] = {0, 0, 0};
    cl_ulong lmem = 0;
    CK(clGetDeviceInfo(dev, CL_DEVICE_MAX_WORK_GROUP_SIZE, sizeof dev_wg, &dev_wg, NULL));
    CK(clGetDeviceInfo(dev, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof dims, dims, NULL));
    CK(clGetDeviceInfo(dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof lmem, &lmem, NULL));
    size_t max1 = dev_wg;
    if (kernel_wg(kred, dev) < max1)
        max1 = kernel_wg(kred, dev);
    if (kernel_wg(kscan, dev) < max1)
        max1 = kernel_wg(kscan, dev);
    if (dims[0] < max1)
        max1 = dims[0];
    while (max1 * 8 > lmem)
        max1 /= 2;
    size_t max_ts = 16;
    while (max_ts > 1 && (max_ts * max_ts > dev_wg || max_ts * max_ts > kernel_wg(ktr, dev) || max_ts > dims[1]))
        max_ts /= 2;
    const size_t cand[5] = {16, 32, 64, 128, 256};
    size_t lsz[5];
    int nls = 0;
    for (int i = 0; i < 5; i++)
        if (cand[i] <= max1)
            lsz[nls++] = cand[i];
    if (nls == 0 || max_ts < 4)
        skip_all("work-group size limits too small");
    printf("localmem: %d local sizes up to %zu, tiles up to %zux%zu\n", nls, lsz[nls - 1], max_ts, max_ts);

    uint32_t *in = xmalloc(NMAX * 4);
    uint32_t seed = 0xc0ffeeu;
    for (uint32_t i = 0; i < NMAX; i++)
        in[i] = rng_next(&seed);
    uint32_t *tin = xmalloc(TW * TH * 4), *tout = xmalloc(TW * TH * 4);
    for (uint32_t i = 0; i < TW * TH; i++)
        tin[i] = rng_next(&seed);
    cl_mem bin = make_buffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, NMAX * 4, in);
    cl_mem bred = make_buffer(ctx, CL_MEM_READ_WRITE, NMAX * 4, NULL);
    cl_mem bscan = make_buffer(ctx, CL_MEM_READ_WRITE, NMAX * 4, NULL);
    cl_mem bt[2];
    bt[0] = make_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, TW * TH * 4, tin);
    bt[1] = make_buffer(ctx, CL_MEM_READ_WRITE, TW * TH * 4, NULL);

    uint32_t *red = xmalloc(NMAX * 4), *scan = xmalloc(NMAX * 4), *scratch = xmalloc(256 * 4);
    int tcur = 0;
    uint32_t tw = TW, th = TH;

    for (int it = 0; it < iters; it++) {
        hold_if_asked("localmem", it, iters);
        /* host update of a slice of the input */
        uint32_t chunk[256];
        for (int i = 0; i < 256; i++)
            chunk[i] = (uint32_t)it * 0x9e3779b1u + (uint32_t)i;
        size_t coff = ((size_t)it * 256u) % NMAX;
        memcpy(in + coff, chunk, sizeof chunk);
        CK(clEnqueueWriteBuffer(q, bin, CL_FALSE, coff * 4, sizeof chunk, chunk, 0, NULL, NULL));

        size_t ls = lsz[it % nls];
        cl_uint n = NMAX - (cl_uint)(it % 7) * 100u;
        size_t gsz = round_up(n, ls);
        size_t ngroups = gsz / ls;

        CK(clSetKernelArg(kred, 0, sizeof(cl_mem), &bin));
        CK(clSetKernelArg(kred, 1, sizeof(cl_mem), &bred));
        CK(clSetKernelArg(kred, 2, ls * sizeof(cl_uint), NULL));
        CK(clSetKernelArg(kred, 3, sizeof(cl_uint), &n));
        CK(clEnqueueNDRangeKernel(q, kred, 1, NULL, &gsz, &ls, 0, NULL, NULL));

        CK(clSetKernelArg(kscan, 0, sizeof(cl_mem), &bin));
        CK(clSetKernelArg(kscan, 1, sizeof(cl_mem), &bscan));
        CK(clSetKernelArg(kscan, 2, ls * sizeof(cl_uint), NULL));
        CK(clSetKernelArg(kscan, 3, ls * sizeof(cl_uint), NULL));
        CK(clSetKernelArg(kscan, 4, sizeof(cl_uint), &n));
        CK(clEnqueueNDRangeKernel(q, kscan, 1, NULL, &gsz, &ls, 0, NULL, NULL));

        size_t ts = (size_t)4 << (it % 3);
        if (ts > max_ts)
            ts = max_ts;
        size_t tg[2] = {tcur ? TH : TW, tcur ? TW : TH}, tl[2] = {ts, ts};
        uint32_t w = tcur ? th : tw, h = tcur ? tw : th;
        CK(clSetKernelArg(ktr, 0, sizeof(cl_mem), &bt[tcur]));
        CK(clSetKernelArg(ktr, 1, sizeof(cl_mem), &bt[1 - tcur]));
        CK(clSetKernelArg(ktr, 2, ts * (ts + 1) * sizeof(cl_uint), NULL));
        CK(clSetKernelArg(ktr, 3, sizeof(cl_uint), &w));
        CK(clSetKernelArg(ktr, 4, sizeof(cl_uint), &h));
        CK(clEnqueueNDRangeKernel(q, ktr, 2, NULL, tg, tl, 0, NULL, NULL));
        tcur = 1 - tcur;

        CK(clEnqueueReadBuffer(q, bred, CL_FALSE, 0, ngroups * 4, red, 0, NULL, NULL));
        CK(clEnqueueReadBuffer(q, bscan, CL_TRUE, 0, (size_t)n * 4, scan, 0, NULL, NULL));
        hash_bytes(red, ngroups * 4);
        hash_bytes(scan, (size_t)n * 4);

        /* host model */
        for (size_t g = 0; g < ngroups; g++) {
            uint32_t acc = 0;
            for (size_t l = 0; l < ls; l++) {
                size_t gid = g * ls + l;
                scratch[l] = gid < n ? in[gid] * (uint32_t)(gid | 1u) : 0u;
                acc += gid < n ? in[gid] : 0u;
                if (gid < n && scan[gid] != acc)
                    fail("scan differs from host model");
            }
            for (size_t s = ls / 2; s > 0; s >>= 1)
                for (size_t l = 0; l < s; l++)
                    scratch[l] += scratch[l + s] ^ (uint32_t)s;
            if (red[g] != scratch[0])
                fail("reduction differs from host model");
        }
        for (uint32_t y = 0; y < h; y++)
            for (uint32_t x = 0; x < w; x++)
                tout[x * h + y] = tin[y * w + x] * 3u + 1u;
        uint32_t *swap = tin;
        tin = tout;
        tout = swap;

        if (it % 16 == 15 || it == iters - 1) {
            CK(clEnqueueReadBuffer(q, bt[tcur], CL_TRUE, 0, TW * TH * 4, tout, 0, NULL, NULL));
            hash_bytes(tout, TW * TH * 4);
            if (memcmp(tout, tin, TW * TH * 4) != 0)
                fail("transpose differs from host model");
        }
        if (it % 1000 == 999)
            printf("localmem: iteration %d\n", it + 1);
    }
    printf("localmem: host model matches\n");

    CK(clReleaseMemObject(bin));
    CK(clReleaseMemObject(bred));
    CK(clReleaseMemObject(bscan));
    CK(clReleaseMemObject(bt[0]));
    CK(clReleaseMemObject(bt[1]));
    CK(clReleaseKernel(kred));
    CK(clReleaseKernel(kscan));
    CK(clReleaseKernel(ktr));
    CK(clReleaseProgram(prog));
    CK(clReleaseCommandQueue(q));
    CK(clReleaseContext(ctx));
    free(in);
    free(tin);
    free(tout);
    free(red);
    free(scan);
    free(scratch);
    fprintf(stderr, "localmem: %d iterations in %.3f s\n", iters, now_s() - t0);
    print_result();
    return 0;
}
