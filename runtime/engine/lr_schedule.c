/* Learning-rate schedules with DeepSpeed's semantics (runtime/lr_schedules.py):
 * constant, WarmupLR, WarmupDecayLR, WarmupCosineLR, as pure functions of the
 * 0-based iteration, so restoring a run needs only its step count.
 *
 * Not here: when the engine asks (engine.c) or which optimizer uses the rate. */
#include <math.h>

#include "dsc/engine.h"

/* Warmup progress in [0, 1) at `it` < warmup steps. DeepSpeed raises the
 * warmup length to at least 2 (log(1) would divide by zero). */
static double warmup_gamma(const dsc_config_scheduler *s, int64_t it, int64_t warmup) {
    if (s->params.warmup_type == DSC_WARMUP_TYPE_LINEAR) return (double)it / (double)warmup;
    return log((double)it + 1.0) / log((double)warmup);
}

double dsc_lr_schedule_at(const dsc_config_scheduler *s, double base_lr, int64_t it) {
    int64_t warmup = s->params.warmup_num_steps < 2 ? 2 : s->params.warmup_num_steps;
    int64_t total = s->params.total_num_steps;
    double min_lr = s->params.warmup_min_lr, max_lr = s->params.warmup_max_lr;
    switch (s->type) {
    case DSC_LR_SCHEDULE_CONSTANT: return base_lr;
    case DSC_LR_SCHEDULE_WARMUP_LR:
        if (it < warmup) return min_lr + (max_lr - min_lr) * warmup_gamma(s, it, warmup);
        return max_lr;
    case DSC_LR_SCHEDULE_WARMUP_DECAY_LR: {
        if (it < warmup) return min_lr + (max_lr - min_lr) * warmup_gamma(s, it, warmup);
        double span = total - warmup > 1 ? (double)(total - warmup) : 1.0;
        double gamma = (double)(total - it) / span;
        return min_lr + (max_lr - min_lr) * (gamma > 0 ? gamma : 0.0);
    }
    case DSC_LR_SCHEDULE_WARMUP_COSINE_LR: {
        if (it < warmup) {
            double r0 = s->params.warmup_min_ratio;
            return base_lr * (r0 + (1.0 - r0) * warmup_gamma(s, it, warmup));
        }
        double span = total - warmup > 1 ? (double)(total - warmup) : 1.0;
        double progress = (double)(it - warmup + 1) / span;
        if (progress > 1.0) progress = 1.0;
        double cmin = s->params.cos_min_ratio;
        double ratio = cmin + (1.0 - cmin) * 0.5 * (1.0 + cos(3.14159265358979323846 * progress));
        return base_lr * (ratio > 0 ? ratio : 0.0);
    }
    }
    return base_lr;
}
