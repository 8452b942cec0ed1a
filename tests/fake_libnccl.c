/* fake_libnccl.c - a stand-in for libnccl.so.2 that runs on the CPU next to
   tests/fake_libcuda.c or the emulator (tests/emu_libcuda.cc), whose "device"
   pointers are host memory. Built as build/fake/libnccl.so.2 by tests/nccl.mk
   and loaded through CAPEX_NCCL_PATH, so capex_cuda.h's NCCL backend (symbol
   loading, init, every collective entry, DDP and ZeRO on device buckets,
   async-error polling, abort) runs in CI without a GPU. It checks dtype and
   op values against NCCL's ABI (bf16 and ncclAvg only from "2.10"), counts
   calls, and plays failures:
     FAKE_NCCL_VERSION=n      what ncclGetVersion reports (default 22809)
     FAKE_NCCL_ASYNC_ERROR=1  collectives do nothing and the comm's async
                              error becomes ncclRemoteError (a dead peer)
     FAKE_NCCL_INIT_FAIL=1    ncclCommInitRank fails (ncclSystemError); a
                              non-blocking init fails later, as its async error
     FAKE_NCCL_TIMEOUT=s      seconds a rank waits for its peers (default 60)
     FAKE_NCCL_WATCH_PEERS=1  ncclCommGetAsyncError reports ncclRemoteError
                              once a peer's process is gone, as NCCL's proxy
                              does when a connection closes (off by default:
                              ranks of the tests exit at different times)
   ncclCommInitRankConfig (NCCL >= 2.14 only: below, a call is counted as
   bad) checks the versioned ncclConfig_t (size, magic, version); with
   blocking = 0 it returns ncclInProgress and ncclCommGetAsyncError says
   ncclInProgress until every rank has joined (ncclRemoteError past
   FAKE_NCCL_TIMEOUT), and each later call on that comm returns
   ncclInProgress too (a group: its ncclGroupEnd); the comm then reads
   ncclInProgress twice more. A call on a comm that has not read
   ncclSuccess since (init, collective, ncclCommDestroy) is ncclInvalidUsage
   and counted as bad, as NCCL refuses it.
   World size 1: every collective is a copy. Several ranks (processes, e.g.
   forked, each with its own comm; or threads): ncclGetUniqueId names a shared
   file (/dev/shm or /tmp) that ncclCommInitRank maps; each collective runs
   when called (kernels of the stand-in drivers are synchronous too) as a
   rendezvous: every rank copies its input into its slot, then reads what it
   needs from all slots, in pieces of FAKE_SLOT bytes. Sums go in rank order
   0, 1, ..., rounding to the dtype after each addition (f16/bf16 via f32), as
   a ring that starts at rank 0 would; AVG divides the sum by nranks in f32
   (f64 for f64). A rank that exits or stalls past the timeout makes its
   peers' collectives fail as NCCL's do: nothing written, async error
   ncclRemoteError. Not NCCL: it only proves the host code. Under the
   emulator's CAPEX_EMU_STREAMS=lazy or ahead (work waits in its stream's queue), a
   collective first runs what was queued before it on its stream
   (cuStreamSynchronize of the loaded emulator), then runs at the call into
   a host buffer, and its result lands in recv through an upload queued on
   the stream (cuMemcpyHtoDAsync_v2): work on another stream that reads recv
   without waiting for the collective reads it stale. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#define FAKE_API __attribute__((visibility("default")))

typedef struct { char internal[128]; } ncclUniqueId;

enum { FAKE_MAX_RANKS = 16, FAKE_SLOT = 1 << 20 };
/* The shared file of a world of several ranks: this header, then one slot of
   FAKE_SLOT bytes per rank. */
typedef struct fake_world {
    int nranks, joined, left;
    int pid[FAKE_MAX_RANKS];
    int arrived, generation; /* the barrier */
    int broken;              /* a rank timed out or died: every later collective fails */
} fake_world;
enum { FAKE_HEADER = 4096 };

typedef struct fake_comm {
    int magic, nranks, rank, async_err;
    int nonblocking, joining, joined_all, pending; /* pending: reads of ncclInProgress left */
    double join_deadline;
    fake_world *w;           /* NULL for world size 1 */
    size_t map_bytes;
} fake_comm;

static int counters[12]; /* 0 allreduce, 1 broadcast, 2 allgather, 3 abort, 4 destroy, 5 init, 6 avg, 7 bad,
                            8 reduce, 9 group depth errors (an End without a Start), 10 non-blocking inits
                            (ncclCommInitRankConfig, blocking = 0), 11 ncclInProgress returned by a call */
static int group_depth;
static struct fake_comm *group_comm; /* a non-blocking comm with work in the open group */
static char last_error[256];

static int version(void) {
    const char *v = getenv("FAKE_NCCL_VERSION");
    return v && v[0] ? atoi(v) : 22809;
}
static int env1(const char *n) { const char *v = getenv(n); return v && v[0] == '1'; }
static double timeout_s(void) {
    const char *v = getenv("FAKE_NCCL_TIMEOUT");
    return v && v[0] ? atof(v) : 60.0;
}
static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
static size_t type_size(int t) {
    switch (t) {
    case 0: case 1: return 1;
    case 2: case 3: return 4;
    case 4: case 5: return 8;
    case 6: return 2;
    case 7: return 4;
    case 8: return 8;
    case 9: return version() >= 21000 ? 2 : 0;
    }
    return 0;
}
static int check_comm(fake_comm *c) {
    if (!c || c->magic != 0x4e43) { counters[7]++; strcpy(last_error, "fake NCCL: invalid communicator"); return 4; }
    return 0;
}

FAKE_API int fake_nccl_counter(int i) { return i >= 0 && i < 12 ? counters[i] : -1; }
/* NCCL refuses a call on a non-blocking comm still in progress. */
static int busy(fake_comm *c) {
    if (!c->joining && !c->pending) return 0;
    counters[7]++;
    strcpy(last_error, "fake NCCL: communicator used before ncclCommGetAsyncError returned ncclSuccess");
    return 1;
}
FAKE_API int ncclGetVersion(int *v) { if (!v) return 4; *v = version(); return 0; }
FAKE_API const char *ncclGetErrorString(int r) {
    static const char *s[] = {"no error", "unhandled cuda error", "unhandled system error", "internal error",
                              "invalid argument", "invalid usage", "remote process exited or there was a network error",
                              "NCCL operation in progress"};
    return r >= 0 && r < 8 ? s[r] : "unknown result code";
}
FAKE_API const char *ncclGetLastError(void *comm) { (void)comm; return last_error; }
/* The id: a fixed pattern (byte 0 nonzero) with the shared file's name from
   byte 8, unique per call, so a world of several ranks knows where to meet. */
FAKE_API int ncclGetUniqueId(ncclUniqueId *id) {
    static int calls;
    struct timespec ts;
    int i;
    if (!id) return 4;
    for (i = 0; i < 128; i++) id->internal[i] = (char)(i * 7 + 1);
    clock_gettime(CLOCK_REALTIME, &ts);
    snprintf(id->internal + 8, 120, "%s/capex-fake-nccl-%ld-%d-%ld", access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp",
             (long)getpid(), ++calls, (long)ts.tv_nsec);
    return 0;
}

static void world_break(fake_comm *c, const char *why) {
    if (c->w) __atomic_store_n(&c->w->broken, 1, __ATOMIC_SEQ_CST);
    c->async_err = 6; /* ncclRemoteError */
    snprintf(last_error, sizeof last_error, "fake NCCL: %s", why);
}
/* 1 when a peer's process is gone or a zombie (forked ranks; threads share
   our pid). */
static int peer_dead(fake_world *w) {
    int r;
    for (r = 0; r < w->nranks; r++) {
        int pid = __atomic_load_n(&w->pid[r], __ATOMIC_SEQ_CST);
        char path[64], buf[256], *p;
        FILE *f;
        if (pid <= 0 || pid == getpid()) continue;
        if (kill(pid, 0) != 0 && errno == ESRCH) return 1;
        snprintf(path, sizeof path, "/proc/%d/stat", pid);
        if (!(f = fopen(path, "r"))) continue;
        p = fgets(buf, sizeof buf, f) ? strrchr(buf, ')') : NULL; /* "pid (comm) S ..." */
        fclose(f);
        if (p && p[1] == ' ' && p[2] == 'Z') return 1;
    }
    return 0;
}
/* Sense-reversing barrier over the shared header; 0 when every rank came. */
static int world_barrier(fake_comm *c) {
    fake_world *w = c->w;
    int gen = __atomic_load_n(&w->generation, __ATOMIC_SEQ_CST);
    double deadline = now_s() + timeout_s(), next_check = 0.0;
    unsigned spins = 0;
    if (__atomic_load_n(&w->broken, __ATOMIC_SEQ_CST)) { world_break(c, "a peer failed earlier"); return 1; }
    if (__atomic_add_fetch(&w->arrived, 1, __ATOMIC_SEQ_CST) == w->nranks) {
        __atomic_store_n(&w->arrived, 0, __ATOMIC_SEQ_CST);
        __atomic_add_fetch(&w->generation, 1, __ATOMIC_SEQ_CST);
        return 0;
    }
    while (__atomic_load_n(&w->generation, __ATOMIC_SEQ_CST) == gen) {
        if (__atomic_load_n(&w->broken, __ATOMIC_SEQ_CST)) { world_break(c, "a peer failed"); return 1; }
        /* by the clock too, not only every 1024 spins: on a loaded machine
           each sched_yield can take tens of ms, and 1024 of them delayed a
           dead peer's report by half a minute */
        if (++spins % 1024 == 0 || (spins > 64 && now_s() >= next_check)) {
            next_check = now_s() + 0.01;
            if (peer_dead(w)) { world_break(c, "a peer process exited"); return 1; }
            if (now_s() > deadline) { world_break(c, "peers did not reach the collective in time"); return 1; }
        }
        if (spins > 64) sched_yield();
    }
    return 0;
}

/* Creates the comm and joins the world; wait: block until every rank joined. */
static int comm_open(void **comm, int nranks, ncclUniqueId id, int rank, int wait) {
    fake_comm *c;
    if (!comm || nranks < 1 || nranks > FAKE_MAX_RANKS || rank < 0 || rank >= nranks || id.internal[0] == 0) {
        strcpy(last_error, "fake NCCL: bad rank, world size (1-16) or id");
        return 4;
    }
    if (wait && env1("FAKE_NCCL_INIT_FAIL")) { strcpy(last_error, "fake NCCL: bootstrap failed"); return 2; }
    c = (fake_comm *)calloc(1, sizeof *c);
    if (!c) return 2;
    c->magic = 0x4e43;
    c->nranks = nranks;
    c->rank = rank;
    c->join_deadline = now_s() + timeout_s();
    if (nranks > 1) {
        char name[121];
        int fd;
        void *m;
        memcpy(name, id.internal + 8, 120);
        name[120] = 0;
        c->map_bytes = FAKE_HEADER + (size_t)nranks * FAKE_SLOT;
        fd = open(name, O_RDWR | O_CREAT, 0600); /* whichever rank comes first creates it, zero-filled */
        if (fd < 0 || ftruncate(fd, (off_t)c->map_bytes) != 0) {
            snprintf(last_error, sizeof last_error, "fake NCCL: cannot create %s", name);
            if (fd >= 0) close(fd);
            free(c);
            return 2;
        }
        m = mmap(NULL, c->map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
        if (m == MAP_FAILED) { strcpy(last_error, "fake NCCL: mmap failed"); free(c); return 2; }
        c->w = (fake_world *)m;
        __atomic_store_n(&c->w->nranks, nranks, __ATOMIC_SEQ_CST);
        __atomic_store_n(&c->w->pid[rank], (int)getpid(), __ATOMIC_SEQ_CST);
        if (__atomic_add_fetch(&c->w->joined, 1, __ATOMIC_SEQ_CST) == nranks) unlink(name); /* all mapped it */
        while (wait && __atomic_load_n(&c->w->joined, __ATOMIC_SEQ_CST) < nranks) { /* NCCL's init blocks for every rank */
            if (now_s() > c->join_deadline) {
                snprintf(last_error, sizeof last_error, "fake NCCL: only %d of %d ranks joined",
                         __atomic_load_n(&c->w->joined, __ATOMIC_SEQ_CST), nranks);
                munmap(m, c->map_bytes);
                free(c);
                return 6;
            }
            sched_yield();
        }
    }
    *comm = c;
    if (wait) counters[5]++;
    return 0;
}
FAKE_API int ncclCommInitRank(void **comm, int nranks, ncclUniqueId id, int rank) { return comm_open(comm, nranks, id, rank, 1); }

/* ncclConfig_t of NCCL 2.14: the fields every later version starts with. */
typedef struct { size_t size; unsigned int magic, version; int blocking; } fake_config;
FAKE_API int ncclCommInitRankConfig(void **comm, int nranks, ncclUniqueId id, int rank, fake_config *cfg) {
    fake_comm *c;
    int r;
    if (version() < 21400) { counters[7]++; strcpy(last_error, "fake NCCL: no ncclCommInitRankConfig before 2.14"); return 5; }
    if (!cfg || cfg->size < sizeof(fake_config) || cfg->magic != 0xcafebeefu || cfg->version < 21400 ||
        (cfg->blocking != 0 && cfg->blocking != 1 && cfg->blocking != INT_MIN)) { /* INT_MIN: NCCL_CONFIG_UNDEF_INT */
        counters[7]++;
        strcpy(last_error, "fake NCCL: ncclConfig_t not made by NCCL_CONFIG_INITIALIZER");
        return 4;
    }
    if (cfg->blocking != 0) return comm_open(comm, nranks, id, rank, 1);
    if ((r = comm_open(comm, nranks, id, rank, 0)) != 0) return r;
    c = (fake_comm *)*comm;
    c->nonblocking = c->joining = 1;
    if (env1("FAKE_NCCL_INIT_FAIL")) { /* fails in NCCL's init thread: the async error says it */
        c->joining = 0;
        c->async_err = 2;
        strcpy(last_error, "fake NCCL: bootstrap failed");
    }
    counters[10]++;
    counters[11]++;
    return 7;
}
FAKE_API int ncclCommGetAsyncError(void *comm, int *err) {
    fake_comm *c = (fake_comm *)comm;
    int r = check_comm(c);
    if (r) return r;
    if (c->joining) { /* non-blocking init: in progress until every rank joined, then two reads more */
        if (!c->joined_all) {
            if (!c->w || __atomic_load_n(&c->w->joined, __ATOMIC_SEQ_CST) >= c->nranks) {
                c->joined_all = 1;
                c->pending = 2;
                counters[5]++;
            } else if (now_s() > c->join_deadline) {
                c->joining = 0;
                c->async_err = 6;
                snprintf(last_error, sizeof last_error, "fake NCCL: only %d of %d ranks joined",
                         __atomic_load_n(&c->w->joined, __ATOMIC_SEQ_CST), c->nranks);
                *err = 6;
                return 0;
            }
        }
        if (!c->joined_all || c->pending) {
            if (c->pending) c->pending--;
            *err = 7;
            return 0;
        }
        c->joining = 0; /* the init's ncclSuccess: peers are watched only after it */
        *err = c->async_err;
        return 0;
    }
    if (c->pending) { c->pending--; *err = 7; return 0; }
    if (c->w && !c->async_err && env1("FAKE_NCCL_WATCH_PEERS") && peer_dead(c->w)) world_break(c, "a peer process exited");
    *err = c->async_err;
    return 0;
}
static int comm_free(fake_comm *c, int counter) {
    if (!c) return 0;
    if (check_comm(c)) return 4;
    c->magic = 0;
    if (c->w) munmap(c->w, c->map_bytes);
    free(c);
    counters[counter]++;
    return 0;
}
FAKE_API int ncclCommAbort(void *comm) {
    fake_comm *c = (fake_comm *)comm;
    if (c && !check_comm(c) && c->w) __atomic_store_n(&c->w->broken, 1, __ATOMIC_SEQ_CST); /* peers stop waiting */
    return comm_free(c, 3);
}
FAKE_API int ncclCommDestroy(void *comm) {
    fake_comm *c = (fake_comm *)comm;
    if (c && !check_comm(c) && busy(c)) return 5;
    return comm_free(c, 4);
}
FAKE_API int ncclGroupStart(void) { group_depth++; return 0; }
FAKE_API int ncclGroupEnd(void) {
    if (group_depth <= 0) { counters[9]++; return 5; } /* ncclInvalidUsage */
    if (--group_depth == 0 && group_comm) { /* a non-blocking comm's group: launched in the background */
        group_comm->pending = 2;
        group_comm = NULL;
        counters[11]++;
        return 7;
    }
    return 0;
}

/* Element conversions for the sums (round to nearest even). */
static float h2f(uint16_t h) {
    int e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? ldexpf((float)m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexpf((float)(m | 1024), e - 25);
    return h & 0x8000 ? -v : v;
}
static uint16_t f2h(float f) {
    uint32_t x, sign, mant;
    int e;
    memcpy(&x, &f, 4);
    sign = (x >> 16) & 0x8000;
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)(sign | 0x7e00);
    e = (int)((x >> 23) & 255) - 127;
    if (e > 15) return (uint16_t)(sign | 0x7c00);
    if (e < -25) return (uint16_t)sign;
    mant = (x & 0x7fffff) | 0x800000;
    {
        int shift = e < -14 ? 13 + (-14 - e) : 13; /* subnormal halves drop more bits */
        uint32_t q = mant >> shift, rem = mant & ((1u << shift) - 1), half = 1u << (shift - 1);
        uint32_t r;
        if (rem > half || (rem == half && (q & 1))) q++;
        r = e < -14 ? q : (((uint32_t)(e + 15) << 10) + (q - 1024));
        if (e >= -14 && q == 2048) r = ((uint32_t)(e + 16) << 10);
        return (uint16_t)(sign | (r > 0x7c00 ? 0x7c00 : r));
    }
}
static float b2f(uint16_t b) { uint32_t x = (uint32_t)b << 16; float f; memcpy(&f, &x, 4); return f; }
static uint16_t f2b(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffff) > 0x7f800000) return (uint16_t)((x >> 16) | 0x40);
    return (uint16_t)((x + 0x7fff + ((x >> 16) & 1)) >> 16);
}
/* acc[i] += v[i] in dtype dt, rounded to it (halves through f32). */
static void add_elem(void *acc, const void *v, size_t i, int dt) {
    switch (dt) {
    case 0: ((int8_t *)acc)[i] = (int8_t)(((int8_t *)acc)[i] + ((const int8_t *)v)[i]); break;
    case 1: ((uint8_t *)acc)[i] = (uint8_t)(((uint8_t *)acc)[i] + ((const uint8_t *)v)[i]); break;
    case 2: ((int32_t *)acc)[i] = (int32_t)((uint32_t)((int32_t *)acc)[i] + (uint32_t)((const int32_t *)v)[i]); break;
    case 3: ((uint32_t *)acc)[i] += ((const uint32_t *)v)[i]; break;
    case 4: ((int64_t *)acc)[i] = (int64_t)((uint64_t)((int64_t *)acc)[i] + (uint64_t)((const int64_t *)v)[i]); break;
    case 5: ((uint64_t *)acc)[i] += ((const uint64_t *)v)[i]; break;
    case 6: ((uint16_t *)acc)[i] = f2h(h2f(((uint16_t *)acc)[i]) + h2f(((const uint16_t *)v)[i])); break;
    case 7: ((float *)acc)[i] += ((const float *)v)[i]; break;
    case 8: ((double *)acc)[i] += ((const double *)v)[i]; break;
    case 9: ((uint16_t *)acc)[i] = f2b(b2f(((uint16_t *)acc)[i]) + b2f(((const uint16_t *)v)[i])); break;
    }
}
static void div_elem(void *acc, size_t i, int dt, int n) {
    switch (dt) {
    case 0: ((int8_t *)acc)[i] = (int8_t)(((int8_t *)acc)[i] / n); break;
    case 1: ((uint8_t *)acc)[i] = (uint8_t)(((uint8_t *)acc)[i] / n); break;
    case 2: ((int32_t *)acc)[i] /= n; break;
    case 3: ((uint32_t *)acc)[i] /= (uint32_t)n; break;
    case 4: ((int64_t *)acc)[i] /= n; break;
    case 5: ((uint64_t *)acc)[i] /= (uint64_t)n; break;
    case 6: ((uint16_t *)acc)[i] = f2h(h2f(((uint16_t *)acc)[i]) / (float)n); break;
    case 7: ((float *)acc)[i] /= (float)n; break;
    case 8: ((double *)acc)[i] /= (double)n; break;
    case 9: ((uint16_t *)acc)[i] = f2b(b2f(((uint16_t *)acc)[i]) / (float)n); break;
    }
}

static int (*emu_stream_sync_fn)(void *);
static int (*emu_upload_fn)(unsigned long long, const void *, size_t, void *);
static void emu_stream_sync_find(void) {
    const char *lib = getenv("CAPEX_LIBCUDA_PATH");
    void *h = lib && lib[0] ? dlopen(lib, RTLD_NOW | RTLD_NOLOAD) : NULL, *f = h ? dlsym(h, "cuStreamSynchronize") : NULL;
    void *u = h ? dlsym(h, "cuMemcpyHtoDAsync_v2") : NULL;
    memcpy(&emu_stream_sync_fn, &f, sizeof f); /* no object-to-function pointer cast */
    memcpy(&emu_upload_fn, &u, sizeof u);
}
/* The work queued before a collective on its stream (lazy emulator streams);
   1 when the result is to be queued there too (emu_upload_fn). */
static int emu_stream_sync(void *stream) {
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    const char *e = getenv("CAPEX_EMU_STREAMS");
    if (!stream || !e || (strcmp(e, "lazy") && strcmp(e, "ahead"))) return 0;
    pthread_once(&once, emu_stream_sync_find);
    if (emu_stream_sync_fn) emu_stream_sync_fn(stream);
    return emu_stream_sync_fn && emu_upload_fn;
}
enum { K_ALLREDUCE, K_BROADCAST, K_ALLGATHER, K_REDUCE };
/* One collective of a world of several ranks, piece by piece through the
   slots. count: elements of send (allgather: per rank). */
static int world_collective(fake_comm *c, const void *send, void *recv, size_t count, int dt, int op, int root,
                            int kind) {
    fake_world *w = c->w;
    size_t es = type_size(dt), per = FAKE_SLOT / es, o, i;
    char *slot0 = (char *)w + FAKE_HEADER;
    int r;
    for (o = 0; o < count || (o == 0 && count == 0); o += per) {
        size_t n = count - o < per ? count - o : per;
        char *mine = slot0 + (size_t)c->rank * FAKE_SLOT;
        if (n) memcpy(mine, (const char *)send + o * es, n * es);
        if (world_barrier(c)) return 0; /* the async error says it */
        switch (kind) {
        case K_ALLGATHER:
            for (r = 0; r < c->nranks; r++)
                if (n) memcpy((char *)recv + ((size_t)r * count + o) * es, slot0 + (size_t)r * FAKE_SLOT, n * es);
            break;
        case K_BROADCAST:
            if (n) memcpy((char *)recv + o * es, slot0 + (size_t)root * FAKE_SLOT, n * es);
            break;
        case K_ALLREDUCE:
        case K_REDUCE:
            if (kind == K_REDUCE && c->rank != root) break;
            if (!n) break;
            {
                char *acc = (char *)recv + o * es;
                memmove(acc, slot0, n * es);
                for (r = 1; r < c->nranks; r++)
                    for (i = 0; i < n; i++) add_elem(acc, slot0 + (size_t)r * FAKE_SLOT, i, dt);
                if (op == 4)
                    for (i = 0; i < n; i++) div_elem(acc, i, dt, c->nranks);
            }
            break;
        }
        if (world_barrier(c)) return 0; /* nobody refills a slot still being read */
        if (count == 0) break;
    }
    return 0;
}

static int collective_run(fake_comm *c, const void *send, void *recv, size_t count, int dt, int op, int root, int kind,
                          int which, void *stream) {
    int r = check_comm(c), lazy = emu_stream_sync(stream);
    size_t es = type_size(dt), bytes;
    void *tmp;
    if (r) return r;
    if (!es) { counters[7]++; strcpy(last_error, "fake NCCL: invalid datatype"); return 4; }
    if (count && (!send || (!recv && !(kind == K_REDUCE && c->rank != root)))) { counters[7]++; return 4; }
    if (root < 0 || root >= c->nranks) { counters[7]++; strcpy(last_error, "fake NCCL: invalid root"); return 4; }
    counters[which]++;
    if (env1("FAKE_NCCL_ASYNC_ERROR")) { c->async_err = 6; return 0; }
    if (c->async_err) return 0; /* a failed world does nothing more */
    bytes = kind == K_REDUCE && c->rank != root ? 0 : count * es * (kind == K_ALLGATHER ? (size_t)c->nranks : 1u);
    if (lazy && bytes) { /* lazy emulator streams: the result lands when the stream runs that far (an upload queued there) */
        if (!(tmp = malloc(bytes))) { strcpy(last_error, "fake NCCL: out of host memory"); return 2; }
        memcpy(tmp, recv, bytes); /* in place, world of one: unchanged */
        if (c->w) world_collective(c, send, tmp, count, dt, op, root, kind);
        else if (send != recv) memmove(tmp, send, count * es);
        if (!c->async_err) emu_upload_fn((unsigned long long)(uintptr_t)recv, tmp, bytes, stream); /* copies tmp at the call */
        free(tmp);
        return 0;
    }
    if (c->w) return world_collective(c, send, recv, count, dt, op, root, kind);
    if (count && send != recv) memmove(recv, send, count * es); /* world of one: a copy */
    return 0;
}
/* The call; on a non-blocking comm it "goes on in the background": its
   result is ncclInProgress (in a group: the group's end). */
static int collective(fake_comm *c, const void *send, void *recv, size_t count, int dt, int op, int root, int kind,
                      int which, void *stream) {
    int r = check_comm(c);
    if (r) return r;
    if (busy(c)) return 5;
    if ((r = collective_run(c, send, recv, count, dt, op, root, kind, which, stream)) != 0 || !c->nonblocking) return r;
    if (c->async_err) return 0; /* failed "on the GPU": the launch itself went through */
    if (group_depth > 0) { group_comm = c; return 0; }
    c->pending = 2;
    counters[11]++;
    return 7;
}
static int check_op(int op) {
    if (op != 0 && !(op == 4 && version() >= 21000)) { counters[7]++; strcpy(last_error, "fake NCCL: invalid op"); return 4; }
    if (op == 4) counters[6]++;
    return 0;
}
FAKE_API int ncclAllReduce(const void *send, void *recv, size_t count, int dt, int op, void *comm, void *stream) {
    return check_op(op) ? 4 : collective((fake_comm *)comm, send, recv, count, dt, op, 0, K_ALLREDUCE, 0, stream);
}
FAKE_API int ncclBroadcast(const void *send, void *recv, size_t count, int dt, int root, void *comm, void *stream) {
    return collective((fake_comm *)comm, send, recv, count, dt, 0, root, K_BROADCAST, 1, stream);
}
FAKE_API int ncclAllGather(const void *send, void *recv, size_t count, int dt, void *comm, void *stream) {
    fake_comm *c = (fake_comm *)comm;
    size_t b = count * type_size(dt);
    /* NCCL: in place only when send is this rank's slot of recv; any other overlap is undefined (refused here) */
    if (b && !check_comm(c) && send && recv && (const char *)send != (const char *)recv + (size_t)c->rank * b &&
        (const char *)send < (const char *)recv + b * (size_t)c->nranks && (const char *)send + b > (const char *)recv) {
        counters[7]++;
        strcpy(last_error, "fake NCCL: allgather sendbuff overlaps recvbuff outside this rank's slot");
        return 4;
    }
    return collective(c, send, recv, count, dt, 0, 0, K_ALLGATHER, 2, stream);
}
FAKE_API int ncclReduce(const void *send, void *recv, size_t count, int dt, int op, int root, void *comm, void *stream) {
    return check_op(op) ? 4 : collective((fake_comm *)comm, send, recv, count, dt, op, root, K_REDUCE, 8, stream);
}
