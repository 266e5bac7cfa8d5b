/* dsc-generate — generate text with the inference engine, streaming tokens
 * as they come.
 *
 *   dsc-generate MODEL (--prompt TEXT | --tokens ID,ID,...) [options]
 *
 * MODEL is a Hugging Face directory (config.json + safetensors) or a dsc
 * training checkpoint (SAVE_DIR, SAVE_DIR/TAG or a state.h5). Text goes
 * through the byte tokenizer for dsc models and through MODEL/tokenizer.json
 * (or --tokenizer) for Hugging Face models; without a tokenizer, prompts
 * are token ids and ids are printed. Runs as one process. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsc/inference.h"
#include "dsc/kernels.h"
#include "dsc/tokenizer.h"

enum { MAX_IDS = 65536, MAX_STOP = 16 };

typedef struct options {
    const char *model, *prompt, *tokens, *tokenizer;
    int32_t max_new, stop[MAX_STOP], n_stop, bos;
    dsc_sampling_params sampling;
    uint64_t seed;
    bool quiet;
} options;

typedef struct stream {
    dsc_tokenizer *tok;
    dsc_tokenizer_stream state;
    int64_t n;
    double t0, first;
} stream;

static void usage(void) {
    fprintf(stderr, "usage: dsc-generate MODEL (--prompt TEXT | --tokens ID,ID,...) [options]\n"
                    "  --max-new-tokens N      tokens to generate (64)\n"
                    "  --temperature T         0 = greedy (default); > 0 samples\n"
                    "  --top-k K  --top-p P    sampling filters (off)\n"
                    "  --repetition-penalty R  HF semantics (1 = off)\n"
                    "  --seed S                sampling seed (1)\n"
                    "  --stop ID[,ID...]       stop tokens (generation ends after emitting one)\n"
                    "  --bos ID                prepend this id to the prompt\n"
                    "  --tokenizer PATH        tokenizer.json (default: MODEL/tokenizer.json when present)\n"
                    "  --quiet                 no statistics on stderr\n"
                    "MODEL: a Hugging Face directory or a dsc checkpoint (SAVE_DIR, SAVE_DIR/TAG, state.h5)\n");
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Parses "1,2,3" into ids; false on a malformed list. */
static bool parse_ids(const char *s, int32_t *ids, int32_t cap, int32_t *n) {
    *n = 0;
    while (*s) {
        char *end;
        errno = 0;
        long v = strtol(s, &end, 10);
        if (end == s || errno || v < 0 || v > INT32_MAX || *n == cap) return false;
        ids[(*n)++] = (int32_t)v;
        s = *end == ',' ? end + 1 : end;
        if (*end && *end != ',') return false;
    }
    return *n > 0;
}

static bool parse_args(int argc, char **argv, options *o) {
    *o = (options){.max_new = 64, .bos = -1, .sampling = dsc_sampling_params_greedy(), .seed = 1};
    if (argc < 2 || argv[1][0] == '-') return false;
    o->model = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quiet") == 0) {
            o->quiet = true;
            continue;
        }
        if (!v) return false;
        i++;
        char *end = NULL;
        if (strcmp(a, "--prompt") == 0)
            o->prompt = v;
        else if (strcmp(a, "--tokens") == 0)
            o->tokens = v;
        else if (strcmp(a, "--tokenizer") == 0)
            o->tokenizer = v;
        else if (strcmp(a, "--max-new-tokens") == 0)
            o->max_new = (int32_t)strtol(v, &end, 10);
        else if (strcmp(a, "--temperature") == 0)
            o->sampling.temperature = strtof(v, &end);
        else if (strcmp(a, "--top-k") == 0)
            o->sampling.top_k = (int32_t)strtol(v, &end, 10);
        else if (strcmp(a, "--top-p") == 0)
            o->sampling.top_p = strtof(v, &end);
        else if (strcmp(a, "--repetition-penalty") == 0)
            o->sampling.repetition_penalty = strtof(v, &end);
        else if (strcmp(a, "--seed") == 0)
            o->seed = strtoull(v, &end, 10);
        else if (strcmp(a, "--bos") == 0)
            o->bos = (int32_t)strtol(v, &end, 10);
        else if (strcmp(a, "--stop") == 0) {
            if (!parse_ids(v, o->stop, MAX_STOP, &o->n_stop)) return false;
        } else
            return false;
        if (end && *end) return false;
    }
    return (o->prompt != NULL) != (o->tokens != NULL) && o->max_new >= 1;
}

static dsc_status on_token(void *user, uint64_t uid, int32_t token, bool finished) {
    (void)uid;
    stream *s = user;
    if (s->n++ == 0) s->first = now_s();
    char text[256];
    size_t len;
    if (s->tok) {
        DSC_TRY(dsc_tokenizer_decode_next(s->tok, &s->state, token, text, sizeof text, &len));
        fwrite(text, 1, len, stdout);
        if (finished) {
            DSC_TRY(dsc_tokenizer_decode_finish(&s->state, text, sizeof text, &len));
            fwrite(text, 1, len, stdout);
        }
    } else {
        printf(" %d", token);
    }
    if (finished) printf("\n");
    fflush(stdout);
    return NULL;
}

static dsc_status run(const options *o) {
    dsc_infer_model *m = NULL;
    dsc_tokenizer *tok = NULL;
    dsc_infer_engine *e = NULL;
    dsc_scheduler *sched = NULL;
    int32_t *ids = malloc(MAX_IDS * sizeof *ids);
    int64_t n = 0;
    dsc_status s = ids ? NULL : dsc_error(DSC_ERR_NOMEM, "prompt buffer");
    double t0 = now_s();
    if (!s) s = dsc_infer_model_load(o->model, &m);
    if (!s) s = dsc_infer_model_open_tokenizer(o->model, m, o->tokenizer, &tok);
    if (!s && o->bos >= 0) ids[n++] = o->bos;
    if (!s && o->tokens) {
        int32_t k;
        if (!parse_ids(o->tokens, ids + n, (int32_t)(MAX_IDS - n), &k))
            s = dsc_error(DSC_ERR_INVALID, "--tokens: expected ID,ID,... (got \"%s\")", o->tokens);
        n += k;
    } else if (!s) {
        int64_t k;
        if (!tok)
            s = dsc_error(DSC_ERR_INVALID, "%s has no tokenizer.json: pass --tokens or --tokenizer", o->model);
        else
            s = dsc_tokenizer_encode(tok, o->prompt, strlen(o->prompt), ids + n, MAX_IDS - n, &k);
        n += s ? 0 : k;
    }
    double t_load = now_s();
    if (!s) {
        dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
        int64_t need = n + o->max_new;
        if (need > ec.max_context) ec.max_context = need; /* clipped to the model's limit by the engine */
        ec.max_sequences = ec.max_batch_sequences = 1;
        s = dsc_infer_engine_create(m, &ec, &e);
    }
    int32_t max_new = o->max_new;
    if (!s) {
        /* The last generated token is never fed back, so a context of N holds N - prompt + 1 new tokens. */
        int64_t room = dsc_infer_engine_kv_config(e)->max_context - n + 1;
        if (room < 1)
            s = dsc_error(DSC_ERR_INVALID, "the prompt (%lld tokens) fills the model's context (%lld)",
                          (long long)n, (long long)dsc_infer_engine_kv_config(e)->max_context);
        else if (room < max_new) {
            fprintf(stderr,
                    "dsc-generate: --max-new-tokens %d clamped to %lld: the model's context is %lld tokens\n",
                    max_new, (long long)room, (long long)dsc_infer_engine_kv_config(e)->max_context);
            max_new = (int32_t)room;
        }
    }
    stream st = {.tok = tok, .t0 = now_s()};
    dsc_tokenizer_stream_init(&st.state);
    if (!s) {
        dsc_scheduler_config sc = dsc_scheduler_config_default(e);
        s = dsc_scheduler_create(e, &sc, on_token, &st, &sched);
    }
    if (!s) {
        dsc_gen_request r = {.uid = 1,
                             .prompt = ids,
                             .n_prompt = (int32_t)n,
                             .max_new_tokens = max_new,
                             .sampling = o->sampling,
                             .seed = o->seed,
                             .stop_tokens = o->stop,
                             .n_stop = o->n_stop};
        if (o->prompt && tok)
            fputs(o->prompt, stdout);
        else
            for (int64_t i = 0; i < n; i++)
                printf(i ? " %d" : "%d", ids[i]);
        fflush(stdout);
        s = dsc_scheduler_submit(sched, &r);
        st.t0 = now_s();
        if (!s) s = dsc_scheduler_run(sched);
    }
    if (!s && !o->quiet) {
        double end = now_s(), decode = end - st.first;
        fprintf(stderr,
                "[%s: loaded in %.2f s; prompt %lld tokens, first token after %.3f s; %lld tokens, %.1f tokens/s "
                "after the first; %d threads]\n",
                dsc_infer_model_arch(m), t_load - t0, (long long)n, st.first - st.t0, (long long)st.n,
                st.n > 1 && decode > 0 ? (double)(st.n - 1) / decode : 0.0, dsc_kernels_get_num_threads());
    }
    dsc_scheduler_destroy(sched);
    dsc_infer_engine_destroy(e);
    dsc_tokenizer_destroy(tok);
    dsc_infer_model_destroy(m);
    free(ids);
    return s;
}

int main(int argc, char **argv) {
    options o;
    if (!parse_args(argc, argv, &o)) {
        usage();
        return 2;
    }
    MPI_Init(&argc, &argv);
    dsc_status s = run(&o);
    int rc = 0;
    if (s) {
        fprintf(stderr, "dsc-generate: %s\n", dsc_status_message(s));
        dsc_status_free(s);
        rc = 1;
    }
    MPI_Finalize();
    return rc;
}
