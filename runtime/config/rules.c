/* Rules that span several config keys: filling "auto" (null) values from
 * other keys, consistency checks that need only the config (head counts,
 * expert counts, schedules, scheduler steps), and DeepSpeed's batch-size rule
 * once the data-parallel size is known. Checks that need the world (ranks,
 * devices) belong to the code that has the world, not here. */
#define _POSIX_C_SOURCE 200809L /* regcomp */
#include <limits.h>
#include <regex.h>
#include <string.h>

#include "runtime/config/config_impl.h"

/* Records a violated rule and goes on, so that one run lists every problem. */
#define REQUIRE(is, cond, ...)                                                                                    \
    do {                                                                                                          \
        if (!(cond)) dsc_config_issue(is, dsc_error(DSC_ERR_CONFIG, __VA_ARGS__));                                \
    } while (0)

static int is_auto(const cJSON *root, const char *path) {
    const cJSON *v = dsc_config_lookup(root, path);
    return !v || cJSON_IsNull(v);
}

static const char *choice(const char *path, int value) {
    return dsc_config_schema_find(path)->choices[value];
}

static int arch_has_moe(dsc_model_arch a) {
    return a == DSC_MODEL_ARCH_GPT_MOE || a == DSC_MODEL_ARCH_MIXTRAL;
}
static int arch_is_gpt(dsc_model_arch a) {
    return a == DSC_MODEL_ARCH_GPT || a == DSC_MODEL_ARCH_GPT_MOE;
}

static void resolve_auto(const cJSON *root, const char *src, dsc_config *c, dsc_config_issues *is) {
    dsc_config_model *m = &c->model;
    if (m->n_kv_head == 0) m->n_kv_head = m->n_head;
    if (m->d_ff == 0) {
        REQUIRE(is, m->d_model <= INT_MAX / 4, "%s: \"model.d_ff\" = 4 * \"model.d_model\" %d overflows", src,
                m->d_model);
        m->d_ff = m->d_model <= INT_MAX / 4 ? 4 * m->d_model : m->d_model;
    }
    if (is_auto(root, "model.tie_embeddings")) m->tie_embeddings = arch_is_gpt(m->arch);
    if (is_auto(root, "model.qkv_bias")) m->qkv_bias = arch_is_gpt(m->arch);
    if (is_auto(root, "zero_optimization.overlap_comm"))
        c->zero_optimization.overlap_comm = c->zero_optimization.stage == 3;
    if (c->scheduler.params.total_num_steps == 0) c->scheduler.params.total_num_steps = c->train.steps;
    if (is_auto(root, "scheduler.params.cycle_second_step_size"))
        c->scheduler.params.cycle_second_step_size = c->scheduler.params.cycle_first_step_size;
    if (is_auto(root, "scheduler.params.cycle_second_stair_count"))
        c->scheduler.params.cycle_second_stair_count = c->scheduler.params.cycle_first_stair_count;
}

static void check_offload(const char *src, const dsc_config_zero *z, dsc_config_issues *is) {
    const char *why = "is supported by DeepSpeed, not by dsc: NVMe offload needs asynchronous NVMe I/O, which dsc "
                      "does not have; use device \"cpu\" or \"none\"";
    REQUIRE(is, z->offload_optimizer != DSC_OFFLOAD_DEVICE_NVME,
            "%s: \"zero_optimization.offload_optimizer.device\" "
            "\"nvme\" %s",
            src, why);
    REQUIRE(is, z->offload_param != DSC_OFFLOAD_DEVICE_NVME,
            "%s: \"zero_optimization.offload_param.device\" "
            "\"nvme\" %s",
            src, why);
}

static void check_model(const char *src, const dsc_config_model *m, dsc_config_issues *is) {
    REQUIRE(is, m->d_model % m->n_head == 0, "%s: \"model.d_model\" %d is not divisible by \"model.n_head\" %d",
            src, m->d_model, m->n_head);
    REQUIRE(is, m->n_head % m->n_kv_head == 0,
            "%s: \"model.n_head\" %d is not divisible by \"model.n_kv_head\" %d", src, m->n_head, m->n_kv_head);
    if (m->d_model % m->n_head) return; /* no head size to check */
    int head_size = m->d_model / m->n_head;
    REQUIRE(
        is, arch_is_gpt(m->arch) || head_size % 2 == 0,
        "%s: head size \"model.d_model\" %d / \"model.n_head\" %d = %d must be even for RoPE (model.arch \"%s\")",
        src, m->d_model, m->n_head, head_size, choice("model.arch", (int)m->arch));
}

static void check_moe(const char *src, const dsc_config *c, dsc_config_issues *is) {
    const dsc_config_moe *e = &c->moe;
    const char *arch = choice("model.arch", (int)c->model.arch);
    if (!arch_has_moe(c->model.arch)) {
        REQUIRE(is, e->num_experts == 0,
                "%s: \"moe.num_experts\" is %d but model.arch \"%s\" has no MoE layers (use \"gpt-moe\" or "
                "\"mixtral\")",
                src, e->num_experts, arch);
        return;
    }
    if (e->num_experts < 1) { /* the other rules are about the experts there are */
        dsc_config_issue(
            is, dsc_error(DSC_ERR_CONFIG, "%s: model.arch \"%s\" needs \"moe.num_experts\" >= 1", src, arch));
        return;
    }
    REQUIRE(is, e->k <= e->num_experts, "%s: \"moe.k\" %d exceeds \"moe.num_experts\" %d", src, e->k,
            e->num_experts);
    REQUIRE(is, e->num_experts % e->ep_size == 0,
            "%s: \"moe.num_experts\" %d is not divisible by \"moe.ep_size\" %d", src, e->num_experts, e->ep_size);
    REQUIRE(is, e->noisy_gate_policy != DSC_MOE_NOISY_GATE_RSAMPLE || e->k == 1,
            "%s: \"moe.noisy_gate_policy\" \"RSample\" works only with \"moe.k\" 1, got %d", src, e->k);
    REQUIRE(is, e->layer_freq <= c->model.n_layer,
            "%s: \"moe.layer_freq\" %d exceeds \"model.n_layer\" %d, so no layer would have experts", src,
            e->layer_freq, c->model.n_layer);
}

static void check_partition_method(const char *src, const char *method, dsc_config_issues *is) {
    if (strcmp(method, "uniform") == 0 || strcmp(method, "parameters") == 0) return;
    if (strncmp(method, "type:", 5) != 0 || !method[5]) {
        dsc_config_issue(is, dsc_error(DSC_ERR_CONFIG,
                                       "%s: \"pipeline.partition_method\" must be \"uniform\", \"parameters\" or "
                                       "\"type:REGEX\", got \"%s\"",
                                       src, method));
        return;
    }
    regex_t re;
    int rc = regcomp(&re, method + 5, REG_EXTENDED | REG_ICASE | REG_NOSUB);
    if (rc == 0) {
        regfree(&re);
        return;
    }
    char why[128];
    regerror(rc, &re, why, sizeof why);
    dsc_config_issue(is,
                     dsc_error(DSC_ERR_CONFIG,
                               "%s: \"pipeline.partition_method\" has an invalid regular expression \"%s\": %s",
                               src, method + 5, why));
}

static void check_pipeline(const char *src, const dsc_config_pipeline *p, dsc_config_issues *is) {
    int interleaved = p->schedule == DSC_PIPE_SCHEDULE_KIND_INTERLEAVED;
    REQUIRE(is, !interleaved || p->virtual_stages >= 2,
            "%s: \"pipeline.schedule\" \"interleaved\" needs \"pipeline.virtual_stages\" >= 2, got %d", src,
            p->virtual_stages);
    REQUIRE(is, interleaved || p->virtual_stages == 1,
            "%s: \"pipeline.virtual_stages\" %d needs \"pipeline.schedule\" \"interleaved\", got \"%s\"", src,
            p->virtual_stages, choice("pipeline.schedule", (int)p->schedule));
    check_partition_method(src, p->partition_method, is);
}

static void check_scheduler(const char *src, const dsc_config_scheduler *s, dsc_config_issues *is) {
    const char *name = choice("scheduler.type", (int)s->type);
    int decays = s->type == DSC_LR_SCHEDULE_WARMUP_DECAY_LR || s->type == DSC_LR_SCHEDULE_WARMUP_COSINE_LR;
    REQUIRE(
        is, !decays || s->params.warmup_num_steps <= s->params.total_num_steps,
        "%s: \"scheduler.params.warmup_num_steps\" %lld exceeds \"scheduler.params.total_num_steps\" %lld (%s)",
        src, (long long)s->params.warmup_num_steps, (long long)s->params.total_num_steps, name);
    int warms_lr = s->type == DSC_LR_SCHEDULE_WARMUP_LR || s->type == DSC_LR_SCHEDULE_WARMUP_DECAY_LR;
    REQUIRE(is, !warms_lr || s->params.warmup_min_lr <= s->params.warmup_max_lr,
            "%s: \"scheduler.params.warmup_min_lr\" %g exceeds \"scheduler.params.warmup_max_lr\" %g (%s)", src,
            s->params.warmup_min_lr, s->params.warmup_max_lr, name);
}

/* DeepSpeed keys whose value asks for something dsc does not do: refused
 * with the reason rather than accepted and ignored. */
static void check_refused(const char *src, const dsc_config *c, dsc_config_issues *is) {
    REQUIRE(is, c->zero_optimization.contiguous_gradients,
            "%s: \"zero_optimization.contiguous_gradients\" false is not supported: dsc keeps every gradient in "
            "one contiguous flat buffer per parameter group, always; set it to true or leave it out",
            src);
    REQUIRE(is, c->comm.backend != DSC_COMM_BACKEND_KIND_NCCL,
            "%s: \"comm.backend\" \"nccl\" is not possible for training: dsc trains on the CPU, where ranks talk "
            "over MPI (NCCL carries CUDA tensors, and \"auto\" picks it for them); use \"auto\" or \"mpi\"",
            src);
}

/* fp16 / bf16: one of them. */
static void check_precision(const char *src, const dsc_config *c, dsc_config_issues *is) {
    REQUIRE(is, !(c->fp16.enabled && c->bf16.enabled),
            "%s: \"fp16.enabled\" and \"bf16.enabled\" are both true; pick one (DeepSpeed refuses both too)", src);
}

/* checkpoint.tag names saves: a plain directory name, with "{step}" when
 * more than one save is made (each save needs its own name). */
static void check_tag(const char *src, const dsc_config_checkpoint *k, dsc_config_issues *is) {
    const char *tag = k->tag;
    if (!tag[0]) return;
    REQUIRE(is, strlen(tag) < 96 && !strchr(tag, '/') && tag[0] != '.' && strcmp(tag, "latest") != 0,
            "%s: \"checkpoint.tag\" \"%s\" must be a plain directory name (no '/', not starting with '.', not "
            "\"latest\", under 96 characters)",
            src, tag);
    REQUIRE(is, k->save_interval == 0 || strstr(tag, "{step}"),
            "%s: \"checkpoint.tag\" \"%s\" would name every save of \"checkpoint.save_interval\" %lld the same; "
            "put \"{step}\" in it (e.g. \"%s_{step}\")",
            src, tag, (long long)k->save_interval, tag);
}

static void check_loop(const char *src, const dsc_config *c, dsc_config_issues *is) {
    check_tag(src, &c->checkpoint, is);
    REQUIRE(is, c->checkpoint.save_interval == 0 || c->checkpoint.save_dir[0],
            "%s: \"checkpoint.save_interval\" %lld needs \"checkpoint.save_dir\"", src,
            (long long)c->checkpoint.save_interval);
    REQUIRE(is, c->train.eval_interval == 0 || c->data.val_fraction > 0,
            "%s: \"train.eval_interval\" %lld needs \"data.val_fraction\" > 0 (no held-out data to evaluate on)",
            src, (long long)c->train.eval_interval);
    REQUIRE(is, !c->flops_profiler.enabled || c->flops_profiler.profile_step < c->train.steps,
            "%s: \"flops_profiler.profile_step\" %lld is never reached: \"train.steps\" is %lld (the profiled "
            "step is the one after profile_step steps)",
            src, (long long)c->flops_profiler.profile_step, (long long)c->train.steps);
}

void dsc_config_apply_rules(const cJSON *root, const char *src, dsc_config *cfg, dsc_config_issues *is) {
    resolve_auto(root, src, cfg, is);
    check_model(src, &cfg->model, is);
    check_moe(src, cfg, is);
    check_pipeline(src, &cfg->pipeline, is);
    check_scheduler(src, &cfg->scheduler, is);
    dsc_config_muon_rules(root, src, cfg, is);
    check_offload(src, &cfg->zero_optimization, is);
    check_refused(src, cfg, is);
    check_precision(src, cfg, is);
    check_loop(src, cfg, is);
}

/* "x is not divisible by a * data-parallel size d = a*d", the message for a
 * value that cannot be split evenly. */
static dsc_status not_divisible(const char *src, const char *what, long long total, const char *by, long long by_v,
                                int dp) {
    if (by)
        return dsc_error(DSC_ERR_CONFIG, "%s: %s %lld is not divisible by %s %lld * data-parallel size %d = %lld",
                         src, what, total, by, by_v, dp, by_v * dp);
    return dsc_error(DSC_ERR_CONFIG, "%s: %s %lld is not divisible by data-parallel size %d", src, what, total,
                     dp);
}

dsc_status dsc_config_resolve_batch(dsc_config *cfg, int dp_size) {
    const char *src = cfg->source;
    DSC_CHECK(dp_size >= 1, DSC_ERR_INVALID, "%s: data-parallel size must be >= 1, got %d", src, dp_size);
    int64_t tb = cfg->train_batch_size, mb = cfg->train_micro_batch_size_per_gpu,
            gas = cfg->gradient_accumulation_steps, dp = dp_size;
    DSC_CHECK(tb || mb, DSC_ERR_CONFIG,
              "%s: either \"train_batch_size\" or \"train_micro_batch_size_per_gpu\" must be given", src);
    int gas_given = gas != 0;
    if (!gas && tb && mb) {
        if (tb % (mb * dp))
            return not_divisible(src, "train_batch_size", tb, "train_micro_batch_size_per_gpu", mb, dp_size);
        gas = tb / (mb * dp);
    }
    if (!gas) gas = 1;
    if (!mb) {
        if (tb % (gas * dp))
            return gas_given
                       ? not_divisible(src, "train_batch_size", tb, "gradient_accumulation_steps", gas, dp_size)
                       : not_divisible(src, "train_batch_size", tb, NULL, 0, dp_size);
        mb = tb / (gas * dp);
    }
    int64_t product;
    DSC_CHECK(!__builtin_mul_overflow(mb, gas, &product) && !__builtin_mul_overflow(product, dp, &product),
              DSC_ERR_CONFIG,
              "%s: train_micro_batch_size_per_gpu %lld * gradient_accumulation_steps %lld * data-parallel size %d "
              "overflows",
              src, (long long)mb, (long long)gas, dp_size);
    if (!tb) tb = product;
    DSC_CHECK(
        tb == product, DSC_ERR_CONFIG,
        "%s: train_batch_size %lld != train_micro_batch_size_per_gpu %lld * gradient_accumulation_steps %lld * "
        "data-parallel size %d = %lld",
        src, (long long)tb, (long long)mb, (long long)gas, dp_size, (long long)product);
    cfg->train_batch_size = tb;
    cfg->train_micro_batch_size_per_gpu = mb;
    cfg->gradient_accumulation_steps = gas;
    cfg->data_parallel_size = dp_size;
    return NULL;
}
