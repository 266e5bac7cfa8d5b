/* dsc/cli.h — the command-line conventions every dsc program follows:
 * `--help` prints the usage on stdout and exits 0, `--version` prints the
 * program's and dsc's version and exits 0, and a bad option value is an
 * error naming the option and the value. Only parsing helpers; each
 * program keeps its own options and usage text. Thread-safety: no state;
 * dsc_cli_info writes to stdout. */
#ifndef DSC_CLI_H
#define DSC_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "dsc/api.h"
#include "dsc/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* dsc's version ("0.1.0"). */
DSC_API const char *dsc_version(void);

/* When argv[1] .. argv[last] (last < argc) holds "--help", prints usage to
 * stdout; else when it holds "--version", prints "PROGRAM (dsc VERSION)".
 * True when one was printed: the program then exits with status 0. */
DSC_API bool dsc_cli_info(int argc, char **argv, int last, const char *program, void (*usage)(FILE *));

/* `text` as an integer in [min, max] or a number in [min, max]; otherwise
 * DSC_ERR_INVALID "OPTION: \"TEXT\" is not an integer" or "... is outside
 * [MIN, MAX]". */
DSC_API dsc_status dsc_cli_int(const char *option, const char *text, int64_t min, int64_t max, int64_t *out);
DSC_API dsc_status dsc_cli_double(const char *option, const char *text, double min, double max, double *out);

#ifdef __cplusplus
}
#endif
#endif
