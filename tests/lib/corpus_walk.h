/* The corpus replay of the fuzz targets' plain-build drivers: every file of the given paths (a
 * file itself, or each file of a folder whose name does not start with '.', in name order) read
 * whole and handed to a callback. One walker for every driver, so that each keeps only what its
 * target expects of a file. */
#ifndef NB_TESTS_LIB_CORPUS_WALK_H
#define NB_TESTS_LIB_CORPUS_WALK_H

#include <stddef.h>
#include <stdint.h>

/* One file: `name` its name within its folder (or the path given), data/len its whole contents
 * (borrowed for the call). Returns the failures it counts (0 or more), or < 0 to stop the walk. */
typedef int (*nb_corpus_fn)(void* ctx, const char* name, const uint8_t* data, size_t len);

/* Walks paths[0..n); *files (nullable) gets the number of files handed to fn. Returns the sum
 * of fn's counts, or -1 when a path cannot be read or fn stopped the walk (the problem printed
 * on stderr, or by fn). */
int nb_corpus_walk(const char* const* paths, int n, nb_corpus_fn fn, void* ctx, int* files);

#endif
