/* api/adapt: what the adaptive scheduler (inter/sched.h) reads of a live exchange and of a codec,
 * shared by the public session's adaptive density (api/session.c) and `nebula worker`: the
 * slowest peer link's estimate, and the codec's bits per kept value and index. Internal: not
 * exported by libnebula. */
#ifndef NB_API_ADAPT_H
#define NB_API_ADAPT_H

#include <stdint.h>

#include "compress/compress.h"
#include "inter/exchange.h"
#include "inter/sched.h"

/* The slowest peer link's estimate of ex (NULL: none): its goodput (0 while any link has none
 * yet) and the longest RTTs. */
void nb_adapt_estimate(nb_exchange_t* ex, nb_estimate_t* out);

/* Codec bits per kept value and per index for the scheduler's prediction: a value type's bits
 * with one fp32 scale per block of 256; delta+varint indices about log2(1/density) / 7 bytes
 * each, or log2(chunk) bits with a chunked top-k (chunk > 0). */
void nb_adapt_bits(nb_values_t v, double density, uint32_t chunk, double* per_value,
                   double* per_index);

/* Starts the idle-link bandwidth probes on every peer link of ex (frames may be too small to
 * measure a link: inter/link.h). */
nb_status_t nb_adapt_probes_start(nb_exchange_t* ex);

#endif
