/* The config schema: every key dsc accepts, with its type, default, range and
 * meaning, as one table. Validation, defaults, suggestions, the JSON written
 * into checkpoints and the reference table in docs/config.md all come from
 * here, so adding a key is one line plus a field in dsc_config. This file does
 * not parse or check anything itself. */
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "runtime/config/config_impl.h"

#define FIELD(f) offsetof(dsc_config, f), sizeof(((dsc_config *)0)->f)
#define SECTION(path, doc)                                                                                        \
    { path, DSC_CONFIG_KIND_OBJECT, 0, 0, NULL, 0, 0, NULL, 0, doc }
#define BOOL(path, f, def, flags, doc)                                                                            \
    { path, DSC_CONFIG_KIND_BOOL, FIELD(f), def, 0, 0, NULL, flags, doc }
#define INT(path, f, def, lo, hi, flags, doc)                                                                     \
    { path, DSC_CONFIG_KIND_INT, FIELD(f), def, lo, hi, NULL, flags, doc }
#define FLOAT(path, f, def, lo, hi, flags, doc)                                                                   \
    { path, DSC_CONFIG_KIND_FLOAT, FIELD(f), def, lo, hi, NULL, flags, doc }
#define FLOATS(path, f, def, lo, hi, flags, doc)                                                                  \
    { path, DSC_CONFIG_KIND_FLOATS, FIELD(f), def, lo, hi, NULL, flags, doc }
#define STRING(path, f, def, doc)                                                                                 \
    { path, DSC_CONFIG_KIND_STRING, FIELD(f), def, 0, 0, NULL, 0, doc }
#define ENUM(path, f, def, choices, flags, doc)                                                                   \
    { path, DSC_CONFIG_KIND_ENUM, FIELD(f), def, 0, 0, choices, flags, doc }

/* DeepSpeed's monitor sections share their three keys. */
#define MONITOR(name, f, doc, enabled_doc)                                                                        \
    SECTION(name, doc), BOOL(name ".enabled", f.enabled, "false", 0, enabled_doc),                                \
        STRING(name ".output_path", f.output_path, "\"\"",                                                        \
               "Directory of the job directory; \"\" is the working directory."),                                 \
        STRING(name ".job_name", f.job_name, "\"DeepSpeedJobName\"",                                              \
               "Sub-directory of output_path for the files.")

#define INF INFINITY
#define NUL DSC_CONFIG_NULLABLE
#define GT DSC_CONFIG_MIN_EXCLUSIVE
#define LT DSC_CONFIG_MAX_EXCLUSIVE
#define I32 2147483647.0
#define I53 9007199254740992.0 /* largest integer a JSON double holds exactly */

/* Enum names; the index is the C enum value. Matching is case-insensitive so
 * DeepSpeed's spelling ("AdamW") is accepted. */
static const char *const archs[] = {"gpt", "llama", "gpt-moe", "mixtral", NULL};
static const char *const optimizers[] = {"adamw", "sgd", "adam", "lamb", "lion", "muon", NULL};
static const char *const ns_methods[] = {"gram", "standard", NULL};
static const char *const offload_devices[] = {"none", "cpu", "nvme", NULL};
static const char *const lr_schedules[] = {
    "constant", "WarmupLR", "WarmupDecayLR", "WarmupCosineLR", "OneCycle", "LRRangeTest", NULL};
static const char *const warmup_types[] = {"log", "linear", NULL};
static const char *const pipe_schedules[] = {"1f1b", "gpipe", "interleaved", NULL};
static const char *const noisy_gates[] = {"null", "Jitter", "RSample", NULL};
static const char *const drop_policies[] = {"probs", "position", NULL};
static const char *const backends[] = {"auto", "mpi", "nccl", NULL};
static const char *const comm_dtypes[] = {"null",    "fp32", "fp16",     "bf16", "float32",
                                          "float16", "half", "bfloat16", NULL};

static const dsc_config_key schema[] = {
    INT("train_batch_size", train_batch_size, "null", 1, I53, NUL,
        "Global batch (sequences per optimizer step) = micro * accumulation * data-parallel size."),
    INT("train_micro_batch_size_per_gpu", train_micro_batch_size_per_gpu, "null", 1, I53, NUL,
        "Sequences per forward/backward on one data-parallel rank."),
    INT("gradient_accumulation_steps", gradient_accumulation_steps, "null", 1, I53, NUL,
        "Micro-batches per optimizer step (the pipeline's micro-batch count)."),
    INT("steps_per_print", steps_per_print, "10", 1, I53, 0, "Log loss and throughput every this many steps."),
    INT("seed", seed, "1234", 0, I53, 0, "Seed of every random stream (per rank and purpose)."),
    BOOL("wall_clock_breakdown", wall_clock_breakdown, "false", 0,
         "Print each logged step's time in forward, backward, p2p, reduce and optimizer (rank 0)."),
    FLOAT("gradient_clipping", gradient_clipping, "0", 0, INF, 0,
          "Clip the global gradient norm to this value; 0 disables clipping."),

    SECTION("model", "The transformer."),
    ENUM("model.arch", model.arch, "\"gpt\"", archs, 0,
         "gpt (LayerNorm, GELU, learned positions), llama (RMSNorm, SwiGLU, RoPE, GQA), gpt-moe, mixtral."),
    INT("model.n_layer", model.n_layer, "12", 1, I32, 0, "Transformer blocks."),
    INT("model.d_model", model.d_model, "768", 1, I32, 0, "Hidden size C."),
    INT("model.n_head", model.n_head, "12", 1, I32, 0, "Attention heads; must divide d_model."),
    INT("model.n_kv_head", model.n_kv_head, "null", 1, I32, NUL,
        "Key/value heads (grouped-query attention); null: n_head. Must divide n_head."),
    INT("model.d_ff", model.d_ff, "null", 1, I32, NUL, "MLP hidden size; null: 4 * d_model."),
    INT("model.vocab_size", model.vocab_size, "50257", 1, I32, 0, "Vocabulary size V."),
    INT("model.seq_len", model.seq_len, "1024", 1, I32, 0, "Sequence length T (and maximum positions)."),
    BOOL("model.tie_embeddings", model.tie_embeddings, "null", NUL,
         "Share the token embedding with the output head; null: true for gpt/gpt-moe, false for llama/mixtral."),
    BOOL("model.activation_checkpointing", model.activation_checkpointing, "false", 0,
         "Blocks keep only input/output; intermediates exist while a block runs (recomputed in backward)."),
    FLOAT("model.rope_theta", model.rope_theta, "10000", 0, INF, GT, "RoPE base (llama, mixtral)."),
    FLOAT("model.norm_eps", model.norm_eps, "1e-05", 0, INF, GT, "Epsilon of LayerNorm / RMSNorm."),
    BOOL("model.qkv_bias", model.qkv_bias, "null", NUL,
         "Bias on the q/k/v projections; null: true for gpt/gpt-moe, false for llama/mixtral."),

    SECTION("optimizer", "DeepSpeed's optimizer section."),
    ENUM("optimizer.type", optimizer.type, "\"adamw\"", optimizers, 0,
         "adamw, adam (adam_w_mode), lamb, lion, sgd (with momentum) or muon (Adam for embeddings, the head and "
         "vectors); DeepSpeed's names, case-insensitive."),
    SECTION("optimizer.params", "Hyper-parameters of the optimizer."),
    FLOAT("optimizer.params.lr", optimizer.params.lr, "0.001", 0, INF, 0,
          "Learning rate (the peak for the warmup schedulers)."),
    FLOATS("optimizer.params.betas", optimizer.params.betas, "[0.9, 0.999]", 0, 1, LT, "Adam's beta1, beta2."),
    FLOAT("optimizer.params.eps", optimizer.params.eps, "1e-08", 0, INF, GT, "Adam's epsilon."),
    FLOAT("optimizer.params.weight_decay", optimizer.params.weight_decay, "0.01", 0, INF, 0,
          "Decoupled weight decay (adamw) or L2 penalty (sgd)."),
    FLOAT("optimizer.params.momentum", optimizer.params.momentum, "0", 0, 1, LT,
          "SGD momentum; muon: its Nesterov momentum, 0.95 when absent."),
    BOOL("optimizer.params.adam_w_mode", optimizer.params.adam_w_mode, "true", 0,
         "adam: decoupled weight decay (AdamW); false adds weight_decay * p to the gradient (L2)."),
    BOOL("optimizer.params.bias_correction", optimizer.params.bias_correction, "true", 0,
         "adam, adamw, lamb: divide the moments by 1 - beta^t."),
    FLOAT("optimizer.params.max_coeff", optimizer.params.max_coeff, "10", 0, INF, GT,
          "lamb: upper clamp of the trust ratio ||p|| / ||update||."),
    FLOAT("optimizer.params.min_coeff", optimizer.params.min_coeff, "0.01", 0, INF, 0,
          "lamb: lower clamp of the trust ratio."),
    FLOAT("optimizer.params.muon_lr", optimizer.params.muon_lr, "null", 0, INF, NUL | GT,
          "muon: learning rate of the Muon parameters; null: lr, or 0.02 when lr is absent."),
    FLOAT("optimizer.params.adam_lr", optimizer.params.adam_lr, "null", 0, INF, NUL | GT,
          "muon: learning rate of the Adam parameters; null: lr, or 3e-4 when lr is absent."),
    ENUM("optimizer.params.ns_method", optimizer.params.ns_method, "\"gram\"", ns_methods, 0,
         "muon: Newton-Schulz on the Gram matrix (gram) or on the matrix itself (standard)."),

    SECTION("scheduler", "DeepSpeed's learning-rate scheduler section."),
    ENUM("scheduler.type", scheduler.type, "\"constant\"", lr_schedules, 0,
         "constant, WarmupLR, WarmupDecayLR, WarmupCosineLR, OneCycle or LRRangeTest (DeepSpeed's semantics)."),
    SECTION("scheduler.params", "Parameters of the scheduler; each type reads the ones it needs."),
    INT("scheduler.params.warmup_num_steps", scheduler.params.warmup_num_steps, "1000", 0, I53, 0,
        "Steps of warmup."),
    INT("scheduler.params.total_num_steps", scheduler.params.total_num_steps, "null", 1, I53, NUL,
        "Step where WarmupDecayLR reaches 0 and WarmupCosineLR its minimum; null: train.steps."),
    FLOAT("scheduler.params.warmup_min_lr", scheduler.params.warmup_min_lr, "0", 0, INF, 0,
          "Start of warmup (WarmupLR, WarmupDecayLR)."),
    FLOAT("scheduler.params.warmup_max_lr", scheduler.params.warmup_max_lr, "0.001", 0, INF, 0,
          "End of warmup (WarmupLR, WarmupDecayLR)."),
    ENUM("scheduler.params.warmup_type", scheduler.params.warmup_type, "\"log\"", warmup_types, 0,
         "Warmup curve: log or linear (WarmupLR, WarmupDecayLR)."),
    FLOAT("scheduler.params.warmup_min_ratio", scheduler.params.warmup_min_ratio, "0", 0, 1, 0,
          "Warmup starts at this fraction of lr (WarmupCosineLR)."),
    FLOAT("scheduler.params.cos_min_ratio", scheduler.params.cos_min_ratio, "0.0001", 0, 1, 0,
          "Cosine ends at this fraction of lr (WarmupCosineLR)."),
    FLOAT("scheduler.params.cycle_min_lr", scheduler.params.cycle_min_lr, "0.01", 0, INF, 0,
          "OneCycle: lr at the start and end of the cycle."),
    FLOAT("scheduler.params.cycle_max_lr", scheduler.params.cycle_max_lr, "0.1", 0, INF, 0,
          "OneCycle: lr at the top of the cycle."),
    FLOAT("scheduler.params.decay_lr_rate", scheduler.params.decay_lr_rate, "0", 0, INF, 0,
          "OneCycle: after the cycle lr = cycle_min_lr / (1 + rate * steps / decay_step_size); 0 keeps it."),
    INT("scheduler.params.cycle_first_step_size", scheduler.params.cycle_first_step_size, "2000", 1, I53, 0,
        "OneCycle: steps from cycle_min_lr up to cycle_max_lr."),
    INT("scheduler.params.cycle_second_step_size", scheduler.params.cycle_second_step_size, "null", 0, I53, NUL,
        "OneCycle: steps back down; null: cycle_first_step_size."),
    INT("scheduler.params.cycle_first_stair_count", scheduler.params.cycle_first_stair_count, "0", 0, I53, 0,
        "OneCycle: stairs on the way up; 0 is a straight line."),
    INT("scheduler.params.cycle_second_stair_count", scheduler.params.cycle_second_stair_count, "null", 0, I53,
        NUL, "OneCycle: stairs on the way down; null: cycle_first_stair_count."),
    INT("scheduler.params.decay_step_size", scheduler.params.decay_step_size, "0", 0, I53, 0,
        "OneCycle: steps per unit of post-cycle decay; 0: no decay."),
    BOOL("scheduler.params.cycle_momentum", scheduler.params.cycle_momentum, "true", 0,
         "OneCycle: cycle beta1 (momentum) from cycle_max_mom down and back, with beta2 0.99, as DeepSpeed."),
    FLOAT("scheduler.params.cycle_min_mom", scheduler.params.cycle_min_mom, "0.8", 0, 1, LT,
          "OneCycle: momentum at the top of the lr cycle."),
    FLOAT("scheduler.params.cycle_max_mom", scheduler.params.cycle_max_mom, "0.9", 0, 1, LT,
          "OneCycle: momentum at the start and end of the cycle."),
    FLOAT("scheduler.params.decay_mom_rate", scheduler.params.decay_mom_rate, "0", 0, INF, 0,
          "OneCycle: after the cycle momentum = cycle_max_mom * (1 + rate * steps / decay_step_size)."),
    FLOAT("scheduler.params.lr_range_test_min_lr", scheduler.params.lr_range_test_min_lr, "0.001", 0, INF, 0,
          "LRRangeTest: the starting lr."),
    INT("scheduler.params.lr_range_test_step_size", scheduler.params.lr_range_test_step_size, "2000", 1, I53, 0,
        "LRRangeTest: steps per unit of increase."),
    FLOAT("scheduler.params.lr_range_test_step_rate", scheduler.params.lr_range_test_step_rate, "1", 0, INF, 0,
          "LRRangeTest: lr = min_lr * (1 + rate * step / step_size)."),
    BOOL("scheduler.params.lr_range_test_staircase", scheduler.params.lr_range_test_staircase, "false", 0,
         "LRRangeTest: grow in whole steps of step_size instead of continuously."),

    SECTION("zero_optimization", "ZeRO sharding (DeepSpeed's keys; sizes in elements)."),
    INT("zero_optimization.stage", zero_optimization.stage, "0", 0, 3, DSC_CONFIG_LISTED,
        "0 off, 1 optimizer state, 2 + gradients, 3 + parameters sharded over data-parallel ranks."),
    INT("zero_optimization.reduce_bucket_size", zero_optimization.reduce_bucket_size, "500000000", 1, I53, 0,
        "Gradient elements per reduction bucket."),
    INT("zero_optimization.allgather_bucket_size", zero_optimization.allgather_bucket_size, "500000000", 1, I53, 0,
        "Parameter elements per all-gather bucket."),
    BOOL("zero_optimization.overlap_comm", zero_optimization.overlap_comm, "null", NUL,
         "Post gradient reductions as non-blocking collectives during backward, waited before the step (stages "
         "0, 1; docs/zero.md); null: on for stage 3."),
    BOOL("zero_optimization.contiguous_gradients", zero_optimization.contiguous_gradients, "true", 0,
         "Gradients in one contiguous buffer: always so in dsc, so false is refused."),
    INT("zero_optimization.stage3_prefetch_bucket_size", zero_optimization.stage3_prefetch_bucket_size, "50000000",
        0, I53, 0, "Stage 3: parameter elements fetched ahead of use."),
    INT("zero_optimization.stage3_max_live_parameters", zero_optimization.stage3_max_live_parameters, "1000000000",
        0, I53, 0, "Stage 3: most gathered parameter elements resident at once."),
    INT("zero_optimization.stage3_param_persistence_threshold",
        zero_optimization.stage3_param_persistence_threshold, "100000", 0, I53, 0,
        "Stage 3: parameters of at most this many elements stay whole on every rank (gathered once per step)."),
    SECTION("zero_optimization.offload_optimizer", "Where the optimizer state lives (DeepSpeed's ZeRO-Offload)."),
    ENUM("zero_optimization.offload_optimizer.device", zero_optimization.offload_optimizer, "\"none\"",
         offload_devices, 0, "none or cpu (a CPU job's state is in host memory already); nvme is refused."),
    SECTION("zero_optimization.offload_param",
            "Where stage 3 keeps parameter shards (DeepSpeed's ZeRO-Infinity)."),
    ENUM("zero_optimization.offload_param.device", zero_optimization.offload_param, "\"none\"", offload_devices, 0,
         "none or cpu (a CPU job's parameters are in host memory already); nvme is refused."),
    BOOL("zero_optimization.cpu_offload", zero_optimization.cpu_offload, "false", 0,
         "DeepSpeed's legacy spelling of offload_optimizer.device cpu."),

    SECTION("pipeline", "Pipeline parallelism."),
    INT("pipeline.stages", pipeline.stages, "1", 1, I32, 0, "Pipeline stages P; 1 disables pipelining."),
    STRING("pipeline.partition_method", pipeline.partition_method, "\"parameters\"",
           "How layers are split over stages: uniform, parameters, or type:REGEX (balance matching layers)."),
    ENUM("pipeline.schedule", pipeline.schedule, "\"1f1b\"", pipe_schedules, 0,
         "Instruction schedule: 1f1b, gpipe or interleaved (needs virtual_stages >= 2)."),
    INT("pipeline.virtual_stages", pipeline.virtual_stages, "1", 1, I32, 0,
        "Model chunks per rank for the interleaved schedule."),
    INT("pipeline.activation_checkpoint_interval", pipeline.activation_checkpoint_interval, "0", 0, I32, 0,
        "Checkpoint every this many layers within a stage; 0 disables."),
    FLOAT("pipeline.p2p_timeout_s", pipeline.p2p_timeout_s, "300", 0, INF, GT,
          "Seconds a stage waits for a peer's activation or gradient before failing."),

    SECTION("tensor_parallel", "Tensor parallelism in training (DeepSpeed's AutoTP keys)."),
    INT("tensor_parallel.autotp_size", tensor_parallel.autotp_size, "1", 1, I32, 0,
        "Tensor-parallel degree: attention split by heads, MLP by width, vocabulary-parallel embedding and loss."),
    BOOL("tensor_parallel.sequence_parallel", tensor_parallel.sequence_parallel, "false", 0,
         "Megatron sequence parallelism: between the tensor-parallel regions each rank holds seq_len / tp "
         "positions (norms, residuals); each all-reduce becomes a reduce-scatter + all-gather."),
    INT("tensor_parallel.tp_grain_size", tensor_parallel.tp_grain_size, "64", 1, I53, 0,
        "Feed-forward and vocabulary widths are split in multiples of this (DeepSpeed's tp_grain_size)."),

    SECTION("moe", "Mixture of experts (DeepSpeed's MoE layer arguments)."),
    INT("moe.num_experts", moe.num_experts, "0", 0, I32, 0, "Experts E per MoE layer; 0 for dense models."),
    INT("moe.ep_size", moe.ep_size, "1", 1, I32, 0, "Expert-parallel group size; must divide num_experts."),
    INT("moe.k", moe.k, "1", 1, I32, 0, "Experts per token (top-k)."),
    FLOAT("moe.capacity_factor", moe.capacity_factor, "1", 0, INF, GT, "Expert capacity factor in training."),
    FLOAT("moe.eval_capacity_factor", moe.eval_capacity_factor, "1", 0, INF, GT,
          "Expert capacity factor in evaluation."),
    INT("moe.min_capacity", moe.min_capacity, "4", 0, I32, 0, "Smallest expert capacity."),
    BOOL("moe.drop_tokens", moe.drop_tokens, "true", 0, "Drop tokens over capacity; false: unlimited capacity."),
    ENUM("moe.noisy_gate_policy", moe.noisy_gate_policy, "null", noisy_gates, NUL,
         "Gate noise in training: null, Jitter (input noise) or RSample (Gumbel, top-1 only)."),
    BOOL("moe.use_rts", moe.use_rts, "true", 0, "Random token selection when dropping (top-1)."),
    BOOL("moe.use_residual", moe.use_residual, "false", 0, "Residual MoE: a dense MLP mixed with the experts."),
    FLOAT("moe.aux_loss_coef", moe.aux_loss_coef, "0.01", 0, INF, 0, "Weight of the load-balancing loss."),
    FLOAT("moe.z_loss_coef", moe.z_loss_coef, "0", 0, INF, 0, "Weight of the router z-loss."),
    INT("moe.layer_freq", moe.layer_freq, "1", 1, I32, 0, "Every layer_freq-th block has a MoE MLP."),
    BOOL("moe.top2_2nd_expert_sampling", moe.top2_2nd_expert_sampling, "true", 0,
         "Top-2: sample the second expert with Gumbel noise."),
    ENUM("moe.drop_policy", moe.drop_policy, "\"probs\"", drop_policies, 0,
         "Which tokens an expert keeps when over capacity: highest probs or earliest position."),
    BOOL(
        "moe.enable_expert_tensor_parallelism", moe.enable_expert_tensor_parallelism, "false", 0,
        "DeepSpeed's MoE argument: split every expert by width over the tensor-parallel group as well (fc/gate/up "
        "by rows, the output projection by columns, one all-reduce each way); false: experts whole, replicated "
        "over the tensor group."),
    BOOL("moe.overlap_alltoall", moe.overlap_alltoall, "true", 0,
         "Training: overlap the exchanges with the expert-parallel group with expert compute, as "
         "point-to-point messages in flight while this rank's own share of the tokens runs through its "
         "experts, instead of blocking all-to-alls (the same results bitwise; docs/moe.md)."),

    SECTION("checkpoint", "Saving and restoring (HDF5)."),
    STRING("checkpoint.save_dir", checkpoint.save_dir, "\"\"", "Directory for checkpoints; \"\" disables saving."),
    INT("checkpoint.save_interval", checkpoint.save_interval, "0", 0, I53, 0,
        "Save every this many steps; 0 saves only at the end."),
    INT("checkpoint.keep_last", checkpoint.keep_last, "0", 0, I32, 0,
        "Keep only the newest this many checkpoints; 0 keeps all."),
    STRING(
        "checkpoint.tag", checkpoint.tag, "\"\"",
        "Name of each save, \"{step}\" replaced by the step (needed with save_interval); \"\": global_step<N>."),

    SECTION("comm", "Communication."),
    FLOAT("comm.timeout_s", comm.timeout_s, "300", 0, INF, GT,
          "Seconds a collective may wait before the job is declared hung."),
    ENUM("comm.backend", comm.backend, "\"auto\"", backends, 0,
         "auto (NCCL for CUDA tensors, else MPI) or mpi; nccl is refused for training, which runs on the CPU."),

    SECTION("data", "Training data."),
    STRING("data.path", data.path, "\"\"",
           "Token file (dsc-train --prepare TEXT OUT makes one); not a directory."),
    FLOAT("data.val_fraction", data.val_fraction, "0", 0, 1, LT, "Fraction of the data held out for evaluation."),

    MONITOR("tensorboard", tensorboard, "TensorBoard event files (DeepSpeed's monitor layout).",
            "Write Train/Samples/train_loss and lr against samples seen, on the logging rank."),
    MONITOR("csv_monitor", csv_monitor, "CSV files, one per event (DeepSpeed's monitor layout).",
            "Write output_path/job_name/Train_Samples_<event>.csv with rows step,value."),

    SECTION("flops_profiler", "DeepSpeed's FLOPs profiler: one step, per layer, on the logging rank."),
    BOOL("flops_profiler.enabled", flops_profiler.enabled, "false", 0, "Profile one training step."),
    INT("flops_profiler.profile_step", flops_profiler.profile_step, "1", 0, I53, 0,
        "Profile the step after this many steps (DeepSpeed's global_steps; 1 skips the first, warm-up step)."),
    INT("flops_profiler.module_depth", flops_profiler.module_depth, "-1", -1, I32, 0,
        "Deepest layer nesting in the detailed table; -1 all."),
    INT("flops_profiler.top_modules", flops_profiler.top_modules, "1", 1, I32, 0,
        "Layers listed per measure (parameters, FLOPs, latency) in the aggregated profile."),
    BOOL("flops_profiler.detailed", flops_profiler.detailed, "true", 0, "Print the per-layer table."),
    FLOAT("flops_profiler.recompute_fwd_factor", flops_profiler.recompute_fwd_factor, "0", 0, 1, 0,
          "Share of the forward recomputed in backward, for DeepSpeed's (3 + factor) * forward estimate."),
    STRING("flops_profiler.output_file", flops_profiler.output_file, "\"\"",
           "Write the profile to this file; empty: standard output."),

    SECTION("comms_logger", "DeepSpeed's communication logger: latency and bandwidth per operation."),
    BOOL("comms_logger.enabled", comms_logger.enabled, "false", 0,
         "Time every collective and point-to-point operation; the logging rank prints the summary at the end."),
    BOOL("comms_logger.verbose", comms_logger.verbose, "false", 0, "Print a line per operation as it completes."),
    BOOL("comms_logger.prof_all", comms_logger.prof_all, "true", 0,
         "Log every operation; false logs none (prof_ops lists are refused)."),
    BOOL("comms_logger.debug", comms_logger.debug, "false", 0,
         "Name each record's communicator (DeepSpeed names the calling function)."),

    SECTION("fp16", "DeepSpeed's fp16 mixed precision: fp32 master weights and optimizer state, fp16 parameters "
                    "and gradients, the layers' matrix products in fp16 with f32 sums, loss scaling."),
    BOOL("fp16.enabled", fp16.enabled, "false", NUL, "Train in fp16 mixed precision; \"auto\" or null: off."),
    FLOAT("fp16.loss_scale", fp16.loss_scale, "0", 0, INF, 0,
          "0: dynamic loss scaling; a positive value: that static scale."),
    INT("fp16.initial_scale_power", fp16.initial_scale_power, "16", 0, 126, 0,
        "The dynamic scale starts at 2^initial_scale_power."),
    INT("fp16.loss_scale_window", fp16.loss_scale_window, "1000", 1, I53, 0,
        "Steps without overflow before the dynamic scale doubles."),
    INT("fp16.hysteresis", fp16.hysteresis, "2", 1, I32, 0,
        "Overflows tolerated (steps still skipped) before the dynamic scale halves."),
    BOOL("fp16.consecutive_hysteresis", fp16.consecutive_hysteresis, "false", 0,
         "A step without overflow restores the hysteresis."),
    FLOAT("fp16.min_loss_scale", fp16.min_loss_scale, "1", 0, INF, GT,
          "The dynamic scale never goes below; an overflow there stops training."),
    SECTION("bf16", "DeepSpeed's bf16 mixed precision: fp32 master weights and optimizer state, bf16 parameters "
                    "and gradients, the layers' matrix products in bf16 with f32 sums (as torch.autocast)."),
    BOOL("bf16.enabled", bf16.enabled, "false", NUL, "Train in bf16 mixed precision; \"auto\" or null: off."),
    BOOL("bf16.check_grad_overflow", bf16.check_grad_overflow, "false", 0,
         "Skip steps whose gradients hold inf / nan instead of stopping."),
    ENUM("communication_data_type", communication_data_type, "null", comm_dtypes, NUL,
         "Dtype of the gradient reduction: fp32, fp16 or bf16 (DeepSpeed's aliases float32, float16, half, "
         "bfloat16 too); null: the training dtype."),

    SECTION("train", "The training loop."),
    INT("train.steps", train.steps, "1000", 1, I53, 0, "Optimizer steps to run."),
    INT("train.eval_interval", train.eval_interval, "0", 0, I53, 0, "Evaluate every this many steps; 0 never."),
    INT("train.eval_iters", train.eval_iters, "10", 1, I32, 0, "Batches per evaluation."),
};

const dsc_config_key *dsc_config_schema(size_t *count) {
    *count = sizeof schema / sizeof schema[0];
    return schema;
}

const dsc_config_key *dsc_config_schema_find(const char *path) {
    for (size_t i = 0; i < sizeof schema / sizeof schema[0]; i++)
        if (strcmp(schema[i].path, path) == 0) return &schema[i];
    return NULL;
}

size_t dsc_config_parent_len(const char *path) {
    const char *dot = strrchr(path, '.');
    return dot ? (size_t)(dot - path) : 0;
}
