/* The tensor-parallel pieces of the model forward: the all-reduce that sums
 * row-parallel partial results over the group (timed, for the benchmark's
 * all-reduce share), the rule that only TP rank 0 adds a row-parallel bias
 * (so the sum counts it once), and the shard's accessors. Without TP all of
 * it is the identity. Not here: which ranges a rank holds (load_tp.c). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <time.h>

#include "inference/model_internal.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

dsc_status dsc_model_tp_allreduce(dsc_infer_model *m, float *x, int64_t n) {
    return dsc_model_tp_allreduce_rows(m, x, n, m->cfg.d_model);
}

dsc_status dsc_model_tp_allreduce_rows(dsc_infer_model *m, float *x, int64_t n, int64_t cols) {
    if (!m->tp_comm) return NULL;
    dsc_tensor t = dsc_model_view2(x, n, cols);
    double t0 = now_s();
    dsc_status s = dsc_comm_allreduce(m->tp_comm, &t, DSC_REDUCE_OP_SUM);
    m->tp_comm_seconds += now_s() - t0;
    return s;
}

const dsc_tensor *dsc_model_row_bias(const dsc_infer_model *m, const dsc_tensor *b) {
    return m->tp_rank == 0 ? b : NULL;
}

void dsc_infer_model_vocab_shard(const dsc_infer_model *m, int64_t *v0, int64_t *nv) {
    *v0 = m->vocab0;
    *nv = m->shard.vocab_size;
}

double dsc_infer_model_comm_seconds(const dsc_infer_model *m) {
    return m->tp_comm_seconds;
}
