/* The multi-rank plan channel: before each step rank 0 broadcasts its batch
 * plan over a dsc communicator (the ranks that serve together) and every
 * other rank replaces its plan with it. Four broadcasts: a header (counts
 * and the stop flag), then the submits, the token ids and the cancels, each
 * skipped when empty. The submits travel as raw bytes: every rank runs the
 * same binary, so the struct's layout is the same everywhere. A follower
 * checks what it received (counts, every token range inside the ids, the
 * logprobs counts) before allocating or applying it. Not here: what the plan means (plan.c)
 * or who builds it (loop.c). */
#include <stdio.h>
#include <string.h>

#include "dsc/comm.h"
#include "serve/logprobs.h"
#include "serve/plan.h"
#include "serve/strbuf.h"

enum { HDR_SUBMITS = 0, HDR_IDS, HDR_CANCELS, HDR_STOP, HDR_N };

static dsc_status bcast(dsc_comm *comm, void *data, dsc_dtype dtype, int64_t n, const char *what) {
    if (n == 0) return NULL;
    dsc_tensor t = dsc_tensor_view(data, dtype, 1, &n, DSC_CPU);
    return dsc_error_wrap(dsc_comm_broadcast(comm, &t, 0), "batch plan: broadcast of the %s", what);
}

static bool range_ok(int64_t off, int64_t n, int64_t total) {
    return off >= 0 && n >= 0 && off <= total && n <= total - off;
}

/* A follower's view of the header: sizes it can allocate, and a plan it can apply. */
static dsc_status check_header(const int64_t *h) {
    DSC_CHECK(
        h[HDR_SUBMITS] >= 0 && h[HDR_SUBMITS] <= INT32_MAX && h[HDR_CANCELS] >= 0 && h[HDR_CANCELS] <= INT32_MAX &&
            h[HDR_IDS] >= 0 && h[HDR_IDS] <= INT32_MAX && (h[HDR_STOP] == 0 || h[HDR_STOP] == 1),
        DSC_ERR_CORRUPT, "batch plan from rank 0: bad header (%lld submits, %lld ids, %lld cancels, stop %lld)",
        (long long)h[HDR_SUBMITS], (long long)h[HDR_IDS], (long long)h[HDR_CANCELS], (long long)h[HDR_STOP]);
    return NULL;
}

static dsc_status check_submits(const serve_plan *p) {
    for (int32_t i = 0; i < p->n_submits; i++) {
        const serve_plan_submit *s = &p->submits[i];
        DSC_CHECK(range_ok(s->prompt_off, s->n_prompt, p->n_ids) && range_ok(s->stop_off, s->n_stop, p->n_ids),
                  DSC_ERR_CORRUPT,
                  "batch plan from rank 0: submit %d (uid %llu) names tokens outside the plan's %lld ids", i,
                  (unsigned long long)s->uid, (long long)p->n_ids);
        DSC_CHECK(s->logprobs >= -1 && s->logprobs <= SERVE_LOGPROBS_MAX, DSC_ERR_CORRUPT,
                  "batch plan from rank 0: submit %d (uid %llu) asks for %d logprobs (-1..%d)", i,
                  (unsigned long long)s->uid, s->logprobs, SERVE_LOGPROBS_MAX);
    }
    return NULL;
}

static dsc_status exchange_comm(void *impl, serve_plan *p) {
    dsc_comm *comm = impl;
    bool root = dsc_comm_rank(comm) == 0;
    int64_t h[HDR_N] = {p->n_submits, p->n_ids, p->n_cancels, p->stop};
    DSC_TRY(bcast(comm, h, DSC_DTYPE_I64, HDR_N, "header"));
    if (!root) {
        DSC_TRY(check_header(h));
        bool ok = serve_grow((void **)&p->submits, &p->cap_submits, h[HDR_SUBMITS], sizeof *p->submits) &&
                  serve_grow((void **)&p->ids, &p->cap_ids, h[HDR_IDS], sizeof *p->ids) &&
                  serve_grow((void **)&p->cancels, &p->cap_cancels, h[HDR_CANCELS], sizeof *p->cancels);
        DSC_CHECK(ok, DSC_ERR_NOMEM, "batch plan from rank 0: %lld submits, %lld ids, %lld cancels",
                  (long long)h[HDR_SUBMITS], (long long)h[HDR_IDS], (long long)h[HDR_CANCELS]);
        p->n_submits = (int32_t)h[HDR_SUBMITS];
        p->n_ids = h[HDR_IDS];
        p->n_cancels = (int32_t)h[HDR_CANCELS];
        p->stop = h[HDR_STOP] != 0;
    }
    DSC_TRY(bcast(comm, p->submits, DSC_DTYPE_U8, (int64_t)p->n_submits * (int64_t)sizeof *p->submits, "submits"));
    DSC_TRY(bcast(comm, p->ids, DSC_DTYPE_I32, p->n_ids, "token ids"));
    DSC_TRY(bcast(comm, p->cancels, DSC_DTYPE_I64, p->n_cancels, "cancels"));
    return root ? NULL : check_submits(p);
}

serve_plan_channel serve_plan_channel_comm(dsc_comm *comm) {
    return (serve_plan_channel){.impl = comm, .exchange = exchange_comm};
}
