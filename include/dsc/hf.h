/* dsc/hf.h — dsc training models to and from Hugging Face checkpoints.
 *
 * Export: a dsc training checkpoint (state.h5) becomes a Hugging Face model
 * directory, config.json + model.safetensors (f32), that transformers loads
 * with from_pretrained: `llama` as LlamaForCausalLM (Qwen2ForCausalLM when
 * model.qkv_bias, since Llama's attention_bias also biases the output
 * projection), `mixtral` as MixtralForCausalLM, `gpt` as GPT2LMHeadModel
 * (q/k/v fused into c_attn, every linear in GPT-2's transposed Conv1D
 * layout). Every model tensor of the checkpoint must have a Hugging Face
 * name; a model the target class cannot express (gpt-moe, GQA in GPT-2,
 * MoE every n-th layer, PR-MoE residuals, a top-1 router) is
 * DSC_ERR_UNSUPPORTED naming the reason.
 *
 * Import: a Hugging Face Llama / Mistral / Qwen2 / Mixtral directory gives
 * the dsc model section (as config overrides) and the initial values of
 * every training parameter, read by the checkpoint restore path
 * (dsc_checkpoint_load_params), so any (PP, DP, EP, ZeRO) layout starts
 * from it.
 *
 * Parameter names on both sides: docs/models.md and docs/checkpoint.md.
 * Thread-safety: an import handle is read-only after open; reads from
 * several threads are safe, open/close are not concurrent with them. */
#ifndef DSC_HF_H
#define DSC_HF_H

#include <stdint.h>

#include "dsc/api.h"
#include "dsc/config.h"
#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Writes out_dir/config.json and out_dir/model.safetensors from the dsc
 * checkpoint file `ckpt_file`. out_dir is created when missing; existing
 * files in it are never overwritten. *n_tensors (may be NULL) receives the
 * number of tensors written. One process. */
DSC_API dsc_status dsc_hf_export(const char *ckpt_file, const char *out_dir, int64_t *n_tensors);

typedef struct dsc_hf_import dsc_hf_import;

/* Opens a Hugging Face model directory: config.json (parsed by the
 * inference policy of its architecture) and its safetensors. A model dsc
 * training cannot build exactly (RoPE scaling, a head size other than
 * hidden_size / num_attention_heads, a top-1 Mixtral router) is
 * DSC_ERR_UNSUPPORTED naming the key. */
DSC_API dsc_status dsc_hf_import_open(const char *dir, dsc_hf_import **out);
DSC_API void dsc_hf_import_close(dsc_hf_import *imp);

/* Loads the training config `path` with `overrides` (--set) and the model
 * section the checkpoint implies (model.arch, shapes, rope_theta,
 * norm_eps, qkv_bias, tie_embeddings; moe.num_experts, k, layer_freq). A key
 * the file or an override sets to another value than the checkpoint's is
 * DSC_ERR_CONFIG naming both values; model.seq_len above the checkpoint's
 * context is DSC_ERR_CONFIG too. */
DSC_API dsc_status dsc_hf_import_config(const dsc_hf_import *imp, const char *path, const char *const *overrides,
                                        int n_overrides, dsc_config *cfg);

/* A dsc_checkpoint_read_fn: elements [begin, begin + count) (row-major) of
 * the dsc parameter `name` of shape (ndim, shape), converted to f32. A name
 * without a Hugging Face tensor or a shape that differs is an error naming
 * both names and shapes. */
DSC_API dsc_status dsc_hf_import_read(void *imp, const char *name, int ndim, const int64_t *shape, int64_t begin,
                                      int64_t count, float *dst);

#ifdef __cplusplus
}
#endif
#endif
