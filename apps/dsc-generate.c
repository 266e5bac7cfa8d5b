/* dsc-generate — generate text with the inference engine.
 *
 *   dsc-generate MODEL (--prompt TEXT | --tokens ID,ID,... | --prompts-file FILE)... [options]
 *
 * MODEL is a Hugging Face directory (config.json + safetensors) or a dsc
 * training checkpoint (SAVE_DIR, SAVE_DIR/TAG or a state.h5). Text goes
 * through the byte tokenizer for dsc models and through MODEL/tokenizer.json
 * (or --tokenizer) for Hugging Face models; without a tokenizer, prompts
 * are token ids and ids are printed. Several prompts (--prompt and --tokens
 * repeated, --prompts-file with one prompt per line, `-` for stdin) are
 * submitted together to the scheduler, which batches them continuously;
 * each output is then printed whole, in the order the prompts were given.
 * One prompt streams its tokens as they come. Runs as one process, or as
 * one tensor-parallel group with --tp N under `dsc-launch -n N` (every rank
 * loads its shard and runs the same scheduler; rank 0 prints), or as a
 * pipeline of --pp P stages (each loads its layers; combined with --tp on
 * DeepSpeed's grid, axes pipe, data, model: dsc-launch -n P*N), with --ep E
 * as E expert-parallel replicas of each stage's TP group (MoE experts split
 * over them, tokens exchanged by all-to-all-v; dsc-launch -n P*N*E); the
 * ranks print which layers, shards and experts they hold. --config
 * reads DeepSpeed inference config keys (tensor_parallel.tp_size,
 * tp_grain_size, partition_config, max_out_tokens, min_out_tokens). */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */
#include <errno.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsc/cli.h"
#include "dsc/comm.h"
#include "dsc/infer_grid.h"
#include "dsc/inference.h"
#include "dsc/kernels.h"
#include "dsc/tokenizer.h"
#include "dsc/topology.h"

enum { MAX_IDS = 65536, MAX_STOP = 16 };

/* One prompt as given: text, or a list of ids (--tokens). */
typedef struct prompt {
    const char *text;
    const char *ids;
} prompt;

typedef struct options {
    const char *model, *tokenizer, *config;
    prompt *prompts;
    int n_prompts;
    char **inputs; /* prompt files and stdin read into memory (the prompts point into them) */
    int n_inputs;
    int32_t max_new, stop[MAX_STOP], n_stop, bos, tp, pp, ep;
    int64_t grain, max_weight_bytes;
    const char *partition;
    dsc_sampling_params sampling;
    uint64_t seed;
    bool quiet, print_plan;
} options;

/* What one request has printed (or, with several, collected). */
typedef struct output {
    dsc_tokenizer_stream state;
    char *text;
    size_t len, cap;
    int64_t n;
} output;

typedef struct run_state {
    dsc_tokenizer *tok;
    output *outs;
    bool streaming; /* one request: print as tokens come */
    bool print;     /* rank 0 of the tensor-parallel group prints */
    int64_t n;
    double t0, first;
} run_state;

static void usage(FILE *fp) {
    fputs("usage: dsc-generate MODEL (--prompt TEXT | --tokens ID,ID,... | --prompts-file FILE)... [options]\n"
          "  --prompt TEXT           a prompt (repeatable; `-` reads one prompt from stdin)\n"
          "  --tokens ID,ID,...      a prompt as token ids (repeatable)\n"
          "  --prompts-file FILE     one prompt per line (blank lines skipped; `-` for stdin)\n"
          "  --max-new-tokens N      tokens to generate per prompt (64)\n"
          "  --temperature T         0 = greedy (default); > 0 samples\n"
          "  --top-k K  --top-p P    sampling filters (off)\n"
          "  --repetition-penalty R  HF semantics (1 = off)\n"
          "  --seed S                sampling seed of every prompt (1)\n"
          "  --stop ID[,ID...]       stop tokens (generation ends after emitting one)\n"
          "  --bos ID                prepend this id to every prompt\n"
          "  --tokenizer PATH        tokenizer.json (default: MODEL/tokenizer.json when present)\n"
          "  --quiet                 no statistics on stderr\n"
          "  --tp N                  tensor parallelism over N ranks (run under dsc-launch -n N)\n"
          "  --tp-grain G            tp_grain_size: MLP and vocabulary cuts in multiples of G (64)\n"
          "  --print-plan            print the sharding plan for --tp N and exit (no ranks needed)\n"
          "  --pp P                  pipeline parallelism over P stages (dsc-launch -n P, or P x N with --tp N)\n"
          "  --partition METHOD      how layers are cut into stages: uniform (default), parameters or compute\n"
          "  --max-weight-bytes B    refuse to load more than B bytes of weights on one rank\n"
          "  --ep E                  expert parallelism: MoE experts split over E replicas of each stage's\n"
          "                          TP group, tokens routed by all-to-all-v (dsc-launch -n P*N*E)\n"
          "  --config FILE           DeepSpeed inference config (tensor_parallel, max_out_tokens,\n"
          "                          min_out_tokens); command-line --tp / --tp-grain win\n"
          "  --help, --version\n"
          "MODEL: a Hugging Face directory or a dsc checkpoint (SAVE_DIR, SAVE_DIR/TAG, state.h5).\n"
          "Several prompts run as one continuous batch; their outputs print in order, one per line.\n",
          fp);
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

/* The whole of `path` (`-`: stdin), kept in o->inputs. */
static dsc_status read_input(options *o, const char *option, const char *path, char **out) {
    FILE *fp = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    DSC_CHECK(fp, DSC_ERR_IO, "%s %s: cannot open: %s", option, path, strerror(errno));
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    for (size_t got = 1; buf && got > 0;) {
        if (len + 1 == cap) {
            char *grown = realloc(buf, cap *= 2);
            if (!grown) free(buf);
            buf = grown;
            if (!buf) break;
        }
        got = fread(buf + len, 1, cap - len - 1, fp);
        len += got;
    }
    bool failed = ferror(fp);
    if (fp != stdin) fclose(fp);
    if (!buf || failed) {
        free(buf);
        return dsc_error(buf ? DSC_ERR_IO : DSC_ERR_NOMEM, "%s %s: read failed", option, path);
    }
    buf[len] = '\0';
    o->inputs[o->n_inputs++] = buf;
    *out = buf;
    return NULL;
}

static void add_prompt(options *o, const char *text, const char *ids) {
    o->prompts[o->n_prompts++] = (prompt){text, ids};
}

/* Splits a prompts file into lines (in place); blank lines are skipped. */
static dsc_status add_prompt_lines(options *o, char *text, int cap) {
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        if (end) *end = '\0';
        size_t n = strlen(line);
        if (n && line[n - 1] == '\r') line[--n] = '\0';
        if (n) {
            DSC_CHECK(o->n_prompts < cap, DSC_ERR_INVALID, "--prompts-file: more than %d prompts", cap);
            add_prompt(o, line, NULL);
        }
        if (!end) break;
        line = end + 1;
    }
    return NULL;
}

static dsc_status parse_args(int argc, char **argv, options *o) {
    const int cap = 65536;
    *o = (options){.max_new = 64, .bos = -1, .sampling = dsc_sampling_params_greedy(), .seed = 1};
    o->prompts = calloc(cap, sizeof *o->prompts);
    o->inputs = calloc((size_t)argc, sizeof *o->inputs);
    DSC_CHECK(o->prompts && o->inputs, DSC_ERR_NOMEM, "out of memory");
    DSC_CHECK(argc >= 2 && argv[1][0] != '-', DSC_ERR_INVALID, "the first argument must be MODEL");
    o->model = argv[1];
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--quiet") == 0 || strcmp(a, "--print-plan") == 0) {
            *(a[2] == 'q' ? &o->quiet : &o->print_plan) = true;
            continue;
        }
        DSC_CHECK(i + 1 < argc, DSC_ERR_INVALID, "option %s needs a value", a);
        const char *v = argv[++i];
        int64_t k;
        double x;
        if (strcmp(a, "--prompt") == 0 || strcmp(a, "--tokens") == 0 || strcmp(a, "--prompts-file") == 0) {
            DSC_CHECK(o->n_prompts < cap, DSC_ERR_INVALID, "%s: more than %d prompts", a, cap);
            char *text = NULL;
            if (strcmp(a, "--prompts-file") == 0) {
                DSC_TRY(read_input(o, a, v, &text));
                DSC_TRY(add_prompt_lines(o, text, cap));
            } else if (strcmp(a, "--tokens") == 0) {
                add_prompt(o, NULL, v);
            } else if (strcmp(v, "-") == 0) {
                DSC_TRY(read_input(o, a, v, &text));
                size_t n = strlen(text);
                if (n && text[n - 1] == '\n') text[n - 1] = '\0'; /* echo "..." | dsc-generate ... --prompt - */
                add_prompt(o, text, NULL);
            } else {
                add_prompt(o, v, NULL);
            }
        } else if (strcmp(a, "--tokenizer") == 0) {
            o->tokenizer = v;
        } else if (strcmp(a, "--config") == 0) {
            o->config = v;
        } else if (strcmp(a, "--tp") == 0) {
            DSC_TRY(dsc_cli_int(a, v, 1, 1 << 16, &k));
            o->tp = (int32_t)k;
        } else if (strcmp(a, "--pp") == 0) {
            DSC_TRY(dsc_cli_int(a, v, 1, 1 << 16, &k));
            o->pp = (int32_t)k;
        } else if (strcmp(a, "--ep") == 0) {
            DSC_TRY(dsc_cli_int(a, v, 1, 1 << 16, &k));
            o->ep = (int32_t)k;
        } else if (strcmp(a, "--partition") == 0) {
            o->partition = v;
        } else if (strcmp(a, "--max-weight-bytes") == 0) {
            DSC_TRY(dsc_cli_int(a, v, 1, INT64_MAX, &o->max_weight_bytes));
        } else if (strcmp(a, "--tp-grain") == 0) {
            DSC_TRY(dsc_cli_int(a, v, 1, INT64_MAX, &o->grain));
        } else if (strcmp(a, "--max-new-tokens") == 0) {
            DSC_TRY(dsc_cli_int(a, v, 1, MAX_IDS, &k));
            o->max_new = (int32_t)k;
        } else if (strcmp(a, "--temperature") == 0) {
            DSC_TRY(dsc_cli_double(a, v, 0, 100, &x));
            o->sampling.temperature = (float)x;
        } else if (strcmp(a, "--top-k") == 0) {
            DSC_TRY(dsc_cli_int(a, v, 0, INT32_MAX, &k));
            o->sampling.top_k = (int32_t)k;
        } else if (strcmp(a, "--top-p") == 0) {
            DSC_TRY(dsc_cli_double(a, v, 0, 1, &x));
            o->sampling.top_p = (float)x;
        } else if (strcmp(a, "--repetition-penalty") == 0) {
            DSC_TRY(dsc_cli_double(a, v, 1e-6, 1e6, &x));
            o->sampling.repetition_penalty = (float)x;
        } else if (strcmp(a, "--seed") == 0) {
            DSC_TRY(dsc_cli_int(a, v, 0, INT64_MAX, &k));
            o->seed = (uint64_t)k;
        } else if (strcmp(a, "--bos") == 0) {
            DSC_TRY(dsc_cli_int(a, v, 0, INT32_MAX, &k));
            o->bos = (int32_t)k;
        } else if (strcmp(a, "--stop") == 0) {
            DSC_CHECK(parse_ids(v, o->stop, MAX_STOP, &o->n_stop), DSC_ERR_INVALID,
                      "--stop: \"%s\" is not a list of at most %d ids ID,ID,...", v, MAX_STOP);
        } else {
            return dsc_error(DSC_ERR_INVALID, "unknown option %s", a);
        }
    }
    if (o->print_plan)
        DSC_CHECK(o->tp >= 1 || o->config, DSC_ERR_INVALID, "--print-plan needs --tp N or --config FILE");
    else
        DSC_CHECK(o->n_prompts > 0, DSC_ERR_INVALID, "no prompt: give --prompt, --tokens or --prompts-file");
    return NULL;
}

static void options_free(options *o) {
    for (int i = 0; i < o->n_inputs; i++)
        free(o->inputs[i]);
    free(o->inputs);
    free(o->prompts);
}

/* Prints (one request) or collects (several) text of request r. */
static dsc_status emit(run_state *st, int r, const char *text, size_t len) {
    if (!st->print) return NULL;
    if (st->streaming) {
        fwrite(text, 1, len, stdout);
        fflush(stdout);
        return NULL;
    }
    output *o = &st->outs[r];
    if (o->len + len + 1 > o->cap) {
        size_t cap = 2 * (o->len + len + 1) + 64;
        char *grown = realloc(o->text, cap);
        DSC_CHECK(grown, DSC_ERR_NOMEM, "output of prompt %d", r + 1);
        o->text = grown;
        o->cap = cap;
    }
    memcpy(o->text + o->len, text, len);
    o->len += len;
    o->text[o->len] = '\0';
    return NULL;
}

static dsc_status on_token(void *user, uint64_t uid, int32_t token, bool finished) {
    run_state *st = user;
    int r = (int)(uid - 1);
    output *o = &st->outs[r];
    if (st->n++ == 0) st->first = now_s();
    o->n++;
    char text[256];
    size_t len;
    if (st->tok) {
        DSC_TRY(dsc_tokenizer_decode_next(st->tok, &o->state, token, text, sizeof text, &len));
        DSC_TRY(emit(st, r, text, len));
        if (finished) {
            DSC_TRY(dsc_tokenizer_decode_finish(&o->state, text, sizeof text, &len));
            DSC_TRY(emit(st, r, text, len));
        }
    } else {
        len = (size_t)snprintf(text, sizeof text, " %d", token);
        DSC_TRY(emit(st, r, text, len));
    }
    return finished ? emit(st, r, "\n", 1) : NULL;
}

/* Prompt r as ids (with --bos) into ids (room for cap); *n its length. */
static dsc_status prompt_ids(const options *o, dsc_tokenizer *tok, int r, int32_t *ids, int64_t cap, int64_t *n) {
    const prompt *p = &o->prompts[r];
    *n = 0;
    if (o->bos >= 0) ids[(*n)++] = o->bos;
    if (p->ids) {
        int32_t k;
        DSC_CHECK(parse_ids(p->ids, ids + *n, (int32_t)(cap - *n), &k), DSC_ERR_INVALID,
                  "--tokens: expected ID,ID,... (got \"%s\")", p->ids);
        *n += k;
        return NULL;
    }
    DSC_CHECK(tok, DSC_ERR_INVALID, "%s has no tokenizer.json: pass --tokens or --tokenizer", o->model);
    int64_t k;
    DSC_TRY(dsc_tokenizer_encode(tok, p->text, strlen(p->text), ids + *n, cap - *n, &k));
    *n += k;
    return NULL;
}

/* The prompt as it is echoed before its continuation: its text, or its ids. */
static dsc_status echo_prompt(const options *o, run_state *st, int r, const int32_t *ids, int64_t n) {
    if (o->prompts[r].text && st->tok) return emit(st, r, o->prompts[r].text, strlen(o->prompts[r].text));
    for (int64_t i = 0; i < n; i++) {
        char text[24];
        int len = snprintf(text, sizeof text, i ? " %d" : "%d", ids[i]);
        DSC_TRY(emit(st, r, text, (size_t)len));
    }
    return NULL;
}

typedef struct batch {
    int32_t **ids;
    int64_t *n;
    int32_t *max_new;
} batch;

static dsc_status tokenize_all(const options *o, dsc_tokenizer *tok, batch *b, int64_t *longest) {
    *longest = 0;
    for (int r = 0; r < o->n_prompts; r++) {
        b->ids[r] = malloc(MAX_IDS * sizeof *b->ids[r]);
        DSC_CHECK(b->ids[r], DSC_ERR_NOMEM, "prompt %d", r + 1);
        DSC_TRY(dsc_error_wrap(prompt_ids(o, tok, r, b->ids[r], MAX_IDS, &b->n[r]), "prompt %d", r + 1));
        if (b->n[r] > *longest) *longest = b->n[r];
    }
    return NULL;
}

/* The last generated token is never fed back, so a context of N holds N - prompt + 1 new tokens;
 * the KV cache holds total blocks x block size tokens. */
static dsc_status clamp_new_tokens(const options *o, const dsc_infer_ds_config *c, dsc_infer_engine *e, batch *b,
                                   bool lead) {
    const dsc_kv_config *kv = dsc_infer_engine_kv_config(e);
    int64_t ctx = kv->max_context, cache = (int64_t)dsc_infer_engine_total_blocks(e) * kv->block_size;
    if (cache < ctx) ctx = cache;
    for (int r = 0; r < o->n_prompts; r++) {
        int64_t room = ctx - b->n[r] + 1;
        DSC_CHECK(room >= 1 && room >= c->min_out_tokens, DSC_ERR_INVALID,
                  "prompt %d: min_out_tokens %lld: after the %lld-token prompt the context (%lld tokens, "
                  "max_out_tokens %lld) and the KV cache (%lld tokens) leave room for %lld new tokens",
                  r + 1, (long long)c->min_out_tokens, (long long)b->n[r], (long long)kv->max_context,
                  (long long)c->max_out_tokens, (long long)cache, (long long)(room > 0 ? room : 0));
        b->max_new[r] = o->max_new;
        if (room < o->max_new) {
            if (lead)
                fprintf(stderr,
                        "dsc-generate: prompt %d: --max-new-tokens %d clamped to %lld: the context holds "
                        "%lld tokens\n",
                        r + 1, o->max_new, (long long)room, (long long)ctx);
            b->max_new[r] = (int32_t)room;
        }
    }
    return NULL;
}

static dsc_status generate(const options *o, dsc_infer_engine *e, run_state *st, batch *b) {
    dsc_scheduler *sched = NULL;
    dsc_scheduler_config sc = dsc_scheduler_config_default(e);
    DSC_TRY(dsc_scheduler_create(e, &sc, on_token, st, &sched));
    dsc_status s = NULL;
    for (int r = 0; !s && r < o->n_prompts; r++) {
        s = echo_prompt(o, st, r, b->ids[r], b->n[r]);
        dsc_gen_request req = {.uid = (uint64_t)r + 1,
                               .prompt = b->ids[r],
                               .n_prompt = (int32_t)b->n[r],
                               .max_new_tokens = b->max_new[r],
                               .sampling = o->sampling,
                               .seed = o->seed,
                               .stop_tokens = o->stop,
                               .n_stop = o->n_stop};
        if (!s) s = dsc_scheduler_submit(sched, &req);
    }
    st->t0 = now_s();
    if (!s) s = dsc_scheduler_run(sched);
    for (int r = 0; !s && st->print && !st->streaming && r < o->n_prompts; r++)
        fwrite(st->outs[r].text, 1, st->outs[r].len, stdout);
    dsc_scheduler_destroy(sched);
    return s;
}

/* --print-plan: the sharding plan, from the checkpoint's header and config alone. */
static dsc_status print_plan(const options *o, const dsc_infer_ds_config *c) {
    dsc_tp_plan *plan;
    DSC_TRY(dsc_infer_model_plan(o->model, &c->tp, &plan));
    dsc_tp_plan_print(plan, stdout);
    dsc_tp_plan_destroy(plan);
    return NULL;
}

static dsc_status run(const options *o, const dsc_infer_ds_config *c, const dsc_infer_grid *lay) {
    dsc_comm *world = lay->world;
    dsc_infer_model *m = NULL;
    dsc_tokenizer *tok = NULL;
    dsc_infer_engine *e = NULL;
    const int R = o->n_prompts;
    batch b = {calloc((size_t)R, sizeof *b.ids), calloc((size_t)R, sizeof *b.n),
               calloc((size_t)R, sizeof *b.max_new)};
    const bool lead = !world || dsc_comm_rank(world) == 0;
    run_state st = {.outs = calloc((size_t)R, sizeof *st.outs), .streaming = R == 1, .print = lead};
    dsc_status s = b.ids && b.n && b.max_new && st.outs ? NULL : dsc_error(DSC_ERR_NOMEM, "%d prompts", R);
    double t0 = now_s();
    int64_t longest = 0;
    dsc_infer_tp tp = c->tp;
    tp.comm = lay->tp;
    tp.ep_comm = lay->ep;
    dsc_infer_pp pp = {
        .comm = lay->pipe, .partition_method = o->partition, .max_weight_bytes = o->max_weight_bytes};
    if (!s) s = dsc_infer_model_load_parallel(o->model, lay->tp || lay->ep ? &tp : NULL, &pp, &m);
    if (!s && world && !o->quiet) dsc_infer_grid_print(lay, m, stderr);
    if (!s) s = dsc_infer_model_open_tokenizer(o->model, m, o->tokenizer, &tok);
    st.tok = tok;
    if (!s) s = tokenize_all(o, tok, &b, &longest);
    double t_load = now_s();
    if (!s) {
        dsc_infer_engine_config ec = dsc_infer_engine_config_default(m);
        if (longest + o->max_new > ec.max_context)
            ec.max_context = longest + o->max_new; /* clipped by the engine */
        if (o->config && c->max_out_tokens < ec.max_context) ec.max_context = c->max_out_tokens;
        ec.max_sequences = ec.max_batch_sequences = R < ec.max_sequences ? R : ec.max_sequences;
        s = dsc_infer_engine_create(m, &ec, &e);
    }
    if (!s) s = clamp_new_tokens(o, c, e, &b, lead);
    for (int r = 0; r < R; r++)
        dsc_tokenizer_stream_init(&st.outs[r].state);
    if (!s) s = generate(o, e, &st, &b);
    if (!s && !o->quiet && lead) {
        double end = now_s(), decode = end - st.first;
        fprintf(stderr,
                "[%s: loaded in %.2f s; %d prompt%s, longest %lld tokens, first token after %.3f s; %lld tokens, "
                "%.1f tokens/s after the first; %d threads; tp %d, pp %d, ep %d, %.3f s in all-reduces]\n",
                dsc_infer_model_arch(m), t_load - t0, R, R == 1 ? "" : "s", (long long)longest, st.first - st.t0,
                (long long)st.n, st.n > 1 && decode > 0 ? (double)(st.n - 1) / decode : 0.0,
                dsc_kernels_get_num_threads(), lay->tp ? dsc_comm_size(lay->tp) : 1,
                lay->pipe ? dsc_comm_size(lay->pipe) : 1, lay->ep ? dsc_comm_size(lay->ep) : 1,
                dsc_infer_model_comm_seconds(m));
    }
    for (int r = 0; r < R; r++) {
        if (b.ids) free(b.ids[r]);
        if (st.outs) free(st.outs[r].text);
    }
    free(b.ids);
    free(b.n);
    free(b.max_new);
    free(st.outs);
    dsc_infer_engine_destroy(e);
    dsc_tokenizer_destroy(tok);
    dsc_infer_model_destroy(m);
    return s;
}

int main(int argc, char **argv) {
    if (dsc_cli_info(argc, argv, argc - 1, "dsc-generate", usage)) return 0;
    options o;
    dsc_status s = parse_args(argc, argv, &o);
    if (s) {
        fprintf(stderr, "dsc-generate: %s (see dsc-generate --help)\n", dsc_status_message(s));
        dsc_status_free(s);
        options_free(&o);
        return 2;
    }
    MPI_Init(&argc, &argv);
    dsc_infer_ds_config c;
    dsc_infer_grid lay = {0};
    s = dsc_infer_ds_config_load(o.config, &c);
    if (!s && o.tp > 0) c.tp.tp_size = o.tp;
    if (!s && o.grain > 0) c.tp.grain = o.grain;
    if (!s && o.print_plan)
        s = print_plan(&o, &c);
    else if (!s) {
        s = dsc_infer_grid_create("dsc-generate", c.tp.tp_size, o.pp > 0 ? o.pp : 1, o.ep > 0 ? o.ep : 1, &lay);
        if (!s) s = run(&o, &c, &lay);
    }
    dsc_infer_ds_config_free(&c);
    int rc = 0;
    if (s) {
        fprintf(stderr, "dsc-generate: %s\n", dsc_status_message(s));
        fflush(stderr);
        dsc_status_free(s);
        rc = 1;
        /* Peers may wait for this rank inside a transfer or a collective: end the whole job now. */
        if (lay.world && dsc_comm_size(lay.world) > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    }
    dsc_infer_grid_free(&lay);
    options_free(&o);
    MPI_Finalize();
    return rc;
}
