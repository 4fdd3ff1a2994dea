/* Path confinement of a descriptor run by a gateway (jobs/job_paths.h): resolves each path the
 * way open() will (symlinks of the existing prefix followed by realpath) and refuses what lands
 * outside the job's folder or the allowed roots. Not a sandbox: the job's processes still run
 * with the gateway's privileges; this keeps the descriptor from naming other people's files. */
#include "jobs/job_paths.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"

typedef struct {
  nb_descriptor_diag_t* diag;
  int errors;
  char first[640];
  char all[2048];
  size_t all_len;
} nb__pctx_t;

static void nb__refuse(nb__pctx_t* c, const char* path, const char* fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void nb__refuse(nb__pctx_t* c, const char* path, const char* fmt, ...) {
  char msg[384];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (c->errors++ == 0) snprintf(c->first, sizeof c->first, "%s: %s", path, msg);
  if (c->all_len + 4 < sizeof c->all) {
    int n = snprintf(c->all + c->all_len, sizeof c->all - c->all_len, "%s%s: %s",
                     c->all_len ? "; " : "", path, msg);
    if (n > 0) c->all_len += (size_t)n;
    if (c->all_len >= sizeof c->all) c->all_len = sizeof c->all - 1;
  }
  nb_descriptor_diag_add(c->diag, path, 0, 0, msg);
}

static int nb__has_dotdot(const char* p) {
  for (const char* s = p; *s;) {
    const char* e = strchr(s, '/');
    size_t n = e ? (size_t)(e - s) : strlen(s);
    if (n == 2 && s[0] == '.' && s[1] == '.') return 1;
    if (!e) break;
    s = e + 1;
  }
  return 0;
}

/* The canonical absolute form of p (absolute, or relative to base): the realpath of its longest
 * existing prefix followed by the rest as written (which holds no ".."). Returns 0, or -1 with
 * why set: a dangling symbolic link (open(O_CREAT) would follow it anywhere), or a prefix that
 * cannot be resolved. */
static int nb__canon(const char* base, const char* p, char* out, size_t cap, char* why, size_t wn) {
  char full[PATH_MAX], pre[PATH_MAX], real[PATH_MAX];
  int n = p[0] == '/' ? snprintf(full, sizeof full, "%s", p)
                      : snprintf(full, sizeof full, "%s/%s", base, p);
  if (n < 0 || (size_t)n >= sizeof full) {
    snprintf(why, wn, "is too long");
    return -1;
  }
  memcpy(pre, full, sizeof pre);
  size_t plen = strlen(pre);
  for (;;) {
    while (plen > 1 && pre[plen - 1] == '/') pre[--plen] = 0;
    if (realpath(pre, real)) break;
    if (errno != ENOENT && errno != ENOTDIR) {
      snprintf(why, wn, "cannot be resolved (%s)", strerror(errno));
      return -1;
    }
    struct stat sb;
    if (lstat(pre, &sb) == 0) {
      snprintf(why, wn, "goes through a symbolic link that points nowhere");
      return -1;
    }
    char* slash = strrchr(pre, '/');
    if (!slash) {
      snprintf(why, wn, "cannot be resolved");
      return -1;
    }
    plen = slash == pre ? 1 : (size_t)(slash - pre);
    pre[plen] = 0;
  }
  /* the rest, as written: components other than "." and "" */
  const char* rest = full + strlen(pre);
  size_t o = (size_t)snprintf(out, cap, "%s", real);
  for (const char* s = rest; *s;) {
    while (*s == '/') s++;
    const char* e = strchr(s, '/');
    size_t k = e ? (size_t)(e - s) : strlen(s);
    if (k && !(k == 1 && s[0] == '.')) {
      if (o + 1 + k >= cap) {
        snprintf(why, wn, "is too long");
        return -1;
      }
      if (o > 1 || out[0] != '/') out[o++] = '/';
      memcpy(out + o, s, k);
      o += k;
      out[o] = 0;
    }
    s += k;
  }
  return 0;
}

static int nb__inside(const char* path, const char* root) {
  if (!root[0]) return 0;
  if (!strcmp(root, "/")) return 1;
  size_t n = strlen(root);
  return !strncmp(path, root, n) && (path[n] == 0 || path[n] == '/');
}

typedef struct {
  const char* base;   /* relative paths are taken against this (NULL: not resolved) */
  char job[PATH_MAX]; /* realpath of the job's folder; "" = does not exist yet */
  int n_roots;
  char roots[NB_JOB_PATHS_MAX_ROOTS][PATH_MAX];
} nb__where_t;

/* One path field. writable: the job writes and prunes there (checkpoint.dir): its folder only. */
static void nb__one(nb__pctx_t* c, const nb__where_t* w, const char* jpath, const char* p,
                    int writable) {
  if (!p[0]) return;
  if (nb__has_dotdot(p)) {
    nb__refuse(c, jpath,
               "\"%s\": \"..\" is not allowed in the paths of a job run by a gateway (they must "
               "stay inside the job's folder%s)",
               p, writable ? "" : " or the gateway's allowed roots");
    return;
  }
  if (p[0] != '/' && !w->base) return; /* inside a folder created afresh for the job */
  if (p[0] == '/' && writable) {
    nb__refuse(c, jpath,
               "\"%s\": an absolute path is not allowed: a job run by a gateway writes "
               "only inside its own folder (use a relative path)",
               p);
    return;
  }
  char canon[PATH_MAX], why[160];
  if (nb__canon(w->base ? w->base : "/", p, canon, sizeof canon, why, sizeof why) != 0) {
    nb__refuse(c, jpath, "\"%s\" %s", p, why);
    return;
  }
  if (w->job[0] && nb__inside(canon, w->job)) return;
  for (int i = 0; !writable && i < w->n_roots; i++)
    if (nb__inside(canon, w->roots[i])) return;
  if (writable)
    nb__refuse(c, jpath,
               "\"%s\" resolves outside the job's folder (through a symbolic link): a job run by "
               "a gateway writes only inside its own folder",
               p);
  else if (p[0] == '/')
    nb__refuse(c, jpath,
               "\"%s\" is outside the job's folder and the gateway's allowed roots (paths.allow "
               "in its config)",
               p);
  else
    nb__refuse(c, jpath,
               "\"%s\" resolves outside the job's folder (through a symbolic link) and the "
               "gateway's allowed roots",
               p);
}

static nb_status_t nb__check(const nb_job_config_t* cfg, const nb__where_t* w,
                             nb_descriptor_diag_t* diag, int all_in_message) {
  nb__pctx_t c;
  memset(&c, 0, sizeof c);
  c.diag = diag;
  char jp[96];
  for (int i = 0; i < cfg->n_clusters; i++) {
    snprintf(jp, sizeof jp, "$.spec.clusters[%d].data.dir", i);
    nb__one(&c, w, jp, cfg->clusters[i].data_dir, 0);
  }
  nb__one(&c, w, "$.spec.model.base.checkpoint", cfg->model.base_checkpoint, 0);
  if (strcmp(cfg->training.distill.teacher, "base") != 0)
    nb__one(&c, w, "$.spec.training.distillation.teacher", cfg->training.distill.teacher, 0);
  nb__one(&c, w, "$.spec.security.ca", cfg->security.ca, 0);
  nb__one(&c, w, "$.spec.security.cert", cfg->security.cert, 0);
  nb__one(&c, w, "$.spec.security.key", cfg->security.key, 0);
  nb__one(&c, w, "$.spec.checkpoint.dir", cfg->checkpoint.dir, 1);
  /* the program runs in its workDir (it writes there: the job's folder only) and is either a
   * name looked up in PATH or a file inside the job's folder or the allowed roots; a relative
   * one is opened from the workDir */
  const nb_job_program_t* pg = &cfg->program;
  nb__one(&c, w, "$.spec.program.workDir", pg->workdir, 1);
  if (pg->argc > 0 && strchr(pg->argv[0], '/')) {
    char joined[2 * NB_JOB_PATH_MAX + 2];
    if (pg->argv[0][0] != '/' && pg->workdir[0])
      snprintf(joined, sizeof joined, "%s/%s", pg->workdir, pg->argv[0]);
    else
      snprintf(joined, sizeof joined, "%s", pg->argv[0]);
    nb__one(&c, w, "$.spec.program.command[0]", joined, 0);
  }
  /* shipped files are written into the workDir: the job's folder only */
  for (int i = 0; i < pg->n_files; i++) {
    char joined[2 * NB_JOB_PATH_MAX + 2];
    snprintf(joined, sizeof joined, "%s%s%s", pg->workdir, pg->workdir[0] ? "/" : "",
             pg->files[i].path);
    snprintf(jp, sizeof jp, "$.spec.program.files[%d].path", i);
    nb__one(&c, w, jp, joined, 1);
  }
  if (!c.errors) return NB_OK;
  return nb_error(NB_ERR_PERMISSION, "%s", all_in_message ? c.all : c.first);
}

static void nb__add_root(nb__where_t* w, const char* r, size_t n) {
  char tmp[PATH_MAX];
  if (!n || n >= sizeof tmp || w->n_roots >= NB_JOB_PATHS_MAX_ROOTS) return;
  memcpy(tmp, r, n);
  tmp[n] = 0;
  /* a root that does not exist allows nothing */
  if (realpath(tmp, w->roots[w->n_roots])) w->n_roots++;
}

nb_status_t nb_job_paths_check(const nb_job_config_t* cfg, const char* job_dir,
                               const char* const* roots, int n_roots, nb_descriptor_diag_t* diag) {
  if (!cfg || n_roots < 0 || (n_roots > 0 && !roots))
    return nb_error(NB_ERR_INVALID, "job paths: NULL argument");
  nb__where_t* w = NULL;
  NB_CHECK(nb_calloc((void**)&w, 1, sizeof *w, "job paths"));
  if (job_dir && !realpath(job_dir, w->job)) {
    nb_free(w);
    return nb_error(NB_ERR_IO, "job folder %s: %s", job_dir, strerror(errno));
  }
  w->base = job_dir ? w->job : NULL;
  for (int i = 0; i < n_roots; i++)
    if (roots[i]) nb__add_root(w, roots[i], strlen(roots[i]));
  nb_status_t st = nb__check(cfg, w, diag, 0);
  nb_free(w);
  return st;
}

nb_status_t nb_job_paths_confine_env(const nb_job_config_t* cfg) {
  const char* jd = getenv("NB_JOB_DIR");
  if (!cfg || !jd || !*jd) return NB_OK;
  nb__where_t* w = NULL;
  NB_CHECK(nb_calloc((void**)&w, 1, sizeof *w, "job paths"));
  char cwd[PATH_MAX];
  nb_status_t st = NB_OK;
  if (!realpath(jd, w->job) || !getcwd(cwd, sizeof cwd)) {
    st = nb_error(NB_ERR_IO, "job folder %s: %s", jd, strerror(errno));
    goto out;
  }
  w->base = cwd; /* relative paths open against the current folder: check them there */
  const char* r = getenv(NB_JOB_PATHS_ENV);
  while (r && *r) {
    const char* e = strchr(r, ':');
    size_t n = e ? (size_t)(e - r) : strlen(r);
    nb__add_root(w, r, n);
    r += n + (e ? 1 : 0);
  }
  st = nb__check(cfg, w, NULL, 1);
  if (st != NB_OK) st = nb_error_wrap(NB_ERR_PERMISSION, "refused paths of a job run by a gateway");
out:
  nb_free(w);
  return st;
}
