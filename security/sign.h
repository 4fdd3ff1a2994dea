/* Signatures of byte strings (job descriptors) by a user's EC key: ECDSA P-256 with SHA-256
 * (EVP_DigestSign), verified against the user's certificate, which must itself verify against
 * the federation CA; and strict base64 for carrying signatures in JSON. What exactly is signed
 * (the canonical bytes of a descriptor) is the caller's business, not this file's. */
#ifndef NB_SECURITY_SIGN_H
#define NB_SECURITY_SIGN_H

#include <openssl/evp.h>
#include <openssl/x509.h>
#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "security/pki.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Signs data[0..len) with `key` (borrowed; an EC key). *sig receives a DER ECDSA signature
 * (at most 72 bytes for P-256) that the caller frees with nb_free; *sig_len its length.
 * NB_ERR_INVALID (NULL, not an EC key), NB_ERR_CRYPTO. Thread-safe for distinct outputs. */
nb_status_t nb_sign_data(EVP_PKEY* key, const void* data, size_t len, uint8_t** sig,
                         size_t* sig_len);

/* Verifies that `sig` is a signature of data by the holder of `user_cert`, and that user_cert is
 * a currently valid user certificate (clientAuth, identity nebula://user/NAME) from `ca`. All
 * pointers borrowed. If expect_user is non-NULL the certificate must name that user. On NB_OK,
 * *who (if non-NULL) receives the signer's identity.
 * Returns NB_OK; NB_ERR_PERMISSION (certificate not from the CA, expired, not a user
 * certificate, or another user than expect_user); NB_ERR_INTEGRITY (the signature does not
 * match the data and certificate: tampered data or signature, or signed by someone else);
 * NB_ERR_INVALID (NULL arguments). Thread-safe. */
nb_status_t nb_sign_verify(X509* user_cert, X509* ca, const void* data, size_t len,
                           const uint8_t* sig, size_t sig_len, const char* expect_user,
                           nb_pki_identity_t* who);

/* Convenience for JSON: sign and return the signature as NUL-terminated base64 (caller frees
 * with nb_free). */
nb_status_t nb_sign_data_b64(EVP_PKEY* key, const void* data, size_t len, char** sig_b64);

/* Convenience for JSON: as nb_sign_verify with the certificate as PEM text (cert_pem, len 0 =
 * NUL-terminated) and the signature in base64. A certificate that is not PEM or a signature that
 * is not base64 gives NB_ERR_INVALID. */
nb_status_t nb_sign_verify_b64(const char* cert_pem, size_t cert_len, X509* ca, const void* data,
                               size_t len, const char* sig_b64, const char* expect_user,
                               nb_pki_identity_t* who);

/* Standard base64 (RFC 4648, with '=' padding, no line breaks). *out is NUL-terminated, caller
 * frees with nb_free. */
nb_status_t nb_b64_encode(const void* data, size_t len, char** out);

/* Strict decoding of the above: only the alphabet, length a multiple of 4, padding only at the
 * end; anything else is NB_ERR_INVALID naming the offending position. len 0 = NUL-terminated.
 * *out (caller frees with nb_free; never NULL on NB_OK) receives *out_len bytes. */
nb_status_t nb_b64_decode(const char* text, size_t len, uint8_t** out, size_t* out_len);

#ifdef __cplusplus
}
#endif
#endif
