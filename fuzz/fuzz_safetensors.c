/* libFuzzer harness: a safetensors file, or (input starting with '{') a
 * model.safetensors.index.json naming the two small valid shards made at
 * start-up. Whatever opens is walked: every tensor described, looked up by
 * name, and read as f32 when small, so bad offsets, shapes and dtypes must
 * be refused at open, never read past the map. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsc/safetensors.h"
#include "fuzz_util.h"

static void make_shards(void) {
    static int done;
    if (done++) return;
    const char *names[2] = {"model.embed_tokens.weight", "model.norm.weight"};
    float data[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    dsc_tensor t[2] = {dsc_tensor_view(data, DSC_DTYPE_F32, 2, (int64_t[]){2, 3}, DSC_CPU),
                       dsc_tensor_view(data + 6, DSC_DTYPE_F32, 1, (int64_t[]){2}, DSC_CPU)};
    for (int i = 0; i < 2; i++) {
        char path[160];
        snprintf(path, sizeof path, "%s/model-%05d-of-00002.safetensors", fuzz_dir(), i + 1);
        dsc_status s = dsc_safetensors_write(path, 1, &names[i], &t[i], 0, NULL);
        if (s) abort(); /* the harness's own setup */
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    make_shards();
    bool index = size > 0 && data[0] == '{';
    const char *path = fuzz_write(index ? "model.safetensors.index.json" : "model.safetensors", data, size);
    dsc_safetensors *st;
    dsc_status s = dsc_safetensors_open(&st, path);
    if (s) {
        dsc_status_free(s);
        return 0;
    }
    for (int64_t i = 0; i < dsc_safetensors_count(st); i++) {
        dsc_safetensors_tensor t, again;
        dsc_safetensors_at(st, i, &t);
        if (!dsc_safetensors_find(st, t.name, &again)) abort(); /* a listed tensor must be found */
        if (t.numel <= 4096) {
            float *buf = malloc((size_t)(t.numel ? t.numel : 1) * sizeof *buf);
            dsc_status_free(dsc_safetensors_read_f32(st, t.name, buf, t.numel));
            free(buf);
        }
    }
    dsc_safetensors_metadata(st, "format");
    dsc_safetensors_close(st);
    return 0;
}
