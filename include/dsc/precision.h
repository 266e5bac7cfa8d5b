/* dsc/precision.h — mixed-precision training (DeepSpeed's fp16 / bf16
 * sections): fp32 master weights and optimizer state, working parameters and
 * gradients rounded to bf16 / fp16, dynamic loss scaling for fp16.
 *
 * The pieces:
 *  - rounding: f32 values rounded to nearest even in bf16 / fp16 (and back),
 *    bit for bit as torch's .to(torch.bfloat16) / .half();
 *  - the loss scaler: DeepSpeed's DynamicLossScaler (runtime/fp16/loss_scaler.py)
 *    or a static scale;
 *  - the mixed-precision optimizer: a wrapper around any optimizer (plain,
 *    ZeRO-1/2) behind dsc/optimizer.h's table. It keeps the fp32 master copy
 *    of the values the inner optimizer updates (ZeRO: only this rank's range),
 *    leaves the parameters the layers read rounded to the reduced type, rounds
 *    each layer's gradient contribution (the scaled loss's) to the reduced
 *    type as it is accumulated, skips the step when any gradient of any rank
 *    overflowed (fp16; bf16 with check_grad_overflow) and otherwise unscales,
 *    lets the inner optimizer update the master and rounds the result again.
 *
 * Storage: the working parameters and gradients live in the store's f32
 * buffers holding values that are exact in the reduced type (the layers'
 * kernels compute in f32 on every backend); their 2-byte form is what the
 * gradient reduction sends (communication_data_type) and what the memory
 * estimate counts. */
#ifndef DSC_PRECISION_H
#define DSC_PRECISION_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stdint.h>

#include "dsc/config.h"
#include "dsc/optimizer.h"
#include "dsc/status.h"
#include "dsc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- rounding ------------------------------------------------------------------------------ */

/* x[i] = the value of x[i] in `dtype` (DSC_DTYPE_BF16 / DSC_DTYPE_F16: round
 * to nearest even, overflow to inf, subnormals kept, NaN stays NaN; F32: no
 * change). */
DSC_API void dsc_round_to_dtype(float *x, int64_t n, dsc_dtype dtype);
/* The same out of place: dst[i] = src[i] in `dtype` (dst == src, or no overlap). */
DSC_API void dsc_round_to_dtype_from(float *dst, const float *src, int64_t n, dsc_dtype dtype);
/* acc[i] += round(part[i]) in `dtype` (f32: no rounding), for i < n: a layer's gradient
 * contribution (at the loss scale) stored in the reduced type, accumulated in f32. */
DSC_API void dsc_precision_add_rounded(float *acc, const float *part, int64_t n, dsc_dtype dtype);
/* torch's bit patterns of x.to(torch.bfloat16) (NaN: 0xffff) and x.half() (NaN: quieted, payload kept). */
DSC_API uint16_t dsc_precision_to_bf16(float x);
DSC_API uint16_t dsc_precision_to_f16(float x);

/* Gradient reduction in a 2-byte dtype (communication_data_type), in the
 * f32 buffers themselves: pack turns the n f32 values at `buf` into n
 * bf16 / f16 values (rounded as above) at the start of `buf`; unpack writes
 * n f32 values from n 2-byte ones, and may run in place (dst at or after
 * src, as for a reduced share inside its packed range); unpack_add adds them
 * to dst (no overlap). */
DSC_API void dsc_precision_pack(void *buf, int64_t n, dsc_dtype dtype);
/* The same rounding out of place: n 2-byte values at dst from n f32 values at src (dst may be src). */
DSC_API void dsc_precision_pack_to(void *dst, const float *src, int64_t n, dsc_dtype dtype);
DSC_API void dsc_precision_unpack(float *dst, const void *src, int64_t n, dsc_dtype dtype);
DSC_API void dsc_precision_unpack_add(float *dst, const void *src, int64_t n, dsc_dtype dtype);
/* Parameters all-gathered in their 2-byte dtype straight into the f32 buffer they are read from: the n
 * 2-byte values in the upper half of `buf` (bytes [2n, 4n)) widened in place into the n f32 values of buf. */
DSC_API void dsc_precision_widen_upper(float *buf, int64_t n, dsc_dtype dtype);
/* Whether a reduction dtype is a packed 2-byte one (bf16, f16). */
static inline bool dsc_precision_is_narrow(dsc_dtype dtype) {
    return dtype == DSC_DTYPE_BF16 || dtype == DSC_DTYPE_F16;
}

/* ---- the loss scaler ----------------------------------------------------------------------- */

typedef struct dsc_loss_scaler_options {
    bool dynamic;                /* false: the scale stays init_scale */
    double init_scale;           /* 2^initial_scale_power (dynamic) or loss_scale (static) */
    int64_t scale_window;        /* clean steps before the scale grows by scale_factor */
    int hysteresis;              /* overflows tolerated before the scale shrinks (delayed_shift) */
    bool consecutive_hysteresis; /* a clean step refills the hysteresis */
    double min_scale;            /* the scale never goes below; an overflow at it is an error */
    double scale_factor;         /* 2 */
} dsc_loss_scaler_options;

typedef struct dsc_loss_scaler {
    dsc_loss_scaler_options o;
    double cur_scale;
    int64_t cur_iter, last_overflow_iter;
    int cur_hysteresis;
} dsc_loss_scaler;

DSC_API void dsc_loss_scaler_init(dsc_loss_scaler *s, const dsc_loss_scaler_options *o);
/* DeepSpeed's DynamicLossScaler.update_scale after a step with or without
 * overflow. An overflow with the scale already at min_scale is
 * DSC_ERR_NUMERIC (DeepSpeed raises there too); *msg (if not NULL, at least
 * 160 bytes) gets DeepSpeed's log line for an overflow, else "". */
DSC_API dsc_status dsc_loss_scaler_update(dsc_loss_scaler *s, bool overflow, char *msg, size_t msg_len);

/* ---- the mixed-precision optimizer ---------------------------------------------------------- */

/* The part of a group's flat buffers the inner optimizer reads gradients
 * from and writes values to: [begin, end) of the group's flat value buffer,
 * and the gradients of those elements as the inner step reads them (a view
 * of the flat gradient buffer, or the inner's own range buffer). */
typedef struct dsc_precision_range {
    int64_t begin, end;
    dsc_tensor grads;
} dsc_precision_range;

typedef struct dsc_precision_options {
    dsc_dtype dtype;                  /* DSC_DTYPE_BF16 or DSC_DTYPE_F16 */
    bool check_overflow;              /* skip steps with inf/nan gradients (fp16: always) */
    dsc_loss_scaler_options scaler;   /* fp16; bf16 uses a static scale of 1 */
    const dsc_optimizer_options *opt; /* the inner optimizer's: store, layers, groups */
    dsc_precision_range ranges[DSC_PARAM_GROUP_COUNT];
    /* the ranges are the whole flat buffers and the inner optimizer reads the values through the
     * parameters and dsc_params_flat at each step (the plain optimizer): the store's values are
     * then the master, and each layer call reads them rounded from a scratch of one layer's size;
     * its step zeroes the gradients, so a layer's first backward after it rounds its contribution
     * where it lands */
    bool whole;
    bool log; /* this rank logs the skipped steps */
} dsc_precision_options;

/* Whether the config asks for mixed precision; fills the options' dtype,
 * overflow check and scaler (ranges and groups are the caller's). */
DSC_API bool dsc_precision_from_config(const dsc_config *cfg, dsc_precision_options *po);
/* The dtype gradients are reduced in: communication_data_type, else the
 * mixed-precision dtype, else f32 (DeepSpeed's default). */
DSC_API dsc_dtype dsc_precision_comm_dtype(const dsc_config *cfg);
/* The dtype the working parameters are exact in: bf16 / fp16 when mixed precision is on, else f32. */
DSC_API dsc_dtype dsc_precision_param_dtype(const dsc_config *cfg);

/* Wraps `inner` (taking ownership, also on error). The master starts from
 * the parameters' f32 values; with ranges (ZeRO-1/2) the values are rounded
 * to the reduced type now, as the working copy. */
DSC_API dsc_status dsc_precision_wrap(const dsc_precision_options *po, dsc_optimizer *inner, dsc_optimizer **out);
/* dsc_precision_wrap when the config asks for mixed precision (else *opt
 * stays as it is): `ranges` NULL means the whole flat buffers (the plain
 * optimizer). On error *opt is destroyed and NULL. */
DSC_API dsc_status dsc_precision_maybe_wrap(const dsc_config *cfg, const dsc_optimizer_options *oo,
                                            const dsc_precision_range *ranges, dsc_optimizer **opt);
/* The wrapper's current loss scale and the steps it skipped (1 and 0 for any other optimizer). */
DSC_API double dsc_precision_loss_scale(dsc_optimizer *opt);
/* What a runner seeds a micro-batch's backward with (dsc_micro_ctx.loss_scale): the loss scale
 * over the micro-batches, so every gradient of the backward is the scaled loss's, as DeepSpeed's
 * (loss * scale).backward() (fp16 overflows where its gradients would), unscaled at the step. */
DSC_API float dsc_precision_micro_loss_scale(dsc_optimizer *opt, int micro_batches);
DSC_API int64_t dsc_precision_skipped_steps(const dsc_optimizer *opt);
/* What a runner does with what passes between two layers under mixed
 * precision: `t` (f32, in place), an activation or an activation gradient
 * (the scaled loss's: an fp16 overflow becomes inf and skips the step),
 * becomes its value stored in the wrapper's dtype. Nothing for any other
 * optimizer. */
DSC_API void dsc_precision_store_between(dsc_optimizer *opt, const dsc_tensor *t);
/* The type mixed precision stores working values in: the wrapper's bf16 / fp16, f32 for any other
 * optimizer (and NULL). What passes between layers is exact in it, so a runner may keep it in
 * 2 bytes and widen it back without changing a bit (the pipeline's checkpointed inputs). */
DSC_API dsc_dtype dsc_precision_dtype(const dsc_optimizer *opt);
/* What the last step did: whether it was skipped, and the scale of its gradients (0, false for any other
 * optimizer). */
DSC_API bool dsc_precision_last_step(const dsc_optimizer *opt, double *loss_scale);

#ifdef __cplusplus
}
#endif
#endif
