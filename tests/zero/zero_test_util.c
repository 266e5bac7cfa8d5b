/* The ZeRO tests' toy model and hook driver (see zero_test_util.h). */
#include "zero_test_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_mpi.h"

void toy_spec_default(toy_spec *spec) {
    /* Sizes not multiples of 64 leave gaps; the large ones straddle partition boundaries at 2, 3 and 4 ranks. */
    static const int64_t sizes[] = {1000, 37, 333, 2048, 5, 700, 129, 64, 1500};
    *spec = (toy_spec){.n_params = 9, .n_layers = 5, .prefix = "toy"};
    for (int i = 0; i < spec->n_params; i++)
        spec->sizes[i] = sizes[i];
    spec->flags[1] = spec->flags[4] = DSC_PARAM_NO_DECAY;
    static const int layers[5][4] = {{0, 1, -1}, {2, 3, 4, -1}, {5, 6, -1}, {7, 8, -1}, {0, -1}};
    for (int l = 0; l < spec->n_layers; l++) {
        for (int j = 0; j < TOY_MAX_PARAMS; j++)
            spec->layer_params[l][j] = -1;
        for (int j = 0; j < 4 && layers[l][j] >= 0; j++)
            spec->layer_params[l][j] = layers[l][j];
    }
}

void toy_model_init(toy_model *m, const toy_spec *spec, int rank) {
    memset(m, 0, sizeof *m);
    m->rank = rank;
    m->layer_base = spec->layer_base;
    assert_ok(dsc_params_create(&m->store, DSC_CPU, 1234));
    dsc_param *params[TOY_MAX_PARAMS];
    for (int i = 0; i < spec->n_params; i++) {
        if (spec->absent[i]) continue;
        char name[64];
        bool expert = spec->flags[i] & DSC_PARAM_EXPERT;
        snprintf(name, sizeof name, "%s.p%d", expert ? spec->expert_prefix : spec->prefix, i);
        assert_ok(dsc_params_declare(m->store, name, 1, &spec->sizes[i], spec->flags[i], DSC_INIT_NORMAL, 0.5f,
                                     &params[i]));
    }
    assert_ok(dsc_params_finalize(m->store));
    m->n_layers = spec->n_layers;
    for (int l = 0; l < spec->n_layers; l++) {
        dsc_layer *layer = &m->layers[l];
        snprintf(layer->name, sizeof layer->name, "%s.layer%d", spec->prefix, l);
        dsc_param *list[TOY_MAX_PARAMS];
        int n = 0;
        while (n < TOY_MAX_PARAMS && spec->layer_params[l][n] >= 0) {
            list[n] = params[spec->layer_params[l][n]];
            n++;
        }
        assert_ok(dsc_layer_set_params(layer, list, NULL, n));
        m->layer_ptrs[l] = layer;
    }
}

void toy_model_free(toy_model *m) {
    for (int l = 0; l < m->n_layers; l++) {
        free(m->layers[l].params);
        free(m->layers[l].param_uses);
    }
    dsc_params_destroy(m->store);
}

int64_t toy_param_total(toy_model *m) {
    int64_t n = 0;
    for (int i = 0; i < dsc_params_count(m->store); i++)
        n += dsc_param_numel(dsc_params_at(m->store, i));
    return n;
}

dsc_optimizer_options toy_options(toy_model *m, dsc_comm *dp) {
    dsc_optimizer_options o = {
        .params = m->store,
        .layers = m->layer_ptrs,
        .n_layers = m->n_layers,
        .dp = dp,
        .hparams = {DSC_OPTIMIZER_TYPE_ADAMW, 0.9f, 0.95f, 1e-8f, 0.0f, 0.1f, 1.0},
    };
    return o;
}

/* A layer's backward: grad += 0.5 * value + a wave that differs per rank,
 * micro-batch, step and parameter (values read while the layer is live). */
static void backward(toy_model *m, dsc_optimizer *opt, int l, int step, int micro, bool last) {
    dsc_layer *layer = &m->layers[l];
    assert_ok(dsc_optimizer_before_layer(opt, layer, true));
    for (int j = 0; j < layer->n_params; j++) {
        dsc_param *p = layer->params[j];
        float *g = p->grad.data;
        const float *v = p->value.data;
        assert_non_null(g);
        assert_non_null(v);
        int64_t n = dsc_param_numel(p);
        for (int64_t i = 0; i < n; i++)
            g[i] += 0.5f * v[i] + 0.3f * sinf(0.37f * (float)i + 1.3f * (float)(m->layer_base + l + j) +
                                              0.7f * (float)step + 0.11f * (float)micro + 0.5f * (float)m->rank);
    }
    assert_ok(dsc_optimizer_after_layer(opt, layer, true));
    if (last) assert_ok(dsc_optimizer_grads_ready(opt, layer));
}

static void forward(toy_model *m, dsc_optimizer *opt) {
    for (int l = 0; l < m->n_layers; l++) {
        assert_ok(dsc_optimizer_before_layer(opt, &m->layers[l], false));
        for (int j = 0; j < m->layers[l].n_params; j++)
            assert_non_null(m->layers[l].params[j]->value.data);
        assert_ok(dsc_optimizer_after_layer(opt, &m->layers[l], false));
    }
}

static void backward_all(toy_model *m, dsc_optimizer *opt, int step, int micro, int M) {
    for (int l = m->n_layers - 1; l >= 0; l--)
        backward(m, opt, l, step, micro, micro == M - 1);
}

void toy_train(toy_model *m, dsc_optimizer *opt, const toy_run *run, bool *clipped) {
    if (clipped) *clipped = false;
    for (int s = 1; s <= run->steps; s++) {
        int M = run->micro_batches;
        if (!run->interleave) {
            for (int mb = 0; mb < M; mb++) {
                forward(m, opt);
                backward_all(m, opt, s, mb, M);
            }
        } else {
            /* 1F1B on the last stage of two: F0 F1 B0 F2 B1 ... B(M-1) */
            int f = 0, b = 0;
            forward(m, opt), f++;
            while (b < M) {
                if (f < M) forward(m, opt), f++;
                backward_all(m, opt, s, b, M), b++;
            }
        }
        if (run->before_reduce) run->before_reduce(m, run->ctx);
        assert_ok(dsc_optimizer_reduce_grads(opt));
        dsc_optim_stats st;
        assert_ok(dsc_optimizer_step(opt, run->lr, &st));
        assert_int_equal(st.step, s);
        if (clipped && st.clip_coef < 1.0) *clipped = true;
    }
}

static dsc_layer *layer_of(dsc_layer *const *layers, int n_layers, const dsc_param *p) {
    for (int l = 0; l < n_layers; l++)
        for (int j = 0; j < layers[l]->n_params; j++)
            if (layers[l]->params[j] == p) return layers[l];
    return NULL;
}

void zero_test_read_params(dsc_param_store *store, dsc_layer *const *layers, int n_layers, dsc_optimizer *opt,
                           float *out) {
    int64_t at = 0;
    for (int i = 0; i < dsc_params_count(store); i++) {
        dsc_param *p = dsc_params_at(store, i);
        dsc_layer *layer = layer_of(layers, n_layers, p);
        assert_non_null(layer);
        assert_ok(dsc_optimizer_before_layer(opt, layer, false));
        memcpy(out + at, p->value.data, (size_t)dsc_param_numel(p) * sizeof *out);
        assert_ok(dsc_optimizer_after_layer(opt, layer, false));
        at += dsc_param_numel(p);
    }
}

void toy_read_params(toy_model *m, dsc_optimizer *opt, float *out) {
    zero_test_read_params(m->store, m->layer_ptrs, m->n_layers, opt, out);
}
