/* `nebula bench torch`: the PyTorch GPT of examples/torch three ways (single, ddp, nebula): the
 * measurement is bench/torch_e2e.py's (PyTorch is Python); this finds it, tells it which nebula,
 * libnebula and delay line to use (the ones beside this executable unless the environment names
 * others), and runs it with the same arguments. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench/bench.h"
#include "common/common.h"
#include "common/install.h"

/* dir/rel/name when it exists: 1 (in out), else 0 */
static int nb__bt_find(const char* dir, const char* rel, const char* name, char* out, size_t cap) {
  if (snprintf(out, cap, "%s/%s%s%s", dir, rel, rel[0] ? "/" : "", name) >= (int)cap) return 0;
  return access(out, R_OK) == 0;
}

int nb_bench_torch_main(int argc, char** argv) {
  char exe[4096], dir[4096], script[8400], lib[8400], dl[8400];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) {
    fprintf(stderr, "nebula bench torch: cannot find this executable: %s\n", strerror(errno));
    return 1;
  }
  exe[n] = 0;
  snprintf(dir, sizeof dir, "%s", exe);
  char* slash = strrchr(dir, '/');
  if (slash) *slash = 0;
  const char* env = getenv("NB_BENCH_DIR");
  int found = env && *env && nb__bt_find(env, "", "torch_e2e.py", script, sizeof script);
  static const char* const rel[] = {"../bench", "../../bench", "../share/nebula/bench"};
  for (size_t i = 0; !found && i < sizeof rel / sizeof rel[0]; i++)
    found = nb__bt_find(dir, rel[i], "torch_e2e.py", script, sizeof script);
  if (!found) {
    fprintf(stderr,
            "nebula bench torch: bench/torch_e2e.py not found next to %s (set NB_BENCH_DIR to "
            "the source tree's bench/)\n",
            exe);
    return 1;
  }
  setenv("NEBULA_EXE", exe, 0);
  if (nb__bt_find(dir, "lib", "libnebula.so", lib, sizeof lib) ||
      nb__bt_find(dir, "../lib", "libnebula.so", lib, sizeof lib))
    setenv("NEBULA_LIB", lib, 0);
  if (nb_install_delayline(NULL, dl, sizeof dl, NULL, 0) == NB_OK) setenv("NB_DELAYLINE", dl, 0);
  const char* py = getenv("PYTHON");
  if (!py || !*py) py = "python3";
  const char** av = NULL;
  if (nb_calloc((void**)&av, (size_t)argc + 3, sizeof *av, "arguments") != NB_OK) {
    fprintf(stderr, "nebula bench torch: %s\n", nb_error_last());
    return 1;
  }
  av[0] = py;
  av[1] = script;
  for (int i = 1; i < argc; i++) av[i + 1] = argv[i];
  av[argc + 1] = NULL;
  fflush(stdout);
  execvp(py, (char* const*)av);
  fprintf(stderr, "nebula bench torch: cannot run %s: %s\n", py, strerror(errno));
  nb_free(av);
  return 1;
}
