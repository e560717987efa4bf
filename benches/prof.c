/* A flat sampling profiler for machines without perf: LD_PRELOAD it with
 * PROF_OUT=file; every millisecond of CPU time (ITIMER_PROF) it records the
 * interrupted instruction pointer, and at exit it writes the samples grouped by
 * shared object and by symbol (or offset, for stripped objects). A process
 * ended by SIGTERM (a server such as crane-proxy) writes them too.
 * Build: gcc -O2 -shared -fPIC -o prof.so prof.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <ucontext.h>
#include <unistd.h>

#define MAX_SAMPLES (1 << 21)
static uintptr_t samples[MAX_SAMPLES];
static volatile unsigned long nsamples;

static void on_prof(int sig, siginfo_t *si, void *uc_)
{
    (void)sig;
    (void)si;
    ucontext_t *uc = uc_;
    unsigned long i = __atomic_fetch_add(&nsamples, 1, __ATOMIC_RELAXED);
    if (i < MAX_SAMPLES)
        samples[i] = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
}

static void stop(void);

static void on_term(int sig)
{
    (void)sig;
    stop();
    _exit(143);
}

__attribute__((constructor)) static void start(void)
{
    if (!getenv("PROF_OUT"))
        return;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_prof;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigaction(SIGPROF, &sa, NULL);
    signal(SIGTERM, on_term);
    struct itimerval it = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_PROF, &it, NULL);
}

struct entry {
    char name[256];
    unsigned long n;
};

static int by_count(const void *a, const void *b)
{
    const struct entry *x = a, *y = b;
    return x->n < y->n ? 1 : x->n > y->n ? -1 : 0;
}

static void add(struct entry *t, int *len, int cap, const char *name)
{
    for (int i = 0; i < *len; i++)
        if (strcmp(t[i].name, name) == 0) {
            t[i].n++;
            return;
        }
    if (*len < cap) {
        snprintf(t[*len].name, sizeof t[*len].name, "%s", name);
        t[(*len)++].n = 1;
    }
}

__attribute__((destructor)) static void stop(void)
{
    static int done;
    if (done++)
        return;
    const char *out = getenv("PROF_OUT");
    if (!out)
        return;
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    unsigned long n = nsamples < MAX_SAMPLES ? nsamples : MAX_SAMPLES;
    enum { CAP = 4096 };
    static struct entry dsos[CAP], syms[CAP];
    int nd = 0, ns = 0;
    for (unsigned long i = 0; i < n; i++) {
        Dl_info d;
        char buf[256];
        if (dladdr((void *)samples[i], &d) && d.dli_fname) {
            const char *base = strrchr(d.dli_fname, '/');
            base = base ? base + 1 : d.dli_fname;
            add(dsos, &nd, CAP, base);
            if (d.dli_sname)
                snprintf(buf, sizeof buf, "%s:%s", base, d.dli_sname);
            else
                snprintf(buf, sizeof buf, "%s+0x%lx", base,
                         (unsigned long)(samples[i] - (uintptr_t)d.dli_fbase) & ~0xfful);
            add(syms, &ns, CAP, buf);
        } else {
            add(dsos, &nd, CAP, "?");
            add(syms, &ns, CAP, "?");
        }
    }
    qsort(dsos, nd, sizeof *dsos, by_count);
    qsort(syms, ns, sizeof *syms, by_count);
    FILE *f = fopen(out, "w");
    if (!f)
        return;
    fprintf(f, "samples %lu\n== by object\n", n);
    for (int i = 0; i < nd && i < 20; i++)
        fprintf(f, "%8lu %5.1f%% %s\n", dsos[i].n, 100.0 * dsos[i].n / n, dsos[i].name);
    fprintf(f, "== by symbol\n");
    for (int i = 0; i < ns && i < 40; i++)
        fprintf(f, "%8lu %5.1f%% %s\n", syms[i].n, 100.0 * syms[i].n / n, syms[i].name);
    fclose(f);
}
