/* How one dimension is cut over tp_size ranks: attention by whole heads
 * (KV groups, or the query heads of one KV head shared by several ranks),
 * feed-forward and vocabulary widths by grain-aligned pieces. Pure
 * arithmetic; the plan (plan.c) turns these cuts into each tensor's spans.
 * Not here: which tensor follows which cut. */
#include "dsc/tp.h"

dsc_status dsc_tp_split_width(int64_t total, int tp_size, int64_t grain, int rank, const char *what,
                              int64_t *start, int64_t *count) {
    DSC_CHECK(tp_size >= 1 && rank >= 0 && rank < tp_size, DSC_ERR_INVALID,
              "tensor parallelism: rank %d outside tp_size %d", rank, tp_size);
    DSC_CHECK(total >= tp_size, DSC_ERR_CONFIG,
              "tensor parallelism: %s of %lld cannot be split over %d ranks (each rank needs at least one)", what,
              (long long)total, tp_size);
    if (grain <= 0) grain = 64;
    if (total < grain * tp_size) grain = 1; /* too narrow for whole grains on every rank: near-even elements */
    int64_t units = total / grain, base = units / tp_size, extra = units % tp_size;
    int64_t mine = base + (rank < extra), before = rank * base + (rank < extra ? rank : extra);
    *start = before * grain;
    *count = mine * grain + (rank == tp_size - 1 ? total % grain : 0);
    return NULL;
}

/* Query and KV heads of rank: whole KV groups when NKV >= tp_size; else each
 * KV head is held by tp_size / NKV ranks that split its query heads. */
static dsc_status split_heads(const dsc_tp_dims *d, int tp, int rank, dsc_tp_shard *out) {
    int32_t nh = d->n_head, nkv = d->n_kv_head;
    DSC_CHECK(nh > 0 && nkv > 0 && d->head_size > 0 && nh % nkv == 0, DSC_ERR_CONFIG,
              "tensor parallelism: %d query heads are not a positive multiple of %d KV heads", nh, nkv);
    int32_t group = nh / nkv;
    if (nkv >= tp) {
        int32_t base = nkv / tp, extra = nkv % tp;
        out->nkv = base + (rank < extra);
        out->kv0 = rank * base + (rank < extra ? rank : extra);
        out->nq = out->nkv * group;
        out->q0 = out->kv0 * group;
        return NULL;
    }
    DSC_CHECK(tp % nkv == 0, DSC_ERR_CONFIG,
              "tensor parallelism: %d KV heads over %d ranks: with fewer KV heads than ranks, tp_size must be a "
              "multiple of the KV-head count (each KV head is then held by tp_size / %d ranks)",
              nkv, tp, nkv);
    int32_t per = tp / nkv, sub = rank % per;
    DSC_CHECK(group >= per, DSC_ERR_CONFIG,
              "tensor parallelism: %d query heads, %d KV heads over %d ranks: each KV head's %d query heads "
              "would be split over %d ranks, leaving a rank without a head",
              nh, nkv, tp, group, per);
    int32_t base = group / per, extra = group % per;
    out->kv0 = rank / per;
    out->nkv = 1;
    out->nq = base + (sub < extra);
    out->q0 = out->kv0 * group + sub * base + (sub < extra ? sub : extra);
    return NULL;
}

dsc_status dsc_tp_shard_of(const dsc_tp_dims *dims, int tp_size, int64_t grain, int rank, dsc_tp_shard *out) {
    *out = (dsc_tp_shard){0};
    DSC_CHECK(tp_size >= 1 && rank >= 0 && rank < tp_size, DSC_ERR_INVALID,
              "tensor parallelism: rank %d outside tp_size %d", rank, tp_size);
    DSC_TRY(split_heads(dims, tp_size, rank, out));
    if (dims->d_ff > 0)
        DSC_TRY(
            dsc_tp_split_width(dims->d_ff, tp_size, grain, rank, "the feed-forward width", &out->f0, &out->nf));
    if (dims->d_ff_expert > 0)
        DSC_TRY(dsc_tp_split_width(dims->d_ff_expert, tp_size, grain, rank, "the routed experts' width", &out->fe0,
                                   &out->nfe));
    if (dims->d_ff_shared > 0)
        DSC_TRY(dsc_tp_split_width(dims->d_ff_shared, tp_size, grain, rank, "the shared expert's width", &out->fs0,
                                   &out->nfs));
    if (dims->vocab_size > 0)
        DSC_TRY(dsc_tp_split_width(dims->vocab_size, tp_size, grain, rank, "the vocabulary", &out->v0, &out->nv));
    return NULL;
}
