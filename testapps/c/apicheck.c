/* apicheck: OpenCL API behaviour that remoting must keep as the vendor has
 * it, each part checked against the specification and a host model:
 *   - CL_PROGRAM_DEVICES names the program's devices;
 *   - transfers, maps and initial contents of several MiB (larger than a
 *     frame of a crane-proxy started with a small --max-payload), blocking
 *     and not, on in-order and out-of-order queues, buffers, rects and
 *     images, and a CL_MEM_HOST_NO_ACCESS buffer made from host memory;
 *   - creation errors come back from the creating call itself, including a
 *     device-side queue the device cannot have;
 *   - CL_*_PROPERTIES queries answer the list the object was made with;
 *   - a kernel launch with a NULL global size (no work-items) succeeds;
 *   - clSetKernelArg, clEnqueueNDRangeKernel and a marker return their
 *     errors themselves (remoting posts them), and clFinish has none left;
 *   - CL_QUEUE_DEVICE_DEFAULT of a host queue and clGetPipeInfo of a buffer
 *     answer as the vendor does.
 * Every part prints one line; `--iters` repeats the transfers. */
/* clSetCommandQueueProperty (`--queue-property`) is an OpenCL 1.0 API. */
#define CL_USE_DEPRECATED_OPENCL_1_0_APIS
#include "common.h"

#define BIG ((size_t)3 * 1024 * 1024 + 12345)

static void fill_pattern(unsigned char *p, size_t n, uint32_t seed)
{
    uint32_t s = seed | 1;
    for (size_t i = 0; i < n; i++)
        p[i] = (unsigned char)rng_next(&s);
}

static void expect_same(const void *got, const void *want, size_t n, const char *what)
{
    if (memcmp(got, want, n) != 0)
        fail(what);
    hash_bytes(got, n);
}

static void program_devices(cl_context ctx, cl_device_id dev)
{
    const char *src = "__kernel void k(__global int *p) { p[0] = 1; }";
    cl_int err;
    cl_program prog = clCreateProgramWithSource(ctx, 1, &src, NULL, &err);
    CKE(err, "clCreateProgramWithSource");
    size_t n = 0;
    CK(clGetProgramInfo(prog, CL_PROGRAM_DEVICES, 0, NULL, &n));
    if (n != sizeof(cl_device_id))
        fail("CL_PROGRAM_DEVICES size");
    cl_device_id d = NULL;
    CK(clGetProgramInfo(prog, CL_PROGRAM_DEVICES, sizeof d, &d, NULL));
    if (d != dev)
        fail("CL_PROGRAM_DEVICES names another device");
    cl_uint num = 0;
    CK(clGetProgramInfo(prog, CL_PROGRAM_NUM_DEVICES, sizeof num, &num, NULL));
    printf("apicheck: program devices %zu, num %u, same device\n", n / sizeof d, num);
    CK(clReleaseProgram(prog));
}

static void errors_and_properties(cl_platform_id plat, cl_context ctx, cl_device_id dev)
{
    cl_int err = CL_SUCCESS;
    cl_command_queue bad = clCreateCommandQueue(ctx, dev, (cl_command_queue_properties)-1, &err);
    printf("apicheck: clCreateCommandQueue(all bits) %d %s\n", (int)err, bad ? "object" : "NULL");
    if (bad)
        CK(clReleaseCommandQueue(bad));
    err = CL_SUCCESS;
    cl_mem none = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 0, NULL, &err);
    printf("apicheck: clCreateBuffer(size 0) %d %s\n", (int)err, none ? "object" : "NULL");
    if (none)
        CK(clReleaseMemObject(none));

    size_t n = 99;
    cl_sampler smp = clCreateSampler(ctx, CL_FALSE, CL_ADDRESS_CLAMP, CL_FILTER_NEAREST, &err);
    CKE(err, "clCreateSampler");
    CK(clGetSamplerInfo(smp, CL_SAMPLER_PROPERTIES, 0, NULL, &n));
    printf("apicheck: CL_SAMPLER_PROPERTIES of clCreateSampler: %zu bytes\n", n);
    CK(clReleaseSampler(smp));
    if (platform_version(plat) >= 30) {
        cl_mem_properties mp[] = {0};
        cl_mem m = clCreateBufferWithProperties(ctx, mp, CL_MEM_READ_WRITE, 64, NULL, &err);
        CKE(err, "clCreateBufferWithProperties");
        n = 99;
        CK(clGetMemObjectInfo(m, CL_MEM_PROPERTIES, 0, NULL, &n));
        printf("apicheck: CL_MEM_PROPERTIES of an empty list: %zu bytes\n", n);
        CK(clReleaseMemObject(m));
        m = make_buffer(ctx, CL_MEM_READ_WRITE, 64, NULL);
        n = 99;
        CK(clGetMemObjectInfo(m, CL_MEM_PROPERTIES, 0, NULL, &n));
        printf("apicheck: CL_MEM_PROPERTIES of clCreateBuffer: %zu bytes\n", n);
        cl_queue_properties qp[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
        cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, qp, &err);
        CKE(err, "clCreateCommandQueueWithProperties");
        cl_queue_properties got[4] = {0};
        CK(clGetCommandQueueInfo(q, CL_QUEUE_PROPERTIES_ARRAY, sizeof got, got, &n));
        printf("apicheck: CL_QUEUE_PROPERTIES_ARRAY %zu bytes, %llx %llx\n", n,
               (unsigned long long)got[0], (unsigned long long)got[1]);
        const char *src = "__kernel void k(__global int *p) { p[get_global_id(0)] = 7; }";
        cl_program prog = build_source(ctx, dev, src, NULL);
        cl_kernel k = make_kernel(prog, "k");
        CK(clSetKernelArg(k, 0, sizeof m, &m));
        err = clEnqueueNDRangeKernel(q, k, 1, NULL, NULL, NULL, 0, NULL, NULL);
        printf("apicheck: NDRange with a NULL global size %d\n", (int)err);
        CK(clFinish(q));
        CK(clReleaseKernel(k));
        CK(clReleaseProgram(prog));
        CK(clReleaseCommandQueue(q));
        CK(clReleaseMemObject(m));
    }
}

static void big_buffers(cl_context ctx, cl_device_id dev, int iter)
{
    cl_int err;
    unsigned char *a = xmalloc(BIG), *b = xmalloc(BIG), *got = xmalloc(BIG);
    fill_pattern(a, BIG, 11u + (uint32_t)iter);
    fill_pattern(b, BIG, 97u + (uint32_t)iter);
    cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err);
    CKE(err, "clCreateCommandQueue");

    /* Initial contents larger than a frame. */
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, BIG, a, &err);
    CKE(err, "clCreateBuffer");
    memset(got, 0, BIG);
    CK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, BIG, got, 0, NULL, NULL));
    expect_same(got, a, BIG, "big COPY_HOST_PTR buffer read back");

    /* The same for a buffer the host may not access: copied out on the device. */
    cl_mem hidden = clCreateBuffer(ctx, CL_MEM_HOST_NO_ACCESS | CL_MEM_COPY_HOST_PTR, BIG, b, &err);
    CKE(err, "clCreateBuffer");
    CK(clEnqueueCopyBuffer(q, hidden, m, 0, 0, BIG, 0, NULL, NULL));
    memset(got, 0, BIG);
    CK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, BIG, got, 0, NULL, NULL));
    expect_same(got, b, BIG, "big HOST_NO_ACCESS buffer copied out");

    /* Non-blocking write and read with events. */
    cl_event we, re;
    CK(clEnqueueWriteBuffer(q, m, CL_FALSE, 0, BIG, a, 0, NULL, &we));
    memset(got, 0, BIG);
    CK(clEnqueueReadBuffer(q, m, CL_FALSE, 0, BIG, got, 1, &we, &re));
    CK(clWaitForEvents(1, &re));
    cl_int st = 1;
    CK(clGetEventInfo(re, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof st, &st, NULL));
    if (st != CL_COMPLETE)
        fail("non-blocking big read not complete after its wait");
    expect_same(got, a, BIG, "non-blocking big write and read");
    CK(clReleaseEvent(we));
    CK(clReleaseEvent(re));

    /* An out-of-order queue: the read waits for the write's event only. */
    cl_command_queue oq = clCreateCommandQueue(ctx, dev, CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, &err);
    if (err == CL_SUCCESS) {
        CK(clEnqueueWriteBuffer(oq, m, CL_FALSE, 0, BIG, b, 0, NULL, &we));
        memset(got, 0, BIG);
        CK(clEnqueueReadBuffer(oq, m, CL_FALSE, 0, BIG, got, 1, &we, &re));
        CK(clWaitForEvents(1, &re));
        expect_same(got, b, BIG, "out-of-order big write and read");
        CK(clReleaseEvent(we));
        CK(clReleaseEvent(re));
        CK(clReleaseCommandQueue(oq));
        printf("apicheck: out-of-order big transfers ok\n");
    } else {
        printf("apicheck: no out-of-order queue\n");
    }

    /* A map of the whole buffer, written and read back. */
    unsigned char *p = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, BIG, 0, NULL, NULL, &err);
    CKE(err, "clEnqueueMapBuffer");
    expect_same(p, b, BIG, "big map read");
    memcpy(p, a, BIG);
    CK(clEnqueueUnmapMemObject(q, m, p, 0, NULL, NULL));
    memset(got, 0, BIG);
    CK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, BIG, got, 0, NULL, NULL));
    expect_same(got, a, BIG, "big map written back");

    /* Rects: rows longer than a frame, and many short rows. */
    size_t bo[3] = {3, 0, 0}, ho[3] = {5, 0, 0};
    size_t long_rows[3] = {(BIG - 64) / 2, 2, 1};
    size_t pitch = BIG / 2;
    memset(got, 0, BIG);
    CK(clEnqueueReadBufferRect(q, m, CL_TRUE, bo, ho, long_rows, pitch, 0, pitch, 0, got, 0, NULL, NULL));
    for (size_t y = 0; y < 2; y++)
        expect_same(got + 5 + y * pitch, a + 3 + y * pitch, long_rows[0], "rect read, long rows");
    size_t many[3] = {1000, 1500, 2};
    size_t bo2[3] = {7, 2, 0};
    CK(clEnqueueWriteBufferRect(q, m, CL_TRUE, bo2, ho, many, 1024, 1024 * 1536, 1000, 0, b, 0, NULL, NULL));
    CK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, BIG, got, 0, NULL, NULL));
    for (size_t z = 0; z < 2; z++)
        for (size_t y = 0; y < 1500; y++)
            if (memcmp(got + 7 + (2 + y) * 1024 + z * 1024 * 1536, b + 5 + y * 1000 + z * 1000 * 1500, 1000) != 0)
                fail("rect write, many rows");
    hash_bytes(got, BIG);

    CK(clReleaseMemObject(hidden));
    CK(clReleaseMemObject(m));
    CK(clReleaseCommandQueue(q));
    free(a);
    free(b);
    free(got);
    printf("apicheck: big buffers ok\n");
}

static void big_images(cl_context ctx, cl_device_id dev, int iter)
{
    cl_bool images = CL_FALSE;
    CK(clGetDeviceInfo(dev, CL_DEVICE_IMAGE_SUPPORT, sizeof images, &images, NULL));
    if (!images) {
        printf("SKIP apicheck/images no image support\n");
        return;
    }
    const size_t w = 1100, h = 900, n = w * h * 4;
    cl_int err;
    unsigned char *a = xmalloc(n), *got = xmalloc(n);
    fill_pattern(a, n, 5u + (uint32_t)iter);
    cl_image_format f = {CL_RGBA, CL_UNSIGNED_INT8};
    cl_image_desc d;
    memset(&d, 0, sizeof d);
    d.image_type = CL_MEM_OBJECT_IMAGE2D;
    d.image_width = w;
    d.image_height = h;
    cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err);
    CKE(err, "clCreateCommandQueue");
    cl_mem img = clCreateImage(ctx, CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR, &f, &d, a, &err);
    CKE(err, "clCreateImage");
    size_t o[3] = {0, 0, 0}, r[3] = {w, h, 1};
    memset(got, 0, n);
    CK(clEnqueueReadImage(q, img, CL_TRUE, o, r, 0, 0, got, 0, NULL, NULL));
    expect_same(got, a, n, "big image made from host memory");
    for (size_t i = 0; i < n; i++)
        a[i] = (unsigned char)(a[i] ^ 0x5a);
    CK(clEnqueueWriteImage(q, img, CL_FALSE, o, r, 0, 0, a, 0, NULL, NULL));
    memset(got, 0, n);
    cl_event e;
    CK(clEnqueueReadImage(q, img, CL_FALSE, o, r, 0, 0, got, 0, NULL, &e));
    CK(clWaitForEvents(1, &e));
    CK(clReleaseEvent(e));
    expect_same(got, a, n, "big image written and read");
    CK(clReleaseMemObject(img));
    CK(clReleaseCommandQueue(q));
    free(a);
    free(got);
    printf("apicheck: big images ok\n");
}

/* Errors of calls remoting posts: each call returns its own, as natively. */
static void posted_errors(cl_context ctx, cl_device_id dev)
{
    const char *src =
        "__kernel void k(__global int *p, __local int *l, char4 c, int n) { p[0] = n; }\n"
        "__kernel __attribute__((reqd_work_group_size(2, 1, 1)))\n"
        "void r(__global int *p) { p[get_global_id(0)] = 1; }\n"
        "__kernel void w(__global long *p, long v) { p[0] = v; }\n";
    cl_int err;
    cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err);
    CKE(err, "clCreateCommandQueue");
    cl_program prog = build_source(ctx, dev, src, NULL);
    cl_kernel k = make_kernel(prog, "k"), r = make_kernel(prog, "r");
    cl_mem m = make_buffer(ctx, CL_MEM_READ_WRITE, 64, NULL);
    int n = 3;
    cl_mem two[2] = {m, m};
    printf("apicheck: arg errors: buffer size %d, local value %d, local 0 %d, value size %d, "
           "no value %d\n",
           (int)clSetKernelArg(k, 0, sizeof two, two), (int)clSetKernelArg(k, 1, 4, &n),
           (int)clSetKernelArg(k, 1, 0, NULL), (int)clSetKernelArg(k, 2, 2, &n),
           (int)clSetKernelArg(k, 3, 4, NULL));
    CK(clSetKernelArg(k, 0, sizeof m, &m));
    CK(clSetKernelArg(k, 1, 16, NULL));
    CK(clSetKernelArg(k, 2, 4, &n));
    size_t g = 4, l = 4;
    printf("apicheck: launch with an argument unset %d\n",
           (int)clEnqueueNDRangeKernel(q, k, 1, NULL, &g, &l, 0, NULL, NULL));
    CK(clSetKernelArg(k, 3, 4, &n));
    CK(clSetKernelArg(r, 0, sizeof m, &m));
    cl_bool nonuniform = CL_FALSE;
    clGetDeviceInfo(dev, CL_DEVICE_NON_UNIFORM_WORK_GROUP_SUPPORT, sizeof nonuniform, &nonuniform, NULL);
    size_t g3 = 3, l2 = 2, huge = (size_t)1 << 40;
    printf("apicheck: launch errors: 4 dims %d, too large %d, required size %d, uniform %s\n",
           (int)clEnqueueNDRangeKernel(q, k, 4, NULL, &g, &l, 0, NULL, NULL),
           (int)clEnqueueNDRangeKernel(q, k, 1, NULL, &huge, &huge, 0, NULL, NULL),
           (int)clEnqueueNDRangeKernel(q, r, 1, NULL, &g, &l, 0, NULL, NULL),
           nonuniform ? "not required"
                      : clEnqueueNDRangeKernel(q, k, 1, NULL, &g3, &l2, 0, NULL, NULL) ==
                                CL_INVALID_WORK_GROUP_SIZE
                            ? "required"
                            : "not checked");
    cl_context other = clCreateContext(NULL, 1, &dev, NULL, NULL, &err);
    CKE(err, "clCreateContext");
    cl_event u = clCreateUserEvent(other, &err);
    CKE(err, "clCreateUserEvent");
    cl_event ev = NULL;
    err = clEnqueueMarkerWithWaitList(q, 1, &u, &ev);
    printf("apicheck: marker waiting on another context's event %d %s\n", (int)err,
           ev ? "event" : "no event");
    CK(clEnqueueNDRangeKernel(q, r, 1, NULL, &g, &l2, 0, NULL, NULL));
    printf("apicheck: clFinish after them %d\n", (int)clFinish(q));
    /* A value argument read from an address that is not aligned. */
    cl_kernel w = make_kernel(prog, "w");
    unsigned char raw[16];
    cl_long v = 0x0102030405060708LL, got = 0;
    memcpy(raw + 1, &v, sizeof v);
    CK(clSetKernelArg(w, 0, sizeof m, &m));
    CK(clSetKernelArg(w, 1, sizeof v, raw + 1));
    size_t one = 1;
    CK(clEnqueueNDRangeKernel(q, w, 1, NULL, &one, NULL, 0, NULL, NULL));
    CK(clEnqueueReadBuffer(q, m, CL_TRUE, 0, sizeof got, &got, 0, NULL, NULL));
    printf("apicheck: unaligned 8-byte argument %llx\n", (unsigned long long)got);
    CK(clReleaseKernel(w));
    CK(clSetUserEventStatus(u, CL_COMPLETE));
    CK(clReleaseEvent(u));
    CK(clReleaseContext(other));
    CK(clReleaseMemObject(m));
    CK(clReleaseKernel(k));
    CK(clReleaseKernel(r));
    CK(clReleaseProgram(prog));
    CK(clReleaseCommandQueue(q));
}

/* Queries the proxy cannot answer as they are (handles) or that remoting
 * had no entry for. */
static void more_queries(cl_platform_id plat, cl_context ctx, cl_device_id dev)
{
    if (platform_version(plat) < 20)
        return;
    cl_int err;
    cl_command_queue q = clCreateCommandQueue(ctx, dev, 0, &err);
    CKE(err, "clCreateCommandQueue");
    cl_command_queue dq = (cl_command_queue)&err;
    err = clGetCommandQueueInfo(q, CL_QUEUE_DEVICE_DEFAULT, sizeof dq, &dq, NULL);
    printf("apicheck: CL_QUEUE_DEVICE_DEFAULT of a host queue %d %s\n", (int)err,
           dq ? "a queue" : "NULL");
    cl_mem m = make_buffer(ctx, CL_MEM_READ_WRITE, 64, NULL);
    cl_uint packet = 0;
    printf("apicheck: clGetPipeInfo of a buffer %d\n",
           (int)clGetPipeInfo(m, CL_PIPE_PACKET_SIZE, sizeof packet, &packet, NULL));
    CK(clReleaseMemObject(m));
    CK(clReleaseCommandQueue(q));
}

/* `--svm`: the device's SVM capabilities and whether clSVMAlloc gives
 * memory (under crane remote, SVM is not forwarded: the device must say it
 * has none). */
static void svm(cl_platform_id plat, cl_context ctx, cl_device_id dev)
{
    cl_device_svm_capabilities caps = 0;
    cl_int err = platform_version(plat) >= 20
                     ? clGetDeviceInfo(dev, CL_DEVICE_SVM_CAPABILITIES, sizeof caps, &caps, NULL)
                     : CL_INVALID_VALUE;
    void *p = err == CL_SUCCESS ? clSVMAlloc(ctx, CL_MEM_READ_WRITE, 64, 0) : NULL;
    printf("apicheck: svm capabilities %d %s, clSVMAlloc %s\n", (int)err, caps ? "some" : "none",
           p ? "memory" : "NULL");
    if (p)
        clSVMFree(ctx, p);
}

/* `--device-queue`: asks for a device-side queue the device may not have
 * and prints the error (PoCL aborts the process instead: under crane remote
 * the proxy must refuse it and live on). */
static void device_queue(cl_context ctx, cl_device_id dev)
{
    cl_int err = CL_SUCCESS;
    cl_queue_properties qp[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_ON_DEVICE | CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE, 0};
    cl_command_queue q = clCreateCommandQueueWithProperties(ctx, dev, qp, &err);
    printf("apicheck: device-side queue %d %s\n", (int)err, q ? "object" : "NULL");
    if (q)
        CK(clReleaseCommandQueue(q));
    qp[1] = CL_QUEUE_ON_DEVICE;
    q = clCreateCommandQueueWithProperties(ctx, dev, qp, &err);
    printf("apicheck: device-side in-order queue %d %s\n", (int)err, q ? "object" : "NULL");
    if (q)
        CK(clReleaseCommandQueue(q));
}

/* `--queue-property`: the deprecated clSetCommandQueueProperty on a queue
 * made with profiling: what it answers, the properties before and after,
 * and that the queue still works. NVIDIA carries it out; others answer
 * CL_INVALID_OPERATION (PoCL's ICD entry is missing: natively the loader
 * crashes, under crane the call fails cleanly). */
static void queue_property(cl_context ctx, cl_device_id dev)
{
    cl_int err = CL_SUCCESS;
    cl_command_queue q = clCreateCommandQueue(ctx, dev, CL_QUEUE_PROFILING_ENABLE, &err);
    CK(err);
    for (int enable = 0; enable < 2; enable++) {
        cl_command_queue_properties old = 12345, now = 0;
        err = clSetCommandQueueProperty(q, CL_QUEUE_PROFILING_ENABLE, enable ? CL_TRUE : CL_FALSE, &old);
        CK(clGetCommandQueueInfo(q, CL_QUEUE_PROPERTIES, sizeof now, &now, NULL));
        printf("apicheck: set profiling %d: %d, old %llu, now %llu\n", enable, (int)err,
               err == CL_SUCCESS ? (unsigned long long)old : 0ULL, (unsigned long long)now);
    }
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 4096, NULL, &err);
    CK(err);
    unsigned char in[4096], out[4096];
    for (int i = 0; i < 4096; i++)
        in[i] = (unsigned char)(i * 7);
    cl_event ev;
    CK(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, sizeof in, in, 0, NULL, NULL));
    CK(clEnqueueReadBuffer(q, m, CL_FALSE, 0, sizeof out, out, 0, NULL, &ev));
    CK(clWaitForEvents(1, &ev));
    cl_ulong t0 = 0, t1 = 0;
    err = clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_START, sizeof t0, &t0, NULL);
    if (err == CL_SUCCESS)
        err = clGetEventProfilingInfo(ev, CL_PROFILING_COMMAND_END, sizeof t1, &t1, NULL);
    printf("apicheck: queue after: data %s, profiling %d%s\n", memcmp(in, out, sizeof in) ? "differs" : "same",
           (int)err, err == CL_SUCCESS && t1 >= t0 ? " ordered" : "");
    CK(clReleaseEvent(ev));
    CK(clReleaseMemObject(m));
    CK(clReleaseCommandQueue(q));
}

/* `--spec-errors`: error codes the specification gives and a vendor may
 * not (PoCL 3.1 answers CL_DEVICE_NOT_FOUND for device type 0 and takes a
 * buffer for an image argument; NVIDIA gives the specification's codes):
 * under crane remote the client answers them, so they are printed, not
 * compared with native. A valid image argument still succeeds. */
static void spec_errors(cl_platform_id plat, cl_context ctx, cl_device_id dev)
{
    cl_device_id d = NULL;
    printf("apicheck: clGetDeviceIDs type 0: %d\n", (int)clGetDeviceIDs(plat, 0, 1, &d, NULL));
    printf("apicheck: clGetDeviceIDs type 1<<20: %d\n", (int)clGetDeviceIDs(plat, 1u << 20, 1, &d, NULL));
    printf("apicheck: clGetDeviceIDs 0 entries: %d\n",
           (int)clGetDeviceIDs(plat, CL_DEVICE_TYPE_DEFAULT, 0, &d, NULL));
    printf("apicheck: clGetDeviceIDs no outputs: %d\n",
           (int)clGetDeviceIDs(plat, CL_DEVICE_TYPE_DEFAULT, 1, NULL, NULL));
    cl_bool images = CL_FALSE;
    CK(clGetDeviceInfo(dev, CL_DEVICE_IMAGE_SUPPORT, sizeof images, &images, NULL));
    if (!images) {
        printf("apicheck: no image support\n");
        return;
    }
    cl_program p = build_source(ctx, dev,
                                "__kernel void k(read_only image2d_t img, __global uint4 *o) {\n"
                                "    o[0] = read_imageui(img, (int2)(0, 0));\n"
                                "}\n",
                                NULL);
    cl_int err;
    cl_kernel k = clCreateKernel(p, "k", &err);
    CK(err);
    cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, 64, NULL, &err);
    CK(err);
    cl_image_format f = {CL_RGBA, CL_UNSIGNED_INT8};
    cl_image_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.image_type = CL_MEM_OBJECT_IMAGE2D;
    desc.image_width = 4;
    desc.image_height = 4;
    cl_mem img = clCreateImage(ctx, CL_MEM_READ_ONLY, &f, &desc, NULL, &err);
    CK(err);
    printf("apicheck: image argument, a buffer: %d\n", (int)clSetKernelArg(k, 0, sizeof buf, &buf));
    printf("apicheck: image argument, an image: %d\n", (int)clSetKernelArg(k, 0, sizeof img, &img));
    printf("apicheck: buffer argument, a buffer: %d\n", (int)clSetKernelArg(k, 1, sizeof buf, &buf));
    CK(clReleaseMemObject(img));
    CK(clReleaseMemObject(buf));
    CK(clReleaseKernel(k));
    CK(clReleaseProgram(p));
}

int main(int argc, char **argv)
{
    g_prog = "apicheck";
    int dq = argc > 1 && strcmp(argv[1], "--device-queue") == 0;
    int sv = argc > 1 && strcmp(argv[1], "--svm") == 0;
    int qp = argc > 1 && strcmp(argv[1], "--queue-property") == 0;
    int se = argc > 1 && strcmp(argv[1], "--spec-errors") == 0;
    int iters = dq || sv || qp || se ? 1 : parse_iters(argc, argv, 2);
    cl_platform_id plat;
    cl_device_id dev;
    pick_device(&plat, &dev);
    cl_context ctx = make_context(plat, dev);
    if (sv) {
        svm(plat, ctx, dev);
        CK(clReleaseContext(ctx));
        print_result();
        return 0;
    }
    if (se) {
        spec_errors(plat, ctx, dev);
        CK(clReleaseContext(ctx));
        print_result();
        return 0;
    }
    if (qp) {
        queue_property(ctx, dev);
        CK(clReleaseContext(ctx));
        print_result();
        return 0;
    }
    if (dq) {
        device_queue(ctx, dev);
        CK(clReleaseContext(ctx));
        print_result();
        return 0;
    }
    program_devices(ctx, dev);
    errors_and_properties(plat, ctx, dev);
    posted_errors(ctx, dev);
    more_queries(plat, ctx, dev);
    for (int i = 0; i < iters; i++) {
        big_buffers(ctx, dev, i);
        big_images(ctx, dev, i);
    }
    CK(clReleaseContext(ctx));
    print_result();
    return 0;
}
