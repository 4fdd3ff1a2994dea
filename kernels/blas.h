/* Which OpenBLAS kernel runs on this CPU, and whether it is a generic one (pre-AVX2: "Prescott"
 * and the like) on a CPU that has AVX2 or AVX-512, with the core type to ask for instead. Only
 * detection: OpenBLAS reads OPENBLAS_CORETYPE once, when it loads, so acting on the verdict
 * (re-executing with it set, warning) is the program's business (cli/nebula_main.c, api/). */
#ifndef NB_KERNELS_BLAS_H
#define NB_KERNELS_BLAS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Instruction-set level of a kernel or of a CPU, ordered. */
typedef enum {
  NB_BLAS_ISA_UNKNOWN = 0,     /* a core name we do not know (not x86, a newer OpenBLAS) */
  NB_BLAS_ISA_SSE = 1,         /* up to SSE4.2: Prescott, Core2, Nehalem, Barcelona, ... */
  NB_BLAS_ISA_AVX = 2,         /* AVX without AVX2: Sandybridge, Bulldozer, Piledriver, ... */
  NB_BLAS_ISA_AVX2 = 3,        /* AVX2 + FMA: Haswell, Zen, Excavator */
  NB_BLAS_ISA_AVX512 = 4,      /* AVX-512 F/BW/VL/DQ/CD: SkylakeX */
  NB_BLAS_ISA_AVX512_BF16 = 5, /* and AVX512_BF16: Cooperlake, SapphireRapids */
} nb_blas_isa_t;

/* What __builtin_cpu_supports says (1 = has it; all 0 off x86). */
typedef struct {
  int avx, avx2, fma, avx512f, avx512bw, avx512vl, avx512dq, avx512cd, avx512bf16;
  int amd; /* vendor AMD: OpenBLAS's AVX2 kernel for it is called Zen */
} nb_blas_cpu_t;

typedef struct {
  char core[32];          /* the kernel OpenBLAS runs (openblas_get_corename: "Haswell"), or
                             NB_DEBUG_BLAS_CORENAME when set and OPENBLAS_CORETYPE is not (the
                             stand-in for OpenBLAS's own detection); "" when no OpenBLAS is
                             loaded in this process */
  char config[160];       /* openblas_get_config ("OpenBLAS 0.3.21 ... DYNAMIC_ARCH ..."); "" */
  int dynamic;            /* 1: a DYNAMIC_ARCH build, where OPENBLAS_CORETYPE picks the kernel */
  char user_coretype[32]; /* OPENBLAS_CORETYPE as the environment had it; "" when unset */
  nb_blas_cpu_t cpu;
  nb_blas_isa_t core_isa; /* of the kernel, from its name */
  nb_blas_isa_t cpu_isa;  /* the best this CPU (and its OS) runs */
  int generic;            /* the verdict: a pre-AVX2 kernel (core_isa SSE or AVX) on a CPU whose
                             cpu_isa is AVX2 or better */
  char best[32];          /* the core type to ask for on this CPU ("Cooperlake", "SkylakeX", "Zen",
                             "Haswell"); "" when no AVX2 */
} nb_blas_info_t;

/* Fills *out for this process: reads OpenBLAS's core name and config (weakly linked: without
 * OpenBLAS both are ""), NB_DEBUG_BLAS_CORENAME (a test's stand-in for the core name),
 * OPENBLAS_CORETYPE and the CPU's features. Cheap; thread-safe. */
void nb_blas_detect(nb_blas_info_t* out);

/* The level of an OpenBLAS core name (case-insensitive); NB_BLAS_ISA_UNKNOWN for NULL, "" and
 * names not in OpenBLAS's x86 list. */
nb_blas_isa_t nb_blas_core_isa(const char* core);

/* The best core type for a CPU ("" below AVX2), and its level into *isa (nullable). */
const char* nb_blas_best_coretype(const nb_blas_cpu_t* cpu, nb_blas_isa_t* isa);

/* The core types worth measuring on this CPU, each one it can run: "Prescott" (the generic
 * baseline) first, then Haswell, Zen, SkylakeX, Cooperlake as the CPU allows. Writes up to max
 * static names into out and returns how many. */
int nb_blas_candidates(const nb_blas_cpu_t* cpu, const char** out, int max);

/* One line about *info into buf (cap bytes, always terminated): the kernel and the CPU and, when
 * generic, what to set ("... set OPENBLAS_CORETYPE=Cooperlake ..."). Returns buf. */
const char* nb_blas_describe(const nb_blas_info_t* info, char* buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
