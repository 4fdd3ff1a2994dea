/* Federation, the origin's side and the records: a federated job's record in the store, the
 * two-phase Submit over the peers (Propose, Commit, Abort), cancelling the peers, and the
 * federation thread (members report their events to the origin). The Federation service a
 * peer calls is federation_api.c. */
#include "gateway/gateway_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "security/seal.h"

/* A federated job's record and its info object (parsed; "{}" when empty). On NB_OK the caller
 * releases both (nb_job_fed_clear, json_decref). NB_ERR_NOT_FOUND: not federated. */
nb_status_t nb__gw_fed_load(nb_job_store_t* st, const char* id, nb_job_fed_t* f, json_t** info) {
  NB_CHECK(nb_job_store_fed_get(st, id, f));
  *info = json_loads(f->info ? f->info : "{}", 0, NULL);
  if (!json_is_object(*info)) {
    json_decref(*info);
    *info = json_object();
  }
  return NB_OK;
}

nb_status_t nb__gw_fed_save(nb_job_store_t* st, const nb_job_fed_t* f, json_t* info) {
  char* txt = json_dumps(info, JSON_COMPACT);
  if (!txt) return nb_error(NB_ERR_NOMEM, "federation record of job %s", f->job_id);
  nb_job_fed_t tmp = *f;
  tmp.info = txt;
  nb_status_t s = nb_job_store_fed_put(st, &tmp);
  free(txt);
  return s;
}

void nb__gw_fed_release(nb_job_fed_t* f, json_t* info) {
  nb_job_fed_clear(f);
  json_decref(info);
}

/* One read-modify-write of job id's federation record under record_mu: info[key] = value
 * (stolen; key NULL: none), info[drop] removed (NULL: none), fed.active = active (-1: kept).
 * A job without a record is left alone (and value released). */
void nb__gw_fed_update(nb_gateway_t* gw, nb_job_store_t* st, const char* id, const char* key,
                       json_t* value, const char* drop, int active) {
  nb_job_fed_t f;
  json_t* info = NULL;
  pthread_mutex_lock(&gw->record_mu);
  if (nb__gw_fed_load(st, id, &f, &info) == NB_OK) {
    if (key) json_object_set_new(info, key, value);
    value = NULL;
    if (drop) json_object_del(info, drop);
    if (active >= 0) f.active = active;
    nb__gw_fed_save(st, &f, info);
    nb__gw_fed_release(&f, info);
  }
  pthread_mutex_unlock(&gw->record_mu);
  json_decref(value);
}

/* info.clusters[cluster] (created when absent). */
json_t* nb__gw_fed_cluster(json_t* info, const char* cluster) {
  json_t* cl = json_object_get(info, "clusters");
  if (!json_is_object(cl)) {
    cl = json_object();
    json_object_set_new(info, "clusters", cl);
  }
  json_t* c = json_object_get(cl, cluster);
  if (!json_is_object(c)) {
    c = json_pack("{s:i, s:s, s:s, s:s, s:I}", "workers", 0, "state", "proposed", "reason", "",
                  "endpoint", "", "seq", (json_int_t)0);
    json_object_set_new(cl, cluster, c);
  }
  return c;
}

const char* nb__gw_jstr(json_t* o, const char* k) {
  const char* v = json_string_value(json_object_get(o, k));
  return v ? v : "";
}

/* Records that `cluster` of an origin job moved to state `to` (info and a cluster_state event). */
void nb__gw_fed_cluster_state(nb_job_store_t* st, const char* id, json_t* info, const char* cluster,
                              const char* to, const char* reason) {
  json_t* c = nb__gw_fed_cluster(info, cluster);
  json_t* ev = json_pack("{s:s, s:s, s:s, s:s}", "cluster", cluster, "from",
                         nb__gw_jstr(c, "state"), "to", to, "reason", reason ? reason : "");
  char* txt = ev ? json_dumps(ev, JSON_COMPACT) : NULL;
  if (txt) nb_job_store_append_event(st, id, "cluster_state", txt, NULL);
  free(txt);
  json_decref(ev);
  json_object_set_new(c, "state", json_string(to));
  json_object_set_new(c, "reason", json_string(reason ? reason : ""));
}

/* The origin's job state from its clusters' (those with workers): failed (or cancelled by
 * someone else than the origin) as soon as one is, and then the others are to be cancelled;
 * succeeded once all are. A final job is left alone. Caller holds gw->record_mu (or runs alone,
 * at start). */
void nb__gw_fed_aggregate(nb_gateway_t* gw, nb_job_store_t* st, const char* id, json_t* info) {
  nb_job_record_t rec = {0};
  if (nb_job_store_get(st, id, &rec) != NB_OK) return;
  int final = nb_job_state_is_final(rec.state);
  nb_job_record_clear(&rec);
  if (final || json_object_get(info, "cancelling")) return;
  const char* k;
  json_t* c;
  int n = 0, ok = 0;
  char reason[768] = "";
  json_object_foreach(json_object_get(info, "clusters"), k, c) {
    if (json_integer_value(json_object_get(c, "workers")) <= 0) continue;
    n++;
    const char* s = nb__gw_jstr(c, "state");
    if (!strcmp(s, "succeeded")) ok++;
    if (!reason[0] && (!strcmp(s, "failed") || !strcmp(s, "cancelled")))
      snprintf(reason, sizeof reason, "cluster '%s' %s: %.600s", k, s, nb__gw_jstr(c, "reason"));
  }
  if (reason[0]) {
    json_object_set_new(info, "cancel_pending", json_true());
    nb_job_store_transition(st, id, NB_JOB_FAILED, reason);
    NB_WARN("job %s: %s: stopping the other clusters", id, reason);
    pthread_mutex_lock(&gw->active_mu);
    int i = nb__gw_active_find(gw, id);
    int launched = i >= 0 && nb__launched(&gw->active[i]);
    nb_launch_t launch;
    if (launched) launch = gw->active[i].launch;
    pthread_mutex_unlock(&gw->active_mu);
    if (launched && nb_launcher_cancel(&launch, gw->cfg.cancel_grace_ms, NULL) != NB_OK)
      NB_WARN("job %s: cannot stop this cluster's workers: %s", id, nb_error_last());
  } else if (n > 0 && ok == n) {
    /* the run report is the built-in worker's (rounds.tsv, summary.json): none for a program */
    if (nb_job_store_transition(st, id, NB_JOB_SUCCEEDED, NULL) == NB_OK &&
        !nb__gw_job_runs_program(st, id))
      nb__gw_report_queue(gw, id);
  }
}

/* Whether cluster is one of the configured peers. */
int nb__gw_is_peer(const nb_gateway_t* gw, const char* cluster) {
  for (int i = 0; i < gw->cfg.n_peers; i++)
    if (!strcmp(gw->cfg.peers[i].id, cluster)) return 1;
  return 0;
}

/* The Federation client of peer cluster, held until nb__gw_peer_release (a reload meanwhile
 * does not destroy it); NULL when cluster is no peer. */
nb__peer_t* nb__gw_peer_acquire(nb_gateway_t* gw, const char* cluster) {
  nb__peer_t* p = NULL;
  pthread_mutex_lock(&gw->peer_mu);
  for (int i = 0; i < gw->cfg.n_peers && !p; i++)
    if (!strcmp(gw->cfg.peers[i].id, cluster) && gw->peer[i]) p = gw->peer[i];
  if (p) p->uses++;
  pthread_mutex_unlock(&gw->peer_mu);
  return p;
}

static void nb__peer_free(nb__peer_t* p) {
  nb_rpc_client_destroy(p->cli);
  nb_free(p);
}

void nb__gw_peer_release(nb_gateway_t* gw, nb__peer_t* p) {
  if (!p) return;
  pthread_mutex_lock(&gw->peer_mu);
  int last = --p->uses == 0 && p->retired;
  pthread_mutex_unlock(&gw->peer_mu);
  if (last) nb__peer_free(p); /* its streams are gone: every holder destroyed its own */
}

/* A Federation client of every peer presenting tls (borrowed; the channels copy it), each
 * replacing the one before, which its holders finish with. Nothing is replaced on failure. */
nb_status_t nb__gw_peers_connect(nb_gateway_t* gw, const nb_tls_t* tls) {
  nb__peer_t* fresh[NB_GW_MAX_PEERS] = {0};
  nb_status_t s = NB_OK;
  for (int i = 0; i < gw->cfg.n_peers && s == NB_OK; i++) {
    nb_rpc_client_opts_t co = {0};
    co.tls = tls;
    co.expected_cluster = gw->cfg.peers[i].id;
    s = nb_calloc((void**)&fresh[i], 1, sizeof *fresh[i], "peer client");
    if (s == NB_OK) s = nb_rpc_client_create(gw->cfg.peers[i].address, &co, &fresh[i]->cli);
  }
  if (s != NB_OK) {
    for (int i = 0; i < gw->cfg.n_peers; i++)
      if (fresh[i]) nb__peer_free(fresh[i]);
    return s;
  }
  nb__peer_t* gone[NB_GW_MAX_PEERS] = {0};
  pthread_mutex_lock(&gw->peer_mu);
  for (int i = 0; i < gw->cfg.n_peers; i++) {
    nb__peer_t* old = gw->peer[i];
    gw->peer[i] = fresh[i];
    if (old) old->retired = 1;
    if (old && old->uses == 0) gone[i] = old;
  }
  pthread_mutex_unlock(&gw->peer_mu);
  for (int i = 0; i < gw->cfg.n_peers; i++)
    if (gone[i]) nb__peer_free(gone[i]);
  return NB_OK;
}

/* At destroy, once no thread or handler holds a client any more. */
void nb__gw_peers_close(nb_gateway_t* gw) {
  for (int i = 0; i < gw->cfg.n_peers; i++) {
    if (gw->peer[i]) nb__peer_free(gw->peer[i]);
    gw->peer[i] = NULL;
  }
}

/* One Federation call to peer `cluster`; a peer that cannot be reached fails fast
 * (NB_ERR_UNAVAILABLE). wait >= 1: after such a failure, give the channel up to a second to
 * connect and try once more; wait 2: a deadline of 30 x federation_timeout_ms (a Commit whose
 * peer first fetches the base checkpoint). */
static nb_status_t nb__fed_call(nb_gateway_t* gw, const char* cluster, const char* method,
                                const ProtobufCMessage* req, const ProtobufCMessageDescriptor* rd,
                                ProtobufCMessage** resp, int wait) {
  nb__peer_t* p = nb__gw_peer_acquire(gw, cluster);
  if (!p)
    return nb_error(NB_ERR_INVALID, "cluster '%s' is not a peer of gateway '%s'", cluster,
                    gw->cfg.cluster_id);
  nb_rpc_client_t* c = p->cli;
  char m[96];
  snprintf(m, sizeof m, "/nebula.v1.Federation/%s", method);
  *resp = NULL;
  int64_t deadline = (int64_t)gw->cfg.federation_timeout_ms * (wait == 2 ? 30 : 1);
  nb_status_t s = nb_rpc_unary_pb(c, m, req, rd, resp, deadline, 0);
  nb__gw_metric_fed_call(gw, method, s);
  if (s == NB_ERR_UNAVAILABLE && wait && nb_rpc_client_wait_ready(c, 1000) == NB_OK) {
    /* the channel was idle or backing off from an earlier failure: once more, connected */
    if (*resp) protobuf_c_message_free_unpacked(*resp, NULL);
    *resp = NULL;
    s = nb_rpc_unary_pb(c, m, req, rd, resp, deadline, 0);
    nb__gw_metric_fed_call(gw, method, s);
  }
  /* the lifecycle line of every call but a Report that went through (one per few seconds) */
  if (s != NB_OK || strcmp(method, "Report")) {
    const char* job = nb__gw_req_job_id(req);
    NB_INFO(JOB, "federation %s to cluster '%s' for job %s: %s%s%s", method, cluster,
            job && *job ? job : "-", s == NB_OK ? "ok" : nb_status_name(s), s == NB_OK ? "" : ": ",
            s == NB_OK ? "" : nb_error_last());
  }
  nb__gw_peer_release(gw, p);
  return s;
}

/* Launches this cluster's share of a committed federated job: the job secret in a 0600 file,
 * the PKI links, and worker_command with every other cluster's endpoint (or `command` when the
 * job has a single cluster with workers). A cluster without workers has nothing to run: its
 * part is done at once. */
nb_status_t nb__gw_fed_start(nb_gateway_t* gw, nb_job_store_t* st, const char* id, int workers,
                             const uint8_t secret[32], json_t* endpoints) {
  if (workers <= 0) {
    NB_CHECK(nb_job_store_transition(st, id, NB_JOB_RUNNING, NULL));
    return nb_job_store_transition(
        st, id, NB_JOB_SUCCEEDED,
        "no workers on this cluster: it takes part to provide the job's base checkpoint");
  }
  char dir[NB_GW_STR + NB_JOB_ID_MAX + 2], secret_file[sizeof dir + 16], pki[sizeof dir + 8];
  nb__gw_jobdir(gw, id, dir, sizeof dir);
  snprintf(secret_file, sizeof secret_file, "%s/job.secret", dir);
  int fd = open(secret_file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0 || write(fd, secret, 32) != 32 || close(fd) != 0)
    return nb_error(NB_ERR_IO, "cannot write %s: %s", secret_file, strerror(errno));
  nb__gw_give(gw, secret_file);
  NB_CHECK(nb__gw_job_pki(gw, dir, pki, sizeof pki));
  nb__wk_args_t wk;
  memset(&wk, 0, sizeof wk);
  wk.pki = pki;
  wk.secret_file = secret_file;
  /* peers were told exchange.advertise:PORT; our workers bind exchange_host:PORT */
  const char* ep = json_string_value(json_object_get(endpoints, gw->cfg.cluster_id));
  char listen[NB_GW_STR + 16];
  if (ep) NB_CHECK(nb__gw_exchange_listen(gw, ep, listen, sizeof listen));
  wk.listen = ep ? listen : NULL;
  const char* k;
  json_t* v;
  int clusters = 0;
  json_object_foreach(endpoints, k, v) {
    const char* addr = json_string_value(v);
    if (!addr || !*addr) continue;
    clusters++;
    if (!strcmp(k, gw->cfg.cluster_id) || wk.n_peers >= NB_JOB_MAX_CLUSTERS) continue;
    snprintf(wk.peers[wk.n_peers++], NB_GW_STR, "%s=%s", k, addr);
  }
  if (!wk.listen)
    return nb_error(NB_ERR_INVALID, "no Exchange endpoint for cluster '%s'", gw->cfg.cluster_id);
  NB_CHECK(nb__gw_fetch_base(gw, st, id, secret));
  {
    nb_job_fed_t fed;
    json_t* finfo = NULL;
    char origin[NB_JOB_ID_MAX] = "";
    if (nb__gw_fed_load(st, id, &fed, &finfo) == NB_OK) {
      snprintf(origin, sizeof origin, "%s", fed.origin);
      nb__gw_fed_release(&fed, finfo);
    }
    NB_CHECK(nb__gw_fetch_files(gw, st, id, secret, origin[0] ? origin : NULL));
  }
  NB_CHECK(nb__gw_launch(gw, st, id, workers, clusters > 1 ? &wk : NULL));
  nb__gw_log_launched(gw, id);
  return NB_OK;
}

/* Maps a failed peer call to what Submit answers: refusals keep their code; a peer that cannot
 * be reached or timed out is UNAVAILABLE. */
static nb_status_t nb__fed_code(nb_status_t s) {
  switch (s) {
    case NB_ERR_PERMISSION:
    case NB_ERR_INVALID:
    case NB_ERR_UNAVAILABLE:
    case NB_ERR_NOT_FOUND:
    case NB_ERR_UNSUPPORTED:
      return s;
    default:
      return NB_ERR_UNAVAILABLE;
  }
}

/* The origin's two-phase submit of one federated job (nb__gw_fed_submit), phase by phase. */
typedef struct {
  nb_gateway_t* gw;
  nb_job_store_t* st;
  const char* id;
  const Nebula__V1__SubmitRequest* req;
  const nb__part_t* parts;
  int np, mine;             /* mine: this cluster's index in parts, or -1 */
  const char* base_cluster; /* model.base.cluster ("" none) */
  int ships_files;          /* spec.program.files: each cluster with workers fetches them */
  nb_job_fed_t fed;         /* the origin's record, with the secret once made */
  json_t* info;             /* its info: clusters and their states */
  json_t* endpoints;        /* cluster id -> Exchange endpoint */
  int my_workers;
  int accepted[NB__MAX_PARTS], committed[NB__MAX_PARTS], reserved;
  char why[2048];   /* set: the submit failed, and this says why */
  nb_status_t code; /* what Submit answers when why is set */
} nb__fsub_t;

/* Our record (x->fed: role, origin, active, the secret once made) and our view of the clusters
 * (x->info) into the store, as one read-modify-write under record_mu. A member's Report is
 * handled meanwhile (federation_api.c) and reads and writes the same record under that lock; a
 * plain save between its read and its write was lost when it wrote back what it had read (a
 * commit's secret reverted, so the member's fetch of the base checkpoint found the job "not
 * committed here"; an endpoint or the acked seq of a report gone). Stored per-cluster fields we
 * do not hold (seq, reason) stay; a stored state other than "proposed" is newer than ours. */
static nb_status_t nb__fsub_save(nb__fsub_t* x) {
  pthread_mutex_lock(&x->gw->record_mu);
  nb_job_fed_t cur;
  json_t* now = NULL;
  nb_status_t s;
  if (nb__gw_fed_load(x->st, x->id, &cur, &now) == NB_OK) {
    const char *k, *f;
    json_t *c, *v;
    json_object_foreach(x->info, k, v) if (strcmp(k, "clusters")) json_object_set(now, k, v);
    json_object_foreach(json_object_get(x->info, "clusters"), k, c) {
      json_t* stored = nb__gw_fed_cluster(now, k);
      char was[32];
      snprintf(was, sizeof was, "%s", nb__gw_jstr(stored, "state"));
      json_object_foreach(c, f, v) {
        if (!strcmp(f, "state") && was[0] && strcmp(was, "proposed")) continue;
        json_object_set(stored, f, v);
      }
    }
    s = nb__gw_fed_save(x->st, &x->fed, now);
    nb__gw_fed_release(&cur, now);
  } else {
    s = nb__gw_fed_save(x->st, &x->fed, x->info);
  }
  pthread_mutex_unlock(&x->gw->record_mu);
  return s;
}

/* The job folder here, our slots and Exchange endpoint, the first record. */
static void nb__fsub_prepare(nb__fsub_t* x) {
  nb_status_t s = NB_OK;
  for (int i = 0; i < x->np; i++)
    json_object_set_new(nb__gw_fed_cluster(x->info, x->parts[i].id), "workers",
                        json_integer(x->parts[i].workers));
  s = nb__gw_jobdir_write(x->gw, x->id, x->req->descriptor.data, x->req->descriptor.len,
                          x->req->signature.data, x->req->signature.len, x->req->cert_pem);
  if (s == NB_OK && x->my_workers > 0) {
    s = nb__gw_reserve(x->gw, x->id, x->my_workers);
    x->reserved = s == NB_OK;
    char ep[NB_GW_STR + 16];
    if (s == NB_OK) s = nb__gw_free_endpoint(x->gw, x->id, ep, sizeof ep);
    if (s == NB_OK) {
      json_object_set_new(nb__gw_fed_cluster(x->info, x->gw->cfg.cluster_id), "endpoint",
                          json_string(ep));
      json_object_set_new(x->endpoints, x->gw->cfg.cluster_id, json_string(ep));
    }
  }
  if (s == NB_OK) s = nb__fsub_save(x);
  if (s != NB_OK) {
    x->code = s;
    snprintf(x->why, sizeof x->why, "cluster '%s' (this gateway) cannot run the job: %.900s",
             x->gw->cfg.cluster_id, nb_error_last());
  }
}

/* Phase 1: every other cluster validates and reserves (Propose). */
static void nb__fsub_propose(nb__fsub_t* x) {
  nb_status_t s = NB_OK;
  for (int i = 0; i < x->np && !x->why[0]; i++) {
    if (i == x->mine) continue;
    Nebula__V1__ProposeRequest pr = NEBULA__V1__PROPOSE_REQUEST__INIT;
    pr.job_id = (char*)x->id;
    pr.descriptor = x->req->descriptor;
    pr.signature = x->req->signature;
    pr.cert_pem = x->req->cert_pem;
    pr.origin = x->gw->cfg.cluster_id;
    pr.workers = x->parts[i].workers;
    ProtobufCMessage* resp = NULL;
    s = nb__fed_call(x->gw, x->parts[i].id, "Propose", &pr.base,
                     &nebula__v1__propose_reply__descriptor, &resp, 1);
    if (s != NB_OK) {
      x->code = nb__fed_code(s);
      snprintf(x->why, sizeof x->why, "cluster '%.63s' refused the job: %.900s", x->parts[i].id,
               nb_error_last());
      break;
    }
    x->accepted[i] = 1;
    const char* ep = ((Nebula__V1__ProposeReply*)resp)->endpoint;
    if (x->parts[i].workers > 0 && (!ep || !*ep)) {
      x->code = NB_ERR_INTERNAL;
      snprintf(x->why, sizeof x->why,
               "cluster '%.63s' accepted the job without an Exchange endpoint", x->parts[i].id);
    } else if (x->parts[i].workers > 0) {
      json_object_set_new(nb__gw_fed_cluster(x->info, x->parts[i].id), "endpoint", json_string(ep));
      json_object_set_new(x->endpoints, x->parts[i].id, json_string(ep));
    }
    protobuf_c_message_free_unpacked(resp, NULL);
  }
}

/* Phase 2: the secret and every endpoint to each (Commit), then launch here. */
static void nb__fsub_commit(nb__fsub_t* x) {
  nb_status_t s = NB_OK;
  if (!x->why[0]) {
    s = nb_seal_secret_generate(x->fed.secret);
    x->fed.has_secret = s == NB_OK;
    json_object_set(x->info, "endpoints", x->endpoints);
    if (s == NB_OK) s = nb__fsub_save(x);
    if (s != NB_OK) {
      x->code = s;
      snprintf(x->why, sizeof x->why, "cannot keep the job's secret: %.900s", nb_error_last());
    }
  }
  Nebula__V1__Endpoint eps[NB__MAX_PARTS];
  Nebula__V1__Endpoint* epp[NB__MAX_PARTS];
  size_t n_eps = 0;
  {
    const char* k;
    json_t* v;
    json_object_foreach(x->endpoints, k, v) {
      nebula__v1__endpoint__init(&eps[n_eps]);
      eps[n_eps].cluster = (char*)k;
      eps[n_eps].address = (char*)json_string_value(v);
      epp[n_eps] = &eps[n_eps];
      n_eps++;
    }
  }
  for (int i = 0; i < x->np && !x->why[0]; i++) {
    if (i == x->mine) continue;
    Nebula__V1__CommitRequest cr = NEBULA__V1__COMMIT_REQUEST__INIT;
    cr.job_id = (char*)x->id;
    cr.secret.data = x->fed.secret;
    cr.secret.len = sizeof x->fed.secret;
    cr.n_endpoints = n_eps;
    cr.endpoints = epp;
    ProtobufCMessage* resp = NULL;
    int fetches = (x->ships_files || (x->base_cluster && x->base_cluster[0] &&
                                      strcmp(x->base_cluster, x->parts[i].id))) &&
                  x->parts[i].workers > 0;
    s = nb__fed_call(x->gw, x->parts[i].id, "Commit", &cr.base,
                     &nebula__v1__federation_ack__descriptor, &resp, fetches ? 2 : 1);
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    if (s != NB_OK) {
      x->code = nb__fed_code(s);
      snprintf(x->why, sizeof x->why, "cluster '%.63s' could not start the job: %.900s",
               x->parts[i].id, nb_error_last());
      break;
    }
    x->committed[i] = 1;
    json_object_set_new(nb__gw_fed_cluster(x->info, x->parts[i].id), "state",
                        json_string("committed"));
  }
  if (!x->why[0]) {
    s = x->my_workers > 0
            ? nb__gw_fed_start(x->gw, x->st, x->id, x->my_workers, x->fed.secret, x->endpoints)
            : nb_job_store_transition(x->st, x->id, NB_JOB_RUNNING, NULL);
    if (s != NB_OK) {
      x->code = s;
      snprintf(x->why, sizeof x->why, "cluster '%s' (this gateway) could not start the job: %.900s",
               x->gw->cfg.cluster_id, nb_error_last());
    } else if (x->mine >= 0) {
      json_object_set_new(nb__gw_fed_cluster(x->info, x->gw->cfg.cluster_id), "state",
                          json_string(x->my_workers > 0 ? "running" : "none"));
    }
  }
}

/* The submit failed: abort everywhere (the committed are cancelled, the others aborted), the
 * job ends failed here. Returns the error Submit answers. */
static nb_status_t nb__fsub_abort(nb__fsub_t* x) {
  nb_status_t s;
  /* abort everywhere: the committed ones are cancelled, the others aborted */
  for (int i = 0; i < x->np; i++) {
    if (!x->accepted[i]) continue;
    ProtobufCMessage* resp = NULL;
    if (x->committed[i]) {
      Nebula__V1__FederationCancelRequest c = NEBULA__V1__FEDERATION_CANCEL_REQUEST__INIT;
      c.job_id = (char*)x->id;
      c.reason = x->why;
      nb__fed_call(x->gw, x->parts[i].id, "Cancel", &c.base,
                   &nebula__v1__federation_ack__descriptor, &resp, 1);
    } else {
      Nebula__V1__AbortRequest a = NEBULA__V1__ABORT_REQUEST__INIT;
      a.job_id = (char*)x->id;
      a.reason = x->why;
      nb__fed_call(x->gw, x->parts[i].id, "Abort", &a.base, &nebula__v1__federation_ack__descriptor,
                   &resp, 1);
    }
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
  }
  if (x->reserved) nb__gw_unreserve(x->gw, x->id);
  nb_job_store_transition(x->st, x->id, NB_JOB_FAILED, x->why);
  x->fed.active = 0;
  nb__fsub_save(x);
  NB_WARN("job %s: %s", x->id, x->why);
  s = nb_error(x->code == NB_OK ? NB_ERR_INTERNAL : x->code, "%s", x->why);
  return s;
}

/* The submit succeeded: our view of the clusters merged into the stored record. */
static void nb__fsub_merge(nb__fsub_t* x) {
  nb__fsub_save(x);
  NB_INFO(JOB, "job %s: committed on %d clusters", x->id, x->np);
}

/* Origin side of Submit for a job involving other clusters: Propose to each, then Commit to each
 * and launch here, or Abort everywhere. The job (proposed) is in the store; on failure it ends
 * failed and the returned error names the cluster and its reason. */
nb_status_t nb__gw_fed_submit(nb_gateway_t* gw, nb_job_store_t* st, const char* id,
                              const Nebula__V1__SubmitRequest* req, const nb__part_t* parts, int np,
                              int mine, const char* base_cluster, int ships_files) {
  nb__fsub_t* x = NULL;
  NB_CHECK(nb_calloc((void**)&x, 1, sizeof *x, "federated submit"));
  x->gw = gw;
  x->st = st;
  x->id = id;
  x->req = req;
  x->parts = parts;
  x->np = np;
  x->mine = mine;
  x->base_cluster = base_cluster;
  x->ships_files = ships_files;
  snprintf(x->fed.job_id, sizeof x->fed.job_id, "%s", id);
  snprintf(x->fed.role, sizeof x->fed.role, "origin");
  snprintf(x->fed.origin, sizeof x->fed.origin, "%s", gw->cfg.cluster_id);
  x->fed.active = 1;
  x->info = json_object();
  x->endpoints = json_object();
  x->my_workers = mine >= 0 ? parts[mine].workers : 0;
  nb__fsub_prepare(x);
  if (!x->why[0]) nb__fsub_propose(x);
  if (!x->why[0]) nb__fsub_commit(x);
  nb_status_t s = NB_OK;
  if (x->why[0])
    s = nb__fsub_abort(x);
  else
    nb__fsub_merge(x);
  json_decref(x->endpoints);
  json_decref(x->info);
  explicit_bzero(x->fed.secret, sizeof x->fed.secret);
  nb_free(x);
  return s;
}

/* Origin: Federation.Cancel to every other cluster with workers whose part has not ended.
 * Returns the first failure (the others are still tried). */
nb_status_t nb__gw_fed_cancel_peers(nb_gateway_t* gw, nb_job_store_t* st, const char* id,
                                    const char* reason) {
  nb_job_fed_t fed;
  json_t* info = NULL;
  pthread_mutex_lock(&gw->record_mu);
  nb_status_t s = nb__gw_fed_load(st, id, &fed, &info);
  pthread_mutex_unlock(&gw->record_mu);
  if (s != NB_OK) return NB_OK; /* not federated */
  if (strcmp(fed.role, "origin")) {
    nb__gw_fed_release(&fed, info);
    return NB_OK;
  }
  nb_status_t first = NB_OK;
  char err[768] = "";
  const char* k;
  json_t* c;
  json_object_foreach(json_object_get(info, "clusters"), k, c) {
    if (!strcmp(k, gw->cfg.cluster_id) || json_integer_value(json_object_get(c, "workers")) <= 0)
      continue;
    nb_job_state_t cs;
    if (nb_job_state_parse(nb__gw_jstr(c, "state"), &cs) == NB_OK && nb_job_state_is_final(cs))
      continue;
    Nebula__V1__FederationCancelRequest cr = NEBULA__V1__FEDERATION_CANCEL_REQUEST__INIT;
    cr.job_id = (char*)id;
    cr.reason = (char*)reason;
    ProtobufCMessage* resp = NULL;
    s = nb__fed_call(gw, k, "Cancel", &cr.base, &nebula__v1__federation_ack__descriptor, &resp, 0);
    if (resp) protobuf_c_message_free_unpacked(resp, NULL);
    if (s != NB_OK && first == NB_OK) {
      first = s;
      snprintf(err, sizeof err, "cluster '%s': %.700s", k, nb_error_last());
    }
  }
  nb__gw_fed_release(&fed, info);
  if (first != NB_OK) return nb_error(first, "%s", err);
  return NB_OK;
}

/* One pass of the federation thread over the active records: members report their new events
 * to the origin (retried next pass while it is away) and give up a proposal the origin never
 * committed; origins cancel the remaining clusters of a job that failed. */
static void nb__fed_pass(nb_gateway_t* gw) {
  nb_job_store_t* st = gw->fed_store;
  nb_job_fed_t* recs = NULL;
  size_t n = 0;
  if (nb_job_store_fed_list_active(st, &recs, &n) != NB_OK) return;
  for (size_t i = 0; i < n && !gw->stopping; i++) {
    nb_job_fed_t* f = &recs[i];
    nb_job_record_t rec = {0};
    if (nb_job_store_get(st, f->job_id, &rec) != NB_OK) continue;
    int final = nb_job_state_is_final(rec.state);
    nb_job_state_t state = rec.state;
    int64_t created = rec.created_ns;
    nb_job_record_clear(&rec);
    json_t* info = json_loads(f->info ? f->info : "{}", 0, NULL);
    if (!json_is_object(info)) {
      json_decref(info);
      info = json_object();
    }
    if (!strcmp(f->role, "member")) {
      if (state == NB_JOB_PROPOSED && !f->has_secret && /* never committed */
          nb_wall_ns() - created > (int64_t)gw->cfg.federation_timeout_ms * 6 * 1000000) {
        nb__gw_unreserve(gw, f->job_id);
        nb_job_store_transition(st, f->job_id, NB_JOB_FAILED,
                                "the origin never committed the job (proposal expired)");
        json_decref(info);
        continue; /* its state event is reported next pass */
      }
      int64_t after = json_integer_value(json_object_get(info, "report_seq"));
      nb_job_event_t* ev = NULL;
      size_t ne = 0;
      if (nb_job_store_events(st, f->job_id, after, 128, &ev, &ne) == NB_OK && ne > 0) {
        Nebula__V1__ReportEvent* es = NULL;
        Nebula__V1__ReportEvent** ep = NULL;
        if (nb_calloc((void**)&es, ne, sizeof *es, "report") == NB_OK &&
            nb_calloc((void**)&ep, ne, sizeof *ep, "report") == NB_OK) {
          for (size_t k = 0; k < ne; k++) {
            nebula__v1__report_event__init(&es[k]);
            es[k].seq = ev[k].seq;
            es[k].time_unix_ns = ev[k].time_ns;
            es[k].kind = ev[k].kind;
            es[k].payload_json = ev[k].payload;
            ep[k] = &es[k];
          }
          Nebula__V1__ReportRequest rr = NEBULA__V1__REPORT_REQUEST__INIT;
          rr.job_id = f->job_id;
          rr.cluster = gw->cfg.cluster_id;
          rr.n_events = ne;
          rr.events = ep;
          ProtobufCMessage* resp = NULL;
          if (nb__fed_call(gw, f->origin, "Report", &rr.base, &nebula__v1__report_reply__descriptor,
                           &resp, 0) == NB_OK) {
            int64_t acked = ((Nebula__V1__ReportReply*)resp)->acked_seq;
            nb__gw_fed_update(gw, st, f->job_id, "report_seq", json_integer(acked), NULL, -1);
            after = acked;
          } else {
            NB_TRACE(RPC, "job %s: report to %s: %s", f->job_id, f->origin, nb_error_last());
          }
          if (resp) protobuf_c_message_free_unpacked(resp, NULL);
        }
        nb_free(es);
        nb_free(ep);
      }
      nb_job_events_free(ev, ne);
      if (final && ne == 0) { /* everything reported */
        nb__gw_fed_update(gw, st, f->job_id, NULL, NULL, NULL, 0);
      }
    } else if (final) {
      /* origin: once final, the clusters still running are cancelled, then nothing is left */
      int ok = 1;
      if (json_is_true(json_object_get(info, "cancel_pending"))) {
        nb_job_record_t r2 = {0};
        char reason[640] = "another cluster of the job failed";
        if (nb_job_store_get(st, f->job_id, &r2) == NB_OK && r2.reason && *r2.reason)
          snprintf(reason, sizeof reason, "%.600s", r2.reason);
        nb_job_record_clear(&r2);
        ok = nb__gw_fed_cancel_peers(gw, st, f->job_id, reason) == NB_OK;
      }
      if (ok) {
        nb__gw_fed_update(gw, st, f->job_id, NULL, NULL, "cancel_pending", 0);
      }
    }
    json_decref(info);
  }
  nb_job_feds_free(recs, n);
}

void* nb__gw_fed_loop(void* arg) {
  nb_gateway_t* gw = arg;
  while (!gw->stopping) {
    nb__fed_pass(gw);
    for (int i = 0; i < 4 && !gw->stopping; i++) nb_sleep_ns((int64_t)gw->cfg.poll_ms * 1000000);
  }
  return NULL;
}
