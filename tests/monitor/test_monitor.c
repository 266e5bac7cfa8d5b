/* The monitors' files: CRC-32C against its published check value, the CSV
 * layout of DeepSpeed's csv_monitor parsed back (one file per tag, header
 * "step,<name>", rows in order), and TensorBoard event files whose framing is
 * checked here record by record (lengths and masked CRCs). With a directory
 * argument the files stay there for tests/monitor/read_tfevents.py, which
 * reads them with the tensorboard package (test_monitor.sh). */
#define _POSIX_C_SOURCE 200809L /* mkdtemp */
#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsc/config.h"
#include "dsc/monitor.h"
#include "test_mpi.h"

static const char *out_dir; /* where the files stay, or NULL: a temporary directory */

static void test_crc32c(void **state) {
    (void)state;
    assert_int_equal(dsc_crc32c("123456789", 9), 0xE3069283u); /* the CRC-32C check value */
    assert_int_equal(dsc_crc32c("", 0), 0);
}

/* The events the test writes, and read_tfevents.py expects. */
static double loss_at(int i) {
    return 5.0 / (1.0 + i);
}
static double lr_at(int i) {
    return 1e-3 * (i + 1);
}

static void write_events(const char *dir) {
    char json[1024];
    snprintf(json, sizeof json,
             "{\"tensorboard\": {\"enabled\": true, \"output_path\": \"%s\", \"job_name\": \"job\"},"
             " \"csv_monitor\": {\"enabled\": true, \"output_path\": \"%s\", \"job_name\": \"job\"}}",
             dir, dir);
    dsc_config cfg;
    assert_ok(dsc_config_parse_string(json, "monitor.json", NULL, 0, &cfg));
    dsc_monitor *m;
    assert_ok(dsc_monitor_create(&cfg, &m));
    assert_non_null(m);
    for (int i = 0; i < 5; i++) {
        assert_ok(dsc_monitor_write(m, "Train/Samples/train_loss", loss_at(i), 16 * (i + 1)));
        assert_ok(dsc_monitor_write(m, "Train/Samples/lr", lr_at(i), 16 * (i + 1)));
    }
    dsc_monitor_destroy(m);
    dsc_config_free(&cfg);
}

static void check_csv(const char *dir) {
    char path[1024], line[256];
    snprintf(path, sizeof path, "%s/job/Train_Samples_train_loss.csv", dir);
    FILE *f = fopen(path, "r");
    assert_non_null(f);
    assert_non_null(fgets(line, sizeof line, f));
    assert_string_equal(line, "step,train_loss\n");
    int rows = 0;
    long long step;
    double value;
    while (fscanf(f, "%lld,%lf\n", &step, &value) == 2) {
        assert_int_equal(step, 16 * (rows + 1));
        assert_true(fabs(value - loss_at(rows)) <= 1e-8 * loss_at(rows)); /* written with 9 digits */
        rows++;
    }
    fclose(f);
    assert_int_equal(rows, 5);
}

static uint32_t read_u32(const unsigned char *p) {
    return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint32_t masked(const void *data, size_t n) {
    uint32_t c = dsc_crc32c(data, n);
    return ((c >> 15) | (c << 17)) + 0xA282EAD8u;
}

/* Every record of the event file is framed and checksummed; 1 + 10 records. */
static void check_tfevents(const char *dir) {
    char jobdir[1024], path[2048];
    snprintf(jobdir, sizeof jobdir, "%s/job", dir);
    DIR *d = opendir(jobdir);
    assert_non_null(d);
    path[0] = '\0';
    for (struct dirent *e; (e = readdir(d));)
        if (strncmp(e->d_name, "events.out.tfevents.", 20) == 0)
            snprintf(path, sizeof path, "%s/%s", jobdir, e->d_name);
    closedir(d);
    assert_true(path[0]);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    unsigned char head[12], data[4096], crc[4];
    int records = 0;
    while (fread(head, 1, 12, f) == 12) {
        uint64_t len = 0;
        for (int i = 7; i >= 0; i--)
            len = len << 8 | head[i];
        assert_int_equal(read_u32(head + 8), masked(head, 8));
        assert_true(len < sizeof data);
        assert_int_equal(fread(data, 1, len, f), len);
        assert_int_equal(fread(crc, 1, 4, f), 4);
        assert_int_equal(read_u32(crc), masked(data, len));
        records++;
    }
    fclose(f);
    assert_int_equal(records, 11);
}

static void test_files(void **state) {
    (void)state;
    char tmp[] = "/tmp/dsc_monitor_XXXXXX";
    const char *dir = out_dir ? out_dir : mkdtemp(tmp);
    assert_non_null(dir);
    write_events(dir);
    check_csv(dir);
    check_tfevents(dir);
    if (!out_dir) {
        char cmd[256];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
        assert_int_equal(system(cmd), 0);
    }
}

static void test_disabled_and_bad_dir(void **state) {
    (void)state;
    dsc_config cfg;
    assert_ok(dsc_config_parse_string("{}", "monitor.json", NULL, 0, &cfg));
    dsc_monitor *m = (dsc_monitor *)&cfg;
    assert_ok(dsc_monitor_create(&cfg, &m));
    assert_null(m);
    assert_ok(dsc_monitor_write(NULL, "x", 1.0, 1));
    dsc_config_free(&cfg);
    assert_ok(dsc_config_parse_string("{\"tensorboard\": {\"enabled\": true, \"output_path\": \"/proc/no\"}}",
                                      "monitor.json", NULL, 0, &cfg));
    assert_err(dsc_monitor_create(&cfg, &m), DSC_ERR_IO, "cannot create directory /proc/no");
    dsc_config_free(&cfg);
}

int main(int argc, char **argv) {
    out_dir = argc > 1 ? argv[1] : NULL;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_crc32c),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_disabled_and_bad_dir),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
