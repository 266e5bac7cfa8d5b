/* Pre-tokenization for byte-level BPE without a regex engine: the GPT-2,
 * Llama-3 and Qwen2 split patterns written out as code, alternative by
 * alternative in the regex's order, with the backtracking each needs.
 *
 * The Unicode classes (\p{L}, \p{N}, \s) are range tables covering ASCII,
 * Latin-1, Latin Extended, IPA, Greek, Cyrillic, Armenian, Hebrew, Arabic,
 * Devanagari, Thai, Georgian, Hangul, kana and CJK ideographs; letters of
 * other scripts are classified as "other", which splits them differently from
 * Hugging Face (documented in docs/inference_blocks.md). Combining marks are
 * not letters, as in Unicode, so decomposed text splits like HF only when it
 * arrives NFC-normalised. */
#include "tokenizer_pretok.h"

#include <string.h>

typedef struct cp_range {
    uint32_t lo, hi;
} cp_range;

static const cp_range LETTERS[] = {
    {0x41, 0x5A},     {0x61, 0x7A},     {0xAA, 0xAA},     {0xB5, 0xB5},     {0xBA, 0xBA},       {0xC0, 0xD6},
    {0xD8, 0xF6},     {0xF8, 0x2C1},    {0x2C6, 0x2D1},   {0x2E0, 0x2E4},   {0x2EC, 0x2EC},     {0x2EE, 0x2EE},
    {0x370, 0x374},   {0x376, 0x377},   {0x37A, 0x37D},   {0x37F, 0x37F},   {0x386, 0x386},     {0x388, 0x38A},
    {0x38C, 0x38C},   {0x38E, 0x3A1},   {0x3A3, 0x3F5},   {0x3F7, 0x481},   {0x48A, 0x52F},     {0x531, 0x556},
    {0x559, 0x559},   {0x560, 0x588},   {0x5D0, 0x5EA},   {0x5EF, 0x5F2},   {0x620, 0x64A},     {0x66E, 0x66F},
    {0x671, 0x6D3},   {0x6D5, 0x6D5},   {0x904, 0x939},   {0x93D, 0x93D},   {0x950, 0x950},     {0x958, 0x961},
    {0xE01, 0xE30},   {0xE32, 0xE33},   {0xE40, 0xE46},   {0x10A0, 0x10C5}, {0x10D0, 0x10FA},   {0x10FC, 0x10FF},
    {0x1100, 0x11FF}, {0x1E00, 0x1F15}, {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D},   {0x1F50, 0x1F57},
    {0x1F59, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC}, {0x3005, 0x3006}, {0x3041, 0x3096},   {0x309D, 0x309F},
    {0x30A1, 0x30FA}, {0x30FC, 0x30FF}, {0x3131, 0x318E}, {0x3400, 0x4DBF}, {0x4E00, 0x9FFF},   {0xAC00, 0xD7A3},
    {0xF900, 0xFAFF}, {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0xFF66, 0xFFBE}, {0x20000, 0x2A6DF},
};

static const cp_range NUMBERS[] = {
    {0x30, 0x39},     {0xB2, 0xB3},     {0xB9, 0xB9},     {0xBC, 0xBE},     {0x660, 0x669},
    {0x6F0, 0x6F9},   {0x966, 0x96F},   {0xE50, 0xE59},   {0x2070, 0x2070}, {0x2074, 0x2079},
    {0x2080, 0x2089}, {0x2150, 0x2182}, {0x2185, 0x2189}, {0x2460, 0x249B}, {0x24EA, 0x24FF},
    {0x2776, 0x2793}, {0x3007, 0x3007}, {0x3021, 0x3029}, {0x3038, 0x303A}, {0xFF10, 0xFF19},
};

static const cp_range SPACES[] = {
    {0x09, 0x0D},     {0x20, 0x20},     {0x85, 0x85},     {0xA0, 0xA0},     {0x1680, 0x1680},
    {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F}, {0x3000, 0x3000},
};

static bool in_ranges(uint32_t cp, const cp_range *r, size_t n) {
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (cp < r[mid].lo)
            hi = mid;
        else if (cp > r[mid].hi)
            lo = mid + 1;
        else
            return true;
    }
    return false;
}

#define IN(table, cp) in_ranges((cp), (table), sizeof(table) / sizeof((table)[0]))

bool dsc_tok_is_letter(uint32_t cp) {
    return IN(LETTERS, cp);
}
bool dsc_tok_is_number(uint32_t cp) {
    return IN(NUMBERS, cp);
}
bool dsc_tok_is_space(uint32_t cp) {
    return IN(SPACES, cp);
}

static bool is_other(uint32_t cp) {
    return !dsc_tok_is_space(cp) && !dsc_tok_is_letter(cp) && !dsc_tok_is_number(cp);
}
static bool is_newline(uint32_t cp) {
    return cp == '\r' || cp == '\n';
}

int dsc_tok_utf8_seq_len(uint8_t b) {
    if (b < 0x80) return 1;
    if (b >= 0xC2 && b <= 0xDF) return 2;
    if (b >= 0xE0 && b <= 0xEF) return 3;
    if (b >= 0xF0 && b <= 0xF4) return 4;
    return 0;
}

uint32_t dsc_tok_utf8_next(const char *text, size_t len, size_t pos, size_t *n) {
    const uint8_t *s = (const uint8_t *)text + pos;
    int k = dsc_tok_utf8_seq_len(s[0]);
    if (k <= 1 || pos + (size_t)k > len) {
        *n = 1;
        return s[0];
    }
    uint32_t cp = s[0] & (0x7F >> k);
    for (int i = 1; i < k; i++) {
        if ((s[i] & 0xC0) != 0x80) {
            *n = 1;
            return s[0];
        }
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    *n = (size_t)k;
    return cp;
}

size_t dsc_tok_utf8_put(uint32_t cp, char *out) {
    uint8_t *o = (uint8_t *)out;
    if (cp < 0x80) {
        o[0] = (uint8_t)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (uint8_t)(0xC0 | (cp >> 6));
        o[1] = (uint8_t)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (uint8_t)(0xE0 | (cp >> 12));
        o[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (uint8_t)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (uint8_t)(0xF0 | (cp >> 18));
    o[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (uint8_t)(0x80 | (cp & 0x3F));
    return 4;
}

/* ---- matching helpers: positions are byte offsets; 0-length means "no match" ---- */

typedef struct text_view {
    const char *s;
    size_t len;
} text_view;

/* The code point at pos (0 at the end) and where the next one starts. */
static uint32_t at(text_view t, size_t pos, size_t *next) {
    if (pos >= t.len) {
        *next = pos;
        return 0;
    }
    size_t n;
    uint32_t cp = dsc_tok_utf8_next(t.s, t.len, pos, &n);
    *next = pos + n;
    return cp;
}

/* End of the run of characters satisfying pred from pos; *last is where the
 * run's final character starts (pos when the run is empty). */
static size_t run(text_view t, size_t pos, bool (*pred)(uint32_t), size_t *last) {
    size_t next;
    *last = pos;
    while (pos < t.len && pred(at(t, pos, &next))) {
        *last = pos;
        pos = next;
    }
    return pos;
}

static bool lower_eq(char c, char want) {
    return c == want || (c >= 'A' && c <= 'Z' && c - 'A' + 'a' == want);
}

/* '(s|t|re|ve|m|ll|d), ASCII-case-insensitive when ci. */
static size_t contraction(text_view t, size_t pos, bool ci) {
    static const char *const SUFFIXES[] = {"s", "t", "re", "ve", "m", "ll", "d"};
    if (t.s[pos] != '\'') return 0;
    for (size_t k = 0; k < sizeof SUFFIXES / sizeof SUFFIXES[0]; k++) {
        size_t n = strlen(SUFFIXES[k]), i = 0;
        while (i < n && pos + 1 + i < t.len &&
               (ci ? lower_eq(t.s[pos + 1 + i], SUFFIXES[k][i]) : t.s[pos + 1 + i] == SUFFIXES[k][i]))
            i++;
        if (i == n) return pos + 1 + n;
    }
    return 0;
}

/* " ?" followed by one or more pred characters. */
static size_t opt_space_run(text_view t, size_t pos, bool (*pred)(uint32_t)) {
    size_t q = t.s[pos] == ' ' ? pos + 1 : pos, last;
    size_t end = run(t, q, pred, &last);
    return end > q ? end : 0;
}

/* \s+(?!\S) then \s+: a whitespace run, minus its last character when a
 * non-space follows and the run is longer than one character. */
static size_t whitespace(text_view t, size_t pos) {
    size_t last, end = run(t, pos, dsc_tok_is_space, &last);
    if (end == pos) return 0;
    if (end == t.len || last == pos) return end;
    return last;
}

static size_t match_gpt2(text_view t, size_t pos) {
    size_t end;
    if ((end = contraction(t, pos, false))) return end;
    if ((end = opt_space_run(t, pos, dsc_tok_is_letter))) return end;
    if ((end = opt_space_run(t, pos, dsc_tok_is_number))) return end;
    if ((end = opt_space_run(t, pos, is_other))) return end;
    return whitespace(t, pos);
}

static size_t match_llama3(text_view t, size_t pos, int max_digits) {
    size_t end, next, last;
    if ((end = contraction(t, pos, true))) return end;
    /* [^\r\n\p{L}\p{N}]?\p{L}+ */
    uint32_t c0 = at(t, pos, &next);
    if (!is_newline(c0) && !dsc_tok_is_letter(c0) && !dsc_tok_is_number(c0)) {
        end = run(t, next, dsc_tok_is_letter, &last);
        if (end > next) return end;
    } else if (dsc_tok_is_letter(c0)) {
        return run(t, pos, dsc_tok_is_letter, &last);
    }
    /* \p{N}{1,max} */
    end = pos;
    for (int k = 0; k < max_digits && end < t.len && dsc_tok_is_number(at(t, end, &next)); k++)
        end = next;
    if (end > pos) return end;
    /* " ?[^\s\p{L}\p{N}]+[\r\n]*" */
    if ((end = opt_space_run(t, pos, is_other))) return run(t, end, is_newline, &last);
    /* \s*[\r\n]+ : the whitespace run up to and including its last newline */
    size_t after_newline = 0;
    for (size_t p = pos; p < t.len;) {
        uint32_t c = at(t, p, &next);
        if (!dsc_tok_is_space(c)) break;
        if (is_newline(c)) after_newline = next;
        p = next;
    }
    if (after_newline) return after_newline;
    return whitespace(t, pos);
}

size_t dsc_tok_pattern_match(dsc_tok_pattern p, const char *text, size_t len, size_t pos) {
    text_view t = {text, len};
    size_t end = 0;
    switch (p) {
    case DSC_TOK_PATTERN_GPT2:
        end = match_gpt2(t, pos);
        break;
    case DSC_TOK_PATTERN_LLAMA3:
        end = match_llama3(t, pos, 3);
        break;
    case DSC_TOK_PATTERN_QWEN2:
        end = match_llama3(t, pos, 1);
        break;
    }
    /* Every character falls in some alternative; this guards invalid UTF-8. */
    return end > pos ? end - pos : 1;
}

bool dsc_tok_pattern_from_regex(const char *regex, dsc_tok_pattern *out) {
    static const struct {
        const char *regex;
        dsc_tok_pattern p;
    } KNOWN[] = {
        {"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+",
         DSC_TOK_PATTERN_GPT2},
        {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
         "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
         DSC_TOK_PATTERN_LLAMA3},
        {"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
         "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
         DSC_TOK_PATTERN_QWEN2},
    };
    for (size_t i = 0; i < sizeof KNOWN / sizeof KNOWN[0]; i++)
        if (strcmp(regex, KNOWN[i].regex) == 0) {
            *out = KNOWN[i].p;
            return true;
        }
    return false;
}

/* Bytes that are printable and not space keep their value as code point; the
 * other 68 are moved, in order, to 256, 257, ... (GPT-2's bytes_to_unicode). */
static bool byte_is_printable(int b) {
    return (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
}

uint32_t dsc_tok_byte_to_unicode(uint8_t b) {
    if (byte_is_printable(b)) return b;
    uint32_t shifted = 0;
    for (int i = 0; i < b; i++)
        shifted += !byte_is_printable(i);
    return 256 + shifted;
}

int dsc_tok_unicode_to_byte(uint32_t cp) {
    if (cp < 256) return byte_is_printable((int)cp) ? (int)cp : -1;
    uint32_t k = 0;
    for (int b = 0; b < 256; b++) {
        if (byte_is_printable(b)) continue;
        if (256 + k == cp) return b;
        k++;
    }
    return -1;
}
