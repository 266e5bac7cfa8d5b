/* Loading a Hugging Face tokenizer.json with a BPE model: vocabulary,
 * merges, added tokens, and the normalizer / pre-tokenizer / decoder
 * components dsc implements, read into the tokenizer object.
 *
 * Anything dsc cannot reproduce exactly (WordPiece or Unigram models, an
 * unknown regex, a lowercasing normalizer, ...) is refused with
 * DSC_ERR_UNSUPPORTED naming the component, rather than tokenizing
 * differently from the model's training. NFC normalisation is accepted as the
 * identity: text that arrives NFC already (the usual case) is unaffected. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer_internal.h"

#define META "\xe2\x96\x81" /* U+2581, SentencePiece's space */

typedef struct loader {
    const char *path;
    dsc_tokenizer *t;
} loader;

static dsc_status read_file(const char *path, char **out) {
    *out = NULL;
    FILE *fp = fopen(path, "rb");
    DSC_CHECK(fp, DSC_ERR_IO, "tokenizer %s: cannot open: %s", path, strerror(errno));
    long size = -1;
    if (fseek(fp, 0, SEEK_END) == 0) size = ftell(fp);
    char *text = size >= 0 ? malloc((size_t)size + 1) : NULL;
    bool ok = text && fseek(fp, 0, SEEK_SET) == 0 && fread(text, 1, (size_t)size, fp) == (size_t)size;
    fclose(fp);
    if (!ok) {
        free(text);
        return dsc_error(DSC_ERR_IO, "tokenizer %s: cannot read", path);
    }
    text[size] = '\0';
    *out = text;
    return NULL;
}

static const char *type_of(const cJSON *obj) {
    const cJSON *ty = cJSON_GetObjectItemCaseSensitive(obj, "type");
    return cJSON_IsString(ty) ? ty->valuestring : "?";
}

static bool get_bool(const cJSON *obj, const char *key, bool dflt) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsBool(v) ? cJSON_IsTrue(v) : dflt;
}

static const char *get_string(const cJSON *obj, const char *key) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* ---- vocabulary and added tokens ---------------------------------------------------- */

/* Ids index tables of max_id + 1 entries, so an id is bounded before it
 * sizes anything: a sparse vocabulary holding the id 2147483646 would
 * otherwise cost 48 GiB of tables and minutes of scanning. */
enum { MAX_TOKEN_ID = (1 << 24) - 1 };

static dsc_status get_id(const loader *L, const cJSON *v, const char *key, const char *what, int32_t *id) {
    DSC_CHECK(cJSON_IsNumber(v) && v->valuedouble >= 0 && v->valuedouble <= MAX_TOKEN_ID &&
                  v->valuedouble == (double)(int32_t)v->valuedouble,
              DSC_ERR_CORRUPT, "tokenizer %s: %s of %s is %.17g, not an id in [0, %d]", L->path, key, what,
              cJSON_IsNumber(v) ? v->valuedouble : -1.0, MAX_TOKEN_ID);
    *id = (int32_t)v->valuedouble;
    return NULL;
}

static dsc_status load_vocab(loader *L, const cJSON *vocab, const cJSON *added) {
    dsc_tokenizer *t = L->t;
    DSC_CHECK(cJSON_IsObject(vocab), DSC_ERR_CORRUPT, "tokenizer %s: model.vocab is not an object", L->path);
    DSC_CHECK(!added || cJSON_IsArray(added), DSC_ERR_CORRUPT, "tokenizer %s: added_tokens is not an array",
              L->path);
    int32_t max_id = -1, id = -1; /* set by get_id; initialised for gcc -O3, which cannot see it */
    for (const cJSON *kv = vocab->child; kv; kv = kv->next) {
        DSC_TRY(get_id(L, kv, "model.vocab", kv->string, &id));
        if (id > max_id) max_id = id;
    }
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        DSC_TRY(get_id(L, cJSON_GetObjectItemCaseSensitive(a, "id"), "added_tokens[].id", "an added token", &id));
        DSC_CHECK(get_string(a, "content") && *get_string(a, "content"), DSC_ERR_CORRUPT,
                  "tokenizer %s: added token %d has no content", L->path, id);
        if (id > max_id) max_id = id;
    }
    DSC_CHECK(max_id >= 0, DSC_ERR_CORRUPT, "tokenizer %s: empty vocabulary", L->path);
    t->vocab_size = max_id + 1;
    t->token_str = calloc((size_t)t->vocab_size, sizeof(char *));
    t->token_bytes = calloc((size_t)t->vocab_size, sizeof(char *));
    t->token_len = calloc((size_t)t->vocab_size, sizeof(size_t));
    int n_added = added ? cJSON_GetArraySize(added) : 0;
    t->added = calloc((size_t)n_added + 1, sizeof(tok_added));
    DSC_CHECK(t->token_str && t->token_bytes && t->token_len && t->added, DSC_ERR_NOMEM,
              "tokenizer %s: out of memory for %d tokens", L->path, t->vocab_size);
    for (const cJSON *kv = vocab->child; kv; kv = kv->next) {
        id = (int32_t)kv->valuedouble;
        DSC_CHECK(!t->token_str[id], DSC_ERR_CORRUPT, "tokenizer %s: id %d is given to both \"%s\" and \"%s\"",
                  L->path, id, t->token_str[id], kv->string);
        DSC_CHECK(t->token_str[id] = strdup(kv->string), DSC_ERR_NOMEM, "tokenizer %s: out of memory", L->path);
    }
    /* An added token's content is what its id decodes to (HF's added
     * vocabulary takes precedence over the model's). */
    for (const cJSON *a = added ? added->child : NULL; a; a = a->next) {
        id = (int32_t)cJSON_GetObjectItemCaseSensitive(a, "id")->valuedouble;
        const char *content = get_string(a, "content");
        if (!t->token_str[id] || strcmp(t->token_str[id], content) != 0) {
            free(t->token_str[id]);
            DSC_CHECK(t->token_str[id] = strdup(content), DSC_ERR_NOMEM, "tokenizer %s: out of memory", L->path);
        }
        tok_added *x = &t->added[t->n_added++];
        x->id = id;
        x->len = strlen(content);
        DSC_CHECK(x->content = strdup(content), DSC_ERR_NOMEM, "tokenizer %s: out of memory", L->path);
        t->added_first[(uint8_t)content[0] / 8] |= (uint8_t)(1u << ((uint8_t)content[0] % 8));
    }
    return NULL;
}

static int by_length_desc(const void *pa, const void *pb) {
    const tok_added *a = pa, *b = pb;
    return (a->len < b->len) - (a->len > b->len);
}

/* ---- merges ---------------------------------------------------------------------------- */

/* One merge as "left right" (older files) or ["left", "right"]. */
static dsc_status parse_merge(const loader *L, const cJSON *m, int32_t r, int32_t *left, int32_t *right,
                              int32_t *result) {
    const char *a, *b;
    size_t alen, blen;
    if (cJSON_IsString(m)) {
        const char *sp = strchr(m->valuestring, ' ');
        DSC_CHECK(sp, DSC_ERR_CORRUPT, "tokenizer %s: merge %d \"%s\" is not two tokens", L->path, r,
                  m->valuestring);
        a = m->valuestring;
        alen = (size_t)(sp - a);
        b = sp + 1;
        blen = strlen(b);
    } else {
        DSC_CHECK(cJSON_IsArray(m) && cJSON_GetArraySize(m) == 2 && cJSON_IsString(cJSON_GetArrayItem(m, 0)) &&
                      cJSON_IsString(cJSON_GetArrayItem(m, 1)),
                  DSC_ERR_CORRUPT, "tokenizer %s: merge %d is not two tokens", L->path, r);
        a = cJSON_GetArrayItem(m, 0)->valuestring;
        b = cJSON_GetArrayItem(m, 1)->valuestring;
        alen = strlen(a);
        blen = strlen(b);
    }
    char joined[1024];
    DSC_CHECK(alen + blen < sizeof joined, DSC_ERR_UNSUPPORTED, "tokenizer %s: merge %d is longer than %zu bytes",
              L->path, r, sizeof joined - 1);
    memcpy(joined, a, alen);
    memcpy(joined + alen, b, blen);
    *left = dsc_tok_vocab_find(L->t, a, alen);
    *right = dsc_tok_vocab_find(L->t, b, blen);
    *result = dsc_tok_vocab_find(L->t, joined, alen + blen);
    DSC_CHECK(*left >= 0 && *right >= 0 && *result >= 0, DSC_ERR_CORRUPT,
              "tokenizer %s: merge %d (\"%.*s\" + \"%.*s\") uses a token missing from the vocabulary", L->path, r,
              (int)alen, a, (int)blen, b);
    return NULL;
}

static dsc_status load_merges(loader *L, const cJSON *merges) {
    DSC_CHECK(!merges || cJSON_IsArray(merges), DSC_ERR_CORRUPT, "tokenizer %s: model.merges is not an array",
              L->path);
    int32_t n = merges ? cJSON_GetArraySize(merges) : 0;
    int32_t *buf = malloc(3 * sizeof(int32_t) * (size_t)(n + 1));
    DSC_CHECK(buf, DSC_ERR_NOMEM, "tokenizer %s: out of memory for %d merges", L->path, n);
    dsc_status s = NULL;
    int32_t r = 0;
    for (const cJSON *m = merges ? merges->child : NULL; m && !s; m = m->next, r++)
        s = parse_merge(L, m, r, &buf[r], &buf[n + r], &buf[2 * n + r]);
    if (!s) s = dsc_tok_index_merges(L->t, n, buf, buf + n, buf + 2 * n);
    free(buf);
    return s;
}

/* ---- model, normalizer, pre-tokenizer, decoder ------------------------------------------------ */

static dsc_status load_model(loader *L, const cJSON *model) {
    dsc_tokenizer *t = L->t;
    DSC_CHECK(cJSON_IsObject(model), DSC_ERR_CORRUPT, "tokenizer %s: missing model", L->path);
    DSC_CHECK(strcmp(type_of(model), "BPE") == 0, DSC_ERR_UNSUPPORTED,
              "tokenizer %s: model type %s is not supported (dsc reads BPE)", L->path, type_of(model));
    const char *prefix = get_string(model, "continuing_subword_prefix");
    const char *suffix = get_string(model, "end_of_word_suffix");
    DSC_CHECK((!prefix || !*prefix) && (!suffix || !*suffix), DSC_ERR_UNSUPPORTED,
              "tokenizer %s: BPE with continuing_subword_prefix / end_of_word_suffix is not supported", L->path);
    t->byte_fallback = get_bool(model, "byte_fallback", false);
    t->fuse_unk = get_bool(model, "fuse_unk", false);
    t->ignore_merges = get_bool(model, "ignore_merges", false);
    const char *unk = get_string(model, "unk_token");
    t->unk_id = unk ? dsc_tok_vocab_find(t, unk, strlen(unk)) : -1;
    DSC_CHECK(!unk || t->unk_id >= 0, DSC_ERR_CORRUPT, "tokenizer %s: unk_token \"%s\" is not in the vocabulary",
              L->path, unk);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_ids[b] = dsc_tok_vocab_find(t, name, 6);
    }
    return load_merges(L, cJSON_GetObjectItemCaseSensitive(model, "merges"));
}

static dsc_status add_norm(loader *L, tok_norm_kind kind, const char *text, const char *content) {
    dsc_tokenizer *t = L->t;
    tok_norm *n = realloc(t->norms, (size_t)(t->n_norms + 1) * sizeof *n);
    DSC_CHECK(n, DSC_ERR_NOMEM, "tokenizer %s: out of memory", L->path);
    t->norms = n;
    n = &t->norms[t->n_norms++];
    *n = (tok_norm){.kind = kind, .text = strdup(text), .content = content ? strdup(content) : NULL};
    DSC_CHECK(n->text && (!content || n->content), DSC_ERR_NOMEM, "tokenizer %s: out of memory", L->path);
    return NULL;
}

static dsc_status load_normalizer(loader *L, const cJSON *nm) {
    if (!nm || cJSON_IsNull(nm)) return NULL;
    const char *ty = type_of(nm);
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(nm, "normalizers");
        for (const cJSON *x = cJSON_IsArray(list) ? list->child : NULL; x; x = x->next)
            DSC_TRY(load_normalizer(L, x));
        return NULL;
    }
    if (strcmp(ty, "NFC") == 0) return NULL;
    if (strcmp(ty, "Prepend") == 0) {
        const char *p = get_string(nm, "prepend");
        DSC_CHECK(p, DSC_ERR_CORRUPT, "tokenizer %s: Prepend normalizer without prepend", L->path);
        return add_norm(L, TOK_NORM_PREPEND, p, NULL);
    }
    if (strcmp(ty, "Replace") == 0) {
        const char *pattern = get_string(cJSON_GetObjectItemCaseSensitive(nm, "pattern"), "String");
        const char *content = get_string(nm, "content");
        DSC_CHECK(pattern && *pattern && content, DSC_ERR_UNSUPPORTED,
                  "tokenizer %s: Replace normalizer needs a String pattern (regex patterns are not supported)",
                  L->path);
        return add_norm(L, TOK_NORM_REPLACE, pattern, content);
    }
    return dsc_error(DSC_ERR_UNSUPPORTED, "tokenizer %s: normalizer %s is not supported", L->path, ty);
}

static dsc_status add_pre(loader *L, tok_pre p) {
    dsc_tokenizer *t = L->t;
    tok_pre *n = realloc(t->pres, (size_t)(t->n_pres + 1) * sizeof *n);
    DSC_CHECK(n, DSC_ERR_NOMEM, "tokenizer %s: out of memory", L->path);
    t->pres = n;
    t->pres[t->n_pres++] = p;
    return NULL;
}

static tok_prepend metaspace_prepend(const cJSON *obj) {
    const char *scheme = get_string(obj, "prepend_scheme");
    if (!scheme) return get_bool(obj, "add_prefix_space", true) ? TOK_PREPEND_ALWAYS : TOK_PREPEND_NEVER;
    if (strcmp(scheme, "first") == 0) return TOK_PREPEND_FIRST;
    return strcmp(scheme, "never") == 0 ? TOK_PREPEND_NEVER : TOK_PREPEND_ALWAYS;
}

static dsc_status load_pre_tokenizer(loader *L, const cJSON *pt) {
    if (!pt || cJSON_IsNull(pt)) return NULL;
    const char *ty = type_of(pt);
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(pt, "pretokenizers");
        for (const cJSON *x = cJSON_IsArray(list) ? list->child : NULL; x; x = x->next)
            DSC_TRY(load_pre_tokenizer(L, x));
        return NULL;
    }
    if (strcmp(ty, "ByteLevel") == 0)
        return add_pre(L, (tok_pre){.kind = TOK_PRE_BYTELEVEL,
                                    .pattern = DSC_TOK_PATTERN_GPT2,
                                    .add_prefix_space = get_bool(pt, "add_prefix_space", false),
                                    .use_regex = get_bool(pt, "use_regex", true)});
    if (strcmp(ty, "Split") == 0) {
        const char *regex = get_string(cJSON_GetObjectItemCaseSensitive(pt, "pattern"), "Regex");
        const char *behavior = get_string(pt, "behavior");
        tok_pre p = {.kind = TOK_PRE_SPLIT};
        DSC_CHECK(regex && dsc_tok_pattern_from_regex(regex, &p.pattern), DSC_ERR_UNSUPPORTED,
                  "tokenizer %s: Split pattern %s is not one dsc implements (GPT-2, Llama-3, Qwen2)", L->path,
                  regex ? regex : "(not a regex)");
        DSC_CHECK(behavior && strcmp(behavior, "Isolated") == 0 && !get_bool(pt, "invert", false),
                  DSC_ERR_UNSUPPORTED, "tokenizer %s: Split needs behavior Isolated without invert", L->path);
        return add_pre(L, p);
    }
    if (strcmp(ty, "Metaspace") == 0) {
        const char *rep = get_string(pt, "replacement");
        tok_pre p = {.kind = TOK_PRE_METASPACE,
                     .replacement = strdup(rep ? rep : META),
                     .prepend = metaspace_prepend(pt),
                     .split = get_bool(pt, "split", true)};
        DSC_CHECK(p.replacement, DSC_ERR_NOMEM, "tokenizer %s: out of memory", L->path);
        dsc_status s = add_pre(L, p);
        if (s) free(p.replacement);
        return s;
    }
    return dsc_error(DSC_ERR_UNSUPPORTED, "tokenizer %s: pre-tokenizer %s is not supported", L->path, ty);
}

typedef struct decode_rules {
    bool byte_level;    /* ByteLevel: characters map back to bytes */
    bool meta_to_space; /* Replace("▁", " ") or Metaspace */
    bool byte_fallback; /* <0xXX> is that byte */
} decode_rules;

static dsc_status load_decoder(loader *L, const cJSON *d, decode_rules *r) {
    if (!d || cJSON_IsNull(d)) return NULL;
    const char *ty = type_of(d);
    if (strcmp(ty, "Sequence") == 0) {
        const cJSON *list = cJSON_GetObjectItemCaseSensitive(d, "decoders");
        for (const cJSON *x = cJSON_IsArray(list) ? list->child : NULL; x; x = x->next)
            DSC_TRY(load_decoder(L, x, r));
    } else if (strcmp(ty, "ByteLevel") == 0) {
        r->byte_level = true;
    } else if (strcmp(ty, "ByteFallback") == 0) {
        r->byte_fallback = true;
    } else if (strcmp(ty, "Replace") == 0) {
        const char *pattern = get_string(cJSON_GetObjectItemCaseSensitive(d, "pattern"), "String");
        const char *content = get_string(d, "content");
        DSC_CHECK(pattern && content && strcmp(pattern, META) == 0 && strcmp(content, " ") == 0,
                  DSC_ERR_UNSUPPORTED, "tokenizer %s: only the Replace(\"" META "\", \" \") decoder is supported",
                  L->path);
        r->meta_to_space = true;
    } else if (strcmp(ty, "Strip") == 0) {
        const char *content = get_string(d, "content");
        const cJSON *start = cJSON_GetObjectItemCaseSensitive(d, "start");
        const cJSON *stop = cJSON_GetObjectItemCaseSensitive(d, "stop");
        DSC_CHECK(content && strcmp(content, " ") == 0 && cJSON_IsNumber(start) && start->valuedouble <= 1 &&
                      (!cJSON_IsNumber(stop) || stop->valuedouble == 0),
                  DSC_ERR_UNSUPPORTED, "tokenizer %s: only Strip(\" \", start <= 1, stop 0) is supported",
                  L->path);
        L->t->strip_leading_space = start->valuedouble == 1;
    } else if (strcmp(ty, "Metaspace") == 0) {
        r->meta_to_space = true;
        L->t->strip_leading_space = metaspace_prepend(d) != TOK_PREPEND_NEVER;
    } else if (strcmp(ty, "Fuse") != 0) {
        return dsc_error(DSC_ERR_UNSUPPORTED, "tokenizer %s: decoder %s is not supported", L->path, ty);
    }
    return NULL;
}

/* What id decodes to under the decoder's rules. */
static dsc_status token_bytes(loader *L, const decode_rules *r, int32_t id) {
    dsc_tokenizer *t = L->t;
    const char *s = t->token_str[id];
    size_t len = strlen(s), n = 0;
    char *out = malloc(len + 1); /* no rule makes a token longer */
    DSC_CHECK(out, DSC_ERR_NOMEM, "tokenizer %s: out of memory", L->path);
    unsigned hex;
    char tail;
    if (r->byte_level) {
        for (size_t i = 0, k; i < len && n != SIZE_MAX; i += k) {
            int b = dsc_tok_unicode_to_byte(dsc_tok_utf8_next(s, len, i, &k));
            if (b < 0)
                n = SIZE_MAX; /* not a byte-level string (an added token): keep it as written */
            else
                out[n++] = (char)b;
        }
        if (n == SIZE_MAX) memcpy(out, s, n = len);
    } else if (r->byte_fallback && len == 6 && sscanf(s, "<0x%2X%c", &hex, &tail) == 2 && tail == '>') {
        out[n++] = (char)hex;
    } else {
        for (size_t i = 0; i < len;) {
            if (r->meta_to_space && strncmp(s + i, META, 3) == 0) {
                out[n++] = ' ';
                i += 3;
            } else {
                out[n++] = s[i++];
            }
        }
    }
    t->token_bytes[id] = out;
    t->token_len[id] = n;
    return NULL;
}

static dsc_status load(loader *L, const cJSON *root) {
    dsc_tokenizer *t = L->t;
    DSC_CHECK(cJSON_IsObject(root), DSC_ERR_CORRUPT, "tokenizer %s: not a JSON object", L->path);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(root, "model");
    DSC_CHECK(cJSON_IsObject(model), DSC_ERR_CORRUPT, "tokenizer %s: missing model", L->path);
    DSC_TRY(load_vocab(L, cJSON_GetObjectItemCaseSensitive(model, "vocab"),
                       cJSON_GetObjectItemCaseSensitive(root, "added_tokens")));
    DSC_TRY(dsc_tok_index_vocab(t));
    DSC_TRY(load_model(L, model));
    DSC_TRY(load_normalizer(L, cJSON_GetObjectItemCaseSensitive(root, "normalizer")));
    DSC_TRY(load_pre_tokenizer(L, cJSON_GetObjectItemCaseSensitive(root, "pre_tokenizer")));
    decode_rules rules = {0};
    DSC_TRY(load_decoder(L, cJSON_GetObjectItemCaseSensitive(root, "decoder"), &rules));
    for (int32_t id = 0; id < t->vocab_size; id++)
        if (t->token_str[id]) DSC_TRY(token_bytes(L, &rules, id));
    qsort(t->added, (size_t)t->n_added, sizeof(tok_added), by_length_desc);
    return NULL;
}

dsc_status dsc_tokenizer_load(dsc_tokenizer **out, const char *path) {
    *out = NULL;
    char *text;
    DSC_TRY(read_file(path, &text));
    cJSON *root = cJSON_Parse(text);
    free(text);
    DSC_CHECK(root, DSC_ERR_CORRUPT, "tokenizer %s: not valid JSON", path);
    dsc_tokenizer *t = calloc(1, sizeof *t);
    dsc_status s = t ? NULL : dsc_error(DSC_ERR_NOMEM, "tokenizer %s: out of memory", path);
    if (t) {
        t->is_bpe = true;
        t->unk_id = -1;
        loader L = {path, t};
        s = load(&L, root);
    }
    cJSON_Delete(root);
    if (s) {
        dsc_tokenizer_destroy(t);
        return s;
    }
    *out = t;
    return NULL;
}
