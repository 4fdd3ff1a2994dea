/* Strict decoding: every frame of the defect corpus is rejected with the right status and a
 * message naming the defect, and the destination is left untouched; the good frames decode.
 * `test_codec_frames --write-corpus DIR` writes the corpus as files for the fuzz target;
 * `--check-corpus DIR` checks that the checked-in files are exactly these frames. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bad_frames.h"
#include "common/common.h"
#include "compress/compress.h"

static void test_corpus(void** state) {
  (void)state;
  nb_test_frame_t* fr = NULL;
  size_t count = nb_test_frames_build(&fr), bad = 0;
  assert_true(count >= 40);
  nb_codec_t* c = NULL;
  assert_int_equal(nb_codec_create(NULL, &c), NB_OK);
  for (size_t i = 0; i < count; i++) {
    const nb_test_frame_t* f = &fr[i];
    uint64_t n = nb_test_frame_n(f->bytes, f->len);
    if (n > 100000 || f->len < 24) n = 1000;
    float* out = malloc(n * sizeof *out);
    float* before = malloc(n * sizeof *out);
    assert_true(out && before);
    for (uint64_t j = 0; j < n; j++) out[j] = before[j] = (float)j;
    nb_error_clear();
    nb_status_t st =
        nb_codec_decode_accumulate(i % 2 ? c : NULL, f->bytes, f->len, 1.0f, out, (size_t)n, NULL);
    if (st != f->want)
      fail_msg("%s: got %s (%s), want %s", f->name, nb_status_name(st), nb_error_last(),
               nb_status_name(f->want));
    if (f->needle && !strstr(nb_error_last(), f->needle))
      fail_msg("%s: message \"%s\" does not mention \"%s\"", f->name, nb_error_last(), f->needle);
    if (st != NB_OK) {
      bad++;
      if (memcmp(out, before, n * sizeof *out) != 0)
        fail_msg("%s: the destination changed although the frame was rejected", f->name);
      nb_frame_info_t info;
      nb_status_t st2 = nb_codec_frame_info(f->bytes, f->len, NULL, &info);
      assert_true(st2 == NB_OK || st2 == st); /* info checks the header part only */
    }
    free(out);
    free(before);
  }
  assert_true(bad >= 20);
  nb_codec_destroy(c);
  nb_test_frames_free(fr, count);
}

/* Decode limits are the caller's: the same good frame fails under tighter ones. */
static void test_limits(void** state) {
  (void)state;
  nb_test_frame_t* fr = NULL;
  size_t count = nb_test_frames_build(&fr);
  const nb_test_frame_t* good = &fr[0];
  assert_int_equal(good->want, NB_OK);
  float out[1000] = {0};
  nb_codec_limits_t lim;
  nb_codec_limits_default(&lim);
  lim.max_n = 999;
  assert_int_equal(nb_codec_decode_accumulate(NULL, good->bytes, good->len, 1, out, 1000, &lim),
                   NB_ERR_CODEC);
  assert_non_null(strstr(nb_error_last(), "limit"));
  nb_codec_limits_default(&lim);
  lim.max_frame_bytes = good->len - 1;
  assert_int_equal(nb_codec_decode_accumulate(NULL, good->bytes, good->len, 1, out, 1000, &lim),
                   NB_ERR_CODEC);
  nb_codec_limits_default(&lim);
  lim.max_raw_bytes = 10;
  assert_int_equal(nb_codec_decode_accumulate(NULL, good->bytes, good->len, 1, out, 1000, &lim),
                   NB_ERR_CODEC);
  nb_test_frames_free(fr, count);
}

static int write_corpus(const char* dir) {
  nb_test_frame_t* fr = NULL;
  size_t count = nb_test_frames_build(&fr);
  for (size_t i = 0; i < count; i++) {
    char path[1024];
    const char* kind = fr[i].want == NB_OK              ? "ok"
                       : fr[i].want == NB_ERR_INTEGRITY ? "integrity"
                                                        : "codec";
    const char* name = fr[i].name;
    if (strncmp(name, "ok-", 3) == 0) name += 3;
    snprintf(path, sizeof path, "%s/%s-%s.frame", dir, kind, name);
    FILE* f = fopen(path, "wb");
    if (!f || fwrite(fr[i].bytes, 1, fr[i].len, f) != fr[i].len) {
      perror(path);
      return 1;
    }
    fclose(f);
  }
  printf("wrote %zu frames to %s\n", count, dir);
  nb_test_frames_free(fr, count);
  return 0;
}

/* The checked-in corpus must hold exactly the frames built here: the base frames come from the
 * real encoder, so this pins the encoder's output bit for bit (default settings included). */
static int check_corpus(const char* dir) {
  nb_test_frame_t* fr = NULL;
  size_t count = nb_test_frames_build(&fr);
  int bad = 0;
  for (size_t i = 0; i < count; i++) {
    char path[1024];
    const char* kind = fr[i].want == NB_OK              ? "ok"
                       : fr[i].want == NB_ERR_INTEGRITY ? "integrity"
                                                        : "codec";
    const char* name = fr[i].name;
    if (strncmp(name, "ok-", 3) == 0) name += 3;
    snprintf(path, sizeof path, "%s/%s-%s.frame", dir, kind, name);
    FILE* f = fopen(path, "rb");
    uint8_t* b = malloc(fr[i].len + 1);
    size_t got = f && b ? fread(b, 1, fr[i].len + 1, f) : 0;
    if (f) fclose(f);
    if (!f || got != fr[i].len || memcmp(b, fr[i].bytes, fr[i].len) != 0) {
      fprintf(stderr, "FAIL %s: %s (regenerate with --write-corpus only if the format changed)\n",
              path, f ? "differs from the frame built now" : "missing");
      bad++;
    }
    free(b);
  }
  printf("%zu corpus frames checked, %d differ\n", count, bad);
  nb_test_frames_free(fr, count);
  return bad ? 1 : 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "--write-corpus") == 0) return write_corpus(argv[2]);
  if (argc == 3 && strcmp(argv[1], "--check-corpus") == 0) return check_corpus(argv[2]);
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_corpus),
      cmocka_unit_test(test_limits),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
