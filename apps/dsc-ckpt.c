/* dsc-ckpt — inspect, compare and export dsc checkpoints.
 *
 *   dsc-ckpt ls SAVE_DIR                 tags, steps, layouts, sizes
 *   dsc-ckpt show CKPT                   tensors, shapes, dtypes, L2 norms
 *   dsc-ckpt diff [--tol X] [--prefix P] CKPT_A CKPT_B
 *                                        per-tensor max |a - b|; exit 0 when both
 *                                        hold the same tensors (under P) with the
 *                                        same shapes, each within X (default 0),
 *                                        1 when they differ, 2 on an error
 *   dsc-ckpt export CKPT --model-only OUT.h5
 *   dsc-ckpt export CKPT --format hf OUT_DIR   config.json + model.safetensors for transformers
 *
 * CKPT is a checkpoint directory (SAVE_DIR/TAG), a save directory (its
 * `latest` is followed) or a state.h5 file. Runs as one process. */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "dsc/checkpoint.h"
#include "dsc/cli.h"
#include "dsc/hf.h"
#include "dsc/tensor_file.h"

#define CKPT_FILE "state.h5"

static void usage(FILE *fp) {
    fprintf(fp, "usage: dsc-ckpt ls SAVE_DIR\n"
                "       dsc-ckpt show CKPT\n"
                "       dsc-ckpt diff [--tol X] [--prefix P] CKPT_A CKPT_B\n"
                "       dsc-ckpt export CKPT --model-only OUT.h5\n"
                "       dsc-ckpt export CKPT --format hf OUT_DIR\n"
                "CKPT: SAVE_DIR/TAG, SAVE_DIR (follows latest) or a state.h5 file\n");
}

static bool is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

static dsc_status resolve(const char *arg, char *file, size_t len) {
    if (is_file(arg)) {
        snprintf(file, len, "%s", arg);
        return NULL;
    }
    snprintf(file, len, "%s/%s", arg, CKPT_FILE);
    if (is_file(file)) return NULL;
    return dsc_checkpoint_path(arg, "latest", file, len);
}

static dsc_status open_ckpt(const char *arg, dsc_tfile **f) {
    char file[1400];
    DSC_TRY(resolve(arg, file, sizeof file));
    return dsc_tfile_open(MPI_COMM_SELF, file, f);
}

static int64_t numel(const dsc_tfile_entry *e) {
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++)
        n *= e->shape[i];
    return n;
}

static void shape_text(const dsc_tfile_entry *e, char *buf, size_t len) {
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < e->ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)e->shape[i]);
    if (used < len) snprintf(buf + used, len - used, ")");
}

/* Reads a whole tensor as doubles (any stored dtype). */
static dsc_status read_doubles(dsc_tfile *f, const dsc_tfile_entry *e, double **out) {
    int64_t n = numel(e);
    char *raw = malloc((size_t)(n ? n : 1) * dsc_dtype_size(e->dtype));
    *out = malloc((size_t)(n ? n : 1) * sizeof **out);
    dsc_status s = raw && *out ? dsc_tfile_read_range(f, e->path, 0, n, raw)
                               : dsc_error(DSC_ERR_NOMEM, "reading %s", e->path);
    for (int64_t i = 0; !s && i < n; i++) {
        switch (e->dtype) {
        case DSC_DTYPE_F32:
            (*out)[i] = ((float *)raw)[i];
            break;
        case DSC_DTYPE_BF16:
            (*out)[i] = dsc_bf16_to_f32(((uint16_t *)raw)[i]);
            break;
        case DSC_DTYPE_F16:
            (*out)[i] = dsc_f16_to_f32(((uint16_t *)raw)[i]);
            break;
        case DSC_DTYPE_I32:
            (*out)[i] = ((int32_t *)raw)[i];
            break;
        case DSC_DTYPE_I64:
            (*out)[i] = (double)((int64_t *)raw)[i];
            break;
        default:
            (*out)[i] = ((uint8_t *)raw)[i];
            break;
        }
    }
    free(raw);
    return s;
}

/* ---- ls -------------------------------------------------------------------------------- */

static dsc_status cmd_ls(const char *save_dir) {
    char latest[128] = "";
    dsc_status_free(dsc_checkpoint_latest(save_dir, latest, sizeof latest));
    char(*tags)[128];
    int n;
    DSC_TRY(dsc_checkpoint_list(save_dir, &tags, &n));
    printf("%-24s %10s %12s  %s\n", "tag", "step", "bytes", "layout");
    for (int i = 0; i < n; i++) {
        char file[1400];
        snprintf(file, sizeof file, "%s/%s/%s", save_dir, tags[i], CKPT_FILE);
        struct stat st;
        dsc_tfile *f;
        dsc_status s = stat(file, &st) == 0 ? dsc_tfile_open(MPI_COMM_SELF, file, &f)
                                            : dsc_error(DSC_ERR_IO, "%s vanished", file);
        if (s) {
            printf("%-24s  unreadable: %s\n", tags[i], dsc_status_message(s));
            dsc_status_free(s);
            continue;
        }
        int64_t step = -1;
        char *layout = NULL;
        dsc_status_free(dsc_tfile_get_attr_int(f, "global_step", &step));
        dsc_status_free(dsc_tfile_get_attr_string(f, "layout", &layout));
        printf("%-24s %10lld %12lld  %s%s\n", tags[i], (long long)step, (long long)st.st_size,
               layout ? layout : "?", strcmp(tags[i], latest) == 0 ? "  <- latest" : "");
        free(layout);
        dsc_status_free(dsc_tfile_close(f));
    }
    free(tags);
    return NULL;
}

/* ---- show ------------------------------------------------------------------------------ */

static dsc_status show_entry(const dsc_tfile_entry *e, void *user) {
    double *v;
    DSC_TRY(read_doubles(user, e, &v));
    double sq = 0;
    for (int64_t i = 0; i < numel(e); i++)
        sq += v[i] * v[i];
    free(v);
    char shape[96];
    shape_text(e, shape, sizeof shape);
    printf("  %-56s %-20s %-5s norm %.6g\n", e->path, shape, dsc_dtype_name(e->dtype), sqrt(sq));
    return NULL;
}

static dsc_status cmd_show(const char *arg) {
    dsc_tfile *f;
    DSC_TRY(open_ckpt(arg, &f));
    int64_t step = -1, version = -1;
    char *layout = NULL, *signature = NULL;
    dsc_status_free(dsc_tfile_get_attr_int(f, "global_step", &step));
    dsc_status_free(dsc_tfile_get_attr_int(f, "format_version", &version));
    dsc_status_free(dsc_tfile_get_attr_string(f, "layout", &layout));
    dsc_status_free(dsc_tfile_get_attr_string(f, "model_signature", &signature));
    printf("%s\n  format %lld, step %lld\n  layout %s\n  model %s\n", dsc_tfile_name(f), (long long)version,
           (long long)step, layout ? layout : "?", signature ? signature : "?");
    free(layout);
    free(signature);
    dsc_status s = dsc_tfile_list_all(f, show_entry, f);
    dsc_status closed = dsc_tfile_close(f);
    if (s) dsc_status_free(closed);
    return s ? s : closed;
}

/* ---- diff ------------------------------------------------------------------------------ */

typedef struct diff_ctx {
    dsc_tfile *a, *b;
    const char *prefix; /* only tensors whose path starts with it */
    double worst;       /* over tensors present in both with equal shapes */
    int compared, only_a, only_b, misshapen;
} diff_ctx;

static bool same_shape(const dsc_tfile_entry *x, const dsc_tfile_entry *y) {
    if (x->ndim != y->ndim) return false;
    for (int i = 0; i < x->ndim; i++)
        if (x->shape[i] != y->shape[i]) return false;
    return true;
}

/* Is `path` in f? A missing tensor is a difference, not an error. */
static bool holds(dsc_tfile *f, const char *path, dsc_tfile_entry *out) {
    dsc_status s = dsc_tfile_describe(f, path, out);
    dsc_status_free(s);
    return s == NULL;
}

static dsc_status diff_entry(const dsc_tfile_entry *e, void *user) {
    diff_ctx *d = user;
    if (strncmp(e->path, d->prefix, strlen(d->prefix)) != 0) return NULL;
    dsc_tfile_entry other;
    if (!holds(d->b, e->path, &other)) {
        printf("  %-56s only in %s\n", e->path, dsc_tfile_name(d->a));
        d->only_a++;
        return NULL;
    }
    if (!same_shape(e, &other)) {
        char sa[96], sb[96];
        shape_text(e, sa, sizeof sa);
        shape_text(&other, sb, sizeof sb);
        printf("  %-56s shapes differ: %s vs %s\n", e->path, sa, sb);
        d->misshapen++;
        return NULL;
    }
    double *va, *vb;
    DSC_TRY(read_doubles(d->a, e, &va));
    dsc_status s = read_doubles(d->b, &other, &vb);
    double max = 0;
    for (int64_t i = 0; !s && i < numel(e); i++) {
        double x = fabs(va[i] - vb[i]);
        if (!(x <= max)) max = x; /* a NaN on either side counts as the largest difference */
    }
    free(va);
    free(vb);
    DSC_TRY(s);
    if (!(max <= d->worst)) d->worst = max;
    d->compared++;
    printf("  %-56s max |a-b| %.3e\n", e->path, max);
    return NULL;
}

/* The second pass: tensors of B that A lacks. */
static dsc_status only_in_b(const dsc_tfile_entry *e, void *user) {
    diff_ctx *d = user;
    dsc_tfile_entry other;
    if (strncmp(e->path, d->prefix, strlen(d->prefix)) != 0 || holds(d->a, e->path, &other)) return NULL;
    printf("  %-56s only in %s\n", e->path, dsc_tfile_name(d->b));
    d->only_b++;
    return NULL;
}

/* *same: both hold the same tensors under `prefix`, shapes equal, every
 * max |a - b| <= tol. */
static dsc_status cmd_diff(const char *a, const char *b, const char *prefix, double tol, bool *same) {
    diff_ctx d = {.prefix = prefix};
    DSC_TRY(open_ckpt(a, &d.a));
    dsc_status s = open_ckpt(b, &d.b);
    if (!s) {
        s = dsc_tfile_list_all(d.a, diff_entry, &d);
        if (!s) s = dsc_tfile_list_all(d.b, only_in_b, &d);
        dsc_status_free(dsc_tfile_close(d.b));
    }
    dsc_status_free(dsc_tfile_close(d.a));
    if (s) return s;
    *same = d.only_a == 0 && d.only_b == 0 && d.misshapen == 0 && d.compared > 0 && d.worst <= tol;
    printf("worst max |a-b| %.3e over %d tensors; %d only in A, %d only in B, %d with other shapes: %s "
           "(--tol %g)\n",
           d.worst, d.compared, d.only_a, d.only_b, d.misshapen, *same ? "same" : "DIFFERENT", tol);
    return NULL;
}

/* ---- export ---------------------------------------------------------------------------- */

typedef struct export_ctx {
    dsc_tfile *in;
    dsc_tfile_piece *pieces;
    int count, cap;
    dsc_status status;
} export_ctx;

static dsc_status collect_entry(const dsc_tfile_entry *e, void *user) {
    export_ctx *x = user;
    if (x->count == x->cap) {
        x->cap = x->cap ? 2 * x->cap : 64;
        dsc_tfile_piece *grown = realloc(x->pieces, (size_t)x->cap * sizeof *grown);
        DSC_CHECK(grown, DSC_ERR_NOMEM, "export: piece list");
        x->pieces = grown;
    }
    void *data = malloc((size_t)(numel(e) ? numel(e) : 1) * dsc_dtype_size(e->dtype));
    DSC_CHECK(data, DSC_ERR_NOMEM, "export: %s", e->path);
    x->pieces[x->count++] = (dsc_tfile_piece){*e, 0, numel(e), data};
    return dsc_tfile_read_range(x->in, e->path, 0, numel(e), data);
}

static dsc_status copy_attrs(dsc_tfile *in, dsc_tfile *out) {
    static const char *ints[] = {"format_version", "global_step"};
    static const char *strings[] = {"dsc_version", "config", "layout", "model_signature"};
    for (size_t i = 0; i < 2; i++) {
        int64_t v;
        DSC_TRY(dsc_tfile_get_attr_int(in, ints[i], &v));
        DSC_TRY(dsc_tfile_set_attr_int(out, ints[i], v));
    }
    for (size_t i = 0; i < 4; i++) {
        char *v;
        DSC_TRY(dsc_tfile_get_attr_string(in, strings[i], &v));
        dsc_status s = dsc_tfile_set_attr_string(out, strings[i], v);
        free(v);
        DSC_TRY(s);
    }
    /* A model-only file restores no optimizer, RNG or engine state. */
    DSC_TRY(dsc_tfile_set_attr_int(out, "world_size", 0));
    DSC_TRY(dsc_tfile_set_attr_int(out, "rng_streams", 0));
    return dsc_tfile_set_attr_string(out, "engine_state", "{}");
}

static dsc_status cmd_export(const char *arg, const char *out_path) {
    export_ctx x = {0};
    DSC_TRY(open_ckpt(arg, &x.in));
    dsc_status s = dsc_tfile_list(x.in, "model", collect_entry, &x);
    dsc_tfile *out = NULL;
    if (!s) s = dsc_tfile_create(MPI_COMM_SELF, out_path, &out);
    if (!s) {
        s = dsc_tfile_write_all(out, x.pieces, x.count);
        if (!s) s = copy_attrs(x.in, out);
        dsc_status closed = dsc_tfile_close(out);
        if (!s)
            s = closed;
        else
            dsc_status_free(closed);
    }
    if (!s) printf("exported %d tensors to %s\n", x.count, out_path);
    for (int i = 0; i < x.count; i++)
        free((void *)x.pieces[i].data);
    free(x.pieces);
    dsc_status_free(dsc_tfile_close(x.in));
    return s;
}

static dsc_status cmd_export_hf(const char *arg, const char *out_dir) {
    char file[1400];
    DSC_TRY(resolve(arg, file, sizeof file));
    int64_t n = 0;
    DSC_TRY(dsc_hf_export(file, out_dir, &n));
    printf("exported %lld tensors to %s/model.safetensors and %s/config.json\n", (long long)n, out_dir, out_dir);
    return NULL;
}

/* dsc-ckpt diff's options: [--tol X] [--prefix P] A B. */
static bool diff_args(int argc, char **argv, double *tol, const char **prefix, const char **a, const char **b) {
    int i = 2;
    for (; i + 1 < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        char *end;
        if (strcmp(argv[i], "--tol") == 0) {
            *tol = strtod(argv[i + 1], &end);
            if (*end || !(*tol >= 0)) {
                fprintf(stderr, "dsc-ckpt diff: --tol %s: expected a number >= 0\n", argv[i + 1]);
                return false;
            }
        } else if (strcmp(argv[i], "--prefix") == 0) {
            *prefix = argv[i + 1];
        } else {
            fprintf(stderr, "dsc-ckpt diff: unknown option %s\n", argv[i]);
            return false;
        }
    }
    if (argc - i != 2) return false;
    *a = argv[i];
    *b = argv[i + 1];
    return true;
}

int main(int argc, char **argv) {
    if (dsc_cli_info(argc, argv, argc - 1, "dsc-ckpt", usage)) return 0;
    if (argc < 3) {
        usage(stderr);
        return 2;
    }
    MPI_Init(&argc, &argv);
    dsc_status s = NULL;
    int rc = 0;
    double tol = 0;
    const char *prefix = "", *a, *b;
    if (strcmp(argv[1], "ls") == 0 && argc == 3) {
        s = cmd_ls(argv[2]);
    } else if (strcmp(argv[1], "show") == 0 && argc == 3) {
        s = cmd_show(argv[2]);
    } else if (strcmp(argv[1], "diff") == 0 && diff_args(argc, argv, &tol, &prefix, &a, &b)) {
        bool same = false;
        s = cmd_diff(a, b, prefix, tol, &same);
        rc = same ? 0 : 1;
    } else if (strcmp(argv[1], "export") == 0 && argc == 5 && strcmp(argv[3], "--model-only") == 0) {
        s = cmd_export(argv[2], argv[4]);
    } else if (strcmp(argv[1], "export") == 0 && argc == 6 && strcmp(argv[3], "--format") == 0) {
        if (strcmp(argv[4], "hf") == 0) {
            s = cmd_export_hf(argv[2], argv[5]);
        } else {
            fprintf(stderr, "dsc-ckpt: --format %s: the formats are hf\n", argv[4]);
            rc = 2;
        }
    } else {
        usage(stderr);
        rc = 2;
    }
    if (s) {
        fprintf(stderr, "dsc-ckpt: %s\n", dsc_status_message(s));
        dsc_status_free(s);
        rc = 2;
    }
    MPI_Finalize();
    return rc;
}
