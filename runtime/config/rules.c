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

static dsc_status resolve_auto(const cJSON *root, const char *src, dsc_config *c) {
    dsc_config_model *m = &c->model;
    if (m->n_kv_head == 0) m->n_kv_head = m->n_head;
    if (m->d_ff == 0) {
        DSC_CHECK(m->d_model <= INT_MAX / 4, DSC_ERR_CONFIG,
                  "%s: \"model.d_ff\" = 4 * \"model.d_model\" %d overflows", src, m->d_model);
        m->d_ff = 4 * m->d_model;
    }
    if (is_auto(root, "model.tie_embeddings")) m->tie_embeddings = arch_is_gpt(m->arch);
    if (is_auto(root, "model.qkv_bias")) m->qkv_bias = arch_is_gpt(m->arch);
    if (is_auto(root, "zero_optimization.overlap_comm")) c->zero_optimization.overlap_comm = false;
    if (c->scheduler.params.total_num_steps == 0) c->scheduler.params.total_num_steps = c->train.steps;
    return NULL;
}

static dsc_status check_model(const char *src, const dsc_config_model *m) {
    DSC_CHECK(m->d_model % m->n_head == 0, DSC_ERR_CONFIG,
              "%s: \"model.d_model\" %d is not divisible by \"model.n_head\" %d", src, m->d_model, m->n_head);
    DSC_CHECK(m->n_head % m->n_kv_head == 0, DSC_ERR_CONFIG,
              "%s: \"model.n_head\" %d is not divisible by \"model.n_kv_head\" %d", src, m->n_head, m->n_kv_head);
    int head_size = m->d_model / m->n_head;
    DSC_CHECK(
        arch_is_gpt(m->arch) || head_size % 2 == 0, DSC_ERR_CONFIG,
        "%s: head size \"model.d_model\" %d / \"model.n_head\" %d = %d must be even for RoPE (model.arch \"%s\")",
        src, m->d_model, m->n_head, head_size, choice("model.arch", (int)m->arch));
    return NULL;
}

static dsc_status check_moe(const char *src, const dsc_config *c) {
    const dsc_config_moe *e = &c->moe;
    const char *arch = choice("model.arch", (int)c->model.arch);
    if (!arch_has_moe(c->model.arch)) {
        DSC_CHECK(e->num_experts == 0, DSC_ERR_CONFIG,
                  "%s: \"moe.num_experts\" is %d but model.arch \"%s\" has no MoE layers (use \"gpt-moe\" or "
                  "\"mixtral\")",
                  src, e->num_experts, arch);
        return NULL;
    }
    DSC_CHECK(e->num_experts >= 1, DSC_ERR_CONFIG, "%s: model.arch \"%s\" needs \"moe.num_experts\" >= 1", src,
              arch);
    DSC_CHECK(e->k <= e->num_experts, DSC_ERR_CONFIG, "%s: \"moe.k\" %d exceeds \"moe.num_experts\" %d", src, e->k,
              e->num_experts);
    DSC_CHECK(e->num_experts % e->ep_size == 0, DSC_ERR_CONFIG,
              "%s: \"moe.num_experts\" %d is not divisible by \"moe.ep_size\" %d", src, e->num_experts,
              e->ep_size);
    DSC_CHECK(e->noisy_gate_policy != DSC_MOE_NOISY_GATE_RSAMPLE || e->k == 1, DSC_ERR_CONFIG,
              "%s: \"moe.noisy_gate_policy\" \"RSample\" works only with \"moe.k\" 1, got %d", src, e->k);
    DSC_CHECK(e->layer_freq <= c->model.n_layer, DSC_ERR_CONFIG,
              "%s: \"moe.layer_freq\" %d exceeds \"model.n_layer\" %d, so no layer would have experts", src,
              e->layer_freq, c->model.n_layer);
    return NULL;
}

static dsc_status check_partition_method(const char *src, const char *method) {
    if (strcmp(method, "uniform") == 0 || strcmp(method, "parameters") == 0) return NULL;
    DSC_CHECK(
        strncmp(method, "type:", 5) == 0 && method[5], DSC_ERR_CONFIG,
        "%s: \"pipeline.partition_method\" must be \"uniform\", \"parameters\" or \"type:REGEX\", got \"%s\"", src,
        method);
    regex_t re;
    int rc = regcomp(&re, method + 5, REG_EXTENDED | REG_ICASE | REG_NOSUB);
    if (rc == 0) {
        regfree(&re);
        return NULL;
    }
    char why[128];
    regerror(rc, &re, why, sizeof why);
    return dsc_error(DSC_ERR_CONFIG,
                     "%s: \"pipeline.partition_method\" has an invalid regular expression \"%s\": %s", src,
                     method + 5, why);
}

static dsc_status check_pipeline(const char *src, const dsc_config_pipeline *p) {
    int interleaved = p->schedule == DSC_PIPE_SCHEDULE_KIND_INTERLEAVED;
    DSC_CHECK(!interleaved || p->virtual_stages >= 2, DSC_ERR_CONFIG,
              "%s: \"pipeline.schedule\" \"interleaved\" needs \"pipeline.virtual_stages\" >= 2, got %d", src,
              p->virtual_stages);
    DSC_CHECK(interleaved || p->virtual_stages == 1, DSC_ERR_CONFIG,
              "%s: \"pipeline.virtual_stages\" %d needs \"pipeline.schedule\" \"interleaved\", got \"%s\"", src,
              p->virtual_stages, choice("pipeline.schedule", (int)p->schedule));
    return check_partition_method(src, p->partition_method);
}

static dsc_status check_scheduler(const char *src, const dsc_config_scheduler *s) {
    const char *name = choice("scheduler.type", (int)s->type);
    int decays = s->type == DSC_LR_SCHEDULE_WARMUP_DECAY_LR || s->type == DSC_LR_SCHEDULE_WARMUP_COSINE_LR;
    DSC_CHECK(
        !decays || s->params.warmup_num_steps <= s->params.total_num_steps, DSC_ERR_CONFIG,
        "%s: \"scheduler.params.warmup_num_steps\" %lld exceeds \"scheduler.params.total_num_steps\" %lld (%s)",
        src, (long long)s->params.warmup_num_steps, (long long)s->params.total_num_steps, name);
    int warms_lr = s->type == DSC_LR_SCHEDULE_WARMUP_LR || s->type == DSC_LR_SCHEDULE_WARMUP_DECAY_LR;
    DSC_CHECK(!warms_lr || s->params.warmup_min_lr <= s->params.warmup_max_lr, DSC_ERR_CONFIG,
              "%s: \"scheduler.params.warmup_min_lr\" %g exceeds \"scheduler.params.warmup_max_lr\" %g (%s)", src,
              s->params.warmup_min_lr, s->params.warmup_max_lr, name);
    return NULL;
}

/* DeepSpeed keys whose value asks for something dsc does not do: refused
 * with the reason rather than accepted and ignored. */
static dsc_status check_refused(const char *src, const dsc_config *c) {
    DSC_CHECK(!c->zero_optimization.overlap_comm, DSC_ERR_CONFIG,
              "%s: \"zero_optimization.overlap_comm\" true is not supported yet: dsc's gradient collectives are "
              "blocking, so reduction interleaves with backward but never overlaps it (overlap comes with the "
              "performance work); set it to false or null",
              src);
    DSC_CHECK(c->zero_optimization.contiguous_gradients, DSC_ERR_CONFIG,
              "%s: \"zero_optimization.contiguous_gradients\" false is not supported: dsc keeps every gradient "
              "in one contiguous flat buffer per parameter group, always; set it to true or leave it out",
              src);
    DSC_CHECK(c->zero_optimization.stage3_param_persistence_threshold == 0, DSC_ERR_CONFIG,
              "%s: \"zero_optimization.stage3_param_persistence_threshold\" %lld is not supported yet: ZeRO-3 in "
              "dsc partitions every parameter, however small; set it to 0",
              src, (long long)c->zero_optimization.stage3_param_persistence_threshold);
    DSC_CHECK(c->comm.backend != DSC_COMM_BACKEND_KIND_NCCL, DSC_ERR_CONFIG,
              "%s: \"comm.backend\" \"nccl\" is not possible for training: dsc trains on the CPU, where ranks "
              "talk over MPI (NCCL carries CUDA tensors, and \"auto\" picks it for them); use \"auto\" or "
              "\"mpi\"",
              src);
    return NULL;
}

/* checkpoint.tag names saves: a plain directory name, with "{step}" when
 * more than one save is made (each save needs its own name). */
static dsc_status check_tag(const char *src, const dsc_config_checkpoint *k) {
    const char *tag = k->tag;
    if (!tag[0]) return NULL;
    DSC_CHECK(strlen(tag) < 96 && !strchr(tag, '/') && tag[0] != '.' && strcmp(tag, "latest") != 0,
              DSC_ERR_CONFIG,
              "%s: \"checkpoint.tag\" \"%s\" must be a plain directory name (no '/', not starting with '.', not "
              "\"latest\", under 96 characters)",
              src, tag);
    DSC_CHECK(k->save_interval == 0 || strstr(tag, "{step}"), DSC_ERR_CONFIG,
              "%s: \"checkpoint.tag\" \"%s\" would name every save of \"checkpoint.save_interval\" %lld the "
              "same; put \"{step}\" in it (e.g. \"%s_{step}\")",
              src, tag, (long long)k->save_interval, tag);
    return NULL;
}

static dsc_status check_loop(const char *src, const dsc_config *c) {
    DSC_TRY(check_tag(src, &c->checkpoint));
    DSC_CHECK(c->checkpoint.save_interval == 0 || c->checkpoint.save_dir[0], DSC_ERR_CONFIG,
              "%s: \"checkpoint.save_interval\" %lld needs \"checkpoint.save_dir\"", src,
              (long long)c->checkpoint.save_interval);
    DSC_CHECK(c->train.eval_interval == 0 || c->data.val_fraction > 0, DSC_ERR_CONFIG,
              "%s: \"train.eval_interval\" %lld needs \"data.val_fraction\" > 0 (no held-out data to evaluate on)",
              src, (long long)c->train.eval_interval);
    return NULL;
}

dsc_status dsc_config_apply_rules(const cJSON *root, const char *src, dsc_config *cfg) {
    DSC_TRY(resolve_auto(root, src, cfg));
    DSC_TRY(check_model(src, &cfg->model));
    DSC_TRY(check_moe(src, cfg));
    DSC_TRY(check_pipeline(src, &cfg->pipeline));
    DSC_CHECK(!cfg->tensor_parallel.sequence_parallel, DSC_ERR_UNSUPPORTED,
              "%s: \"tensor_parallel.sequence_parallel\" = true is not implemented yet (tensor parallelism runs "
              "with replicated norms and all-reduces); set it to false",
              src);
    DSC_TRY(check_scheduler(src, &cfg->scheduler));
    DSC_TRY(check_refused(src, cfg));
    return check_loop(src, cfg);
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
