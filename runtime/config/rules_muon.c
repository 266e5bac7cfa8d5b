/* The config rules of the Muon optimizer: DeepSpeed's defaults for the keys
 * a Muon config leaves out (they differ from the Adam family's, so they are
 * filled here and not by the schema), and the keys dsc refuses for it.
 *
 * DeepSpeed builds two parameter groups from one optimizer block
 * (runtime/engine.py, MUON_OPTIMIZER): the Muon group takes lr (or muon_lr),
 * momentum (0.95), weight_decay (0) and ns_method ("gram"); the Adam group
 * takes lr (or adam_lr), betas ([0.9, 0.95]), eps (1e-10) and weight_decay;
 * without lr the groups default to 0.02 and 3e-4. Every ZeRO stage and
 * tensor parallelism take Muon (the matrices are assembled for Newton-Schulz:
 * runtime/optim/muon.c). */
#include "runtime/config/config_impl.h"

static int absent(const cJSON *root, const char *path) {
    const cJSON *v = dsc_config_lookup(root, path);
    return !v || cJSON_IsNull(v);
}

static void fill_defaults(const cJSON *root, dsc_config_optimizer *o) {
    bool has_lr = !absent(root, "optimizer.params.lr");
    if (o->params.muon_lr == 0) o->params.muon_lr = has_lr ? o->params.lr : 0.02;
    if (o->params.adam_lr == 0) o->params.adam_lr = has_lr ? o->params.lr : 3e-4;
    if (absent(root, "optimizer.params.momentum")) o->params.momentum = 0.95;
    if (absent(root, "optimizer.params.weight_decay")) o->params.weight_decay = 0.0;
    if (absent(root, "optimizer.params.eps")) o->params.eps = 1e-10;
    if (absent(root, "optimizer.params.betas")) {
        o->params.betas[0] = 0.9;
        o->params.betas[1] = 0.95;
    }
}

/* DeepSpeed's WarmupLR, WarmupDecayLR, OneCycle and LRRangeTest write one
 * rate into every parameter group, so a group's own rate would be
 * overwritten on the first step; WarmupCosineLR scales each group's rate. */
static void check_group_rates(const cJSON *root, const char *src, const dsc_config *cfg, dsc_config_issues *is) {
    dsc_lr_schedule sched = cfg->scheduler.type;
    if (sched == DSC_LR_SCHEDULE_CONSTANT || sched == DSC_LR_SCHEDULE_WARMUP_COSINE_LR) {
        if (cfg->optimizer.params.lr <= 0)
            dsc_config_issue(is, dsc_error(DSC_ERR_CONFIG,
                                           "%s: \"optimizer.params.lr\" 0 with \"optimizer.type\" \"muon\": "
                                           "the group rates (muon_lr, adam_lr) are taken relative to lr; give "
                                           "lr > 0",
                                           src));
        return;
    }
    const char *keys[] = {"optimizer.params.muon_lr", "optimizer.params.adam_lr"};
    for (int i = 0; i < 2; i++)
        if (!absent(root, keys[i]))
            dsc_config_issue(is,
                             dsc_error(DSC_ERR_CONFIG,
                                       "%s: \"%s\" has no effect with \"scheduler.type\" \"%s\", which "
                                       "sets one rate for every parameter group (as DeepSpeed's does); leave "
                                       "it out, or use WarmupCosineLR or no scheduler",
                                       src, keys[i], dsc_config_schema_find("scheduler.type")->choices[sched]));
}

void dsc_config_muon_rules(const cJSON *root, const char *src, dsc_config *cfg, dsc_config_issues *is) {
    if (cfg->optimizer.type != DSC_OPTIMIZER_TYPE_MUON) return;
    fill_defaults(root, &cfg->optimizer);
    check_group_rates(root, src, cfg, is);
    if (!cfg->optimizer.params.bias_correction)
        dsc_config_issue(is, dsc_error(DSC_ERR_UNSUPPORTED,
                                       "%s: \"optimizer.params.bias_correction\" false is not possible with "
                                       "\"optimizer.type\" \"muon\": DeepSpeed's MuonWithAuxAdam always "
                                       "bias-corrects its Adam group; leave the key out",
                                       src));
}
