/* The gateway's access control list: which users may submit jobs, to which clusters, with how
 * many workers per cluster. Deny by default: a request passes only when one rule allows all of
 * it. It does not authenticate anyone (the client certificate does) nor parse config files. */
#ifndef NB_JOBS_ACL_H
#define NB_JOBS_ACL_H

#include <stddef.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NB_ACL_MAX_RULES 64
#define NB_ACL_MAX_CLUSTERS 16
#define NB_ACL_NAME_MAX 64 /* user names and cluster ids, NUL included */

/* One rule: `user` ("*" = any user) may submit jobs whose every cluster is in `clusters`
 * ("*" = any) with at most max_workers workers in each (0 = no limit). */
typedef struct {
  char user[NB_ACL_NAME_MAX];
  int n_clusters;
  char clusters[NB_ACL_MAX_CLUSTERS][NB_ACL_NAME_MAX];
  int max_workers;
} nb_acl_rule_t;

typedef struct {
  int n_rules;
  nb_acl_rule_t rules[NB_ACL_MAX_RULES];
} nb_acl_t;

/* What a job asks for in one cluster. */
typedef struct {
  const char* cluster; /* borrowed */
  int workers;
} nb_acl_want_t;

/* Adds a rule. user: "*" or a name; clusters: n entries, "*" allowed (borrowed, copied).
 * Returns NB_OK; NB_ERR_INVALID (empty or over-long names, n out of range, max_workers < 0);
 * NB_ERR_CONFIG when the table is full. Not thread-safe (setup only). */
nb_status_t nb_acl_add(nb_acl_t* acl, const char* user, const char* const* clusters, int n,
                       int max_workers);

/* Decides whether `user` may run a job asking for want[0..n). NB_OK when one rule allows every
 * entry; otherwise NB_ERR_PERMISSION with a message naming the user and what was refused (the
 * reason from the first rule naming the user: unknown user, cluster not allowed, too many
 * workers). An empty ACL
 * refuses everyone. Thread-safe on a const acl. */
nb_status_t nb_acl_check(const nb_acl_t* acl, const char* user, const nb_acl_want_t* want,
                         size_t n);

#ifdef __cplusplus
}
#endif
#endif
