/* ACL rules and their evaluation (jobs/acl.h). Rules are tried in order; the first that allows
 * the whole request wins; a refusal gives the reason of the first rule that named the user. No
 * wildcards other than a bare "*", no groups, no negative rules. */
#include "jobs/acl.h"

#include <stdio.h>
#include <string.h>

#include "common/common.h"

static int nb__acl_name_ok(const char* s) {
  size_t n = s ? strlen(s) : 0;
  return n > 0 && n < NB_ACL_NAME_MAX;
}

nb_status_t nb_acl_add(nb_acl_t* acl, const char* user, const char* const* clusters, int n,
                       int max_workers) {
  if (!acl || !nb__acl_name_ok(user))
    return nb_error(NB_ERR_INVALID, "acl: a rule needs a user name of 1..%d bytes or \"*\"",
                    NB_ACL_NAME_MAX - 1);
  if (n < 1 || n > NB_ACL_MAX_CLUSTERS || !clusters)
    return nb_error(NB_ERR_INVALID, "acl: rule for '%s' needs 1..%d clusters, got %d", user,
                    NB_ACL_MAX_CLUSTERS, n);
  if (max_workers < 0)
    return nb_error(NB_ERR_INVALID, "acl: rule for '%s': max_workers must be >= 0, got %d", user,
                    max_workers);
  if (acl->n_rules >= NB_ACL_MAX_RULES)
    return nb_error(NB_ERR_CONFIG, "acl: more than %d rules", NB_ACL_MAX_RULES);
  nb_acl_rule_t* r = &acl->rules[acl->n_rules];
  memset(r, 0, sizeof *r);
  snprintf(r->user, sizeof r->user, "%s", user);
  for (int i = 0; i < n; i++) {
    if (!nb__acl_name_ok(clusters[i]))
      return nb_error(NB_ERR_INVALID, "acl: rule for '%s': cluster %d is empty or too long", user,
                      i);
    snprintf(r->clusters[i], sizeof r->clusters[i], "%s", clusters[i]);
  }
  r->n_clusters = n;
  r->max_workers = max_workers;
  acl->n_rules++;
  return NB_OK;
}

static int nb__rule_has_cluster(const nb_acl_rule_t* r, const char* cluster) {
  for (int i = 0; i < r->n_clusters; i++)
    if (!strcmp(r->clusters[i], "*") || !strcmp(r->clusters[i], cluster)) return 1;
  return 0;
}

nb_status_t nb_acl_check(const nb_acl_t* acl, const char* user, const nb_acl_want_t* want,
                         size_t n) {
  if (!acl || !user || (n && !want)) return nb_error(NB_ERR_INVALID, "acl: NULL argument");
  char why[320] = "";
  int user_known = 0;
  for (int k = 0; k < acl->n_rules; k++) {
    const nb_acl_rule_t* r = &acl->rules[k];
    if (strcmp(r->user, "*") && strcmp(r->user, user)) continue;
    user_known = 1;
    size_t i = 0;
    for (; i < n; i++) {
      if (!nb__rule_has_cluster(r, want[i].cluster)) {
        if (!why[0])
          snprintf(why, sizeof why, "user '%s' may not run jobs on cluster '%s'", user,
                   want[i].cluster);
        break;
      }
      if (r->max_workers > 0 && want[i].workers > r->max_workers) {
        if (!why[0])
          snprintf(why, sizeof why,
                   "user '%s' may use at most %d workers on cluster '%s' (asked %d)", user,
                   r->max_workers, want[i].cluster, want[i].workers);
        break;
      }
    }
    if (i == n) return NB_OK;
  }
  if (!user_known)
    return nb_error(NB_ERR_PERMISSION, "user '%s' is not in this gateway's ACL", user);
  return nb_error(NB_ERR_PERMISSION, "%s", why);
}
