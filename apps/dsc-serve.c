/* dsc-serve — an OpenAI-compatible HTTP server over the inference engine.
 *
 *   dsc-serve MODEL [--port 8000] [--host 127.0.0.1] [options]
 *
 * MODEL is a Hugging Face directory or a dsc checkpoint, as for
 * dsc-generate. Prints "dsc-serve: listening on http://HOST:PORT ..." once
 * it accepts requests (with the pid of every rank); SIGTERM or SIGINT
 * drains it (exit 0). With --tp N, --pp P and/or --ep E under `dsc-launch
 * -n N*P*E` (DeepSpeed's grid: axes pipe, data, model; dsc/infer_grid.h)
 * every rank loads its shard of its stage (and its experts), prints which,
 * rank 0 speaks HTTP and the others follow its batch plans; a signal
 * to rank 0 drains every rank, the others ignore signals (they stop with
 * rank 0's last plan). SIGUSR2 is SIGTERM's stand-in: dsc-launch turns a
 * SIGTERM or SIGINT it gets into SIGUSR2, which mpirun passes to every rank. */
#define _POSIX_C_SOURCE 200809L /* sigaction */
#include <cjson/cJSON.h>
#include <errno.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/cli.h"
#include "dsc/comm.h"
#include "dsc/infer_grid.h"
#include "dsc/inference.h"
#include "dsc/serve.h"
#include "dsc/tokenizer.h"
#include "dsc/topology.h"

typedef struct options {
    const char *model, *tokenizer;
    dsc_serve_config serve;
    int64_t max_model_len, kv_cache_bytes;
    int32_t block_size, max_num_seqs, max_batched_tokens, kv_reserve, tp, pp, ep;
    const char *partition;    /* --partition: how layers are cut into stages (NULL: uniform) */
    int64_t max_weight_bytes; /* --max-weight-bytes (0: no budget) */
    bool bf16_kv, static_batching, prefill_first, eos_given;
    dsc_weight_format weight_type; /* of the projection weights (f32: as loaded) */
} options;

static dsc_server *volatile g_server;
static volatile sig_atomic_t g_stop; /* a signal came, perhaps before the server existed */

static void on_signal(int sig) {
    (void)sig;
    g_stop = 1;
    if (g_server) dsc_server_request_stop(g_server);
}

static void usage(FILE *fp) {
    fprintf(
        fp,
        "usage: dsc-serve MODEL [options]\n"
        "  --host ADDR                  IPv4 address to bind (127.0.0.1; 0.0.0.0 = every interface)\n"
        "  --port N                     port (8000; 0 = any free port, printed)\n"
        "  --api-key KEY                require Authorization: Bearer KEY (default: $DSC_API_KEY)\n"
        "  --served-model-name NAME     the model id of /v1/models (default: MODEL's last path element)\n"
        "  --tokenizer PATH             tokenizer.json (default: MODEL/tokenizer.json; bytes for dsc models)\n"
        "  --chat-template NAME         llama-3, mistral, chatml, phi-3 (default: from the tokenizer)\n"
        "  --bos ID                     prepend ID to text prompts of /v1/completions\n"
        "  --eos ID[,ID...]             stop tokens of every request (default: config.json's eos_token_id)\n"
        "  --seed N                     seed of requests that give none (+ request number)\n"
        "  --max-model-len N            context per sequence (the model's, at most 4096)\n"
        "  --kv-cache-bytes N           KV cache memory (64 MiB)   --kv-dtype f32|bf16\n"
        "  --weight-type T              projection weights f32 (default), bf16, f16 or q8_0\n"
        "  --block-size N               tokens per KV block (16)\n"
        "  --max-num-seqs N             sequences in the engine at once (64)\n"
        "  --max-num-batched-tokens N   tokens per forward (512)\n"
        "  --kv-reserve-tokens N        admit with N future tokens reserved and preempt when short (-1: all)\n"
        "  --prefill-first              prompt chunks before decodes in each forward\n"
        "  --static-batching            run admitted groups to completion (for comparison)\n"
        "  --max-concurrent-requests N  generation requests in flight before 429 (64)\n"
        "  --max-body-bytes N           request body limit (1048576)\n"
        "  --max-prompt-tokens N        tokens per prompt (8192)\n"
        "  --max-tokens-limit N         largest max_tokens (4096)\n"
        "  --drain-timeout S            on SIGTERM, seconds in-flight requests get before cancellation (30)\n"
        "  --tp N                       tensor parallelism over N ranks (run under dsc-launch -n N)\n"
        "  --pp P                       pipeline parallelism over P stages (dsc-launch -n P, or P x N with "
        "--tp N)\n"
        "  --ep E                       expert parallelism: MoE experts split over E replicas of each stage's\n"
        "                               TP group (dsc-launch -n N*P*E; tokens routed by all-to-all-v)\n"
        "  --partition METHOD           how layers are cut into stages: uniform (default) or parameters\n"
        "  --max-weight-bytes B         refuse to load more than B bytes of weights on one rank\n");
}

static bool parse_int(const char *v, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long x = strtoll(v, &end, 10);
    if (end == v || *end || errno || x < lo || x > hi) return false;
    *out = x;
    return true;
}

static bool parse_ids(const char *v, int32_t *ids, int32_t cap, int32_t *n) {
    *n = 0;
    for (const char *s = v; *s;) {
        char *end;
        errno = 0;
        long x = strtol(s, &end, 10);
        if (end == s || errno || x < 0 || x > INT32_MAX || *n == cap || (*end && *end != ',')) return false;
        ids[(*n)++] = (int32_t)x;
        s = *end ? end + 1 : end;
    }
    return *n > 0;
}

static const char *base_name(const char *path) {
    static char name[256];
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/')
        n--;
    size_t start = n;
    while (start > 0 && path[start - 1] != '/')
        start--;
    snprintf(name, sizeof name, "%.*s", (int)(n - start), path + start);
    return name;
}

static bool parse_args(int argc, char **argv, options *o) {
    *o = (options){.serve = dsc_serve_config_default(), .kv_cache_bytes = -1, .kv_reserve = -1};
    if (argc < 2 || argv[1][0] == '-') return false;
    o->model = argv[1];
    o->serve.model_name = base_name(o->model);
    o->serve.api_key = getenv("DSC_API_KEY");
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--static-batching") == 0) {
            o->static_batching = true;
            continue;
        }
        if (strcmp(a, "--prefill-first") == 0) {
            o->prefill_first = true;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "dsc-serve: option %s needs a value\n", a);
            return false;
        }
        const char *v = argv[++i];
        int64_t x = 0;
        bool ok = true;
        if (strcmp(a, "--host") == 0)
            o->serve.host = v;
        else if (strcmp(a, "--port") == 0)
            ok = parse_int(v, 0, 65535, &x) && ((o->serve.port = (int)x), true);
        else if (strcmp(a, "--api-key") == 0)
            o->serve.api_key = v;
        else if (strcmp(a, "--served-model-name") == 0)
            o->serve.model_name = v;
        else if (strcmp(a, "--tokenizer") == 0)
            o->tokenizer = v;
        else if (strcmp(a, "--chat-template") == 0)
            o->serve.chat_template = v;
        else if (strcmp(a, "--bos") == 0)
            ok = parse_int(v, 0, INT32_MAX, &x) && ((o->serve.bos = (int32_t)x), true);
        else if (strcmp(a, "--eos") == 0)
            ok = (o->eos_given = true) && parse_ids(v, o->serve.eos, DSC_SERVE_MAX_EOS, &o->serve.n_eos);
        else if (strcmp(a, "--seed") == 0)
            ok = parse_int(v, 0, INT64_MAX, &x) && ((o->serve.seed = (uint64_t)x), true);
        else if (strcmp(a, "--max-model-len") == 0)
            ok = parse_int(v, 1, INT32_MAX, &o->max_model_len);
        else if (strcmp(a, "--kv-cache-bytes") == 0)
            ok = parse_int(v, 1, INT64_MAX, &o->kv_cache_bytes);
        else if (strcmp(a, "--kv-dtype") == 0)
            ok = (o->bf16_kv = strcmp(v, "bf16") == 0) || strcmp(v, "f32") == 0;
        else if (strcmp(a, "--weight-type") == 0) {
            dsc_status st = dsc_weight_format_from_name(v, &o->weight_type);
            ok = !st;
            dsc_status_free(st);
        } else if (strcmp(a, "--block-size") == 0)
            ok = parse_int(v, 1, 4096, &x) && ((o->block_size = (int32_t)x), true);
        else if (strcmp(a, "--max-num-seqs") == 0)
            ok = parse_int(v, 1, 65536, &x) && ((o->max_num_seqs = (int32_t)x), true);
        else if (strcmp(a, "--max-num-batched-tokens") == 0)
            ok = parse_int(v, 1, 1 << 20, &x) && ((o->max_batched_tokens = (int32_t)x), true);
        else if (strcmp(a, "--tp") == 0)
            ok = parse_int(v, 1, 1 << 16, &x) && ((o->tp = (int32_t)x), true);
        else if (strcmp(a, "--pp") == 0)
            ok = parse_int(v, 1, 1 << 16, &x) && ((o->pp = (int32_t)x), true);
        else if (strcmp(a, "--ep") == 0)
            ok = parse_int(v, 1, 1 << 16, &x) && ((o->ep = (int32_t)x), true);
        else if (strcmp(a, "--partition") == 0)
            ok = (o->partition = v, strcmp(v, "uniform") == 0 || strcmp(v, "parameters") == 0);
        else if (strcmp(a, "--max-weight-bytes") == 0)
            ok = parse_int(v, 1, INT64_MAX, &o->max_weight_bytes);
        else if (strcmp(a, "--kv-reserve-tokens") == 0)
            ok = parse_int(v, -1, INT32_MAX, &x) && ((o->kv_reserve = (int32_t)x), true);
        else if (strcmp(a, "--max-concurrent-requests") == 0)
            ok = parse_int(v, 1, 1 << 20, &x) && ((o->serve.max_concurrent = (int32_t)x), true);
        else if (strcmp(a, "--max-body-bytes") == 0)
            ok = parse_int(v, 64, INT32_MAX, &x) && ((o->serve.max_body_bytes = (size_t)x), true);
        else if (strcmp(a, "--max-prompt-tokens") == 0)
            ok = parse_int(v, 1, INT32_MAX, &x) && ((o->serve.max_prompt_tokens = (int32_t)x), true);
        else if (strcmp(a, "--max-tokens-limit") == 0)
            ok = parse_int(v, 1, INT32_MAX, &x) && ((o->serve.max_tokens = (int32_t)x), true);
        else if (strcmp(a, "--drain-timeout") == 0) {
            char *end;
            o->serve.drain_timeout_s = strtod(v, &end);
            ok = end != v && !*end && o->serve.drain_timeout_s >= 0;
        } else {
            fprintf(stderr, "dsc-serve: unknown option %s\n", a);
            return false;
        }
        if (!ok) {
            fprintf(stderr, "dsc-serve: bad value for %s: %s\n", a, v);
            return false;
        }
    }
    return true;
}

/* Hugging Face models: config.json's eos_token_id (a number or a list). */
static void read_eos(const char *model, dsc_serve_config *sc) {
    char path[2048];
    snprintf(path, sizeof path, "%s/config.json", model);
    FILE *f = fopen(path, "rb");
    if (!f) return;
    char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cJSON *root = cJSON_ParseWithLength(buf, n);
    const cJSON *eos = cJSON_GetObjectItemCaseSensitive(root, "eos_token_id");
    if (cJSON_IsNumber(eos)) sc->eos[sc->n_eos++] = (int32_t)eos->valuedouble;
    for (const cJSON *e = cJSON_IsArray(eos) ? eos->child : NULL; e && sc->n_eos < DSC_SERVE_MAX_EOS; e = e->next)
        if (cJSON_IsNumber(e)) sc->eos[sc->n_eos++] = (int32_t)e->valuedouble;
    cJSON_Delete(root);
}

/* Every rank's pid, in rank order, as "1,2,3" (what tests and scripts signal). */
static dsc_status rank_pids(dsc_comm *world, char *out, size_t cap) {
    int n = world ? dsc_comm_size(world) : 1;
    int32_t mine = (int32_t)getpid(), *all = calloc((size_t)n, sizeof *all);
    DSC_CHECK(all, DSC_ERR_NOMEM, "pids of %d ranks", n);
    int64_t one = 1, len = n;
    dsc_tensor send = dsc_tensor_view(&mine, DSC_DTYPE_I32, 1, &one, DSC_CPU);
    dsc_tensor recv = dsc_tensor_view(all, DSC_DTYPE_I32, 1, &len, DSC_CPU);
    dsc_status s = world ? dsc_comm_allgather(world, &send, &recv, NULL) : NULL;
    if (!world) all[0] = mine;
    size_t at = 0;
    for (int r = 0; !s && r < n && at < cap; r++)
        at += (size_t)snprintf(out + at, cap - at, r ? ",%d" : "%d", (int)all[r]);
    free(all);
    return s;
}

static dsc_status serve(options *o, const dsc_infer_grid *rk) {
    dsc_infer_model *m = NULL;
    dsc_tokenizer *tok = NULL;
    dsc_infer_engine *e = NULL;
    dsc_server *srv = NULL;
    dsc_comm *world = rk->world;
    const bool lead = !world || dsc_comm_rank(world) == 0;
    dsc_infer_tp tp = {.comm = rk->tp, .tp_size = 1, .ep_comm = rk->ep};
    dsc_infer_pp pp = {
        .comm = rk->pipe, .partition_method = o->partition, .max_weight_bytes = o->max_weight_bytes};
    dsc_status s = dsc_infer_model_load_parallel(o->model, rk->tp || rk->ep ? &tp : NULL, &pp, &m);
    if (!s && world) dsc_infer_grid_print(rk, m, stderr);
    if (!s) s = dsc_infer_model_set_weight_type(m, o->weight_type);
    if (!s) s = dsc_infer_model_open_tokenizer(o->model, m, o->tokenizer, &tok);
    if (!s) {
        dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
        if (o->max_model_len > 0) ec.max_context = o->max_model_len;
        if (o->kv_cache_bytes > 0) ec.kv_cache_bytes = o->kv_cache_bytes;
        if (o->block_size > 0) ec.block_size = o->block_size;
        if (o->max_num_seqs > 0) ec.max_sequences = ec.max_batch_sequences = o->max_num_seqs;
        if (o->max_batched_tokens > 0) ec.max_tokens_per_forward = o->max_batched_tokens;
        if (ec.max_batch_sequences > ec.max_tokens_per_forward) ec.max_batch_sequences = ec.max_tokens_per_forward;
        if (o->bf16_kv) ec.kv_dtype = DSC_DTYPE_BF16;
        s = dsc_infer_engine_create(m, &ec, &e);
    }
    if (!s) {
        dsc_scheduler_config sc = dsc_scheduler_config_default(e);
        sc.kv_reserve_tokens = o->kv_reserve;
        sc.static_batching = o->static_batching;
        if (o->prefill_first) sc.prefill_priority = DSC_PREFILL_PRIORITY_PREFILL_FIRST;
        if (!o->eos_given) read_eos(o->model, &o->serve);
        o->serve.model_arch = dsc_infer_model_arch(m);
        o->serve.comm = world;
        o->serve.tp_comm = rk->tp;
        o->serve.pipe_comm = rk->pipe;
        s = dsc_server_create(e, &sc, tok, &o->serve, &srv);
    }
    char pids[1024] = "";
    if (!s) s = rank_pids(world, pids, sizeof pids);
    if (!s) {
        const char *tmpl = dsc_server_chat_template(srv);
        const dsc_kv_config *kv = dsc_infer_engine_kv_config(e);
        if (lead) {
            printf("dsc-serve: listening on http://%s:%d (model %s, %s, context %lld, %d KV blocks of %d, chat "
                   "template %s, tp %d, pp %d, ep %d, pids %s)\n",
                   o->serve.host, dsc_server_port(srv), o->serve.model_name, dsc_infer_model_arch(m),
                   (long long)kv->max_context, dsc_infer_engine_total_blocks(e), kv->block_size,
                   tmpl ? tmpl : "none", rk->tp ? dsc_comm_size(rk->tp) : 1,
                   rk->pipe ? dsc_comm_size(rk->pipe) : 1, rk->ep ? dsc_comm_size(rk->ep) : 1, pids);
            fflush(stdout);
        }
        g_server = srv;
        if (g_stop) dsc_server_request_stop(srv); /* signalled while loading: drain at once */
        s = dsc_server_run(srv);
        g_server = NULL;
        if (lead || s) fprintf(stderr, "dsc-serve: %s\n", s ? "stopped by an engine error" : "drained, exiting");
    }
    dsc_server_destroy(srv);
    dsc_infer_engine_destroy(e);
    dsc_tokenizer_destroy(tok);
    dsc_infer_model_destroy(m);
    return s;
}

int main(int argc, char **argv) {
    if (dsc_cli_info(argc, argv, argc - 1, "dsc-serve", usage)) return 0;
    options o;
    if (argc == 2 && strcmp(argv[1], "-h") == 0) {
        usage(stdout);
        return 0;
    }
    if (!parse_args(argc, argv, &o)) {
        usage(stderr);
        return 2;
    }
    /* Before MPI_Init (which can take a while): a signal while starting up is kept for the server. */
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGUSR2, &sa, NULL); /* dsc-launch's drain request, relayed by mpirun */
    signal(SIGPIPE, SIG_IGN);
    MPI_Init(&argc, &argv);
    dsc_infer_grid rk;
    dsc_status s =
        dsc_infer_grid_create("dsc-serve", o.tp > 0 ? o.tp : 1, o.pp > 0 ? o.pp : 1, o.ep > 0 ? o.ep : 1, &rk);
    if (!s) s = serve(&o, &rk);
    int rc = 0;
    if (s) {
        int size, rank;
        MPI_Comm_size(MPI_COMM_WORLD, &size);
        MPI_Comm_rank(MPI_COMM_WORLD, &rank);
        if (size > 1)
            fprintf(stderr, "dsc-serve: rank %d: %s\n", rank, dsc_status_message(s));
        else
            fprintf(stderr, "dsc-serve: %s\n", dsc_status_message(s));
        fflush(stderr);
        dsc_status_free(s);
        rc = 1;
        /* Peers may wait for this rank in a transfer or a collective: end the whole job now. */
        if (size > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    }
    dsc_infer_grid_free(&rk);
    MPI_Finalize();
    return rc;
}
