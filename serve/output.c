/* The text of a generated sequence as the client sees it: incremental
 * detokenization (complete UTF-8 characters only, dsc_tokenizer_stream),
 * stop strings (the text ends before the first one; bytes that may begin
 * one are held back until they cannot), and the UTF-8 clean-up JSON
 * strings need. Not here: which tokens stop a sequence (the scheduler's
 * stop tokens) or how text is framed (response.c). */
#include <stdlib.h>
#include <string.h>

#include "serve/serve_internal.h"

static bool text_add(serve_text *t, const char *s, size_t n) {
    if (t->len + n + 1 > t->cap) {
        size_t cap = t->cap ? t->cap : 256;
        while (cap < t->len + n + 1)
            cap *= 2;
        char *p = realloc(t->all, cap);
        if (!p) return false;
        t->all = p;
        t->cap = cap;
    }
    memcpy(t->all + t->len, s, n);
    t->len += n;
    t->all[t->len] = '\0';
    return true;
}

/* The longest k < |stop| with the text ending in stop[0..k), at most `room`. */
static size_t held_for(const serve_text *t, const char *stop, size_t room) {
    size_t n = strlen(stop), best = 0;
    for (size_t k = 1; k < n && k <= room; k++)
        if (memcmp(t->all + t->len - k, stop, k) == 0) best = k;
    return best;
}

dsc_status serve_text_append(serve_text *t, const dsc_tokenizer *tok, int32_t token, bool silent, bool last,
                             char *const *stop, int32_t n_stop, bool *stopped) {
    *stopped = false;
    char piece[1024];
    size_t n = 0;
    if (tok && !silent) {
        DSC_TRY(dsc_tokenizer_decode_next(tok, &t->dec, token, piece, sizeof piece, &n));
        DSC_CHECK(text_add(t, piece, n), DSC_ERR_NOMEM, "output text of %zu bytes", t->len + n);
    }
    if (tok && last) {
        DSC_TRY(dsc_tokenizer_decode_finish(&t->dec, piece, sizeof piece, &n));
        DSC_CHECK(text_add(t, piece, n), DSC_ERR_NOMEM, "output text of %zu bytes", t->len + n);
    }
    /* A stop string starts at or after `visible`: earlier starts were held back. */
    size_t first = t->len;
    for (int32_t i = 0; i < n_stop; i++) {
        size_t m = strlen(stop[i]);
        for (size_t at = t->visible; at + m <= t->len && at < first; at++)
            if (memcmp(t->all + at, stop[i], m) == 0) first = at;
    }
    if (first < t->len) {
        t->len = t->visible = first;
        t->all[first] = '\0';
        *stopped = true;
        return NULL;
    }
    size_t hold = 0;
    for (int32_t i = 0; i < n_stop && !last; i++) {
        size_t h = held_for(t, stop[i], t->len - t->visible);
        if (h > hold) hold = h;
    }
    t->visible = t->len - hold;
    return NULL;
}

void serve_text_free(serve_text *t) {
    free(t->all);
    *t = (serve_text){0};
}

/* Length of the valid UTF-8 character at s (n bytes left), 0 when invalid. */
static size_t utf8_char(const unsigned char *s, size_t n) {
    if (s[0] < 0x80) return 1;
    size_t len = (s[0] & 0xE0) == 0xC0 ? 2 : (s[0] & 0xF0) == 0xE0 ? 3 : (s[0] & 0xF8) == 0xF0 ? 4 : 0;
    if (len == 0 || len > n) return 0;
    for (size_t i = 1; i < len; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    uint32_t cp = len == 2 ? s[0] & 0x1Fu : len == 3 ? s[0] & 0x0Fu : s[0] & 0x07u;
    for (size_t i = 1; i < len; i++)
        cp = (cp << 6) | (s[i] & 0x3Fu);
    bool overlong = (len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000);
    if (overlong || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
    return len;
}

char *serve_utf8_clean(const char *s, size_t n) {
    char *out = malloc(3 * n + 1); /* each invalid byte becomes the 3 bytes of U+FFFD */
    if (!out) return NULL;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        size_t len = utf8_char((const unsigned char *)s + i, n - i);
        if (len && s[i] != '\0') {
            memcpy(out + o, s + i, len);
            o += len;
            i += len;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
            i++;
        }
    }
    out[o] = '\0';
    return out;
}
