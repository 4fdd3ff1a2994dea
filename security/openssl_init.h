/* OpenSSL's process-wide set-up for nebula: OpenSSL is told, before anything else of it runs in
 * the process, not to tear itself down in an atexit handler. gRPC's threads use OpenSSL and may
 * still be ending when the process exits; after OpenSSL's atexit clean-up a thread that ends
 * no longer frees its per-thread error state (the thread-stop key is gone), which is a real
 * leak, and under LeakSanitizer a process that exited cleanly then exits 1. Without the
 * clean-up the state of a live thread stays reachable and an ending one frees its own. */
#ifndef NB_SECURITY_OPENSSL_INIT_H
#define NB_SECURITY_OPENSSL_INIT_H

#ifdef __cplusplus
extern "C" {
#endif

/* Idempotent and thread-safe; also run by a constructor when this object is linked in. Every
 * entry point of security/ that starts OpenSSL calls it first. */
void nb_openssl_init(void);

#ifdef __cplusplus
}
#endif
#endif
