/* The plan as a table for people (dsc-generate --print-plan): each rank's
 * heads and widths, then one line per tensor with its shape, kind, unit, the
 * rule that decided it and every rank's spans along the split axis. Also the
 * names of the enums. Not here: making the plan (plan.c). */
#include "dsc/tp.h"

const char *dsc_tp_kind_name(dsc_tp_kind k) {
    switch (k) {
    case DSC_TP_KIND_UNDECLARED:
        return "undeclared";
    case DSC_TP_KIND_REPLICATE:
        return "replicate";
    case DSC_TP_KIND_COLUMN:
        return "column";
    case DSC_TP_KIND_ROW:
        return "row";
    case DSC_TP_KIND_VOCAB:
        return "vocab";
    }
    return "?";
}

const char *dsc_tp_unit_name(dsc_tp_unit u) {
    static const char *const names[DSC_TP_UNIT_COUNT] = {"-",  "q-heads", "kv-heads", "q|k|v",     "[head,3,hs]",
                                                         "ff", "gate|up", "vocab",    "ff-expert", "ff-shared"};
    return (unsigned)u < DSC_TP_UNIT_COUNT ? names[u] : "?";
}

const char *dsc_tp_source_name(dsc_tp_rule_source s) {
    switch (s) {
    case DSC_TP_SOURCE_USER:
        return "partition_config";
    case DSC_TP_SOURCE_MODEL_PLAN:
        return "base_model_tp_plan";
    case DSC_TP_SOURCE_POLICY:
        return "policy";
    case DSC_TP_SOURCE_NAME:
        return "name";
    case DSC_TP_SOURCE_DEFAULT:
        return "default";
    }
    return "?";
}

void dsc_tp_plan_print(const dsc_tp_plan *p, FILE *f) {
    int tp = dsc_tp_plan_size(p);
    fprintf(f, "tensor-parallel plan over %d ranks\n", tp);
    for (int r = 0; r < tp; r++) {
        const dsc_tp_shard *s = dsc_tp_plan_shard(p, r);
        fprintf(f, "  rank %d: q heads [%d, %d)  kv heads [%d, %d)  ff [%lld, %lld)  vocab [%lld, %lld)\n", r,
                s->q0, s->q0 + s->nq, s->kv0, s->kv0 + s->nkv, (long long)s->f0, (long long)(s->f0 + s->nf),
                (long long)s->v0, (long long)(s->v0 + s->nv));
    }
    fprintf(f, "%-48s %-16s %-9s %-11s %-18s %s\n", "tensor", "shape", "kind", "unit", "rule", "spans per rank");
    for (int64_t i = 0; i < dsc_tp_plan_count(p); i++) {
        const dsc_tp_entry *e = dsc_tp_plan_entry(p, i);
        char shape[64];
        int used = snprintf(shape, sizeof shape, "(");
        for (int d = 0; d < e->ndim && used < (int)sizeof shape; d++)
            used +=
                snprintf(shape + used, sizeof shape - (size_t)used, d ? ",%lld" : "%lld", (long long)e->shape[d]);
        if (used < (int)sizeof shape) snprintf(shape + used, sizeof shape - (size_t)used, ")");
        fprintf(f, "%-48s %-16s %-9s %-11s %-18s", e->name, shape, dsc_tp_kind_name(e->kind),
                dsc_tp_unit_name(e->unit), dsc_tp_source_name(e->source));
        if (e->axis < 0) fprintf(f, " whole");
        for (int r = 0; e->axis >= 0 && r < tp; r++) {
            const dsc_tp_span *sp;
            int n = dsc_tp_plan_spans(p, i, r, &sp);
            fprintf(f, " %d:", r);
            for (int k = 0; k < n; k++)
                fprintf(f, "%s[%lld,%lld)", k ? "+" : "", (long long)sp[k].start,
                        (long long)(sp[k].start + sp[k].count));
        }
        if (e->axis >= 0) fprintf(f, " (axis %d)", e->axis);
        fprintf(f, "\n");
    }
}
