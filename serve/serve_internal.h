/* Private types of dsc-serve shared by its files: a parsed OpenAI request
 * (serve_params), the job one HTTP request becomes (one sequence per
 * prompt, the events its tokens produce), and the server object. The job's
 * fields after `mu`-guarded comments are read and written only under the
 * server's mutex. Not here: the batch plan (plan.h) or HTTP details. */
#ifndef DSC_SERVE_INTERNAL_H
#define DSC_SERVE_INTERNAL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsc/serve.h"
#include "serve/logprobs.h"
#include "serve/metrics.h"
#include "serve/plan.h"

enum {
    SERVE_MAX_STOP = 4,       /* stop strings per request (OpenAI's limit) */
    SERVE_MAX_STOP_LEN = 256, /* bytes per stop string */
    SERVE_MAX_STOP_IDS = 16,
    SERVE_MAX_PROMPTS = 64, /* prompts in one /v1/completions request */
    SERVE_MAX_LOGPROBS = SERVE_LOGPROBS_MAX,
    SERVE_MAX_MESSAGES = 256
};

/* ---- a parsed request ------------------------------------------------------------------- */
typedef enum serve_kind { SERVE_KIND_COMPLETION = 0, SERVE_KIND_CHAT } serve_kind;

typedef struct serve_prompt {
    char *text;   /* a text prompt, or NULL */
    int32_t *ids; /* token ids (given, or the text's after tokenizing) */
    int32_t n_ids;
} serve_prompt;

typedef struct serve_message {
    char *role; /* system, user, assistant */
    char *content;
} serve_message;

typedef struct serve_params {
    serve_kind kind;
    serve_prompt *prompts; /* completions; chat: one, rendered from the messages */
    int32_t n_prompts;
    serve_message *messages;
    int32_t n_messages;
    int32_t max_tokens; /* -1: the default */
    dsc_sampling_params sampling;
    bool has_seed;
    uint64_t seed;
    char *stop[SERVE_MAX_STOP];
    int32_t n_stop;
    int32_t stop_ids[SERVE_MAX_STOP_IDS];
    int32_t n_stop_ids;
    bool echo;
    int32_t logprobs;     /* -1: none; else the top alternatives per token (0..20) */
    bool chat_logprobs;   /* chat's logprobs flag, while parsing */
    int32_t top_logprobs; /* chat's count, while parsing (-1: absent) */
    bool stream, include_usage, return_token_ids;
} serve_params;

/* An OpenAI error object: {"error": {"message", "type", "param", "code"}}. */
typedef struct serve_error {
    int http;
    const char *type; /* "invalid_request_error", ... */
    const char *code; /* NULL or "invalid_api_key", "model_not_found", ... */
    char param[64];   /* "" -> null */
    char message[512];
} serve_error;

void serve_error_set(serve_error *e, int http, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Strict parse of a request body: an unknown field, a wrong type or a
 * value out of range is a 400 naming the field; a model other than
 * `model_name` is a 404. false with *err filled on failure. */
bool serve_params_parse(const char *body, size_t len, serve_kind kind, const char *model_name, serve_params *p,
                        serve_error *err);
void serve_params_free(serve_params *p);

/* ---- the text of one generated sequence ----------------------------------------------------- */
typedef struct serve_text {
    char *all; /* (len) decoded bytes so far */
    size_t len, cap;
    size_t visible; /* bytes released to the client: stop-string candidates are held back */
    dsc_tokenizer_stream dec;
} serve_text;

/* Appends token's text (none when `silent`: a stop token) and moves
 * `visible`: to the start of a stop string found (*stopped), to the end on
 * the sequence's last token, else to before any suffix that may begin a
 * stop string. tok NULL: no text. */
dsc_status serve_text_append(serve_text *t, const dsc_tokenizer *tok, int32_t token, bool silent, bool last,
                             char *const *stop, int32_t n_stop, bool *stopped);
void serve_text_free(serve_text *t);
/* A NUL-terminated copy of s[0..n) with invalid UTF-8 replaced by U+FFFD
 * (JSON strings must be UTF-8); NULL when out of memory. */
char *serve_utf8_clean(const char *s, size_t n);

/* ---- a job: one HTTP generation request ----------------------------------------------------- */
typedef enum serve_finish {
    SERVE_FINISH_NONE = 0,
    SERVE_FINISH_STOP,
    SERVE_FINISH_LENGTH,
    SERVE_FINISH_ABORT /* cancelled: client gone or drain timeout */
} serve_finish;

typedef struct serve_seq {
    uint64_t uid;
    int32_t max_tokens;
    int32_t *gen; /* (max_tokens) generated ids */
    int32_t n_gen;
    serve_text text;
    serve_finish finish;
    bool in_sched; /* submitted and not yet released */
    double t_last; /* time of the latest token (inter-token latency) */
} serve_seq;

/* One generated token: its text is seqs[seq].text.all[off, off + len). */
typedef struct serve_event {
    int32_t seq;
    int32_t token;
    size_t off, len;
    int32_t top; /* index into job->tops of 1 + logprobs entries: the token's own, then the top ones */
    serve_finish finish;
    bool first; /* the sequence's first event */
} serve_event;

typedef enum serve_admission {
    SERVE_ADMISSION_PENDING = 0,
    SERVE_ADMISSION_OK,
    SERVE_ADMISSION_FAILED
} serve_admission;

typedef struct serve_job {
    serve_params p;
    char id[48];
    int64_t created;
    double t_arrival;
    int32_t n_seqs;
    serve_seq *seqs;
    int32_t prompt_tokens;
    pthread_cond_t cond; /* signalled on admission, events and completion */
    /* guarded by the server's mutex: */
    serve_admission admission;
    serve_error error; /* when admission failed or the engine failed */
    serve_event *events;
    int32_t n_events;
    int64_t cap_events;
    serve_logprob *tops;
    int32_t n_tops;
    int64_t cap_tops;
    int32_t n_finished; /* sequences with a finish reason */
    bool cancel;        /* asked by the HTTP side (client gone) */
    bool done;          /* every sequence released by the step loop */
    bool engine_failed;
    bool counted; /* holds a slot among the requests in flight */
    int refs;     /* the HTTP side and the step loop */
    struct serve_job *next;
} serve_job;

/* A job for the parsed request p (taken over: freed with the job) whose
 * sequences may generate max_tokens each; NULL when out of memory (p is
 * then still the caller's). One reference: the caller's. */
serve_job *serve_job_new(dsc_server *srv, const serve_params *p, int32_t max_tokens);
/* Drops one reference (under the server mutex); the last frees the job. */
void serve_job_unref(dsc_server *srv, serve_job *job);

/* ---- the server ------------------------------------------------------------------------------ */
typedef struct serve_chat_template serve_chat_template;

/* A sequence whose tokens report logprobs: n top alternatives. */
typedef struct serve_lp_seq {
    uint64_t uid;
    int32_t n;
} serve_lp_seq;

struct dsc_server {
    dsc_serve_config cfg;
    char *model_name;
    char *api_key;
    dsc_infer_engine *engine;
    dsc_scheduler *sched;
    dsc_tokenizer *tok;
    const serve_chat_template *chat;
    int32_t chat_end_id; /* the template's end-of-turn token, or -1 */
    char chat_end[32];   /* its text: a stop string when it is not a token */
    int32_t vocab, max_context, block_size;
    int rank, n_ranks; /* of cfg.comm; rank 0 speaks HTTP, the others follow its plans */
    int64_t created;
    pthread_mutex_t mu;
    pthread_cond_t wake; /* the step loop waits on it when idle */
    /* guarded by mu: */
    serve_job *inbox, *inbox_tail;
    serve_job **active;
    int32_t n_active;
    int64_t cap_active;
    int32_t in_flight;
    uint64_t n_requests;
    bool draining;
    serve_metrics metrics;
    /* step loop only: */
    serve_lp_seq *lp_seqs; /* (n_lp_seqs) on every rank: computing logprobs is collective across ranks */
    int32_t n_lp_seqs;
    int64_t cap_lp_seqs;
    int32_t vocab0;       /* the first vocabulary id of this rank's logits rows */
    dsc_comm *vocab_comm; /* the ranks holding this row's vocabulary slices (NULL: the whole row here) */
    bool last_stage;      /* holds the logits (always without pipeline parallelism) */
    uint64_t next_uid;
    serve_plan plan;
    serve_plan_channel channel;
    /* HTTP */
    struct MHD_Daemon *mhd;
    int port;
    volatile int stop_requested; /* sig_atomic_t semantics: set by the signal handler */
};

/* loop.c: the scheduler's token callback (user = the server). */
dsc_status serve_loop_on_token(void *user, uint64_t uid, int32_t token, bool finished);

/* http.c: starts and stops libmicrohttpd. */
dsc_status serve_http_start(dsc_server *srv);
void serve_http_quiesce(dsc_server *srv); /* stop accepting connections */
void serve_http_stop(dsc_server *srv);

double serve_now(void);

#endif
