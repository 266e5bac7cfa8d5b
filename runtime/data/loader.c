/* The distributed sampler: which tokens form sequence b of micro-batch m on
 * data-parallel rank r at step s.
 *
 * Global sample k = ((s*M + m)*DP + r)*B + b (see dsc/data.h). The train
 * split is cut into W windows of T tokens (each sequence reads T + 1 tokens,
 * the last one only as a target); epoch e = k / W visits every window once, in
 * the order of a seeded permutation of [0, W), shifted by a seeded offset
 * smaller than the split's leftover tokens so later epochs see other
 * boundaries. The permutation is a 4-round Feistel network with cycle walking:
 * random access to any k in O(1) memory and time, so there is no cursor to
 * save and every rank computes its own samples independently. The val split is
 * read in order from its start.
 *
 * Not here: the file format (token_file.c) or when batches are requested
 * (the engine). */
#include "dsc/data.h"

#include <stdlib.h>
#include <string.h>

struct dsc_data_loader {
    dsc_token_file *file;
    dsc_data_loader_options opts; /* opts.path is not kept */
    int64_t begin[2];             /* first token of each split */
    int64_t length[2];            /* tokens in each split */
    int64_t windows[2];           /* W: sequences per epoch of each split */
    int32_t *row;                 /* (T + 1) one sequence with its next token */
};

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

/* A bijection of [0, n) keyed by `key`: Feistel rounds over the smallest
 * even-bit power of two >= n, re-applied until the value lands inside [0, n). */
static int64_t permute(int64_t j, int64_t n, uint64_t key) {
    if (n <= 1) return 0;
    int bits = 64 - __builtin_clzll((uint64_t)(n - 1));
    bits += bits & 1;
    int half = bits / 2;
    uint64_t mask = (1ULL << half) - 1;
    uint64_t x = (uint64_t)j;
    do {
        uint64_t l = x >> half, r = x & mask;
        for (uint64_t round = 0; round < 4; round++) {
            uint64_t f = mix64(r ^ mix64(key + round * 0x9e3779b97f4a7c15ULL)) & mask;
            uint64_t next_r = l ^ f;
            l = r;
            r = next_r;
        }
        x = (l << half) | r;
    } while (x >= (uint64_t)n);
    return (int64_t)x;
}

static const char *split_name(dsc_data_split split) {
    return split == DSC_DATA_SPLIT_TRAIN ? "train" : "val";
}

dsc_status dsc_data_loader_open(const dsc_data_loader_options *opts, dsc_data_loader **out) {
    *out = NULL;
    DSC_CHECK(opts->val_fraction >= 0 && opts->val_fraction < 1, DSC_ERR_INVALID,
              "data loader: val_fraction %g is outside [0, 1)", opts->val_fraction);
    DSC_CHECK(opts->micro_batch_size > 0 && opts->seq_len > 0 && opts->micro_batches > 0 && opts->dp_size > 0 &&
                  opts->dp_rank >= 0 && opts->dp_rank < opts->dp_size && opts->vocab_size > 0,
              DSC_ERR_INVALID, "data loader: invalid layout B=%lld T=%lld M=%d dp_rank=%d dp_size=%d vocab=%lld",
              (long long)opts->micro_batch_size, (long long)opts->seq_len, opts->micro_batches, opts->dp_rank,
              opts->dp_size, (long long)opts->vocab_size);
    DSC_CHECK(opts->seq_len < INT32_MAX && opts->micro_batch_size <= INT64_MAX / opts->seq_len, DSC_ERR_INVALID,
              "data loader: micro-batch B=%lld x T=%lld tokens does not fit a tensor",
              (long long)opts->micro_batch_size, (long long)opts->seq_len);
    dsc_token_file *file;
    dsc_status opened = dsc_token_file_open(opts->path, &file);
    if (opened) return dsc_error_wrap(opened, "\"data.path\" %s", opts->path);
    dsc_data_loader *dl = calloc(1, sizeof *dl);
    int32_t *row = malloc((size_t)(opts->seq_len + 1) * sizeof *row);
    if (!dl || !row) {
        free(dl);
        free(row);
        dsc_token_file_close(file);
        return dsc_error(DSC_ERR_NOMEM, "data loader %s: out of memory", opts->path);
    }
    dl->file = file;
    dl->opts = *opts;
    dl->opts.path = NULL;
    dl->row = row;
    int64_t n = dsc_token_file_count(file);
    int64_t n_val = (int64_t)((double)n * opts->val_fraction);
    dl->begin[DSC_DATA_SPLIT_TRAIN] = 0;
    dl->length[DSC_DATA_SPLIT_TRAIN] = n - n_val;
    dl->begin[DSC_DATA_SPLIT_VAL] = n - n_val;
    dl->length[DSC_DATA_SPLIT_VAL] = n_val;
    int64_t T = opts->seq_len;
    for (int sp = 0; sp < 2; sp++) {
        bool needed = sp == DSC_DATA_SPLIT_TRAIN || n_val > 0;
        if (needed && dl->length[sp] < T + 1) {
            dsc_status s =
                dsc_error(DSC_ERR_INVALID,
                          "data file %s: the %s split has %lld tokens, fewer than seq_len + 1 = %lld "
                          "(file has %lld tokens, val_fraction %g)",
                          dsc_token_file_path(file), split_name((dsc_data_split)sp), (long long)dl->length[sp],
                          (long long)(T + 1), (long long)n, opts->val_fraction);
            dsc_data_loader_close(dl);
            return s;
        }
        dl->windows[sp] = dl->length[sp] > 0 ? (dl->length[sp] - 1) / T : 0;
    }
    *out = dl;
    return NULL;
}

void dsc_data_loader_close(dsc_data_loader *dl) {
    if (!dl) return;
    dsc_token_file_close(dl->file);
    free(dl->row);
    free(dl);
}

int64_t dsc_data_loader_windows(const dsc_data_loader *dl, dsc_data_split split) {
    return dl->windows[split];
}

int64_t dsc_data_loader_epoch(const dsc_data_loader *dl, int64_t step) {
    const dsc_data_loader_options *o = &dl->opts;
    int64_t samples = step * o->micro_batches * o->dp_size * o->micro_batch_size;
    return samples / dl->windows[DSC_DATA_SPLIT_TRAIN];
}

int64_t dsc_data_loader_sample_start(const dsc_data_loader *dl, dsc_data_split split, int64_t k) {
    int64_t W = dl->windows[split], T = dl->opts.seq_len;
    if (split == DSC_DATA_SPLIT_VAL) return dl->begin[split] + (k % W) * T;
    int64_t epoch = k / W;
    uint64_t key = mix64(dl->opts.seed ^ mix64((uint64_t)epoch + 0x243f6a8885a308d3ULL));
    int64_t leftover = dl->length[split] - 1 - W * T; /* tokens no window of this epoch needs */
    int64_t offset = (int64_t)(mix64(key ^ 0x13198a2e03707344ULL) % (uint64_t)(leftover + 1));
    return dl->begin[split] + offset + permute(k % W, W, key) * T;
}

dsc_status dsc_data_loader_fill(dsc_data_loader *dl, dsc_data_split split, int64_t step, int micro,
                                dsc_tensor *tokens, dsc_tensor *targets) {
    const dsc_data_loader_options *o = &dl->opts;
    DSC_CHECK(dl->windows[split] > 0, DSC_ERR_INVALID, "data file %s: the %s split is empty (val_fraction %g)",
              dsc_token_file_path(dl->file), split_name(split), o->val_fraction);
    DSC_CHECK(micro >= 0 && micro < o->micro_batches && step >= 0, DSC_ERR_INVALID,
              "data loader: micro-batch %d of step %lld is outside [0, %d)", micro, (long long)step,
              o->micro_batches);
    int64_t B = o->micro_batch_size, T = o->seq_len;
    const int64_t shape[2] = {B, T};
    DSC_TRY(dsc_tensor_expect(tokens, "data loader tokens", DSC_DTYPE_I32, 2, shape));
    DSC_TRY(dsc_tensor_expect(targets, "data loader targets", DSC_DTYPE_I32, 2, shape));
    int32_t *tok = tokens->data;  // (B, T)
    int32_t *tgt = targets->data; // (B, T)
    for (int64_t b = 0; b < B; b++) {
        int64_t k = ((step * o->micro_batches + micro) * o->dp_size + o->dp_rank) * B + b;
        int64_t start = dsc_data_loader_sample_start(dl, split, k);
        DSC_TRY(dsc_token_file_read(dl->file, start, T + 1, o->vocab_size, dl->row));
        memcpy(tok + b * T, dl->row, (size_t)T * sizeof *tok);
        memcpy(tgt + b * T, dl->row + 1, (size_t)T * sizeof *tgt);
    }
    return NULL;
}
