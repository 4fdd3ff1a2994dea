/* See openssl_init.h. */
#include "security/openssl_init.h"

#include <openssl/crypto.h>
#include <pthread.h>

static pthread_once_t nb__openssl_once = PTHREAD_ONCE_INIT;

static void nb__openssl_once_fn(void) {
  /* the first initialisation of the process decides: no atexit handler */
  OPENSSL_init_crypto(OPENSSL_INIT_NO_ATEXIT, NULL);
}

void nb_openssl_init(void) {
  pthread_once(&nb__openssl_once, nb__openssl_once_fn);
}

/* at load time, before main and before any library loaded after this one can use OpenSSL */
__attribute__((constructor)) static void nb__openssl_ctor(void) {
  nb_openssl_init();
}
