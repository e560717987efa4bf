/* frameloop: a video-encoder-shaped frame loop (reused by the benchmarks).
 *
 * Per frame: one host write of the luma plane (W*H bytes, 8 KiB by default),
 * seven small kernels with five arguments each (35 clSetKernelArg calls:
 * load, block motion search, residual, 4x4 integer transform, quantisation,
 * reconstruction, entropy estimate), one blocking read of a 32-byte summary per
 * 8x8 block (4 KiB by default) that drives the rate control (QP of the next
 * frame), reference/reconstruction buffers swapped through the kernel
 * arguments, and a full read of the reconstruction every 16 frames.  Integer
 * arithmetic only.  Prints frames/s to stderr.
 *   frameloop [--iters FRAMES] [--width W] [--height H]   (W, H multiples of 8)
 */
#include "common.h"

static const char *SRC =
    "#define BS 8\n"
    "__kernel void fl_load(__global const uchar *src, __global int *cur, int w, int h, int frame)\n"
    "{\n"
    "    int x = get_global_id(0), y = get_global_id(1);\n"
    "    if (x >= w || y >= h) return;\n"
    "    cur[y * w + x] = (int)src[y * w + x] + ((((x ^ y ^ frame) & 3) == 0) ? 1 : 0);\n"
    "}\n"
    "__kernel void fl_motion(__global const int *cur, __global const int *ref, __global int *mv, int w, int range)\n"
    "{\n"
    "    int bx = get_global_id(0), by = get_global_id(1);\n"
    "    int h = (int)get_global_size(1) * BS;\n"
    "    int best = 0x7fffffff, bdx = 0, bdy = 0;\n"
    "    for (int dy = -range; dy <= range; dy++)\n"
    "        for (int dx = -range; dx <= range; dx++) {\n"
    "            int sad = ((int)abs(dx) + (int)abs(dy)) * 4;\n"
    "            for (int j = 0; j < BS; j++)\n"
    "                for (int i = 0; i < BS; i++) {\n"
    "                    int x = bx * BS + i, y = by * BS + j;\n"
    "                    int rx = clamp(x + dx, 0, w - 1), ry = clamp(y + dy, 0, h - 1);\n"
    "                    sad += (int)abs(cur[y * w + x] - ref[ry * w + rx]);\n"
    "                }\n"
    "            if (sad < best) { best = sad; bdx = dx; bdy = dy; }\n"
    "        }\n"
    "    int b = by * (int)get_global_size(0) + bx;\n"
    "    mv[3 * b] = bdx;\n"
    "    mv[3 * b + 1] = bdy;\n"
    "    mv[3 * b + 2] = best;\n"
    "}\n"
    "__kernel void fl_residual(__global const int *cur, __global const int *ref, __global const int *mv,\n"
    "                          __global int *resid, int w)\n"
    "{\n"
    "    int x = get_global_id(0), y = get_global_id(1), h = (int)get_global_size(1);\n"
    "    int b = (y / BS) * (w / BS) + x / BS;\n"
    "    int rx = clamp(x + mv[3 * b], 0, w - 1), ry = clamp(y + mv[3 * b + 1], 0, h - 1);\n"
    "    resid[y * w + x] = cur[y * w + x] - ref[ry * w + rx];\n"
    "}\n"
    "__kernel void fl_transform(__global const int *resid, __global int *coef, int w, int h, int shift)\n"
    "{\n"
    "    int bx = get_global_id(0), by = get_global_id(1);\n"
    "    if (by * 4 >= h) return;\n"
    "    int m[16];\n"
    "    for (int j = 0; j < 4; j++)\n"
    "        for (int i = 0; i < 4; i++) m[j * 4 + i] = resid[(by * 4 + j) * w + bx * 4 + i];\n"
    "    for (int j = 0; j < 4; j++) {\n"
    "        int *r = m + j * 4;\n"
    "        int a = r[0] + r[3], b = r[1] + r[2], c = r[1] - r[2], d = r[0] - r[3];\n"
    "        r[0] = a + b; r[2] = a - b; r[1] = 2 * d + c; r[3] = d - 2 * c;\n"
    "    }\n"
    "    for (int i = 0; i < 4; i++) {\n"
    "        int a = m[i] + m[12 + i], b = m[4 + i] + m[8 + i];\n"
    "        int c = m[4 + i] - m[8 + i], d = m[i] - m[12 + i];\n"
    "        m[i] = a + b; m[8 + i] = a - b; m[4 + i] = 2 * d + c; m[12 + i] = d - 2 * c;\n"
    "    }\n"
    "    for (int j = 0; j < 4; j++)\n"
    "        for (int i = 0; i < 4; i++) coef[(by * 4 + j) * w + bx * 4 + i] = m[j * 4 + i] / (1 << shift);\n"
    "}\n"
    "__kernel void fl_quant(__global const int *coef, __global int *level, int qp, int w, int deadzone)\n"
    "{\n"
    "    int i = get_global_id(1) * w + get_global_id(0);\n"
    "    int c = coef[i];\n"
    "    int q = 4 + qp * 2;\n"
    "    int a = ((int)abs(c) * 16 + deadzone) / (q * 16);\n"
    "    level[i] = c < 0 ? -a : a;\n"
    "}\n"
    "__kernel void fl_recon(__global const int *level, __global const int *ref, __global const int *mv,\n"
    "                       __global int *recon, int qp)\n"
    "{\n"
    "    int x = get_global_id(0), y = get_global_id(1);\n"
    "    int w = (int)get_global_size(0), h = (int)get_global_size(1);\n"
    "    int b = (y / BS) * (w / BS) + x / BS;\n"
    "    int rx = clamp(x + mv[3 * b], 0, w - 1), ry = clamp(y + mv[3 * b + 1], 0, h - 1);\n"
    "    int q = 4 + qp * 2;\n"
    "    recon[y * w + x] = clamp(ref[ry * w + rx] + (level[y * w + x] * q) / 16, 0, 255);\n"
    "}\n"
    "__kernel void fl_entropy(__global const int *level, __global const int *mv, __global uint *bits, int w, int qp)\n"
    "{\n"
    "    int bx = get_global_id(0), by = get_global_id(1);\n"
    "    int b = by * (int)get_global_size(0) + bx;\n"
    "    uint nz = 0, sum = 0, est = 0, hsh = 2166136261u;\n"
    "    for (int j = 0; j < BS; j++)\n"
    "        for (int i = 0; i < BS; i++) {\n"
    "            int l = level[(by * BS + j) * w + bx * BS + i];\n"
    "            uint a = abs(l);\n"
    "            nz += a != 0u;\n"
    "            sum += a;\n"
    "            est += a ? 2u * (32u - clz(a + 1u)) + 1u : 1u;\n"
    "            hsh = (hsh ^ (uint)l) * 16777619u;\n"
    "        }\n"
    "    est += 2u * (32u - clz(abs(mv[3 * b]) + 1u)) + 2u * (32u - clz(abs(mv[3 * b + 1]) + 1u));\n"
    "    __global uint *o = bits + b * 8;\n"
    "    o[0] = nz; o[1] = sum; o[2] = est; o[3] = (uint)mv[3 * b];\n"
    "    o[4] = (uint)mv[3 * b + 1]; o[5] = (uint)mv[3 * b + 2]; o[6] = hsh; o[7] = (uint)qp;\n"
    "}\n";

static void set5(cl_kernel k, size_t s0, const void *a0, size_t s1, const void *a1, size_t s2, const void *a2,
                 size_t s3, const void *a3, size_t s4, const void *a4)
{
    CK(clSetKernelArg(k, 0, s0, a0));
    CK(clSetKernelArg(k, 1, s1, a1));
    CK(clSetKernelArg(k, 2, s2, a2));
    CK(clSetKernelArg(k, 3, s3, a3));
    CK(clSetKernelArg(k, 4, s4, a4));
}

#define SZM sizeof(cl_mem)
#define SZI sizeof(cl_int)

int main(int argc, char **argv)
{
    g_prog = "frameloop";
    int frames = 5000, w = 128, h = 64;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc)
            frames = atoi(argv[++i]);
        else if (strcmp(argv[i], "--width") == 0 && i + 1 < argc)
            w = atoi(argv[++i]);
        else if (strcmp(argv[i], "--height") == 0 && i + 1 < argc)
            h = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: %s [--iters FRAMES] [--width W] [--height H]\n", argv[0]);
            return 2;
        }
    }
    if (frames < 1 || w < 16 || h < 16 || w % 8 || h % 8) {
        fprintf(stderr, "frameloop: bad arguments\n");
        return 2;
    }
    cl_platform_id plat;
    cl_device_id dev;
    pick_device(&plat, &dev);

    cl_context ctx = make_context(plat, dev);
    cl_command_queue q = make_queue(ctx, dev, 0);
    cl_program prog = build_source(ctx, dev, SRC, "-cl-std=CL1.2");
    cl_kernel kload = make_kernel(prog, "fl_load");
    cl_kernel kmot = make_kernel(prog, "fl_motion");
    cl_kernel kres = make_kernel(prog, "fl_residual");
    cl_kernel ktr = make_kernel(prog, "fl_transform");
    cl_kernel kq = make_kernel(prog, "fl_quant");
    cl_kernel krec = make_kernel(prog, "fl_recon");
    cl_kernel kent = make_kernel(prog, "fl_entropy");

    const size_t npix = (size_t)w * h;
    const size_t nblk = npix / 64;
    cl_mem d_src = make_buffer(ctx, CL_MEM_READ_ONLY, npix, NULL);
    cl_mem d_cur = make_buffer(ctx, CL_MEM_READ_WRITE, npix * 4, NULL);
    cl_mem d_rr[2] = {make_buffer(ctx, CL_MEM_READ_WRITE, npix * 4, NULL),
                      make_buffer(ctx, CL_MEM_READ_WRITE, npix * 4, NULL)};
    cl_mem d_mv = make_buffer(ctx, CL_MEM_READ_WRITE, nblk * 3 * 4, NULL);
    cl_mem d_res = make_buffer(ctx, CL_MEM_READ_WRITE, npix * 4, NULL);
    cl_mem d_coef = make_buffer(ctx, CL_MEM_READ_WRITE, npix * 4, NULL);
    cl_mem d_lev = make_buffer(ctx, CL_MEM_READ_WRITE, npix * 4, NULL);
    cl_mem d_bits = make_buffer(ctx, CL_MEM_WRITE_ONLY, nblk * 32, NULL);
    cl_int grey = 128;
    CK(clEnqueueFillBuffer(q, d_rr[0], &grey, sizeof grey, 0, npix * 4, 0, NULL, NULL));

    unsigned char *frame = xmalloc(npix);
    uint32_t *bits = xmalloc(nblk * 32);
    int32_t *recon = xmalloc(npix * 4);
    int qp = 12, ref = 0;
    cl_int cw = w, ch = h, range = 3, shift = 0, deadzone = 6;
    const size_t gpix[2] = {(size_t)w, (size_t)h}, gblk[2] = {(size_t)w / 8, (size_t)h / 8},
                 g4[2] = {(size_t)w / 4, (size_t)h / 4};
    uint64_t total_bits = 0;
    double t0 = now_s();

    for (int f = 0; f < frames; f++) {
        /* synthetic frame: drifting gradient, a moving square, noise */
        uint32_t rs = (0x9e3779b9u ^ (uint32_t)f * 0x85ebca6bu) | 1u;
        int sqx = (f * 3) % (w - 16), sqy = (f * 2) % (h - 16);
        for (int y = 0; y < h; y++)
            for (int x = 0; x < w; x++) {
                int v = (x * 2 + y + f) & 255;
                if (x >= sqx && x < sqx + 16 && y >= sqy && y < sqy + 16)
                    v = 255 - v / 2;
                v += (int)(rng_next(&rs) & 7) - 3;
                frame[(size_t)y * w + x] = (unsigned char)(v < 0 ? 0 : v > 255 ? 255 : v);
            }
        CK(clEnqueueWriteBuffer(q, d_src, CL_FALSE, 0, npix, frame, 0, NULL, NULL));

        cl_int fno = f, cqp = qp;
        cl_mem dref = d_rr[ref], drec = d_rr[1 - ref];
        set5(kload, SZM, &d_src, SZM, &d_cur, SZI, &cw, SZI, &ch, SZI, &fno);
        CK(clEnqueueNDRangeKernel(q, kload, 2, NULL, gpix, NULL, 0, NULL, NULL));
        set5(kmot, SZM, &d_cur, SZM, &dref, SZM, &d_mv, SZI, &cw, SZI, &range);
        CK(clEnqueueNDRangeKernel(q, kmot, 2, NULL, gblk, NULL, 0, NULL, NULL));
        set5(kres, SZM, &d_cur, SZM, &dref, SZM, &d_mv, SZM, &d_res, SZI, &cw);
        CK(clEnqueueNDRangeKernel(q, kres, 2, NULL, gpix, NULL, 0, NULL, NULL));
        set5(ktr, SZM, &d_res, SZM, &d_coef, SZI, &cw, SZI, &ch, SZI, &shift);
        CK(clEnqueueNDRangeKernel(q, ktr, 2, NULL, g4, NULL, 0, NULL, NULL));
        set5(kq, SZM, &d_coef, SZM, &d_lev, SZI, &cqp, SZI, &cw, SZI, &deadzone);
        CK(clEnqueueNDRangeKernel(q, kq, 2, NULL, gpix, NULL, 0, NULL, NULL));
        set5(krec, SZM, &d_lev, SZM, &dref, SZM, &d_mv, SZM, &drec, SZI, &cqp);
        CK(clEnqueueNDRangeKernel(q, krec, 2, NULL, gpix, NULL, 0, NULL, NULL));
        set5(kent, SZM, &d_lev, SZM, &d_mv, SZM, &d_bits, SZI, &cw, SZI, &cqp);
        CK(clEnqueueNDRangeKernel(q, kent, 2, NULL, gblk, NULL, 0, NULL, NULL));
        CK(clEnqueueReadBuffer(q, d_bits, CL_TRUE, 0, nblk * 32, bits, 0, NULL, NULL));
        hash_bytes(bits, nblk * 32);

        /* rate control from the read-back estimate */
        uint64_t fb = 0;
        for (size_t b = 0; b < nblk; b++)
            fb += bits[b * 8 + 2];
        total_bits += fb;
        uint64_t target = nblk * 120;
        if (fb > target && qp < 40)
            qp++;
        else if (fb < target && qp > 0)
            qp--;

        if (f % 16 == 15 || f == frames - 1) {
            CK(clEnqueueReadBuffer(q, drec, CL_TRUE, 0, npix * 4, recon, 0, NULL, NULL));
            hash_bytes(recon, npix * 4);
        }
        ref = 1 - ref;
        if (f % 1000 == 999)
            printf("frameloop: frame %d qp %d\n", f + 1, qp);
    }
    CK(clFinish(q));
    double dt = now_s() - t0;
    printf("frameloop: %d frames %dx%d, %llu estimated bits, final qp %d\n", frames, w, h,
           (unsigned long long)total_bits, qp);
    fprintf(stderr, "frameloop: %d frames in %.3f s, %.1f frames/s\n", frames, dt, frames / dt);

    cl_mem mems[] = {d_src, d_cur, d_rr[0], d_rr[1], d_mv, d_res, d_coef, d_lev, d_bits};
    for (size_t i = 0; i < sizeof mems / sizeof mems[0]; i++)
        CK(clReleaseMemObject(mems[i]));
    cl_kernel ks[] = {kload, kmot, kres, ktr, kq, krec, kent};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++)
        CK(clReleaseKernel(ks[i]));
    CK(clReleaseProgram(prog));
    CK(clReleaseCommandQueue(q));
    CK(clReleaseContext(ctx));
    free(frame);
    free(bits);
    free(recon);
    print_result();
    return 0;
}
