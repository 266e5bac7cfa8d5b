/* The loss curve: reads the engine's metrics JSON lines and draws train loss
 * (and val loss, when evaluated) against step as a self-contained SVG.
 *
 * Not here: writing the metrics (engine.c). Lines that are not JSON objects
 * with a step are an error naming the line; other keys are ignored. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "dsc/engine.h"

typedef struct curve {
    double *step, *value;
    int n, cap;
} curve;

static dsc_status curve_push(curve *c, double step, double value) {
    if (c->n == c->cap) {
        int cap = c->cap ? 2 * c->cap : 256;
        double *s = realloc(c->step, (size_t)cap * sizeof *s);
        if (s) c->step = s;
        double *v = s ? realloc(c->value, (size_t)cap * sizeof *v) : NULL;
        if (v) c->value = v;
        DSC_CHECK(s && v, DSC_ERR_NOMEM, "metrics plot: out of memory");
        c->cap = cap;
    }
    c->step[c->n] = step;
    c->value[c->n] = value;
    c->n++;
    return NULL;
}

static dsc_status read_metrics(const char *path, curve *train, curve *val) {
    FILE *fp = fopen(path, "r");
    DSC_CHECK(fp, DSC_ERR_IO, "metrics file %s: cannot open", path);
    char line[4096];
    dsc_status s = NULL;
    for (int lineno = 1; !s && fgets(line, sizeof line, fp); lineno++) {
        if (strspn(line, " \t\r\n") == strlen(line)) continue;
        cJSON *obj = cJSON_Parse(line);
        const cJSON *step = obj ? cJSON_GetObjectItemCaseSensitive(obj, "step") : NULL;
        if (!cJSON_IsNumber(step)) {
            s = dsc_error(DSC_ERR_CORRUPT, "metrics file %s line %d: not a JSON object with a \"step\"", path,
                          lineno);
        } else {
            const cJSON *loss = cJSON_GetObjectItemCaseSensitive(obj, "loss");
            const cJSON *vloss = cJSON_GetObjectItemCaseSensitive(obj, "val_loss");
            if (cJSON_IsNumber(loss)) s = curve_push(train, step->valuedouble, loss->valuedouble);
            if (!s && cJSON_IsNumber(vloss)) s = curve_push(val, step->valuedouble, vloss->valuedouble);
        }
        cJSON_Delete(obj);
    }
    fclose(fp);
    DSC_TRY(s);
    DSC_CHECK(train->n > 0, DSC_ERR_CORRUPT, "metrics file %s: no training loss to plot", path);
    return NULL;
}

enum { W = 720, H = 420, LEFT = 70, RIGHT = 20, TOP = 30, BOTTOM = 50 };

static void polyline(FILE *fp, const curve *c, double x0, double x1, double y0, double y1, const char *color) {
    if (c->n == 0) return;
    fprintf(fp, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"", color);
    for (int i = 0; i < c->n; i++) {
        double x = LEFT + (c->step[i] - x0) / (x1 - x0) * (W - LEFT - RIGHT);
        double y = TOP + (y1 - c->value[i]) / (y1 - y0) * (H - TOP - BOTTOM);
        fprintf(fp, "%.1f,%.1f ", x, y);
    }
    fputs("\"/>\n", fp);
}

static void write_svg(FILE *fp, const curve *train, const curve *val) {
    double x0 = train->step[0], x1 = train->step[0], y0 = INFINITY, y1 = -INFINITY;
    const curve *all[2] = {train, val};
    for (int k = 0; k < 2; k++)
        for (int i = 0; i < all[k]->n; i++) {
            if (all[k]->step[i] < x0) x0 = all[k]->step[i];
            if (all[k]->step[i] > x1) x1 = all[k]->step[i];
            if (isfinite(all[k]->value[i]) && all[k]->value[i] < y0) y0 = all[k]->value[i];
            if (isfinite(all[k]->value[i]) && all[k]->value[i] > y1) y1 = all[k]->value[i];
        }
    if (x1 <= x0) x1 = x0 + 1;
    if (!(y1 > y0)) y1 = y0 + 1;
    fprintf(fp,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" "
            "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
            W, H);
    fprintf(fp, "<text x=\"%d\" y=\"18\" font-size=\"14\">loss vs step</text>\n", LEFT);
    fprintf(fp, "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#888\"/>\n", LEFT, TOP,
            W - LEFT - RIGHT, H - TOP - BOTTOM);
    for (int i = 0; i <= 4; i++) {
        double v = y0 + (y1 - y0) * i / 4.0;
        double y = TOP + (1.0 - i / 4.0) * (H - TOP - BOTTOM);
        fprintf(fp, "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.3g</text>\n", LEFT - 6, y + 4, v);
        double s = x0 + (x1 - x0) * i / 4.0;
        double x = LEFT + i / 4.0 * (W - LEFT - RIGHT);
        fprintf(fp, "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%.0f</text>\n", x, H - BOTTOM + 18, s);
    }
    fprintf(fp, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">step</text>\n", (LEFT + W - RIGHT) / 2, H - 12);
    polyline(fp, train, x0, x1, y0, y1, "#1f77b4");
    polyline(fp, val, x0, x1, y0, y1, "#d62728");
    fprintf(fp, "<text x=\"%d\" y=\"%d\" fill=\"#1f77b4\">train loss</text>\n", W - RIGHT - 160, TOP + 16);
    if (val->n > 0)
        fprintf(fp, "<text x=\"%d\" y=\"%d\" fill=\"#d62728\">val loss</text>\n", W - RIGHT - 80, TOP + 16);
    fputs("</svg>\n", fp);
}

dsc_status dsc_metrics_plot_svg(const char *metrics_path, const char *svg_path) {
    curve train = {0}, val = {0};
    dsc_status s = read_metrics(metrics_path, &train, &val);
    FILE *fp = s ? NULL : fopen(svg_path, "w");
    if (!s && !fp) s = dsc_error(DSC_ERR_IO, "plot %s: cannot open for writing", svg_path);
    if (fp) {
        write_svg(fp, &train, &val);
        if (fclose(fp) != 0) s = dsc_error(DSC_ERR_IO, "plot %s: write failed", svg_path);
    }
    free(train.step);
    free(train.value);
    free(val.step);
    free(val.value);
    return s;
}
