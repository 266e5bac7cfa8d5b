/* Public optimizer updates over flat f32 vectors: AdamW and SGD with momentum
 * (torch.optim semantics), Lion and the direction of LAMB (DeepSpeed's). Shapes may differ as long as element
 * counts agree, so a parameter can be updated through a flat view of its state. */
#include "kernels/dispatch.h"

static dsc_status expect_same_numel(const kernel_call *call, const dsc_tensor *t, const char *name,
                                    const dsc_tensor *param) {
    if (!t) return NULL;
    char a[96], b[96];
    DSC_CHECK(t->dtype == DSC_DTYPE_F32 && dsc_tensor_numel(t) == dsc_tensor_numel(param), DSC_ERR_INVALID,
              "%s argument %s: expected f32 with the %lld elements of param %s, got %s", call->op, name,
              (long long)dsc_tensor_numel(param), dsc_tensor_describe(param, b, sizeof b),
              dsc_tensor_describe(t, a, sizeof a));
    return NULL;
}

dsc_status dsc_kernel_adamw(dsc_tensor *param, const dsc_tensor *grad, dsc_tensor *exp_avg, dsc_tensor *exp_avg_sq,
                            float lr, float beta1, float beta2, float eps, float weight_decay, int64_t step) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_adamw", KARG(param), KARG(grad), KARG(exp_avg), KARG(exp_avg_sq)));
    DSC_TRY(expect_same_numel(&call, param, "param", param));
    DSC_TRY(expect_same_numel(&call, grad, "grad", param));
    DSC_TRY(expect_same_numel(&call, exp_avg, "exp_avg", param));
    DSC_TRY(expect_same_numel(&call, exp_avg_sq, "exp_avg_sq", param));
    DSC_CHECK(step >= 1, DSC_ERR_INVALID, "dsc_kernel_adamw: step %lld is not 1-based", (long long)step);
    DSC_CHECK(beta1 >= 0 && beta1 < 1 && beta2 >= 0 && beta2 < 1, DSC_ERR_INVALID,
              "dsc_kernel_adamw: betas (%g, %g) outside [0, 1)", (double)beta1, (double)beta2);
    return KERNEL_RUN(&call, adamw, param->data, grad->data, exp_avg->data, exp_avg_sq->data,
                      dsc_tensor_numel(param), lr, beta1, beta2, eps, weight_decay, step);
}

dsc_status dsc_kernel_sgd(dsc_tensor *param, const dsc_tensor *grad, dsc_tensor *momentum_buf, float lr,
                          float momentum, float weight_decay, int64_t step) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_sgd", KARG(param), KARG(grad),
                         {"momentum_buf", momentum_buf, momentum == 0}));
    DSC_TRY(expect_same_numel(&call, param, "param", param));
    DSC_TRY(expect_same_numel(&call, grad, "grad", param));
    DSC_TRY(expect_same_numel(&call, momentum_buf, "momentum_buf", param));
    DSC_CHECK(step >= 1, DSC_ERR_INVALID, "dsc_kernel_sgd: step %lld is not 1-based", (long long)step);
    return KERNEL_RUN(&call, sgd, param->data, grad->data, momentum == 0 ? NULL : kernel_f32(momentum_buf),
                      dsc_tensor_numel(param), lr, momentum, weight_decay, step);
}

dsc_status dsc_kernel_lion(dsc_tensor *param, const dsc_tensor *grad, dsc_tensor *exp_avg, float lr, float beta1,
                           float beta2, float weight_decay) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_lion", KARG(param), KARG(grad), KARG(exp_avg)));
    DSC_TRY(expect_same_numel(&call, param, "param", param));
    DSC_TRY(expect_same_numel(&call, grad, "grad", param));
    DSC_TRY(expect_same_numel(&call, exp_avg, "exp_avg", param));
    return KERNEL_RUN(&call, lion, param->data, grad->data, exp_avg->data, dsc_tensor_numel(param), lr, beta1,
                      beta2, weight_decay);
}

dsc_status dsc_kernel_lamb_direction(dsc_tensor *update, const dsc_tensor *param, const dsc_tensor *grad,
                                     dsc_tensor *exp_avg, dsc_tensor *exp_avg_sq, float beta1, float beta2,
                                     float eps, float weight_decay) {
    kernel_call call;
    DSC_TRY(KERNEL_BEGIN(&call, "dsc_kernel_lamb_direction", KARG(update), KARG(param), KARG(grad), KARG(exp_avg),
                         KARG(exp_avg_sq)));
    DSC_TRY(expect_same_numel(&call, update, "update", param));
    DSC_TRY(expect_same_numel(&call, grad, "grad", param));
    DSC_TRY(expect_same_numel(&call, exp_avg, "exp_avg", param));
    DSC_TRY(expect_same_numel(&call, exp_avg_sq, "exp_avg_sq", param));
    return KERNEL_RUN(&call, lamb_direction, update->data, param->data, grad->data, exp_avg->data,
                      exp_avg_sq->data, dsc_tensor_numel(param), beta1, beta2, eps, weight_decay);
}
