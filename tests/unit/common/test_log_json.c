/* NB_LOG_FORMAT=json: nb_log_format_json on nasty strings (quotes, backslashes, control
 * characters, invalid and valid UTF-8, messages too long for the line) always gives one JSON
 * object that jansson parses, with the fields and the message as given; the logger's own lines
 * under NB_LOG_FORMAT=json; nb_log_check_env's verdicts. Not a test of the text format. */
#include <jansson.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/log.h"

/* Parses one line (it must end in exactly one newline) into an object; caller decrefs. */
static json_t* parse_line(const char* line, size_t n) {
  assert_true(n > 2);
  assert_int_equal(line[n - 1], '\n');
  assert_null(memchr(line, '\n', n - 1));
  json_error_t err;
  json_t* j = json_loadb(line, n, 0, &err);
  if (!j) fail_msg("not JSON (%s at %d): %s", err.text, err.position, line);
  assert_true(json_is_object(j));
  return j;
}

static nb_log_record_t rec(const char* msg) {
  nb_log_record_t r = {
      .wall_ns = 1767323045678901234LL, /* 2026-01-02T03:04:05.678Z */
      .level = NB_LOG_INFO,
      .sub = NB_SUB_JOB,
      .host = "host-1",
      .pid = 4242,
      .cluster = "dc-a",
      .rank = 0,
      .file = "api.c",
      .line = 312,
      .msg = msg,
  };
  return r;
}

static void test_fields(void** state) {
  (void)state;
  char out[4096];
  nb_log_record_t r = rec("job x accepted");
  size_t n = nb_log_format_json(&r, out, sizeof out);
  assert_int_equal(n, strlen(out));
  json_t* j = parse_line(out, n);
  assert_string_equal(json_string_value(json_object_get(j, "ts")), "2026-01-02T03:04:05.678Z");
  assert_string_equal(json_string_value(json_object_get(j, "level")), "INFO");
  assert_string_equal(json_string_value(json_object_get(j, "sub")), "JOB");
  assert_string_equal(json_string_value(json_object_get(j, "host")), "host-1");
  assert_int_equal(json_integer_value(json_object_get(j, "pid")), 4242);
  assert_string_equal(json_string_value(json_object_get(j, "cluster")), "dc-a");
  assert_int_equal(json_integer_value(json_object_get(j, "rank")), 0);
  assert_string_equal(json_string_value(json_object_get(j, "file")), "api.c");
  assert_int_equal(json_integer_value(json_object_get(j, "line")), 312);
  assert_string_equal(json_string_value(json_object_get(j, "msg")), "job x accepted");
  json_decref(j);
  /* a WARN has no subsystem; no identity: no cluster or rank */
  r.level = NB_LOG_WARN;
  r.cluster = NULL;
  n = nb_log_format_json(&r, out, sizeof out);
  j = parse_line(out, n);
  assert_string_equal(json_string_value(json_object_get(j, "level")), "WARN");
  assert_null(json_object_get(j, "sub"));
  assert_null(json_object_get(j, "cluster"));
  assert_null(json_object_get(j, "rank"));
  json_decref(j);
  /* TRACE; the epoch; a cap under 256 is refused */
  r.level = NB_LOG_TRACE;
  r.wall_ns = 0;
  n = nb_log_format_json(&r, out, sizeof out);
  j = parse_line(out, n);
  assert_string_equal(json_string_value(json_object_get(j, "level")), "TRACE");
  assert_string_equal(json_string_value(json_object_get(j, "ts")), "1970-01-01T00:00:00.000Z");
  json_decref(j);
  assert_int_equal(nb_log_format_json(&r, out, 255), 0);
}

/* Strings that are valid UTF-8 come back exactly. */
static void test_escapes(void** state) {
  (void)state;
  static const char* msgs[] = {
      "quote \" backslash \\ slash /",
      "newline\nreturn\rtab\tbell\a backspace\b formfeed\f",
      "\x01\x02\x1f\x7f",
      "euro \xe2\x82\xac, emoji \xf0\x9f\x98\x80, U+10FFFF \xf4\x8f\xbf\xbf, U+0080 \xc2\x80",
      "{\"msg\":\"injected\"}\n{\"level\":\"WARN\"}",
      "",
  };
  char out[8192];
  for (size_t i = 0; i < sizeof msgs / sizeof msgs[0]; i++) {
    nb_log_record_t r = rec(msgs[i]);
    r.host = msgs[i];
    r.cluster = msgs[i];
    r.file = "a\"b.c";
    size_t n = nb_log_format_json(&r, out, sizeof out);
    json_t* j = parse_line(out, n);
    assert_string_equal(json_string_value(json_object_get(j, "msg")), msgs[i]);
    assert_string_equal(json_string_value(json_object_get(j, "host")), msgs[i]);
    assert_string_equal(json_string_value(json_object_get(j, "cluster")), msgs[i]);
    assert_string_equal(json_string_value(json_object_get(j, "file")), "a\"b.c");
    json_decref(j);
  }
}

/* Bytes that are not UTF-8 become U+FFFD each; the rest stays. */
static void test_invalid_utf8(void** state) {
  (void)state;
  static const struct {
    const char* in;
    const char* want;
  } cases[] = {
      {"a\xff"
       "b",
       "a\xef\xbf\xbd"
       "b"},                                                    /* never a UTF-8 byte */
      {"\xc0\xaf", "\xef\xbf\xbd\xef\xbf\xbd"},                 /* overlong '/' */
      {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* a surrogate */
      {"\xf4\x90\x80\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}, /* > U+10FFFF */
      {"cut \xe2\x82", "cut \xef\xbf\xbd\xef\xbf\xbd"}, /* truncated at the end */
      {"\x80 lone continuation", "\xef\xbf\xbd lone continuation"},
  };
  char out[4096];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    nb_log_record_t r = rec(cases[i].in);
    size_t n = nb_log_format_json(&r, out, sizeof out);
    json_t* j = parse_line(out, n);
    assert_string_equal(json_string_value(json_object_get(j, "msg")), cases[i].want);
    json_decref(j);
  }
}

/* A message that does not fit is cut at a whole character; the line stays one JSON object. */
static void test_too_long(void** state) {
  (void)state;
  char msg[3000];
  char out[8192];
  static const char* fill[] = {"\"", "\x01", "\xe2\x82\xac", "x", "\xff"};
  for (size_t f = 0; f < sizeof fill / sizeof fill[0]; f++) {
    size_t k = strlen(fill[f]), o = 0;
    while (o + k < sizeof msg) memcpy(msg + o, fill[f], k), o += k;
    msg[o] = 0;
    for (size_t cap = 256; cap <= 4096; cap += 97) {
      nb_log_record_t r = rec(msg);
      r.host = msg; /* even a host name of control characters */
      size_t n = nb_log_format_json(&r, out, cap);
      assert_true(n > 0 && n < cap);
      json_t* j = parse_line(out, n);
      assert_non_null(json_object_get(j, "msg"));
      assert_int_equal(json_integer_value(json_object_get(j, "line")), 312);
      json_decref(j);
    }
  }
}

/* The logger itself under NB_LOG_FORMAT=json, into NB_DEBUG_FILE. */
static void test_logger_lines(void** state) {
  (void)state;
  char dir[] = "/tmp/nb_logjson.XXXXXX";
  assert_non_null(mkdtemp(dir));
  char path[64];
  snprintf(path, sizeof path, "%s/log", dir);
  setenv("NB_DEBUG_FILE", path, 1);
  setenv("NB_LOG_FORMAT", "JSON", 1);
  setenv("NB_DEBUG", "INFO", 1);
  nb_log_reload();
  nb_log_set_identity("dc-\"b\"", 3);
  NB_WARN("warned %d \"%s\"", 1, "q\n");
  NB_INFO(JOB, "job %s \xff", "y");
  NB_TRACE(JOB, "not printed at INFO");
  unsetenv("NB_DEBUG_FILE");
  unsetenv("NB_LOG_FORMAT");
  unsetenv("NB_DEBUG");
  nb_log_reload();
  FILE* f = fopen(path, "r");
  assert_non_null(f);
  char line[8192];
  int n = 0;
  while (fgets(line, sizeof line, f)) {
    json_t* j = parse_line(line, strlen(line));
    assert_string_equal(json_string_value(json_object_get(j, "cluster")), "dc-\"b\"");
    assert_int_equal(json_integer_value(json_object_get(j, "rank")), 3);
    assert_string_equal(json_string_value(json_object_get(j, "file")), "test_log_json.c");
    assert_string_equal(json_string_value(json_object_get(j, "msg")),
                        n == 0 ? "warned 1 \"q\n\"" : "job y \xef\xbf\xbd");
    assert_string_equal(json_string_value(json_object_get(j, "level")), n == 0 ? "WARN" : "INFO");
    json_decref(j);
    n++;
  }
  fclose(f);
  assert_int_equal(n, 2);
  unlink(path);
  rmdir(dir);
}

static void test_check_env(void** state) {
  (void)state;
  unsetenv("NB_LOG_FORMAT");
  assert_int_equal(nb_log_check_env(), NB_OK);
  static const char* ok[] = {"", "text", "json", "JSON", "Text"};
  for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
    setenv("NB_LOG_FORMAT", ok[i], 1);
    assert_int_equal(nb_log_check_env(), NB_OK);
  }
  setenv("NB_LOG_FORMAT", "xml", 1);
  assert_int_equal(nb_log_check_env(), NB_ERR_CONFIG);
  assert_string_equal(nb_error_last(), "NB_LOG_FORMAT=xml: expected text or json");
  unsetenv("NB_LOG_FORMAT");
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_fields),       cmocka_unit_test(test_escapes),
      cmocka_unit_test(test_invalid_utf8), cmocka_unit_test(test_too_long),
      cmocka_unit_test(test_logger_lines), cmocka_unit_test(test_check_env),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
