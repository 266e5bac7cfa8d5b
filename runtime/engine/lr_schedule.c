/* Learning-rate schedules with DeepSpeed's semantics (runtime/lr_schedules.py):
 * constant, WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle (with its
 * momentum cycle) and LRRangeTest, as pure functions of the 0-based
 * iteration, so restoring a run needs only its step count.
 *
 * DeepSpeed sets OneCycle's and LRRangeTest's start value when the scheduler
 * is built and steps the scheduler after each optimizer step, so optimizer
 * step it+1 (iteration it) runs with the value DeepSpeed computes for
 * batch_iteration = it; OneCycle's momentum at iteration 0 is the
 * constructor's cycle_min_mom, not the formula's.
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

/* OneCycle's position in the cycle: 0 at the bottom, 1 at the top, in
 * stairs when a stair count is set (DeepSpeed's _get_scale_factor). */
static double one_cycle_scale(const dsc_config_scheduler *s, int64_t it) {
    double first = (double)s->params.cycle_first_step_size, second = (double)s->params.cycle_second_step_size;
    double total = first + second, ratio = first / total, b = (double)it;
    double x = 1.0 + b / total - floor(1.0 + b / total);
    double scale = x <= ratio ? x / ratio : (x - 1.0) / (ratio - 1.0);
    int64_t stairs = x <= ratio ? s->params.cycle_first_stair_count : s->params.cycle_second_stair_count;
    if (stairs > 0) {
        double in_cycle = fmod(b, total);
        double position =
            in_cycle <= first ? in_cycle * (double)stairs / first : (total - in_cycle) * (double)stairs / second;
        scale = floor(position) / (double)stairs;
    }
    return scale;
}

/* Steps past the end of the cycle at iteration `it`, or -1 while in it. */
static double one_cycle_decay_steps(const dsc_config_scheduler *s, int64_t it) {
    int64_t total = s->params.cycle_first_step_size + s->params.cycle_second_step_size;
    return it - 1 < total ? -1.0 : (double)(it - total);
}

static double one_cycle_lr(const dsc_config_scheduler *s, int64_t it) {
    double lo = s->params.cycle_min_lr, hi = s->params.cycle_max_lr;
    double after = one_cycle_decay_steps(s, it);
    if (after < 0) return lo + (hi - lo) * one_cycle_scale(s, it);
    if (s->params.decay_step_size == 0 || s->params.decay_lr_rate == 0) return lo;
    return lo / (1.0 + s->params.decay_lr_rate * after / (double)s->params.decay_step_size);
}

bool dsc_lr_schedule_betas(const dsc_config_scheduler *s, int64_t it, double *beta1, double *beta2) {
    if (s->type != DSC_LR_SCHEDULE_ONE_CYCLE || !s->params.cycle_momentum) return false;
    double lo = s->params.cycle_min_mom, hi = s->params.cycle_max_mom;
    double after = one_cycle_decay_steps(s, it);
    *beta2 = 0.99;
    if (it == 0)
        *beta1 = lo;
    else if (after < 0)
        *beta1 = hi - (hi - lo) * one_cycle_scale(s, it);
    else if (s->params.decay_step_size == 0 || s->params.decay_mom_rate == 0)
        *beta1 = hi;
    else
        *beta1 = hi * (1.0 + s->params.decay_mom_rate * after / (double)s->params.decay_step_size);
    return true;
}

double dsc_lr_schedule_at(const dsc_config_scheduler *s, double base_lr, int64_t it) {
    int64_t warmup = s->params.warmup_num_steps < 2 ? 2 : s->params.warmup_num_steps;
    int64_t total = s->params.total_num_steps;
    double min_lr = s->params.warmup_min_lr, max_lr = s->params.warmup_max_lr;
    switch (s->type) {
    case DSC_LR_SCHEDULE_CONSTANT:
        return base_lr;
    case DSC_LR_SCHEDULE_ONE_CYCLE:
        return one_cycle_lr(s, it);
    case DSC_LR_SCHEDULE_LR_RANGE_TEST: {
        double interval = (double)it / (double)s->params.lr_range_test_step_size;
        if (s->params.lr_range_test_staircase) interval = floor(interval);
        return s->params.lr_range_test_min_lr * (1.0 + s->params.lr_range_test_step_rate * interval);
    }
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
