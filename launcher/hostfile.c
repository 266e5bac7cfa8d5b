/* Which slots on which hosts a job may use: DeepSpeed's hostfile format
 * ("worker-1 slots=4", '#' comments) and its --include / --exclude filters
 * ("worker-1:0,1@worker-2"). Knows nothing of mpirun or of running. */
#define _POSIX_C_SOURCE 200809L /* strdup, strndup */
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher/launcher.h"

enum { MAX_SLOTS = 1 << 16 };

static dsc_status add_host(dsc_launch_hosts *hosts, const char *name, size_t name_len, int slots) {
    dsc_launch_host *grown = realloc(hosts->host, (size_t)(hosts->count + 1) * sizeof *grown);
    DSC_CHECK(grown, DSC_ERR_NOMEM, "adding host %.*s", (int)name_len, name);
    hosts->host = grown;
    dsc_launch_host *h = &hosts->host[hosts->count];
    h->name = strndup(name, name_len);
    h->slots = slots;
    h->enabled = malloc((size_t)slots * sizeof *h->enabled);
    if (!h->name || !h->enabled) {
        free(h->name);
        free(h->enabled);
        return dsc_error(DSC_ERR_NOMEM, "adding host %.*s", (int)name_len, name);
    }
    for (int s = 0; s < slots; s++)
        h->enabled[s] = true;
    hosts->count++;
    return NULL;
}

static int find_host(const dsc_launch_hosts *hosts, const char *name, size_t len) {
    for (int i = 0; i < hosts->count; i++)
        if (strlen(hosts->host[i].name) == len && strncmp(hosts->host[i].name, name, len) == 0) return i;
    return -1;
}

/* A decimal integer in [lo, hi] spanning exactly [s, s+len). */
static bool parse_int(const char *s, size_t len, int lo, int hi, int *out) {
    if (len == 0 || len > 9) return false;
    int v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i])) return false;
        v = 10 * v + (s[i] - '0');
    }
    if (v < lo || v > hi) return false;
    *out = v;
    return true;
}

/* One line without its comment: "HOSTNAME slots=N" or blank. */
static dsc_status parse_line(const char *line, size_t len, const char *source, int lineno, int *host_lines,
                             dsc_launch_hosts *hosts) {
    const char *p = line, *end = line + len;
    while (p < end && isspace((unsigned char)*p))
        p++;
    while (end > p && isspace((unsigned char)end[-1]))
        end--;
    if (p == end) return NULL;
    const char *name = p;
    while (p < end && !isspace((unsigned char)*p))
        p++;
    size_t name_len = (size_t)(p - name);
    while (p < end && isspace((unsigned char)*p))
        p++;
    const char *value = p;
    size_t value_len = (size_t)(end - p);
    DSC_CHECK(value_len > 6 && strncmp(value, "slots=", 6) == 0 && !memchr(value, ' ', value_len) &&
                  !memchr(value, '\t', value_len),
              DSC_ERR_INVALID, "%s:%d: expected \"HOSTNAME slots=N\", got \"%.*s\"", source, lineno,
              (int)(end - line), line);
    int slots;
    DSC_CHECK(parse_int(value + 6, value_len - 6, 1, MAX_SLOTS, &slots), DSC_ERR_INVALID,
              "%s:%d: slots must be an integer from 1 to %d, got \"%.*s\"", source, lineno, MAX_SLOTS,
              (int)(value_len - 6), value + 6);
    int dup = find_host(hosts, name, name_len);
    DSC_CHECK(dup < 0, DSC_ERR_INVALID, "%s:%d: host \"%.*s\" is already listed on line %d", source, lineno,
              (int)name_len, name, dup >= 0 ? host_lines[dup] : 0);
    DSC_TRY(add_host(hosts, name, name_len, slots));
    host_lines[hosts->count - 1] = lineno;
    return NULL;
}

dsc_status dsc_launch_hostfile_parse(const char *text, const char *source, dsc_launch_hosts *hosts) {
    hosts->host = NULL;
    hosts->count = 0;
    size_t n_lines = 1;
    for (const char *c = text; *c; c++)
        n_lines += *c == '\n';
    int *host_lines = malloc(n_lines * sizeof *host_lines); /* line of each host, for duplicate messages */
    DSC_CHECK(host_lines, DSC_ERR_NOMEM, "%s: parsing", source);
    dsc_status st = NULL;
    int lineno = 0;
    for (const char *line = text; *line && !st;) {
        size_t len = strcspn(line, "\n");
        lineno++;
        size_t content = strcspn(line, "#\n");
        st = parse_line(line, content < len ? content : len, source, lineno, host_lines, hosts);
        line += len + (line[len] == '\n');
    }
    free(host_lines);
    if (!st && hosts->count == 0) st = dsc_error(DSC_ERR_INVALID, "%s: no hosts listed", source);
    if (st) dsc_launch_hosts_free(hosts);
    return st;
}

dsc_status dsc_launch_hostfile_load(const char *path, dsc_launch_hosts *hosts) {
    hosts->host = NULL;
    hosts->count = 0;
    FILE *f = fopen(path, "rb");
    DSC_CHECK(f, DSC_ERR_IO, "hostfile %s: %s", path, strerror(errno));
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    if (!mem) {
        fclose(f);
        return dsc_error(DSC_ERR_NOMEM, "reading hostfile %s", path);
    }
    char buf[4096];
    size_t got;
    while ((got = fread(buf, 1, sizeof buf, f)) > 0)
        fwrite(buf, 1, got, mem);
    int failed = ferror(f);
    fclose(f);
    fclose(mem);
    dsc_status st = failed ? dsc_error(DSC_ERR_IO, "hostfile %s: read error", path)
                           : dsc_launch_hostfile_parse(text, path, hosts);
    free(text);
    return st;
}

dsc_status dsc_launch_hosts_local(int slots, dsc_launch_hosts *hosts) {
    hosts->host = NULL;
    hosts->count = 0;
    return add_host(hosts, "localhost", strlen("localhost"), slots < 1 ? 1 : slots);
}

/* Marks on `mark` (slots of host h) the slots one filter entry names. */
static dsc_status entry_slots(const dsc_launch_host *h, const char *list, size_t len, const char *flag,
                              bool *mark) {
    if (!list) {
        for (int s = 0; s < h->slots; s++)
            mark[s] = true;
        return NULL;
    }
    for (const char *item = list, *end = list + len;;) {
        const char *comma = memchr(item, ',', (size_t)(end - item));
        size_t n = comma ? (size_t)(comma - item) : (size_t)(end - item);
        int slot;
        DSC_CHECK(parse_int(item, n, 0, INT_MAX, &slot), DSC_ERR_INVALID, "%s: bad slot \"%.*s\" for host %s",
                  flag, (int)n, item, h->name);
        DSC_CHECK(slot < h->slots, DSC_ERR_INVALID, "%s: host %s has %d slot%s (0-%d), so slot %d does not exist",
                  flag, h->name, h->slots, h->slots == 1 ? "" : "s", h->slots - 1, slot);
        mark[slot] = true;
        if (!comma) break;
        item = comma + 1;
    }
    return NULL;
}

static dsc_status filter_entry(dsc_launch_hosts *hosts, const char *entry, size_t len, const char *flag,
                               bool **named) {
    const char *colon = memchr(entry, ':', len);
    size_t name_len = colon ? (size_t)(colon - entry) : len;
    DSC_CHECK(name_len > 0 && (!colon || colon + 1 < entry + len), DSC_ERR_INVALID, "%s: bad entry \"%.*s\"", flag,
              (int)len, entry);
    int i = find_host(hosts, entry, name_len);
    if (i < 0) {
        char known[512] = "";
        size_t used = 0;
        for (int k = 0; k < hosts->count && used < sizeof known; k++)
            used +=
                (size_t)snprintf(known + used, sizeof known - used, "%s%s", k ? ", " : "", hosts->host[k].name);
        return dsc_error(DSC_ERR_INVALID, "%s: unknown host \"%.*s\" (hosts: %s)", flag, (int)name_len, entry,
                         known);
    }
    return entry_slots(&hosts->host[i], colon ? colon + 1 : NULL, colon ? (size_t)(entry + len - colon - 1) : 0,
                       flag, named[i]);
}

dsc_status dsc_launch_hosts_filter(dsc_launch_hosts *hosts, const char *spec, bool include) {
    const char *flag = include ? "--include" : "--exclude";
    DSC_CHECK(*spec, DSC_ERR_INVALID, "%s: empty host list", flag);
    /* named[i][s]: the spec lists slot s of host i. */
    bool **named = calloc((size_t)hosts->count, sizeof *named);
    DSC_CHECK(named, DSC_ERR_NOMEM, "%s", flag);
    dsc_status st = NULL;
    for (int i = 0; i < hosts->count && !st; i++) {
        named[i] = calloc((size_t)hosts->host[i].slots, sizeof **named);
        if (!named[i]) st = dsc_error(DSC_ERR_NOMEM, "%s", flag);
    }
    for (const char *entry = spec; !st;) {
        size_t len = strcspn(entry, "@");
        st = filter_entry(hosts, entry, len, flag, named);
        if (!entry[len]) break;
        entry += len + 1;
    }
    for (int i = 0; i < hosts->count && !st; i++)
        for (int s = 0; s < hosts->host[i].slots; s++)
            hosts->host[i].enabled[s] = hosts->host[i].enabled[s] && named[i][s] == include;
    for (int i = 0; i < hosts->count; i++)
        free(named[i]);
    free(named);
    return st;
}

int dsc_launch_host_slots(const dsc_launch_hosts *hosts, int i) {
    int n = 0;
    for (int s = 0; s < hosts->host[i].slots; s++)
        n += hosts->host[i].enabled[s];
    return n;
}

int dsc_launch_hosts_total(const dsc_launch_hosts *hosts) {
    int n = 0;
    for (int i = 0; i < hosts->count; i++)
        n += dsc_launch_host_slots(hosts, i);
    return n;
}

void dsc_launch_hosts_free(dsc_launch_hosts *hosts) {
    for (int i = 0; i < hosts->count; i++) {
        free(hosts->host[i].name);
        free(hosts->host[i].enabled);
    }
    free(hosts->host);
    hosts->host = NULL;
    hosts->count = 0;
}
