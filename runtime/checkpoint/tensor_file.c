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

#include "runtime/checkpoint/agree.h"

typedef struct dataset {
    dsc_tfile_entry entry;
    hid_t id;
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

static void quiet_hdf5(void) { H5Eset_auto2(H5E_DEFAULT, NULL, NULL); }

/* ---- dtype mapping -------------------------------------------------------------------- */

/* Half types are stored as 16-bit unsigned integers; the "dsc_dtype" attribute says which. */
static hid_t file_type(dsc_dtype d) {
    switch (d) {
    case DSC_DTYPE_F32: return H5T_IEEE_F32LE;
    case DSC_DTYPE_BF16:
    case DSC_DTYPE_F16: return H5T_STD_U16LE;
    case DSC_DTYPE_I32: return H5T_STD_I32LE;
    case DSC_DTYPE_I64: return H5T_STD_I64LE;
    default: return H5T_STD_U8LE;
    }
}

static hid_t memory_type(dsc_dtype d) {
    switch (d) {
    case DSC_DTYPE_F32: return H5T_NATIVE_FLOAT;
    case DSC_DTYPE_BF16:
    case DSC_DTYPE_F16: return H5T_NATIVE_UINT16;
    case DSC_DTYPE_I32: return H5T_NATIVE_INT32;
    case DSC_DTYPE_I64: return H5T_NATIVE_INT64;
    default: return H5T_NATIVE_UINT8;
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

static dsc_status push_set(dsc_tfile *f, const dsc_tfile_entry *e, hid_t id) {
    dataset *grown = realloc(f->sets, (size_t)(f->n_sets + 1) * sizeof *grown);
    if (!grown) return dsc_error(DSC_ERR_NOMEM, "%s: dataset table", f->name);
    f->sets = grown;
    f->sets[f->n_sets++] = (dataset){*e, id};
    return NULL;
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
    for (int i = 0; i < ndim; i++) e->shape[i] = (int64_t)dims[i];
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
        if (cls == H5T_FLOAT && size == 4) e->dtype = DSC_DTYPE_F32;
        else if (cls == H5T_INTEGER && size == 4) e->dtype = DSC_DTYPE_I32;
        else if (cls == H5T_INTEGER && size == 8) e->dtype = DSC_DTYPE_I64;
        else if (cls == H5T_INTEGER && size == 1) e->dtype = DSC_DTYPE_U8;
        else return dsc_error(DSC_ERR_CORRUPT, "%s: dataset %s has a type dsc cannot read", f->name, path);
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
    v->status = read_entry(v->f, id, path, &e);
    if (!v->status) v->status = push_set(v->f, &e, id);
    if (v->status) {
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
    snprintf((*out)->name, sizeof (*out)->name, "%s", filename);
    return NULL;
}

static hid_t mpio_access(MPI_Comm comm) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_fapl_mpio(fapl, comm, MPI_INFO_NULL);
    return fapl;
}

static void free_file(dsc_tfile *f) {
    if (!f) return;
    for (int i = 0; i < f->n_sets; i++) H5Dclose(f->sets[i].id);
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
        if (f->file < 0) s = h5_error(DSC_ERR_CORRUPT, "cannot open as HDF5", f);
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
    for (int i = 0; i < f->n_sets; i++) H5Dclose(f->sets[i].id);
    f->n_sets = 0;
    if (H5Fclose(f->file) < 0 && !s) s = h5_error(DSC_ERR_IO, "close failed", f);
    f->file = H5I_INVALID_HID;
    MPI_Comm comm = f->comm;
    free_file(f);
    return dsc_agree(comm, s);
}

const char *dsc_tfile_name(const dsc_tfile *f) { return f->name; }

/* ---- defining datasets ------------------------------------------------------------------ */

static bool same_layout(const dsc_tfile_entry *a, const dsc_tfile_entry *b) {
    if (a->dtype != b->dtype || a->ndim != b->ndim) return false;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return false;
    return true;
}

static dsc_status set_dtype_attr(dsc_tfile *f, hid_t id, dsc_dtype dtype) {
    const char *name = dsc_dtype_name(dtype);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(name) + 1);
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(id, "dsc_dtype", t, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t rc = attr < 0 ? -1 : H5Awrite(attr, t, name);
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    H5Tclose(t);
    return rc < 0 ? h5_error(DSC_ERR_IO, "writing a dtype attribute", f) : NULL;
}

static dsc_status create_set(dsc_tfile *f, const dsc_tfile_entry *e) {
    hsize_t dims[DSC_MAX_DIMS];
    for (int i = 0; i < e->ndim; i++) dims[i] = (hsize_t)e->shape[i];
    hid_t space = H5Screate_simple(e->ndim, dims, NULL);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    hid_t id = H5Dcreate2(f->file, e->path, file_type(e->dtype), space, lcpl, H5P_DEFAULT, H5P_DEFAULT);
    H5Pclose(lcpl);
    H5Sclose(space);
    if (id < 0) {
        char what[300];
        snprintf(what, sizeof what, "creating dataset %s", e->path);
        return h5_error(DSC_ERR_IO, what, f);
    }
    dsc_status s = set_dtype_attr(f, id, e->dtype);
    if (!s) s = push_set(f, e, id);
    if (s) H5Dclose(id);
    return s;
}

/* Gathers every rank's entries (as raw bytes) to every rank. */
static dsc_status gather_entries(dsc_tfile *f, const dsc_tfile_entry *entries, int count, dsc_tfile_entry **all,
                                 int *total, int **owner) {
    int size;
    MPI_Comm_size(f->comm, &size);
    int *counts = malloc((size_t)size * sizeof *counts);
    int *byte_counts = malloc((size_t)size * sizeof *byte_counts);
    int *displs = malloc((size_t)size * sizeof *displs);
    DSC_CHECK(counts && byte_counts && displs, DSC_ERR_NOMEM, "%s: entry gather", f->name);
    MPI_Allgather(&count, 1, MPI_INT, counts, 1, MPI_INT, f->comm);
    *total = 0;
    for (int r = 0; r < size; r++) {
        byte_counts[r] = counts[r] * (int)sizeof(dsc_tfile_entry);
        displs[r] = *total * (int)sizeof(dsc_tfile_entry);
        *total += counts[r];
    }
    *all = malloc((size_t)(*total ? *total : 1) * sizeof **all);
    *owner = malloc((size_t)(*total ? *total : 1) * sizeof **owner);
    DSC_CHECK(*all && *owner, DSC_ERR_NOMEM, "%s: entry gather", f->name);
    MPI_Allgatherv(entries, count * (int)sizeof(dsc_tfile_entry), MPI_BYTE, *all, byte_counts, displs, MPI_BYTE,
                   f->comm);
    for (int r = 0, i = 0; r < size; r++)
        for (int j = 0; j < counts[r]; j++) (*owner)[i++] = r;
    free(counts);
    free(byte_counts);
    free(displs);
    return NULL;
}

typedef struct owned_entry {
    const dsc_tfile_entry *entry;
    int owner;
} owned_entry;

static int compare_owned(const void *a, const void *b) {
    return strcmp(((const owned_entry *)a)->entry->path, ((const owned_entry *)b)->entry->path);
}

/* Creates each distinct path once, in name order, so every rank issues the
 * same sequence of collective HDF5 calls. */
static dsc_status create_union(dsc_tfile *f, const dsc_tfile_entry *all, const int *owner, int total) {
    owned_entry *sorted = malloc((size_t)(total ? total : 1) * sizeof *sorted);
    DSC_CHECK(sorted, DSC_ERR_NOMEM, "%s: entry sort", f->name);
    for (int i = 0; i < total; i++) sorted[i] = (owned_entry){&all[i], owner[i]};
    qsort(sorted, (size_t)total, sizeof *sorted, compare_owned);
    dsc_status s = NULL;
    for (int i = 0; !s && i < total; i++) {
        const owned_entry *cur = &sorted[i];
        if (i > 0 && strcmp(sorted[i - 1].entry->path, cur->entry->path) == 0) {
            if (!same_layout(sorted[i - 1].entry, cur->entry))
                s = dsc_error(DSC_ERR_INVALID, "%s: tensor %s is described differently by ranks %d and %d",
                              f->name, cur->entry->path, sorted[i - 1].owner, cur->owner);
            continue;
        }
        if (find_set(f, cur->entry->path)) continue; /* defined by an earlier call */
        s = create_set(f, cur->entry);
        if (!s) qsort(f->sets, (size_t)f->n_sets, sizeof *f->sets, compare_sets);
    }
    free(sorted);
    return s;
}

dsc_status dsc_tfile_define_all(dsc_tfile *f, const dsc_tfile_entry *entries, int count) {
    dsc_tfile_entry *all = NULL;
    int *owner = NULL, total = 0;
    dsc_status s = gather_entries(f, entries, count, &all, &total, &owner);
    if (!s) s = create_union(f, all, owner, total);
    free(all);
    free(owner);
    return dsc_agree(f->comm, s);
}

/* ---- flat ranges as hyperslabs ------------------------------------------------------------- */

/* Selects elements [begin, end) of the row-major flattening of the trailing
 * dimensions from `dim` on, under the fixed leading coordinates `prefix`:
 * a partial head row, a block of whole rows, a partial tail row. */
static herr_t select_range(hid_t space, int ndim, const hsize_t *dims, int dim, hsize_t *prefix, hsize_t begin,
                           hsize_t end, bool *first) {
    if (begin >= end) return 0;
    hsize_t inner = 1;
    for (int i = dim + 1; i < ndim; i++) inner *= dims[i];
    hsize_t start[DSC_MAX_DIMS], count[DSC_MAX_DIMS];
    if (dim == ndim - 1 || (begin % inner == 0 && end % inner == 0)) {
        for (int i = 0; i < dim; i++) start[i] = prefix[i], count[i] = 1;
        start[dim] = begin / inner;
        count[dim] = (end - begin) / inner;
        for (int i = dim + 1; i < ndim; i++) start[i] = 0, count[i] = dims[i];
        herr_t rc = H5Sselect_hyperslab(space, *first ? H5S_SELECT_SET : H5S_SELECT_OR, start, NULL, count, NULL);
        *first = false;
        return rc;
    }
    hsize_t row = begin / inner;
    if (begin % inner != 0 || end - begin < inner) {
        hsize_t row_end = (row + 1) * inner < end ? (row + 1) * inner : end;
        prefix[dim] = row;
        if (select_range(space, ndim, dims, dim + 1, prefix, begin - row * inner, row_end - row * inner, first) < 0)
            return -1;
        return select_range(space, ndim, dims, dim, prefix, row_end, end, first);
    }
    hsize_t whole_end = end / inner * inner;
    if (select_range(space, ndim, dims, dim, prefix, begin, whole_end, first) < 0) return -1;
    return select_range(space, ndim, dims, dim, prefix, whole_end, end, first);
}

static dsc_status transfer(dsc_tfile *f, const char *path, int64_t begin, int64_t count, void *data, bool write) {
    dataset *d = find_set(f, path);
    DSC_CHECK(d, DSC_ERR_CORRUPT, "%s: tensor %s is missing", f->name, path);
    int64_t numel = 1;
    for (int i = 0; i < d->entry.ndim; i++) numel *= d->entry.shape[i];
    DSC_CHECK(begin >= 0 && count >= 0 && begin + count <= numel, DSC_ERR_INVALID,
              "%s: range [%lld, %lld) outside tensor %s of %lld elements", f->name, (long long)begin,
              (long long)(begin + count), path, (long long)numel);
    if (count == 0) return NULL;
    hid_t fspace = H5Dget_space(d->id);
    hsize_t dims[DSC_MAX_DIMS], prefix[DSC_MAX_DIMS] = {0};
    for (int i = 0; i < d->entry.ndim; i++) dims[i] = (hsize_t)d->entry.shape[i];
    bool first = true;
    herr_t rc = d->entry.ndim == 0 ? H5Sselect_all(fspace)
                                   : select_range(fspace, d->entry.ndim, dims, 0, prefix, (hsize_t)begin,
                                                  (hsize_t)(begin + count), &first);
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
        snprintf(what, sizeof what, "%s tensor %s", write ? "writing" : "reading", path);
        return h5_error(write ? DSC_ERR_IO : DSC_ERR_CORRUPT, what, f);
    }
    return NULL;
}

dsc_status dsc_tfile_write_range(dsc_tfile *f, const char *path, int64_t begin, int64_t count, const void *data) {
    return transfer(f, path, begin, count, (void *)data, true);
}

dsc_status dsc_tfile_read_range(dsc_tfile *f, const char *path, int64_t begin, int64_t count, void *data) {
    return transfer(f, path, begin, count, data, false);
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

/* ---- attributes ------------------------------------------------------------------------------- */

static dsc_status write_attr(dsc_tfile *f, const char *name, hid_t type, const void *value) {
    hid_t space = H5Screate(H5S_SCALAR);
    hid_t attr = H5Acreate2(f->file, name, type, space, H5P_DEFAULT, H5P_DEFAULT);
    herr_t rc = attr < 0 ? -1 : H5Awrite(attr, type, value);
    if (attr >= 0) H5Aclose(attr);
    H5Sclose(space);
    dsc_status s = NULL;
    if (rc < 0) {
        char what[160];
        snprintf(what, sizeof what, "writing attribute %s", name);
        s = h5_error(DSC_ERR_IO, what, f);
    }
    return dsc_agree(f->comm, s);
}

dsc_status dsc_tfile_set_attr_int(dsc_tfile *f, const char *name, int64_t value) {
    return write_attr(f, name, H5T_NATIVE_INT64, &value);
}

dsc_status dsc_tfile_set_attr_string(dsc_tfile *f, const char *name, const char *value) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(value) + 1);
    dsc_status s = write_attr(f, name, t, value);
    H5Tclose(t);
    return s;
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
        if (!*value) s = dsc_error(DSC_ERR_NOMEM, "%s: attribute %s", f->name, name);
        else if (H5Aread(attr, t, *value) < 0) s = h5_error(DSC_ERR_CORRUPT, "reading a string attribute", f);
    }
    H5Tclose(t);
    H5Aclose(attr);
    return s;
}
