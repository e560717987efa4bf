/* programs: every way of making a program and its kernels.
 *
 *  A: clCreateProgramWithSource + clBuildProgram with -D defines,
 *     -cl-std=CL1.2 and -cl-kernel-arg-info; kernels via
 *     clCreateKernelsInProgram, names via CL_KERNEL_FUNCTION_NAME,
 *     clGetKernelArgInfo.
 *  B: the binary of A (CL_PROGRAM_BINARY_SIZES / CL_PROGRAM_BINARIES) fed to
 *     clCreateProgramWithBinary + clBuildProgram; recreated every 50
 *     iterations.
 *  C: two compilation units compiled with clCompileProgram against an
 *     embedded header (input_headers / header_include_names), then
 *     clLinkProgram; the helper function lives in the other unit. The
 *     header program is made after the units. The units stay: every 10
 *     iterations unit 1 is compiled again and linked again with unit 2
 *     made from its binary (a resume may have made them from their
 *     compiled objects; compiling again must still work, the build status
 *     read success and the binary be given).
 *  D: the source of A built with different values, defined in a header file
 *     it includes from a directory named with -I (written at start, removed
 *     at exit): through crane-proxy the include is resolved on this machine.
 *  F: unit 2 as a library (clLinkProgram -create-library) linked with
 *     unit 1; over a thousand programs are made and released first (the
 *     last first), so that the library and the program linked from it get
 *     recycled handles in decreasing order (a resume must still make the
 *     library before the program linked from it).
 *  E: a program built again every 10 iterations, with and without a macro
 *     that changes what its kernel writes (as the CTS's
 *     options_build_macro_existence does; a resume may have made it from its
 *     kept executable, and the next build must still compile the source).
 *     TESTAPP_HOLD holds the program halfway with E's kernel alive (from
 *     20 iterations: E runs every 10).
 *  G: a kernel declared with attributes (vec_type_hint,
 *     reqd_work_group_size): every 10 iterations a kernel is made from it
 *     again and must report the CL_KERNEL_ATTRIBUTES it reported first (a
 *     resume may have made the program from its kept executable, and PoCL
 *     reports none for kernels of a program made from a binary).
 *  clCloneKernel (OpenCL >= 2.1) clones a kernel with its arguments set.
 * Each iteration runs the same pipeline with two of A/B/C (results must be
 * identical) plus D, and checks everything against a host model.
 */
#include "common.h"

#include <unistd.h>

static const char *SRC_A =
    "__kernel void scale(__global const uint *in, __global uint *out, uint n)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i < n) out[i] = in[i] * K_MUL + K_ADD;\n"
    "}\n"
    "__kernel void offset(__global uint *buf, uint n, uint off)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i < n) buf[i] = (buf[i] + off) ^ (i * K_ADD);\n"
    "}\n"
    "__kernel void combine(__global const uint *a, __global const uint *b, __global uint *out, uint n)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i < n) out[i] = a[i] ^ rotate(b[i], (uint)K_MUL);\n"
    "}\n";

static const char *HEADER =
    "#ifndef CRANE_OPS_H\n"
    "#define CRANE_OPS_H\n"
    "#define K_MUL 5u\n"
    "#define K_ADD 11u\n"
    "uint crane_scale_op(uint v);\n"
    "#endif\n";

static const char *UNIT1 =
    "#include \"crane_ops.h\"\n"
    "__kernel void scale(__global const uint *in, __global uint *out, uint n)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i < n) out[i] = crane_scale_op(in[i]);\n"
    "}\n"
    "__kernel void offset(__global uint *buf, uint n, uint off)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i < n) buf[i] = (buf[i] + off) ^ (i * K_ADD);\n"
    "}\n"
    "__kernel void combine(__global const uint *a, __global const uint *b, __global uint *out, uint n)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i < n) out[i] = a[i] ^ rotate(b[i], (uint)K_MUL);\n"
    "}\n";

static const char *UNIT2 =
    "#include \"crane_ops.h\"\n"
    "uint crane_scale_op(uint v)\n"
    "{\n"
    "    return v * K_MUL + K_ADD;\n"
    "}\n";

static const char *SRC_E =
    "__kernel void e(__global uint *o)\n"
    "{\n"
    "#ifdef E_MACRO\n"
    "    o[0] = 42u;\n"
    "#else\n"
    "    o[0] = 24u;\n"
    "#endif\n"
    "}\n";

static const char *SRC_G =
    "__kernel __attribute__((vec_type_hint(float4))) __attribute__((reqd_work_group_size(1, 1, 1)))\n"
    "void g(__global uint *o)\n"
    "{\n"
    "    o[get_global_id(0)] = 7u;\n"
    "}\n";

/* A kernel's CL_KERNEL_ATTRIBUTES (at most 255 bytes) into out. */
static void kernel_attributes(cl_kernel k, char out[256])
{
    size_t n = 0;
    memset(out, 0, 256);
    CK(clGetKernelInfo(k, CL_KERNEL_ATTRIBUTES, 0, NULL, &n));
    if (n > 255)
        fail("CL_KERNEL_ATTRIBUTES is longer than 255 bytes");
    CK(clGetKernelInfo(k, CL_KERNEL_ATTRIBUTES, n, out, NULL));
}

#define N 8192u
#define BYTES (N * 4u)
#define OPTS_A "-cl-std=CL1.2 -DK_MUL=5u -DK_ADD=11u -cl-kernel-arg-info"
#define HEADER_D "#define K_MUL 7u\n#define K_ADD 3u\n"
#define SRC_D_HEAD "#include \"crane_d.h\"\n"

typedef struct {
    cl_kernel scale, offset, combine;
} kset;

static cl_device_id g_dev;

static void kernels_in_program(cl_program p, kset *ks, int print)
{
    cl_kernel k[8];
    cl_uint nk = 0;
    CK(clCreateKernelsInProgram(p, 8, k, &nk));
    if (nk != 3)
        fail("clCreateKernelsInProgram did not return 3 kernels");
    memset(ks, 0, sizeof *ks);
    for (cl_uint i = 0; i < nk; i++) {
        char name[64] = {0};
        CK(clGetKernelInfo(k[i], CL_KERNEL_FUNCTION_NAME, sizeof name - 1, name, NULL));
        cl_uint nargs = 0;
        CK(clGetKernelInfo(k[i], CL_KERNEL_NUM_ARGS, sizeof nargs, &nargs, NULL));
        if (strcmp(name, "scale") == 0 && nargs == 3)
            ks->scale = k[i];
        else if (strcmp(name, "offset") == 0 && nargs == 3)
            ks->offset = k[i];
        else if (strcmp(name, "combine") == 0 && nargs == 4)
            ks->combine = k[i];
        else
            fail("unexpected kernel name or argument count");
    }
    if (!ks->scale || !ks->offset || !ks->combine)
        fail("missing kernel");
    if (print) {
        size_t n = 0;
        char names[256] = {0};
        CK(clGetProgramInfo(p, CL_PROGRAM_KERNEL_NAMES, sizeof names - 1, names, &n));
        printf("programs: kernels %s\n", names);
    }
}

static void release_kset(kset *ks)
{
    CK(clReleaseKernel(ks->scale));
    CK(clReleaseKernel(ks->offset));
    CK(clReleaseKernel(ks->combine));
}

static cl_program from_binary(cl_context ctx, const unsigned char *bin, size_t size)
{
    cl_int err, status;
    cl_program p = clCreateProgramWithBinary(ctx, 1, &g_dev, &size, &bin, &status, &err);
    CKE(err, "clCreateProgramWithBinary");
    CKE(status, "clCreateProgramWithBinary");
    err = clBuildProgram(p, 1, &g_dev, "", NULL, NULL);
    if (err != CL_SUCCESS) {
        print_build_log(p, g_dev);
        die_cl("clBuildProgram", err);
    }
    cl_build_status bs;
    CK(clGetProgramBuildInfo(p, g_dev, CL_PROGRAM_BUILD_STATUS, sizeof bs, &bs, NULL));
    if (bs != CL_BUILD_SUCCESS)
        fail("binary program build status");
    return p;
}

static void pipeline(cl_command_queue q, const kset *ks, cl_mem in, cl_mem t, cl_mem out, cl_uint off)
{
    cl_uint n = N;
    size_t g = N;
    CK(clSetKernelArg(ks->scale, 0, sizeof(cl_mem), &in));
    CK(clSetKernelArg(ks->scale, 1, sizeof(cl_mem), &t));
    CK(clSetKernelArg(ks->scale, 2, sizeof(cl_uint), &n));
    CK(clEnqueueNDRangeKernel(q, ks->scale, 1, NULL, &g, NULL, 0, NULL, NULL));
    CK(clSetKernelArg(ks->offset, 0, sizeof(cl_mem), &t));
    CK(clSetKernelArg(ks->offset, 1, sizeof(cl_uint), &n));
    CK(clSetKernelArg(ks->offset, 2, sizeof(cl_uint), &off));
    CK(clEnqueueNDRangeKernel(q, ks->offset, 1, NULL, &g, NULL, 0, NULL, NULL));
    CK(clSetKernelArg(ks->combine, 0, sizeof(cl_mem), &t));
    CK(clSetKernelArg(ks->combine, 1, sizeof(cl_mem), &in));
    CK(clSetKernelArg(ks->combine, 2, sizeof(cl_mem), &out));
    CK(clSetKernelArg(ks->combine, 3, sizeof(cl_uint), &n));
    CK(clEnqueueNDRangeKernel(q, ks->combine, 1, NULL, &g, NULL, 0, NULL, NULL));
}

static uint32_t rotl(uint32_t v, uint32_t r)
{
    return (v << r) | (v >> (32 - r));
}

static void host_pipeline(const uint32_t *in, uint32_t *out, uint32_t mul, uint32_t add, uint32_t off)
{
    for (uint32_t i = 0; i < N; i++) {
        uint32_t t = in[i] * mul + add;
        t = (t + off) ^ (i * add);
        out[i] = t ^ rotl(in[i], mul);
    }
}

int main(int argc, char **argv)
{
    g_prog = "programs";
    int iters = parse_iters(argc, argv, 2400);
    cl_platform_id plat;
    cl_device_id dev;
    pick_device(&plat, &dev);
    g_dev = dev;
    double t0 = now_s();

    cl_context ctx = make_context(plat, dev);
    cl_command_queue q = make_queue(ctx, dev, 0);

    /* A: source + options */
    cl_program pa = build_source(ctx, dev, SRC_A, OPTS_A);
    kset ka;
    kernels_in_program(pa, &ka, 1);
    {
        char argname[64] = {0};
        cl_int err = clGetKernelArgInfo(ka.scale, 0, CL_KERNEL_ARG_NAME, sizeof argname - 1, argname, NULL);
        if (err == CL_KERNEL_ARG_INFO_NOT_AVAILABLE)
            printf("SKIP programs/arginfo kernel argument info not available\n");
        else if (err != CL_SUCCESS)
            die_cl("clGetKernelArgInfo", err);
        else if (strcmp(argname, "in") != 0)
            fail("clGetKernelArgInfo returned a wrong name");
        else
            printf("programs: clGetKernelArgInfo ok\n");
    }

    /* B: binary round trip */
    size_t binsize = 0;
    CK(clGetProgramInfo(pa, CL_PROGRAM_BINARY_SIZES, sizeof binsize, &binsize, NULL));
    if (binsize == 0)
        fail("program binary size is 0");
    unsigned char *bin = xmalloc(binsize);
    unsigned char *bins[1] = {bin};
    CK(clGetProgramInfo(pa, CL_PROGRAM_BINARIES, sizeof bins, bins, NULL));
    printf("programs: binary of %zu bytes\n", binsize);
    cl_program pb = from_binary(ctx, bin, binsize);
    kset kb;
    kernels_in_program(pb, &kb, 0);

    /* C: compile + link with an embedded header */
    cl_bool compiler = CL_FALSE, linker = CL_FALSE;
    CK(clGetDeviceInfo(dev, CL_DEVICE_COMPILER_AVAILABLE, sizeof compiler, &compiler, NULL));
    CK(clGetDeviceInfo(dev, CL_DEVICE_LINKER_AVAILABLE, sizeof linker, &linker, NULL));
    cl_program pc = NULL, hdr = NULL, u1 = NULL, u2 = NULL, lib = NULL, pf = NULL;
    const char *hname = "crane_ops.h";
    kset kc, kf;
    if (!compiler || !linker || device_version(dev) < 12) {
        printf("SKIP programs/link no compiler/linker; using A in its place\n");
    } else {
        cl_int err;
        /* The header is made after the units that include it (as the CTS's
         * test_compiler does): a resume must still make it before their
         * compile is replayed. */
        u1 = clCreateProgramWithSource(ctx, 1, &UNIT1, NULL, &err);
        CKE(err, "clCreateProgramWithSource");
        u2 = clCreateProgramWithSource(ctx, 1, &UNIT2, NULL, &err);
        CKE(err, "clCreateProgramWithSource");
        hdr = clCreateProgramWithSource(ctx, 1, &HEADER, NULL, &err);
        CKE(err, "clCreateProgramWithSource");
        err = clCompileProgram(u1, 1, &dev, "-cl-std=CL1.2", 1, &hdr, &hname, NULL, NULL);
        if (err != CL_SUCCESS) {
            print_build_log(u1, dev);
            die_cl("clCompileProgram", err);
        }
        err = clCompileProgram(u2, 1, &dev, "-cl-std=CL1.2", 1, &hdr, &hname, NULL, NULL);
        if (err != CL_SUCCESS) {
            print_build_log(u2, dev);
            die_cl("clCompileProgram", err);
        }
        cl_program units[2] = {u1, u2};
        pc = clLinkProgram(ctx, 1, &dev, "", 2, units, NULL, NULL, &err);
        if (err != CL_SUCCESS) {
            if (pc)
                print_build_log(pc, dev);
            die_cl("clLinkProgram", err);
        }
        kernels_in_program(pc, &kc, 0);
        printf("programs: compiled and linked two units\n");

        enum { JUNK = 1100 };
        cl_program *junk = xmalloc(JUNK * sizeof *junk);
        for (int i = 0; i < JUNK; i++) {
            junk[i] = clCreateProgramWithSource(ctx, 1, &HEADER, NULL, &err);
            CKE(err, "clCreateProgramWithSource");
        }
        for (int i = JUNK - 1; i >= 0; i--)
            CK(clReleaseProgram(junk[i]));
        free(junk);
        lib = clLinkProgram(ctx, 1, &dev, "-create-library", 1, &u2, NULL, NULL, &err);
        CKE(err, "clLinkProgram (library)");
        cl_program with_lib[2] = {u1, lib};
        pf = clLinkProgram(ctx, 1, &dev, "", 2, with_lib, NULL, NULL, &err);
        CKE(err, "clLinkProgram (with a library)");
        kernels_in_program(pf, &kf, 0);
        printf("programs: linked a unit with a library\n");
    }
    if (!pc) {
        kernels_in_program(pa, &kc, 0);
        kernels_in_program(pa, &kf, 0);
    }

    /* D: different defines, from a header file found with -I */
    char ddir[] = "/tmp/crane-programs-XXXXXX", dpath[64], dopts[128];
    if (!mkdtemp(ddir))
        fail("mkdtemp failed");
    snprintf(dpath, sizeof dpath, "%s/crane_d.h", ddir);
    FILE *hf = fopen(dpath, "w");
    if (!hf || fputs(HEADER_D, hf) < 0 || fclose(hf) != 0)
        fail("cannot write the header of D");
    snprintf(dopts, sizeof dopts, "-cl-std=CL1.2 -I %s", ddir);
    size_t dlen = strlen(SRC_D_HEAD) + strlen(SRC_A) + 1;
    char *src_d = xmalloc(dlen);
    snprintf(src_d, dlen, "%s%s", SRC_D_HEAD, SRC_A);
    cl_program pd = build_source(ctx, dev, src_d, dopts);
    free(src_d);
    kset kd;
    kernels_in_program(pd, &kd, 0);
    cl_program pe = build_source(ctx, dev, SRC_E, "-cl-std=CL1.2");
    cl_program pg = build_source(ctx, dev, SRC_G, "-cl-std=CL1.2");
    char attrs_g[256];
    {
        cl_kernel kg = make_kernel(pg, "g");
        kernel_attributes(kg, attrs_g);
        CK(clReleaseKernel(kg));
        printf("programs: kernel attributes \"%s\"\n", attrs_g);
    }

    int can_clone = device_version(dev) >= 21 && platform_version(plat) >= 21;
    if (!can_clone)
        printf("SKIP programs/clone clCloneKernel needs OpenCL 2.1\n");

    cl_mem in = make_buffer(ctx, CL_MEM_READ_WRITE, BYTES, NULL);
    cl_mem t = make_buffer(ctx, CL_MEM_READ_WRITE, BYTES, NULL);
    cl_mem out1 = make_buffer(ctx, CL_MEM_READ_WRITE, BYTES, NULL);
    cl_mem out2 = make_buffer(ctx, CL_MEM_READ_WRITE, BYTES, NULL);
    cl_mem out3 = make_buffer(ctx, CL_MEM_READ_WRITE, BYTES, NULL);
    uint32_t *hin = xmalloc(BYTES), *h1 = xmalloc(BYTES), *h2 = xmalloc(BYTES), *m = xmalloc(BYTES);
    uint32_t seed = 0xb16b00b5u;
    for (uint32_t i = 0; i < N; i++)
        hin[i] = rng_next(&seed);
    CK(clEnqueueWriteBuffer(q, in, CL_TRUE, 0, BYTES, hin, 0, NULL, NULL));
    int clones = 0, rebuilds = 0, relinks = 0, rebuilds_e = 0;

    int held = 0;
    for (int it = 0; it < iters; it++) {
        kset *vars[4] = {&ka, &kb, &kc, &kf};
        kset *v1 = vars[it % 4], *v2 = vars[(it + 1) % 4];
        cl_uint off = (cl_uint)it * 0x61c88647u;
        pipeline(q, v1, in, t, out1, off);
        pipeline(q, v2, in, t, out2, off);
        pipeline(q, &kd, in, t, out3, off);
        CK(clEnqueueReadBuffer(q, out1, CL_FALSE, 0, BYTES, h1, 0, NULL, NULL));
        CK(clEnqueueReadBuffer(q, out2, CL_TRUE, 0, BYTES, h2, 0, NULL, NULL));
        if (memcmp(h1, h2, BYTES) != 0)
            fail("program variants disagree");
        host_pipeline(hin, m, 5u, 11u, off);
        if (memcmp(h1, m, BYTES) != 0)
            fail("result differs from host model");
        hash_bytes(h1, BYTES);
        CK(clEnqueueReadBuffer(q, out3, CL_TRUE, 0, BYTES, h2, 0, NULL, NULL));
        host_pipeline(hin, m, 7u, 3u, off);
        if (memcmp(h2, m, BYTES) != 0)
            fail("-D variant differs from host model");
        hash_bytes(h2, 256);

        if (can_clone) {
            /* clone with arguments set, then retarget the original: the clone keeps its own */
            cl_uint n = N;
            CK(clSetKernelArg(v1->scale, 0, sizeof(cl_mem), &out1));
            CK(clSetKernelArg(v1->scale, 1, sizeof(cl_mem), &out3));
            CK(clSetKernelArg(v1->scale, 2, sizeof(cl_uint), &n));
            cl_int err;
            cl_kernel kcl = clCloneKernel(v1->scale, &err);
            CKE(err, "clCloneKernel");
            CK(clSetKernelArg(v1->scale, 1, sizeof(cl_mem), &t));
            size_t g = N;
            CK(clEnqueueNDRangeKernel(q, kcl, 1, NULL, &g, NULL, 0, NULL, NULL));
            CK(clEnqueueReadBuffer(q, out3, CL_TRUE, 0, BYTES, h2, 0, NULL, NULL));
            for (uint32_t i = 0; i < N; i++)
                if (h2[i] != h1[i] * 5u + 11u)
                    fail("cloned kernel result differs from host model");
            hash_bytes(h2, 256);
            CK(clReleaseKernel(kcl));
            clones++;
        }

        /* feed back: in <- out1 (device copy), mirror on host */
        CK(clEnqueueCopyBuffer(q, out1, in, 0, 0, BYTES, 0, NULL, NULL));
        memcpy(hin, h1, BYTES);

        if (it % 50 == 49) {
            release_kset(&kb);
            CK(clReleaseProgram(pb));
            pb = from_binary(ctx, bin, binsize);
            size_t nk = 0;
            CK(clGetProgramInfo(pb, CL_PROGRAM_NUM_KERNELS, sizeof nk, &nk, NULL));
            if (nk != 3)
                fail("CL_PROGRAM_NUM_KERNELS is not 3");
            kb.scale = make_kernel(pb, "scale");
            kb.offset = make_kernel(pb, "offset");
            kb.combine = make_kernel(pb, "combine");
            rebuilds++;
        }
        if (it % 10 == 9) {
            /* E: built again, the macro defined every other time */
            int with = (it / 10) % 2 == 0;
            cl_int err = clBuildProgram(pe, 1, &dev, with ? "-cl-std=CL1.2 -DE_MACRO" : "-cl-std=CL1.2",
                                        NULL, NULL);
            if (err != CL_SUCCESS) {
                print_build_log(pe, dev);
                die_cl("clBuildProgram (E again)", err);
            }
            cl_kernel ke = make_kernel(pe, "e");
            CK(clSetKernelArg(ke, 0, sizeof(cl_mem), &out3));
            size_t one = 1;
            CK(clEnqueueNDRangeKernel(q, ke, 1, NULL, &one, NULL, 0, NULL, NULL));
            cl_uint got = 0;
            CK(clEnqueueReadBuffer(q, out3, CL_TRUE, 0, sizeof got, &got, 0, NULL, NULL));
            if (got != (with ? 42u : 24u))
                fail("program E built again did not take its new options");
            /* TESTAPP_HOLD: halfway, with E's kernel alive, so that a move
             * made during the hold finds it; released after the move, it
             * must no longer be attached to E's program at E's next build
             * (the vendor refuses a build of a program with kernels). */
            if (!held && it >= iters / 2) {
                held = 1;
                hold_if_asked("programs", iters / 2, iters);
            }
            CK(clReleaseKernel(ke));
            rebuilds_e++;
            /* G: the attributes its first kernel reported */
            char attrs[256];
            cl_kernel kg = make_kernel(pg, "g");
            kernel_attributes(kg, attrs);
            CK(clReleaseKernel(kg));
            if (strcmp(attrs, attrs_g) != 0) {
                fprintf(stderr, "programs: CL_KERNEL_ATTRIBUTES \"%s\", first \"%s\"\n", attrs, attrs_g);
                fail("a kernel's attributes changed");
            }
        }
        if (pc && it % 10 == 9) {
            /* C again: compile unit 1 again, link both units again */
            cl_build_status bs;
            cl_program_binary_type bt;
            CK(clGetProgramBuildInfo(u2, dev, CL_PROGRAM_BUILD_STATUS, sizeof bs, &bs, NULL));
            CK(clGetProgramBuildInfo(u2, dev, CL_PROGRAM_BINARY_TYPE, sizeof bt, &bt, NULL));
            if (bs != CL_BUILD_SUCCESS || bt != CL_PROGRAM_BINARY_TYPE_COMPILED_OBJECT)
                fail("a compiled unit's build status or binary type changed");
            cl_int err = clCompileProgram(u1, 1, &dev, "-cl-std=CL1.2", 1, &hdr, &hname, NULL, NULL);
            if (err != CL_SUCCESS) {
                print_build_log(u1, dev);
                die_cl("clCompileProgram (again)", err);
            }
            /* Unit 2 through its binary, as the CTS's
             * execute_after_serialize_reload_object does. */
            size_t u2size = 0;
            CK(clGetProgramInfo(u2, CL_PROGRAM_BINARY_SIZES, sizeof u2size, &u2size, NULL));
            if (u2size == 0)
                fail("a compiled unit's binary size is 0");
            unsigned char *u2bin = xmalloc(u2size);
            unsigned char *u2bins[1] = {u2bin};
            CK(clGetProgramInfo(u2, CL_PROGRAM_BINARIES, sizeof u2bins, u2bins, NULL));
            cl_int st;
            const unsigned char *cu2bin = u2bin;
            cl_program u2again = clCreateProgramWithBinary(ctx, 1, &dev, &u2size, &cu2bin, &st, &err);
            CKE(err, "clCreateProgramWithBinary (compiled unit)");
            CKE(st, "clCreateProgramWithBinary (compiled unit)");
            free(u2bin);
            cl_program units[2] = {u1, u2again};
            cl_program again = clLinkProgram(ctx, 1, &dev, "", 2, units, NULL, NULL, &err);
            CKE(err, "clLinkProgram (again)");
            CK(clReleaseProgram(u2again));
            release_kset(&kc);
            CK(clReleaseProgram(pc));
            pc = again;
            kernels_in_program(pc, &kc, 0);
            relinks++;
        }
        if (it % 500 == 499)
            printf("programs: iteration %d\n", it + 1);
    }
    CK(clFinish(q));
    printf("programs: host model matches, %d clones, %d rebuilds from binary, %d links again, "
           "%d builds again\n",
           clones, rebuilds, relinks, rebuilds_e);

    release_kset(&ka);
    release_kset(&kb);
    release_kset(&kc);
    release_kset(&kd);
    release_kset(&kf);
    CK(clReleaseProgram(pa));
    CK(clReleaseProgram(pb));
    if (pc) {
        CK(clReleaseProgram(pc));
        CK(clReleaseProgram(hdr));
        CK(clReleaseProgram(u1));
        CK(clReleaseProgram(u2));
        CK(clReleaseProgram(lib));
        CK(clReleaseProgram(pf));
    }
    CK(clReleaseProgram(pd));
    CK(clReleaseProgram(pe));
    CK(clReleaseProgram(pg));
    unlink(dpath);
    rmdir(ddir);
    CK(clReleaseMemObject(in));
    CK(clReleaseMemObject(t));
    CK(clReleaseMemObject(out1));
    CK(clReleaseMemObject(out2));
    CK(clReleaseMemObject(out3));
    CK(clReleaseCommandQueue(q));
    CK(clReleaseContext(ctx));
    free(bin);
    free(hin);
    free(h1);
    free(h2);
    free(m);
    fprintf(stderr, "programs: %d iterations in %.3f s\n", iters, now_s() - t0);
    print_result();
    return 0;
}
