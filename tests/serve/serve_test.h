/* Test helpers shared by the dsc-serve end-to-end tests: the long-context
 * copy of the tiny Llama fixture, starting a server with the test's
 * options on one rank or several (stopped by the caller, killed if the
 * test dies), requests with
 * the test API key, reading /metrics, and dsc-generate's output for the
 * same request. Bounded everywhere: every wait has a deadline. */
#ifndef DSC_TESTS_SERVE_TEST_H
#define DSC_TESTS_SERVE_TEST_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "serve/client.h"
#include "serve/spawn.h"

#define ST_KEY "test-key-123"
#define ST_AUTH "Authorization: Bearer " ST_KEY "\r\n"

/* DSC_BINARY_DIR/tests/serve/llama4k: tests/inference/fixtures/hf/llama with
 * a 4096-token context (RoPE: the weights do not depend on it). */
const char *st_model_dir(void);
/* The layout a test runs the server in, from its arguments "[TP [PP]]"
 * (default 1 1; the fixture's 2 KV heads allow TP 1 or 2, its 2 layers PP 1
 * or 2): st_tp x st_pp ranks. */
extern int st_tp, st_pp;
void st_layout(int argc, char **argv);
int st_ranks(void);
/* --tp / --pp for the layout (when > 1), then args (NULL-terminated), into
 * out (room for 4 more than args); returns out. */
const char *const *st_layout_args(const char **out, const char *const *args);
/* --kv-cache-bytes for a 192-block cache (blocks of 16 tokens) on every
 * rank of the layout: each holds its share of the KV heads and layers. */
const char *st_kv_bytes(void);
/* dsc-serve st_model_dir() --port 0 --api-key ST_KEY <extra...> (NULL-terminated). */
void st_start(serve_proc *p, const char *const *extra);
/* The same on `ranks` ranks: dsc-launch -n ranks dsc-serve ... (extra names
 * the layout, e.g. --tp 2); ranks 1 is st_start. merge_stderr: the
 * launcher's verdict comes back through serve_proc_wait. */
void st_start_ranks(serve_proc *p, int ranks, bool merge_stderr, const char *const *extra);
/* st_start_ranks with another model directory than st_model_dir(). */
void st_start_model(serve_proc *p, const char *model, int ranks, bool merge_stderr, const char *const *extra);
/* Sends sig to rank 0 (dsc-serve itself on one rank) and waits for the
 * server (the launcher on several ranks) to exit: its exit code (the test
 * fails when it had to be killed). */
int st_signal_stop(serve_proc *p, int sig);
/* st_signal_stop(p, SIGTERM). */
int st_stop(serve_proc *p);
/* POST or GET (body NULL) with the test key; *resp malloc'd. */
int st_request(int port, const char *path, const char *body, char **resp);
/* The value of the /metrics sample `name` (first with that name). */
double st_metric(int port, const char *name);
/* Waits (at most 20 s) until the server has no request in flight, no
 * sequence queued or running and no KV block used. */
void st_wait_idle(int port);
/* What a client saw of a /v1/completions event stream. */
typedef struct st_stream {
    int32_t ids[64]; /* token_ids of the chunks (return_token_ids), the first 64 */
    int32_t n_ids;
    int chunks;                           /* chunks with a choice */
    int prompt_tokens, completion_tokens; /* from the usage chunk (include_usage), else -1 */
    char finish[16];
    bool done_seen, error_seen;
} st_stream;

/* Reads the stream to its end ([DONE], the connection's end or an error). */
void st_read_stream(serve_client *cl, st_stream *out);

/* dsc-generate's tokens for (prompt, options): n ids into out. */
int32_t st_generate(const int32_t *prompt, int32_t n_prompt, const char *options, int32_t *out, int32_t cap);

#endif
