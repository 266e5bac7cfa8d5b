/* dsc-generate — generate text with the inference engine, streaming tokens
 * as they come.
 *
 *   dsc-generate MODEL (--prompt TEXT | --tokens ID,ID,...) [options]
 *
 * MODEL is a Hugging Face directory (config.json + safetensors) or a dsc
 * training checkpoint (SAVE_DIR, SAVE_DIR/TAG or a state.h5). Text goes
 * through the byte tokenizer for dsc models and through MODEL/tokenizer.json
 * (or --tokenizer) for Hugging Face models; without a tokenizer, prompts
 * are token ids and ids are printed. Runs as one process, or as one
 * tensor-parallel group with --tp N under `dsc-launch -n N` (every rank
 * loads its shard and runs the same scheduler; rank 0 prints). --config
 * reads DeepSpeed inference config keys (tensor_parallel.tp_size,
 * tp_grain_size, partition_config, max_out_tokens, min_out_tokens). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsc/comm.h"
#include "dsc/inference.h"
#include "dsc/kernels.h"
#include "dsc/tokenizer.h"

enum { MAX_IDS = 65536, MAX_STOP = 16 };

typedef struct options {
    const char *model, *prompt, *tokens, *tokenizer, *config;
    int32_t max_new, stop[MAX_STOP], n_stop, bos, tp;
    int64_t grain;
    dsc_sampling_params sampling;
    uint64_t seed;
    bool quiet, print_plan;
} options;

typedef struct stream {
    dsc_tokenizer *tok;
    dsc_tokenizer_stream state;
    int64_t n;
    double t0, first;
    bool print; /* rank 0 of the tensor-parallel group prints */
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
                    "  --tp N                  tensor parallelism over N ranks (run under dsc-launch -n N)\n"
                    "  --tp-grain G            tp_grain_size: MLP and vocabulary cuts in multiples of G (64)\n"
                    "  --print-plan            print the sharding plan for --tp N and exit (no ranks needed)\n"
                    "  --config FILE           DeepSpeed inference config (tensor_parallel, max_out_tokens,\n"
                    "                          min_out_tokens); command-line --tp / --tp-grain win\n"
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
    *o = (options){.max_new = 64, .bos = -1, .sampling = dsc_sampling_params_greedy(), .seed = 1, .tp = 0};
    if (argc < 2 || argv[1][0] == '-') return false;
    o->model = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--quiet") == 0 || strcmp(a, "--print-plan") == 0) {
            *(a[2] == 'q' ? &o->quiet : &o->print_plan) = true;
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
        else if (strcmp(a, "--tp") == 0)
            o->tp = (int32_t)strtol(v, &end, 10);
        else if (strcmp(a, "--tp-grain") == 0)
            o->grain = strtoll(v, &end, 10);
        else if (strcmp(a, "--config") == 0)
            o->config = v;
        else if (strcmp(a, "--stop") == 0) {
            if (!parse_ids(v, o->stop, MAX_STOP, &o->n_stop)) return false;
        } else
            return false;
        if (end && *end) return false;
    }
    if (o->print_plan) return o->tp >= 1 || o->config;
    return (o->prompt != NULL) != (o->tokens != NULL) && o->max_new >= 1 && o->tp >= 0 && o->grain >= 0;
}

static dsc_status on_token(void *user, uint64_t uid, int32_t token, bool finished) {
    (void)uid;
    stream *s = user;
    if (s->n++ == 0) s->first = now_s();
    if (!s->print) return NULL;
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

/* --print-plan: the sharding plan, from the checkpoint's header and config alone. */
static dsc_status print_plan(const options *o, const dsc_infer_ds_config *c) {
    dsc_tp_plan *plan;
    DSC_TRY(dsc_infer_model_plan(o->model, &c->tp, &plan));
    dsc_tp_plan_print(plan, stdout);
    dsc_tp_plan_destroy(plan);
    return NULL;
}

/* The tensor-parallel group: the whole world, which must have tp_size ranks (one group per launch). */
static dsc_status tp_group(const dsc_infer_ds_config *c, dsc_comm **world) {
    *world = NULL;
    int size;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (c->tp.tp_size == 1 && size == 1) return NULL;
    DSC_CHECK(c->tp.tp_size == size, DSC_ERR_CONFIG,
              "tensor_parallel.tp_size %d with %d ranks: dsc-generate runs one tensor-parallel group, so launch it "
              "with dsc-launch -n %d",
              c->tp.tp_size, size, c->tp.tp_size);
    return dsc_comm_world(NULL, world);
}

static dsc_status run(const options *o, const dsc_infer_ds_config *c, dsc_comm *world) {
    dsc_infer_model *m = NULL;
    dsc_tokenizer *tok = NULL;
    dsc_infer_engine *e = NULL;
    dsc_scheduler *sched = NULL;
    int32_t *ids = malloc(MAX_IDS * sizeof *ids);
    int64_t n = 0;
    dsc_status s = ids ? NULL : dsc_error(DSC_ERR_NOMEM, "prompt buffer");
    double t0 = now_s();
    dsc_infer_tp tp = c->tp;
    tp.comm = world;
    bool lead = !world || dsc_comm_rank(world) == 0;
    if (!s) s = dsc_infer_model_load_tp(o->model, world ? &tp : NULL, &m);
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
        if (o->config && c->max_out_tokens < ec.max_context) ec.max_context = c->max_out_tokens;
        ec.max_sequences = ec.max_batch_sequences = 1;
        s = dsc_infer_engine_create(m, &ec, &e);
    }
    int32_t max_new = o->max_new;
    if (!s) {
        /* The last generated token is never fed back, so a context of N holds N - prompt + 1 new tokens;
         * the KV cache holds total blocks x block size tokens. */
        const dsc_kv_config *kv = dsc_infer_engine_kv_config(e);
        int64_t ctx = kv->max_context, cache = (int64_t)dsc_infer_engine_total_blocks(e) * kv->block_size;
        if (cache < ctx) ctx = cache;
        int64_t room = ctx - n + 1;
        if (room < c->min_out_tokens)
            s = dsc_error(DSC_ERR_INVALID,
                          "min_out_tokens %lld: after the %lld-token prompt the context (%lld tokens, max_out_tokens "
                          "%lld) and the KV cache (%lld tokens) leave room for %lld new tokens",
                          (long long)c->min_out_tokens, (long long)n, (long long)kv->max_context,
                          (long long)c->max_out_tokens, (long long)cache, (long long)(room > 0 ? room : 0));
        else if (room < max_new) {
            if (lead)
                fprintf(stderr, "dsc-generate: --max-new-tokens %d clamped to %lld: the context holds %lld tokens\n",
                        max_new, (long long)room, (long long)ctx);
            max_new = (int32_t)room;
        }
    }
    stream st = {.tok = tok, .t0 = now_s(), .print = lead};
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
        if (lead && o->prompt && tok)
            fputs(o->prompt, stdout);
        else
            for (int64_t i = 0; lead && i < n; i++)
                printf(i ? " %d" : "%d", ids[i]);
        fflush(stdout);
        s = dsc_scheduler_submit(sched, &r);
        st.t0 = now_s();
        if (!s) s = dsc_scheduler_run(sched);
    }
    if (!s && !o->quiet && lead) {
        double end = now_s(), decode = end - st.first;
        fprintf(stderr,
                "[%s: loaded in %.2f s; prompt %lld tokens, first token after %.3f s; %lld tokens, %.1f tokens/s "
                "after the first; %d threads; tp %d, %.3f s in all-reduces]\n",
                dsc_infer_model_arch(m), t_load - t0, (long long)n, st.first - st.t0, (long long)st.n,
                st.n > 1 && decode > 0 ? (double)(st.n - 1) / decode : 0.0, dsc_kernels_get_num_threads(),
                world ? dsc_comm_size(world) : 1, dsc_infer_model_comm_seconds(m));
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
    dsc_infer_ds_config c;
    dsc_comm *world = NULL;
    dsc_status s = dsc_infer_ds_config_load(o.config, &c);
    if (!s && o.tp > 0) c.tp.tp_size = o.tp;
    if (!s && o.grain > 0) c.tp.grain = o.grain;
    if (!s && o.print_plan)
        s = print_plan(&o, &c);
    else if (!s) {
        s = tp_group(&c, &world);
        if (!s) s = run(&o, &c, world);
    }
    dsc_infer_ds_config_free(&c);
    dsc_comm_free(world);
    int rc = 0;
    if (s) {
        fprintf(stderr, "dsc-generate: %s\n", dsc_status_message(s));
        dsc_status_free(s);
        rc = 1;
    }
    MPI_Finalize();
    return rc;
}
