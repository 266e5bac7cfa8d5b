/* pipe/simulate_render.c — draws a simulated pipeline as an ASCII timeline
 * (one row per stage) and as an SVG file. It only reads a finished
 * dsc_pipe_sim_result; it simulates nothing. */
#include <math.h>
#include <stdio.h>

#include "dsc/pipe_sim.h"

static double shortest_segment(const dsc_pipe_sim_result *r) {
    double shortest = INFINITY;
    for (int i = 0; i < r->num_stages; i++)
        for (int k = 0; k < r->stages[i].num_segments; k++) {
            const double len = r->stages[i].segments[k].end - r->stages[i].segments[k].start;
            if (len > 0 && len < shortest) shortest = len;
        }
    return shortest;
}

static const char segment_chars[4] = {'F', 'B', 'f', 'b'};

static int segment_category(const dsc_pipe_sim_segment *g) {
    return (g->chunk % 2) * 2 + g->backward;
}

/* The character of column [lo, hi): the activity that fills most of it, or
 * '.' when the stage is idle for at least half of it. Averaging over the
 * column (instead of sampling one instant) keeps scaled-down rows honest.
 * `k` is the first segment that may still overlap; it only moves forward. */
static char column_char(const dsc_pipe_sim_stage *st, int *k, double lo, double hi) {
    double busy[4] = {0};
    while (*k < st->num_segments && st->segments[*k].end <= lo)
        (*k)++;
    for (int q = *k; q < st->num_segments && st->segments[q].start < hi; q++) {
        const dsc_pipe_sim_segment *g = &st->segments[q];
        busy[segment_category(g)] += fmin(g->end, hi) - fmax(g->start, lo);
    }
    int best = 0;
    for (int c = 1; c < 4; c++)
        if (busy[c] > busy[best]) best = c;
    return busy[0] + busy[1] + busy[2] + busy[3] >= 0.5 * (hi - lo) ? segment_chars[best] : '.';
}

dsc_status dsc_pipe_sim_print_timeline(const dsc_pipe_sim_result *r, int max_width, FILE *out) {
    DSC_CHECK(max_width >= 1, DSC_ERR_INVALID, "timeline width must be >= 1, got %d", max_width);
    const double shortest = shortest_segment(r);
    if (r->makespan <= 0 || !isfinite(shortest)) {
        fprintf(out, "timeline: nothing to draw (makespan %g)\n", r->makespan);
        return NULL;
    }
    /* One column per shortest operation, unless that is wider than allowed. */
    int cols = (int)ceil(r->makespan / shortest - 1e-9);
    double dt = shortest;
    if (cols > max_width) cols = max_width, dt = r->makespan / max_width;
    fprintf(out, "timeline: 1 column = %.4g time units; F/B forward/backward (f/b odd model chunks), . idle\n",
            dt);
    for (int i = 0; i < r->num_stages; i++) {
        const dsc_pipe_sim_stage *st = &r->stages[i];
        fprintf(out, "stage %3d |", i);
        int k = 0;
        for (int col = 0; col < cols; col++)
            fputc(column_char(st, &k, col * dt, (col + 1) * dt), out);
        fputs("|\n", out);
    }
    DSC_CHECK(!ferror(out), DSC_ERR_IO, "writing the timeline: output error");
    return NULL;
}

/* Text goes into XML, so the three characters XML reserves are escaped. */
static void put_xml_text(FILE *f, const char *text) {
    for (; *text; text++) {
        if (*text == '<')
            fputs("&lt;", f);
        else if (*text == '>')
            fputs("&gt;", f);
        else if (*text == '&')
            fputs("&amp;", f);
        else
            fputc(*text, f);
    }
}

dsc_status dsc_pipe_sim_write_svg(const dsc_pipe_sim_result *r, const char *title, const char *path) {
    FILE *f = fopen(path, "w");
    DSC_CHECK(f, DSC_ERR_IO, "opening SVG file %s for writing", path);
    const double left = 70, top = 40, row = 22, plot_w = 1200;
    const double scale = r->makespan > 0 ? plot_w / r->makespan : 0;
    const double height = top + row * r->num_stages + 30;
    /* Forward blue, backward green; odd model chunks a lighter shade. */
    static const char *const fills[2][2] = {{"#4c78a8", "#9ecae9"}, {"#54a24b", "#a6d59a"}};
    fprintf(f,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"monospace\" "
            "font-size=\"11\">\n",
            left + plot_w + 20, height);
    fprintf(f, "<text x=\"%.0f\" y=\"20\" font-size=\"14\">", left);
    put_xml_text(f, title);
    fprintf(f, " (makespan %.4g, bubble %.4f)</text>\n", r->makespan, r->bubble);
    for (int i = 0; i < r->num_stages; i++) {
        const double y = top + row * i;
        fprintf(f, "<text x=\"5\" y=\"%.1f\">stage %d</text>\n", y + row * 0.7, i);
        fprintf(f, "<rect x=\"%.0f\" y=\"%.1f\" width=\"%.0f\" height=\"%.1f\" fill=\"#f0f0f0\"/>\n", left, y,
                plot_w, row - 2);
        for (int k = 0; k < r->stages[i].num_segments; k++) {
            const dsc_pipe_sim_segment *g = &r->stages[i].segments[k];
            const double x = left + g->start * scale, w = (g->end - g->start) * scale;
            fprintf(f,
                    "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.1f\" fill=\"%s\" stroke=\"white\" "
                    "stroke-width=\"0.5\"><title>%s mb %d chunk %d [%g, %g]</title></rect>\n",
                    x, y, w, row - 2, fills[g->backward][g->chunk % 2], g->backward ? "backward" : "forward",
                    g->micro_batch, g->chunk, g->start, g->end);
            if (w >= 14) /* micro-batch id, dark on the light shades of odd chunks */
                fprintf(f, "<text x=\"%.2f\" y=\"%.1f\" fill=\"%s\">%d</text>\n", x + 2, y + row * 0.65,
                        g->chunk % 2 ? "#222222" : "white", g->micro_batch);
        }
    }
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">time 0 .. %.4g</text>\n</svg>\n", left, height - 8, r->makespan);
    const int write_failed = ferror(f);
    const int close_failed = fclose(f) != 0;
    DSC_CHECK(!write_failed && !close_failed, DSC_ERR_IO, "writing SVG file %s", path);
    return NULL;
}
