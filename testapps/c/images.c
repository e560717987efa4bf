/* images: 2D images read/written by kernels through samplers.
 *
 * RGBA/UNSIGNED_INT8 images are ping-ponged through a 3x3 filter kernel
 * (unnormalized, clamp-to-edge, nearest sampler from clCreateSampler);
 * an RGBA/FLOAT image is warped through a normalized repeat nearest sampler
 * (clCreateSamplerWithProperties where the platform is >= 2.0).  Every
 * iteration uses clEnqueueWriteImage, ReadImage, CopyImage, CopyImageToBuffer,
 * CopyBufferToImage and FillImage on sub-rectangles.  One image is created
 * with the deprecated clCreateImage2D as old apps do; a 1D image made from a
 * buffer (CL_MEM_OBJECT_IMAGE1D_BUFFER) is written through the image and read
 * back whole (PoCL before 7.0 leaks a context reference per such image, which
 * crane must give back for a suspend to unload PoCL completely); an image
 * the host may not access (CL_MEM_HOST_NO_ACCESS) is written and read only
 * by the device (crane reads it at a suspend through a copy on the device).  Nearest filtering and
 * exact texel-centre coordinates keep the results bit-identical.
 */
#define CL_USE_DEPRECATED_OPENCL_1_1_APIS
#include "common.h"

static const char *SRC =
    "__kernel void ufilter(__read_only image2d_t src, __write_only image2d_t dst, sampler_t smp, uint salt)\n"
    "{\n"
    "    int x = get_global_id(0), y = get_global_id(1);\n"
    "    uint4 acc = (uint4)(0u);\n"
    "    for (int dy = -1; dy <= 1; dy++)\n"
    "        for (int dx = -1; dx <= 1; dx++)\n"
    "            acc += read_imageui(src, smp, (int2)(x + dx, y + dy));\n"
    "    uint4 c = read_imageui(src, smp, (int2)(x, y));\n"
    "    uint4 o = (acc / 9u + c.yzwx * 3u + (uint4)(salt, salt >> 8, salt >> 16, (uint)(x ^ y))) & 0xffu;\n"
    "    write_imageui(dst, (int2)(x, y), o);\n"
    "}\n"
    "__kernel void fwarp(__read_only image2d_t src, __write_only image2d_t dst, sampler_t smp, float shift)\n"
    "{\n"
    "    int x = get_global_id(0), y = get_global_id(1);\n"
    "    int w = get_image_width(dst), h = get_image_height(dst);\n"
    "    float2 c = (float2)(((float)x + 0.5f) / (float)w + shift, ((float)y + 0.5f) / (float)h);\n"
    "    float4 v = read_imagef(src, smp, c);\n"
    "    float4 k = (float4)((float)x, (float)y, shift, 1.0f) * 0.0625f;\n"
    "    write_imagef(dst, (int2)(x, y), v.yzwx * 0.75f + k);\n"
    "}\n";

#define W 128u
#define H 64u

static int has_format(const cl_image_format *fmts, cl_uint n, cl_channel_order o, cl_channel_type t)
{
    for (cl_uint i = 0; i < n; i++)
        if (fmts[i].image_channel_order == o && fmts[i].image_channel_data_type == t)
            return 1;
    return 0;
}

static cl_mem make_image(cl_context ctx, cl_mem_flags flags, cl_channel_type t, void *host)
{
    cl_image_format fmt = {CL_RGBA, t};
    cl_image_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.image_type = CL_MEM_OBJECT_IMAGE2D;
    desc.image_width = W;
    desc.image_height = H;
    cl_int err;
    cl_mem m = clCreateImage(ctx, flags, &fmt, &desc, host, &err);
    CKE(err, "clCreateImage");
    return m;
}

int main(int argc, char **argv)
{
    g_prog = "images";
    int iters = parse_iters(argc, argv, 3600);
    cl_platform_id plat;
    cl_device_id dev;
    pick_device(&plat, &dev);
    double t0 = now_s();

    cl_bool img_support = CL_FALSE;
    CK(clGetDeviceInfo(dev, CL_DEVICE_IMAGE_SUPPORT, sizeof img_support, &img_support, NULL));
    if (!img_support)
        skip_all("device has no image support");

    cl_context ctx = make_context(plat, dev);
    cl_uint nfmt = 0;
    CK(clGetSupportedImageFormats(ctx, CL_MEM_READ_WRITE, CL_MEM_OBJECT_IMAGE2D, 0, NULL, &nfmt));
    cl_image_format *fmts = xmalloc(sizeof(cl_image_format) * (nfmt ? nfmt : 1));
    CK(clGetSupportedImageFormats(ctx, CL_MEM_READ_WRITE, CL_MEM_OBJECT_IMAGE2D, nfmt, fmts, NULL));
    if (!has_format(fmts, nfmt, CL_RGBA, CL_UNSIGNED_INT8) || !has_format(fmts, nfmt, CL_RGBA, CL_FLOAT))
        skip_all("RGBA UNSIGNED_INT8 or RGBA FLOAT 2D images unsupported");
    free(fmts);

    cl_command_queue q = make_queue(ctx, dev, 0);
    cl_program prog = build_source(ctx, dev, SRC, "-cl-std=CL1.2");
    cl_kernel kuf = make_kernel(prog, "ufilter");
    cl_kernel kfw = make_kernel(prog, "fwarp");

    cl_int err;
    cl_sampler s_u = clCreateSampler(ctx, CL_FALSE, CL_ADDRESS_CLAMP_TO_EDGE, CL_FILTER_NEAREST, &err);
    CKE(err, "clCreateSampler");
    cl_sampler s_f;
    if (platform_version(plat) >= 20 && device_version(dev) >= 20) {
        cl_sampler_properties sp[] = {CL_SAMPLER_NORMALIZED_COORDS, CL_TRUE,
                                      CL_SAMPLER_ADDRESSING_MODE,   CL_ADDRESS_REPEAT,
                                      CL_SAMPLER_FILTER_MODE,       CL_FILTER_NEAREST,
                                      0};
        s_f = clCreateSamplerWithProperties(ctx, sp, &err);
        CKE(err, "clCreateSamplerWithProperties");
    } else {
        s_f = clCreateSampler(ctx, CL_TRUE, CL_ADDRESS_REPEAT, CL_FILTER_NEAREST, &err);
        CKE(err, "clCreateSampler");
    }

    /* initial contents */
    uint32_t seed = 0x5eed1u;
    unsigned char *u8 = xmalloc(W * H * 4);
    for (size_t i = 0; i < W * H * 4; i++)
        u8[i] = (unsigned char)rng_next(&seed);
    float *f32 = xmalloc(W * H * 4 * sizeof(float));
    for (size_t i = 0; i < W * H * 4; i++)
        f32[i] = (float)(rng_next(&seed) & 0xffff) / 65536.0f;

    cl_mem imgu[2];
    imgu[0] = make_image(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, CL_UNSIGNED_INT8, u8);
    imgu[1] = make_image(ctx, CL_MEM_READ_WRITE, CL_UNSIGNED_INT8, NULL);
    cl_mem imgf = make_image(ctx, CL_MEM_READ_WRITE, CL_FLOAT, NULL);
    cl_image_format ffmt = {CL_RGBA, CL_FLOAT};
    cl_mem imgf2 = clCreateImage2D(ctx, CL_MEM_READ_WRITE, &ffmt, W, H, 0, NULL, &err);
    CKE(err, "clCreateImage2D");
    size_t origin0[3] = {0, 0, 0}, full[3] = {W, H, 1};
    CK(clEnqueueWriteImage(q, imgf, CL_TRUE, origin0, full, 0, 0, f32, 0, NULL, NULL));
    size_t qw = 0;
    CK(clGetImageInfo(imgf2, CL_IMAGE_WIDTH, sizeof qw, &qw, NULL));
    if (qw != W)
        fail("clGetImageInfo width mismatch");

    const size_t bufbytes = W * H * 4;
    cl_mem buf = make_buffer(ctx, CL_MEM_READ_WRITE, bufbytes, NULL);
    cl_uchar zero = 0;
    CK(clEnqueueFillBuffer(q, buf, &zero, 1, 0, bufbytes, 0, NULL, NULL));

    /* A 1D image made from a buffer (CL_MEM_OBJECT_IMAGE1D_BUFFER): written
     * through the image, so its contents live in the buffer's storage. */
    cl_mem buf1d = make_buffer(ctx, CL_MEM_READ_WRITE, W * 4, NULL);
    CK(clEnqueueFillBuffer(q, buf1d, &zero, 1, 0, W * 4, 0, NULL, NULL));
    cl_image_format fmt1d = {CL_RGBA, CL_UNSIGNED_INT8};
    cl_image_desc desc1d;
    memset(&desc1d, 0, sizeof desc1d);
    desc1d.image_type = CL_MEM_OBJECT_IMAGE1D_BUFFER;
    desc1d.image_width = W;
    desc1d.buffer = buf1d;
    cl_mem img1d = clCreateImage(ctx, CL_MEM_READ_WRITE, &fmt1d, &desc1d, NULL, &err);
    CKE(err, "clCreateImage (1D image buffer)");
    unsigned char *line1d = xmalloc(W * 4);

    /* An image the host may not access (CL_MEM_HOST_NO_ACCESS): only the
     * device writes it (copies from the uint images) and reads it (copied
     * out to a buffer). */
    cl_mem hidden = make_image(ctx, CL_MEM_READ_WRITE | CL_MEM_HOST_NO_ACCESS, CL_UNSIGNED_INT8, NULL);
    cl_mem hidden_out = make_buffer(ctx, CL_MEM_READ_WRITE, W * H * 4, NULL);
    {
        cl_uint4 black = {{0, 0, 0, 0}};
        size_t ho0[3] = {0, 0, 0}, hfull[3] = {W, H, 1};
        CK(clEnqueueFillImage(q, hidden, &black, ho0, hfull, 0, NULL, NULL));
    }

    unsigned char patch[16 * 16 * 4];
    unsigned char probe_u[32 * 8 * 4];
    float probe_f[16 * 4 * 4];
    float fpatch[8 * 8 * 4];
    unsigned char *full_u = xmalloc(W * H * 4);
    float *full_f = xmalloc(W * H * 4 * sizeof(float));
    int cur = 0;
    const size_t g2[2] = {W, H};

    for (int it = 0; it < iters; it++) {
        /* host patch into the current uint image */
        for (size_t i = 0; i < sizeof patch; i++)
            patch[i] = (unsigned char)(it * 31 + (int)i * 7);
        size_t po[3] = {((size_t)it * 13u) % (W - 16), ((size_t)it * 5u) % (H - 16), 0};
        size_t pr[3] = {16, 16, 1};
        CK(clEnqueueWriteImage(q, imgu[cur], CL_FALSE, po, pr, 16 * 4, 0, patch, 0, NULL, NULL));

        /* filter ping-pong */
        cl_uint salt = (cl_uint)it * 0x01000193u;
        CK(clSetKernelArg(kuf, 0, sizeof(cl_mem), &imgu[cur]));
        CK(clSetKernelArg(kuf, 1, sizeof(cl_mem), &imgu[1 - cur]));
        CK(clSetKernelArg(kuf, 2, sizeof(cl_sampler), &s_u));
        CK(clSetKernelArg(kuf, 3, sizeof(cl_uint), &salt));
        CK(clEnqueueNDRangeKernel(q, kuf, 2, NULL, g2, NULL, 0, NULL, NULL));
        cur = 1 - cur;

        /* probe read */
        size_t ro[3] = {((size_t)it * 7u) % (W - 32), ((size_t)it * 3u) % (H - 8), 0};
        size_t rr[3] = {32, 8, 1};
        CK(clEnqueueReadImage(q, imgu[cur], CL_FALSE, ro, rr, 0, 0, probe_u, 0, NULL, NULL));

        /* image -> buffer (4 rows) and, every 4th iteration, buffer -> image */
        size_t co[3] = {0, ((size_t)it * 4u) % H, 0};
        size_t cr[3] = {W, 4, 1};
        size_t boff = ((size_t)it % 16u) * W * 4u * 4u;
        CK(clEnqueueCopyImageToBuffer(q, imgu[cur], buf, co, cr, boff, 0, NULL, NULL));
        if (it % 4 == 3) {
            size_t bo[3] = {((size_t)it * 11u) % (W - 64), ((size_t)it * 9u) % (H - 2), 0};
            size_t br[3] = {64, 2, 1};
            size_t src_off = ((size_t)it * 256u) % (bufbytes - 64 * 2 * 4);
            CK(clEnqueueCopyBufferToImage(q, buf, imgu[cur], src_off, bo, br, 0, NULL, NULL));
        }
        if (it % 8 == 5) {
            cl_uint4 color = {{(cl_uint)it & 0xff, 0x11, 0x22, 0x33}};
            size_t fo[3] = {((size_t)it * 17u) % (W - 8), ((size_t)it * 19u) % (H - 8), 0};
            size_t fr[3] = {8, 8, 1};
            CK(clEnqueueFillImage(q, imgu[cur], &color, fo, fr, 0, NULL, NULL));
        }

        /* float warp through the normalized sampler, then copy half back */
        cl_float shift = (cl_float)(it % (int)W) / (cl_float)W;
        CK(clSetKernelArg(kfw, 0, sizeof(cl_mem), &imgf));
        CK(clSetKernelArg(kfw, 1, sizeof(cl_mem), &imgf2));
        CK(clSetKernelArg(kfw, 2, sizeof(cl_sampler), &s_f));
        CK(clSetKernelArg(kfw, 3, sizeof(cl_float), &shift));
        CK(clEnqueueNDRangeKernel(q, kfw, 2, NULL, g2, NULL, 0, NULL, NULL));
        size_t ho[3] = {0, (it % 2) ? H / 2 : 0, 0};
        size_t hr[3] = {W, H / 2, 1};
        CK(clEnqueueCopyImage(q, imgf2, imgf, ho, ho, hr, 0, NULL, NULL));
        for (size_t i = 0; i < 8 * 8 * 4; i++)
            fpatch[i] = (float)((it * 37 + (int)i) & 1023) / 1024.0f;
        size_t fpo[3] = {((size_t)it * 23u) % (W - 8), ((size_t)it * 29u) % (H - 8), 0};
        size_t fpr[3] = {8, 8, 1};
        CK(clEnqueueWriteImage(q, imgf, CL_FALSE, fpo, fpr, 0, 0, fpatch, 0, NULL, NULL));
        size_t fro[3] = {((size_t)it * 3u) % (W - 16), ((size_t)it * 2u) % (H - 4), 0};
        size_t frr[3] = {16, 4, 1};
        CK(clEnqueueReadImage(q, imgf, CL_FALSE, fro, frr, 16 * 4 * sizeof(float), 0, probe_f, 0, NULL, NULL));

        /* 16x16 pixels into the image the host may not access */
        size_t hso[3] = {((size_t)it * 3u) % (W - 16), ((size_t)it * 7u) % (H - 16), 0};
        size_t hdo[3] = {((size_t)it * 11u) % (W - 16), ((size_t)it * 5u) % (H - 16), 0};
        size_t hreg[3] = {16, 16, 1};
        CK(clEnqueueCopyImage(q, imgu[cur], hidden, hso, hdo, hreg, 0, NULL, NULL));

        /* 16 pixels of the 1D image buffer, through the image */
        size_t lo[3] = {((size_t)it * 5u) % (W - 16), 0, 0}, lr[3] = {16, 1, 1};
        CK(clEnqueueWriteImage(q, img1d, CL_FALSE, lo, lr, 0, 0, patch, 0, NULL, NULL));

        CK(clFinish(q));
        hash_bytes(probe_u, sizeof probe_u);
        hash_bytes(probe_f, sizeof probe_f);

        if (it % 50 == 49 || it == iters - 1) {
            CK(clEnqueueReadImage(q, imgu[cur], CL_TRUE, origin0, full, 0, 0, full_u, 0, NULL, NULL));
            hash_bytes(full_u, W * H * 4);
            CK(clEnqueueReadImage(q, imgf, CL_TRUE, origin0, full, 0, 0, full_f, 0, NULL, NULL));
            hash_bytes(full_f, W * H * 4 * sizeof(float));
            CK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, bufbytes, full_u, 0, NULL, NULL));
            hash_bytes(full_u, bufbytes);
            size_t lfull[3] = {W, 1, 1};
            CK(clEnqueueReadImage(q, img1d, CL_TRUE, origin0, lfull, 0, 0, line1d, 0, NULL, NULL));
            hash_bytes(line1d, W * 4);
            CK(clEnqueueCopyImageToBuffer(q, hidden, hidden_out, origin0, full, 0, 0, NULL, NULL));
            CK(clEnqueueReadBuffer(q, hidden_out, CL_TRUE, 0, W * H * 4, full_u, 0, NULL, NULL));
            hash_bytes(full_u, W * H * 4);
        }
        if (it % 500 == 499)
            printf("images: iteration %d\n", it + 1);
    }

    CK(clReleaseMemObject(imgu[0]));
    CK(clReleaseMemObject(imgu[1]));
    CK(clReleaseMemObject(imgf));
    CK(clReleaseMemObject(imgf2));
    CK(clReleaseMemObject(buf));
    CK(clReleaseMemObject(img1d));
    CK(clReleaseMemObject(buf1d));
    CK(clReleaseMemObject(hidden));
    CK(clReleaseMemObject(hidden_out));
    free(line1d);
    CK(clReleaseSampler(s_u));
    CK(clReleaseSampler(s_f));
    CK(clReleaseKernel(kuf));
    CK(clReleaseKernel(kfw));
    CK(clReleaseProgram(prog));
    CK(clReleaseCommandQueue(q));
    CK(clReleaseContext(ctx));
    free(u8);
    free(f32);
    free(full_u);
    free(full_f);
    fprintf(stderr, "images: %d iterations in %.3f s\n", iters, now_s() - t0);
    print_result();
    return 0;
}
