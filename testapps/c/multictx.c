/* multictx: several contexts and several queues at once.
 *
 * Context 1 has two in-order queues (the second made with
 * clCreateCommandQueueWithProperties + profiling when available): a kernel on
 * queue A feeds a kernel on queue B through an event wait list across the
 * queues.  Context 2 (same device, program built with a different -D) takes
 * the result through the host and feeds the next iteration back.  Every 64
 * iterations a third context is created, used and fully released.  A host
 * model checks every read.
 */
#include "common.h"

static const char *SRC =
    "__kernel void stage(__global const uint *in, __global uint *out, uint n, uint salt)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i >= n) return;\n"
    "    out[i] = in[i] * SCALE + (in[(i + 1u) % n] >> 2) + salt;\n"
    "}\n";

#define N 4096u
#define BYTES (N * 4u)

static void host_stage(const uint32_t *in, uint32_t *out, uint32_t scale, uint32_t salt)
{
    for (uint32_t i = 0; i < N; i++)
        out[i] = in[i] * scale + (in[(i + 1u) % N] >> 2) + salt;
}

static void set_stage(cl_kernel k, cl_mem in, cl_mem out, cl_uint salt)
{
    cl_uint n = N;
    CK(clSetKernelArg(k, 0, sizeof(cl_mem), &in));
    CK(clSetKernelArg(k, 1, sizeof(cl_mem), &out));
    CK(clSetKernelArg(k, 2, sizeof(cl_uint), &n));
    CK(clSetKernelArg(k, 3, sizeof(cl_uint), &salt));
}

int main(int argc, char **argv)
{
    g_prog = "multictx";
    int iters = parse_iters(argc, argv, 3000);
    cl_platform_id plat;
    cl_device_id dev;
    pick_device(&plat, &dev);
    double t0 = now_s();
    int v20 = platform_version(plat) >= 20 && device_version(dev) >= 20;

    cl_context c1 = make_context(plat, dev);
    cl_context c2 = make_context(plat, dev);
    cl_command_queue q1a = make_queue(c1, dev, 0);
    cl_command_queue q1b;
    if (v20) {
        cl_queue_properties qp[] = {CL_QUEUE_PROPERTIES, CL_QUEUE_PROFILING_ENABLE, 0};
        cl_int err;
        q1b = clCreateCommandQueueWithProperties(c1, dev, qp, &err);
        CKE(err, "clCreateCommandQueueWithProperties");
    } else {
        q1b = make_queue(c1, dev, CL_QUEUE_PROFILING_ENABLE);
    }
    cl_command_queue q2 = make_queue(c2, dev, 0);
    cl_program p1 = build_source(c1, dev, SRC, "-cl-std=CL1.2 -DSCALE=3u");
    cl_program p2 = build_source(c2, dev, SRC, "-cl-std=CL1.2 -DSCALE=5u");
    cl_kernel k1a = make_kernel(p1, "stage");
    cl_kernel k1b = make_kernel(p1, "stage");
    cl_kernel k2 = make_kernel(p2, "stage");

    cl_mem in1 = make_buffer(c1, CL_MEM_READ_ONLY, BYTES, NULL);
    cl_mem x1 = make_buffer(c1, CL_MEM_READ_WRITE, BYTES, NULL);
    cl_mem y1 = make_buffer(c1, CL_MEM_WRITE_ONLY, BYTES, NULL);
    cl_mem in2 = make_buffer(c2, CL_MEM_READ_ONLY, BYTES, NULL);
    cl_mem out2 = make_buffer(c2, CL_MEM_WRITE_ONLY, BYTES, NULL);

    uint32_t *h = xmalloc(BYTES), *hy = xmalloc(BYTES), *m1 = xmalloc(BYTES), *m2 = xmalloc(BYTES),
             *m3 = xmalloc(BYTES);
    uint32_t seed = 0x31337u;
    for (uint32_t i = 0; i < N; i++)
        h[i] = rng_next(&seed);
    size_t gsz = N;
    int temp_contexts = 0;

    for (int it = 0; it < iters; it++) {
        cl_uint salt = (cl_uint)it * 0x85ebca6bu;
        cl_event ew, e1, e2, e3;
        CK(clEnqueueWriteBuffer(q1a, in1, CL_FALSE, 0, BYTES, h, 0, NULL, &ew));
        set_stage(k1a, in1, x1, salt);
        CK(clEnqueueNDRangeKernel(q1a, k1a, 1, NULL, &gsz, NULL, 1, &ew, &e1));
        CK(clFlush(q1a));
        set_stage(k1b, x1, y1, salt ^ 0xffu);
        CK(clEnqueueNDRangeKernel(q1b, k1b, 1, NULL, &gsz, NULL, 1, &e1, &e2));
        CK(clEnqueueReadBuffer(q1b, y1, CL_FALSE, 0, BYTES, hy, 1, &e2, &e3));
        CK(clFlush(q1b));
        CK(clWaitForEvents(1, &e3));
        cl_ulong ts = 0, te = 0;
        CK(clGetEventProfilingInfo(e2, CL_PROFILING_COMMAND_START, sizeof ts, &ts, NULL));
        CK(clGetEventProfilingInfo(e2, CL_PROFILING_COMMAND_END, sizeof te, &te, NULL));
        if (te < ts)
            fail("profiling end before start");
        CK(clReleaseEvent(ew));
        CK(clReleaseEvent(e1));
        CK(clReleaseEvent(e2));
        CK(clReleaseEvent(e3));
        hash_bytes(hy, BYTES);
        host_stage(h, m1, 3u, salt);
        host_stage(m1, m2, 3u, salt ^ 0xffu);
        if (memcmp(m2, hy, BYTES) != 0)
            fail("context 1 result differs from host model");

        /* through the host into context 2 */
        CK(clEnqueueWriteBuffer(q2, in2, CL_FALSE, 0, BYTES, hy, 0, NULL, NULL));
        set_stage(k2, in2, out2, salt + 1u);
        CK(clEnqueueNDRangeKernel(q2, k2, 1, NULL, &gsz, NULL, 0, NULL, NULL));
        CK(clEnqueueReadBuffer(q2, out2, CL_TRUE, 0, BYTES, h, 0, NULL, NULL));
        host_stage(m2, m3, 5u, salt + 1u);
        if (memcmp(m3, h, BYTES) != 0)
            fail("context 2 result differs from host model");
        hash_bytes(h, 64 * 4);

        if (it % 64 == 63) {
            /* a short-lived third context */
            cl_context c3 = make_context(plat, dev);
            cl_command_queue q3 = make_queue(c3, dev, 0);
            cl_program p3 = build_source(c3, dev, SRC, "-cl-std=CL1.2 -DSCALE=7u");
            cl_kernel k3 = make_kernel(p3, "stage");
            cl_mem a3 = make_buffer(c3, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, BYTES, h);
            cl_mem b3 = make_buffer(c3, CL_MEM_WRITE_ONLY, BYTES, NULL);
            set_stage(k3, a3, b3, salt);
            CK(clEnqueueNDRangeKernel(q3, k3, 1, NULL, &gsz, NULL, 0, NULL, NULL));
            CK(clEnqueueReadBuffer(q3, b3, CL_TRUE, 0, BYTES, m1, 0, NULL, NULL));
            host_stage(h, m2, 7u, salt);
            if (memcmp(m1, m2, BYTES) != 0)
                fail("context 3 result differs from host model");
            hash_bytes(m1, BYTES);
            CK(clReleaseMemObject(a3));
            CK(clReleaseMemObject(b3));
            CK(clReleaseKernel(k3));
            CK(clReleaseProgram(p3));
            CK(clReleaseCommandQueue(q3));
            CK(clReleaseContext(c3));
            temp_contexts++;
        }
        if (it % 500 == 499)
            printf("multictx: iteration %d\n", it + 1);
    }
    CK(clFinish(q1a));
    CK(clFinish(q1b));
    CK(clFinish(q2));
    hash_bytes(h, BYTES);
    printf("multictx: host model matches, %d temporary contexts\n", temp_contexts);

    CK(clReleaseMemObject(in1));
    CK(clReleaseMemObject(x1));
    CK(clReleaseMemObject(y1));
    CK(clReleaseMemObject(in2));
    CK(clReleaseMemObject(out2));
    CK(clReleaseKernel(k1a));
    CK(clReleaseKernel(k1b));
    CK(clReleaseKernel(k2));
    CK(clReleaseProgram(p1));
    CK(clReleaseProgram(p2));
    CK(clReleaseCommandQueue(q1a));
    CK(clReleaseCommandQueue(q1b));
    CK(clReleaseCommandQueue(q2));
    CK(clReleaseContext(c1));
    CK(clReleaseContext(c2));
    free(h);
    free(hy);
    free(m1);
    free(m2);
    free(m3);
    fprintf(stderr, "multictx: %d iterations in %.3f s\n", iters, now_s() - t0);
    print_result();
    return 0;
}
