/* A job's life: created by the HTTP side for one generation request (one
 * sequence per prompt), referenced by the HTTP side and, once queued, by
 * the step loop; the last reference frees it and ends its slot among the
 * requests in flight. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "serve/serve_internal.h"

serve_job *serve_job_new(dsc_server *srv, const serve_params *p, int32_t max_tokens) {
    serve_job *job = calloc(1, sizeof *job);
    if (!job) return NULL;
    job->p = *p;
    job->n_seqs = p->n_prompts;
    job->seqs = calloc((size_t)job->n_seqs, sizeof *job->seqs);
    bool ok = job->seqs != NULL;
    for (int32_t i = 0; ok && i < job->n_seqs; i++) {
        job->seqs[i].max_tokens = max_tokens;
        ok = (job->seqs[i].gen = malloc((size_t)max_tokens * sizeof *job->seqs[i].gen)) != NULL;
        job->prompt_tokens += p->prompts[i].n_ids;
    }
    pthread_cond_init(&job->cond, NULL);
    job->refs = 1;
    job->t_arrival = serve_now();
    job->created = (int64_t)time(NULL);
    pthread_mutex_lock(&srv->mu);
    unsigned long long n = (unsigned long long)++srv->n_requests;
    pthread_mutex_unlock(&srv->mu);
    snprintf(job->id, sizeof job->id, "%s-%llx%06llx", p->kind == SERVE_KIND_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)job->created, n);
    if (!ok) {
        job->p = (serve_params){0}; /* the caller still owns p */
        pthread_mutex_lock(&srv->mu);
        serve_job_unref(srv, job);
        pthread_mutex_unlock(&srv->mu);
        return NULL;
    }
    return job;
}

void serve_job_unref(dsc_server *srv, serve_job *job) {
    if (--job->refs > 0) return;
    if (job->counted) {
        srv->in_flight--;
        pthread_cond_signal(&srv->wake);
    }
    for (int32_t i = 0; job->seqs && i < job->n_seqs; i++) {
        free(job->seqs[i].gen);
        serve_text_free(&job->seqs[i].text);
    }
    free(job->seqs);
    free(job->events);
    free(job->tops);
    serve_params_free(&job->p);
    pthread_cond_destroy(&job->cond);
    free(job);
}
