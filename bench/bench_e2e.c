/* `nebula bench e2e`: one model, data, seed and step budget trained three ways with `nebula run`
 * on this machine — single (one cluster holding every language and worker), dense (two
 * clusters, fp32 gradients every step over the capped link) and nebula (outer sync with
 * adaptive density and overlap over the same link) — and their ratios. As root dense and nebula
 * run in two namespaces behind the emulated WAN link (rate and one-way delay); otherwise over
 * loopback with the rate cap only. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench/bench.h"
#include "bench/e2e.h"
#include "common/common.h"
#include "common/opts.h"

int nb_e2e_write_job(json_t* base, const char* v, double rate, double delay, const char* path,
                     const nb_e2e_point_t* point) {
  json_t* j = json_deep_copy(base);
  json_t* spec = json_object_get(j, "spec");
  json_t* meta = json_object_get(j, "metadata");
  char name[64];
  snprintf(name, sizeof name, "e2e-%s", v);
  json_object_set_new(meta, "name", json_string(name));
  json_t* sync = json_object_get(spec, "sync");
  json_t* comp = json_object_get(spec, "compression");
  json_t* link = json_object_get(spec, "link");
  if (!json_is_object(sync) || !json_is_object(link)) {
    json_decref(j);
    return -1;
  }
  json_object_set_new(link, "rateMbit", json_real(rate));
  /* as root, nebula run puts the two clusters in namespaces behind this delay (deploy/wan) */
  if (delay > 0 && geteuid() == 0 && strcmp(v, "single") != 0)
    json_object_set_new(link, "delayMs", json_real(delay));
  else
    json_object_del(link, "delayMs");
  json_object_set_new(spec, "checkpoint", json_pack("{s:i}", "everyRounds", 0));
  if (strcmp(v, "single") == 0) {
    /* one cluster: every language and every worker; the outer step is the identity */
    json_t* cl = json_object_get(spec, "clusters");
    json_t* langs = json_array();
    int workers = 0;
    size_t i;
    json_t* c;
    json_array_foreach(cl, i, c) {
      json_t* w = json_object_get(c, "workers");
      workers += w ? (int)json_integer_value(w) : 1;
      json_t* ls = json_object_get(json_object_get(c, "data"), "languages");
      size_t k;
      json_t* l;
      json_array_foreach(ls, k, l) {
        int seen = 0;
        size_t m;
        json_t* x;
        json_array_foreach(langs, m, x) seen |= json_equal(x, l);
        if (!seen) json_array_append(langs, l);
      }
    }
    json_t* one = json_deep_copy(json_array_get(cl, 0));
    json_object_set_new(one, "id", json_string("dc-all"));
    json_object_set_new(one, "workers", json_integer(workers));
    json_object_set_new(json_object_get(one, "data"), "languages", langs);
    json_object_set_new(spec, "clusters", json_pack("[o]", one));
    json_object_set_new(sync, "overlap", json_false());
    json_object_set_new(sync, "outer",
                        json_pack("{s:f,s:f,s:b}", "lr", 1.0, "momentum", 0.0, "nesterov", 1));
    /* and exact: a dense fp32 frame, so that the round boundary does not compress single's own
     * progress (top-k + int8 of the identity step cost it about 0.1 bpb) */
    json_object_set_new(
        spec, "compression",
        json_pack("{s:{s:f,s:f,s:f},s:b,s:b,s:s}", "density", "initial", 1.0, "min", 1.0, "max",
                  1.0, "adaptive", 0, "errorFeedback", 0, "values", "fp32"));
  } else if (strcmp(v, "dense") == 0) {
    json_object_set_new(sync, "mode", json_string("dense"));
    json_object_del(sync, "innerSteps");
    json_object_del(sync, "overlap");
    json_object_del(sync, "outer");
    json_object_del(spec, "compression");
  } else {
    json_object_set_new(sync, "mode", json_string("outer"));
    json_object_set_new(sync, "overlap", json_true());
    if (comp) json_object_set_new(comp, "adaptive", json_true());
    if (point && !point->adaptive) { /* one fixed point of the codec */
      if (!json_is_object(comp)) json_object_set_new(spec, "compression", comp = json_object());
      json_object_set_new(comp, "adaptive", json_false());
      json_object_set_new(comp, "density",
                          json_pack("{s:f,s:f,s:f}", "initial", point->density, "min",
                                    point->density, "max", point->density));
      json_object_set_new(comp, "values", json_string(point->values));
      json_object_set_new(comp, "errorFeedback", json_boolean(point->density < 1));
    }
    if (point && point->adaptive && point->values && json_is_object(comp))
      json_object_set_new(comp, "values", json_string(point->values)); /* e.g. "auto" */
    if (point && point->topk_chunk > 0 && json_is_object(comp))
      json_object_set_new(comp, "topkChunk", json_integer(point->topk_chunk));
    if (point && point->ef_decay > 0 && json_is_object(comp))
      json_object_set_new(comp, "errorFeedbackDecay", json_real(point->ef_decay));
    if (point && point->overlap_steps > 0)
      json_object_set_new(sync, "overlapSteps", json_integer(point->overlap_steps));
    if (point && point->inner_steps > 0)
      json_object_set_new(sync, "innerSteps", json_integer(point->inner_steps));
    if (point && point->no_eager) json_object_set_new(sync, "eager", json_false());
    if (point && (point->outer_momentum >= 0 || point->outer_lr > 0)) {
      json_t* outer = json_object_get(sync, "outer");
      if (!json_is_object(outer)) json_object_set_new(sync, "outer", outer = json_object());
      if (point->outer_momentum >= 0)
        json_object_set_new(outer, "momentum", json_real(point->outer_momentum));
      if (point->outer_lr > 0) json_object_set_new(outer, "lr", json_real(point->outer_lr));
    }
  }
  int rc = json_dump_file(j, path, JSON_INDENT(2)) == 0 ? 0 : -1;
  json_decref(j);
  return rc;
}

/* 1 when `nebula run` put the clusters behind the emulated WAN link (its log says so). */
static int nb__e2e_used_netns(const char* log) {
  FILE* f = fopen(log, "r");
  if (!f) return 0;
  char line[512];
  int yes = 0;
  while (!yes && fgets(line, sizeof line, f))
    yes = strstr(line, "in network namespaces behind an emulated WAN link") != NULL;
  fclose(f);
  return yes;
}

json_t* nb_e2e_load_job(const char* bench, const char* job, long seed, long eval_batches,
                        const char* out, int* rc) {
  json_error_t je;
  json_t* base = json_load_file(job, 0, &je);
  if (!base) {
    if (je.line > 0)
      fprintf(stderr, "nebula bench %s: %s: %s (line %d)\n", bench, job, je.text, je.line);
    else
      fprintf(stderr, "nebula bench %s: %s\n", bench, je.text);
    *rc = 1;
    return NULL;
  }
  json_t* tr = json_object_get(json_object_get(base, "spec"), "training");
  if (!json_is_object(tr)) {
    fprintf(stderr, "nebula bench %s: %s has no spec.training (seed, evaluation)\n", bench, job);
    json_decref(base);
    *rc = 2;
    return NULL;
  }
  if (seed >= 0) json_object_set_new(tr, "seed", json_integer(seed));
  if (eval_batches > 0) {
    json_t* ev = json_object_get(tr, "eval");
    if (!json_is_object(ev)) json_object_set_new(tr, "eval", ev = json_object());
    json_object_set_new(ev, "batches", json_integer(eval_batches));
  }
  mkdir("runs", 0755);
  if (mkdir(out, 0755) != 0 && errno != EEXIST) {
    fprintf(stderr, "nebula bench %s: cannot create %s: %s\n", bench, out, strerror(errno));
    json_decref(base);
    *rc = 1;
    return NULL;
  }
  return base;
}

int nb_e2e_run(const char* job, const char* out, const char* log, const char* data_dir,
               long steps) {
  const char* av[16];
  char steps_text[24];
  snprintf(steps_text, sizeof steps_text, "%ld", steps);
  int k = 0;
  av[k++] = "nebula";
  av[k++] = "run";
  av[k++] = job;
  av[k++] = "--out";
  av[k++] = out;
  if (data_dir) av[k++] = "--data-dir", av[k++] = data_dir;
  if (steps > 0) av[k++] = "--steps", av[k++] = steps_text;
  av[k] = NULL;
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    if (!freopen(log, "w", stdout)) _exit(126);
    dup2(1, 2);
    execv("/proc/self/exe", (char* const*)av);
    _exit(127);
  }
  int status;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

double nb_e2e_round_compute(const char* dir, long long* n_params) {
  char p[1200];
  snprintf(p, sizeof p, "%s/summary.json", dir);
  json_t* s = json_load_file(p, 0, NULL);
  *n_params = s ? (long long)json_integer_value(json_object_get(s, "params_synced")) : 0;
  json_decref(s);
  snprintf(p, sizeof p, "%s/rounds.tsv", dir);
  FILE* f = fopen(p, "r");
  if (!f) return 0;
  char line[4096];
  int col = -1;
  double v[4096];
  size_t rows = 0, nv = 0;
  while (fgets(line, sizeof line, f)) {
    int c = 0;
    for (char* tok = strtok(line, "\t\n"); tok; tok = strtok(NULL, "\t\n"), c++) {
      if (col < 0 && strcmp(tok, "compute_s") == 0) col = c;
      if (col >= 0 && c == col && rows > 0 && nv < sizeof v / sizeof v[0]) v[nv++] = atof(tok);
    }
    rows++;
  }
  fclose(f);
  if (nv == 0) return 0;
  /* the median: a burst of other work on the machine during a few rounds does not move it */
  return nb_bench_median(v, nv);
}

void nb_e2e_collect(const char* out, nb_e2e_result_t* r) {
  char p[1200];
  const char* ids[2] = {NULL, NULL};
  int n = 0;
  if (strcmp(r->name, "single") == 0)
    ids[n++] = "dc-all";
  else
    ids[n++] = "dc-a", ids[n++] = "dc-b";
  json_t* langs = json_object();
  r->wall_s = 0;
  r->util = 0;
  r->wan_bytes = 0;
  r->bits_per_param = 0;
  int got = 0;
  for (int i = 0; i < n; i++) {
    snprintf(p, sizeof p, "%s/%s/summary.json", out, ids[i]);
    json_t* s = json_load_file(p, 0, NULL);
    if (!s) continue;
    got++;
    double w = json_real_value(json_object_get(s, "wall_s"));
    if (w > r->wall_s) r->wall_s = w;
    r->util += json_real_value(json_object_get(s, "compute_utilization")) / n;
    r->wan_bytes += json_integer_value(json_object_get(s, "wan_bytes_sent"));
    r->bits_per_param += json_real_value(json_object_get(s, "bits_per_param_per_sync")) / n;
    json_object_update(langs, json_object_get(s, "final_eval_bpb"));
    json_decref(s);
  }
  double sum = 0;
  const char* key;
  json_t* v;
  json_object_foreach(langs, key, v) sum += json_real_value(v);
  r->eval_bpb = json_object_size(langs) ? sum / (double)json_object_size(langs) : NAN;
  json_decref(langs);
  r->ok = got == n;
}

/* --thin's inner steps per round: at F = 10 on the demo job, rounds of 16 steps (top-3 % 2-bit
 * frames landing about 12 steps in) lost less than rounds of 32 (top-5 %, landing late) and of
 * 8 (where only top-0.75 % fits a round) for the same link (docs/hybrid.md) */
#define NB__E2E_THIN_H 16
/* --thin's error-feedback decay beta (SparseLoCo's e <- beta e + delta) beside the job's outer
 * momentum: 0.85 lost least of 0.8-1 in the pareto sweep and at --thin 10 (docs/hybrid.md) */
#define NB__E2E_THIN_DECAY 0.85

/* The flags of `nebula bench e2e`. */
typedef struct {
  const char *job, *data_dir, *out;
  double rate, delay, thin;
  long thin_h;       /* the nebula run's inner steps per round at --thin */
  double thin_decay; /* and its compression.errorFeedbackDecay */
  int no_dense, as_json;
  long seed, eval_batches, steps; /* steps 0: the job's */
} nb__e2e_opts_t;

static const char nb__e2e_about[] =
    "Trains the job's model three ways with 'nebula run' (single cluster, dense sync, nebula\n"
    "outer sync with adaptive density and overlap) and prints wall time, final held-out bits\n"
    "per byte (mean over the job's languages), WAN bytes and compute utilization, with ratios\n"
    "against single. As root the two-cluster runs go through namespaces behind the emulated\n"
    "WAN link (rate and delay); otherwise over loopback with the rate cap only (the delay is\n"
    "then recorded, not emulated: delay_ms_emulated 0).";
static const char nb__e2e_epilog[] =
    "--thin F: a thin link that scales with the machine: the rate is set so that one dense\n"
    "int8 frame of the job takes F x the round's compute time measured by the single run\n"
    "(F = 10 is a 10-70B model on a few hundred Mbit/s); the dense baseline is skipped there\n"
    "(it would take hours) and the rate chosen is reported; nebula then runs with\n"
    "compression.values \"auto\" (the scheduler picks the codec point each round),\n"
    "errorFeedbackDecay --thin-decay and rounds of --thin-inner-steps steps (the link's bits\n"
    "per second buy more at short rounds with sparse frames than at long ones with denser\n"
    "frames: docs/hybrid.md).";

/* Parses the flags into *o; -1 to go on, else the exit code (0 after --help, 2 on a bad flag,
 * having said why in one line). */
static int nb__e2e_parse(int argc, char** argv, nb__e2e_opts_t* o) {
  *o = (nb__e2e_opts_t){.job = "jobs/examples/pretrain-2dc-small.json",
                        .out = "runs/bench-e2e",
                        .rate = 100,
                        .delay = 25,
                        .seed = -1,
                        .eval_batches = -1,
                        .thin_h = NB__E2E_THIN_H,
                        .thin_decay = NB__E2E_THIN_DECAY};
  const nb_opt_t opts[] = {
      NB_E2E_RUN_OPTIONS(o, "runs/bench-e2e"),
      NB_OPTION("rate-mbit", NB_OPT_DOUBLE, &o->rate, "R", "the link's rate (default 100)",
                .min = 1e-6, .max = 1000000),
      NB_OPTION("thin", NB_OPT_DOUBLE, &o->thin, "F",
                "a thin link: a dense int8 frame takes F x a round's compute (below)", .min = 1e-6,
                .max = 1000000),
      NB_OPTION("thin-inner-steps", NB_OPT_LONG, &o->thin_h, "H",
                "the nebula run's inner steps per round at --thin (default 16)", .min = 1,
                .max = 100000),
      NB_OPTION("thin-decay", NB_OPT_DOUBLE, &o->thin_decay, "B",
                "the nebula run's error-feedback decay at --thin (default 0.85)", .min = 0.01,
                .max = 1),
      NB_OPTION("delay-ms", NB_OPT_DOUBLE, &o->delay, "D", "one-way delay (default 25)", .min = 0,
                .max = 100000),
      NB_OPTION("seed", NB_OPT_LONG, &o->seed, "S", "training.seed of all three runs", .min = 0),
      NB_OPTION("no-dense", NB_OPT_FLAG, &o->no_dense, NULL,
                "skip the dense baseline (minutes at 100 Mbit/s)"),
      NB_OPTION_END,
  };
  const nb_cmd_spec_t spec = {
      .cmd = "nebula bench e2e",
      .synopsis =
          "usage: nebula bench e2e [--job FILE] [--rate-mbit R | --thin F] [--delay-ms D]\n"
          "                        [--steps N] [--seed S] [--eval-batches B]\n"
          "                        [--data-dir DIR] [--out DIR] [--no-dense]\n"
          "                        [--thin-inner-steps H] [--thin-decay B] [--json]",
      .about = nb__e2e_about,
      .epilog = nb__e2e_epilog,
      .opts = opts,
  };
  int rc = nb_opts_parse(&spec, argc, argv);
  return rc != NB_OPTS_RUN ? rc : -1;
}

/* --thin: sets o->rate to the rate at which one dense int8 frame (a byte per value, a 4-byte
 * scale per 256, header) takes thin x the single run's round compute (*round_compute); 1 when
 * the single run left no round compute time. */
static int nb__e2e_thin_rate(nb__e2e_opts_t* o, double* round_compute) {
  long long n_params = 0;
  char sd[1100];
  snprintf(sd, sizeof sd, "%s/single/dc-all", o->out);
  *round_compute = nb_e2e_round_compute(sd, &n_params);
  if (!(*round_compute > 0) || n_params <= 0) {
    fprintf(stderr, "nebula bench e2e: --thin: no round compute time in %s\n", sd);
    return 1;
  }
  double frame = (double)n_params * (1.0 + 4.0 / 256.0) + 4096;
  o->rate = frame * 8e-6 / (o->thin * *round_compute);
  if (!o->as_json) {
    printf("e2e: --thin %g: dense int8 frame %.0f bytes, round compute %.3f s -> %.4f Mbit/s\n",
           o->thin, frame, *round_compute, o->rate);
    fflush(stdout);
  }
  return 0;
}

/* 1 when run i (single, dense, nebula) is skipped: dense at a thin link's rate takes hours. */
static int nb__e2e_skipped(const nb__e2e_opts_t* o, int i) {
  return (o->thin > 0 || o->no_dense) && i == 1;
}

/* The three runs in turn, their figures into res[]; *netns: the nebula run went through the
 * namespaces. The exit code: 0, or 1 when a run failed (the others still run). */
static int nb__e2e_runs(nb__e2e_opts_t* o, json_t* base, nb_e2e_result_t* res, int* netns,
                        double* round_compute) {
  int rc = 0;
  for (int i = 0; i < 3; i++) {
    if (nb__e2e_skipped(o, i)) continue;
    if (o->thin > 0 && i == 2 && nb__e2e_thin_rate(o, round_compute) != 0) {
      rc = 1;
      break;
    }
    char jp[1100], op[1100], lp[1100];
    snprintf(jp, sizeof jp, "%s/%s.json", o->out, res[i].name);
    snprintf(op, sizeof op, "%s/%s", o->out, res[i].name);
    snprintf(lp, sizeof lp, "%s/%s.log", o->out, res[i].name);
    /* --thin: the scheduler picks whole codec points (values "auto"), with SparseLoCo's
     * decaying error feedback (beta --thin-decay) beside the job's outer momentum, in rounds of
     * thin_h steps (docs/hybrid.md); the rate stays the one set by the job's own round */
    const nb_e2e_point_t thin_point = {.name = "auto",
                                       .values = "auto",
                                       .adaptive = 1,
                                       .ef_decay = o->thin_decay,
                                       .outer_momentum = -1,
                                       .inner_steps = (int)o->thin_h};
    if (nb_e2e_write_job(base, res[i].name, o->rate, o->delay, jp,
                         o->thin > 0 && i == 2 ? &thin_point : NULL) != 0) {
      fprintf(stderr, "nebula bench e2e: %s: cannot derive the %s job\n", o->job, res[i].name);
      rc = 1;
      break;
    }
    if (!o->as_json) {
      printf("e2e: running %s (log %s)\n", res[i].name, lp);
      fflush(stdout);
    }
    int st = nb_e2e_run(jp, op, lp, o->data_dir, o->steps);
    if (i == 2) *netns = nb__e2e_used_netns(lp);
    nb_e2e_collect(op, &res[i]);
    if (st != 0 || !res[i].ok) {
      fprintf(stderr, "nebula bench e2e: the %s run failed (exit %d); see %s\n", res[i].name, st,
              lp);
      rc = 1;
    }
  }
  return rc;
}

/* The ratios against single printed as one JSON object (as_json) or as a table. */
static void nb__e2e_report(const nb__e2e_opts_t* o, const nb_e2e_result_t* res, int netns,
                           double round_compute) {
  double rate = o->rate, delay = o->delay, thin = o->thin;
  double delay_em = netns ? delay : 0;
  const nb_e2e_result_t *s = &res[0], *d = &res[1], *nb = &res[2];
  double t_ratio = nb->wall_s / s->wall_s, l_ratio = nb->eval_bpb / s->eval_bpb;
  double b_ratio = nb->wan_bytes > 0 && thin <= 0 && !o->no_dense
                       ? (double)d->wan_bytes / (double)nb->wan_bytes
                       : NAN;
  if (o->as_json) { /* jansson: a ratio that is not a number is null, never "nan" */
    json_t* j = json_object();
    for (int i = 0; i < 3; i++)
      if (!nb__e2e_skipped(o, i))
        json_object_set_new(
            j, res[i].name,
            json_pack("{s:o, s:o, s:I, s:o}", "wall_s", nb_bench_json_real(res[i].wall_s),
                      "final_eval_loss", nb_bench_json_real(res[i].eval_bpb), "wan_bytes",
                      (json_int_t)res[i].wan_bytes, "compute_utilization",
                      nb_bench_json_real(res[i].util)));
    json_object_set_new(j, "nebula_bits_per_param_per_sync",
                        nb_bench_json_real(nb->bits_per_param));
    json_object_set_new(j, "nebula_vs_single_time", nb_bench_json_real(t_ratio));
    json_object_set_new(j, "nebula_vs_single_loss", nb_bench_json_real(l_ratio));
    json_object_set_new(j, "dense_over_nebula_bytes", nb_bench_json_real(b_ratio));
    json_object_set_new(j, "rate_mbit", nb_bench_json_real(rate));
    json_object_set_new(j, "delay_ms_emulated", nb_bench_json_real(delay_em));
    json_object_set_new(j, "delay_ms_requested", nb_bench_json_real(delay));
    json_object_set_new(j, "thin", nb_bench_json_real(thin));
    json_object_set_new(j, "round_compute_s", nb_bench_json_real(round_compute));
    json_object_set_new(j, "dense",
                        json_string(thin > 0      ? "skipped at --thin"
                                    : o->no_dense ? "skipped (--no-dense)"
                                                  : "run"));
    nb_bench_json_print(stdout, j);
  } else {
    printf("\n%-8s %9s %15s %14s %12s\n", "run", "wall_s", "eval_bpb(loss)", "wan_bytes",
           "compute_util");
    for (int i = 0; i < 3; i++)
      if (!nb__e2e_skipped(o, i))
        printf("%-8s %9.1f %15.4f %14lld %12.3f\n", res[i].name, res[i].wall_s, res[i].eval_bpb,
               res[i].wan_bytes, res[i].util);
    printf(
        "nebula bits/param/sync %.3f; nebula/single time %.3f, loss %.4f; dense/nebula bytes "
        "%.1f (%s, %g Mbit/s, %g ms one way emulated)\n",
        nb->bits_per_param, t_ratio, l_ratio, b_ratio,
        netns ? "namespaces behind the emulated WAN" : "loopback with the rate cap", rate,
        delay_em);
    if (thin > 0)
      printf(
          "thin link: --thin %g (a dense int8 frame = %g x the round's compute of %.3f s); dense "
          "baseline skipped\n",
          thin, thin, round_compute);
  }
}

int nb_bench_e2e_main(int argc, char** argv) {
  nb__e2e_opts_t o;
  int rc = nb__e2e_parse(argc, argv, &o);
  if (rc >= 0) return rc;
  /* the same seed and evaluation for all three runs */
  rc = 0;
  json_t* base = nb_e2e_load_job("e2e", o.job, o.seed, o.eval_batches, o.out, &rc);
  if (!base) return rc;
  nb_e2e_result_t res[3] = {{.name = "single"}, {.name = "dense"}, {.name = "nebula"}};
  int netns = 0;
  double round_compute = 0;
  rc = nb__e2e_runs(&o, base, res, &netns, &round_compute);
  json_decref(base);
  nb__e2e_report(&o, res, netns, round_compute);
  return rc;
}
