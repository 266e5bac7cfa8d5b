/* Megatron-LM indexed datasets as training data: the fixtures written by an
 * independent numpy restatement of Megatron's writer
 * (make_megatron_fixtures.py: uint16 and int32, a document per paragraph,
 * a sequence per line of tinyshakespeare) read back through
 * dsc_token_file as exactly the text's bytes, by PREFIX, PREFIX.bin or
 * PREFIX.idx, and through the data loader; then crafted bad indexes (each
 * field of the header, sizes, pointers, document indices, trailing bytes,
 * multimodal modes) and token ids outside the vocabulary are refused with
 * messages naming the field. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/data.h"
#include "test_mpi.h"

#define FIXTURES DSC_SOURCE_DIR "/tests/data/fixtures/"

static unsigned char *text_bytes(int64_t n) {
    FILE *fp = fopen(DSC_SOURCE_DIR "/data/tinyshakespeare.txt", "rb");
    assert_non_null(fp);
    unsigned char *buf = malloc((size_t)n);
    assert_int_equal(fread(buf, 1, (size_t)n, fp), (size_t)n);
    fclose(fp);
    return buf;
}

static void check_stream(const char *path, int64_t n) {
    dsc_token_file *f;
    assert_ok(dsc_token_file_open(path, &f));
    assert_int_equal(dsc_token_file_count(f), n);
    unsigned char *want = text_bytes(n);
    int32_t *got = malloc((size_t)n * sizeof *got);
    assert_ok(dsc_token_file_read(f, 0, n, 256, got));
    for (int64_t i = 0; i < n; i++)
        assert_int_equal(got[i], want[i]);
    /* reads that start and end inside sequences */
    for (int64_t pos = 0; pos + 37 <= n; pos += 101) {
        assert_ok(dsc_token_file_read(f, pos, 37, 256, got));
        for (int64_t i = 0; i < 37; i++)
            assert_int_equal(got[i], want[pos + i]);
    }
    assert_err(dsc_token_file_read(f, n - 3, 4, 256, got), DSC_ERR_INVALID, "outside its");
    assert_err(dsc_token_file_read(f, 0, 10, 65, got), DSC_ERR_CORRUPT, "is outside [0, 65)");
    printf("%s: %lld tokens, equal to the text's bytes\n", path, (long long)n);
    free(got);
    free(want);
    dsc_token_file_close(f);
}

static void test_fixtures(void **state) {
    (void)state;
    check_stream(FIXTURES "ts_u16", 3000);
    check_stream(FIXTURES "ts_u16.bin", 3000);
    check_stream(FIXTURES "ts_i32.idx", 1000);
}

static void test_loader(void **state) {
    (void)state;
    dsc_data_loader_options o = {.path = FIXTURES "ts_u16",
                                 .vocab_size = 256,
                                 .micro_batch_size = 2,
                                 .seq_len = 16,
                                 .micro_batches = 1,
                                 .dp_size = 1,
                                 .seed = 3};
    dsc_data_loader *dl;
    assert_ok(dsc_data_loader_open(&o, &dl));
    int32_t tok[32], tgt[32];
    dsc_tensor tokens = dsc_tensor_view(tok, DSC_DTYPE_I32, 2, (int64_t[]){2, 16}, DSC_CPU);
    dsc_tensor targets = dsc_tensor_view(tgt, DSC_DTYPE_I32, 2, (int64_t[]){2, 16}, DSC_CPU);
    unsigned char *want = text_bytes(3000);
    for (int step = 0; step < 5; step++) {
        assert_ok(dsc_data_loader_fill(dl, DSC_DATA_SPLIT_TRAIN, step, 0, &tokens, &targets));
        for (int b = 0; b < 2; b++) {
            int64_t start = dsc_data_loader_sample_start(dl, DSC_DATA_SPLIT_TRAIN, step * 2 + b);
            for (int t = 0; t < 16; t++) {
                assert_int_equal(tok[b * 16 + t], want[start + t]);
                assert_int_equal(tgt[b * 16 + t], want[start + t + 1]);
            }
        }
    }
    free(want);
    dsc_data_loader_close(dl);
}

/* ---- crafted files -------------------------------------------------------------------------- */

static char prefix[256];

/* Writes prefix.idx from the fields and prefix.bin with `bin_bytes` bytes of id 1 (uint16). */
static void write_index(const char *magic, uint64_t version, uint8_t code, uint64_t n, uint64_t d,
                        const int32_t *sizes, const int64_t *pointers, const int64_t *docs, size_t extra,
                        size_t bin_bytes) {
    char path[300];
    snprintf(path, sizeof path, "%s.idx", prefix);
    FILE *fp = fopen(path, "wb");
    assert_non_null(fp);
    fwrite(magic, 1, 9, fp);
    fwrite(&version, 8, 1, fp);
    fwrite(&code, 1, 1, fp);
    fwrite(&n, 8, 1, fp);
    fwrite(&d, 8, 1, fp);
    fwrite(sizes, 4, 2, fp); /* the crafted cases describe two sequences and two documents */
    fwrite(pointers, 8, 2, fp);
    fwrite(docs, 8, 2, fp);
    for (size_t i = 0; i < extra; i++)
        fputc(0, fp);
    fclose(fp);
    snprintf(path, sizeof path, "%s.bin", prefix);
    fp = fopen(path, "wb");
    assert_non_null(fp);
    for (size_t i = 0; i < bin_bytes; i++)
        fputc(i % 2 == 0 ? 1 : 0, fp);
    fclose(fp);
}

static const char MAGIC[] = "MMIDIDX\0\0";

static void expect_open_error(int code, const char *needle) {
    dsc_token_file *f = NULL;
    assert_err(dsc_token_file_open(prefix, &f), code, needle);
    assert_null(f);
}

static void test_crafted(void **state) {
    (void)state;
    snprintf(prefix, sizeof prefix, "/tmp/dsc_test_megatron_%d", (int)getpid());
    const int32_t sizes[2] = {3, 2};
    const int64_t ptrs[2] = {0, 6}, docs[2] = {0, 2};
    /* the good file first: 5 tokens of id 1 */
    write_index(MAGIC, 1, 8, 2, 2, sizes, ptrs, docs, 0, 10);
    dsc_token_file *f;
    assert_ok(dsc_token_file_open(prefix, &f));
    assert_int_equal(dsc_token_file_count(f), 5);
    dsc_token_file_close(f);

    write_index("MMIDIDY\0\0", 1, 8, 2, 2, sizes, ptrs, docs, 0, 10);
    expect_open_error(DSC_ERR_CORRUPT, "bad magic");
    write_index(MAGIC, 2, 8, 2, 2, sizes, ptrs, docs, 0, 10);
    expect_open_error(DSC_ERR_CORRUPT, "version 2");
    write_index(MAGIC, 1, 7, 2, 2, sizes, ptrs, docs, 0, 10);
    expect_open_error(DSC_ERR_UNSUPPORTED, "float type");
    write_index(MAGIC, 1, 9, 2, 2, sizes, ptrs, docs, 0, 10);
    expect_open_error(DSC_ERR_CORRUPT, "unknown dtype code 9");
    write_index(MAGIC, 1, 8, 3, 2, sizes, ptrs, docs, 0, 10); /* one sequence more than the arrays hold */
    expect_open_error(DSC_ERR_CORRUPT, "need more than");
    write_index(MAGIC, 1, 8, 1ull << 62, 2, sizes, ptrs, docs, 0, 10); /* a count whose byte size overflows */
    expect_open_error(DSC_ERR_CORRUPT, "need more than");
    write_index(MAGIC, 1, 8, 2, 2, sizes, ptrs, docs, 3, 10); /* trailing bytes */
    expect_open_error(DSC_ERR_CORRUPT, "but the file has");
    write_index(MAGIC, 1, 8, 2, 2, sizes, ptrs, docs, 2, 10); /* one i8 mode per sequence */
    expect_open_error(DSC_ERR_UNSUPPORTED, "multimodal");
    write_index(MAGIC, 1, 8, 2, 2, sizes, (const int64_t[]){0, 8}, docs, 0, 10); /* sequence 1 ends past .bin */
    expect_open_error(DSC_ERR_CORRUPT, "sequence 1 (2 tokens at byte 8) lies outside");
    write_index(MAGIC, 1, 8, 2, 2, (const int32_t[]){3, -1}, ptrs, docs, 0, 10);
    expect_open_error(DSC_ERR_CORRUPT, "sequence 1 (-1 tokens");
    write_index(MAGIC, 1, 8, 2, 2, sizes, (const int64_t[]){-2, 6}, docs, 0, 10);
    expect_open_error(DSC_ERR_CORRUPT, "sequence 0 (3 tokens at byte -2)");
    write_index(MAGIC, 1, 8, 2, 2, sizes, ptrs, (const int64_t[]){1, 2}, 0, 10);
    expect_open_error(DSC_ERR_CORRUPT, "doc_idx[0] = 1");
    write_index(MAGIC, 1, 8, 2, 2, sizes, ptrs, (const int64_t[]){0, 1}, 0, 10);
    expect_open_error(DSC_ERR_CORRUPT, "last doc_idx is 1");
    write_index(MAGIC, 1, 8, 2, 2, sizes, ptrs, (const int64_t[]){0, 3}, 0, 10);
    expect_open_error(DSC_ERR_CORRUPT, "doc_idx[1] = 3");

    /* a negative id in an int32 dataset */
    write_index(MAGIC, 1, 4, 2, 2, (const int32_t[]){1, 1}, (const int64_t[]){0, 4}, docs, 0, 0);
    char path[300];
    snprintf(path, sizeof path, "%s.bin", prefix);
    FILE *fp = fopen(path, "wb");
    int32_t ids[2] = {5, -7};
    fwrite(ids, 4, 2, fp);
    fclose(fp);
    assert_ok(dsc_token_file_open(prefix, &f));
    int32_t out[2];
    assert_err(dsc_token_file_read(f, 0, 2, 256, out), DSC_ERR_CORRUPT, "token id -7 (sequence 1");
    dsc_token_file_close(f);

    snprintf(path, sizeof path, "%s.idx", prefix);
    remove(path);
    snprintf(path, sizeof path, "%s.bin", prefix);
    remove(path);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fixtures),
        cmocka_unit_test(test_loader),
        cmocka_unit_test(test_crafted),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
