/* Shared by tests/fuzz_tcp.c and tests/fuzz_net_seeds.c: a TCP comm built on
   given sockets (no rendezvous) and the fixed sequence of collectives the
   fuzzer drives, so the seed generator records exactly the messages the
   harness expects. Include after capex.h with CAPEX_IMPLEMENTATION. */
#ifndef CAPEX_TEST_FUZZ_TCP_H
#define CAPEX_TEST_FUZZ_TCP_H

/* fds[p]: rank 0's socket to peer p (fds[0] unused), or fds[0] on a peer;
   -1 where absent. The comm owns the sockets (destroy closes them). */
static int fuzz_tcp_comm(capex_comm *c, int rank, int world, const int *fds) {
    capex__tcp *t = (capex__tcp *)capex__alloc(NULL, sizeof *t);
    int p;
    memset(c, 0, sizeof *c);
    if (!t) return -1;
    memset(t, 0, sizeof *t);
    t->fds = (int *)capex__alloc(NULL, sizeof(int) * (size_t)world);
    if (!t->fds) { capex__free(NULL, t); return -1; }
    for (p = 0; p < world; p++) t->fds[p] = fds[p];
    c->vt = &capex__tcp_vt;
    c->impl = t;
    c->rank = rank;
    c->world_size = world;
    c->timeout_s = 10.0;
    return 0;
}

/* Every op, dtype path and direction of the TCP backend; stops at the first
   failure as a caller would. */
static capex_result fuzz_tcp_sequence(capex_comm *c) {
    float f[4], g[6];
    uint16_t h[3];
    int64_t q[2];
    double d[2];
    capex_result r;
    int i;
    for (i = 0; i < 4; i++) f[i] = (float)(c->rank + i);
    for (i = 0; i < 3; i++) h[i] = capex_f32_to_bf16((float)(c->rank + i));
    for (i = 0; i < 2; i++) { q[i] = c->rank + i; d[i] = c->rank * 0.5 + i; }
    if ((r = capex_comm_allreduce(c, f, f, 4, CAPEX_F32, CAPEX_REDUCE_SUM)) != CAPEX_OK) return r;
    if ((r = capex_comm_allreduce(c, h, h, 3, CAPEX_BF16, CAPEX_REDUCE_AVG)) != CAPEX_OK) return r;
    if ((r = capex_comm_allreduce(c, h, h, 2, CAPEX_F16, CAPEX_REDUCE_SUM)) != CAPEX_OK) return r;
    if ((r = capex_comm_allreduce(c, q, q, 2, CAPEX_I64, CAPEX_REDUCE_SUM)) != CAPEX_OK) return r;
    if ((r = capex_comm_allreduce(c, d, d, 2, CAPEX_F64, CAPEX_REDUCE_AVG)) != CAPEX_OK) return r;
    if ((r = capex_comm_broadcast(c, f, 3, CAPEX_F32, c->world_size - 1)) != CAPEX_OK) return r;
    if ((r = capex_comm_allgather(c, f, g, 2, CAPEX_F32)) != CAPEX_OK) return r;
    return capex_comm_barrier(c);
}
#endif
