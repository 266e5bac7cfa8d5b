/* Saving and restoring a job's state (see dsc/checkpoint.h): turns the
 * parameter store, the optimizer's state list and the RNG streams into
 * pieces of global tensors for the tensor file, and back. */
#include "dsc/checkpoint.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/tensor_file.h"
#include "runtime/checkpoint/agree.h"
#include "runtime/checkpoint/ckpt_dir.h"

#ifndef DSC_VERSION
#define DSC_VERSION "unknown"
#endif

/* One tensor range this rank holds: where it lives in the file and in memory. */
typedef struct holding {
    dsc_tfile_piece piece;
    void *live; /* the live memory the range is saved from / restored into */
} holding;

typedef struct holdings {
    holding *items;
    int count, cap;
} holdings;

static dsc_status add_holding(holdings *h, const char *path, dsc_dtype dtype, int ndim, const int64_t *shape,
                              int64_t begin, int64_t count, void *live) {
    if (h->count == h->cap) {
        h->cap = h->cap ? 2 * h->cap : 64;
        holding *grown = realloc(h->items, (size_t)h->cap * sizeof *grown);
        DSC_CHECK(grown, DSC_ERR_NOMEM, "checkpoint: tensor list");
        h->items = grown;
    }
    holding *it = &h->items[h->count++];
    memset(it, 0, sizeof *it);
    DSC_CHECK(strlen(path) < sizeof it->piece.tensor.path, DSC_ERR_INVALID, "checkpoint: tensor name too long: %s",
              path);
    snprintf(it->piece.tensor.path, sizeof it->piece.tensor.path, "%s", path);
    it->piece.tensor.dtype = dtype;
    it->piece.tensor.ndim = ndim;
    memcpy(it->piece.tensor.shape, shape, (size_t)ndim * sizeof *shape);
    it->piece.begin = begin;
    it->piece.count = count;
    it->piece.data = live;
    it->live = live;
    return NULL;
}

/* Elements [begin, begin + count) of a parameter's local flattening (its
 * value, or per-parameter state of its shape) as ranges of the global tensor
 * at `path`: one range when the parameter is whole; for a tensor-parallel
 * piece, one per index of the axes before the split axis, where the piece's
 * rows are contiguous in the global tensor. */
static dsc_status add_param_range(holdings *h, const char *path, dsc_dtype dtype, const dsc_param *p,
                                  int64_t begin, int64_t count, void *live) {
    const int nd = p->value.ndim, a = p->shard.axis;
    if (a < 0) return add_holding(h, path, dtype, nd, p->shard.global, begin, count, live);
    int64_t inner = 1;
    for (int i = a + 1; i < nd; i++)
        inner *= p->shard.global[i];
    const int64_t run = p->value.shape[a] * inner, stride = p->shard.global[a] * inner;
    const size_t elem = dsc_dtype_size(dtype);
    for (int64_t at = begin; at < begin + count;) {
        const int64_t o = at / run, within = at % run,
                      n = run - within < begin + count - at ? run - within : begin + count - at;
        DSC_TRY(add_holding(h, path, dtype, nd, p->shard.global, o * stride + p->shard.start * inner + within, n,
                            (char *)live + (size_t)(at - begin) * elem));
        at += n;
    }
    return NULL;
}

static dsc_status check_host(const dsc_tensor *t, const char *what) {
    DSC_CHECK(t->device.type == DSC_DEVICE_CPU, DSC_ERR_UNSUPPORTED,
              "checkpoint: %s lives on a GPU; checkpoints of device tensors go through a host copy that dsc does "
              "not make yet",
              what);
    return NULL;
}

static bool in_list(const dsc_param *const *list, int n, const dsc_param *p) {
    for (int i = 0; i < n; i++)
        if (list[i] == p) return true;
    return false;
}

/* Parameter values the optimizer holds as shards (ZeRO-3), as model/<param>
 * ranges; `sharded` receives the parameters they cover. */
static dsc_status collect_value_shards(const dsc_checkpoint_state *st, holdings *h, const dsc_param ***sharded,
                                       int *n_sharded) {
    *sharded = NULL;
    *n_sharded = 0;
    int n = st->optimizer ? dsc_optimizer_state_count(st->optimizer) : 0;
    char path[DSC_PARAM_NAME_MAX + 64];
    for (int i = 0; i < n; i++) {
        dsc_optim_state s;
        dsc_optimizer_state_at(st->optimizer, i, &s);
        if (!s.is_value) continue;
        DSC_TRY(check_host(&s.local, s.param->name));
        snprintf(path, sizeof path, "model/%s", s.param->name);
        DSC_TRY(
            add_param_range(h, path, DSC_DTYPE_F32, s.param, s.offset, dsc_tensor_numel(&s.local), s.local.data));
        if (in_list(*sharded, *n_sharded, s.param)) continue;
        const dsc_param **grown = realloc(*sharded, (size_t)(*n_sharded + 1) * sizeof *grown);
        DSC_CHECK(grown, DSC_ERR_NOMEM, "checkpoint: parameter list");
        *sharded = grown;
        (*sharded)[(*n_sharded)++] = s.param;
    }
    return NULL;
}

/* Everything this rank holds, in a fixed order (params, optimizer, rng). */
static dsc_status collect(const dsc_checkpoint_state *st, dsc_checkpoint_scope scope, holdings *h) {
    char path[DSC_PARAM_NAME_MAX + 64];
    const dsc_param **sharded;
    int n_sharded;
    dsc_status s = collect_value_shards(st, h, &sharded, &n_sharded);
    for (int i = 0; !s && i < dsc_params_count(st->params); i++) {
        dsc_param *p = dsc_params_at(st->params, i);
        if (in_list(sharded, n_sharded, p)) continue;
        s = check_host(&p->value, p->name);
        snprintf(path, sizeof path, "model/%s", p->name);
        if (!s) s = add_param_range(h, path, DSC_DTYPE_F32, p, 0, dsc_tensor_numel(&p->value), p->value.data);
    }
    free(sharded);
    DSC_TRY(s);
    if (scope == DSC_CHECKPOINT_MODEL_ONLY) return NULL;
    for (int i = 0; st->optimizer && i < dsc_optimizer_state_count(st->optimizer); i++) {
        dsc_optim_state s;
        dsc_optimizer_state_at(st->optimizer, i, &s);
        if (s.is_value) continue;
        DSC_TRY(check_host(&s.local, s.name));
        snprintf(path, sizeof path, "optimizer/%s", s.name);
        int64_t n = dsc_tensor_numel(&s.local);
        if (s.param)
            DSC_TRY(add_param_range(h, path, s.local.dtype, s.param, s.offset, n, s.local.data));
        else
            DSC_TRY(add_holding(h, path, s.local.dtype, 1, &n, 0, n, s.local.data));
    }
    int rank, size;
    MPI_Comm_rank(st->comm, &rank);
    MPI_Comm_size(st->comm, &size);
    if (st->n_rngs > 0) {
        int64_t words = (int64_t)st->n_rngs * 4, shape[2] = {size, words};
        DSC_TRY(add_holding(h, "rng/states", DSC_DTYPE_I64, 2, shape, rank * words, words, st->rngs));
    }
    return NULL;
}

dsc_status dsc_checkpoint_list(const char *save_dir, char (**tags)[128], int *count) {
    return dsc_ckpt_list_tags(save_dir, tags, count);
}

dsc_status dsc_checkpoint_latest(const char *save_dir, char *tag, size_t len) {
    return dsc_ckpt_read_latest(save_dir, tag, len);
}

dsc_status dsc_checkpoint_path(const char *save_dir, const char *tag, char *path, size_t len) {
    char resolved[256];
    if (!tag || strcmp(tag, "latest") == 0)
        DSC_TRY(dsc_ckpt_read_latest(save_dir, resolved, sizeof resolved));
    else
        snprintf(resolved, sizeof resolved, "%s", tag);
    snprintf(path, len, "%s/%s/%s", save_dir, resolved, DSC_CKPT_FILE);
    return NULL;
}

/* ---- recovery after a crash ----------------------------------------------------------- */

/* Reads every element of a dataset, which checks its CRC segments. */
static dsc_status read_whole(const dsc_tfile_entry *e, void *user) {
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++)
        n *= e->shape[i];
    void *buf = malloc((size_t)(n ? n : 1) * dsc_dtype_size(e->dtype));
    DSC_CHECK(buf, DSC_ERR_NOMEM, "verifying %s: %lld elements", e->path, (long long)n);
    dsc_status s = dsc_tfile_read_range(user, e->path, 0, n, buf);
    free(buf);
    return s;
}

/* A checkpoint is sound when its file opens, its attributes are there (its
 * global_step that of the tag's name, when the name has one) and every
 * tensor reads back with matching checksums. */
static dsc_status verify(const char *save_dir, const char *tag) {
    char filename[1400];
    snprintf(filename, sizeof filename, "%s/%s/%s", save_dir, tag, DSC_CKPT_FILE);
    dsc_tfile *f;
    DSC_TRY(dsc_tfile_open(MPI_COMM_SELF, filename, &f));
    int64_t version = 0, step = -1;
    dsc_status s = dsc_tfile_get_attr_int(f, "format_version", &version);
    if (!s) s = dsc_tfile_get_attr_int(f, "global_step", &step);
    long long named = dsc_ckpt_tag_step(tag);
    if (!s && named >= 0 && step != named)
        s = dsc_error(DSC_ERR_CORRUPT, "%s: global_step %lld, but the tag names step %lld", filename,
                      (long long)step, named);
    if (!s) s = dsc_tfile_list_all(f, read_whole, f);
    dsc_status closed = dsc_tfile_close(f);
    if (s) dsc_status_free(closed);
    return s ? s : closed;
}

dsc_status dsc_checkpoint_recover(const char *save_dir, FILE *log) {
    char latest[128] = "";
    dsc_status missing = dsc_ckpt_read_latest(save_dir, latest, sizeof latest);
    long long latest_step = missing ? -1 : dsc_ckpt_tag_step(latest);
    if (!missing && latest_step < 0) return NULL; /* a tag without a step: no order to repair by */
    char(*tags)[128];
    int n;
    dsc_status s = dsc_ckpt_list_tags(save_dir, &tags, &n);
    if (s) {
        dsc_status_free(s);
        return missing; /* no directory: nothing to recover, and latest's error says why */
    }
    bool adopted = false;
    for (int i = n - 1; i >= 0 && !s && !adopted; i--) {
        if (strcmp(tags[i], latest) == 0 || dsc_ckpt_tag_step(tags[i]) <= latest_step) break;
        dsc_status bad = verify(save_dir, tags[i]);
        if (!bad) {
            s = dsc_ckpt_write_latest(save_dir, tags[i]);
            adopted = !s;
            if (adopted && log)
                fprintf(log,
                        "checkpoint %s/%s: complete and verified, newer than latest (%s); a crash stopped its "
                        "publication, so latest now names it\n",
                        save_dir, tags[i], latest[0] ? latest : "none");
            continue;
        }
        char name[160];
        s = dsc_ckpt_set_aside(save_dir, tags[i], name, sizeof name);
        if (!s && log)
            fprintf(log, "checkpoint %s/%s: damaged (%s); set aside as %s/%s\n", save_dir, tags[i],
                    dsc_status_message(bad), save_dir, name);
        dsc_status_free(bad);
    }
    free(tags);
    if (s || adopted) {
        dsc_status_free(missing);
        return s;
    }
    return missing;
}

/* ---- save --------------------------------------------------------------------------- */

static dsc_status write_attrs(dsc_tfile *f, const dsc_checkpoint_state *st) {
    int size;
    MPI_Comm_size(st->comm, &size);
    DSC_TRY(dsc_tfile_set_attr_int(f, "format_version", DSC_CHECKPOINT_FORMAT_VERSION));
    DSC_TRY(dsc_tfile_set_attr_string(f, "dsc_version", DSC_VERSION));
    DSC_TRY(dsc_tfile_set_attr_int(f, "global_step", st->global_step));
    DSC_TRY(dsc_tfile_set_attr_int(f, "world_size", size));
    DSC_TRY(dsc_tfile_set_attr_int(f, "rng_streams", st->n_rngs));
    DSC_TRY(dsc_tfile_set_attr_string(f, "config", st->config_json ? st->config_json : "{}"));
    DSC_TRY(dsc_tfile_set_attr_string(f, "layout", st->layout_json ? st->layout_json : "{}"));
    DSC_TRY(dsc_tfile_set_attr_string(f, "model_signature", st->model_signature ? st->model_signature : "{}"));
    DSC_TRY(dsc_tfile_set_attr_string(f, "engine_state", st->engine_json ? st->engine_json : "{}"));
    return NULL;
}

/* Fault injection for the crash-safety test: DSC_FAILPOINT=checkpoint_write:R
 * kills rank R (SIGKILL) after its data is written, before the file is
 * complete and published — the worst moment for a crash. */
static void failpoint_after_write(MPI_Comm comm) {
    const char *fp = getenv("DSC_FAILPOINT");
    const char *prefix = "checkpoint_write:";
    if (!fp || strncmp(fp, prefix, strlen(prefix)) != 0) return;
    int rank;
    MPI_Comm_rank(comm, &rank);
    if (atoi(fp + strlen(prefix)) == rank) raise(SIGKILL);
}

static dsc_status write_file(const dsc_checkpoint_state *st, const char *filename) {
    holdings h = {0};
    dsc_status s = dsc_agree(st->comm, collect(st, DSC_CHECKPOINT_FULL, &h));
    dsc_tfile *f = NULL;
    if (!s) s = dsc_tfile_create(st->comm, filename, &f);
    if (!s) {
        dsc_tfile_piece *pieces = malloc((size_t)(h.count ? h.count : 1) * sizeof *pieces);
        s = dsc_agree(st->comm, pieces ? NULL : dsc_error(DSC_ERR_NOMEM, "checkpoint: piece list"));
        for (int i = 0; !s && i < h.count; i++)
            pieces[i] = h.items[i].piece;
        if (!s) s = dsc_tfile_write_all(f, pieces, h.count);
        if (!s) failpoint_after_write(st->comm);
        if (!s) s = write_attrs(f, st);
        free(pieces);
        dsc_status closed = dsc_tfile_close(f);
        if (!s)
            s = closed;
        else
            dsc_status_free(closed);
    }
    free(h.items);
    return s;
}

dsc_status dsc_checkpoint_save(const dsc_checkpoint_state *st, const char *save_dir, const char *tag,
                               int keep_last) {
    int rank;
    MPI_Comm_rank(st->comm, &rank);
    DSC_TRY(dsc_agree(st->comm, rank == 0 ? dsc_ckpt_dir_begin(save_dir, tag) : NULL));
    char partial[1024], filename[1100];
    dsc_ckpt_partial_dir(save_dir, tag, partial, sizeof partial);
    snprintf(filename, sizeof filename, "%s/%s", partial, DSC_CKPT_FILE);
    dsc_status s = write_file(st, filename);
    if (!s) s = dsc_agree(st->comm, rank == 0 ? dsc_ckpt_dir_publish(save_dir, tag) : NULL);
    if (s) {
        if (rank == 0) dsc_ckpt_dir_abandon(save_dir, tag);
        return dsc_error_wrap(s, "saving checkpoint %s/%s", save_dir, tag);
    }
    return dsc_agree(st->comm, rank == 0 ? dsc_ckpt_prune(save_dir, keep_last) : NULL);
}

/* ---- load --------------------------------------------------------------------------- */

static dsc_status check_compatible(dsc_tfile *f, const dsc_checkpoint_state *st) {
    int64_t version;
    DSC_TRY(dsc_tfile_get_attr_int(f, "format_version", &version));
    DSC_CHECK(version <= DSC_CHECKPOINT_FORMAT_VERSION, DSC_ERR_UNSUPPORTED,
              "%s: checkpoint format version %lld is newer than this dsc supports (%d); upgrade dsc",
              dsc_tfile_name(f), (long long)version, DSC_CHECKPOINT_FORMAT_VERSION);
    DSC_CHECK(version >= 1, DSC_ERR_CORRUPT, "%s: invalid checkpoint format version %lld", dsc_tfile_name(f),
              (long long)version);
    char *signature;
    DSC_TRY(dsc_tfile_get_attr_string(f, "model_signature", &signature));
    const char *want = st->model_signature ? st->model_signature : "{}";
    dsc_status s = NULL;
    if (strcmp(signature, want) != 0)
        s = dsc_error(DSC_ERR_CORRUPT, "%s: checkpoint holds a different model: saved %s, this job builds %s",
                      dsc_tfile_name(f), signature, want);
    free(signature);
    return s;
}

/* Reads every holding into one staging buffer after checking shapes. */
static dsc_status stage(dsc_tfile *f, const holdings *h, char **staging) {
    size_t total = 0;
    for (int i = 0; i < h->count; i++) {
        const dsc_tfile_entry *t = &h->items[i].piece.tensor;
        DSC_TRY(dsc_tfile_expect(f, t->path, t->dtype, t->ndim, t->shape));
        total += (size_t)h->items[i].piece.count * dsc_dtype_size(t->dtype);
    }
    *staging = malloc(total ? total : 1);
    DSC_CHECK(*staging, DSC_ERR_NOMEM, "checkpoint: staging %zu bytes", total);
    size_t at = 0;
    for (int i = 0; i < h->count; i++) {
        const dsc_tfile_piece *p = &h->items[i].piece;
        DSC_TRY(dsc_tfile_read_range(f, p->tensor.path, p->begin, p->count, *staging + at));
        at += (size_t)p->count * dsc_dtype_size(p->tensor.dtype);
    }
    return NULL;
}

static void commit(const holdings *h, const char *staging) {
    size_t at = 0;
    for (int i = 0; i < h->count; i++) {
        size_t bytes = (size_t)h->items[i].piece.count * dsc_dtype_size(h->items[i].piece.tensor.dtype);
        memcpy(h->items[i].live, staging + at, bytes);
        at += bytes;
    }
}

/* RNG streams are per rank: they are restored only into the same world size
 * and stream count; otherwise the job keeps its freshly seeded streams. */
static dsc_status rng_matches(dsc_tfile *f, const dsc_checkpoint_state *st, bool *matches) {
    int size;
    MPI_Comm_size(st->comm, &size);
    int64_t world, streams;
    DSC_TRY(dsc_tfile_get_attr_int(f, "world_size", &world));
    DSC_TRY(dsc_tfile_get_attr_int(f, "rng_streams", &streams));
    *matches = world == size && streams == st->n_rngs && st->n_rngs > 0;
    return NULL;
}

static dsc_status load_from(dsc_tfile *f, dsc_checkpoint_state *st, dsc_checkpoint_scope scope,
                            char **engine_json) {
    DSC_TRY(dsc_agree(st->comm, check_compatible(f, st)));
    bool with_rng = false;
    if (scope == DSC_CHECKPOINT_FULL) DSC_TRY(dsc_agree(st->comm, rng_matches(f, st, &with_rng)));
    dsc_checkpoint_state view = *st;
    if (!with_rng) view.n_rngs = 0;
    holdings h = {0};
    char *staging = NULL;
    dsc_status s = collect(&view, scope, &h);
    if (!s) s = stage(f, &h, &staging);
    int64_t step = 0;
    char *engine = NULL;
    if (!s && scope == DSC_CHECKPOINT_FULL) s = dsc_tfile_get_attr_int(f, "global_step", &step);
    if (!s && scope == DSC_CHECKPOINT_FULL && engine_json)
        s = dsc_tfile_get_attr_string(f, "engine_state", &engine);
    s = dsc_agree(st->comm, s);
    if (!s) {
        commit(&h, staging);
        if (scope == DSC_CHECKPOINT_FULL) st->global_step = step;
        if (engine_json) *engine_json = engine;
        engine = NULL;
    }
    free(engine);
    free(staging);
    free(h.items);
    return s;
}

dsc_status dsc_checkpoint_load(dsc_checkpoint_state *st, const char *save_dir, const char *tag,
                               dsc_checkpoint_scope scope, char **engine_json) {
    if (engine_json) *engine_json = NULL;
    int rank;
    MPI_Comm_rank(st->comm, &rank);
    char filename[1400] = "";
    dsc_status s = rank == 0 ? dsc_checkpoint_path(save_dir, tag, filename, sizeof filename) : NULL;
    DSC_TRY(dsc_agree(st->comm, s));
    MPI_Bcast(filename, sizeof filename, MPI_CHAR, 0, st->comm);
    dsc_tfile *f;
    DSC_TRY(dsc_tfile_open(st->comm, filename, &f));
    s = load_from(f, st, scope, engine_json);
    dsc_status closed = dsc_tfile_close(f);
    if (s) {
        dsc_status_free(closed);
        return s;
    }
    return closed;
}

dsc_status dsc_checkpoint_load_params(dsc_checkpoint_state *st, dsc_checkpoint_read_fn read, void *ctx) {
    holdings h = {0};
    dsc_status s = collect(st, DSC_CHECKPOINT_MODEL_ONLY, &h);
    size_t total = 0;
    for (int i = 0; !s && i < h.count; i++)
        total += (size_t)h.items[i].piece.count * sizeof(float);
    float *staging = s ? NULL : malloc(total ? total : 1);
    if (!s && !staging) s = dsc_error(DSC_ERR_NOMEM, "initial parameters: staging %zu bytes", total);
    size_t at = 0;
    for (int i = 0; !s && i < h.count; i++) {
        const dsc_tfile_piece *p = &h.items[i].piece;
        s = read(ctx, p->tensor.path + strlen("model/"), p->tensor.ndim, p->tensor.shape, p->begin, p->count,
                 staging + at);
        at += (size_t)p->count;
    }
    s = dsc_agree(st->comm, s);
    if (!s) commit(&h, (const char *)staging);
    free(staging);
    free(h.items);
    return s;
}
