/* The PipelineModule: the model's ordered layer specs (with tied layers),
 * a description of every layer (parameters, activation bytes per token,
 * name) obtained by building each spec once into a scratch store, the cut
 * into P * v virtual stages by the configured partition method, and the
 * printed partition summary. Also the stage: the layers one rank builds for
 * its chunks, and nothing else.
 *
 * Not here: the partition algorithms (pipe/partition.c), running layers
 * (pipe/engine.c), tied-gradient communication (pipe/tied.c). */
#define _POSIX_C_SOURCE 200809L /* regcomp */
#include <regex.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "dsc/pipe.h"

typedef struct layer_info {
    char name[64];
    int64_t params;        /* trainable elements the layer reads (tied ones included) */
    int64_t act_per_token; /* activation bytes per token per in-flight micro-batch */
} layer_info;

struct dsc_pipe_module {
    dsc_pipe_layer_spec *layers; /* [n] */
    layer_info *info;            /* [n] */
    int n;
    int P, v;
    int *bounds; /* [P*v + 1]: virtual stage j holds layers [bounds[j], bounds[j+1]) */
    dsc_model_config model;
    const void *extra;
    const void *tp;
    dsc_layer_factory attention;
    int64_t width;
    int64_t unique_params; /* the whole model, every expert */
    int64_t rank_params;   /* as one expert-parallel rank holds it */
    int ep;                /* expert-parallel ranks (>= 1) */
    char method[96];
};

struct dsc_pipe_stage {
    int id, chunks;
    dsc_layer **layers; /* [n] chunk by chunk, forward order */
    int n;
    int *chunk_start; /* [chunks + 1] into layers */
};

static void set_layer(dsc_pipe_layer_spec *l, const char *type, int block, const char *tied) {
    memset(l, 0, sizeof *l);
    strcpy(l->spec.type, type);
    l->spec.block = block;
    if (tied) strcpy(l->tied, tied);
}

dsc_status dsc_pipe_model_layers(const dsc_model_config *mc, dsc_pipe_layer_spec **layers, int *count) {
    *layers = NULL;
    *count = 0;
    dsc_layer_spec *specs;
    int n;
    DSC_TRY(dsc_model_specs(mc, &specs, &n));
    dsc_pipe_layer_spec *list = calloc((size_t)n, sizeof *list);
    if (!list) {
        free(specs);
        return dsc_error(DSC_ERR_NOMEM, "pipeline: layer list of %d entries", n);
    }
    for (int i = 0; i < n; i++) {
        bool tie = mc->tie_embeddings &&
                   (strcmp(specs[i].type, "embedding") == 0 || strcmp(specs[i].type, "lm_head") == 0);
        set_layer(&list[i], specs[i].type, specs[i].block, tie ? "embed.wte.weight" : NULL);
    }
    free(specs);
    *layers = list;
    *count = n;
    return NULL;
}

/* Builds every spec once into a scratch store (never finalized, so no
 * parameter memory) to learn names, parameter counts and activation sizes. */
static dsc_status describe(dsc_pipe_module *m) {
    dsc_param_store *scratch;
    DSC_TRY(dsc_params_create(&scratch, DSC_CPU, 0));
    dsc_build_ctx ctx = {.model = &m->model,
                         .params = scratch,
                         .device = DSC_CPU,
                         .extra = m->extra,
                         .tp = m->tp,
                         .attention = m->attention};
    dsc_status s = NULL;
    for (int i = 0; i < m->n && !s; i++) {
        dsc_layer *layer;
        s = dsc_layer_build(&m->layers[i].spec, &ctx, &layer);
        if (s) {
            s = dsc_error_wrap(s, "pipeline: describing layer %d (%s)", i, m->layers[i].spec.type);
            break;
        }
        layer_info *info = &m->info[i];
        snprintf(info->name, sizeof info->name, "%s", layer->name);
        info->params = dsc_layer_param_numel(layer);
        info->act_per_token = layer->activation_bytes_per_token;
        for (int j = 0; j < layer->n_params && !s && m->layers[i].tied[0]; j++)
            if (strcmp(layer->params[j]->name, m->layers[i].tied) == 0 &&
                !(layer->params[j]->flags & DSC_PARAM_TIED))
                s = dsc_error(DSC_ERR_INVALID,
                              "pipeline: layer %d (%s) ties %s, but its parameter is not flagged tied", i,
                              layer->name, m->layers[i].tied);
        dsc_layer_destroy(layer);
    }
    if (!s) {
        m->rank_params = dsc_params_held_numel(scratch);
        m->unique_params = dsc_params_model_numel(scratch, m->ep);
    }
    dsc_params_destroy(scratch);
    return s;
}

/* The weights of a balanced method: trainable parameters, or 1 for layers
 * whose type matches the regex (DeepSpeed matches the class name). */
static dsc_status method_weights(const dsc_pipe_module *m, double *w) {
    if (strcasecmp(m->method, "parameters") == 0) {
        for (int i = 0; i < m->n; i++)
            w[i] = (double)m->info[i].params;
        return NULL;
    }
    DSC_CHECK(strncasecmp(m->method, "type:", 5) == 0 && m->method[5], DSC_ERR_CONFIG,
              "pipeline.partition_method \"%s\": expected \"uniform\", \"parameters\" or \"type:REGEX\"",
              m->method);
    regex_t re;
    DSC_CHECK(regcomp(&re, m->method + 5, REG_EXTENDED | REG_ICASE | REG_NOSUB) == 0, DSC_ERR_CONFIG,
              "pipeline.partition_method \"%s\": invalid regular expression", m->method);
    int matched = 0;
    for (int i = 0; i < m->n; i++) {
        w[i] = regexec(&re, m->layers[i].spec.type, 0, NULL, 0) == 0 ? 1.0 : 0.0;
        matched += w[i] > 0;
    }
    regfree(&re);
    DSC_CHECK(matched > 0, DSC_ERR_CONFIG,
              "pipeline.partition_method \"%s\": no layer type matches (types are e.g. "
              "embedding, block, moe_block, lm_head)",
              m->method);
    return NULL;
}

static dsc_status partition(dsc_pipe_module *m) {
    int parts = m->P * m->v;
    DSC_CHECK(
        m->n >= parts, DSC_ERR_CONFIG,
        "pipeline: %d stages x %d virtual stages = %d parts, but the model has only %d layers (pipeline.stages "
        "must not exceed the layer count)",
        m->P, m->v, parts, m->n);
    DSC_CHECK(
        m->v == 1 || m->n % parts == 0, DSC_ERR_CONFIG,
        "pipeline: interleaving %d stages x %d virtual stages needs a layer count divisible by %d, the model "
        "has %d layers (embedding + model.n_layer blocks + head)",
        m->P, m->v, parts, m->n);
    if (strcasecmp(m->method, "uniform") == 0) {
        dsc_pipe_partition_uniform(m->n, parts, m->bounds);
        return NULL;
    }
    double *w = malloc((size_t)m->n * sizeof *w);
    DSC_CHECK(w, DSC_ERR_NOMEM, "pipeline: %d partition weights", m->n);
    dsc_status s = method_weights(m, w);
    if (!s) s = dsc_pipe_partition_balanced(w, m->n, parts, m->bounds);
    free(w);
    return s;
}

void dsc_pipe_module_destroy(dsc_pipe_module *m) {
    if (!m) return;
    free(m->layers);
    free(m->info);
    free(m->bounds);
    free(m);
}

dsc_status dsc_pipe_module_create(const dsc_pipe_module_options *o, dsc_pipe_module **out) {
    *out = NULL;
    DSC_CHECK(o->layers && o->n_layers >= 1 && o->model, DSC_ERR_INVALID,
              "pipeline module: needs layers and a model");
    DSC_CHECK(o->stages >= 1 && o->chunks >= 1, DSC_ERR_CONFIG,
              "pipeline: stages %d and virtual stages %d must be >= 1", o->stages, o->chunks);
    dsc_pipe_module *m = calloc(1, sizeof *m);
    DSC_CHECK(m, DSC_ERR_NOMEM, "pipeline module: out of memory");
    m->n = o->n_layers;
    m->P = o->stages;
    m->v = o->chunks;
    m->model = *o->model;
    m->extra = o->build_extra;
    m->tp = o->build_tp;
    m->attention = o->build_attention;
    m->width = o->width > 0 ? o->width : o->model->d_model;
    m->ep = o->expert_parallel > 1 ? o->expert_parallel : 1;
    snprintf(m->method, sizeof m->method, "%s", o->partition_method ? o->partition_method : "parameters");
    m->layers = malloc((size_t)m->n * sizeof *m->layers);
    m->info = calloc((size_t)m->n, sizeof *m->info);
    m->bounds = calloc((size_t)(m->P * m->v + 1), sizeof *m->bounds);
    dsc_status s =
        m->layers && m->info && m->bounds ? NULL : dsc_error(DSC_ERR_NOMEM, "pipeline module: %d layers", m->n);
    if (!s) memcpy(m->layers, o->layers, (size_t)m->n * sizeof *m->layers);
    if (!s) s = describe(m);
    if (!s) s = partition(m);
    if (s) {
        dsc_pipe_module_destroy(m);
        return s;
    }
    *out = m;
    return NULL;
}

int dsc_pipe_module_stages(const dsc_pipe_module *m) {
    return m->P;
}
int dsc_pipe_module_chunks(const dsc_pipe_module *m) {
    return m->v;
}
int dsc_pipe_module_layer_count(const dsc_pipe_module *m) {
    return m->n;
}
int64_t dsc_pipe_module_width(const dsc_pipe_module *m) {
    return m->width;
}
const dsc_pipe_layer_spec *dsc_pipe_module_layer(const dsc_pipe_module *m, int index) {
    return &m->layers[index];
}
int64_t dsc_pipe_module_layer_params(const dsc_pipe_module *m, int index) {
    return m->info[index].params;
}
int64_t dsc_pipe_module_unique_params(const dsc_pipe_module *m) {
    return m->unique_params;
}
int64_t dsc_pipe_module_rank_params(const dsc_pipe_module *m) {
    return m->rank_params;
}

void dsc_pipe_module_range(const dsc_pipe_module *m, int stage, int chunk, int *first, int *end) {
    int j = chunk * m->P + stage;
    *first = m->bounds[j];
    *end = m->bounds[j + 1];
}

void dsc_pipe_module_print_summary(const dsc_pipe_module *m, int64_t B, int64_t T, FILE *fp) {
    char held[96] = "";
    if (m->ep > 1)
        snprintf(held, sizeof held, " (%lld per expert-parallel rank, %d ranks)", (long long)m->rank_params,
                 m->ep);
    fprintf(fp,
            "pipeline partition: %d layers, %lld parameters%s, method \"%s\", %d stages x %d chunks; "
            "activations per micro-batch of %lld x %lld tokens\n",
            m->n, (long long)m->unique_params, held, m->method, m->P, m->v, (long long)B, (long long)T);
    fprintf(fp, "  stage  chunk  layers     %s  activations  names\n", m->ep > 1 ? "rank params" : " parameters");
    for (int s = 0; s < m->P; s++) {
        for (int c = 0; c < m->v; c++) {
            int first, end;
            dsc_pipe_module_range(m, s, c, &first, &end);
            int64_t params = 0, act = 0;
            for (int i = first; i < end; i++) {
                params += m->info[i].params;
                act += m->info[i].act_per_token * B * T;
            }
            fprintf(fp, "  %5d  %5d  [%3d, %3d)  %10lld  %8.2f MiB ", s, c, first, end, (long long)params,
                    (double)act / (1024.0 * 1024.0));
            for (int i = first; i < end; i++)
                fprintf(fp, " %s", m->info[i].name);
            fputc('\n', fp);
        }
    }
}

/* ---- the stage ----------------------------------------------------------------------- */

void dsc_pipe_stage_destroy(dsc_pipe_stage *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++)
        dsc_layer_destroy(s->layers[i]);
    free(s->layers);
    free(s->chunk_start);
    free(s);
}

dsc_status dsc_pipe_stage_build(const dsc_pipe_module *m, int stage_id, dsc_param_store *params, dsc_device device,
                                dsc_pipe_stage **out) {
    *out = NULL;
    DSC_CHECK(stage_id >= 0 && stage_id < m->P, DSC_ERR_INVALID, "pipeline: stage %d outside [0, %d)", stage_id,
              m->P);
    dsc_pipe_stage *s = calloc(1, sizeof *s);
    DSC_CHECK(s, DSC_ERR_NOMEM, "pipeline stage: out of memory");
    s->id = stage_id;
    s->chunks = m->v;
    s->layers = calloc((size_t)m->n, sizeof *s->layers);
    s->chunk_start = calloc((size_t)m->v + 1, sizeof *s->chunk_start);
    dsc_status st = s->layers && s->chunk_start ? NULL : dsc_error(DSC_ERR_NOMEM, "pipeline stage: layer table");
    dsc_build_ctx ctx = {.model = &m->model,
                         .params = params,
                         .device = device,
                         .extra = m->extra,
                         .tp = m->tp,
                         .attention = m->attention};
    for (int c = 0; c < m->v && !st; c++) {
        int first, end;
        dsc_pipe_module_range(m, stage_id, c, &first, &end);
        s->chunk_start[c] = s->n;
        for (int i = first; i < end && !st; i++) {
            st = dsc_layer_build(&m->layers[i].spec, &ctx, &s->layers[s->n]);
            if (st)
                st = dsc_error_wrap(st, "pipeline stage %d: building layer %d (%s)", stage_id, i,
                                    m->layers[i].spec.type);
            else
                s->n++;
        }
    }
    if (st) {
        dsc_pipe_stage_destroy(s);
        return st;
    }
    s->chunk_start[m->v] = s->n;
    *out = s;
    return NULL;
}

int dsc_pipe_stage_id(const dsc_pipe_stage *s) {
    return s->id;
}

dsc_layer *const *dsc_pipe_stage_layers(const dsc_pipe_stage *s, int *count) {
    *count = s->n;
    return s->layers;
}

dsc_layer *const *dsc_pipe_stage_chunk(const dsc_pipe_stage *s, int chunk, int *count) {
    *count = s->chunk_start[chunk + 1] - s->chunk_start[chunk];
    return s->layers + s->chunk_start[chunk];
}
