/* Helpers shared by the communicator tests: typed element access that maps
 * small integers exactly into every dtype, and the expected byte counts. */
#ifndef DSC_COMM_TEST_UTIL_H
#define DSC_COMM_TEST_UTIL_H

#include <stdint.h>

#include "dsc/comm.h"
#include "dsc/tensor.h"

static inline double elem_get(const dsc_tensor *t, int64_t i) {
    switch (t->dtype) {
    case DSC_DTYPE_F32:
        return ((const float *)t->data)[i];
    case DSC_DTYPE_BF16:
        return dsc_bf16_to_f32(((const uint16_t *)t->data)[i]);
    case DSC_DTYPE_F16:
        return dsc_f16_to_f32(((const uint16_t *)t->data)[i]);
    case DSC_DTYPE_I32:
        return ((const int32_t *)t->data)[i];
    case DSC_DTYPE_I64:
        return (double)((const int64_t *)t->data)[i];
    default:
        return ((const uint8_t *)t->data)[i];
    }
}

static inline void elem_set(dsc_tensor *t, int64_t i, double v) {
    switch (t->dtype) {
    case DSC_DTYPE_F32:
        ((float *)t->data)[i] = (float)v;
        break;
    case DSC_DTYPE_BF16:
        ((uint16_t *)t->data)[i] = dsc_f32_to_bf16((float)v);
        break;
    case DSC_DTYPE_F16:
        ((uint16_t *)t->data)[i] = dsc_f32_to_f16((float)v);
        break;
    case DSC_DTYPE_I32:
        ((int32_t *)t->data)[i] = (int32_t)v;
        break;
    case DSC_DTYPE_I64:
        ((int64_t *)t->data)[i] = (int64_t)v;
        break;
    default:
        ((uint8_t *)t->data)[i] = (uint8_t)v;
        break;
    }
}

/* A 1-D tensor of n elements (n may be 0). */
static inline dsc_status vec_alloc(dsc_tensor *t, dsc_dtype dtype, int64_t n) {
    return dsc_tensor_alloc(t, dtype, 1, &n, DSC_CPU, DSC_MEM_COMM);
}

/* Counter deltas of one operation. */
static inline void stats_delta(const dsc_comm_stats *before, const dsc_comm_stats *after, dsc_comm_op op,
                               int64_t *calls, int64_t *sent, int64_t *recv) {
    *calls = after->calls[op] - before->calls[op];
    *sent = after->bytes_sent[op] - before->bytes_sent[op];
    *recv = after->bytes_recv[op] - before->bytes_recv[op];
}

#endif
