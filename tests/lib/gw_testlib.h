/* Set-up shared by the tests that run in-process gateways over mutual TLS on loopback
 * (tests/unit/gateway, tests/unit/federation): a temporary folder holding a PKI made by
 * security/pki, free loopback ports, clients with a user's certificate and signed submits.
 * Every helper fails the running cmocka test when a step goes wrong. Built into each test that
 * uses it (SOURCES ${PROJECT_SOURCE_DIR}/tests/lib/gw_testlib.c). */
#ifndef NB_TESTS_LIB_GW_TESTLIB_H
#define NB_TESTS_LIB_GW_TESTLIB_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <openssl/evp.h>
#include <openssl/x509.h>

#include "common/common.h"
#include "gateway/gateway.h"
#include "gateway/store.h"
#include "inter/rpc.h"
#include "nebula/v1/gateway.pb-c.h"
#include "security/tls.h"

/* Makes $TMPDIR/<prefix>.XXXXXX (/tmp without TMPDIR) and writes its path into dir. */
void gwt_make_dir(char* dir, size_t cap, const char* prefix);

/* Removes dir and everything below it (links not followed). */
void gwt_remove_dir(const char* dir);

/* Reaps every child that has already exited, without waiting for the others. */
void gwt_reap(void);

/* A loopback port nothing listens on now (bound, then closed). */
int gwt_free_port(void);

/* Fills *cfg with the defaults, then parses json (paths relative to dir) into it. */
void gwt_parse_config(const char* dir, const char* json, nb_gateway_config_t* cfg);

/* Two gateways peered on loopback: free ports into port[0] and port[1], then for i = 0, 1
 * make_config(i) fills cfg[i] (from port[]) and gateway i starts into gw[i]. */
void gwt_start_pair(int port[2], nb_gateway_config_t cfg[2], nb_gateway_t* gw[2],
                    void (*make_config)(int i));

/* Destroys both gateways of a pair (NULL ok) and sets them NULL. */
void gwt_stop_pair(nb_gateway_t* gw[2]);

/* Writes dir/<name>.key and dir/<name>.crt, then frees k and c. */
void gwt_write_pair(const char* dir, EVP_PKEY* k, X509* c, const char* name);

/* A new CA written to dir/ca.crt, a cluster certificate (SAN IP:127.0.0.1) for each of
 * clusters and a user certificate for each of users, each as dir/<name>.{key,crt}. The CA's key
 * and certificate go to *ca_key and *ca (the caller frees them) when both are given, else are
 * freed. */
void gwt_make_pki(const char* dir, const char* const* clusters, int n_clusters,
                  const char* const* users, int n_users, EVP_PKEY** ca_key, X509** ca);

/* A client of 127.0.0.1:port with user's certificate from dir; its TLS material in *tls_out
 * (the caller destroys both). */
nb_rpc_client_t* gwt_client(const char* dir, const char* user, int port, nb_tls_t** tls_out);

/* Submits doc signed with dir/<signer>.key, dir/<signer>.crt sent along (tamper: flip a byte
 * after signing). The reply into *out (the caller frees it) when out is given, else freed. */
nb_status_t gwt_submit(nb_rpc_client_t* cli, const char* dir, const char* signer, const char* doc,
                       int tamper, int64_t timeout_ms, Nebula__V1__Job** out);

/* gwt_submit, keeping only the job id (into id when given and the gateway answered). */
nb_status_t gwt_submit_id(nb_rpc_client_t* cli, const char* dir, const char* signer,
                          const char* doc, int tamper, int64_t timeout_ms, char* id, size_t cap);

/* The job store of the gateway configured by cfg (<work_dir>/jobs.db), opened. */
nb_job_store_t* gwt_open_store(const nb_gateway_config_t* cfg);

/* The job's state in cfg's store, -1 when unknown; its reason into why when given. */
nb_job_state_t gwt_job_state(const nb_gateway_config_t* cfg, const char* id, char* why, size_t cap);

/* Polls cfg's store every 50 ms for up to seconds until the job is in state want; fails the test
 * (naming the state it is in and why) when the time runs out or it ends in another state. */
void gwt_wait_state(const nb_gateway_config_t* cfg, const char* id, nb_job_state_t want,
                    int seconds);

/* What a failed wait prints on stderr: the job's state, its last events, the tails of its
 * stdout.log and stderr.log, and its exit files. gwt_wait_state does it for both gateways of
 * gwt_start_pair's pair (or the one it waited on) before it fails. */
void gwt_dump_job(const nb_gateway_config_t* cfg, const char* id);

/* The job's events in cfg's store of kind (NULL: any) whose payload holds needle (NULL: any). */
int gwt_count_events(const nb_gateway_config_t* cfg, const char* id, const char* kind,
                     const char* needle);

/* The "pid" of the job's last event of kind in cfg's store (0 if none). */
pid_t gwt_event_pid(const nb_gateway_config_t* cfg, const char* id, const char* kind);

/* Cancels the job through cli (reason "test"), asserting the call succeeds; the job as it
 * answers (the caller frees it). */
Nebula__V1__Job* gwt_cancel(nb_rpc_client_t* cli, const char* id, int64_t timeout_ms);

/* Polls (up to 10 s) until both gateways of a pair have launched the job; the pids of the two
 * launch events into *pa and *pb, asserted found. */
void gwt_wait_launched(const nb_gateway_config_t cfg[2], const char* id, pid_t* pa, pid_t* pb);

#endif
