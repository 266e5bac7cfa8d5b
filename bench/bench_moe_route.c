/* bench_moe_route — the MoE layer's token movement alone: gate (softmax,
 * top-k, capacity positions, weights), dispatch (token rows scattered into
 * the (E, Cap, M) expert buffer) and combine (weighted sum of each token's
 * expert rows), in microseconds per token. "before" is the host loops
 * moe/dispatch.c ran up to wave 2 (memset, a memcpy per route, a scalar
 * multiply-add loop, OpenMP over tokens), restated below; "after" is the
 * row kernels (dsc_kernel_moe_scatter / _gather) over the destination-row
 * table. Both share the gate (dsc_moe_gate_forward, timed on its own).
 * Reference: the memory-traffic bound of moving the token rows twice (the
 * dispatch reads S rows and writes the E * Cap buffer rows once: kept rows
 * copied, padding zeroed; the old loops zeroed all, then copied; the combine
 * reads the kept rows and writes S rows) at the memcpy rate measured at the
 * same footprint (and, for scale, from DRAM).
 * Runs are interleaved (before, after, before, ...), min and median over
 * the pairs, load average before and after.
 *
 *   build/bench/bench_moe_route [--tokens S] [--d-model M] [--experts E] [--k K]
 *                               [--capacity-factor C] [--pairs N] [--iters I]
 * Prints; never asserts. */
#define _DEFAULT_SOURCE /* getloadavg, clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench/bench_clock.h"
#include "dsc/kernels.h"
#include "dsc/moe_gate.h"

static void die(dsc_status s) {
    if (!s) return;
    fprintf(stderr, "bench_moe_route: %s\n", dsc_status_message(s));
    exit(1);
}

static double load1(void) {
    double l;
    return getloadavg(&l, 1) == 1 ? l : -1;
}

/* ---- before: the host loops of moe/dispatch.c (wave 2) ---- */

static void old_dispatch(const dsc_moe_gate_result *r, const int64_t *row0, const float *x, int64_t M,
                         float *buf) {
    const int64_t S = r->num_tokens, K = r->k;
    memset(buf, 0, (size_t)(row0[r->num_experts] * M) * sizeof *buf);
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < S; s++)
        for (int64_t j = 0; j < K; j++) {
            const int32_t slot = r->slot[s * K + j];
            if (slot < 0) continue;
            memcpy(buf + (row0[r->expert[s * K + j]] + slot) * M, x + s * M, (size_t)M * sizeof *x);
        }
}

static void old_combine(const dsc_moe_gate_result *r, const int64_t *row0, const float *y, int64_t M, float *out) {
    const int64_t S = r->num_tokens, K = r->k;
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < S; s++) {
        float *o = out + s * M;
        memset(o, 0, (size_t)M * sizeof *o);
        for (int64_t j = 0; j < K; j++) {
            const int32_t slot = r->slot[s * K + j];
            if (slot < 0) continue;
            const float w = r->weight[s * K + j], *row = y + (row0[r->expert[s * K + j]] + slot) * M;
            for (int64_t c = 0; c < M; c++)
                o[c] += w * row[c];
        }
    }
}

typedef struct setup {
    int64_t S, M, E, K, R;
    dsc_moe_gate_config cfg;
    dsc_moe_gate_result r;
    dsc_tensor logits;
    float *z, *x, *buf, *out;
    int64_t *row0;
    int32_t *dest;
} setup;

/* Seconds of one pass per phase: [0] gate, [1] dispatch, [2] combine. */
static void one_pass(setup *b, bool kernels, double *t) {
    double t0 = now_s();
    die(dsc_moe_gate_forward(&b->cfg, &b->logits, false, NULL, NULL, &b->r));
    double t1 = now_s();
    const int64_t S = b->S, M = b->M, K = b->K;
    for (int64_t e = 0; e <= b->E; e++)
        b->row0[e] = e * b->r.capacity;
    const int64_t R = b->row0[b->E];
    if (kernels) {
        for (int64_t i = 0; i < S * K; i++)
            b->dest[i] = b->r.slot[i] < 0 ? -1 : (int32_t)(b->row0[b->r.expert[i]] + b->r.slot[i]);
        dsc_tensor x = dsc_tensor_view(b->x, DSC_DTYPE_F32, 2, (int64_t[]){S, M}, DSC_CPU);
        dsc_tensor buf = dsc_tensor_view(b->buf, DSC_DTYPE_F32, 2, (int64_t[]){R, M}, DSC_CPU);
        dsc_tensor dest = dsc_tensor_view(b->dest, DSC_DTYPE_I32, 2, (int64_t[]){S, K}, DSC_CPU);
        dsc_tensor w = dsc_tensor_view(b->r.weight, DSC_DTYPE_F32, 2, (int64_t[]){S, K}, DSC_CPU);
        dsc_tensor out = dsc_tensor_view(b->out, DSC_DTYPE_F32, 2, (int64_t[]){S, M}, DSC_CPU);
        for (int64_t e = 0; e < b->E; e++) { /* padding slots after each expert's kept rows */
            int64_t n = (b->r.capacity - b->r.kept_counts[e]) * M;
            dsc_tensor pad =
                dsc_tensor_view(b->buf + (b->row0[e] + b->r.kept_counts[e]) * M, DSC_DTYPE_F32, 1, &n, DSC_CPU);
            if (n > 0) die(dsc_kernel_zero(&pad));
        }
        die(dsc_kernel_moe_scatter(&buf, &x, &dest));
        t[1] += now_s() - t1;
        double t2 = now_s();
        die(dsc_kernel_moe_gather(&out, &buf, &dest, &w, false));
        t[2] += now_s() - t2;
    } else {
        old_dispatch(&b->r, b->row0, b->x, M, b->buf);
        t[1] += now_s() - t1;
        double t2 = now_s();
        old_combine(&b->r, b->row0, b->buf, M, b->out);
        t[2] += now_s() - t2;
    }
    t[0] += t1 - t0;
}

/* Best memcpy rate (bytes read + written per second) copying n bytes. */
static double memcpy_rate(size_t n) {
    char *a = malloc(n), *c = malloc(n);
    memset(a, 1, n);
    memset(c, 2, n);
    double best = 1e30;
    for (int i = 0; i < 5; i++) {
        double t0 = now_s();
        memcpy(c, a, n);
        double dt = now_s() - t0;
        best = dt < best ? dt : best;
    }
    volatile char sink = c[n / 2];
    (void)sink;
    free(a), free(c);
    return 2.0 * (double)n / best;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static double minimum(const double *v, int n) {
    double m = v[0];
    for (int i = 1; i < n; i++)
        m = v[i] < m ? v[i] : m;
    return m;
}

int main(int argc, char **argv) {
    setup b = {.S = 2048, .M = 768, .E = 8, .K = 2};
    double cf = 1.25;
    int pairs = 7, iters = 20;
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *o = argv[i], *v = argv[i + 1];
        if (!strcmp(o, "--tokens"))
            b.S = atoll(v);
        else if (!strcmp(o, "--d-model"))
            b.M = atoll(v);
        else if (!strcmp(o, "--experts"))
            b.E = atoll(v);
        else if (!strcmp(o, "--k"))
            b.K = atoll(v);
        else if (!strcmp(o, "--capacity-factor"))
            cf = atof(v);
        else if (!strcmp(o, "--pairs"))
            pairs = atoi(v);
        else if (!strcmp(o, "--iters"))
            iters = atoi(v);
        else {
            fprintf(stderr, "bench_moe_route: unknown option %s\n", o);
            return 2;
        }
    }
    if (pairs < 1 || pairs > 64 || iters < 1 || b.S < 1 || b.M < 1 || b.K < 1 || b.K > b.E) {
        fprintf(stderr, "bench_moe_route: need 1 <= pairs <= 64, iters >= 1, tokens, width >= 1, 1 <= k <= E\n");
        return 2;
    }
    const double load0 = load1();
    b.cfg = dsc_moe_gate_config_default();
    b.cfg.k = (int)b.K;
    b.cfg.capacity_factor = b.cfg.eval_capacity_factor = cf;
    die(dsc_moe_gate_result_alloc(&b.r, b.S, b.E, (int)b.K));
    const int64_t cap = dsc_moe_gate_capacity(&b.cfg, b.S, b.E, false);
    b.R = cap * b.E;
    b.z = malloc((size_t)(b.S * b.E) * sizeof(float));
    b.x = malloc((size_t)(b.S * b.M) * sizeof(float));
    b.out = malloc((size_t)(b.S * b.M) * sizeof(float));
    b.buf = malloc((size_t)(b.R * b.M) * sizeof(float));
    b.row0 = malloc((size_t)(b.E + 1) * sizeof(int64_t));
    b.dest = malloc((size_t)(b.S * b.K) * sizeof(int32_t));
    unsigned seed = 1;
    for (int64_t i = 0; i < b.S * b.E; i++)
        b.z[i] = (float)((seed = seed * 1664525u + 1013904223u) >> 8) / (float)(1u << 24) * 4.0f - 2.0f;
    for (int64_t i = 0; i < b.S * b.M; i++)
        b.x[i] = (float)((seed = seed * 1664525u + 1013904223u) >> 8) / (float)(1u << 24) - 0.5f;
    b.logits = dsc_tensor_view(b.z, DSC_DTYPE_F32, 2, (int64_t[]){b.S, b.E}, DSC_CPU);

    double before[3][64], after[3][64];
    double warm[3] = {0};
    one_pass(&b, false, warm);
    one_pass(&b, true, warm);
    for (int p = 0; p < pairs; p++) {
        for (int v = 0; v < 2; v++) {
            double t[3] = {0};
            for (int i = 0; i < iters; i++)
                one_pass(&b, v == 1, t);
            for (int ph = 0; ph < 3; ph++)
                (v ? after : before)[ph][p] = 1e6 * t[ph] / iters / (double)b.S;
        }
    }
    int64_t kept = 0;
    for (int64_t e = 0; e < b.E; e++)
        kept += b.r.kept_counts[e];
    const double bytes = 4.0 * (double)b.M * ((double)b.S + (double)b.R + (double)kept + (double)b.S);
    /* The rate at the pass's own footprint (cache-resident when it fits, as the pass is) and from DRAM. */
    const double rate = memcpy_rate((size_t)(bytes / 2) + 4096), dram = memcpy_rate((size_t)256 << 20);
    printf("bench_moe_route: S=%lld tokens, M=%lld, E=%lld, k=%lld, capacity %lld (factor %g), %lld of %lld "
           "routes kept, %d threads, %d interleaved pairs x %d iterations\n",
           (long long)b.S, (long long)b.M, (long long)b.E, (long long)b.K, (long long)cap, cf, (long long)kept,
           (long long)(b.S * b.K), dsc_kernels_get_num_threads(), pairs, iters);
    printf(
        "moving the rows twice: %.1f MB per pass; memcpy (read + write) %.2f GB/s at that footprint, bound %.4f "
        "us/token; %.2f GB/s from DRAM (256 MiB), bound %.4f us/token\n",
        bytes / 1e6, rate / 1e9, 1e6 * bytes / rate / (double)b.S, dram / 1e9, 1e6 * bytes / dram / (double)b.S);
    const char *names[3] = {"gate (shared)", "dispatch", "combine"};
    printf("%-16s %12s %12s %12s %12s %8s\n", "us/token", "before min", "before med", "after min", "after med",
           "speedup");
    double sum_b[64] = {0}, sum_a[64] = {0};
    for (int ph = 0; ph < 3; ph++) {
        for (int p = 0; p < pairs; p++) {
            if (ph) sum_b[p] += before[ph][p], sum_a[p] += after[ph][p];
        }
        double bm = minimum(before[ph], pairs), am = minimum(after[ph], pairs);
        double bmed = median(before[ph], pairs), amed = median(after[ph], pairs);
        printf("%-16s %12.4f %12.4f %12.4f %12.4f %7.2fx\n", names[ph], bm, bmed, am, amed, bmed / amed);
    }
    double bm = minimum(sum_b, pairs), am = minimum(sum_a, pairs);
    double bmed = median(sum_b, pairs), amed = median(sum_a, pairs);
    printf("%-16s %12.4f %12.4f %12.4f %12.4f %7.2fx   (bound %.4f: after reaches %.0f%% of it)\n",
           "dispatch+combine", bm, bmed, am, amed, bmed / amed, 1e6 * bytes / rate / (double)b.S,
           100.0 * (1e6 * bytes / rate / (double)b.S) / amed);
    printf("load average %.2f before, %.2f after\n", load0, load1());
    dsc_moe_gate_result_free(&b.r);
    free(b.z), free(b.x), free(b.out), free(b.buf), free(b.row0), free(b.dest);
    return 0;
}
