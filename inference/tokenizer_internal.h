/* Private to inference/: the tokenizer object shared by the generic API
 * (tokenizer.c), the tokenizer.json loader (tokenizer_json.c) and the BPE
 * encoder (tokenizer_bpe.c). */
#ifndef DSC_INFERENCE_TOKENIZER_INTERNAL_H
#define DSC_INFERENCE_TOKENIZER_INTERNAL_H

#include "dsc/tokenizer.h"
#include "tokenizer_pretok.h"

typedef enum tok_norm_kind { TOK_NORM_PREPEND, TOK_NORM_REPLACE } tok_norm_kind;

typedef struct tok_norm {
    tok_norm_kind kind;
    char *text;    /* Prepend: the prefix; Replace: the pattern */
    char *content; /* Replace: the replacement */
} tok_norm;

typedef enum tok_pre_kind { TOK_PRE_SPLIT, TOK_PRE_BYTELEVEL, TOK_PRE_METASPACE } tok_pre_kind;
typedef enum tok_prepend { TOK_PREPEND_NEVER, TOK_PREPEND_FIRST, TOK_PREPEND_ALWAYS } tok_prepend;

typedef struct tok_pre {
    tok_pre_kind kind;
    dsc_tok_pattern pattern; /* Split; ByteLevel with use_regex uses GPT-2's */
    bool add_prefix_space;   /* ByteLevel */
    bool use_regex;          /* ByteLevel */
    char *replacement;       /* Metaspace */
    tok_prepend prepend;     /* Metaspace */
    bool split;              /* Metaspace */
} tok_pre;

typedef struct tok_added {
    char *content;
    size_t len;
    int32_t id;
} tok_added;

struct dsc_tokenizer {
    int32_t vocab_size;
    bool is_bpe;
    char **token_str;         /* (V) vocabulary strings as the model spells them; NULL for holes */
    char **token_bytes;       /* (V) what each id decodes to */
    size_t *token_len;        /* (V) */
    bool strip_leading_space; /* the decoder drops one leading space (SentencePiece) */

    int32_t *str_slots; /* hash of token_str -> id + 1, 0 = empty */
    uint32_t str_mask;
    uint64_t *pair_keys; /* hash of merge pairs (left << 32 | right) */
    int32_t *pair_rank;  /* rank + 1, 0 = empty */
    int32_t *pair_result;
    uint32_t pair_mask;

    tok_norm *norms;
    int n_norms;
    tok_pre *pres;
    int n_pres;
    tok_added *added; /* longest first, so the longest added token wins */
    int n_added;
    uint8_t added_first[32]; /* bitmap of first bytes of added tokens */

    int32_t unk_id; /* -1 when none */
    bool byte_fallback;
    bool fuse_unk;
    bool ignore_merges;
    int32_t byte_ids[256]; /* ids of <0x00>..<0xFF>, -1 when missing */
};

/* Collects ids up to a capacity and counts all of them. */
typedef struct tok_ids {
    int32_t *ids;
    int64_t cap;
    int64_t n;
} tok_ids;

static inline void tok_ids_push(tok_ids *o, int32_t id) {
    if (o->n < o->cap) o->ids[o->n] = id;
    o->n++;
}

/* The id of vocabulary string s[0, len), or -1. */
int32_t dsc_tok_vocab_find(const dsc_tokenizer *t, const char *s, size_t len);
/* The merge of (left, right): its rank (lower merges first) and the merged id; false if none. */
bool dsc_tok_merge_find(const dsc_tokenizer *t, int32_t left, int32_t right, int32_t *rank, int32_t *result);
/* Builds the string -> id table from token_str (the first id of a repeated string wins). */
dsc_status dsc_tok_index_vocab(dsc_tokenizer *t);
/* Builds the merge table; merge r has rank r (a repeated pair keeps its first rank). */
dsc_status dsc_tok_index_merges(dsc_tokenizer *t, int32_t n_merges, const int32_t *left, const int32_t *right,
                                const int32_t *result);

/* Encodes with the tokenizer.json pipeline: added tokens, normalizers, pre-tokenizers, BPE. */
dsc_status dsc_tok_bpe_encode(const dsc_tokenizer *t, const char *text, size_t len, tok_ids *out);

#endif
