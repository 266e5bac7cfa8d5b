/* The byte-level tokenizer (token = byte value, vocabulary 256) and the
 * prepare step that turns a text file into a token file with it or with any
 * encoder a caller plugs in (dsc-train passes the inference tokenizer of a
 * Hugging Face tokenizer.json).
 *
 * Deliberately the simplest tokenizer that trains a model on any text; not
 * here: BPE or any learned vocabulary (inference/tokenizer*.c). */
#include "dsc/data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void dsc_byte_tokenizer_encode(const char *text, size_t len, uint32_t *ids) {
    for (size_t i = 0; i < len; i++)
        ids[i] = (unsigned char)text[i];
}

size_t dsc_byte_tokenizer_decode(const int32_t *ids, int64_t n, char *out, size_t cap) {
    if (cap == 0) return 0;
    size_t w = 0;
    for (int64_t i = 0; i < n && w + 1 < cap; i++)
        out[w++] = ids[i] >= 0 && ids[i] < DSC_BYTE_VOCAB_SIZE ? (char)(unsigned char)ids[i] : '?';
    out[w] = '\0';
    return w;
}

static dsc_status read_text(const char *path, char **text, size_t *len) {
    FILE *fp = fopen(path, "rb");
    DSC_CHECK(fp, DSC_ERR_IO, "text file %s: cannot open: %s", path, strerror(errno));
    dsc_status s = NULL;
    long size = -1;
    if (fseek(fp, 0, SEEK_END) == 0) size = ftell(fp);
    if (size < 0 || fseek(fp, 0, SEEK_SET) != 0) s = dsc_error(DSC_ERR_IO, "text file %s: cannot seek", path);
    char *buf = s ? NULL : malloc((size_t)size + 1);
    if (!s && !buf) s = dsc_error(DSC_ERR_NOMEM, "text file %s: no memory for %ld bytes", path, size);
    if (!s && fread(buf, 1, (size_t)size, fp) != (size_t)size)
        s = dsc_error(DSC_ERR_IO, "text file %s: short read", path);
    fclose(fp);
    if (s) {
        free(buf);
        return s;
    }
    *text = buf;
    *len = (size_t)size;
    return NULL;
}

static dsc_status encode_bytes(void *ctx, const char *text, size_t len, int32_t *ids, int64_t cap,
                               int64_t *n_out) {
    (void)ctx;
    DSC_CHECK((int64_t)len <= cap, DSC_ERR_INVALID, "byte tokenizer: %zu bytes need %zu ids, room for %lld", len,
              len, (long long)cap);
    for (size_t i = 0; i < len; i++)
        ids[i] = (unsigned char)text[i];
    *n_out = (int64_t)len;
    return NULL;
}

dsc_status dsc_data_prepare_with(const char *text_path, const char *token_path, const dsc_text_encoder *enc,
                                 int64_t *count) {
    char *text = NULL;
    size_t len = 0;
    DSC_TRY(read_text(text_path, &text, &len));
    int64_t cap = (int64_t)len + 2, n = 0; /* dsc/tokenizer.h: len + 2 ids always suffice */
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    dsc_status s =
        ids ? enc->encode(enc->ctx, text, len, ids, cap, &n)
            : dsc_error(DSC_ERR_NOMEM, "preparing %s: no memory for %lld tokens", text_path, (long long)cap);
    free(text);
    /* ids are >= 0: reuse the buffer as the writer's unsigned ids */
    uint32_t *u = (uint32_t *)ids;
    for (int64_t i = 0; !s && i < n; i++)
        u[i] = (uint32_t)ids[i];
    dsc_token_dtype dtype = enc->vocab_size <= 65536 ? DSC_TOKEN_DTYPE_U16 : DSC_TOKEN_DTYPE_U32;
    if (!s)
        s = dsc_error_wrap(dsc_token_file_write(token_path, u, n, dtype, enc->vocab_size), "preparing %s",
                           text_path);
    free(ids);
    DSC_TRY(s);
    if (count) *count = n;
    return NULL;
}

dsc_status dsc_data_prepare(const char *text_path, const char *token_path, int64_t *count) {
    const dsc_text_encoder bytes = {NULL, DSC_BYTE_VOCAB_SIZE, encode_bytes};
    return dsc_data_prepare_with(text_path, token_path, &bytes, count);
}
