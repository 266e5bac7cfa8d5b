/* dsc-train: train a model from a JSON config over MPI ranks.
 *
 *   dsc-train CONFIG [--set key=value]... [--metrics FILE.jsonl] [--sample N]
 *             [--prompt TEXT] [--temperature X] [--no-progress] [--report-memory]
 *             [--resume [TAG|latest|auto]] [--init-from-hf HF_DIR]
 *   dsc-train CONFIG [--set key=value]... --estimate-memory RANKS
 *   dsc-train --plot METRICS.jsonl OUT.svg
 *   dsc-train --prepare TEXT OUT.tok [--tokenizer tokenizer.json]
 *
 * Every rank runs the same command (mpirun / dsc-launch start them). Rank 0
 * prints the step lines, writes the metrics and, at the end, a sample
 * generated from the trained model. A thin CLI: the wiring is dsc_trainer
 * (runtime/engine), the loop is dsc_engine.
 *
 * Preemption: SIGTERM, or SIGUSR2 (what dsc-launch makes of the SIGTERM or
 * SIGINT it gets; mpirun relays it to every rank), stops the run after the
 * step in progress, with a checkpoint when checkpoint.save_dir is set, and
 * exit status 0; `--resume auto` continues from it. */
#define _POSIX_C_SOURCE 200809L /* sigaction */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/checkpoint.h"
#include "dsc/cli.h"
#include "dsc/comm.h"
#include "dsc/config.h"
#include "dsc/data.h"
#include "dsc/engine.h"
#include "dsc/hf.h"
#include "dsc/kernels.h"
#include "dsc/moe.h"
#include "dsc/pipe.h"
#include "dsc/sampling.h"
#include "dsc/tokenizer.h"
#include "dsc/topology.h"
#include "dsc/tp_layers.h"
#include "dsc/zero.h"

typedef struct args {
    const char *config;
    const char **overrides;
    int n_overrides;
    const char *metrics;
    int sample_tokens;
    const char *prompt;
    float temperature;
    bool progress;
    bool report_memory; /* per-rank allocator accounting beside ZeRO's formula, after training */
    int estimate_ranks; /* > 0: print ZeRO's per-rank memory for this many ranks and exit */
    const char *resume; /* checkpoint tag to resume from ("latest"; "auto": latest when one exists); NULL: fresh */
    const char *init_from_hf; /* Hugging Face model directory the parameters start from */
} args;

static void usage(FILE *fp) {
    fputs("usage: dsc-train CONFIG [--set key=value]... [--metrics FILE.jsonl] [--sample N]\n"
          "                 [--prompt TEXT] [--temperature X] [--no-progress] [--report-memory]\n"
          "                 [--resume [TAG|latest|auto]] [--init-from-hf HF_DIR]\n"
          "       dsc-train CONFIG [--set key=value]... --estimate-memory RANKS\n"
          "       dsc-train --plot METRICS.jsonl OUT.svg\n"
          "       dsc-train --prepare TEXT OUT.tok [--tokenizer tokenizer.json]\n"
          "  --set key=value      override a config key (repeatable)\n"
          "  --metrics FILE       JSON-lines metrics, one line per step (rank 0)\n"
          "  --sample N           tokens of the sample printed after training (200; 0: none)\n"
          "  --prompt TEXT        the sample's prompt (a newline); --temperature X (0.8; 0: greedy)\n"
          "  --resume [TAG]       continue from checkpoint.save_dir/TAG (latest); --resume auto: from\n"
          "                       the latest checkpoint when one exists, else start fresh\n"
          "  --init-from-hf DIR   start from a Hugging Face Llama/Mistral/Qwen2/Mixtral checkpoint\n"
          "  --estimate-memory N  ZeRO's per-rank memory for N ranks, without training\n"
          "  --report-memory      measured per-rank memory after training; --no-progress: no bar\n"
          "  --prepare            text -> token file (byte tokenizer, or a tokenizer.json)\n"
          "  --plot               loss curve of a metrics file as SVG\n",
          fp);
}

/* After --resume: a tag, unless it is an option or the config file. */
static bool is_tag(const char *word) {
    size_t n = strlen(word);
    return word[0] != '-' && !(n > 5 && strcmp(word + n - 5, ".json") == 0);
}

static dsc_status parse_args(int argc, char **argv, args *a) {
    *a = (args){.sample_tokens = 200, .prompt = "\n", .temperature = 0.8f, .progress = true};
    a->overrides = calloc((size_t)argc, sizeof *a->overrides);
    DSC_CHECK(a->overrides, DSC_ERR_NOMEM, "out of memory");
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        static const char *const with_value[] = {"--set",         "--metrics",         "--sample",      "--prompt",
                                                 "--temperature", "--estimate-memory", "--init-from-hf"};
        for (size_t k = 0; k < sizeof with_value / sizeof with_value[0]; k++)
            DSC_CHECK(strcmp(arg, with_value[k]) != 0 || i + 1 < argc, DSC_ERR_INVALID, "option %s needs a value",
                      arg);
        int64_t v;
        double x;
        if (strcmp(arg, "--set") == 0)
            a->overrides[a->n_overrides++] = argv[++i];
        else if (strcmp(arg, "--metrics") == 0)
            a->metrics = argv[++i];
        else if (strcmp(arg, "--sample") == 0) {
            DSC_TRY(dsc_cli_int(arg, argv[++i], 0, 1 << 20, &v));
            a->sample_tokens = (int)v;
        } else if (strcmp(arg, "--prompt") == 0)
            a->prompt = argv[++i];
        else if (strcmp(arg, "--temperature") == 0) {
            DSC_TRY(dsc_cli_double(arg, argv[++i], 0, 100, &x));
            a->temperature = (float)x;
        } else if (strcmp(arg, "--no-progress") == 0)
            a->progress = false;
        else if (strcmp(arg, "--report-memory") == 0)
            a->report_memory = true;
        else if (strcmp(arg, "--estimate-memory") == 0) {
            DSC_TRY(dsc_cli_int(arg, argv[++i], 1, 1 << 24, &v));
            a->estimate_ranks = (int)v;
        } else if (strcmp(arg, "--resume") == 0)
            a->resume = i + 1 < argc && is_tag(argv[i + 1]) ? argv[++i] : "latest";
        else if (strcmp(arg, "--init-from-hf") == 0)
            a->init_from_hf = argv[++i];
        else if (arg[0] == '-')
            return dsc_error(DSC_ERR_INVALID, "unknown option %s", arg);
        else if (!a->config)
            a->config = arg;
        else
            return dsc_error(DSC_ERR_INVALID, "a second config file %s (the first is %s)", arg, a->config);
    }
    DSC_CHECK(a->config, DSC_ERR_INVALID, "no config file given");
    return NULL;
}

/* Continues a prompt: the data-parallel trainer's generation or the pipeline's. */
typedef dsc_status (*generate_fn)(void *model, const int32_t *prompt, int n_prompt, int n_new, float temperature,
                                  uint64_t seed, int32_t *out);

static dsc_status trainer_generate(void *t, const int32_t *prompt, int n_prompt, int n_new, float temperature,
                                   uint64_t seed, int32_t *out) {
    return dsc_trainer_generate(t, prompt, n_prompt, n_new, temperature, seed, out);
}

static void print_sample(generate_fn generate, void *model, const dsc_config *cfg, const args *a, bool show) {
    size_t n_prompt = strlen(a->prompt);
    if (a->sample_tokens == 0 || n_prompt == 0) return;
    if (cfg->model.vocab_size < DSC_BYTE_VOCAB_SIZE) {
        if (show)
            printf("dsc-train: no sample: the byte tokenizer needs model.vocab_size >= %d (it is %d)\n",
                   DSC_BYTE_VOCAB_SIZE, cfg->model.vocab_size);
        return;
    }
    int32_t *ids = malloc((n_prompt + (size_t)a->sample_tokens) * sizeof *ids);
    uint32_t *bytes = malloc(n_prompt * sizeof *bytes);
    char *text = malloc(n_prompt + (size_t)a->sample_tokens + 1);
    dsc_status s = ids && bytes && text ? NULL : dsc_error(DSC_ERR_NOMEM, "sample: out of memory");
    if (!s) {
        dsc_byte_tokenizer_encode(a->prompt, n_prompt, bytes);
        for (size_t i = 0; i < n_prompt; i++)
            ids[i] = (int32_t)bytes[i];
        s = generate(model, ids, (int)n_prompt, a->sample_tokens, a->temperature, cfg->seed, ids);
    }
    if (!s && show) {
        dsc_byte_tokenizer_decode(ids, (int64_t)n_prompt + a->sample_tokens, text,
                                  n_prompt + (size_t)a->sample_tokens + 1);
        printf("---- sample (%d tokens, temperature %.2f) ----\n%s\n----\n", a->sample_tokens, a->temperature,
               text);
    } else if (s) {
        fprintf(stderr, "dsc-train: sample: %s\n", dsc_status_message(s));
        dsc_status_free(s);
    }
    free(ids);
    free(bytes);
    free(text);
}

/* Optimizer bytes per parameter as allocated: the state, and with fp16 / bf16 the fp32 master. */
static int state_bytes(const dsc_config *cfg) {
    return 4 * dsc_optim_state_kinds(cfg->optimizer.type) + (cfg->fp16.enabled || cfg->bf16.enabled ? 4 : 0);
}

/* For the estimate: DeepSpeed's mixed-precision model states (2-byte parameters and gradients). */
static int estimate_bytes(const dsc_config *cfg) {
    if (!cfg->fp16.enabled && !cfg->bf16.enabled) return state_bytes(cfg);
    return 4 * dsc_optim_state_kinds(cfg->optimizer.type) | DSC_ZERO_MIXED_PRECISION;
}

/* The job's config: the file with --set overrides, and with --init-from-hf
 * the model section of the Hugging Face checkpoint. */
static dsc_status load_config(const args *a, const dsc_hf_import *hf, dsc_config *cfg) {
    if (hf) return dsc_hf_import_config(hf, a->config, a->overrides, a->n_overrides, cfg);
    return dsc_config_load_file(a->config, a->overrides, a->n_overrides, cfg);
}

/* ZeRO's per-rank model-state memory for every stage, from the config alone:
 * with tensor parallelism a rank's non-expert share is
 * (Ψ_dense - replicated) / tp + replicated; its experts are the whole
 * experts of its expert-parallel share, or 1/tp of them (but their proj
 * biases) when moe.enable_expert_tensor_parallelism splits them. */
static dsc_status estimate(const args *a) {
    dsc_config cfg;
    dsc_hf_import *hf = NULL;
    if (a->init_from_hf) DSC_TRY(dsc_hf_import_open(a->init_from_hf, &hf));
    dsc_status loaded = load_config(a, hf, &cfg);
    dsc_hf_import_close(hf);
    DSC_TRY(loaded);
    dsc_model_config mc;
    dsc_zero_model_size size;
    const bool moe = cfg.moe.num_experts > 0;
    dsc_moe_build_extra mx = {0}; /* no expert-parallel group: the whole model's experts */
    dsc_status s = dsc_trainer_model_config(&cfg, &mc);
    if (!s && moe) s = dsc_moe_register_layers();
    if (!s && moe) s = dsc_moe_options_from_config(&cfg.moe, mc.arch, &mx.options);
    if (!s) s = dsc_zero_model_size_of_extra(&mc, moe ? &mx : NULL, &size);
    int pp = cfg.pipeline.stages, ep = cfg.moe.ep_size > 0 ? cfg.moe.ep_size : 1;
    const int tp = cfg.tensor_parallel.autotp_size;
    if (!s && a->estimate_ranks % (pp * tp) != 0)
        s = dsc_error(
            DSC_ERR_CONFIG,
            "--estimate-memory %d: world = pp x tp x dp, and %d is not a multiple of pipeline.stages %d x "
            "tensor_parallel.autotp_size %d",
            a->estimate_ranks, a->estimate_ranks, pp, tp);
    const int dp = a->estimate_ranks / (pp * tp);
    if (!s && tp > 1) {
        /* A tensor rank holds the replicated parameters and 1/tp of the rest; ZeRO then shards that over dp. */
        const bool split = moe && cfg.moe.enable_expert_tensor_parallelism;
        const double whole = size.params, experts = size.expert_params;
        const double dense = dsc_tp_params_per_rank(&mc, cfg.moe.use_residual, whole - experts, tp);
        size.expert_params = dsc_tp_expert_params_per_rank(&mc, experts, tp, split);
        size.params = dense + size.expert_params;
        size.largest_layer /= tp;
        printf("tensor parallelism %d: %.0f of %.0f parameters per tensor rank (%.0f replicated", tp, size.params,
               whole, dsc_tp_replicated_params(&mc, cfg.moe.use_residual));
        if (moe)
            printf("; experts %s: %.0f of %.0f", split ? "split by TP" : "whole on every tensor rank",
                   size.expert_params, experts);
        printf(")\n");
    }
    if (!s) {
        dsc_zero_estimate_print(stdout, &size, dp, pp, ep, estimate_bytes(&cfg));
        const int stage = cfg.zero_optimization.stage;
        dsc_zero_memory m;
        dsc_zero_estimate_rank(&size, stage, dp, pp, ep, estimate_bytes(&cfg), &m);
        if (estimate_bytes(&cfg) & DSC_ZERO_MIXED_PRECISION)
            printf("(DeepSpeed's mixed-precision model states; dsc's CPU training stores the bf16/fp16 working "
                   "parameters and gradients in 4-byte floats, 2 more bytes each per element)\n");
        printf("per rank at ZeRO stage %d: %.0f parameters (%.0f in experts), %.0f bytes of model states\n", stage,
               (size.params - size.expert_params) / pp + size.expert_params / pp / ep,
               size.expert_params / pp / ep, m.params + m.grads + m.optim);
    }
    dsc_config_free(&cfg);
    return s;
}

/* DeepSpeed's moe.enable_expert_tensor_parallelism with tensor parallelism:
 * every expert split over the tensor group with the dense MLP's cut of
 * d_ff. Without it (or at TP 1) the experts stay whole on every tensor rank. */
static dsc_status split_experts(const dsc_config *cfg, dsc_groups *groups, dsc_moe_options *o) {
    const int tp = cfg->tensor_parallel.autotp_size;
    if (!cfg->moe.enable_expert_tensor_parallelism || tp == 1) return NULL;
    dsc_model_config mc;
    DSC_TRY(dsc_trainer_model_config(cfg, &mc));
    o->expert_tp = dsc_groups_get(groups, DSC_GROUP_KIND_TENSOR);
    return dsc_tp_split_width(mc.d_ff, tp, cfg->tensor_parallel.tp_grain_size, dsc_comm_rank(o->expert_tp),
                              "the experts' hidden width (moe.enable_expert_tensor_parallelism)", &o->tp_f0,
                              &o->tp_nf);
}

/* MoE models (moe.num_experts > 0): DeepSpeed's expert-parallel and
 * expert-data-parallel groups for moe.ep_size, the MoE layer options and the
 * "moe_block" layer type, for the trainer; with tensor parallelism also the
 * tensor-parallel layers (attention by heads, experts whole or split). */
typedef struct moe_wiring {
    dsc_group_plan plan;
    dsc_groups *groups;
    dsc_moe_build_extra extra;
    dsc_tp_build_extra tp;
    dsc_trainer_layers layers;
} moe_wiring;

static dsc_status moe_wire(const dsc_config *cfg, dsc_comm *world, moe_wiring *w) {
    const int size = dsc_comm_size(world), tp = cfg->tensor_parallel.autotp_size;
    DSC_CHECK(size % tp == 0, DSC_ERR_CONFIG,
              "%s: world = pp x tp x dp: %d ranks are not divisible by tensor_parallel.autotp_size %d",
              cfg->source ? cfg->source : "config", size, tp);
    DSC_TRY(dsc_moe_check_parallel(cfg->moe.num_experts, cfg->moe.ep_size, size / tp));
    DSC_TRY(dsc_moe_options_from_config(&cfg->moe, cfg->model.arch, &w->extra.options));
    DSC_TRY(dsc_moe_register_layers());
    /* Under TP the tensor ranks see the same tokens, so expert-parallel groups
     * are cut from the data-parallel groups (DeepSpeed's rule when it has an mpu). */
    dsc_parallel_dims dims = {.pp = 1, .tp = tp, .ep = cfg->moe.ep_size, .expert_tp = tp > 1};
    DSC_TRY(dsc_groups_plan(size, dsc_comm_rank(world), &dims, &w->plan));
    DSC_TRY(dsc_groups_create(world, &w->plan, &w->groups));
    if (tp > 1) DSC_TRY(dsc_tp_prepare(cfg, w->groups, &w->tp, &w->layers));
    DSC_TRY(split_experts(cfg, w->groups, &w->extra.options));
    w->extra.ep = dsc_groups_get(w->groups, DSC_GROUP_KIND_EXPERT);
    w->layers.build_extra = &w->extra;
    w->layers.expert_dp = dsc_groups_get(w->groups, DSC_GROUP_KIND_EXPERT_DATA);
    w->layers.ep = w->extra.ep;
    return NULL;
}

/* --resume auto: whether checkpoint.save_dir has a checkpoint to resume (rank 0 looks, every rank follows). */
static dsc_status have_checkpoint(const dsc_checkpointer_options *co, bool *found) {
    const char *dir = co->cfg->checkpoint.save_dir;
    DSC_CHECK(dir[0], DSC_ERR_CONFIG,
              "--resume auto needs \"checkpoint.save_dir\" (where to look for a checkpoint)");
    int rank, yes = 0;
    MPI_Comm_rank(co->comm, &rank);
    if (rank == 0) {
        char tag[128];
        dsc_status s = dsc_checkpoint_latest(dir, tag, sizeof tag);
        yes = s == NULL;
        dsc_status_free(s);
    }
    MPI_Bcast(&yes, 1, MPI_INT, 0, co->comm);
    *found = yes;
    if (!yes && co->log) printf("dsc-train: --resume auto: no checkpoint in %s, starting fresh\n", dir);
    return NULL;
}

static volatile sig_atomic_t g_stop_signal; /* the signal that asked for a stop; 0: none */

static void on_stop_signal(int sig) {
    g_stop_signal = sig;
}

/* The engine's step-end hook: the checkpointer's saves, then the stop. */
typedef struct step_hook {
    dsc_checkpointer *ckpt; /* NULL: the run saves nothing */
    dsc_comm *world;        /* every rank of the job; its deadline bounds the agreement */
    int signal;             /* the agreed stop signal; 0: none */
} step_hook;

/* The ranks agree after every step whether one of them was signalled (each
 * may get the signal during a different step); on a stop the state of the
 * step just finished is saved, unless that step saved already. */
static dsc_status on_step_end(dsc_engine *e, const dsc_step_metrics *m, void *ctx) {
    step_hook *h = ctx;
    if (h->ckpt) DSC_TRY(dsc_checkpointer_on_step(e, m, h->ckpt));
    int32_t sig = g_stop_signal;
    dsc_tensor flag = dsc_tensor_view(&sig, DSC_DTYPE_I32, 1, (int64_t[]){1}, DSC_CPU);
    dsc_status s = dsc_comm_allreduce(h->world, &flag, DSC_REDUCE_OP_MAX);
    if (s)
        return dsc_error_wrap(s, "agreeing after step %lld whether a rank was asked to stop", (long long)m->step);
    if (!sig) return NULL;
    h->signal = sig;
    if (h->ckpt && dsc_checkpointer_saved_step(h->ckpt) != m->step) DSC_TRY(dsc_checkpointer_save(h->ckpt));
    dsc_engine_request_stop(e);
    return NULL;
}

/* After training: whether a signal stopped it early (rank 0 says so). */
static bool stopped_early(const step_hook *h, const dsc_config *cfg, const dsc_engine *e, bool log) {
    int64_t done = dsc_engine_steps_done(e);
    if (!h->signal || done >= cfg->train.steps) return false;
    if (log)
        printf("dsc-train: stopped by signal %d after step %lld of %lld; %s\n", h->signal, (long long)done,
               (long long)cfg->train.steps,
               h->ckpt ? "run again with --resume auto to continue"
                       : "nothing was saved (no \"checkpoint.save_dir\" in the config)");
    return true;
}

/* Checkpointing when the config saves or the command resumes: the engine's
 * step hook saves (and stops on a signal), and a resume restores before
 * training. Without a resume, --init-from-hf sets the parameters from the
 * Hugging Face checkpoint. */
static dsc_status wire_checkpoints(const args *a, dsc_hf_import *hf, const dsc_checkpointer_options *co,
                                   dsc_comm *world, step_hook *hook, dsc_checkpointer **out) {
    *out = NULL;
    bool resume = a->resume != NULL;
    if (resume && strcmp(a->resume, "auto") == 0) DSC_TRY(have_checkpoint(co, &resume));
    if (resume || co->cfg->checkpoint.save_dir[0]) DSC_TRY(dsc_checkpointer_create(co, out));
    *hook = (step_hook){*out, world, 0};
    dsc_engine_set_hook(co->engine, on_step_end, hook);
    if (resume) return dsc_checkpointer_resume(*out, strcmp(a->resume, "auto") == 0 ? "latest" : a->resume);
    if (!hf) return NULL;
    dsc_checkpoint_state st = {.comm = co->comm, .params = co->params, .optimizer = co->optimizer};
    DSC_TRY(dsc_checkpoint_load_params(&st, dsc_hf_import_read, hf));
    if (co->log) printf("dsc-train: parameters initialised from %s\n", a->init_from_hf);
    return NULL;
}

/* ---- pipelines (pipeline.stages > 1): pipe/'s PP x DP trainer ------------------------ */

typedef struct pipe_model {
    dsc_pipe_trainer *trainer;
    int64_t T, V;
} pipe_model;

/* Every rank of the pipeline computes the same logits (the last stage
 * broadcasts them) and draws the same token from the same stream. */
static dsc_status pipe_generate(void *model, const int32_t *prompt, int n_prompt, int n_new, float temperature,
                                uint64_t seed, int32_t *out) {
    const pipe_model *pm = model;
    float *logits = malloc((size_t)pm->V * sizeof *logits);
    dsc_sample_candidate *scratch = malloc((size_t)pm->V * sizeof *scratch);
    dsc_status s = logits && scratch ? NULL : dsc_error(DSC_ERR_NOMEM, "generate: out of memory");
    dsc_rng rng;
    dsc_rng_init(&rng, seed, 0, DSC_RNG_SAMPLE);
    dsc_sampling_params sp = {temperature > 0 ? temperature : 0.0f, 0, 1.0f, 1.0f};
    dsc_tensor row = dsc_tensor_view(logits, DSC_DTYPE_F32, 1, &pm->V, DSC_CPU);
    memcpy(out, prompt, (size_t)n_prompt * sizeof *out);
    for (int i = n_prompt; i < n_prompt + n_new && !s; i++) {
        int64_t len = i < pm->T ? i : pm->T; /* the newest seq_len tokens */
        dsc_tensor tokens = dsc_tensor_view(out + (i - len), DSC_DTYPE_I32, 2, (int64_t[]){1, len}, DSC_CPU);
        s = dsc_pipe_runner_logits(dsc_pipe_trainer_runner(pm->trainer), &tokens, &row);
        if (!s) s = dsc_sample(&out[i], logits, (int32_t)pm->V, &sp, NULL, 0, scratch, &rng);
    }
    free(logits);
    free(scratch);
    return s;
}

/* " (N in rank 0's shard)" when expert or tensor parallelism splits the
 * model's `total` parameters so that rank 0 holds `per_rank`; "" otherwise. */
static void held_per_rank(int64_t total, int64_t per_rank, char *buf, size_t len) {
    buf[0] = '\0';
    if (per_rank != total) snprintf(buf, len, " (%lld in rank 0's shard)", (long long)per_rank);
}

/* MoE blocks inside pipeline stages: all-to-alls over the stage's
 * expert-parallel group. */
static dsc_status pipe_moe_prepare(const dsc_config *cfg, dsc_groups *groups, void *ctx, const void **extra) {
    dsc_moe_build_extra *x = ctx;
    int stage_ranks = dsc_comm_size(dsc_groups_get(groups, DSC_GROUP_KIND_DATA));
    DSC_TRY(dsc_moe_check_parallel(cfg->moe.num_experts, cfg->moe.ep_size, stage_ranks));
    DSC_TRY(dsc_moe_options_from_config(&cfg->moe, cfg->model.arch, &x->options));
    DSC_TRY(dsc_moe_register_layers());
    DSC_TRY(split_experts(cfg, groups, &x->options));
    x->ep = dsc_groups_get(groups, DSC_GROUP_KIND_EXPERT);
    *extra = x;
    return NULL;
}

static dsc_status train_pipeline(const args *a, dsc_hf_import *hf, dsc_comm *world, dsc_config *cfg) {
    int rank = dsc_comm_rank(world), size = dsc_comm_size(world), P = cfg->pipeline.stages;
    const int tp = cfg->tensor_parallel.autotp_size, dp = size / (P * tp);
    DSC_CHECK(size % (P * tp) == 0, DSC_ERR_CONFIG,
              "%s: world = pp x tp x dp: %d ranks are not divisible by \"pipeline.stages\" %d x "
              "\"tensor_parallel.autotp_size\" %d",
              a->config, size, P, tp);
    DSC_TRY(dsc_comm_set_timeout(world, cfg->comm.timeout_s));
    DSC_TRY(dsc_config_resolve_batch(cfg, dp));
    const bool moe = cfg->moe.num_experts > 0;
    dsc_moe_build_extra extra = {0};
    dsc_tp_build_extra tp_extra = {0};
    dsc_pipe_trainer_options po = {cfg,
                                   world,
                                   rank == 0,
                                   a->metrics,
                                   a->progress,
                                   {.prepare_build = moe ? pipe_moe_prepare : NULL,
                                    .ctx = &extra,
                                    .make_optimizer = dsc_zero_make_optimizer,
                                    .prepare_tp = dsc_tp_prepare,
                                    .tp_ctx = &tp_extra}};
    dsc_pipe_trainer *t;
    DSC_TRY(dsc_pipe_trainer_create(&po, &t));
    const dsc_pipe_module *m = dsc_pipe_trainer_module(t);
    dsc_status s = NULL;
    if (rank == 0) {
        char held[96];
        held_per_rank(dsc_pipe_module_unique_params(m), dsc_pipe_module_rank_params(m), held, sizeof held);
        printf(
            "dsc-train: %s, %lld parameters%s, %d pipeline stages x %d data-parallel ranks x %d tensor-parallel x "
            "%d threads; batch %lld sequences = %lld micro x %lld micro-batches x %d replicas, seq_len %d; %lld "
            "steps\n",
            a->config, (long long)dsc_pipe_module_unique_params(m), held, P, dp, tp, dsc_kernels_get_num_threads(),
            (long long)cfg->train_batch_size, (long long)cfg->train_micro_batch_size_per_gpu,
            (long long)cfg->gradient_accumulation_steps, dp, cfg->model.seq_len, (long long)cfg->train.steps);
        dsc_pipe_module_print_summary(m, cfg->train_micro_batch_size_per_gpu, cfg->model.seq_len, stdout);
        if (tp > 1) s = dsc_tp_print_shards(stdout, cfg);
        fflush(stdout);
    }
    dsc_checkpointer_options co = {cfg,
                                   dsc_pipe_trainer_engine(t),
                                   dsc_pipe_trainer_params(t),
                                   dsc_pipe_trainer_optimizer(t),
                                   MPI_COMM_WORLD,
                                   P,
                                   dp,
                                   moe ? cfg->moe.ep_size : 1,
                                   dsc_pipe_trainer_rng(t),
                                   1,
                                   rank == 0};
    dsc_checkpointer *ckpt = NULL;
    step_hook hook = {0};
    if (!s) s = wire_checkpoints(a, hf, &co, world, &hook, &ckpt);
    if (!s && tp > 1)
        s = dsc_tp_sync_rng(dsc_groups_get(dsc_pipe_trainer_groups(t), DSC_GROUP_KIND_TENSOR),
                            dsc_pipe_trainer_rng(t));
    if (!s) s = dsc_engine_train(dsc_pipe_trainer_engine(t));
    if (!s && stopped_early(&hook, cfg, dsc_pipe_trainer_engine(t), rank == 0)) {
        dsc_checkpointer_destroy(ckpt);
        dsc_pipe_trainer_destroy(t);
        return NULL;
    }
    int n_layers;
    dsc_layer *const *layers = dsc_pipe_trainer_layers(t, &n_layers);
    if (!s && moe)
        s = dsc_moe_report_load(world, dsc_groups_get(dsc_pipe_trainer_groups(t), DSC_GROUP_KIND_TENSOR),
                                cfg->model.n_layer, cfg->moe.num_experts, layers, n_layers, stdout);
    if (!s && a->report_memory) {
        dsc_param_store *ps = dsc_pipe_trainer_params(t);
        double psi = 0; /* this stage's parameters */
        for (int i = 0; i < dsc_params_count(ps); i++)
            psi += (double)dsc_param_numel(dsc_params_at(ps, i));
        s = dsc_zero_memory_report(stdout, world, cfg->zero_optimization.stage, psi, dp, state_bytes(cfg));
    }
    pipe_model pm = {t, cfg->model.seq_len, cfg->model.vocab_size};
    if (!s && ((moe && cfg->moe.ep_size > 1) || tp > 1)) {
        if (rank == 0 && a->sample_tokens > 0)
            printf("dsc-train: no sample: %s generation is not wired into pipelines (use dsc-generate on the "
                   "checkpoint)\n",
                   tp > 1 ? "tensor-parallel" : "expert-parallel");
    } else if (!s) {
        print_sample(pipe_generate, &pm, cfg, a, rank == 0); /* collective: every stage takes part */
    }
    dsc_checkpointer_destroy(ckpt);
    dsc_pipe_trainer_destroy(t);
    return s;
}

static dsc_status train(const args *a, dsc_hf_import *hf, dsc_comm *world) {
    dsc_config cfg;
    DSC_TRY(load_config(a, hf, &cfg));
    if (cfg.pipeline.stages > 1) {
        dsc_status s = train_pipeline(a, hf, world, &cfg);
        dsc_config_free(&cfg);
        return s;
    }
    int rank = dsc_comm_rank(world), size = dsc_comm_size(world);
    dsc_trainer *t = NULL;
    dsc_status s = dsc_comm_set_timeout(world, cfg.comm.timeout_s);
    const int tp = cfg.tensor_parallel.autotp_size, dp = size / (tp > 0 ? tp : 1);
    const bool moe = cfg.moe.num_experts > 0;
    dsc_tp_wiring tw = {0};
    moe_wiring mw = {0};
    if (!s && moe) s = moe_wire(&cfg, world, &mw);
    if (!s && !moe && tp > 1) s = dsc_tp_wire(&cfg, world, &tw);
    if (!s) s = dsc_config_resolve_batch(&cfg, dp);
    dsc_comm *dp_group = world;
    if (!s && tp > 1) dp_group = moe ? dsc_groups_get(mw.groups, DSC_GROUP_KIND_DATA) : dsc_tp_wiring_dp(&tw);
    dsc_trainer_options to = {&cfg, dp_group, rank == 0, a->metrics, a->progress};
    const dsc_trainer_layers *layers = moe ? &mw.layers : tp > 1 ? &tw.layers : NULL;
    if (!s) s = dsc_trainer_create_with_layers(&to, dsc_zero_make_optimizer, layers, &t);
    if (!s && rank == 0) {
        char held[96];
        held_per_rank(dsc_trainer_model_param_count(t), dsc_trainer_param_count(t), held, sizeof held);
        printf("dsc-train: %s, %lld parameters%s, %d tensor-parallel x %d data-parallel ranks x %d threads; "
               "batch %lld sequences = %lld micro x %lld accumulation x %d replicas, seq_len %d; %lld steps\n",
               a->config, (long long)dsc_trainer_model_param_count(t), held, tp, dp, dsc_kernels_get_num_threads(),
               (long long)cfg.train_batch_size, (long long)cfg.train_micro_batch_size_per_gpu,
               (long long)cfg.gradient_accumulation_steps, dp, cfg.model.seq_len, (long long)cfg.train.steps);
        if (tp > 1) s = dsc_tp_print_shards(stdout, &cfg);
        fflush(stdout);
    }
    dsc_checkpointer *ckpt = NULL;
    step_hook hook = {0};
    if (!s) {
        dsc_checkpointer_options co = {&cfg,
                                       dsc_trainer_engine(t),
                                       dsc_trainer_params(t),
                                       dsc_trainer_optimizer(t),
                                       MPI_COMM_WORLD,
                                       1,
                                       dp,
                                       moe ? cfg.moe.ep_size : 1,
                                       dsc_trainer_rng(t),
                                       1,
                                       rank == 0};
        s = wire_checkpoints(a, hf, &co, world, &hook, &ckpt);
    }
    if (!s && tp > 1) s = dsc_tp_sync_rng(moe ? mw.tp.group : tw.extra.group, dsc_trainer_rng(t));
    if (!s) s = dsc_engine_train(dsc_trainer_engine(t));
    /* preempted: the reports and the sample would only delay the exit */
    const bool finished = !s && !stopped_early(&hook, &cfg, dsc_trainer_engine(t), rank == 0);
    if (!s && finished && moe) {
        int n_layers;
        dsc_layer *const *layers = dsc_trainer_model_layers(t, &n_layers);
        s = dsc_moe_report_load(world, dsc_groups_get(mw.groups, DSC_GROUP_KIND_TENSOR), cfg.model.n_layer,
                                cfg.moe.num_experts, layers, n_layers, stdout);
    }
    if (!s && finished && a->report_memory)
        s = dsc_zero_memory_report(stdout, world, cfg.zero_optimization.stage, (double)dsc_trainer_param_count(t),
                                   dp, state_bytes(&cfg));
    /* Generation runs on rank 0 alone, which an expert-parallel MoE layer cannot do; it grows the context one
     * token at a time, which sequence parallelism cannot split. */
    const bool sp = tp > 1 && cfg.tensor_parallel.sequence_parallel;
    if (!s && finished && ((moe && cfg.moe.ep_size > 1) || sp)) {
        if (rank == 0 && a->sample_tokens > 0)
            printf("dsc-train: no sample: %s (use dsc-generate on the checkpoint)\n",
                   sp ? "tensor_parallel.sequence_parallel splits positions over the tensor ranks"
                      : "generation runs on one rank and moe.ep_size > 1");
    }
    /* ZeRO-3 gathers parameters and tensor-parallel layers reduce collectively, so every rank generates and
     * rank 0 prints. */
    else if (!s && finished && (rank == 0 || cfg.zero_optimization.stage == 3 || tp > 1))
        print_sample(trainer_generate, t, &cfg, a, rank == 0);
    dsc_checkpointer_destroy(ckpt);
    dsc_trainer_destroy(t);
    dsc_tp_wiring_free(&tw);
    dsc_groups_free(mw.groups);
    dsc_group_plan_free(&mw.plan);
    dsc_config_free(&cfg);
    return s;
}

/* Errors every rank detects alike (bad config, data or a non-finite loss,
 * which is averaged over ranks first) end with a normal shutdown; anything
 * else may leave peers inside a collective, so the job is aborted. */
static bool every_rank_agrees(dsc_code code) {
    return code == DSC_ERR_CONFIG || code == DSC_ERR_IO || code == DSC_ERR_CORRUPT || code == DSC_ERR_NUMERIC ||
           code == DSC_ERR_UNSUPPORTED;
}

static dsc_status encode_hf(void *tok, const char *text, size_t len, int32_t *ids, int64_t cap, int64_t *n_out) {
    return dsc_tokenizer_encode(tok, text, len, ids, cap, n_out);
}

/* --prepare TEXT OUT [--tokenizer JSON]: the byte tokenizer, or a Hugging Face tokenizer.json. */
static int prepare(int argc, char **argv) {
    bool hf = argc == 6 && strcmp(argv[4], "--tokenizer") == 0;
    if (argc != 4 && !hf) {
        fprintf(stderr, "dsc-train: --prepare takes TEXT OUT.tok [--tokenizer tokenizer.json]\n");
        usage(stderr);
        return 2;
    }
    int64_t count = 0;
    dsc_tokenizer *tok = NULL;
    dsc_status s = hf ? dsc_tokenizer_load(&tok, argv[5]) : NULL;
    if (!s && hf) {
        dsc_text_encoder enc = {tok, (uint32_t)dsc_tokenizer_vocab_size(tok), encode_hf};
        s = dsc_data_prepare_with(argv[2], argv[3], &enc, &count);
    } else if (!s) {
        s = dsc_data_prepare(argv[2], argv[3], &count);
    }
    if (s)
        fprintf(stderr, "dsc-train: %s\n", dsc_status_message(s));
    else
        printf("dsc-train: wrote %lld tokens to %s%s%s\n", (long long)count, argv[3], hf ? " with " : "",
               hf ? argv[5] : "");
    dsc_status_free(s);
    dsc_tokenizer_destroy(tok);
    return s ? 1 : 0;
}

int main(int argc, char **argv) {
    if (dsc_cli_info(argc, argv, argc - 1, "dsc-train", usage)) return 0;
    if (argc == 4 && strcmp(argv[1], "--plot") == 0) {
        dsc_status s = dsc_metrics_plot_svg(argv[2], argv[3]);
        if (s)
            fprintf(stderr, "dsc-train: %s\n", dsc_status_message(s));
        else
            printf("dsc-train: wrote %s\n", argv[3]);
        dsc_status_free(s);
        return s ? 1 : 0;
    }
    if (argc >= 2 && strcmp(argv[1], "--prepare") == 0) return prepare(argc, argv);
    args a;
    dsc_status s = parse_args(argc, argv, &a);
    if (s) {
        fprintf(stderr, "dsc-train: %s\n", dsc_status_message(s));
        usage(stderr);
        dsc_status_free(s);
        free(a.overrides);
        return 2;
    }
    if (a.estimate_ranks > 0) {
        s = estimate(&a);
        if (s) fprintf(stderr, "dsc-train: %s\n", dsc_status_message(s));
        dsc_status_free(s);
        free(a.overrides);
        return s ? 1 : 0;
    }
    struct sigaction sa = {.sa_handler = on_stop_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL);
    dsc_comm *world = NULL;
    dsc_hf_import *hf = NULL;
    s = dsc_comm_world(NULL, &world);
    if (!s && a.init_from_hf) s = dsc_hf_import_open(a.init_from_hf, &hf);
    if (!s) s = train(&a, hf, world);
    dsc_hf_import_close(hf);
    free(a.overrides);
    if (!s) {
        dsc_comm_free(world);
        dsc_status_free(dsc_comm_finalize());
        return 0;
    }
    bool agreed = every_rank_agrees(dsc_status_code(s));
    if (!agreed || !world || dsc_comm_rank(world) == 0) fprintf(stderr, "dsc-train: %s\n", dsc_status_message(s));
    dsc_status_free(s);
    if (world && !agreed && dsc_comm_size(world) > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    dsc_comm_free(world);
    dsc_status_free(dsc_comm_finalize());
    return 1;
}
