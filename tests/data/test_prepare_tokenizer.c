/* `dsc-train --prepare TEXT OUT --tokenizer tokenizer.json`: texts of the
 * tokenizer fixture corpus (tests/ref/tokenizer_ref.py) are prepared with
 * the byte-level BPE (GPT-2 regex) and SentencePiece-style BPE fixtures,
 * and the token file must hold the ids Hugging Face `tokenizers` gave for
 * the same text (tokenizer_expected.json), in the dtype and with the
 * vocabulary size the tokenizer implies. Also: without --tokenizer the
 * bytes, and a missing tokenizer file names it. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "dsc/data.h"
#include "test_mpi.h"

#define FIXTURES DSC_SOURCE_DIR "/tests/inference/fixtures/"
#define APP DSC_BINARY_DIR "/bin/dsc-train"

static cJSON *expected;
static char text_path[256], tok_path[256];

static int setup(void **state) {
    (void)state;
    char *buf = dsc_test_read_file(FIXTURES "tokenizer_expected.json");
    expected = cJSON_Parse(buf);
    free(buf);
    assert_non_null(expected);
    snprintf(text_path, sizeof text_path, "/tmp/dsc_test_prepare_%d.txt", (int)getpid());
    snprintf(tok_path, sizeof tok_path, "/tmp/dsc_test_prepare_%d.tok", (int)getpid());
    return 0;
}

static int teardown(void **state) {
    (void)state;
    cJSON_Delete(expected);
    remove(text_path);
    remove(tok_path);
    return 0;
}

static int run_prepare(const char *tokenizer) {
    char cmd[2048];
    remove(tok_path);
    snprintf(cmd, sizeof cmd, "%s --prepare %s %s%s%s", APP, text_path, tok_path, tokenizer ? " --tokenizer " : "",
             tokenizer ? tokenizer : "");
    return system(cmd);
}

static void check_text(const char *file, int index) {
    const cJSON *text = cJSON_GetArrayItem(cJSON_GetObjectItem(expected, "corpus"), index);
    const cJSON *f = cJSON_GetObjectItem(cJSON_GetObjectItem(expected, "files"), file);
    const cJSON *ids = cJSON_GetArrayItem(cJSON_GetObjectItem(f, "ids"), index);
    int vocab = cJSON_GetObjectItem(f, "vocab_size")->valueint;
    FILE *fp = fopen(text_path, "wb");
    assert_non_null(fp);
    fputs(text->valuestring, fp);
    fclose(fp);
    char tokenizer[512];
    snprintf(tokenizer, sizeof tokenizer, FIXTURES "%s", file);
    assert_int_equal(run_prepare(tokenizer), 0);
    dsc_token_file *tf;
    assert_ok(dsc_token_file_open(tok_path, &tf));
    int n = cJSON_GetArraySize(ids);
    assert_int_equal(dsc_token_file_count(tf), n);
    assert_int_equal(dsc_token_file_vocab(tf), vocab);
    assert_int_equal(dsc_token_file_dtype(tf), DSC_TOKEN_DTYPE_U16);
    int32_t *got = malloc((size_t)(n ? n : 1) * sizeof *got);
    assert_ok(dsc_token_file_read(tf, 0, n, vocab, got));
    for (int i = 0; i < n; i++)
        assert_int_equal(got[i], cJSON_GetArrayItem(ids, i)->valueint);
    printf("%s, corpus text %d: %d ids equal to Hugging Face tokenizers'\n", file, index, n);
    free(got);
    dsc_token_file_close(tf);
}

static void test_hf_tokenizers(void **state) {
    (void)state;
    const int texts[] = {1, 5, 8, 18};
    for (int i = 0; i < 4; i++) {
        check_text("gpt2_bpe.json", texts[i]);
        check_text("sp_bpe.json", texts[i]);
    }
}

static void test_bytes_and_errors(void **state) {
    (void)state;
    FILE *fp = fopen(text_path, "wb");
    fputs("héllo", fp);
    fclose(fp);
    assert_int_equal(run_prepare(NULL), 0);
    dsc_token_file *tf;
    assert_ok(dsc_token_file_open(tok_path, &tf));
    assert_int_equal(dsc_token_file_count(tf), 6); /* é is two bytes */
    assert_int_equal(dsc_token_file_vocab(tf), 256);
    dsc_token_file_close(tf);
    assert_int_not_equal(run_prepare("/nonexistent/tokenizer.json"), 0);
    assert_int_not_equal(access(tok_path, F_OK), 0); /* nothing written */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hf_tokenizers),
        cmocka_unit_test(test_bytes_and_errors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
