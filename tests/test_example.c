/* The training example as a test: examples/train_charlm.c compiled in, its
   main renamed, its train() driven directly. Proves the pieces work together:
   the loss falls below a stated bound, O2 (fp16, bf16) lands near O0,
   resume from a checkpoint continues bit-identically, two DDP ranks stay
   bit-identical, and a corrupt checkpoint is refused cleanly. */
#define _POSIX_C_SOURCE 200809L
#define main train_charlm_main
#include "../examples/train_charlm.c"
#undef main
#include "capex_test.h"
#include "two_ranks.h"
#include <sys/types.h>
#include <sys/wait.h>
#include <sys/socket.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <unistd.h>
#include <fcntl.h>
#ifdef _OPENMP
#include <omp.h>
#endif

static text_data corpus;
static int corpus_ok = -1;

static const text_data *data_or_null(void) {
    if (corpus_ok < 0) corpus_ok = load_text(NULL, 0.1, &corpus);
    return corpus_ok ? &corpus : NULL;
}

/* Small and quick (also under ASan), big enough that learning shows. */
static void small_cfg(run_cfg *c, capex_opt_level level, capex_dtype half, int steps) {
    run_cfg_default(c);
    c->level = level; c->half = half; c->steps = steps; c->warmup = 10;
    c->batch = 32; c->hidden = 96; c->eval_every = 0; c->eval_windows = 1024; c->quiet = 1; c->label = "test";
}

static int train_single(const run_cfg *c, run_result *res) {
    capex_comm comm;
    int ok;
    if (capex_comm_init_single(&comm) != CAPEX_OK) return 0;
    ok = train(c, data_or_null(), &comm, 0, 1, res);
    capex_comm_destroy(&comm);
    return ok;
}

/* ln(86) = 4.45 nats is chance on this vocabulary; a unigram model gets
   3.29 on the validation split (a bigram table 2.49). Below 2.9 after 250
   steps means the MLP uses its context. */
#define LOSS_BOUND 2.9f

CT_TEST(loss_falls_below_bound_o0_o2_fp16_bf16) {
    run_cfg c;
    run_result r0, r16, rb16;
    if (!data_or_null()) CT_SKIP("no text under /usr/share/common-licenses (Debian base-files)");
    small_cfg(&c, CAPEX_O0, CAPEX_F16, 250);
    CT_CHECK(train_single(&c, &r0), "O0: %s", capex_last_error());
    small_cfg(&c, CAPEX_O2, CAPEX_F16, 250);
    CT_CHECK(train_single(&c, &r16), "O2 fp16: %s", capex_last_error());
    small_cfg(&c, CAPEX_O2, CAPEX_BF16, 250);
    CT_CHECK(train_single(&c, &rb16), "O2 bf16: %s", capex_last_error());
    printf("  val loss after 250 steps: O0 %.4f, O2 fp16 %.4f, O2 bf16 %.4f (bound %.1f)\n", r0.val_loss, r16.val_loss, rb16.val_loss, LOSS_BOUND);
    CT_CHECK(r0.val_loss < LOSS_BOUND, "O0 val loss %.4f >= %.1f", r0.val_loss, LOSS_BOUND);
    CT_CHECK(r16.val_loss < LOSS_BOUND && rb16.val_loss < LOSS_BOUND, "O2 val %.4f / %.4f", r16.val_loss, rb16.val_loss);
    /* make run's claim, on a short run: mixed precision tracks fp32 */
    CT_CHECK(fabsf(r16.val_loss - r0.val_loss) < 0.05f && fabsf(rb16.val_loss - r0.val_loss) < 0.05f,
             "O0 %.4f, O2 fp16 %.4f, O2 bf16 %.4f", r0.val_loss, r16.val_loss, rb16.val_loss);
    CT_CHECK(r0.skipped == 0, "O0 has no loss scaling, so nothing to skip: %lld", (long long)r0.skipped);
    CT_CHECK(r16.weights_crc != r0.weights_crc, "O2 must not silently run in fp32");
}

CT_TEST(other_levels_and_optimizers_learn) {
    static const capex_opt_level levels[] = {CAPEX_O1, CAPEX_O3, CAPEX_O2, CAPEX_O2};
    static const capex_optim_kind kinds[] = {CAPEX_OPTIM_ADAM, CAPEX_OPTIM_ADAM, CAPEX_OPTIM_LAMB, CAPEX_OPTIM_SGD};
    static const float lrs[] = {3e-3f, 3e-3f, 1e-2f, 0.1f};
    int i;
    if (!data_or_null()) CT_SKIP("no text under /usr/share/common-licenses");
    for (i = 0; i < 4; i++) {
        run_cfg c;
        run_result r;
        small_cfg(&c, levels[i], CAPEX_BF16, 100);
        c.optim = kinds[i]; c.lr = lrs[i];
        CT_CHECK(train_single(&c, &r), "case %d: %s", i, capex_last_error());
        printf("  %s optim %d: val loss %.4f after 100 steps (bound 3.3)\n", capex_opt_level_name(levels[i]), (int)kinds[i], r.val_loss);
        CT_CHECK(r.val_loss < 3.3f, "case %d (%s, optim %d): val loss %.4f", i, capex_opt_level_name(levels[i]), (int)kinds[i], r.val_loss);
    }
}

CT_TEST(resume_from_checkpoint_is_bit_identical) {
    static const capex_opt_level levels[] = {CAPEX_O2, CAPEX_O0};
    static const capex_optim_kind kinds[] = {CAPEX_OPTIM_ADAM, CAPEX_OPTIM_LAMB};
    char path[64];
    int i;
    if (!data_or_null()) CT_SKIP("no text under /usr/share/common-licenses");
    snprintf(path, sizeof path, "/tmp/capex_example_ckpt_%ld.capex", (long)getpid());
    for (i = 0; i < 2; i++) {
        run_cfg c;
        run_result full, first, second;
        small_cfg(&c, levels[i], CAPEX_F16, 60);
        c.optim = kinds[i];
        CT_CHECK(train_single(&c, &full), "uninterrupted: %s", capex_last_error());
        c.save_path = path; c.save_at = 29; /* mid-epoch, mid-schedule */
        CT_CHECK(train_single(&c, &first), "first half: %s", capex_last_error());
        CT_CHECK(first.weights_crc == full.weights_crc, "saving must not change the run");
        c.save_path = NULL; c.save_at = 0; c.resume_path = path;
        CT_CHECK(train_single(&c, &second), "resumed: %s", capex_last_error());
        CT_CHECK(second.weights_crc == full.weights_crc, "case %d: resumed weights %08x, uninterrupted %08x", i,
                 (unsigned)second.weights_crc, (unsigned)full.weights_crc);
        CT_CHECK(second.skipped == full.skipped, "skipped steps %lld vs %lld", (long long)second.skipped, (long long)full.skipped);
        /* the checkpoint carries the training loss average: the report continues, not restarts from 0 */
        CT_CHECK(second.train_loss == full.train_loss, "case %d: resumed train loss %.6f, uninterrupted %.6f", i,
                 second.train_loss, full.train_loss);
        /* a checkpoint past --steps is refused (it trained nothing and reported a train loss of 0) */
        c.steps = 20;
        fflush(stdout);
        CT_CHECK(!train_single(&c, &second), "case %d: resuming step 29 with --steps 20 must be refused", i);
    }
    remove(path);
}

/* A small synthetic text (vocab 13), held exactly in its buffer so that a
   read past its end is one (ASan sees it in make sanitize). */
static int synthetic_text(text_data *d, size_t n, size_t n_train) {
    size_t i;
    memset(d, 0, sizeof *d);
    if (!(d->bytes = (unsigned char *)malloc(n))) return 0;
    for (i = 0; i < n; i++) d->bytes[i] = (unsigned char)((i * 7 + i / 13) % 13);
    for (i = 0; i < 13; i++) d->chars[i] = (unsigned char)('a' + i);
    d->n = n; d->n_train = n_train; d->vocab = 13;
    return 1;
}

/* --eval-windows not a multiple of the batch: the count is rounded up to whole
   batches and every window lies inside the validation text (the last batch
   used to run past the text's end and average in what lay there). */
CT_TEST(eval_windows_not_a_multiple_of_the_batch) {
    text_data d;
    model m3, m1;
    float *w = NULL, a, b;
    CT_CHECK(synthetic_text(&d, 600, 540), "out of memory");
    CT_CHECK(model_init(&m3, 13, 4, 8, 16, 3, CAPEX_F32) && model_init(&m1, 13, 4, 8, 16, 1, CAPEX_F32), "out of memory");
    w = (float *)malloc((size_t)m3.n_params * sizeof(float));
    CT_CHECK(w != NULL, "out of memory");
    model_init_weights(&m3, w, 7);
    a = evaluate(&m3, w, &d, 4); /* batch 3: 6 windows */
    b = evaluate(&m1, w, &d, 6); /* the same 6 windows one at a time */
    CT_CHECK(isfinite(a) && fabsf(a - b) <= 1e-5f * fabsf(b), "4 windows in batches of 3: %.7f, the 6 windows one by one: %.7f", a, b);
    CT_CHECK(eval_window_count(4096, 64) == 4096 && eval_window_count(4, 3) == 6 && eval_window_count(1, 5) == 5, "window counts");
    /* near INT_MAX: rounded down instead, so the evaluation loop's int count cannot overflow */
    CT_CHECK(eval_window_count(INT_MAX, 64) % 64 == 0 && eval_window_count(INT_MAX, 64) <= INT_MAX - 64, "INT_MAX windows: %d",
             eval_window_count(INT_MAX, 64));
    free(w);
    model_free(&m3);
    model_free(&m1);
    free(d.bytes);
}

/* A text too short for the context (validation) or the batch (training) is
   refused with a message, not read past its end (--ctx 600 on a 5 KB file
   crashed). */
CT_TEST(text_too_short_for_ctx_or_batch_is_refused) {
    static const int ctxs[3] = {100, 4, 540}, batches[3] = {8, 600, 1};
    text_data d;
    int i;
    CT_CHECK(synthetic_text(&d, 600, 540), "out of memory");
    for (i = 0; i < 3; i++) {
        capex_comm comm;
        run_cfg c;
        run_result r;
        int ok;
        small_cfg(&c, CAPEX_O0, CAPEX_F16, 2);
        c.ctx = ctxs[i]; c.batch = batches[i]; c.hidden = 8; c.emb = 4; c.eval_windows = 4;
        CT_CHECK(capex_comm_init_single(&comm) == CAPEX_OK, "comm");
        fflush(stdout);
        ok = train(&c, &d, &comm, 0, 1, &r);
        capex_comm_destroy(&comm);
        CT_CHECK(!ok, "ctx %d batch %d on 540 + 60 bytes must be refused", ctxs[i], batches[i]);
    }
    free(d.bytes);
}

/* main() with argv, its stdout in out (at most cap bytes); the exit status. */
static int main_captured(int argc, char **argv, char *out, size_t cap) {
    char path[64];
    int fd, saved, rc;
    FILE *f;
    size_t n = 0;
    snprintf(path, sizeof path, "/tmp/capex_example_out_%ld.txt", (long)getpid());
    fflush(stdout);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    saved = dup(1);
    if (fd < 0 || saved < 0) return -1;
    dup2(fd, 1);
    close(fd);
    rc = train_charlm_main(argc, argv);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    out[0] = '\0';
    if ((f = fopen(path, "r")) != NULL) { n = fread(out, 1, cap - 1, f); fclose(f); }
    out[n] = '\0';
    remove(path);
    return rc;
}

/* The learning rate the log shows at a step ("[O0] step    12  ... lr 1.23e-03"). */
static double logged_lr(const char *out, int step) {
    char key[32];
    const char *p, *lr;
    snprintf(key, sizeof key, "step %5d  loss", step);
    if (!(p = strstr(out, key)) || !(lr = strstr(p, " lr "))) return -1;
    return atof(lr + 4);
}

/* --warmup N is honoured as given (a default-sized clamp for short runs cut
   --warmup 30 of 100 steps to 11, and the documented "--sched onecycle
   --warmup 300" to 151); --save-at past --steps or without --save is an error,
   not a checkpoint silently never written. */
CT_TEST(warmup_and_save_at_options_do_what_they_say) {
    char *argv[] = {(char *)"train_charlm", (char *)"--device", (char *)"cpu", (char *)"--opt", (char *)"O0",
                    (char *)"--steps", (char *)"40", (char *)"--warmup", (char *)"30", (char *)"--sched", (char *)"linear",
                    (char *)"--log-every", (char *)"5", (char *)"--eval-every", (char *)"0", (char *)"--hidden", (char *)"8",
                    (char *)"--batch", (char *)"4", (char *)"--eval-windows", (char *)"4", NULL};
    char *bad1[] = {(char *)"train_charlm", (char *)"--steps", (char *)"10", (char *)"--save", (char *)"/tmp/capex_never.capex",
                    (char *)"--save-at", (char *)"20", NULL};
    char *bad2[] = {(char *)"train_charlm", (char *)"--steps", (char *)"10", (char *)"--save-at", (char *)"5", NULL};
    static char out[16384];
    double lr10, lr25, lr35;
    int rc;
    if (!data_or_null()) CT_SKIP("no text under /usr/share/common-licenses");
    rc = main_captured(21, argv, out, sizeof out);
    CT_CHECK(rc == 0, "exit status %d: %.300s", rc, out);
    lr10 = logged_lr(out, 10); lr25 = logged_lr(out, 25); lr35 = logged_lr(out, 35);
    CT_CHECK(lr10 > 0 && lr25 > 0 && lr35 > 0, "lr in the log: %.600s", out);
    CT_CHECK(lr10 < lr25 && lr25 < 3e-3, "lr still rising through the 30 warmup steps: step 10 %g, step 25 %g", lr10, lr25);
    CT_CHECK(lr35 < 3e-3, "after the warmup: step 35 %g", lr35);
    CT_CHECK(train_charlm_main(7, bad1) == 2, "--save-at past --steps is refused");
    CT_CHECK(access("/tmp/capex_never.capex", F_OK) != 0, "nothing written");
    CT_CHECK(train_charlm_main(5, bad2) == 2, "--save-at without --save is refused");
}

/* Options that cannot work together are refused before any training (exit
   status 2): --compare ignored --save (and resumed all three runs from one
   file); --zero with --device gpu trained on the CPU while saying GPU, and
   with several GPU ranks handed its host arrays to NCCL. */
CT_TEST(conflicting_options_are_refused) {
    char *cmp_save[] = {(char *)"train_charlm", (char *)"--compare", (char *)"--save", (char *)"/tmp/capex_never.capex", NULL};
    char *cmp_resume[] = {(char *)"train_charlm", (char *)"--compare", (char *)"--resume", (char *)"/tmp/capex_never.capex", NULL};
    char *zero_gpu[] = {(char *)"train_charlm", (char *)"--zero", (char *)"1", (char *)"--device", (char *)"gpu", NULL};
    CT_CHECK(train_charlm_main(4, cmp_save) == 2, "--compare --save");
    CT_CHECK(train_charlm_main(4, cmp_resume) == 2, "--compare --resume");
    CT_CHECK(train_charlm_main(5, zero_gpu) == 2, "--zero 1 --device gpu");
}

/* A number option must be a number, all of it (atoi took "10x" as 10 and
   "abc" as 0: a run with no clipping or no weight decay, silently). */
CT_TEST(malformed_numbers_are_refused) {
    static const char *const bad[][2] = {{"--steps", "10x"}, {"--lr", "1e-3x"}, {"--clip", "abc"}, {"--wd", ""},
                                         {"--seed", "-1"}, {"--bucket-kb", "12q"}, {"--tol", "0.05.1"}, {"--ctx", "99999999999"}};
    size_t i;
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *argv[] = {(char *)"train_charlm", (char *)bad[i][0], (char *)bad[i][1], NULL};
        CT_CHECK(train_charlm_main(3, argv) == 2, "%s '%s' was accepted", bad[i][0], bad[i][1]);
    }
}

/* A negative count is an error, not a silent meaning: --log-every -1 logged
   every step (step % -1 == 0), --eval-every -1 evaluated only at the end and
   --save-at -3 with --save saved at the last step; --clip -1 did not clip
   (AdamW, SGD) or failed LAMB's setup after loading the text. */
CT_TEST(negative_counts_are_refused) {
    static const char *const bad[][2] = {{"--log-every", "-1"}, {"--eval-every", "-1"}, {"--save-at", "-3"}, {"--clip", "-1"}};
    static char out[16384];
    char save[64];
    size_t i;
    if (!data_or_null()) CT_SKIP("no text under /usr/share/common-licenses");
    snprintf(save, sizeof save, "/tmp/capex_example_neg_%ld.capex", (long)getpid());
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *argv[] = {(char *)"train_charlm", (char *)"--device", (char *)"cpu", (char *)"--steps", (char *)"2",
                        (char *)"--hidden", (char *)"8", (char *)"--batch", (char *)"4", (char *)"--eval-windows",
                        (char *)"4", (char *)"--save", save, (char *)bad[i][0], (char *)bad[i][1], NULL};
        int rc = main_captured(15, argv, out, sizeof out);
        CT_CHECK(rc == 2, "%s %s: exit status %d, want 2: %.300s", bad[i][0], bad[i][1], rc, out);
        CT_CHECK(access(save, F_OK) != 0, "%s %s: nothing written", bad[i][0], bad[i][1]);
        remove(save);
    }
}

/* A checkpoint path that cannot be written is refused before training (it
   trained every step, then failed at the save with exit status 1): a missing
   directory, an empty path, a directory. */
CT_TEST(unwritable_checkpoint_path_is_refused_before_training) {
    static const char *const bad[] = {"/nonexistent/dir/ckpt.capex", "", "/tmp/", "/tmp"};
    static char out[16384];
    size_t i;
    if (!data_or_null()) CT_SKIP("no text under /usr/share/common-licenses");
    for (i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char *argv[] = {(char *)"train_charlm", (char *)"--device", (char *)"cpu", (char *)"--steps", (char *)"3",
                        (char *)"--hidden", (char *)"8", (char *)"--batch", (char *)"4", (char *)"--eval-windows", (char *)"4",
                        (char *)"--save", (char *)bad[i], NULL};
        int rc = main_captured(13, argv, out, sizeof out);
        CT_CHECK(rc == 2, "--save '%s': exit status %d, want 2: %.300s", bad[i], rc, out);
        CT_CHECK(!strstr(out, "step"), "--save '%s': no training before the refusal: %.300s", bad[i], out);
    }
}

/* ctx * emb over INT_MAX overflowed the CPU loops' int window size (D),
   after allocating the model; now refused by model_init and by main. */
CT_TEST(window_over_int_max_is_refused) {
    model m;
    char *argv[] = {(char *)"train_charlm", (char *)"--ctx", (char *)"20000", (char *)"--emb", (char *)"110000", NULL};
    int ok = model_init(&m, 86, 20000, 110000, 1, 1, CAPEX_F32);
    if (ok) model_free(&m);
    CT_CHECK(!ok, "ctx 20000 x emb 110000 accepted");
    CT_CHECK(train_charlm_main(5, argv) == 2, "refused as an option error");
}

CT_TEST(corrupt_or_missing_checkpoint_is_refused) {
    run_cfg c;
    run_result r;
    char path[64];
    FILE *f;
    long size;
    unsigned char *buf;
    if (!data_or_null()) CT_SKIP("no text under /usr/share/common-licenses");
    snprintf(path, sizeof path, "/tmp/capex_example_bad_%ld.capex", (long)getpid());
    small_cfg(&c, CAPEX_O2, CAPEX_F16, 12);
    c.save_path = path;
    CT_CHECK(train_single(&c, &r), "%s", capex_last_error());
    f = fopen(path, "r+b");
    CT_CHECK(f != NULL, "checkpoint written");
    fseek(f, 0, SEEK_END);
    size = ftell(f);
    buf = (unsigned char *)malloc((size_t)size);
    fseek(f, 0, SEEK_SET);
    CT_CHECK(buf && fread(buf, 1, (size_t)size, f) == (size_t)size, "read back");
    buf[size - 9] ^= 0x40; /* one flipped bit in the tensor data */
    fseek(f, 0, SEEK_SET);
    fwrite(buf, 1, (size_t)size, f);
    fclose(f);
    free(buf);
    c.save_path = NULL; c.resume_path = path; c.steps = 20;
    fflush(stdout);
    CT_CHECK(!train_single(&c, &r), "a corrupt checkpoint must be refused");
    CT_CHECK(strstr(capex_last_error(), "crc") || strstr(capex_last_error(), "checksum") || strstr(capex_last_error(), "CRC"),
             "message names the checksum: %.200s", capex_last_error());
    remove(path);
    c.resume_path = "/nonexistent/ckpt.capex";
    CT_CHECK(!train_single(&c, &r), "a missing checkpoint must be refused");
}


/* One rank of a 2-rank run over the TCP backend (tests/two_ranks.h). */
static int ddp_train_rank(capex_comm *comm, int rank, uint32_t *crc) {
    run_cfg c;
    run_result r;
    int ok;
    if (!data_or_null()) return 0;
    small_cfg(&c, CAPEX_O2, CAPEX_BF16, 40);
    c.bucket_bytes = 16 * 1024; /* several buckets */
    ok = train(&c, data_or_null(), comm, rank, 2, &r);
    *crc = r.weights_crc;
    return ok;
}

CT_TEST(two_ddp_ranks_stay_bit_identical) {
    uint32_t crc0 = 0, crc1 = 1;
    if (!data_or_null()) CT_SKIP("no text under /usr/share/common-licenses");
    two_ranks_run(ct, "test_example", ddp_train_rank, &crc0, &crc1);
    if (ct->failed) return;
    CT_CHECK(crc0 == crc1, "replicas differ: %08x vs %08x", (unsigned)crc0, (unsigned)crc1);
}

/* --zero 1 and 2 over 2 TCP ranks: fp32 (O0, no clipping, where the sum of
   two gradients has one order) ends bit-identical to the DDP run; O2 bf16
   stage 2 with clipping lands within 0.01 of DDP's validation loss (the
   global norm is summed per shard: a clip factor an ulp apart), replicas
   identical; a stage-2 checkpoint resumes into stage 1 bit for bit. */
static int g_zero_stage, g_zero_level;
static const char *g_zero_save, *g_zero_resume;
static float g_zero_val[2];
static int zero_train_rank(capex_comm *comm, int rank, uint32_t *crc) {
    run_cfg c;
    run_result r;
    int ok;
    if (!data_or_null()) return 0;
    small_cfg(&c, g_zero_level ? CAPEX_O2 : CAPEX_O0, CAPEX_BF16, 40);
    c.bucket_bytes = 16 * 1024; /* several buckets */
    if (!g_zero_level) c.clip = 0.0f;
    c.zero = g_zero_stage;
    c.save_path = g_zero_save;
    c.save_at = 20;
    c.resume_path = g_zero_resume;
    ok = train(&c, data_or_null(), comm, rank, 2, &r);
    *crc = r.weights_crc;
    g_zero_val[rank] = r.val_loss;
    return ok;
}

/* Rank 1 is a fresh exec of this program: the case travels in the environment. */
static char g_zero_paths[2][128];
static void zero_to_env(void) {
    char v[400];
    snprintf(v, sizeof v, "%d %d %s %s", g_zero_stage, g_zero_level, g_zero_save ? g_zero_save : "-",
             g_zero_resume ? g_zero_resume : "-");
    setenv("CAPEX_TEST_ZERO_CASE", v, 1);
}
static int zero_from_env(void) {
    const char *v = getenv("CAPEX_TEST_ZERO_CASE");
    if (!v || sscanf(v, "%d %d %127s %127s", &g_zero_stage, &g_zero_level, g_zero_paths[0], g_zero_paths[1]) != 4) return 0;
    g_zero_save = strcmp(g_zero_paths[0], "-") ? g_zero_paths[0] : NULL;
    g_zero_resume = strcmp(g_zero_paths[1], "-") ? g_zero_paths[1] : NULL;
    return 1;
}
static void zero_run(ct_state *ct, uint32_t *c0, uint32_t *c1) {
    zero_to_env();
    two_ranks_run(ct, "test_example", zero_train_rank, c0, c1);
    unsetenv("CAPEX_TEST_ZERO_CASE");
}

CT_TEST(two_zero_ranks_match_ddp) {
    uint32_t d0 = 0, d1 = 1, z0 = 2, z1 = 3;
    char path[128];
    int stage;
    float dval;
    if (!data_or_null()) CT_SKIP("no text under /usr/share/common-licenses");
    for (stage = 0; stage <= 2; stage++) {
        g_zero_stage = stage; g_zero_level = 0;
        zero_run(ct, stage ? &z0 : &d0, stage ? &z1 : &d1);
        if (ct->failed) return;
        if (stage) CT_CHECK(z0 == z1 && z0 == d0, "O0 --zero %d: crcs %08x %08x, DDP %08x", stage, (unsigned)z0, (unsigned)z1, (unsigned)d0);
    }
    g_zero_level = 1; g_zero_stage = 0;
    zero_run(ct, &d0, &d1);
    if (ct->failed) return;
    dval = g_zero_val[0];
    g_zero_stage = 2;
    snprintf(path, sizeof path, "/tmp/capex_zero_example_%ld.ckpt", (long)getpid());
    g_zero_save = path;
    zero_run(ct, &z0, &z1);
    g_zero_save = NULL;
    if (ct->failed) { remove(path); return; }
    CT_CHECK(z0 == z1, "O2 --zero 2: replicas differ");
    CT_CHECK(fabsf(g_zero_val[0] - dval) < 0.01f, "O2 --zero 2: val %.4f, DDP %.4f", (double)g_zero_val[0], (double)dval);
    g_zero_stage = 1;
    g_zero_resume = path; /* from step 20 on, in stage 1 */
    zero_run(ct, &d0, &d1);
    g_zero_resume = NULL;
    remove(path);
    if (ct->failed) return;
    CT_CHECK(d0 == z0 && d1 == z1, "resumed --zero 1 from the --zero 2 checkpoint: %08x, uninterrupted %08x", (unsigned)d0,
             (unsigned)z0);
}

/* The example as users launch it: the MPI build under mpirun -np 2, bounded
   by coreutils timeout. Replicas must end bit-identical (the example checks
   every rank's weight checksum and prints the verdict). */
CT_TEST(mpirun_two_ranks_identical_replicas) {
    char exe[1024], bin[1200], out[1300], cmd[4096], line[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char *slash;
    FILE *f;
    int st, identical = 0, finals = 0;
    if (!data_or_null()) CT_SKIP("no text under /usr/share/common-licenses");
    CT_CHECK(n > 0, "readlink /proc/self/exe");
    exe[n] = '\0';
    slash = strrchr(exe, '/');
    CT_CHECK(slash != NULL, "exe path");
    *slash = '\0';
    snprintf(bin, sizeof bin, "%s/../examples/train_charlm_mpi", exe);
    if (access(bin, X_OK) != 0) CT_SKIP("%.900s not built (needs mpicc: make ci-deps installs Open MPI)", bin);
    if (system("command -v mpirun > /dev/null 2>&1") != 0) CT_SKIP("mpirun not found (make ci-deps installs Open MPI)");
    snprintf(out, sizeof out, "/tmp/capex_example_mpi_%ld.log", (long)getpid());
    snprintf(cmd, sizeof cmd,
             "OMP_NUM_THREADS=1 timeout -k 5 120 mpirun --allow-run-as-root --oversubscribe --mca btl_vader_single_copy_mechanism none "
             "-np 2 '%s' --opt O2 --half bf16 --steps 60 --batch 32 --hidden 96 --bucket-kb 16 --eval-every 0 --quiet > '%s' 2>&1",
             bin, out);
    fflush(stdout);
    st = system(cmd);
    f = fopen(out, "r");
    CT_CHECK(f != NULL, "no output from mpirun");
    while (fgets(line, sizeof line, f)) {
        if (strstr(line, "replicas: 2 ranks, weights bit-identical")) identical = 1;
        if (strncmp(line, "final:", 6) == 0) finals++;
    }
    if (st != 0 || !identical || finals != 1) { /* show what mpirun said */
        rewind(f);
        while (fgets(line, sizeof line, f)) printf("    | %s", line);
    }
    fclose(f);
    remove(out);
    CT_CHECK(st == 0, "mpirun exit status %d", st);
    CT_CHECK(finals == 1, "one final line (rank 0), got %d", finals);
    CT_CHECK(identical, "replicas not reported bit-identical");
}

/* The GPU path's kernels (the model, through capex's public JIT) compile with
   NVRTC for the oldest and newest supported archs, and each kernel is in the image. */
CT_TEST(gpu_model_kernels_compile_with_nvrtc) {
    static const int archs[2] = {75, 120};
    const size_t n_parts = sizeof charlm_kernels_parts / sizeof charlm_kernels_parts[0];
    const char *opts[1] = {"--fmad=false"};
    char src[16384];
    size_t i;
    int v, k;
    src[0] = '\0';
    for (i = 0; i < n_parts; i++) {
        CT_CHECK(strlen(src) + strlen(charlm_kernels_parts[i]) < sizeof src, "source fits");
        strcat(src, charlm_kernels_parts[i]);
    }
    for (v = 0; v < 2; v++) {
        capex_cuda_target t;
        capex_cuda_image im;
        capex_result r;
        t.kind = CAPEX_CUDA_IMAGE_PTX; /* PTX names every entry in plain text */
        t.arch = archs[v];
        r = capex_cuda_nvrtc_compile(src, "charlm_kernels", opts, 1, t, &im);
        if (r == CAPEX_ERR_NO_NVRTC) CT_SKIP("NVRTC not found: %s", capex_last_error());
        CT_CHECK(r == CAPEX_OK, "sm_%d: %s", archs[v], capex_last_error());
        for (k = 0; k < N_KERNELS; k++) {
            char entry[64];
            snprintf(entry, sizeof entry, ".entry %s(", charlm_kernel_names[k]);
            CT_CHECK(strstr((const char *)im.data, entry) != NULL, "sm_%d: kernel %s missing", archs[v], charlm_kernel_names[k]);
        }
        capex_cuda_image_free(&im);
    }
}

/* --device gpu without a usable GPU: a clear message and exit status 1, no crash;
   --device auto falls back to the CPU and says why. */
CT_TEST(gpu_requested_without_a_gpu_fails_cleanly) {
    char *argv_gpu[] = {(char *)"train_charlm", (char *)"--device", (char *)"gpu", (char *)"--steps", (char *)"2", (char *)"--quiet", NULL};
    const char *old = getenv("CAPEX_LIBCUDA_PATH");
    char *saved = old ? strdup(old) : NULL;
    int rc;
    setenv("CAPEX_LIBCUDA_PATH", "/nonexistent/libcuda.so.1", 1);
    rc = train_charlm_main(6, argv_gpu);
    if (saved) { setenv("CAPEX_LIBCUDA_PATH", saved, 1); free(saved); }
    else unsetenv("CAPEX_LIBCUDA_PATH");
    CT_CHECK(rc == 1, "exit status %d, want 1", rc);
    CT_CHECK(strstr(capex_last_error(), "/nonexistent/libcuda.so.1") != NULL, "message names what was tried: %s", capex_last_error());
}

/* --compare whose chart cannot be written: exit status 1 and no "chart: FILE"
   line (it printed the line and exited 0); a writable path gets the chart. */
CT_TEST(compare_chart_write_failure_is_reported) {
    char svg[64], bad[] = "/nonexistent/dir/chart.svg";
    char *argv[] = {(char *)"train_charlm", (char *)"--device", (char *)"cpu", (char *)"--compare", (char *)"--steps", (char *)"4",
                    (char *)"--hidden", (char *)"8", (char *)"--batch", (char *)"4", (char *)"--eval-windows", (char *)"4",
                    (char *)"--tol", (char *)"10", (char *)"--quiet", (char *)"--svg", NULL, NULL};
    static char out[16384];
    int rc;
    if (!data_or_null()) CT_SKIP("no text under /usr/share/common-licenses");
    snprintf(svg, sizeof svg, "/tmp/capex_example_chart_%ld.svg", (long)getpid());
    argv[16] = svg;
    rc = main_captured(17, argv, out, sizeof out);
    CT_CHECK(rc == 0 && strstr(out, "chart: ") && access(svg, F_OK) == 0, "writable chart: exit status %d: %.400s", rc, out);
    remove(svg);
    argv[16] = bad;
    rc = main_captured(17, argv, out, sizeof out);
    CT_CHECK(rc == 1, "unwritable chart: exit status %d, want 1", rc);
    CT_CHECK(!strstr(out, "chart: "), "no chart line for a chart not written: %.400s", out);
}

static const ct_case cases[] = {
    CT_CASE(loss_falls_below_bound_o0_o2_fp16_bf16), CT_CASE(other_levels_and_optimizers_learn),
    CT_CASE(resume_from_checkpoint_is_bit_identical), CT_CASE(corrupt_or_missing_checkpoint_is_refused),
    CT_CASE(eval_windows_not_a_multiple_of_the_batch), CT_CASE(text_too_short_for_ctx_or_batch_is_refused),
    CT_CASE(warmup_and_save_at_options_do_what_they_say), CT_CASE(compare_chart_write_failure_is_reported),
    CT_CASE(conflicting_options_are_refused), CT_CASE(malformed_numbers_are_refused),
    CT_CASE(negative_counts_are_refused), CT_CASE(window_over_int_max_is_refused),
    CT_CASE(unwritable_checkpoint_path_is_refused_before_training),
    CT_CASE(two_ddp_ranks_stay_bit_identical),
    CT_CASE(two_zero_ranks_match_ddp), CT_CASE(mpirun_two_ranks_identical_replicas),
    CT_CASE(gpu_model_kernels_compile_with_nvrtc), CT_CASE(gpu_requested_without_a_gpu_fails_cleanly),
};
int main(int argc, char **argv) {
#ifdef _OPENMP
    omp_set_num_threads(1); /* test programs share the cores; speed is not under test here */
#endif
    if (argc == 4 && strcmp(argv[1], "--rank1") == 0) {
        if (zero_from_env()) return two_ranks_child_main(zero_train_rank, argv[2], argv[3]);
        return two_ranks_child_main(ddp_train_rank, argv[2], argv[3]);
    }
    return ct_main(__FILE__, cases, sizeof cases / sizeof cases[0], argc, argv);
}
