/* `nebula bench pareto`: quality against bits on the wire. One job (the e2e bench's default) is
 * trained by the exact single-cluster run and by the two-cluster nebula run at fixed points of
 * the codec (dense fp32, dense int8, top-k with int8 / 4-bit / 2-bit values, 2-bit with
 * SparseLoCo's decaying error feedback instead of outer momentum) and at the scheduler's own
 * choice, for one or more seeds; it prints each point's held-out loss ratio against single (mean
 * and per seed) and its bits per parameter per sync. Ratios only: both sides of each ratio come
 * from the same seed and the same machine. */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "bench/bench.h"
#include "bench/e2e.h"
#include "common/opts.h"

#define NB__PARETO_MAX_SEEDS 10

/* name, density, values, adaptive, ef_decay, outer momentum (-1: the job's), topk chunk,
 * overlap steps (0: the job's, 4 of 32), outer lr (0: the job's, 1), H (0: the job's, 32),
 * no_eager (1: sync.eager false) */
static const nb_e2e_point_t nb__points[] = {
    {"dense-fp32", 1.0, "fp32", 0, 0, -1, 0, 0, 0, 0, 0},
    {"dense-int8", 1.0, "int8", 0, 0, -1, 0, 0, 0, 0, 0},
    {"top10-int8", 0.10, "int8", 0, 0, -1, 0, 0, 0, 0, 0},
    {"top3-4bit", 0.03, "4bit", 0, 0, -1, 4096, 0, 0, 0, 0},
    {"top1.5-2bit", 0.015, "2bit", 0, 0, -1, 4096, 0, 0, 0, 0},
    /* SparseLoCo: e <- beta e + Delta replaces the outer momentum */
    {"top1.5-2bit-ef", 0.015, "2bit", 0, 0.95, 0, 4096, 0, 0, 0, 0},
    {"top3-2bit-ef", 0.03, "2bit", 0, 0.95, 0, 4096, 0, 0, 0, 0},
    {"top3-4bit-ef", 0.03, "4bit", 0, 0.95, 0, 4096, 0, 0, 0, 0},
    {"top10-int8-ef", 0.10, "int8", 0, 0.95, 0, 0, 0, 0, 0, 0},
    /* decaying error feedback with the job's outer Nesterov momentum: the best of a sweep */
    {"top3-2bit-efm", 0.03, "2bit", 0, 0.9, -1, 4096, 0, 0, 0, 0},
    {"top1.5-2bit-efm", 0.015, "2bit", 0, 0.9, -1, 4096, 0, 0, 0, 0},
    /* denser points that the Rice-coded chunked index brings under 0.5 bits */
    {"top5-2bit-efm", 0.05, "2bit", 0, 0.9, -1, 4096, 0, 0, 0, 0},
    {"top8-2bit-efm", 0.08, "2bit", 0, 0.9, -1, 4096, 0, 0, 0, 0},
    /* the same with the update landing 24 of 32 steps into the next round (a thin link) */
    {"top1.5-2bit-efm-t24", 0.015, "2bit", 0, 0.9, -1, 4096, 24, 0, 0, 0},
    {"top3-2bit-efm-t24", 0.03, "2bit", 0, 0.9, -1, 4096, 24, 0, 0, 0},
    {"top5-2bit-efm-t24", 0.05, "2bit", 0, 0.9, -1, 4096, 24, 0, 0, 0},
    {"top8-2bit-efm-t24", 0.08, "2bit", 0, 0.9, -1, 4096, 24, 0, 0, 0},
    /* a larger outer step for a sparse point */
    {"top5-2bit-efm-lr1.25", 0.05, "2bit", 0, 0.9, -1, 4096, 0, 1.25, 0, 0},
    {"top5-2bit-efm-lr1.5", 0.05, "2bit", 0, 0.9, -1, 4096, 0, 1.5, 0, 0},
    /* shorter rounds at the same bits per second on the link: H 16 at half the bits per sync */
    {"dense-int8-h16", 1.0, "int8", 0, 0, -1, 0, 0, 0, 16, 0},
    {"top3-2bit-efm-h16", 0.03, "2bit", 0, 0.9, -1, 4096, 0, 0, 16, 0},
    {"top5-2bit-efm-h16", 0.05, "2bit", 0, 0.9, -1, 4096, 0, 0, 16, 0},
    {"top1.5-2bit-efm-h8", 0.015, "2bit", 0, 0.9, -1, 4096, 0, 0, 8, 0},
    {"top1.5-2bit-efm-h8-t6", 0.015, "2bit", 0, 0.9, -1, 4096, 6, 0, 8, 0},
    {"top0.75-2bit-efm-h8", 0.0075, "2bit", 0, 0.9, -1, 4096, 0, 0, 8, 0},
    {"top3-2bit-efm-h16-t12", 0.03, "2bit", 0, 0.9, -1, 4096, 12, 0, 16, 0},
    {"top5-2bit-efm-h16-t12", 0.05, "2bit", 0, 0.9, -1, 4096, 12, 0, 16, 0},
    /* a sparse round starting from theta_global - own Delta, as before sync.eager */
    {"top3-2bit-efm-h16-noeager", 0.03, "2bit", 0, 0.9, -1, 4096, 0, 0, 16, 1},
    {"top3-2bit-efm-h16-t12-noeager", 0.03, "2bit", 0, 0.9, -1, 4096, 12, 0, 16, 1},
    {"sched", 0, NULL, 1, 0, -1, 0, 0, 0, 0, 0},
};
#define NB__N_POINTS (sizeof nb__points / sizeof nb__points[0])

/* --help's list of the points, after the options. */
static void nb__pareto_points_help(FILE* f) {
  fprintf(f, "Points:\n ");
  for (size_t i = 0; i < NB__N_POINTS; i++) fprintf(f, " %s", nb__points[i].name);
  fprintf(f, "\n(sched: the adaptive scheduler on the job's own compression).\n");
}

/* 1 when files a and b exist and hold the same bytes. */
static int nb__pareto_same_file(const char* a, const char* b) {
  FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
  int same = fa && fb;
  while (same) {
    int x = fgetc(fa), y = fgetc(fb);
    if (x != y) same = 0;
    if (x == EOF || y == EOF) break;
  }
  if (fa) fclose(fa);
  if (fb) fclose(fb);
  return same;
}

/* 1 when the comma-separated list names name (a NULL list: every point). */
static int nb__pareto_want(const char* list, const char* name) {
  if (!list) return 1;
  size_t n = strlen(name);
  for (const char* p = list; *p;) {
    const char* e = strchr(p, ',');
    size_t len = e ? (size_t)(e - p) : strlen(p);
    if (len == n && strncmp(p, name, n) == 0) return 1;
    p += len + (e ? 1 : 0);
  }
  return 0;
}

/* The flags of `nebula bench pareto`. */
typedef struct {
  const char *job, *data_dir, *out, *points;
  double rate;
  long seeds, eval_batches, steps; /* steps 0: the job's */
  int as_json, reuse;
} nb__pareto_opts_t;

/* Parses the flags into *o; -1 to go on, else the exit code (0 after --help, 2 on a bad flag or
 * a --points list that names no point, having said why in one line). */
static int nb__pareto_parse(int argc, char** argv, nb__pareto_opts_t* o) {
  *o = (nb__pareto_opts_t){.job = "jobs/examples/pretrain-2dc-small.json",
                           .out = "runs/bench-pareto",
                           .rate = 100,
                           .seeds = 1,
                           .eval_batches = -1};
  const nb_opt_t opts[] = {
      NB_E2E_RUN_OPTIONS(o, "runs/bench-pareto"),
      NB_OPTION("seeds", NB_OPT_LONG, &o->seeds, "N", "seeds 1..N (default 1)", .min = 1,
                .max = NB__PARETO_MAX_SEEDS),
      NB_OPTION("points", NB_OPT_STR, &o->points, "A,B,...", "the points to run (default all)"),
      NB_OPTION("rate-mbit", NB_OPT_DOUBLE, &o->rate, "R", "the link's rate (default 100)",
                .min = 1e-6, .max = 1000000),
      NB_OPTION("reuse", NB_OPT_FLAG, &o->reuse, NULL,
                "read a finished run of exactly the same job in --out instead of running it\n"
                "again (an interrupted study resumes; another --points list reuses the single\n"
                "runs)"),
      NB_OPTION_END,
  };
  const nb_cmd_spec_t spec = {
      .cmd = "nebula bench pareto",
      .synopsis =
          "usage: nebula bench pareto [--job FILE] [--seeds N] [--points A,B,...] [--steps N]\n"
          "                           [--eval-batches B] [--rate-mbit R] [--data-dir DIR]\n"
          "                           [--out DIR] [--reuse] [--json]",
      .about =
          "Trains the job once on one cluster (exact) and once per codec point on two\n"
          "clusters with outer sync, for seeds 1..N, and prints each point's held-out loss\n"
          "ratio against the single run (mean and per seed) and bits per parameter per sync.\n"
          "The link is the job's, at --rate-mbit; the runs take a minute or two each on two\n"
          "cores, so 3 seeds of every point take hours.",
      .opts = opts,
      .more_help = nb__pareto_points_help,
  };
  int rc = nb_opts_parse(&spec, argc, argv);
  if (rc != NB_OPTS_RUN) return rc;
  size_t chosen = 0;
  for (size_t p = 0; p < NB__N_POINTS; p++)
    chosen += (size_t)nb__pareto_want(o->points, nb__points[p].name);
  if (chosen == 0) {
    fprintf(stderr,
            "nebula bench pareto: --points names none of the points (see nebula bench pareto "
            "--help)\n");
    return 2;
  }
  return -1;
}

/* The figures of every run: single[s] of the exact run of seed s + 1, bpb[p][s] and bits[p][s]
 * of point p. */
typedef struct {
  double single[NB__PARETO_MAX_SEEDS], bpb[NB__N_POINTS][NB__PARETO_MAX_SEEDS];
  double bits[NB__N_POINTS][NB__PARETO_MAX_SEEDS];
} nb__pareto_table_t;

/* One run of seed s + 1 (pt NULL: the exact single-cluster run) into *r: derived from base,
 * read back from --out under --reuse when the same job finished there, else run. 0, or 1 after
 * saying why the job could not be derived or written or the run failed. */
static int nb__pareto_run(const nb__pareto_opts_t* o, json_t* base, long s,
                          const nb_e2e_point_t* pt, nb_e2e_result_t* r) {
  const char* name = pt ? pt->name : "single";
  char jp[1200], op[1200], lp[1200];
  snprintf(jp, sizeof jp, "%s/seed%ld-%s.json", o->out, s + 1, name);
  snprintf(op, sizeof op, "%s/seed%ld-%s", o->out, s + 1, name);
  snprintf(lp, sizeof lp, "%s/seed%ld-%s.log", o->out, s + 1, name);
  char fresh[1300];
  snprintf(fresh, sizeof fresh, "%s.new", jp);
  if (nb_e2e_write_job(base, pt ? "nebula" : "single", o->rate, 0, fresh, pt) != 0) {
    fprintf(stderr, "nebula bench pareto: %s: cannot derive the %s job\n", o->job, name);
    return 1;
  }
  *r = (nb_e2e_result_t){.name = pt ? "nebula" : "single"};
  int st = 0;
  /* --reuse: a finished run of exactly this job (and --steps) in --out is read, not rerun */
  if (o->reuse && !o->steps && nb__pareto_same_file(fresh, jp)) nb_e2e_collect(op, r);
  if (r->ok && isfinite(r->eval_bpb)) {
    remove(fresh);
    if (!o->as_json) printf("pareto: seed %ld: %s: reusing %s\n", s + 1, name, op);
  } else {
    if (rename(fresh, jp) != 0) {
      fprintf(stderr, "nebula bench pareto: cannot write %s: %s\n", jp, strerror(errno));
      return 1;
    }
    if (!o->as_json) {
      printf("pareto: seed %ld: %s (log %s)\n", s + 1, name, lp);
      fflush(stdout);
    }
    r->ok = 0;
    st = nb_e2e_run(jp, op, lp, o->data_dir, o->steps);
    nb_e2e_collect(op, r);
  }
  if (st != 0 || !r->ok || !isfinite(r->eval_bpb)) {
    fprintf(stderr, "nebula bench pareto: the %s run of seed %ld failed (exit %d); see %s\n", name,
            s + 1, st, lp);
    return 1;
  }
  return 0;
}

/* Every seed's exact run and chosen points in turn into *t; stops at the first failure. */
static int nb__pareto_runs(const nb__pareto_opts_t* o, json_t* base, nb__pareto_table_t* t) {
  int rc = 0;
  json_t* tr = json_object_get(json_object_get(base, "spec"), "training");
  for (long s = 0; s < o->seeds && rc == 0; s++) {
    json_object_set_new(tr, "seed", json_integer(s + 1));
    for (size_t p = 0; p <= NB__N_POINTS && rc == 0; p++) {
      /* p == 0: the exact single-cluster run; then the points */
      const nb_e2e_point_t* pt = p ? &nb__points[p - 1] : NULL;
      if (pt && !nb__pareto_want(o->points, pt->name)) continue;
      nb_e2e_result_t r;
      rc = nb__pareto_run(o, base, s, pt, &r);
      if (rc != 0) break;
      if (!pt) {
        t->single[s] = r.eval_bpb;
      } else {
        t->bpb[p - 1][s] = r.eval_bpb;
        t->bits[p - 1][s] = r.bits_per_param;
      }
    }
  }
  return rc;
}

/* Each chosen point's bits per parameter and loss ratio against single (mean and per seed),
 * as one JSON object (as_json) or as a table. */
static void nb__pareto_report(const nb__pareto_opts_t* o, const nb__pareto_table_t* t) {
  long seeds = o->seeds;
  json_t *j = NULL, *jpoints = NULL; /* --json: built with jansson, non-finite numbers null */
  if (o->as_json) {
    j = json_object();
    json_object_set_new(j, "seeds", json_integer(seeds));
    json_t* single = json_array();
    for (long s = 0; s < seeds; s++)
      json_array_append_new(single, nb_bench_json_real(t->single[s]));
    json_object_set_new(j, "single_eval_bpb", single);
    jpoints = json_array();
    json_object_set_new(j, "points", jpoints);
  } else {
    printf("\n%-16s %8s %6s %12s %11s  %s\n", "point", "density", "values", "bits/param",
           "loss_ratio", "per seed");
  }
  for (size_t p = 0; p < NB__N_POINTS; p++) {
    const nb_e2e_point_t* pt = &nb__points[p];
    if (!nb__pareto_want(o->points, pt->name)) continue;
    const double *bpb = t->bpb[p], *single = t->single;
    double mean_ratio = 0, mean_bits = 0;
    for (long s = 0; s < seeds; s++) {
      mean_ratio += bpb[s] / single[s] / (double)seeds;
      mean_bits += t->bits[p][s] / (double)seeds;
    }
    if (o->as_json) {
      json_t *ratio = json_array(), *ev = json_array();
      for (long s = 0; s < seeds; s++) {
        json_array_append_new(ratio, nb_bench_json_real(bpb[s] / single[s]));
        json_array_append_new(ev, nb_bench_json_real(bpb[s]));
      }
      json_array_append_new(
          jpoints,
          json_pack("{s:s, s:o, s:s, s:b, s:o, s:o, s:o, s:o}", "name", pt->name, "density",
                    nb_bench_json_real(pt->density), "values", pt->values ? pt->values : "job",
                    "adaptive", pt->adaptive ? 1 : 0, "bits_per_param_per_sync",
                    nb_bench_json_real(mean_bits), "loss_ratio_mean",
                    nb_bench_json_real(mean_ratio), "loss_ratio", ratio, "eval_bpb", ev));
    } else {
      char dens[16];
      snprintf(dens, sizeof dens, pt->adaptive ? "sched" : "%g", pt->density);
      printf("%-16s %8s %6s %12.3f %11.4f  ", pt->name, dens, pt->values ? pt->values : "job",
             mean_bits, mean_ratio);
      for (long s = 0; s < seeds; s++) printf("%s%.4f", s ? " " : "", bpb[s] / single[s]);
      printf("\n");
    }
  }
  if (o->as_json) {
    json_object_set_new(j, "rate_mbit", nb_bench_json_real(o->rate));
    nb_bench_json_print(stdout, j);
  } else
    printf(
        "(loss ratio: held-out bits per byte of the two-cluster run over the exact "
        "single-cluster run of the same seed; %g Mbit/s link)\n",
        o->rate);
}

int nb_bench_pareto_main(int argc, char** argv) {
  nb__pareto_opts_t o;
  int rc = nb__pareto_parse(argc, argv, &o);
  if (rc >= 0) return rc;
  rc = 0;
  json_t* base = nb_e2e_load_job("pareto", o.job, -1, o.eval_batches, o.out, &rc);
  if (!base) return rc;
  nb__pareto_table_t t;
  rc = nb__pareto_runs(&o, base, &t);
  json_decref(base);
  if (rc != 0) return rc;
  nb__pareto_report(&o, &t);
  return 0;
}
