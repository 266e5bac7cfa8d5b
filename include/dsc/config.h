/* dsc/config.h — the job configuration: one JSON file per job, parsed into a
 * typed struct that every later layer reads.
 *
 * Key names follow DeepSpeed's JSON config where DeepSpeed has them
 * (train_batch_size, optimizer, scheduler, zero_optimization, ...) plus dsc's
 * own sections (model, pipeline, moe, checkpoint, comm, data, train).
 * Validation is strict: an unknown key is an error that suggests the nearest
 * known key, a wrong type or out-of-range value names the full key path, and
 * cross-field inconsistencies name the numbers that disagree. Every error is
 * DSC_ERR_CONFIG and starts with the source name ("config.json: ...").
 *
 * The struct is the single source of truth once loaded: all defaults are
 * filled in and "auto" values (n_kv_head, d_ff, qkv_bias, ...) are resolved.
 * Strings are owned by the struct and freed by dsc_config_free. This header
 * does not know how a key is spelled in JSON; the schema (and the generated
 * reference in docs/config.md) does. */
#ifndef DSC_CONFIG_H
#define DSC_CONFIG_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stdint.h>

#include "dsc/model.h"
#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The architecture enum is dsc/model.h's (one type, so a file may include
 * both headers); these are the config's spellings of its values. */
#define DSC_MODEL_ARCH_GPT DSC_ARCH_GPT         /* GPT-2: LayerNorm, GELU MLP, learned positions */
#define DSC_MODEL_ARCH_LLAMA DSC_ARCH_LLAMA     /* RMSNorm, SwiGLU MLP, RoPE, grouped-query attention */
#define DSC_MODEL_ARCH_GPT_MOE DSC_ARCH_GPT_MOE /* GPT with MoE MLPs every moe.layer_freq layers */
#define DSC_MODEL_ARCH_MIXTRAL DSC_ARCH_MIXTRAL /* Llama with MoE MLPs */

/* DeepSpeed's optimizer names (case-insensitive in the file). */
typedef enum dsc_optimizer_type {
    DSC_OPTIMIZER_TYPE_ADAMW = 0, /* torch.optim.AdamW */
    DSC_OPTIMIZER_TYPE_SGD,       /* with momentum */
    DSC_OPTIMIZER_TYPE_ADAM,      /* DeepSpeed's Adam: AdamW when adam_w_mode, else L2 added to the gradient */
    DSC_OPTIMIZER_TYPE_LAMB,      /* DeepSpeed's FusedLamb: Adam direction scaled by a clamped trust ratio */
    DSC_OPTIMIZER_TYPE_LION,      /* sign of interpolated momentum, decoupled weight decay */
    DSC_OPTIMIZER_TYPE_MUON       /* DeepSpeed's MuonWithAuxAdam: Muon for hidden matrices, Adam for the rest */
} dsc_optimizer_type;

/* Muon's orthogonalisation: DeepSpeed's two Newton-Schulz iterations. */
typedef enum dsc_muon_ns_method {
    DSC_MUON_NS_GRAM = 0, /* iterates on the small Gram matrix X X^T (DeepSpeed's default) */
    DSC_MUON_NS_STANDARD  /* the quintic iteration on X itself */
} dsc_muon_ns_method;

typedef enum dsc_offload_device {
    DSC_OFFLOAD_DEVICE_NONE = 0,
    DSC_OFFLOAD_DEVICE_CPU,
    DSC_OFFLOAD_DEVICE_NVME /* refused */
} dsc_offload_device;

/* DeepSpeed's scheduler names; "constant" keeps optimizer.params.lr. */
typedef enum dsc_lr_schedule {
    DSC_LR_SCHEDULE_CONSTANT = 0,
    DSC_LR_SCHEDULE_WARMUP_LR,        /* warmup_min_lr -> warmup_max_lr, then constant */
    DSC_LR_SCHEDULE_WARMUP_DECAY_LR,  /* ... then linear decay to 0 at total_num_steps */
    DSC_LR_SCHEDULE_WARMUP_COSINE_LR, /* ratio warmup to lr, cosine to cos_min_ratio * lr */
    DSC_LR_SCHEDULE_ONE_CYCLE,        /* triangle cycle_min_lr -> cycle_max_lr -> cycle_min_lr, then decay */
    DSC_LR_SCHEDULE_LR_RANGE_TEST     /* lr_range_test_min_lr growing linearly (or in stairs) */
} dsc_lr_schedule;

typedef enum dsc_warmup_type { DSC_WARMUP_TYPE_LOG = 0, DSC_WARMUP_TYPE_LINEAR } dsc_warmup_type;

typedef enum dsc_pipe_schedule_kind {
    DSC_PIPE_SCHEDULE_KIND_1F1B = 0,
    DSC_PIPE_SCHEDULE_KIND_GPIPE,
    DSC_PIPE_SCHEDULE_KIND_INTERLEAVED
} dsc_pipe_schedule_kind;

typedef enum dsc_moe_noisy_gate {
    DSC_MOE_NOISY_GATE_NONE = 0, /* JSON null */
    DSC_MOE_NOISY_GATE_JITTER,
    DSC_MOE_NOISY_GATE_RSAMPLE
} dsc_moe_noisy_gate;

typedef enum dsc_moe_drop_policy {
    DSC_MOE_DROP_POLICY_PROBS = 0,
    DSC_MOE_DROP_POLICY_POSITION
} dsc_moe_drop_policy;

typedef enum dsc_comm_backend_kind {
    DSC_COMM_BACKEND_KIND_AUTO = 0, /* NCCL when built with CUDA and on GPUs, else MPI */
    DSC_COMM_BACKEND_KIND_MPI,
    DSC_COMM_BACKEND_KIND_NCCL
} dsc_comm_backend_kind;

typedef struct dsc_config_model {
    dsc_model_arch arch;
    int n_layer;
    int d_model;
    int n_head;
    int n_kv_head; /* resolved: n_head when 0 in the file */
    int d_ff;      /* resolved: 4 * d_model when 0 in the file */
    int vocab_size;
    int seq_len;
    bool tie_embeddings;
    bool activation_checkpointing;
    double rope_theta;
    double norm_eps;
    bool qkv_bias; /* resolved: true for gpt/gpt-moe, false for llama/mixtral when null */
} dsc_config_model;

typedef struct dsc_config_optimizer {
    dsc_optimizer_type type;
    struct {
        double lr;
        double betas[2];
        double eps;
        double weight_decay;
        double momentum;
        bool adam_w_mode;     /* Adam: decoupled weight decay (AdamW) instead of L2 */
        bool bias_correction; /* Adam, AdamW, Lamb */
        double max_coeff;     /* Lamb: trust ratio clamp */
        double min_coeff;
        double muon_lr; /* Muon: lr of the Muon parameters (resolved: lr, or 0.02 without lr) */
        double adam_lr; /* Muon: lr of the Adam parameters (resolved: lr, or 3e-4 without lr) */
        dsc_muon_ns_method ns_method;
    } params;
} dsc_config_optimizer;

typedef struct dsc_config_scheduler {
    dsc_lr_schedule type;
    struct {
        int64_t warmup_num_steps;
        int64_t total_num_steps; /* resolved: train.steps when 0 in the file */
        double warmup_min_lr;
        double warmup_max_lr;
        dsc_warmup_type warmup_type;
        double warmup_min_ratio;
        double cos_min_ratio;
        /* OneCycle */
        double cycle_min_lr, cycle_max_lr, decay_lr_rate;
        int64_t cycle_first_step_size, cycle_second_step_size;     /* resolved: second = first when null */
        int64_t cycle_first_stair_count, cycle_second_stair_count; /* resolved: second = first when null */
        int64_t decay_step_size;
        bool cycle_momentum; /* cycle the optimizer's beta1 (momentum) opposite to the lr */
        double cycle_min_mom, cycle_max_mom, decay_mom_rate;
        /* LRRangeTest */
        double lr_range_test_min_lr, lr_range_test_step_rate;
        int64_t lr_range_test_step_size;
        bool lr_range_test_staircase;
    } params;
} dsc_config_scheduler;

typedef struct dsc_config_zero {
    int stage;
    int64_t reduce_bucket_size;    /* elements */
    int64_t allgather_bucket_size; /* elements */
    bool overlap_comm;             /* resolved: true for stage 3, else false, when null; no effect yet */
    bool contiguous_gradients;
    int64_t stage3_prefetch_bucket_size;
    int64_t stage3_max_live_parameters;
    int64_t stage3_param_persistence_threshold;
    dsc_offload_device offload_optimizer; /* offload_optimizer.device (cpu_offload: true means cpu) */
    dsc_offload_device offload_param;     /* offload_param.device */
    bool cpu_offload;                     /* DeepSpeed's legacy spelling of offload_optimizer cpu */
} dsc_config_zero;

typedef struct dsc_config_pipeline {
    int stages;
    char *partition_method; /* "uniform", "parameters" or "type:REGEX" */
    dsc_pipe_schedule_kind schedule;
    int virtual_stages;
    int activation_checkpoint_interval;
    double p2p_timeout_s;
} dsc_config_pipeline;

/* DeepSpeed's tensor_parallel section (AutoTP training). */
typedef struct dsc_config_tp {
    int autotp_size;        /* tensor-parallel degree; 1 disables */
    bool sequence_parallel; /* Megatron sequence parallelism (tp/sequence.c) */
    int64_t tp_grain_size;  /* widths split in multiples of this */
} dsc_config_tp;

typedef struct dsc_config_moe {
    int num_experts; /* 0: no MoE layers */
    int ep_size;
    int k;
    double capacity_factor;
    double eval_capacity_factor;
    int min_capacity;
    bool drop_tokens;
    dsc_moe_noisy_gate noisy_gate_policy;
    bool use_rts;
    bool use_residual;
    double aux_loss_coef;
    double z_loss_coef;
    int layer_freq;
    bool top2_2nd_expert_sampling;
    dsc_moe_drop_policy drop_policy;
    bool enable_expert_tensor_parallelism; /* split every expert by width over the tensor group too */
    bool overlap_alltoall;                 /* dsc_moe_options.overlap_alltoall */
} dsc_config_moe;

typedef struct dsc_config_checkpoint {
    char *save_dir; /* "" disables saving */
    int64_t save_interval;
    int keep_last; /* 0 keeps every checkpoint */
    char *tag;     /* "" means "global_step<N>" */
} dsc_config_checkpoint;

typedef struct dsc_config_comm {
    double timeout_s;
    dsc_comm_backend_kind backend;
} dsc_config_comm;

typedef struct dsc_config_data {
    char *path;
    double val_fraction;
} dsc_config_data;

/* DeepSpeed's tensorboard and csv_monitor sections (the same three keys). */
typedef struct dsc_config_monitor {
    bool enabled;
    char *output_path; /* files go to output_path/job_name/ ("" : the working directory) */
    char *job_name;
} dsc_config_monitor;

/* DeepSpeed's flops_profiler section: one step profiled per layer. */
typedef struct dsc_config_flops_profiler {
    bool enabled;
    int64_t profile_step;        /* profile the step taken after this many (DeepSpeed's global_steps) */
    int module_depth;            /* deepest layer nesting in the detailed table; -1 all */
    int top_modules;             /* layers listed per measure in the aggregated profile */
    bool detailed;               /* print the per-layer table */
    double recompute_fwd_factor; /* forward recomputed in backward (activation checkpointing), for the estimate */
    char *output_file;           /* "" : stdout */
} dsc_config_flops_profiler;

/* DeepSpeed's comms_logger section (prof_ops is refused: use prof_all). */
typedef struct dsc_config_comms_logger {
    bool enabled;
    bool verbose;  /* a line per operation as it completes */
    bool prof_all; /* log every operation (without it, none: dsc has no prof_ops list) */
    bool debug;    /* records name their communicator */
} dsc_config_comms_logger;

/* DeepSpeed's fp16 section (mixed precision with loss scaling). */
typedef struct dsc_config_fp16 {
    bool enabled;
    double loss_scale;         /* 0: dynamic loss scaling; > 0: this static scale */
    int initial_scale_power;   /* the dynamic scale starts at 2^this */
    int64_t loss_scale_window; /* clean steps before the scale doubles */
    int hysteresis;            /* overflows tolerated before the scale halves */
    bool consecutive_hysteresis;
    double min_loss_scale;
} dsc_config_fp16;

/* DeepSpeed's bf16 section. */
typedef struct dsc_config_bf16 {
    bool enabled;
    bool check_grad_overflow; /* skip steps with inf/nan gradients (no loss scale) */
} dsc_config_bf16;

/* communication_data_type: the dtype gradients are reduced in (DeepSpeed's
 * spellings; the aliases map to FP32 / FP16 / BF16, see dsc/precision.h). */
typedef enum dsc_comm_data_type {
    DSC_COMM_DATA_TYPE_DEFAULT = 0, /* JSON null: the training dtype */
    DSC_COMM_DATA_TYPE_FP32,
    DSC_COMM_DATA_TYPE_FP16,
    DSC_COMM_DATA_TYPE_BF16,
    DSC_COMM_DATA_TYPE_FLOAT32,
    DSC_COMM_DATA_TYPE_FLOAT16,
    DSC_COMM_DATA_TYPE_HALF,
    DSC_COMM_DATA_TYPE_BFLOAT16
} dsc_comm_data_type;

typedef struct dsc_config_train {
    int64_t steps;
    int64_t eval_interval; /* 0: never */
    int eval_iters;
} dsc_config_train;

struct dsc_config_source;

typedef struct dsc_config {
    /* Batch sizes: 0 until given or derived by dsc_config_resolve_batch. */
    int64_t train_batch_size;
    int64_t train_micro_batch_size_per_gpu;
    int64_t gradient_accumulation_steps;
    int data_parallel_size; /* 0 until dsc_config_resolve_batch */

    dsc_config_model model;
    dsc_config_optimizer optimizer;
    dsc_config_scheduler scheduler;
    double gradient_clipping; /* 0: no clipping */
    dsc_config_zero zero_optimization;
    dsc_config_pipeline pipeline;
    dsc_config_tp tensor_parallel;
    dsc_config_moe moe;
    dsc_config_checkpoint checkpoint;
    dsc_config_comm comm;
    dsc_config_data data;
    dsc_config_train train;
    int64_t steps_per_print;
    uint64_t seed;
    bool wall_clock_breakdown;
    dsc_config_monitor tensorboard;
    dsc_config_monitor csv_monitor;
    dsc_config_flops_profiler flops_profiler;
    dsc_config_comms_logger comms_logger;
    dsc_config_fp16 fp16;
    dsc_config_bf16 bf16;
    dsc_comm_data_type communication_data_type;

    char *source;                   /* file name used in messages */
    struct dsc_config_source *json; /* the JSON as given plus overrides (private) */
} dsc_config;

/* Loads `path` and applies `overrides` ("a.b.c=value", in order). On error
 * *cfg is left zeroed (nothing to free). */
DSC_API dsc_status dsc_config_load_file(const char *path, const char *const *overrides, int n_overrides,
                                        dsc_config *cfg);

/* As load_file, from JSON text; `source` names it in messages ("config.json"). */
DSC_API dsc_status dsc_config_parse_string(const char *json, const char *source, const char *const *overrides,
                                           int n_overrides, dsc_config *cfg);

/* Applies one "a.b.c=value" override. The value is parsed as JSON when it is
 * valid JSON, else taken as a string, and checked against the schema. On
 * error *cfg is unchanged. Resets the batch resolution (call resolve again). */
DSC_API dsc_status dsc_config_apply_override(dsc_config *cfg, const char *assignment);

/* DeepSpeed's batch rule, batch = micro * accumulation * dp_size: given any
 * two of the three (or one: the missing ones default as in DeepSpeed), derive
 * the rest; all must agree. The message lists the numbers that disagree. */
DSC_API dsc_status dsc_config_resolve_batch(dsc_config *cfg, int dp_size);

/* The complete effective configuration (every key, defaults and resolved
 * values included) as indented JSON, for checkpoints; free() the result.
 * Parsing it again gives the same struct. */
DSC_API dsc_status dsc_config_to_json(const dsc_config *cfg, char **json);

/* The reference table of every key (path, type, default, meaning) as
 * Markdown, as it appears in docs/config.md; free() the result. */
DSC_API dsc_status dsc_config_reference_markdown(char **markdown);

/* DeepSpeed's config keys with what dsc does with each (implemented,
 * implemented by design, or refused with the reason and the alternative), as
 * the Markdown table in docs/config.md; free() the result. */
DSC_API dsc_status dsc_config_deepspeed_markdown(char **markdown);

DSC_API void dsc_config_free(dsc_config *cfg);

#ifdef __cplusplus
}
#endif
#endif
