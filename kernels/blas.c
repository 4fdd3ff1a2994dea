/* Detection of OpenBLAS's kernel against the CPU's instruction sets (kernels/blas.h). It reads
 * and reports; it never sets OPENBLAS_CORETYPE (too late once OpenBLAS has loaded) and never
 * calls a BLAS routine. */
#include "kernels/blas.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "common/common.h"

/* Weak, so that a build against another CBLAS still links: the names are then NULL and the core
 * "" (not checked). Declared here rather than taken from <cblas.h>, which declares them strong. */
extern char* openblas_get_corename(void) __attribute__((weak));
extern char* openblas_get_config(void) __attribute__((weak));

NB_PARAM_STRING(DebugBlasCorename, "NB_DEBUG_BLAS_CORENAME", "",
                "tests: the OpenBLAS core name to assume instead of the one OpenBLAS reports "
                "(e.g. Prescott, to simulate its generic kernel on any CPU)")

/* OpenBLAS's x86 core names (driver/others/dynamic.c) by the instruction set their kernels use. */
static const struct {
  const char* name;
  nb_blas_isa_t isa;
} nb__blas_cores[] = {
    {"Katmai", NB_BLAS_ISA_SSE},
    {"Coppermine", NB_BLAS_ISA_SSE},
    {"Northwood", NB_BLAS_ISA_SSE},
    {"Prescott", NB_BLAS_ISA_SSE},
    {"Banias", NB_BLAS_ISA_SSE},
    {"Atom", NB_BLAS_ISA_SSE},
    {"Core2", NB_BLAS_ISA_SSE},
    {"Penryn", NB_BLAS_ISA_SSE},
    {"Dunnington", NB_BLAS_ISA_SSE},
    {"Nehalem", NB_BLAS_ISA_SSE},
    {"Athlon", NB_BLAS_ISA_SSE},
    {"Opteron", NB_BLAS_ISA_SSE},
    {"Opteron_SSE3", NB_BLAS_ISA_SSE},
    {"Barcelona", NB_BLAS_ISA_SSE},
    {"Nano", NB_BLAS_ISA_SSE},
    {"Bobcat", NB_BLAS_ISA_SSE},
    {"Sandybridge", NB_BLAS_ISA_AVX},
    {"Bulldozer", NB_BLAS_ISA_AVX},
    {"Piledriver", NB_BLAS_ISA_AVX},
    {"Steamroller", NB_BLAS_ISA_AVX},
    {"Haswell", NB_BLAS_ISA_AVX2},
    {"Excavator", NB_BLAS_ISA_AVX2},
    {"Zen", NB_BLAS_ISA_AVX2},
    {"SkylakeX", NB_BLAS_ISA_AVX512},
    {"Cooperlake", NB_BLAS_ISA_AVX512_BF16},
    {"SapphireRapids", NB_BLAS_ISA_AVX512_BF16},
};

nb_blas_isa_t nb_blas_core_isa(const char* core) {
  if (!core || !core[0]) return NB_BLAS_ISA_UNKNOWN;
  for (size_t i = 0; i < sizeof nb__blas_cores / sizeof nb__blas_cores[0]; i++)
    if (!strcasecmp(core, nb__blas_cores[i].name)) return nb__blas_cores[i].isa;
  return NB_BLAS_ISA_UNKNOWN;
}

static void nb__blas_cpu(nb_blas_cpu_t* c) {
  memset(c, 0, sizeof *c);
#if defined(__x86_64__) || defined(__i386__)
  /* libgcc's answers include the OS's part: AVX-512 counts only when XCR0 enables its state */
  __builtin_cpu_init();
  c->avx = __builtin_cpu_supports("avx") != 0;
  c->avx2 = __builtin_cpu_supports("avx2") != 0;
  c->fma = __builtin_cpu_supports("fma") != 0;
  c->avx512f = __builtin_cpu_supports("avx512f") != 0;
  c->avx512bw = __builtin_cpu_supports("avx512bw") != 0;
  c->avx512vl = __builtin_cpu_supports("avx512vl") != 0;
  c->avx512dq = __builtin_cpu_supports("avx512dq") != 0;
  c->avx512cd = __builtin_cpu_supports("avx512cd") != 0;
  c->avx512bf16 = __builtin_cpu_supports("avx512bf16") != 0;
  c->amd = __builtin_cpu_is("amd") != 0;
#endif
}

const char* nb_blas_best_coretype(const nb_blas_cpu_t* c, nb_blas_isa_t* isa) {
  nb_blas_isa_t level = NB_BLAS_ISA_UNKNOWN;
  const char* best = "";
  int skx = c->avx512f && c->avx512bw && c->avx512vl && c->avx512dq && c->avx512cd;
  if (skx && c->avx512bf16) {
    level = NB_BLAS_ISA_AVX512_BF16;
    best = "Cooperlake";
  } else if (skx) {
    level = NB_BLAS_ISA_AVX512;
    best = "SkylakeX";
  } else if (c->avx2 && c->fma) {
    level = NB_BLAS_ISA_AVX2;
    best = c->amd ? "Zen" : "Haswell"; /* what OpenBLAS's own detection picks per vendor */
  } else if (c->avx) {
    level = NB_BLAS_ISA_AVX;
  } else {
#if defined(__x86_64__) || defined(__i386__)
    level = NB_BLAS_ISA_SSE;
#endif
  }
  if (isa) *isa = level;
  return best;
}

int nb_blas_candidates(const nb_blas_cpu_t* c, const char** out, int max) {
  nb_blas_isa_t level;
  nb_blas_best_coretype(c, &level);
  const char* all[5];
  int n = 0;
#if defined(__x86_64__) || defined(__i386__)
  all[n++] = "Prescott";
#endif
  if (level >= NB_BLAS_ISA_AVX2) {
    all[n++] = "Haswell";
    all[n++] = "Zen";
  }
  if (level >= NB_BLAS_ISA_AVX512) all[n++] = "SkylakeX";
  if (level >= NB_BLAS_ISA_AVX512_BF16) all[n++] = "Cooperlake";
  int k = 0;
  for (int i = 0; i < n && k < max; i++) out[k++] = all[i];
  return k;
}

static void nb__blas_copy(char* dst, size_t cap, const char* src) {
  snprintf(dst, cap, "%s", src ? src : "");
  /* the names go into log lines: keep them printable */
  for (char* p = dst; *p; p++)
    if ((unsigned char)*p < 0x20 || (unsigned char)*p > 0x7e) *p = '?';
}

void nb_blas_detect(nb_blas_info_t* out) {
  memset(out, 0, sizeof *out);
  nb__blas_copy(out->user_coretype, sizeof out->user_coretype, getenv("OPENBLAS_CORETYPE"));
  /* the stand-in is for what OpenBLAS's own detection chose; with OPENBLAS_CORETYPE set OpenBLAS
   * did not detect, it loaded the type asked for, and the real name says whether that took */
  const char* debug = nb_param_DebugBlasCorename();
  if (debug && debug[0] && !out->user_coretype[0] && openblas_get_corename) {
    nb__blas_copy(out->core, sizeof out->core, debug);
  } else if (openblas_get_corename) {
    nb__blas_copy(out->core, sizeof out->core, openblas_get_corename());
  }
  if (openblas_get_config) nb__blas_copy(out->config, sizeof out->config, openblas_get_config());
  out->dynamic = strstr(out->config, "DYNAMIC_ARCH") != NULL;
  nb__blas_cpu(&out->cpu);
  out->core_isa = nb_blas_core_isa(out->core);
  nb__blas_copy(out->best, sizeof out->best, nb_blas_best_coretype(&out->cpu, &out->cpu_isa));
  out->generic = (out->core_isa == NB_BLAS_ISA_SSE || out->core_isa == NB_BLAS_ISA_AVX) &&
                 out->cpu_isa >= NB_BLAS_ISA_AVX2;
}

static const char* nb__blas_isa_name(nb_blas_isa_t isa) {
  switch (isa) {
    case NB_BLAS_ISA_SSE:
      return "SSE only";
    case NB_BLAS_ISA_AVX:
      return "AVX (no AVX2)";
    case NB_BLAS_ISA_AVX2:
      return "AVX2";
    case NB_BLAS_ISA_AVX512:
      return "AVX-512";
    case NB_BLAS_ISA_AVX512_BF16:
      return "AVX-512 + BF16";
    default:
      return "an unknown instruction set";
  }
}

const char* nb_blas_describe(const nb_blas_info_t* b, char* buf, size_t cap) {
  if (!buf || cap == 0) return buf;
  const char* cpu = nb__blas_isa_name(b->cpu_isa);
  if (!b->core[0]) {
    snprintf(buf, cap, "blas: not OpenBLAS (no core name to check) on a CPU with %s", cpu);
  } else if (!b->generic) {
    snprintf(buf, cap, "blas: OpenBLAS kernel %s (%s) on a CPU with %s%s%s", b->core,
             nb__blas_isa_name(b->core_isa), cpu, b->user_coretype[0] ? ", OPENBLAS_CORETYPE=" : "",
             b->user_coretype);
  } else if (!b->dynamic) {
    snprintf(buf, cap,
             "blas: OpenBLAS runs its generic %s kernel on a CPU with %s, and this OpenBLAS is not "
             "a DYNAMIC_ARCH build (OPENBLAS_CORETYPE cannot change it): matrix products run at a "
             "fraction of this CPU's speed; install an OpenBLAS built for it",
             b->core, cpu);
  } else if (b->user_coretype[0]) {
    snprintf(buf, cap,
             "blas: OpenBLAS runs its generic %s kernel on a CPU with %s, as OPENBLAS_CORETYPE=%s "
             "in the environment asks (or OpenBLAS does not know that name); unset it or set "
             "OPENBLAS_CORETYPE=%s for this CPU's speed",
             b->core, cpu, b->user_coretype, b->best);
  } else {
    snprintf(buf, cap,
             "blas: OpenBLAS runs its generic %s kernel on a CPU with %s: matrix products run at a "
             "fraction of this CPU's speed; set OPENBLAS_CORETYPE=%s in the environment before the "
             "program starts (OpenBLAS reads it only when it loads)",
             b->core, cpu, b->best);
  }
  return buf;
}
