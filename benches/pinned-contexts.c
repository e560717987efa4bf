/* pinned-contexts: is pinned host memory of one OpenCL context pinned for
 * another context's transfers? crane-proxy keeps pre-copy blobs in pinned
 * memory of a context of its own and writes them into buffers of the
 * sessions' contexts (docs/architecture.md, "Pre-copy to crane-proxy").
 * Writes 256 MiB into a buffer of context B, 5 times, from B's pinned
 * memory (CL_MEM_ALLOC_HOST_PTR mapped), from A's, and from malloc'd memory.
 *
 *   gcc -O2 -o pinned-contexts benches/pinned-contexts.c -lOpenCL -lpthread
 *
 * Then 32 new 8 MiB buffers of B, each written once non-blocking and one
 * clFinish (what a move's re-injection does), from each source; and the
 * same from A's pinned memory while another thread makes a context.
 *
 * NVIDIA H200 (580.159.04): 55.2 / 55.1 / 6.7 GB/s (A's memory is pinned
 * for B too), and 0.16 ms per new buffer from either pinned memory against
 * 1.35-1.55 from malloc. Whether A's memory is allocated before or after B
 * is made makes no difference; a context being made by another thread
 * while the writes run does: 1.24-1.39 ms per buffer (why crane-proxy
 * makes a warm context's replacement after the move's rebuild, not when
 * the move takes it: proxy-dom/src/warm.rs). */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <pthread.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
#define CK(x) do{cl_int e_=(x); if(e_){printf("%s:%d err %d\n",__FILE__,__LINE__,e_);exit(1);}}while(0)
static void *pinned(cl_context c, cl_command_queue q, size_t n){cl_int e;cl_mem b=clCreateBuffer(c,CL_MEM_ALLOC_HOST_PTR,n,NULL,&e);CK(e);void*p=clEnqueueMapBuffer(q,b,CL_TRUE,CL_MAP_WRITE,0,n,0,NULL,NULL,&e);CK(e);memset(p,1,n);return p;}
static double rate(cl_command_queue q, cl_mem d, void *src, size_t n){CK(clEnqueueWriteBuffer(q,d,CL_TRUE,0,n,src,0,NULL,NULL));double t=now();for(int i=0;i<5;i++)CK(clEnqueueWriteBuffer(q,d,CL_TRUE,0,n,src,0,NULL,NULL));return 5.0*n/(now()-t)/1e9;}
static cl_device_id beside_dev;
static void *make_context(void *arg){
  (void)arg; cl_int e; double t=now();
  cl_context c=clCreateContext(NULL,1,&beside_dev,NULL,NULL,&e); CK(e);
  printf("  (a context made beside in %.1f ms)\n",(now()-t)*1e3);
  clReleaseContext(c); return NULL;
}
static void fresh_writes(cl_context b, cl_command_queue qb, void *src, const char *name){
  cl_int e; size_t m = 8u << 20; cl_mem fresh[32];
  double t0 = now(), enq = 0;
  for (int i = 0; i < 32; i++) {
    fresh[i] = clCreateBuffer(b, CL_MEM_READ_WRITE, m, NULL, &e); CK(e);
    double t = now();
    CK(clEnqueueWriteBuffer(qb, fresh[i], CL_FALSE, 0, m, (char *)src + i * m, 0, NULL, NULL));
    enq += now() - t;
  }
  CK(clFinish(qb));
  double all = now() - t0;
  printf("32 new 8 MiB buffers written from %s: %.1f ms (enqueue %.1f ms, %.2f ms per buffer)\n",
         name, all * 1e3, enq * 1e3, all * 1e3 / 32);
  for (int i = 0; i < 32; i++) clReleaseMemObject(fresh[i]);
}
int main(void){
  cl_platform_id p; cl_device_id d; cl_int e; size_t n=256u<<20;
  CK(clGetPlatformIDs(1,&p,NULL)); CK(clGetDeviceIDs(p,CL_DEVICE_TYPE_ALL,1,&d,NULL));
  cl_context a=clCreateContext(NULL,1,&d,NULL,NULL,&e);CK(e);
  cl_context b=clCreateContext(NULL,1,&d,NULL,NULL,&e);CK(e);
  cl_command_queue qa=clCreateCommandQueueWithProperties(a,d,NULL,&e);CK(e);
  cl_command_queue qb=clCreateCommandQueueWithProperties(b,d,NULL,&e);CK(e);
  cl_mem db=clCreateBuffer(b,CL_MEM_READ_WRITE,n,NULL,&e);CK(e);
  void *pa=pinned(a,qa,n), *pb=pinned(b,qb,n), *heap=malloc(n); memset(heap,1,n);
  printf("write 256 MiB into context B's buffer from: B's pinned %.1f GB/s, A's pinned %.1f GB/s, malloc %.1f GB/s\n",
         rate(qb,db,pb,n), rate(qb,db,pa,n), rate(qb,db,heap,n));
  /* As a move's re-injection does: 32 new buffers of 8 MiB, each written
   * once, non-blocking, then one clFinish. */
  void *srcs[3] = {pb, pa, heap};
  const char *names[3] = {"B's pinned", "A's pinned", "malloc"};
  for (int round = 0; round < 2; round++)
    for (int s = 0; s < 3; s++) fresh_writes(b, qb, srcs[s], names[s]);
  /* While the driver makes a context (crane-proxy's warm context refilled
   * during a move's rebuild, before session 20). */
  beside_dev = d;
  for (int round = 0; round < 2; round++) {
    pthread_t t; pthread_create(&t, NULL, make_context, NULL);
    fresh_writes(b, qb, pa, "A's pinned, a context being made beside");
    pthread_join(t, NULL);
  }
  return 0;
}
