/* A parallel HDF5 file of named tensors (see dsc/tensor_file.h).
 *
 * Datasets are created collectively from the union of every rank's entries and
 * their handles are cached for the file's lifetime, so the data transfers that
 * follow are independent calls by the owning ranks only. Collective calls end
 * with an agreement step: when any rank fails, every rank returns the failing
 * rank's message, so no rank goes on alone into the next collective. */
#include "dsc/tensor_file.h"

#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "runtime/checkpoint/agree.h"

typedef struct segment {
    int64_t begin, count, crc;
} segment;

typedef struct dataset {
    dsc_tfile_entry entry;
    hid_t id;
    segment *segments; /* sorted by begin; NULL when the dsc_segments attribute is missing */
    int n_segments;
} dataset;

struct dsc_tfile {
    MPI_Comm comm;
    hid_t file;
    char name[1024];
    dataset *sets; /* sorted by path */
    int n_sets;
};

/* ---- HDF5 error text ---------------------------------------------------------------- */

static herr_t innermost(unsigned n, const H5E_error2_t *err, void *user) {
    (void)n;
    snprintf((char *)user, 256, "%s", err->desc ? err->desc : "unknown HDF5 error");
    return 0;
}

/* An error for a failed HDF5 call that ends with HDF5's own innermost reason. */
static dsc_status h5_error(dsc_code code, const char *what, const dsc_tfile *f) {
    char reason[256] = "unknown HDF5 error";
    H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, innermost, reason);
    H5Eclear2(H5E_DEFAULT);
    return dsc_error(code, "%s: %s (%s)", f ? f->name : "hdf5", what, reason);
}

static void quiet_hdf5(void) {
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
}

/* ---- dtype mapping -------------------------------------------------------------------- */

/* Half types are stored as 16-bit unsigned integers; the "dsc_dtype" attribute says which. */
static hid_t file_type(dsc_dtype d) {
    switch (d) {
    case DSC_DTYPE_F32:
        return H5T_IEEE_F32LE;
    case DSC_DTYPE_BF16:
    case DSC_DTYPE_F16:
        return H5T_STD_U16LE;
    case DSC_DTYPE_I32:
        return H5T_STD_I32LE;
    case DSC_DTYPE_I64:
        return H5T_STD_I64LE;
    default:
        return H5T_STD_U8LE;
    }
}

static hid_t memory_type(dsc_dtype d) {
    switch (d) {
    case DSC_DTYPE_F32:
        return H5T_NATIVE_FLOAT;
    case DSC_DTYPE_BF16:
    case DSC_DTYPE_F16:
        return H5T_NATIVE_UINT16;
    case DSC_DTYPE_I32:
        return H5T_NATIVE_INT32;
    case DSC_DTYPE_I64:
        return H5T_NATIVE_INT64;
    default:
        return H5T_NATIVE_UINT8;
    }
}

/* ---- the dataset table ---------------------------------------------------------------- */

static int compare_sets(const void *a, const void *b) {
    return strcmp(((const dataset *)a)->entry.path, ((const dataset *)b)->entry.path);
}

static dataset *find_set(const dsc_tfile *f, const char *path) {
    dataset key;
    snprintf(key.entry.path, sizeof key.entry.path, "%s", path);
    return bsearch(&key, f->sets, (size_t)f->n_sets, sizeof *f->sets, compare_sets);
}

static dsc_status push_set(dsc_tfile *f, const dsc_tfile_entry *e, hid_t id, segment *segments, int n_segments) {
    dataset *grown = realloc(f->sets, (size_t)(f->n_sets + 1) * sizeof *grown);
    if (!grown) return dsc_error(DSC_ERR_NOMEM, "%s: dataset table", f->name);
    f->sets = grown;
    f->sets[f->n_sets++] = (dataset){*e, id, segments, n_segments};
    return NULL;
}

/* Reads the "dsc_segments" attribute ((n, 3) int64) when present. */
static dsc_status read_segments(dsc_tfile *f, hid_t id, const char *path, segment **out, int *n) {
    *out = NULL;
    *n = 0;
    if (H5Aexists(id, "dsc_segments") <= 0) return NULL;
    hid_t attr = H5Aopen(id, "dsc_segments", H5P_DEFAULT);
    hid_t space = H5Aget_space(attr);
    hsize_t dims[2] = {0, 0};
    int rank = H5Sget_simple_extent_dims(space, dims, NULL);
    H5Sclose(space);
    dsc_status s = NULL;
    if (rank != 2 || dims[1] != 3) {
        s = dsc_error(DSC_ERR_CORRUPT, "%s: tensor %s has a malformed dsc_segments attribute", f->name, path);
    } else {
        *out = malloc((size_t)(dims[0] ? dims[0] : 1) * sizeof **out);
        if (!*out)
            s = dsc_error(DSC_ERR_NOMEM, "%s: segments of %s", f->name, path);
        else if (H5Aread(attr, H5T_NATIVE_INT64, *out) < 0)
            s = h5_error(DSC_ERR_CORRUPT, "reading the dsc_segments attribute", f);
        else
            *n = (int)dims[0];
    }
    H5Aclose(attr);
    return s;
}

static dsc_status read_entry(dsc_tfile *f, hid_t id, const char *path, dsc_tfile_entry *e) {
    memset(e, 0, sizeof *e);
    snprintf(e->path, sizeof e->path, "%s", path);
    hid_t space = H5Dget_space(id);
    int ndim = H5Sget_simple_extent_ndims(space);
    hsize_t dims[DSC_MAX_DIMS];
    if (ndim < 0 || ndim > DSC_MAX_DIMS) {
        H5Sclose(space);
        return dsc_error(DSC_ERR_CORRUPT, "%s: dataset %s has unsupported rank %d", f->name, path, ndim);
    }
    H5Sget_simple_extent_dims(space, dims, NULL);
    H5Sclose(space);
    e->ndim = ndim;
    for (int i = 0; i < ndim; i++)
        e->shape[i] = (int64_t)dims[i];
    char dtype_name[16] = "";
    if (H5Aexists(id, "dsc_dtype") > 0) {
        hid_t attr = H5Aopen(id, "dsc_dtype", H5P_DEFAULT);
        hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, sizeof dtype_name - 1);
        H5Aread(attr, t, dtype_name);
        H5Tclose(t);
        H5Aclose(attr);
    }
    if (dsc_dtype_from_name(dtype_name, &e->dtype)) {
        /* Written by another tool: infer from the stored type. */
        hid_t t = H5Dget_type(id);
        H5T_class_t cls = H5Tget_class(t);
        size_t size = H5Tget_size(t);
        H5Tclose(t);
        if (cls == H5T_FLOAT && size == 4)
            e->dtype = DSC_DTYPE_F32;
        else if (cls == H5T_INTEGER && size == 4)
            e->dtype = DSC_DTYPE_I32;
        else if (cls == H5T_INTEGER && size == 8)
            e->dtype = DSC_DTYPE_I64;
        else if (cls == H5T_INTEGER && size == 1)
            e->dtype = DSC_DTYPE_U8;
        else
            return dsc_error(DSC_ERR_CORRUPT, "%s: dataset %s has a type dsc cannot read", f->name, path);
    }
    return NULL;
}

typedef struct visit_ctx {
    dsc_tfile *f;
    dsc_status status;
} visit_ctx;

static herr_t visit_object(hid_t root, const char *path, const H5O_info_t *info, void *user) {
    visit_ctx *v = user;
    if (info->type != H5O_TYPE_DATASET) return 0;
    hid_t id = H5Dopen2(root, path, H5P_DEFAULT);
    if (id < 0) {
        v->status = h5_error(DSC_ERR_CORRUPT, "opening a dataset", v->f);
        return -1;
    }
    dsc_tfile_entry e;
    segment *segments = NULL;
    int n_segments = 0;
    v->status = read_entry(v->f, id, path, &e);
    if (!v->status) v->status = read_segments(v->f, id, path, &segments, &n_segments);
    if (!v->status) v->status = push_set(v->f, &e, id, segments, n_segments);
    if (v->status) {
        free(segments);
        H5Dclose(id);
        return -1;
    }
    return 0;
}

/* ---- open / create / close ------------------------------------------------------------- */

static dsc_status new_file(MPI_Comm comm, const char *filename, dsc_tfile **out) {
    *out = calloc(1, sizeof **out);
    if (!*out) return dsc_error(DSC_ERR_NOMEM, "%s: file handle", filename);
    (*out)->comm = comm;
    (*out)->file = H5I_INVALID_HID;
    snprintf((*out)->name, sizeof(*out)->name, "%s", filename);
    return NULL;
}

static hid_t mpio_access(MPI_Comm comm) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
    return fapl;
}

static void close_sets(dsc_tfile *f) {
    for (int i = 0; i < f->n_sets; i++) {
        H5Dclose(f->sets[i].id);
        free(f->sets[i].segments);
    }
    f->n_sets = 0;
}

static void free_file(dsc_tfile *f) {
    if (!f) return;
    close_sets(f);
    if (f->file >= 0) H5Fclose(f->file);
    free(f->sets);
    free(f);
}

dsc_status dsc_tfile_create(MPI_Comm comm, const char *filename, dsc_tfile **out) {
    quiet_hdf5();
    dsc_tfile *f;
    DSC_TRY(new_file(comm, filename, &f));
    hid_t fapl = mpio_access(comm);
    f->file = H5Fcreate(filename, H5F_ACC_EXCL, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    dsc_status s = f->file < 0 ? h5_error(DSC_ERR_IO, "cannot create the file (it must not exist)", f) : NULL;
    s = dsc_agree(comm, s);
    if (s) {
        free_file(f);
        return s;
    }
    *out = f;
    return NULL;
}

dsc_status dsc_tfile_open(MPI_Comm comm, const char *filename, dsc_tfile **out) {
    quiet_hdf5();
    dsc_tfile *f;
    DSC_TRY(new_file(comm, filename, &f));
    dsc_status s = NULL;
    if (H5Fis_hdf5(filename) <= 0) {
        FILE *probe = fopen(filename, "rb");
        s = probe ? dsc_error(DSC_ERR_CORRUPT, "%s: not an HDF5 file or truncated", filename)
                  : dsc_error(DSC_ERR_IO, "%s: cannot open: no such file", filename);
        if (probe) fclose(probe);
        H5Eclear2(H5E_DEFAULT);
    } else {
        hid_t fapl = mpio_access(comm);
        f->file = H5Fopen(filename, H5F_ACC_RDONLY, fapl);
        H5Pclose(fapl);
        if (f->file < 0) s = h5_error(DSC_ERR_CORRUPT, "not an HDF5 file or truncated: cannot open it", f);
    }
    if (!s) {
        visit_ctx v = {f, NULL};
        if (H5Ovisit(f->file, H5_INDEX_NAME, H5_ITER_INC, visit_object, &v) < 0)
            s = v.status ? v.status : h5_error(DSC_ERR_CORRUPT, "cannot list datasets", f);
        qsort(f->sets, (size_t)f->n_sets, sizeof *f->sets, compare_sets);
    }
    s = dsc_agree(comm, s);
    if (s) {
        free_file(f);
        return s;
    }
    *out = f;
    return NULL;
}

dsc_status dsc_tfile_close(dsc_tfile *f) {
    if (!f) return NULL;
    dsc_status s = NULL;
    unsigned intent = 0;
    if (H5Fget_intent(f->file, &intent) >= 0 && (intent & H5F_ACC_RDWR) && H5Fflush(f->file, H5F_SCOPE_GLOBAL) < 0)
        s = h5_error(DSC_ERR_IO, "flush failed", f);
    close_sets(f);
    if (H5Fclose(f->file) < 0 && !s) s = h5_error(DSC_ERR_IO, "close failed", f);
    f->file = H5I_INVALID_HID;
    MPI_Comm comm = f->comm;
    free_file(f);
    return dsc_agree(comm, s);
}

const char *dsc_tfile_name(const dsc_tfile *f) {
    return f->name;
}

/* ---- writing ---------------------------------------------------------------------------- */

static bool same_layout(const dsc_tfile_entry *a, const dsc_tfile_entry *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

static int64_t entry_numel(const dsc_tfile_entry *e) {
    int64_t n = 1;
    for (int i = 0; i < e->ndim; i++)
        n *= e->shape[i];
    return n;
}

static dsc_status write_scalar_attr(dsc_tfile *f, hid_t obj, const char *name, hid_t type, const void *value) {
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(obj, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t rc = attr < 0 ? -1 : H5Awrite(attr, type, value);
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    if (rc >= 0) return NULL;
    char what[160];
    snprintf(what, sizeof what, "writing attribute %s", name);
    return h5_error(DSC_ERR_IO, what, f);
}

static dsc_status set_string_attr(dsc_tfile *f, hid_t obj, const char *name, const char *value) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(value) + 1);
    dsc_status s = write_scalar_attr(f, obj, name, t, value);
    H5Tclose(t);
    return s;
}

static dsc_status set_segments_attr(dsc_tfile *f, hid_t id, const segment *segments, int n) {
    hsize_t dims[2] = {(hsize_t)n, 3};
    hid_t space = H5Screate_simple(2, dims, NULL);
    hid_t attr = H5Acreate2(id, "dsc_segments", H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t rc = attr < 0 ? -1 : H5Awrite(attr, H5T_NATIVE_INT64, segments);
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    return rc < 0 ? h5_error(DSC_ERR_IO, "writing the dsc_segments attribute", f) : NULL;
}

static dsc_status create_set(dsc_tfile *f, const dsc_tfile_entry *e, segment *segments, int n_segments) {
    hsize_t dims[DSC_MAX_DIMS];
    for (int i = 0; i < e->ndim; i++)
        dims[i] = (hsize_t)e->shape[i];
    hid_t space = H5Screate_simple(e->ndim, dims, NULL);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t id = H5Dcreate2(f->file, e->path, file_type(e->dtype), space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    H5Pclose(lcpl);
    H5Sclose(space);
    if (id < 0) {
        free(segments);
        char what[300];
        snprintf(what, sizeof what, "creating dataset %s", e->path);
        return h5_error(DSC_ERR_IO, what, f);
    }
    dsc_status s = set_string_attr(f, id, "dsc_dtype", dsc_dtype_name(e->dtype));
    if (!s) s = set_segments_attr(f, id, segments, n_segments);
    if (!s) s = push_set(f, e, id, segments, n_segments);
    if (s) {
        free(segments);
        H5Dclose(id);
    }
    return s;
}

/* What every rank learns of every piece. */
typedef struct piece_meta {
    dsc_tfile_entry tensor;
    int64_t begin, count, crc;
    int owner;
    int local_index;
} piece_meta;

static int compare_meta(const void *a, const void *b) {
    const piece_meta *x = a, *y = b;
    int c = strcmp(x->tensor.path, y->tensor.path);
    if (c) return c;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->count != y->count) return x->count < y->count ? -1 : 1;
    return x->owner - y->owner;
}

static dsc_status gather_meta(dsc_tfile *f, const dsc_tfile_piece *pieces, int count, piece_meta **all,
                              int *total) {
    int rank, size;
    MPI_Comm_rank(f->comm, &rank);
    MPI_Comm_size(f->comm, &size);
    piece_meta *mine = malloc((size_t)(count ? count : 1) * sizeof *mine);
    int *bytes = malloc((size_t)size * sizeof *bytes), *displs = malloc((size_t)size * sizeof *displs);
    dsc_status s = mine && bytes && displs ? NULL : dsc_error(DSC_ERR_NOMEM, "%s: piece gather", f->name);
    for (int i = 0; !s && i < count; i++) {
        const dsc_tfile_piece *p = &pieces[i];
        size_t nbytes = (size_t)p->count * dsc_dtype_size(p->tensor.dtype);
        mine[i] = (piece_meta){
            p->tensor, p->begin, p->count, (int64_t)crc32(0L, (const Bytef *)p->data, (uInt)nbytes), rank, i};
        if (p->begin < 0 || p->count < 0 || p->begin + p->count > entry_numel(&p->tensor))
            s = dsc_error(DSC_ERR_INVALID, "%s: range [%lld, %lld) outside tensor %s", f->name,
                          (long long)p->begin, (long long)(p->begin + p->count), p->tensor.path);
    }
    int my_bytes = count * (int)sizeof(piece_meta);
    MPI_Allgather(&my_bytes, 1, MPI_INT, bytes, 1, MPI_INT, f->comm);
    int sum = 0;
    for (int r = 0; r < size; r++)
        displs[r] = sum, sum += bytes[r];
    *total = sum / (int)sizeof(piece_meta);
    *all = malloc((size_t)(sum ? sum : 1));
    if (!*all && !s) s = dsc_error(DSC_ERR_NOMEM, "%s: piece gather", f->name);
    if (*all) MPI_Allgatherv(mine, my_bytes, MPI_BYTE, *all, bytes, displs, MPI_BYTE, f->comm);
    free(mine);
    free(bytes);
    free(displs);
    return s;
}

/* Defines each tensor once, in name order (identical on every rank), with the
 * segments written by the first holder of each distinct range; marks in
 * `writes` the local pieces this rank writes. */
static dsc_status define_union(dsc_tfile *f, piece_meta *all, int total, int rank, bool *writes) {
    qsort(all, (size_t)total, sizeof *all, compare_meta);
    dsc_status s = NULL;
    for (int i = 0; !s && i < total;) {
        int end = i;
        while (end < total && strcmp(all[end].tensor.path, all[i].tensor.path) == 0)
            end++;
        segment *segments = malloc((size_t)(end - i) * sizeof *segments);
        int n = 0;
        if (!segments) s = dsc_error(DSC_ERR_NOMEM, "%s: segments", f->name);
        for (int j = i; !s && j < end; j++) {
            if (!same_layout(&all[i].tensor, &all[j].tensor)) {
                s = dsc_error(DSC_ERR_INVALID, "%s: tensor %s is described differently by ranks %d and %d",
                              f->name, all[j].tensor.path, all[i].owner, all[j].owner);
                break;
            }
            bool repeat = j > i && all[j].begin == all[j - 1].begin && all[j].count == all[j - 1].count;
            if (repeat || all[j].count == 0) continue;
            segments[n++] = (segment){all[j].begin, all[j].count, all[j].crc};
            if (all[j].owner == rank) writes[all[j].local_index] = true;
        }
        if (s)
            free(segments);
        else
            s = create_set(f, &all[i].tensor, segments, n);
        i = end;
    }
    if (!s) qsort(f->sets, (size_t)f->n_sets, sizeof *f->sets, compare_sets);
    return s;
}

/* Selects elements [begin, end) of the row-major flattening of a tensor of
 * shape `dims` as a union of hyperslabs, walking from `begin`: each slab is
 * the largest block of whole sub-tensors of the outermost dimension k at
 * which the position is aligned and that still fits, clipped to the end of
 * dimension k. Partial rows toward an alignment and back down to `end`
 * make at most 2 * ndim slabs; every index stays below ndim <= DSC_MAX_DIMS
 * by construction (a loop, not a recursion the compiler must bound). */
static herr_t select_range(hid_t space, int ndim, const hsize_t *dims, hsize_t begin, hsize_t end) {
    if (ndim < 1 || ndim > DSC_MAX_DIMS) return -1;
    hsize_t stride[DSC_MAX_DIMS];
    stride[ndim - 1] = 1;
    for (int i = ndim - 1; i > 0; i--)
        stride[i - 1] = stride[i] * dims[i];
    for (hsize_t pos = begin; pos < end;) {
        int k = 0;
        while (k < ndim - 1 && (pos % stride[k] != 0 || pos + stride[k] > end))
            k++;
        hsize_t start[DSC_MAX_DIMS], count[DSC_MAX_DIMS];
        for (int i = 0; i < ndim; i++) {
            start[i] = i > k ? 0 : pos / stride[i] % dims[i];
            count[i] = i > k ? dims[i] : 1;
        }
        hsize_t fit = (end - pos) / stride[k], room = dims[k] - start[k];
        count[k] = fit < room ? fit : room;
        if (H5Sselect_hyperslab(space, pos == begin ? H5S_SELECT_SET : H5S_SELECT_OR, start, NULL, count, NULL) <
            0)
            return -1;
        pos += count[k] * stride[k];
    }
    return 0;
}

static dsc_status transfer(dsc_tfile *f, const dataset *d, int64_t begin, int64_t count, void *data, bool write) {
    if (count == 0) return NULL;
    hid_t fspace = H5Dget_space(d->id);
    hsize_t dims[DSC_MAX_DIMS];
    for (int i = 0; i < d->entry.ndim; i++)
        dims[i] = (hsize_t)d->entry.shape[i];
    herr_t rc = d->entry.ndim == 0
                    ? H5Sselect_all(fspace)
                    : select_range(fspace, d->entry.ndim, dims, (hsize_t)begin, (hsize_t)(begin + count));
    hsize_t mcount = (hsize_t)count;
    hid_t mspace = H5Screate_simple(1, &mcount, NULL);
    if (rc >= 0) {
        hid_t mt = memory_type(d->entry.dtype);
        rc = write ? H5Dwrite(d->id, mt, mspace, fspace, H5P_DEFAULT, data)
                   : H5Dread(d->id, mt, mspace, fspace, H5P_DEFAULT, data);
    }
    H5Sclose(mspace);
    H5Sclose(fspace);
    if (rc < 0) {
        char what[320];
        snprintf(what, sizeof what, "%s tensor %s", write ? "writing" : "reading", d->entry.path);
        return h5_error(write ? DSC_ERR_IO : DSC_ERR_CORRUPT, what, f);
    }
    return NULL;
}

dsc_status dsc_tfile_write_all(dsc_tfile *f, const dsc_tfile_piece *pieces, int count) {
    int rank;
    MPI_Comm_rank(f->comm, &rank);
    piece_meta *all = NULL;
    int total = 0;
    bool *writes = calloc((size_t)(count ? count : 1), sizeof *writes);
    dsc_status s = writes ? NULL : dsc_error(DSC_ERR_NOMEM, "%s: write plan", f->name);
    dsc_status gathered = gather_meta(f, pieces, count, &all, &total);
    if (!s)
        s = gathered;
    else
        dsc_status_free(gathered);
    /* Every rank must agree before the collective dataset creation starts. */
    s = dsc_agree(f->comm, s);
    if (!s) s = dsc_agree(f->comm, define_union(f, all, total, rank, writes));
    for (int i = 0; !s && i < count; i++) {
        if (!writes[i]) continue;
        s = transfer(f, find_set(f, pieces[i].tensor.path), pieces[i].begin, pieces[i].count,
                     (void *)pieces[i].data, true);
    }
    free(all);
    free(writes);
    return dsc_agree(f->comm, s);
}

/* ---- reading ---------------------------------------------------------------------------- */

static dsc_status check_crc(dsc_tfile *f, const dataset *d, const segment *g, const void *buf) {
    size_t bytes = (size_t)g->count * dsc_dtype_size(d->entry.dtype);
    DSC_CHECK((int64_t)crc32(0L, (const Bytef *)buf, (uInt)bytes) == g->crc, DSC_ERR_CORRUPT,
              "%s: tensor %s: checksum mismatch in elements [%lld, %lld) (file corrupted)", f->name, d->entry.path,
              (long long)g->begin, (long long)(g->begin + g->count));
    return NULL;
}

/* Reads [begin, end) through the segments that cover it, checking each
 * segment's CRC. A segment inside the range is read in place; one that
 * sticks out is read whole into a temporary buffer. */
static dsc_status read_verified(dsc_tfile *f, const dataset *d, int64_t begin, int64_t count, void *data) {
    int64_t end = begin + count, covered = begin;
    size_t esize = dsc_dtype_size(d->entry.dtype);
    for (int i = 0; i < d->n_segments && covered < end; i++) {
        const segment *g = &d->segments[i];
        if (g->begin + g->count <= covered) continue;
        if (g->begin > covered) break;
        char *dst = (char *)data + (size_t)(covered - begin) * esize;
        if (g->begin == covered && g->begin + g->count <= end) {
            DSC_TRY(transfer(f, d, g->begin, g->count, dst, false));
            DSC_TRY(check_crc(f, d, g, dst));
            covered += g->count;
            continue;
        }
        char *buf = malloc((size_t)g->count * esize);
        DSC_CHECK(buf, DSC_ERR_NOMEM, "%s: reading tensor %s", f->name, d->entry.path);
        dsc_status s = transfer(f, d, g->begin, g->count, buf, false);
        if (!s) s = check_crc(f, d, g, buf);
        if (!s) {
            int64_t piece_end = g->begin + g->count < end ? g->begin + g->count : end;
            memcpy(dst, buf + (size_t)(covered - g->begin) * esize, (size_t)(piece_end - covered) * esize);
            covered = piece_end;
        }
        free(buf);
        DSC_TRY(s);
    }
    DSC_CHECK(covered == end, DSC_ERR_CORRUPT, "%s: tensor %s: elements [%lld, %lld) were never written", f->name,
              d->entry.path, (long long)covered, (long long)end);
    return NULL;
}

dsc_status dsc_tfile_read_range(dsc_tfile *f, const char *path, int64_t begin, int64_t count, void *data) {
    const dataset *d = find_set(f, path);
    DSC_CHECK(d, DSC_ERR_CORRUPT, "%s: tensor %s is missing", f->name, path);
    int64_t numel = entry_numel(&d->entry);
    DSC_CHECK(begin >= 0 && count >= 0 && begin + count <= numel, DSC_ERR_INVALID,
              "%s: range [%lld, %lld) outside tensor %s of %lld elements", f->name, (long long)begin,
              (long long)(begin + count), path, (long long)numel);
    if (count == 0) return NULL;
    /* Without its checksums a dataset cannot be told from a damaged one:
     * stripping one attribute must not switch corruption detection off. */
    DSC_CHECK(d->segments, DSC_ERR_CORRUPT,
              "%s: tensor %s has no dsc_segments checksums (attribute stripped, or the file was written by "
              "another tool); refusing to read it unverified",
              f->name, path);
    return read_verified(f, d, begin, count, data);
}

/* ---- lookup -------------------------------------------------------------------------------- */

dsc_status dsc_tfile_describe(dsc_tfile *f, const char *path, dsc_tfile_entry *out) {
    dataset *d = find_set(f, path);
    DSC_CHECK(d, DSC_ERR_CORRUPT, "%s: tensor %s is missing", f->name, path);
    *out = d->entry;
    return NULL;
}

static void format_shape(char *buf, size_t len, dsc_dtype dtype, int ndim, const int64_t *shape) {
    size_t used = (size_t)snprintf(buf, len, "(");
    for (int i = 0; i < ndim && used < len; i++)
        used += (size_t)snprintf(buf + used, len - used, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (used < len) snprintf(buf + used, len - used, ") %s", dsc_dtype_name(dtype));
}

dsc_status dsc_tfile_expect(dsc_tfile *f, const char *path, dsc_dtype dtype, int ndim, const int64_t *shape) {
    dsc_tfile_entry e;
    DSC_TRY(dsc_tfile_describe(f, path, &e));
    dsc_tfile_entry want = {.dtype = dtype, .ndim = ndim};
    memcpy(want.shape, shape, (size_t)ndim * sizeof *shape);
    if (same_layout(&e, &want)) return NULL;
    char a[128], b[128];
    format_shape(a, sizeof a, dtype, ndim, shape);
    format_shape(b, sizeof b, e.dtype, e.ndim, e.shape);
    return dsc_error(DSC_ERR_CORRUPT, "%s: tensor %s has shape %s, expected %s", f->name, path, b, a);
}

dsc_status dsc_tfile_list(dsc_tfile *f, const char *prefix, dsc_status (*fn)(const dsc_tfile_entry *, void *),
                          void *user) {
    size_t plen = strlen(prefix);
    for (int i = 0; i < f->n_sets; i++) {
        const char *p = f->sets[i].entry.path;
        if (strncmp(p, prefix, plen) != 0 || p[plen] != '/' || strchr(p + plen + 1, '/')) continue;
        DSC_TRY(fn(&f->sets[i].entry, user));
    }
    return NULL;
}

dsc_status dsc_tfile_list_all(dsc_tfile *f, dsc_status (*fn)(const dsc_tfile_entry *, void *), void *user) {
    for (int i = 0; i < f->n_sets; i++)
        DSC_TRY(fn(&f->sets[i].entry, user));
    return NULL;
}

/* ---- attributes ------------------------------------------------------------------------------- */

dsc_status dsc_tfile_set_attr_int(dsc_tfile *f, const char *name, int64_t value) {
    return dsc_agree(f->comm, write_scalar_attr(f, f->file, name, H5T_NATIVE_INT64, &value));
}

dsc_status dsc_tfile_set_attr_string(dsc_tfile *f, const char *name, const char *value) {
    return dsc_agree(f->comm, set_string_attr(f, f->file, name, value));
}

static dsc_status open_attr(dsc_tfile *f, const char *name, hid_t *attr) {
    *attr = H5Aexists(f->file, name) > 0 ? H5Aopen(f->file, name, H5P_DEFAULT) : H5I_INVALID_HID;
    H5Eclear2(H5E_DEFAULT);
    DSC_CHECK(*attr >= 0, DSC_ERR_CORRUPT, "%s: attribute %s is missing", f->name, name);
    return NULL;
}

dsc_status dsc_tfile_get_attr_int(dsc_tfile *f, const char *name, int64_t *value) {
    hid_t attr;
    DSC_TRY(open_attr(f, name, &attr));
    hid_t t = H5Aget_type(attr);
    bool is_int = H5Tget_class(t) == H5T_INTEGER;
    H5Tclose(t);
    herr_t rc = is_int ? H5Aread(attr, H5T_NATIVE_INT64, value) : -1;
    H5Aclose(attr);
    DSC_CHECK(rc >= 0, DSC_ERR_CORRUPT, "%s: attribute %s is not an integer", f->name, name);
    return NULL;
}

dsc_status dsc_tfile_get_attr_string(dsc_tfile *f, const char *name, char **value) {
    hid_t attr;
    DSC_TRY(open_attr(f, name, &attr));
    hid_t t = H5Aget_type(attr);
    dsc_status s = NULL;
    if (H5Tget_class(t) != H5T_STRING || H5Tis_variable_str(t) > 0) {
        s = dsc_error(DSC_ERR_CORRUPT, "%s: attribute %s is not a fixed-length string", f->name, name);
    } else {
        size_t size = H5Tget_size(t);
        *value = calloc(size + 1, 1);
        if (!*value)
            s = dsc_error(DSC_ERR_NOMEM, "%s: attribute %s", f->name, name);
        else if (H5Aread(attr, t, *value) < 0)
            s = h5_error(DSC_ERR_CORRUPT, "reading a string attribute", f);
    }
    H5Tclose(t);
    H5Aclose(attr);
    return s;
}
