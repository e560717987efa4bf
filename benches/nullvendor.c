/* A do-nothing OpenCL vendor (an ICD), for measuring what crane itself adds to
 * a call. Every function call_overhead.c makes returns at once: no device, no
 * queue, no compiler. With it, `call_overhead` natively measures the ICD
 * loader's own cost per call and under crane crane's own cost, without a real
 * vendor's run-to-run noise, which on GPUs is larger than either (cargo xtask
 * bench --null-vendor; docs/benchmarks.md).
 *
 * Objects are a dispatch pointer and a reference count. Info queries answer
 * what crane and call_overhead ask (a GPU device, a kernel with four global
 * buffer arguments, two of them const, and an int); any other query is
 * answered with zeros. Build: gcc -O2 -shared -fPIC -o libnullvendor.so. */
#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#define CL_USE_DEPRECATED_OPENCL_1_1_APIS
#include <CL/cl.h>
#include <CL/cl_ext.h>
#include <CL/cl_icd.h>
#include <stdlib.h>
#include <string.h>

struct obj {
    struct _cl_icd_dispatch *dispatch;
    int refs;
};

static struct _cl_icd_dispatch table;
static struct obj platform = {&table, 1};
static struct obj device = {&table, 1};

static void *make(cl_int *err)
{
    struct obj *o = calloc(1, sizeof *o);
    o->dispatch = &table;
    o->refs = 1;
    if (err) *err = CL_SUCCESS;
    return o;
}

static cl_int retain(void *o)
{
    if (!o) return CL_INVALID_VALUE;
    ((struct obj *)o)->refs++;
    return CL_SUCCESS;
}

static cl_int release(void *o)
{
    if (!o) return CL_INVALID_VALUE;
    struct obj *x = o;
    if (x != &platform && x != &device && --x->refs == 0) free(x);
    return CL_SUCCESS;
}

/* Writes `n` bytes of `src` as an info answer (all zeros where src is NULL). */
static cl_int answer(const void *src, size_t n, size_t size, void *value, size_t *ret)
{
    if (value) {
        if (size < n) return CL_INVALID_VALUE;
        if (src) memcpy(value, src, n); else memset(value, 0, size);
    }
    if (ret) *ret = src ? n : (value ? size : 8);
    return CL_SUCCESS;
}
#define ANSWER(v) answer(&(v), sizeof(v), size, value, ret)
#define ANSWER_STR(s) answer((s), strlen(s) + 1, size, value, ret)

static cl_int CL_API_CALL get_platform_ids(cl_uint n, cl_platform_id *out, cl_uint *n_ret)
{
    if (out && n) out[0] = (cl_platform_id)&platform;
    if (n_ret) *n_ret = 1;
    return CL_SUCCESS;
}

cl_int CL_API_CALL clIcdGetPlatformIDsKHR(cl_uint n, cl_platform_id *out, cl_uint *n_ret)
{
    return get_platform_ids(n, out, n_ret);
}

void *CL_API_CALL clGetExtensionFunctionAddress(const char *name)
{
    return name && !strcmp(name, "clIcdGetPlatformIDsKHR") ? (void *)clIcdGetPlatformIDsKHR : NULL;
}

static void *CL_API_CALL ext_for_platform(cl_platform_id p, const char *name)
{
    (void)p;
    return name && !strcmp(name, "clIcdGetPlatformIDsKHR") ? (void *)clIcdGetPlatformIDsKHR : NULL;
}

static cl_int CL_API_CALL platform_info(cl_platform_id p, cl_platform_info param, size_t size,
                                        void *value, size_t *ret)
{
    (void)p;
    switch (param) {
    case CL_PLATFORM_NAME: return ANSWER_STR("crane null vendor");
    case CL_PLATFORM_VENDOR: return ANSWER_STR("crane");
    case CL_PLATFORM_VERSION: return ANSWER_STR("OpenCL 3.0 null");
    case CL_PLATFORM_PROFILE: return ANSWER_STR("FULL_PROFILE");
    case CL_PLATFORM_EXTENSIONS: return ANSWER_STR("cl_khr_icd");
    case CL_PLATFORM_ICD_SUFFIX_KHR: return ANSWER_STR("NULL");
    default: return answer(NULL, 0, size, value, ret);
    }
}

/* ocl-icd looks this one up by name in the vendor library. */
cl_int CL_API_CALL clGetPlatformInfo(cl_platform_id p, cl_platform_info param, size_t size,
                                     void *value, size_t *ret)
{
    return platform_info(p, param, size, value, ret);
}

static cl_int CL_API_CALL device_ids(cl_platform_id p, cl_device_type t, cl_uint n,
                                     cl_device_id *out, cl_uint *n_ret)
{
    (void)p;
    if (!(t & (CL_DEVICE_TYPE_GPU | CL_DEVICE_TYPE_DEFAULT))) return CL_DEVICE_NOT_FOUND;
    if (out && n) out[0] = (cl_device_id)&device;
    if (n_ret) *n_ret = 1;
    return CL_SUCCESS;
}

static cl_int CL_API_CALL device_info(cl_device_id d, cl_device_info param, size_t size,
                                      void *value, size_t *ret)
{
    (void)d;
    cl_device_type type = CL_DEVICE_TYPE_GPU;
    cl_platform_id p = (cl_platform_id)&platform;
    cl_bool yes = CL_TRUE;
    cl_uint one = 1;
    switch (param) {
    case CL_DEVICE_TYPE: return ANSWER(type);
    case CL_DEVICE_PLATFORM: return ANSWER(p);
    case CL_DEVICE_NAME: return ANSWER_STR("null device");
    case CL_DEVICE_VENDOR: return ANSWER_STR("crane");
    case CL_DEVICE_VERSION: return ANSWER_STR("OpenCL 3.0 null");
    case CL_DRIVER_VERSION: return ANSWER_STR("0");
    case CL_DEVICE_OPENCL_C_VERSION: return ANSWER_STR("OpenCL C 1.2 null");
    case CL_DEVICE_PROFILE: return ANSWER_STR("FULL_PROFILE");
    case CL_DEVICE_EXTENSIONS: return ANSWER_STR("");
    case CL_DEVICE_AVAILABLE:
    case CL_DEVICE_COMPILER_AVAILABLE:
    case CL_DEVICE_LINKER_AVAILABLE: return ANSWER(yes);
    case CL_DEVICE_MAX_COMPUTE_UNITS: return ANSWER(one);
    default: return answer(NULL, 0, size, value, ret);
    }
}

static cl_context CL_API_CALL create_context(const cl_context_properties *props, cl_uint n,
                                             const cl_device_id *devs,
                                             void(CL_CALLBACK *cb)(const char *, const void *,
                                                                   size_t, void *),
                                             void *ud, cl_int *err)
{
    (void)props; (void)n; (void)devs; (void)cb; (void)ud;
    return make(err);
}

static cl_context CL_API_CALL create_context_from_type(const cl_context_properties *props,
                                                       cl_device_type t,
                                                       void(CL_CALLBACK *cb)(const char *,
                                                                             const void *, size_t,
                                                                             void *),
                                                       void *ud, cl_int *err)
{
    (void)props; (void)t; (void)cb; (void)ud;
    return make(err);
}

static cl_int CL_API_CALL context_info(cl_context c, cl_context_info param, size_t size,
                                       void *value, size_t *ret)
{
    (void)c;
    cl_uint one = 1;
    cl_device_id d = (cl_device_id)&device;
    switch (param) {
    case CL_CONTEXT_NUM_DEVICES: return ANSWER(one);
    case CL_CONTEXT_DEVICES: return ANSWER(d);
    case CL_CONTEXT_REFERENCE_COUNT: return ANSWER(((struct obj *)c)->refs);
    default: return answer(NULL, 0, size, value, ret);
    }
}

static cl_command_queue CL_API_CALL create_queue_props(cl_context c, cl_device_id d,
                                                       const cl_queue_properties *props,
                                                       cl_int *err)
{
    (void)c; (void)d; (void)props;
    return make(err);
}

static cl_command_queue CL_API_CALL create_queue(cl_context c, cl_device_id d,
                                                 cl_command_queue_properties props, cl_int *err)
{
    (void)c; (void)d; (void)props;
    return make(err);
}

static cl_mem CL_API_CALL create_buffer(cl_context c, cl_mem_flags flags, size_t size, void *host,
                                        cl_int *err)
{
    (void)c; (void)flags; (void)size; (void)host;
    return make(err);
}

static cl_program CL_API_CALL program_with_source(cl_context c, cl_uint n, const char **s,
                                                  const size_t *l, cl_int *err)
{
    (void)c; (void)n; (void)s; (void)l;
    return make(err);
}

static cl_int CL_API_CALL build_program(cl_program p, cl_uint n, const cl_device_id *d,
                                        const char *o,
                                        void(CL_CALLBACK *cb)(cl_program, void *), void *ud)
{
    (void)n; (void)d; (void)o;
    if (cb) cb(p, ud);
    return CL_SUCCESS;
}

static cl_int CL_API_CALL program_info(cl_program p, cl_program_info param, size_t size,
                                       void *value, size_t *ret)
{
    (void)p;
    cl_uint one = 1;
    cl_device_id d = (cl_device_id)&device;
    size_t nk = 1;
    switch (param) {
    case CL_PROGRAM_NUM_DEVICES: return ANSWER(one);
    case CL_PROGRAM_DEVICES: return ANSWER(d);
    case CL_PROGRAM_NUM_KERNELS: return ANSWER(nk);
    case CL_PROGRAM_KERNEL_NAMES: return ANSWER_STR("k");
    default: return answer(NULL, 0, size, value, ret);
    }
}

static cl_int CL_API_CALL build_info(cl_program p, cl_device_id d, cl_program_build_info param,
                                     size_t size, void *value, size_t *ret)
{
    (void)p; (void)d;
    cl_build_status ok = CL_BUILD_SUCCESS;
    cl_program_binary_type bt = CL_PROGRAM_BINARY_TYPE_EXECUTABLE;
    switch (param) {
    case CL_PROGRAM_BUILD_STATUS: return ANSWER(ok);
    case CL_PROGRAM_BINARY_TYPE: return ANSWER(bt);
    default: return answer(NULL, 0, size, value, ret);
    }
}

static cl_kernel CL_API_CALL create_kernel(cl_program p, const char *name, cl_int *err)
{
    (void)p; (void)name;
    return make(err);
}

static cl_int CL_API_CALL kernel_info(cl_kernel k, cl_kernel_info param, size_t size,
                                      void *value, size_t *ret)
{
    (void)k;
    cl_uint args = 5;
    switch (param) {
    case CL_KERNEL_NUM_ARGS: return ANSWER(args);
    case CL_KERNEL_FUNCTION_NAME: return ANSWER_STR("k");
    default: return answer(NULL, 0, size, value, ret);
    }
}

/* k(__global float *a, __global const float *b, __global float *c,
 *   __global const float *d, int n), as call_overhead.c builds it. */
static cl_int CL_API_CALL arg_info(cl_kernel k, cl_uint i, cl_kernel_arg_info param,
                                   size_t size, void *value, size_t *ret)
{
    (void)k;
    if (i >= 5) return CL_INVALID_ARG_INDEX;
    cl_kernel_arg_address_qualifier addr =
        i < 4 ? CL_KERNEL_ARG_ADDRESS_GLOBAL : CL_KERNEL_ARG_ADDRESS_PRIVATE;
    cl_kernel_arg_access_qualifier access = CL_KERNEL_ARG_ACCESS_NONE;
    cl_kernel_arg_type_qualifier tq = (i == 1 || i == 3) ? CL_KERNEL_ARG_TYPE_CONST : 0;
    switch (param) {
    case CL_KERNEL_ARG_ADDRESS_QUALIFIER: return ANSWER(addr);
    case CL_KERNEL_ARG_ACCESS_QUALIFIER: return ANSWER(access);
    case CL_KERNEL_ARG_TYPE_QUALIFIER: return ANSWER(tq);
    case CL_KERNEL_ARG_TYPE_NAME: return ANSWER_STR(i < 4 ? "float*" : "int");
    case CL_KERNEL_ARG_NAME: return ANSWER_STR("x");
    default: return CL_INVALID_VALUE;
    }
}

static cl_int CL_API_CALL set_arg(cl_kernel k, cl_uint i, size_t size, const void *v)
{
    (void)k; (void)size; (void)v;
    return i < 5 ? CL_SUCCESS : CL_INVALID_ARG_INDEX;
}

static cl_int CL_API_CALL ndrange(cl_command_queue q, cl_kernel k, cl_uint dim, const size_t *o,
                                  const size_t *g, const size_t *l, cl_uint n,
                                  const cl_event *w, cl_event *ev)
{
    (void)q; (void)k; (void)dim; (void)o; (void)g; (void)l; (void)n; (void)w;
    if (ev) *ev = make(NULL);
    return CL_SUCCESS;
}

static cl_int CL_API_CALL write_buffer(cl_command_queue q, cl_mem b, cl_bool blocking,
                                       size_t off, size_t size, const void *p, cl_uint n,
                                       const cl_event *w, cl_event *ev)
{
    (void)q; (void)b; (void)blocking; (void)off; (void)size; (void)p; (void)n; (void)w;
    if (ev) *ev = make(NULL);
    return CL_SUCCESS;
}

static cl_int CL_API_CALL read_buffer(cl_command_queue q, cl_mem b, cl_bool blocking, size_t off,
                                      size_t size, void *p, cl_uint n, const cl_event *w,
                                      cl_event *ev)
{
    (void)q; (void)b; (void)blocking; (void)off; (void)n; (void)w;
    memset(p, 0, size);
    if (ev) *ev = make(NULL);
    return CL_SUCCESS;
}

static cl_int CL_API_CALL queue_op(cl_command_queue q)
{
    (void)q;
    return CL_SUCCESS;
}

static cl_int CL_API_CALL event_info(cl_event e, cl_event_info param, size_t size, void *value,
                                     size_t *ret)
{
    (void)e;
    cl_int done = CL_COMPLETE;
    if (param == CL_EVENT_COMMAND_EXECUTION_STATUS) return ANSWER(done);
    return answer(NULL, 0, size, value, ret);
}

static cl_int CL_API_CALL wait_events(cl_uint n, const cl_event *l)
{
    (void)n; (void)l;
    return CL_SUCCESS;
}

static cl_int CL_API_CALL any_info(void *o, cl_uint param, size_t size, void *value, size_t *ret)
{
    (void)o; (void)param;
    return answer(NULL, 0, size, value, ret);
}

static cl_int CL_API_CALL unload_compiler(cl_platform_id p)
{
    (void)p;
    return CL_SUCCESS;
}

__attribute__((constructor)) static void fill(void)
{
    table.clGetPlatformIDs = get_platform_ids;
    table.clGetPlatformInfo = platform_info;
    table.clGetDeviceIDs = device_ids;
    table.clGetDeviceInfo = device_info;
    table.clCreateContext = create_context;
    table.clCreateContextFromType = create_context_from_type;
    table.clRetainContext = (void *)retain;
    table.clReleaseContext = (void *)release;
    table.clGetContextInfo = context_info;
    table.clCreateCommandQueue = create_queue;
    table.clCreateCommandQueueWithProperties = create_queue_props;
    table.clRetainCommandQueue = (void *)retain;
    table.clReleaseCommandQueue = (void *)release;
    table.clGetCommandQueueInfo = (void *)any_info;
    table.clCreateBuffer = create_buffer;
    table.clRetainMemObject = (void *)retain;
    table.clReleaseMemObject = (void *)release;
    table.clGetMemObjectInfo = (void *)any_info;
    table.clCreateProgramWithSource = program_with_source;
    table.clRetainProgram = (void *)retain;
    table.clReleaseProgram = (void *)release;
    table.clBuildProgram = build_program;
    table.clGetProgramInfo = program_info;
    table.clGetProgramBuildInfo = build_info;
    table.clCreateKernel = create_kernel;
    table.clRetainKernel = (void *)retain;
    table.clReleaseKernel = (void *)release;
    table.clSetKernelArg = set_arg;
    table.clGetKernelInfo = kernel_info;
    table.clGetKernelArgInfo = arg_info;
    table.clGetKernelWorkGroupInfo = (void *)any_info;
    table.clWaitForEvents = wait_events;
    table.clGetEventInfo = event_info;
    table.clRetainEvent = (void *)retain;
    table.clReleaseEvent = (void *)release;
    table.clFlush = queue_op;
    table.clFinish = queue_op;
    table.clEnqueueReadBuffer = read_buffer;
    table.clEnqueueWriteBuffer = write_buffer;
    table.clEnqueueNDRangeKernel = ndrange;
    table.clGetExtensionFunctionAddress = clGetExtensionFunctionAddress;
    table.clGetExtensionFunctionAddressForPlatform = ext_for_platform;
    table.clUnloadPlatformCompiler = unload_compiler;
    table.clRetainDevice = (void *)retain;
    table.clReleaseDevice = (void *)release;
}
