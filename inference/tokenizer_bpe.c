/* Encoding text with a tokenizer.json BPE tokenizer, in Hugging Face's
 * order: split out added tokens, normalize each remaining segment, pre-
 * tokenize it into pieces (regex split, byte-level mapping, Metaspace), then
 * run BPE merges inside each piece.
 *
 * Merges follow HF's order (lowest rank first, leftmost among equals) with
 * a heap, so a SentencePiece-style segment that is never split (Llama-2's
 * whole prompt is one piece) still costs O(n log n). Loading the file and
 * decoding live elsewhere. */
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

/* A mergeable adjacent pair: symbol `pos` (left) with its current right neighbour. */
typedef struct merge_cand {
    int32_t rank;
    int32_t pos;
    int32_t left, right; /* the ids when queued; a changed id means the entry is stale */
    int32_t result;
} merge_cand;

typedef struct encoder {
    const dsc_tokenizer *t;
    tok_ids *out;
    bool first_segment; /* Metaspace "first" prepends only at the start of the text */
    size_t cap;         /* symbols the scratch below holds */
    int32_t *sym;       /* (cap) symbol ids of one piece, -1 once merged away */
    int32_t *next;      /* (cap) linked list over live symbols */
    int32_t *prev;      /* (cap) */
    merge_cand *heap;   /* (3 * cap): n - 1 initial pairs + 2 per merge */
    size_t heap_n;
} encoder;

/* ---- BPE on one piece --------------------------------------------------------------------- */

static dsc_status reserve(encoder *e, size_t n) {
    if (n <= e->cap) return NULL;
    size_t cap = n > 2 * e->cap ? n : 2 * e->cap;
    int32_t *sym = realloc(e->sym, cap * sizeof(int32_t));
    if (sym) e->sym = sym;
    int32_t *next = realloc(e->next, cap * sizeof(int32_t));
    if (next) e->next = next;
    int32_t *prev = realloc(e->prev, cap * sizeof(int32_t));
    if (prev) e->prev = prev;
    merge_cand *heap = realloc(e->heap, 3 * cap * sizeof(merge_cand));
    if (heap) e->heap = heap;
    DSC_CHECK(sym && next && prev && heap, DSC_ERR_NOMEM, "tokenizer: out of memory for %zu symbols", cap);
    e->cap = cap;
    return NULL;
}

static bool cand_before(const merge_cand *a, const merge_cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

/* Queues the pair (left, next[left]) when a merge exists for it. */
static void queue_pair(encoder *e, int32_t left) {
    int32_t right = e->next[left], rank, result;
    if (right < 0 || !dsc_tok_merge_find(e->t, e->sym[left], e->sym[right], &rank, &result)) return;
    size_t i = e->heap_n++;
    merge_cand c = {rank, left, e->sym[left], e->sym[right], result};
    for (; i > 0 && cand_before(&c, &e->heap[(i - 1) / 2]); i = (i - 1) / 2)
        e->heap[i] = e->heap[(i - 1) / 2];
    e->heap[i] = c;
}

static merge_cand pop_pair(encoder *e) {
    merge_cand top = e->heap[0], last = e->heap[--e->heap_n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= e->heap_n) break;
        if (c + 1 < e->heap_n && cand_before(&e->heap[c + 1], &e->heap[c])) c++;
        if (!cand_before(&e->heap[c], &last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (e->heap_n > 0) e->heap[i] = last;
    return top;
}

/* Initial symbols: one per character in the vocabulary, else its bytes as
 * <0xXX> tokens (byte fallback), else unk (consecutive unks fused if asked).
 * At most one symbol per byte, which reserve() accounted for. */
static dsc_status initial_symbols(encoder *e, const char *s, size_t len, size_t *n) {
    const dsc_tokenizer *t = e->t;
    bool last_unk = false;
    for (size_t i = 0, k; i < len; i += k) {
        uint32_t cp = dsc_tok_utf8_next(s, len, i, &k);
        int32_t id = dsc_tok_vocab_find(t, s + i, k);
        bool bytes_ok = id < 0 && t->byte_fallback;
        for (size_t j = 0; j < k && bytes_ok; j++)
            bytes_ok = t->byte_ids[(uint8_t)s[i + j]] >= 0;
        if (id >= 0) {
            e->sym[(*n)++] = id;
        } else if (bytes_ok) {
            for (size_t j = 0; j < k; j++)
                e->sym[(*n)++] = t->byte_ids[(uint8_t)s[i + j]];
        } else {
            DSC_CHECK(t->unk_id >= 0, DSC_ERR_INVALID,
                      "tokenizer: character U+%04X has no token and the model has no unk token", cp);
            if (!(t->fuse_unk && last_unk)) e->sym[(*n)++] = t->unk_id;
        }
        last_unk = id < 0 && !bytes_ok;
    }
    return NULL;
}

/* Merges lowest rank first, leftmost among equals (HF's order), with a heap
 * of candidate pairs and a linked list of symbols: O(n log n) per piece. */
static dsc_status bpe_piece(encoder *e, const char *s, size_t len) {
    const dsc_tokenizer *t = e->t;
    if (len == 0) return NULL;
    if (t->ignore_merges) {
        int32_t whole = dsc_tok_vocab_find(t, s, len);
        if (whole >= 0) {
            tok_ids_push(e->out, whole);
            return NULL;
        }
    }
    DSC_TRY(reserve(e, len));
    size_t n = 0;
    DSC_TRY(initial_symbols(e, s, len, &n));
    e->heap_n = 0;
    for (size_t i = 0; i < n; i++) {
        e->prev[i] = (int32_t)i - 1;
        e->next[i] = i + 1 < n ? (int32_t)i + 1 : -1;
    }
    for (size_t i = 0; i + 1 < n; i++)
        queue_pair(e, (int32_t)i);
    while (e->heap_n > 0) {
        merge_cand c = pop_pair(e);
        int32_t l = c.pos, r = e->next[l];
        if (e->sym[l] != c.left || r < 0 || e->sym[r] != c.right) continue; /* stale */
        e->sym[l] = c.result;
        e->sym[r] = -1;
        e->next[l] = e->next[r];
        if (e->next[r] >= 0) e->prev[e->next[r]] = l;
        if (e->prev[l] >= 0) queue_pair(e, e->prev[l]);
        queue_pair(e, l);
    }
    for (int32_t i = n ? 0 : -1; i >= 0; i = e->next[i])
        tok_ids_push(e->out, e->sym[i]);
    return NULL;
}

/* ---- pre-tokenizers ----------------------------------------------------------------------------- */

static dsc_status pre_tokenize(encoder *e, int k, const char *s, size_t len, bool at_text_start);

static dsc_status byte_level(encoder *e, int k, const tok_pre *p, const char *s, size_t len, bool at_text_start) {
    /* The piece (with its prefix space, if asked) and room for its image:
     * every byte maps to a code point below 0x144, at most 2 UTF-8 bytes. */
    char *src = malloc(3 * len + 4);
    DSC_CHECK(src, DSC_ERR_NOMEM, "tokenizer: out of memory for a piece of %zu bytes", len);
    size_t n = 0;
    if (p->add_prefix_space && (len == 0 || s[0] != ' ')) src[n++] = ' ';
    memcpy(src + n, s, len);
    n += len;
    char *mapped = src + n;
    dsc_status st = NULL;
    for (size_t pos = 0; !st && pos < n;) {
        size_t m = p->use_regex ? dsc_tok_pattern_match(p->pattern, src, n, pos) : n - pos, out = 0;
        for (size_t i = 0; i < m; i++)
            out += dsc_tok_utf8_put(dsc_tok_byte_to_unicode((uint8_t)src[pos + i]), mapped + out);
        st = pre_tokenize(e, k + 1, mapped, out, at_text_start && pos == 0);
        pos += m;
    }
    free(src);
    return st;
}

static dsc_status metaspace(encoder *e, int k, const tok_pre *p, const char *s, size_t len, bool at_text_start) {
    size_t rl = strlen(p->replacement), spaces = 0;
    for (size_t i = 0; i < len; i++)
        spaces += s[i] == ' ';
    char *buf = malloc(len + spaces * rl + rl + 1);
    DSC_CHECK(buf, DSC_ERR_NOMEM, "tokenizer: out of memory for a piece of %zu bytes", len);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] == ' ') {
            memcpy(buf + n, p->replacement, rl);
            n += rl;
        } else {
            buf[n++] = s[i];
        }
    }
    bool prepend = p->prepend == TOK_PREPEND_ALWAYS || (p->prepend == TOK_PREPEND_FIRST && at_text_start);
    if (prepend && (n < rl || memcmp(buf, p->replacement, rl) != 0)) {
        memmove(buf + rl, buf, n);
        memcpy(buf, p->replacement, rl);
        n += rl;
    }
    dsc_status st = NULL;
    /* Split before every replacement character (it starts the next piece). */
    size_t start = 0;
    for (size_t i = 1; p->split && !st && i + rl <= n; i++)
        if (memcmp(buf + i, p->replacement, rl) == 0) {
            st = pre_tokenize(e, k + 1, buf + start, i - start, at_text_start && start == 0);
            start = i;
        }
    if (!st) st = pre_tokenize(e, k + 1, buf + start, n - start, at_text_start && start == 0);
    free(buf);
    return st;
}

/* Applies pre-tokenizer k to the piece, or BPE once all have run. */
static dsc_status pre_tokenize(encoder *e, int k, const char *s, size_t len, bool at_text_start) {
    if (k == e->t->n_pres) return bpe_piece(e, s, len);
    const tok_pre *p = &e->t->pres[k];
    switch (p->kind) {
    case TOK_PRE_SPLIT:
        for (size_t pos = 0; pos < len;) {
            size_t m = dsc_tok_pattern_match(p->pattern, s, len, pos);
            DSC_TRY(pre_tokenize(e, k + 1, s + pos, m, at_text_start && pos == 0));
            pos += m;
        }
        return NULL;
    case TOK_PRE_BYTELEVEL:
        return byte_level(e, k, p, s, len, at_text_start);
    case TOK_PRE_METASPACE:
        return metaspace(e, k, p, s, len, at_text_start);
    }
    return dsc_error(DSC_ERR_INTERNAL, "tokenizer: unknown pre-tokenizer kind %d", (int)p->kind);
}

/* ---- normalizers --------------------------------------------------------------------------------- */

/* Applies one normalizer to *s (len *n), replacing the buffer. */
static dsc_status normalize_step(const tok_norm *nm, char **s, size_t *n) {
    size_t tl = strlen(nm->text), cl = nm->content ? strlen(nm->content) : 0, count = 0;
    if (nm->kind == TOK_NORM_PREPEND && *n == 0) return NULL; /* HF leaves empty text alone */
    if (nm->kind == TOK_NORM_REPLACE)
        for (size_t i = 0; i + tl <= *n; i++)
            if (memcmp(*s + i, nm->text, tl) == 0) count++, i += tl - 1;
    size_t cap = nm->kind == TOK_NORM_PREPEND ? *n + tl : *n + count * cl;
    char *out = malloc(cap + 1);
    DSC_CHECK(out, DSC_ERR_NOMEM, "tokenizer: out of memory normalizing %zu bytes", *n);
    size_t len = 0;
    if (nm->kind == TOK_NORM_PREPEND) {
        memcpy(out, nm->text, tl);
        memcpy(out + tl, *s, *n);
        len = tl + *n;
    } else {
        for (size_t i = 0; i < *n;) {
            if (i + tl <= *n && memcmp(*s + i, nm->text, tl) == 0) {
                memcpy(out + len, nm->content, cl);
                len += cl;
                i += tl;
            } else {
                out[len++] = (*s)[i++];
            }
        }
    }
    free(*s);
    *s = out;
    *n = len;
    return NULL;
}

static dsc_status encode_segment(encoder *e, const char *text, size_t len) {
    char *s = malloc(len + 1);
    DSC_CHECK(s, DSC_ERR_NOMEM, "tokenizer: out of memory for %zu bytes", len);
    memcpy(s, text, len);
    size_t n = len;
    dsc_status st = NULL;
    for (int i = 0; i < e->t->n_norms && !st; i++)
        st = normalize_step(&e->t->norms[i], &s, &n);
    if (!st) st = pre_tokenize(e, 0, s, n, e->first_segment);
    e->first_segment = false;
    free(s);
    return st;
}

/* The longest added token starting at text[pos], or NULL. */
static const tok_added *added_at(const dsc_tokenizer *t, const char *text, size_t len, size_t pos) {
    uint8_t c = (uint8_t)text[pos];
    if (!(t->added_first[c / 8] & (1u << (c % 8)))) return NULL;
    for (int i = 0; i < t->n_added; i++) {
        const tok_added *a = &t->added[i];
        if (a->len <= len - pos && memcmp(text + pos, a->content, a->len) == 0) return a;
    }
    return NULL;
}

dsc_status dsc_tok_bpe_encode(const dsc_tokenizer *t, const char *text, size_t len, tok_ids *out) {
    encoder e = {.t = t, .out = out, .first_segment = true};
    dsc_status st = NULL;
    size_t seg = 0;
    for (size_t pos = 0; pos < len && !st;) {
        const tok_added *a = added_at(t, text, len, pos);
        if (!a) {
            pos++;
            continue;
        }
        if (pos > seg) st = encode_segment(&e, text + seg, pos - seg);
        e.first_segment = false;
        tok_ids_push(out, a->id);
        pos += a->len;
        seg = pos;
    }
    if (!st && len > seg) st = encode_segment(&e, text + seg, len - seg);
    free(e.sym);
    free(e.next);
    free(e.prev);
    free(e.heap);
    return st;
}
