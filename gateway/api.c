/* The nebula.v1.Gateway service: Submit a signed descriptor, Get, List, Watch, Cancel and
 * Logs, each deciding with the caller's certificate, the admins list and the ACL. What a job
 * does once launched is the monitor's (monitor.c); federated jobs go through federation.c. */
#include "gateway/gateway_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "common/common.h"
#include "jobs/descriptor.h"
#include "security/pki.h"
#include "security/sign.h"

static int nb__is_admin(const nb_gateway_t* gw, const char* user) {
  for (int i = 0; i < gw->cfg.n_admins; i++)
    if (!strcmp(gw->cfg.admins[i], user)) return 1;
  return 0;
}

/* The caller's user name; cluster certificates (peer gateways) act as admins. */
static nb_status_t nb__caller(nb_rpc_call_t* call, const char** user, int* admin) {
  const nb_tls_peer_t* p = nb_rpc_call_peer(call);
  if (!p || p->kind == NB_TLS_PEER_NONE)
    return nb_error(NB_ERR_PERMISSION, "the Gateway API needs a client certificate");
  *user = p->name;
  *admin = p->kind == NB_TLS_PEER_CLUSTER;
  return NB_OK;
}

nb_status_t nb__gw_open_store(nb_gateway_t* gw, nb_job_store_t** st) {
  nb_status_t s = nb_job_store_open(gw->cfg.store_path, st);
  if (s != NB_OK) return nb_error_wrap(NB_ERR_UNAVAILABLE, "job store");
  return NB_OK;
}

/* Fills a Job message from a record; strings point into rec (keep it alive while sending). */
static void nb__job_msg(nb_gateway_t* gw, const nb_job_record_t* rec, int with_descriptor,
                        Nebula__V1__Job* m, char* name, size_t name_cap) {
  nebula__v1__job__init(m);
  m->id = (char*)rec->id;
  m->owner = (char*)rec->owner;
  m->state = (char*)nb_job_state_name(rec->state);
  m->reason = rec->reason ? rec->reason : (char*)"";
  m->created_unix_ns = rec->created_ns;
  m->updated_unix_ns = rec->updated_ns;
  m->cluster = gw->cfg.cluster_id;
  m->descriptor = with_descriptor && rec->descriptor ? rec->descriptor : (char*)"";
  m->exit_code = -1;
  name[0] = 0;
  json_t* d = rec->descriptor ? json_loads(rec->descriptor, 0, NULL) : NULL;
  const char* nm = json_string_value(json_object_get(json_object_get(d, "metadata"), "name"));
  if (nm) snprintf(name, name_cap, "%s", nm);
  json_decref(d);
  m->name = name;
  pthread_mutex_lock(&gw->active_mu);
  int k = nb__gw_active_find(gw, rec->id);
  if (k >= 0) m->pid = gw->active[k].launch.pid;
  pthread_mutex_unlock(&gw->active_mu);
}

/* An ended job's exit code (from its last exit event; stays as it is without one) and run
 * report path (report NULL: not wanted). Get and List both take them from here, so that they
 * agree. Returns 1 when rec is final and its events were read, 0 otherwise. */
static int nb__job_ended(nb_job_store_t* st, const nb_job_record_t* rec, int32_t* exit_code,
                         char* report, size_t cap) {
  nb_job_event_t* ev = NULL;
  size_t n = 0;
  if (!nb_job_state_is_final(rec->state) ||
      nb_job_store_events(st, rec->id, 0, 0, &ev, &n) != NB_OK)
    return 0;
  for (size_t i = 0; i < n; i++) {
    int is_exit = !strcmp(ev[i].kind, "exit"), is_report = report && !strcmp(ev[i].kind, "report");
    if (!is_exit && !is_report) continue;
    json_t* j = json_loads(ev[i].payload, 0, NULL);
    if (j && is_exit) *exit_code = (int32_t)json_integer_value(json_object_get(j, "exit_code"));
    if (j && is_report) snprintf(report, cap, "%s", nb__gw_jstr(j, "path"));
    json_decref(j);
  }
  nb_job_events_free(ev, n);
  return 1;
}

static nb_status_t nb__send_job(nb_rpc_call_t* call, nb_gateway_t* gw, nb_job_store_t* st,
                                const char* id, int with_descriptor) {
  nb_job_record_t rec = {0};
  NB_CHECK(nb_job_store_get(st, id, &rec));
  Nebula__V1__Job m;
  char name[NB_JOB_NAME_MAX];
  nb__job_msg(gw, &rec, with_descriptor, &m, name, sizeof name);
  char report[NB_GW_STR * 2] = "";
  if (nb__job_ended(st, &rec, &m.exit_code, report, sizeof report)) m.report = report;
  /* the origin of a federated job: every cluster's part */
  Nebula__V1__ClusterPart parts[NB__MAX_PARTS];
  Nebula__V1__ClusterPart* pp[NB__MAX_PARTS];
  nb_job_fed_t fed;
  json_t* info = NULL;
  int loaded = with_descriptor && nb__gw_fed_load(st, id, &fed, &info) == NB_OK;
  if (loaded && !strcmp(fed.role, "origin")) {
    const char* k;
    json_t* c;
    json_object_foreach(json_object_get(info, "clusters"), k, c) {
      if (m.n_clusters >= NB__MAX_PARTS) break;
      Nebula__V1__ClusterPart* p = &parts[m.n_clusters];
      nebula__v1__cluster_part__init(p);
      p->cluster = (char*)k;
      p->workers = (int32_t)json_integer_value(json_object_get(c, "workers"));
      p->state = (char*)nb__gw_jstr(c, "state");
      p->reason = (char*)nb__gw_jstr(c, "reason");
      p->endpoint = (char*)nb__gw_jstr(c, "endpoint");
      pp[m.n_clusters++] = p;
    }
    m.clusters = pp;
  }
  nb_status_t s = nb_rpc_call_send_pb(call, &m.base);
  if (loaded) nb__gw_fed_release(&fed, info);
  nb_job_record_clear(&rec);
  return s;
}

/* Loads a job the caller may see: its own, or any for admins. */
static nb_status_t nb__job_for(nb_job_store_t* st, const char* id, const char* user, int admin,
                               nb_job_record_t* rec) {
  if (!id || !*id) return nb_error(NB_ERR_INVALID, "job_id is empty");
  nb_status_t s = nb_job_store_get(st, id, rec);
  if (s == NB_ERR_NOT_FOUND) return nb_error(NB_ERR_NOT_FOUND, "no job '%s' here", id);
  if (s != NB_OK) return s;
  if (!admin && strcmp(rec->owner, user)) {
    nb_job_record_clear(rec);
    return nb_error(NB_ERR_PERMISSION, "job '%s' belongs to user '%s', not to '%s'", id, rec->owner,
                    user);
  }
  return NB_OK;
}

/* One call of a Gateway method past the shared prologue (nb__api_call). */
typedef struct {
  nb_gateway_t* gw;
  const char* user;    /* the caller's certificate name */
  int admin;           /* a listed admin, or a peer gateway's cluster certificate */
  nb_job_store_t* st;  /* this call's own store handle */
  nb_job_record_t rec; /* methods with .job: the job the request names, which the caller may see */
} nb__api_call_t;

/* What one Gateway method adds to the shared prologue. */
typedef struct {
  const ProtobufCMessageDescriptor* desc; /* its request */
  const char* method;
  int job; /* the request's job_id must name a job the caller may see (into rec) */
  /* checks of the request alone, made before the store is opened (NULL: none) */
  nb_status_t (*check)(const nb__api_call_t* c, const ProtobufCMessage* req);
  nb_status_t (*serve)(nb_rpc_call_t* call, nb__api_call_t* c, const ProtobufCMessage* req);
} nb__api_method_t;

/* The job_id field of a request (by name, from its descriptor); NULL when it has none. */
const char* nb__gw_req_job_id(const ProtobufCMessage* req) {
  const ProtobufCFieldDescriptor* f =
      protobuf_c_message_descriptor_get_field_by_name(req->descriptor, "job_id");
  return f ? *(const char* const*)((const char*)req + f->offset) : NULL;
}

/* The prologue and epilogue of every Gateway handler but Submit: who calls (listed admins
 * included) and its request, the method's checks of the request, a store handle and, for a
 * method about one job, that job (the caller's own, or any for admins); then m->serve; then
 * everything released. */
static nb_status_t nb__api_call(nb_rpc_call_t* call, nb_gateway_t* gw, const void* spec) {
  const nb__api_method_t* m = spec;
  nb__api_call_t c = {.gw = gw, .user = ""};
  ProtobufCMessage* req = NULL;
  int end = 0;
  NB_CHECK(nb__caller(call, &c.user, &c.admin));
  c.admin |= nb__is_admin(c.gw, c.user);
  NB_CHECK(nb_rpc_call_recv_pb(call, m->desc, &req, &end, NB_RPC_INFINITE));
  if (!req) return nb_error(NB_ERR_INVALID, "%s: no request", m->method);
  nb_status_t s = m->check ? m->check(&c, req) : NB_OK;
  if (s == NB_OK) s = nb__gw_open_store(c.gw, &c.st);
  if (s == NB_OK && m->job) s = nb__job_for(c.st, nb__gw_req_job_id(req), c.user, c.admin, &c.rec);
  if (s == NB_OK) s = m->serve(call, &c, req);
  nb_job_record_clear(&c.rec);
  nb_job_store_close(c.st);
  protobuf_c_message_free_unpacked(req, NULL);
  return s;
}

static nb_status_t nb__submit(nb_rpc_call_t* call, nb_gateway_t* gw, const void* spec) {
  const char* user = "";
  int admin = 0;
  NB_CHECK(nb__caller(call, &user, &admin));
  const nb_tls_peer_t* peer = nb_rpc_call_peer(call);
  nb__gw_metric_submission(gw);
  char who[NB_GW_STR];
  snprintf(who, sizeof who, "%s '%.200s'", peer->kind == NB_TLS_PEER_USER ? "user" : "cluster",
           user);
  if (peer->kind != NB_TLS_PEER_USER) {
    nb_status_t r =
        nb_error(NB_ERR_PERMISSION, "only user certificates may submit jobs (caller is %s '%s')",
                 "cluster", peer->name);
    nb__gw_metric_refusal(gw, "Submit", who, "not_a_user", nb_error_last());
    return r;
  }
  ProtobufCMessage* m = NULL;
  int end = 0;
  NB_CHECK(nb_rpc_call_recv_pb(call, &nebula__v1__submit_request__descriptor, &m, &end,
                               NB_RPC_INFINITE));
  if (!m) {
    nb_status_t r = nb_error(NB_ERR_INVALID, "Submit: no request");
    nb__gw_metric_refusal(gw, "Submit", who, "submit_incomplete", nb_error_last());
    return r;
  }
  Nebula__V1__SubmitRequest* req = (Nebula__V1__SubmitRequest*)m;
  nb_status_t s = NB_OK;
  const char* refused = NULL; /* the reason counted when s is not NB_OK at done */
  nb__gw_signed_t sd = {0};
  nb_job_config_t* cfg = NULL; /* sd.cfg once read */
  nb_job_store_t* st = NULL;
  char id[NB_JOB_ID_MAX];

  if (!req->descriptor.len || !req->signature.len || !req->cert_pem || !*req->cert_pem) {
    s = nb_error(NB_ERR_INVALID,
                 "Submit needs the descriptor, its signature and the signer's "
                 "certificate");
    refused = "submit_incomplete";
    goto done;
  }
  s = nb__gw_read_signed(gw, &req->descriptor, &req->signature, req->cert_pem, user, NULL, 1, &sd);
  if (s != NB_OK) {
    /* the signature and signer are checked before the descriptor is parsed, then its paths */
    refused = !sd.cfg ? "signature" : s == NB_ERR_INVALID ? "descriptor" : "paths";
    goto done;
  }
  cfg = sd.cfg;
  /* Which clusters: each one named, and the one holding the base checkpoint */
  nb__part_t parts[NB__MAX_PARTS];
  int np = nb__gw_parts(cfg, parts), mine = -1, fed = 0;
  nb_acl_want_t want[NB_JOB_MAX_CLUSTERS];
  for (int i = 0; i < cfg->n_clusters; i++) {
    want[i].cluster = cfg->clusters[i].id;
    want[i].workers = cfg->clusters[i].workers;
  }
  s = nb_acl_check(&gw->cfg.acl, user, want, (size_t)cfg->n_clusters);
  if (s != NB_OK) {
    refused = "acl";
    goto done;
  }
  for (int i = 0; i < np; i++) {
    if (!strcmp(parts[i].id, gw->cfg.cluster_id)) {
      mine = i;
      continue;
    }
    fed = 1;
    if (!nb__gw_is_peer(gw, parts[i].id)) {
      s = nb_error(NB_ERR_INVALID,
                   "the job names cluster '%s', which is not a peer of gateway '%s' (add it to "
                   "\"peers\" in the gateway's config)",
                   parts[i].id, gw->cfg.cluster_id);
      refused = "unknown_cluster";
      goto done;
    }
  }
  int my_workers = mine >= 0 ? parts[mine].workers : 0;
  for (int i = 0; i < cfg->n_clusters && my_workers > 0; i++) {
    if (!strcmp(cfg->clusters[i].id, gw->cfg.cluster_id) &&
        cfg->clusters[i].device == NB_JOB_DEVICE_CUDA && gw->cfg.device != NB_JOB_DEVICE_CUDA) {
      s = nb_error(NB_ERR_INVALID, "$.spec.clusters[%d].device: cluster '%s' has no cuda devices",
                   i, gw->cfg.cluster_id);
      refused = "device";
      goto done;
    }
  }
  pthread_mutex_lock(&gw->active_mu);
  int used = nb__gw_slots_used(gw, NULL);
  pthread_mutex_unlock(&gw->active_mu);
  if (used + my_workers > gw->cfg.slots) {
    s = nb_error(NB_ERR_UNAVAILABLE,
                 "cluster '%s' has %d free worker slots of %d, the job needs %d",
                 gw->cfg.cluster_id, gw->cfg.slots - used, gw->cfg.slots, my_workers);
    refused = "slots";
    goto done;
  }
  /* from here a failure is the gateway's, not a refusal (but the federation's answer) */
  NB_CHECK_GOTO(nb__gw_open_store(gw, &st), s, done);
  {
    /* the store wants JSON text: the signed bytes, NUL-terminated */
    char* text = NULL;
    NB_CHECK_GOTO(nb_alloc((void**)&text, req->descriptor.len + 1, 1, "descriptor"), s, done);
    memcpy(text, req->descriptor.data, req->descriptor.len);
    text[req->descriptor.len] = 0;
    s = NB_ERR_EXISTS;
    for (int attempt = 0; attempt < 4 && s == NB_ERR_EXISTS; attempt++) {
      uint32_t rnd = 0;
      if (getrandom(&rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd) rnd ^= (uint32_t)nb_now_ns();
      snprintf(id, sizeof id, "%.40s-%08x", cfg->name, rnd);
      s = nb_job_store_create(st, id, user, text);
    }
    nb_free(text);
    if (s != NB_OK) goto done;
  }
  NB_INFO(JOB, "job %s accepted from %s: %d cluster%s, %d workers here", id, who, np,
          np == 1 ? "" : "s", my_workers);
  NB_CHECK_GOTO(nb_job_store_transition(st, id, NB_JOB_PROPOSED, NULL), s, done);
  if (fed) {
    /* two-phase with every other cluster; on failure the job is failed here and Submit fails */
    s = nb__gw_fed_submit(gw, st, id, req, parts, np, mine, cfg->model.base_cluster,
                          cfg->program.n_files > 0);
    if (s != NB_OK) {
      refused = "federation"; /* a peer refused or could not be reached: Submit fails */
      goto done;
    }
  } else {
    s = nb__gw_jobdir_write(gw, id, req->descriptor.data, req->descriptor.len, req->signature.data,
                            req->signature.len, req->cert_pem);
    if (s == NB_OK) s = nb__gw_fetch_files(gw, st, id, NULL, NULL);
    if (s == NB_OK) s = nb__gw_launch(gw, st, id, my_workers, NULL);
    if (s == NB_OK) nb__gw_log_launched(gw, id);
    if (s != NB_OK) {
      char reason[512];
      snprintf(reason, sizeof reason, "launch failed: %s", nb_error_last());
      nb_job_store_transition(st, id, NB_JOB_FAILED, reason);
      NB_WARN("job %s: %s", id, reason);
    }
  }
  s = nb__send_job(call, gw, st, id, 1);
done:
  if (s != NB_OK && refused) nb__gw_metric_refusal(gw, "Submit", who, refused, nb_error_last());
  nb__gw_signed_clear(&sd);
  nb_job_store_close(st);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

static nb_status_t nb__get_serve(nb_rpc_call_t* call, nb__api_call_t* c,
                                 const ProtobufCMessage* m) {
  return nb__send_job(call, c->gw, c->st, ((const Nebula__V1__GetRequest*)m)->job_id, 1);
}

static const nb__api_method_t nb__get_m = {&nebula__v1__get_request__descriptor, "Get", 1, NULL,
                                           nb__get_serve};

/* Whose jobs, in which state, List may show: only the caller's own unless it is an admin. */
static nb_status_t nb__list_filter(const nb__api_call_t* c, const Nebula__V1__ListRequest* req,
                                   const char** owner, nb_job_state_t* state) {
  *owner = req->owner && *req->owner ? req->owner : NULL;
  if (!c->admin && *owner && strcmp(*owner, c->user))
    return nb_error(NB_ERR_PERMISSION, "user '%s' may only list its own jobs (asked for '%s')",
                    c->user, *owner);
  if (!c->admin) *owner = c->user;
  *state = (nb_job_state_t)-1;
  if (req->state && *req->state && nb_job_state_parse(req->state, state) != NB_OK)
    return nb_error(NB_ERR_INVALID,
                    "state '%s' is not a job state (pending, proposed, running, "
                    "succeeded, failed, cancelled)",
                    req->state);
  return NB_OK;
}

static nb_status_t nb__list_check(const nb__api_call_t* c, const ProtobufCMessage* m) {
  const char* owner;
  nb_job_state_t state;
  return nb__list_filter(c, (const Nebula__V1__ListRequest*)m, &owner, &state);
}

static nb_status_t nb__list_serve(nb_rpc_call_t* call, nb__api_call_t* c,
                                  const ProtobufCMessage* m) {
  nb_status_t s = NB_OK;
  nb_job_record_t* recs = NULL;
  size_t n = 0;
  Nebula__V1__Job* jobs = NULL;
  Nebula__V1__Job** ptrs = NULL;
  char(*names)[NB_JOB_NAME_MAX] = NULL;
  const char* owner;
  nb_job_state_t state;
  NB_CHECK(nb__list_filter(c, (const Nebula__V1__ListRequest*)m, &owner, &state));
  NB_CHECK_GOTO(nb_job_store_list(c->st, owner, (int)state, &recs, &n), s, done);
  if (n) {
    NB_CHECK_GOTO(nb_calloc((void**)&jobs, n, sizeof *jobs, "jobs"), s, done);
    NB_CHECK_GOTO(nb_calloc((void**)&ptrs, n, sizeof *ptrs, "jobs"), s, done);
    NB_CHECK_GOTO(nb_calloc((void**)&names, n, sizeof *names, "names"), s, done);
  }
  for (size_t i = 0; i < n; i++) {
    nb__job_msg(c->gw, &recs[i], 0, &jobs[i], names[i], sizeof names[i]);
    nb__job_ended(c->st, &recs[i], &jobs[i].exit_code, NULL, 0); /* as Get says it */
    ptrs[i] = &jobs[i];
  }
  Nebula__V1__ListReply rep = NEBULA__V1__LIST_REPLY__INIT;
  rep.n_jobs = n;
  rep.jobs = ptrs;
  s = nb_rpc_call_send_pb(call, &rep.base);
done:
  nb_free(jobs);
  nb_free(ptrs);
  nb_free(names);
  nb_job_records_free(recs, n);
  return s;
}

static const nb__api_method_t nb__list_m = {&nebula__v1__list_request__descriptor, "List", 0,
                                            nb__list_check, nb__list_serve};

static double nb__jnum(json_t* o, const char* k, double def) {
  json_t* v = json_object_get(o, k);
  return json_is_number(v) ? json_number_value(v) : def;
}

static nb_status_t nb__send_event(nb_rpc_call_t* call, const char* id, const nb_job_event_t* e) {
  Nebula__V1__JobEvent m = NEBULA__V1__JOB_EVENT__INIT;
  m.job_id = (char*)id;
  m.seq = e->seq;
  m.time_unix_ns = e->time_ns;
  m.kind = (char*)e->kind;
  m.payload_json = e->payload;
  m.eta_seconds = -1;
  json_t* j = json_loads(e->payload, 0, NULL);
  char state[32] = "", source[NB_JOB_NAME_MAX] = "";
  char* reason = NULL;
  if (j && !strcmp(e->kind, "state")) {
    const char* to = json_string_value(json_object_get(j, "to"));
    if (to) snprintf(state, sizeof state, "%s", to);
    reason = (char*)json_string_value(json_object_get(j, "reason"));
  } else if (j && !strcmp(e->kind, "progress")) {
    m.round = (int64_t)nb__jnum(j, "round", 0);
    m.step = (int64_t)nb__jnum(j, "step", 0);
    m.max_steps = (int64_t)nb__jnum(j, "max_steps", 0);
    m.loss = nb__jnum(j, "loss", 0);
    m.wan_mbps = nb__jnum(j, "wan_mbps", 0);
    m.density = nb__jnum(j, "density", 0);
    m.eta_seconds = nb__jnum(j, "eta_s", -1);
    const char* src = json_string_value(json_object_get(j, "source"));
    if (src) snprintf(source, sizeof source, "%s", src);
  }
  m.state = state;
  m.reason = reason ? reason : (char*)"";
  m.source = source;
  nb_status_t s = nb_rpc_call_send_pb(call, &m.base);
  json_decref(j);
  return s;
}

static nb_status_t nb__watch_serve(nb_rpc_call_t* call, nb__api_call_t* c,
                                   const ProtobufCMessage* m) {
  const Nebula__V1__WatchRequest* req = (const Nebula__V1__WatchRequest*)m;
  nb_job_record_t rec = {0};
  int64_t after = req->after_seq;
  int sent = 0;
  nb_status_t s = NB_OK;
  while (s == NB_OK) {
    if (nb_rpc_call_cancelled(call)) {
      s = nb_error(NB_ERR_CANCELLED, "Watch: client went away");
      break;
    }
    /* read the state before the events: a final state seen here has all its events below */
    s = nb_job_store_get(c->st, req->job_id, &rec);
    if (s != NB_OK) break;
    int final = nb_job_state_is_final(rec.state);
    nb_job_record_clear(&rec);
    /* a succeeded job's run report is still being built: its "report" event is to come */
    int pending = final && nb__gw_report_pending(c->gw, req->job_id);
    nb_job_event_t* ev = NULL;
    size_t n = 0;
    s = nb_job_store_events(c->st, req->job_id, after, 256, &ev, &n);
    for (size_t i = 0; s == NB_OK && i < n; i++) {
      s = nb__send_event(call, req->job_id, &ev[i]);
      after = ev[i].seq;
      sent++;
    }
    nb_job_events_free(ev, n);
    if (s != NB_OK || (final && n == 0 && !pending)) break;
    if (n == 0) nb_sleep_ns((int64_t)c->gw->cfg.poll_ms * 1000000);
  }
  if (s == NB_OK && sent == 0) {
    /* a stream must carry something: repeat the final state */
    nb_job_event_t e = {0};
    nb_job_store_get(c->st, req->job_id, &rec);
    e.seq = after;
    e.time_ns = rec.updated_ns;
    snprintf(e.kind, sizeof e.kind, "state");
    json_t* j = json_pack("{s:s, s:s}", "to", nb_job_state_name(rec.state), "reason",
                          rec.reason ? rec.reason : "");
    e.payload = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    s = nb__send_event(call, req->job_id, &e);
    free(e.payload);
    nb_job_record_clear(&rec);
  }
  return s;
}

static const nb__api_method_t nb__watch_m = {&nebula__v1__watch_request__descriptor, "Watch", 1,
                                             NULL, nb__watch_serve};

/* The reason is stored and shown by `nebula list/get/watch`: printable text only. */
static nb_status_t nb__cancel_check(const nb__api_call_t* c, const ProtobufCMessage* m) {
  const Nebula__V1__CancelRequest* req = (const Nebula__V1__CancelRequest*)m;
  nb_status_t s = NB_OK;
  for (size_t i = 0; req->reason && req->reason[i] && s == NB_OK; i++) {
    unsigned char ch = (unsigned char)req->reason[i];
    if (ch < 0x20 || ch == 0x7f ||
        (ch == 0xc2 && (unsigned char)req->reason[i + 1] >= 0x80 &&
         (unsigned char)req->reason[i + 1] <= 0x9f))
      s = nb_error(NB_ERR_INVALID,
                   "Cancel: the reason has a control character (0x%02x) at byte %zu; give "
                   "printable text",
                   ch == 0xc2 ? (unsigned char)req->reason[i + 1] : ch, i);
  }
  return s;
}

static nb_status_t nb__cancel_serve(nb_rpc_call_t* call, nb__api_call_t* c,
                                    const ProtobufCMessage* m) {
  const Nebula__V1__CancelRequest* req = (const Nebula__V1__CancelRequest*)m;
  nb_status_t s = NB_OK;
  if (!nb_job_state_is_final(c->rec.state)) {
    char reason[512];
    snprintf(reason, sizeof reason, "cancelled by %s%s%.300s", c->user,
             req->reason && *req->reason ? ": " : "", req->reason ? req->reason : "");
    /* a federated job: every other cluster stops first (each answers once its workers are
     * gone), then ours. A job with processes: the monitor records the end (exit event, then
     * `cancelled`) once they are gone, and retires the entry, which frees its slots before we
     * answer. */
    /* the peers' cancelled states that come in now must not fail the job */
    nb__gw_fed_update(c->gw, c->st, req->job_id, "cancelling", json_string(reason), NULL, -1);
    nb_status_t peers = nb__gw_fed_cancel_peers(c->gw, c->st, req->job_id, reason);
    char perr[768] = "";
    if (peers != NB_OK) {
      snprintf(perr, sizeof perr, "%s", nb_error_last());
      /* the federation thread keeps trying the clusters that did not answer */
      nb__gw_fed_update(c->gw, c->st, req->job_id, "cancel_pending", json_true(), NULL, -1);
    }
    s = nb__gw_cancel_local(c->gw, c->st, req->job_id, reason);
    if (s == NB_OK && peers != NB_OK)
      s = nb_error(peers,
                   "job %s: cancelled here, but not yet on every cluster (retried in the "
                   "background): %s",
                   req->job_id, perr);
  }
  if (s == NB_OK) s = nb__send_job(call, c->gw, c->st, req->job_id, 0);
  return s;
}

static const nb__api_method_t nb__cancel_m = {&nebula__v1__cancel_request__descriptor, "Cancel", 1,
                                              nb__cancel_check, nb__cancel_serve};

/* Streams <work_dir>/<job>/<stream>.log from req's offset as LogChunks (at least one, empty
 * when there is nothing yet); with req->follow until the job is final here. */
nb_status_t nb__gw_logs_send(nb_rpc_call_t* call, nb_gateway_t* gw, nb_job_store_t* st,
                             const Nebula__V1__LogsRequest* req) {
  const char* which = req->stream && *req->stream ? req->stream : "stdout";
  if (strcmp(which, "stdout") && strcmp(which, "stderr"))
    return nb_error(NB_ERR_INVALID, "stream must be \"stdout\" or \"stderr\", not '%s'", which);
  if (req->offset < 0) /* it used to read from 0, as if asked for the whole log */
    return nb_error(NB_ERR_INVALID, "Logs: offset %" PRId64 " is negative; give a byte offset >= 0",
                    req->offset);
  nb_job_record_t rec = {0};
  FILE* f = NULL;
  uint8_t* buf = NULL;
  int sent = 0;
  nb_status_t s = NB_OK;
  NB_CHECK(nb_alloc((void**)&buf, 65536, 1, "log chunk"));
  char path[NB_GW_STR + 128];
  snprintf(path, sizeof path, "%s/%s/%s.log", gw->cfg.work_dir, req->job_id, which);
  int64_t off = req->offset;
  for (;;) {
    if (nb_rpc_call_cancelled(call)) {
      s = nb_error(NB_ERR_CANCELLED, "Logs: client went away");
      break;
    }
    int final = 1;
    if (req->follow) {
      s = nb_job_store_get(st, req->job_id, &rec);
      if (s != NB_OK) break;
      final = nb_job_state_is_final(rec.state);
      nb_job_record_clear(&rec);
    }
    if (!f) f = fopen(path, "rbe");
    size_t got = 0;
    if (f && fseeko(f, off, SEEK_SET) == 0) got = fread(buf, 1, 65536, f);
    if (f) clearerr(f);
    if (got) {
      Nebula__V1__LogChunk c = NEBULA__V1__LOG_CHUNK__INIT;
      c.offset = off;
      c.data.data = buf;
      c.data.len = got;
      s = nb_rpc_call_send_pb(call, &c.base);
      if (s != NB_OK) break;
      off += (int64_t)got;
      sent++;
      continue;
    }
    if (final) break; /* the state was read before this last read: nothing more will come */
    nb_sleep_ns((int64_t)gw->cfg.poll_ms * 1000000);
  }
  if (s == NB_OK && !sent) {
    Nebula__V1__LogChunk c = NEBULA__V1__LOG_CHUNK__INIT; /* empty: the log is empty so far */
    c.offset = off;
    s = nb_rpc_call_send_pb(call, &c.base);
  }
  if (f) fclose(f);
  nb_free(buf);
  return s;
}

/* The origin relays another cluster's output of a job it federates: Federation.Logs at that
 * cluster's gateway, each chunk passed on as it comes. */
static nb_status_t nb__logs_relay(nb_rpc_call_t* call, nb_gateway_t* gw, nb_job_store_t* st,
                                  const Nebula__V1__LogsRequest* req) {
  nb_job_fed_t fed;
  json_t* info = NULL;
  nb_status_t s = nb__gw_fed_load(st, req->job_id, &fed, &info);
  if (s == NB_ERR_NOT_FOUND)
    return nb_error(NB_ERR_NOT_FOUND, "job '%s' runs on cluster '%s' only; no cluster '%s'",
                    req->job_id, gw->cfg.cluster_id, req->cluster);
  NB_CHECK(s);
  int member = json_is_object(json_object_get(json_object_get(info, "clusters"), req->cluster));
  int origin = !strcmp(fed.role, "origin");
  char at[NB_JOB_ID_MAX];
  snprintf(at, sizeof at, "%s", fed.origin);
  nb__gw_fed_release(&fed, info);
  if (!origin)
    return nb_error(NB_ERR_INVALID,
                    "another cluster's output of job '%s' is served by its origin '%s', not here",
                    req->job_id, at);
  if (!member)
    return nb_error(NB_ERR_NOT_FOUND, "job '%s' has no cluster '%s'", req->job_id, req->cluster);
  nb__peer_t* peer = nb__gw_peer_acquire(gw, req->cluster);
  if (!peer)
    return nb_error(NB_ERR_INVALID, "cluster '%s' is not a peer of gateway '%s'", req->cluster,
                    gw->cfg.cluster_id);
  nb_rpc_client_t* c = peer->cli;
  Nebula__V1__LogsRequest fwd = *req;
  fwd.cluster = (char*)"";
  nb_rpc_stream_t* rs = NULL;
  int64_t deadline = req->follow ? NB_RPC_INFINITE : (int64_t)gw->cfg.federation_timeout_ms * 30;
  s = nb_rpc_stream_open(c, "/nebula.v1.Federation/Logs", deadline, 0, &rs);
  if (s != NB_OK) {
    nb__gw_peer_release(gw, peer);
    return s;
  }
  s = nb_rpc_stream_send_pb(rs, &fwd.base);
  if (s == NB_OK) s = nb_rpc_stream_close_send(rs);
  while (s == NB_OK) {
    ProtobufCMessage* m = NULL;
    int end = 0;
    s = nb_rpc_stream_recv_pb(rs, &nebula__v1__log_chunk__descriptor, &m, &end, 1000);
    if (s == NB_ERR_TIMEOUT) { /* the peer's log is quiet: is our client still there? */
      s = nb_rpc_call_cancelled(call) ? nb_error(NB_ERR_CANCELLED, "Logs: client went away")
                                      : NB_OK;
      continue;
    }
    if (s != NB_OK || end) break;
    s = nb_rpc_call_send_pb(call, m);
    protobuf_c_message_free_unpacked(m, NULL);
  }
  if (s == NB_OK) s = nb_rpc_stream_finish(rs);
  nb_rpc_stream_destroy(rs);
  nb__gw_peer_release(gw, peer); /* after its stream: the last holder of a replaced one frees it */
  if (s != NB_OK) return nb_error_wrap(s, "cluster's log");
  return NB_OK;
}

static nb_status_t nb__logs_serve(nb_rpc_call_t* call, nb__api_call_t* c,
                                  const ProtobufCMessage* m) {
  const Nebula__V1__LogsRequest* req = (const Nebula__V1__LogsRequest*)m;
  if (req->cluster && *req->cluster && strcmp(req->cluster, c->gw->cfg.cluster_id))
    return nb__logs_relay(call, c->gw, c->st, req);
  return nb__gw_logs_send(call, c->gw, c->st, req);
}

static const nb__api_method_t nb__logs_m = {&nebula__v1__logs_request__descriptor, "Logs", 1, NULL,
                                            nb__logs_serve};

const nb__gw_method_t nb__gw_api_methods[NB__GW_API_METHODS] = {
    {"/nebula.v1.Gateway/Submit", NB_RPC_UNARY, nb__submit, NULL},
    {"/nebula.v1.Gateway/Get", NB_RPC_UNARY, nb__api_call, &nb__get_m},
    {"/nebula.v1.Gateway/List", NB_RPC_UNARY, nb__api_call, &nb__list_m},
    {"/nebula.v1.Gateway/Watch", NB_RPC_SERVER_STREAMING, nb__api_call, &nb__watch_m},
    {"/nebula.v1.Gateway/Cancel", NB_RPC_UNARY, nb__api_call, &nb__cancel_m},
    {"/nebula.v1.Gateway/Logs", NB_RPC_SERVER_STREAMING, nb__api_call, &nb__logs_m},
};
