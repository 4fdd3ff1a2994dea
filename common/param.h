/* Environment parameters, NCCL_PARAM-style: each knob is declared once (name, default,
 * description) next to the code that uses it, read from the environment once, validated, and
 * logged with its source. `nebula env` lists every parameter linked into the binary. This is
 * for process-wide knobs; job settings belong in the job descriptor, not here. */
#ifndef NB_COMMON_PARAM_H
#define NB_COMMON_PARAM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { NB_PARAM_INT = 0, NB_PARAM_DOUBLE = 1, NB_PARAM_STRING = 2 } nb_param_type_t;

typedef struct nb_param {
  const char* env; /* "NB_ZSTD_LEVEL" */
  nb_param_type_t type;
  const char* defval; /* default, as text */
  const char* desc;   /* one line */
  double min, max;    /* bounds for numbers; min > max means unbounded */
  /* filled on first read: */
  int loaded;
  const char* source; /* "default" or "environment" */
  int64_t ival;
  double dval;
  char sval[256];
  struct nb_param* next;
} nb_param_t;

/* Registration and reads. Thread-safe; the first read of a parameter logs it under ENV, and a
 * value that does not parse or is out of bounds is reported with NB_WARN and the default used. */
void nb_param_register(nb_param_t* p);
int64_t nb_param_int(nb_param_t* p);
double nb_param_double(nb_param_t* p);
const char* nb_param_string(nb_param_t* p);

/* Walks every registered parameter (order unspecified). Values are loaded before the call. */
void nb_param_foreach(void (*fn)(const nb_param_t* p, void* ctx), void* ctx);

/* For tests: forget loaded values so the next read consults the environment again. */
void nb_param_reset_all(void);

/* Declares a parameter in a .c file and a static getter `nb_param_<name>()`. */
#define NB__PARAM_DECL(name, envname, typ, def, lo, hi, description, rettype, getter)         \
  static nb_param_t nb__param_##name = {                                                      \
      .env = envname, .type = typ, .defval = def, .desc = description, .min = lo, .max = hi}; \
  __attribute__((constructor)) static void nb__param_ctor_##name(void) {                      \
    nb_param_register(&nb__param_##name);                                                     \
  }                                                                                           \
  static inline rettype nb_param_##name(void) {                                               \
    return getter(&nb__param_##name);                                                         \
  }

/* The default as `nebula env` shows it: the value, also when it is a module's macro. */
#define NB__PARAM_XSTR(x) #x
#define NB__PARAM_STR(x) NB__PARAM_XSTR(x)
#define NB_PARAM_INT(name, envname, def, lo, hi, description)                                   \
  NB__PARAM_DECL(name, envname, NB_PARAM_INT, NB__PARAM_STR(def), lo, hi, description, int64_t, \
                 nb_param_int)
#define NB_PARAM_DOUBLE(name, envname, def, lo, hi, description)                                  \
  NB__PARAM_DECL(name, envname, NB_PARAM_DOUBLE, NB__PARAM_STR(def), lo, hi, description, double, \
                 nb_param_double)
#define NB_PARAM_STRING(name, envname, def, description)                              \
  NB__PARAM_DECL(name, envname, NB_PARAM_STRING, def, 1, 0, description, const char*, \
                 nb_param_string)

#ifdef __cplusplus
}
#endif
#endif
