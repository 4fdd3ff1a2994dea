/* `nebula certs`: the federation PKI from the command line (init a CA, issue cluster and user
 * certificates, show and verify a certificate). A thin layer over security/pki.h: all the work and
 * all the checks live there; this file only parses options and prints. */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "security/security.h"

enum { NB__EXIT_OK = 0, NB__EXIT_FAIL = 1, NB__EXIT_USAGE = 2 };

static void nb__certs_usage(FILE* f) {
  fprintf(
      f,
      "usage: nebula certs <command> [options]\n\n"
      "commands:\n"
      "  init   --dir D [--cn NAME] [--days N] [--force]\n"
      "         create the federation CA (EC P-256) as D/ca.key (0600) and D/ca.crt;\n"
      "         an existing CA is never replaced without --force\n"
      "  issue  --dir D (--cluster ID [--san IP-or-DNS ...] | --user NAME) [--days N] [--force]\n"
      "         issue a key and certificate signed by D's CA: D/clusters/ID.{key,crt} (TLS\n"
      "         server+client, SANs DNS:ID, URI:nebula://cluster/ID and each --san) or\n"
      "         D/users/NAME.{key,crt} (TLS client, URI:nebula://user/NAME)\n"
      "  show   FILE\n"
      "         print a certificate: subject, issuer, validity, SANs, identity, usages,\n"
      "         SHA-256 fingerprint\n"
      "  verify (--dir D | --ca CAFILE) [--cluster ID | --user NAME] [--usage server|client] FILE\n"
      "         check FILE against the CA (chain, validity, usage, identity)\n");
}

static int nb__fail(const char* cmd, nb_status_t st) {
  fprintf(stderr, "nebula certs %s: %s: %s\n", cmd, nb_status_name(st), nb_error_last());
  return NB__EXIT_FAIL;
}

static int nb__parse_days(const char* s, int* out) {
  char* end = NULL;
  long v = strtol(s, &end, 10);
  if (!*s || *end || v <= 0 || v > 36500) {
    fprintf(stderr, "nebula certs: --days takes a number of days in 1..36500, not '%s'\n", s);
    return 0;
  }
  *out = (int)v;
  return 1;
}

enum {
  OPT_DIR = 1,
  OPT_FORCE,
  OPT_DAYS,
  OPT_CN,
  OPT_CLUSTER,
  OPT_USER,
  OPT_SAN,
  OPT_CA,
  OPT_USAGE,
  OPT_HELP
};

static const struct option nb__opts[] = {{"dir", required_argument, NULL, OPT_DIR},
                                         {"force", no_argument, NULL, OPT_FORCE},
                                         {"days", required_argument, NULL, OPT_DAYS},
                                         {"cn", required_argument, NULL, OPT_CN},
                                         {"cluster", required_argument, NULL, OPT_CLUSTER},
                                         {"user", required_argument, NULL, OPT_USER},
                                         {"san", required_argument, NULL, OPT_SAN},
                                         {"ca", required_argument, NULL, OPT_CA},
                                         {"usage", required_argument, NULL, OPT_USAGE},
                                         {"help", no_argument, NULL, OPT_HELP},
                                         {NULL, 0, NULL, 0}};

#define NB__MAX_SANS 64

int nb_certs_main(int argc, char** argv) {
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
      !strcmp(argv[1], "help")) {
    nb__certs_usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? NB__EXIT_USAGE : NB__EXIT_OK;
  }
  const char* cmd = argv[1];
  if (strcmp(cmd, "init") && strcmp(cmd, "issue") && strcmp(cmd, "show") && strcmp(cmd, "verify")) {
    fprintf(stderr, "nebula certs: '%s' is not a certs command; see 'nebula certs --help'\n", cmd);
    return NB__EXIT_USAGE;
  }
  const char *dir = NULL, *cn = NULL, *cluster = NULL, *user = NULL, *ca = NULL, *usage = NULL;
  const char* sans[NB__MAX_SANS];
  size_t n_sans = 0;
  int force = 0, days = 0;
  optind = 0; /* full re-initialisation: nb_certs_main may run more than once per process */
  opterr = 0;
  int c;
  while ((c = getopt_long(argc - 1, argv + 1, "+", nb__opts, NULL)) != -1) {
    switch (c) {
      case OPT_DIR:
        dir = optarg;
        break;
      case OPT_FORCE:
        force = 1;
        break;
      case OPT_DAYS:
        if (!nb__parse_days(optarg, &days)) return NB__EXIT_USAGE;
        break;
      case OPT_CN:
        cn = optarg;
        break;
      case OPT_CLUSTER:
        cluster = optarg;
        break;
      case OPT_USER:
        user = optarg;
        break;
      case OPT_SAN:
        if (n_sans == NB__MAX_SANS) {
          fprintf(stderr, "nebula certs: at most %d --san\n", NB__MAX_SANS);
          return NB__EXIT_USAGE;
        }
        sans[n_sans++] = optarg;
        break;
      case OPT_CA:
        ca = optarg;
        break;
      case OPT_USAGE:
        usage = optarg;
        break;
      case OPT_HELP:
        nb__certs_usage(stdout);
        return NB__EXIT_OK;
      default:
        fprintf(stderr,
                "nebula certs %s: unknown or incomplete option '%s'; see 'nebula certs --help'\n",
                cmd, argv[optind] ? argv[optind] : "?");
        return NB__EXIT_USAGE;
    }
  }
  int npos = argc - 1 - optind;
  char** pos = argv + 1 + optind;
  nb_status_t st;

  if (!strcmp(cmd, "init")) {
    if (!dir || npos || cluster || user || n_sans || ca || usage) {
      fprintf(stderr, "nebula certs init: takes --dir D [--cn NAME] [--days N] [--force]\n");
      return NB__EXIT_USAGE;
    }
    st = nb_pki_dir_init(dir, cn, days, force);
    if (st != NB_OK) return nb__fail(cmd, st);
    printf("federation CA created: %s/ca.crt (key %s/ca.key, mode 0600)\n", dir, dir);
    return NB__EXIT_OK;
  }

  if (!strcmp(cmd, "issue")) {
    if (!dir || npos || !!cluster == !!user || cn || ca || usage || (user && n_sans)) {
      fprintf(stderr,
              "nebula certs issue: takes --dir D and exactly one of --cluster ID [--san X ...] "
              "or --user NAME\n");
      return NB__EXIT_USAGE;
    }
    nb_pki_issue_opts_t o = {.kind = cluster ? NB_PKI_CLUSTER : NB_PKI_USER,
                             .name = cluster ? cluster : user,
                             .sans = sans,
                             .n_sans = n_sans,
                             .days = days};
    st = nb_pki_dir_issue(dir, &o, force);
    if (st != NB_OK) return nb__fail(cmd, st);
    char kp[PATH_MAX], cp[PATH_MAX];
    nb_pki_path(dir, o.kind, o.name, "key", kp, sizeof kp);
    nb_pki_path(dir, o.kind, o.name, "crt", cp, sizeof cp);
    printf("%s certificate issued: %s (key %s, mode 0600)\n", nb_pki_kind_name(o.kind), cp, kp);
    return NB__EXIT_OK;
  }

  if (npos != 1 ||
      (!strcmp(cmd, "show") && (dir || ca || cluster || user || usage || n_sans || force))) {
    fprintf(stderr, "nebula certs %s: takes one certificate file; see 'nebula certs --help'\n",
            cmd);
    return NB__EXIT_USAGE;
  }
  X509* cert = NULL;
  st = nb_pki_cert_load(pos[0], &cert);
  if (st != NB_OK) return nb__fail(cmd, st);

  if (!strcmp(cmd, "show")) {
    char* text = NULL;
    st = nb_pki_cert_describe(cert, &text);
    X509_free(cert);
    if (st != NB_OK) return nb__fail(cmd, st);
    fputs(text, stdout);
    nb_free(text);
    return NB__EXIT_OK;
  }

  /* verify */
  int rc = NB__EXIT_USAGE;
  X509* cacert = NULL;
  char cap[PATH_MAX];
  nb_pki_usage_t u = NB_PKI_USAGE_ANY;
  nb_pki_identity_t expect = {0};
  if (!!dir == !!ca || (cluster && user) || n_sans || force || cn) {
    fprintf(stderr, "nebula certs verify: takes exactly one of --dir D or --ca CAFILE\n");
    goto out;
  }
  if (usage && !strcmp(usage, "server"))
    u = NB_PKI_USAGE_SERVER;
  else if (usage && !strcmp(usage, "client"))
    u = NB_PKI_USAGE_CLIENT;
  else if (usage) {
    fprintf(stderr, "nebula certs verify: --usage is server or client, not '%s'\n", usage);
    goto out;
  }
  if (cluster || user) {
    expect.kind = cluster ? NB_PKI_CLUSTER : NB_PKI_USER;
    if (strlen(cluster ? cluster : user) > NB_PKI_NAME_MAX) {
      fprintf(stderr, "nebula certs verify: name too long\n");
      goto out;
    }
    snprintf(expect.name, sizeof expect.name, "%s", cluster ? cluster : user);
  }
  if (dir && nb_pki_path(dir, NB_PKI_NONE, NULL, "crt", cap, sizeof cap) != NB_OK) {
    rc = nb__fail(cmd, NB_ERR_INVALID);
    goto out;
  }
  st = nb_pki_cert_load(dir ? cap : ca, &cacert);
  if (st == NB_OK) st = nb_pki_cert_verify(cert, cacert, u, (cluster || user) ? &expect : NULL);
  if (st != NB_OK) {
    rc = nb__fail(cmd, st);
    goto out;
  }
  /* The CA signed it, but a certificate without a nebula identity URI is refused by every
   * gateway and exchange (docs/security.md, Identity), so it does not pass here either. */
  nb_pki_identity_t id;
  st = nb_pki_identity_from_cert(cert, &id);
  if (st != NB_OK) {
    fprintf(stderr,
            "nebula certs verify: %s: %s: %s: no nebula endpoint accepts it (a CN alone is no "
            "identity; see docs/security.md, Identity)\n",
            pos[0], nb_status_name(NB_ERR_PERMISSION), nb_error_last());
    rc = NB__EXIT_FAIL;
    goto out;
  }
  printf("%s: OK (%s %s)\n", pos[0], nb_pki_kind_name(id.kind), id.name);
  rc = NB__EXIT_OK;
out:
  X509_free(cacert);
  X509_free(cert);
  return rc;
}
