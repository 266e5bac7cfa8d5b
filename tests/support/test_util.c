/* Status assertions and numeric comparison for cmocka tests. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "test_mpi.h"

void dsc_test_ok(dsc_status s, const char *expr, const char *file, int line) {
    if (!s) return;
    print_error("%s failed: %s\n", expr, dsc_status_message(s));
    dsc_status_free(s);
    _fail(file, line);
}

void dsc_test_err(dsc_status s, int code, const char *needle, const char *expr, const char *file, int line) {
    if (!s) {
        print_error("%s succeeded; expected an error containing \"%s\"\n", expr, needle);
        _fail(file, line);
    }
    const char *msg = dsc_status_message(s);
    if ((int)dsc_status_code(s) != code || !strstr(msg, needle)) {
        print_error("%s: expected code %s with \"%s\", got code %s: %s\n", expr, dsc_code_name((dsc_code)code),
                    needle, dsc_code_name(dsc_status_code(s)), msg);
        dsc_status_free(s);
        _fail(file, line);
    }
    dsc_status_free(s);
}

double dsc_test_max_rel_err(const float *a, const float *b, int64_t n, double floor, const char *what) {
    double max_diff = 0, max_ref = floor;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= max_diff)) max_diff = d; /* NaN propagates as a failure */
        if (fabs((double)b[i]) > max_ref) max_ref = fabs((double)b[i]);
    }
    double rel = max_diff / max_ref;
    printf("  %-40s max abs err %.3e, rel err %.3e over %lld values\n", what, max_diff, rel, (long long)n);
    return rel;
}

double dsc_test_rel_err(const float *a, const float *b, int64_t n) {
    double diff = 0, ref = 1e-6;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (!(d <= diff)) diff = d; /* NaN propagates as a failure */
        if (fabs((double)b[i]) > ref) ref = fabs((double)b[i]);
    }
    return diff / ref;
}

bool dsc_test_doc_block_is(const char *path, const char *name, const char *text) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    static char doc[1 << 18];
    size_t n = fread(doc, 1, sizeof doc - 1, f);
    fclose(f);
    doc[n] = '\0';
    char open[64], close[64];
    snprintf(open, sizeof open, "<!-- %s:begin -->\n", name);
    snprintf(close, sizeof close, "<!-- %s:end -->", name);
    const char *begin = strstr(doc, open), *end = strstr(doc, close);
    if (!begin || !end || begin > end) return false;
    begin += strlen(open);
    return (size_t)(end - begin) == strlen(text) && strncmp(begin, text, strlen(text)) == 0;
}
