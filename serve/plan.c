/* The batch plan's buffers, its application to a scheduler, and the
 * one-rank channel. See plan.h for the contract ranks rely on. */
#include "serve/plan.h"

#include <stdlib.h>
#include <string.h>

#include "serve/strbuf.h"

dsc_status serve_plan_add_submit(serve_plan *p, const dsc_gen_request *r, int32_t logprobs) {
    bool ok = serve_grow((void **)&p->submits, &p->cap_submits, p->n_submits + 1, sizeof *p->submits) &&
              serve_grow((void **)&p->ids, &p->cap_ids, p->n_ids + r->n_prompt + r->n_stop, sizeof *p->ids);
    DSC_CHECK(ok, DSC_ERR_NOMEM, "batch plan: request %llu", (unsigned long long)r->uid);
    serve_plan_submit *s = &p->submits[p->n_submits++];
    *s = (serve_plan_submit){.uid = r->uid,
                             .prompt_off = p->n_ids,
                             .n_prompt = r->n_prompt,
                             .max_new_tokens = r->max_new_tokens,
                             .sampling = r->sampling,
                             .seed = r->seed,
                             .stop_off = p->n_ids + r->n_prompt,
                             .n_stop = r->n_stop,
                             .logprobs = logprobs};
    memcpy(p->ids + s->prompt_off, r->prompt, (size_t)r->n_prompt * sizeof *p->ids);
    if (r->n_stop > 0) memcpy(p->ids + s->stop_off, r->stop_tokens, (size_t)r->n_stop * sizeof *p->ids);
    p->n_ids += r->n_prompt + r->n_stop;
    return NULL;
}

dsc_status serve_plan_add_cancel(serve_plan *p, uint64_t uid) {
    DSC_CHECK(serve_grow((void **)&p->cancels, &p->cap_cancels, p->n_cancels + 1, sizeof *p->cancels),
              DSC_ERR_NOMEM, "batch plan: cancel of %llu", (unsigned long long)uid);
    p->cancels[p->n_cancels++] = uid;
    return NULL;
}

void serve_plan_clear(serve_plan *p) {
    p->n_submits = p->n_cancels = 0;
    p->n_ids = 0;
    p->stop = false;
}

void serve_plan_free(serve_plan *p) {
    free(p->submits);
    free(p->ids);
    free(p->cancels);
    *p = (serve_plan){0};
}

dsc_status serve_plan_apply(const serve_plan *p, dsc_scheduler *s,
                            void (*on_submit)(void *user, int32_t i, dsc_status result), void *user) {
    for (int32_t i = 0; i < p->n_cancels; i++)
        DSC_TRY(dsc_scheduler_release(s, p->cancels[i]));
    for (int32_t i = 0; i < p->n_submits; i++) {
        const serve_plan_submit *q = &p->submits[i];
        dsc_gen_request r = {.uid = q->uid,
                             .prompt = p->ids + q->prompt_off,
                             .n_prompt = q->n_prompt,
                             .max_new_tokens = q->max_new_tokens,
                             .sampling = q->sampling,
                             .seed = q->seed,
                             .stop_tokens = p->ids + q->stop_off,
                             .n_stop = q->n_stop};
        dsc_status st = dsc_scheduler_submit(s, &r);
        if (on_submit)
            on_submit(user, i, st);
        else
            dsc_status_free(st);
    }
    return NULL;
}

static dsc_status exchange_single(void *impl, serve_plan *p) {
    (void)impl;
    (void)p;
    return NULL;
}

serve_plan_channel serve_plan_channel_single(void) {
    return (serve_plan_channel){.impl = NULL, .exchange = exchange_single};
}
