/* The server object: options checked, the scheduler created over the
 * borrowed engine, the chat template chosen (--chat-template, else from the
 * tokenizer's special tokens, else Mistral's for Mistral/Mixtral models
 * whose tokenizer has </s>), the plan channel chosen (one rank, or rank 0
 * broadcasting to the ranks of cfg->comm), HTTP started on rank 0; and its
 * teardown. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/chat_template.h"
#include "serve/serve_internal.h"

dsc_serve_config dsc_serve_config_default(void) {
    return (dsc_serve_config){.host = "127.0.0.1",
                              .port = 8000,
                              .model_name = "dsc",
                              .max_body_bytes = 1u << 20,
                              .max_prompt_tokens = 8192,
                              .max_tokens = 4096,
                              .max_concurrent = 64,
                              .drain_timeout_s = 30.0,
                              .bos = -1,
                              .seed = 0x5eed};
}

static dsc_status check_config(const dsc_serve_config *c) {
    DSC_CHECK(c->host && c->model_name && c->model_name[0], DSC_ERR_CONFIG, "dsc-serve: a host and a model name");
    DSC_CHECK(strpbrk(c->model_name, "\"\\\n") == NULL, DSC_ERR_CONFIG,
              "--served-model-name \"%s\": no quotes, backslashes or newlines", c->model_name);
    DSC_CHECK(c->port >= 0 && c->port <= 65535, DSC_ERR_CONFIG, "--port %d: not in [0, 65535]", c->port);
    DSC_CHECK(c->max_body_bytes >= 64, DSC_ERR_CONFIG, "--max-body-bytes %zu: at least 64", c->max_body_bytes);
    DSC_CHECK(c->max_prompt_tokens >= 1, DSC_ERR_CONFIG, "--max-prompt-tokens %d: at least 1",
              c->max_prompt_tokens);
    DSC_CHECK(c->max_tokens >= 1, DSC_ERR_CONFIG, "--max-tokens-limit %d: at least 1", c->max_tokens);
    DSC_CHECK(c->max_concurrent >= 1, DSC_ERR_CONFIG, "--max-concurrent-requests %d: at least 1",
              c->max_concurrent);
    DSC_CHECK(c->drain_timeout_s >= 0, DSC_ERR_CONFIG, "--drain-timeout %g: not negative", c->drain_timeout_s);
    DSC_CHECK(c->n_eos >= 0 && c->n_eos <= DSC_SERVE_MAX_EOS, DSC_ERR_CONFIG, "%d stop tokens: at most %d",
              c->n_eos, DSC_SERVE_MAX_EOS);
    DSC_CHECK(!c->api_key || c->api_key[0], DSC_ERR_CONFIG, "--api-key: empty");
    return NULL;
}

static dsc_status choose_template(dsc_server *srv) {
    const char *name = srv->cfg.chat_template;
    if (name) {
        srv->chat = serve_chat_template_find(name);
        DSC_CHECK(srv->chat, DSC_ERR_CONFIG, "--chat-template %s: unknown; dsc has %s", name,
                  serve_chat_template_names());
    } else {
        srv->chat = serve_chat_template_detect(srv->tok);
        const char *arch = srv->cfg.model_arch ? srv->cfg.model_arch : "";
        bool mistral = strncmp(arch, "Mistral", 7) == 0 || strncmp(arch, "Mixtral", 7) == 0;
        if (!srv->chat && mistral && srv->tok && dsc_tokenizer_token_id(srv->tok, "</s>") >= 0)
            srv->chat = serve_chat_template_find("mistral");
    }
    srv->chat_end_id = -1;
    if (srv->chat) {
        snprintf(srv->chat_end, sizeof srv->chat_end, "%s", serve_chat_template_end(srv->chat));
        if (srv->tok) srv->chat_end_id = dsc_tokenizer_token_id(srv->tok, srv->chat_end);
    }
    return NULL;
}

/* Under tensor parallelism each rank's logits rows are a slice of the
 * vocabulary, in the TP group's rank order: this rank's first id is the
 * widths before it. The TP group is the stage's (under pipeline or expert
 * parallelism not the world). */
static dsc_status find_vocab0(dsc_server *srv) {
    const dsc_serve_config *c = &srv->cfg;
    srv->vocab_comm = c->tp_comm;
    srv->last_stage = !c->pipe_comm || dsc_comm_rank(c->pipe_comm) == dsc_comm_size(c->pipe_comm) - 1;
    srv->vocab0 = 0;
    int n_ranks = srv->vocab_comm ? dsc_comm_size(srv->vocab_comm) : 1;
    if (n_ranks == 1) {
        srv->vocab_comm = NULL;
        return NULL;
    }
    int rank = dsc_comm_rank(srv->vocab_comm);
    int32_t mine = dsc_infer_engine_logits_width(srv->engine), *all = calloc((size_t)n_ranks, sizeof *all);
    DSC_CHECK(all, DSC_ERR_NOMEM, "logits widths of %d ranks", n_ranks);
    int64_t one = 1, n = n_ranks, total = 0;
    dsc_tensor send = dsc_tensor_view(&mine, DSC_DTYPE_I32, 1, &one, DSC_CPU);
    dsc_tensor recv = dsc_tensor_view(all, DSC_DTYPE_I32, 1, &n, DSC_CPU);
    dsc_status s = dsc_comm_allgather(srv->vocab_comm, &send, &recv, NULL);
    for (int r = 0; !s && r < n_ranks; r++) {
        if (r == rank) srv->vocab0 = (int32_t)total;
        total += all[r];
    }
    free(all);
    DSC_TRY(s);
    DSC_CHECK(total == srv->vocab, DSC_ERR_CONFIG,
              "the TP ranks' logits widths add up to %lld, not the vocabulary's %d: dsc-serve needs one "
              "vocabulary slice per rank of a tensor-parallel group",
              (long long)total, srv->vocab);
    return NULL;
}

static char *dup_or_null(const char *s) {
    return s ? strdup(s) : NULL;
}

dsc_status dsc_server_create(dsc_infer_engine *engine, const dsc_scheduler_config *sched, dsc_tokenizer *tok,
                             const dsc_serve_config *cfg, dsc_server **out) {
    DSC_TRY(check_config(cfg));
    int32_t V = dsc_infer_engine_vocab_size(engine);
    for (int32_t i = 0; i < cfg->n_eos; i++)
        DSC_CHECK(cfg->eos[i] >= 0 && cfg->eos[i] < V, DSC_ERR_CONFIG,
                  "stop token %d: outside the vocabulary [0, %d)", cfg->eos[i], V);
    DSC_CHECK(cfg->bos < V, DSC_ERR_CONFIG, "--bos %d: outside the vocabulary [0, %d)", cfg->bos, V);
    dsc_server *srv = calloc(1, sizeof *srv);
    DSC_CHECK(srv, DSC_ERR_NOMEM, "server");
    srv->cfg = *cfg;
    srv->engine = engine;
    srv->tok = tok;
    srv->vocab = V;
    srv->max_context = (int32_t)dsc_infer_engine_kv_config(engine)->max_context;
    srv->block_size = dsc_infer_engine_kv_config(engine)->block_size;
    srv->created = (int64_t)time(NULL);
    srv->rank = cfg->comm ? dsc_comm_rank(cfg->comm) : 0;
    srv->n_ranks = cfg->comm ? dsc_comm_size(cfg->comm) : 1;
    srv->channel = srv->n_ranks > 1 ? serve_plan_channel_comm(cfg->comm) : serve_plan_channel_single();
    srv->port = -1;
    pthread_mutex_init(&srv->mu, NULL);
    pthread_cond_init(&srv->wake, NULL);
    srv->model_name = dup_or_null(cfg->model_name);
    srv->api_key = dup_or_null(cfg->api_key);
    dsc_status s = srv->model_name && (srv->api_key || !cfg->api_key) ? NULL : dsc_error(DSC_ERR_NOMEM, "server");
    if (!s) s = choose_template(srv);
    if (!s) s = dsc_scheduler_create(engine, sched, serve_loop_on_token, srv, &srv->sched);
    if (!s) s = find_vocab0(srv);
    if (!s && srv->rank == 0) s = serve_http_start(srv);
    /* Only the copies outlive this call. */
    srv->cfg.model_name = srv->model_name;
    srv->cfg.api_key = srv->api_key;
    srv->cfg.host = srv->cfg.chat_template = srv->cfg.model_arch = NULL;
    if (s) {
        dsc_server_destroy(srv);
        return s;
    }
    srv->metrics.kv_total = dsc_infer_engine_total_blocks(engine);
    *out = srv;
    return NULL;
}

int dsc_server_port(const dsc_server *srv) {
    return srv->port;
}

const char *dsc_server_chat_template(const dsc_server *srv) {
    return srv->chat ? serve_chat_template_name(srv->chat) : NULL;
}

void dsc_server_request_stop(dsc_server *srv) {
    srv->stop_requested = 1;
}

void dsc_server_destroy(dsc_server *srv) {
    if (!srv) return;
    serve_http_stop(srv);
    dsc_scheduler_destroy(srv->sched);
    serve_plan_free(&srv->plan);
    free(srv->lp_seqs);
    free(srv->active);
    free(srv->model_name);
    free(srv->api_key);
    pthread_cond_destroy(&srv->wake);
    pthread_mutex_destroy(&srv->mu);
    free(srv);
}
