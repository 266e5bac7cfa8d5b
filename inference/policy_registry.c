/* The registry of inference policies by architecture name. Registration
 * validates both container mapping tables, so a malformed policy is refused
 * before any checkpoint is read. Not here: the policies themselves
 * (policy_hf.c, policy_dsc.c) or loading (model_build.c). */
#include <stdio.h>
#include <string.h>

#include "inference/model_internal.h"

enum { MAX_POLICIES = 32 };

static const dsc_policy *registry[MAX_POLICIES];
static int n_registered;

dsc_status dsc_policy_register(const dsc_policy *policy) {
    DSC_CHECK(policy && policy->arch && policy->configure && policy->layer && policy->non_layer &&
                  policy->layer_prefix,
              DSC_ERR_INVALID, "policy %s: arch, configure, layer prefix and both containers are required",
              policy && policy->arch ? policy->arch : "(unnamed)");
    for (int i = 0; i < n_registered; i++)
        DSC_CHECK(strcmp(registry[i]->arch, policy->arch) != 0, DSC_ERR_INVALID, "policy %s is already registered",
                  policy->arch);
    DSC_CHECK(n_registered < MAX_POLICIES, DSC_ERR_INVALID, "policy %s: registry full (%d)", policy->arch,
              MAX_POLICIES);
    DSC_TRY(dsc_error_wrap(dsc_container_def_validate(policy->layer), "policy %s", policy->arch));
    DSC_TRY(dsc_error_wrap(dsc_container_def_validate(policy->non_layer), "policy %s", policy->arch));
    if (policy->dense_layer)
        DSC_TRY(dsc_error_wrap(dsc_container_def_validate(policy->dense_layer), "policy %s", policy->arch));
    registry[n_registered++] = policy;
    return NULL;
}

dsc_status dsc_policy_find(const char *arch, const dsc_policy **out) {
    DSC_TRY(dsc_policy_register_builtin());
    for (int i = 0; i < n_registered; i++)
        if (strcmp(registry[i]->arch, arch) == 0) {
            *out = registry[i];
            return NULL;
        }
    char names[512] = "";
    size_t used = 0;
    for (int i = 0; i < n_registered && used < sizeof names; i++)
        used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "", registry[i]->arch);
    return dsc_error(DSC_ERR_UNSUPPORTED, "architecture '%s' has no inference policy (registered: %s)", arch,
                     names);
}

dsc_status dsc_policy_register_builtin(void) {
    static bool done;
    if (done) return NULL;
    const dsc_policy *builtin[] = {&dsc_policy_dsc_gpt,      &dsc_policy_dsc_llama,   &dsc_policy_hf_llama,
                                   &dsc_policy_hf_mistral,   &dsc_policy_hf_qwen2,    &dsc_policy_hf_mixtral,
                                   &dsc_policy_hf_phi3,      &dsc_policy_dsc_gpt_moe, &dsc_policy_dsc_mixtral,
                                   &dsc_policy_hf_qwen2_moe, &dsc_policy_hf_neox,     &dsc_policy_hf_gpt2,
                                   &dsc_policy_hf_opt};
    for (size_t i = 0; i < sizeof builtin / sizeof builtin[0]; i++) {
        bool present = false;
        for (int j = 0; j < n_registered; j++)
            present |= registry[j] == builtin[i];
        if (!present) DSC_TRY(dsc_policy_register(builtin[i]));
    }
    done = true;
    return NULL;
}
