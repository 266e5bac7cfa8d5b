/* libFuzzer harness: tokenizer.json. What loads is exercised: its own first
 * bytes (JSON punctuation, quotes, escapes, UTF-8) are encoded and decoded
 * back, and the first ids are decoded one at a time through the streaming
 * decoder, so vocabularies, merges, added tokens, normalizers and
 * pre-tokenizers a file can describe must never crash encode or decode. */
#include <stdlib.h>
#include <string.h>

#include "dsc/tokenizer.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write("tokenizer.json", data, size);
    dsc_tokenizer *tok;
    dsc_status s = dsc_tokenizer_load(&tok, path);
    if (s) {
        dsc_status_free(s);
        return 0;
    }
    size_t len = size < 256 ? size : 256;
    int64_t cap = (int64_t)len + 2, n = 0;
    int32_t *ids = malloc((size_t)cap * sizeof *ids);
    char out[8192];
    size_t out_len;
    s = dsc_tokenizer_encode(tok, (const char *)data, len, ids, cap, &n);
    if (!s) s = dsc_tokenizer_decode(tok, ids, n, out, sizeof out, &out_len);
    dsc_status_free(s);
    dsc_tokenizer_stream st;
    dsc_tokenizer_stream_init(&st);
    int32_t V = dsc_tokenizer_vocab_size(tok);
    for (int32_t id = 0; id < V && id < 512; id++)
        dsc_status_free(dsc_tokenizer_decode_next(tok, &st, id, out, sizeof out, &out_len));
    dsc_status_free(dsc_tokenizer_decode_finish(&st, out, sizeof out, &out_len));
    dsc_tokenizer_token_id(tok, "<s>");
    free(ids);
    dsc_tokenizer_destroy(tok);
    return 0;
}
