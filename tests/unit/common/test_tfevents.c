/* common/tfevents: CRC-32C against published vectors, TFRecord framing, the Event encoding byte
 * for byte, and the writer (a file read back frame by frame here; TensorBoard itself reads one in
 * tests/unit/worker/worker_tensorboard.sh). Not a test of TensorBoard. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/checksum.h"
#include "common/log.h"
#include "common/tfevents.h"

static uint32_t le32(const uint8_t* p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t* p) {
  return (uint64_t)le32(p) | (uint64_t)le32(p + 4) << 32;
}

/* RFC 3720 B.4 and the usual check value */
static void test_crc32c_vectors(void** state) {
  (void)state;
  uint8_t buf[32];
  assert_int_equal(nb_crc32c(0, "123456789", 9), 0xE3069283u);
  assert_int_equal(nb_crc32c(0, "", 0), 0);
  memset(buf, 0, sizeof buf);
  assert_int_equal(nb_crc32c(0, buf, 32), 0x8A9136AAu);
  memset(buf, 0xff, sizeof buf);
  assert_int_equal(nb_crc32c(0, buf, 32), 0x62A8AB43u);
  for (int i = 0; i < 32; i++) buf[i] = (uint8_t)i;
  assert_int_equal(nb_crc32c(0, buf, 32), 0x46DD794Eu);
  for (int i = 0; i < 32; i++) buf[i] = (uint8_t)(31 - i);
  assert_int_equal(nb_crc32c(0, buf, 32), 0x113FDB5Cu);
  /* continued over pieces = one shot; and it is not zlib's CRC-32 */
  assert_int_equal(nb_crc32c(nb_crc32c(0, "1234", 4), "56789", 5), 0xE3069283u);
  assert_true(nb_crc32c(0, "123456789", 9) != nb_crc32(0, "123456789", 9));
}

static void test_mask(void** state) {
  (void)state;
  assert_int_equal(nb_tfevents_mask_crc(0), 0xa282ead8u);
  assert_int_equal(nb_tfevents_mask_crc(0x12345678u), 0x4f730f40u);
}

static void test_frame(void** state) {
  (void)state;
  uint8_t out[64];
  assert_int_equal(nb_tfevents_frame("abc", 3, out, sizeof out), 3 + 16);
  assert_true(le64(out) == 3);
  assert_int_equal(le32(out + 8), nb_tfevents_mask_crc(nb_crc32c(0, out, 8)));
  assert_memory_equal(out + 12, "abc", 3);
  assert_int_equal(le32(out + 15), nb_tfevents_mask_crc(nb_crc32c(0, "abc", 3)));
  /* empty data: the data CRC is the mask of 0 */
  assert_int_equal(nb_tfevents_frame(NULL, 0, out, sizeof out), 16);
  assert_int_equal(le32(out + 12), 0xa282ead8u);
  /* too small a buffer writes nothing */
  assert_int_equal(nb_tfevents_frame("abc", 3, out, 18), 0);
}

static void test_encode(void** state) {
  (void)state;
  uint8_t out[512];
  /* wall_time 1.5 (0x3FF8000000000000), step 3, Summary { Value { tag "a", simple_value 2 } } */
  static const uint8_t want[] = {0x09, 0,    0,    0,    0,    0,    0,    0xf8,
                                 0x3f, 0x10, 0x03, 0x2a, 0x0a, 0x0a, 0x08, 0x0a,
                                 0x01, 'a',  0x15, 0,    0,    0,    0x40};
  size_t n = nb_tfevents_encode(1.5, 3, "a", 2.0f, out, sizeof out);
  assert_int_equal(n, sizeof want);
  assert_memory_equal(out, want, sizeof want);
  /* the file version record: wall_time 0, file_version = 3 "brain.Event:2" */
  static const uint8_t ver[] = {0x09, 0,   0,   0,   0,   0,   0,   0,   0,   0x1a, 0x0d, 'b',
                                'r',  'a', 'i', 'n', '.', 'E', 'v', 'e', 'n', 't',  ':',  '2'};
  n = nb_tfevents_encode(0, 0, NULL, 0, out, sizeof out);
  assert_int_equal(n, sizeof ver);
  assert_memory_equal(out, ver, sizeof ver);
  /* a step over 127 and a negative one are varints (2 and 10 bytes) */
  n = nb_tfevents_encode(0, 300, "a", 0, out, sizeof out);
  assert_int_equal(n, sizeof want + 1);
  assert_int_equal(out[9], 0x10);
  assert_int_equal(out[10], 0xac);
  assert_int_equal(out[11], 0x02);
  n = nb_tfevents_encode(0, -1, "a", 0, out, sizeof out);
  assert_int_equal(n, sizeof want + 9);
  assert_int_equal(out[19], 0x01);
  /* a tag of 200 bytes: the Value's and the Summary's lengths take two bytes */
  char tag[NB_TFEVENTS_TAG_MAX + 2];
  memset(tag, 'x', 200);
  tag[200] = 0;
  n = nb_tfevents_encode(0, 1, tag, 0, out, sizeof out);
  assert_int_equal(n, 9 + 2 + 1 + 2 + 1 + 2 + 1 + 2 + 200 + 5);
  assert_int_equal(out[12], 0xd3); /* summary length 211 = 0xd3 0x01 */
  assert_int_equal(out[13], 0x01);
  /* an empty or too long tag, too small a buffer */
  assert_int_equal(nb_tfevents_encode(0, 1, "", 0, out, sizeof out), 0);
  memset(tag, 'x', NB_TFEVENTS_TAG_MAX + 1);
  tag[NB_TFEVENTS_TAG_MAX + 1] = 0;
  assert_int_equal(nb_tfevents_encode(0, 1, tag, 0, out, sizeof out), 0);
  assert_int_equal(nb_tfevents_encode(1.5, 3, "a", 2.0f, out, sizeof want - 1), 0);
}

/* Reads a whole file; *len its size. Caller frees. */
static uint8_t* slurp(const char* path, size_t* len) {
  FILE* f = fopen(path, "rb");
  assert_non_null(f);
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t* b = malloc((size_t)n + 1);
  assert_int_equal(fread(b, 1, (size_t)n, f), (size_t)n);
  fclose(f);
  *len = (size_t)n;
  return b;
}

static char g_dir[64];

static int setup_dir(void** state) {
  (void)state;
  snprintf(g_dir, sizeof g_dir, "/tmp/nb_tfe.XXXXXX");
  return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown_dir(void** state) {
  (void)state;
  char cmd[128];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
  return system(cmd) == 0 ? 0 : -1;
}

static void test_writer_file(void** state) {
  (void)state;
  char dir[128];
  snprintf(dir, sizeof dir, "%s/tb", g_dir);
  nb_tfevents_t *w = NULL, *w2 = NULL;
  assert_int_equal(nb_tfevents_open(dir, &w), NB_OK);
  const char* path = nb_tfevents_path(w);
  assert_non_null(strstr(path, "/tb/events.out.tfevents."));
  /* the same folder, second and process: another name */
  assert_int_equal(nb_tfevents_open(dir, &w2), NB_OK);
  assert_string_not_equal(nb_tfevents_path(w2), path);
  nb_tfevents_close(w2);
  assert_int_equal(nb_tfevents_scalar(w, 4, "loss", 5.5), NB_OK);
  assert_int_equal(nb_tfevents_scalar(w, 8, "eval/bpb/en", 7.25), NB_OK);
  assert_int_equal(nb_tfevents_scalar(w, 8, "", 1), NB_ERR_INVALID);
  assert_int_equal(nb_tfevents_scalar(w, 8, NULL, 1), NB_ERR_INVALID);
  assert_int_equal(nb_tfevents_flush(w), NB_OK);
  /* flushed: readable before close, as a live TensorBoard reads it */
  size_t len;
  uint8_t* b = slurp(path, &len);
  size_t off = 0;
  int records = 0;
  uint8_t ev[512];
  while (off < len) {
    assert_true(len - off >= 16);
    uint64_t n = le64(b + off);
    assert_int_equal(le32(b + off + 8), nb_tfevents_mask_crc(nb_crc32c(0, b + off, 8)));
    assert_true(n <= len - off - 16);
    assert_int_equal(le32(b + off + 12 + n),
                     nb_tfevents_mask_crc(nb_crc32c(0, b + off + 12, (size_t)n)));
    if (records == 0) { /* the version record */
      assert_int_equal(n, 24);
      assert_memory_equal(b + off + 12 + 11, "brain.Event:2", 13);
    } else {
      /* the same bytes as the encoder's, but the wall time */
      const char* tag = records == 1 ? "loss" : "eval/bpb/en";
      size_t m = nb_tfevents_encode(0, records == 1 ? 4 : 8, tag, records == 1 ? 5.5f : 7.25f, ev,
                                    sizeof ev);
      assert_int_equal(n, m);
      assert_memory_equal(b + off + 12 + 9, ev + 9, m - 9);
    }
    off += 16 + (size_t)n;
    records++;
  }
  assert_int_equal(records, 3);
  free(b);
  nb_tfevents_close(w);
  /* NULL writer: nothing, OK */
  assert_int_equal(nb_tfevents_scalar(NULL, 1, "loss", 1), NB_OK);
  assert_int_equal(nb_tfevents_flush(NULL), NB_OK);
  nb_tfevents_close(NULL);
  assert_string_equal(nb_tfevents_path(NULL), "");
}

static void test_writer_errors(void** state) {
  (void)state;
  nb_tfevents_t* w = NULL;
  char dir[128];
  snprintf(dir, sizeof dir, "%s/no/such/parent", g_dir);
  assert_int_equal(nb_tfevents_open(dir, &w), NB_ERR_IO);
  assert_null(w);
  assert_non_null(strstr(nb_error_last(), dir));
  assert_int_equal(nb_tfevents_open("", &w), NB_ERR_INVALID);
  assert_int_equal(nb_tfevents_open_path(NULL, &w), NB_ERR_INVALID);

  /* a full disk: the first failed flush warns, later calls fail quietly */
  char log[128];
  snprintf(log, sizeof log, "%s/log.txt", g_dir);
  setenv("NB_DEBUG_FILE", log, 1);
  nb_log_reload();
  assert_int_equal(nb_tfevents_open_path("/dev/full", &w), NB_OK);
  assert_int_equal(nb_tfevents_scalar(w, 1, "loss", 1), NB_OK); /* buffered */
  assert_int_equal(nb_tfevents_flush(w), NB_ERR_IO);
  assert_int_equal(nb_tfevents_scalar(w, 2, "loss", 1), NB_ERR_IO);
  assert_int_equal(nb_tfevents_flush(w), NB_ERR_IO);
  nb_tfevents_close(w);
  unsetenv("NB_DEBUG_FILE");
  nb_log_reload();
  size_t len;
  char* text = (char*)slurp(log, &len);
  text[len] = 0;
  int warns = 0;
  for (char* p = text; (p = strstr(p, "tensorboard: cannot write /dev/full")); p++) warns++;
  assert_int_equal(warns, 1);
  assert_non_null(strstr(text, "training goes on"));
  free(text);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_crc32c_vectors),
      cmocka_unit_test(test_mask),
      cmocka_unit_test(test_frame),
      cmocka_unit_test(test_encode),
      cmocka_unit_test_setup_teardown(test_writer_file, setup_dir, teardown_dir),
      cmocka_unit_test_setup_teardown(test_writer_errors, setup_dir, teardown_dir),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
