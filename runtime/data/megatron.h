/* Private to runtime/data: Megatron-LM's indexed datasets (the
 * MMapIndexedDataset format: PREFIX.idx + PREFIX.bin) read as one token
 * stream, the sequences concatenated in index order, as Megatron's GPT
 * dataset samples them. token_file.c opens them behind dsc_token_file, so
 * the loader reads either kind. Layout and checks: megatron.c. */
#ifndef DSC_RUNTIME_DATA_MEGATRON_H
#define DSC_RUNTIME_DATA_MEGATRON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsc/status.h"

typedef struct dsc_megatron dsc_megatron;

/* Whether `path` names a Megatron dataset: PREFIX.bin or PREFIX.idx whose
 * .idx exists, or a PREFIX with PREFIX.idx beside it; *prefix (len bytes)
 * receives PREFIX. */
bool dsc_megatron_detect(const char *path, char *prefix, size_t len);

/* Maps PREFIX.idx and PREFIX.bin and validates every count, size, pointer
 * and document index against the files before anything is read; errors are
 * DSC_ERR_CORRUPT naming the file, the field and the numbers. */
dsc_status dsc_megatron_open(const char *prefix, dsc_megatron **out);
void dsc_megatron_close(dsc_megatron *m);

int64_t dsc_megatron_count(const dsc_megatron *m); /* tokens in all sequences */
int dsc_megatron_item_bytes(const dsc_megatron *m);

/* Tokens [pos, pos + n) of the stream; an id < 0 or >= vocab_limit is
 * DSC_ERR_CORRUPT naming the file, the sequence and the position. */
dsc_status dsc_megatron_read(const dsc_megatron *m, int64_t pos, int64_t n, int64_t vocab_limit, int32_t *out);

#endif
