/* Which vector code a CPU kernel runs: the portable one, AVX2 + FMA or AVX-512F, chosen once
 * from the CPU's flags or forced by the caller (tests run every path the CPU has). Only the
 * choice lives here; each kernel keeps its own vector code. */
#ifndef NB_KERNELS_CPU_PATH_H
#define NB_KERNELS_CPU_PATH_H

#ifdef __cplusplus
extern "C" {
#endif

/* AUTO takes the widest path the CPU has; a path the CPU (or the build) lacks runs the portable
 * one. Every path gives the same results within fp32 rounding, not to the bit. */
typedef enum {
  NB_CPU_PATH_AUTO = 0,
  NB_CPU_PATH_PORTABLE = 1,
  NB_CPU_PATH_AVX2 = 2,   /* AVX2 + FMA */
  NB_CPU_PATH_AVX512 = 3, /* AVX-512F */
} nb_cpu_path_t;

/* The path that runs when path is asked for. Thread-safe. */
nb_cpu_path_t nb_cpu_path_resolve(nb_cpu_path_t path);

/* 1 when path would run as asked on this CPU (AUTO and PORTABLE always). Thread-safe. */
int nb_cpu_path_supported(nb_cpu_path_t path);

/* "avx512", "avx2" or "portable": the name of the path path resolves to (static string). */
const char* nb_cpu_path_name(nb_cpu_path_t path);

#ifdef __cplusplus
}
#endif
#endif
