/* dsc/data.h — training data: token files, the byte-level tokenizer, and the
 * distributed sampler that turns a token file into micro-batches.
 *
 * A token file is a 32-byte little-endian header followed by the tokens:
 *   u32 magic (DSC_TOKEN_FILE_MAGIC, "DTOK"), u32 version (1),
 *   u32 bytes per token (2 = uint16, 4 = uint32), u32 vocab size (0 = unknown),
 *   u64 token count, u64 reserved (0).
 * It is memory-mapped read-only, so every rank can open the same file cheaply.
 *
 * A Megatron-LM indexed dataset (MMapIndexedDataset: PREFIX.bin + PREFIX.idx,
 * what Megatron-DeepSpeed's preprocess_data.py writes) opens behind the same
 * handle when the path is PREFIX, PREFIX.bin or PREFIX.idx with the .idx
 * present: its sequences, concatenated in index order, are the tokens (as
 * Megatron's GPT dataset samples them). Every count, size, pointer and
 * document index of the index is checked against both files at open.
 *
 * The loader has no cursor: the data of (split, step, micro-batch, rank) is a
 * pure function of the file, the seed and the batch layout, so a run resumes
 * at step s from s alone and two runs with one seed read identical data. The
 * sampler is defined in docs/training.md ("Sampler"); in short, sequence b of
 * micro-batch m on data-parallel rank r at step s is global sample
 *   k = ((s * M + m) * DP + r) * B + b,
 * so rank r's micro-batch m is what a 1-rank run accumulating M*DP
 * micro-batches sees as micro-batch m*DP + r.
 *
 * Not here: the training loop (dsc/engine.h) and real subword tokenizers. */
#ifndef DSC_DATA_H
#define DSC_DATA_H

#include "dsc/api.h"
#include <stddef.h>
#include <stdint.h>

#include "dsc/status.h"
#include "dsc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DSC_TOKEN_FILE_MAGIC 0x4b4f5444u /* "DTOK" read as little-endian u32 */
#define DSC_TOKEN_FILE_VERSION 1u
#define DSC_TOKEN_FILE_HEADER_BYTES 32

typedef enum dsc_token_dtype { DSC_TOKEN_DTYPE_U16 = 2, DSC_TOKEN_DTYPE_U32 = 4 } dsc_token_dtype;

/* ---- token files ------------------------------------------------------------ */

/* Writes `count` tokens as `dtype`; a token that does not fit the dtype or is
 * >= vocab_size (when vocab_size > 0) is an error naming its position. */
DSC_API dsc_status dsc_token_file_write(const char *path, const uint32_t *tokens, int64_t count,
                                        dsc_token_dtype dtype, uint32_t vocab_size);

typedef struct dsc_token_file dsc_token_file;

/* Maps `path` and validates the header and the size (or a Megatron dataset, above). */
DSC_API dsc_status dsc_token_file_open(const char *path, dsc_token_file **out);
DSC_API void dsc_token_file_close(dsc_token_file *f);
DSC_API int64_t dsc_token_file_count(const dsc_token_file *f);
DSC_API dsc_token_dtype
dsc_token_file_dtype(const dsc_token_file *f); /* Megatron: U16 for 1-2 byte ids, else U32 */
DSC_API uint32_t
dsc_token_file_vocab(const dsc_token_file *f); /* from the header; 0 = unknown (always for Megatron) */
DSC_API const char *dsc_token_file_path(const dsc_token_file *f);
/* Tokens [pos, pos + n) as i32 into out (n entries). An id >= vocab_limit is
 * DSC_ERR_CORRUPT naming the file, the token position and the id. */
DSC_API dsc_status dsc_token_file_read(const dsc_token_file *f, int64_t pos, int64_t n, int64_t vocab_limit,
                                       int32_t *out);

/* ---- byte-level tokenizer (vocab 256: token = byte value) -------------------- */

#define DSC_BYTE_VOCAB_SIZE 256

DSC_API void dsc_byte_tokenizer_encode(const char *text, size_t len, uint32_t *ids); /* ids has len entries */
/* Writes the bytes of ids (each in [0, 256)) to out, NUL-terminated, at most
 * cap - 1 bytes; returns the number written. Ids outside the range print '?'. */
DSC_API size_t dsc_byte_tokenizer_decode(const int32_t *ids, int64_t n, char *out, size_t cap);

/* Reads the text file `text_path`, encodes it with the byte tokenizer and
 * writes a uint16 token file to `token_path`; *count (may be NULL) receives
 * the number of tokens. */
DSC_API dsc_status dsc_data_prepare(const char *text_path, const char *token_path, int64_t *count);

/* A tokenizer seen by the prepare step: encodes len bytes of text into ids
 * (room for cap; more needed is an error), *n_out the ids written; every id
 * < vocab_size. */
typedef struct dsc_text_encoder {
    void *ctx;
    uint32_t vocab_size;
    dsc_status (*encode)(void *ctx, const char *text, size_t len, int32_t *ids, int64_t cap, int64_t *n_out);
} dsc_text_encoder;

/* As dsc_data_prepare with another tokenizer: the whole text is encoded at
 * once (so pre-tokenization sees it as one string) and written as uint16
 * when vocab_size <= 65536, else uint32. */
DSC_API dsc_status dsc_data_prepare_with(const char *text_path, const char *token_path,
                                         const dsc_text_encoder *enc, int64_t *count);

/* ---- the distributed sampler ------------------------------------------------- */

typedef enum dsc_data_split {
    DSC_DATA_SPLIT_TRAIN = 0, /* the first (1 - val_fraction) of the tokens, shuffled per epoch */
    DSC_DATA_SPLIT_VAL        /* the rest, read in order from its start */
} dsc_data_split;

typedef struct dsc_data_loader_options {
    const char *path;
    double val_fraction;      /* in [0, 1); 0 leaves no validation split */
    int64_t vocab_size;       /* token ids must be < vocab_size */
    int64_t micro_batch_size; /* B sequences per micro-batch per rank */
    int64_t seq_len;          /* T; each sequence reads T + 1 tokens */
    int micro_batches;        /* M micro-batches per step per rank */
    int dp_rank;
    int dp_size;
    uint64_t seed;
} dsc_data_loader_options;

typedef struct dsc_data_loader dsc_data_loader;

/* Opens the token file; a split too short for one sequence of T + 1 tokens is
 * an error naming the split and the numbers. */
DSC_API dsc_status dsc_data_loader_open(const dsc_data_loader_options *opts, dsc_data_loader **out);
DSC_API void dsc_data_loader_close(dsc_data_loader *dl);

/* Fills this rank's micro-batch `micro` (0 <= micro < M) of global batch
 * `step`: tokens (B, T) i32 = the sequence, targets (B, T) i32 = the same
 * sequence shifted by one. */
DSC_API dsc_status dsc_data_loader_fill(dsc_data_loader *dl, dsc_data_split split, int64_t step, int micro,
                                        dsc_tensor *tokens, dsc_tensor *targets);

/* The first token position (in the file) of global sample k of a split, and
 * the epoch it belongs to (train split; the val split has one pass per
 * evaluation). For tests and for reporting. */
DSC_API int64_t dsc_data_loader_sample_start(const dsc_data_loader *dl, dsc_data_split split, int64_t k);
DSC_API int64_t dsc_data_loader_epoch(const dsc_data_loader *dl, int64_t step);
/* Number of distinct sequences per epoch of a split. */
DSC_API int64_t dsc_data_loader_windows(const dsc_data_loader *dl, dsc_data_split split);

#ifdef __cplusplus
}
#endif
#endif
