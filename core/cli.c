/* The command-line conventions of dsc's programs (dsc/cli.h): --help and
 * --version, and option values checked with messages that name the option
 * and the value. Not here: any program's options. */
#include "dsc/cli.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#ifndef DSC_VERSION
#define DSC_VERSION "unknown"
#endif

const char *dsc_version(void) {
    return DSC_VERSION;
}

bool dsc_cli_info(int argc, char **argv, int last, const char *program, void (*usage)(FILE *)) {
    bool help = false, version = false;
    for (int i = 1; i <= last && i < argc; i++) {
        help = help || strcmp(argv[i], "--help") == 0;
        version = version || strcmp(argv[i], "--version") == 0;
    }
    if (help)
        usage(stdout);
    else if (version)
        printf("%s (dsc %s)\n", program, dsc_version());
    return help || version;
}

dsc_status dsc_cli_int(const char *option, const char *text, int64_t min, int64_t max, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    DSC_CHECK(*text && !*end && errno == 0, DSC_ERR_INVALID, "%s: \"%s\" is not an integer", option, text);
    DSC_CHECK(v >= min && v <= max, DSC_ERR_INVALID, "%s: %lld is outside [%lld, %lld]", option, v, (long long)min,
              (long long)max);
    *out = v;
    return NULL;
}

dsc_status dsc_cli_double(const char *option, const char *text, double min, double max, double *out) {
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    DSC_CHECK(*text && !*end && errno == 0 && !isnan(v), DSC_ERR_INVALID, "%s: \"%s\" is not a number", option,
              text);
    DSC_CHECK(v >= min && v <= max, DSC_ERR_INVALID, "%s: %s is outside [%g, %g]", option, text, min, max);
    *out = v;
    return NULL;
}
