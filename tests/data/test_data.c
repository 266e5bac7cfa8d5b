/* Token files, the byte tokenizer, the prepare step and the distributed
 * sampler: round trips, clear errors on bad files, each epoch a permutation of
 * the windows, disjoint ranks, DP layout == 1-rank accumulation layout,
 * determinism for a seed and resumability from the step alone. */
#define _POSIX_C_SOURCE 200809L /* truncate */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/data.h"
#include "test_mpi.h"

static void temp_path(char *buf, size_t len, const char *what) {
    snprintf(buf, len, "/tmp/dsc_test_data_%d_%s", (int)getpid(), what);
}

/* A file of n tokens with id i % 251 at position i, so positions are recognisable. */
static void write_ramp(const char *path, int64_t n, dsc_token_dtype dtype) {
    uint32_t *ids = malloc((size_t)n * sizeof *ids);
    for (int64_t i = 0; i < n; i++)
        ids[i] = (uint32_t)(i % 251);
    assert_ok(dsc_token_file_write(path, ids, n, dtype, 256));
    free(ids);
}

static void test_token_file_round_trip(void **state) {
    (void)state;
    char path[256];
    temp_path(path, sizeof path, "rt.tok");
    const dsc_token_dtype dtypes[] = {DSC_TOKEN_DTYPE_U16, DSC_TOKEN_DTYPE_U32};
    for (int d = 0; d < 2; d++) {
        uint32_t ids[] = {0, 7, 65535, 3, 70000};
        int n = dtypes[d] == DSC_TOKEN_DTYPE_U16 ? 4 : 5;
        assert_ok(dsc_token_file_write(path, ids, n, dtypes[d], 0));
        dsc_token_file *f;
        assert_ok(dsc_token_file_open(path, &f));
        assert_int_equal(dsc_token_file_count(f), n);
        assert_int_equal(dsc_token_file_dtype(f), dtypes[d]);
        int32_t out[5];
        assert_ok(dsc_token_file_read(f, 0, n, 100000, out));
        for (int i = 0; i < n; i++)
            assert_int_equal(out[i], (int32_t)ids[i]);
        assert_err(dsc_token_file_read(f, 1, n, 100000, out), DSC_ERR_INVALID, "outside its");
        assert_err(dsc_token_file_read(f, 0, n, 100, out), DSC_ERR_CORRUPT,
                   "token id 65535 at position 2 is >= vocab size 100");
        dsc_token_file_close(f);
    }
    uint32_t big[] = {1, 70000};
    assert_err(dsc_token_file_write(path, big, 2, DSC_TOKEN_DTYPE_U16, 0), DSC_ERR_INVALID,
               "token id 70000 at position 1");
    unlink(path);
}

static void test_token_file_errors(void **state) {
    (void)state;
    dsc_token_file *f;
    assert_err(dsc_token_file_open("/nonexistent/dir/x.tok", &f), DSC_ERR_IO,
               "data file /nonexistent/dir/x.tok: cannot open");
    char path[256];
    temp_path(path, sizeof path, "bad.tok");
    FILE *fp = fopen(path, "wb");
    fputs("First Citizen: Before we proceed any further, hear me speak.", fp);
    fclose(fp);
    assert_err(dsc_token_file_open(path, &f), DSC_ERR_CORRUPT, "not a dsc token file");
    /* A header that promises more tokens than the file holds. */
    write_ramp(path, 100, DSC_TOKEN_DTYPE_U16);
    assert_int_equal(truncate(path, DSC_TOKEN_FILE_HEADER_BYTES + 150), 0);
    assert_err(dsc_token_file_open(path, &f), DSC_ERR_CORRUPT, "header says 100 tokens (232 bytes)");
    /* A count whose byte size wraps to 0 (2^63 x 2): the 32-byte file is not a header + 2^63 tokens. */
    uint32_t header[8] = {DSC_TOKEN_FILE_MAGIC, DSC_TOKEN_FILE_VERSION, 2, 0, 0, 0x80000000u, 0, 0};
    fp = fopen(path, "wb");
    assert_int_equal(fwrite(header, sizeof header, 1, fp), 1);
    fclose(fp);
    assert_err(dsc_token_file_open(path, &f), DSC_ERR_CORRUPT, "header says 9223372036854775808 tokens");
    unlink(path);
}

static void test_byte_tokenizer_and_prepare(void **state) {
    (void)state;
    const char *text = "Hi, \xc3\xa9t\xc3\xa9!\n";
    size_t len = strlen(text);
    uint32_t ids[32];
    dsc_byte_tokenizer_encode(text, len, ids);
    assert_int_equal(ids[0], 'H');
    assert_int_equal(ids[4], 0xc3);
    int32_t ids32[32];
    for (size_t i = 0; i < len; i++)
        ids32[i] = (int32_t)ids[i];
    char back[32];
    assert_int_equal(dsc_byte_tokenizer_decode(ids32, (int64_t)len, back, sizeof back), len);
    assert_string_equal(back, text);
    assert_int_equal(dsc_byte_tokenizer_decode(ids32, (int64_t)len, back, 3), 2);
    assert_string_equal(back, "Hi");

    char txt[256], tok[256];
    temp_path(txt, sizeof txt, "in.txt");
    temp_path(tok, sizeof tok, "out.tok");
    FILE *fp = fopen(txt, "wb");
    fputs(text, fp);
    fclose(fp);
    int64_t count;
    assert_ok(dsc_data_prepare(txt, tok, &count));
    assert_int_equal(count, len);
    dsc_token_file *f;
    assert_ok(dsc_token_file_open(tok, &f));
    assert_int_equal(dsc_token_file_vocab(f), 256);
    assert_int_equal(dsc_token_file_dtype(f), DSC_TOKEN_DTYPE_U16);
    int32_t out[32];
    assert_ok(dsc_token_file_read(f, 0, (int64_t)len, 256, out));
    assert_memory_equal(out, ids32, len * sizeof *out);
    dsc_token_file_close(f);
    assert_err(dsc_data_prepare("/nonexistent.txt", tok, NULL), DSC_ERR_IO, "text file /nonexistent.txt");
    unlink(txt);
    unlink(tok);
}

static dsc_data_loader *open_loader(const char *path, int B, int T, int M, int rank, int dp, uint64_t seed,
                                    double val_fraction) {
    dsc_data_loader_options o = {path, val_fraction, 256, B, T, M, rank, dp, seed};
    dsc_data_loader *dl;
    assert_ok(dsc_data_loader_open(&o, &dl));
    return dl;
}

static void test_epoch_is_a_permutation(void **state) {
    (void)state;
    char path[256];
    temp_path(path, sizeof path, "perm.tok");
    write_ramp(path, 1000, DSC_TOKEN_DTYPE_U16);
    const int T = 7;
    dsc_data_loader *dl = open_loader(path, 1, T, 1, 0, 1, 42, 0.0);
    int64_t W = dsc_data_loader_windows(dl, DSC_DATA_SPLIT_TRAIN);
    assert_int_equal(W, 999 / T);
    for (int64_t epoch = 0; epoch < 3; epoch++) {
        int64_t first = dsc_data_loader_sample_start(dl, DSC_DATA_SPLIT_TRAIN, epoch * W);
        int64_t offset = first % T;
        char *seen = calloc((size_t)W, 1);
        for (int64_t j = 0; j < W; j++) {
            int64_t start = dsc_data_loader_sample_start(dl, DSC_DATA_SPLIT_TRAIN, epoch * W + j);
            assert_int_equal(start % T, offset); /* one offset per epoch */
            assert_true(start + T + 1 <= 1000);  /* the sequence fits */
            assert_false(seen[start / T]);       /* no window twice */
            seen[start / T] = 1;
        }
        free(seen);
    }
    /* The order is shuffled, not the identity. */
    int identity = 1;
    for (int64_t j = 0; j < 10; j++)
        identity &= dsc_data_loader_sample_start(dl, DSC_DATA_SPLIT_TRAIN, j) / T == j;
    assert_false(identity);
    dsc_data_loader_close(dl);
    unlink(path);
}

static void fill(dsc_data_loader *dl, dsc_data_split split, int64_t step, int micro, int B, int T, int32_t *tok,
                 int32_t *tgt) {
    int64_t shape[2] = {B, T};
    dsc_tensor a = dsc_tensor_view(tok, DSC_DTYPE_I32, 2, shape, DSC_CPU);
    dsc_tensor b = dsc_tensor_view(tgt, DSC_DTYPE_I32, 2, shape, DSC_CPU);
    assert_ok(dsc_data_loader_fill(dl, split, step, micro, &a, &b));
}

enum { B = 2, T = 8, M = 3, DP = 4 };

static void test_ranks_disjoint_and_match_accumulation(void **state) {
    (void)state;
    char path[256];
    temp_path(path, sizeof path, "dp.tok");
    write_ramp(path, 5000, DSC_TOKEN_DTYPE_U32);
    dsc_data_loader *one = open_loader(path, B, T, M * DP, 0, 1, 7, 0.1);
    dsc_data_loader *ranks[DP];
    for (int r = 0; r < DP; r++)
        ranks[r] = open_loader(path, B, T, M, r, DP, 7, 0.1);
    int32_t tok[B * T], tgt[B * T], ref_tok[B * T], ref_tgt[B * T];
    for (int64_t step = 0; step < 4; step++) {
        for (int r = 0; r < DP; r++) {
            for (int m = 0; m < M; m++) {
                fill(ranks[r], DSC_DATA_SPLIT_TRAIN, step, m, B, T, tok, tgt);
                fill(one, DSC_DATA_SPLIT_TRAIN, step, m * DP + r, B, T, ref_tok, ref_tgt);
                assert_memory_equal(tok, ref_tok, sizeof tok);
                assert_memory_equal(tgt, ref_tgt, sizeof tgt);
                /* targets are the inputs shifted by one (the ramp makes that checkable) */
                for (int b = 0; b < B; b++)
                    for (int t = 0; t + 1 < T; t++)
                        assert_int_equal(tgt[b * T + t], tok[b * T + t + 1]);
            }
        }
        /* Disjoint: no two sequences of one global batch start at the same place. */
        const int n = DP * M * B;
        for (int i = 0; i < n; i++) {
            int64_t ki = dsc_data_loader_sample_start(one, DSC_DATA_SPLIT_TRAIN, step * DP * M * B + i);
            for (int j = 0; j < i; j++)
                assert_true(ki != dsc_data_loader_sample_start(one, DSC_DATA_SPLIT_TRAIN, step * DP * M * B + j));
        }
    }
    dsc_data_loader_close(one);
    for (int r = 0; r < DP; r++)
        dsc_data_loader_close(ranks[r]);
    unlink(path);
}

static void test_deterministic_and_resumable(void **state) {
    (void)state;
    char path[256];
    temp_path(path, sizeof path, "det.tok");
    write_ramp(path, 600, DSC_TOKEN_DTYPE_U16);
    dsc_data_loader *a = open_loader(path, B, T, M, 1, 2, 99, 0.0);
    int32_t tok[B * T], tgt[B * T], tok2[B * T], tgt2[B * T];
    /* Run a through steps 0..9 (several epochs of this small file) ... */
    for (int64_t step = 0; step < 10; step++)
        for (int m = 0; m < M; m++)
            fill(a, DSC_DATA_SPLIT_TRAIN, step, m, B, T, tok, tgt);
    assert_true(dsc_data_loader_epoch(a, 10) >= 1);
    /* ... then a fresh loader asked for step 10 directly must agree: the step is the whole state. */
    dsc_data_loader *b = open_loader(path, B, T, M, 1, 2, 99, 0.0);
    for (int m = 0; m < M; m++) {
        fill(a, DSC_DATA_SPLIT_TRAIN, 10, m, B, T, tok, tgt);
        fill(b, DSC_DATA_SPLIT_TRAIN, 10, m, B, T, tok2, tgt2);
        assert_memory_equal(tok, tok2, sizeof tok);
    }
    /* Another seed gives another order. */
    dsc_data_loader *c = open_loader(path, B, T, M, 1, 2, 100, 0.0);
    fill(c, DSC_DATA_SPLIT_TRAIN, 10, 0, B, T, tok2, tgt2);
    fill(a, DSC_DATA_SPLIT_TRAIN, 10, 0, B, T, tok, tgt);
    assert_true(memcmp(tok, tok2, sizeof tok) != 0);
    dsc_data_loader_close(a);
    dsc_data_loader_close(b);
    dsc_data_loader_close(c);
    unlink(path);
}

static void test_val_split_and_errors(void **state) {
    (void)state;
    char path[256];
    temp_path(path, sizeof path, "val.tok");
    write_ramp(path, 1000, DSC_TOKEN_DTYPE_U16);
    dsc_data_loader *dl = open_loader(path, B, T, 1, 0, 1, 1, 0.2);
    /* val = tokens [800, 1000), read in order */
    assert_int_equal(dsc_data_loader_sample_start(dl, DSC_DATA_SPLIT_VAL, 0), 800);
    assert_int_equal(dsc_data_loader_sample_start(dl, DSC_DATA_SPLIT_VAL, 1), 800 + T);
    int64_t W = dsc_data_loader_windows(dl, DSC_DATA_SPLIT_VAL);
    assert_int_equal(dsc_data_loader_sample_start(dl, DSC_DATA_SPLIT_VAL, W), 800);
    for (int64_t k = 0; k < 500; k++)
        assert_true(dsc_data_loader_sample_start(dl, DSC_DATA_SPLIT_TRAIN, k) + T + 1 <= 800);
    /* wrong shapes */
    int32_t buf[64];
    int64_t bad_shape[2] = {B, T + 1};
    dsc_tensor x = dsc_tensor_view(buf, DSC_DTYPE_I32, 2, bad_shape, DSC_CPU);
    assert_err(dsc_data_loader_fill(dl, DSC_DATA_SPLIT_TRAIN, 0, 0, &x, &x), DSC_ERR_INVALID,
               "data loader tokens");
    dsc_data_loader_close(dl);

    dsc_data_loader_options o = {path, 0.995, 256, B, T, 1, 0, 1, 1};
    assert_err(dsc_data_loader_open(&o, &dl), DSC_ERR_INVALID, "the train split has 5 tokens");
    o.val_fraction = 0.005;
    assert_err(dsc_data_loader_open(&o, &dl), DSC_ERR_INVALID, "the val split has 5 tokens");
    o.val_fraction = 0;
    o.vocab_size = 100;
    assert_ok(dsc_data_loader_open(&o, &dl));
    int32_t tok[B * T], tgt[B * T];
    int64_t shape[2] = {B, T};
    dsc_tensor a = dsc_tensor_view(tok, DSC_DTYPE_I32, 2, shape, DSC_CPU);
    dsc_tensor b = dsc_tensor_view(tgt, DSC_DTYPE_I32, 2, shape, DSC_CPU);
    dsc_status s = NULL;
    for (int64_t step = 0; step < 100 && !s; step++)
        s = dsc_data_loader_fill(dl, DSC_DATA_SPLIT_TRAIN, step, 0, &a, &b);
    assert_err(s, DSC_ERR_CORRUPT, "is >= vocab size 100");
    assert_err(dsc_data_loader_fill(dl, DSC_DATA_SPLIT_VAL, 0, 0, &a, &b), DSC_ERR_INVALID,
               "the val split is empty");
    dsc_data_loader_close(dl);
    o.path = "/nonexistent/train.tok";
    assert_err(dsc_data_loader_open(&o, &dl), DSC_ERR_IO, "data file /nonexistent/train.tok");
    o.path = "/tmp"; /* a directory: named as such, with the key, not "mmap: No such device" */
    assert_err(dsc_data_loader_open(&o, &dl), DSC_ERR_IO,
               "\"data.path\" /tmp: data file /tmp is a directory, not a token file");
    unlink(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_token_file_round_trip),
        cmocka_unit_test(test_token_file_errors),
        cmocka_unit_test(test_byte_tokenizer_and_prepare),
        cmocka_unit_test(test_epoch_is_a_permutation),
        cmocka_unit_test(test_ranks_disjoint_and_match_accumulation),
        cmocka_unit_test(test_deterministic_and_resumable),
        cmocka_unit_test(test_val_split_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
