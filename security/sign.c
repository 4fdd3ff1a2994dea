/* ECDSA P-256/SHA-256 signatures of byte strings with EVP_DigestSign/Verify, the certificate
 * checks that make a signature mean "this user of this federation", and strict base64. It does
 * not canonicalise JSON: callers sign exactly the bytes they will verify. */
#include "security/sign.h"

#include <limits.h>
#include <openssl/err.h>
#include <string.h>

#include "common/common.h"

static nb_status_t nb__check_ec(EVP_PKEY* key) {
  if (EVP_PKEY_get_base_id(key) != EVP_PKEY_EC)
    return nb_error(NB_ERR_INVALID, "signing key is %s, expected an EC (P-256) key",
                    EVP_PKEY_get0_type_name(key) ? EVP_PKEY_get0_type_name(key) : "unknown");
  return NB_OK;
}

nb_status_t nb_sign_data(EVP_PKEY* key, const void* data, size_t len, uint8_t** sig,
                         size_t* sig_len) {
  if (!key || (len && !data) || !sig || !sig_len) return nb_error(NB_ERR_INVALID, "NULL argument");
  *sig = NULL;
  *sig_len = 0;
  NB_CHECK(nb__check_ec(key));
  nb_status_t st = NB_OK;
  uint8_t* buf = NULL;
  size_t n = 0;
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  if (!md || EVP_DigestSignInit_ex(md, NULL, "SHA256", NULL, NULL, key, NULL) != 1 ||
      EVP_DigestSign(md, NULL, &n, data, len) != 1) {
    st = nb__ossl_error(NB_ERR_CRYPTO, "ECDSA signing");
    goto done;
  }
  NB_CHECK_GOTO(nb_alloc((void**)&buf, n, 1, "signature"), st, done);
  if (EVP_DigestSign(md, buf, &n, data, len) != 1) {
    st = nb__ossl_error(NB_ERR_CRYPTO, "ECDSA signing");
    nb_free(buf);
    goto done;
  }
  *sig = buf;
  *sig_len = n;
done:
  EVP_MD_CTX_free(md);
  return st;
}

nb_status_t nb_sign_verify(X509* user_cert, X509* ca, const void* data, size_t len,
                           const uint8_t* sig, size_t sig_len, const char* expect_user,
                           nb_pki_identity_t* who) {
  if (!user_cert || !ca || (len && !data) || (sig_len && !sig))
    return nb_error(NB_ERR_INVALID, "NULL argument");
  if (who) memset(who, 0, sizeof *who);
  nb_pki_identity_t expect = {.kind = NB_PKI_USER}, got;
  if (expect_user) {
    if (nb_pki_name_check(expect_user, "expected user name") != NB_OK) return NB_ERR_INVALID;
    snprintf(expect.name, sizeof expect.name, "%s", expect_user);
  }
  NB_CHECK(nb_pki_cert_verify(user_cert, ca, NB_PKI_USAGE_CLIENT, NULL));
  if (nb_pki_identity_from_cert(user_cert, &got) != NB_OK)
    return nb_error_wrap(NB_ERR_PERMISSION, "signer certificate");
  if (got.kind != NB_PKI_USER)
    return nb_error(NB_ERR_PERMISSION, "signer certificate is %s '%s', not a user",
                    nb_pki_kind_name(got.kind), got.name);
  if (expect_user && strcmp(got.name, expect.name) != 0)
    return nb_error(NB_ERR_PERMISSION, "signed by user '%s', expected user '%s'", got.name,
                    expect.name);

  EVP_PKEY* pub = X509_get0_pubkey(user_cert);
  if (!pub) return nb__ossl_error(NB_ERR_INVALID, "signer certificate has no usable public key");
  NB_CHECK(nb__check_ec(pub));
  nb_status_t st = NB_OK;
  EVP_MD_CTX* md = EVP_MD_CTX_new();
  if (!md || EVP_DigestVerifyInit_ex(md, NULL, "SHA256", NULL, NULL, pub, NULL) != 1) {
    st = nb__ossl_error(NB_ERR_CRYPTO, "ECDSA verification setup");
    goto done;
  }
  /* 1 = valid; 0 = wrong signature; < 0 = malformed signature: both are a failed check. */
  if (EVP_DigestVerify(md, sig, sig_len, data, len) != 1) {
    ERR_clear_error();
    st = nb_error(NB_ERR_INTEGRITY,
                  "signature does not match the data and the certificate of user '%s' (tampered "
                  "data or signature, or signed with another key)",
                  got.name);
    goto done;
  }
  if (who) *who = got;
done:
  EVP_MD_CTX_free(md);
  return st;
}

nb_status_t nb_sign_data_b64(EVP_PKEY* key, const void* data, size_t len, char** sig_b64) {
  if (!sig_b64) return nb_error(NB_ERR_INVALID, "NULL argument");
  *sig_b64 = NULL;
  uint8_t* sig = NULL;
  size_t n = 0;
  NB_CHECK(nb_sign_data(key, data, len, &sig, &n));
  nb_status_t st = nb_b64_encode(sig, n, sig_b64);
  nb_free(sig);
  return st;
}

nb_status_t nb_sign_verify_b64(const char* cert_pem, size_t cert_len, X509* ca, const void* data,
                               size_t len, const char* sig_b64, const char* expect_user,
                               nb_pki_identity_t* who) {
  if (!cert_pem || !sig_b64) return nb_error(NB_ERR_INVALID, "NULL argument");
  X509* cert = NULL;
  uint8_t* sig = NULL;
  size_t n = 0;
  nb_status_t st = nb_pki_cert_from_pem(cert_pem, cert_len, &cert);
  if (st != NB_OK) return nb_error_wrap(st, "signer certificate");
  st = nb_b64_decode(sig_b64, 0, &sig, &n);
  if (st != NB_OK) {
    st = nb_error_wrap(st, "signature");
    goto done;
  }
  st = nb_sign_verify(cert, ca, data, len, sig, n, expect_user, who);
done:
  nb_free(sig);
  X509_free(cert);
  return st;
}

nb_status_t nb_b64_encode(const void* data, size_t len, char** out) {
  if (!out || (len && !data)) return nb_error(NB_ERR_INVALID, "NULL argument");
  *out = NULL;
  if (len > (size_t)INT_MAX / 4 * 3 - 3) return nb_error(NB_ERR_INVALID, "base64 input too large");
  size_t n = 4 * ((len + 2) / 3);
  NB_CHECK(nb_alloc((void**)out, n + 1, 1, "base64 text"));
  int w = EVP_EncodeBlock((unsigned char*)*out, data, (int)len);
  (*out)[w < 0 ? 0 : w] = '\0';
  return NB_OK;
}

static int nb__b64_char(unsigned char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' ||
         c == '/';
}

nb_status_t nb_b64_decode(const char* text, size_t len, uint8_t** out, size_t* out_len) {
  if (!text || !out || !out_len) return nb_error(NB_ERR_INVALID, "NULL argument");
  *out = NULL;
  *out_len = 0;
  if (len == 0) len = strlen(text);
  if (len % 4) return nb_error(NB_ERR_INVALID, "base64 length %zu is not a multiple of 4", len);
  if (len > (size_t)INT_MAX) return nb_error(NB_ERR_INVALID, "base64 text too large");
  size_t pad = 0;
  if (len >= 1 && text[len - 1] == '=') pad++;
  if (len >= 2 && text[len - 2] == '=') pad++;
  for (size_t i = 0; i < len - pad; i++)
    if (!nb__b64_char((unsigned char)text[i]))
      return nb_error(NB_ERR_INVALID, "base64 text has an invalid character (byte 0x%02x) at %zu",
                      (unsigned char)text[i], i);
  size_t n = len / 4 * 3;
  NB_CHECK(nb_alloc((void**)out, n ? n : 1, 1, "base64 data"));
  if (len) {
    int w = EVP_DecodeBlock(*out, (const unsigned char*)text, (int)len);
    if (w < 0 || (size_t)w != n) {
      nb_free(*out);
      *out = NULL;
      return nb_error(NB_ERR_INVALID, "malformed base64 text");
    }
  }
  *out_len = n - pad; /* EVP_DecodeBlock counts padding as zero bytes */
  return NB_OK;
}
