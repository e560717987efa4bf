/* dirty-read: how fast can a suspend read a device buffer into RAM that
 * outlives the vendor library, and a resume write it back? (issue 15's
 * goal: >= 80% of the device<->host bandwidth.) For each size, the ways:
 *
 *   pageable-fresh   clEnqueueReadBuffer into fresh (THP) anonymous memory
 *   pin-fresh        a CL_MEM_USE_HOST_PTR buffer over fresh memory (NVIDIA
 *                    page-locks it), then the read into it (crane today)
 *   prefault-N       fresh memory faulted in by N threads first, then pinned
 *                    and read into
 *   pin-warm         memory already faulted in (a RAM copy reused), pinned
 *                    and read into
 *   staged-N-fresh   reads of 16 MiB pieces into a ring of the vendor's
 *                    pinned memory (CL_MEM_ALLOC_HOST_PTR, made once per
 *                    vendor load), copied out by N threads into fresh memory
 *   staged-N-warm    the same into memory already faulted in
 *   write-pageable   clEnqueueWriteBuffer from warm unpinned memory
 *   write-pin        pinned (USE_HOST_PTR) first, then written
 *   write-staged-N   copied by N threads into the ring, written from there
 *   pieces-...       pinned piece by piece by 1 or 2 threads ahead of the
 *                    transfers (see `pipelined`), into warm memory or fresh
 *                    memory faulted in by N threads ahead of the pinning
 *   write-pieces     the same for writes from warm memory
 *
 * Prints ms and GB/s per way (the pin's share apart where there is one)
 * against the device's own rate (a read into the vendor's pinned memory).
 * Every way's contents are checked against the buffer's.
 *
 *   gcc -O2 -pthread -o dirty-read benches/dirty-read.c -lOpenCL
 *   ./dirty-read [MiB...]        (default 256 1024)
 */
#define CL_TARGET_OPENCL_VERSION 300
#define _GNU_SOURCE
#include <CL/cl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#define CK(x) do { cl_int e_ = (x); if (e_) { printf("%s:%d err %d\n", __FILE__, __LINE__, e_); exit(1); } } while (0)
#define PIECE (16u << 20)
#define SLOTS 4

static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }

static cl_context ctx;
static cl_command_queue q;
static void *ring[SLOTS];

static void *fresh(size_t n) {
    size_t h = 2u << 20, map = n + h;
    char *p = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); exit(1); }
    char *a = (char *)(((uintptr_t)p + h - 1) & ~(uintptr_t)(h - 1));
    madvise(a, n, MADV_HUGEPAGE);
    return a;
}

/* N threads copying (or faulting in) [0, n) in N slices. */
struct job { char *dst; const char *src; size_t n; };
static void *copy_slice(void *a) {
    struct job *j = a;
    if (j->src) memcpy(j->dst, j->src, j->n); else memset(j->dst, 0, j->n);
    return NULL;
}
static void parallel(char *dst, const char *src, size_t n, int threads) {
    pthread_t t[64];
    struct job j[64];
    size_t per = (n / threads + 4095) & ~(size_t)4095;
    int k = 0;
    for (size_t off = 0; off < n; off += per, k++) {
        j[k] = (struct job){dst + off, src ? src + off : NULL, off + per > n ? n - off : per};
        if (k) pthread_create(&t[k], NULL, copy_slice, &j[k]);
    }
    copy_slice(&j[0]);
    for (int i = 1; i < k; i++) pthread_join(t[i], NULL);
}

static cl_mem pin(void *p, size_t n, double *secs) {
    double t = now();
    cl_int e;
    cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, n, p, &e);
    CK(e);
    *secs = now() - t;
    return m;
}

/* Reads `buf` into `dst` through the ring, N copying threads. */
static void staged_read(cl_mem buf, char *dst, size_t n, int threads) {
    size_t pieces = (n + PIECE - 1) / PIECE;
    cl_event ev[SLOTS];
    for (size_t i = 0; i < pieces && i < SLOTS; i++) {
        size_t len = i * PIECE + PIECE > n ? n - i * PIECE : PIECE;
        CK(clEnqueueReadBuffer(q, buf, CL_FALSE, i * PIECE, len, ring[i], 0, NULL, &ev[i]));
    }
    clFlush(q);
    for (size_t i = 0; i < pieces; i++) {
        int s = i % SLOTS;
        size_t len = i * PIECE + PIECE > n ? n - i * PIECE : PIECE;
        CK(clWaitForEvents(1, &ev[s]));
        clReleaseEvent(ev[s]);
        parallel(dst + i * PIECE, ring[s], len, threads);
        size_t nx = i + SLOTS;
        if (nx < pieces) {
            size_t l2 = nx * PIECE + PIECE > n ? n - nx * PIECE : PIECE;
            CK(clEnqueueReadBuffer(q, buf, CL_FALSE, nx * PIECE, l2, ring[s], 0, NULL, &ev[s]));
            clFlush(q);
        }
    }
}

static void staged_write(cl_mem buf, const char *src, size_t n, int threads) {
    size_t pieces = (n + PIECE - 1) / PIECE;
    cl_event ev[SLOTS] = {0};
    for (size_t i = 0; i < pieces; i++) {
        int s = i % SLOTS;
        size_t len = i * PIECE + PIECE > n ? n - i * PIECE : PIECE;
        if (ev[s]) { CK(clWaitForEvents(1, &ev[s])); clReleaseEvent(ev[s]); }
        parallel(ring[s], src + i * PIECE, len, threads);
        CK(clEnqueueWriteBuffer(q, buf, CL_FALSE, i * PIECE, len, ring[s], 0, NULL, &ev[s]));
        clFlush(q);
    }
    CK(clFinish(q));
    for (int s = 0; s < SLOTS; s++) if (ev[s]) clReleaseEvent(ev[s]);
}

/* Pinned piece by piece, pipelined: `pinners` threads page-lock pieces
 * (a CL_MEM_USE_HOST_PTR buffer each) ahead of the transfers, which start
 * on each piece as soon as it is pinned; with `faulters`, fresh memory is
 * faulted in piece by piece ahead of the pinning. */
#define MAXP 1024
struct pipe {
    char *host; size_t n, piece; int pieces, faulters, pinners;
    pthread_mutex_t mu; pthread_cond_t cv;
    int faulted[MAXP], pinned[MAXP], next_fault, next_pin;
    cl_mem pins[MAXP];
};
static size_t plen(struct pipe *p, int k) { size_t o = (size_t)k * p->piece; return o + p->piece > p->n ? p->n - o : p->piece; }
static void *faulter(void *a) {
    struct pipe *p = a;
    for (;;) {
        pthread_mutex_lock(&p->mu); int k = p->next_fault++; pthread_mutex_unlock(&p->mu);
        if (k >= p->pieces) return NULL;
        memset(p->host + (size_t)k * p->piece, 0, plen(p, k));
        pthread_mutex_lock(&p->mu); p->faulted[k] = 1; pthread_cond_broadcast(&p->cv); pthread_mutex_unlock(&p->mu);
    }
}
static void *pinner(void *a) {
    struct pipe *p = a;
    for (;;) {
        pthread_mutex_lock(&p->mu); int k = p->next_pin++;
        if (k < p->pieces && p->faulters) while (!p->faulted[k]) pthread_cond_wait(&p->cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
        if (k >= p->pieces) return NULL;
        cl_int e;
        cl_mem m = clCreateBuffer(ctx, CL_MEM_READ_WRITE | CL_MEM_USE_HOST_PTR, plen(p, k), p->host + (size_t)k * p->piece, &e);
        CK(e);
        pthread_mutex_lock(&p->mu); p->pins[k] = m; p->pinned[k] = 1; pthread_cond_broadcast(&p->cv); pthread_mutex_unlock(&p->mu);
    }
}
static void pipelined(cl_mem buf, char *host, size_t n, int write, int faulters, int pinners, size_t piece) {
    static struct pipe p;
    memset(&p, 0, sizeof p);
    p.host = host; p.n = n; p.piece = piece; p.pieces = (int)((n + piece - 1) / piece);
    p.faulters = faulters; p.pinners = pinners;
    pthread_mutex_init(&p.mu, NULL); pthread_cond_init(&p.cv, NULL);
    pthread_t t[32]; int nt = 0;
    for (int i = 0; i < faulters; i++) pthread_create(&t[nt++], NULL, faulter, &p);
    for (int i = 0; i < pinners; i++) pthread_create(&t[nt++], NULL, pinner, &p);
    for (int k = 0; k < p.pieces; k++) {
        pthread_mutex_lock(&p.mu); while (!p.pinned[k]) pthread_cond_wait(&p.cv, &p.mu); pthread_mutex_unlock(&p.mu);
        size_t off = (size_t)k * piece;
        if (write) CK(clEnqueueWriteBuffer(q, buf, CL_FALSE, off, plen(&p, k), host + off, 0, NULL, NULL));
        else CK(clEnqueueReadBuffer(q, buf, CL_FALSE, off, plen(&p, k), host + off, 0, NULL, NULL));
        clFlush(q);
    }
    CK(clFinish(q));
    for (int i = 0; i < nt; i++) pthread_join(t[i], NULL);
    for (int k = 0; k < p.pieces; k++) clReleaseMemObject(p.pins[k]);
}

static size_t n;
static const char *want;
static double device_gbs;

static void report(const char *way, double secs, double pin_secs) {
    double gbs = n / secs / 1e9;
    printf("%-18s %8.1f ms %6.1f GB/s %5.0f%%", way, secs * 1e3, gbs, 100 * gbs / device_gbs);
    if (pin_secs >= 0) printf("   (pin %.1f ms)", pin_secs * 1e3);
    printf("\n");
}

static void check(const char *way, const char *got) {
    if (memcmp(got, want, n)) { printf("%s: contents differ\n", way); exit(1); }
}

int main(int argc, char **argv) {
    cl_platform_id pl; cl_device_id dev; cl_int e;
    CK(clGetPlatformIDs(1, &pl, NULL));
    CK(clGetDeviceIDs(pl, CL_DEVICE_TYPE_ALL, 1, &dev, NULL));
    char name[256]; clGetDeviceInfo(dev, CL_DEVICE_NAME, sizeof name, name, NULL);
    ctx = clCreateContext(NULL, 1, &dev, NULL, NULL, &e); CK(e);
    q = clCreateCommandQueueWithProperties(ctx, dev, NULL, &e); CK(e);
    double t = now();
    for (int s = 0; s < SLOTS; s++) {
        cl_mem b = clCreateBuffer(ctx, CL_MEM_ALLOC_HOST_PTR, PIECE, NULL, &e); CK(e);
        ring[s] = clEnqueueMapBuffer(q, b, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, PIECE, 0, NULL, NULL, &e); CK(e);
        memset(ring[s], 0, PIECE);
    }
    printf("device %s; ring of %d x %u MiB made in %.1f ms\n", name, SLOTS, PIECE >> 20, (now() - t) * 1e3);
    int sizes[8] = {256, 1024}, ns = 2;
    if (argc > 1) { ns = 0; for (int i = 1; i < argc && ns < 8; i++) sizes[ns++] = atoi(argv[i]); }
    for (int si = 0; si < ns; si++) {
        n = (size_t)sizes[si] << 20;
        char *src = fresh(n);
        for (size_t i = 0; i < n / 8; i++) ((uint64_t *)src)[i] = i * 0x9E3779B97F4A7C15ull;
        want = src;
        cl_mem buf = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n, NULL, &e); CK(e);
        double ps;
        cl_mem sp = pin(src, n, &ps);
        CK(clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, n, src, 0, NULL, NULL));
        clReleaseMemObject(sp);
        /* The device's rate: a read into the vendor's pinned memory. */
        cl_mem hb = clCreateBuffer(ctx, CL_MEM_ALLOC_HOST_PTR, n, NULL, &e); CK(e);
        char *hp = clEnqueueMapBuffer(q, hb, CL_TRUE, CL_MAP_READ | CL_MAP_WRITE, 0, n, 0, NULL, NULL, &e); CK(e);
        memset(hp, 0, n);
        CK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, n, hp, 0, NULL, NULL));
        t = now();
        CK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, n, hp, 0, NULL, NULL));
        device_gbs = n / (now() - t) / 1e9;
        check("device", hp);
        printf("\n%d MiB: device -> pinned %.1f GB/s\n", sizes[si], device_gbs);
        t = now();
        CK(clEnqueueWriteBuffer(q, buf, CL_TRUE, 0, n, hp, 0, NULL, NULL));
        printf("%d MiB: pinned -> device %.1f GB/s\n", sizes[si], n / (now() - t) / 1e9);
        clEnqueueUnmapMemObject(q, hb, hp, 0, NULL, NULL);
        clReleaseMemObject(hb);

        char *d = fresh(n);
        t = now();
        CK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, n, d, 0, NULL, NULL));
        report("pageable-fresh", now() - t, -1);
        check("pageable-fresh", d);

        d = fresh(n);
        t = now();
        cl_mem p = pin(d, n, &ps);
        CK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, n, d, 0, NULL, NULL));
        report("pin-fresh", now() - t, ps);
        check("pin-fresh", d);
        clReleaseMemObject(p);

        int th[] = {4, 8};
        for (int k = 0; k < 2; k++) {
            char label[32];
            snprintf(label, sizeof label, "prefault-%d", th[k]);
            d = fresh(n);
            t = now();
            parallel(d, NULL, n, th[k]);
            double fault = now() - t;
            p = pin(d, n, &ps);
            CK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, n, d, 0, NULL, NULL));
            report(label, now() - t, ps);
            printf("%18s (faulting in %.1f ms)\n", "", fault * 1e3);
            check(label, d);
            clReleaseMemObject(p);
        }
        /* `d` is warm now. */
        t = now();
        p = pin(d, n, &ps);
        CK(clEnqueueReadBuffer(q, buf, CL_TRUE, 0, n, d, 0, NULL, NULL));
        report("pin-warm", now() - t, ps);
        check("pin-warm", d);
        clReleaseMemObject(p);

        struct { const char *name; int faulters, pinners; size_t piece; } pw[] = {
            {"pieces-warm-16M", 0, 1, 16u << 20}, {"pieces-warm-16Mx2", 0, 2, 16u << 20},
            {"pieces-warm-64M", 0, 1, 64u << 20}, {"pieces-fresh-4", 4, 1, 16u << 20},
            {"pieces-fresh-8x2", 8, 2, 16u << 20}, {"pieces-fresh-8-4M", 8, 2, 4u << 20},
        };
        for (int k = 0; k < 6; k++) {
            char *f = pw[k].faulters ? fresh(n) : d;
            t = now();
            pipelined(buf, f, n, 0, pw[k].faulters, pw[k].pinners, pw[k].piece);
            report(pw[k].name, now() - t, -1);
            check(pw[k].name, f);
            if (f != d) munmap(f, n);
        }

        int st[] = {1, 4, 8};
        for (int k = 0; k < 3; k++) {
            char label[32];
            snprintf(label, sizeof label, "staged-%d-fresh", st[k]);
            char *f = fresh(n);
            t = now();
            staged_read(buf, f, n, st[k]);
            report(label, now() - t, -1);
            check(label, f);
            munmap(f, n);
            snprintf(label, sizeof label, "staged-%d-warm", st[k]);
            t = now();
            staged_read(buf, d, n, st[k]);
            report(label, now() - t, -1);
            check(label, d);
        }

        /* Writes back from warm memory `d` (it holds the contents). */
        cl_mem back = clCreateBuffer(ctx, CL_MEM_READ_WRITE, n, NULL, &e); CK(e);
        char *chk = fresh(n);
        sp = pin(chk, n, &ps);
        t = now();
        CK(clEnqueueWriteBuffer(q, back, CL_TRUE, 0, n, d, 0, NULL, NULL));
        report("write-pageable", now() - t, -1);
        t = now();
        p = pin(d, n, &ps);
        CK(clEnqueueWriteBuffer(q, back, CL_TRUE, 0, n, d, 0, NULL, NULL));
        report("write-pin", now() - t, ps);
        clReleaseMemObject(p);
        for (int k = 0; k < 2; k++) {
            const char *name = k ? "write-pieces-x2" : "write-pieces";
            CK(clEnqueueFillBuffer(q, back, "\0\0\0\0", 4, 0, n, 0, NULL, NULL));
            CK(clFinish(q));
            t = now();
            pipelined(back, d, n, 1, 0, k + 1, 16u << 20);
            report(name, now() - t, -1);
            CK(clEnqueueReadBuffer(q, back, CL_TRUE, 0, n, chk, 0, NULL, NULL));
            check(name, chk);
        }
        for (int k = 0; k < 3; k++) {
            char label[32];
            snprintf(label, sizeof label, "write-staged-%d", st[k]);
            CK(clEnqueueFillBuffer(q, back, "\0\0\0\0", 4, 0, n, 0, NULL, NULL));
            CK(clFinish(q));
            t = now();
            staged_write(back, d, n, st[k]);
            report(label, now() - t, -1);
            CK(clEnqueueReadBuffer(q, back, CL_TRUE, 0, n, chk, 0, NULL, NULL));
            check(label, chk);
        }
        clReleaseMemObject(sp);
        clReleaseMemObject(back);
        clReleaseMemObject(buf);
    }
    return 0;
}
