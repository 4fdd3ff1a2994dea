/* chrF and BLEU as sacreBLEU 2.4 defines them (see metrics.h for the exact settings matched).
 * N-gram multisets are compared by sorting and merging, so counts are exact (no hashing).
 * Not a general tokenizer library: only the 13a tokenizer that BLEU's default uses. */
#include "train/metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- UTF-8 and Python's notion of whitespace ------------------------------------------------- */

/* Decodes one code point at s[*i] (advancing *i); returns -1 on invalid UTF-8 (overlongs,
 * surrogates and values above U+10FFFF included, as Python's strict decoder). */
static int32_t utf8_next(const unsigned char* s, size_t len, size_t* i) {
  unsigned c = s[*i];
  if (c < 0x80) {
    (*i)++;
    return (int32_t)c;
  }
  int n;
  uint32_t cp, min;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 1, cp = c & 0x1F, min = 0x80;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 2, cp = c & 0x0F, min = 0x800;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 3, cp = c & 0x07, min = 0x10000;
  } else {
    return -1;
  }
  if (*i + (size_t)n >= len) return -1;
  for (int k = 1; k <= n; k++) {
    unsigned cc = s[*i + (size_t)k];
    if ((cc & 0xC0) != 0x80) return -1;
    cp = (cp << 6) | (cc & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return -1;
  *i += (size_t)n + 1;
  return (int32_t)cp;
}

nb_status_t nb_utf8_sanitize(const unsigned char* bytes, size_t len, char** out) {
  char* s = NULL;
  NB_CHECK(nb_alloc((void**)&s, len * 3 + 1, 1, "utf-8 text"));
  size_t o = 0;
  for (size_t i = 0; i < len;) {
    size_t start = i;
    if (utf8_next(bytes, len, &i) < 0) { /* invalid byte: U+FFFD, move on by one */
      memcpy(s + o, "\xEF\xBF\xBD", 3);
      o += 3;
      i = start + 1;
    } else if (!(i == start + 1 && bytes[start] == 0)) {
      memcpy(s + o, bytes + start, i - start);
      o += i - start;
    }
  }
  s[o] = '\0';
  *out = s;
  return NB_OK;
}

/* str.isspace() of CPython: the characters str.split() and str.rstrip() treat as whitespace. */
static int py_isspace(uint32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Decodes text into code points with whitespace removed (chrF's default preprocessing).
 * *out is nb_free'd by the caller. */
static nb_status_t decode_nows(const char* text, uint32_t** out, size_t* n_out) {
  size_t len = strlen(text), i = 0, n = 0;
  uint32_t* cps = NULL;
  NB_CHECK(nb_alloc((void**)&cps, len + 1, sizeof(*cps), "chrF code points"));
  while (i < len) {
    int32_t c = utf8_next((const unsigned char*)text, len, &i);
    if (c < 0) {
      nb_free(cps);
      return nb_error(NB_ERR_INVALID, "metrics: invalid UTF-8 at byte %zu", i);
    }
    if (!py_isspace((uint32_t)c)) cps[n++] = (uint32_t)c;
  }
  *out = cps;
  *n_out = n;
  return NB_OK;
}

/* ---- chrF ------------------------------------------------------------------------------------ */

typedef struct {
  const uint32_t* s;
  size_t n;
} cp_ctx_t;

static int cmp_cp_cross(const uint32_t* x, const uint32_t* y, size_t n) {
  for (size_t k = 0; k < n; k++) {
    if (x[k] != y[k]) return x[k] < y[k] ? -1 : 1;
  }
  return 0;
}

static int cmp_cp_ngram(const void* a, const void* b, void* arg) {
  const cp_ctx_t* c = arg;
  return cmp_cp_cross(c->s + *(const size_t*)a, c->s + *(const size_t*)b, c->n);
}

/* Multiset intersection of two index lists sorted by the same order: counts the pairs that
 * cmp(i, j) calls equal, advancing past the smaller side otherwise. */
static int64_t sorted_matches(const size_t* ih, size_t a, const size_t* ir, size_t b,
                              int (*cmp)(const void* h, size_t i, const void* r, size_t j),
                              const void* h, const void* r) {
  int64_t m = 0;
  size_t i = 0, j = 0;
  while (i < a && j < b) {
    int c = cmp(h, ih[i], r, ir[j]);
    if (c == 0) {
      m++, i++, j++;
    } else if (c < 0) {
      i++;
    } else {
      j++;
    }
  }
  return m;
}

static int cmp_cp_at(const void* h, size_t i, const void* r, size_t j) {
  const cp_ctx_t *ch = h, *cr = r;
  return cmp_cp_cross(ch->s + i, cr->s + j, ch->n);
}

/* Size of the multiset intersection of the order-n n-grams of h and r. ih/ir are scratch of at
 * least hn/rn entries. */
static int64_t cp_matches(const uint32_t* h, size_t hn, const uint32_t* r, size_t rn, size_t n,
                          size_t* ih, size_t* ir) {
  if (hn < n || rn < n) return 0;
  size_t a = hn - n + 1, b = rn - n + 1;
  for (size_t k = 0; k < a; k++) ih[k] = k;
  for (size_t k = 0; k < b; k++) ir[k] = k;
  cp_ctx_t ch = {h, n}, cr = {r, n};
  qsort_r(ih, a, sizeof(*ih), cmp_cp_ngram, &ch);
  qsort_r(ir, b, sizeof(*ir), cmp_cp_ngram, &cr);
  return sorted_matches(ih, a, ir, b, cmp_cp_at, &ch, &cr);
}

nb_status_t nb_metrics_chrf_add(nb_chrf_stats_t* acc, const char* hyp, const char* ref) {
  if (!acc || !hyp || !ref) return nb_error(NB_ERR_INVALID, "chrF: NULL argument");
  nb_status_t st = NB_OK;
  uint32_t *h = NULL, *r = NULL;
  size_t *ih = NULL, *ir = NULL, hn = 0, rn = 0;
  NB_CHECK_GOTO(decode_nows(hyp, &h, &hn), st, fail);
  NB_CHECK_GOTO(decode_nows(ref, &r, &rn), st, fail);
  NB_CHECK_GOTO(nb_alloc((void**)&ih, hn + 1, sizeof(*ih), "chrF index"), st, fail);
  NB_CHECK_GOTO(nb_alloc((void**)&ir, rn + 1, sizeof(*ir), "chrF index"), st, fail);
  for (size_t n = 1; n <= NB_CHRF_ORDER; n++) {
    acc->hyp[n - 1] += hn >= n ? (int64_t)(hn - n + 1) : 0;
    acc->ref[n - 1] += rn >= n ? (int64_t)(rn - n + 1) : 0;
    acc->match[n - 1] += cp_matches(h, hn, r, rn, n, ih, ir);
  }
fail:
  nb_free(h);
  nb_free(r);
  nb_free(ih);
  nb_free(ir);
  return st;
}

double nb_metrics_chrf_score(const nb_chrf_stats_t* s) {
  /* sacreBLEU CHRF._compute_f_score without eps smoothing: average precision and recall over the
   * orders where both sides have n-grams, then F-beta of the averages. */
  const double factor = NB_CHRF_BETA * NB_CHRF_BETA;
  double avg_prec = 0.0, avg_rec = 0.0;
  int eff = 0;
  for (int i = 0; i < NB_CHRF_ORDER; i++) {
    if (s->hyp[i] > 0 && s->ref[i] > 0) {
      avg_prec += (double)s->match[i] / (double)s->hyp[i];
      avg_rec += (double)s->match[i] / (double)s->ref[i];
      eff++;
    }
  }
  if (eff == 0) return 0.0;
  avg_prec /= eff;
  avg_rec /= eff;
  if (avg_prec + avg_rec == 0.0) return 0.0;
  return 100.0 * (1.0 + factor) * avg_prec * avg_rec / (factor * avg_prec + avg_rec);
}

nb_status_t nb_metrics_chrf_corpus(const char* const* hyps, const char* const* refs, size_t n,
                                   double* out_score) {
  if ((n && (!hyps || !refs)) || !out_score) return nb_error(NB_ERR_INVALID, "chrF: NULL argument");
  nb_chrf_stats_t acc;
  memset(&acc, 0, sizeof(acc));
  for (size_t i = 0; i < n; i++) {
    nb_status_t st = nb_metrics_chrf_add(&acc, hyps[i], refs[i]);
    if (st != NB_OK) return nb_error_wrap(st, "chrF segment");
  }
  *out_score = nb_metrics_chrf_score(&acc);
  return NB_OK;
}

/* ---- 13a tokenizer --------------------------------------------------------------------------- */

/* A growable byte buffer. */
typedef struct {
  char* p;
  size_t n, cap;
} buf_t;

static nb_status_t buf_put(buf_t* b, const char* s, size_t n) {
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->n + n + 1) cap *= 2;
    NB_CHECK(nb_realloc((void**)&b->p, cap, 1, "13a buffer"));
    b->cap = cap;
  }
  memcpy(b->p + b->n, s, n);
  b->n += n;
  b->p[b->n] = '\0';
  return NB_OK;
}

static nb_status_t buf_c(buf_t* b, char c) {
  return buf_put(b, &c, 1);
}

/* Replaces every occurrence of `from` in in[0..n) by `to` (Python str.replace). */
static nb_status_t replace_all(const char* in, size_t n, const char* from, const char* to,
                               buf_t* out) {
  size_t fl = strlen(from), tl = strlen(to), i = 0;
  out->n = 0;
  NB_CHECK(buf_put(out, "", 0));
  while (i < n) {
    if (i + fl <= n && memcmp(in + i, from, fl) == 0) {
      NB_CHECK(buf_put(out, to, tl));
      i += fl;
    } else {
      NB_CHECK(buf_c(out, in[i]));
      i++;
    }
  }
  return NB_OK;
}

static int is_digit(char c) {
  return c >= '0' && c <= '9';
}

/* The first substitution class of sacreBLEU's TokenizerRegexp:
 * [\{-\~\[-\` -\&\(-\+\:-\@\/] = ASCII punctuation except ' , - . (and space, harmless). */
static int is_punct13a(unsigned char c) {
  return (c >= 0x7B && c <= 0x7E) || (c >= 0x5B && c <= 0x60) || (c >= 0x20 && c <= 0x26) ||
         (c >= 0x28 && c <= 0x2B) || (c >= 0x3A && c <= 0x40) || c == 0x2F;
}

/* re.sub(r"(X)(Y)", repl) where X and Y each match one byte: pairs in in[0..n) that `match`,
 * left to right and non-overlapping, become the 4 bytes of `repl` with '1' and '2' standing for
 * the two bytes ("1 2 " is r"\1 \2 "). */
static nb_status_t replace_pairs(const char* in, size_t n, int (*match)(char x, char y),
                                 const char repl[4], buf_t* out) {
  out->n = 0;
  NB_CHECK(buf_put(out, "", 0));
  for (size_t k = 0; k < n;) {
    if (k + 1 < n && match(in[k], in[k + 1])) {
      char t[4];
      for (int j = 0; j < 4; j++)
        t[j] = repl[j] == '1' ? in[k] : repl[j] == '2' ? in[k + 1] : repl[j];
      NB_CHECK(buf_put(out, t, 4));
      k += 2;
    } else {
      NB_CHECK(buf_c(out, in[k]));
      k++;
    }
  }
  return NB_OK;
}

/* The pairs of 13a's last three substitutions: ([^0-9])([\.,]), ([\.,])([^0-9]), ([0-9])(-). */
static int nondigit_sep(char x, char y) {
  return !is_digit(x) && (y == '.' || y == ',');
}
static int sep_nondigit(char x, char y) {
  return (x == '.' || x == ',') && !is_digit(y);
}
static int digit_dash(char x, char y) {
  return is_digit(x) && y == '-';
}

/* The regexes are applied to UTF-8 bytes; each pattern only tests ASCII bytes and [^0-9] never
 * splits a multi-byte character differently from a code-point match, so the result equals
 * Python's re.sub on the decoded string. */
nb_status_t nb_metrics_tokenize_13a(const char* text, char** out) {
  if (!text || !out) return nb_error(NB_ERR_INVALID, "13a: NULL argument");
  nb_status_t st = NB_OK;
  buf_t a = {0}, b = {0};
  size_t len = strlen(text), i = 0, keep = 0;
  /* rstrip (Python whitespace), validating UTF-8 on the way */
  while (i < len) {
    int32_t c = utf8_next((const unsigned char*)text, len, &i);
    if (c < 0) return nb_error(NB_ERR_INVALID, "13a: invalid UTF-8 at byte %zu", i);
    if (!py_isspace((uint32_t)c)) keep = i;
  }
  NB_CHECK_GOTO(replace_all(text, keep, "<skipped>", "", &a), st, fail);
  NB_CHECK_GOTO(replace_all(a.p, a.n, "-\n", "", &b), st, fail);
  NB_CHECK_GOTO(replace_all(b.p, b.n, "\n", " ", &a), st, fail);
  if (memchr(a.p, '&', a.n)) {
    NB_CHECK_GOTO(replace_all(a.p, a.n, "&quot;", "\"", &b), st, fail);
    NB_CHECK_GOTO(replace_all(b.p, b.n, "&amp;", "&", &a), st, fail);
    NB_CHECK_GOTO(replace_all(a.p, a.n, "&lt;", "<", &b), st, fail);
    NB_CHECK_GOTO(replace_all(b.p, b.n, "&gt;", ">", &a), st, fail);
  }
  /* f' {line} ' then ([punct]) -> ' \1 ' */
  b.n = 0;
  NB_CHECK_GOTO(buf_c(&b, ' '), st, fail);
  for (size_t k = 0; k < a.n; k++) {
    unsigned char c = (unsigned char)a.p[k];
    if (is_punct13a(c)) {
      char t[3] = {' ', (char)c, ' '};
      NB_CHECK_GOTO(buf_put(&b, t, 3), st, fail);
    } else {
      NB_CHECK_GOTO(buf_c(&b, (char)c), st, fail);
    }
  }
  NB_CHECK_GOTO(buf_c(&b, ' '), st, fail);
  /* ([^0-9])([\.,]) -> '\1 \2 ', then ([\.,])([^0-9]) -> ' \1 \2', then ([0-9])(-) -> '\1 \2 ' */
  NB_CHECK_GOTO(replace_pairs(b.p, b.n, nondigit_sep, "1 2 ", &a), st, fail);
  NB_CHECK_GOTO(replace_pairs(a.p, a.n, sep_nondigit, " 1 2", &b), st, fail);
  NB_CHECK_GOTO(replace_pairs(b.p, b.n, digit_dash, "1 2 ", &a), st, fail);
  /* ' '.join(line.split()) with Python's Unicode whitespace */
  b.n = 0;
  NB_CHECK_GOTO(buf_put(&b, "", 0), st, fail);
  {
    size_t k = 0;
    int in_tok = 0;
    while (k < a.n) {
      size_t start = k;
      int32_t c = utf8_next((const unsigned char*)a.p, a.n, &k);
      if (c < 0) {
        st = nb_error(NB_ERR_INTERNAL, "13a: produced invalid UTF-8");
        goto fail;
      }
      if (py_isspace((uint32_t)c)) {
        in_tok = 0;
        continue;
      }
      if (!in_tok && b.n > 0) NB_CHECK_GOTO(buf_c(&b, ' '), st, fail);
      in_tok = 1;
      NB_CHECK_GOTO(buf_put(&b, a.p + start, k - start), st, fail);
    }
  }
  *out = b.p;
  b.p = NULL;
fail:
  nb_free(a.p);
  nb_free(b.p);
  return st;
}

/* ---- BLEU ------------------------------------------------------------------------------------ */

typedef struct {
  char** tok; /* token pointers into a tokenized buffer (NUL-separated) */
  size_t n;
  char* mem;
} toks_t;

static nb_status_t tokens_of(const char* text, toks_t* t) {
  memset(t, 0, sizeof(*t));
  NB_CHECK(nb_metrics_tokenize_13a(text, &t->mem));
  size_t len = strlen(t->mem), cnt = len ? 1 : 0;
  for (size_t i = 0; i < len; i++) cnt += t->mem[i] == ' ';
  nb_status_t st = nb_alloc((void**)&t->tok, cnt + 1, sizeof(*t->tok), "BLEU tokens");
  if (st != NB_OK) {
    nb_free(t->mem);
    t->mem = NULL;
    return st;
  }
  if (len) {
    t->tok[t->n++] = t->mem;
    for (size_t i = 0; i < len; i++) {
      if (t->mem[i] == ' ') {
        t->mem[i] = '\0';
        t->tok[t->n++] = t->mem + i + 1;
      }
    }
  }
  return NB_OK;
}

static void tokens_free(toks_t* t) {
  nb_free(t->tok);
  nb_free(t->mem);
}

typedef struct {
  char* const* tok;
  size_t n;
} tok_ctx_t;

static int cmp_tok_seq(char* const* x, char* const* y, size_t n) {
  for (size_t k = 0; k < n; k++) {
    int c = strcmp(x[k], y[k]);
    if (c) return c;
  }
  return 0;
}

static int cmp_tok_ngram(const void* a, const void* b, void* arg) {
  const tok_ctx_t* c = arg;
  return cmp_tok_seq(c->tok + *(const size_t*)a, c->tok + *(const size_t*)b, c->n);
}

static int cmp_tok_at(const void* h, size_t i, const void* r, size_t j) {
  const tok_ctx_t *ch = h, *cr = r;
  return cmp_tok_seq(ch->tok + i, cr->tok + j, ch->n);
}

static int64_t tok_matches(const toks_t* h, const toks_t* r, size_t n, size_t* ih, size_t* ir) {
  if (h->n < n || r->n < n) return 0;
  size_t a = h->n - n + 1, b = r->n - n + 1;
  for (size_t k = 0; k < a; k++) ih[k] = k;
  for (size_t k = 0; k < b; k++) ir[k] = k;
  tok_ctx_t ch = {h->tok, n}, cr = {r->tok, n};
  qsort_r(ih, a, sizeof(*ih), cmp_tok_ngram, &ch);
  qsort_r(ir, b, sizeof(*ir), cmp_tok_ngram, &cr);
  return sorted_matches(ih, a, ir, b, cmp_tok_at, &ch, &cr);
}

nb_status_t nb_metrics_bleu_add(nb_bleu_stats_t* acc, const char* hyp, const char* ref) {
  if (!acc || !hyp || !ref) return nb_error(NB_ERR_INVALID, "BLEU: NULL argument");
  nb_status_t st = NB_OK;
  toks_t h = {0}, r = {0};
  size_t *ih = NULL, *ir = NULL;
  NB_CHECK_GOTO(tokens_of(hyp, &h), st, fail);
  NB_CHECK_GOTO(tokens_of(ref, &r), st, fail);
  NB_CHECK_GOTO(nb_alloc((void**)&ih, h.n + 1, sizeof(*ih), "BLEU index"), st, fail);
  NB_CHECK_GOTO(nb_alloc((void**)&ir, r.n + 1, sizeof(*ir), "BLEU index"), st, fail);
  acc->sys_len += (int64_t)h.n;
  acc->ref_len += (int64_t)r.n; /* one reference: it is the closest */
  for (size_t n = 1; n <= NB_BLEU_ORDER; n++) {
    acc->total[n - 1] += h.n >= n ? (int64_t)(h.n - n + 1) : 0;
    acc->correct[n - 1] += tok_matches(&h, &r, n, ih, ir);
  }
fail:
  tokens_free(&h);
  tokens_free(&r);
  nb_free(ih);
  nb_free(ir);
  return st;
}

/* sacreBLEU's my_log: log(0) is a large negative number, not -inf. */
static double my_log(double x) {
  return x == 0.0 ? -9999999999.0 : log(x);
}

void nb_metrics_bleu_score(const nb_bleu_stats_t* s, nb_bleu_smooth_t smooth,
                           nb_bleu_result_t* out) {
  memset(out, 0, sizeof(*out));
  out->sys_len = s->sys_len;
  out->ref_len = s->ref_len;
  if (s->sys_len < s->ref_len) {
    out->bp = s->sys_len > 0 ? exp(1.0 - (double)s->ref_len / (double)s->sys_len) : 0.0;
  } else {
    out->bp = 1.0;
  }
  int any = 0;
  for (int n = 0; n < NB_BLEU_ORDER; n++) any |= s->correct[n] != 0;
  if (!any) return; /* score 0, precisions 0 (sacreBLEU's early stop) */
  double smooth_mteval = 1.0;
  for (int n = 0; n < NB_BLEU_ORDER; n++) {
    if (s->total[n] == 0) break;
    if (s->correct[n] == 0) {
      if (smooth == NB_BLEU_SMOOTH_EXP) {
        smooth_mteval *= 2.0;
        out->precisions[n] = 100.0 / (smooth_mteval * (double)s->total[n]);
      } else if (smooth == NB_BLEU_SMOOTH_FLOOR) {
        out->precisions[n] = 100.0 * 0.1 / (double)s->total[n];
      }
    } else {
      out->precisions[n] = 100.0 * (double)s->correct[n] / (double)s->total[n];
    }
  }
  double sum = 0.0;
  for (int n = 0; n < NB_BLEU_ORDER; n++) sum += my_log(out->precisions[n]);
  out->score = out->bp * exp(sum / NB_BLEU_ORDER);
}

nb_status_t nb_metrics_bleu_corpus(const char* const* hyps, const char* const* refs, size_t n,
                                   nb_bleu_result_t* out) {
  if ((n && (!hyps || !refs)) || !out) return nb_error(NB_ERR_INVALID, "BLEU: NULL argument");
  nb_bleu_stats_t acc;
  memset(&acc, 0, sizeof(acc));
  for (size_t i = 0; i < n; i++) {
    nb_status_t st = nb_metrics_bleu_add(&acc, hyps[i], refs[i]);
    if (st != NB_OK) return nb_error_wrap(st, "BLEU segment");
  }
  nb_metrics_bleu_score(&acc, NB_BLEU_SMOOTH_EXP, out);
  return NB_OK;
}
