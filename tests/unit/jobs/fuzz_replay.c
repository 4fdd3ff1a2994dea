/* Replays files (or every file in folders) through the descriptor fuzz target without libFuzzer,
 * so the bad corpus and the examples run through the fuzz harness in every build. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

static int replay_file(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "cannot open %s\n", path);
    return 1;
  }
  static uint8_t buf[1 << 21];
  size_t n = fread(buf, 1, sizeof buf, f);
  fclose(f);
  LLVMFuzzerTestOneInput(buf, n);
  return 0;
}

int main(int argc, char** argv) {
  int files = 0, bad = 0;
  for (int i = 1; i < argc; i++) {
    struct stat sb;
    if (stat(argv[i], &sb) != 0) {
      fprintf(stderr, "cannot stat %s\n", argv[i]);
      return 1;
    }
    if (!S_ISDIR(sb.st_mode)) {
      bad += replay_file(argv[i]);
      files++;
      continue;
    }
    DIR* d = opendir(argv[i]);
    struct dirent* e;
    while (d && (e = readdir(d))) {
      if (e->d_name[0] == '.') continue;
      char p[4096];
      snprintf(p, sizeof p, "%s/%s", argv[i], e->d_name);
      bad += replay_file(p);
      files++;
    }
    if (d) closedir(d);
  }
  printf("replayed %d inputs through the descriptor fuzz target\n", files);
  return bad || files == 0 ? 1 : 0;
}
