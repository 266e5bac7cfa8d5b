/* libFuzzer harness: a token file (32-byte header + tokens). What opens is
 * read back: its first and last tokens against the header's vocabulary and
 * a data loader over it (one sequence window of 4 tokens), so a header's
 * count, width and vocabulary must agree with the file before any read. */
#include <stdlib.h>

#include "dsc/data.h"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    const char *path = fuzz_write("data.tok", data, size);
    dsc_token_file *f;
    dsc_status s = dsc_token_file_open(path, &f);
    if (s) {
        dsc_status_free(s);
        return 0;
    }
    int64_t n = dsc_token_file_count(f), k = n < 16 ? n : 16;
    int64_t vocab = dsc_token_file_vocab(f) ? dsc_token_file_vocab(f) : 65536;
    int32_t buf[16];
    dsc_status_free(dsc_token_file_read(f, 0, k, vocab, buf));
    dsc_status_free(dsc_token_file_read(f, n - k, k, vocab, buf));
    dsc_token_file_close(f);
    dsc_data_loader_options o = {.path = path,
                                 .micro_batch_size = 1,
                                 .seq_len = 4,
                                 .micro_batches = 1,
                                 .dp_size = 1,
                                 .vocab_size = vocab,
                                 .val_fraction = 0.25,
                                 .seed = 1};
    dsc_data_loader *dl;
    s = dsc_data_loader_open(&o, &dl);
    if (s) {
        dsc_status_free(s);
        return 0;
    }
    int32_t tokens[4], targets[4];
    dsc_tensor t = dsc_tensor_view(tokens, DSC_DTYPE_I32, 2, (int64_t[]){1, 4}, DSC_CPU);
    dsc_tensor g = dsc_tensor_view(targets, DSC_DTYPE_I32, 2, (int64_t[]){1, 4}, DSC_CPU);
    dsc_status_free(dsc_data_loader_fill(dl, DSC_DATA_SPLIT_TRAIN, 3, 0, &t, &g));
    dsc_status_free(dsc_data_loader_fill(dl, DSC_DATA_SPLIT_VAL, 0, 0, &t, &g));
    dsc_data_loader_close(dl);
    return 0;
}
