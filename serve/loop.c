/* The step loop (the thread that calls dsc_server_run owns the engine and
 * the scheduler): each iteration takes new jobs and cancellations from the
 * HTTP side, writes them into the batch plan, exchanges the plan (plan.h:
 * broadcast to the other ranks when the engine is split), applies it, and runs one
 * forward. Generated tokens come back through the scheduler's callback,
 * which turns each into an event of its job (text, logprobs, finish
 * reason) and wakes the job's HTTP thread.
 *
 * Every release of a sequence from the scheduler — finished, stopped by a
 * stop string, cancelled because its client left or the drain timed out —
 * goes through the plan's cancel list, so all ranks release the same
 * sequences in the same iteration; ranks other than 0 only follow (follow()).
 * Not here: HTTP (http.c), parsing and
 * tokenizing (request.c, http.c), rendering (response.c). */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "serve/serve_internal.h"
#include "serve/strbuf.h"

double serve_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static serve_job *find_seq(const dsc_server *srv, uint64_t uid, int32_t *seq) {
    for (int32_t j = 0; j < srv->n_active; j++) {
        serve_job *job = srv->active[j];
        for (int32_t i = 0; i < job->n_seqs; i++)
            if (job->seqs[i].uid == uid && job->seqs[i].in_sched) {
                *seq = i;
                return job;
            }
    }
    return NULL;
}

static bool is_stop_token(const dsc_server *srv, const serve_job *job, int32_t tok) {
    for (int32_t i = 0; i < srv->cfg.n_eos; i++)
        if (srv->cfg.eos[i] == tok) return true;
    for (int32_t i = 0; i < job->p.n_stop_ids; i++)
        if (job->p.stop_ids[i] == tok) return true;
    return job->p.kind == SERVE_KIND_CHAT && srv->chat_end_id >= 0 && tok == srv->chat_end_id;
}

/* This sequence's top-logprobs count (-1: none), from the table every rank keeps. */
static int32_t lp_count(const dsc_server *srv, uint64_t uid) {
    for (int32_t i = 0; i < srv->n_lp_seqs; i++)
        if (srv->lp_seqs[i].uid == uid) return srv->lp_seqs[i].n;
    return -1;
}

/* Every rank: the logprobs of uid's token. The last stage computes them
 * over its TP group's vocabulary slices (the row is there only); under
 * pipeline parallelism it broadcasts them over the pipeline group, so rank
 * 0 (on stage 0) has them. Every replica reports the same tokens in the same
 * order, so these collectives match across ranks. */
static dsc_status token_logprobs(dsc_server *srv, uint64_t uid, int32_t token, int32_t n_lp, serve_logprob *lp) {
    if (srv->last_stage) {
        const float *row = dsc_scheduler_token_logits(srv->sched);
        DSC_CHECK(row, DSC_ERR_INTERNAL, "logprobs of sequence %llu: no logits row", (unsigned long long)uid);
        DSC_TRY(serve_logprobs(srv->vocab_comm, row, dsc_infer_engine_logits_width(srv->engine), srv->vocab0,
                               token, n_lp, lp));
    }
    dsc_comm *pipe = srv->cfg.pipe_comm;
    if (!pipe) return NULL;
    int64_t bytes = (int64_t)(1 + n_lp) * (int64_t)sizeof *lp;
    dsc_tensor t = dsc_tensor_view(lp, DSC_DTYPE_U8, 1, &bytes, DSC_CPU);
    return dsc_error_wrap(dsc_comm_broadcast(pipe, &t, dsc_comm_size(pipe) - 1),
                          "logprobs of sequence %llu: broadcast from the last pipeline stage",
                          (unsigned long long)uid);
}

static bool add_event(serve_job *job, serve_event ev) {
    if (!serve_grow((void **)&job->events, &job->cap_events, job->n_events + 1, sizeof *job->events)) return false;
    job->events[job->n_events++] = ev;
    return true;
}

/* Gives seq a finish reason (once) and counts the job's finished sequences. */
static void finish_seq(dsc_server *srv, serve_job *job, serve_seq *q, serve_finish f) {
    if (q->finish != SERVE_FINISH_NONE) return;
    q->finish = f;
    if (f == SERVE_FINISH_ABORT) srv->metrics.cancelled++;
    if (++job->n_finished == job->n_seqs) serve_hist_observe(&srv->metrics.e2e, serve_now() - job->t_arrival);
}

dsc_status serve_loop_on_token(void *user, uint64_t uid, int32_t token, bool finished) {
    dsc_server *srv = user;
    /* Every rank computes the logprobs (a collective across ranks), before rank 0 decides what to keep. */
    serve_logprob lp[1 + SERVE_MAX_LOGPROBS];
    int32_t n_lp = lp_count(srv, uid);
    if (n_lp >= 0) DSC_TRY(token_logprobs(srv, uid, token, n_lp, lp));
    if (srv->rank != 0) return NULL;
    dsc_status st = NULL;
    pthread_mutex_lock(&srv->mu);
    int32_t i;
    serve_job *job = find_seq(srv, uid, &i);
    serve_seq *q = job ? &job->seqs[i] : NULL;
    if (q && q->finish == SERVE_FINISH_NONE) { /* a stopped or cancelled sequence's last forward is ignored */
        double now = serve_now();
        srv->metrics.generation_tokens++;
        if (q->n_gen == 0)
            serve_hist_observe(&srv->metrics.ttft, now - job->t_arrival);
        else
            serve_hist_observe(&srv->metrics.itl, now - q->t_last);
        q->t_last = now;
        q->gen[q->n_gen++] = token;
        bool stop_tok = is_stop_token(srv, job, token), stopped;
        serve_finish f = finished ? (stop_tok ? SERVE_FINISH_STOP : SERVE_FINISH_LENGTH) : SERVE_FINISH_NONE;
        size_t before = q->text.visible;
        st = serve_text_append(&q->text, srv->tok, token, stop_tok, f != SERVE_FINISH_NONE, job->p.stop,
                               job->p.n_stop, &stopped);
        if (!st && stopped) f = SERVE_FINISH_STOP;
        serve_event ev = {.seq = i,
                          .token = token,
                          .off = before,
                          .len = q->text.visible - before,
                          .finish = f,
                          .top = job->n_tops,
                          .first = q->n_gen == 1};
        if (!st && n_lp >= 0) {
            if (serve_grow((void **)&job->tops, &job->cap_tops, job->n_tops + 1 + n_lp, sizeof *job->tops)) {
                memcpy(job->tops + job->n_tops, lp, (size_t)(1 + n_lp) * sizeof *lp);
                job->n_tops += 1 + n_lp;
            } else {
                st = dsc_error(DSC_ERR_NOMEM, "logprobs of request %s", job->id);
            }
        }
        if (!st && !add_event(job, ev)) st = dsc_error(DSC_ERR_NOMEM, "events of request %s", job->id);
        if (f != SERVE_FINISH_NONE) finish_seq(srv, job, q, f);
        pthread_cond_broadcast(&job->cond);
    }
    pthread_mutex_unlock(&srv->mu);
    return st;
}

/* Under the mutex: new jobs become active and enter the plan. */
static dsc_status plan_new_jobs(dsc_server *srv, int32_t *first_new) {
    *first_new = srv->n_active;
    while (srv->inbox) {
        serve_job *job = srv->inbox;
        DSC_CHECK(serve_grow((void **)&srv->active, &srv->cap_active, srv->n_active + 1, sizeof *srv->active),
                  DSC_ERR_NOMEM, "active request list");
        srv->inbox = job->next;
        job->next = NULL;
        srv->active[srv->n_active++] = job;
        int32_t stop[DSC_SERVE_MAX_EOS + SERVE_MAX_STOP_IDS + 1], n_stop = 0;
        for (int32_t k = 0; k < srv->cfg.n_eos; k++)
            stop[n_stop++] = srv->cfg.eos[k];
        for (int32_t k = 0; k < job->p.n_stop_ids; k++)
            stop[n_stop++] = job->p.stop_ids[k];
        if (job->p.kind == SERVE_KIND_CHAT && srv->chat_end_id >= 0) stop[n_stop++] = srv->chat_end_id;
        uint64_t seed = job->p.has_seed ? job->p.seed : srv->cfg.seed + srv->n_requests;
        for (int32_t i = 0; i < job->n_seqs; i++) {
            serve_seq *q = &job->seqs[i];
            q->uid = ++srv->next_uid;
            dsc_gen_request r = {.uid = q->uid,
                                 .prompt = job->p.prompts[i].ids,
                                 .n_prompt = job->p.prompts[i].n_ids,
                                 .max_new_tokens = q->max_tokens,
                                 .sampling = job->p.sampling,
                                 .seed = seed,
                                 .stop_tokens = stop,
                                 .n_stop = n_stop};
            DSC_TRY(serve_plan_add_submit(&srv->plan, &r, job->p.logprobs));
        }
    }
    srv->inbox_tail = NULL;
    return NULL;
}

/* Under the mutex: sequences to release (finished, stopped, cancelled). */
static dsc_status plan_releases(dsc_server *srv, bool cut) {
    for (int32_t j = 0; j < srv->n_active; j++) {
        serve_job *job = srv->active[j];
        for (int32_t i = 0; i < job->n_seqs; i++) {
            serve_seq *q = &job->seqs[i];
            if (!q->in_sched) continue;
            if (q->finish == SERVE_FINISH_NONE && (job->cancel || cut)) {
                finish_seq(srv, job, q, SERVE_FINISH_ABORT);
                if (!add_event(job, (serve_event){.seq = i,
                                                  .token = -1,
                                                  .off = q->text.visible,
                                                  .finish = SERVE_FINISH_ABORT,
                                                  .first = q->n_gen == 0}))
                    return dsc_error(DSC_ERR_NOMEM, "events of request %s", job->id);
                if (cut && !job->error.http)
                    serve_error_set(&job->error, 503, NULL, "the server stopped before the request finished");
            }
            if (q->finish != SERVE_FINISH_NONE) DSC_TRY(serve_plan_add_cancel(&srv->plan, q->uid));
        }
    }
    return NULL;
}

typedef struct submit_ctx {
    dsc_server *srv;
    int32_t first_new;
} submit_ctx;

/* Rank 0: the plan's submit i belongs to the i-th new sequence, in job order. */
static void admit(submit_ctx *c, int32_t i, dsc_status result) {
    dsc_server *srv = c->srv;
    for (int32_t j = c->first_new; j < srv->n_active; j++) {
        serve_job *job = srv->active[j];
        if (i >= job->n_seqs) {
            i -= job->n_seqs;
            continue;
        }
        serve_seq *q = &job->seqs[i];
        if (result) {
            if (job->admission != SERVE_ADMISSION_FAILED) {
                dsc_code code = dsc_status_code(result);
                serve_error_set(&job->error, code == DSC_ERR_INVALID ? 400 : 500, "prompt", "%s",
                                dsc_status_message(result));
            }
            job->admission = SERVE_ADMISSION_FAILED;
            job->cancel = true;
            q->finish = SERVE_FINISH_ABORT;
            job->n_finished++;
        } else {
            q->in_sched = true;
            srv->metrics.prompt_tokens += (uint64_t)job->p.prompts[i].n_ids;
        }
        break;
    }
    dsc_status_free(result);
}

/* Every rank: an admitted sequence that reports logprobs joins the table (room was reserved). */
static void on_submit(void *user, int32_t i, dsc_status result) {
    submit_ctx *c = user;
    dsc_server *srv = c->srv;
    const serve_plan_submit *q = &srv->plan.submits[i];
    if (!result && q->logprobs >= 0) srv->lp_seqs[srv->n_lp_seqs++] = (serve_lp_seq){q->uid, q->logprobs};
    if (srv->rank == 0)
        admit(c, i, result);
    else
        dsc_status_free(result);
}

/* Every rank: the plan applied to its scheduler; released sequences leave the logprobs table. */
static dsc_status apply_plan(dsc_server *srv, submit_ctx *ctx) {
    const serve_plan *p = &srv->plan;
    DSC_CHECK(
        serve_grow((void **)&srv->lp_seqs, &srv->cap_lp_seqs, srv->n_lp_seqs + p->n_submits, sizeof *srv->lp_seqs),
        DSC_ERR_NOMEM, "logprobs table");
    DSC_TRY(serve_plan_apply(p, srv->sched, on_submit, ctx));
    for (int32_t k = 0; k < p->n_cancels; k++)
        for (int32_t i = 0; i < srv->n_lp_seqs; i++)
            if (srv->lp_seqs[i].uid == p->cancels[k]) {
                srv->lp_seqs[i] = srv->lp_seqs[--srv->n_lp_seqs];
                break;
            }
    return NULL;
}

/* Under the mutex, after the plan was applied: released sequences leave the
 * scheduler, jobs whose sequences are all released are done. */
static void settle(dsc_server *srv, int32_t first_new) {
    for (int32_t k = 0; k < srv->plan.n_cancels; k++) {
        int32_t i;
        serve_job *job = find_seq(srv, srv->plan.cancels[k], &i);
        if (job) job->seqs[i].in_sched = false;
    }
    for (int32_t j = first_new; j < srv->n_active; j++)
        if (srv->active[j]->admission == SERVE_ADMISSION_PENDING) srv->active[j]->admission = SERVE_ADMISSION_OK;
    int32_t kept = 0;
    for (int32_t j = 0; j < srv->n_active; j++) {
        serve_job *job = srv->active[j];
        bool busy = job->n_finished < job->n_seqs;
        for (int32_t i = 0; i < job->n_seqs && !busy; i++)
            busy = job->seqs[i].in_sched;
        pthread_cond_broadcast(&job->cond);
        if (busy) {
            srv->active[kept++] = job;
            continue;
        }
        job->done = true;
        serve_job_unref(srv, job);
    }
    srv->n_active = kept;
}

static void publish_gauges(dsc_server *srv) {
    dsc_scheduler_counts c = dsc_scheduler_get_counts(srv->sched);
    srv->metrics.waiting = c.waiting;
    srv->metrics.running = c.running;
    srv->metrics.preempted = c.preempted;
    srv->metrics.preemptions = (uint64_t)dsc_scheduler_get_stats(srv->sched)->preemptions;
    srv->metrics.kv_total = dsc_infer_engine_total_blocks(srv->engine);
    srv->metrics.kv_used = srv->metrics.kv_total - dsc_infer_engine_free_blocks(srv->engine);
}

static void fail_job(dsc_server *srv, serve_job *job, dsc_status err) {
    job->engine_failed = true;
    serve_error_set(&job->error, 500, NULL, "the engine failed: %s", dsc_status_message(err));
    if (job->admission == SERVE_ADMISSION_PENDING) job->admission = SERVE_ADMISSION_FAILED;
    for (int32_t i = 0; i < job->n_seqs; i++) {
        finish_seq(srv, job, &job->seqs[i], SERVE_FINISH_ABORT);
        job->seqs[i].in_sched = false;
    }
    job->done = true;
    pthread_cond_broadcast(&job->cond);
    serve_job_unref(srv, job);
}

/* The engine failed: every job, running or queued, ends with a 500 naming
 * the error, and no new one is taken (draining). */
static void fail_all(dsc_server *srv, dsc_status err) {
    pthread_mutex_lock(&srv->mu);
    for (int32_t j = 0; j < srv->n_active; j++)
        fail_job(srv, srv->active[j], err);
    srv->n_active = 0;
    while (srv->inbox) {
        serve_job *job = srv->inbox;
        srv->inbox = job->next;
        fail_job(srv, job, err);
    }
    srv->inbox_tail = NULL;
    srv->draining = true;
    pthread_mutex_unlock(&srv->mu);
}

/* Every rank, on the plan that says stop: steps until nothing is left in
 * flight. Under pipeline parallelism sequences released in flight still
 * occupy micro-batches whose activations are on their way between stages;
 * their last ticks land them (they are dropped, not reported) and free
 * their blocks. Without pipeline parallelism the first step is idle. */
static dsc_status drain_engine(dsc_server *srv) {
    for (bool idle = false; !idle;)
        DSC_TRY(dsc_scheduler_step(srv->sched, &idle));
    return NULL;
}

/* A rank other than 0: rank 0's plans, applied in the order they come, and
 * a step after each (rank 0 steps after every plan too: the scheduler
 * replicas decide alike whether the step is idle), until the plan that says
 * stop. */
static dsc_status follow(dsc_server *srv) {
    for (;;) {
        serve_plan_clear(&srv->plan);
        DSC_TRY(srv->channel.exchange(srv->channel.impl, &srv->plan));
        submit_ctx ctx = {srv, 0};
        DSC_TRY(apply_plan(srv, &ctx));
        if (srv->plan.stop) return drain_engine(srv);
        bool idle;
        DSC_TRY(dsc_scheduler_step(srv->sched, &idle));
    }
}

dsc_status dsc_server_run(dsc_server *srv) {
    if (srv->rank != 0) return follow(srv);
    dsc_status st = NULL;
    double deadline = 0;
    for (;;) {
        serve_plan_clear(&srv->plan);
        pthread_mutex_lock(&srv->mu);
        bool newly_draining = srv->stop_requested && !srv->draining;
        if (newly_draining) {
            srv->draining = true;
            deadline = serve_now() + srv->cfg.drain_timeout_s;
        }
        pthread_mutex_unlock(&srv->mu);
        if (newly_draining) serve_http_quiesce(srv);
        pthread_mutex_lock(&srv->mu);
        int32_t first_new;
        st = plan_new_jobs(srv, &first_new);
        if (!st) st = plan_releases(srv, srv->draining && serve_now() > deadline);
        srv->plan.stop = srv->draining && srv->in_flight == 0 && srv->n_active == 0;
        pthread_mutex_unlock(&srv->mu);
        if (!st) st = srv->channel.exchange(srv->channel.impl, &srv->plan);
        submit_ctx ctx = {srv, first_new};
        if (!st) {
            /* The scheduler is the step loop's; on_submit's job fields are the mutex's. */
            pthread_mutex_lock(&srv->mu);
            st = apply_plan(srv, &ctx);
            settle(srv, first_new);
            publish_gauges(srv);
            pthread_mutex_unlock(&srv->mu);
        }
        if (!st && srv->plan.stop) st = drain_engine(srv);
        if (st || srv->plan.stop) break;
        /* Stepped after every plan, also when nothing waits or runs: under
         * pipeline parallelism a released sequence may still be in flight,
         * and its blocks are freed when it lands. An idle step costs nothing
         * and is idle on every rank alike. */
        bool idle;
        st = dsc_scheduler_step(srv->sched, &idle);
        if (st) break;
        if (!idle) {
            pthread_mutex_lock(&srv->mu);
            publish_gauges(srv);
            pthread_mutex_unlock(&srv->mu);
            continue;
        }
        pthread_mutex_lock(&srv->mu);
        bool work = srv->inbox || srv->n_active > 0 || (srv->stop_requested && !srv->draining);
        if (!work) { /* woken by a new job, a freed one while draining, or after 50 ms */
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000 * 1000;
            if (ts.tv_nsec >= 1000000000L) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000L;
            }
            pthread_cond_timedwait(&srv->wake, &srv->mu, &ts);
        }
        pthread_mutex_unlock(&srv->mu);
    }
    if (st) fail_all(srv, st);
    return st;
}
