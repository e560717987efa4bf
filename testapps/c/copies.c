/* copies: fills, copies and rectangular transfers.
 *
 * Each iteration: clEnqueueFillBuffer with every pattern size 1..128 bytes
 * in turn, clEnqueueCopyBuffer at odd byte offsets (across buffers and inside
 * one buffer), clEnqueueCopyBufferRect between buffers viewed with different
 * row/slice pitches, clEnqueueWriteBufferRect and clEnqueueReadBufferRect with
 * host pitches, a kernel mixing the two buffers, and probe reads.  A byte
 * exact host mirror checks everything.
 */
#include "common.h"

static const char *SRC =
    "__kernel void mixk(__global uint *x, __global const uint *y, uint n, uint salt)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i >= n) return;\n"
    "    x[i] = (x[i] ^ y[(i * 7u) % n]) + salt;\n"
    "}\n";

#define BYTES 65536u
/* X viewed as 4 slices of 64 rows of 256 bytes; Y as 4 slices of 32 rows of 512 bytes */
#define XRP 256u
#define XSP (256u * 64u)
#define YRP 512u
#define YSP (512u * 32u)
/* host rectangles: 100-byte rows, 20 rows per slice */
#define HRP 100u
#define HSP (100u * 20u)

static void rect_copy(unsigned char *dst, const size_t dorg[3], size_t drp, size_t dsp, const unsigned char *src,
                      const size_t sorg[3], size_t srp, size_t ssp, const size_t reg[3])
{
    for (size_t z = 0; z < reg[2]; z++)
        for (size_t y = 0; y < reg[1]; y++)
            memmove(dst + (dorg[2] + z) * dsp + (dorg[1] + y) * drp + dorg[0],
                    src + (sorg[2] + z) * ssp + (sorg[1] + y) * srp + sorg[0], reg[0]);
}

int main(int argc, char **argv)
{
    g_prog = "copies";
    int iters = parse_iters(argc, argv, 12000);
    cl_platform_id plat;
    cl_device_id dev;
    pick_device(&plat, &dev);
    double t0 = now_s();

    cl_context ctx = make_context(plat, dev);
    cl_command_queue q = make_queue(ctx, dev, 0);
    cl_program prog = build_source(ctx, dev, SRC, "-cl-std=CL1.2");
    cl_kernel km = make_kernel(prog, "mixk");

    unsigned char *hx = xmalloc(BYTES), *hy = xmalloc(BYTES), *tmp = xmalloc(BYTES);
    uint32_t seed = 0xf00dbabeu;
    for (size_t i = 0; i < BYTES; i++) {
        hx[i] = (unsigned char)rng_next(&seed);
        hy[i] = (unsigned char)rng_next(&seed);
    }
    cl_mem bx = make_buffer(ctx, CL_MEM_READ_WRITE, BYTES, NULL);
    cl_mem by = make_buffer(ctx, CL_MEM_READ_WRITE, BYTES, NULL);
    CK(clEnqueueWriteBuffer(q, bx, CL_FALSE, 0, BYTES, hx, 0, NULL, NULL));
    CK(clEnqueueWriteBuffer(q, by, CL_TRUE, 0, BYTES, hy, 0, NULL, NULL));

    unsigned char hostrect[HSP * 2];
    unsigned char probe[HSP * 2];
    unsigned char pattern[128];
    cl_uint n = BYTES / 4;
    size_t gsz = BYTES / 4;

    for (int it = 0; it < iters; it++) {
        uint32_t r = (uint32_t)it * 2654435761u;
        /* 1. fill */
        size_t ps = (size_t)1 << (it % 8);
        for (size_t i = 0; i < ps; i++)
            pattern[i] = (unsigned char)(it + (int)i * 3);
        size_t foff = round_up((r >> 8) % (BYTES / 2), ps);
        size_t fsize = round_up(64 + (r >> 20) % 2000, ps);
        cl_mem fb = (it % 3 == 0) ? by : bx;
        unsigned char *fh = (it % 3 == 0) ? hy : hx;
        CK(clEnqueueFillBuffer(q, fb, pattern, ps, foff, fsize, 0, NULL, NULL));
        for (size_t i = 0; i < fsize; i += ps)
            memcpy(fh + foff + i, pattern, ps);

        /* 2. copy X -> Y at odd offsets, then inside X (non-overlapping) */
        size_t csz = 1 + (r >> 5) % 3000;
        size_t cs = (r >> 11) % (BYTES - csz), cd = (r >> 3) % (BYTES - csz);
        CK(clEnqueueCopyBuffer(q, bx, by, cs, cd, csz, 0, NULL, NULL));
        memcpy(hy + cd, hx + cs, csz);
        size_t is = (r >> 7) % (BYTES / 2 - csz), id = BYTES / 2 + (r >> 13) % (BYTES / 2 - csz);
        CK(clEnqueueCopyBuffer(q, bx, bx, is, id, csz, 0, NULL, NULL));
        memcpy(hx + id, hx + is, csz);

        /* 3. rect copy X -> Y with different pitches */
        size_t reg[3] = {1 + (r >> 4) % 200, 1 + (r >> 12) % 30, 1 + (r >> 24) % 3};
        size_t so[3] = {(r >> 6) % (XRP - reg[0] + 1), (r >> 14) % (64 - reg[1] + 1), (r >> 28) % (4 - reg[2] + 1)};
        size_t dor[3] = {(r >> 9) % (YRP - reg[0] + 1), (r >> 17) % (32 - reg[1] + 1), (r >> 2) % (4 - reg[2] + 1)};
        CK(clEnqueueCopyBufferRect(q, bx, by, so, dor, reg, XRP, XSP, YRP, YSP, 0, NULL, NULL));
        rect_copy(hy, dor, YRP, YSP, hx, so, XRP, XSP, reg);

        /* 4. host rect -> X */
        for (size_t i = 0; i < sizeof hostrect; i++)
            hostrect[i] = (unsigned char)(it * 7 + (int)i);
        size_t wreg[3] = {1 + (r >> 10) % HRP, 1 + (r >> 19) % 20, 1 + (r >> 27) % 2};
        size_t who[3] = {(r >> 1) % (HRP - wreg[0] + 1), (r >> 5) % (20 - wreg[1] + 1), 0};
        size_t wbo[3] = {(r >> 15) % (XRP - wreg[0] + 1), (r >> 21) % (64 - wreg[1] + 1), (r >> 29) % (4 - wreg[2] + 1)};
        CK(clEnqueueWriteBufferRect(q, bx, CL_FALSE, wbo, who, wreg, XRP, XSP, HRP, HSP, hostrect, 0, NULL, NULL));
        rect_copy(hx, wbo, XRP, XSP, hostrect, who, HRP, HSP, wreg);

        /* 5. kernel */
        cl_uint salt = r ^ 0x5bd1e995u;
        CK(clSetKernelArg(km, 0, sizeof(cl_mem), &bx));
        CK(clSetKernelArg(km, 1, sizeof(cl_mem), &by));
        CK(clSetKernelArg(km, 2, sizeof(cl_uint), &n));
        CK(clSetKernelArg(km, 3, sizeof(cl_uint), &salt));
        CK(clEnqueueNDRangeKernel(q, km, 1, NULL, &gsz, NULL, 0, NULL, NULL));
        {
            uint32_t *x32 = (uint32_t *)(void *)hx;
            const uint32_t *y32 = (const uint32_t *)(const void *)hy;
            for (uint32_t i = 0; i < n; i++)
                x32[i] = (x32[i] ^ y32[(i * 7u) % n]) + salt;
        }

        /* 6. rect read Y -> host, 7. plain read of X */
        size_t rreg[3] = {1 + (r >> 3) % HRP, 1 + (r >> 16) % 20, 2};
        size_t rbo[3] = {(r >> 8) % (YRP - rreg[0] + 1), (r >> 18) % (32 - rreg[1] + 1), (r >> 30) % 3};
        size_t rho[3] = {0, 0, 0};
        memset(probe, 0, sizeof probe);
        CK(clEnqueueReadBufferRect(q, by, CL_FALSE, rbo, rho, rreg, YRP, YSP, HRP, HSP, probe, 0, NULL, NULL));
        unsigned char xprobe[256];
        size_t xoff = (r >> 12) % (BYTES - sizeof xprobe);
        CK(clEnqueueReadBuffer(q, bx, CL_TRUE, xoff, sizeof xprobe, xprobe, 0, NULL, NULL));
        hash_bytes(probe, sizeof probe);
        hash_bytes(xprobe, sizeof xprobe);
        memset(tmp, 0, sizeof probe);
        rect_copy(tmp, rho, HRP, HSP, hy, rbo, YRP, YSP, rreg);
        if (memcmp(tmp, probe, sizeof probe) != 0)
            fail("ReadBufferRect differs from host mirror");
        if (memcmp(xprobe, hx + xoff, sizeof xprobe) != 0)
            fail("ReadBuffer differs from host mirror");

        if (it % 32 == 31 || it == iters - 1) {
            CK(clEnqueueReadBuffer(q, bx, CL_TRUE, 0, BYTES, tmp, 0, NULL, NULL));
            hash_bytes(tmp, BYTES);
            if (memcmp(tmp, hx, BYTES) != 0)
                fail("X differs from host mirror");
            CK(clEnqueueReadBuffer(q, by, CL_TRUE, 0, BYTES, tmp, 0, NULL, NULL));
            hash_bytes(tmp, BYTES);
            if (memcmp(tmp, hy, BYTES) != 0)
                fail("Y differs from host mirror");
        }
        if (it % 3000 == 2999)
            printf("copies: iteration %d\n", it + 1);
    }
    printf("copies: host mirror matches\n");

    CK(clReleaseMemObject(bx));
    CK(clReleaseMemObject(by));
    CK(clReleaseKernel(km));
    CK(clReleaseProgram(prog));
    CK(clReleaseCommandQueue(q));
    CK(clReleaseContext(ctx));
    free(hx);
    free(hy);
    free(tmp);
    fprintf(stderr, "copies: %d iterations in %.3f s\n", iters, now_s() - t0);
    print_result();
    return 0;
}
