/* Collecting a config's problems so that one run reports every one of them
 * (unknown keys, wrong types, values out of range, refused DeepSpeed
 * features, rules across keys) instead of the first. A lone problem keeps its
 * own message; several become one list under "source: N problems:". Only
 * text handling: what counts as a problem is decided by the callers. */
#include <stdlib.h>
#include <string.h>

#include "runtime/config/config_impl.h"

/* The message without "rank N: " and "source: ", which the list states once. */
static const char *bare(const char *msg, const char *source) {
    if (strncmp(msg, "rank ", 5) == 0) {
        const char *colon = strstr(msg, ": ");
        if (colon) msg = colon + 2;
    }
    size_t n = strlen(source);
    if (strncmp(msg, source, n) == 0 && strncmp(msg + n, ": ", 2) == 0) msg += n + 2;
    return msg;
}

void dsc_config_issue(dsc_config_issues *is, dsc_status problem) {
    if (!problem) return;
    is->count++;
    if (!is->first) {
        is->first = problem;
        return;
    }
    const char *lines[2] = {is->count == 2 ? dsc_status_message(is->first) : NULL, dsc_status_message(problem)};
    for (int i = 0; i < 2; i++) {
        if (!lines[i]) continue;
        const char *m = bare(lines[i], is->source);
        size_t add = strlen(m) + 5;
        char *grown = realloc(is->text, is->len + add + 1);
        if (!grown) continue; /* the count still says how many there were */
        is->text = grown;
        memcpy(is->text + is->len, "\n  - ", 5);
        memcpy(is->text + is->len + 5, m, add - 5);
        is->len += add;
        is->text[is->len] = '\0';
    }
    dsc_status_free(problem);
}

dsc_status dsc_config_issues_finish(dsc_config_issues *is) {
    dsc_status out = NULL;
    if (is->count == 1) {
        out = is->first;
        is->first = NULL;
    } else if (is->count > 1) {
        out = dsc_error(DSC_ERR_CONFIG, "%s: %d problems:%s", is->source, is->count, is->text ? is->text : "");
    }
    dsc_status_free(is->first);
    free(is->text);
    *is = (dsc_config_issues){.source = is->source};
    return out;
}
