/* dsc/tensor_file.h — an HDF5 file of named tensors, opened by a group of ranks.
 *
 * The storage layer under checkpoints: every tensor is one dataset with its
 * GLOBAL shape under a path such as "model/layers.7.attn.q.weight", and each
 * rank reads or writes only the flat element range it owns (a pipeline
 * stage's whole parameter, a ZeRO partition's slice, an expert's rows). A flat
 * range of a row-major array is written as a union of hyperslabs, so any
 * contiguous piece of any tensor can be owned by any rank.
 *
 * HDF5 requires structural calls (creating datasets, attributes) to be
 * collective with identical arguments; dsc_tfile_write_all gathers every
 * rank's pieces, creates the union of tensors, and lets the lowest rank that
 * holds a given range write it (replicas write once). Each written range is
 * a "segment" with a CRC32, listed in the dataset's "dsc_segments" attribute
 * ((n, 3) int64: begin, count, crc32), so flipped bytes are detected on read
 * whatever layout reads them back; a dataset without that attribute is
 * refused on read, never read unverified. Reads are independent calls.
 * This layer knows nothing of models, optimizers or directories. */
#ifndef DSC_TENSOR_FILE_H
#define DSC_TENSOR_FILE_H

#include "dsc/api.h"
#include <mpi.h>
#include <stdint.h>

#include "dsc/status.h"
#include "dsc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_tfile dsc_tfile;

/* A tensor as one rank knows it: path, dtype, global shape. */
typedef struct dsc_tfile_entry {
    char path[256];
    dsc_dtype dtype;
    int ndim;
    int64_t shape[DSC_MAX_DIMS];
} dsc_tfile_entry;

/* Collective over comm. create fails if the file exists (nothing is ever overwritten). */
DSC_API dsc_status dsc_tfile_create(MPI_Comm comm, const char *filename, dsc_tfile **out);
DSC_API dsc_status dsc_tfile_open(MPI_Comm comm, const char *filename, dsc_tfile **out);
/* Collective. Flushes (create mode), closes and frees; safe on NULL. */
DSC_API dsc_status dsc_tfile_close(dsc_tfile *f);

/* The part of a tensor one rank holds: elements [begin, begin + count) of
 * the row-major flattening of the global tensor. */
typedef struct dsc_tfile_piece {
    dsc_tfile_entry tensor;
    int64_t begin;
    int64_t count;
    const void *data; /* count elements of tensor.dtype */
} dsc_tfile_piece;

/* Collective: defines the union of every rank's tensors (one path described
 * differently by two ranks is an error naming both) and writes every
 * distinct range once, with its checksum. Call once per file. */
DSC_API dsc_status dsc_tfile_write_all(dsc_tfile *f, const dsc_tfile_piece *pieces, int count);

/* Independent: reads elements [begin, begin + count) of `path` into data,
 * verifying the checksum of every written segment the range touches; a
 * mismatch or a range no segment covers is DSC_ERR_CORRUPT naming file,
 * tensor and elements. */
DSC_API dsc_status dsc_tfile_read_range(dsc_tfile *f, const char *path, int64_t begin, int64_t count, void *data);

/* Looks a dataset up: DSC_ERR_CORRUPT naming file and path when missing. */
DSC_API dsc_status dsc_tfile_describe(dsc_tfile *f, const char *path, dsc_tfile_entry *out);
/* Checks a dataset against an expected dtype and shape; errors name file, path, expected and found. */
DSC_API dsc_status dsc_tfile_expect(dsc_tfile *f, const char *path, dsc_dtype dtype, int ndim,
                                    const int64_t *shape);
/* Calls fn for every dataset under group `prefix` ("model"), in name order. */
DSC_API dsc_status dsc_tfile_list(dsc_tfile *f, const char *prefix,
                                  dsc_status (*fn)(const dsc_tfile_entry *entry, void *user), void *user);
/* Calls fn for every dataset of the file, whatever its group, in name order. */
DSC_API dsc_status dsc_tfile_list_all(dsc_tfile *f, dsc_status (*fn)(const dsc_tfile_entry *entry, void *user),
                                      void *user);

/* Root attributes. Writers are collective with identical values on every rank. */
DSC_API dsc_status dsc_tfile_set_attr_int(dsc_tfile *f, const char *name, int64_t value);
DSC_API dsc_status dsc_tfile_set_attr_string(dsc_tfile *f, const char *name, const char *value);
DSC_API dsc_status dsc_tfile_get_attr_int(dsc_tfile *f, const char *name, int64_t *value);
/* Returns a malloc'd string the caller frees. */
DSC_API dsc_status dsc_tfile_get_attr_string(dsc_tfile *f, const char *name, char **value);

DSC_API const char *dsc_tfile_name(const dsc_tfile *f);

#ifdef __cplusplus
}
#endif
#endif
