/* moe/ private: moving token rows between token order and the experts'
 * row buffers (padded (E, Cap, M) or packed), the layout change around the all-to-alls, and
 * the MoE layer's hooks for block.c (type check, statistics).
 *
 * The row movement runs as kernels (dsc_kernel_moe_*) over the
 * destination rows moe_rows_* derive from the gate's routes (expert, slot,
 * weight per route; slot -1 = dropped). Each (expert, slot) holds at most
 * one route, so the scatters never collide and every kernel parallelises
 * over tokens. Nothing here talks to other ranks.
 *
 * Dimension letters: S tokens, K routes per token, E experts, Cap slots per
 * expert, M model width. */
#ifndef DSC_MOE_INTERNAL_H
#define DSC_MOE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "dsc/moe.h"
#include "dsc/moe_gate.h"

/* Where each expert's rows start in an expert-row buffer, row0 (E + 1),
 * row0[E] = the rows in all: padded, every expert Cap rows (training's
 * (E, Cap, M) all-to-all buffers), or packed, kept_counts[e] rows each and
 * no padding (serving's dropless all-to-all-v). Routes fill slots
 * 0 .. kept_counts[e] - 1 of their expert, so both layouts hold every kept route.
 * Both also fill r->dest (the kernels' destination row of each route) for that layout. */
dsc_status moe_rows_padded(dsc_moe_gate_result *r, int64_t *row0);
dsc_status moe_rows_packed(dsc_moe_gate_result *r, int64_t *row0);

/* buf (row0[E], M): row row0[e] + slot = x[s] for every kept route (s -> e, slot), the rest of each expert's
 * rows zero; x (S, M). Needs r->kept_counts of the routes. */
dsc_status moe_dispatch(const dsc_moe_gate_result *r, const int64_t *row0, const float *x, int64_t M, float *buf);

/* out[s] = sum over the kept routes of s of weight * y[row0[e] + slot]; out (S, M), y (row0[E], M).
 * A token with no kept route gets a zero row. */
dsc_status moe_combine(const dsc_moe_gate_result *r, const int64_t *row0, const float *y, int64_t M, float *out);

/* Backward of moe_combine for dout (S, M): dy (row0[E], M) has
 * dy[row0[e] + slot] = weight * dout[s] for every kept route, zero elsewhere; d_weight (S, K) =
 * dot(dout[s], y[row0[e] + slot]) for kept routes and 0 for dropped ones. */
dsc_status moe_combine_backward(const dsc_moe_gate_result *r, const int64_t *row0, const float *dout,
                                const float *y, int64_t M, float *dy, float *d_weight);

/* Backward of moe_dispatch: dx[s] (+)= sum over the kept routes of s of dbuf[row0[e] + slot];
 * dx (S, M) is overwritten unless `accumulate`. */
dsc_status moe_dispatch_backward(const dsc_moe_gate_result *r, const int64_t *row0, const float *dbuf, int64_t M,
                                 float *dx, bool accumulate);

/* dst gets the (a, b) blocks of src, of varying size, in (b, a) order: src holds them in
 * row-major order, block (i, j) rows[i * b + j] rows of `inner` floats;
 * dst gets them in (b, a) order. rows (a * b). */
void moe_swap_axes_v(const float *src, float *dst, const int64_t *rows, int64_t a, int64_t b, int64_t inner);

/* ---- the MoE layer (layer.c), for the block factory and the statistics API ---- */

bool moe_layer_is(const dsc_layer *layer);
void moe_layer_stats(const dsc_layer *layer, dsc_moe_stats *out);
void moe_layer_stats_reset(dsc_layer *layer);

#endif
