/* subbuffers: kernels, copies, reads and writes on sub-regions of one parent.
 *
 * A parent buffer is split into R regions.  Each region has a long-lived
 * read-write sub-buffer and a read-only alias; a large sub-buffer spans the
 * middle regions; each iteration also creates, uses and releases transient
 * sub-buffers.  Writes go through sub-buffers, probe reads go through the
 * parent across region boundaries.  A host mirror checks the final parent.
 */
#include "common.h"

static const char *SRC =
    "__kernel void rblend(__global uint *dst, __global const uint *nbr, uint count, uint seed)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i >= count) return;\n"
    "    dst[i] = dst[i] * 3u + (nbr[count - 1u - i] ^ (seed + i));\n"
    "}\n"
    "__kernel void rscale(__global uint *buf, uint count, uint mul)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i >= count) return;\n"
    "    buf[i] = buf[i] * mul + i;\n"
    "}\n";

#define R 8u
#define REG_ELEMS 1024u

static cl_mem make_sub(cl_mem parent, cl_mem_flags flags, size_t off, size_t size)
{
    cl_buffer_region reg = {off, size};
    cl_int err;
    cl_mem m = clCreateSubBuffer(parent, flags, CL_BUFFER_CREATE_TYPE_REGION, &reg, &err);
    CKE(err, "clCreateSubBuffer");
    return m;
}

static void run_blend(cl_command_queue q, cl_kernel k, cl_mem dst, cl_mem nbr, cl_uint count, cl_uint seed)
{
    size_t g = count;
    CK(clSetKernelArg(k, 0, sizeof(cl_mem), &dst));
    CK(clSetKernelArg(k, 1, sizeof(cl_mem), &nbr));
    CK(clSetKernelArg(k, 2, sizeof(cl_uint), &count));
    CK(clSetKernelArg(k, 3, sizeof(cl_uint), &seed));
    CK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL));
}

static void run_scale(cl_command_queue q, cl_kernel k, cl_mem buf, cl_uint count, cl_uint mul)
{
    size_t g = count;
    CK(clSetKernelArg(k, 0, sizeof(cl_mem), &buf));
    CK(clSetKernelArg(k, 1, sizeof(cl_uint), &count));
    CK(clSetKernelArg(k, 2, sizeof(cl_uint), &mul));
    CK(clEnqueueNDRangeKernel(q, k, 1, NULL, &g, NULL, 0, NULL, NULL));
}

static void host_blend(uint32_t *dst, const uint32_t *nbr_copy, uint32_t count, uint32_t seed)
{
    for (uint32_t i = 0; i < count; i++)
        dst[i] = dst[i] * 3u + (nbr_copy[count - 1 - i] ^ (seed + i));
}

static void host_scale(uint32_t *buf, uint32_t count, uint32_t mul)
{
    for (uint32_t i = 0; i < count; i++)
        buf[i] = buf[i] * mul + i;
}

int main(int argc, char **argv)
{
    g_prog = "subbuffers";
    int iters = parse_iters(argc, argv, 18000);
    cl_platform_id plat;
    cl_device_id dev;
    pick_device(&plat, &dev);
    double t0 = now_s();

    cl_uint align_bits = 0;
    CK(clGetDeviceInfo(dev, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits, NULL));
    size_t align = align_bits / 8 ? align_bits / 8 : 1;
    const size_t reg_bytes = round_up(REG_ELEMS * 4, align);
    const size_t reg_elems = reg_bytes / 4; /* == REG_ELEMS unless alignment > 4 KiB */
    const size_t total = R * reg_bytes;
    const size_t total_elems = total / 4;

    cl_context ctx = make_context(plat, dev);
    cl_command_queue q = make_queue(ctx, dev, 0);
    cl_program prog = build_source(ctx, dev, SRC, "-cl-std=CL1.2");
    cl_kernel kblend = make_kernel(prog, "rblend");
    cl_kernel kscale = make_kernel(prog, "rscale");

    uint32_t *mirror = xmalloc(total);
    uint32_t *tmp = xmalloc(total);
    uint32_t seed = 0xabcdef1u;
    for (size_t i = 0; i < total_elems; i++)
        mirror[i] = rng_next(&seed);
    cl_mem parent = make_buffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, total, mirror);

    cl_mem sub[R], ro[R];
    for (cl_uint r = 0; r < R; r++) {
        sub[r] = make_sub(parent, CL_MEM_READ_WRITE, r * reg_bytes, reg_bytes);
        ro[r] = make_sub(parent, CL_MEM_READ_ONLY, r * reg_bytes, reg_bytes);
        cl_mem assoc = NULL;
        size_t off = 0;
        CK(clGetMemObjectInfo(sub[r], CL_MEM_ASSOCIATED_MEMOBJECT, sizeof assoc, &assoc, NULL));
        CK(clGetMemObjectInfo(ro[r], CL_MEM_OFFSET, sizeof off, &off, NULL));
        if (assoc != parent || off != r * reg_bytes)
            fail("sub-buffer info mismatch");
    }
    cl_mem mid = make_sub(parent, CL_MEM_READ_WRITE, reg_bytes, (R - 2) * reg_bytes);
    printf("subbuffers: %u regions of %zu bytes (base align %zu)\n", R, reg_bytes, align);

    for (int it = 0; it < iters; it++) {
        cl_uint useed = (cl_uint)it * 2246822519u;
        /* 1. each region blended with the reversed next region (read-only alias) */
        for (cl_uint r = 0; r < R; r++) {
            cl_uint rn = (r + 1) % R;
            run_blend(q, kblend, sub[r], ro[rn], (cl_uint)reg_elems, useed + r);
            memcpy(tmp, mirror + rn * reg_elems, reg_bytes);
            host_blend(mirror + r * reg_elems, tmp, (uint32_t)reg_elems, useed + r);
        }
        /* 2. the middle span */
        cl_uint mul = 5u + 2u * ((cl_uint)it % 7u);
        run_scale(q, kscale, mid, (cl_uint)((R - 2) * reg_elems), mul);
        host_scale(mirror + reg_elems, (uint32_t)((R - 2) * reg_elems), mul);

        /* 3. small host write into one region through its sub-buffer */
        uint32_t patch[16];
        for (int i = 0; i < 16; i++)
            patch[i] = (uint32_t)it * 16u + (uint32_t)i;
        cl_uint wr = (cl_uint)it % R;
        size_t woff = ((size_t)it * 40u) % (reg_bytes - sizeof patch) & ~(size_t)3;
        CK(clEnqueueWriteBuffer(q, sub[wr], CL_FALSE, woff, sizeof patch, patch, 0, NULL, NULL));
        memcpy((char *)mirror + wr * reg_bytes + woff, patch, sizeof patch);

        /* 4. copy between two sub-buffers */
        cl_uint ca = ((cl_uint)it * 3u) % R, cb = (ca + 3u) % R;
        size_t coff = ((size_t)it * 12u) % (reg_bytes - 256) & ~(size_t)3;
        CK(clEnqueueCopyBuffer(q, sub[ca], sub[cb], coff, reg_bytes - 256 - coff, 256, 0, NULL, NULL));
        memmove((char *)mirror + cb * reg_bytes + (reg_bytes - 256 - coff), (char *)mirror + ca * reg_bytes + coff,
                256);

        /* 5. transient sub-buffer over two regions: create, use, release */
        cl_uint tr = (cl_uint)it % (R - 1);
        cl_mem trans = make_sub(parent, it % 2 ? 0 : CL_MEM_READ_WRITE, tr * reg_bytes, 2 * reg_bytes);
        run_scale(q, kscale, trans, (cl_uint)(2 * reg_elems), 7u);
        host_scale(mirror + tr * reg_elems, (uint32_t)(2 * reg_elems), 7u);
        CK(clReleaseMemObject(trans));

        /* 6. probe read through the parent, straddling a region boundary */
        uint32_t probe[32];
        size_t poff = ((size_t)(it % (R - 1)) + 1) * reg_bytes - 64;
        CK(clEnqueueReadBuffer(q, parent, CL_FALSE, poff, sizeof probe, probe, 0, NULL, NULL));
        CK(clFinish(q));
        hash_bytes(probe, sizeof probe);
        if (memcmp(probe, (char *)mirror + poff, sizeof probe) != 0)
            fail("probe differs from host mirror");

        /* 7. probe read through a read-only sub-buffer */
        CK(clEnqueueReadBuffer(q, ro[(wr + 1) % R], CL_TRUE, 0, sizeof probe, probe, 0, NULL, NULL));
        hash_bytes(probe, sizeof probe);

        if (it % 64 == 63) {
            CK(clEnqueueReadBuffer(q, parent, CL_TRUE, 0, total, tmp, 0, NULL, NULL));
            hash_bytes(tmp, total);
            if (memcmp(tmp, mirror, total) != 0)
                fail("parent differs from host mirror");
        }
        if (it % 3000 == 2999)
            printf("subbuffers: iteration %d\n", it + 1);
    }

    CK(clEnqueueReadBuffer(q, parent, CL_TRUE, 0, total, tmp, 0, NULL, NULL));
    hash_bytes(tmp, total);
    if (memcmp(tmp, mirror, total) != 0)
        fail("final parent differs from host mirror");
    printf("subbuffers: host mirror matches\n");

    CK(clReleaseMemObject(mid));
    for (cl_uint r = 0; r < R; r++) {
        CK(clReleaseMemObject(sub[r]));
        CK(clReleaseMemObject(ro[r]));
    }
    CK(clReleaseMemObject(parent));
    CK(clReleaseKernel(kblend));
    CK(clReleaseKernel(kscale));
    CK(clReleaseProgram(prog));
    CK(clReleaseCommandQueue(q));
    CK(clReleaseContext(ctx));
    free(mirror);
    free(tmp);
    fprintf(stderr, "subbuffers: %d iterations in %.3f s\n", iters, now_s() - t0);
    print_result();
    return 0;
}
