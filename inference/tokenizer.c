/* The tokenizer API over both kinds of tokenizer: the byte tokenizer, lookup
 * tables shared with the BPE loader, decoding, and streaming decoding that
 * holds back incomplete UTF-8 characters.
 *
 * Parsing tokenizer.json lives in tokenizer_json.c and the encoding pipeline
 * in tokenizer_bpe.c; this file knows neither format nor algorithm, only the
 * per-id byte strings both kinds decode through. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

static uint32_t hash_bytes(const char *s, size_t len) {
    uint32_t h = 2166136261u; /* FNV-1a */
    for (size_t i = 0; i < len; i++)
        h = (h ^ (uint8_t)s[i]) * 16777619u;
    return h;
}

static uint32_t hash_pair(uint64_t key) {
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (uint32_t)key;
}

static uint32_t table_size(int64_t n) {
    uint32_t size = 16;
    while (size < 2 * n)
        size *= 2;
    return size;
}

int32_t dsc_tok_vocab_find(const dsc_tokenizer *t, const char *s, size_t len) {
    if (!t->str_slots) return -1;
    for (uint32_t h = hash_bytes(s, len) & t->str_mask;; h = (h + 1) & t->str_mask) {
        int32_t e = t->str_slots[h];
        if (e == 0) return -1;
        const char *k = t->token_str[e - 1];
        if (strlen(k) == len && memcmp(k, s, len) == 0) return e - 1;
    }
}

bool dsc_tok_merge_find(const dsc_tokenizer *t, int32_t left, int32_t right, int32_t *rank, int32_t *result) {
    if (!t->pair_keys) return false;
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint32_t h = hash_pair(key) & t->pair_mask;; h = (h + 1) & t->pair_mask) {
        if (t->pair_rank[h] == 0) return false;
        if (t->pair_keys[h] == key) {
            *rank = t->pair_rank[h] - 1;
            *result = t->pair_result[h];
            return true;
        }
    }
}

dsc_status dsc_tok_index_vocab(dsc_tokenizer *t) {
    uint32_t size = table_size(t->vocab_size);
    t->str_slots = calloc(size, sizeof(int32_t));
    DSC_CHECK(t->str_slots, DSC_ERR_NOMEM, "tokenizer: out of memory for the vocabulary table");
    t->str_mask = size - 1;
    for (int32_t id = 0; id < t->vocab_size; id++) {
        const char *s = t->token_str[id];
        if (!s || dsc_tok_vocab_find(t, s, strlen(s)) >= 0) continue;
        uint32_t h = hash_bytes(s, strlen(s)) & t->str_mask;
        while (t->str_slots[h])
            h = (h + 1) & t->str_mask;
        t->str_slots[h] = id + 1;
    }
    return NULL;
}

dsc_status dsc_tok_index_merges(dsc_tokenizer *t, int32_t n_merges, const int32_t *left, const int32_t *right,
                                const int32_t *result) {
    uint32_t size = table_size(n_merges);
    t->pair_keys = calloc(size, sizeof(uint64_t));
    t->pair_rank = calloc(size, sizeof(int32_t));
    t->pair_result = calloc(size, sizeof(int32_t));
    DSC_CHECK(t->pair_keys && t->pair_rank && t->pair_result, DSC_ERR_NOMEM,
              "tokenizer: out of memory for the merge table");
    t->pair_mask = size - 1;
    for (int32_t r = 0; r < n_merges; r++) {
        int32_t rank, res;
        if (dsc_tok_merge_find(t, left[r], right[r], &rank, &res)) continue;
        uint64_t key = (uint64_t)(uint32_t)left[r] << 32 | (uint32_t)right[r];
        uint32_t h = hash_pair(key) & t->pair_mask;
        while (t->pair_rank[h])
            h = (h + 1) & t->pair_mask;
        t->pair_keys[h] = key;
        t->pair_rank[h] = r + 1;
        t->pair_result[h] = result[r];
    }
    return NULL;
}

dsc_status dsc_tokenizer_create_bytes(dsc_tokenizer **out) {
    *out = NULL;
    dsc_tokenizer *t = calloc(1, sizeof *t);
    DSC_CHECK(t, DSC_ERR_NOMEM, "byte tokenizer: out of memory");
    t->vocab_size = 256;
    t->unk_id = -1;
    t->token_bytes = calloc(256, sizeof(char *));
    t->token_len = calloc(256, sizeof(size_t));
    bool ok = t->token_bytes && t->token_len;
    for (int b = 0; ok && b < 256; b++) {
        ok = (t->token_bytes[b] = malloc(1)) != NULL;
        if (ok) t->token_bytes[b][0] = (char)b;
        t->token_len[b] = 1;
    }
    if (!ok) {
        dsc_tokenizer_destroy(t);
        return dsc_error(DSC_ERR_NOMEM, "byte tokenizer: out of memory");
    }
    *out = t;
    return NULL;
}

void dsc_tokenizer_destroy(dsc_tokenizer *t) {
    if (!t) return;
    for (int32_t i = 0; i < t->vocab_size; i++) {
        if (t->token_str) free(t->token_str[i]);
        if (t->token_bytes) free(t->token_bytes[i]);
    }
    free(t->token_str);
    free(t->token_bytes);
    free(t->token_len);
    free(t->str_slots);
    free(t->pair_keys);
    free(t->pair_rank);
    free(t->pair_result);
    for (int i = 0; i < t->n_norms; i++) {
        free(t->norms[i].text);
        free(t->norms[i].content);
    }
    free(t->norms);
    for (int i = 0; i < t->n_pres; i++)
        free(t->pres[i].replacement);
    free(t->pres);
    for (int i = 0; i < t->n_added; i++)
        free(t->added[i].content);
    free(t->added);
    free(t);
}

int32_t dsc_tokenizer_vocab_size(const dsc_tokenizer *t) {
    return t->vocab_size;
}

int32_t dsc_tokenizer_token_id(const dsc_tokenizer *t, const char *token) {
    return dsc_tok_vocab_find(t, token, strlen(token));
}

dsc_status dsc_tokenizer_encode(const dsc_tokenizer *t, const char *text, size_t len, int32_t *ids, int64_t cap,
                                int64_t *n_out) {
    tok_ids o = {ids, cap, 0};
    if (t->is_bpe) {
        DSC_TRY(dsc_tok_bpe_encode(t, text, len, &o));
    } else {
        for (size_t i = 0; i < len; i++)
            tok_ids_push(&o, (uint8_t)text[i]);
    }
    *n_out = o.n;
    DSC_CHECK(o.n <= cap, DSC_ERR_INVALID, "tokenizer: text of %zu bytes needs %lld ids, buffer holds %lld", len,
              (long long)o.n, (long long)cap);
    return NULL;
}

static dsc_status check_id(const dsc_tokenizer *t, int32_t id) {
    DSC_CHECK(id >= 0 && id < t->vocab_size && t->token_bytes[id], DSC_ERR_INVALID,
              "tokenizer: id %d is not in the vocabulary (size %d)", id, t->vocab_size);
    return NULL;
}

dsc_status dsc_tokenizer_decode(const dsc_tokenizer *t, const int32_t *ids, int64_t n, char *out, size_t cap,
                                size_t *len_out) {
    DSC_CHECK(cap > 0, DSC_ERR_INVALID, "tokenizer: decode needs a buffer of at least 1 byte");
    size_t len = 0;
    for (int64_t i = 0; i < n; i++) {
        DSC_TRY(check_id(t, ids[i]));
        const char *b = t->token_bytes[ids[i]];
        size_t bl = t->token_len[ids[i]];
        if (i == 0 && bl > 0 && b[0] == ' ' && t->strip_leading_space) b++, bl--;
        DSC_CHECK(len + bl < cap, DSC_ERR_INVALID, "tokenizer: decoded text exceeds the %zu-byte buffer", cap);
        memcpy(out + len, b, bl);
        len += bl;
    }
    out[len] = '\0';
    *len_out = len;
    return NULL;
}

void dsc_tokenizer_stream_init(dsc_tokenizer_stream *s) {
    memset(s, 0, sizeof *s);
}

/* Length of the longest prefix of b[0, n) that does not end inside a UTF-8
 * character which later bytes could still complete. Invalid bytes count as
 * complete (they are passed through, never held forever). */
static size_t complete_prefix(const uint8_t *b, size_t n) {
    size_t i = 0, done = 0;
    while (i < n) {
        int k = dsc_tok_utf8_seq_len(b[i]);
        if (k <= 1) {
            i++;
            done = i;
            continue;
        }
        size_t j = 1;
        while (j < (size_t)k && i + j < n && (b[i + j] & 0xC0) == 0x80)
            j++;
        if (j == (size_t)k || i + j < n) {
            i += j; /* complete, or broken by a non-continuation byte */
            done = i;
        } else {
            break; /* truncated at the end: wait for more bytes */
        }
    }
    return done;
}

dsc_status dsc_tokenizer_decode_next(const dsc_tokenizer *t, dsc_tokenizer_stream *s, int32_t id, char *out,
                                     size_t cap, size_t *len_out) {
    DSC_TRY(check_id(t, id));
    const uint8_t *b = (const uint8_t *)t->token_bytes[id];
    size_t bl = t->token_len[id], n = (size_t)s->n_pending + bl;
    DSC_CHECK(n < cap, DSC_ERR_INVALID, "tokenizer: streaming decode of id %d needs %zu bytes, buffer holds %zu",
              id, n + 1, cap);
    memcpy(out, s->pending, (size_t)s->n_pending);
    memcpy(out + s->n_pending, b, bl);
    size_t ready = complete_prefix((const uint8_t *)out, n);
    s->n_pending = (int)(n - ready);
    memcpy(s->pending, out + ready, (size_t)s->n_pending);
    size_t skip = 0;
    if (!s->started && ready > 0) {
        s->started = true;
        skip = t->strip_leading_space && out[0] == ' ';
    }
    memmove(out, out + skip, ready - skip);
    out[ready - skip] = '\0';
    *len_out = ready - skip;
    return NULL;
}

dsc_status dsc_tokenizer_decode_finish(dsc_tokenizer_stream *s, char *out, size_t cap, size_t *len_out) {
    DSC_CHECK((size_t)s->n_pending < cap, DSC_ERR_INVALID, "tokenizer: finishing a stream needs %d bytes",
              s->n_pending + 1);
    memcpy(out, s->pending, (size_t)s->n_pending);
    out[s->n_pending] = '\0';
    *len_out = (size_t)s->n_pending;
    dsc_tokenizer_stream_init(s);
    return NULL;
}
