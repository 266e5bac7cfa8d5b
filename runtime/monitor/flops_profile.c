/* The FLOPs profiler's report, in the shape of DeepSpeed's
 * print_model_profile: a summary of the profiled step (parameters, forward
 * and backward FLOPs, latencies and achieved FLOP/s of this rank), the top
 * layers by parameters, forward FLOPs and forward latency, and a table per
 * layer. The backward FLOPs are counted, not estimated; DeepSpeed's estimate
 * (3 + recompute_fwd_factor) * forward follows beside them.
 *
 * Not here: recording (runtime/nn/layer_profile.c), when to profile (the
 * engine). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/monitor.h"

/* 1234567 -> "1.23 M": DeepSpeed's number_to_string. */
static const char *human(double v, char *buf, size_t len) {
    static const char *const units[] = {"", " K", " M", " G", " T", " P"};
    int u = 0;
    while (v >= 1000.0 && u < 5)
        v /= 1000.0, u++;
    snprintf(buf, len, u ? "%.2f%s" : "%.0f%s", v, units[u]);
    return buf;
}

static double rate(double flops, double s) {
    return s > 0 ? flops / s : 0.0;
}

typedef struct totals {
    int64_t params, fwd_flops, bwd_flops;
    double fwd_s, bwd_s;
} totals;

/* The depth-0 layers hold everything below them. */
static totals sum_top(const dsc_layer_profile *rows, int n) {
    totals t = {0};
    for (int i = 0; i < n; i++) {
        if (rows[i].depth != 0) continue;
        t.params += rows[i].params, t.fwd_flops += rows[i].fwd_flops, t.bwd_flops += rows[i].bwd_flops;
        t.fwd_s += rows[i].fwd_s, t.bwd_s += rows[i].bwd_s;
    }
    return t;
}

static void summary(FILE *f, const dsc_flops_report *r, const totals *t, double recompute) {
    char a[32], b[64];
    double both_s = t->fwd_s + t->bwd_s;
    fprintf(f, "Profile summary at step %lld (rank %d):\n", (long long)r->step, r->rank);
    fprintf(f, "Notations: FLOPs are those of the GEMM, linear and attention kernels (2 per multiply-add); "
               "latencies are wall time on this rank.\n");
    fprintf(f, "%-62s %d\n", "data parallel size:", r->dp_size);
    fprintf(f, "%-62s %d\n", "pipeline stages:", r->pp_size);
    fprintf(f, "%-62s %lld\n", "samples per rank in the step:", (long long)r->samples_per_rank);
    fprintf(f, "%-62s %s\n", "params per rank:", human((double)t->params, a, sizeof a));
    fprintf(f, "%-62s %s\n", "fwd flops per rank:", human((double)t->fwd_flops, a, sizeof a));
    fprintf(f, "%-62s %s\n", "bwd flops per rank (counted):", human((double)t->bwd_flops, a, sizeof a));
    fprintf(f, "%-62s %.2f ms\n", "fwd latency:", 1e3 * t->fwd_s);
    fprintf(f, "%-62s %.2f ms\n", "bwd latency:", 1e3 * t->bwd_s);
    fprintf(f, "%-62s %sFLOPS\n", "fwd FLOPS per rank = fwd flops / fwd latency:",
            human(rate((double)t->fwd_flops, t->fwd_s), a, sizeof a));
    fprintf(f, "%-62s %sFLOPS\n", "bwd FLOPS per rank = bwd flops / bwd latency:",
            human(rate((double)t->bwd_flops, t->bwd_s), a, sizeof a));
    fprintf(f, "%-62s %sFLOPS\n", "fwd+bwd FLOPS per rank = (fwd + bwd flops) / (fwd + bwd latency):",
            human(rate((double)(t->fwd_flops + t->bwd_flops), both_s), a, sizeof a));
    snprintf(b, sizeof b, "(3 + %g) * fwd flops / (fwd + bwd latency):", recompute);
    fprintf(f, "DeepSpeed's estimate %-41s %sFLOPS\n", b,
            human(rate((3.0 + recompute) * (double)t->fwd_flops, both_s), a, sizeof a));
    fprintf(f, "%-62s %.2f ms\n", "step latency:", 1e3 * r->step_s);
    fprintf(f, "%-62s %.2f\n", "samples/second (this rank):", rate((double)r->samples_per_rank, r->step_s));
}

/* The index of the k-th largest depth-0 row by `key`, skipping those already taken. */
static int kth_top(const dsc_layer_profile *rows, int n, double (*key)(const dsc_layer_profile *), bool *taken) {
    int best = -1;
    for (int i = 0; i < n; i++)
        if (rows[i].depth == 0 && !taken[i] && (best < 0 || key(&rows[i]) > key(&rows[best]))) best = i;
    if (best >= 0) taken[best] = true;
    return best;
}

static double by_params(const dsc_layer_profile *r) {
    return (double)r->params;
}
static double by_flops(const dsc_layer_profile *r) {
    return (double)r->fwd_flops;
}
static double by_latency(const dsc_layer_profile *r) {
    return r->fwd_s;
}

static dsc_status aggregated(FILE *f, const dsc_layer_profile *rows, int n, int top) {
    static const struct {
        const char *what;
        double (*key)(const dsc_layer_profile *);
    } measures[] = {{"params", by_params}, {"fwd flops", by_flops}, {"fwd latency", by_latency}};
    bool *taken = malloc((size_t)(n > 0 ? n : 1) * sizeof *taken);
    DSC_CHECK(taken, DSC_ERR_NOMEM, "flops profiler: %d layers", n);
    fprintf(f, "Top %d layers at depth 0 by parameters, forward FLOPs and forward latency:\n", top);
    for (size_t m = 0; m < sizeof measures / sizeof *measures; m++) {
        memset(taken, 0, (size_t)(n > 0 ? n : 1) * sizeof *taken);
        fprintf(f, "    %-12s -", measures[m].what);
        for (int k = 0; k < top; k++) {
            int i = kth_top(rows, n, measures[m].key, taken);
            if (i < 0) break;
            char a[32];
            if (measures[m].key == by_latency)
                fprintf(f, " %s: %.2f ms", rows[i].name, 1e3 * rows[i].fwd_s);
            else
                fprintf(f, " %s: %s", rows[i].name, human(measures[m].key(&rows[i]), a, sizeof a));
        }
        fputc('\n', f);
    }
    free(taken);
    return NULL;
}

static double share(double part, double whole) {
    return whole > 0 ? 100.0 * part / whole : 0.0;
}

static void detailed(FILE *f, const dsc_layer_profile *rows, int n, const totals *t, int depth) {
    fprintf(f, "%-28s %-10s %10s %6s %10s %6s %11s %6s %12s %10s %11s %12s\n", "layer", "type", "params", "%",
            "fwd flops", "%", "fwd ms", "%", "fwd FLOPS", "bwd flops", "bwd ms", "bwd FLOPS");
    for (int i = 0; i < n; i++) {
        const dsc_layer_profile *r = &rows[i];
        if (depth >= 0 && r->depth > depth) continue;
        char name[40], p[32], ff[32], fr[32], bf[32], br[32];
        int indent = r->depth > 0 ? (r->depth < 8 ? 2 * r->depth : 16) : 0; /* a long name is cut to the column */
        snprintf(name, sizeof name, "%*s%.*s", indent, "", (int)sizeof name - 1 - indent, r->name);
        fprintf(f, "%-28s %-10s %10s %5.1f%% %10s %5.1f%% %11.3f %5.1f%% %12s %10s %11.3f %12s\n", name, r->type,
                human((double)r->params, p, sizeof p), share((double)r->params, (double)t->params),
                human((double)r->fwd_flops, ff, sizeof ff), share((double)r->fwd_flops, (double)t->fwd_flops),
                1e3 * r->fwd_s, share(r->fwd_s, t->fwd_s),
                human(rate((double)r->fwd_flops, r->fwd_s), fr, sizeof fr),
                human((double)r->bwd_flops, bf, sizeof bf), 1e3 * r->bwd_s,
                human(rate((double)r->bwd_flops, r->bwd_s), br, sizeof br));
    }
}

dsc_status dsc_flops_profile_write(const dsc_config_flops_profiler *cfg, const dsc_flops_report *r,
                                   const dsc_layer_profile *rows, int n) {
    FILE *f = stdout;
    if (cfg->output_file && cfg->output_file[0]) {
        f = fopen(cfg->output_file, "w");
        DSC_CHECK(f, DSC_ERR_IO, "flops_profiler.output_file %s: %s", cfg->output_file, strerror(errno));
    }
    totals t = sum_top(rows, n);
    fprintf(f, "\n-------------------------- dsc FLOPs profiler --------------------------\n");
    summary(f, r, &t, cfg->recompute_fwd_factor);
    fprintf(f, "----------------------------- Aggregated profile -----------------------------\n");
    dsc_status s = aggregated(f, rows, n, cfg->top_modules);
    if (!s && cfg->detailed) {
        fprintf(f, "------------------------------ Detailed profile ------------------------------\n");
        detailed(f, rows, n, &t, cfg->module_depth);
    }
    fprintf(f, "------------------------------------------------------------------------------\n");
    if (f != stdout) {
        if (fclose(f) != 0 && !s)
            s = dsc_error(DSC_ERR_IO, "flops_profiler.output_file %s: %s", cfg->output_file, strerror(errno));
    } else {
        fflush(f);
    }
    return s;
}
