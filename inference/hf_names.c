/* The name rules between dsc training parameters and Hugging Face tensors
 * (hf_names.h): Llama / Qwen2 / Mixtral names for dsc llama and mixtral,
 * GPT-2's for dsc gpt (docs/models.md has the table). */
#include "inference/hf_names.h"

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define L "model.layers.*."
#define MOE L "block_sparse_moe."
static const dsc_hf_rule llama_rules[] = {
    {"embed.wte.weight", "model.embed_tokens.weight", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.norm1.weight", L "input_layernorm.weight", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.attn.q.weight", L "self_attn.q_proj.weight", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.attn.k.weight", L "self_attn.k_proj.weight", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.attn.v.weight", L "self_attn.v_proj.weight", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.attn.q.bias", L "self_attn.q_proj.bias", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.attn.k.bias", L "self_attn.k_proj.bias", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.attn.v.bias", L "self_attn.v_proj.bias", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.attn.o.weight", L "self_attn.o_proj.weight", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.norm2.weight", L "post_attention_layernorm.weight", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.mlp.gate.weight", L "mlp.gate_proj.weight", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.mlp.up.weight", L "mlp.up_proj.weight", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.mlp.down.weight", L "mlp.down_proj.weight", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.moe.gate.weight", MOE "gate.weight", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.moe.experts.*.gate.weight", MOE "experts.*.w1.weight", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.moe.experts.*.up.weight", MOE "experts.*.w3.weight", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.moe.experts.*.down.weight", MOE "experts.*.w2.weight", DSC_HF_LAYOUT_SAME, 0},
    {"head.norm.weight", "model.norm.weight", DSC_HF_LAYOUT_SAME, 0},
    {"head.weight", "lm_head.weight", DSC_HF_LAYOUT_SAME, 0},
};
#undef MOE
#undef L

#define H "transformer.h.*."
static const dsc_hf_rule gpt_rules[] = {
    {"embed.wte.weight", "transformer.wte.weight", DSC_HF_LAYOUT_SAME, 0},
    {"embed.wpe.weight", "transformer.wpe.weight", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.norm1.weight", H "ln_1.weight", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.norm1.bias", H "ln_1.bias", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.attn.q.weight", H "attn.c_attn.weight", DSC_HF_LAYOUT_QKV_PART, 0},
    {"layers.*.attn.k.weight", H "attn.c_attn.weight", DSC_HF_LAYOUT_QKV_PART, 1},
    {"layers.*.attn.v.weight", H "attn.c_attn.weight", DSC_HF_LAYOUT_QKV_PART, 2},
    {"layers.*.attn.q.bias", H "attn.c_attn.bias", DSC_HF_LAYOUT_QKV_PART, 0},
    {"layers.*.attn.k.bias", H "attn.c_attn.bias", DSC_HF_LAYOUT_QKV_PART, 1},
    {"layers.*.attn.v.bias", H "attn.c_attn.bias", DSC_HF_LAYOUT_QKV_PART, 2},
    {"layers.*.attn.o.weight", H "attn.c_proj.weight", DSC_HF_LAYOUT_TRANSPOSED, 0},
    {"layers.*.attn.o.bias", H "attn.c_proj.bias", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.norm2.weight", H "ln_2.weight", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.norm2.bias", H "ln_2.bias", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.mlp.fc.weight", H "mlp.c_fc.weight", DSC_HF_LAYOUT_TRANSPOSED, 0},
    {"layers.*.mlp.fc.bias", H "mlp.c_fc.bias", DSC_HF_LAYOUT_SAME, 0},
    {"layers.*.mlp.proj.weight", H "mlp.c_proj.weight", DSC_HF_LAYOUT_TRANSPOSED, 0},
    {"layers.*.mlp.proj.bias", H "mlp.c_proj.bias", DSC_HF_LAYOUT_SAME, 0},
    {"head.norm.weight", "transformer.ln_f.weight", DSC_HF_LAYOUT_SAME, 0},
    {"head.norm.bias", "transformer.ln_f.bias", DSC_HF_LAYOUT_SAME, 0},
    {"head.weight", "lm_head.weight", DSC_HF_LAYOUT_SAME, 0},
};
#undef H

const dsc_hf_rule *dsc_hf_rules(dsc_model_arch arch, int *n) {
    switch (arch) {
    case DSC_ARCH_LLAMA:
    case DSC_ARCH_MIXTRAL:
        *n = (int)(sizeof llama_rules / sizeof llama_rules[0]);
        return llama_rules;
    case DSC_ARCH_GPT:
        *n = (int)(sizeof gpt_rules / sizeof gpt_rules[0]);
        return gpt_rules;
    default:
        *n = 0;
        return NULL;
    }
}

enum { MAX_STARS = 4 };

/* Matches name against pattern; each `*` takes a run of digits (at most 9). */
static bool match(const char *pattern, const char *name, long idx[MAX_STARS], int *n_idx) {
    *n_idx = 0;
    while (*pattern) {
        if (*pattern == '*') {
            if (*n_idx == MAX_STARS || !isdigit((unsigned char)*name)) return false;
            long v = 0;
            int digits = 0;
            for (; isdigit((unsigned char)*name) && digits < 9; name++, digits++)
                v = 10 * v + (*name - '0');
            if (isdigit((unsigned char)*name)) return false;
            idx[(*n_idx)++] = v;
            pattern++;
        } else if (*pattern++ != *name++) {
            return false;
        }
    }
    return *name == '\0';
}

static bool fill(const char *pattern, const long *idx, int n_idx, char *out, size_t len) {
    size_t w = 0;
    int k = 0;
    for (; *pattern; pattern++) {
        int wrote = *pattern == '*' && k < n_idx ? snprintf(out + w, len - w, "%ld", idx[k++])
                                                 : snprintf(out + w, len - w, "%c", *pattern);
        if (wrote < 0 || (size_t)wrote >= len - w) return false;
        w += (size_t)wrote;
    }
    return k == n_idx;
}

static const dsc_hf_rule *translate(const dsc_hf_rule *rules, int n, bool to_hf, const char *name, char *out,
                                    size_t len) {
    long idx[MAX_STARS];
    int n_idx;
    for (int i = 0; i < n; i++) {
        const char *from = to_hf ? rules[i].dsc : rules[i].hf, *to = to_hf ? rules[i].hf : rules[i].dsc;
        if (match(from, name, idx, &n_idx) && fill(to, idx, n_idx, out, len)) return &rules[i];
    }
    return NULL;
}

const dsc_hf_rule *dsc_hf_to_hf(const dsc_hf_rule *rules, int n, const char *name, char *out, size_t len) {
    return translate(rules, n, true, name, out, len);
}

const dsc_hf_rule *dsc_hf_from_hf(const dsc_hf_rule *rules, int n, const char *name, char *out, size_t len) {
    return translate(rules, n, false, name, out, len);
}
