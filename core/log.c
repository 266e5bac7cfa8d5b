/* Leveled logging to stderr with a rank prefix. The level is parsed from
 * DSC_LOG_LEVEL on first use; an unknown value falls back to info with a
 * warning rather than silently hiding messages. */
#include "dsc/log.h"

#include "dsc/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int level = -1;

static dsc_log_level parse_level(void) {
    const char *env = getenv("DSC_LOG_LEVEL");
    if (!env || !*env) return DSC_LOG_INFO;
    static const char *names[] = {"error", "warn", "info", "debug"};
    for (int i = 0; i < 4; i++)
        if (strcasecmp(env, names[i]) == 0) return (dsc_log_level)i;
    fprintf(stderr, "[dsc WARN] DSC_LOG_LEVEL=%s is not one of error, warn, info, debug; using info\n", env);
    return DSC_LOG_INFO;
}

dsc_log_level dsc_log_get_level(void) {
    if (level < 0) level = parse_level();
    return (dsc_log_level)level;
}

void dsc_log_set_level(dsc_log_level l) {
    level = l;
}

static void vlog(dsc_log_level l, const char *fmt, va_list ap) {
    static const char *tags[] = {"ERROR", "WARN", "INFO", "DEBUG"};
    char line[4096];
    vsnprintf(line, sizeof line, fmt, ap);
    int rank = dsc_get_rank();
    /* One fprintf per line so that lines from ranks sharing a pipe do not interleave. */
    if (rank >= 0)
        fprintf(stderr, "[dsc rank %d %s] %s\n", rank, tags[l], line);
    else
        fprintf(stderr, "[dsc %s] %s\n", tags[l], line);
}

void dsc_log(dsc_log_level l, const char *fmt, ...) {
    if (l > dsc_log_get_level()) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(l, fmt, ap);
    va_end(ap);
}

void dsc_log_rank0(dsc_log_level l, const char *fmt, ...) {
    if (l > dsc_log_get_level() || dsc_get_rank() > 0) return;
    va_list ap;
    va_start(ap, fmt);
    vlog(l, fmt, ap);
    va_end(ap);
}
