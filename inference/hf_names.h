/* Private to inference/: how dsc training parameter names correspond to
 * Hugging Face tensor names (hf_export.c writes them, hf_import.c reads
 * them). A rule pairs a dsc pattern with a Hugging Face one; each `*`
 * stands for a decimal index (layer, expert) and is carried across in
 * order. The layout says how the tensor is stored on the Hugging Face side.
 * Not here: reading or writing files. */
#ifndef DSC_INFERENCE_HF_NAMES_H
#define DSC_INFERENCE_HF_NAMES_H

#include <stdbool.h>
#include <stddef.h>

#include "dsc/model.h"

typedef enum dsc_hf_layout {
    DSC_HF_LAYOUT_SAME = 0,   /* same shape and element order */
    DSC_HF_LAYOUT_TRANSPOSED, /* a (out, in) linear weight stored (in, out): GPT-2's Conv1D */
    /* GPT-2's fused c_attn: q, k, v (parts 0, 1, 2) side by side along the
     * output axis, weights transposed: (C, C) -> columns [part*C, (part+1)*C)
     * of (C, 3C); biases (C) -> elements [part*C, (part+1)*C) of (3C). */
    DSC_HF_LAYOUT_QKV_PART
} dsc_hf_layout;

typedef struct dsc_hf_rule {
    const char *dsc;
    const char *hf;
    dsc_hf_layout layout;
    int part; /* DSC_HF_LAYOUT_QKV_PART: 0 q, 1 k, 2 v */
} dsc_hf_rule;

/* The rules of a dsc architecture: llama and mixtral share Hugging Face's
 * Llama / Mixtral names, gpt has GPT-2's. NULL (*n = 0) for gpt-moe. */
const dsc_hf_rule *dsc_hf_rules(dsc_model_arch arch, int *n);

/* The rule whose dsc pattern matches `name` and the Hugging Face name it
 * gives (out, len bytes); NULL when none matches. */
const dsc_hf_rule *dsc_hf_to_hf(const dsc_hf_rule *rules, int n, const char *name, char *out, size_t len);
/* The reverse: the rule whose Hugging Face pattern matches `name` and the
 * dsc name it gives; NULL when none matches. */
const dsc_hf_rule *dsc_hf_from_hf(const dsc_hf_rule *rules, int n, const char *name, char *out, size_t len);

#endif
