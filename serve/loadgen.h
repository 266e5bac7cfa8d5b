/* A bounded load generator for dsc-serve on 127.0.0.1: `concurrency`
 * client threads send streaming /v1/completions requests (token-id prompts
 * of random length and content, greedy, random max_tokens) until
 * `requests` were sent or `time_limit_s` passed; a fraction of clients
 * leave mid-stream. It measures throughput, time to first token and
 * inter-token latency as the client sees them. The request mix is a pure
 * function of (seed, request index), so two servers get the same mix. */
#ifndef DSC_SERVE_LOADGEN_H
#define DSC_SERVE_LOADGEN_H

#include <stdint.h>

#include "dsc/status.h"

typedef struct serve_load_config {
    int port;
    const char *headers; /* extra request headers ("Authorization: Bearer K\r\n") or NULL */
    int32_t concurrency, requests;
    double time_limit_s;
    double disconnect_fraction; /* of requests, abandoned after 1..4 tokens */
    int32_t vocab, prompt_min, prompt_max, tokens_min, tokens_max;
    uint64_t seed;
} serve_load_config;

typedef struct serve_load_result {
    int64_t sent, completed, disconnected, rejected, failed;
    int64_t tokens; /* generated tokens received */
    double elapsed_s;
    double ttft[3], itl[3]; /* p50, p90, p99 in seconds */
    char first_error[256];
} serve_load_result;

dsc_status serve_load_run(const serve_load_config *cfg, serve_load_result *out);

#endif
