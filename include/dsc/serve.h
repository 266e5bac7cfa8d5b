/* dsc/serve.h — an OpenAI-compatible HTTP server over the inference engine
 * (libmicrohttpd): POST /v1/completions and /v1/chat/completions (JSON or
 * server-sent events), GET /v1/models, /health and /metrics (Prometheus).
 *
 * Threading: HTTP requests are parsed, tokenized and answered on
 * libmicrohttpd's connection threads; the engine and its scheduler belong to
 * the thread that calls dsc_server_run (the step loop), which takes new
 * requests and cancellations from a queue once per forward. The two sides
 * meet only under the server's mutex. dsc_server_request_stop is
 * async-signal-safe.
 *
 * Ranks: an engine split over several ranks (tensor and/or pipeline
 * parallelism) is served by every rank of its communicator (cfg.comm)
 * calling dsc_server_create and dsc_server_run. Rank 0 listens and runs the step loop, which turns
 * each iteration's submits and cancels into a batch plan (serve/plan.h) and
 * broadcasts it before applying it; the other ranks apply the same plans to
 * their own scheduler replicas, so every rank forms the same batches, and
 * leave when rank 0's drained plan says stop. Only rank 0 heeds
 * dsc_server_request_stop. logprobs across ranks are computed from each
 * rank's vocabulary slice (collectives in the token callback over the TP
 * group); under pipeline parallelism the last stage computes them and
 * broadcasts them over the pipeline group (rank 0 is on stage 0).
 *
 * Not here: model loading, the command line (apps/dsc-serve.c). */
#ifndef DSC_SERVE_H
#define DSC_SERVE_H

#include "dsc/api.h"
#include <stddef.h>
#include <stdint.h>

#include "dsc/comm.h"
#include "dsc/inference.h"
#include "dsc/status.h"
#include "dsc/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { DSC_SERVE_MAX_EOS = 8 };

typedef struct dsc_serve_config {
    const char *host;       /* bind address, "127.0.0.1" by default */
    int port;               /* 0: an ephemeral port (dsc_server_port says which) */
    const char *api_key;    /* NULL: no authentication; else "Authorization: Bearer KEY" on all but /health */
    const char *model_name; /* the id /v1/models lists and requests may name */
    size_t max_body_bytes;
    int32_t max_prompt_tokens; /* per prompt */
    int32_t max_tokens;        /* per request's max_tokens (and the default of chat) */
    int32_t max_concurrent;    /* generation requests in flight; beyond: 429 */
    double drain_timeout_s;    /* after a stop request, in-flight requests get this long, then are cancelled */
    const char *chat_template; /* NULL: chosen from the tokenizer's special tokens (and model_arch) */
    const char *model_arch;    /* "MistralForCausalLM", ...: Mistral models get the mistral template */
    int32_t bos;               /* >= 0: prepended to text prompts of /v1/completions */
    int32_t eos[DSC_SERVE_MAX_EOS]; /* stop tokens of every request (the model's end of sequence) */
    int32_t n_eos;
    uint64_t seed;  /* seeds of requests that give none: seed + request number */
    dsc_comm *comm; /* every rank the engine is split over (borrowed); NULL: one rank */
    /* Borrowed, NULL when of size 1 (dsc/infer_grid.h makes them): this
     * rank's pipeline group (the topology's `pipe` axis) and the TP group of
     * its stage (`model` axis), whose ranks hold slices of the vocabulary.
     * Ranks of comm in neither (expert-parallel replicas) hold the same
     * logits as their peers. */
    dsc_comm *pipe_comm, *tp_comm;
} dsc_serve_config;

DSC_API dsc_serve_config dsc_serve_config_default(void);

typedef struct dsc_server dsc_server;

/* Borrows the engine and tokenizer (NULL: token-id prompts only, empty
 * text); copies cfg's strings; creates the scheduler and starts listening. A bad option or an
 * address that cannot be bound is an error naming it. */
DSC_API dsc_status dsc_server_create(dsc_infer_engine *engine, const dsc_scheduler_config *sched,
                                     dsc_tokenizer *tok, const dsc_serve_config *cfg, dsc_server **out);
/* The port listened on (rank 0; -1 on the other ranks). */
DSC_API int dsc_server_port(const dsc_server *srv);
/* The chat template in use ("llama-3", ...), NULL when chat is refused. */
DSC_API const char *dsc_server_chat_template(const dsc_server *srv);
/* Runs the step loop until a stop request has drained: new connections are
 * refused, in-flight requests finish (or are cancelled after the drain
 * timeout). An engine error ends it (every waiting client gets a 500). On
 * ranks other than 0: follows rank 0's plans until its last one. */
DSC_API dsc_status dsc_server_run(dsc_server *srv);
/* Async-signal-safe: asks dsc_server_run to drain and return. */
DSC_API void dsc_server_request_stop(dsc_server *srv);
DSC_API void dsc_server_destroy(dsc_server *srv);

#ifdef __cplusplus
}
#endif
#endif
