/* events: out-of-order queue, event wait lists, user events, callbacks.
 *
 * Each iteration builds a small DAG on an out-of-order (profiling) queue:
 * a write gated on a user event, two independent kernels, a join kernel, a
 * marker and a barrier with wait lists, and reads.  The host checks that the
 * gated read has not completed, then sets the user event, waits, and checks
 * the event info (command types, status).  clSetEventCallback is registered
 * for CL_COMPLETE on every event, for CL_SUBMITTED / CL_RUNNING on some, and
 * once more after completion; the program prints the callback count, which
 * must equal the number registered.
 */
#include "common.h"

#include <stdatomic.h>
#include <stdint.h>

static const char *SRC =
    "__kernel void ka(__global const uint *in, __global uint *t1, uint n)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i < n) t1[i] = in[i] * 3u + i;\n"
    "}\n"
    "__kernel void kb(__global const uint *in, __global uint *t2, uint n)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i < n) t2[i] = in[n - 1u - i] ^ 0x5a5a5a5au;\n"
    "}\n"
    "__kernel void kc(__global const uint *t1, __global const uint *t2, __global uint *out, uint n)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i < n) out[i] = t1[i] + rotate(t2[i], i & 31u);\n"
    "}\n";

#define N 8192u
#define BYTES (N * 4u)

static atomic_int g_cb_count;
static atomic_int g_cb_bad;

static void CL_CALLBACK on_event(cl_event ev, cl_int status, void *user)
{
    (void)ev;
    cl_int want = (cl_int)(intptr_t)user;
    /* the status passed equals the registered type (or is an error code) */
    if (status != want)
        atomic_fetch_add(&g_cb_bad, 1);
    atomic_fetch_add(&g_cb_count, 1);
}

static int g_cb_registered;

static void add_cb(cl_event ev, cl_int type)
{
    CK(clSetEventCallback(ev, type, on_event, (void *)(intptr_t)type));
    g_cb_registered++;
}

static cl_int ev_status(cl_event ev)
{
    cl_int s = 0;
    CK(clGetEventInfo(ev, CL_EVENT_COMMAND_EXECUTION_STATUS, sizeof s, &s, NULL));
    return s;
}

static cl_command_type ev_type(cl_event ev)
{
    cl_command_type t = 0;
    CK(clGetEventInfo(ev, CL_EVENT_COMMAND_TYPE, sizeof t, &t, NULL));
    return t;
}

static void check_type(cl_event ev, cl_command_type want, const char *what)
{
    cl_command_type got = ev_type(ev);
    if (got != want) {
        fprintf(stderr, "events: %s event has CL_EVENT_COMMAND_TYPE 0x%x, expected 0x%x\n", what, (unsigned)got,
                (unsigned)want);
        fail("unexpected CL_EVENT_COMMAND_TYPE");
    }
}

static void wait_callbacks(void)
{
    double t0 = now_s();
    while (atomic_load(&g_cb_count) < g_cb_registered) {
        if (now_s() - t0 > 30.0)
            break;
        sleep_us(50);
    }
}

static uint32_t rotl(uint32_t v, uint32_t r)
{
    return r ? (v << r) | (v >> (32 - r)) : v;
}

int main(int argc, char **argv)
{
    g_prog = "events";
    int iters = parse_iters(argc, argv, 16000);
    cl_platform_id plat;
    cl_device_id dev;
    pick_device(&plat, &dev);
    double t0 = now_s();
    int v20 = platform_version(plat) >= 20 && device_version(dev) >= 20;

    cl_command_queue_properties qprops = 0;
    CK(clGetDeviceInfo(dev, CL_DEVICE_QUEUE_PROPERTIES, sizeof qprops, &qprops, NULL));
    cl_command_queue_properties want = CL_QUEUE_PROFILING_ENABLE;
    if (qprops & CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE)
        want |= CL_QUEUE_OUT_OF_ORDER_EXEC_MODE_ENABLE;
    else
        printf("SKIP events/ooo device has no out-of-order queues; using an in-order queue\n");

    cl_context ctx = make_context(plat, dev);
    cl_command_queue q;
    if (v20) {
        cl_queue_properties qp[] = {CL_QUEUE_PROPERTIES, want, 0};
        cl_int err;
        q = clCreateCommandQueueWithProperties(ctx, dev, qp, &err);
        CKE(err, "clCreateCommandQueueWithProperties");
    } else {
        q = make_queue(ctx, dev, want);
    }
    cl_program prog = build_source(ctx, dev, SRC, "-cl-std=CL1.2");
    cl_kernel ka = make_kernel(prog, "ka");
    cl_kernel kb = make_kernel(prog, "kb");
    cl_kernel kc = make_kernel(prog, "kc");

    cl_mem bin = make_buffer(ctx, CL_MEM_READ_ONLY, BYTES, NULL);
    cl_mem t1 = make_buffer(ctx, CL_MEM_READ_WRITE, BYTES, NULL);
    cl_mem t2 = make_buffer(ctx, CL_MEM_READ_WRITE, BYTES, NULL);
    cl_mem bout = make_buffer(ctx, CL_MEM_WRITE_ONLY, BYTES, NULL);
    cl_uint n = N;
    CK(clSetKernelArg(ka, 0, sizeof(cl_mem), &bin));
    CK(clSetKernelArg(ka, 1, sizeof(cl_mem), &t1));
    CK(clSetKernelArg(ka, 2, sizeof(cl_uint), &n));
    CK(clSetKernelArg(kb, 0, sizeof(cl_mem), &bin));
    CK(clSetKernelArg(kb, 1, sizeof(cl_mem), &t2));
    CK(clSetKernelArg(kb, 2, sizeof(cl_uint), &n));
    CK(clSetKernelArg(kc, 0, sizeof(cl_mem), &t1));
    CK(clSetKernelArg(kc, 1, sizeof(cl_mem), &t2));
    CK(clSetKernelArg(kc, 2, sizeof(cl_mem), &bout));
    CK(clSetKernelArg(kc, 3, sizeof(cl_uint), &n));

    uint32_t *hin = xmalloc(BYTES), *hout = xmalloc(BYTES), *m1 = xmalloc(BYTES), *m2 = xmalloc(BYTES);
    uint32_t probe[64];
    uint32_t seed = 0xe7e27u;
    for (uint32_t i = 0; i < N; i++)
        hout[i] = rng_next(&seed);
    size_t gsz = N;

    for (int it = 0; it < iters; it++) {
        for (uint32_t i = 0; i < N; i++)
            hin[i] = hout[i] ^ (uint32_t)it;
        cl_int err;
        cl_event u = clCreateUserEvent(ctx, &err);
        CKE(err, "clCreateUserEvent");
        if (ev_status(u) != CL_SUBMITTED)
            fail("new user event is not CL_SUBMITTED");
        cl_event ew, ea, eb, ec, em, er, ebar, ep;
        CK(clEnqueueWriteBuffer(q, bin, CL_FALSE, 0, BYTES, hin, 1, &u, &ew));
        CK(clEnqueueNDRangeKernel(q, ka, 1, NULL, &gsz, NULL, 1, &ew, &ea));
        CK(clEnqueueNDRangeKernel(q, kb, 1, NULL, &gsz, NULL, 1, &ew, &eb));
        cl_event ab[2] = {ea, eb};
        CK(clEnqueueNDRangeKernel(q, kc, 1, NULL, &gsz, NULL, 2, ab, &ec));
        CK(clEnqueueMarkerWithWaitList(q, 2, ab, &em));
        CK(clEnqueueReadBuffer(q, bout, CL_FALSE, 0, BYTES, hout, 1, &ec, &er));
        CK(clEnqueueBarrierWithWaitList(q, 1, &er, &ebar));
        size_t poff = ((size_t)it * 61u) % (N - 64);
        CK(clEnqueueReadBuffer(q, t1, CL_FALSE, poff * 4, sizeof probe, probe, 1, &ebar, &ep));

        add_cb(u, CL_COMPLETE);
        add_cb(ew, CL_COMPLETE);
        add_cb(ea, CL_COMPLETE);
        add_cb(eb, CL_COMPLETE);
        add_cb(ec, CL_COMPLETE);
        add_cb(em, CL_COMPLETE);
        add_cb(er, CL_COMPLETE);
        add_cb(ebar, CL_COMPLETE);
        add_cb(ep, CL_COMPLETE);
        if (it % 4 == 0)
            add_cb(ea, CL_SUBMITTED);
        if (it % 4 == 1)
            add_cb(ec, CL_RUNNING);
        CK(clFlush(q));

        if (ev_status(er) == CL_COMPLETE || ev_status(ep) == CL_COMPLETE)
            fail("read gated on an unset user event completed");
        check_type(u, CL_COMMAND_USER, "user event");
        check_type(ew, CL_COMMAND_WRITE_BUFFER, "write");
        check_type(ec, CL_COMMAND_NDRANGE_KERNEL, "kernel");
        check_type(er, CL_COMMAND_READ_BUFFER, "read");
        /* NVIDIA reports a vendor-specific type (0x4003) for markers: query only */
        (void)ev_type(em);
        (void)ev_type(ebar);

        CK(clSetUserEventStatus(u, CL_COMPLETE));
        cl_event all[3] = {er, ep, em};
        CK(clWaitForEvents(3, all));
        /* a callback registered after completion must still be called */
        add_cb(ew, CL_COMPLETE);
        cl_ulong ps = 0, pe = 0;
        CK(clGetEventProfilingInfo(ec, CL_PROFILING_COMMAND_START, sizeof ps, &ps, NULL));
        CK(clGetEventProfilingInfo(ec, CL_PROFILING_COMMAND_END, sizeof pe, &pe, NULL));
        if (pe < ps)
            fail("profiling end before start");
        if (ev_status(ec) != CL_COMPLETE || ev_status(u) != CL_COMPLETE)
            fail("event not complete after wait");
        wait_callbacks();

        cl_event evs[9] = {u, ew, ea, eb, ec, em, er, ebar, ep};
        for (int i = 0; i < 9; i++)
            CK(clReleaseEvent(evs[i]));

        hash_bytes(hout, BYTES);
        hash_bytes(probe, sizeof probe);
        for (uint32_t i = 0; i < N; i++) {
            m1[i] = hin[i] * 3u + i;
            m2[i] = hin[N - 1 - i] ^ 0x5a5a5a5au;
            if (hout[i] != m1[i] + rotl(m2[i], i & 31u))
                fail("result differs from host model");
        }
        if (memcmp(probe, m1 + poff, sizeof probe) != 0)
            fail("probe differs from host model");
        if (it % 4000 == 3999)
            printf("events: iteration %d\n", it + 1);
    }
    CK(clFinish(q));
    wait_callbacks();
    int got = atomic_load(&g_cb_count);
    int bad = atomic_load(&g_cb_bad);
    printf("events: callbacks %d/%d (%d with unexpected status)\n", got, g_cb_registered, bad);
    hash_u64((uint64_t)got);
    if (got != g_cb_registered || bad != 0)
        fail("callback count differs from the number registered");

    CK(clReleaseMemObject(bin));
    CK(clReleaseMemObject(t1));
    CK(clReleaseMemObject(t2));
    CK(clReleaseMemObject(bout));
    CK(clReleaseKernel(ka));
    CK(clReleaseKernel(kb));
    CK(clReleaseKernel(kc));
    CK(clReleaseProgram(prog));
    CK(clReleaseCommandQueue(q));
    CK(clReleaseContext(ctx));
    free(hin);
    free(hout);
    free(m1);
    free(m2);
    fprintf(stderr, "events: %d iterations in %.3f s\n", iters, now_s() - t0);
    print_result();
    return 0;
}
