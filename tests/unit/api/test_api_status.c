/* The status values a user's program sees (api_status_public.c: nebula.h alone) against those of
 * nebula's internals (common/status.h, which takes them from nebula.h): every value must agree,
 * and the count too (a second definition of the enum that drifted would fail here). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/status.h"

extern const int api_status_public[];
extern const int api_status_public_n;

static void test_same_values(void** state) {
  (void)state;
  const int internal[] = {NB_OK,
                          NB_ERR_INVALID,
                          NB_ERR_SYSTEM,
                          NB_ERR_NOMEM,
                          NB_ERR_CUDA,
                          NB_ERR_NCCL,
                          NB_ERR_MPI,
                          NB_ERR_RPC,
                          NB_ERR_CRYPTO,
                          NB_ERR_INTEGRITY,
                          NB_ERR_CODEC,
                          NB_ERR_TIMEOUT,
                          NB_ERR_REMOTE,
                          NB_ERR_UNSUPPORTED,
                          NB_ERR_NOT_FOUND,
                          NB_ERR_EXISTS,
                          NB_ERR_PERMISSION,
                          NB_ERR_CONFIG,
                          NB_ERR_IO,
                          NB_ERR_CANCELLED,
                          NB_ERR_UNAVAILABLE,
                          NB_ERR_INTERNAL,
                          NB_STATUS_COUNT_};
  int n = (int)(sizeof internal / sizeof internal[0]);
  assert_int_equal(api_status_public_n, n);
  for (int i = 0; i < n; i++) assert_int_equal(api_status_public[i], internal[i]);
  /* every internal status has a name in the list: the count is the last value + 1 */
  assert_int_equal(internal[n - 1], n - 1);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(test_same_values)};
  return cmocka_run_group_tests(tests, NULL, NULL);
}
