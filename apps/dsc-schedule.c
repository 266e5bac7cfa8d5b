/* apps/dsc-schedule.c — prints pipeline instruction streams and simulates
 * whole pipelines.
 *
 *   dsc-schedule train|infer|dp|gpipe|interleaved M P S [--v V]
 *       the stream of stage S in the canonical format, and nothing else
 *   dsc-schedule simulate SCHEDULE M P [--v V] [--fwd F] [--bwd B] [--p2p C]
 *                         [--svg FILE] [--width N]
 *       makespan, bubble fraction and peak live activations per stage beside
 *       their closed forms, an ASCII timeline, optionally an SVG timeline
 *
 * A thin CLI: argument parsing and printing only; schedules and simulation
 * live in libdsc (dsc/schedule.h, dsc/pipe_sim.h). */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/cli.h"
#include "dsc/pipe_sim.h"
#include "dsc/schedule.h"

typedef struct options {
    dsc_schedule_kind kind;
    int micro_batches, stages, stage_id, chunks;
    dsc_pipe_sim_costs costs;
    const char *svg;
    int width;
} options;

static void usage(FILE *fp) {
    fputs("usage: dsc-schedule train|infer|dp|gpipe|interleaved M P S [--v V]\n"
          "       dsc-schedule simulate SCHEDULE M P [--v V] [--fwd F] [--bwd B] [--p2p C] [--svg FILE] [--width "
          "N]\n"
          "  M micro-batches, P stages, S stage id; V model chunks per stage (interleaved only, default 2);\n"
          "  F, B, C forward / backward / p2p cost (default 1, 2, 0); N timeline columns (default 120)\n",
          fp);
}

static int parse_int(const char *what, const char *text, int *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < -1000000000L || v > 1000000000L) {
        fprintf(stderr, "dsc-schedule: %s must be an integer, got \"%s\"\n", what, text);
        return 0;
    }
    *out = (int)v;
    return 1;
}

static int parse_double(const char *what, const char *text, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v)) {
        fprintf(stderr, "dsc-schedule: %s must be a number, got \"%s\"\n", what, text);
        return 0;
    }
    *out = v;
    return 1;
}

/* Parses the options after the positional arguments; returns 0 on a bad one. */
static int parse_flags(int argc, char **argv, int simulate, options *o) {
    int have_v = 0;
    for (int i = 0; i < argc; i++) {
        const char *flag = argv[i];
        if (i + 1 >= argc) {
            fprintf(stderr, "dsc-schedule: %s needs a value\n", flag);
            return 0;
        }
        const char *val = argv[++i];
        int ok = 1;
        if (strcmp(flag, "--v") == 0) {
            ok = parse_int("--v", val, &o->chunks);
            have_v = 1;
        } else if (simulate && strcmp(flag, "--fwd") == 0) {
            ok = parse_double("--fwd", val, &o->costs.forward);
        } else if (simulate && strcmp(flag, "--bwd") == 0) {
            ok = parse_double("--bwd", val, &o->costs.backward);
        } else if (simulate && strcmp(flag, "--p2p") == 0) {
            ok = parse_double("--p2p", val, &o->costs.p2p);
        } else if (simulate && strcmp(flag, "--width") == 0) {
            ok = parse_int("--width", val, &o->width);
        } else if (simulate && strcmp(flag, "--svg") == 0) {
            o->svg = val;
        } else {
            fprintf(stderr, "dsc-schedule: unknown option %s\n", flag);
            return 0;
        }
        if (!ok) return 0;
    }
    if (!have_v) o->chunks = o->kind == DSC_SCHEDULE_INTERLEAVED ? 2 : 1;
    return 1;
}

static int fail(dsc_status st) {
    fprintf(stderr, "dsc-schedule: %s\n", dsc_status_message(st));
    dsc_status_free(st);
    return 1;
}

static int print_stream(const options *o) {
    dsc_schedule *s;
    dsc_status st = dsc_schedule_create(o->kind, o->micro_batches, o->stages, o->stage_id, o->chunks, &s);
    if (st) return fail(st);
    st = dsc_schedule_print(s, stdout);
    dsc_schedule_destroy(s);
    return st ? fail(st) : 0;
}

static void print_report(const options *o, dsc_schedule *const *scheds, const dsc_pipe_sim_result *r,
                         const dsc_pipe_sim_bounds *cf) {
    const dsc_pipe_sim_costs *c = &o->costs;
    printf("schedule %s: M=%d micro-batches, P=%d stages, v=%d chunks per stage; costs F=%g B=%g C=%g\n",
           dsc_schedule_kind_name(o->kind), o->micro_batches, o->stages, o->chunks, c->forward, c->backward,
           c->p2p);
    printf("%-18s %12s %12s\n", "", "simulated", c->p2p > 0 ? "closed(C=0)" : "closed form");
    printf("%-18s %12.4f %12.4f\n", "makespan", r->makespan, cf->makespan);
    printf("%-18s %12.4f %12.4f\n", "bubble fraction", r->bubble, cf->bubble);
    printf("%-18s %12d\n", "steps", dsc_schedule_num_steps(scheds[0]));
    printf("\nstage %10s %10s %10s %12s %8s\n", "busy", "finish", "peak_live", "closed form", "buffers");
    for (int i = 0; i < r->num_stages; i++) {
        const dsc_pipe_sim_stage *st = &r->stages[i];
        printf("%5d %10.4g %10.4g %10d %12d %8d\n", i, st->busy, st->finish, st->peak_live,
               dsc_pipe_sim_peak_live_bound(o->kind, o->micro_batches, o->stages, i, o->chunks),
               dsc_schedule_num_buffers(scheds[i]));
    }
    if (o->chunks > 1) printf("(peak_live counts model chunks, each 1/%d of a stage's activations)\n", o->chunks);
    putchar('\n');
}

static int simulate(const options *o) {
    if (o->stages < 1) return fail(dsc_error(DSC_ERR_INVALID, "P must be >= 1, got %d", o->stages));
    dsc_schedule **scheds = calloc((size_t)o->stages, sizeof *scheds);
    if (!scheds) return fail(dsc_error(DSC_ERR_NOMEM, "allocating %d schedules", o->stages));
    dsc_pipe_sim_result r = {0};
    dsc_pipe_sim_bounds cf;
    dsc_status st = NULL;
    for (int i = 0; i < o->stages && !st; i++)
        st = dsc_schedule_create(o->kind, o->micro_batches, o->stages, i, o->chunks, &scheds[i]);
    if (!st) st = dsc_pipe_sim_run(scheds, o->stages, &o->costs, &r);
    if (!st) st = dsc_pipe_sim_closed_form(o->kind, o->micro_batches, o->stages, o->chunks, &o->costs, &cf);
    if (!st) {
        print_report(o, scheds, &r, &cf);
        st = dsc_pipe_sim_print_timeline(&r, o->width, stdout);
    }
    if (!st && o->svg) {
        char title[160];
        snprintf(title, sizeof title, "%s M=%d P=%d v=%d F=%g B=%g C=%g", dsc_schedule_kind_name(o->kind),
                 o->micro_batches, o->stages, o->chunks, o->costs.forward, o->costs.backward, o->costs.p2p);
        st = dsc_pipe_sim_write_svg(&r, title, o->svg);
        if (!st) printf("wrote %s\n", o->svg);
    }
    dsc_pipe_sim_free(&r);
    for (int i = 0; i < o->stages; i++)
        dsc_schedule_destroy(scheds[i]);
    free(scheds);
    return st ? fail(st) : 0;
}

int main(int argc, char **argv) {
    if (dsc_cli_info(argc, argv, argc - 1, "dsc-schedule", usage)) return 0;
    options o = {.costs = {1.0, 2.0, 0.0}, .width = 120};
    const int sim = argc > 1 && strcmp(argv[1], "simulate") == 0;
    /* "KIND M P S" or "simulate KIND M P": four words after the program name. */
    if (argc < 5) {
        usage(stderr);
        return 2;
    }
    const char *kind_name = argv[sim ? 2 : 1];
    const int first = sim ? 3 : 2;
    dsc_status st = dsc_schedule_kind_from_name(kind_name, &o.kind);
    if (st) {
        fail(st);
        usage(stderr);
        return 2;
    }
    if (!parse_int("M", argv[first], &o.micro_batches) || !parse_int("P", argv[first + 1], &o.stages)) return 2;
    if (!sim && !parse_int("S", argv[first + 2], &o.stage_id)) return 2;
    const int flags_at = sim ? first + 2 : first + 3;
    if (!parse_flags(argc - flags_at, argv + flags_at, sim, &o)) {
        usage(stderr);
        return 2;
    }
    return sim ? simulate(&o) : print_stream(&o);
}
