/* Data parallel, single process: launcher-environment tables, the sampler
   against a literal transcription of torch's DistributedSampler.__iter__,
   bucket layouts against an independent transcription of PyTorch's
   compute_bucket_assignment_by_size, the grad_ready tracker through a fake
   comm backend that records launches, and the TCP rendezvous on loopback
   with forked ranks. The multi-rank MPI tests are tests/mpi/ (run by
   tests/test_dist_mpirun.c). */
#define _POSIX_C_SOURCE 200809L
#define CAPEX_IMPLEMENTATION
/* Rank 0's rendezvous loop, observed through capex.h's private hooks instead
   of a clock: the hello budget it gives an unidentified connection (a test
   sets it past the hang guard, so that a join cannot have waited for one to
   run out) and a count of its polls (rank 0 in a forked child). */
static double g_rdv_hello_budget_s = 2.0;
static long g_rdv_polls;
#define CAPEX__RDV_HELLO_BUDGET_S g_rdv_hello_budget_s
#define CAPEX__RDV_ON_POLL() ((void)g_rdv_polls++)
#include "fail_alloc.h" /* before capex.h: one chosen allocation can fail */
#include "../capex.h"
#include "capex_test.h"
#include "fork_world.h"
#include "dist_shards.h"
#include <unistd.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <signal.h>

/* ---------------------------------------------------------------- env -- */

typedef struct kv { const char *k, *v; } kv;
static const char *table_getenv(const char *name, void *user) {
    const kv *t = (const kv *)user;
    for (; t && t->k; t++) if (strcmp(t->k, name) == 0) return t->v;
    return NULL;
}
static capex_result read_env(const kv *t, capex_dist_env *e) {
    capex_dist_env_desc d;
    capex_dist_env_desc_init(&d);
    d.getenv_fn = table_getenv;
    d.getenv_user = (void *)t;
    return capex_dist_env_read(&d, e);
}

CT_TEST(env_none_is_single_process) {
    kv t[] = {{NULL, NULL}};
    capex_dist_env e;
    CT_CHECK(read_env(t, &e) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(e.launcher == CAPEX_LAUNCHER_NONE && e.rank == 0 && e.world_size == 1, "got %d/%d", e.rank, e.world_size);
    CT_CHECK(e.local_rank == 0 && e.local_world_size == 1 && e.node_rank == 0, "local");
    CT_CHECK(e.master_addr[0] == 0 && e.master_port == 0 && e.run_id[0] == 0, "defaults");
}

CT_TEST(env_torchrun) {
    kv t[] = {{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
              {"MASTER_ADDR", "node7"}, {"MASTER_PORT", "29500"}, {"TORCHELASTIC_RUN_ID", "job42"},
              {"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "1"}, {"SLURM_PROCID", "0"}, {NULL, NULL}};
    capex_dist_env e;
    CT_CHECK(read_env(t, &e) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(e.launcher == CAPEX_LAUNCHER_TORCHRUN, "torchrun wins over Open MPI and Slurm: %s", capex_launcher_name(e.launcher));
    CT_CHECK(e.rank == 3 && e.world_size == 8 && e.local_rank == 1 && e.local_world_size == 2 && e.node_rank == 1, "ranks");
    CT_CHECK(strcmp(e.master_addr, "node7") == 0 && e.master_port == 29500, "master");
    CT_CHECK(strcmp(e.run_id, "job42") == 0, "run id %s", e.run_id);
}

CT_TEST(env_rendezvous_port_beside_torchrun_store) {
    kv plain[] = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}, {NULL, NULL}};
    kv agent[] = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"},
                  {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {NULL, NULL}};
    kv over[] = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"},
                 {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"CAPEX_PORT", "31000"}, {NULL, NULL}};
    kv edge[] = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "65535"},
                 {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {NULL, NULL}};
    kv bad[] = {{"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"}, {"CAPEX_PORT", "0"}, {NULL, NULL}};
    kv mpi[] = {{"OMPI_COMM_WORLD_RANK", "0"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29500"},
                {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {NULL, NULL}};
    capex_dist_env e;
    CT_CHECK(read_env(plain, &e) == CAPEX_OK && e.rdv_port == 29500, "plain torchrun-style env: %d", e.rdv_port);
    CT_CHECK(read_env(agent, &e) == CAPEX_OK && e.rdv_port == 29501 && e.master_port == 29500,
             "torchrun's agent store holds MASTER_PORT: capex uses the next one (%d)", e.rdv_port);
    CT_CHECK(read_env(over, &e) == CAPEX_OK && e.rdv_port == 31000, "CAPEX_PORT wins: %d", e.rdv_port);
    CT_CHECK(read_env(edge, &e) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "CAPEX_PORT"), "65535: %.200s", capex_last_error());
    CT_CHECK(read_env(bad, &e) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "CAPEX_PORT"), "CAPEX_PORT=0 refused");
    CT_CHECK(read_env(mpi, &e) == CAPEX_OK && e.rdv_port == 29500, "the agent rule is torchrun's only: %d", e.rdv_port);
}

CT_TEST(env_openmpi_pmi_slurm) {
    kv o[] = {{"OMPI_COMM_WORLD_RANK", "5"}, {"OMPI_COMM_WORLD_SIZE", "6"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
              {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "3"}, {NULL, NULL}};
    kv p[] = {{"PMI_RANK", "2"}, {"PMI_SIZE", "4"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "2"}, {NULL, NULL}};
    kv s[] = {{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "7"}, {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "2"},
              {"SLURM_TASKS_PER_NODE", "3,2(x2)"}, {"SLURM_NTASKS_PER_NODE", "3,2(x2)"}, {"SLURM_JOB_ID", "991"},
              {"SLURM_STEP_ID", "4"}, {NULL, NULL}};
    kv s2[] = {{"SLURM_PROCID", "3"}, {"SLURM_NPROCS", "4"}, {"SLURM_NTASKS_PER_NODE", "2"}, {NULL, NULL}};
    kv cyc[] = {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {NULL, NULL}};
    kv het[] = {{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "2"},
                {"SLURM_TASKS_PER_NODE", "2(x2),4"}, {NULL, NULL}};
    capex_dist_env e;
    CT_CHECK(read_env(o, &e) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(e.launcher == CAPEX_LAUNCHER_OPENMPI && e.rank == 5 && e.world_size == 6 && e.local_rank == 1 &&
             e.local_world_size == 2 && e.node_rank == 2, "ompi %d %d", e.rank, e.world_size);
    CT_CHECK(read_env(p, &e) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(e.launcher == CAPEX_LAUNCHER_PMI && e.rank == 2 && e.world_size == 4 && e.local_rank == 0 &&
             e.local_world_size == 2, "pmi");
    CT_CHECK(read_env(s, &e) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(e.launcher == CAPEX_LAUNCHER_SLURM && e.rank == 5 && e.world_size == 7 && e.local_rank == 1 &&
             e.local_world_size == 2 && e.node_rank == -1, "slurm local world %d", e.local_world_size);
    CT_CHECK(strcmp(e.run_id, "slurm-991.4") == 0, "slurm run id %s", e.run_id);
    /* node_rank only for uniform block placement: mpirun --map-by node puts
       ranks 0,2 on node 0 and 1,3 on node 1; Slurm "2(x2),4" is 2,2,4 */
    CT_CHECK(read_env(cyc, &e) == CAPEX_OK && e.local_rank == 0 && e.local_world_size == 2 && e.node_rank == -1,
             "cyclic placement: node_rank %d", e.node_rank);
    CT_CHECK(read_env(het, &e) == CAPEX_OK && e.local_world_size == 4 && e.node_rank == -1,
             "uneven Slurm nodes: node_rank %d (rank 4 is on node 2)", e.node_rank);
    CT_CHECK(read_env(s2, &e) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(e.rank == 3 && e.world_size == 4 && e.local_world_size == 2 && e.local_rank == 1 && e.node_rank == 1,
             "SLURM_NPROCS / NTASKS_PER_NODE: local %d/%d", e.local_rank, e.local_world_size);
    { /* srun --mpi=pmi2 (Slurm's mpi/pmi2 plugin) sets PMI_RANK and PMI_SIZE but
         no local variables: Slurm's describe the same task (rank 5 of 8, 4 a
         node, is local rank 1 on node 1); not when they are another task's */
        kv pmi2[] = {{"PMI_RANK", "5"}, {"PMI_SIZE", "8"}, {"PMI_FD", "7"}, {"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"},
                     {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "1"}, {"SLURM_TASKS_PER_NODE", "4(x2)"}, {NULL, NULL}};
        kv other[] = {{"PMI_RANK", "5"}, {"PMI_SIZE", "8"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"},
                      {"SLURM_LOCALID", "0"}, {NULL, NULL}};
        CT_CHECK(read_env(pmi2, &e) == CAPEX_OK && e.launcher == CAPEX_LAUNCHER_PMI && e.rank == 5 && e.local_rank == 1 &&
                     e.local_world_size == 4 && e.node_rank == 1,
                 "srun --mpi=pmi2: %s local %d/%d, node %d", capex_launcher_name(e.launcher), e.local_rank,
                 e.local_world_size, e.node_rank);
        CT_CHECK(read_env(other, &e) == CAPEX_OK && e.local_rank == 5 && e.local_world_size == 8,
                 "a batch step's Slurm variables are not this task's: local %d/%d", e.local_rank, e.local_world_size);
    }
    { /* SLURM_NTASKS_PER_NODE is the --ntasks-per-node request; the layout
         (SLURM_TASKS_PER_NODE on SLURM_NODEID) wins: 4 tasks on 4 nodes asked
         at 4 per node (a real job's variables), and -n 5 at 2 per node, whose
         last node holds 1 */
        kv req[] = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "1"},
                    {"SLURM_NTASKS_PER_NODE", "4"}, {"SLURM_TASKS_PER_NODE", "1(x4)"}, {NULL, NULL}};
        kv last[] = {{"SLURM_PROCID", "4"}, {"SLURM_NTASKS", "5"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "2"},
                     {"SLURM_NTASKS_PER_NODE", "2"}, {"SLURM_TASKS_PER_NODE", "2(x2),1"}, {NULL, NULL}};
        CT_CHECK(read_env(req, &e) == CAPEX_OK && e.local_rank == 0 && e.local_world_size == 1 && e.node_rank == 1,
                 "one task a node: local %d/%d, node %d", e.local_rank, e.local_world_size, e.node_rank);
        CT_CHECK(read_env(last, &e) == CAPEX_OK && e.local_rank == 0 && e.local_world_size == 1,
                 "last node of -n 5 at 2 per node: local %d/%d", e.local_rank, e.local_world_size);
    }
}

/* Flux (flux-core's job shell, src/shell/task.c): FLUX_TASK_RANK (global),
   FLUX_JOB_SIZE, FLUX_TASK_LOCAL_ID (index on this node); no local size.
   Its PMI plugin also sets PMI_RANK/PMI_SIZE (no MPI_LOCALRANKID): PMI wins,
   and takes the local rank from Flux when Flux's variables are this task's. */
CT_TEST(env_flux) {
    kv f[] = {{"FLUX_TASK_RANK", "5"}, {"FLUX_JOB_SIZE", "8"}, {"FLUX_TASK_LOCAL_ID", "1"}, {"FLUX_JOB_NNODES", "2"},
              {"FLUX_JOB_ID", "1234"}, {NULL, NULL}};
    kv fp[] = {{"PMI_RANK", "5"}, {"PMI_SIZE", "8"}, {"PMI_FD", "9"}, {"FLUX_TASK_RANK", "5"}, {"FLUX_JOB_SIZE", "8"},
               {"FLUX_TASK_LOCAL_ID", "1"}, {NULL, NULL}};
    /* mpiexec (hydra, without local variables) run as one Flux task: Flux's are the mpiexec's */
    kv hy[] = {{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}, {"FLUX_TASK_RANK", "0"}, {"FLUX_JOB_SIZE", "1"},
               {"FLUX_TASK_LOCAL_ID", "0"}, {NULL, NULL}};
    /* a Flux instance started by srun: the job's tasks inherit the broker's Slurm variables */
    kv fs[] = {{"FLUX_TASK_RANK", "6"}, {"FLUX_JOB_SIZE", "8"}, {"FLUX_TASK_LOCAL_ID", "2"}, {"FLUX_JOB_ID", "77"},
               {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}, {"SLURM_JOB_ID", "5"}, {NULL, NULL}};
    kv half[] = {{"FLUX_TASK_RANK", "1"}, {NULL, NULL}};
    kv bad[] = {{"FLUX_TASK_RANK", "1"}, {"FLUX_JOB_SIZE", "2"}, {"FLUX_TASK_LOCAL_ID", "x"}, {NULL, NULL}};
    capex_dist_env e;
    CT_CHECK(read_env(f, &e) == CAPEX_OK && e.launcher == CAPEX_LAUNCHER_FLUX && e.rank == 5 && e.world_size == 8 &&
                 e.local_rank == 1 && e.local_world_size == 8 && e.node_rank == -1,
             "flux: %s %d/%d local %d/%d node %d: %.200s", capex_launcher_name(e.launcher), e.rank, e.world_size,
             e.local_rank, e.local_world_size, e.node_rank, capex_last_error());
    CT_CHECK(strcmp(e.run_id, "flux-1234") == 0, "flux run id %s", e.run_id);
    CT_CHECK(strcmp(capex_launcher_name(CAPEX_LAUNCHER_FLUX), "Flux") == 0, "name");
    CT_CHECK(read_env(fp, &e) == CAPEX_OK && e.launcher == CAPEX_LAUNCHER_PMI && e.rank == 5 && e.local_rank == 1,
             "flux with its PMI: %s local %d", capex_launcher_name(e.launcher), e.local_rank);
    CT_CHECK(read_env(hy, &e) == CAPEX_OK && e.launcher == CAPEX_LAUNCHER_PMI && e.rank == 3 && e.local_rank == 3 &&
                 e.local_world_size == 4, "another task's Flux variables: local %d/%d", e.local_rank, e.local_world_size);
    CT_CHECK(read_env(fs, &e) == CAPEX_OK && e.launcher == CAPEX_LAUNCHER_FLUX && e.rank == 6 && e.local_rank == 2,
             "flux under srun: %s rank %d local %d", capex_launcher_name(e.launcher), e.rank, e.local_rank);
    CT_CHECK(strcmp(e.run_id, "flux-77") == 0, "the Flux job's id, not the enclosing Slurm job's: %s", e.run_id);
    CT_CHECK(read_env(half, &e) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "FLUX_JOB_SIZE"), "%.200s",
             capex_last_error());
    CT_CHECK(read_env(bad, &e) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "FLUX_TASK_LOCAL_ID"), "%.200s",
             capex_last_error());
}

CT_TEST(env_slurm_tasks_per_node_parser) {
    CT_CHECK(capex__slurm_tasks_on_node("2(x3),1", 0) == 2 && capex__slurm_tasks_on_node("2(x3),1", 2) == 2, "rep");
    CT_CHECK(capex__slurm_tasks_on_node("2(x3),1", 3) == 1, "tail");
    CT_CHECK(capex__slurm_tasks_on_node("2(x3),1", 4) == 0, "past the end");
    CT_CHECK(capex__slurm_tasks_on_node("4", 0) == 4, "plain");
    {
        const char *bad[] = {"", "x", "2(3)", "2(x)", "2(x3", "2,", ",2", "2(x0)", "0", "2 ", "99999999999", "2(x3)1"};
        size_t i;
        for (i = 0; i < sizeof bad / sizeof bad[0]; i++)
            CT_CHECK(capex__slurm_tasks_on_node(bad[i], 0) == 0, "'%s' must be rejected", bad[i]);
    }
}

CT_TEST(env_overrides_and_run_id_precedence) {
    kv t[] = {{"RANK", "3"}, {"WORLD_SIZE", "8"}, {"CAPEX_RUN_ID", "mine"}, {"TORCHELASTIC_RUN_ID", "theirs"},
              {"MASTER_PORT", "1234"}, {NULL, NULL}};
    capex_dist_env_desc d;
    capex_dist_env e;
    capex_dist_env_desc_init(&d);
    d.getenv_fn = table_getenv;
    d.getenv_user = t;
    d.rank = 1; d.world_size = 2; d.master_addr = "127.0.0.1"; d.master_port = 4321;
    CT_CHECK(capex_dist_env_read(&d, &e) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(e.launcher == CAPEX_LAUNCHER_EXPLICIT && e.rank == 1 && e.world_size == 2, "explicit wins");
    CT_CHECK(e.local_rank == 1 && e.local_world_size == 2, "one node assumed");
    CT_CHECK(strcmp(e.master_addr, "127.0.0.1") == 0 && e.master_port == 4321, "addr override");
    CT_CHECK(strcmp(e.run_id, "mine") == 0, "CAPEX_RUN_ID first: %s", e.run_id);
    d.run_id = "given";
    d.local_world_size = 1;
    CT_CHECK(capex_dist_env_read(&d, &e) == CAPEX_OK && strcmp(e.run_id, "given") == 0, "explicit run id");
    CT_CHECK(e.local_rank == 0 && e.local_world_size == 1 && e.node_rank == 1, "block placement %d", e.local_rank);
    d.world_size = -1;
    CT_CHECK(capex_dist_env_read(&d, &e) == CAPEX_ERR_CONFIG, "rank without world size");
    CT_CHECK(capex_dist_env_read(&d, NULL) == CAPEX_ERR_INVALID_ARG, "NULL out");
    /* the real environment path runs too (whatever it holds, no crash) */
    { capex_result r = capex_dist_env_read(NULL, &e); CT_CHECK(r == CAPEX_OK || r == CAPEX_ERR_CONFIG, "real env"); }
}

CT_TEST(env_errors_are_config_and_named) {
    static const kv cases[][4] = {
        {{"RANK", "abc"}, {"WORLD_SIZE", "2"}, {NULL, NULL}},
        {{"RANK", "-1"}, {"WORLD_SIZE", "2"}, {NULL, NULL}},
        {{"RANK", " 1"}, {"WORLD_SIZE", "2"}, {NULL, NULL}},
        {{"RANK", "1"}, {"WORLD_SIZE", "2x"}, {NULL, NULL}},
        {{"RANK", ""}, {"WORLD_SIZE", "2"}, {NULL, NULL}},
        {{"RANK", "4"}, {"WORLD_SIZE", "4"}, {NULL, NULL}},
        {{"RANK", "0"}, {"WORLD_SIZE", "0"}, {NULL, NULL}},
        {{"RANK", "0"}, {NULL, NULL}},
        {{"RANK", "99999999999"}, {"WORLD_SIZE", "2"}, {NULL, NULL}},
        {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "2"}},
        {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_WORLD_SIZE", "3"}, {NULL, NULL}},
        {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}, {NULL, NULL}},
        {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "http"}, {NULL, NULL}},
        {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "0"}, {NULL, NULL}},
        {{"OMPI_COMM_WORLD_RANK", "1"}, {NULL, NULL}},
        {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_NODEID", "9"}, {"SLURM_TASKS_PER_NODE", "2(x2)"}},
        {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "-2"}, {NULL, NULL}},
        {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "4"}, {"SLURM_NTASKS_PER_NODE", "abc"}, {NULL, NULL}},
    };
    size_t i;
    for (i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        kv t[5];
        capex_dist_env e;
        memcpy(t, cases[i], sizeof cases[i]);
        t[4].k = NULL; t[4].v = NULL;
        CT_CHECK(read_env(t, &e) == CAPEX_ERR_CONFIG, "case %lu must fail", (unsigned long)i);
        CT_CHECK(strlen(capex_last_error()) > 10, "case %lu has a message", (unsigned long)i);
    }
    {
        kv t[] = {{"RANK", "abc"}, {"WORLD_SIZE", "2"}, {NULL, NULL}};
        capex_dist_env e;
        read_env(t, &e);
        CT_CHECK(strstr(capex_last_error(), "RANK") && strstr(capex_last_error(), "abc"), "names the variable: %s",
                 capex_last_error());
    }
}

/* ------------------------------------------------------------ sampler -- */

/* torch/utils/data/distributed.py, __init__ and __iter__, transcribed with
   Python's math.ceil on exact rationals (no floats). */
static long long ceil_div_signed(long long a, long long b) { /* b > 0 */
    return a >= 0 ? (a + b - 1) / b : -((-a) / b);
}
static size_t torch_indices(uint64_t n, int R, int rank, int shuffle, uint64_t seed, uint64_t epoch, int drop_last,
                            uint64_t *out, uint64_t *num_samples_out) {
    long long num_samples, total, i;
    uint64_t *ind = (uint64_t *)malloc(sizeof(uint64_t) * (size_t)(2 * n + 2 * (uint64_t)R + 2));
    size_t len = 0, k = 0;
    if (drop_last && n % (uint64_t)R != 0) num_samples = ceil_div_signed((long long)n - R, R);
    else num_samples = ceil_div_signed((long long)n, R);
    total = num_samples * R;
    for (i = 0; i < (long long)n; i++) ind[len++] = shuffle ? capex_permute_index((uint64_t)i, n, seed + epoch) : (uint64_t)i;
    if (!drop_last) {
        long long pad = total - (long long)len, orig = (long long)len;
        if (pad <= orig) { for (i = 0; i < pad; i++) ind[len++] = ind[i]; }
        else { /* (indices * ceil(pad / len))[:pad] */
            long long reps = ceil_div_signed(pad, orig), r2, j, added = 0;
            for (r2 = 0; r2 < reps; r2++) for (j = 0; j < orig && added < pad; j++, added++) ind[len++] = ind[j];
        }
    } else {
        len = (size_t)total;
    }
    for (i = rank; i < total; i += R) out[k++] = ind[i];
    free(ind);
    *num_samples_out = (uint64_t)num_samples;
    return k;
}

CT_TEST(sampler_matches_torch_transcription) {
    uint64_t n;
    uint64_t *got = (uint64_t *)malloc(sizeof(uint64_t) * 200), *want = (uint64_t *)malloc(sizeof(uint64_t) * 200);
    for (n = 0; n <= 40; n++) {
        int R, rank, dl, sh;
        for (R = 1; R <= 7; R++) for (dl = 0; dl < 2; dl++) for (sh = 0; sh < 2; sh++) for (rank = 0; rank < R; rank++) {
            capex_sampler_desc d;
            capex_sampler s;
            uint64_t ns = 0;
            size_t k, m;
            capex_sampler_desc_init(&d);
            d.dataset_size = n; d.num_replicas = R; d.rank = rank; d.shuffle = sh; d.drop_last = dl; d.seed = 1234;
            CT_CHECK(capex_sampler_init(&s, &d) == CAPEX_OK, "%.300s", capex_last_error());
            capex_sampler_set_epoch(&s, 7);
            m = torch_indices(n, R, rank, sh, 1234, 7, dl, want, &ns);
            CT_CHECK(s.num_samples == ns && m == ns && s.total_size == ns * (uint64_t)R, "n=%lu R=%d dl=%d: %lu vs %lu",
                     (unsigned long)n, R, dl, (unsigned long)s.num_samples, (unsigned long)ns);
            for (k = 0; k < m; k++) got[k] = 0xdeadbeef;
            CT_CHECK(capex_sampler_indices(&s, got, 200) == CAPEX_OK, "%.300s", capex_last_error());
            for (k = 0; k < m; k++)
                CT_CHECK(got[k] == want[k], "n=%lu R=%d rank=%d dl=%d sh=%d k=%lu: %lu vs %lu", (unsigned long)n, R, rank,
                         dl, sh, (unsigned long)k, (unsigned long)got[k], (unsigned long)want[k]);
        }
    }
    free(got);
    free(want);
}

CT_TEST(sampler_torch_formulas_by_hand) {
    /* torch: N=10, R=4 -> num_samples 3, total 12; drop_last -> 2, total 8;
       N=3, R=4, drop_last -> ceil(-1/4) = 0 */
    capex_sampler_desc d;
    capex_sampler s;
    uint64_t idx[3];
    capex_sampler_desc_init(&d);
    d.dataset_size = 10; d.num_replicas = 4; d.rank = 3; d.shuffle = 0;
    CT_CHECK(capex_sampler_init(&s, &d) == CAPEX_OK && s.num_samples == 3 && s.total_size == 12, "ceil");
    CT_CHECK(capex_sampler_indices(&s, idx, 3) == CAPEX_OK && idx[0] == 3 && idx[1] == 7 && idx[2] == 1,
             "padding repeats the start: %lu %lu %lu", (unsigned long)idx[0], (unsigned long)idx[1], (unsigned long)idx[2]);
    d.drop_last = 1;
    CT_CHECK(capex_sampler_init(&s, &d) == CAPEX_OK && s.num_samples == 2 && s.total_size == 8, "floor");
    d.dataset_size = 3;
    CT_CHECK(capex_sampler_init(&s, &d) == CAPEX_OK && s.num_samples == 0, "tiny dataset drop_last");
    d.dataset_size = 2; d.drop_last = 0;
    CT_CHECK(capex_sampler_init(&s, &d) == CAPEX_OK && s.num_samples == 1 && s.total_size == 4, "pad past N");
    CT_CHECK(capex_sampler_index(&s, 0, &idx[0]) == CAPEX_OK && idx[0] == 1, "rank 3 of 4 on N=2 gets index 1");
    CT_CHECK(capex_sampler_index(&s, 1, &idx[0]) == CAPEX_ERR_INVALID_ARG, "k past num_samples");
    CT_CHECK(capex_sampler_indices(&s, idx, 0) == CAPEX_ERR_SIZE_MISMATCH, "cap too small");
    /* N = 2^64 - 1 over 2 ranks pads to 2^64: refused, not a total of 0 */
    d.dataset_size = UINT64_MAX; d.num_replicas = 2; d.rank = 1;
    CT_CHECK(capex_sampler_init(&s, &d) == CAPEX_ERR_INVALID_ARG && strstr(capex_last_error(), "overflow"),
             "padded total wraps: total_size %llu", (unsigned long long)s.total_size);
    d.drop_last = 1;
    CT_CHECK(capex_sampler_init(&s, &d) == CAPEX_OK && s.num_samples == UINT64_MAX / 2 && s.total_size == UINT64_MAX - 1 &&
                 capex_sampler_index(&s, s.num_samples - 1, &idx[0]) == CAPEX_OK && idx[0] == UINT64_MAX - 2,
             "drop_last: the last sample of rank 1: %.200s", capex_last_error());
    d.num_replicas = 3; d.drop_last = 0; /* 2^64 - 1 = 3 * 6148914691236517205: no padding */
    CT_CHECK(capex_sampler_init(&s, &d) == CAPEX_OK && s.total_size == UINT64_MAX, "3 ranks: %.200s", capex_last_error());
    d.dataset_size = 2; d.num_replicas = 4;
    d.rank = 4;
    CT_CHECK(capex_sampler_init(&s, &d) == CAPEX_ERR_INVALID_ARG, "rank >= num_replicas");
    d.rank = 0; d.num_replicas = 0;
    CT_CHECK(capex_sampler_init(&s, &d) == CAPEX_ERR_INVALID_ARG, "num_replicas 0");
}

/* A sampler that init did not make (init failed, zeroed, garbage) or whose
   sizes no longer match its desc is refused: no stale shard from a previous
   init, no division by a dataset_size of 0. */
CT_TEST(sampler_refuses_failed_zeroed_or_edited) {
    capex_sampler_desc d;
    capex_sampler s, fresh;
    uint64_t idx[4] = {0, 0, 0, 0}, want = 0;
    capex_sampler_desc_init(&d);
    d.dataset_size = 10; d.num_replicas = 2; d.rank = 1;
    CT_CHECK(capex_sampler_init(&s, &d) == CAPEX_OK, "%.300s", capex_last_error());
    d.rank = 2; /* a failed re-init (say, rank past a smaller world) must not leave the old shard usable */
    CT_CHECK(capex_sampler_init(&s, &d) == CAPEX_ERR_INVALID_ARG, "rank 2 of 2");
    CT_CHECK(capex_sampler_index(&s, 0, &idx[0]) == CAPEX_ERR_INVALID_ARG &&
                 strstr(capex_last_error(), "capex_sampler_init"),
             "index after a failed init: got %llu, %.200s", (unsigned long long)idx[0], capex_last_error());
    CT_CHECK(capex_sampler_indices(&s, idx, 4) == CAPEX_ERR_INVALID_ARG, "indices after a failed init");
    memset(&s, 0, sizeof s);
    CT_CHECK(capex_sampler_indices(&s, NULL, 0) == CAPEX_ERR_INVALID_ARG, "zeroed sampler: an empty shard is not OK");
    memset(&s, 0xA5, sizeof s);
    CT_CHECK(capex_sampler_index(&s, 0, &idx[0]) == CAPEX_ERR_INVALID_ARG, "garbage sampler");
    d.rank = 1; d.num_replicas = 4;
    CT_CHECK(capex_sampler_init(&s, &d) == CAPEX_OK && s.num_samples == 3, "%.300s", capex_last_error());
    s.d.dataset_size = 0; /* edited after init: was index % 0 */
    CT_CHECK(capex_sampler_index(&s, 0, &idx[0]) == CAPEX_ERR_INVALID_ARG, "dataset_size edited to 0");
    s.d.dataset_size = 7; /* 2 per rank now, num_samples still says 3 */
    CT_CHECK(capex_sampler_index(&s, 2, &idx[0]) == CAPEX_ERR_INVALID_ARG, "dataset_size edited to 7");
    s.d.dataset_size = 11; /* same sizes as 10 (3 per rank, total 12): a consistent sampler for 11 */
    d.dataset_size = 11;
    CT_CHECK(capex_sampler_init(&fresh, &d) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_sampler_index(&s, 2, &idx[0]) == CAPEX_OK && capex_sampler_index(&fresh, 2, &want) == CAPEX_OK &&
                 idx[0] == want, "edited to 11: %llu vs %llu", (unsigned long long)idx[0], (unsigned long long)want);
    s.d.rank = 0; /* re-init from its own desc */
    CT_CHECK(capex_sampler_init(&s, &s.d) == CAPEX_OK && s.d.rank == 0 && s.num_samples == 3, "%.300s",
             capex_last_error());
    CT_CHECK(capex_sampler_init(&s, NULL) == CAPEX_ERR_INVALID_ARG &&
                 capex_sampler_index(&s, 0, &idx[0]) == CAPEX_ERR_INVALID_ARG, "NULL desc leaves s refused");
}

CT_TEST(sampler_shards_disjoint_complete_and_epoch_dependent) {
    const uint64_t n = 1001;
    const int R = 4;
    unsigned char *count = (unsigned char *)calloc(n, 1);
    uint64_t *e0 = (uint64_t *)malloc(sizeof(uint64_t) * n), *e1 = (uint64_t *)malloc(sizeof(uint64_t) * n);
    int rank, dl;
    size_t same = 0, k;
    for (dl = 0; dl < 2; dl++) {
        uint64_t total = 0, seen = 0;
        memset(count, 0, n);
        for (rank = 0; rank < R; rank++) {
            capex_sampler_desc d;
            capex_sampler s;
            uint64_t i, v;
            capex_sampler_desc_init(&d);
            d.dataset_size = n; d.num_replicas = R; d.rank = rank; d.seed = 42; d.drop_last = dl;
            capex_sampler_init(&s, &d);
            capex_sampler_set_epoch(&s, 3);
            for (i = 0; i < s.num_samples; i++) {
                CT_CHECK(capex_sampler_index(&s, i, &v) == CAPEX_OK && v < n, "index in range");
                count[v]++;
                total++;
            }
        }
        for (k = 0; k < n; k++) if (count[k]) seen++;
        if (dl) CT_CHECK(total == 1000 && seen == 1000, "drop_last: 1000 distinct of 1001 (%lu, %lu)", (unsigned long)total, (unsigned long)seen);
        else CT_CHECK(total == 1004 && seen == n, "padded: every index, 3 repeated (%lu, %lu)", (unsigned long)total, (unsigned long)seen);
    }
    for (k = 0; k < n; k++) { e0[k] = capex_permute_index(k, n, 42 + 0); e1[k] = capex_permute_index(k, n, 42 + 1); }
    for (k = 0; k < n; k++) same += e0[k] == e1[k];
    CT_CHECK(same < 20, "epochs 0 and 1 differ (%lu fixed points)", (unsigned long)same);
    for (k = 0; k < n; k++) CT_CHECK(e0[k] == capex_permute_index(k, n, 42), "deterministic");
    free(count); free(e0); free(e1);
}

CT_TEST(permutation_is_a_bijection) {
    uint64_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 100, 255, 256, 257, 1000, 4097, 65537};
    unsigned char *seen = (unsigned char *)malloc(65537);
    size_t si;
    uint64_t key, i;
    for (si = 0; si < sizeof sizes / sizeof sizes[0]; si++) for (key = 0; key < 5; key++) {
        uint64_t n = sizes[si], fixed = 0;
        memset(seen, 0, (size_t)n);
        for (i = 0; i < n; i++) {
            uint64_t v = capex_permute_index(i, n, key * 0x1234567ull);
            CT_CHECK(v < n && !seen[v], "n=%lu key=%lu: %lu hit twice", (unsigned long)n, (unsigned long)key, (unsigned long)v);
            seen[v] = 1;
            fixed += v == i;
        }
        if (n >= 1000) CT_CHECK(fixed < 20, "n=%lu looks shuffled (%lu fixed points)", (unsigned long)n, (unsigned long)fixed);
    }
    /* huge n: stays in range */
    CT_CHECK(capex_permute_index(5, ~(uint64_t)0, 9) < ~(uint64_t)0, "n = 2^64-1");
    CT_CHECK(capex_permute_index(123456789ull, 1ull << 40, 9) < (1ull << 40), "n = 2^40");
    free(seen);
}

/* --------------------------------------------------------- fake comm -- */
/* A world of `world` identical ranks: SUM = x * world (exact for the
   values used), recorded launches and waits, injectable failures. */
typedef struct fake {
    int world;
    int launches[64], nlaunch;    /* bucket index of each iallreduce      */
    capex_dtype launch_dtype[64];
    int waits[64], nwait;
    capex_ddp *ddp;               /* to map buffers back to bucket indices */
    capex_result fail_wait;       /* returned by the next wait if set      */
    int async;                    /* 0: no iallreduce entry (sync path)    */
    int ntest, test_done;         /* progress polls seen; what test says   */
    int fail_launch_at;           /* > 0: that iallreduce (1-based) fails, COMM */
} fake;

static int fake_bucket_of(fake *f, const void *buf) {
    size_t k;
    for (k = 0; f->ddp && k < f->ddp->nb; k++)
        if (f->ddp->b[k].buf == buf || f->ddp->b[k].buf32 == buf) return (int)k;
    return -1;
}
static void fake_sum(fake *f, void *buf, size_t n, capex_dtype t) {
    size_t i;
    if (t == CAPEX_I64) { /* exact: capex__comm_agree's tags (the rebuild agrees) do not fit a float */
        for (i = 0; i < n; i++) ((int64_t *)buf)[i] *= f->world;
        return;
    }
    for (i = 0; i < n; i++) capex__store(buf, t, i, capex__load(buf, t, i) * (float)f->world);
}
static capex_result fake_allreduce(capex_comm *c, const void *s, void *r, size_t n, capex_dtype t, capex_reduce_op op, double dl) {
    fake *f = (fake *)c->impl;
    (void)dl;
    if (s != r) memcpy(r, s, n * capex_dtype_size(t));
    if (f->nlaunch < 64) { f->launch_dtype[f->nlaunch] = t; f->launches[f->nlaunch++] = fake_bucket_of(f, r); }
    fake_sum(f, r, n, t);
    if (op == CAPEX_REDUCE_AVG) capex__host_div(r, n, t, (float)f->world);
    return CAPEX_OK;
}
static capex_result fake_iallreduce(capex_comm *c, const void *s, void *r, size_t n, capex_dtype t, capex_reduce_op op,
                                    capex_comm_req *q) {
    fake *f = (fake *)c->impl;
    if (f->fail_launch_at && f->nlaunch + 1 == f->fail_launch_at) {
        f->nlaunch++;
        return capex__fail(CAPEX_ERR_COMM, "fake comm: injected launch failure");
    }
    q->active = 1;
    q->p[0] = r;
    return fake_allreduce(c, s, r, n, t, op, 0);
}
static capex_result fake_wait(capex_comm *c, capex_comm_req *q, double dl) {
    fake *f = (fake *)c->impl;
    capex_result r = f->fail_wait;
    (void)dl;
    if (f->nwait < 64) f->waits[f->nwait++] = fake_bucket_of(f, q->p[0]);
    q->active = 0;
    if (r) return capex__fail(r, "fake comm: injected failure");
    return CAPEX_OK;
}
static capex_result fake_test(capex_comm *c, capex_comm_req *q, int *done) {
    fake *f = (fake *)c->impl;
    f->ntest++;
    *done = f->test_done;
    (void)q;
    return CAPEX_OK;
}
static capex_result fake_bcast(capex_comm *c, void *b, size_t n, capex_dtype t, int root, double dl) {
    (void)c; (void)b; (void)n; (void)t; (void)root; (void)dl;
    return CAPEX_OK;
}
/* A world of ranks alike: every slot gets this rank's data (create's model check). */
static capex_result fake_allgather(capex_comm *c, const void *s, void *r, size_t n, capex_dtype t, double dl) {
    size_t bytes = n * capex_comm_dtype_size(t);
    int p;
    (void)dl;
    for (p = 0; p < c->world_size; p++) memmove((char *)r + (size_t)p * bytes, s, bytes);
    return CAPEX_OK;
}
static capex_result fake_barrier(capex_comm *c, double dl) { (void)c; (void)dl; return CAPEX_OK; }
/* Nothing of the fake's stays in flight after a failure, so it can "abort":
   DDP then frees its buckets at destroy (without an abort entry they are
   left, as MPI may still write them: capex__req_orphaned). */
static void fake_abort(capex_comm *c) { (void)c; }
static const capex_comm_vtable fake_vt = {"fake", fake_allreduce, fake_bcast, fake_allgather, fake_barrier,
                                          fake_iallreduce, fake_wait, NULL, fake_abort, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                          fake_test, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
static const capex_comm_vtable fake_sync_vt = {"fake-sync", fake_allreduce, fake_bcast, fake_allgather, fake_barrier,
                                               NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                               NULL, NULL, NULL, NULL, NULL, NULL, NULL};

static void fake_comm(capex_comm *c, fake *f, int world, int async) {
    memset(f, 0, sizeof *f);
    f->world = world;
    f->async = async;
    memset(c, 0, sizeof *c);
    c->vt = async ? &fake_vt : &fake_sync_vt;
    c->impl = f;
    c->rank = 0;
    c->world_size = world;
    c->timeout_s = 10;
}

/* ------------------------------------------------------ bucket layout -- */

/* Independent transcription of compute_bucket_assignment_by_size with
   tensor_indices given (the ready order), then buckets sorted by their first
   member's position. Writes bucket id per position; returns bucket count. */
static int ref_plan(const capex_ddp_param *ps, const size_t *order, size_t n, size_t first, size_t cap, size_t msg,
                    int *bucket_of_pos) {
    int open[3] = {-1, -1, -1}, nb = 0;
    size_t sz[3] = {0, 0, 0}, lim[3];
    size_t i;
    lim[0] = lim[1] = lim[2] = msg ? msg : first;
    for (i = 0; i < n; i++) {
        const capex_ddp_param *p = &ps[order[i]];
        int t = (int)p->dtype;
        if (open[t] < 0) { open[t] = nb++; sz[t] = 0; }
        bucket_of_pos[i] = open[t];
        sz[t] += msg ? p->numel : p->numel * capex_dtype_size(p->dtype);
        if (sz[t] >= lim[t]) { open[t] = -1; lim[t] = msg ? msg : cap; }
    }
    return nb;
}

static int check_layout(capex_ddp *g, const capex_ddp_param *ps, size_t n, const size_t *order, size_t first, size_t cap,
                        size_t msg, char *why) {
    int ref[64], nb = ref_plan(ps, order, n, first, cap, msg, ref);
    size_t k, pos[64], i;
    if ((size_t)nb != capex_ddp_num_buckets(g)) { sprintf(why, "%d buckets expected, got %lu", nb, (unsigned long)capex_ddp_num_buckets(g)); return 0; }
    for (i = 0; i < 64; i++) pos[i] = 0;
    for (i = 0; i < n; i++) {
        size_t p = order[i];
        capex_ddp_bucket_info bi;
        capex_ddp_bucket(g, (size_t)ref[i], &bi);
        if (bi.params[pos[ref[i]]] != p) { sprintf(why, "param %lu misplaced in bucket %d", (unsigned long)p, ref[i]); return 0; }
        pos[ref[i]]++;
    }
    for (k = 0; k < (size_t)nb; k++) {
        capex_ddp_bucket_info bi;
        size_t off = 0;
        capex_ddp_bucket(g, k, &bi);
        if (bi.num_params != pos[k]) { sprintf(why, "bucket %lu size", (unsigned long)k); return 0; }
        for (i = 0; i < bi.num_params; i++) {
            size_t p = bi.params[i];
            size_t a = 16 / capex_dtype_size(bi.dtype);
            off = (off + a - 1) / a * a; /* views start 16-byte aligned */
            if (bi.offsets[i] != off || ps[p].dtype != bi.dtype) { sprintf(why, "bucket %lu offsets/dtype", (unsigned long)k); return 0; }
            if (((uintptr_t)capex_ddp_grad(g, p) & 15u) != 0) { sprintf(why, "grad view of %lu not 16-byte aligned", (unsigned long)p); return 0; }
            if ((char *)capex_ddp_grad(g, p) != (char *)g->b[k].buf + off * capex_dtype_size(bi.dtype)) {
                sprintf(why, "grad view of %lu", (unsigned long)p); return 0;
            }
            off += ps[p].numel;
        }
        if (off != bi.numel) { sprintf(why, "bucket %lu numel", (unsigned long)k); return 0; }
    }
    return 1;
}

CT_TEST(bucket_layout_matches_pytorch_assignment) {
    /* 12 params, mixed dtypes and sizes; small limits so several buckets form */
    static const size_t numel[12] = {10, 300, 7, 64, 64, 1, 500, 33, 20, 20, 128, 3};
    static const capex_dtype dt[12] = {CAPEX_F32, CAPEX_F32, CAPEX_BF16, CAPEX_F32, CAPEX_F16, CAPEX_F32,
                                       CAPEX_BF16, CAPEX_F32, CAPEX_F16, CAPEX_F32, CAPEX_F32, CAPEX_BF16};
    capex_ddp_param ps[12];
    float data[2000];
    size_t order[12], i;
    int variant;
    capex_comm c;
    char why[200];
    capex_comm_init_single(&c);
    for (i = 0; i < 12; i++) { ps[i].data = data; ps[i].numel = numel[i]; ps[i].dtype = dt[i]; ps[i].grad = NULL; order[i] = 11 - i; }
    for (variant = 0; variant < 4; variant++) {
        capex_ddp_desc d;
        capex_ddp *g = NULL;
        capex_ddp_desc_init(&d);
        if (variant == 0) { d.first_bucket_bytes = 100; d.bucket_bytes = 600; }
        if (variant == 1) { d.first_bucket_bytes = 1; d.bucket_bytes = 1; }
        if (variant == 2) { d.message_size = 100; }
        CT_CHECK(capex_ddp_create(&g, &c, ps, 12, &d) == CAPEX_OK, "%.300s", capex_last_error());
        CT_CHECK(check_layout(g, ps, 12, order, d.first_bucket_bytes, d.bucket_bytes, d.message_size, why), "variant %d: %s", variant, why);
        if (variant == 1) CT_CHECK(capex_ddp_num_buckets(g) == 12, "1-byte limits: one bucket per param");
        if (variant == 3) CT_CHECK(capex_ddp_num_buckets(g) == 3, "defaults: one bucket per dtype here");
        capex_ddp_destroy(g);
    }
    /* by hand: f32 params of 64 KiB each, limits 128 KiB then 256 KiB:
       reverse order 5,4 | 3,2,1,0 -> buckets {5,4}, {3,2,1,0} */
    {
        capex_ddp_param q[6];
        capex_ddp_desc d;
        capex_ddp *g = NULL;
        capex_ddp_bucket_info bi;
        static float big[16384];
        for (i = 0; i < 6; i++) { q[i].data = big; q[i].numel = 16384; q[i].dtype = CAPEX_F32; q[i].grad = NULL; }
        capex_ddp_desc_init(&d);
        d.first_bucket_bytes = 128 * 1024; d.bucket_bytes = 256 * 1024;
        CT_CHECK(capex_ddp_create(&g, &c, q, 6, &d) == CAPEX_OK, "%.300s", capex_last_error());
        CT_CHECK(capex_ddp_num_buckets(g) == 2, "2 buckets, got %lu", (unsigned long)capex_ddp_num_buckets(g));
        capex_ddp_bucket(g, 0, &bi);
        CT_CHECK(bi.num_params == 2 && bi.params[0] == 5 && bi.params[1] == 4 && bi.numel == 32768, "first bucket");
        capex_ddp_bucket(g, 1, &bi);
        CT_CHECK(bi.num_params == 4 && bi.params[0] == 3 && bi.params[3] == 0, "second bucket");
        CT_CHECK(capex_ddp_bucket(g, 2, &bi) == CAPEX_ERR_INVALID_ARG, "bucket out of range");
        CT_CHECK(capex_ddp_grad(g, 6) == NULL, "grad out of range");
        capex_ddp_destroy(g);
    }
}

/* The model check's verdicts from peers' signatures as a fake world of 2
   hands them over: rank 1's slot is this rank's signature edited, or no
   signature at all (a rank that skipped create and made another collective
   of the same size). No collective at all in a world of 1. */
static int sig_edit_slot = -1, sig_edit_slot2 = -1;
static int64_t sig_edit_value, sig_edit_value2;
static int sig_gathers;
static capex_result sig_allgather(capex_comm *c, const void *s, void *r, size_t n, capex_dtype t, double dl) {
    size_t bytes = n * capex_comm_dtype_size(t);
    (void)dl;
    sig_gathers++;
    memmove(r, s, bytes);
    memmove((char *)r + bytes, s, bytes);
    if (sig_edit_slot == -2) memset((char *)r + bytes, 0, bytes);
    else if (sig_edit_slot >= 0) ((int64_t *)r)[n + (size_t)sig_edit_slot] = sig_edit_value;
    if (sig_edit_slot2 >= 0) ((int64_t *)r)[n + (size_t)sig_edit_slot2] = sig_edit_value2;
    (void)c;
    return CAPEX_OK;
}
CT_TEST(create_model_check_verdicts) {
    static capex_comm_vtable vt;
    static const struct { int slot; int64_t value; int slot2; int64_t value2; capex_result want; const char *msg; } cases[] = {
        {-1, 0, -1, 0, CAPEX_OK, ""},
        {-2, 0, -1, 0, CAPEX_ERR_CONFIG, "rank 1 sent no create signature"},
        {-2, 0, CAPEX__SIG_REFUSED, 1, CAPEX_ERR_CONFIG, "rank 1 sent no create signature"}, /* not a refusal */
        {CAPEX__SIG_API, CAPEX__SIG_ZERO, -1, 0, CAPEX_ERR_CONFIG, "rank 1 did not call the same create as rank 0"},
        {CAPEX__SIG_REFUSED, 1, CAPEX__SIG_NP, 0, CAPEX_ERR_COMM, "rank 1 refused its arguments (1 of 2 ranks did"},
        {CAPEX__SIG_NP, 3, -1, 0, CAPEX_ERR_SIZE_MISMATCH, "rank 1 has 3 params (12 elements), rank 0 has 2 (12)"},
        {CAPEX__SIG_NUMEL, 13, -1, 0, CAPEX_ERR_SIZE_MISMATCH, "rank 1 has 2 params (13 elements), rank 0 has 2 (12)"},
        {CAPEX__SIG_H_NUMEL, 5, -1, 0, CAPEX_ERR_SIZE_MISMATCH, "param sizes differ from rank 0's (first differing rank 1)"},
        {CAPEX__SIG_H_DTYPE, 5, -1, 0, CAPEX_ERR_SIZE_MISMATCH, "but param dtypes differ"},
        {CAPEX__SIG_H_NUMEL, 5, CAPEX__SIG_H_DTYPE, 5, CAPEX_ERR_SIZE_MISMATCH, "param sizes and dtypes differ"},
        {CAPEX__SIG_DESC + 0, 4096, -1, 0, CAPEX_ERR_CONFIG, "rank 1 has first_bucket_bytes 4096, rank 0 has 1048576"},
        {CAPEX__SIG_DESC + 2, 64, -1, 0, CAPEX_ERR_CONFIG, "rank 1 has message_size 64, rank 0 has 0"},
        {CAPEX__SIG_DESC + 3, 0, -1, 0, CAPEX_ERR_CONFIG, "rank 1 has gradient_average 0, rank 0 has 1"},
        {CAPEX__SIG_DESC + 4, 0x40000000, -1, 0, CAPEX_ERR_CONFIG, "rank 1 has gradient_predivide_factor 2, rank 0 has 1"},
        {CAPEX__SIG_DESC + 5, 1, CAPEX__SIG_DESC + 8, 0, CAPEX_ERR_CONFIG,
         "rank 1 has allreduce_always_fp32 1, rank 0 has 0; also broadcast_parameters (every rank must pass the same capex_ddp_desc)"},
        {CAPEX__SIG_DESC + 6, 1, -1, 0, CAPEX_ERR_CONFIG, "rank 1 has find_unused_parameters 1"},
        {CAPEX__SIG_DESC + 7, 1, -1, 0, CAPEX_ERR_CONFIG, "rank 1 has rebuild_buckets 1"},
    };
    capex_comm c;
    capex_ddp *g = NULL;
    capex_ddp_param p[2];
    capex_ddp_desc d;
    float x[2][8];
    size_t k;
    fake f;
    fake_comm(&c, &f, 2, 0);
    vt = *c.vt;
    vt.allgather = sig_allgather;
    c.vt = &vt;
    memset(x, 0, sizeof x);
    for (k = 0; k < 2; k++) { p[k].data = x[k]; p[k].numel = k ? 4 : 8; p[k].dtype = CAPEX_F32; p[k].grad = NULL; }
    capex_ddp_desc_init(&d);
    for (k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        capex_result r;
        sig_edit_slot = cases[k].slot;
        sig_edit_value = cases[k].value;
        sig_edit_slot2 = cases[k].slot2;
        sig_edit_value2 = cases[k].value2;
        sig_gathers = 0;
        r = capex_ddp_create(&g, &c, p, 2, &d);
        CT_CHECK(r == cases[k].want && (g != NULL) == (r == CAPEX_OK) && sig_gathers == 1 &&
                 strstr(capex_last_error(), cases[k].msg), "case %zu: %d %s", k, (int)r, capex_last_error());
        capex_ddp_destroy(g);
        g = NULL;
    }
    sig_edit_slot2 = -1;
    /* a world of 1 sends nothing */
    c.world_size = 1;
    sig_gathers = 0;
    sig_edit_slot = -2;
    CT_CHECK(capex_ddp_create(&g, &c, p, 2, &d) == CAPEX_OK && sig_gathers == 0, "world 1: %s", capex_last_error());
    capex_ddp_destroy(g);
}

CT_TEST(ddp_create_errors) {
    capex_comm c;
    capex_ddp *g = (capex_ddp *)1;
    capex_ddp_param p;
    capex_ddp_desc d;
    float x[4];
    capex_comm_init_single(&c);
    p.data = x; p.numel = 4; p.dtype = CAPEX_F32; p.grad = NULL;
    capex_ddp_desc_init(&d);
    CT_CHECK(capex_ddp_create(&g, NULL, &p, 1, &d) == CAPEX_ERR_INVALID_ARG && g == NULL, "NULL comm");
    CT_CHECK(capex_ddp_create(&g, &c, NULL, 1, &d) == CAPEX_ERR_INVALID_ARG, "NULL params");
    d.gradient_predivide_factor = 0.0f;
    CT_CHECK(capex_ddp_create(&g, &c, &p, 1, &d) == CAPEX_ERR_INVALID_ARG, "predivide 0");
    d.gradient_predivide_factor = (float)NAN;
    CT_CHECK(capex_ddp_create(&g, &c, &p, 1, &d) == CAPEX_ERR_INVALID_ARG, "predivide NaN");
    /* 1/f overflows float: the predivide made every grad Inf (and zeros NaN) */
    d.gradient_predivide_factor = 1e-39f;
    CT_CHECK(capex_ddp_create(&g, &c, &p, 1, &d) == CAPEX_ERR_INVALID_ARG && g == NULL &&
             strstr(capex_last_error(), "reciprocal"), "predivide 1e-39: %.300s", capex_last_error());
    d.gradient_predivide_factor = 3e-38f; /* 1/f = 3.3e37 still fits */
    CT_CHECK(capex_ddp_create(&g, &c, &p, 1, &d) == CAPEX_OK, "predivide 3e-38: %.300s", capex_last_error());
    capex_ddp_destroy(g);
    g = NULL;
    capex_ddp_desc_init(&d);
    d.bucket_bytes = 0;
    CT_CHECK(capex_ddp_create(&g, &c, &p, 1, &d) == CAPEX_ERR_INVALID_ARG, "zero limit");
    capex_ddp_desc_init(&d);
    p.dtype = (capex_dtype)7;
    CT_CHECK(capex_ddp_create(&g, &c, &p, 1, &d) == CAPEX_ERR_INVALID_ARG, "bad dtype");
    p.dtype = CAPEX_F32;
    CT_CHECK(capex_ddp_create(&g, &c, &p, 0, &d) == CAPEX_OK && capex_ddp_num_buckets(g) == 0, "no params is fine");
    CT_CHECK(capex_ddp_finalize(g) == CAPEX_OK, "empty finalize");
    CT_CHECK(capex_ddp_broadcast_parameters(g) == CAPEX_OK, "world 1: nothing to send");
    CT_CHECK(capex_ddp_broadcast_parameters(NULL) == CAPEX_ERR_INVALID_ARG, "NULL ddp");
    capex_ddp_destroy(g);
    { /* numel sums whose bucket byte size wraps size_t (a short bucket was accepted before) */
        capex_ddp_param ps[2];
        size_t i;
        for (i = 0; i < 2; i++) { ps[i].data = x; ps[i].numel = SIZE_MAX / 8 + 1; ps[i].dtype = CAPEX_F32; ps[i].grad = NULL; }
        capex_ddp_desc_init(&d);
        d.broadcast_parameters = 0;
        g = (capex_ddp *)1;
        CT_CHECK(capex_ddp_create(&g, &c, ps, 2, &d) == CAPEX_ERR_INVALID_ARG && g == NULL &&
                 strstr(capex_last_error(), "overflows"), "numel sum wrap: %.300s", capex_last_error());
        ps[0].numel = SIZE_MAX / 2 + 1;
        CT_CHECK(capex_ddp_create(&g, &c, ps, 1, &d) == CAPEX_ERR_INVALID_ARG, "one param wraps");
        CT_CHECK(capex_ddp_create(&g, &c, ps, SIZE_MAX / 2, &d) == CAPEX_ERR_INVALID_ARG, "param count wraps");
    }
}

/* ---------------------------------------------------- tracker (fake) -- */

#define NP 8
typedef struct rig {
    capex_comm c;
    fake f;
    capex_ddp *g;
    capex_ddp_param ps[NP];
    float data[NP][16];
    uint16_t hdata[NP][16];
} rig;

/* 8 f32 params of 16 elements (64 B); limits 128 B -> buckets of 2 params:
   bucket 0 = {7,6}, 1 = {5,4}, 2 = {3,2}, 3 = {1,0}. */
static capex_result rig_make(rig *r, int world, int async, const capex_ddp_desc *d0, capex_dtype t) {
    capex_ddp_desc d;
    size_t i;
    memset(r, 0, sizeof *r);
    fake_comm(&r->c, &r->f, world, async);
    for (i = 0; i < NP; i++) {
        r->ps[i].data = t == CAPEX_F32 ? (void *)r->data[i] : (void *)r->hdata[i];
        r->ps[i].numel = 16; r->ps[i].dtype = t; r->ps[i].grad = NULL;
    }
    if (d0) d = *d0; else capex_ddp_desc_init(&d);
    d.first_bucket_bytes = d.bucket_bytes = 16 * capex_dtype_size(t) * 2;
    {
        capex_result res = capex_ddp_create(&r->g, &r->c, r->ps, NP, &d);
        r->f.ddp = r->g;
        return res;
    }
}
static void rig_fill(rig *r, size_t p, float base) {
    size_t i;
    void *g = capex_ddp_grad(r->g, p);
    for (i = 0; i < 16; i++) capex__store(g, r->ps[p].dtype, i, base + (float)i);
}

CT_TEST(tracker_launches_in_order_during_backward) {
    rig r;
    int k;
    size_t p;
    capex_ddp_stats st;
    CT_CHECK(rig_make(&r, 4, 1, NULL, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_ddp_num_buckets(r.g) == 4, "4 buckets");
    for (p = NP; p-- > 0;) {
        rig_fill(&r, p, (float)p);
        CT_CHECK(capex_ddp_grad_ready(r.g, p) == CAPEX_OK, "%.300s", capex_last_error());
        CT_CHECK(r.f.nlaunch == (int)((NP - p) / 2), "after param %lu: %d launches", (unsigned long)p, r.f.nlaunch);
    }
    for (k = 0; k < 4; k++) CT_CHECK(r.f.launches[k] == k, "launch %d is bucket %d", k, r.f.launches[k]);
    CT_CHECK(r.f.nwait == 0, "no wait before finalize");
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_OK, "%.300s", capex_last_error());
    for (k = 0; k < 4; k++) CT_CHECK(r.f.waits[k] == k, "wait order");
    capex_ddp_get_stats(r.g, &st);
    CT_CHECK(st.launches == 4 && st.launched_in_backward == 4 && st.iterations == 1, "stats");
    /* in-flight buckets were polled from grad_ready (test says "not done":
       only the oldest one, on each of the 7 grad_ready calls after the first launch) */
    CT_CHECK(r.f.ntest == 7 && st.progress_polls == 7, "progress polls %d", r.f.ntest);
    for (p = 0; p < NP; p++) {
        float *g = (float *)capex_ddp_grad(r.g, p);
        for (k = 0; k < 16; k++) CT_CHECK(g[k] == (float)p + (float)k, "average of 4 equal grads is the grad");
    }
    capex_ddp_destroy(r.g);
}

/* grad_ready polls the in-flight buckets oldest first and stops at the first
   unfinished one; one that test reported finished is not polled again in
   that iteration (MPI_Test on it again is wasted work). It was: with B
   buckets finishing at once, about B^2/2 polls per backward. */
CT_TEST(tracker_progress_polls_each_finished_bucket_once) {
    capex_comm c;
    fake f;
    capex_ddp *g = NULL;
    capex_ddp_param ps[64];
    capex_ddp_desc d;
    capex_ddp_stats st;
    float data[64][4];
    size_t p;
    int it;
    fake_comm(&c, &f, 2, 1);
    f.test_done = 1;
    for (p = 0; p < 64; p++) { ps[p].data = data[p]; ps[p].numel = 4; ps[p].dtype = CAPEX_F32; ps[p].grad = NULL; }
    capex_ddp_desc_init(&d);
    d.first_bucket_bytes = d.bucket_bytes = 16; /* one bucket per param */
    CT_CHECK(capex_ddp_create(&g, &c, ps, 64, &d) == CAPEX_OK, "%.300s", capex_last_error());
    f.ddp = g;
    for (it = 0; it < 2; it++) {
        for (p = 64; p-- > 0;) CT_CHECK(capex_ddp_grad_ready(g, p) == CAPEX_OK, "%.300s", capex_last_error());
        CT_CHECK(capex_ddp_finalize(g) == CAPEX_OK, "%.300s", capex_last_error());
    }
    capex_ddp_get_stats(g, &st);
    CT_CHECK(f.ntest == 128 && st.progress_polls == 128, "%d polls for 2 x 64 buckets", f.ntest);
    capex_ddp_destroy(g);
}

CT_TEST(tracker_later_bucket_waits_for_earlier) {
    rig r;
    CT_CHECK(rig_make(&r, 2, 1, NULL, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
    /* bucket 2 = {3,2} fills first, then bucket 1 = {5,4}: nothing launches
       until bucket 0 = {7,6} is full; then 0, 1, 2 go in order */
    capex_ddp_grad_ready(r.g, 3); capex_ddp_grad_ready(r.g, 2);
    capex_ddp_grad_ready(r.g, 5); capex_ddp_grad_ready(r.g, 4);
    CT_CHECK(r.f.nlaunch == 0, "held back: %d", r.f.nlaunch);
    capex_ddp_grad_ready(r.g, 7);
    CT_CHECK(r.f.nlaunch == 0, "bucket 0 half full");
    capex_ddp_grad_ready(r.g, 6);
    CT_CHECK(r.f.nlaunch == 3 && r.f.launches[0] == 0 && r.f.launches[1] == 1 && r.f.launches[2] == 2, "in order");
    capex_ddp_grad_ready(r.g, 0);
    CT_CHECK(r.f.nlaunch == 3, "bucket 3 half full");
    capex_ddp_grad_ready(r.g, 1);
    CT_CHECK(r.f.nlaunch == 4 && r.f.launches[3] == 3, "last");
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_OK, "%.300s", capex_last_error());
    /* second iteration behaves the same (state reset) */
    capex_ddp_grad_ready(r.g, 6); capex_ddp_grad_ready(r.g, 7);
    CT_CHECK(r.f.nlaunch == 5 && r.f.launches[4] == 0, "iteration 2 starts over");
    capex_ddp_destroy(r.g);
}

/* A ddp destroyed mid-iteration (an error in backward, say) waits for the
   buckets already launched: their collectives (MPI_Iallreduce on host
   buffers, NCCL on device buffers, with an event to free) write into the
   buffers it frees. */
CT_TEST(tracker_destroy_waits_for_launched_buckets) {
    rig r;
    CT_CHECK(rig_make(&r, 2, 1, NULL, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
    capex_ddp_grad_ready(r.g, 7); capex_ddp_grad_ready(r.g, 6); /* bucket 0 launches */
    capex_ddp_grad_ready(r.g, 5); capex_ddp_grad_ready(r.g, 4); /* bucket 1 */
    capex_ddp_grad_ready(r.g, 3);                              /* bucket 2 half full: not launched */
    CT_CHECK(r.f.nlaunch == 2 && r.f.nwait == 0, "%d launches, %d waits", r.f.nlaunch, r.f.nwait);
    capex_ddp_destroy(r.g);
    CT_CHECK(r.f.nwait == 2 && r.f.waits[0] == 0 && r.f.waits[1] == 1, "destroy waited %d times", r.f.nwait);
}

CT_TEST(tracker_delay_allreduce_and_sync_backend) {
    rig r;
    capex_ddp_desc d;
    size_t p;
    int async;
    for (async = 0; async < 2; async++) {
        capex_ddp_desc_init(&d);
        d.delay_allreduce = async; /* sync backend: launches in backward anyway */
        CT_CHECK(rig_make(&r, 2, async, &d, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
        for (p = NP; p-- > 0;) { rig_fill(&r, p, 1.0f); capex_ddp_grad_ready(r.g, p); }
        CT_CHECK(r.f.nlaunch == (async ? 0 : 4), "async=%d: %d launches before finalize", async, r.f.nlaunch);
        CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_OK, "%.300s", capex_last_error());
        CT_CHECK(r.f.nlaunch == 4 && r.f.launches[0] == 0 && r.f.launches[3] == 3, "all 4, in order");
        CT_CHECK(r.f.nwait == (async ? 4 : 0), "waits: %d", r.f.nwait);
        capex_ddp_destroy(r.g);
        if (async) break;
    }
}

CT_TEST(tracker_predivide_and_average) {
    /* Apex: x *= 1/f before; SUM; x *= f/world after (only if averaging) */
    static const struct { int avg; float f; float expect_factor; } cases[] = {
        {1, 1.0f, 1.0f}, {1, 2.0f, 1.0f}, {1, 8.0f, 1.0f}, {0, 1.0f, 4.0f}, {0, 2.0f, 2.0f}};
    size_t ci, p, i;
    for (ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        rig r;
        capex_ddp_desc d;
        capex_ddp_desc_init(&d);
        d.gradient_average = cases[ci].avg;
        d.gradient_predivide_factor = cases[ci].f;
        CT_CHECK(rig_make(&r, 4, 1, &d, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
        for (p = NP; p-- > 0;) { rig_fill(&r, p, 16.0f * (float)p); capex_ddp_grad_ready(r.g, p); }
        CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_OK, "%.300s", capex_last_error());
        for (p = 0; p < NP; p++) {
            float *g = (float *)capex_ddp_grad(r.g, p);
            for (i = 0; i < 16; i++)
                CT_CHECK(g[i] == (16.0f * (float)p + (float)i) * cases[ci].expect_factor, "case %lu p %lu: %g",
                         (unsigned long)ci, (unsigned long)p, (double)g[i]);
        }
        capex_ddp_destroy(r.g);
    }
}

/* Where the average happens, in fp16 (design choice, pinned): Apex's default
   (predivide 1) sums first, so grads whose average fits fp16 but whose sum
   does not come back Inf (the loss scaler then skips the step and backs off);
   torch's DDP divides each grad by the world size before the allreduce,
   which gradient_predivide_factor = world_size reproduces, and
   allreduce_always_fp32 sums in f32. 40000 on 2 ranks: sum 80000 > 65504. */
CT_TEST(tracker_fp16_average_overflow_by_predivide) {
    static const struct { float f; int fp32; int finite; } cases[] = {{1.0f, 0, 0}, {2.0f, 0, 1}, {1.0f, 1, 1}};
    size_t ci, p, i;
    for (ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
        rig r;
        capex_ddp_desc d;
        capex_ddp_desc_init(&d);
        d.gradient_predivide_factor = cases[ci].f;
        d.allreduce_always_fp32 = cases[ci].fp32;
        CT_CHECK(rig_make(&r, 2, 1, &d, CAPEX_F16) == CAPEX_OK, "%.300s", capex_last_error());
        for (p = NP; p-- > 0;) {
            uint16_t *g = (uint16_t *)capex_ddp_grad(r.g, p);
            for (i = 0; i < 16; i++) g[i] = capex_f32_to_f16(40000.0f);
            CT_CHECK(capex_ddp_grad_ready(r.g, p) == CAPEX_OK, "%.300s", capex_last_error());
        }
        CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_OK, "%.300s", capex_last_error());
        for (p = 0; p < NP; p++) {
            float v = capex_f16_to_f32(((uint16_t *)capex_ddp_grad(r.g, p))[5]);
            CT_CHECK(cases[ci].finite ? v == 40000.0f : isinf(v), "case %zu: %g", ci, (double)v);
        }
        capex_ddp_destroy(r.g);
    }
}

CT_TEST(tracker_allreduce_always_fp32_with_bf16) {
    rig r;
    capex_ddp_desc d;
    size_t p, i;
    capex_ddp_desc_init(&d);
    d.allreduce_always_fp32 = 1;
    d.gradient_predivide_factor = 3.0f; /* 1/3 then 3/4 is not exact: f32 staging rounds once */
    CT_CHECK(rig_make(&r, 4, 1, &d, CAPEX_BF16) == CAPEX_OK, "%.300s", capex_last_error());
    for (p = NP; p-- > 0;) { rig_fill(&r, p, 1.0f + (float)p); capex_ddp_grad_ready(r.g, p); }
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(r.f.nlaunch == 4 && r.f.launch_dtype[0] == CAPEX_F32, "reduced in f32");
    for (p = 0; p < NP; p++) {
        uint16_t *g = (uint16_t *)capex_ddp_grad(r.g, p);
        for (i = 0; i < 16; i++) {
            float x = capex_bf16_to_f32(capex_f32_to_bf16(1.0f + (float)p + (float)i));
            float want = ((x * (float)(1.0 / 3.0)) * 4.0f) * (float)(3.0 / 4.0);
            CT_CHECK(g[i] == capex_f32_to_bf16(want), "p %lu i %lu", (unsigned long)p, (unsigned long)i);
        }
    }
    capex_ddp_destroy(r.g);
    /* without the flag the bf16 bucket goes to the comm as bf16 */
    capex_ddp_desc_init(&d);
    CT_CHECK(rig_make(&r, 4, 1, &d, CAPEX_BF16) == CAPEX_OK, "%.300s", capex_last_error());
    for (p = NP; p-- > 0;) { rig_fill(&r, p, 1.0f); capex_ddp_grad_ready(r.g, p); }
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_OK && r.f.launch_dtype[0] == CAPEX_BF16, "bf16 on the wire");
    capex_ddp_destroy(r.g);
}

CT_TEST(tracker_no_sync_accumulates) {
    rig r;
    size_t p, i;
    CT_CHECK(rig_make(&r, 4, 1, NULL, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_ddp_set_sync(r.g, 0) == CAPEX_OK, "no_sync");
    for (p = NP; p-- > 0;) { rig_fill(&r, p, 1.0f); capex_ddp_grad_ready(r.g, p); }
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_OK && r.f.nlaunch == 0, "no communication under no_sync");
    CT_CHECK(capex_ddp_set_sync(r.g, 1) == CAPEX_OK, "sync again");
    for (p = NP; p-- > 0;) {
        float *g = (float *)capex_ddp_grad(r.g, p);
        for (i = 0; i < 16; i++) g[i] += 2.0f; /* the engine accumulates */
        if (p != 3) CT_CHECK(capex_ddp_grad_ready(r.g, p) == CAPEX_OK, "ready");
    }
    /* param 3 got no grad this step but accumulated one before: mark_unused keeps it */
    CT_CHECK(capex_ddp_set_sync(r.g, 0) == CAPEX_ERR_ORDER, "sync switch mid-iteration refused");
    CT_CHECK(capex_ddp_mark_unused(r.g, 3) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_OK && r.f.nlaunch == 4, "one reduction for the accumulated grads");
    for (p = 0; p < NP; p++) {
        float *g = (float *)capex_ddp_grad(r.g, p);
        for (i = 0; i < 16; i++) CT_CHECK(g[i] == 3.0f + (float)i, "accumulated p %lu: %g", (unsigned long)p, (double)g[i]);
    }
    capex_ddp_destroy(r.g);
}

CT_TEST(tracker_unused_parameters) {
    rig r;
    capex_ddp_desc d;
    size_t p, i;
    capex_ddp_desc_init(&d);
    CT_CHECK(rig_make(&r, 4, 1, &d, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
    for (p = NP; p-- > 0;) { rig_fill(&r, p, 5.0f); if (p != 2 && p != 6) capex_ddp_grad_ready(r.g, p); }
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_ERR_ORDER, "missing params without find_unused");
    CT_CHECK(strstr(capex_last_error(), "2 parameter(s)") != NULL, "message: %.300s", capex_last_error());
    CT_CHECK(capex_ddp_mark_unused(r.g, 2) == CAPEX_OK && capex_ddp_mark_unused(r.g, 6) == CAPEX_OK, "explicit mark");
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_OK, "%.300s", capex_last_error());
    for (i = 0; i < 16; i++) CT_CHECK(((float *)capex_ddp_grad(r.g, 2))[i] == 0.0f, "unused grad is zero");
    CT_CHECK(((float *)capex_ddp_grad(r.g, 5))[3] == 8.0f, "used grad reduced");
    capex_ddp_destroy(r.g);

    d.find_unused_parameters = 1;
    CT_CHECK(rig_make(&r, 4, 1, &d, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
    for (p = NP; p-- > 0;) { rig_fill(&r, p, 5.0f); if (p != 0) capex_ddp_grad_ready(r.g, p); }
    CT_CHECK(r.f.nlaunch == 3, "bucket 3 waits for param 0");
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_OK && r.f.nlaunch == 4, "finalize marks param 0 unused");
    for (i = 0; i < 16; i++) CT_CHECK(((float *)capex_ddp_grad(r.g, 0))[i] == 0.0f, "zeroed");
    capex_ddp_destroy(r.g);
}

CT_TEST(tracker_errors) {
    rig r;
    size_t p;
    CT_CHECK(rig_make(&r, 2, 1, NULL, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_ddp_zero_grad(r.g) == CAPEX_OK, "zero_grad between iterations");
    CT_CHECK(capex_ddp_grad_ready(r.g, 7) == CAPEX_OK, "first");
    CT_CHECK(capex_ddp_grad_ready(r.g, 7) == CAPEX_ERR_ORDER, "twice in one iteration");
    /* mid-backward: a nonblocking comm may be reducing the buckets in place */
    CT_CHECK(capex_ddp_zero_grad(r.g) == CAPEX_ERR_ORDER && strstr(capex_last_error(), "finalize"),
             "zero_grad mid-backward: %.200s", capex_last_error());
    CT_CHECK(capex_ddp_mark_unused(r.g, 7) == CAPEX_ERR_ORDER, "ready then unused");
    CT_CHECK(capex_ddp_grad_ready(r.g, NP) == CAPEX_ERR_INVALID_ARG, "unknown param");
    CT_CHECK(capex_ddp_grad_ready(NULL, 0) == CAPEX_ERR_INVALID_ARG, "NULL ddp");
    CT_CHECK(capex_ddp_finalize(NULL) == CAPEX_ERR_INVALID_ARG, "NULL finalize");
    for (p = 0; p < 7; p++) capex_ddp_grad_ready(r.g, p);
    r.f.fail_wait = CAPEX_ERR_COMM;
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_ERR_COMM, "peer failure reaches finalize");
    CT_CHECK(r.c.failed, "comm poisoned");
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_ERR_COMM, "failed stays failed");
    CT_CHECK(capex_ddp_grad_ready(r.g, 0) == CAPEX_ERR_COMM, "no further use");
    /* these said ORDER ("zero between iterations, after finalize"), which can never succeed now */
    CT_CHECK(capex_ddp_zero_grad(r.g) == CAPEX_ERR_COMM && strstr(capex_last_error(), "failed"),
             "zero_grad after the failure: %.200s", capex_last_error());
    CT_CHECK(capex_ddp_set_sync(r.g, 0) == CAPEX_ERR_COMM, "set_sync after the failure: %.200s", capex_last_error());
    CT_CHECK(capex_ddp_broadcast_parameters(r.g) == CAPEX_ERR_COMM, "broadcast after the failure");
    CT_CHECK(capex_comm_barrier(&r.c) == CAPEX_ERR_COMM, "the comm refuses too");
    capex_ddp_destroy(r.g);
    /* the comm failed outside DDP (a barrier, a metrics allreduce): DDP stops too */
    CT_CHECK(rig_make(&r, 2, 1, NULL, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_ddp_grad_ready(r.g, 0) == CAPEX_OK, "healthy");
    r.c.failed = 1;
    CT_CHECK(capex_ddp_grad_ready(r.g, 1) == CAPEX_ERR_COMM && r.f.nlaunch == 0, "failed comm: no new collective");
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_ERR_COMM, "and finalize refuses");
    capex_ddp_destroy(r.g);
    CT_CHECK(rig_make(&r, 2, 1, NULL, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
    for (p = 0; p < NP; p++) capex_ddp_grad_ready(r.g, p);
    r.f.fail_wait = CAPEX_ERR_TIMEOUT;
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_ERR_TIMEOUT, "timeout reaches finalize");
    capex_ddp_destroy(r.g);
}

/* A bucket's allreduce fails to start mid-backward (its peer is gone) with
   two earlier buckets in flight: that grad_ready and every later call say
   COMM, nothing else is launched, and destroy waits for nothing on the
   failed comm and frees everything (ASan: no leak, no double free). */
CT_TEST(tracker_launch_failure_mid_backward) {
    rig r;
    size_t p;
    CT_CHECK(rig_make(&r, 2, 1, NULL, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
    r.f.fail_launch_at = 3;
    for (p = NP; p-- > 4;) CT_CHECK(capex_ddp_grad_ready(r.g, p) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_ddp_grad_ready(r.g, 3) == CAPEX_OK, "bucket 2 half full");
    CT_CHECK(capex_ddp_grad_ready(r.g, 2) == CAPEX_ERR_COMM && r.c.failed, "its launch fails: %.200s", capex_last_error());
    CT_CHECK(capex_ddp_grad_ready(r.g, 1) == CAPEX_ERR_COMM && capex_ddp_mark_unused(r.g, 0) == CAPEX_ERR_COMM, "later grads");
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_ERR_COMM && capex_ddp_zero_grad(r.g) == CAPEX_ERR_COMM &&
             capex_ddp_set_sync(r.g, 0) == CAPEX_ERR_COMM, "finalize, zero_grad, set_sync");
    CT_CHECK(r.f.nlaunch == 3 && r.f.nwait == 0, "%d launches, %d waits", r.f.nlaunch, r.f.nwait);
    capex_ddp_destroy(r.g);
    CT_CHECK(r.f.nwait == 0, "destroy waited on a failed comm");
}

CT_TEST(tracker_engine_owned_grads_are_copied) {
    capex_comm c;
    fake f;
    capex_ddp *g = NULL;
    capex_ddp_param ps[3];
    capex_ddp_desc d;
    float data[3][5], grad[3][5];
    size_t p, i;
    fake_comm(&c, &f, 2, 1);
    for (p = 0; p < 3; p++) {
        ps[p].data = data[p]; ps[p].numel = 5; ps[p].dtype = CAPEX_F32; ps[p].grad = grad[p];
        for (i = 0; i < 5; i++) grad[p][i] = (float)(p * 10 + i);
    }
    capex_ddp_desc_init(&d);
    d.gradient_average = 0;
    CT_CHECK(capex_ddp_create(&g, &c, ps, 3, &d) == CAPEX_OK, "%.300s", capex_last_error());
    f.ddp = g;
    CT_CHECK(capex_ddp_grad(g, 1) == (void *)grad[1], "engine's own pointer");
    for (p = 3; p-- > 0;) capex_ddp_grad_ready(g, p);
    CT_CHECK(capex_ddp_finalize(g) == CAPEX_OK, "%.300s", capex_last_error());
    for (p = 0; p < 3; p++) for (i = 0; i < 5; i++) CT_CHECK(grad[p][i] == 2.0f * (float)(p * 10 + i), "sum copied back");
    CT_CHECK(capex_ddp_zero_grad(g) == CAPEX_OK && grad[2][4] == 0.0f, "zero_grad zeroes engine grads");
    capex_ddp_destroy(g);
}

CT_TEST(tracker_rebuild_from_ready_order) {
    rig r;
    capex_ddp_desc d;
    capex_ddp_bucket_info bi;
    float *before[NP];
    size_t p, i;
    capex_ddp_desc_init(&d);
    d.rebuild_buckets = 1;
    d.gradient_average = 0;
    CT_CHECK(rig_make(&r, 2, 1, &d, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
    /* the engine produces grads in forward order 0..7 (not reversed) */
    for (p = 0; p < NP; p++) {
        rig_fill(&r, p, 100.0f * (float)p);
        capex_ddp_grad_ready(r.g, p);
        if (p == 5) CT_CHECK(r.f.nlaunch == 0, "planned order defeated: bucket 0 = {7,6} fills last");
    }
    CT_CHECK(r.f.nlaunch == 4, "all at the end");
    CT_CHECK(capex_ddp_layout_version(r.g) == 0, "v0");
    for (p = 0; p < NP; p++) before[p] = (float *)capex_ddp_grad(r.g, p);
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_OK, "%.300s", capex_last_error());
    CT_CHECK(capex_ddp_layout_version(r.g) == 1, "rebuilt once");
    /* the step after this finalize may use pointers taken during backward (the
       README loop): they stay valid and hold the reduced grads (ASan: no UAF) */
    for (p = 0; p < NP; p++)
        for (i = 0; i < 16; i++)
            CT_CHECK(before[p][i] == 2.0f * (100.0f * (float)p + (float)i), "old pointers keep the reduced grads");
    capex_ddp_bucket(r.g, 0, &bi);
    CT_CHECK(bi.params[0] == 0 && bi.params[1] == 1, "bucket 0 now {0,1}");
    for (p = 0; p < NP; p++)
        for (i = 0; i < 16; i++)
            CT_CHECK(((float *)capex_ddp_grad(r.g, p))[i] == 2.0f * (100.0f * (float)p + (float)i), "grads moved with the layout");
    r.f.nlaunch = 0;
    for (p = 0; p < NP; p++) { capex_ddp_grad_ready(r.g, p); if (p == 1) CT_CHECK(r.f.nlaunch == 1, "launches early now"); }
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_OK && capex_ddp_layout_version(r.g) == 1, "only once");
    capex_ddp_destroy(r.g);
}

/* The rebuild out of memory: the old layout comes back whole (the grads, the pointers the
   engine holds), finalize reports it and the ddp refuses further use; destroy frees each
   buffer once (ASan). The rollback had never run. */
CT_TEST(tracker_rebuild_out_of_memory_keeps_the_old_layout) {
    rig r;
    capex_ddp_desc d;
    capex_result res;
    float *before[NP];
    size_t p, i;
    capex_ddp_desc_init(&d);
    d.rebuild_buckets = 1;
    d.gradient_average = 0;
    CT_CHECK(rig_make(&r, 2, 1, &d, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
    for (p = 0; p < NP; p++) { rig_fill(&r, p, 100.0f * (float)p); capex_ddp_grad_ready(r.g, p); } /* forward order */
    for (p = 0; p < NP; p++) before[p] = (float *)capex_ddp_grad(r.g, p);
    g_fail_alloc_size = 16 * sizeof(float) * 2; /* a new bucket's buffer */
    res = capex_ddp_finalize(r.g);
    CT_CHECK(g_fail_alloc_size == 0, "no allocation of that size came (the test is wrong)");
    g_fail_alloc_size = 0;
    CT_CHECK(res == CAPEX_ERR_OUT_OF_MEMORY, "finalize: %s (%.300s)", capex_result_string(res), capex_last_error());
    CT_CHECK(capex_ddp_layout_version(r.g) == 0, "layout version %d", capex_ddp_layout_version(r.g));
    for (p = 0; p < NP; p++) {
        CT_CHECK(capex_ddp_grad(r.g, p) == (void *)before[p], "param %zu: its grad moved", p);
        for (i = 0; i < 16; i++)
            CT_CHECK(before[p][i] == 2.0f * (100.0f * (float)p + (float)i), "param %zu: reduced grad %g", p, (double)before[p][i]);
        if (ct->failed) break;
    }
    CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_ERR_COMM, "a failed ddp was used again: %.300s", capex_last_error());
    capex_ddp_destroy(r.g);
}

/* A param only marked unused under no_sync accumulated nothing (torch's
   local_used_map counts a param used only when its grad hook fired): in the
   sync iteration where it is unused again its grad counts as zero, as when
   the no_sync micro-step is left out. finalize under no_sync counted every
   ready param as accumulated, mark_unused ones too, so a stale grad (the
   last step's, not zeroed) was reduced instead. */
CT_TEST(tracker_mark_unused_under_no_sync_accumulates_nothing) {
    int with_micro;
    float got[2];
    for (with_micro = 0; with_micro < 2; with_micro++) {
        rig r;
        capex_ddp_desc d;
        size_t p;
        capex_ddp_desc_init(&d);
        d.find_unused_parameters = with_micro; /* the sync step below: explicit mark, then implicit */
        CT_CHECK(rig_make(&r, 4, 1, &d, CAPEX_F32) == CAPEX_OK, "%.300s", capex_last_error());
        for (p = NP; p-- > 0;) { rig_fill(&r, p, 5.0f); capex_ddp_grad_ready(r.g, p); }
        CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_OK, "%.300s", capex_last_error());
        /* no zero_grad: the grads accumulate on top of the last reduced ones */
        if (with_micro) {
            CT_CHECK(capex_ddp_set_sync(r.g, 0) == CAPEX_OK, "no_sync");
            for (p = NP; p-- > 0;)
                CT_CHECK((p == 2 ? capex_ddp_mark_unused(r.g, p) : capex_ddp_grad_ready(r.g, p)) == CAPEX_OK, "%.300s",
                         capex_last_error());
            CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_OK, "%.300s", capex_last_error());
            CT_CHECK(capex_ddp_set_sync(r.g, 1) == CAPEX_OK, "sync");
        }
        for (p = NP; p-- > 0;) if (p != 2) capex_ddp_grad_ready(r.g, p);
        if (!with_micro) CT_CHECK(capex_ddp_mark_unused(r.g, 2) == CAPEX_OK, "%.300s", capex_last_error());
        CT_CHECK(capex_ddp_finalize(r.g) == CAPEX_OK, "%.300s", capex_last_error());
        got[with_micro] = ((float *)capex_ddp_grad(r.g, 2))[3];
        CT_CHECK(((float *)capex_ddp_grad(r.g, 5))[3] == 8.0f, "used grads keep accumulating: %g",
                 (double)((float *)capex_ddp_grad(r.g, 5))[3]);
        capex_ddp_destroy(r.g);
    }
    CT_CHECK(got[0] == 0.0f && got[1] == 0.0f, "unused in every micro-step: grad %g without the no_sync step, %g with it",
             (double)got[0], (double)got[1]);
}

/* Random DDP runs (world 1/2/4, 0-6 params of f32/bf16, some empty, views or
   engine-owned grads, random limits, message_size, delay, average,
   predivide 1/2, always_fp32, find_unused, rebuild) of 6 iterations each:
   random sync switches, each param ready (after adding small integers),
   marked unused or (find_unused) left out, in a random order; zero_grad
   half the time. A model of the grads: ready = what the engine wrote,
   unused in a synced step = zero unless it got grads under no_sync, then
   x / f * world (* f / world when averaging). Fails on the mark_unused under
   no_sync bug (trial 3). */
static uint64_t rnd_state;
static unsigned rnd(unsigned n) {
    rnd_state ^= rnd_state << 13; rnd_state ^= rnd_state >> 7; rnd_state ^= rnd_state << 17;
    return (unsigned)(rnd_state % n);
}
CT_TEST(tracker_random_calls_against_a_model) {
    static float data[6][40], eng[6][40];
    int trial;
    rnd_state = 88172645463325252ull;
    for (trial = 0; trial < 3000; trial++) {
        capex_comm c;
        fake f;
        capex_ddp *g = NULL;
        capex_ddp_desc d;
        capex_ddp_param ps[6];
        capex_dtype dts[6];
        size_t np = rnd(7), p, i, numel[6];
        double V[6][40];
        unsigned char accum[6];
        int W = 1 << rnd(3), engine = (int)rnd(2), it, sync = 1;
        float fac;
        fake_comm(&c, &f, W, (int)rnd(2));
        capex_ddp_desc_init(&d);
        d.first_bucket_bytes = 1 + rnd(100);
        d.bucket_bytes = 1 + rnd(200);
        if (rnd(4) == 0) d.message_size = 1 + rnd(30);
        d.delay_allreduce = (int)rnd(2);
        d.gradient_average = (int)rnd(2);
        fac = rnd(2) ? 1.0f : 2.0f;
        d.gradient_predivide_factor = fac;
        d.allreduce_always_fp32 = (int)rnd(2);
        d.find_unused_parameters = (int)rnd(2);
        d.rebuild_buckets = (int)rnd(2);
        for (p = 0; p < np; p++) {
            numel[p] = rnd(4) == 0 ? 0 : 1 + rnd(37);
            dts[p] = rnd(3) == 0 ? CAPEX_BF16 : CAPEX_F32;
            ps[p].data = data[p]; ps[p].numel = numel[p]; ps[p].dtype = dts[p]; ps[p].grad = engine ? eng[p] : NULL;
            memset(eng[p], 0, sizeof eng[p]);
            for (i = 0; i < 40; i++) V[p][i] = 0;
            accum[p] = 0;
        }
        CT_CHECK(capex_ddp_create(&g, &c, ps, np, &d) == CAPEX_OK, "trial %d: %.300s", trial, capex_last_error());
        f.ddp = g;
        for (it = 0; it < 6; it++) {
            size_t order[6];
            unsigned char act[6]; /* 0 ready, 1 mark_unused, 2 left out (find_unused) */
            if (rnd(3) == 0) { sync = !sync; CT_CHECK(capex_ddp_set_sync(g, sync) == CAPEX_OK, "set_sync"); }
            for (p = 0; p < np; p++) { order[p] = p; act[p] = (unsigned char)rnd(d.find_unused_parameters ? 3 : 2); }
            for (p = np; p > 1; p--) { size_t j = rnd((unsigned)p), t = order[p - 1]; order[p - 1] = order[j]; order[j] = t; }
            for (i = 0; i < np; i++) {
                size_t q = order[i], k;
                void *gv = engine ? (void *)eng[q] : capex_ddp_grad(g, q);
                if (act[q] == 1) CT_CHECK(capex_ddp_mark_unused(g, q) == CAPEX_OK, "trial %d: %.300s", trial, capex_last_error());
                if (act[q] != 0) continue;
                for (k = 0; k < numel[q]; k++) {
                    capex__store(gv, dts[q], k, capex__load(gv, dts[q], k) + (float)((int)rnd(9) - 4));
                    V[q][k] = capex__load(gv, dts[q], k);
                }
                CT_CHECK(capex_ddp_grad_ready(g, q) == CAPEX_OK, "trial %d: %.300s", trial, capex_last_error());
                if (!sync) accum[q] = 1;
            }
            CT_CHECK(capex_ddp_finalize(g) == CAPEX_OK, "trial %d it %d: %.300s", trial, it, capex_last_error());
            for (p = 0; sync && p < np; p++) {
                void *gv = capex_ddp_grad(g, p);
                for (i = 0; i < numel[p]; i++) {
                    double want = (act[p] != 0 && !accum[p] ? 0.0 : V[p][i]) / fac * W, got = capex__load(gv, dts[p], i);
                    if (d.gradient_average) want = want * fac / W;
                    CT_CHECK(fabs(got - want) <= 0.02 * fabs(want), "trial %d it %d param %lu [%lu]: %g, want %g", trial, it, (unsigned long)p, (unsigned long)i,
                             got, want);
                    V[p][i] = got; /* carry its rounding */
                }
                accum[p] = 0;
            }
            if (rnd(2) == 0) {
                CT_CHECK(capex_ddp_zero_grad(g) == CAPEX_OK, "zero_grad: %.300s", capex_last_error());
                for (p = 0; p < np; p++) for (i = 0; i < numel[p]; i++) V[p][i] = 0;
            }
        }
        capex_ddp_destroy(g);
    }
}

/* ---------------------------------------------------- single comm -- */

CT_TEST(comm_single_and_errors) {
    capex_comm c;
    float a[4] = {1, 2, 3, 4}, b[4] = {0, 0, 0, 0}, g[4];
    uint16_t h[2] = {0x3c00, 0x4000};
    CT_CHECK(capex_comm_init_single(&c) == CAPEX_OK && c.world_size == 1 && c.rank == 0, "init");
    CT_CHECK(capex_comm_allreduce(&c, a, b, 4, CAPEX_F32, CAPEX_REDUCE_SUM) == CAPEX_OK && b[3] == 4.0f, "sum copy");
    CT_CHECK(capex_comm_allreduce(&c, h, h, 2, CAPEX_F16, CAPEX_REDUCE_AVG) == CAPEX_OK && h[1] == 0x4000, "avg in place");
    CT_CHECK(capex_comm_broadcast(&c, a, 4, CAPEX_F32, 0) == CAPEX_OK && a[0] == 1.0f, "broadcast");
    CT_CHECK(capex_comm_allgather(&c, a, g, 4, CAPEX_F32) == CAPEX_OK && g[2] == 3.0f, "allgather");
    CT_CHECK(capex_comm_barrier(&c) == CAPEX_OK, "barrier");
    CT_CHECK(capex_comm_allreduce(&c, a, b, 0, CAPEX_F32, CAPEX_REDUCE_SUM) == CAPEX_OK, "count 0");
    CT_CHECK(capex_comm_allreduce(&c, NULL, b, 4, CAPEX_F32, CAPEX_REDUCE_SUM) == CAPEX_ERR_INVALID_ARG, "NULL");
    CT_CHECK(capex_comm_allreduce(&c, a, b, 4, (capex_dtype)9, CAPEX_REDUCE_SUM) == CAPEX_ERR_INVALID_ARG, "dtype");
    CT_CHECK(capex_comm_allreduce(&c, a, b, 4, CAPEX_F32, (capex_reduce_op)5) == CAPEX_ERR_INVALID_ARG, "op");
    CT_CHECK(capex_comm_broadcast(&c, a, 4, CAPEX_F32, 1) == CAPEX_ERR_INVALID_ARG, "root out of range");
    CT_CHECK(capex_comm_barrier(NULL) == CAPEX_ERR_INVALID_ARG, "NULL comm");
    /* element counts whose byte size wraps size_t (the copy was short before) */
    CT_CHECK(capex_comm_allreduce(&c, a, b, SIZE_MAX / 2 + 1, CAPEX_F32, CAPEX_REDUCE_SUM) == CAPEX_ERR_INVALID_ARG &&
             strstr(capex_last_error(), "overflows"), "allreduce wrap: %.300s", capex_last_error());
    CT_CHECK(capex_comm_allreduce(&c, a, b, SIZE_MAX / 8 + 1, CAPEX_I64, CAPEX_REDUCE_SUM) == CAPEX_ERR_INVALID_ARG,
             "int64 wrap");
    CT_CHECK(capex_comm_broadcast(&c, a, SIZE_MAX, CAPEX_F16, 0) == CAPEX_ERR_INVALID_ARG, "broadcast wrap");
    CT_CHECK(capex_comm_allgather(&c, a, g, SIZE_MAX / 4 + 1, CAPEX_F32) == CAPEX_ERR_INVALID_ARG, "allgather wrap");
    CT_CHECK(capex_comm_allreduce(&c, a, b, 4, CAPEX_F32, CAPEX_REDUCE_SUM) == CAPEX_OK, "usable after");
    { /* reduce-scatter / allgatherv: float64 reference, then the argument checks */
        char why[400] = "";
        size_t one[1] = {4}, zero[1] = {0}, wrap[1] = {SIZE_MAX / 4 + 1};
        int line = shards_check_all(&c, 12345, why, sizeof why);
        CT_CHECK(line == 0, "single comm shards (dist_shards.h:%d): %s", line, why);
        CT_CHECK(capex_comm_reduce_scatter(&c, a, b, NULL, CAPEX_F32, CAPEX_REDUCE_SUM) == CAPEX_ERR_INVALID_ARG &&
                 strstr(capex_last_error(), "counts"), "RS counts NULL");
        CT_CHECK(capex_comm_reduce_scatter(&c, a, b, one, (capex_dtype)9, CAPEX_REDUCE_SUM) == CAPEX_ERR_INVALID_ARG, "RS dtype");
        CT_CHECK(capex_comm_reduce_scatter(&c, a, b, one, CAPEX_F32, (capex_reduce_op)7) == CAPEX_ERR_INVALID_ARG, "RS op");
        CT_CHECK(capex_comm_reduce_scatter(&c, a, b, one, CAPEX_I64, CAPEX_REDUCE_AVG) == CAPEX_ERR_INVALID_ARG, "RS avg i64");
        CT_CHECK(capex_comm_reduce_scatter(&c, NULL, b, one, CAPEX_F32, CAPEX_REDUCE_SUM) == CAPEX_ERR_INVALID_ARG, "RS send");
        CT_CHECK(capex_comm_reduce_scatter(&c, a, NULL, one, CAPEX_F32, CAPEX_REDUCE_SUM) == CAPEX_ERR_INVALID_ARG, "RS recv");
        CT_CHECK(capex_comm_reduce_scatter(&c, NULL, NULL, zero, CAPEX_F32, CAPEX_REDUCE_SUM) == CAPEX_OK, "RS empty");
        CT_CHECK(capex_comm_reduce_scatter(&c, a, b, wrap, CAPEX_F32, CAPEX_REDUCE_SUM) == CAPEX_ERR_INVALID_ARG &&
                 strstr(capex_last_error(), "overflows"), "RS wrap: %.300s", capex_last_error());
        CT_CHECK(capex_comm_allgatherv(&c, a, g, NULL, CAPEX_F32) == CAPEX_ERR_INVALID_ARG, "AGV counts NULL");
        CT_CHECK(capex_comm_allgatherv(&c, a, g, one, (capex_dtype)9) == CAPEX_ERR_INVALID_ARG, "AGV dtype");
        CT_CHECK(capex_comm_allgatherv(&c, NULL, g, one, CAPEX_F32) == CAPEX_ERR_INVALID_ARG, "AGV send");
        CT_CHECK(capex_comm_allgatherv(&c, a, NULL, one, CAPEX_F32) == CAPEX_ERR_INVALID_ARG, "AGV recv");
        CT_CHECK(capex_comm_allgatherv(&c, NULL, NULL, zero, CAPEX_F32) == CAPEX_OK, "AGV empty");
        CT_CHECK(capex_comm_allgatherv(&c, a, g, wrap, CAPEX_F32) == CAPEX_ERR_INVALID_ARG &&
                 strstr(capex_last_error(), "overflows"), "AGV wrap");
        CT_CHECK(capex_comm_allgatherv(NULL, a, g, one, CAPEX_F32) == CAPEX_ERR_INVALID_ARG, "AGV NULL comm");
    }
    capex_comm_destroy(&c);
    CT_CHECK(capex_comm_barrier(&c) == CAPEX_ERR_INVALID_ARG, "destroyed");
#ifndef CAPEX_MPI
    CT_CHECK(capex_comm_init_mpi_world(&c) == CAPEX_ERR_NO_MPI, "no MPI in this build");
    CT_CHECK(strstr(capex_last_error(), "CAPEX_MPI") != NULL, "says how: %.300s", capex_last_error());
#endif
    CT_CHECK(capex_dist_now() > 0.0, "clock");
}

/* --------------------------------------------------------- rendezvous -- */


/* child exit code: 0 ok with the right blob, 1 wrong blob, else 10 - result */
static int rdv_child(int port, int rank, int world, uint64_t nonce, double timeout, double delay) {
    capex_rendezvous_desc d;
    unsigned char blob[128];
    capex_result r;
    size_t i;
    if (delay > 0) capex__sleep_s(delay);
    capex_rendezvous_desc_init(&d);
    d.addr = "127.0.0.1"; d.port = port; d.rank = rank; d.world_size = world; d.nonce = nonce; d.timeout_s = timeout;
    d.retry_interval_s = 0.02;
    memset(blob, 0, sizeof blob);
    r = capex_rendezvous_broadcast(&d, blob, sizeof blob);
    if (r != CAPEX_OK) return 10 - (int)r;
    for (i = 0; i < sizeof blob; i++) if (blob[i] != (unsigned char)(i * 7 + 3)) return 1;
    return 0;
}

typedef struct spec { int rank; uint64_t nonce; int world; double delay; double timeout; } spec;

/* Forks one child per spec; runs rank 0 here (if root_timeout > 0); returns
   rank 0's result and the children's exit codes. */
static capex_result rdv_run(const spec *sp, int n, int world, double root_timeout, double root_delay, int *codes) {
    pid_t pids[8];
    int port = free_port(), i;
    capex_result r = CAPEX_OK;
    uint64_t nonce = capex_rendezvous_nonce("run-A");
    fflush(stdout);
    for (i = 0; i < n; i++) {
        pids[i] = fork();
        if (pids[i] == 0) _exit(rdv_child(port, sp[i].rank, sp[i].world, sp[i].nonce, sp[i].timeout > 0 ? sp[i].timeout : CT_HANG_GUARD_S, sp[i].delay));
    }
    if (root_timeout > 0) {
        capex_rendezvous_desc d;
        unsigned char blob[128];
        size_t k;
        if (root_delay > 0) capex__sleep_s(root_delay);
        for (k = 0; k < sizeof blob; k++) blob[k] = (unsigned char)(k * 7 + 3);
        capex_rendezvous_desc_init(&d);
        d.addr = "127.0.0.1"; d.port = port; d.rank = 0; d.world_size = world; d.nonce = nonce; d.timeout_s = root_timeout;
        r = capex_rendezvous_broadcast(&d, blob, sizeof blob);
    }
    for (i = 0; i < n; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 100;
    }
    return r;
}

#define RUN_A capex_rendezvous_nonce("run-A")
#define CODE(res) (10 - (int)(res))

CT_TEST(rendezvous_success_and_late_ranks) {
    int codes[8], i;
    spec s[3];
    capex_result r;
    memset(s, 0, sizeof s);
    for (i = 0; i < 3; i++) { s[i].rank = i + 1; s[i].nonce = RUN_A; s[i].world = 4; s[i].delay = 0; }
    r = rdv_run(s, 3, 4, CT_HANG_GUARD_S, 0, codes);
    CT_CHECK(r == CAPEX_OK, "rank 0: %s %.300s", capex_result_string(r), capex_last_error());
    for (i = 0; i < 3; i++) CT_CHECK(codes[i] == 0, "rank %d exit %d", i + 1, codes[i]);
    /* a late peer (0.4 s) and a late rank 0 (0.3 s: peers retry) */
    s[1].delay = 0.4;
    r = rdv_run(s, 3, 4, CT_HANG_GUARD_S, 0.3, codes);
    CT_CHECK(r == CAPEX_OK, "late ranks: %s %.300s", capex_result_string(r), capex_last_error());
    for (i = 0; i < 3; i++) CT_CHECK(codes[i] == 0, "late: rank %d exit %d", i + 1, codes[i]);
}

CT_TEST(rendezvous_wrong_nonce_is_refused) {
    int codes[8];
    spec s[2];
    capex_result r;
    memset(s, 0, sizeof s);
    /* a foreign peer (wrong nonce) and the real rank 1: the foreign one gets
       CAPEX_ERR_COMM, the run itself succeeds */
    s[0].rank = 1; s[0].nonce = capex_rendezvous_nonce("run-B"); s[0].world = 2; s[0].delay = 0;
    s[1].rank = 1; s[1].nonce = RUN_A; s[1].world = 2; s[1].delay = 0.3;
    r = rdv_run(s, 2, 2, CT_HANG_GUARD_S, 0, codes);
    CT_CHECK(r == CAPEX_OK, "rank 0: %s %.300s", capex_result_string(r), capex_last_error());
    CT_CHECK(codes[0] == CODE(CAPEX_ERR_COMM), "foreign peer exit %d", codes[0]);
    CT_CHECK(codes[1] == 0, "real peer exit %d", codes[1]);
    /* only a foreign peer: rank 0 times out, naming the refusal (3 s: the
       forked peer must have connected by then on a loaded machine) */
    r = rdv_run(s, 1, 2, 3.0, 0, codes);
    CT_CHECK(r == CAPEX_ERR_TIMEOUT && strstr(capex_last_error(), "1 foreign"), "%s %.300s", capex_result_string(r), capex_last_error());
    CT_CHECK(codes[0] == CODE(CAPEX_ERR_COMM), "foreign peer exit %d", codes[0]);
}

/* Version 1 hellos (builds whose TCP comm headers carry no dtype/op and
   whose barrier rank 0 does not open) are refused at the rendezvous: such a
   rank would otherwise fail a later reduction as a dtype or op mismatch, or
   wait out a barrier. So are version 2 hellos (no root in a broadcast's
   headers, no ring announcements: a broadcast would wait out its deadline)
   and version 3 ones (no byte count in a broadcast's word to rank 0). */
CT_TEST(rendezvous_refuses_the_version_1_wire_format) {
    unsigned char hello[32];
    capex_rendezvous_desc f;
    uint32_t rk = 0, wd = 0;
    capex_rendezvous_desc_init(&f);
    f.rank = 1; f.world_size = 2; f.nonce = RUN_A;
    capex__rdv_put_hello(hello, &f, 128);
    CT_CHECK(capex__rdv_parse_hello(hello, 32, RUN_A, 2, 128, &rk, &wd) == CAPEX__RDV_OK && rk == 1, "own hello");
    capex__put32(hello + 4, 1u);
    CT_CHECK(capex__rdv_parse_hello(hello, 32, RUN_A, 2, 128, &rk, &wd) == CAPEX__RDV_BAD_PROTO, "a version 1 hello");
    capex__put32(hello + 4, 2u); /* its broadcasts send no root, nor its ring collectives an announcement */
    CT_CHECK(capex__rdv_parse_hello(hello, 32, RUN_A, 2, 128, &rk, &wd) == CAPEX__RDV_BAD_PROTO, "a version 2 hello");
    capex__put32(hello + 4, 3u); /* its broadcast words carry no byte count */
    CT_CHECK(capex__rdv_parse_hello(hello, 32, RUN_A, 2, 128, &rk, &wd) == CAPEX__RDV_BAD_PROTO, "a version 3 hello");
    CT_CHECK(capex__rdv_parse_hello(hello, 5, RUN_A, 2, 128, &rk, &wd) == CAPEX__RDV_BAD_PROTO, "refused at its 5th byte");
}

CT_TEST(rendezvous_missing_rank_times_out) {
    int codes[8];
    spec s[1];
    capex_result r;
    memset(s, 0, sizeof s);
    s[0].rank = 1; s[0].nonce = RUN_A; s[0].world = 3; s[0].delay = 0;
    r = rdv_run(s, 1, 3, 3.0, 0, codes); /* 3 s: rank 1 must have joined by then, or it is named missing too */
    CT_CHECK(r == CAPEX_ERR_TIMEOUT, "rank 0: %s", capex_result_string(r));
    CT_CHECK(strstr(capex_last_error(), "missing: 2") != NULL, "names the missing rank: %.300s", capex_last_error());
    CT_CHECK(codes[0] == CODE(CAPEX_ERR_COMM), "rank 1 learns rank 0 gave up: exit %d", codes[0]);
    /* no rank 0 at all: the peer times out by itself */
    s[0].timeout = 1.0;
    r = rdv_run(s, 1, 3, 0, 0, codes);
    CT_CHECK(codes[0] == CODE(CAPEX_ERR_TIMEOUT), "lonely peer exit %d", codes[0]);
}

CT_TEST(rendezvous_bad_peer_of_this_run_fails) {
    int codes[8];
    spec s[1];
    capex_result r;
    memset(s, 0, sizeof s);
    s[0].rank = 1; s[0].nonce = RUN_A; s[0].world = 3; s[0].delay = 0; /* world 3 vs rank 0's 2 */
    r = rdv_run(s, 1, 2, CT_HANG_GUARD_S, 0, codes);
    CT_CHECK(r == CAPEX_ERR_COMM && strstr(capex_last_error(), "world size"), "%s %.300s", capex_result_string(r), capex_last_error());
    CT_CHECK(codes[0] == CODE(CAPEX_ERR_COMM), "peer exit %d", codes[0]);
    {
        spec t[2];
        memset(t, 0, sizeof t);
        t[0].rank = 1; t[0].nonce = RUN_A; t[0].world = 3; t[0].delay = 0;
        t[1].rank = 1; t[1].nonce = RUN_A; t[1].world = 3; t[1].delay = 0.2; /* two processes claim rank 1 */
        r = rdv_run(t, 2, 3, CT_HANG_GUARD_S, 0, codes);
        CT_CHECK(r == CAPEX_ERR_COMM && strstr(capex_last_error(), "already"), "%s %.300s", capex_result_string(r), capex_last_error());
    }
}

CT_TEST(rendezvous_arguments) {
    capex_rendezvous_desc d;
    unsigned char b[4];
    capex_rendezvous_desc_init(&d);
    CT_CHECK(capex_rendezvous_broadcast(&d, b, 4) == CAPEX_OK, "world 1 is a no-op");
    CT_CHECK(capex_rendezvous_broadcast(NULL, b, 4) == CAPEX_ERR_INVALID_ARG, "NULL desc");
    d.world_size = 2; d.rank = 2;
    CT_CHECK(capex_rendezvous_broadcast(&d, b, 4) == CAPEX_ERR_INVALID_ARG, "rank >= world");
    d.rank = 1;
    CT_CHECK(capex_rendezvous_broadcast(&d, NULL, 4) == CAPEX_ERR_INVALID_ARG, "NULL blob");
    d.port = 0;
    CT_CHECK(capex_rendezvous_broadcast(&d, b, 4) == CAPEX_ERR_CONFIG, "port 0");
    d.port = 1234; d.addr = "";
    CT_CHECK(capex_rendezvous_broadcast(&d, b, 4) == CAPEX_ERR_CONFIG, "no address");
    d.addr = "127.0.0.1"; d.timeout_s = 0;
    CT_CHECK(capex_rendezvous_broadcast(&d, b, 4) == CAPEX_ERR_INVALID_ARG, "timeout 0");
    d.timeout_s = 1; d.addr = "no.such.host.invalid";
    CT_CHECK(capex_rendezvous_broadcast(&d, b, 4) == CAPEX_ERR_COMM, "unresolvable");
    CT_CHECK(capex_rendezvous_nonce("a") != capex_rendezvous_nonce("b") && capex_rendezvous_nonce(NULL) == capex_rendezvous_nonce(""), "nonce");
}

CT_TEST(broadcast_blob_bootstrap) {
    capex_dist_env env;
    capex_comm c;
    unsigned char id[128];
    int port = free_port(), st = 0;
    size_t k;
    pid_t pid;
    kv t[] = {{NULL, NULL}};
    CT_CHECK(read_env(t, &env) == CAPEX_OK, "env");
    capex_comm_init_single(&c);
    CT_CHECK(capex_dist_broadcast_blob(&env, &c, id, sizeof id, 1.0) == CAPEX_OK, "world 1: nothing to do");
    CT_CHECK(capex_dist_broadcast_blob(NULL, NULL, id, sizeof id, 1.0) == CAPEX_ERR_INVALID_ARG, "nothing given");
    env.world_size = 2;
    CT_CHECK(capex_dist_broadcast_blob(&env, NULL, id, sizeof id, 1.0) == CAPEX_ERR_CONFIG, "no MASTER_ADDR");
    /* two processes over the TCP rendezvous, as capex_cuda.h does for NCCL */
    strcpy(env.master_addr, "127.0.0.1");
    env.master_port = port;
    strcpy(env.run_id, "blob-run");
    fflush(stdout);
    pid = fork();
    if (pid == 0) {
        env.rank = 1;
        memset(id, 0, sizeof id);
        if (capex_dist_broadcast_blob(&env, NULL, id, sizeof id, CT_HANG_GUARD_S) != CAPEX_OK) _exit(2);
        for (k = 0; k < sizeof id; k++) if (id[k] != (unsigned char)(255 - k)) _exit(3);
        _exit(0);
    }
    env.rank = 0;
    for (k = 0; k < sizeof id; k++) id[k] = (unsigned char)(255 - k);
    CT_CHECK(capex_dist_broadcast_blob(&env, NULL, id, sizeof id, CT_HANG_GUARD_S) == CAPEX_OK, "%.300s", capex_last_error());
    waitpid(pid, &st, 0);
    CT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 1 got the blob (exit %d)", WEXITSTATUS(st));
}

/* A size whose word count wraps ((size + 3) / 4 near SIZE_MAX) is refused,
   not copied into a one-word buffer, on rank 0 and on the others. */
CT_TEST(broadcast_blob_size_that_wraps) {
    capex_comm c;
    fake f;
    unsigned char id[16];
    size_t bad[3] = {SIZE_MAX, SIZE_MAX - 1, SIZE_MAX - 2};
    int rank, i;
    for (rank = 0; rank < 2; rank++)
        for (i = 0; i < 3; i++) {
            fake_comm(&c, &f, 2, 0);
            c.rank = rank;
            CT_CHECK(capex_dist_broadcast_blob(NULL, &c, id, bad[i], 1.0) == CAPEX_ERR_INVALID_ARG &&
                         strstr(capex_last_error(), "overflow"),
                     "rank %d, size SIZE_MAX - %d: %.200s", rank, i, capex_last_error());
        }
}

/* ------------------------------------------------ rendezvous flood -- */

/* Stray clients of MASTER_PORT, as an outside probe opened them: idle,
   trickling a valid-looking prefix, garbage, a foreign run's hello. The
   first connection waits until rank 0 listens; the rest do not wait. */
static int flood_open(int port, int n, int *fds) {
    struct sockaddr_in a;
    unsigned char hello[32];
    capex_rendezvous_desc f;
    double until = capex_dist_now() + CT_HANG_GUARD_S; /* until rank 0 listens */
    int i, k = 0;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_port = htons((unsigned short)port);
    a.sin_addr.s_addr = htonl(0x7f000001u);
    capex_rendezvous_desc_init(&f);
    f.rank = 1; f.world_size = 2; f.nonce = capex_rendezvous_nonce("run-B");
    capex__rdv_put_hello(hello, &f, 128);
    while (k < n) {
        int s = socket(AF_INET, SOCK_STREAM, 0);
        if (s < 0) break;
        if (k > 0) fcntl(s, F_SETFL, fcntl(s, F_GETFL, 0) | O_NONBLOCK);
        if (connect(s, (struct sockaddr *)&a, sizeof a) != 0 && errno != EINPROGRESS) {
            close(s);
            if (k > 0 || capex_dist_now() > until) break;
            capex__sleep_s(0.01); /* rank 0 not listening yet */
            continue;
        }
        fds[k++] = s;
    }
    for (i = 0; i < k; i++) {
        struct pollfd pf;
        pf.fd = fds[i]; pf.events = POLLOUT; pf.revents = 0;
        if (i % 5 == 0 || poll(&pf, 1, 50) != 1) continue;  /* idle */
        if (i % 5 == 1) (void)send(fds[i], hello, 6, MSG_NOSIGNAL);      /* valid prefix, then nothing */
        if (i % 5 == 2) (void)send(fds[i], "GET / HTTP/1.0\r\n\r\n", 18, MSG_NOSIGNAL);
        if (i % 5 == 3) (void)send(fds[i], hello, 32, MSG_NOSIGNAL);     /* another run */
        if (i % 5 == 4) (void)send(fds[i], hello, 1, MSG_NOSIGNAL);
    }
    return k;
}

/* One real rank: mode 0 the blob rendezvous, mode 1 TCP comm + allreduce. */
static int flood_rank(int mode, int port, int rank, int world) {
    if (mode == 0) {
        capex_rendezvous_desc d;
        unsigned char blob[128];
        size_t k;
        capex_rendezvous_desc_init(&d);
        d.addr = "127.0.0.1"; d.port = port; d.rank = rank; d.world_size = world; d.nonce = RUN_A; d.timeout_s = CT_HANG_GUARD_S;
        d.retry_interval_s = 0.02;
        for (k = 0; k < sizeof blob; k++) blob[k] = rank ? 0 : (unsigned char)(k * 7 + 3);
        if (capex_rendezvous_broadcast(&d, blob, sizeof blob) != CAPEX_OK) return 2;
        for (k = 0; k < sizeof blob; k++) if (blob[k] != (unsigned char)(k * 7 + 3)) return 3;
    } else {
        capex_dist_env env;
        capex_comm c;
        float x = (float)(rank + 1);
        memset(&env, 0, sizeof env);
        env.rank = rank; env.world_size = world; env.local_rank = rank; env.local_world_size = world;
        strcpy(env.master_addr, "127.0.0.1");
        env.master_port = port;
        strcpy(env.run_id, "run-A");
        if (capex_comm_init_tcp(&c, &env, CT_HANG_GUARD_S) != CAPEX_OK) return 4;
        c.timeout_s = CT_HANG_GUARD_S;
        if (capex_comm_allreduce(&c, &x, &x, 1, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_OK) return 5;
        capex_comm_destroy(&c);
        if (x != (float)(world * (world + 1) / 2)) return 6;
    }
    return 0;
}

/* Rank 0 starts, `strays` connections arrive, then the other ranks; *codes
   gets exit codes. Rank 0 gives a connection longer than the hang guard to
   send its hello, and the strays stay open until every rank is done: the
   ranks join only if rank 0 serves them while the idle strays wait (the old
   rank 0 served one connection at a time, each until its budget ran out:
   with this budget, until its deadline). No clock involved. */
static void flood_run(int mode, int world, int strays, int *opened, int *codes) {
    pid_t pids[8];
    int port = free_port(), fds[128], nf, i;
    fflush(stdout);
    pids[0] = fork();
    if (pids[0] == 0) {
        g_rdv_hello_budget_s = 10 * CT_HANG_GUARD_S;
        _exit(flood_rank(mode, port, 0, world));
    }
    nf = flood_open(port, strays, fds);
    for (i = 1; i < world; i++) {
        pids[i] = fork();
        if (pids[i] == 0) _exit(flood_rank(mode, port, i, world));
    }
    for (i = 0; i < world; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 100;
    }
    for (i = 0; i < nf; i++) close(fds[i]);
    *opened = nf;
}

CT_TEST(rendezvous_flood_of_stray_connections) {
    int codes[8], opened = 0, i;
    /* 50 strays, then a 2-rank blob rendezvous (the old code, serving one
       connection at a time, timed out) */
    flood_run(0, 2, 50, &opened, codes);
    CT_CHECK(opened == 50, "opened %d of 50 stray connections", opened);
    CT_CHECK(codes[0] == 0 && codes[1] == 0, "rendezvous ranks exit %d %d (2: the rendezvous failed)", codes[0],
             codes[1]);
    /* 80 strays (more than rank 0 keeps pending: the oldest are pushed out),
       then a 3-rank TCP comm and an allreduce over it */
    flood_run(1, 3, 80, &opened, codes);
    CT_CHECK(opened == 80, "opened %d of 80 stray connections", opened);
    for (i = 0; i < 3; i++) CT_CHECK(codes[i] == 0, "TCP rank %d exit %d", i, codes[i]);
}

/* Rank 0 of a 2-rank rendezvous with only `spare` descriptors left above
   those open now (RLIMIT_NOFILE), so accept() fails with EMFILE, and a
   hello budget past the hang guard (a join cannot come from a stray's budget
   running out). Exit code: 0 joined, 2 failed, 3 failed without naming the
   cause, 7 rank 0 polled more than it can without spinning (the old accept
   loop spun on the readable listening socket: about 10^5 polls a second).
   Counted, not timed: a starved rank 0 waits 50 ms before each accept(), so
   it polls at most twice per 50 ms of its deadline, plus once or twice per
   event from the `strays` connections; load only makes that fewer. */
static int starved_root(int port, int spare, double timeout, int expect_ok, int strays) {
    capex_rendezvous_desc d;
    struct rlimit rl;
    unsigned char blob[128]; /* flood_rank's blob */
    int lo = dup(0), ok;
    size_t k;
    long max_polls = (long)(2 * timeout / 0.05) + 8L * strays + 256;
    if (lo < 0) return 9;
    close(lo);
    for (k = 0; k < sizeof blob; k++) blob[k] = (unsigned char)(k * 7 + 3);
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return 9;
    rl.rlim_cur = (rlim_t)(lo + spare);
    if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return 9;
    capex_rendezvous_desc_init(&d);
    d.addr = "127.0.0.1"; d.port = port; d.rank = 0; d.world_size = 2; d.nonce = RUN_A; d.timeout_s = timeout;
    g_rdv_hello_budget_s = 10 * CT_HANG_GUARD_S;
    g_rdv_polls = 0;
    ok = capex_rendezvous_broadcast(&d, blob, sizeof blob) == CAPEX_OK;
    if (g_rdv_polls > max_polls) { /* stderr: the caller _exits */
        fprintf(stderr, "  rank 0 polled %ld times (at most %ld without a spin)\n", g_rdv_polls, max_polls);
        return 7;
    }
    if (!ok && !strstr(capex_last_error(), strerror(EMFILE))) { fprintf(stderr, "  rank 0: %s\n", capex_last_error()); return 3; }
    return ok == expect_ok ? 0 : 2;
}

CT_TEST(rendezvous_out_of_descriptors) {
    int port = free_port(), fds[128], nf, st, i;
    pid_t root, peer;
    /* 1. four descriptors: the listening socket and three pending strays; 30
       idle or garbage strays, then the real rank 1. Pending strays are given
       up, oldest first, to accept the next connection: rank 1 joins (the
       deadline a hang guard). */
    fflush(stdout);
    root = fork();
    if (root == 0) _exit(starved_root(port, 4, CT_HANG_GUARD_S, 1, 31));
    nf = flood_open(port, 30, fds);
    peer = fork();
    if (peer == 0) _exit(flood_rank(0, port, 1, 2));
    waitpid(root, &st, 0);
    CT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "starved rank 0 exit %d (7: spun)",
             WIFEXITED(st) ? WEXITSTATUS(st) : 100);
    waitpid(peer, &st, 0);
    CT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 1 exit %d", WIFEXITED(st) ? WEXITSTATUS(st) : 100);
    CT_CHECK(nf == 30, "opened %d of 30 strays", nf);
    for (i = 0; i < nf; i++) close(fds[i]);
    /* 2. only the listening socket: nothing can be accepted, nothing is
       pending to give up. Rank 0 times out naming EMFILE, without spinning. */
    port = free_port();
    root = fork();
    if (root == 0) _exit(starved_root(port, 1, 3.0, 0, 3));
    nf = flood_open(port, 3, fds);
    waitpid(root, &st, 0);
    CT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rank 0 without descriptors: exit %d (7: spun, 3: no cause)",
             WIFEXITED(st) ? WEXITSTATUS(st) : 100);
    for (i = 0; i < nf; i++) close(fds[i]);
}

/* A fake rank 0 that answers its k-th connection by script[k]: 'b' busy,
   'o' the real answer and blob, 'g' garbage, 's' silence until the peer
   closes (held: a peer that overstays its deadline gets EOF, not a timeout).
   Its waits are hang guards. */
static int fake_root(int ls, const char *script) {
    int k;
    for (k = 0; script[k]; k++) {
        unsigned char m[32], blob[128];
        size_t i;
        struct pollfd pf;
        int fd;
        pf.fd = ls; pf.events = POLLIN; pf.revents = 0;
        if (poll(&pf, 1, (int)(CT_HANG_GUARD_S * 1000)) != 1 || (fd = accept(ls, NULL, NULL)) < 0) return 1; /* the peer gave up */
        if (recv(fd, m, 32, MSG_WAITALL) != 32) return 2;
        if (script[k] == 'b') capex__rdv_put_answer(m, CAPEX__RDV_BUSY, 0, 0);
        if (script[k] == 'o') capex__rdv_put_answer(m, CAPEX__RDV_OK, RUN_A, sizeof blob);
        if (script[k] == 'g') memcpy(m, "HTTP/1.0 400 Bad Request\r\n\r\n", 24);
        if (script[k] != 's') (void)send(fd, m, 24, MSG_NOSIGNAL);
        for (i = 0; i < sizeof blob; i++) blob[i] = (unsigned char)(i * 7 + 3);
        if (script[k] == 'o') (void)send(fd, blob, sizeof blob, MSG_NOSIGNAL);
        pf.fd = fd; pf.events = POLLIN; pf.revents = 0;
        if (script[k] == 's' && poll(&pf, 1, (int)(CT_HANG_GUARD_S * 1000)) == 1) (void)recv(fd, m, 1, 0); /* until the peer gives up */
        close(fd);
    }
    return 0;
}

static capex_result fake_root_run(const char *script, double timeout, int *code) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int ls = socket(AF_INET, SOCK_STREAM, 0), st = 0, one = 1;
    capex_rendezvous_desc d;
    unsigned char blob[128];
    capex_result r;
    size_t i;
    pid_t pid;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(0x7f000001u);
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(ls, (struct sockaddr *)&a, sizeof a) != 0 || listen(ls, 4) != 0 ||
        getsockname(ls, (struct sockaddr *)&a, &len) != 0) { close(ls); *code = -1; return CAPEX_ERR_COMM; }
    fflush(stdout);
    pid = fork();
    if (pid == 0) _exit(fake_root(ls, script));
    close(ls);
    capex_rendezvous_desc_init(&d);
    d.addr = "127.0.0.1"; d.port = ntohs(a.sin_port); d.rank = 1; d.world_size = 2; d.nonce = RUN_A; d.timeout_s = timeout;
    d.retry_interval_s = 0.02;
    memset(blob, 0, sizeof blob);
    r = capex_rendezvous_broadcast(&d, blob, sizeof blob);
    for (i = 0; r == CAPEX_OK && i < sizeof blob; i++) if (blob[i] != (unsigned char)(i * 7 + 3)) r = CAPEX_ERR_INTERNAL;
    waitpid(pid, &st, 0);
    *code = WIFEXITED(st) ? WEXITSTATUS(st) : 100;
    return r;
}

/* No clock: the deadlines of the calls that must not time out are hang
   guards, and the one that must is held by a silent rank 0 until it fires. */
CT_TEST(rendezvous_peer_against_busy_or_fake_rank0) {
    int code = 0;
    /* rank 0 dropped the peer unheard (flood): the peer reconnects */
    capex_result r = fake_root_run("bbo", CT_HANG_GUARD_S, &code);
    CT_CHECK(r == CAPEX_OK && code == 0, "busy twice, then served: %s %.300s (fake rank 0 exit %d)", capex_result_string(r),
             capex_last_error(), code);
    /* not a capex rank 0 at all: refused at once, naming it */
    r = fake_root_run("g", CT_HANG_GUARD_S, &code);
    CT_CHECK(r == CAPEX_ERR_COMM && strstr(capex_last_error(), "not a capex rendezvous"), "garbage answer: %s %.300s",
             capex_result_string(r), capex_last_error());
    /* one that never answers holds the peer only until its deadline */
    r = fake_root_run("s", 0.5, &code);
    CT_CHECK(r == CAPEX_ERR_TIMEOUT, "silent rank 0: %s %.300s", capex_result_string(r), capex_last_error());
}

/* ---------------------------------------------------------- TCP comm -- */

static void *tcp_no_alloc(size_t size, void *user) { (void)size; (void)user; return NULL; }
static void tcp_no_free(void *p, void *user) { (void)p; (void)user; }
static int tcp_local_fail_pipe[2] = {-1, -1};

/* Blocks until every other rank has closed its end of tcp_local_fail_pipe
   (EOF), or for CT_HANG_GUARD_S should a rank never get that far. */
static void tcp_wait_pipe_eof(void) {
    struct pollfd pf;
    char ch;
    close(tcp_local_fail_pipe[1]);
    pf.fd = tcp_local_fail_pipe[0]; pf.events = POLLIN; pf.revents = 0;
    while (poll(&pf, 1, (int)(CT_HANG_GUARD_S * 1000)) == 1 && read(tcp_local_fail_pipe[0], &ch, 1) > 0) {}
}
static void tcp_kill_self(int sig) { (void)sig; kill(getpid(), SIGKILL); }

/* The body run by every rank of a TCP world; returns 0 or a failing line. */
static int tcp_body(int rank, int world, int port, int mode) {
    capex_dist_env env;
    capex_comm c;
    float f[5], g[15];
    uint16_t h[3];
    int i;
    memset(&env, 0, sizeof env);
    env.rank = rank; env.world_size = world; env.local_rank = rank; env.local_world_size = world;
    strcpy(env.master_addr, "127.0.0.1");
    env.master_port = port;
    strcpy(env.run_id, "tcp-test");
    if (mode == 18) strcpy(env.master_addr, "::1"); /* IPv6 loopback: the star and the ring's links */
    if (capex_comm_init_tcp(&c, &env, CT_HANG_GUARD_S) != CAPEX_OK) return __LINE__;
    c.timeout_s = CT_HANG_GUARD_S; /* modes that expect a timeout set their own */
    if (mode == 18) {
        size_t n = (size_t)1 << 17, k;
        float *x = (float *)malloc(n * sizeof(float));
        int line = 0;
        if (!x) return __LINE__;
        c.timeout_s = CT_HANG_GUARD_S; /* a hang guard only */
        for (k = 0; k < n; k++) x[k] = (float)(rank + 1) * (float)(k % 7);
        if (capex_comm_allreduce(&c, x, x, 5, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_OK) line = __LINE__; /* star */
        else if (x[3] != (float)(world * (world + 1) / 2 * 3)) line = __LINE__;
        for (k = 0; !line && k < n; k++) x[k] = (float)(rank + 1) * (float)(k % 7);
        if (!line && capex_comm_allreduce(&c, x, x, n, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_OK) line = __LINE__; /* ring */
        for (k = 0; !line && k < n; k++) if (x[k] != (float)(world * (world + 1) / 2) * (float)(k % 7)) line = __LINE__;
        if (line) fprintf(stderr, "rank %d over ::1: line %d: %s\n", rank, line, capex_last_error());
        free(x);
        capex_comm_destroy(&c);
        return line;
    }
    if (mode == 1) { /* failure modes: rank 1 dies, stalls or goes out of order */
        capex_result r;
        if (rank == 1) { capex_comm_destroy(&c); return 0; }         /* dies (closes its socket) */
        r = capex_comm_allreduce(&c, f, f, 5, CAPEX_F32, CAPEX_REDUCE_SUM);
        capex_comm_destroy(&c);
        return r == CAPEX_ERR_COMM ? 0 : __LINE__;
    }
    if (mode == 2) {
        capex_result r;
        /* rank 1 stalls until rank 0 has returned (the pipe's EOF), not for a
           fixed time: a slow rank 0 cannot see it leave (COMM) instead */
        if (rank == 1) { tcp_wait_pipe_eof(); capex_comm_destroy(&c); return 0; }
        c.timeout_s = 0.5;
        r = capex_comm_allreduce(&c, f, f, 5, CAPEX_F32, CAPEX_REDUCE_SUM);
        close(tcp_local_fail_pipe[1]);
        capex_comm_destroy(&c);
        return r == CAPEX_ERR_TIMEOUT ? 0 : __LINE__;
    }
    if (mode == 4) { /* world 3: rank 2 dies; rank 0 sees it and must pass it on at once */
        capex_result r;
        /* rank 0 keeps its sockets open until rank 1 has returned (the
           pipe's EOF): only its abort can end rank 1's wait with COMM (a
           deadline gives TIMEOUT), however slow the machine */
        if (rank == 2) { capex_comm_destroy(&c); return 0; } /* its exit closes its end of the pipe */
        r = capex_comm_allreduce(&c, f, f, 5, CAPEX_F32, CAPEX_REDUCE_SUM);
        if (rank == 0) tcp_wait_pipe_eof();
        else close(tcp_local_fail_pipe[1]);
        capex_comm_destroy(&c);
        return r == CAPEX_ERR_COMM ? 0 : __LINE__;
    }
    if (mode == 3) {
        capex_result r;
        if (rank == 1) { r = capex_comm_allgather(&c, f, g, 5, CAPEX_F32); capex_comm_destroy(&c); return 0; }
        r = capex_comm_allreduce(&c, f, f, 5, CAPEX_F32, CAPEX_REDUCE_SUM);
        capex_comm_destroy(&c);
        return r == CAPEX_ERR_COMM && strstr(capex_last_error(), "different orders") ? 0 : __LINE__;
    }
    if (mode == 5) { /* byte sizes that wrap size_t: refused alike on every rank, the comm stays usable */
        size_t wrap4 = SIZE_MAX / 2 + 1, scratch_wrap = SIZE_MAX / 8 + 2;
        capex_ddp_param ps[2];
        capex_ddp *dd = NULL;
        capex_ddp_desc d;
        /* count * 4 fits but rank 0's scratch (count * 8) wrapped to 8 bytes before: heap overflow */
        if (capex_comm_allreduce(&c, f, f, scratch_wrap, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_ERR_INVALID_ARG) return __LINE__;
        if (!strstr(capex_last_error(), "overflows")) return __LINE__;
        if (capex_comm_allreduce(&c, f, f, wrap4, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_ERR_INVALID_ARG) return __LINE__;
        if (!strstr(capex_last_error(), "overflows")) return __LINE__;
        if (capex_comm_allreduce(&c, f, f, SIZE_MAX / 16 + 1, CAPEX_F64, CAPEX_REDUCE_SUM) != CAPEX_ERR_INVALID_ARG)
            return __LINE__;
        if (capex_comm_broadcast(&c, f, wrap4, CAPEX_F32, 0) != CAPEX_ERR_INVALID_ARG) return __LINE__;
        /* count * 4 fits, times the world of 2 does not */
        if (capex_comm_allgather(&c, f, g, SIZE_MAX / 8 + 1, CAPEX_F32) != CAPEX_ERR_INVALID_ARG) return __LINE__;
        { /* reduce-scatter: rank 0's scratch (8 bytes an f32 element) wraps, the counts' sum wraps; allgatherv bytes */
            size_t rs[2] = {scratch_wrap, 0}, sum_wrap[2] = {SIZE_MAX / 2 + 1, SIZE_MAX / 2 + 1}, ag[2] = {SIZE_MAX / 8 + 1, SIZE_MAX / 8 + 1};
            if (capex_comm_reduce_scatter(&c, f, f, rs, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_ERR_INVALID_ARG) return __LINE__;
            if (!strstr(capex_last_error(), "overflows")) return __LINE__;
            if (capex_comm_reduce_scatter(&c, f, f, sum_wrap, CAPEX_I64, CAPEX_REDUCE_SUM) != CAPEX_ERR_INVALID_ARG) return __LINE__;
            if (!strstr(capex_last_error(), "SIZE_MAX")) return __LINE__;
            if (capex_comm_allgatherv(&c, f, g, ag, CAPEX_F32) != CAPEX_ERR_INVALID_ARG) return __LINE__;
        }
        for (i = 0; i < 2; i++) { ps[i].data = f; ps[i].numel = SIZE_MAX / 8 + 1; ps[i].dtype = CAPEX_F32; ps[i].grad = NULL; }
        capex_ddp_desc_init(&d);
        d.broadcast_parameters = 0;
        if (capex_ddp_create(&dd, &c, ps, 2, &d) != CAPEX_ERR_INVALID_ARG || dd) return __LINE__;
        for (i = 0; i < 5; i++) f[i] = (float)(rank + 1);
        if (capex_comm_allreduce(&c, f, f, 5, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_OK || f[4] != 3.0f) return __LINE__;
        capex_comm_destroy(&c);
        return 0;
    }
    if (mode == 10) { /* count 0 on rank 0, 4 elsewhere: an error for both, not a pairing with the next call */
        float b[4];
        capex_result r1, r2;
        for (i = 0; i < 4; i++) { f[i] = (float)(rank + 1); b[i] = 100.0f * (float)(rank + 1); }
        r1 = capex_comm_allreduce(&c, f, f, rank == 0 ? 0 : 4, CAPEX_F32, CAPEX_REDUCE_SUM);
        r2 = capex_comm_allreduce(&c, b, b, 4, CAPEX_F32, CAPEX_REDUCE_SUM);
        capex_comm_destroy(&c);
        if (rank == 0 && r2 == CAPEX_OK) fprintf(stderr, "rank 0: b[0] = %g (its 100 plus rank 1's first call)\n", (double)b[0]);
        return r1 == CAPEX_ERR_COMM && r2 == CAPEX_ERR_COMM ? 0 : __LINE__;
    }
    if ((mode >= 11 && mode <= 13) || mode == 20) { /* a local failure on one rank mid-collective: the others learn at once */
        /* 11: rank 1 out of memory for the ring's scratch (large allreduce);
           12: rank 0 out of memory for the star's scratch (small allreduce);
           13: rank 1 passes a NULL buffer the others do not;
           20: rank 1 out of memory for the front-end's reduce-scatter
               fallback scratch (a backend without the entry), before any traffic */
        static const capex_allocator no_mem = {tcp_no_alloc, tcp_no_free, NULL};
        static capex_comm_vtable plain;
        const capex_comm_vtable *orig = c.vt;
        size_t n = mode == 11 ? (size_t)1 << 18 : 6, counts[3] = {2, 2, 2};
        float *x = (float *)calloc(n, sizeof(float)), *y = rank == 1 && mode == 13 ? NULL : x;
        int bad = rank == (mode == 12 ? 0 : 1), line = 0;
        capex_result r, want = mode == 13 ? CAPEX_ERR_INVALID_ARG : CAPEX_ERR_OUT_OF_MEMORY;
        c.timeout_s = CT_HANG_GUARD_S; /* a hang guard only: the peers must not need it */
        if (bad && mode != 13) c.allocator = &no_mem;
        if (mode == 20) {
            plain = *c.vt;
            plain.reduce_scatter = NULL;
            c.vt = &plain;
            counts[0] = n - 2 * (size_t)(world - 1);
            r = capex_comm_reduce_scatter(&c, x, x, counts, CAPEX_F32, CAPEX_REDUCE_SUM);
        } else {
            r = capex_comm_allreduce(&c, x, y, n, CAPEX_F32, CAPEX_REDUCE_SUM);
        }
        if (r != (bad ? want : CAPEX_ERR_COMM)) {
            fprintf(stderr, "rank %d (mode %d): %s\n", rank, mode, capex_last_error());
            line = __LINE__;
        }
        /* the comm is gone on every rank: a next call fails instead of pairing with a peer's pending one */
        r = capex_comm_allreduce(&c, x, x, n, CAPEX_F32, CAPEX_REDUCE_SUM);
        if (r != CAPEX_ERR_COMM) {
            fprintf(stderr, "rank %d (mode %d), next call: %s\n", rank, mode, capex_last_error());
            if (!line) line = __LINE__;
        }
        /* the failing rank keeps its sockets open until every other rank has
           returned (the pipe's EOF), so only the library can have told them */
        close(tcp_local_fail_pipe[1]);
        if (bad) { char ch; while (read(tcp_local_fail_pipe[0], &ch, 1) > 0) {} }
        c.allocator = NULL;
        c.vt = orig; /* destroy through the backend's own entries */
        capex_comm_destroy(&c);
        free(x);
        return line;
    }
    if (mode >= 21 && mode <= 23) { /* rank 0 alone refuses a call whose peers first wait to read from it */
        /* 21: a NULL buffer in a broadcast from rank 0 (peers only receive);
           22: a NULL buffer in a ring allreduce (world 3: rank 1 reads rank 0 first);
           23: count 0 on rank 0 against that ring allreduce. Only rank 0's
           stand-in can end the peers' wait as CAPEX_ERR_COMM (their deadline
           gives TIMEOUT): every deadline here is a hang guard */
        size_t n = mode == 21 ? 6 : (size_t)1 << 18;
        float *x = (float *)calloc(n, sizeof(float));
        capex_result r, want = rank ? CAPEX_ERR_COMM : mode == 23 ? CAPEX_ERR_COMM : CAPEX_ERR_INVALID_ARG;
        int line = 0;
        if (mode == 21) r = capex_comm_broadcast(&c, rank ? x : NULL, n, CAPEX_F32, 0);
        else r = capex_comm_allreduce(&c, x, rank || mode == 23 ? x : NULL, rank || mode == 22 ? n : 0, CAPEX_F32,
                                      CAPEX_REDUCE_SUM);
        if (r != want) {
            fprintf(stderr, "rank %d (mode %d): %s: %s\n", rank, mode, capex_result_string(r), capex_last_error());
            line = __LINE__;
        }
        /* a peer reading rank 0's stand-in barrier is told what it is (rank 2 on the ring sees rank 1 leave) */
        if (!line && rank && (mode == 21 || rank == 1) && !strstr(capex_last_error(), "standing in for a call")) {
            fprintf(stderr, "rank %d (mode %d): %s\n", rank, mode, capex_last_error());
            line = __LINE__;
        }
        /* the comm is gone on every rank: a next call fails instead of pairing */
        if (capex_comm_allreduce(&c, x, x, 4, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_ERR_COMM && !line) line = __LINE__;
        capex_comm_destroy(&c);
        free(x);
        return line;
    }
    if (mode == 19) { /* rank 1 is SIGKILLed at a moment of its own (mostly mid-ring): the others get CAPEX_ERR_COMM */
        size_t n = (size_t)1 << 17;
        float *x = (float *)calloc(n, sizeof(float));
        capex_result r = CAPEX_OK;
        int it;
        c.timeout_s = CT_HANG_GUARD_S; /* a hang guard only */
        if (rank == 1) {
            struct itimerval tv;
            memset(&tv, 0, sizeof tv);
            tv.it_value.tv_usec = 50000;
            signal(SIGALRM, tcp_kill_self);
            setitimer(ITIMER_REAL, &tv, NULL);
        }
        for (it = 0; it < 1000000 && r == CAPEX_OK; it++) r = capex_comm_allreduce(&c, x, x, n, CAPEX_F32, CAPEX_REDUCE_SUM);
        if (r != CAPEX_ERR_COMM) fprintf(stderr, "rank %d (mode 19), call %d: %s\n", rank, it, capex_last_error());
        capex_comm_destroy(&c);
        free(x);
        return r == CAPEX_ERR_COMM ? 0 : __LINE__;
    }
    if (mode >= 31 && mode <= 33) { /* ranks pass different broadcast roots */
        /* 31: rank 0 root 0, the others their own rank; 32: rank 0 root 1,
           the others 0; 33: the last rank its own rank, the others 0 */
        float b[4] = {1, 2, 3, 4};
        int root = mode == 31 ? rank : mode == 32 ? (rank == 0) : rank == world - 1 ? rank : 0, line = 0;
        capex_result r;
        c.timeout_s = CT_HANG_GUARD_S; /* a hang guard only */
        r = capex_comm_broadcast(&c, b, 4, CAPEX_F32, root);
        if (r != CAPEX_ERR_COMM) line = __LINE__;
        else if (!strstr(capex_last_error(), rank == 0 ? "must pass the same root" : "rank 0 refused collective")) line = __LINE__;
        if (line) fprintf(stderr, "rank %d (mode %d): %s: %s\n", rank, mode, capex_result_string(r), capex_last_error());
        capex_comm_destroy(&c);
        return line;
    }
    if (mode == 37) { /* the last rank refuses a broadcast from rank 0 (NULL buffer): the root fails in that call too */
        float b[4] = {1, 2, 3, 4};
        capex_result r, want = rank == world - 1 ? CAPEX_ERR_INVALID_ARG : CAPEX_ERR_COMM;
        c.timeout_s = CT_HANG_GUARD_S; /* a hang guard only */
        r = capex_comm_broadcast(&c, rank == world - 1 ? NULL : b, 4, CAPEX_F32, 0);
        if (r != want) fprintf(stderr, "rank %d (mode 37): %s: %s\n", rank, capex_result_string(r), capex_last_error());
        capex_comm_destroy(&c);
        return r == want ? 0 : __LINE__;
    }
    if (mode >= 38 && mode <= 40) { /* one rank passes another broadcast count: every rank fails in that call */
        /* 38: root 0, the last rank 8 elements (the root only sent: it returned CAPEX_OK);
           39: root 1, the last rank 8 (the root sends when rank 0 says go: it returned CAPEX_OK);
           40: root 0, rank 0 itself 8 (the peers failed on its data; rank 0 returned CAPEX_OK) */
        float b[8] = {1, 2, 3, 4, 5, 6, 7, 8};
        int odd = mode == 40 ? 0 : world - 1, root = mode == 39 ? 1 : 0, line;
        capex_result r;
        c.timeout_s = CT_HANG_GUARD_S; /* a hang guard only */
        r = capex_comm_broadcast(&c, b, rank == odd ? 8 : 4, CAPEX_F32, root);
        line = r != CAPEX_ERR_COMM ? __LINE__ : strstr(capex_last_error(), "same root") ? __LINE__ : 0; /* the roots agree */
        if (line)
            fprintf(stderr, "rank %d (mode %d, world %d): %s: %s\n", rank, mode, world, capex_result_string(r), capex_last_error());
        capex_comm_destroy(&c);
        return line;
    }
    if (mode >= 41 && mode <= 44) { /* the last rank swaps two ranks' counts (the same total): every rank fails */
        /* 41: allgatherv, 42: reduce-scatter (star); 43, 44: the same on the ring.
           At world 3 the star allgatherv returned CAPEX_OK everywhere, the last
           rank reading the shards at the wrong offsets; elsewhere some ranks did */
        size_t unit = mode >= 43 ? (size_t)1 << 15 : 1, counts[3], k, total;
        float *x, *y;
        int line = 0;
        capex_result r;
        for (k = 0; k < (size_t)world; k++) counts[k] = (k + 1) * unit;
        total = (size_t)world * (size_t)(world + 1) / 2 * unit;
        if (rank == world - 1) { counts[0] = 2 * unit; counts[1] = unit; }
        x = (float *)calloc(total, sizeof(float));
        y = (float *)calloc(total, sizeof(float));
        if (!x || !y) return __LINE__;
        c.timeout_s = CT_HANG_GUARD_S; /* a hang guard only */
        if (mode == 41 || mode == 43) r = capex_comm_allgatherv(&c, y, x, counts, CAPEX_F32);
        else r = capex_comm_reduce_scatter(&c, x, y, counts, CAPEX_F32, CAPEX_REDUCE_SUM);
        if (r != CAPEX_ERR_COMM) line = __LINE__;
        if (line)
            fprintf(stderr, "rank %d (mode %d, world %d): %s: %s\n", rank, mode, world, capex_result_string(r), capex_last_error());
        capex_comm_destroy(&c);
        free(x);
        free(y);
        return line;
    }
    if (mode >= 34 && mode <= 36) { /* one rank's count takes the star, the others' the ring (world >= 3) */
        /* 34: allreduce, 35: reduce-scatter, 36: allgatherv; the small count
           on rank 0, 1, 2 (world 3) or 1, 2, 3 (world 4) */
        size_t n = (size_t)1 << 17, counts[4], k;
        float *x = (float *)calloc(n, sizeof(float)), *y = (float *)calloc(n, sizeof(float));
        int small = rank == (mode - 34 + world - 3) % world, line = 0;
        capex_result r = CAPEX_OK;
        if (!x || !y) return __LINE__;
        c.timeout_s = CT_HANG_GUARD_S; /* a hang guard only: a timeout is the failure this mode shows */
        for (k = 0; k < (size_t)world; k++) counts[k] = small ? 4 : n / (size_t)world;
        if (mode == 34) r = capex_comm_allreduce(&c, x, x, small ? 4 : n, CAPEX_F32, CAPEX_REDUCE_SUM);
        if (mode == 35) r = capex_comm_reduce_scatter(&c, x, y, counts, CAPEX_F32, CAPEX_REDUCE_SUM);
        if (mode == 36) r = capex_comm_allgatherv(&c, y, x, counts, CAPEX_F32);
        if (r != CAPEX_ERR_COMM) line = __LINE__;
        else if (rank == 0 && !strstr(capex_last_error(), "must pass the same count")) line = __LINE__;
        if (line) fprintf(stderr, "rank %d (mode %d): %s: %s\n", rank, mode, capex_result_string(r), capex_last_error());
        capex_comm_destroy(&c);
        free(x);
        free(y);
        return line;
    }
    if (mode >= 14 && mode <= 17) { /* rank 0 reduces another dtype or op of the same byte size as the others */
        /* 14: f32 x4 against f16 x8 (star); 15: SUM against AVG (star);
           16: SUM against AVG (ring); 17: int64 against f64 (ring) */
        size_t n = mode >= 16 ? (size_t)1 << 16 : 4;
        double *x = (double *)calloc(2 * n, sizeof(double));
        capex_dtype ty = mode == 17 ? (rank ? CAPEX_F64 : CAPEX_I64) : CAPEX_F32;
        capex_reduce_op op = (mode == 15 || mode == 16) && rank ? CAPEX_REDUCE_AVG : CAPEX_REDUCE_SUM;
        size_t cnt = mode == 17 ? 2 * n : mode == 16 ? 4 * n : n;
        capex_result r;
        if (mode == 14 && rank) { ty = CAPEX_F16; cnt = 2 * n; }
        c.timeout_s = CT_HANG_GUARD_S; /* a hang guard only */
        r = capex_comm_allreduce(&c, x, x, cnt, ty, op);
        if (r != CAPEX_ERR_COMM) fprintf(stderr, "rank %d (mode %d): %s: %s\n", rank, mode, capex_result_string(r), capex_last_error());
        capex_comm_destroy(&c);
        free(x);
        return r == CAPEX_ERR_COMM ? 0 : __LINE__;
    }
    if (mode == 8 || mode == 9) { /* the ring (a large allreduce) with rank 1 dead (8) or stalled (9) */
        size_t n = 1 << 18;
        float *x = (float *)calloc(n, sizeof(float));
        capex_result r;
        if (rank == 1) {
            if (mode == 9) tcp_wait_pipe_eof(); /* stalls until ranks 0 and 2 have returned, not for a fixed time */
            capex_comm_destroy(&c);
            free(x);
            return 0;
        }
        /* 8 expects COMM: the default is its hang guard. 9: rank 0 waits
           for rank 1's ring announcement only: its deadline must fire
           (TIMEOUT; one not kept waits until rank 1 is let go: COMM). Rank 2
           may see rank 0's abort first (COMM), or only rank 1 (TIMEOUT). */
        if (mode == 9) c.timeout_s = 0.5;
        r = capex_comm_allreduce(&c, x, x, n, CAPEX_F32, CAPEX_REDUCE_SUM);
        if (mode == 9) close(tcp_local_fail_pipe[1]);
        capex_comm_destroy(&c);
        free(x);
        if (mode == 8) return r == CAPEX_ERR_COMM ? 0 : __LINE__;
        if (r != CAPEX_ERR_TIMEOUT && (rank == 0 || r != CAPEX_ERR_COMM)) {
            fprintf(stderr, "rank %d (rank 1 stalled mid-ring): %s: %s\n", rank, capex_result_string(r), capex_last_error());
            return __LINE__;
        }
        return 0;
    }
    if (mode == 6 || mode == 7) { /* reduce-scatter / allgatherv against float64 (7: the front-ends' fallbacks) */
        static capex_comm_vtable plain;
        const capex_comm_vtable *orig = c.vt;
        char why[400] = "";
        int line;
        if (mode == 7) {
            plain = *c.vt;
            plain.reduce_scatter = NULL;
            plain.allgatherv = NULL;
            c.vt = &plain;
        }
        line = shards_check_all(&c, 777 + (uint64_t)world, why, sizeof why);
        if (!line) line = shards_allreduce_check(&c, 31 + (uint64_t)world, 5 + 300000 * (size_t)(mode == 6), why, sizeof why);
        if (line) fprintf(stderr, "rank %d of %d (mode %d): dist_shards.h:%d: %s\n", rank, world, mode, line, why);
        c.vt = orig; /* destroy through the backend's own entries */
        capex_comm_destroy(&c);
        return line ? __LINE__ : 0;
    }
    if (strcmp(c.vt->name, "tcp") != 0) return __LINE__;
    for (i = 0; i < 5; i++) f[i] = (float)((rank + 1) * (i + 1));
    if (capex_comm_allreduce(&c, f, f, 5, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_OK) return __LINE__;
    for (i = 0; i < 5; i++) if (f[i] != (float)(6 * (i + 1))) return __LINE__;
    for (i = 0; i < 3; i++) h[i] = capex_f32_to_bf16((float)(rank + 1));
    if (capex_comm_allreduce(&c, h, h, 3, CAPEX_BF16, CAPEX_REDUCE_AVG) != CAPEX_OK) return __LINE__;
    if (capex_bf16_to_f32(h[1]) != 2.0f) return __LINE__;
    for (i = 0; i < 5; i++) f[i] = rank == 2 ? (float)(i + 100) : 0.0f;
    if (capex_comm_broadcast(&c, f, 5, CAPEX_F32, 2) != CAPEX_OK || f[4] != 104.0f) return __LINE__;
    for (i = 0; i < 5; i++) f[i] = (float)(rank * 5 + i);
    if (capex_comm_allgather(&c, f, g, 5, CAPEX_F32) != CAPEX_OK) return __LINE__;
    for (i = 0; i < 15; i++) if (g[i] != (float)i) return __LINE__;
    if (capex_comm_barrier(&c) != CAPEX_OK) return __LINE__;
    { /* DDP over TCP: params broadcast from rank 0, grads averaged */
        float w[2][4], *gr;
        capex_ddp_param ps[2];
        capex_ddp_desc d;
        capex_ddp *dd = NULL;
        int p, step;
        for (p = 0; p < 2; p++) for (i = 0; i < 4; i++) w[p][i] = (float)(rank * 10 + p);
        for (p = 0; p < 2; p++) { ps[p].data = w[p]; ps[p].numel = 4; ps[p].dtype = CAPEX_F32; ps[p].grad = NULL; }
        capex_ddp_desc_init(&d);
        d.first_bucket_bytes = d.bucket_bytes = 16;
        if (capex_ddp_create(&dd, &c, ps, 2, &d) != CAPEX_OK) return __LINE__;
        if (w[1][3] != 1.0f) return __LINE__; /* rank 0's value */
        for (step = 0; step < 3; step++) {
            for (p = 2; p-- > 0;) {
                gr = (float *)capex_ddp_grad(dd, (size_t)p);
                for (i = 0; i < 4; i++) gr[i] = (float)(rank + 1 + p);
                if (capex_ddp_grad_ready(dd, (size_t)p) != CAPEX_OK) return __LINE__;
            }
            if (capex_ddp_finalize(dd) != CAPEX_OK) return __LINE__;
            for (p = 0; p < 2; p++) if (((float *)capex_ddp_grad(dd, (size_t)p))[2] != (float)(2 + p)) return __LINE__;
        }
        capex_ddp_destroy(dd);
    }
    capex_comm_destroy(&c);
    return 0;
}

static int tcp_world(int world, int mode, int *codes) { return fork_world(world, mode, codes, tcp_body); }

CT_TEST(tcp_comm_collectives_and_ddp) {
    int codes[8], r = tcp_world(3, 0, codes);
    CT_CHECK(r == 0, "rank 0 failed at line %d: %.300s", r, capex_last_error());
    CT_CHECK(codes[1] == 0 && codes[2] == 0, "peers: %d %d", codes[1], codes[2]);
}

/* Ranks passing different models or descriptors to capex_ddp_create /
   capex_zero_create: every rank fails at create with one clear status and
   message (on the header before the model check they hung in the parameter
   broadcast, failed later with an op mismatch, or went on with different
   buckets), the comm stays usable and a matching create after it works. The
   odd rank is rank 1 in a world of 2 and rank 0 in a world of 3 (ranks 1 and
   2 then both differ from rank 0; the message names the first, rank 1). The
   comm's deadline is a hang guard only: the expected codes are not timeouts. */
enum {
    MC_OK, MC_NP, MC_SIZES, MC_NUMEL, MC_DTYPE, MC_BUCKET, MC_BCAST, MC_PREDIV, MC_REFUSE, MC_DELAY,
    MC_Z_OK, MC_Z_NP, MC_Z_DTYPE, MC_Z_GROUP, MC_Z_STAGE, MC_Z_LR, MC_Z_BCAST, MC_Z_REFUSE, MC_Z_UNUSED, MC_N
};
static int model_check_body(int rank, int world, int port, int mode) {
    capex_dist_env env;
    capex_comm c;
    float w[3][8], s[1];
    capex_ddp_param ps[3];
    capex_ddp_desc d;
    capex_ddp *g = NULL;
    capex_zero_param zp[3];
    capex_zero_desc zd;
    capex_optim_desc od;
    capex_zero *z = NULL;
    int odd = world == 2 ? 1 : 0, me = rank == odd, first = odd ? odd : 1, p, i, line = 0, zero = mode >= MC_Z_OK;
    size_t np = 2, ngroups = 1;
    capex_result r, want = CAPEX_OK;
    char expect[160] = "";
    memset(&env, 0, sizeof env);
    env.rank = rank; env.world_size = world; env.local_rank = rank; env.local_world_size = world;
    strcpy(env.master_addr, "127.0.0.1");
    env.master_port = port;
    strcpy(env.run_id, "tcp-model-check");
    if (capex_comm_init_tcp(&c, &env, CT_HANG_GUARD_S) != CAPEX_OK) return __LINE__;
    c.timeout_s = CT_HANG_GUARD_S;
    for (p = 0; p < 3; p++) for (i = 0; i < 8; i++) w[p][i] = (float)(rank * 100 + p * 10 + i);
    for (p = 0; p < 3; p++) {
        ps[p].data = w[p]; ps[p].numel = p ? 4 : 8; ps[p].dtype = CAPEX_F32; ps[p].grad = NULL;
        zp[p].data = w[p]; zp[p].numel = p ? 4 : 8; zp[p].dtype = CAPEX_F32; zp[p].group = 0;
    }
    capex_ddp_desc_init(&d);
    d.first_bucket_bytes = d.bucket_bytes = 16;
    capex_zero_desc_init(&zd);
    capex_optim_desc_init(&od, CAPEX_OPTIM_ADAM);
    if (mode == MC_Z_GROUP) ngroups = 2;
    if (me) switch (mode) {
        case MC_NP: case MC_Z_NP: np = 3; break;
        case MC_SIZES: ps[0].numel = 4; ps[1].numel = 8; break; /* same count and total */
        case MC_NUMEL: ps[1].numel = 3; break;
        case MC_DTYPE: ps[1].dtype = CAPEX_BF16; break;
        case MC_Z_DTYPE: zp[1].dtype = CAPEX_BF16; break;
        case MC_BUCKET: d.bucket_bytes = 32; break;
        case MC_BCAST: d.broadcast_parameters = 0; break;
        case MC_PREDIV: d.gradient_predivide_factor = 2.0f; break;
        case MC_DELAY: d.delay_allreduce = 1; break;
        case MC_REFUSE: ps[1].dtype = (capex_dtype)99; break;
        case MC_Z_GROUP: zp[1].group = 1; break;
        case MC_Z_STAGE: zd.stage = 2; break;
        case MC_Z_LR: od.defaults.lr = 0.5f; break;
        case MC_Z_BCAST: zd.broadcast_parameters = 0; break;
        case MC_Z_REFUSE: zp[1].group = 5; break;
        case MC_Z_UNUSED: /* fields Adam never reads may differ: no refusal */
            od.defaults.momentum = 0.9f; od.defaults.nesterov = 1; od.defaults.lr_decay = 0.5f;
            od.defaults.grad_averaging = 0; od.use_nvlamb = 1; od.wd_after_momentum = 1; od.seed = 7;
            break;
        default: break;
    }
    switch (mode) {
        case MC_NP: case MC_Z_NP: case MC_NUMEL: {
            int n_odd = mode == MC_NUMEL ? 2 : 3, e_odd = mode == MC_NUMEL ? 11 : 16;
            want = CAPEX_ERR_SIZE_MISMATCH;
            snprintf(expect, sizeof expect, "ranks hold different models: rank %d has %d params (%d elements), rank 0 has %d (%d)",
                     first, odd ? n_odd : 2, odd ? e_odd : 12, odd ? 2 : n_odd, odd ? 12 : e_odd);
            break;
        }
        case MC_SIZES: want = CAPEX_ERR_SIZE_MISMATCH; snprintf(expect, sizeof expect, "param sizes differ from rank 0's (first differing rank %d)", first); break;
        case MC_DTYPE: case MC_Z_DTYPE: want = CAPEX_ERR_SIZE_MISMATCH; snprintf(expect, sizeof expect, "param dtypes differ from rank 0's (first differing rank %d)", first); break;
        case MC_Z_GROUP: want = CAPEX_ERR_SIZE_MISMATCH; snprintf(expect, sizeof expect, "param groups differ from rank 0's (first differing rank %d)", first); break;
        case MC_BUCKET: want = CAPEX_ERR_CONFIG; snprintf(expect, sizeof expect, "rank %d has bucket_bytes %d, rank 0 has %d", first, odd ? 32 : 16, odd ? 16 : 32); break;
        case MC_BCAST: want = CAPEX_ERR_CONFIG; snprintf(expect, sizeof expect, "rank %d has broadcast_parameters %d, rank 0 has %d", first, !odd, odd ? 1 : 0); break;
        case MC_Z_BCAST: want = CAPEX_ERR_CONFIG; snprintf(expect, sizeof expect, "rank %d has broadcast_parameters %d, rank 0 has %d", first, !odd, odd ? 1 : 0); break;
        case MC_DELAY: want = CAPEX_ERR_CONFIG; snprintf(expect, sizeof expect, "rank %d has delay_allreduce %d, rank 0 has %d", first, odd, !odd); break;
        case MC_PREDIV: want = CAPEX_ERR_CONFIG; snprintf(expect, sizeof expect, "rank %d has gradient_predivide_factor %g, rank 0 has %g", first, odd ? 2.0 : 1.0, odd ? 1.0 : 2.0); break;
        case MC_Z_STAGE: want = CAPEX_ERR_CONFIG; snprintf(expect, sizeof expect, "rank %d has stage %d, rank 0 has %d", first, odd ? 2 : 1, odd ? 1 : 2); break;
        case MC_Z_LR: want = CAPEX_ERR_CONFIG; snprintf(expect, sizeof expect, "rank %d's hparams differ from rank 0's", first); break;
        case MC_REFUSE: case MC_Z_REFUSE:
            want = me ? CAPEX_ERR_INVALID_ARG : CAPEX_ERR_COMM;
            if (me) snprintf(expect, sizeof expect, "%s", mode == MC_REFUSE ? "invalid dtype 99" : "group 5 of 1");
            else snprintf(expect, sizeof expect, "rank %d refused its arguments (1 of %d ranks did", odd, world);
            break;
        default: break;
    }
    r = zero ? capex_zero_create(&z, &c, zp, np, &od, NULL, ngroups, &zd) : capex_ddp_create(&g, &c, ps, np, &d);
    if (r != want || (r != CAPEX_OK) != (g == NULL && z == NULL) || !strstr(capex_last_error(), expect)) line = __LINE__;
    else if (r == CAPEX_OK) { /* matching models: rank 0's parameters everywhere, then a reduction */
        if (w[1][3] != 13.0f) line = __LINE__;
        if (g) {
            for (p = 2; !line && p-- > 0;) {
                float *gr = (float *)capex_ddp_grad(g, (size_t)p);
                for (i = 0; i < (p ? 4 : 8); i++) gr[i] = (float)(rank + 1);
                if (capex_ddp_grad_ready(g, (size_t)p) != CAPEX_OK) line = __LINE__;
            }
            if (!line && capex_ddp_finalize(g) != CAPEX_OK) line = __LINE__;
            if (!line && ((float *)capex_ddp_grad(g, 0))[7] != (float)(world + 1) / 2.0f) line = __LINE__;
        }
        if (z) {
            for (p = 2; !line && p-- > 0;) {
                float *gr = (float *)capex_zero_grad(z, (size_t)p);
                for (i = 0; gr && i < (p ? 4 : 8); i++) gr[i] = 1.0f;
                if (!gr || capex_zero_grad_ready(z, (size_t)p) != CAPEX_OK) line = __LINE__;
            }
            if (!line && (capex_zero_finalize(z) != CAPEX_OK || capex_zero_step(z, 1.0f, 1.0f, 0) != CAPEX_OK)) line = __LINE__;
            for (p = 0; !line && p < 2; p++) /* Adam's first step: -lr * sign(g) on every element, every rank */
                for (i = 0; i < (p ? 4 : 8); i++) if (w[p][i] != (float)(p * 10 + i) - od.defaults.lr) line = __LINE__;
        }
    } else { /* the comm still works, and so does a matching create */
        s[0] = (float)(rank + 1);
        if (capex_comm_allreduce(&c, s, s, 1, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_OK || s[0] != (float)(world * (world + 1) / 2))
            line = __LINE__;
        for (p = 0; p < 3; p++) { ps[p].numel = p ? 4 : 8; ps[p].dtype = CAPEX_F32; }
        capex_ddp_desc_init(&d);
        if (!line && (capex_ddp_create(&g, &c, ps, 2, &d) != CAPEX_OK || w[0][7] != 7.0f)) line = __LINE__;
    }
    if (line) fprintf(stderr, "model check, world %d mode %d, rank %d: line %d: %d %s\n", world, mode, rank, line, (int)r,
                      capex_last_error());
    capex_ddp_destroy(g);
    capex_zero_destroy(z);
    capex_comm_destroy(&c);
    return line;
}

CT_TEST(tcp_create_refuses_different_models_on_every_rank) {
    int world, mode, codes[8];
    for (world = 2; world <= 3; world++)
        for (mode = 0; mode < MC_N; mode++) {
            int r = fork_world(world, mode, codes, model_check_body);
            CT_CHECK(r == 0 && codes[1] == 0 && (world < 3 || codes[2] == 0),
                     "world %d case %d: rank 0 line %d, peers exit %d %d", world, mode, r, codes[1], world > 2 ? codes[2] : 0);
        }
}

/* Ranks reporting grads in different orders with another collective on the
   same comm in between (SyncBatchNorm's backward): without delay_allreduce
   rank 0's first bucket pairs with rank 1's other allreduce (same size: the
   data mix silently, as capex.h says); with it every bucket starts in
   finalize, after the other collective on every rank. */
static int tcp_interleave_body(int rank, int world, int port, int mode) {
    capex_dist_env env;
    capex_comm c;
    capex_ddp *g = NULL;
    capex_ddp_param ps[2];
    capex_ddp_desc d;
    float data[2][4], other[4];
    size_t p, i;
    int ok = 1;
    (void)mode;
    memset(&env, 0, sizeof env);
    env.rank = rank; env.world_size = world; env.local_rank = rank; env.local_world_size = world;
    strcpy(env.master_addr, "127.0.0.1");
    env.master_port = port;
    strcpy(env.run_id, "tcp-test");
    if (capex_comm_init_tcp(&c, &env, CT_HANG_GUARD_S) != CAPEX_OK) return __LINE__;
    c.timeout_s = CT_HANG_GUARD_S;
    for (p = 0; p < 2; p++) { ps[p].data = data[p]; ps[p].numel = 4; ps[p].dtype = CAPEX_F32; ps[p].grad = NULL; }
    capex_ddp_desc_init(&d);
    d.first_bucket_bytes = d.bucket_bytes = 16; /* one bucket per param */
    d.gradient_average = 0;
    d.delay_allreduce = 1;
    if (capex_ddp_create(&g, &c, ps, 2, &d) != CAPEX_OK) return __LINE__;
    for (p = 0; p < 2; p++) for (i = 0; i < 4; i++) ((float *)capex_ddp_grad(g, p))[i] = (float)(p + 1);
    for (i = 0; i < 4; i++) other[i] = 100.0f;
    if (capex_ddp_grad_ready(g, rank == 0 ? 1 : 0) != CAPEX_OK) return __LINE__;
    if (capex_comm_allreduce(&c, other, other, 4, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_OK) return __LINE__;
    if (capex_ddp_grad_ready(g, rank == 0 ? 0 : 1) != CAPEX_OK) return __LINE__;
    if (capex_ddp_finalize(g) != CAPEX_OK) return __LINE__;
    for (i = 0; i < 4; i++)
        ok &= other[i] == 200.0f && ((float *)capex_ddp_grad(g, 0))[i] == 2.0f && ((float *)capex_ddp_grad(g, 1))[i] == 4.0f;
    capex_ddp_destroy(g);
    capex_comm_destroy(&c);
    return ok ? 0 : __LINE__;
}

CT_TEST(tcp_ddp_delay_allreduce_keeps_other_collectives_apart) {
    int codes[8], r = fork_world(2, 0, codes, tcp_interleave_body);
    CT_CHECK(r == 0 && codes[1] == 0, "rank 0 line %d, rank 1 exit %d: %.300s", r, codes[1], capex_last_error());
}

/* What a torch DDP user does at once, on 3 (and 2) real ranks over TCP:
   params of three dtypes with an empty one and an engine-owned grad, small
   buckets, rebuild_buckets and find_unused_parameters, every step two
   micro-batches (no_sync, then synced), each rank reporting grads in its own
   order and using its own subset of the params (the rest marked unused or
   left to finalize). Grads are small integers, so the reduced grads must
   equal the sums exactly (averages: world 2); every rank must end with the
   same bucket layout (rank 0's ready order) and the same grads. */
#define MIX_NP 6
static const size_t mix_numel[MIX_NP] = {5, 3, 0, 9, 17, 1};
static const capex_dtype mix_dt[MIX_NP] = {CAPEX_F32, CAPEX_F16, CAPEX_F32, CAPEX_BF16, CAPEX_F32, CAPEX_F16};
static int mix_val(int r, int s, int m, size_t p, size_t i) { return (int)((r * 7 + s * 3 + m * 5 + (int)p * 11 + (int)i) % 9) - 4; }
static int mix_used(int r, int s, int m, size_t p) { return (r + s + m + (int)p) % 4 != 0; }
static uint64_t mix_layout_hash(capex_ddp *g) {
    uint64_t h = 1469598103934665603ull;
    size_t k, i;
    for (k = 0; k < capex_ddp_num_buckets(g); k++) {
        capex_ddp_bucket_info bi;
        capex_ddp_bucket(g, k, &bi);
        h = (h ^ (uint64_t)bi.dtype) * 1099511628211ull;
        for (i = 0; i < bi.num_params; i++) h = (h ^ (bi.params[i] * 131 + bi.offsets[i])) * 1099511628211ull;
    }
    return h;
}
/* mode 1: delay_allreduce, allreduce_always_fp32, predivide 2 (exact on these values) */
static int ddp_mix_body(int rank, int world, int port, int mode) {
    capex_dist_env env;
    capex_comm c;
    capex_ddp *g = NULL;
    capex_ddp_param ps[MIX_NP];
    capex_ddp_desc d;
    static float data[MIX_NP][32], own[32];
    int s, m, r, avg = world == 2;
    size_t p, i;
    memset(&env, 0, sizeof env);
    env.rank = rank; env.world_size = world; env.local_rank = rank; env.local_world_size = world;
    strcpy(env.master_addr, "127.0.0.1");
    env.master_port = port;
    strcpy(env.run_id, "ddp-mix");
    if (capex_comm_init_tcp(&c, &env, CT_HANG_GUARD_S) != CAPEX_OK) return __LINE__;
    c.timeout_s = CT_HANG_GUARD_S;
    for (p = 0; p < MIX_NP; p++) {
        ps[p].data = data[p]; ps[p].numel = mix_numel[p]; ps[p].dtype = mix_dt[p]; ps[p].grad = p == 4 ? own : NULL;
    }
    memset(own, 0, sizeof own);
    capex_ddp_desc_init(&d);
    d.first_bucket_bytes = 8; d.bucket_bytes = 24;
    d.rebuild_buckets = 1;
    d.find_unused_parameters = 1;
    d.gradient_average = avg;
    if (mode == 1) { d.delay_allreduce = 1; d.allreduce_always_fp32 = 1; d.gradient_predivide_factor = 2.0f; }
    if (capex_ddp_create(&g, &c, ps, MIX_NP, &d) != CAPEX_OK) return __LINE__;
    for (s = 0; s < 4; s++) {
        for (m = 0; m < 2; m++) {
            size_t order[MIX_NP];
            uint64_t st = (uint64_t)(rank * 1000 + s * 10 + m + 1) * 0x9e3779b97f4a7c15ull;
            if (capex_ddp_set_sync(g, m == 1) != CAPEX_OK) return __LINE__;
            for (p = 0; p < MIX_NP; p++) order[p] = p;
            for (p = MIX_NP; p > 1; p--) { /* this rank's own ready order */
                size_t j, t;
                st ^= st << 13; st ^= st >> 7; st ^= st << 17;
                j = (size_t)(st % p); t = order[p - 1]; order[p - 1] = order[j]; order[j] = t;
            }
            for (i = 0; i < MIX_NP; i++) {
                size_t q = order[i], k;
                void *gv = capex_ddp_grad(g, q);
                if (!mix_used(rank, s, m, q)) {
                    if ((q + (size_t)s) % 2 && capex_ddp_mark_unused(g, q) != CAPEX_OK) return __LINE__;
                    continue; /* else left to finalize */
                }
                for (k = 0; k < mix_numel[q]; k++)
                    capex__store(gv, mix_dt[q], k, capex__load(gv, mix_dt[q], k) + (float)mix_val(rank, s, m, q, k));
                if (capex_ddp_grad_ready(g, q) != CAPEX_OK) return __LINE__;
            }
            if (capex_ddp_finalize(g) != CAPEX_OK) {
                fprintf(stderr, "rank %d step %d micro %d: %s\n", rank, s, m, capex_last_error());
                return __LINE__;
            }
        }
        for (p = 0; p < MIX_NP; p++) {
            const void *gv = capex_ddp_grad(g, p);
            for (i = 0; i < mix_numel[p]; i++) {
                double want = 0, got = capex__load(gv, mix_dt[p], i);
                for (r = 0; r < world; r++)
                    for (m = 0; m < 2; m++) want += mix_used(r, s, m, p) ? mix_val(r, s, m, p, i) : 0;
                if (avg) want /= world;
                else if (mode == 1) want /= 2; /* the predivide stays without averaging (Apex) */
                if (got != want) {
                    fprintf(stderr, "rank %d step %d param %zu [%zu]: %g, want %g\n", rank, s, p, i, got, want);
                    return __LINE__;
                }
            }
        }
        { /* one layout on every rank, rebuilt once */
            int64_t mine[2], all[2 * 8];
            mine[0] = (int64_t)mix_layout_hash(g);
            mine[1] = capex_ddp_layout_version(g);
            if (capex_comm_allgather(&c, mine, all, 2, CAPEX_I64) != CAPEX_OK) return __LINE__;
            for (r = 1; r < world; r++) if (all[2 * r] != all[0] || all[2 * r + 1] != all[1]) return __LINE__;
            if (all[1] != 1) return __LINE__;
        }
        if (capex_ddp_zero_grad(g) != CAPEX_OK) return __LINE__;
    }
    capex_ddp_destroy(g);
    capex_comm_destroy(&c);
    return 0;
}

CT_TEST(tcp_ddp_mixed_dtypes_orders_unused_no_sync_rebuild) {
    int world, mode;
    for (mode = 0; mode < 2; mode++)
        for (world = 2; world <= 3; world++) {
            int codes[8] = {0}, r = fork_world(world, mode, codes, ddp_mix_body);
            CT_CHECK(r == 0 && codes[1] == 0 && codes[2] == 0, "mode %d world %d: rank 0 line %d, peers exit %d %d", mode,
                     world, r, codes[1], codes[2]);
        }
}

/* A DDP destroyed mid-iteration on every rank (an error in backward), one
   bucket already reduced and one half full: the comm stays in step (the next
   collective pairs with the peers' next one, not with a bucket) and a new
   DDP on it trains. Mode 1: delay_allreduce (nothing launched yet). */
static int ddp_destroy_mid_body(int rank, int world, int port, int mode) {
    capex_dist_env env;
    capex_comm c;
    capex_ddp *g = NULL;
    capex_ddp_param ps[4];
    capex_ddp_desc d;
    float data[4][4], x[3];
    size_t p, i;
    int it;
    memset(&env, 0, sizeof env);
    env.rank = rank; env.world_size = world; env.local_rank = rank; env.local_world_size = world;
    strcpy(env.master_addr, "127.0.0.1");
    env.master_port = port;
    strcpy(env.run_id, "ddp-destroy");
    if (capex_comm_init_tcp(&c, &env, CT_HANG_GUARD_S) != CAPEX_OK) return __LINE__;
    c.timeout_s = CT_HANG_GUARD_S;
    for (p = 0; p < 4; p++) { ps[p].data = data[p]; ps[p].numel = 4; ps[p].dtype = CAPEX_F32; ps[p].grad = NULL; }
    capex_ddp_desc_init(&d);
    d.first_bucket_bytes = d.bucket_bytes = 32; /* buckets {3,2}, {1,0} */
    d.delay_allreduce = mode;
    for (it = 0; it < 2; it++) {
        if (capex_ddp_create(&g, &c, ps, 4, &d) != CAPEX_OK) return __LINE__;
        for (p = 4; p-- > 0;) {
            for (i = 0; i < 4; i++) ((float *)capex_ddp_grad(g, p))[i] = (float)(rank + 1);
            if (it == 0 && p == 0) break; /* backward fails before the last grad */
            if (capex_ddp_grad_ready(g, p) != CAPEX_OK) return __LINE__;
        }
        if (it == 1) {
            if (capex_ddp_finalize(g) != CAPEX_OK) return __LINE__;
            for (p = 0; p < 4; p++) if (((float *)capex_ddp_grad(g, p))[3] != (float)(world + 1) / 2.0f) return __LINE__;
        }
        capex_ddp_destroy(g);
        for (i = 0; i < 3; i++) x[i] = (float)(rank * 10 + (int)i);
        if (capex_comm_allreduce(&c, x, x, 3, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_OK) return __LINE__;
        if (x[2] != (float)(10 * world * (world - 1) / 2 + 2 * world)) return __LINE__;
    }
    capex_comm_destroy(&c);
    return 0;
}

CT_TEST(tcp_ddp_destroyed_mid_iteration_leaves_the_comm_usable) {
    int mode;
    for (mode = 0; mode < 2; mode++) {
        int codes[8] = {0}, r = fork_world(2, mode, codes, ddp_destroy_mid_body);
        CT_CHECK(r == 0 && codes[1] == 0, "mode %d: rank 0 line %d, rank 1 exit %d: %.300s", mode, r, codes[1],
                 capex_last_error());
    }
}

/* Rank 1 runs out of memory in the rebuild (mode 0: a new bucket's buffer,
   after the order's broadcast; mode 1: the order's own buffer, before it):
   every rank's finalize fails there, not only rank 1's (its peers went on
   into the next iteration and waited out their deadline in its first
   bucket, or in the broadcast), and the comm stays in step. */
static int ddp_rebuild_oom_body(int rank, int world, int port, int mode) {
    capex_dist_env env;
    capex_comm c;
    capex_ddp *g = NULL;
    capex_ddp_param ps[5];
    capex_ddp_desc d;
    float data[5][6], x[2];
    size_t p, i;
    capex_result r;
    int bad = 0;
    memset(&env, 0, sizeof env);
    env.rank = rank; env.world_size = world; env.local_rank = rank; env.local_world_size = world;
    strcpy(env.master_addr, "127.0.0.1");
    env.master_port = port;
    strcpy(env.run_id, "ddp-rebuild-oom");
    if (capex_comm_init_tcp(&c, &env, CT_HANG_GUARD_S) != CAPEX_OK) return __LINE__;
    c.timeout_s = CT_HANG_GUARD_S;
    for (p = 0; p < 5; p++) { ps[p].data = data[p]; ps[p].numel = 6; ps[p].dtype = CAPEX_F32; ps[p].grad = NULL; }
    capex_ddp_desc_init(&d);
    d.first_bucket_bytes = d.bucket_bytes = 48; /* buckets {4,3}, {2,1}, {0}: 48-byte buffers */
    d.rebuild_buckets = 1;
    if (capex_ddp_create(&g, &c, ps, 5, &d) != CAPEX_OK) return __LINE__;
    for (p = 5; p-- > 0;) {
        for (i = 0; i < 6; i++) ((float *)capex_ddp_grad(g, p))[i] = (float)(rank + 1);
        if (capex_ddp_grad_ready(g, p) != CAPEX_OK) return __LINE__;
    }
    if (rank == 1) g_fail_alloc_size = mode == 0 ? 48 : 5 * sizeof(uint32_t);
    r = capex_ddp_finalize(g);
    /* a wrong answer is noted and the collectives go on, so no rank waits for one that left */
    if (rank == 1 && g_fail_alloc_size) bad = __LINE__; /* the chosen allocation never came: the test is wrong */
    else if (r != (rank == 1 ? CAPEX_ERR_OUT_OF_MEMORY : CAPEX_ERR_COMM)) bad = __LINE__;
    else if (capex_ddp_finalize(g) != CAPEX_ERR_COMM) bad = __LINE__; /* failed: refuses further use */
    g_fail_alloc_size = 0;
    capex_ddp_destroy(g);
    x[0] = (float)rank; x[1] = 1.0f;
    if (capex_comm_allreduce(&c, x, x, 2, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_OK) return __LINE__;
    if (x[0] != (float)(world * (world - 1) / 2) || x[1] != (float)world) return __LINE__;
    capex_comm_destroy(&c);
    return bad;
}

CT_TEST(tcp_ddp_rebuild_out_of_memory_on_one_rank_fails_every_rank) {
    int mode;
    for (mode = 0; mode < 2; mode++) {
        int codes[8] = {0}, r = fork_world(3, mode, codes, ddp_rebuild_oom_body);
        CT_CHECK(r == 0 && codes[1] == 0 && codes[2] == 0, "mode %d: rank 0 line %d, ranks 1, 2 exit %d, %d: %.300s", mode,
                 r, codes[1], codes[2], capex_last_error());
    }
}

CT_TEST(tcp_comm_dead_stalled_and_mismatched_peers) {
    int codes[8], r;
    r = tcp_world(2, 1, codes);
    CT_CHECK(r == 0, "dead peer -> CAPEX_ERR_COMM (line %d: %.300s)", r, capex_last_error());
    CT_CHECK(pipe(tcp_local_fail_pipe) == 0, "pipe");
    r = tcp_world(2, 2, codes);
    close(tcp_local_fail_pipe[0]);
    CT_CHECK(r == 0, "stalled peer -> CAPEX_ERR_TIMEOUT (line %d: %.300s)", r, capex_last_error());
    r = tcp_world(2, 3, codes);
    CT_CHECK(r == 0, "mismatch -> CAPEX_ERR_COMM (line %d: %.300s)", r, capex_last_error());
    CT_CHECK(pipe(tcp_local_fail_pipe) == 0, "pipe");
    r = tcp_world(3, 4, codes);
    close(tcp_local_fail_pipe[0]);
    CT_CHECK(r == 0 && codes[1] == 0 && codes[2] == 0,
             "rank 2 dead: rank 0 CAPEX_ERR_COMM (line %d) and its abort fails rank 1 at once (exit %d, not a timeout)", r,
             codes[1]);
    {
        capex_dist_env env;
        capex_comm c;
        memset(&env, 0, sizeof env);
        env.world_size = 2;
        CT_CHECK(capex_comm_init_tcp(&c, &env, 1.0) == CAPEX_ERR_CONFIG, "no MASTER_ADDR");
        env.world_size = 1;
        CT_CHECK(capex_comm_init_tcp(&c, &env, 1.0) == CAPEX_OK && c.world_size == 1, "world 1 is single");
        capex_comm_destroy(&c);
    }
}

/* A hand-filled env's port out of range is a configuration error, not a
   listen on port & 0xffff (getaddrinfo reads "70000" as 4464). */
/* A collective of no elements is still a collective: rank 0 passing 0
   while rank 1 passes 4 fails both, instead of rank 0 returning at once and
   pairing its next allreduce with rank 1's first one (silently wrong). */
CT_TEST(tcp_comm_count_zero_against_n) {
    int codes[8] = {0}, r = tcp_world(2, 10, codes);
    CT_CHECK(r == 0 && codes[1] == 0, "rank 0 line %d, rank 1 exit %d: %.300s", r, codes[1], capex_last_error());
}

CT_TEST(tcp_comm_port_out_of_range) {
    capex_dist_env env;
    capex_comm c;
    int ports[3][2] = {{70000, 0}, {0, 65536}, {-5, 0}}, i;
    for (i = 0; i < 3; i++) {
        memset(&env, 0, sizeof env);
        env.world_size = 2;
        strcpy(env.master_addr, "127.0.0.1");
        env.master_port = ports[i][0];
        env.rdv_port = ports[i][1];
        CT_CHECK(capex_comm_init_tcp(&c, &env, 0.3) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "65535"),
                 "master_port %d, rdv_port %d: %.200s", ports[i][0], ports[i][1], capex_last_error());
    }
}

CT_TEST(tcp_comm_reduce_scatter_allgatherv_vs_float64) {
    int world, mode, codes[8], r, i;
    for (mode = 6; mode <= 7; mode++)
        for (world = 1; world <= 4; world++) {
            for (i = 0; i < 8; i++) codes[i] = 0;
            r = tcp_world(world, mode, codes);
            CT_CHECK(r == 0, "%s, world %d: rank 0 failed at line %d (its stderr says why)",
                     mode == 6 ? "TCP entries" : "front-end fallbacks", world, r);
            for (i = 1; i < world; i++) CT_CHECK(codes[i] == 0, "world %d mode %d: rank %d exit %d", world, mode, i, codes[i]);
        }
}

CT_TEST(tcp_ring_dead_and_stalled_peers) {
    int codes[8] = {0}, r;
    /* dead: CAPEX_ERR_COMM (EOF or reset), never the deadline's CAPEX_ERR_TIMEOUT */
    r = tcp_world(3, 8, codes);
    CT_CHECK(r == 0 && codes[2] == 0, "rank 1 dead mid-ring: rank 0 line %d, rank 2 exit %d (want CAPEX_ERR_COMM)", r, codes[2]);
    CT_CHECK(pipe(tcp_local_fail_pipe) == 0, "pipe");
    r = tcp_world(3, 9, codes);
    close(tcp_local_fail_pipe[0]);
    CT_CHECK(r == 0 && codes[2] == 0, "rank 1 stalled mid-ring: rank 0 line %d, rank 2 exit %d (want TIMEOUT, TIMEOUT or COMM)", r,
             codes[2]);
}

/* A rank that fails on its own mid-collective (no memory for its scratch, a
   NULL buffer only it passes) must not leave the others waiting out their
   deadline: they get CAPEX_ERR_COMM at once (60 s timeouts are hang guards),
   the failing rank its own status, and every later call fails on all ranks. */
CT_TEST(tcp_comm_local_failure_on_one_rank_fails_the_others) {
    static const int modes[4] = {11, 12, 13, 20};
    int m, mode, world, codes[8], r, i;
    for (m = 0; m < 4; m++)
        for (mode = modes[m], world = 2; world <= 3; world++) {
            for (i = 0; i < 8; i++) codes[i] = 0;
            CT_CHECK(pipe(tcp_local_fail_pipe) == 0, "pipe");
            r = tcp_world(world, mode, codes);
            close(tcp_local_fail_pipe[0]);
            CT_CHECK(r == 0, "mode %d world %d: rank 0 line %d: %.300s", mode, world, r, capex_last_error());
            for (i = 1; i < world; i++) CT_CHECK(codes[i] == 0, "mode %d world %d: rank %d exit %d", mode, world, i, codes[i]);
        }
}

/* A call refused by rank 0 alone (a NULL buffer, count 0) where the peers
   first wait to read from rank 0 (a broadcast from it; the ring, whose rank 1
   reads rank 0 first): the peers get CAPEX_ERR_COMM at once, not at their
   deadline (rank 0's stand-in barrier used to wait to read from them). */
CT_TEST(tcp_comm_call_refused_by_rank0_fails_waiting_peers) {
    int mode, world, codes[8], r, i;
    for (mode = 21; mode <= 23; mode++)
        for (world = mode == 21 ? 2 : 3; world <= 3; world++) {
            for (i = 0; i < 8; i++) codes[i] = 0;
            r = tcp_world(world, mode, codes);
            CT_CHECK(r == 0, "mode %d world %d: rank 0 line %d: %.300s", mode, world, r, capex_last_error());
            for (i = 1; i < world; i++) CT_CHECK(codes[i] == 0, "mode %d world %d: rank %d exit %d", mode, world, i, codes[i]);
        }
}

/* Ranks reducing the same number of bytes as different dtypes (f32 x4 and
   f16 x8, int64 and f64) or with different ops (SUM and AVG) fail with
   CAPEX_ERR_COMM on every rank, on the star and on the ring, instead of
   summing one type's bits as another's or dividing on some ranks only. */
CT_TEST(tcp_comm_dtype_or_op_mismatch_fails) {
    int mode, world, codes[8], r, i;
    for (mode = 14; mode <= 17; mode++)
        for (world = 2; world <= 3; world++) {
            for (i = 0; i < 8; i++) codes[i] = 0;
            r = tcp_world(world, mode, codes);
            CT_CHECK(r == 0, "mode %d world %d: rank 0 line %d: %.300s", mode, world, r, capex_last_error());
            for (i = 1; i < world; i++) CT_CHECK(codes[i] == 0, "mode %d world %d: rank %d exit %d", mode, world, i, codes[i]);
        }
}

/* Ranks passing different roots to a broadcast fail with CAPEX_ERR_COMM on
   every rank in that call: rank 0 names the roots, the peers get its notice.
   Before, ranks that all only sent returned CAPEX_OK (the mismatch showed at
   the next collective, or never), and ranks that all waited timed out. */
CT_TEST(tcp_comm_broadcast_root_mismatch_fails) {
    int mode, world, codes[8], r, i;
    for (mode = 31; mode <= 33; mode++)
        for (world = 2; world <= 3; world++) {
            for (i = 0; i < 8; i++) codes[i] = 0;
            r = tcp_world(world, mode, codes);
            CT_CHECK(r == 0, "mode %d world %d: rank 0 line %d (its stderr says why)", mode, world, r);
            for (i = 1; i < world; i++) CT_CHECK(codes[i] == 0, "mode %d world %d: rank %d exit %d", mode, world, i, codes[i]);
        }
}

/* One rank passes another count to a broadcast (roots 0 and 1, the odd rank
   a peer or rank 0): every rank fails in that call (CAPEX_ERR_COMM), as
   capex_comm_init_tcp's manual says; the root used to send, return
   CAPEX_OK and pair its next call with the peers' failure. Worlds 2, 3. */
CT_TEST(tcp_comm_broadcast_count_mismatch_fails_every_rank) {
    int mode, world, codes[8], r, i;
    for (mode = 38; mode <= 40; mode++)
        for (world = 2; world <= 3; world++) {
            for (i = 0; i < 8; i++) codes[i] = 0;
            r = tcp_world(world, mode, codes);
            CT_CHECK(r == 0, "mode %d world %d: rank 0 line %d (its stderr says why)", mode, world, r);
            for (i = 1; i < world; i++) CT_CHECK(codes[i] == 0, "mode %d world %d: rank %d exit %d", mode, world, i, codes[i]);
        }
}

/* The last rank passes a counts array with two ranks' counts swapped (the
   same total) to allgatherv or reduce-scatter, star and ring: every rank
   fails in that call (CAPEX_ERR_COMM). The headers carried only byte sizes,
   so some ranks returned CAPEX_OK (all of them in a world of 3's star
   allgatherv, the last one with its shards at the wrong offsets). */
CT_TEST(tcp_comm_counts_mismatch_fails_every_rank) {
    int mode, world, codes[8], r, i;
    for (mode = 41; mode <= 44; mode++)
        for (world = 2; world <= 3; world++) {
            for (i = 0; i < 8; i++) codes[i] = 0;
            r = tcp_world(world, mode, codes);
            CT_CHECK(r == 0, "mode %d world %d: rank 0 line %d (its stderr says why)", mode, world, r);
            for (i = 1; i < world; i++) CT_CHECK(codes[i] == 0, "mode %d world %d: rank %d exit %d", mode, world, i, codes[i]);
        }
}

/* A peer refusing a broadcast from rank 0 (a NULL buffer): rank 0, the
   root, now waits for every peer's word and fails in that call
   (CAPEX_ERR_COMM) with the others; it used to only send, return CAPEX_OK
   and fail at its next call. Worlds 2 and 3. */
CT_TEST(tcp_comm_broadcast_root_fails_with_a_refusing_peer) {
    int world, codes[8], r, i;
    for (world = 2; world <= 3; world++) {
        for (i = 0; i < 8; i++) codes[i] = 0;
        r = tcp_world(world, 37, codes);
        CT_CHECK(r == 0, "world %d: rank 0 line %d (its stderr says why)", world, r);
        for (i = 1; i < world; i++) CT_CHECK(codes[i] == 0, "world %d: rank %d exit %d", world, i, codes[i]);
    }
}

/* Worlds of 3 and 4 where one rank's count is under the ring's threshold
   and the others' over it (allreduce, reduce-scatter, allgatherv): the
   star rank and the ring ranks waited on links nobody wrote until the
   deadline (CAPEX_ERR_TIMEOUT); now every rank gets CAPEX_ERR_COMM in that
   call, rank 0's error saying which count went over which path. */
CT_TEST(tcp_comm_star_ring_mismatch_fails) {
    int mode, world, codes[8], r, i;
    for (mode = 34; mode <= 36; mode++)
        for (world = 3; world <= 4; world++) {
            for (i = 0; i < 8; i++) codes[i] = 0;
            r = tcp_world(world, mode, codes);
            CT_CHECK(r == 0, "mode %d world %d: rank 0 line %d (its stderr says why)", mode, world, r);
            for (i = 1; i < world; i++) CT_CHECK(codes[i] == 0, "mode %d world %d: rank %d exit %d", mode, world, i, codes[i]);
        }
}

/* MASTER_ADDR "::1": the rendezvous, the star and the ring's links (ranks
   2.. listen where their IPv6 star socket is) carry a star and a ring
   allreduce in worlds 2 and 3. Skipped where ::1 cannot be bound. */
CT_TEST(tcp_comm_over_ipv6_loopback) {
    struct sockaddr_in6 a;
    int s6 = socket(AF_INET6, SOCK_STREAM, 0), ok, world, codes[8], r, i;
    memset(&a, 0, sizeof a);
    a.sin6_family = AF_INET6;
    a.sin6_addr = in6addr_loopback;
    ok = s6 >= 0 && bind(s6, (struct sockaddr *)&a, sizeof a) == 0;
    if (s6 >= 0) close(s6);
    if (!ok) CT_SKIP("no IPv6 loopback here");
    for (world = 2; world <= 3; world++) {
        for (i = 0; i < 8; i++) codes[i] = 0;
        r = tcp_world(world, 18, codes);
        CT_CHECK(r == 0, "world %d: rank 0 line %d: %.300s", world, r, capex_last_error());
        for (i = 1; i < world; i++) CT_CHECK(codes[i] == 0, "world %d: rank %d exit %d", world, i, codes[i]);
    }
}

/* kill -9 of a rank during a stream of ring allreduces (its timer fires
   after 50 ms; where it lands does not matter): every other rank returns
   CAPEX_ERR_COMM, none waits out its 60 s hang guard. */
CT_TEST(tcp_comm_rank_killed_mid_collective) {
    int codes[8] = {0}, r = tcp_world(3, 19, codes);
    CT_CHECK(r == 0 && codes[2] == 0, "rank 0 line %d, rank 2 exit %d: %.300s", r, codes[2], capex_last_error());
    CT_CHECK(codes[1] == 100, "rank 1 was killed (exit %d)", codes[1]);
}

CT_TEST(tcp_comm_refuses_sizes_that_wrap) {
    int codes[8], r = tcp_world(2, 5, codes);
    CT_CHECK(r == 0, "rank 0 failed at line %d: %.300s", r, capex_last_error());
    CT_CHECK(codes[1] == 0, "rank 1 exit %d", codes[1]);
}

/* torchrun --no-python, simulated: the launcher's variables in the real
   environment of 3 processes, read with capex_dist_env_read(NULL) and turned
   into a comm by capex_comm_init_auto. */
CT_TEST(torchrun_style_launch_auto_comm) {
    pid_t pids[3];
    int port = free_port(), i, ok = 1;
    char portbuf[16];
    snprintf(portbuf, sizeof portbuf, "%d", port);
    fflush(stdout);
    for (i = 0; i < 3; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            char rk[8];
            capex_dist_env env;
            capex_comm c;
            float x;
            snprintf(rk, sizeof rk, "%d", i);
            setenv("RANK", rk, 1); setenv("LOCAL_RANK", rk, 1);
            setenv("WORLD_SIZE", "3", 1); setenv("LOCAL_WORLD_SIZE", "3", 1);
            setenv("MASTER_ADDR", "127.0.0.1", 1); setenv("MASTER_PORT", portbuf, 1);
            setenv("TORCHELASTIC_RUN_ID", "sim-run", 1);
            if (capex_dist_env_read(NULL, &env) != CAPEX_OK || env.launcher != CAPEX_LAUNCHER_TORCHRUN) _exit(2);
            capex_dist_log_init(&env);
            if (capex_comm_init_auto(&c, &env) != CAPEX_OK || c.world_size != 3 || c.rank != i) _exit(3);
            x = (float)(i + 1);
            if (capex_comm_allreduce(&c, &x, &x, 1, CAPEX_F32, CAPEX_REDUCE_AVG) != CAPEX_OK || x != 2.0f) _exit(4);
            capex_comm_destroy(&c);
            _exit(0);
        }
    }
    for (i = 0; i < 3; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ok = 0;
    }
    CT_CHECK(ok, "every simulated torchrun worker must finish its allreduce");
}


/* An env filled by hand (rdv_port 0) under torchrun's agent store takes the
   rule of capex_dist_env_read from the process environment: capex meets on
   MASTER_PORT + 1. The "store" here is a listener held on MASTER_PORT, so a
   rendezvous on that port could not listen. */
CT_TEST(hand_env_agent_store_meets_on_next_port) {
    struct sockaddr_in a;
    socklen_t len = sizeof a;
    int store = socket(AF_INET, SOCK_STREAM, 0), port = 0, i, ok = 1;
    pid_t pids[2];
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(0x7f000001u);
    if (store >= 0 && bind(store, (struct sockaddr *)&a, sizeof a) == 0 && listen(store, 4) == 0 &&
        getsockname(store, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (port <= 0 || port >= 65535) {
        if (store >= 0) close(store);
        CT_SKIP("no loopback port for the store");
    }
    fflush(stdout);
    fflush(stderr);
    for (i = 0; i < 2; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            capex_dist_env env;
            capex_comm c;
            float x = (float)(i + 1);
            close(store);
            setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
            unsetenv("CAPEX_PORT");
            memset(&env, 0, sizeof env);
            env.launcher = CAPEX_LAUNCHER_TORCHRUN;
            env.rank = i; env.world_size = 2; env.local_rank = i; env.local_world_size = 2;
            strcpy(env.master_addr, "127.0.0.1");
            env.master_port = port;
            strcpy(env.run_id, "agent-store");
            if (capex_comm_init_tcp(&c, &env, CT_HANG_GUARD_S) != CAPEX_OK) _exit(2);
            if (capex_comm_allreduce(&c, &x, &x, 1, CAPEX_F32, CAPEX_REDUCE_SUM) != CAPEX_OK || x != 3.0f) _exit(3);
            capex_comm_destroy(&c);
            _exit(0);
        }
    }
    for (i = 0; i < 2; i++) {
        int st = 0;
        waitpid(pids[i], &st, 0);
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ok = 0;
    }
    close(store);
    CT_CHECK(ok, "both ranks meet on MASTER_PORT + 1 (%d) beside the store on %d", port + 1, port);
}

/* ... and MASTER_PORT=65535 there has no next port: refused, as
   capex_dist_env_read refuses it, naming the variables (not a rendezvous on
   the store's own port). */
CT_TEST(hand_env_agent_store_port_65535_refused) {
    capex_dist_env env;
    capex_comm c;
    char blob[4] = {0};
    int ok1, ok2;
    pid_t pid;
    int st = 0;
    fflush(stdout);
    fflush(stderr);
    pid = fork(); /* the environment is changed in a child only */
    if (pid == 0) {
        setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
        unsetenv("CAPEX_PORT");
        memset(&env, 0, sizeof env);
        env.launcher = CAPEX_LAUNCHER_TORCHRUN;
        env.rank = 1; env.world_size = 2; env.local_rank = 1; env.local_world_size = 2;
        strcpy(env.master_addr, "127.0.0.1");
        env.master_port = 65535;
        ok1 = capex_comm_init_tcp(&c, &env, 0.3) == CAPEX_ERR_CONFIG && strstr(capex_last_error(), "MASTER_PORT=65535") &&
              strstr(capex_last_error(), "TORCHELASTIC_USE_AGENT_STORE");
        if (!ok1) fprintf(stderr, "comm_init_tcp: %.300s\n", capex_last_error());
        ok2 = capex_dist_broadcast_blob(&env, NULL, blob, sizeof blob, 0.3) == CAPEX_ERR_CONFIG &&
              strstr(capex_last_error(), "MASTER_PORT=65535") && strstr(capex_last_error(), "TORCHELASTIC_USE_AGENT_STORE");
        if (!ok2) fprintf(stderr, "broadcast_blob: %.300s\n", capex_last_error());
        _exit(ok1 && ok2 ? 0 : 1);
    }
    waitpid(pid, &st, 0);
    CT_CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "a hand-filled torchrun env with the agent store and MASTER_PORT=65535 "
             "must be refused with CAPEX_ERR_CONFIG naming MASTER_PORT=65535 and TORCHELASTIC_USE_AGENT_STORE (see stderr)");
}


static const ct_case cases[] = {

    CT_CASE(env_none_is_single_process),
    CT_CASE(env_torchrun), CT_CASE(env_rendezvous_port_beside_torchrun_store),
    CT_CASE(hand_env_agent_store_meets_on_next_port), CT_CASE(hand_env_agent_store_port_65535_refused),
    CT_CASE(env_openmpi_pmi_slurm),
    CT_CASE(env_slurm_tasks_per_node_parser),
    CT_CASE(env_flux),
    CT_CASE(env_overrides_and_run_id_precedence),
    CT_CASE(env_errors_are_config_and_named),
    CT_CASE(sampler_matches_torch_transcription),
    CT_CASE(sampler_torch_formulas_by_hand),
    CT_CASE(sampler_refuses_failed_zeroed_or_edited),
    CT_CASE(sampler_shards_disjoint_complete_and_epoch_dependent),
    CT_CASE(permutation_is_a_bijection),
    CT_CASE(bucket_layout_matches_pytorch_assignment),
    CT_CASE(ddp_create_errors),
    CT_CASE(create_model_check_verdicts),
    CT_CASE(tracker_launches_in_order_during_backward),
    CT_CASE(tracker_later_bucket_waits_for_earlier),
    CT_CASE(tracker_progress_polls_each_finished_bucket_once),
    CT_CASE(tracker_destroy_waits_for_launched_buckets),
    CT_CASE(tracker_delay_allreduce_and_sync_backend),
    CT_CASE(tracker_predivide_and_average),
    CT_CASE(tracker_allreduce_always_fp32_with_bf16),
    CT_CASE(tracker_fp16_average_overflow_by_predivide),
    CT_CASE(tracker_no_sync_accumulates),
    CT_CASE(tracker_mark_unused_under_no_sync_accumulates_nothing),
    CT_CASE(tracker_random_calls_against_a_model),
    CT_CASE(tracker_unused_parameters),
    CT_CASE(tracker_errors),
    CT_CASE(tracker_launch_failure_mid_backward),
    CT_CASE(tracker_engine_owned_grads_are_copied),
    CT_CASE(tracker_rebuild_from_ready_order), CT_CASE(tracker_rebuild_out_of_memory_keeps_the_old_layout),
    CT_CASE(comm_single_and_errors),
    CT_CASE(rendezvous_success_and_late_ranks),
    CT_CASE(rendezvous_wrong_nonce_is_refused),
    CT_CASE(rendezvous_refuses_the_version_1_wire_format),
    CT_CASE(rendezvous_missing_rank_times_out),
    CT_CASE(rendezvous_bad_peer_of_this_run_fails),
    CT_CASE(rendezvous_arguments),
    CT_CASE(broadcast_blob_bootstrap),
    CT_CASE(broadcast_blob_size_that_wraps),
    CT_CASE(rendezvous_flood_of_stray_connections),
    CT_CASE(rendezvous_out_of_descriptors),
    CT_CASE(rendezvous_peer_against_busy_or_fake_rank0),
    CT_CASE(tcp_comm_collectives_and_ddp),
    CT_CASE(tcp_create_refuses_different_models_on_every_rank),
    CT_CASE(tcp_ddp_delay_allreduce_keeps_other_collectives_apart),
    CT_CASE(tcp_ddp_mixed_dtypes_orders_unused_no_sync_rebuild),
    CT_CASE(tcp_ddp_destroyed_mid_iteration_leaves_the_comm_usable), CT_CASE(tcp_ddp_rebuild_out_of_memory_on_one_rank_fails_every_rank),
    CT_CASE(tcp_comm_dead_stalled_and_mismatched_peers),
    CT_CASE(tcp_comm_port_out_of_range),
    CT_CASE(tcp_comm_count_zero_against_n),
    CT_CASE(tcp_comm_reduce_scatter_allgatherv_vs_float64),
    CT_CASE(tcp_ring_dead_and_stalled_peers),
    CT_CASE(tcp_comm_refuses_sizes_that_wrap),
    CT_CASE(tcp_comm_local_failure_on_one_rank_fails_the_others),
    CT_CASE(tcp_comm_call_refused_by_rank0_fails_waiting_peers),
    CT_CASE(tcp_comm_dtype_or_op_mismatch_fails),
    CT_CASE(tcp_comm_broadcast_root_mismatch_fails),
    CT_CASE(tcp_comm_star_ring_mismatch_fails),
    CT_CASE(tcp_comm_broadcast_root_fails_with_a_refusing_peer),
    CT_CASE(tcp_comm_broadcast_count_mismatch_fails_every_rank),
    CT_CASE(tcp_comm_counts_mismatch_fails_every_rank),
    CT_CASE(tcp_comm_over_ipv6_loopback),
    CT_CASE(tcp_comm_rank_killed_mid_collective),
    CT_CASE(torchrun_style_launch_auto_comm),
};
CT_MAIN(cases)
