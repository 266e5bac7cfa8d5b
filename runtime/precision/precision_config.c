/* The fp16 / bf16 / communication_data_type sections as the options of the
 * mixed-precision optimizer, and the wrapping every trainer does. */
#include <math.h>

#include "dsc/comm.h"
#include "dsc/log.h"
#include "dsc/precision.h"

bool dsc_precision_from_config(const dsc_config *cfg, dsc_precision_options *po) {
    *po = (dsc_precision_options){0};
    if (cfg->fp16.enabled) {
        const dsc_config_fp16 *f = &cfg->fp16;
        bool dynamic = f->loss_scale == 0;
        po->dtype = DSC_DTYPE_F16;
        po->check_overflow = true;
        po->scaler = (dsc_loss_scaler_options){
            .dynamic = dynamic,
            .init_scale = dynamic ? ldexp(1.0, f->initial_scale_power) : f->loss_scale,
            .scale_window = f->loss_scale_window,
            .hysteresis = f->hysteresis,
            .consecutive_hysteresis = f->consecutive_hysteresis,
            .min_scale = f->min_loss_scale,
            .scale_factor = 2.0,
        };
        return true;
    }
    if (cfg->bf16.enabled) {
        po->dtype = DSC_DTYPE_BF16;
        po->check_overflow = cfg->bf16.check_grad_overflow;
        po->scaler = (dsc_loss_scaler_options){.init_scale = 1.0, .min_scale = 1.0, .scale_factor = 2.0};
        return true;
    }
    return false;
}

dsc_dtype dsc_precision_comm_dtype(const dsc_config *cfg) {
    switch (cfg->communication_data_type) {
    case DSC_COMM_DATA_TYPE_FP16:
    case DSC_COMM_DATA_TYPE_FLOAT16:
    case DSC_COMM_DATA_TYPE_HALF:
        return DSC_DTYPE_F16;
    case DSC_COMM_DATA_TYPE_BF16:
    case DSC_COMM_DATA_TYPE_BFLOAT16:
        return DSC_DTYPE_BF16;
    case DSC_COMM_DATA_TYPE_FP32:
    case DSC_COMM_DATA_TYPE_FLOAT32:
        return DSC_DTYPE_F32;
    case DSC_COMM_DATA_TYPE_DEFAULT:
        break;
    }
    return dsc_precision_param_dtype(cfg);
}

dsc_dtype dsc_precision_param_dtype(const dsc_config *cfg) {
    return cfg->fp16.enabled ? DSC_DTYPE_F16 : cfg->bf16.enabled ? DSC_DTYPE_BF16 : DSC_DTYPE_F32;
}

dsc_status dsc_precision_maybe_wrap(const dsc_config *cfg, const dsc_optimizer_options *oo,
                                    const dsc_precision_range *ranges, dsc_optimizer **opt) {
    dsc_precision_options po;
    if (!dsc_precision_from_config(cfg, &po)) return NULL;
    po.opt = oo;
    po.log = true;
    po.whole = !ranges;
    for (int g = 0; g < DSC_PARAM_GROUP_COUNT; g++) {
        if (ranges) {
            po.ranges[g] = ranges[g];
            continue;
        }
        dsc_tensor grads;
        dsc_params_flat(oo->params, (dsc_param_group)g, NULL, &grads);
        po.ranges[g] = (dsc_precision_range){0, dsc_tensor_numel(&grads), grads};
    }
    dsc_optimizer *inner = *opt;
    *opt = NULL;
    DSC_TRY(dsc_precision_wrap(&po, inner, opt));
    const char *comm = dsc_dtype_name(dsc_precision_comm_dtype(cfg));
    if (po.dtype == DSC_DTYPE_F16 && po.scaler.dynamic)
        dsc_log_rank0(
            DSC_LOG_INFO,
            "fp16 mixed precision: fp32 master weights, fp16 parameters and gradients, the layers' matrix "
            "products in fp16 with f32 sums, dynamic loss scale 2^%d (window %lld, hysteresis %d, min %g), "
            "gradients reduced in %s",
            cfg->fp16.initial_scale_power, (long long)po.scaler.scale_window, po.scaler.hysteresis,
            po.scaler.min_scale, comm);
    else if (po.dtype == DSC_DTYPE_F16)
        dsc_log_rank0(
            DSC_LOG_INFO,
            "fp16 mixed precision: fp32 master weights, fp16 parameters and gradients, the layers' matrix "
            "products in fp16 with f32 sums, static loss scale %g, gradients reduced in %s",
            po.scaler.init_scale, comm);
    else
        dsc_log_rank0(
            DSC_LOG_INFO,
            "bf16 mixed precision: fp32 master weights, bf16 parameters and gradients, the layers' matrix "
            "products in bf16 with f32 sums, gradients reduced in %s%s",
            comm, po.check_overflow ? ", steps with inf/nan gradients skipped" : "");
    return NULL;
}
