/* Artifacts of jobs: a job's outputs put in the artifact store once it succeeded here, what
 * the artifact service may serve to a peer of a job, who may put files, and fetching a job's
 * base checkpoint and its program's files from the cluster that holds them. The store and the
 * wire protocol are gateway/artifact.h. */
#include "gateway/gateway_internal.h"

#include <dirent.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "jobs/job_paths.h"

/* Puts the files of one output folder in the artifact store as
 * "<owner>/<job name>/<prefix><file>", owned by (owner, id): every *.safetensors, summary.json
 * and rounds.tsv at its top. Records an "artifact" event for each. */
static void nb__publish_dir(nb_gateway_t* gw, nb_job_store_t* st, const char* id, const char* owner,
                            const char* job_name, const char* dir, const char* prefix) {
  DIR* d = opendir(dir);
  if (!d) return;
  struct dirent* e;
  while ((e = readdir(d))) {
    size_t n = strlen(e->d_name);
    int want = (n > 12 && !strcmp(e->d_name + n - 12, ".safetensors")) ||
               !strcmp(e->d_name, "summary.json") || !strcmp(e->d_name, "rounds.tsv");
    if (!want) continue;
    char path[NB_GW_STR * 2 + 512], name[NB_ARTIFACT_NAME_MAX];
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) continue;
    if (snprintf(name, sizeof name, "%s/%s/%s%s", owner, job_name, prefix, e->d_name) >=
        (int)sizeof name)
      continue;
    int fd = nb__gw_open_job_file(gw, path);
    if (fd < 0) continue;
    char via[64]; /* the file just checked, whatever its name points to by now */
    snprintf(via, sizeof via, "/proc/self/fd/%d", fd);
    nb_artifact_info_t info;
    nb_status_t ps = nb_artifact_put(gw->art, name, owner, id, via, &info);
    close(fd);
    if (ps != NB_OK) {
      NB_WARN("job %s: cannot keep %s as artifact %s: %s", id, path, name, nb_error_last());
      continue;
    }
    json_t* j = json_pack("{s:s, s:s, s:I}", "name", name, "sha256", info.sha256, "size",
                          (json_int_t)info.size);
    char* txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (txt) nb_job_store_append_event(st, id, "artifact", txt, NULL);
    free(txt);
    json_decref(j);
  }
  closedir(d);
}

/* A job's part succeeded here: its outputs (final model, summary, the latest checkpoint with
 * the adapters of a LoRA job) become artifacts under "<owner>/<job name>/<relative path>",
 * owned by the job's user and the job, where peer gateways of a later job of the same user can
 * fetch them (gateway/artifact.h: who is entitled to what). */
void nb__gw_publish(nb_gateway_t* gw, nb_job_store_t* st, const char* id) {
  if (!gw->art) return;
  nb_job_record_t rec = {0};
  if (nb_job_store_get(st, id, &rec) != NB_OK) return;
  json_t* d = json_loads(rec.descriptor ? rec.descriptor : "", 0, NULL);
  char owner[NB_ARTIFACT_ID_MAX];
  snprintf(owner, sizeof owner, "%.63s", rec.owner);
  nb_job_record_clear(&rec);
  if (!owner[0] || strchr(owner, '/')) {
    json_decref(d);
    NB_WARN("job %s: no owner recorded; its outputs are not kept as artifacts", id);
    return;
  }
  const char* nm = json_string_value(json_object_get(json_object_get(d, "metadata"), "name"));
  char job_name[NB_JOB_NAME_MAX];
  snprintf(job_name, sizeof job_name, "%.63s", nm ? nm : id);
  json_decref(d);
  char dir[NB_GW_STR + NB_JOB_ID_MAX + 2], out[sizeof dir + 8], ck[sizeof out + 16];
  nb__gw_jobdir(gw, id, dir, sizeof dir);
  snprintf(out, sizeof out, "%s/out", dir);
  const char* tops[2] = {out, dir};
  for (int t = 0; t < 2; t++) {
    nb__publish_dir(gw, st, id, owner, job_name, tops[t], "");
    /* the newest trainer checkpoint folder step-<N> */
    snprintf(ck, sizeof ck, "%s/checkpoints", tops[t]);
    DIR* cd = opendir(ck);
    if (!cd) continue;
    long best = -1;
    struct dirent* e;
    while ((e = readdir(cd))) {
      long step;
      char tail;
      if (sscanf(e->d_name, "step-%ld%c", &step, &tail) == 1 && step > best) best = step;
    }
    closedir(cd);
    if (best < 0) continue;
    char sub[sizeof ck + 32], prefix[64];
    snprintf(sub, sizeof sub, "%s/step-%ld", ck, best);
    snprintf(prefix, sizeof prefix, "checkpoints/step-%ld/", best);
    nb__publish_dir(gw, st, id, owner, job_name, sub, prefix);
  }
}

/* The artifact service asks whether `peer` takes part in job_id (one of the clusters its
 * descriptor names, or the one holding its base checkpoint) and for the job's secret, owner and
 * base checkpoint, from which it decides what the job is entitled to (gateway/artifact.h). */
nb_status_t nb__gw_artifact_job(void* user, const char* job_id, const char* peer,
                                nb_artifact_job_t* out) {
  nb_gateway_t* gw = user;
  nb_job_store_t* st = NULL;
  nb_job_config_t* cfg = NULL;
  nb_job_fed_t fed;
  json_t* info = NULL;
  int loaded = 0;
  nb_status_t s = nb__gw_open_store(gw, &st);
  if (s == NB_OK) {
    s = nb__gw_fed_load(st, job_id, &fed, &info);
    loaded = s == NB_OK;
    if (s == NB_ERR_NOT_FOUND) s = nb_error(NB_ERR_NOT_FOUND, "no federated job '%s' here", job_id);
  }
  if (s == NB_OK && !fed.has_secret)
    s = nb_error(NB_ERR_NOT_FOUND, "job '%s' is not committed here", job_id);
  if (s == NB_OK) s = nb__gw_job_config(st, job_id, &cfg);
  if (s == NB_OK) {
    nb__part_t parts[NB__MAX_PARTS];
    int np = nb__gw_parts(cfg, parts), in = 0;
    for (int i = 0; i < np; i++) in |= !strcmp(parts[i].id, peer);
    in |= !strcmp(fed.origin, peer); /* the origin fetches the job's outputs for its report */
    if (!in)
      s = nb_error(NB_ERR_PERMISSION, "cluster '%s' takes no part in job '%s'", peer, job_id);
  }
  nb_job_record_t rec = {0};
  if (s == NB_OK) s = nb_job_store_get(st, job_id, &rec);
  if (s == NB_OK) {
    memcpy(out->secret, fed.secret, 32);
    snprintf(out->owner, sizeof out->owner, "%.63s", rec.owner);
    snprintf(out->base, sizeof out->base, "%.255s", cfg->model.base_checkpoint);
    snprintf(out->base_sha256, sizeof out->base_sha256, "%s", cfg->model.base_sha256);
    out->n_files = 0;
    for (int i = 0; i < cfg->program.n_files && i < NB_ARTIFACT_JOB_FILES; i++)
      snprintf(out->files[out->n_files++], sizeof out->files[0], "%.255s",
               cfg->program.files[i].artifact);
  }
  nb_job_record_clear(&rec);
  if (loaded) nb__gw_fed_release(&fed, info);
  nb_free(cfg);
  nb_job_store_close(st);
  return s;
}

/* Gives dest and the folders made for it, up to the job's folder dir, to run_as. */
static void nb__give_up_to(nb_gateway_t* gw, const char* dir, const char* dest) {
  if (!gw->run_as) return;
  char q[NB_GW_STR * 2 + NB_JOB_PATH_MAX * 2];
  snprintf(q, sizeof q, "%s", dest);
  while (strlen(q) > strlen(dir)) {
    nb__gw_give(gw, q);
    char* sl = strrchr(q, '/');
    if (!sl) break;
    *sl = 0;
  }
}

/* Fetches artifact `name` of job id from cluster `from`'s gateway into dest (sealed with the job's
 * secret, resumed, hash-checked: gateway/artifact.h); the one path by which a job's base
 * checkpoint and its program's files reach a cluster that does not hold them. */
static nb_status_t nb__fetch_from(nb_gateway_t* gw, const char* from, const char* id,
                                  const uint8_t* secret, const char* name, const char* dest,
                                  nb_artifact_info_t* info) {
  const char* target = NULL;
  for (int i = 0; i < gw->cfg.n_peers; i++)
    if (!strcmp(gw->cfg.peers[i].id, from)) target = gw->cfg.peers[i].address;
  if (!target || !secret)
    return nb_error(NB_ERR_INVALID, "cluster '%s' is not a peer of gateway '%s'", from,
                    gw->cfg.cluster_id);
  nb_artifact_fetch_opts_t o;
  memset(&o, 0, sizeof o);
  nb_tls_t* tls = nb_tls_source_get(gw->tls_src); /* the pair in use now (SIGHUP reloads) */
  o.target = target;
  o.tls = tls;
  o.account = gw->art;
  o.expected_cluster = from;
  o.job_id = id;
  o.secret = secret;
  o.name = name;
  o.dest = dest;
  o.timeout_ms = (int64_t)gw->cfg.federation_timeout_ms * 30;
  nb_status_t s = nb_artifact_fetch(&o, info);
  nb_tls_destroy(tls);
  return s;
}

/* A job whose model.base names another cluster: fetch that checkpoint from that cluster's
 * gateway into the job folder at the descriptor's relative path (by content hash when the
 * descriptor pins one), before anything runs. */
nb_status_t nb__gw_fetch_base(nb_gateway_t* gw, nb_job_store_t* st, const char* id,
                              const uint8_t secret[32]) {
  nb_job_config_t* cfg = NULL;
  NB_CHECK(nb__gw_job_config(st, id, &cfg));
  nb_status_t s = NB_OK;
  const nb_job_model_t* mo = &cfg->model;
  char dir[NB_GW_STR + NB_JOB_ID_MAX + 2], dest[sizeof dir + NB_JOB_PATH_MAX + 2],
      parent[sizeof dest], name[NB_JOB_SHA256_HEX + 8];
  if (!mo->base_checkpoint[0] || !mo->base_cluster[0] ||
      !strcmp(mo->base_cluster, gw->cfg.cluster_id))
    goto out;
  if (nb_artifact_name_check(mo->base_checkpoint) != NB_OK) {
    s = nb_error_wrap(NB_ERR_INVALID, "model.base.checkpoint '%s' cannot be fetched",
                      mo->base_checkpoint);
    goto out;
  }
  int peer = 0;
  for (int i = 0; i < gw->cfg.n_peers; i++) peer |= !strcmp(gw->cfg.peers[i].id, mo->base_cluster);
  if (!peer) {
    s = nb_error(NB_ERR_INVALID, "model.base.cluster '%s' is not a peer of gateway '%s'",
                 mo->base_cluster, gw->cfg.cluster_id);
    goto out;
  }
  nb__gw_jobdir(gw, id, dir, sizeof dir);
  snprintf(dest, sizeof dest, "%s/%s", dir, mo->base_checkpoint);
  snprintf(parent, sizeof parent, "%s", dest);
  *strrchr(parent, '/') = 0;
  if (nb__gw_mkdirs(parent) != 0) {
    s = nb_error(NB_ERR_IO, "cannot create %s: %s", parent, strerror(errno));
    goto out;
  }
  if (mo->base_sha256[0]) snprintf(name, sizeof name, "sha256:%s", mo->base_sha256);
  const char* what = mo->base_sha256[0] ? name : mo->base_checkpoint;
  nb_artifact_info_t info;
  double t0 = nb_now_s();
  s = nb__fetch_from(gw, mo->base_cluster, id, secret, what, dest, &info);
  if (s != NB_OK) {
    s = nb_error_wrap(s, "fetching the base checkpoint %s from cluster '%s'", what,
                      mo->base_cluster);
    goto out;
  }
  nb__give_up_to(gw, dir, dest); /* the fetched file and the folders made for it */
  json_t* j =
      json_pack("{s:s, s:s, s:s, s:I, s:f}", "name", what, "from", mo->base_cluster, "sha256",
                info.sha256, "size", (json_int_t)info.size, "seconds", nb_now_s() - t0);
  char* txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
  if (txt) nb_job_store_append_event(st, id, "fetch", txt, NULL);
  free(txt);
  json_decref(j);
  NB_INFO(JOB, "job %s: base checkpoint %s fetched from %s (%llu bytes)", id, what,
          mo->base_cluster, (unsigned long long)info.size);
out:
  nb_free(cfg);
  return s;
}

/* Artifacts.Put: a user the ACL names (any rule of that user or of "*") may put files into its
 * own namespace here; what the files may be used for is the job's business (Submit's ACL). */
nb_status_t nb__gw_may_put(void* user, const char* name) {
  const nb_gateway_t* gw = user;
  for (int i = 0; i < gw->cfg.acl.n_rules; i++)
    if (!strcmp(gw->cfg.acl.rules[i].user, name) || !strcmp(gw->cfg.acl.rules[i].user, "*"))
      return NB_OK;
  return nb_error(NB_ERR_PERMISSION, "user '%s' is not in this gateway's ACL", name);
}

/* A job that runs the user's program with spec.program.files: each file into
 * <jobdir>/<workDir>/<path> before launch, from this gateway's own store when the file's cluster
 * is this one, else fetched from that cluster's gateway as the base checkpoint is (sealed with
 * the job's secret; NULL secret: a job of this cluster only). The default cluster is the
 * origin's (origin NULL: this gateway). A file that cannot be had fails the launch naming it. */
nb_status_t nb__gw_fetch_files(nb_gateway_t* gw, nb_job_store_t* st, const char* id,
                               const uint8_t* secret, const char* origin) {
  nb_job_config_t* cfg = NULL;
  NB_CHECK(nb__gw_job_config(st, id, &cfg));
  nb_status_t s = NB_OK;
  nb_job_record_t rec = {0};
  nb_descriptor_diag_t* diag = NULL;
  const nb_job_program_t* pg = &cfg->program;
  if (pg->n_files == 0) goto out;
  NB_CHECK_GOTO(nb_job_store_get(st, id, &rec), s, out);
  if (!rec.owner[0]) {
    s = nb_error(NB_ERR_PERMISSION, "job %s has no owner: its program's files cannot be had", id);
    goto out;
  }
  char dir[NB_GW_STR + NB_JOB_ID_MAX + 2];
  nb__gw_jobdir(gw, id, dir, sizeof dir);
  /* the files land where the descriptor's paths say, inside the job's folder as it is now */
  const char* roots[NB_JOB_PATHS_MAX_ROOTS];
  for (int i = 0; i < gw->cfg.n_allow; i++) roots[i] = gw->cfg.allow[i];
  NB_CHECK_GOTO(nb_calloc((void**)&diag, 1, sizeof *diag, "diagnostics"), s, out);
  if (nb_job_paths_check(cfg, dir, roots, gw->cfg.n_allow, diag) != NB_OK) {
    s = nb__gw_diag_error(NB_ERR_PERMISSION, "descriptor refused:", diag);
    goto out;
  }
  for (int i = 0; i < pg->n_files; i++) {
    const char* art = pg->files[i].artifact;
    const char* from = pg->files[i].cluster[0] ? pg->files[i].cluster
                       : origin && origin[0]   ? origin
                                               : gw->cfg.cluster_id;
    char dest[sizeof dir + 2 * NB_JOB_PATH_MAX + 4], parent[sizeof dest];
    if (snprintf(dest, sizeof dest, "%s/%s%s%s", dir, pg->workdir, pg->workdir[0] ? "/" : "",
                 pg->files[i].path) >= (int)sizeof dest) {
      s = nb_error(NB_ERR_INVALID, "$.spec.program.files[%d].path: too long", i);
      goto out;
    }
    snprintf(parent, sizeof parent, "%s", dest);
    *strrchr(parent, '/') = 0;
    if (nb__gw_mkdirs(parent) != 0) {
      s = nb_error(NB_ERR_IO, "$.spec.program.files[%d]: cannot create %s: %s", i, parent,
                   strerror(errno));
      goto out;
    }
    nb_artifact_info_t info;
    double t0 = nb_now_s();
    if (!strcmp(from, gw->cfg.cluster_id)) {
      s = nb_artifact_copy_out(gw->art, art, rec.owner, dest, &info);
    } else {
      s = nb__fetch_from(gw, from, id, secret, art, dest, &info);
    }
    if (s != NB_OK) {
      s = nb_error_wrap(s, "$.spec.program.files[%d]: artifact '%s' from cluster '%s'", i, art,
                        from);
      goto out;
    }
    mode_t mode = pg->files[i].mode ? (mode_t)pg->files[i].mode : 0644;
    if (chmod(dest, mode) != 0) {
      s = nb_error(NB_ERR_IO, "$.spec.program.files[%d]: chmod %s: %s", i, dest, strerror(errno));
      goto out;
    }
    nb__give_up_to(gw, dir, dest);
    json_t* j = json_pack("{s:s, s:s, s:s, s:s, s:I, s:f}", "name", art, "path", pg->files[i].path,
                          "from", from, "sha256", info.sha256, "size", (json_int_t)info.size,
                          "seconds", nb_now_s() - t0);
    char* txt = j ? json_dumps(j, JSON_COMPACT) : NULL;
    if (txt) nb_job_store_append_event(st, id, "fetch", txt, NULL);
    free(txt);
    json_decref(j);
    NB_INFO(JOB, "job %s: program file %s = artifact %s from %s (%llu bytes)", id,
            pg->files[i].path, art, from, (unsigned long long)info.size);
  }
out:
  nb_free(diag);
  nb_job_record_clear(&rec);
  nb_free(cfg);
  return s;
}
