/* The CPU path choice: __builtin_cpu_supports on x86-64 with GCC or Clang, the portable path
 * everywhere else. No cached state: the builtin reads flags the runtime resolved at start-up. */
#include "kernels/cpu_path.h"

nb_cpu_path_t nb_cpu_path_resolve(nb_cpu_path_t path) {
#if defined(__x86_64__) && defined(__GNUC__)
  int avx512 = __builtin_cpu_supports("avx512f");
  int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (path == NB_CPU_PATH_AUTO) path = avx512 ? NB_CPU_PATH_AVX512 : NB_CPU_PATH_AVX2;
  if (path == NB_CPU_PATH_AVX512 && avx512) return NB_CPU_PATH_AVX512;
  if (path == NB_CPU_PATH_AVX2 && avx2) return NB_CPU_PATH_AVX2;
#endif
  return NB_CPU_PATH_PORTABLE;
}

int nb_cpu_path_supported(nb_cpu_path_t path) {
  return path == NB_CPU_PATH_AUTO || nb_cpu_path_resolve(path) == path;
}

const char* nb_cpu_path_name(nb_cpu_path_t path) {
  switch (nb_cpu_path_resolve(path)) {
    case NB_CPU_PATH_AVX512:
      return "avx512";
    case NB_CPU_PATH_AVX2:
      return "avx2";
    default:
      return "portable";
  }
}
