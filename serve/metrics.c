/* Prometheus text exposition (format 0.0.4) of serve_metrics. Names follow
 * vLLM's where it has them (prefix dsc_ instead of vllm:). */
#include "serve/metrics.h"

static const int statuses[SERVE_N_STATUS - 1] = {200, 400, 401, 404, 405, 413, 429, 500, 503};
static const double bounds[SERVE_HIST_BUCKETS - 1] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                                      0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};

void serve_metrics_count_status(serve_metrics *m, int http_status) {
    int i = 0;
    while (i < SERVE_N_STATUS - 1 && statuses[i] != http_status)
        i++;
    m->by_status[i]++;
}

void serve_hist_observe(serve_hist *h, double seconds) {
    int i = 0;
    while (i < SERVE_HIST_BUCKETS - 1 && seconds > bounds[i])
        i++;
    h->buckets[i]++;
    h->count++;
    h->sum += seconds;
}

static void gauge(serve_buf *b, const char *name, const char *help, const char *model, double v) {
    serve_buf_printf(b, "# HELP %s %s\n# TYPE %s gauge\n%s{model=\"%s\"} %.17g\n", name, help, name, name, model,
                     v);
}

static void counter(serve_buf *b, const char *name, const char *help, const char *model, uint64_t v) {
    serve_buf_printf(b, "# HELP %s %s\n# TYPE %s counter\n%s{model=\"%s\"} %llu\n", name, help, name, name, model,
                     (unsigned long long)v);
}

static void histogram(serve_buf *b, const char *name, const char *help, const char *model, const serve_hist *h) {
    serve_buf_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < SERVE_HIST_BUCKETS; i++) {
        cum += h->buckets[i];
        if (i < SERVE_HIST_BUCKETS - 1)
            serve_buf_printf(b, "%s_bucket{model=\"%s\",le=\"%g\"} %llu\n", name, model, bounds[i],
                             (unsigned long long)cum);
        else
            serve_buf_printf(b, "%s_bucket{model=\"%s\",le=\"+Inf\"} %llu\n", name, model,
                             (unsigned long long)cum);
    }
    serve_buf_printf(b, "%s_sum{model=\"%s\"} %.9g\n%s_count{model=\"%s\"} %llu\n", name, model, h->sum, name,
                     model, (unsigned long long)h->count);
}

void serve_metrics_render(const serve_metrics *m, const char *model, serve_buf *b) {
    serve_buf_puts(b, "# HELP dsc_http_requests_total HTTP requests answered, by status code\n"
                      "# TYPE dsc_http_requests_total counter\n");
    for (int i = 0; i < SERVE_N_STATUS; i++) {
        if (i < SERVE_N_STATUS - 1)
            serve_buf_printf(b, "dsc_http_requests_total{model=\"%s\",status=\"%d\"} %llu\n", model, statuses[i],
                             (unsigned long long)m->by_status[i]);
        else
            serve_buf_printf(b, "dsc_http_requests_total{model=\"%s\",status=\"other\"} %llu\n", model,
                             (unsigned long long)m->by_status[i]);
    }
    gauge(b, "dsc_num_requests_in_flight", "generation requests being answered", model, m->in_flight);
    gauge(b, "dsc_num_requests_waiting", "sequences queued in the scheduler (preempted included)", model,
          m->waiting);
    gauge(b, "dsc_num_requests_running", "sequences the scheduler runs", model, m->running);
    gauge(b, "dsc_num_preempted", "sequences waiting again after a recompute preemption", model, m->preempted);
    counter(b, "dsc_num_preemptions_total", "recompute preemptions", model, m->preemptions);
    gauge(b, "dsc_kv_blocks_used", "KV cache blocks in use", model, m->kv_used);
    gauge(b, "dsc_kv_blocks_free", "KV cache blocks free", model, m->kv_total - m->kv_used);
    gauge(b, "dsc_kv_cache_usage_perc", "fraction of KV cache blocks in use", model,
          m->kv_total ? (double)m->kv_used / m->kv_total : 0.0);
    counter(b, "dsc_prompt_tokens_total", "prompt tokens of admitted sequences", model, m->prompt_tokens);
    counter(b, "dsc_generation_tokens_total", "generated tokens", model, m->generation_tokens);
    counter(b, "dsc_sequences_cancelled_total",
            "sequences cancelled before finishing (client gone, drain timeout)", model, m->cancelled);
    histogram(b, "dsc_time_to_first_token_seconds", "arrival to first generated token", model, &m->ttft);
    histogram(b, "dsc_inter_token_latency_seconds", "between consecutive tokens of a sequence", model, &m->itl);
    histogram(b, "dsc_e2e_request_latency_seconds", "arrival to the last token of a request", model, &m->e2e);
}
