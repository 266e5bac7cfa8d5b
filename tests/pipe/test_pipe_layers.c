/* The test-only layers of test_pipe_layers.h. Every buffer is (B, T, W) f32
 * with W = 1, or 2 for "test_wide". */
#include "test_pipe_layers.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/kernels.h"
#include "test_mpi.h"

typedef struct test_layer {
    dsc_layer base;
    dsc_param *w;        /* (1, 1); NULL for the loss */
    int width;           /* output features */
    bool first;          /* reads the tokens: no input gradient */
    dsc_tensor x, y, dx; /* per slot, (slots * B * T) floats each */
} test_layer;

static float *at(dsc_tensor *t, int slot, const dsc_layer *l) {
    return (float *)t->data + (int64_t)slot * l->max_B * l->max_T * 2;
}

static dsc_status t_reserve(dsc_layer *self, int slots, int64_t B, int64_t T) {
    test_layer *l = (test_layer *)self;
    int64_t n = (int64_t)slots * B * T * 2;
    dsc_tensor_free(&l->x), dsc_tensor_free(&l->y), dsc_tensor_free(&l->dx);
    DSC_TRY(dsc_tensor_alloc(&l->x, DSC_DTYPE_F32, 1, &n, DSC_CPU, DSC_MEM_ACTIVATIONS));
    DSC_TRY(dsc_tensor_alloc(&l->y, DSC_DTYPE_F32, 1, &n, DSC_CPU, DSC_MEM_ACTIVATIONS));
    return dsc_tensor_alloc(&l->dx, DSC_DTYPE_F32, 1, &n, DSC_CPU, DSC_MEM_ACTIVATIONS);
}

static dsc_status t_forward(dsc_layer *self, int slot, const dsc_tensor *in, dsc_tensor *out, dsc_micro_ctx *ctx) {
    test_layer *l = (test_layer *)self;
    const dsc_tensor *ref = in->ndim == 0 ? ctx->tokens : in;
    int64_t b = ref->shape[0], t = ref->shape[1];
    float *x = at(&l->x, slot, self), *y = at(&l->y, slot, self);
    l->first = in->ndim == 0;
    for (int64_t i = 0; i < b * t; i++)
        x[i] = in->ndim == 0 ? (float)((const int32_t *)ctx->tokens->data)[i]
                             : ((const float *)in->data)[i * in->shape[2]];
    if (!l->w) { /* MSE against the targets */
        double sum = 0;
        for (int64_t i = 0; i < b * t; i++) {
            float d = x[i] - (float)((const int32_t *)ctx->targets->data)[i];
            y[i] = d * d;
            sum += y[i];
        }
        ctx->loss = sum / (double)(b * t);
        *out = dsc_tensor_view(y, DSC_DTYPE_F32, 2, (int64_t[]){b, t}, DSC_CPU);
        return NULL;
    }
    float w = *(const float *)l->w->value.data;
    for (int64_t i = 0; i < b * t; i++)
        for (int k = 0; k < l->width; k++)
            y[i * l->width + k] = w * x[i];
    *out = dsc_tensor_view(y, DSC_DTYPE_F32, 3, (int64_t[]){b, t, l->width}, DSC_CPU);
    return NULL;
}

static dsc_status t_backward(dsc_layer *self, int slot, const dsc_tensor *dout, dsc_tensor *din,
                             dsc_micro_ctx *ctx) {
    test_layer *l = (test_layer *)self;
    const dsc_tensor *ref = l->w ? dout : ctx->targets;
    int64_t b = ref->shape[0], t = ref->shape[1], n = b * t;
    float *x = at(&l->x, slot, self), *dx = at(&l->dx, slot, self);
    if (!l->w) {
        for (int64_t i = 0; i < n; i++)
            dx[i] = 2.0f * (x[i] - (float)((const int32_t *)ctx->targets->data)[i]) / (float)n * ctx->loss_scale;
    } else {
        float w = *(const float *)l->w->value.data, *dw = (float *)l->w->grad.data;
        for (int64_t i = 0; i < n; i++) {
            float g = ((const float *)dout->data)[i * l->width];
            *dw += g * x[i];
            dx[i] = w * g;
        }
    }
    *din = l->first ? (dsc_tensor){0} : dsc_tensor_view(dx, DSC_DTYPE_F32, 3, (int64_t[]){b, t, 1}, DSC_CPU);
    /* One kernel call, as every real layer's backward makes (x 1 changes nothing), so the
     * runner's progress hook has a kernel to run before (test_pipe_gas counts it). */
    dsc_tensor view = dsc_tensor_view(dx, DSC_DTYPE_F32, 1, &n, DSC_CPU);
    return dsc_kernel_scale(&view, 1.0f);
}

static void t_destroy(dsc_layer *self) {
    test_layer *l = (test_layer *)self;
    dsc_tensor_free(&l->x), dsc_tensor_free(&l->y), dsc_tensor_free(&l->dx);
    free(l);
}

static const dsc_layer_ops linear_ops = {.type = "test_linear",
                                         .reserve = t_reserve,
                                         .forward = t_forward,
                                         .backward = t_backward,
                                         .destroy = t_destroy};
static const dsc_layer_ops mse_ops = {
    .type = "test_mse", .reserve = t_reserve, .forward = t_forward, .backward = t_backward, .destroy = t_destroy};

static dsc_status make(const dsc_layer_spec *spec, const dsc_build_ctx *ctx, int width, bool loss,
                       dsc_layer **out) {
    test_layer *l = calloc(1, sizeof *l);
    l->base.ops = loss ? &mse_ops : &linear_ops;
    l->width = width;
    snprintf(l->base.name, sizeof l->base.name, loss ? "mse" : "lin.%d", spec->block);
    if (!loss) {
        char name[64];
        snprintf(name, sizeof name, "lin.%d.weight", spec->block);
        DSC_TRY(dsc_params_declare(ctx->params, name, 2, (int64_t[]){1, 1}, 0, DSC_INIT_ONES, 0, &l->w));
        DSC_TRY(dsc_layer_set_params(&l->base, &l->w, NULL, 1));
    }
    l->base.activation_bytes_per_token = 12;
    *out = &l->base;
    return NULL;
}

static dsc_status linear_factory(const dsc_layer_spec *s, const dsc_build_ctx *c, dsc_layer **o) {
    return make(s, c, 1, false, o);
}
static dsc_status wide_factory(const dsc_layer_spec *s, const dsc_build_ctx *c, dsc_layer **o) {
    return make(s, c, 2, false, o);
}
static dsc_status mse_factory(const dsc_layer_spec *s, const dsc_build_ctx *c, dsc_layer **o) {
    return make(s, c, 1, true, o);
}

void test_pipe_register_layers(void) {
    assert_ok(dsc_layer_register("test_linear", linear_factory));
    assert_ok(dsc_layer_register("test_wide", wide_factory));
    assert_ok(dsc_layer_register("test_mse", mse_factory));
}

static dsc_status const_next(dsc_batch_source *base, dsc_tensor *tokens, dsc_tensor *targets) {
    test_const_source *s = (test_const_source *)base;
    for (int64_t i = 0; i < dsc_tensor_numel(tokens); i++) {
        ((int32_t *)tokens->data)[i] = s->input;
        ((int32_t *)targets->data)[i] = s->target;
    }
    base->consumed++;
    return NULL;
}

void test_const_source_init(test_const_source *s, int micro_batches, int32_t input, int32_t target) {
    *s = (test_const_source){{const_next, micro_batches, 0}, input, target};
}

dsc_status test_pipe_build(dsc_comm *pipe, const test_pipe_spec *spec, test_pipe *tp) {
    memset(tp, 0, sizeof *tp);
    test_pipe_register_layers();
    DSC_TRY(dsc_comm_set_timeout(pipe, spec->timeout_s));
    dsc_model_config_defaults(&tp->mc, DSC_ARCH_GPT);
    tp->mc.d_model = 1;
    dsc_pipe_layer_spec layers[16];
    memset(layers, 0, sizeof layers);
    for (int i = 0; i < spec->n; i++) {
        snprintf(layers[i].spec.type, sizeof layers[i].spec.type, "%s", spec->types[i]);
        layers[i].spec.block = i;
    }
    dsc_pipe_module_options mo = {.layers = layers,
                                  .n_layers = spec->n,
                                  .stages = dsc_comm_size(pipe),
                                  .chunks = spec->chunks,
                                  .partition_method = spec->method,
                                  .model = &tp->mc,
                                  .width = 1,
                                  .expert_parallel = 1};
    DSC_TRY(dsc_pipe_module_create(&mo, &tp->module));
    DSC_TRY(dsc_params_create(&tp->store, DSC_CPU, 1));
    DSC_TRY(dsc_pipe_stage_build(tp->module, dsc_comm_rank(pipe), tp->store, DSC_CPU, &tp->stage));
    DSC_TRY(dsc_params_finalize(tp->store));
    int n;
    dsc_layer *const *local = dsc_pipe_stage_layers(tp->stage, &n);
    dsc_optimizer_options oo = {.params = tp->store, .layers = local, .n_layers = n, .pipe = pipe};
    oo.hparams.type = DSC_OPTIMIZER_TYPE_SGD;
    DSC_TRY(dsc_optimizer_create_plain(&oo, &tp->opt));
    dsc_pipe_runner_options ro = {
        .module = tp->module,
        .stage = tp->stage,
        .pipe = pipe,
        .optimizer = tp->opt,
        .schedule = spec->schedule,
        .micro_batches = spec->micro_batches,
        .B = 1,
        .T = 1,
    };
    return dsc_pipe_runner_create(&ro, &tp->runner);
}

void test_pipe_free(test_pipe *tp) {
    dsc_batch_runner_destroy(tp->runner);
    dsc_optimizer_destroy(tp->opt);
    dsc_pipe_stage_destroy(tp->stage);
    dsc_params_destroy(tp->store);
    dsc_pipe_module_destroy(tp->module);
    memset(tp, 0, sizeof *tp);
}
