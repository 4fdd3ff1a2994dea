/* `nebula certs`: the federation PKI from the command line (init a CA, issue cluster and user
 * certificates, show and verify a certificate). A thin layer over security/pki.h: all the work and
 * all the checks live there; this file only parses options (common/opts.h) and prints. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "common/opts.h"
#include "common/common.h"
#include "security/security.h"

/* What `nebula certs --help` prints before the options. */
static const char nb__certs_about[] =

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
    "         check FILE against the CA (chain, validity, usage, identity)";

static int nb__fail(const char* cmd, nb_status_t st) {
  fprintf(stderr, "nebula certs %s: %s: %s\n", cmd, nb_status_name(st), nb_error_last());
  return NB_EXIT_FAIL;
}

#define NB__MAX_SANS 64

/* What the options of `nebula certs <cmd>` said. */
typedef struct {
  const char* cmd;
  const char *dir, *cn, *cluster, *user, *ca, *usage, *file;
  const char** sans;
  size_t n_sans;
  int force, days;
} nb__certs_opts_t;

static int nb__certs_init(const nb__certs_opts_t* o) {
  const char *dir = o->dir, *cluster = o->cluster, *user = o->user, *ca = o->ca;
  size_t n_sans = o->n_sans;
  if (!dir || o->file || cluster || user || n_sans || ca || o->usage) {
    fprintf(stderr, "nebula certs init: takes --dir D [--cn NAME] [--days N] [--force]\n");
    return NB_EXIT_USAGE;
  }
  nb_status_t st = nb_pki_dir_init(dir, o->cn, o->days, o->force);
  if (st != NB_OK) return nb__fail(o->cmd, st);
  printf("federation CA created: %s/ca.crt (key %s/ca.key, mode 0600)\n", dir, dir);
  return NB_EXIT_OK;
}

static int nb__certs_issue(const nb__certs_opts_t* o) {
  const char *dir = o->dir, *cluster = o->cluster, *user = o->user;
  size_t n_sans = o->n_sans;
  if (!dir || o->file || !!cluster == !!user || o->cn || o->ca || o->usage || (user && n_sans)) {
    fprintf(stderr,
            "nebula certs issue: takes --dir D and exactly one of --cluster ID [--san X ...] "
            "or --user NAME\n");
    return NB_EXIT_USAGE;
  }
  nb_pki_issue_opts_t io = {.kind = cluster ? NB_PKI_CLUSTER : NB_PKI_USER,
                            .name = cluster ? cluster : user,
                            .sans = o->sans,
                            .n_sans = n_sans,
                            .days = o->days};
  nb_status_t st = nb_pki_dir_issue(dir, &io, o->force);
  if (st != NB_OK) return nb__fail(o->cmd, st);
  char kp[PATH_MAX], cp[PATH_MAX];
  nb_pki_path(dir, io.kind, io.name, "key", kp, sizeof kp);
  nb_pki_path(dir, io.kind, io.name, "crt", cp, sizeof cp);
  printf("%s certificate issued: %s (key %s, mode 0600)\n", nb_pki_kind_name(io.kind), cp, kp);
  return NB_EXIT_OK;
}

/* show and verify: one certificate file. */
static int nb__certs_check(const nb__certs_opts_t* o) {
  const char* cmd = o->cmd;
  const char *dir = o->dir, *cn = o->cn, *cluster = o->cluster, *user = o->user, *ca = o->ca;
  const char* usage = o->usage;
  size_t n_sans = o->n_sans;
  int force = o->force;
  int npos = o->file ? 1 : 0;
  const char* pos[1] = {o->file};
  nb_status_t st;
  if (npos != 1 ||
      (!strcmp(cmd, "show") && (dir || ca || cluster || user || usage || n_sans || force))) {
    fprintf(stderr, "nebula certs %s: takes one certificate file; see 'nebula certs --help'\n",
            cmd);
    return NB_EXIT_USAGE;
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
    return NB_EXIT_OK;
  }

  /* verify */
  int rc = NB_EXIT_USAGE;
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
    rc = NB_EXIT_FAIL;
    goto out;
  }
  printf("%s: OK (%s %s)\n", pos[0], nb_pki_kind_name(id.kind), id.name);
  rc = NB_EXIT_OK;
out:
  X509_free(cacert);
  X509_free(cert);
  return rc;
}

int nb_certs_main(int argc, char** argv) {
  const char *dir = NULL, *cn = NULL, *cluster = NULL, *user = NULL, *ca = NULL, *usage = NULL;
  const char* sans[NB__MAX_SANS];
  const char* file = NULL;
  int n_sans_opt = 0, force = 0;
  long days_opt = 0;
  // clang-format off: one option per entry
  const nb_opt_t opts[] = {
      {.name = "dir", .kind = NB_OPT_STR, .dst = &dir, .meta = "D", .help = "the PKI folder"},
      {.name = "cn", .kind = NB_OPT_STR, .dst = &cn, .meta = "NAME", .help = "init: the CA's name"},
      {.name = "days",
       .kind = NB_OPT_LONG,
       .dst = &days_opt,
       .meta = "N",
       .min = 1,
       .max = 36500,
       .help = "validity in days (1..36500)"},
      {.name = "force",
       .kind = NB_OPT_FLAG,
       .dst = &force,
       .help = "replace an existing CA, key or certificate"},
      {.name = "cluster", .kind = NB_OPT_STR, .dst = &cluster, .meta = "ID", .help = "a cluster"},
      {.name = "user", .kind = NB_OPT_STR, .dst = &user, .meta = "NAME", .help = "a user"},
      {.name = "san",
       .kind = NB_OPT_LIST,
       .dst = (void*)sans,
       .meta = "IP-or-DNS",
       .count = &n_sans_opt,
       .max = NB__MAX_SANS,
       .help = "issue --cluster: one more subject alternative name (repeat)"},
      {.name = "ca", .kind = NB_OPT_STR, .dst = &ca, .meta = "CAFILE", .help = "verify: the CA"},
      {.name = "usage",
       .kind = NB_OPT_STR,
       .dst = &usage,
       .meta = "U",
       .help = "verify: the usage FILE must allow, server or client"},
      {.name = NULL},
  };
  // clang-format on
  const char* cmd = argc >= 2 ? argv[1] : "";
  char name[64];
  snprintf(name, sizeof name, "nebula certs %s", cmd);
  nb_cmd_spec_t spec = {.cmd = name,
                        .synopsis = "usage: nebula certs <command> [options]",
                        .about = nb__certs_about,
                        .arg_name = "FILE",
                        .arg = &file,
                        .opts = opts};
  if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
      !strcmp(argv[1], "help")) {
    nb_opts_help(&spec, argc < 2 ? stderr : stdout);
    return argc < 2 ? NB_EXIT_USAGE : NB_EXIT_OK;
  }
  if (strcmp(cmd, "init") && strcmp(cmd, "issue") && strcmp(cmd, "show") && strcmp(cmd, "verify")) {
    if (cmd[0] == '-') /* an option before the command: named without its value */
      fprintf(stderr, "nebula certs: unknown option '%.*s' (see nebula certs --help)\n",
              (int)strcspn(cmd, "="), cmd);
    else
      fprintf(stderr, "nebula certs: '%s' is not a certs command (see nebula certs --help)\n", cmd);
    return NB_EXIT_USAGE;
  }
  int prc = nb_opts_parse(&spec, argc - 1, argv + 1);
  if (prc != NB_OPTS_RUN) return prc;
  nb__certs_opts_t o = {
      cmd, dir, cn, cluster, user, ca, usage, file, sans, (size_t)n_sans_opt, force, (int)days_opt};
  if (!strcmp(cmd, "init")) return nb__certs_init(&o);
  if (!strcmp(cmd, "issue")) return nb__certs_issue(&o);
  return nb__certs_check(&o);
}
