/* Writes the seed corpora of tests/fuzz_rdv.c and tests/fuzz_tcp.c from the
   library's own messages: rendezvous hellos and answers as capex__rdv_put_*
   make them, and the TCP streams that real ranks (threads running
   tests/fuzz_tcp.h's sequence over socketpairs) send each other, recorded by
   a relay in the middle. Usage: fuzz_net_seeds <corpus dir> (writes
   <dir>/fuzz_rdv/ and <dir>/fuzz_tcp/, which must exist). */
#define _POSIX_C_SOURCE 200809L
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "fuzz_tcp.h"
#include <stdlib.h>
#include <pthread.h>
#include <signal.h>

static const char *out_dir;

static void put_file(const char *sub, const char *name, const unsigned char *a, size_t na, const unsigned char *b, size_t nb) {
    char path[512];
    FILE *f;
    snprintf(path, sizeof path, "%s/%s/%s", out_dir, sub, name);
    f = fopen(path, "wb");
    if (!f || fwrite(a, 1, na, f) != na || (nb && fwrite(b, 1, nb, f) != nb) || fclose(f) != 0) {
        fprintf(stderr, "fuzz_net_seeds: cannot write %s\n", path);
        exit(1);
    }
}

/* ---- rendezvous: 2 bytes of harness header, then the message ---------- */
static void rdv_seeds(void) {
    capex_rendezvous_desc d;
    unsigned char m[2 + 32 + 16];
    char name[64];
    int rank, piece;
    capex_rendezvous_desc_init(&d);
    d.world_size = 4;
    d.nonce = capex_rendezvous_nonce("fuzz");
    for (rank = 1; rank < 4; rank++)
        for (piece = 0; piece < 8; piece += 7) { /* whole bytes one by one, and in pieces of 8 */
            m[0] = 0; m[1] = (unsigned char)piece;
            d.rank = rank;
            capex__rdv_put_hello(m + 2, &d, 128);
            snprintf(name, sizeof name, "hello-rank%d-piece%d", rank, piece + 1);
            put_file("fuzz_rdv", name, m, 34, NULL, 0);
        }
    d.nonce = capex_rendezvous_nonce("another run");
    m[1] = 3;
    capex__rdv_put_hello(m + 2, &d, 128);
    put_file("fuzz_rdv", "hello-foreign", m, 34, NULL, 0);
    /* peer side: rank 0's answers; byte 1 is the blob size */
    {
        uint64_t nonce = capex_rendezvous_nonce("fuzz");
        unsigned st;
        int i;
        m[0] = 1; m[1] = 16;
        capex__rdv_put_answer(m + 2, CAPEX__RDV_OK, nonce, 16);
        for (i = 0; i < 16; i++) m[26 + i] = (unsigned char)(i * 37);
        put_file("fuzz_rdv", "answer-ok-blob16", m, 42, NULL, 0);
        m[1] = 0;
        capex__rdv_put_answer(m + 2, CAPEX__RDV_OK, nonce, 0);
        put_file("fuzz_rdv", "answer-ok-empty", m, 26, NULL, 0);
        for (st = CAPEX__RDV_BAD_NONCE; st <= CAPEX__RDV_BUSY; st++) {
            m[1] = 16;
            capex__rdv_put_answer(m + 2, st, nonce, 16);
            snprintf(name, sizeof name, "answer-status%u", st);
            put_file("fuzz_rdv", name, m, 26, NULL, 0);
        }
    }
}

/* ---- TCP: a world of real ranks with a recording relay on every link --- */
typedef struct buf { unsigned char *p; size_t n, cap; } buf;
static void buf_add(buf *b, const unsigned char *p, size_t n) {
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->p = (unsigned char *)realloc(b->p, b->cap);
        if (!b->p) exit(1);
    }
    memcpy(b->p + b->n, p, n);
    b->n += n;
}

typedef struct relay_link { int root_end, peer_end; buf to_root, to_peer; } relay_link;
typedef struct world { int size; relay_link links[3]; int fds[3][3]; capex_result res[3]; } world;

/* Copies bytes both ways on every link until both sides closed, recording them. */
static void *relay(void *arg) {
    world *w = (world *)arg;
    int open_ends = 2 * (w->size - 1);
    while (open_ends > 0) {
        struct pollfd pf[4];
        int n = 0, p, i;
        for (p = 1; p < w->size; p++) {
            pf[n].fd = w->links[p].root_end; pf[n].events = POLLIN; pf[n].revents = 0; n++;
            pf[n].fd = w->links[p].peer_end; pf[n].events = POLLIN; pf[n].revents = 0; n++;
        }
        if (poll(pf, (nfds_t)n, 10000) <= 0) { fprintf(stderr, "fuzz_net_seeds: relay stuck\n"); exit(1); }
        for (i = 0; i < n; i++) {
            relay_link *l = &w->links[1 + i / 2];
            int from_root = (i % 2) == 0, to = from_root ? l->peer_end : l->root_end;
            unsigned char tmp[4096];
            ssize_t k;
            if (pf[i].fd < 0 || !pf[i].revents) continue;
            k = read(pf[i].fd, tmp, sizeof tmp);
            if (k <= 0) {
                shutdown(to, SHUT_WR);
                if (from_root) l->root_end = -1; else l->peer_end = -1;
                open_ends--;
                continue;
            }
            buf_add(from_root ? &l->to_peer : &l->to_root, tmp, (size_t)k);
            if (capex__io_all(to, tmp, (size_t)k, 1, capex_dist_now() + 10.0) != 0) exit(1);
        }
    }
    return NULL;
}

typedef struct rank_arg { world *w; int rank; } rank_arg;
static void *rank_main(void *arg) {
    rank_arg *a = (rank_arg *)arg;
    capex_comm c;
    if (fuzz_tcp_comm(&c, a->rank, a->w->size, a->w->fds[a->rank]) != 0) exit(1);
    a->w->res[a->rank] = fuzz_tcp_sequence(&c);
    capex_comm_destroy(&c);
    return NULL;
}

static void run_world(world *w, int size) {
    pthread_t th[4];
    rank_arg ra[3];
    int p, i;
    memset(w, 0, sizeof *w);
    w->size = size;
    for (p = 0; p < 3; p++) for (i = 0; i < 3; i++) w->fds[p][i] = -1;
    for (p = 1; p < size; p++) {
        int a[2], b[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, a) != 0 || socketpair(AF_UNIX, SOCK_STREAM, 0, b) != 0) exit(1);
        w->fds[0][p] = a[0]; w->links[p].root_end = a[1];
        w->fds[p][0] = b[0]; w->links[p].peer_end = b[1];
    }
    pthread_create(&th[3], NULL, relay, w);
    for (p = 0; p < size; p++) { ra[p].w = w; ra[p].rank = p; pthread_create(&th[p], NULL, rank_main, &ra[p]); }
    for (p = 0; p < size; p++) pthread_join(th[p], NULL);
    pthread_join(th[3], NULL);
    for (p = 0; p < size; p++)
        if (w->res[p] != CAPEX_OK) { fprintf(stderr, "fuzz_net_seeds: rank %d: %s\n", p, capex_last_error()); exit(1); }
}

static void tcp_seeds(void) {
    world w;
    unsigned char h[3];
    int size, i;
    for (size = 2; size <= 3; size++) {
        char name[64];
        run_world(&w, size);
        /* rank 1 under test: what rank 0 sent it */
        h[0] = (unsigned char)(1 | (size == 3 ? 2 : 0)); h[1] = h[2] = 0;
        snprintf(name, sizeof name, "rank1-world%d", size);
        put_file("fuzz_tcp", name, h, 3, w.links[1].to_peer.p, w.links[1].to_peer.n);
        /* rank 0 under test: what the peers sent it, peer 1's stream first */
        h[0] = (unsigned char)(size == 3 ? 2 : 0);
        h[1] = (unsigned char)w.links[1].to_root.n; h[2] = (unsigned char)(w.links[1].to_root.n >> 8);
        snprintf(name, sizeof name, "rank0-world%d", size);
        if (size == 2) put_file("fuzz_tcp", name, h, 3, w.links[1].to_root.p, w.links[1].to_root.n);
        else {
            buf all;
            memset(&all, 0, sizeof all);
            buf_add(&all, w.links[1].to_root.p, w.links[1].to_root.n);
            buf_add(&all, w.links[2].to_root.p, w.links[2].to_root.n);
            put_file("fuzz_tcp", name, h, 3, all.p, all.n);
            free(all.p);
        }
        for (i = 1; i < size; i++) { free(w.links[i].to_root.p); free(w.links[i].to_peer.p); }
    }
}

int main(int argc, char **argv) {
    if (argc != 2) { fprintf(stderr, "usage: fuzz_net_seeds <corpus dir>\n"); return 2; }
    signal(SIGPIPE, SIG_IGN);
    out_dir = argv[1];
    rdv_seeds();
    tcp_seeds();
    return 0;
}
