/* Token bucket kept as two byte counters: `issued` (bytes reserved by callers, in arrival order)
 * and `allowed` (bytes the bucket has released so far). A caller reserving bytes [a, b) may go when
 * allowed >= b, so waiters leave in FIFO order and a rate change simply changes how fast `allowed`
 * grows. Not a scheduler across links: one limiter per capped link. */
#include "inter/ratelimit.h"

#include <math.h>
#include <pthread.h>
#include <string.h>

#include "common/common.h"

struct nb_ratelimit {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  double rate;     /* bytes/s, 0 = unlimited */
  double burst;    /* bytes */
  double issued;   /* bytes reserved since creation */
  double allowed;  /* bytes released since creation, as of last_ns; <= issued + burst */
  int64_t last_ns; /* time `allowed` was brought up to date */
  int cancelled;
  nb_ratelimit_stats_t st;
  nb_clock_t clk; /* every reading of the time and every timed wait */
};

static int64_t rl_now(const nb_ratelimit_t* rl) {
  return rl->clk.now_ns(rl->clk.ctx);
}

/* 10 ms at the rate, at least one smallest link chunk (16 KiB): a larger floor let whole frames
 * of a thin link through at once, and the estimator (which samples transfers of 64 KiB and
 * more) then measured the burst, not the rate. */
static double rl_default_burst(double rate) {
  double b = rate * 0.010;
  return b < 16384.0 ? 16384.0 : b;
}

static nb_status_t rl_check(double rate, double burst) {
  if (!isfinite(rate) || rate < 0.0)
    return nb_error(NB_ERR_INVALID, "rate limit: rate must be a finite number >= 0 bytes/s, got %g",
                    rate);
  if (!isfinite(burst) || burst < 0.0)
    return nb_error(NB_ERR_INVALID, "rate limit: burst must be a finite number >= 0 bytes, got %g",
                    burst);
  return NB_OK;
}

/* Brings `allowed` up to `now` at the current rate. Caller holds mu. */
static void rl_refill(nb_ratelimit_t* rl, int64_t now) {
  if (now > rl->last_ns && rl->rate > 0.0) {
    rl->allowed += rl->rate * (double)(now - rl->last_ns) * 1e-9;
    double cap = rl->issued + rl->burst;
    if (rl->allowed > cap) rl->allowed = cap;
  }
  if (now > rl->last_ns) rl->last_ns = now;
}

nb_status_t nb_ratelimit_create(double rate_Bps, double burst_bytes, nb_ratelimit_t** out) {
  return nb_ratelimit_create_clock(rate_Bps, burst_bytes, NULL, out);
}

nb_status_t nb_ratelimit_create_clock(double rate_Bps, double burst_bytes, const nb_clock_t* clk,
                                      nb_ratelimit_t** out) {
  if (!out) return nb_error(NB_ERR_INVALID, "rate limit: out is NULL");
  *out = NULL;
  NB_CHECK(rl_check(rate_Bps, burst_bytes));
  if (clk && (!clk->now_ns || !clk->wait_until))
    return nb_error(NB_ERR_INVALID, "rate limit: the clock lacks now_ns or wait_until");
  nb_ratelimit_t* rl = NULL;
  NB_CHECK(nb_calloc((void**)&rl, 1, sizeof *rl, "rate limiter"));
  int e1 = pthread_mutex_init(&rl->mu, NULL);
  int e2 = nb_clock_cond_init(&rl->cv);
  if (e1 || e2) {
    if (!e1) pthread_mutex_destroy(&rl->mu);
    if (!e2) pthread_cond_destroy(&rl->cv);
    nb_free(rl);
    return nb_error(NB_ERR_SYSTEM, "rate limit: cannot initialise mutex/condition (%d/%d)", e1, e2);
  }
  rl->rate = rate_Bps;
  rl->burst = burst_bytes > 0.0 ? burst_bytes : rl_default_burst(rate_Bps);
  rl->allowed = rl->burst; /* starts full */
  rl->clk = clk ? *clk : *nb_clock_real();
  rl->last_ns = rl_now(rl);
  *out = rl;
  return NB_OK;
}

void nb_ratelimit_destroy(nb_ratelimit_t* rl) {
  if (!rl) return;
  pthread_cond_destroy(&rl->cv);
  pthread_mutex_destroy(&rl->mu);
  nb_free(rl);
}

nb_status_t nb_ratelimit_set_rate(nb_ratelimit_t* rl, double rate_Bps, double burst_bytes) {
  if (!rl) return nb_error(NB_ERR_INVALID, "rate limit: limiter is NULL");
  NB_CHECK(rl_check(rate_Bps, burst_bytes));
  pthread_mutex_lock(&rl->mu);
  int64_t now = rl_now(rl);
  rl_refill(rl, now);
  int was_unlimited = rl->rate == 0.0;
  rl->rate = rate_Bps;
  if (burst_bytes > 0.0)
    rl->burst = burst_bytes;
  else if (was_unlimited)
    rl->burst = rl_default_burst(rate_Bps);
  if (was_unlimited) rl->allowed = rl->issued + rl->burst; /* a fresh, full bucket */
  pthread_cond_broadcast(&rl->cv);
  pthread_mutex_unlock(&rl->mu);
  NB_INFO(WIRE, "rate limit set to %.3f Mbit/s (burst %.0f bytes)", rate_Bps * 8e-6, rl->burst);
  return NB_OK;
}

static nb_status_t rl_acquire(nb_ratelimit_t* rl, size_t bytes, int64_t deadline_ns) {
  if (!rl) return nb_error(NB_ERR_INVALID, "rate limit: limiter is NULL");
  nb_status_t st = NB_OK;
  pthread_mutex_lock(&rl->mu);
  if (rl->cancelled) {
    pthread_mutex_unlock(&rl->mu);
    return nb_error(NB_ERR_CANCELLED, "rate limit: cancelled");
  }
  int64_t t0 = rl_now(rl);
  rl_refill(rl, t0);
  double n = (double)bytes;
  if (rl->rate == 0.0) {
    rl->issued += n;
    rl->allowed = rl->issued;
    goto granted;
  }
  double end = rl->issued + n;
  if (deadline_ns >= 0 && end > rl->allowed) {
    double wait_s = (end - rl->allowed) / rl->rate;
    if ((double)t0 + wait_s * 1e9 > (double)deadline_ns) {
      pthread_mutex_unlock(&rl->mu);
      return nb_error(NB_ERR_TIMEOUT, "rate limit: %zu bytes need %.3f s at %.3f Mbit/s", bytes,
                      wait_s, rl->rate * 8e-6);
    }
  }
  rl->issued = end;
  int waited = 0;
  for (;;) {
    int64_t now = rl_now(rl);
    rl_refill(rl, now);
    if (rl->rate == 0.0) {
      if (rl->allowed < rl->issued) rl->allowed = rl->issued;
      break;
    }
    if (rl->allowed >= end) break;
    if (rl->cancelled) {
      st = nb_error(NB_ERR_CANCELLED, "rate limit: cancelled while waiting");
      break;
    }
    if (deadline_ns >= 0 && now >= deadline_ns) {
      st = nb_error(NB_ERR_TIMEOUT, "rate limit: deadline passed while waiting for %zu bytes",
                    bytes);
      break;
    }
    double wait_ns = (end - rl->allowed) / rl->rate * 1e9;
    int64_t wake = now + (int64_t)ceil(wait_ns);
    if (deadline_ns >= 0 && wake > deadline_ns) wake = deadline_ns;
    waited = 1;
    rl->clk.wait_until(rl->clk.ctx, &rl->cv, &rl->mu, wake); /* any return: the loop re-checks */
  }
  if (waited) {
    rl->st.waits++;
    rl->st.wait_s += (double)(rl_now(rl) - t0) * 1e-9;
  }
  if (st != NB_OK) {
    pthread_mutex_unlock(&rl->mu);
    return st;
  }
granted:
  rl->st.bytes += bytes;
  rl->st.acquires++;
  pthread_mutex_unlock(&rl->mu);
  return NB_OK;
}

nb_status_t nb_ratelimit_acquire(nb_ratelimit_t* rl, size_t bytes) {
  return rl_acquire(rl, bytes, -1);
}

nb_status_t nb_ratelimit_acquire_until(nb_ratelimit_t* rl, size_t bytes, int64_t deadline_ns) {
  if (deadline_ns < 0) return nb_error(NB_ERR_INVALID, "rate limit: negative deadline");
  return rl_acquire(rl, bytes, deadline_ns);
}

int nb_ratelimit_try_acquire(nb_ratelimit_t* rl, size_t bytes) {
  if (!rl) return 0;
  int ok = 0;
  pthread_mutex_lock(&rl->mu);
  if (!rl->cancelled) {
    rl_refill(rl, rl_now(rl));
    double n = (double)bytes;
    if (rl->rate == 0.0 || rl->allowed - rl->issued >= n) {
      rl->issued += n;
      if (rl->rate == 0.0) rl->allowed = rl->issued;
      rl->st.bytes += bytes;
      rl->st.acquires++;
      ok = 1;
    }
  }
  pthread_mutex_unlock(&rl->mu);
  return ok;
}

void nb_ratelimit_cancel(nb_ratelimit_t* rl) {
  if (!rl) return;
  pthread_mutex_lock(&rl->mu);
  rl->cancelled = 1;
  pthread_cond_broadcast(&rl->cv);
  pthread_mutex_unlock(&rl->mu);
}

void nb_ratelimit_stats(nb_ratelimit_t* rl, nb_ratelimit_stats_t* out) {
  if (!out) return;
  memset(out, 0, sizeof *out);
  if (!rl) return;
  pthread_mutex_lock(&rl->mu);
  *out = rl->st;
  out->rate_Bps = rl->rate;
  out->burst_bytes = rl->burst;
  pthread_mutex_unlock(&rl->mu);
}
