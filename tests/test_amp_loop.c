/* test_amp_loop.c - the pieces of a mixed-precision data-parallel training
   loop together (tests/amp_loop.h): loss scaler with hysteresis, clipping,
   AdamW with masters, lr schedule, DDP and ZeRO 1/2, checkpoints; on a
   single comm and TCP worlds of 2 and 3 (forked). */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include "capex_test.h"
#include "fork_world.h"
#include "amp_loop.h"
#include <unistd.h>

static char g_path[256], g_keep[300];

static int tcp_body(int rank, int world, int port, int mode) {
    capex_dist_env env;
    capex_comm c;
    char why[600] = "";
    int line;
    memset(&env, 0, sizeof env);
    env.rank = rank; env.world_size = world; env.local_rank = rank; env.local_world_size = world;
    strcpy(env.master_addr, "127.0.0.1");
    env.master_port = port;
    strcpy(env.run_id, "amp-loop-test");
    if (capex_comm_init_tcp(&c, &env, CT_HANG_GUARD_S) != CAPEX_OK) { fprintf(stderr, "rank %d: %s\n", rank, capex_last_error()); return __LINE__; }
    c.timeout_s = CT_HANG_GUARD_S; /* a hang guard: every check expects success */
    /* mode 1: keep ZeRO 2's checkpoint; 2: resume it (another world size) */
    line = al_check_all(&c, g_path, mode == 1 ? g_keep : NULL, why, sizeof why);
    if (!line && mode == 2) line = al_check_resume_from(&c, g_keep, why, sizeof why);
    if (line) fprintf(stderr, "rank %d of %d: amp_loop.h:%d: %s\n", rank, world, line, why);
    capex_comm_destroy(&c);
    return line;
}

CT_TEST(single_comm) {
    capex_comm c;
    char why[600] = "";
    int line;
    CT_CHECK(capex_comm_init_single(&c) == CAPEX_OK, "single");
    line = al_check_all(&c, g_path, NULL, why, sizeof why);
    capex_comm_destroy(&c);
    CT_CHECK(line == 0, "amp_loop.h:%d: %s", line, why);
}

/* world 3 saves ZeRO 2's checkpoint, world 2 and a single comm resume it */
CT_TEST(tcp_worlds) {
    int world;
    capex_comm c;
    char why[600] = "";
    int line;
    for (world = 3; world >= 2; world--) {
        int codes[8] = {0}, r, i;
        r = fork_world(world, world == 3 ? 1 : 2, codes, tcp_body);
        CT_CHECK(r == 0, "world %d: rank 0 failed at amp_loop.h:%d (see stderr)", world, r);
        for (i = 1; i < world; i++) CT_CHECK(codes[i] == 0, "world %d: rank %d exit %d", world, i, codes[i]);
    }
    CT_CHECK(capex_comm_init_single(&c) == CAPEX_OK, "single");
    line = al_check_resume_from(&c, g_keep, why, sizeof why);
    capex_comm_destroy(&c);
    remove(g_keep);
    CT_CHECK(line == 0, "single comm resuming world 3's checkpoint: amp_loop.h:%d: %s", line, why);
}

static const ct_case cases[] = {CT_CASE(single_comm), CT_CASE(tcp_worlds)};
int main(int argc, char **argv) {
    snprintf(g_path, sizeof g_path, "/tmp/capex_amp_loop_%d", (int)getpid());
    snprintf(g_keep, sizeof g_keep, "%.250s.w3", g_path);
    return ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
}
