/* Checkpoint directories: publication order, `latest`, refusal to overwrite,
 * leftovers of a killed save, listing by step and pruning. */
#define _XOPEN_SOURCE 700 /* mkdtemp, nftw */
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/checkpoint/ckpt_dir.h"
#include "test_mpi.h"

static char root[512];

static int remove_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void fake_save(const char *tag) {
    assert_ok(dsc_ckpt_dir_begin(root, tag));
    char partial[1024], file[1200];
    dsc_ckpt_partial_dir(root, tag, partial, sizeof partial);
    snprintf(file, sizeof file, "%s/%s", partial, DSC_CKPT_FILE);
    FILE *f = fopen(file, "w");
    assert_non_null(f);
    fputs(tag, f);
    fclose(f);
    assert_ok(dsc_ckpt_dir_publish(root, tag));
}

static int exists(const char *tag) {
    char dir[1024];
    struct stat st;
    dsc_ckpt_final_dir(root, tag, dir, sizeof dir);
    return stat(dir, &st) == 0;
}

static void test_publish_latest_and_prune(void **state) {
    (void)state;
    /* a fresh directory of its own: a name from the pid met an earlier run's leftovers when the pid recurred */
    char top[400];
    snprintf(top, sizeof top, "%s/test_ckpt_dir_XXXXXX", DSC_BINARY_DIR);
    assert_non_null(mkdtemp(top));
    snprintf(root, sizeof root, "%s/save", top);
    char tag[128];
    assert_err(dsc_ckpt_read_latest(root, tag, sizeof tag), DSC_ERR_IO, "no checkpoint to resume");
    fake_save("global_step5");
    assert_ok(dsc_ckpt_read_latest(root, tag, sizeof tag));
    assert_string_equal(tag, "global_step5");
    assert_err(dsc_ckpt_dir_begin(root, "global_step5"), DSC_ERR_IO, "refusing to overwrite");
    assert_err(dsc_ckpt_dir_begin(root, "../evil"), DSC_ERR_INVALID, "must be a plain name");

    /* A save killed after begin leaves only a partial directory: latest is untouched. */
    assert_ok(dsc_ckpt_dir_begin(root, "global_step10"));
    assert_ok(dsc_ckpt_read_latest(root, tag, sizeof tag));
    assert_string_equal(tag, "global_step5");
    assert_false(exists("global_step10"));
    fake_save("global_step10"); /* begin clears the leftover */
    fake_save("global_step100");
    fake_save("global_step20");

    char(*tags)[128];
    int n;
    assert_ok(dsc_ckpt_list_tags(root, &tags, &n));
    assert_int_equal(n, 4);
    assert_string_equal(tags[0], "global_step5");
    assert_string_equal(tags[3], "global_step100");
    free(tags);

    /* latest (global_step20) survives pruning even though it is not the newest step. */
    assert_ok(dsc_ckpt_prune(root, 1));
    assert_true(exists("global_step20"));
    assert_true(exists("global_step100"));
    assert_false(exists("global_step5"));
    assert_false(exists("global_step10"));

    assert_ok(dsc_ckpt_dir_begin(root, "global_step30"));
    dsc_ckpt_dir_abandon(root, "global_step30");
    char partial[1024];
    struct stat st;
    dsc_ckpt_partial_dir(root, "global_step30", partial, sizeof partial);
    assert_int_not_equal(stat(partial, &st), 0);
    assert_int_equal(nftw(top, remove_entry, 8, FTW_DEPTH | FTW_PHYS), 0);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_publish_latest_and_prune)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
