/* "Did you mean ...?" for unknown config keys: the nearest sibling by edit
 * distance, else a key with the same (or nearly the same) name elsewhere in
 * the schema ("lr" -> "optimizer.params.lr"), else the list of keys allowed
 * at that place. Only produces text; the caller decides it is an error. */
#define _POSIX_C_SOURCE 200809L /* strncasecmp */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "runtime/config/config_impl.h"

/* Optimal-string-alignment distance (Levenshtein plus adjacent swaps),
 * case-insensitive; names are short, so the O(n*m) table is on the stack. */
static size_t edit_distance(const char *a, size_t n, const char *b, size_t m) {
    enum { MAXLEN = 64 };
    if (n >= MAXLEN || m >= MAXLEN) return (size_t)-1;
    size_t d[MAXLEN][MAXLEN];
    for (size_t i = 0; i <= n; i++)
        d[i][0] = i;
    for (size_t j = 0; j <= m; j++)
        d[0][j] = j;
    for (size_t i = 1; i <= n; i++) {
        for (size_t j = 1; j <= m; j++) {
            int same = tolower((unsigned char)a[i - 1]) == tolower((unsigned char)b[j - 1]);
            size_t best = d[i - 1][j - 1] + (same ? 0 : 1);
            if (d[i - 1][j] + 1 < best) best = d[i - 1][j] + 1;
            if (d[i][j - 1] + 1 < best) best = d[i][j - 1] + 1;
            if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] && d[i - 2][j - 2] + 1 < best)
                best = d[i - 2][j - 2] + 1;
            d[i][j] = best;
        }
    }
    return d[n][m];
}

size_t dsc_config_typo_budget(size_t len) {
    return len < 5 ? 1 : len < 9 ? 2 : 3;
}

size_t dsc_config_name_distance(const char *a, const char *b) {
    return edit_distance(a, strlen(a), b, strlen(b));
}

static const char *last_part(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot ? dot + 1 : path;
}

static int is_child(const char *path, const char *parent) {
    size_t plen = strlen(parent);
    return dsc_config_parent_len(path) == plen && strncmp(path, parent, plen) == 0;
}

/* Distance of `name` to a sibling, where a shortened or extended sibling
 * ("train_micro_batch_size") counts as a typo though many edits away, as long
 * as the shared prefix is most of the longer name ("stage" is not a short
 * "stage3_max_reuse_distance"). */
static size_t sibling_distance(const char *name, size_t nlen, const char *sib, size_t budget) {
    size_t slen = strlen(sib), d = edit_distance(name, nlen, sib, slen);
    size_t shorter = nlen < slen ? nlen : slen, longer = nlen < slen ? slen : nlen;
    if (d > budget && shorter >= 5 && 2 * shorter >= longer && strncasecmp(name, sib, shorter) == 0) d = budget;
    return d;
}

/* The known paths: the schema's, then DeepSpeed's table (deepspeed_keys.c). */
static const char *path_at(size_t i, size_t n_schema) {
    size_t n_ds;
    const dsc_ds_key *ds = dsc_config_deepspeed_keys(&n_ds);
    return i < n_schema ? dsc_config_schema(&n_schema)[i].path : ds[i - n_schema].path;
}

void dsc_config_suggest(const char *parent, const char *name, char *hint, size_t len) {
    size_t count, n_ds;
    dsc_config_schema(&count);
    dsc_config_deepspeed_keys(&n_ds);
    size_t total = count + n_ds;
    size_t nlen = strlen(name), budget = dsc_config_typo_budget(nlen);
    const char *best = NULL;
    size_t best_d = budget + 1;
    for (size_t i = 0; i < total; i++) {
        const char *path = path_at(i, count);
        if (!is_child(path, parent)) continue;
        size_t d = sibling_distance(name, nlen, last_part(path), budget);
        if (d < best_d) best = path, best_d = d;
    }
    if (!best) {
        for (size_t i = 0; i < total; i++) {
            const char *leaf = last_part(path_at(i, count));
            size_t d = edit_distance(name, nlen, leaf, strlen(leaf));
            if (d < best_d) best = path_at(i, count), best_d = d;
        }
    }
    if (best) {
        snprintf(hint, len, " (did you mean \"%s\"?)", best);
        return;
    }
    const dsc_config_key *keys = dsc_config_schema(&count);
    size_t used =
        (size_t)snprintf(hint, len, " (known keys%s%s%s:", *parent ? " in \"" : "", parent, *parent ? "\"" : "");
    const char *sep = " ";
    for (size_t i = 0; i < count && used < len; i++) {
        if (!is_child(keys[i].path, parent)) continue;
        used += (size_t)snprintf(hint + used, len - used, "%s%s", sep, last_part(keys[i].path));
        sep = ", ";
    }
    if (used < len) snprintf(hint + used, len - used, ")");
}
