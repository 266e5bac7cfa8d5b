/* Private to inference/: the pre-tokenization pieces of the BPE tokenizer —
 * hand-written equivalents of the GPT-2 / Llama-3 / Qwen2 split regexes, the
 * Unicode classes they use, UTF-8 stepping and GPT-2's byte <-> unicode map. */
#ifndef DSC_INFERENCE_TOKENIZER_PRETOK_H
#define DSC_INFERENCE_TOKENIZER_PRETOK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum dsc_tok_pattern {
    DSC_TOK_PATTERN_GPT2 = 0, /* 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ */
    DSC_TOK_PATTERN_LLAMA3,   /* (?i:'s|...)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|... */
    DSC_TOK_PATTERN_QWEN2     /* Llama-3's with \p{N} instead of \p{N}{1,3} */
} dsc_tok_pattern;

/* Recognises one of the patterns above in a tokenizer.json Split regex. */
bool dsc_tok_pattern_from_regex(const char *regex, dsc_tok_pattern *out);
/* Byte length (> 0) of the regex match starting at text[pos], pos < len.
 * Matches tile the text, as Split with behavior "Isolated" uses them. */
size_t dsc_tok_pattern_match(dsc_tok_pattern p, const char *text, size_t len, size_t pos);

/* Decodes the UTF-8 character at text[pos] (pos < len) and sets *n to its
 * byte length; an invalid byte decodes as itself, 1 byte long. */
uint32_t dsc_tok_utf8_next(const char *text, size_t len, size_t pos, size_t *n);
/* Writes cp as UTF-8 to out (4 bytes room); returns its length. */
size_t dsc_tok_utf8_put(uint32_t cp, char *out);
/* Length (1..4) of a UTF-8 sequence announced by lead byte b, or 0 if b cannot start one. */
int dsc_tok_utf8_seq_len(uint8_t b);

bool dsc_tok_is_letter(uint32_t cp);
bool dsc_tok_is_number(uint32_t cp);
bool dsc_tok_is_space(uint32_t cp);

/* GPT-2's reversible map of bytes to printable code points, and back
 * (-1 for a code point no byte maps to). */
uint32_t dsc_tok_byte_to_unicode(uint8_t b);
int dsc_tok_unicode_to_byte(uint32_t cp);

#endif
