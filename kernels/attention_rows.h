/* The row steps of causal attention that the CPU reference (attention.c, a loop over rows) and
 * the CUDA kernels (attention.cu, one thread per row) share, written once so that both do the
 * same arithmetic. Row i of a (T, T) score matrix attends to keys 0..i. */
#ifndef NB_KERNELS_ATTENTION_ROWS_H
#define NB_KERNELS_ATTENTION_ROWS_H

#include <math.h>

#include "kernels/host_device.h"

/* Causal softmax of row i in place: the softmax of row[0..i], zeros in row[i+1..T). */
NB_HD void nb_att_softmax_row(float* row, int i, int T) {
  float mx = row[0];
  for (int j = 1; j <= i; j++)
    if (row[j] > mx) mx = row[j];
  float sum = 0.0f;
  for (int j = 0; j <= i; j++) {
    row[j] = expf(row[j] - mx);
    sum += row[j];
  }
  float inv = 1.0f / sum;
  for (int j = 0; j <= i; j++) row[j] *= inv;
  for (int j = i + 1; j < T; j++) row[j] = 0.0f;
}

/* Its backward in place, from the probabilities p of row i: d = p * (d - sum(p * d)) over
 * d[0..i], zeros in d[i+1..end). */
NB_HD void nb_att_softmax_bwd_row(float* d, const float* p, int i, int end) {
  float dot = 0.0f;
  for (int j = 0; j <= i; j++) dot += p[j] * d[j];
  for (int j = 0; j <= i; j++) d[j] = p[j] * (d[j] - dot);
  for (int j = i + 1; j < end; j++) d[j] = 0.0f;
}

#endif
