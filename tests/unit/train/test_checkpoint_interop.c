/* Interop: our checkpoint read by the Python reference implementation (safetensors + numpy),
 * every tensor compared bit for bit, and a file written by safetensors.numpy.save_file read back
 * by our loader. Exits 77 (skip) when python3 or the packages are missing. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kernels/device.h"
#include "train/checkpoint.h"
#include "train/model.h"

#define FAIL(...)                 \
  do {                            \
    fprintf(stderr, __VA_ARGS__); \
    fputc('\n', stderr);          \
    rc = 1;                       \
    goto done;                    \
  } while (0)

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: %s check_safetensors.py\n", argv[0]);
    return 2;
  }
  int rc = 0;
  char dir[256], ckpt[300], raw[300], man[300], back[300];
  snprintf(dir, sizeof dir, "%s/nb_interop_XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
  if (!mkdtemp(dir)) return 1;
  snprintf(ckpt, sizeof ckpt, "%s/model.safetensors", dir);
  snprintf(raw, sizeof raw, "%s/arena.f32", dir);
  snprintf(man, sizeof man, "%s/manifest.txt", dir);
  snprintf(back, sizeof back, "%s/back.safetensors", dir);
  nb_model_config_t cfg = nb_model_config_make(2, 32, 4, 64);
  nb_model_t *m = NULL, *r = NULL;
  if (nb_model_create(&cfg, 2024, &m) != NB_OK) FAIL("create: %s", nb_error_last());
  size_t n;
  float* p = nb_model_params(m, &n);
  p[5] = -0.0f;
  p[6] = 3.4e38f;
  p[7] = 1e-42f; /* subnormal */
  if (nb_checkpoint_save(ckpt, m, 123) != NB_OK) FAIL("save: %s", nb_error_last());
  FILE* f = fopen(raw, "wb");
  fwrite(p, sizeof(float), n, f);
  fclose(f);
  f = fopen(man, "w");
  for (size_t i = 0; i < nb_model_num_tensors(m); i++) {
    const nb_tensor_view_t* v = nb_model_tensor(m, i);
    fprintf(f, "%s %zu %d", v->name, v->offset, v->shape[0]);
    if (v->ndim == 2) fprintf(f, " %d", v->shape[1]);
    fputc('\n', f);
  }
  fclose(f);

  pid_t pid = fork();
  if (pid == 0) {
    execlp("python3", "python3", argv[1], ckpt, raw, man, back, (char*)NULL);
    _exit(77); /* no python3: skip */
  }
  int ws = 0;
  waitpid(pid, &ws, 0);
  int prc = WIFEXITED(ws) ? WEXITSTATUS(ws) : 1;
  if (prc == 77) {
    printf("python3 with safetensors + numpy not available: skipped\n");
    rc = NB_TEST_SKIP_CODE;
    goto done;
  }
  if (prc != 0) FAIL("python side failed (%d)", prc);

  long step = 0;
  if (nb_checkpoint_load(back, &r, &step) != NB_OK)
    FAIL("loading the file written by safetensors: %s", nb_error_last());
  if (step != 123 || memcmp(nb_model_params(r, NULL), p, n * sizeof(float)) != 0)
    FAIL("file written by safetensors: step %ld or values differ", step);
  printf("file written by safetensors.numpy.save_file loaded bit-exact (step %ld)\n", step);
done:
  nb_model_destroy(m);
  nb_model_destroy(r);
  unlink(ckpt), unlink(raw), unlink(man), unlink(back);
  rmdir(dir);
  return rc;
}
