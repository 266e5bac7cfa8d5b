/* The table of DeepSpeed's config keys (docs/_pages/config-json.md and
 * runtime/zero/config.py of DeepSpeed) with what dsc does with each: the
 * schema implements it, dsc meets it by design, or it is supported by
 * DeepSpeed and not by dsc, refused with the reason and what to use instead
 * (accepted only with the value that asks for nothing, so a file that merely
 * spells out DeepSpeed's defaults runs). Data only: checking lives in
 * deepspeed.c, the reference in docs/config.md is generated from here. */
#include <stddef.h>

#include "runtime/config/config_impl.h"

#define IMPL(path)                                                                                                \
    { path, DSC_DS_IMPLEMENTED, NULL, NULL, NULL, NULL }
#define DESIGN(path, reason)                                                                                      \
    { path, DSC_DS_BY_DESIGN, NULL, NULL, reason, NULL }
#define SECTION(path)                                                                                             \
    { path, DSC_DS_BY_DESIGN, NULL, NULL, NULL, NULL } /* its keys have their own entries */
#define REFUSE(path, off, children, reason, instead)                                                              \
    { path, DSC_DS_REFUSED, off, children, reason, instead }

#define NO_MIXED                                                                                                  \
    "mixed precision is not implemented yet (issue 19, item 2): dsc trains with f32 parameters, gradients and "   \
    "optimizer state"
#define FP16_KEYS                                                                                                 \
    "enabled auto_cast loss_scale initial_scale_power loss_scale_window hysteresis consecutive_hysteresis "       \
    "min_loss_scale fp16_master_weights_and_grads"
#define BF16_KEYS                                                                                                 \
    "enabled immediate_grad_update check_grad_overflow bf16_master_weights_and_grads bf16_optimizer_states"
#define OFFLOAD_BUFFERS                                                                                           \
    "tunes DeepSpeed's pinned host / NVMe staging buffers; dsc updates the state where it lives"
#define ZEROPP "ZeRO++ (quantized or hierarchical collectives) is not implemented"

static const dsc_ds_key keys[] = {
    /* batch size */
    IMPL("train_batch_size"),
    IMPL("train_micro_batch_size_per_gpu"),
    IMPL("gradient_accumulation_steps"),
    REFUSE("managed_gradient_accumulation", "true", NULL,
           "dsc's engine owns the accumulation loop and steps the optimizer at the accumulation boundary",
           "gradient_accumulation_steps"),
    /* optimizer and scheduler (their params are in the schema) */
    IMPL("optimizer"),
    IMPL("optimizer.type"),
    IMPL("optimizer.params"),
    DESIGN("optimizer.params.torch_adam",
           "dsc has one Adam implementation, with torch.optim.Adam / AdamW arithmetic, on every backend"),
    IMPL("scheduler"),
    IMPL("scheduler.type"),
    IMPL("scheduler.params"),
    REFUSE("scheduler.params.last_batch_iteration", "-1", NULL,
           "dsc restores the schedule's iteration from the checkpoint's step count", "dsc-train --resume DIR"),
    /* communication */
    REFUSE("communication_data_type", "null|\"fp32\"|\"float32\"", NULL,
           "gradients are reduced in f32; reduction in bf16/fp16 comes with mixed precision (issue 19, item 2)",
           NULL),
    REFUSE("gradient_allreduce_op", "\"mean\"", NULL,
           "dsc averages gradients over the data-parallel group (DeepSpeed's default)",
           "scale the loss instead of summing gradients"),
    REFUSE("prescale_gradients", "false", NULL,
           "dsc divides by the data-parallel size after the sum (DeepSpeed's default); prescaling only moves "
           "rounding in low precision",
           NULL),
    REFUSE("gradient_predivide_factor", "1", NULL, "no pre-division of gradients before the average", NULL),
    REFUSE("sparse_gradients", "false", NULL, "embedding gradients are dense in dsc", NULL),
    /* precision */
    REFUSE("fp16", "enabled=false", FP16_KEYS, NO_MIXED, "\"fp16\": {\"enabled\": false} (f32 training)"),
    REFUSE("bf16", "enabled=false", BF16_KEYS, NO_MIXED, "\"bf16\": {\"enabled\": false} (f32 training)"),
    REFUSE("bfloat16", "enabled=false", BF16_KEYS, NO_MIXED, "\"bf16\": {\"enabled\": false} (f32 training)"),
    REFUSE("amp", "enabled=false", NULL, "NVIDIA Apex AMP is a PyTorch extension", "f32 training"),
    REFUSE("torch_autocast", "enabled=false", "enabled dtype lower_precision_safe_modules",
           "torch.autocast is PyTorch's", "f32 training"),
    SECTION("data_types"),
    REFUSE("data_types.grad_accum_dtype", "null|\"fp32\"", NULL, "gradients accumulate in f32", NULL),
    IMPL("gradient_clipping"),
    /* ZeRO */
    IMPL("zero_optimization"),
    IMPL("zero_optimization.stage"),
    IMPL("zero_optimization.reduce_bucket_size"),
    IMPL("zero_optimization.allgather_bucket_size"),
    IMPL("zero_optimization.overlap_comm"),
    IMPL("zero_optimization.contiguous_gradients"),
    IMPL("zero_optimization.stage3_prefetch_bucket_size"),
    IMPL("zero_optimization.stage3_max_live_parameters"),
    IMPL("zero_optimization.stage3_param_persistence_threshold"),
    IMPL("zero_optimization.offload_optimizer"),
    IMPL("zero_optimization.offload_optimizer.device"),
    IMPL("zero_optimization.offload_param"),
    IMPL("zero_optimization.offload_param.device"),
    IMPL("zero_optimization.cpu_offload"),
    IMPL("optimizer.params.adam_w_mode"),
    IMPL("optimizer.params.bias_correction"),
    IMPL("optimizer.params.max_coeff"),
    IMPL("optimizer.params.min_coeff"),
    REFUSE("optimizer.params.eps_inside_sqrt", "false", NULL,
           "Lamb adds eps outside the square root, as DeepSpeed's "
           "default",
           NULL),
    REFUSE("optimizer.params.amsgrad", "false", NULL, "AMSGrad is not implemented", NULL),
    REFUSE("optimizer.params.nesterov", "false", NULL, "Nesterov momentum is not implemented", NULL),
    REFUSE("optimizer.params.dampening", "0", NULL, "SGD dampening is not implemented", NULL),
    REFUSE("zero_optimization.allgather_partitions", "true", NULL,
           "dsc always all-gathers the updated partitions (DeepSpeed's default)", NULL),
    REFUSE("zero_optimization.reduce_scatter", "true", NULL,
           "stages 2 and 3 always reduce-scatter gradients (DeepSpeed's default)", NULL),
    DESIGN("zero_optimization.load_from_fp32_weights", "dsc checkpoints hold only f32 weights"),
    DESIGN("zero_optimization.elastic_checkpoint",
           "dsc checkpoints restore into any data-parallel size and any ZeRO stage"),
    REFUSE("zero_optimization.grad_hooks", "true", NULL, "dsc's layers report their gradients to ZeRO themselves",
           NULL),
    DESIGN("zero_optimization.round_robin_gradients",
           "orders DeepSpeed's gradient copies for CPU offload; dsc reduces in layer order with the same result"),
    DESIGN("zero_optimization.sub_group_size",
           "bounds DeepSpeed's temporary buffers during the optimizer step; dsc updates each shard in place with "
           "no temporary"),
    DESIGN("zero_optimization.stage3_max_reuse_distance",
           "tunes DeepSpeed's cache of gathered parameters; dsc's stage 3 keeps at most "
           "stage3_max_live_parameters gathered, so the bound it asks for holds"),
    DESIGN("zero_optimization.stage3_gather_16bit_weights_on_model_save",
           "dsc checkpoints always store the whole (gathered) parameters"),
    DESIGN("zero_optimization.stage3_gather_fp16_weights_on_model_save",
           "dsc checkpoints always store the whole (gathered) parameters"),
    DESIGN("zero_optimization.gather_16bit_weights_on_model_save",
           "dsc checkpoints always store the whole (gathered) parameters"),
    DESIGN("zero_optimization.stage3_module_granularity_threshold",
           "groups small PyTorch modules into leaves; dsc gathers per layer already"),
    DESIGN("zero_optimization.memory_efficient_linear", "dsc's linear layers keep only their inputs for backward"),
    DESIGN("zero_optimization.ignore_unused_parameters", "every dsc parameter takes part in every step"),
    DESIGN("zero_optimization.use_multi_rank_bucket_allreduce",
           "a DeepSpeed bucketing variant; dsc's buckets give the same average"),
    DESIGN("zero_optimization.save_muon_momentum_buffer_in_memory",
           "dsc keeps all optimizer state in memory (no NVMe)"),
    DESIGN("zero_optimization.override_module_apply", "PyTorch's Module.apply has no counterpart in dsc"),
    DESIGN("zero_optimization.cpu_offload_use_pin_memory", OFFLOAD_BUFFERS),
    REFUSE("zero_optimization.cpu_offload_param", "false", NULL, "legacy spelling of offload_param",
           "zero_optimization.offload_param.device"),
    REFUSE("zero_optimization.prefetch_bucket_size", NULL, NULL, "DeepSpeed's alias",
           "zero_optimization.stage3_prefetch_bucket_size"),
    REFUSE("zero_optimization.param_persistence_threshold", NULL, NULL, "DeepSpeed's alias",
           "zero_optimization.stage3_param_persistence_threshold"),
    REFUSE("zero_optimization.max_live_parameters", NULL, NULL, "DeepSpeed's alias",
           "zero_optimization.stage3_max_live_parameters"),
    DESIGN("zero_optimization.max_reuse_distance", "alias of stage3_max_reuse_distance (see there)"),
    REFUSE("zero_optimization.stage3_model_persistence_threshold", NULL, NULL,
           "a cap on the total of unpartitioned parameters is not implemented",
           "zero_optimization.stage3_param_persistence_threshold"),
    REFUSE("zero_optimization.stage3_use_all_reduce_for_fetch_params", "false", NULL,
           "stage 3 gathers parameters with all-gather", NULL),
    REFUSE("zero_optimization.stage3_allgather_sequential", "false", NULL,
           "stage 3 gathers a layer's parameters in buckets", NULL),
    REFUSE("zero_optimization.zero_hpz_partition_size", "1", NULL, ZEROPP, NULL),
    REFUSE("zero_optimization.zero_quantized_weights", "false", NULL, ZEROPP, NULL),
    REFUSE("zero_optimization.zero_quantized_nontrainable_weights", "false", NULL, ZEROPP, NULL),
    REFUSE("zero_optimization.zero_quantized_gradients", "false", NULL, ZEROPP, NULL),
    REFUSE("zero_optimization.zeropp_loco_param", "null", NULL, ZEROPP, NULL),
    REFUSE("zero_optimization.mics_shard_size", "-1", NULL, "MiCS sub-group sharding is not implemented",
           "zero_optimization.stage"),
    REFUSE("zero_optimization.mics_hierarchical_params_gather", "false", NULL,
           "MiCS sub-group sharding is not implemented", NULL),
    REFUSE("zero_optimization.legacy_stage1", "false", NULL, "there is one stage 1 implementation", NULL),
    REFUSE("zero_optimization.pipeline_loading_checkpoint", "false", NULL,
           "checkpoints load into every stage the same way", NULL),
    REFUSE("zero_optimization.log_trace_cache_warnings", "false", NULL, "dsc has no trace cache", NULL),
    REFUSE("zero_optimization.enable_sanity_checks", "false", NULL, "DeepSpeed's internal debugging checks", NULL),
    REFUSE("zero_optimization.zenflow", NULL, NULL, "ZenFlow's asynchronous CPU updates are not implemented",
           NULL),
    REFUSE("zero_optimization.leaf_module", NULL, NULL, "dsc gathers per layer; there are no PyTorch leaf modules",
           NULL),
    DESIGN("zero_optimization.offload_optimizer.pin_memory", OFFLOAD_BUFFERS),
    DESIGN("zero_optimization.offload_optimizer.buffer_count", OFFLOAD_BUFFERS),
    DESIGN("zero_optimization.offload_optimizer.fast_init", OFFLOAD_BUFFERS),
    REFUSE("zero_optimization.offload_optimizer.nvme_path", "null", NULL, "NVMe offload is not implemented",
           "device \"cpu\" or \"none\""),
    REFUSE("zero_optimization.offload_optimizer.ratio", "1", NULL, "partial optimizer offload is not implemented",
           NULL),
    DESIGN("zero_optimization.offload_param.pin_memory", OFFLOAD_BUFFERS),
    DESIGN("zero_optimization.offload_param.buffer_count", OFFLOAD_BUFFERS),
    DESIGN("zero_optimization.offload_param.buffer_size", OFFLOAD_BUFFERS),
    DESIGN("zero_optimization.offload_param.max_in_cpu", OFFLOAD_BUFFERS),
    REFUSE("zero_optimization.offload_param.nvme_path", "null", NULL, "NVMe offload is not implemented",
           "device \"cpu\" or \"none\""),
    DESIGN("zero_allow_untested_optimizer", "every dsc optimizer is tested with every ZeRO stage"),
    DESIGN("zero_force_ds_cpu_optimizer", "dsc has one optimizer implementation per update rule"),
    DESIGN("aio", "asynchronous I/O settings serve NVMe offload only, which dsc refuses"),
    /* parallelism DeepSpeed offers that dsc's training does not */
    IMPL("tensor_parallel"),
    IMPL("tensor_parallel.autotp_size"),
    REFUSE("tensor_parallel.tp_overlap_comm", "false", NULL, "tensor-parallel all-reduces are not overlapped",
           NULL),
    REFUSE("tensor_parallel.preset_model", NULL, NULL, "dsc's AutoTP plan is derived from dsc's own model layers",
           "model.arch"),
    REFUSE("tensor_parallel.partition_config", NULL, NULL,
           "dsc's AutoTP plan is derived from dsc's own model layers", "model.arch"),
    REFUSE("hybrid_engine", "enabled=false", NULL, "the RLHF hybrid engine is not implemented", NULL),
    REFUSE("expert_parallel", "enabled=false", NULL,
           "AutoEP converts PyTorch models; dsc builds MoE models itself",
           "model.arch \"gpt-moe\" or \"mixtral\" with moe.ep_size"),
    REFUSE("sequence_parallel_size", "1", NULL, "Ulysses sequence parallelism is not implemented", NULL),
    REFUSE("seq_parallel_communication_data_type", "\"fp32\"|null", NULL,
           "Ulysses sequence parallelism is not implemented", NULL),
    REFUSE("use_data_before_expert_parallelism", "false", NULL, "a data-parallel group ordering not implemented",
           NULL),
    /* pipeline: dsc's own section; DeepSpeed's keys inside it */
    REFUSE("pipeline.partition", NULL, NULL, "dsc names its partitioning differently",
           "pipeline.partition_method"),
    REFUSE("pipeline.seed_layers", "false", NULL, "layers are seeded from the global seed and their name", NULL),
    DESIGN("pipeline.pipe_partitioned", "splits activations over tensor-parallel ranks; dsc's training has none"),
    DESIGN("pipeline.grad_partitioned", "splits gradients over tensor-parallel ranks; dsc's training has none"),
    DESIGN("pipeline.use_reentrant", "PyTorch's activation-checkpoint flavour; dsc recomputes explicitly"),
    /* logging and tools */
    IMPL("steps_per_print"),
    IMPL("wall_clock_breakdown"),
    REFUSE("dump_state", "false", NULL, "dsc has no engine object to print",
           "the effective config is saved in every checkpoint"),
    REFUSE("memory_breakdown", "false", NULL, "not a log line in dsc",
           "the mem_bytes of each step in the metrics file"),
    DESIGN("timers", "dsc prints throughput (tokens/s) every steps_per_print steps"),
    REFUSE("autotuning", "enabled=false", NULL, "the autotuner launches DeepSpeed experiments", NULL),
    REFUSE("flops_profiler", "enabled=false", NULL, "the FLOPs profiler is not implemented yet", NULL),
    REFUSE("comms_logger", "enabled=false", NULL, "the communication logger is not implemented yet", NULL),
    IMPL("tensorboard"),
    IMPL("tensorboard.enabled"),
    IMPL("tensorboard.output_path"),
    IMPL("tensorboard.job_name"),
    IMPL("csv_monitor"),
    IMPL("csv_monitor.enabled"),
    IMPL("csv_monitor.output_path"),
    IMPL("csv_monitor.job_name"),
    REFUSE("wandb", "enabled=false", "enabled group team project",
           "Weights & Biases needs a network connection and a service account",
           "tensorboard or csv_monitor (files written locally)"),
    REFUSE("comet", "enabled=false", NULL, "Comet needs a network connection and a service account",
           "tensorboard or csv_monitor (files written locally)"),
    REFUSE("nebula", "enabled=false", NULL, "Azure Nebula checkpointing is a hosted service",
           "checkpoint.save_dir"),
    /* activation checkpointing: dsc's own switches are model.activation_checkpointing and the pipeline's interval
     */
    SECTION("activation_checkpointing"),
    REFUSE("activation_checkpointing.partition_activations", "false", NULL,
           "splits saved activations over tensor-parallel ranks; dsc's training has none", NULL),
    REFUSE("activation_checkpointing.cpu_checkpointing", "false", NULL, "activation offload is not implemented",
           NULL),
    REFUSE("activation_checkpointing.contiguous_memory_optimization", "false", NULL,
           "a PyTorch allocator workaround", NULL),
    REFUSE("activation_checkpointing.number_checkpoints", "null", NULL,
           "dsc checkpoints every block or every N layers of a stage",
           "model.activation_checkpointing or pipeline.activation_checkpoint_interval"),
    REFUSE("activation_checkpointing.synchronize_checkpoint_boundary", "false", NULL,
           "a CUDA synchronisation for profiling", NULL),
    REFUSE("activation_checkpointing.profile", "false", NULL, "checkpoint profiling is not implemented", NULL),
    /* features of DeepSpeed's model zoo and data pipeline */
    REFUSE("sparse_attention", NULL, NULL, "block-sparse attention is not implemented", "dense attention"),
    REFUSE("data_efficiency", "enabled=false", NULL, "curriculum sampling and random-LTD are not implemented",
           NULL),
    REFUSE("curriculum_learning", "enabled=false", NULL, "curriculum learning is not implemented", NULL),
    REFUSE("progressive_layer_drop", "enabled=false", NULL, "progressive layer dropping is not implemented", NULL),
    REFUSE("eigenvalue", "enabled=false", NULL, "eigenvalue estimation is not implemented", NULL),
    REFUSE("quantize_training", "enabled=false", NULL, "MoQ quantized training is not implemented", NULL),
    REFUSE("compression_training", "**enabled=false", NULL,
           "compression (quantization, pruning, layer reduction) is not implemented", NULL),
    REFUSE("weight_quantization", NULL, NULL, "weight quantization is not implemented", NULL),
    REFUSE("elasticity", "enabled=false", NULL, "elastic batch sizing is not implemented",
           "fixed batch sizes; checkpoints restore into any data-parallel size"),
    DESIGN("dataloader_drop_last",
           "dsc draws every batch whole from the token stream, so there is no last partial batch"),
    REFUSE("compile", "enabled=false", NULL, "torch.compile is PyTorch's", NULL),
    REFUSE("deepcompile", NULL, NULL, "DeepCompile is PyTorch's", NULL),
    /* checkpoint: dsc's own section; DeepSpeed's keys inside it */
    DESIGN("checkpoint.tag_validation", "every rank must agree on the checkpoint it saves or loads, else the job "
                                        "stops with the reason (DeepSpeed's \"Fail\")"),
    DESIGN("checkpoint.load_universal", "dsc checkpoints are universal: any layout restores from them"),
    REFUSE("checkpoint.use_node_local_storage", "false", NULL, "checkpoints go to one shared directory",
           "checkpoint.save_dir"),
    REFUSE("checkpoint.parallel_write", "pipeline_stage=false", "pipeline_stage",
           "pipeline stages write their own parameters already", NULL),
};

const dsc_ds_key *dsc_config_deepspeed_keys(size_t *count) {
    *count = sizeof keys / sizeof keys[0];
    return keys;
}
