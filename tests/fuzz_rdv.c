/* libFuzzer target for the TCP rendezvous messages in both directions.
   Byte 0 bit 0 picks the side:
   0: rank 0 reads a hello (world 4, nonce of "fuzz", 128-byte blob) through
      capex__rdv_conn_read from a socketpair that gets the rest of the input
      in pieces of (byte 1 % 8 + 1) bytes, then EOF. Its verdict must match
      capex__rdv_parse_hello on the whole message, refuse on the first byte
      no hello begins with, and accept only ranks 1..3 of world 4.
   1: a peer (rank 1 of 2, blob of byte 1 bytes) runs capex__rdv_peer_exchange
      against a socket holding the rest of the input as rank 0's answer and
      blob, then EOF: CAPEX_OK only with a valid answer and the whole blob
      (which must be the input's bytes), a busy answer asks to reconnect,
      anything else is CAPEX_ERR_COMM; the hello it sent must satisfy rank
      0's parser.
   Seeds: tests/corpus/fuzz_rdv (tests/fuzz_net_seeds.c).
   Build: clang -g -O1 -fsanitize=fuzzer,address,undefined tests/fuzz_rdv.c */
#define _POSIX_C_SOURCE 200809L
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include <stdlib.h>
#include <signal.h>

static int verbose; /* FUZZ_VERBOSE=1: print each input's verdict (to check seeds) */

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc; (void)argv;
    signal(SIGPIPE, SIG_IGN);
    verbose = getenv("FUZZ_VERBOSE") != NULL;
    return 0;
}

static void root_side(const uint8_t *data, size_t size, size_t piece) {
    capex_rendezvous_desc d;
    capex__rdv_conn pc;
    uint32_t rk = 0, wd = 0, rk2 = 0, wd2 = 0;
    size_t off = 0, n = size < 32 ? size : 32;
    int sv[2], st = -1, want, i;
    capex_rendezvous_desc_init(&d);
    d.world_size = 4;
    d.nonce = capex_rendezvous_nonce("fuzz");
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) abort();
    capex__set_nonblock(sv[0]);
    memset(&pc, 0, sizeof pc);
    pc.fd = sv[0];
    while (st == -1 && off < size) {
        size_t k = size - off < piece ? size - off : piece;
        if (capex__io_all(sv[1], (void *)(uintptr_t)(data + off), k, 1, capex_dist_now() + 5.0) != 0) abort();
        off += k;
        st = capex__rdv_conn_read(&pc, &d, 128, &rk, &wd);
    }
    if (st == -1) { shutdown(sv[1], SHUT_WR); st = capex__rdv_conn_read(&pc, &d, 128, &rk, &wd); }
    want = capex__rdv_parse_hello(data, n, d.nonce, d.world_size, 128, &rk2, &wd2);
    if (pc.have > 32) abort();
    if (want == -1) want = -2; /* EOF before a whole hello */
    if (verbose) fprintf(stderr, "rank 0 read a hello: verdict %d\n", st);
    if (st != want) abort();
    if (st == CAPEX__RDV_OK && (rk < 1 || rk > 3 || wd != 4 || rk != rk2 || memcmp(data, "CPXR", 4) != 0 ||
                                capex__get32(data + 4) != CAPEX__RDV_VERSION ||
                                capex__get64(data + 16) != d.nonce || capex__get64(data + 24) != 128))
        abort();
    /* garbage goes at its first wrong byte: no verdict waits for bytes past it */
    for (i = 0; i < 8 && (size_t)i < size; i++)
        if (capex__rdv_parse_hello(data, (size_t)i + 1, d.nonce, 4, 128, &rk2, &wd2) == CAPEX__RDV_BAD_PROTO) {
            if (st != CAPEX__RDV_BAD_PROTO || pc.have > (size_t)i + piece) abort();
            break;
        }
    close(sv[0]);
    close(sv[1]);
}

static void peer_side(const uint8_t *data, size_t size, size_t blob_size) {
    capex_rendezvous_desc d;
    unsigned char *blob = (unsigned char *)malloc(blob_size ? blob_size : 1), hello[32];
    uint32_t rk = 0, wd = 0;
    int sv[2], again = 0;
    capex_result r;
    if (!blob) return;
    capex_rendezvous_desc_init(&d);
    d.rank = 1;
    d.world_size = 2;
    d.nonce = capex_rendezvous_nonce("fuzz");
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) abort();
    capex__set_nonblock(sv[0]);
    if (size && capex__io_all(sv[1], (void *)(uintptr_t)data, size, 1, capex_dist_now() + 5.0) != 0) abort();
    shutdown(sv[1], SHUT_WR);
    r = capex__rdv_peer_exchange(&d, sv[0], blob, blob_size, capex_dist_now() + 10.0, &again);
    if (verbose) fprintf(stderr, "peer: %s%s\n", capex_result_string(r), again == 1 ? " (busy: reconnect)" : "");
    if (again == 2 || r == CAPEX_ERR_TIMEOUT) abort(); /* all bytes were there: nothing to wait for */
    if (again == 1 && (size < 24 || capex__get32(data + 4) != CAPEX__RDV_BUSY)) abort();
    if (r == CAPEX_OK) {
        if (size < 24 + blob_size || capex__get32(data + 4) != CAPEX__RDV_OK ||
            capex__get64(data + 8) != d.nonce || capex__get64(data + 16) != blob_size ||
            (blob_size && memcmp(blob, data + 24, blob_size) != 0))
            abort();
    } else if (r != CAPEX_ERR_COMM) {
        abort();
    }
    if (capex__io_all(sv[1], hello, 32, 0, capex_dist_now() + 5.0) != 0 ||
        capex__rdv_parse_hello(hello, 32, d.nonce, 2, blob_size, &rk, &wd) != CAPEX__RDV_OK || rk != 1)
        abort();
    close(sv[0]);
    close(sv[1]);
    free(blob);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2 || size > 65536) return 0;
    if (data[0] & 1) peer_side(data + 2, size - 2, data[1]);
    else root_side(data + 2, size - 2, (size_t)(data[1] % 8) + 1);
    return 0;
}
