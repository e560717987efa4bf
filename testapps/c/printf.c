/* printf: kernels that call printf().
 *
 * A kernel's printf output goes to the standard output of the process that
 * runs it; the application must find it on its own stdout once it has
 * waited for the kernel, whoever ran it.  As the Khronos CTS's test_printf
 * does, each iteration points stdout at a file (dup, freopen), launches a
 * one-work-item kernel that prints, waits for it (clWaitForEvents, clFinish
 * or a blocking read, in turn), restores stdout (fflush, dup2) and prints
 * and hashes what the file holds.  Then a kernel prints straight to stdout
 * before a closing host line.  Kernels run one work-item each, so the
 * output's order is deterministic.
 */
#include "common.h"
#include <unistd.h>

static const char *SRC =
    "__kernel void say(__global const int *in, __global int *out, int iter)\n"
    "{\n"
    "    int v = in[iter % 4] * 3 + iter;\n"
    "    printf(\"kernel %d: value %d, %s, char %c, hex %#x\\n\", iter, v, \"ok\", 'a' + iter % 26, v);\n"
    "    printf(\"kernel %d: vector %v4hld\\n\", iter, (int4)(iter, v, -v, 7));\n"
    "    out[0] = v;\n"
    "}\n";

static const char *HOW[3] = {"clWaitForEvents", "clFinish", "blocking read"};

int main(int argc, char **argv)
{
    g_prog = "printf";
    int iters = parse_iters(argc, argv, 6);
    cl_platform_id plat;
    cl_device_id dev;
    pick_device(&plat, &dev);
    double t0 = now_s();

    cl_context ctx = make_context(plat, dev);
    cl_command_queue q = make_queue(ctx, dev, 0);
    cl_program prog = build_source(ctx, dev, SRC, "-cl-std=CL1.2");
    cl_kernel k = make_kernel(prog, "say");
    int in[4] = {11, -5, 1000, 42};
    cl_mem bin = make_buffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof in, in);
    cl_mem bout = make_buffer(ctx, CL_MEM_WRITE_ONLY, sizeof(int), NULL);
    CK(clSetKernelArg(k, 0, sizeof bin, &bin));
    CK(clSetKernelArg(k, 1, sizeof bout, &bout));

    char path[] = "/tmp/crane-printf-XXXXXX";
    int tmp = mkstemp(path);
    if (tmp < 0)
        fail("mkstemp");
    close(tmp);
    char *got = xmalloc(1 << 16);

    for (int it = 0; it < iters; it++) {
        int how = it % 3;
        CK(clSetKernelArg(k, 2, sizeof it, &it));
        fflush(stdout);
        int saved = dup(fileno(stdout));
        if (saved < 0 || !freopen(path, "w", stdout))
            fail("redirecting stdout");
        size_t one = 1;
        cl_event ev;
        CK(clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, &ev));
        fflush(stdout);
        CK(clFlush(q));
        int out = 0;
        if (how == 0) {
            CK(clWaitForEvents(1, &ev));
        } else if (how == 1) {
            CK(clFinish(q));
        } else {
            CK(clEnqueueReadBuffer(q, bout, CL_TRUE, 0, sizeof out, &out, 0, NULL, NULL));
        }
        CK(clReleaseEvent(ev));
        fflush(stdout);
        if (dup2(saved, fileno(stdout)) < 0)
            fail("restoring stdout");
        close(saved);

        FILE *f = fopen(path, "r");
        if (!f)
            fail("reopening the output file");
        size_t n = fread(got, 1, (1 << 16) - 1, f);
        fclose(f);
        got[n] = 0;
        hash_bytes(got, n);
        if (how == 2)
            hash_u64((uint64_t)(uint32_t)out);
        printf("iteration %d (%s): %zu bytes printed by the kernel\n%s", it, HOW[how], n, got);
        if (n == 0)
            fail("the kernel's printf output is missing");
    }
    unlink(path);

    /* Straight to stdout: the kernel's lines come before the host's. */
    int last = iters;
    CK(clSetKernelArg(k, 2, sizeof last, &last));
    fflush(stdout);
    size_t one = 1;
    CK(clEnqueueNDRangeKernel(q, k, 1, NULL, &one, NULL, 0, NULL, NULL));
    CK(clFinish(q));
    printf("after the last kernel\n");

    free(got);
    CK(clReleaseMemObject(bin));
    CK(clReleaseMemObject(bout));
    CK(clReleaseKernel(k));
    CK(clReleaseProgram(prog));
    CK(clReleaseCommandQueue(q));
    CK(clReleaseContext(ctx));
    fprintf(stderr, "printf: %.3f s\n", now_s() - t0);
    print_result();
    return 0;
}
