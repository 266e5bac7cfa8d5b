/* The monitors of a config on the logging rank: TensorBoard event files and
 * DeepSpeed's CSV layout (output_path/job_name/<tag with '/' -> '_'>.csv, a
 * "step,<last part of the tag>" header, then "step,value" rows), each event
 * going to every enabled one. Not here: the event encoding (tfevents.c) or
 * when events happen (the engine). */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/monitor.h"
#include "runtime/checkpoint/ckpt_dir.h"

typedef struct csv_file {
    char *tag;
    FILE *f;
} csv_file;

struct dsc_monitor {
    dsc_tfevents *tb; /* NULL when tensorboard is off */
    char *csv_dir;    /* NULL when csv_monitor is off */
    csv_file *csv;
    int n_csv;
};

static dsc_status job_dir(const dsc_config_monitor *c, char **out) {
    size_t n = strlen(c->output_path) + strlen(c->job_name) + 2;
    *out = malloc(n);
    DSC_CHECK(*out, DSC_ERR_NOMEM, "monitor directory");
    snprintf(*out, n, "%s%s%s", c->output_path, *c->output_path ? "/" : "", c->job_name);
    return dsc_fs_make_dirs(*out);
}

dsc_status dsc_monitor_create(const dsc_config *cfg, dsc_monitor **out) {
    *out = NULL;
    if (!cfg->tensorboard.enabled && !cfg->csv_monitor.enabled) return NULL;
    dsc_monitor *m = calloc(1, sizeof *m);
    DSC_CHECK(m, DSC_ERR_NOMEM, "monitor");
    dsc_status s = NULL;
    if (cfg->tensorboard.enabled) {
        char *dir = NULL;
        s = job_dir(&cfg->tensorboard, &dir);
        if (!s) s = dsc_tfevents_open(dir, &m->tb);
        free(dir);
    }
    if (!s && cfg->csv_monitor.enabled) s = job_dir(&cfg->csv_monitor, &m->csv_dir);
    if (s) {
        dsc_monitor_destroy(m);
        return dsc_error_wrap(s, "%s: starting the monitors", cfg->source ? cfg->source : "config");
    }
    *out = m;
    return NULL;
}

/* The open CSV file of `tag`, created with its header on first use. */
static dsc_status csv_for(dsc_monitor *m, const char *tag, FILE **f) {
    for (int i = 0; i < m->n_csv; i++)
        if (strcmp(m->csv[i].tag, tag) == 0) return *f = m->csv[i].f, NULL;
    char path[1024];
    int at = snprintf(path, sizeof path, "%s/", m->csv_dir);
    for (const char *c = tag; *c && at < (int)sizeof path - 5; c++)
        path[at++] = *c == '/' || *c == ' ' ? '_' : *c;
    snprintf(path + at, sizeof path - (size_t)at, ".csv");
    csv_file *grown = realloc(m->csv, (size_t)(m->n_csv + 1) * sizeof *grown);
    DSC_CHECK(grown, DSC_ERR_NOMEM, "monitor: csv file %s", path);
    m->csv = grown;
    char *name = strdup(tag);
    FILE *file = name ? fopen(path, "a") : NULL;
    if (!file) {
        free(name);
        return dsc_error(DSC_ERR_IO, "%s: cannot open for appending: %s", path, strerror(errno));
    }
    const char *header = strrchr(tag, '/') ? strrchr(tag, '/') + 1 : tag;
    fprintf(file, "step,%s\n", header);
    m->csv[m->n_csv++] = (csv_file){name, file};
    *f = file;
    return NULL;
}

dsc_status dsc_monitor_write(dsc_monitor *m, const char *tag, double value, int64_t step) {
    if (!m) return NULL;
    if (m->tb) DSC_TRY(dsc_tfevents_scalar(m->tb, tag, (float)value, step, 0));
    if (!m->csv_dir) return NULL;
    FILE *f;
    DSC_TRY(csv_for(m, tag, &f));
    DSC_CHECK(fprintf(f, "%lld,%.9g\n", (long long)step, value) > 0 && fflush(f) == 0, DSC_ERR_IO,
              "monitor: writing %s: %s", tag, strerror(errno));
    return NULL;
}

void dsc_monitor_destroy(dsc_monitor *m) {
    if (!m) return;
    dsc_tfevents_close(m->tb);
    for (int i = 0; i < m->n_csv; i++) {
        fclose(m->csv[i].f);
        free(m->csv[i].tag);
    }
    free(m->csv);
    free(m->csv_dir);
    free(m);
}
