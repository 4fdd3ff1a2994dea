/* The nebula.v1.Federation service: what a peer gateway calls on a member (Propose, Commit,
 * Abort, Cancel, Logs) and on the origin (Report). Only the cluster certificate of a configured
 * peer is served. The origin's side of the protocol is federation.c. */
#include "gateway/gateway_internal.h"

#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "jobs/descriptor.h"
#include "security/pki.h"
#include "security/sign.h"

/* Federation calls come from the cluster certificate of a configured peer only. */
static nb_status_t nb__fed_caller(nb_rpc_call_t* call, nb_gateway_t* gw, const char** cluster) {
  const nb_tls_peer_t* p = nb_rpc_call_peer(call);
  if (!p || p->kind != NB_TLS_PEER_CLUSTER)
    return nb_error(NB_ERR_PERMISSION,
                    "the Federation API is for peer gateways (a cluster certificate), not '%s'",
                    p ? p->name : "?");
  if (!nb__gw_is_peer(gw, p->name))
    return nb_error(NB_ERR_PERMISSION, "cluster '%s' is not a peer of gateway '%s'", p->name,
                    gw->cfg.cluster_id);
  *cluster = p->name;
  return NB_OK;
}

/* Reads a request of a Federation method from a configured peer. */
static nb_status_t nb__fed_request(nb_rpc_call_t* call, nb_gateway_t* gw,
                                   const ProtobufCMessageDescriptor* desc, const char* method,
                                   const char** caller, ProtobufCMessage** m) {
  NB_CHECK(nb__fed_caller(call, gw, caller));
  int end = 0;
  *m = NULL;
  NB_CHECK(nb_rpc_call_recv_pb(call, desc, m, &end, NB_RPC_INFINITE));
  if (!*m) return nb_error(NB_ERR_INVALID, "%s: no request", method);
  return NB_OK;
}

/* Loads the member record of job id, which `caller` must be the origin of. */
static nb_status_t nb__fed_member(nb_job_store_t* st, const char* id, const char* caller,
                                  nb_job_fed_t* fed, json_t** info) {
  if (!id || !*id) return nb_error(NB_ERR_INVALID, "job_id is empty");
  nb_status_t s = nb__gw_fed_load(st, id, fed, info);
  if (s == NB_ERR_NOT_FOUND) return nb_error(NB_ERR_NOT_FOUND, "no federated job '%s' here", id);
  if (s != NB_OK) return s;
  if (strcmp(fed->role, "member") || strcmp(fed->origin, caller)) {
    nb__gw_fed_release(fed, *info);
    return nb_error(NB_ERR_PERMISSION, "cluster '%s' is not the origin of job '%s'", caller, id);
  }
  return NB_OK;
}

static nb_status_t nb__fed_ack(nb_rpc_call_t* call, nb_job_store_t* st, const char* id) {
  nb_job_record_t rec = {0};
  NB_CHECK(nb_job_store_get(st, id, &rec));
  Nebula__V1__FederationAck a = NEBULA__V1__FEDERATION_ACK__INIT;
  a.state = (char*)nb_job_state_name(rec.state);
  nb_status_t s = nb_rpc_call_send_pb(call, &a.base);
  nb_job_record_clear(&rec);
  return s;
}

/* One call of a Federation method past the shared prologue (nb__fed_serve). */
typedef struct {
  nb_gateway_t* gw;
  const char* caller; /* the calling peer's cluster id */
  nb_job_store_t* st; /* this call's own store handle */
  nb_job_fed_t fed;   /* methods with .member: the job's member record; its origin is the caller */
  json_t* info;       /* and its info object */
} nb__fed_call_t;

/* What one Federation method adds to the shared prologue. */
typedef struct {
  const ProtobufCMessageDescriptor* desc; /* its request */
  const char* method;
  int member; /* the request's job_id names a job here whose origin is the caller */
  /* checks of the request alone, made before the store is opened (NULL: none) */
  nb_status_t (*check)(const nb__fed_call_t* c, const ProtobufCMessage* req);
  nb_status_t (*serve)(nb_rpc_call_t* call, nb__fed_call_t* c, const ProtobufCMessage* req);
} nb__fed_method_t;

/* The prologue and epilogue of the Federation handlers but Propose: the calling peer and its
 * request, the method's checks, a store handle and, for a method about a job this cluster is a
 * member of, its record; then m->serve; then everything released. */
static nb_status_t nb__fed_serve(nb_rpc_call_t* call, nb_gateway_t* gw, const void* spec) {
  const nb__fed_method_t* m = spec;
  nb__fed_call_t c = {.gw = gw, .caller = ""};
  ProtobufCMessage* req = NULL;
  int loaded = 0;
  NB_CHECK(nb__fed_request(call, c.gw, m->desc, m->method, &c.caller, &req));
  nb_status_t s = m->check ? m->check(&c, req) : NB_OK;
  if (s == NB_OK) s = nb__gw_open_store(c.gw, &c.st);
  if (s == NB_OK && m->member) {
    s = nb__fed_member(c.st, nb__gw_req_job_id(req), c.caller, &c.fed, &c.info);
    loaded = s == NB_OK;
  }
  if (s == NB_OK) s = m->serve(call, &c, req);
  /* the lifecycle line of a peer's call (a Report or Logs that went through: none) */
  if (s != NB_OK || (strcmp(m->method, "Report") && strcmp(m->method, "Logs"))) {
    const char* job = nb__gw_req_job_id(req);
    if (s == NB_OK)
      NB_INFO(JOB, "federation %s from cluster '%s' for job %s: ok", m->method, c.caller,
              job && *job ? job : "-");
    else
      NB_INFO(JOB, "federation %s from cluster '%s' for job %s: refused (%s): %s", m->method,
              c.caller, job && *job ? job : "-", nb_status_name(s), nb_error_last());
  }
  if (loaded) nb__gw_fed_release(&c.fed, c.info);
  nb_job_store_close(c.st);
  protobuf_c_message_free_unpacked(req, NULL);
  return s;
}

/* Member, phase 1: the same checks as Submit (signature, descriptor, our ACL and resources),
 * then the job is stored as proposed, its slots reserved and our Exchange endpoint chosen. */
static nb_status_t nb__fed_propose(nb_rpc_call_t* call, nb_gateway_t* gw, const void* spec) {
  const char* caller = "";
  ProtobufCMessage* m = NULL;
  NB_CHECK(
      nb__fed_request(call, gw, &nebula__v1__propose_request__descriptor, "Propose", &caller, &m));
  Nebula__V1__ProposeRequest* req = (Nebula__V1__ProposeRequest*)m;
  nb_status_t s = NB_OK;
  nb__gw_signed_t sd = {0};
  nb_job_config_t* cfg = NULL; /* sd.cfg once read */
  nb_job_store_t* st = NULL;
  json_t* info = NULL;
  int reserved = 0, created = 0;
  nb_pki_identity_t who;
  char ep[NB_GW_STR + 16] = "";
  if (!req->origin || strcmp(req->origin, caller)) {
    s = nb_error(NB_ERR_PERMISSION, "Propose: origin '%s' is not the caller '%s'",
                 req->origin ? req->origin : "", caller);
    goto done;
  }
  if (!req->job_id || !*req->job_id || !req->descriptor.len || !req->signature.len ||
      !req->cert_pem || !*req->cert_pem) {
    s = nb_error(NB_ERR_INVALID, "Propose needs the job id, descriptor, signature and certificate");
    goto done;
  }
  s = nb__gw_read_signed(gw, &req->descriptor, &req->signature, req->cert_pem, NULL, &who, 0, &sd);
  if (s != NB_OK) goto done;
  cfg = sd.cfg;
  nb__part_t parts[NB__MAX_PARTS];
  int np = nb__gw_parts(cfg, parts), mine = -1;
  for (int i = 0; i < np; i++)
    if (!strcmp(parts[i].id, gw->cfg.cluster_id)) mine = i;
  if (mine < 0) {
    s = nb_error(NB_ERR_INVALID, "job '%s' does not involve cluster '%s'", req->job_id,
                 gw->cfg.cluster_id);
    goto done;
  }
  int workers = parts[mine].workers;
  nb_acl_want_t want = {gw->cfg.cluster_id, workers};
  s = nb_acl_check(&gw->cfg.acl, who.name, &want, 1);
  if (s != NB_OK) goto done;
  for (int i = 0; i < cfg->n_clusters && workers > 0; i++) {
    if (!strcmp(cfg->clusters[i].id, gw->cfg.cluster_id) &&
        cfg->clusters[i].device == NB_JOB_DEVICE_CUDA && gw->cfg.device != NB_JOB_DEVICE_CUDA) {
      s = nb_error(NB_ERR_INVALID, "$.spec.clusters[%d].device: cluster '%s' has no cuda devices",
                   i, gw->cfg.cluster_id);
      goto done;
    }
  }
  if (workers > 0) {
    NB_CHECK_GOTO(nb__gw_reserve(gw, req->job_id, workers), s, done);
    reserved = 1;
    NB_CHECK_GOTO(nb__gw_free_endpoint(gw, req->job_id, ep, sizeof ep), s, done);
  }
  NB_CHECK_GOTO(nb__gw_open_store(gw, &st), s, done);
  {
    char* text = NULL;
    NB_CHECK_GOTO(nb_alloc((void**)&text, req->descriptor.len + 1, 1, "descriptor"), s, done);
    memcpy(text, req->descriptor.data, req->descriptor.len);
    text[req->descriptor.len] = 0;
    s = nb_job_store_create(st, req->job_id, who.name, text);
    nb_free(text);
    if (s == NB_ERR_EXISTS) s = nb_error(NB_ERR_EXISTS, "job '%s' is already here", req->job_id);
    if (s != NB_OK) goto done;
    created = 1;
  }
  NB_CHECK_GOTO(nb_job_store_transition(st, req->job_id, NB_JOB_PROPOSED, NULL), s, done);
  NB_CHECK_GOTO(nb__gw_jobdir_write(gw, req->job_id, req->descriptor.data, req->descriptor.len,
                                    req->signature.data, req->signature.len, req->cert_pem),
                s, done);
  {
    nb_job_fed_t fed;
    memset(&fed, 0, sizeof fed);
    snprintf(fed.job_id, sizeof fed.job_id, "%s", req->job_id);
    snprintf(fed.role, sizeof fed.role, "member");
    snprintf(fed.origin, sizeof fed.origin, "%s", caller);
    fed.active = 1;
    info = json_pack("{s:I}", "report_seq", (json_int_t)0);
    json_t* me = nb__gw_fed_cluster(info, gw->cfg.cluster_id);
    json_object_set_new(me, "workers", json_integer(workers));
    json_object_set_new(me, "endpoint", json_string(ep));
    NB_CHECK_GOTO(nb__gw_fed_save(st, &fed, info), s, done);
  }
  NB_INFO(JOB, "job %s proposed by %s for user %s: %d workers here, exchange %s", req->job_id,
          caller, who.name, workers, ep[0] ? ep : "-");
  {
    Nebula__V1__ProposeReply r = NEBULA__V1__PROPOSE_REPLY__INIT;
    r.endpoint = ep;
    s = nb_rpc_call_send_pb(call, &r.base);
  }
done:
  if (s != NB_OK) {
    char why[768];
    snprintf(why, sizeof why, "%s", nb_error_last());
    if (reserved) nb__gw_unreserve(gw, req->job_id);
    if (created) nb_job_store_transition(st, req->job_id, NB_JOB_FAILED, why);
    NB_WARN("job %s proposed by %s: refused: %s", req->job_id ? req->job_id : "?", caller, why);
    s = nb_error(s, "%s", why);
  }
  json_decref(info);
  nb__gw_signed_clear(&sd);
  nb_job_store_close(st);
  protobuf_c_message_free_unpacked(m, NULL);
  return s;
}

/* Member, phase 2: keep the secret and the endpoints, launch our share. */
static nb_status_t nb__fed_commit_serve(nb_rpc_call_t* call, nb__fed_call_t* c,
                                        const ProtobufCMessage* m) {
  const Nebula__V1__CommitRequest* req = (const Nebula__V1__CommitRequest*)m;
  nb_job_fed_t fed;
  json_t* info = NULL;
  int loaded = 0;
  nb_job_record_t rec = {0};
  nb_status_t s = NB_OK;
  pthread_mutex_lock(&c->gw->record_mu);
  s = nb__fed_member(c->st, req->job_id, c->caller, &fed, &info);
  loaded = s == NB_OK;
  if (s == NB_OK && req->secret.len != sizeof fed.secret)
    s = nb_error(NB_ERR_INVALID, "Commit: the secret must be %zu bytes", sizeof fed.secret);
  if (s == NB_OK) s = nb_job_store_get(c->st, req->job_id, &rec);
  if (s == NB_OK && rec.state != NB_JOB_PROPOSED)
    s = nb_error(NB_ERR_INVALID, "job '%s' is %s here, not proposed", req->job_id,
                 nb_job_state_name(rec.state));
  json_t* eps = json_object();
  for (size_t i = 0; s == NB_OK && i < req->n_endpoints; i++)
    json_object_set_new(eps, req->endpoints[i]->cluster, json_string(req->endpoints[i]->address));
  if (s == NB_OK) {
    memcpy(fed.secret, req->secret.data, sizeof fed.secret);
    fed.has_secret = 1;
    json_object_set(info, "endpoints", eps);
    s = nb__gw_fed_save(c->st, &fed, info);
  }
  pthread_mutex_unlock(&c->gw->record_mu);
  int workers = (int)json_integer_value(
      json_object_get(nb__gw_fed_cluster(info ? info : eps, c->gw->cfg.cluster_id), "workers"));
  if (s == NB_OK) {
    s = nb__gw_fed_start(c->gw, c->st, req->job_id, workers, fed.secret, eps);
    if (s != NB_OK) {
      char reason[768];
      snprintf(reason, sizeof reason, "launch failed: %.700s", nb_error_last());
      nb__gw_unreserve(c->gw, req->job_id);
      nb_job_store_transition(c->st, req->job_id, NB_JOB_FAILED, reason);
      s = nb_error(s, "%s", reason);
    }
  }
  json_decref(eps);
  if (s == NB_OK) s = nb__fed_ack(call, c->st, req->job_id);
  if (loaded) nb__gw_fed_release(&fed, info);
  nb_job_record_clear(&rec);
  return s;
}
/* the member record is read (and written) under record_mu: .member stays 0 */
static const nb__fed_method_t nb__fed_commit_m = {&nebula__v1__commit_request__descriptor, "Commit",
                                                  0, NULL, nb__fed_commit_serve};

static nb_status_t nb__fed_abort_serve(nb_rpc_call_t* call, nb__fed_call_t* c,
                                       const ProtobufCMessage* m) {
  const Nebula__V1__AbortRequest* req = (const Nebula__V1__AbortRequest*)m;
  nb__gw_unreserve(c->gw, req->job_id);
  char reason[768];
  snprintf(reason, sizeof reason, "aborted by the origin '%s': %.600s", c->caller,
           req->reason ? req->reason : "");
  nb_status_t t = nb_job_store_transition(c->st, req->job_id, NB_JOB_FAILED, reason);
  if (t != NB_OK && t != NB_ERR_INVALID) return t;
  return nb__fed_ack(call, c->st, req->job_id);
}

static const nb__fed_method_t nb__fed_abort_m = {&nebula__v1__abort_request__descriptor, "Abort", 1,
                                                 NULL, nb__fed_abort_serve};

static nb_status_t nb__fed_cancel_serve(nb_rpc_call_t* call, nb__fed_call_t* c,
                                        const ProtobufCMessage* m) {
  const Nebula__V1__FederationCancelRequest* req = (const Nebula__V1__FederationCancelRequest*)m;
  char reason[768];
  snprintf(reason, sizeof reason, "cancelled by the origin '%s'%s%.600s", c->caller,
           req->reason && *req->reason ? ": " : "", req->reason ? req->reason : "");
  NB_CHECK(nb__gw_cancel_local(c->gw, c->st, req->job_id, reason));
  return nb__fed_ack(call, c->st, req->job_id);
}

static const nb__fed_method_t nb__fed_cancel_m = {
    &nebula__v1__federation_cancel_request__descriptor, "Cancel", 1, NULL, nb__fed_cancel_serve};

/* The most a member's event seq may run ahead of its last accepted one at the origin. */
#define NB__FED_SEQ_MAX_GAP 1000

/* Origin: a batch of a member's events. Stored tagged with the cluster (state → cluster_state,
 * launch/exit → cluster_launch/cluster_exit, progress keeps its kind); the cluster's state feeds
 * the job's aggregate state. Idempotent: events at or below the cluster's acked seq are skipped. */
static nb_status_t nb__fed_report_check(const nb__fed_call_t* c, const ProtobufCMessage* m) {
  const Nebula__V1__ReportRequest* req = (const Nebula__V1__ReportRequest*)m;
  if (!req->cluster || strcmp(req->cluster, c->caller))
    return nb_error(NB_ERR_PERMISSION, "Report: cluster '%s' is not the caller '%s'",
                    req->cluster ? req->cluster : "", c->caller);
  return NB_OK;
}

static nb_status_t nb__fed_report_serve(nb_rpc_call_t* call, nb__fed_call_t* fc,
                                        const ProtobufCMessage* m) {
  const Nebula__V1__ReportRequest* req = (const Nebula__V1__ReportRequest*)m;
  nb_job_fed_t fed;
  json_t* info = NULL;
  int64_t acked = 0;
  nb_status_t s = NB_OK;
  pthread_mutex_lock(&fc->gw->record_mu);
  s = nb__gw_fed_load(fc->st, req->job_id ? req->job_id : "", &fed, &info);
  if (s == NB_ERR_NOT_FOUND)
    s = nb_error(NB_ERR_NOT_FOUND, "no federated job '%s' here", req->job_id);
  if (s == NB_OK) {
    json_t* c = json_object_get(json_object_get(info, "clusters"), fc->caller);
    if (strcmp(fed.role, "origin") || !json_is_object(c)) {
      s = nb_error(NB_ERR_PERMISSION, "cluster '%s' takes no part in job '%s' from here",
                   fc->caller, req->job_id);
    } else {
      acked = json_integer_value(json_object_get(c, "seq"));
      /* A member numbers its events 1, 2, 3, ... in its own store and reports them in order, so
       * a new event follows the last accepted one closely. One far ahead (or going backwards)
       * would move the acked seq past the member's real events, which would then be skipped as
       * already stored: the job would never end here. The whole batch is refused, nothing is
       * stored, and the member is told why. */
      int64_t prev = acked;
      for (size_t i = 0; i < req->n_events && s == NB_OK; i++) {
        int64_t q = req->events[i]->seq;
        if (q <= acked) continue;
        if (q <= prev)
          s = nb_error(NB_ERR_INVALID,
                       "Report from cluster '%s' for job '%s' refused: event seq %" PRId64
                       " does not follow seq %" PRId64
                       " (a member's events are in increasing "
                       "order); nothing stored",
                       fc->caller, req->job_id, q, prev);
        else if (q - prev > NB__FED_SEQ_MAX_GAP)
          s = nb_error(NB_ERR_INVALID,
                       "Report from cluster '%s' for job '%s' refused: event seq %" PRId64
                       " is more than %d ahead of seq %" PRId64
                       ", the last accepted; "
                       "nothing stored",
                       fc->caller, req->job_id, q, NB__FED_SEQ_MAX_GAP, prev);
        else
          prev = q;
      }
      if (s != NB_OK) NB_WARN("federation: %s", nb_error_last());
      for (size_t i = 0; i < req->n_events && s == NB_OK; i++) {
        Nebula__V1__ReportEvent* e = req->events[i];
        if (e->seq <= acked) continue;
        json_t* p = json_loads(e->payload_json ? e->payload_json : "", 0, NULL);
        if (!json_is_object(p)) {
          json_decref(p);
          p = json_object();
        }
        json_object_set_new(p, "cluster", json_string(fc->caller));
        char kind[32];
        if (!strcmp(e->kind, "progress")) {
          snprintf(kind, sizeof kind, "progress");
          if (!json_object_get(p, "source"))
            json_object_set_new(p, "source", json_string(fc->caller));
        } else {
          snprintf(kind, sizeof kind, "cluster_%.20s", e->kind);
        }
        if (!strcmp(e->kind, "state")) {
          const char* to = nb__gw_jstr(p, "to");
          json_object_set_new(c, "state", json_string(to));
          json_object_set_new(c, "reason", json_string(nb__gw_jstr(p, "reason")));
        }
        char* txt = json_dumps(p, JSON_COMPACT);
        json_decref(p);
        s = txt ? nb_job_store_append_event(fc->st, req->job_id, kind, txt, NULL)
                : nb_error(NB_ERR_NOMEM, "report");
        free(txt);
        if (s == NB_OK) acked = e->seq;
      }
      json_object_set_new(c, "seq", json_integer(acked));
      nb__gw_fed_aggregate(fc->gw, fc->st, req->job_id, info);
      nb_status_t t = nb__gw_fed_save(fc->st, &fed, info);
      if (s == NB_OK) s = t;
    }
    nb__gw_fed_release(&fed, info);
  }
  pthread_mutex_unlock(&fc->gw->record_mu);
  if (s == NB_OK) {
    Nebula__V1__ReportReply r = NEBULA__V1__REPORT_REPLY__INIT;
    r.acked_seq = acked;
    s = nb_rpc_call_send_pb(call, &r.base);
  }
  return s;
}

static const nb__fed_method_t nb__fed_report_m = {&nebula__v1__report_request__descriptor, "Report",
                                                  0, nb__fed_report_check, nb__fed_report_serve};

static nb_status_t nb__fed_logs_serve(nb_rpc_call_t* call, nb__fed_call_t* c,
                                      const ProtobufCMessage* m) {
  return nb__gw_logs_send(call, c->gw, c->st, (const Nebula__V1__LogsRequest*)m);
}

static const nb__fed_method_t nb__fed_logs_m = {&nebula__v1__logs_request__descriptor, "Logs", 1,
                                                NULL, nb__fed_logs_serve};

const nb__gw_method_t nb__gw_fed_methods[NB__GW_FED_METHODS] = {
    {"/nebula.v1.Federation/Propose", NB_RPC_UNARY, nb__fed_propose, NULL},
    {"/nebula.v1.Federation/Commit", NB_RPC_UNARY, nb__fed_serve, &nb__fed_commit_m},
    {"/nebula.v1.Federation/Abort", NB_RPC_UNARY, nb__fed_serve, &nb__fed_abort_m},
    {"/nebula.v1.Federation/Cancel", NB_RPC_UNARY, nb__fed_serve, &nb__fed_cancel_m},
    {"/nebula.v1.Federation/Report", NB_RPC_UNARY, nb__fed_serve, &nb__fed_report_m},
    {"/nebula.v1.Federation/Logs", NB_RPC_SERVER_STREAMING, nb__fed_serve, &nb__fed_logs_m},
};
