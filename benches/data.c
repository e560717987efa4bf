/* Every way an application moves data, timed: buffers read, written and
 * copied from pageable, pinned (a mapped CL_MEM_ALLOC_HOST_PTR buffer) and
 * CL_MEM_USE_HOST_PTR memory, blocking and not; rectangles; images; fills;
 * maps of device, ALLOC_HOST_PTR and USE_HOST_PTR buffers; creation with
 * CL_MEM_COPY_HOST_PTR. Each path's result is checked (a wrong byte ends the
 * run with status 1), so the figures are of transfers that worked.
 *
 *   data [--sizes 1K,64K,1M,16M,256M] [--bytes-per-path N] [--platform NAME]
 *
 * Prints one line per path and size:  DATA <path> <bytes> <seconds per op>
 * `cargo xtask bench-data` runs it natively and under crane and prints ratios.
 */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(x)                                                                     \
    do {                                                                             \
        cl_int e_ = (x);                                                             \
        if (e_ != CL_SUCCESS) {                                                      \
            fprintf(stderr, "data: %s:%d: %s failed: %d\n", __FILE__, __LINE__, #x, e_); \
            exit(2);                                                                 \
        }                                                                            \
    } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static cl_context ctx;
static cl_command_queue q;
static size_t per_path = (size_t)1 << 30;

static void fill_pattern(unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 131u + seed);
}

static void expect_pattern(const char *path, const unsigned char *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++) {
        if (p[i] != (unsigned char)(i * 131u + seed)) {
            fprintf(stderr, "data: %s: byte %zu of %zu is %u, expected %u\n", path, i, n, p[i],
                    (unsigned char)(i * 131u + seed));
            exit(1);
        }
    }
}

static int reps_for(size_t bytes) {
    size_t r = per_path / bytes;
    if (r < 3) r = 3;
    if (r > 2000) r = 2000;
    return (int)r;
}

static void report(const char *path, size_t bytes, double secs, int reps) {
    printf("DATA %s %zu %.9f\n", path, bytes, secs / reps);
    fflush(stdout);
}

/* Reads `dev` back with a blocking read and checks it holds pattern `seed`. */
static void verify(const char *path, cl_mem dev, size_t n, unsigned seed) {
    unsigned char *h = malloc(n);
    CHECK(clEnqueueReadBuffer(q, dev, CL_TRUE, 0, n, h, 0, NULL, NULL));
    expect_pattern(path, h, n, seed);
    free(h);
}

static cl_mem buffer(cl_mem_flags flags, size_t n, void *host) {
    cl_int e;
    cl_mem m = clCreateBuffer(ctx, flags, n, host, &e);
    CHECK(e);
    return m;
}

typedef void (*op_fn)(size_t n, void *arg);
#define TIMED(path, n, body)                                         \
    do {                                                             \
        int reps_ = reps_for(n);                                     \
        { body; }                                                    \
        CHECK(clFinish(q));                                          \
        double t_ = now();                                           \
        for (int r_ = 0; r_ < reps_; r_++) { body; }                 \
        CHECK(clFinish(q));                                          \
        report(path, n, now() - t_, reps_);                          \
    } while (0)

static void run_size(size_t n, int images) {
    cl_int e;
    cl_mem dev = buffer(CL_MEM_READ_WRITE, n, NULL);
    cl_mem dev2 = buffer(CL_MEM_READ_WRITE, n, NULL);
    unsigned char *pageable = malloc(n);
    cl_mem pinbuf = buffer(CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR, n, NULL);
    unsigned char *pinned =
        clEnqueueMapBuffer(q, pinbuf, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, n, 0, NULL, NULL, &e);
    CHECK(e);
    unsigned char *app = aligned_alloc(4096, (n + 4095) / 4096 * 4096);

    struct { const char *name; unsigned char *p; } srcs[] = {{"pageable", pageable}, {"pinned", pinned}};
    char path[96];
    for (int s = 0; s < 2; s++) {
        unsigned char *h = srcs[s].p;
        fill_pattern(h, n, 1);
        snprintf(path, sizeof path, "write-%s", srcs[s].name);
        TIMED(path, n, CHECK(clEnqueueWriteBuffer(q, dev, CL_TRUE, 0, n, h, 0, NULL, NULL)));
        verify(path, dev, n, 1);
        snprintf(path, sizeof path, "write-%s-nonblocking", srcs[s].name);
        TIMED(path, n, CHECK(clEnqueueWriteBuffer(q, dev, CL_FALSE, 0, n, h, 0, NULL, NULL)));
        verify(path, dev, n, 1);
        memset(h, 0, n);
        snprintf(path, sizeof path, "read-%s", srcs[s].name);
        TIMED(path, n, CHECK(clEnqueueReadBuffer(q, dev, CL_TRUE, 0, n, h, 0, NULL, NULL)));
        expect_pattern(path, h, n, 1);
        memset(h, 0, n);
        snprintf(path, sizeof path, "read-%s-nonblocking", srcs[s].name);
        TIMED(path, n, CHECK(clEnqueueReadBuffer(q, dev, CL_FALSE, 0, n, h, 0, NULL, NULL)));
        CHECK(clFinish(q));
        expect_pattern(path, h, n, 1);
    }

    /* Rectangles: rows of up to 4 KiB. */
    size_t row = n < 4096 ? n : 4096, rows = n / row;
    size_t origin[3] = {0, 0, 0}, region[3] = {row, rows, 1};
    fill_pattern(pinned, row * rows, 2);
    TIMED("write-rect-pinned", row * rows,
          CHECK(clEnqueueWriteBufferRect(q, dev, CL_TRUE, origin, origin, region, row, 0, row, 0,
                                         pinned, 0, NULL, NULL)));
    verify("write-rect-pinned", dev, row * rows, 2);
    memset(pageable, 0, n);
    TIMED("read-rect-pageable", row * rows,
          CHECK(clEnqueueReadBufferRect(q, dev, CL_TRUE, origin, origin, region, row, 0, row, 0,
                                        pageable, 0, NULL, NULL)));
    expect_pattern("read-rect-pageable", pageable, row * rows, 2);

    /* Device-side copy and fill. */
    TIMED("copy", n, CHECK(clEnqueueCopyBuffer(q, dev, dev2, 0, 0, n, 0, NULL, NULL)));
    verify("copy", dev2, row * rows, 2);
    unsigned pattern = 0x01020304u;
    TIMED("fill", n / 4 * 4,
          CHECK(clEnqueueFillBuffer(q, dev2, &pattern, 4, 0, n / 4 * 4, 0, NULL, NULL)));

    /* Maps of a device buffer. */
    fill_pattern(pageable, n, 3);
    CHECK(clEnqueueWriteBuffer(q, dev, CL_TRUE, 0, n, pageable, 0, NULL, NULL));
    TIMED("map-read-unmap", n, {
        unsigned char *m = clEnqueueMapBuffer(q, dev, CL_TRUE, CL_MAP_READ, 0, n, 0, NULL, NULL, &e);
        CHECK(e);
        if (m[n - 1] != (unsigned char)((n - 1) * 131u + 3)) {
            fprintf(stderr, "data: map-read-unmap: wrong last byte\n");
            exit(1);
        }
        CHECK(clEnqueueUnmapMemObject(q, dev, m, 0, NULL, NULL));
    });
    TIMED("map-write-invalidate-unmap", n, {
        unsigned char *m = clEnqueueMapBuffer(q, dev, CL_TRUE, CL_MAP_WRITE_INVALIDATE_REGION, 0, n,
                                              0, NULL, NULL, &e);
        CHECK(e);
        m[0] = 7;
        m[n - 1] = 9;
        CHECK(clEnqueueUnmapMemObject(q, dev, m, 0, NULL, NULL));
    });
    TIMED("map-readwrite-unmap", n, {
        unsigned char *m = clEnqueueMapBuffer(q, dev, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, n, 0,
                                              NULL, NULL, &e);
        CHECK(e);
        m[n / 2] = (unsigned char)(m[n / 2] + 1);
        CHECK(clEnqueueUnmapMemObject(q, dev, m, 0, NULL, NULL));
    });
    {
        unsigned char first = 0, last = 0;
        CHECK(clEnqueueReadBuffer(q, dev, CL_TRUE, 0, 1, &first, 0, NULL, NULL));
        CHECK(clEnqueueReadBuffer(q, dev, CL_TRUE, n - 1, 1, &last, 0, NULL, NULL));
        if (first != 7 || last != 9) {
            fprintf(stderr, "data: map-write-invalidate-unmap: writes lost (%u %u)\n", first, last);
            exit(1);
        }
    }

    /* The mapped ALLOC_HOST_PTR buffer itself, unmapped and mapped again. */
    CHECK(clEnqueueUnmapMemObject(q, pinbuf, pinned, 0, NULL, NULL));
    TIMED("map-alloc-host-ptr-unmap", n, {
        unsigned char *m = clEnqueueMapBuffer(q, pinbuf, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, n, 0,
                                              NULL, NULL, &e);
        CHECK(e);
        m[0] = 5;
        CHECK(clEnqueueUnmapMemObject(q, pinbuf, m, 0, NULL, NULL));
    });

    /* A CL_MEM_USE_HOST_PTR buffer over the application's memory. */
    fill_pattern(app, n, 4);
    cl_mem uhp = buffer(CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, n, app);
    TIMED("map-use-host-ptr-unmap", n, {
        unsigned char *m = clEnqueueMapBuffer(q, uhp, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, n, 0,
                                              NULL, NULL, &e);
        CHECK(e);
        if (m != app) {
            fprintf(stderr, "data: a USE_HOST_PTR map is not at the host pointer\n");
            exit(1);
        }
        CHECK(clEnqueueUnmapMemObject(q, uhp, m, 0, NULL, NULL));
    });
    TIMED("copy-from-use-host-ptr", n, CHECK(clEnqueueCopyBuffer(q, uhp, dev2, 0, 0, n, 0, NULL, NULL)));
    verify("copy-from-use-host-ptr", dev2, n, 4);
    CHECK(clReleaseMemObject(uhp));

    /* Creation with CL_MEM_COPY_HOST_PTR (then a first use, so that lazy
     * vendors copy too). */
    fill_pattern(pageable, n, 5);
    TIMED("create-copy-host-ptr", n, {
        cl_mem c = buffer(CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, n, pageable);
        CHECK(clEnqueueCopyBuffer(q, c, dev2, 0, 0, 1, 0, NULL, NULL));
        CHECK(clFinish(q));
        CHECK(clReleaseMemObject(c));
    });

    /* 2D RGBA8 images of 1024-pixel rows. */
    if (images && n >= 4096) {
        cl_image_format fmt = {CL_RGBA, CL_UNSIGNED_INT8};
        cl_image_desc desc;
        memset(&desc, 0, sizeof desc);
        desc.image_type = CL_MEM_OBJECT_IMAGE2D;
        desc.image_width = 1024;
        desc.image_height = n / 4096;
        cl_mem img = clCreateImage(ctx, CL_MEM_READ_WRITE, &fmt, &desc, NULL, &e);
        if (e == CL_SUCCESS) {
            size_t ib = 4096 * desc.image_height, reg[3] = {1024, desc.image_height, 1};
            fill_pattern(pageable, ib, 6);
            TIMED("write-image", ib,
                  CHECK(clEnqueueWriteImage(q, img, CL_TRUE, origin, reg, 0, 0, pageable, 0, NULL, NULL)));
            memset(pageable, 0, ib);
            TIMED("read-image", ib,
                  CHECK(clEnqueueReadImage(q, img, CL_TRUE, origin, reg, 0, 0, pageable, 0, NULL, NULL)));
            expect_pattern("read-image", pageable, ib, 6);
            TIMED("map-image-read-unmap", ib, {
                size_t rp = 0;
                unsigned char *m = clEnqueueMapImage(q, img, CL_TRUE, CL_MAP_READ, origin, reg, &rp, NULL,
                                                     0, NULL, NULL, &e);
                CHECK(e);
                if (m[rp * (desc.image_height - 1) + 4095] !=
                    (unsigned char)((ib - 1) * 131u + 6)) {
                    fprintf(stderr, "data: map-image-read-unmap: wrong last byte\n");
                    exit(1);
                }
                CHECK(clEnqueueUnmapMemObject(q, img, m, 0, NULL, NULL));
            });
            CHECK(clReleaseMemObject(img));
        }
    }

    CHECK(clReleaseMemObject(pinbuf));
    CHECK(clReleaseMemObject(dev2));
    CHECK(clReleaseMemObject(dev));
    free(pageable);
    free(app);
}

static size_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'K': case 'k': v *= 1024; break;
    case 'M': case 'm': v *= 1024 * 1024; break;
    case 'G': case 'g': v *= 1024.0 * 1024 * 1024; break;
    }
    return (size_t)v;
}

int main(int argc, char **argv) {
    const char *sizes = "1K,64K,1M,16M,256M", *want = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--sizes")) sizes = argv[i + 1];
        else if (!strcmp(argv[i], "--bytes-per-path")) per_path = parse_size(argv[i + 1]);
        else if (!strcmp(argv[i], "--platform")) want = argv[i + 1];
        else {
            fprintf(stderr, "usage: data [--sizes LIST] [--bytes-per-path N] [--platform NAME]\n");
            return 2;
        }
    }
    cl_platform_id pl[8];
    cl_uint np = 0;
    CHECK(clGetPlatformIDs(8, pl, &np));
    cl_uint pi = 0;
    for (cl_uint i = 0; i < np && want; i++) {
        char name[256] = "";
        clGetPlatformInfo(pl[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
        if (strstr(name, want)) pi = i;
    }
    cl_device_id dev;
    CHECK(clGetDeviceIDs(pl[pi], CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
    char name[256] = "";
    clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof name, name, NULL);
    cl_bool images = CL_FALSE;
    clGetDeviceInfo(dev, CL_DEVICE_IMAGE_SUPPORT, sizeof images, &images, NULL);
    printf("DEVICE %s\n", name);
    cl_int e;
    ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &e);
    CHECK(e);
    q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &e);
    CHECK(e);
    char *list = strdup(sizes);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) run_size(parse_size(tok), images);
    free(list);
    CHECK(clReleaseCommandQueue(q));
    CHECK(clReleaseContext(ctx));
    return 0;
}
