/* dsc/safetensors.h — reading (and writing) Hugging Face safetensors files.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of
 * JSON ({name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__":
 * {str: str}}), then the raw little-endian tensor bytes, offsets relative to
 * the end of the header. Files are memory-mapped, validated completely when
 * opened (every error is DSC_ERR_CORRUPT naming the file and the tensor) and
 * tensors are returned as zero-copy views or converted to f32 into a caller
 * buffer. A sharded checkpoint (`model.safetensors.index.json` with a
 * `weight_map` of tensor name -> shard file) opens as one set. */
#ifndef DSC_SAFETENSORS_H
#define DSC_SAFETENSORS_H

#include "dsc/api.h"
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsc/status.h"
#include "dsc/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsc_safetensors dsc_safetensors;

/* One tensor of an opened set. `data` points into the read-only mapping (it
 * may be unaligned for the dtype) and lives until the set is closed.
 * `dtype_name` is the file's ("F32", "BF16", "F64", ...); `dtype` is its
 * dsc equivalent, or DSC_DTYPE_COUNT when dsc has none (F64, I16, BOOL, ...). */
typedef struct dsc_safetensors_tensor {
    const char *name;
    const char *file;
    const char *dtype_name;
    dsc_dtype dtype;
    int ndim;
    int64_t shape[DSC_MAX_DIMS];
    int64_t numel;
    const void *data;
    size_t nbytes;
} dsc_safetensors_tensor;

/* Opens `path`: a .safetensors file, a *.index.json of a sharded checkpoint,
 * or a directory holding model.safetensors.index.json or model.safetensors.
 * Missing or unreadable files are DSC_ERR_IO; malformed content DSC_ERR_CORRUPT. */
DSC_API dsc_status dsc_safetensors_open(dsc_safetensors **out, const char *path);
DSC_API void dsc_safetensors_close(dsc_safetensors *st);

/* Tensors sorted by name, i in [0, count). */
DSC_API int64_t dsc_safetensors_count(const dsc_safetensors *st);
DSC_API void dsc_safetensors_at(const dsc_safetensors *st, int64_t i, dsc_safetensors_tensor *out);
/* False when there is no tensor `name`. */
DSC_API bool dsc_safetensors_find(const dsc_safetensors *st, const char *name, dsc_safetensors_tensor *out);
/* A string of "__metadata__" (of the first file for a sharded set), or NULL. */
DSC_API const char *dsc_safetensors_metadata(const dsc_safetensors *st, const char *key);

/* A non-owning dsc_tensor over the mapped bytes (read-only memory: do not
 * write). A missing name is DSC_ERR_INVALID; a dtype dsc lacks DSC_ERR_UNSUPPORTED. */
DSC_API dsc_status dsc_safetensors_view(const dsc_safetensors *st, const char *name, dsc_tensor *out);
/* Converts tensor `name` (F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL) to
 * f32 into dst, which holds `numel` floats; numel must equal the tensor's. */
DSC_API dsc_status dsc_safetensors_read_f32(const dsc_safetensors *st, const char *name, float *dst,
                                            int64_t numel);
/* Elements [offset, offset + count) of tensor `name` (row-major) as f32: only
 * those bytes of the mapping are touched (a tensor-parallel shard). */
DSC_API dsc_status dsc_safetensors_read_f32_range(const dsc_safetensors *st, const char *name, int64_t offset,
                                                  int64_t count, float *dst);

/* Writes n CPU tensors (f32, bf16, f16, i32, i64, u8) named names[i] into a
 * new file at `path` (written to path.tmp, then renamed), with n_meta
 * metadata pairs meta[2*j] = key, meta[2*j+1] = value. Names must be distinct
 * and not "__metadata__". */
DSC_API dsc_status dsc_safetensors_write(const char *path, int64_t n, const char *const *names,
                                         const dsc_tensor *tensors, int n_meta, const char *const *meta);

#ifdef __cplusplus
}
#endif
#endif
