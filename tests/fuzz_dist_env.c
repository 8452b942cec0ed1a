/* libFuzzer target for the launcher-environment parsers: the input is split
   at NUL bytes into the values of the launcher variables below (missing ones
   are unset), then capex_dist_env_read must either succeed with a
   consistent result or fail with CAPEX_ERR_CONFIG, never crash; the Slurm
   task-list parser gets the raw input too.
   Build: clang -g -O1 -fsanitize=fuzzer,address,undefined tests/fuzz_dist_env.c */
#define CAPEX_IMPLEMENTATION
#include "../capex.h"
#include <stdlib.h>

static const char *const names[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                    "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE",
                                    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_NODEID", "SLURM_TASKS_PER_NODE",
                                    "SLURM_NTASKS_PER_NODE", "CAPEX_RUN_ID", "FLUX_TASK_RANK", "FLUX_JOB_SIZE",
                                    "FLUX_TASK_LOCAL_ID", "FLUX_JOB_ID", "MPI_LOCALRANKID", "SLURM_LOCALID"};
#define NV (sizeof names / sizeof names[0])
typedef struct tab { const char *v[NV]; } tab;

static const char *lookup(const char *name, void *user) {
    tab *t = (tab *)user;
    size_t i;
    for (i = 0; i < NV; i++) if (strcmp(names[i], name) == 0) return t->v[i];
    return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = (char *)malloc(size + 1), *p;
    tab t;
    size_t i = 0;
    capex_dist_env_desc d;
    capex_dist_env e;
    capex_result r;
    if (!buf) return 0;
    memcpy(buf, data, size);
    buf[size] = '\0';
    (void)capex__slurm_tasks_on_node(buf, (int)(size % 7));
    memset(&t, 0, sizeof t);
    /* first three bytes: which variables are set (bit i of a 24-bit mask) */
    for (p = buf; i < NV && p <= buf + size; i++) {
        size_t len = strlen(p);
        if (size >= 3 && (((unsigned long)data[0] | (unsigned long)data[1] << 8 | (unsigned long)data[2] << 16) >> i) & 1)
            t.v[i] = p;
        p += len + 1;
    }
    capex_dist_env_desc_init(&d);
    d.getenv_fn = lookup;
    d.getenv_user = &t;
    r = capex_dist_env_read(&d, &e);
    if (r == CAPEX_OK) {
        if (e.world_size < 1 || e.rank < 0 || e.rank >= e.world_size || e.local_rank < 0 ||
            e.local_rank >= e.local_world_size || e.local_world_size > e.world_size || e.master_port < 0 ||
            e.master_port > 65535)
            abort();
    } else if (r != CAPEX_ERR_CONFIG) {
        abort();
    }
    free(buf);
    return 0;
}
