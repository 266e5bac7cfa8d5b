/* DeepSpeed's loss scalers (runtime/fp16/loss_scaler.py): a static scale,
 * or DynamicLossScaler — halve on overflow once the hysteresis is used up
 * (the step is skipped), grow by scale_factor after scale_window clean
 * steps since the last overflow, never below min_scale. Kept line for line
 * with update_scale so the fixture from DeepSpeed's own class matches. */
#include <stdio.h>

#include "dsc/precision.h"

void dsc_loss_scaler_init(dsc_loss_scaler *s, const dsc_loss_scaler_options *o) {
    *s = (dsc_loss_scaler){.o = *o, .cur_scale = o->init_scale, .last_overflow_iter = -1};
    if (s->o.scale_factor <= 0) s->o.scale_factor = 2.0;
    if (s->o.hysteresis < 1) s->o.hysteresis = 1;
    s->cur_hysteresis = s->o.hysteresis;
}

dsc_status dsc_loss_scaler_update(dsc_loss_scaler *s, bool overflow, char *msg, size_t msg_len) {
    if (msg && msg_len) msg[0] = '\0';
    if (!s->o.dynamic) {
        if (overflow && msg) snprintf(msg, msg_len, "OVERFLOW! Skipping step. Static loss scale %g", s->cur_scale);
        s->cur_iter++;
        return NULL;
    }
    if (overflow) {
        if (s->o.hysteresis == 1 || s->cur_hysteresis == 1) {
            DSC_CHECK(s->cur_scale != s->o.min_scale, DSC_ERR_NUMERIC,
                      "fp16: the gradients overflow with the loss scale already at fp16.min_loss_scale %g "
                      "(DeepSpeed: \"Current loss scale already at minimum - cannot decrease scale anymore\"); "
                      "lower optimizer.params.lr, set gradient_clipping, or train with bf16",
                      s->o.min_scale);
            double next = s->cur_scale / s->o.scale_factor;
            if (next < s->o.min_scale) next = s->o.min_scale;
            if (msg)
                snprintf(msg, msg_len, "OVERFLOW! Skipping step. Attempted loss scale: %.0f, reducing to %.0f",
                         s->cur_scale, next);
            s->cur_scale = next;
        } else {
            if (msg)
                snprintf(msg, msg_len,
                         "OVERFLOW! Skipping step. Attempted loss scale: %.0f, but hysteresis is %d. Reducing "
                         "hysteresis to %d",
                         s->cur_scale, s->cur_hysteresis, s->cur_hysteresis - 1);
            s->cur_hysteresis--;
        }
        s->last_overflow_iter = s->cur_iter;
    } else {
        if (s->o.consecutive_hysteresis) s->cur_hysteresis = s->o.hysteresis;
        int64_t stable = (s->cur_iter - s->last_overflow_iter) - 1;
        if (stable > 0 && s->o.scale_window > 0 && stable % s->o.scale_window == 0) {
            if (!s->o.consecutive_hysteresis) s->cur_hysteresis = s->o.hysteresis;
            s->cur_scale *= s->o.scale_factor;
        }
    }
    s->cur_iter++;
    return NULL;
}
