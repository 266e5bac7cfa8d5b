/* The server's Prometheus metrics: HTTP requests by status, the scheduler's
 * queue, running and preempted sequences, KV blocks, prompt and generated
 * tokens, cancellations, and latency histograms (time to first token,
 * inter-token latency, end-to-end). Plain counters: the caller holds the
 * server's mutex around every update and around rendering. */
#ifndef DSC_SERVE_METRICS_H
#define DSC_SERVE_METRICS_H

#include <stdint.h>

#include "serve/strbuf.h"

enum { SERVE_HIST_BUCKETS = 15, SERVE_N_STATUS = 10 };

typedef struct serve_hist {
    double sum;
    uint64_t count;
    uint64_t buckets[SERVE_HIST_BUCKETS]; /* not cumulative; the last is +Inf */
} serve_hist;

typedef struct serve_metrics {
    uint64_t by_status[SERVE_N_STATUS];
    uint64_t prompt_tokens, generation_tokens;
    uint64_t cancelled; /* sequences cancelled before they finished */
    uint64_t preemptions;
    int32_t waiting, running, preempted; /* sequences, as of the last step */
    int32_t kv_used, kv_total;
    int32_t in_flight; /* generation requests */
    serve_hist ttft, itl, e2e;
} serve_metrics;

void serve_metrics_count_status(serve_metrics *m, int http_status);
void serve_hist_observe(serve_hist *h, double seconds);
void serve_metrics_render(const serve_metrics *m, const char *model, serve_buf *out);

#endif
