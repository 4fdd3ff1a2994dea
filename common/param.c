/* The parameter registry behind NB_PARAM_*. A linked list filled by constructors; values are
 * loaded lazily under one mutex. */
#include "common/param.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"

static pthread_mutex_t nb__param_mu = PTHREAD_MUTEX_INITIALIZER;
static nb_param_t* nb__param_head;

void nb_param_register(nb_param_t* p) {
  pthread_mutex_lock(&nb__param_mu);
  for (nb_param_t* q = nb__param_head; q; q = q->next)
    if (q == p) goto out;
  p->next = nb__param_head;
  nb__param_head = p;
out:
  pthread_mutex_unlock(&nb__param_mu);
}

static int nb__parse(nb_param_t* p, const char* text, int64_t* iv, double* dv) {
  char* end = NULL;
  errno = 0;
  if (p->type == NB_PARAM_INT) {
    long long v = strtoll(text, &end, 0);
    if (errno || end == text || *end) return 0;
    if (p->min <= p->max && ((double)v < p->min || (double)v > p->max)) return 0;
    *iv = v;
  } else if (p->type == NB_PARAM_DOUBLE) {
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v)) return 0;
    if (p->min <= p->max && (v < p->min || v > p->max)) return 0;
    *dv = v;
  }
  return 1;
}

static void nb__param_load_locked(nb_param_t* p) {
  if (p->loaded) return;
  const char* env = getenv(p->env);
  int64_t iv = 0;
  double dv = 0;
  p->source = "default";
  if (env && *env && nb__parse(p, env, &iv, &dv)) {
    p->source = "environment";
    snprintf(p->sval, sizeof p->sval, "%s", env);
  } else {
    if (env && *env) {
      if (p->min <= p->max)
        NB_WARN("%s=\"%s\" is not valid (expected a %s in [%g, %g]); using the default %s", p->env,
                env, p->type == NB_PARAM_INT ? "integer" : "number", p->min, p->max, p->defval);
      else
        NB_WARN("%s=\"%s\" is not valid; using the default %s", p->env, env, p->defval);
    }
    snprintf(p->sval, sizeof p->sval, "%s", p->defval);
    nb__parse(p, p->defval, &iv, &dv);
  }
  p->ival = iv;
  p->dval = p->type == NB_PARAM_INT ? (double)iv : dv;
  if (p->type == NB_PARAM_DOUBLE) p->ival = (int64_t)dv;
  __atomic_store_n(&p->loaded, 1, __ATOMIC_RELEASE);
  NB_INFO(ENV, "%s=%s (%s)", p->env, p->sval, p->source);
}

static nb_param_t* nb__param_get(nb_param_t* p) {
  if (!__atomic_load_n(&p->loaded, __ATOMIC_ACQUIRE)) {
    pthread_mutex_lock(&nb__param_mu);
    nb__param_load_locked(p);
    pthread_mutex_unlock(&nb__param_mu);
  }
  return p;
}

int64_t nb_param_int(nb_param_t* p) {
  return nb__param_get(p)->ival;
}
double nb_param_double(nb_param_t* p) {
  return nb__param_get(p)->dval;
}
const char* nb_param_string(nb_param_t* p) {
  return nb__param_get(p)->sval;
}

void nb_param_foreach(void (*fn)(const nb_param_t* p, void* ctx), void* ctx) {
  pthread_mutex_lock(&nb__param_mu);
  for (nb_param_t* p = nb__param_head; p; p = p->next) nb__param_load_locked(p);
  nb_param_t* head = nb__param_head;
  pthread_mutex_unlock(&nb__param_mu);
  for (nb_param_t* p = head; p; p = p->next) fn(p, ctx);
}

void nb_param_reset_all(void) {
  pthread_mutex_lock(&nb__param_mu);
  for (nb_param_t* p = nb__param_head; p; p = p->next) p->loaded = 0;
  pthread_mutex_unlock(&nb__param_mu);
}
