/* Shared by the training tests: a tiny GPT config over a token file cut from
 * data/tinyshakespeare.txt, and helpers to build and run a trainer. */
#ifndef DSC_TESTS_ENGINE_TRAIN_FIXTURE_H
#define DSC_TESTS_ENGINE_TRAIN_FIXTURE_H

#include "dsc/config.h"
#include "dsc/engine.h"

/* Writes the first `count` bytes of tinyshakespeare as a token file at `path`. */
void train_fixture_tokens(const char *path, int64_t count);

/* Parses the tiny config (2 blocks, C 32, T 16, vocab 256, micro 2, M 2,
 * 5 steps, AdamW with clipping) with data.path = `data` plus `overrides`,
 * and resolves the batch for `dp_size` ranks. */
void train_fixture_config(dsc_config *cfg, const char *data, const char *const *overrides, int n, int dp_size);

/* The store's parameters, concatenated in declaration order (malloc'd). */
float *train_fixture_params(dsc_trainer *t, int64_t *count);

#endif
