/* ZeRO's memory arithmetic: the paper's per-rank formula for model states,
 * the estimator that prints it for every stage without running anything
 * (sizes far beyond this machine), and the report that sets the allocator's
 * measured accounting beside the formula.
 *
 * Not here: allocation (the optimizer allocates through dsc_mem_alloc under
 * the params / grads / optim / comm categories, which is what the report
 * reads). */
#include <stdbool.h>
#include <stdlib.h>

#include "dsc/memory.h"
#include "dsc/model.h"
#include "dsc/zero.h"

void dsc_zero_memory_formula(int stage, double psi, int dp, int state_bytes, dsc_zero_memory *out) {
    double n = dp > 0 ? dp : 1;
    bool mixed = state_bytes & DSC_ZERO_MIXED_PRECISION;
    double width = mixed ? 2.0 : 4.0, optim = (state_bytes & 0xffff) + (mixed ? 4 : 0);
    out->params = width * psi / (stage >= 3 ? n : 1);
    out->grads = width * psi / (stage >= 2 ? n : 1);
    out->optim = optim * psi / (stage >= 1 ? n : 1);
}

dsc_status dsc_zero_model_size_of(const dsc_model_config *mc, dsc_zero_model_size *out) {
    return dsc_zero_model_size_of_extra(mc, NULL, out);
}

dsc_status dsc_zero_model_size_of_extra(const dsc_model_config *mc, const void *build_extra,
                                        dsc_zero_model_size *out) {
    *out = (dsc_zero_model_size){0};
    DSC_TRY(dsc_model_config_validate(mc));
    DSC_TRY(dsc_nn_register_dense_layers());
    dsc_layer_spec *specs = NULL;
    int count = 0;
    DSC_TRY(dsc_model_specs(mc, &specs, &count));
    /* Declaring parameters allocates nothing until finalize, so a 70B model costs only its layer structs. */
    dsc_param_store *store = NULL;
    dsc_status s = dsc_params_create(&store, DSC_CPU, 0);
    dsc_build_ctx ctx = {.model = mc, .params = store, .device = DSC_CPU, .extra = build_extra};
    for (int i = 0; i < count && !s; i++) {
        dsc_layer *layer = NULL;
        s = dsc_layer_build(&specs[i], &ctx, &layer);
        if (s) break;
        double n = (double)dsc_layer_param_numel(layer);
        if (n > out->largest_layer) out->largest_layer = n;
        dsc_layer_destroy(layer);
    }
    for (int i = 0; store && !s && i < dsc_params_count(store); i++) {
        const dsc_param *p = dsc_params_at(store, i);
        out->params += (double)dsc_param_numel(p);
        if (p->flags & DSC_PARAM_EXPERT) out->expert_params += (double)dsc_param_numel(p);
    }
    dsc_params_destroy(store);
    free(specs);
    return s ? dsc_error_wrap(s, "counting the parameters of a %s model", dsc_model_arch_name(mc->arch)) : NULL;
}

static double gib(double bytes) {
    return bytes / (1024.0 * 1024.0 * 1024.0);
}

void dsc_zero_estimate_rank(const dsc_zero_model_size *size, int stage, int dp, int pp, int ep, int state_bytes,
                            dsc_zero_memory *out) {
    pp = pp > 0 ? pp : 1;
    ep = ep > 0 ? ep : 1;
    const double dense = (size->params - size->expert_params) / pp;
    const double expert = size->expert_params / pp / ep; /* this rank's experts */
    const int edp = dp / ep > 0 ? dp / ep : 1;
    dsc_zero_memory d, e;
    dsc_zero_memory_formula(stage, dense, dp, state_bytes, &d);
    dsc_zero_memory_formula(stage, expert, edp, state_bytes, &e);
    *out = (dsc_zero_memory){d.params + e.params, d.grads + e.grads, d.optim + e.optim};
}

void dsc_zero_estimate_print(FILE *fp, const dsc_zero_model_size *size, int dp, int pp, int ep, int state_bytes) {
    pp = pp > 0 ? pp : 1;
    ep = ep > 0 ? ep : 1;
    int edp = dp / ep > 0 ? dp / ep : 1;
    fprintf(
        fp,
        "ZeRO model-state memory per rank: %.3fB parameters (%.3fB in experts), largest layer %.3fM; dp=%d pp=%d",
        size->params / 1e9, size->expert_params / 1e9, size->largest_layer / 1e6, dp, pp);
    if (size->expert_params > 0) fprintf(fp, " ep=%d (experts sharded over %d ranks)", ep, edp);
    if (state_bytes & DSC_ZERO_MIXED_PRECISION)
        fprintf(fp,
                "; bf16/fp16 mixed precision: 2-byte parameters and gradients, 4-byte fp32 master + %d bytes of "
                "optimizer state per parameter\n",
                state_bytes & 0xffff);
    else
        fprintf(fp, "; fp32 with %d bytes of optimizer state per parameter\n", state_bytes);
    fprintf(fp, "%-7s %12s %12s %12s %12s %16s\n", "stage", "params GiB", "grads GiB", "optim GiB", "total GiB",
            "+ gathered GiB");
    for (int stage = 0; stage <= 3; stage++) {
        dsc_zero_memory m;
        dsc_zero_estimate_rank(size, stage, dp, pp, ep, state_bytes, &m);
        double p = m.params, g = m.grads, o = m.optim;
        /* stage 3 holds a gathered layer (and the prefetched next one) besides its shards */
        bool mixed = state_bytes & DSC_ZERO_MIXED_PRECISION;
        double live = stage == 3 ? 2 * (mixed ? 2.0 : 4.0) * size->largest_layer : 0;
        const char *note = stage < 3 ? ""
                           : pp > 1  ? "  (refused with pipeline.stages > 1)"
                           : mixed   ? "  (refused with bf16/fp16)"
                                     : "";
        fprintf(fp, "%-7d %12.3f %12.3f %12.3f %12.3f %16.3f%s\n", stage, gib(p), gib(g), gib(o), gib(p + g + o),
                gib(live), note);
    }
}

dsc_status dsc_zero_memory_report(FILE *fp, dsc_comm *comm, int stage, double psi, int dp, int state_bytes) {
    enum { TOTAL = DSC_MEM_CATEGORY_COUNT, PEAK, PSI, FIELDS };
    int size = comm ? dsc_comm_size(comm) : 1, rank = comm ? dsc_comm_rank(comm) : 0;
    dsc_mem_stats st;
    dsc_mem_get_stats(&st);
    int64_t mine[FIELDS];
    for (int c = 0; c < DSC_MEM_CATEGORY_COUNT; c++)
        mine[c] = st.current[c];
    mine[TOTAL] = st.total_current;
    mine[PEAK] = st.total_peak;
    mine[PSI] = (int64_t)psi;
    int64_t *all = calloc((size_t)size * FIELDS, sizeof *all);
    DSC_CHECK(all, DSC_ERR_NOMEM, "memory report of %d ranks", size);
    int64_t n = FIELDS, total = (int64_t)size * FIELDS;
    dsc_tensor send = dsc_tensor_view(mine, DSC_DTYPE_I64, 1, &n, DSC_CPU);
    dsc_tensor recv = dsc_tensor_view(all, DSC_DTYPE_I64, 1, &total, DSC_CPU);
    dsc_status s = comm ? dsc_comm_allgather(comm, &send, &recv, NULL) : dsc_tensor_copy(&recv, &send);
    if (s || rank != 0) {
        free(all);
        return s ? dsc_error_wrap(s, "gathering the memory report") : NULL;
    }
    const double MiB = 1024.0 * 1024.0;
    fprintf(fp,
            "memory per rank (MiB, allocator accounting), ZeRO stage %d over %d data-parallel ranks; formula = "
            "the paper's parameters + gradients + optimizer state for the rank's psi\n",
            stage, dp);
    fprintf(fp, "%-6s %12s %9s %9s %9s %9s %9s %9s %9s %9s %9s %8s\n", "rank", "psi", "params", "grads", "optim",
            "activ", "comm", "other", "total", "peak", "formula", "ratio");
    for (int r = 0; r < size; r++) {
        const int64_t *v = all + (size_t)r * FIELDS;
        dsc_zero_memory f;
        dsc_zero_memory_formula(stage, (double)v[PSI], dp, state_bytes, &f);
        double states = (double)(v[DSC_MEM_PARAMS] + v[DSC_MEM_GRADS] + v[DSC_MEM_OPTIM]);
        double want = f.params + f.grads + f.optim;
        fprintf(fp, "%-6d %12lld %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %9.2f %8.4f\n", r,
                (long long)v[PSI], v[DSC_MEM_PARAMS] / MiB, v[DSC_MEM_GRADS] / MiB, v[DSC_MEM_OPTIM] / MiB,
                v[DSC_MEM_ACTIVATIONS] / MiB, v[DSC_MEM_COMM] / MiB,
                (v[DSC_MEM_KV_CACHE] + v[DSC_MEM_OTHER]) / MiB, v[TOTAL] / MiB, v[PEAK] / MiB, want / MiB,
                states / want);
    }
    free(all);
    return NULL;
}
