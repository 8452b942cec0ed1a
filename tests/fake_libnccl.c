/* fake_libnccl.c - a stand-in for libnccl.so.2 (world size 1) that runs on the
   CPU next to tests/fake_libcuda.c, whose "device" pointers are host memory.
   Built as build/fake/libnccl.so.2 by tests/nccl.mk and loaded through
   CAPEX_NCCL_PATH by tests/test_nccl.c, so capex_cuda.h's NCCL backend (symbol
   loading, init, every collective entry, DDP on device buckets, async-error
   polling, abort) runs in CI without a GPU. It checks dtype and op values
   against NCCL's ABI (bf16 and ncclAvg only from "2.10"), counts calls, and
   plays failures:
     FAKE_NCCL_VERSION=n      what ncclGetVersion reports (default 22809)
     FAKE_NCCL_ASYNC_ERROR=1  collectives do nothing and the comm's async
                              error becomes ncclRemoteError (a dead peer)
     FAKE_NCCL_INIT_FAIL=1    ncclCommInitRank fails (ncclSystemError)
   Not NCCL: it only proves the host code. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#define FAKE_API __attribute__((visibility("default")))

typedef struct { char internal[128]; } ncclUniqueId;
typedef struct fake_comm { int magic, nranks, rank, async_err; } fake_comm;

static int counters[10]; /* 0 allreduce, 1 broadcast, 2 allgather, 3 abort, 4 destroy, 5 init, 6 avg, 7 bad,
                            8 reduce, 9 group depth errors (an End without a Start) */
static int group_depth;
static char last_error[256];

static int version(void) {
    const char *v = getenv("FAKE_NCCL_VERSION");
    return v && v[0] ? atoi(v) : 22809;
}
static int env1(const char *n) { const char *v = getenv(n); return v && v[0] == '1'; }
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

FAKE_API int fake_nccl_counter(int i) { return i >= 0 && i < 10 ? counters[i] : -1; }
FAKE_API int ncclGetVersion(int *v) { if (!v) return 4; *v = version(); return 0; }
FAKE_API const char *ncclGetErrorString(int r) {
    static const char *s[] = {"no error", "unhandled cuda error", "unhandled system error", "internal error",
                              "invalid argument", "invalid usage", "remote process exited or there was a network error",
                              "NCCL operation in progress"};
    return r >= 0 && r < 8 ? s[r] : "unknown result code";
}
FAKE_API const char *ncclGetLastError(void *comm) { (void)comm; return last_error; }
FAKE_API int ncclGetUniqueId(ncclUniqueId *id) {
    int i;
    if (!id) return 4;
    for (i = 0; i < 128; i++) id->internal[i] = (char)(i * 7 + 1);
    return 0;
}
FAKE_API int ncclCommInitRank(void **comm, int nranks, ncclUniqueId id, int rank) {
    fake_comm *c;
    if (!comm || nranks != 1 || rank != 0 || id.internal[0] == 0) { strcpy(last_error, "fake NCCL: world size 1 only"); return 4; }
    if (env1("FAKE_NCCL_INIT_FAIL")) { strcpy(last_error, "fake NCCL: bootstrap failed"); return 2; }
    c = (fake_comm *)calloc(1, sizeof *c);
    c->magic = 0x4e43;
    c->nranks = nranks;
    c->rank = rank;
    *comm = c;
    counters[5]++;
    return 0;
}
FAKE_API int ncclCommGetAsyncError(void *comm, int *err) {
    fake_comm *c = (fake_comm *)comm;
    int r = check_comm(c);
    if (r) return r;
    *err = c->async_err;
    return 0;
}
FAKE_API int ncclCommAbort(void *comm) {
    fake_comm *c = (fake_comm *)comm;
    if (!c) return 0;
    if (check_comm(c)) return 4;
    c->magic = 0;
    free(c);
    counters[3]++;
    return 0;
}
FAKE_API int ncclCommDestroy(void *comm) {
    fake_comm *c = (fake_comm *)comm;
    if (!c) return 0;
    if (check_comm(c)) return 4;
    c->magic = 0;
    free(c);
    counters[4]++;
    return 0;
}
FAKE_API int ncclGroupStart(void) { group_depth++; return 0; }
FAKE_API int ncclGroupEnd(void) {
    if (group_depth <= 0) { counters[9]++; return 5; } /* ncclInvalidUsage */
    group_depth--;
    return 0;
}

/* World of one: every collective is a copy (or nothing, in place). */
static int collective(fake_comm *c, const void *send, void *recv, size_t count, int dt, int which) {
    int r = check_comm(c);
    size_t es = type_size(dt);
    if (r) return r;
    if (!es) { counters[7]++; strcpy(last_error, "fake NCCL: invalid datatype"); return 4; }
    if (count && (!send || !recv)) { counters[7]++; return 4; }
    counters[which]++;
    if (env1("FAKE_NCCL_ASYNC_ERROR")) { c->async_err = 6; return 0; }
    if (count && send != recv) memmove(recv, send, count * es);
    return 0;
}
FAKE_API int ncclAllReduce(const void *send, void *recv, size_t count, int dt, int op, void *comm, void *stream) {
    (void)stream;
    if (op != 0 && !(op == 4 && version() >= 21000)) { counters[7]++; strcpy(last_error, "fake NCCL: invalid op"); return 4; }
    if (op == 4) counters[6]++;
    return collective((fake_comm *)comm, send, recv, count, dt, 0);
}
FAKE_API int ncclBroadcast(const void *send, void *recv, size_t count, int dt, int root, void *comm, void *stream) {
    (void)stream;
    if (root != 0) { counters[7]++; return 4; }
    return collective((fake_comm *)comm, send, recv, count, dt, 1);
}
FAKE_API int ncclAllGather(const void *send, void *recv, size_t count, int dt, void *comm, void *stream) {
    (void)stream;
    return collective((fake_comm *)comm, send, recv, count, dt, 2);
}
FAKE_API int ncclReduce(const void *send, void *recv, size_t count, int dt, int op, int root, void *comm, void *stream) {
    (void)stream;
    if (root != 0) { counters[7]++; return 4; }
    if (op != 0 && !(op == 4 && version() >= 21000)) { counters[7]++; strcpy(last_error, "fake NCCL: invalid op"); return 4; }
    if (op == 4) counters[6]++;
    return collective((fake_comm *)comm, send, recv, count, dt, 8);
}
