/* floatmath: floating-point results that may differ between devices, and
 * results that may not.
 *
 * The OpenCL C specification makes +, -, *, fma and a few others correctly
 * rounded: every conforming device gives the same bits. Built-ins such as sin,
 * exp or pow, and division, may be off by a few units in the last place (ULP),
 * so two devices, or one device before and after crane moves the program to
 * another, may answer different bits, each within the bound.
 *
 * Each iteration runs two kernels over N elements whose inputs shift a little
 * every iteration:
 *   - `exact` (+, *, fma): checked bit for bit against the host and hashed into
 *     the RESULT line, which must therefore be identical on every device;
 *   - `rounded` (sin, cos, exp, log, sqrt, /, pow): each element checked against
 *     the host's double-precision result within the specification's bound for
 *     single precision (full profile), and summed as |value| in double.
 * It prints one line per built-in, `FLOAT <name> <bound in ULP> <sum>`: runs on
 * different devices agree on these sums within 2 * bound * 2^-23 relative (each
 * element of each run is within bound ULP of the same exact value, and an ULP
 * of a float is at most 2^-23 of its magnitude); runs on one device agree
 * exactly. Contraction is off (FP_CONTRACT), so no device fuses a * b + c.
 */
#include "common.h"
#include <math.h>

static const char *SRC =
    "#pragma OPENCL FP_CONTRACT OFF\n"
    "__kernel void exact(__global const float *a, __global const float *b, __global const float *c,\n"
    "                    __global float *out, uint n, float shift)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i >= n) return;\n"
    "    float x = a[i] + shift;\n"
    "    out[i] = x * b[i];\n"
    "    out[n + i] = fma(x, b[i], c[i]);\n"
    "    out[2 * n + i] = x - c[i];\n"
    "}\n"
    "__kernel void rounded(__global const float *a, __global const float *b, __global float *out,\n"
    "                      uint n, float shift)\n"
    "{\n"
    "    uint i = get_global_id(0);\n"
    "    if (i >= n) return;\n"
    "    float x = a[i] + shift;\n"
    "    float y = b[i];\n"
    "    out[i] = sin(x);\n"
    "    out[n + i] = cos(x);\n"
    "    out[2 * n + i] = exp(x * 0.0625f);\n"
    "    out[3 * n + i] = log(fabs(x) + 0.5f);\n"
    "    out[4 * n + i] = sqrt(fabs(x));\n"
    "    out[5 * n + i] = x / (fabs(y) + 0.25f);\n"
    "    out[6 * n + i] = pow(0.5f + fabs(y) * 0.0625f, x * 0.0625f);\n"
    "}\n";

#define N 4096u
#define NR 7

static const char *NAMES[NR] = {"sin", "cos", "exp", "log", "sqrt", "divide", "pow"};
/* OpenCL C 3.0, 7.5.1: ULP bounds for single precision, full profile. */
static const double BOUNDS[NR] = {4, 4, 3, 3, 3, 2.5, 16};

/* The exact value each `rounded` output approximates, from the same float inputs. */
static double reference(int f, float x, float y)
{
    switch (f) {
    case 0: return sin((double)x);
    case 1: return cos((double)x);
    case 2: return exp((double)(x * 0.0625f));
    case 3: return log((double)(fabsf(x) + 0.5f));
    case 4: return sqrt((double)fabsf(x));
    case 5: return (double)x / (double)(fabsf(y) + 0.25f);
    default: return pow((double)(0.5f + fabsf(y) * 0.0625f), (double)(x * 0.0625f));
    }
}

/* One ULP of a float of magnitude |r| (normal range). */
static double ulp_of(double r)
{
    int e;
    frexp(r, &e);
    if (e < -125)
        e = -125;
    return ldexp(1.0, e - 24);
}

/* A float in ±[1, 2) * 2^k, k in [lo, hi]. */
static float scaled(uint32_t *s, int lo, int hi)
{
    uint32_t r = rng_next(s);
    float m = 1.0f + (float)(r & 0xffffff) / 16777216.0f;
    int k = lo + (int)(rng_next(s) % (uint32_t)(hi - lo + 1));
    return (r >> 31 ? -1.0f : 1.0f) * ldexpf(m, k);
}

int main(int argc, char **argv)
{
    g_prog = "floatmath";
    int iters = parse_iters(argc, argv, 3000);
    cl_platform_id plat;
    cl_device_id dev;
    pick_device(&plat, &dev);
    cl_context ctx = make_context(plat, dev);
    cl_command_queue q = make_queue(ctx, dev, 0);
    cl_program prog = build_source(ctx, dev, SRC, "-cl-std=CL1.2");
    cl_kernel kexact = make_kernel(prog, "exact");
    cl_kernel kround = make_kernel(prog, "rounded");

    float *a = xmalloc(N * sizeof(float)), *b = xmalloc(N * sizeof(float)), *c = xmalloc(N * sizeof(float));
    uint32_t seed = 0x2545f491u;
    for (uint32_t i = 0; i < N; i++) {
        /* x within ±64 (sin, cos exact enough in double), b and c of many magnitudes. */
        a[i] = (float)((int32_t)(rng_next(&seed) % 128000u) - 64000) / 1000.0f;
        b[i] = scaled(&seed, -12, 12);
        c[i] = scaled(&seed, -20, 20);
    }
    cl_mem ba = make_buffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, N * sizeof(float), a);
    cl_mem bb = make_buffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, N * sizeof(float), b);
    cl_mem bc = make_buffer(ctx, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, N * sizeof(float), c);
    cl_mem bx = make_buffer(ctx, CL_MEM_WRITE_ONLY, 3 * N * sizeof(float), NULL);
    cl_mem br = make_buffer(ctx, CL_MEM_WRITE_ONLY, NR * N * sizeof(float), NULL);
    float *ox = xmalloc(3 * N * sizeof(float)), *orr = xmalloc(NR * N * sizeof(float));
    cl_uint n = N;
    size_t gsz = N;
    double sums[NR] = {0}, worst[NR] = {0};

    for (int it = 0; it < iters; it++) {
        float shift = (float)(it % 4096) * 0.0009765625f;
        CK(clSetKernelArg(kexact, 0, sizeof(cl_mem), &ba));
        CK(clSetKernelArg(kexact, 1, sizeof(cl_mem), &bb));
        CK(clSetKernelArg(kexact, 2, sizeof(cl_mem), &bc));
        CK(clSetKernelArg(kexact, 3, sizeof(cl_mem), &bx));
        CK(clSetKernelArg(kexact, 4, sizeof(cl_uint), &n));
        CK(clSetKernelArg(kexact, 5, sizeof(float), &shift));
        CK(clEnqueueNDRangeKernel(q, kexact, 1, NULL, &gsz, NULL, 0, NULL, NULL));
        CK(clSetKernelArg(kround, 0, sizeof(cl_mem), &ba));
        CK(clSetKernelArg(kround, 1, sizeof(cl_mem), &bb));
        CK(clSetKernelArg(kround, 2, sizeof(cl_mem), &br));
        CK(clSetKernelArg(kround, 3, sizeof(cl_uint), &n));
        CK(clSetKernelArg(kround, 4, sizeof(float), &shift));
        CK(clEnqueueNDRangeKernel(q, kround, 1, NULL, &gsz, NULL, 0, NULL, NULL));
        CK(clEnqueueReadBuffer(q, bx, CL_FALSE, 0, 3 * N * sizeof(float), ox, 0, NULL, NULL));
        CK(clEnqueueReadBuffer(q, br, CL_TRUE, 0, NR * N * sizeof(float), orr, 0, NULL, NULL));
        for (uint32_t i = 0; i < N; i++) {
            float x = a[i] + shift;
            float want[3] = {x * b[i], fmaf(x, b[i], c[i]), x - c[i]};
            for (int k = 0; k < 3; k++) {
                if (memcmp(&ox[k * N + i], &want[k], sizeof(float)) != 0) {
                    char what[160];
                    snprintf(what, sizeof what, "exact op %d element %u iteration %d: %a, want %a", k, i, it,
                             (double)ox[k * N + i], (double)want[k]);
                    fail(what);
                }
            }
            for (int f = 0; f < NR; f++) {
                double r = reference(f, x, b[i]);
                double got = orr[f * N + i];
                double ulps = fabs(got - r) / ulp_of(r);
                if (!(ulps <= BOUNDS[f])) {
                    char what[160];
                    snprintf(what, sizeof what, "%s element %u iteration %d: %.9g is %.2f ULP from %.17g", NAMES[f], i,
                             it, got, ulps, r);
                    fail(what);
                }
                if (ulps > worst[f])
                    worst[f] = ulps;
                sums[f] += fabs(got);
            }
        }
        hash_bytes(ox, 3 * N * sizeof(float));
    }
    for (int f = 0; f < NR; f++) {
        printf("FLOAT %s %g %.12e\n", NAMES[f], BOUNDS[f], sums[f]);
        fprintf(stderr, "floatmath: %s at most %.2f ULP from exact\n", NAMES[f], worst[f]);
    }
    print_result();
    return 0;
}
