/* tcp-intake: how fast can one process take bytes from another over TCP
 * loopback, the way crane-proxy takes a move's re-injection (8 MiB frames
 * read straight into pinned staging)? A bound for "move to crane-proxy
 * without pre-copy" (docs/benchmarks.md).
 *
 *   gcc -O2 -o tcp-intake benches/tcp-intake.c -lOpenCL -lpthread
 *   ./tcp-intake [MiB=256] [reps=5]
 *
 * For 1, 2 and 4 parallel connections (the bytes split between them), the
 * receiver reading into warm malloc'd memory and into pinned memory of the
 * first OpenCL device (CL_MEM_ALLOC_HOST_PTR mapped), sender writing 8 MiB
 * at a time from warm memory; prints GB/s per repetition. No OpenCL
 * platform: the pinned rows are skipped. Each row twice: the sender
 * write()ing (the kernel copies the bytes into its socket buffers, and the
 * receiver's read copies them out again), and the sender vmsplice()ing its
 * pages into a pipe and splice()ing the pipe into the socket (no copy on the
 * sending side: one copy in all). */
#define _GNU_SOURCE
#include <fcntl.h>
#include <sys/uio.h>
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define CHUNK (8u << 20)
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}
static void die(const char *w) { perror(w); exit(1); }

struct side { int fd; char *buf; size_t len; };
static int use_splice;

static void *splicer(struct side *s) {
    int p[2];
    if (pipe(p)) die("pipe");
    int cap = fcntl(p[1], F_SETPIPE_SZ, 1 << 20);
    if (cap <= 0) cap = 64 << 10;
    for (size_t off = 0; off < s->len;) {
        size_t n = s->len - off < (size_t)cap ? s->len - off : (size_t)cap;
        struct iovec v = {s->buf + off, n};
        ssize_t in = vmsplice(p[1], &v, 1, 0);
        if (in <= 0) die("vmsplice");
        for (ssize_t d = 0; d < in;) {
            ssize_t w = splice(p[0], NULL, s->fd, NULL, (size_t)(in - d), SPLICE_F_MORE);
            if (w <= 0) die("splice");
            d += w;
        }
        off += (size_t)in;
    }
    close(p[0]);
    close(p[1]);
    return NULL;
}

static void *sender(void *a) {
    struct side *s = a;
    if (use_splice) return splicer(s);
    for (size_t off = 0; off < s->len;) {
        size_t n = s->len - off < CHUNK ? s->len - off : CHUNK;
        for (size_t d = 0; d < n;) {
            ssize_t w = write(s->fd, s->buf + off + d, n - d);
            if (w <= 0) die("write");
            d += (size_t)w;
        }
        off += n;
    }
    return NULL;
}

static void *receiver(void *a) {
    struct side *s = a;
    for (size_t d = 0; d < s->len;) {
        ssize_t r = read(s->fd, s->buf + d, s->len - d < CHUNK ? s->len - d : CHUNK);
        if (r <= 0) die("read");
        d += (size_t)r;
    }
    return NULL;
}

/* One run: `conns` connections carry `len` bytes from src to dst. */
static double run(int conns, char *src, char *dst, size_t len) {
    int l = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (bind(l, (void *)&sa, sizeof sa) || listen(l, 8) || getsockname(l, (void *)&sa, &sl)) die("listen");
    struct side snd[4], rcv[4];
    size_t part = len / conns;
    for (int i = 0; i < conns; i++) {
        int c = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        if (connect(c, (void *)&sa, sizeof sa)) die("connect");
        setsockopt(c, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        int a = accept(l, NULL, NULL);
        if (a < 0) die("accept");
        snd[i] = (struct side){c, src + i * part, part};
        rcv[i] = (struct side){a, dst + i * part, part};
    }
    pthread_t t[8];
    double t0 = now();
    for (int i = 0; i < conns; i++) {
        pthread_create(&t[2 * i], NULL, sender, &snd[i]);
        pthread_create(&t[2 * i + 1], NULL, receiver, &rcv[i]);
    }
    for (int i = 0; i < 2 * conns; i++) pthread_join(t[i], NULL);
    double dt = now() - t0;
    for (int i = 0; i < conns; i++) { close(snd[i].fd); close(rcv[i].fd); }
    close(l);
    if (memcmp(src, dst, part * conns)) { fprintf(stderr, "data differs\n"); exit(1); }
    return (double)(part * conns) / dt / 1e9;
}

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 256;
    int reps = argc > 2 ? atoi(argv[2]) : 5;
    size_t len = mib << 20;
    char *src = malloc(len), *heap = malloc(len), *pin = NULL;
    for (size_t i = 0; i < len; i++) src[i] = (char)(i * 7 + 3);
    memset(heap, 0, len);
    cl_platform_id p;
    cl_device_id d;
    cl_uint np = 0;
    if (clGetPlatformIDs(1, &p, &np) == CL_SUCCESS && np &&
        clGetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 1, &d, NULL) == CL_SUCCESS) {
        cl_int e;
        cl_context c = clCreateContext(NULL, 1, &d, NULL, NULL, &e);
        cl_command_queue q = clCreateCommandQueueWithProperties(c, d, NULL, &e);
        cl_mem b = clCreateBuffer(c, CL_MEM_ALLOC_HOST_PTR, len, NULL, &e);
        pin = clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_WRITE, 0, len, 0, NULL, NULL, &e);
        if (e) pin = NULL; else memset(pin, 0, len);
        char name[256] = "";
        clGetDeviceInfo(d, CL_DEVICE_NAME, sizeof name, name, NULL);
        printf("pinned memory of %s\n", name);
    }
    for (int conns = 1; conns <= 4; conns *= 2) {
        for (int mode = 0; mode < 4; mode++) {
            int into = mode & 1;
            use_splice = mode >> 1;
            char *dst = into ? pin : heap;
            if (!dst) continue;
            printf("%d connection(s), %s, %zu MiB into %s memory, GB/s:", conns,
                   use_splice ? "vmsplice" : "write", mib, into ? "pinned" : "malloc'd");
            for (int r = 0; r < reps; r++) {
                memset(dst, 0, len);
                printf(" %.2f", run(conns, src, dst, len));
                fflush(stdout);
            }
            printf("\n");
        }
    }
    return 0;
}
