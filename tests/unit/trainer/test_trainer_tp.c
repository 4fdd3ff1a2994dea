/* The training loop with tensor parallelism (train/trainer.h, cfg.tp) under mpirun -np 2: the two
 * ranks are one TP=2 group. Every rank also runs the unsharded trainer of the same config, so
 * each checks against it: 20 steps follow the TP=1 loss trajectory, a TP=2 checkpoint resumes at
 * TP=1 and a TP=1 checkpoint at TP=2 (both then follow the uninterrupted run), and bad tensor
 * settings are refused naming the field. The argument is the folder of the trainer tests' data
 * (its mono folder). */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "intra/intra.h"
#include "train/trainer.h"

/* The shard sums its products in another order than the unsharded model (partial sums over
 * heads and hidden units, then the allreduce): losses agree to fp32 rounding amplified by the
 * steps, well inside 1e-4 relative over 20 AdamW steps. */
#define TOL_LOSS 1e-4
#define STEPS 20
#define HALF 10

static int g_rank, g_size;
static nb_comm_t* g_comm;
static const char* g_data;
static char g_dir[256]; /* a scratch folder made by rank 0, the same on every rank */

static void agree(int ok, const char* what) {
  int all = 0;
  MPI_Allreduce(&ok, &all, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  if (!all) fail_msg("%s failed on some rank (this rank: %s)", what, ok ? "ok" : "FAILED");
}

static nb_status_t tp_allreduce(void* ctx, float* buf, size_t n) {
  return nb_comm_allreduce(ctx, buf, buf, n, NB_COMM_FP32, NB_COMM_SUM);
}

typedef struct {
  double loss[STEPS + 1];
} losses_t;

static int record(void* ctx, const nb_train_progress_t* p) {
  losses_t* l = ctx;
  if (p->event == NB_TRAIN_EVENT_STEP && p->step >= 1 && p->step <= STEPS)
    l->loss[p->step] = p->loss;
  return 0;
}

/* A small config on the test corpus; tp 2 = this rank's shard of the group. */
static void config(nb_train_config_t* c, int tp, losses_t* l, const char* ckpt, int resume,
                   long steps) {
  nb_train_config_defaults(c);
  c->model = nb_model_config_make(2, 64, 4, 32);
  c->seed = 7;
  c->batch_size = 4;
  c->max_steps = steps;
  c->optim.lr = 3e-3f;
  c->optim.warmup_steps = 2;
  c->optim.total_steps = STEPS;
  c->optim.grad_clip = 1.0f;
  c->eval_every = 0;
  c->eval_batches = 1;
  c->n_sources = 2;
  snprintf(c->sources[0].label, NB_TRAIN_LABEL_MAX, "en");
  snprintf(c->sources[0].path, NB_TRAIN_PATH_MAX, "%s/mono/en.txt", g_data);
  snprintf(c->sources[1].label, NB_TRAIN_LABEL_MAX, "de");
  snprintf(c->sources[1].path, NB_TRAIN_PATH_MAX, "%s/mono/de.txt", g_data);
  c->progress = record;
  c->progress_ctx = l;
  if (ckpt) snprintf(c->checkpoint_dir, NB_TRAIN_PATH_MAX, "%s", ckpt);
  c->checkpoint_keep = 0;
  c->resume = resume;
  if (tp > 1) c->tp = (nb_model_tp_t){g_rank, tp, tp_allreduce, g_comm};
}

static int run(int tp, losses_t* l, const char* ckpt, int resume, long steps, float** logical,
               size_t* n) {
  nb_train_config_t c;
  config(&c, tp, l, ckpt, resume, steps);
  nb_trainer_t* t = NULL;
  nb_train_eval_t ev;
  if (nb_trainer_create(&c, &t) != NB_OK || nb_trainer_run(t, &ev) != NB_OK) {
    fprintf(stderr, "rank %d, tp %d: %s\n", g_rank, tp, nb_error_last());
    nb_trainer_destroy(t);
    return 0;
  }
  int ok = 1;
  if (logical) {
    *n = nb_trainer_logical_params(t);
    *logical = malloc(*n * sizeof(float));
    ok = *logical && nb_trainer_tp_gather(t, *logical) == NB_OK;
  }
  nb_trainer_destroy(t);
  return ok;
}

static int same_losses(const losses_t* a, const losses_t* b, long from, long to, const char* what) {
  double worst = 0;
  for (long s = from; s <= to; s++) {
    double r = fabs(a->loss[s] - b->loss[s]) / fabs(b->loss[s]);
    if (r > worst) worst = r;
  }
  if (g_rank == 0)
    printf("%s: steps %ld-%ld, loss %.5f -> %.5f, worst rel diff %.2e\n", what, from, to,
           b->loss[from], b->loss[to], worst);
  return worst <= TOL_LOSS;
}

/* A resumed run reports only the steps after its checkpoint. */
static int resumed(const losses_t* l) {
  for (long s = 1; s <= HALF; s++)
    if (l->loss[s] != 0) return 0;
  return l->loss[HALF + 1] != 0;
}

static void test_tp_trainer_trajectory(void** state) {
  (void)state;
  losses_t ref = {0}, tp = {0};
  float *pr = NULL, *pt = NULL;
  size_t nr = 0, nt = 0;
  int ok = run(1, &ref, NULL, 0, STEPS, &pr, &nr);
  ok = ok && run(2, &tp, NULL, 0, STEPS, &pt, &nt);
  ok = ok && nr == nt && same_losses(&tp, &ref, 1, STEPS, "tp=2 vs tp=1");
  double worst = 0, scale = 0;
  for (size_t i = 0; ok && i < nr; i++) {
    double d = fabs((double)pt[i] - pr[i]);
    if (d > worst) worst = d;
    if (fabs(pr[i]) > scale) scale = fabs(pr[i]);
  }
  if (g_rank == 0) printf("final parameters: max abs diff %.2e (max |p| %.3f)\n", worst, scale);
  ok = ok && worst <= 1e-3 * scale;
  free(pr);
  free(pt);
  agree(ok, "tp trainer trajectory");
}

/* Resharding: the first half at one degree, the checkpoint, the second half at the other; the
 * second half follows the uninterrupted TP=1 run. */
static void test_tp_checkpoint_reshards(void** state) {
  (void)state;
  losses_t ref = {0}, a = {0}, b = {0}, c = {0}, d = {0};
  char d_tp2[300], d_tp1[300];
  snprintf(d_tp2, sizeof d_tp2, "%s/from-tp2", g_dir); /* written by the group's rank 0 */
  snprintf(d_tp1, sizeof d_tp1, "%s/from-tp1", g_dir); /* written by rank 0 alone */
  char mine[300];
  snprintf(mine, sizeof mine, "%s/tp1-rank%d", g_dir, g_rank); /* TP=1 runs of each rank */
  int ok = run(1, &ref, NULL, 0, STEPS, NULL, NULL);
  /* TP=2 for the first half, then each rank alone at TP=1 from a copy of that checkpoint */
  ok = ok && run(2, &a, d_tp2, 0, HALF, NULL, NULL);
  MPI_Barrier(MPI_COMM_WORLD);
  char cmd[1024];
  snprintf(cmd, sizeof cmd, "cp -r '%s' '%s'", d_tp2, mine);
  ok = ok && system(cmd) == 0;
  ok = ok && run(1, &b, mine, 1, STEPS, NULL, NULL);
  ok = ok && resumed(&b) &&
       same_losses(&b, &ref, HALF + 1, STEPS, "tp=2 checkpoint resumed at tp=1");
  /* the reverse: rank 0 alone at TP=1, then both at TP=2 */
  if (g_rank == 0) ok = ok && run(1, &c, d_tp1, 0, HALF, NULL, NULL);
  MPI_Barrier(MPI_COMM_WORLD);
  ok = ok && run(2, &d, d_tp1, 1, STEPS, NULL, NULL);
  ok = ok && resumed(&d) &&
       same_losses(&d, &ref, HALF + 1, STEPS, "tp=1 checkpoint resumed at tp=2");
  agree(ok, "checkpoint resharding");
}

static void expect_refused(nb_train_config_t* c, const char* needle) {
  nb_trainer_t* t = NULL;
  nb_status_t st = nb_trainer_create(c, &t);
  int ok = st == NB_ERR_CONFIG && strstr(nb_error_last(), needle) != NULL;
  if (!ok)
    fprintf(stderr, "expected a refusal naming %s, got %d: %s\n", needle, st, nb_error_last());
  nb_trainer_destroy(t);
  assert_true(ok);
}

static void test_tp_trainer_bad_config(void** state) {
  (void)state;
  losses_t l;
  nb_train_config_t c;
  config(&c, 2, &l, NULL, 0, 1);
  c.model = nb_model_config_make(2, 60, 3, 32);
  expect_refused(&c, "n_head");
  config(&c, 2, &l, NULL, 0, 1);
  c.lora_enabled = 1;
  expect_refused(&c, "LoRA");
  config(&c, 2, &l, NULL, 0, 1);
  c.tp.rank = 2;
  expect_refused(&c, "tp.rank");
  config(&c, 2, &l, NULL, 0, 1);
  c.tp.allreduce = NULL;
  expect_refused(&c, "tp.allreduce");
}

int main(int argc, char** argv) {
  if (nb_intra_init(&argc, &argv) != NB_OK) return 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  if (argc < 2 || g_size != 2) {
    if (g_rank == 0) fprintf(stderr, "usage: mpirun -np 2 %s DATA_DIR\n", argv[0]);
    nb_intra_finalize();
    return 2;
  }
  g_data = argv[1];
  if (g_rank == 0) {
    snprintf(g_dir, sizeof g_dir, "/tmp/nb-trainer-tp-XXXXXX");
    if (!mkdtemp(g_dir)) g_dir[0] = 0;
  }
  MPI_Bcast(g_dir, sizeof g_dir, MPI_CHAR, 0, MPI_COMM_WORLD);
  if (!g_dir[0]) nb_comm_abort(NULL, 1);
  nb_comm_config_t cfg;
  nb_comm_config_init(&cfg);
  cfg.device = NB_COMM_DEVICE_CPU;
  if (nb_comm_create(&cfg, &g_comm) != NB_OK) nb_comm_abort(NULL, 1);

  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_tp_trainer_trajectory),
      cmocka_unit_test(test_tp_checkpoint_reshards),
      cmocka_unit_test(test_tp_trainer_bad_config),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  MPI_Barrier(MPI_COMM_WORLD);
  if (g_rank == 0) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
  }
  nb_comm_destroy(g_comm);
  nb_intra_finalize();
  return rc;
}
