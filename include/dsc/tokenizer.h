/* dsc/tokenizer.h — text <-> token ids for generation and serving.
 *
 * Two kinds behind one API: the byte tokenizer dsc's own models use (token =
 * byte value, vocabulary 256) and Hugging Face tokenizer.json files with a BPE
 * model: byte-level BPE (GPT-2, Llama-3, Qwen2: ByteLevel pre-tokenizer or a
 * Split with their regex, which dsc implements by hand) and SentencePiece-style
 * BPE (Llama-2, Mistral: "▁" for spaces, byte fallback <0xXX> tokens).
 * Added/special tokens are matched in the text before anything else.
 * Encoding returns the model's ids only: no BOS/EOS is added (the
 * post-processor of tokenizer.json is not applied); callers prepend
 * dsc_tokenizer_token_id(tok, "<s>") themselves where a model wants it.
 *
 * Decoding yields bytes that are UTF-8 for any id sequence the encoder made;
 * the streaming decoder returns, after each new id, only text whose UTF-8
 * characters are complete, so a character split across tokens (byte
 * fallback, byte-level pieces of an emoji) is never printed half. */
#ifndef DSC_TOKENIZER_H
#define DSC_TOKENIZER_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_tokenizer dsc_tokenizer;

/* The byte tokenizer: id i <-> byte i, vocabulary 256. */
DSC_API dsc_status dsc_tokenizer_create_bytes(dsc_tokenizer **out);
/* A Hugging Face tokenizer.json. Missing file: DSC_ERR_IO; malformed:
 * DSC_ERR_CORRUPT; a model, normalizer, pre-tokenizer or regex dsc does not
 * implement: DSC_ERR_UNSUPPORTED naming it. */
DSC_API dsc_status dsc_tokenizer_load(dsc_tokenizer **out, const char *path);
DSC_API void dsc_tokenizer_destroy(dsc_tokenizer *tok);

/* One more than the largest id. */
DSC_API int32_t dsc_tokenizer_vocab_size(const dsc_tokenizer *tok);
/* The id of a token given as its vocabulary string (e.g. "<|endoftext|>",
 * "<s>"), or -1. */
DSC_API int32_t dsc_tokenizer_token_id(const dsc_tokenizer *tok, const char *token);

/* Encodes len bytes of text into ids (capacity cap). *n_out is the number of
 * ids the text needs; when it exceeds cap the call fails with DSC_ERR_INVALID
 * naming it (no id is lost silently; retry with a larger buffer). len + 2
 * ids always suffice for a text without added tokens. */
DSC_API dsc_status dsc_tokenizer_encode(const dsc_tokenizer *tok, const char *text, size_t len, int32_t *ids,
                                        int64_t cap, int64_t *n_out);
/* Decodes n ids into out (capacity cap, NUL-terminated); *len_out is the text
 * length without the NUL. Too small a buffer or an id outside the vocabulary is
 * DSC_ERR_INVALID. */
DSC_API dsc_status dsc_tokenizer_decode(const dsc_tokenizer *tok, const int32_t *ids, int64_t n, char *out,
                                        size_t cap, size_t *len_out);

/* Incremental decoding of one sequence; zero-initialise or call _init. */
typedef struct dsc_tokenizer_stream {
    uint8_t pending[4]; /* an incomplete UTF-8 character carried to the next token */
    int n_pending;
    bool started; /* whether any text was produced (SentencePiece strips one leading space) */
} dsc_tokenizer_stream;

DSC_API void dsc_tokenizer_stream_init(dsc_tokenizer_stream *s);
/* Appends id and writes to out (capacity cap, NUL-terminated) the text that
 * became complete; *len_out may be 0 while a character is still partial. */
DSC_API dsc_status dsc_tokenizer_decode_next(const dsc_tokenizer *tok, dsc_tokenizer_stream *s, int32_t id,
                                             char *out, size_t cap, size_t *len_out);
/* Ends the stream: writes whatever bytes are still pending (an incomplete
 * character at the very end) and resets it. */
DSC_API dsc_status dsc_tokenizer_decode_finish(dsc_tokenizer_stream *s, char *out, size_t cap, size_t *len_out);

#ifdef __cplusplus
}
#endif
#endif
