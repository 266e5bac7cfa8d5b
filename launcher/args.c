/* dsc-launch's command line: options up to the program, then the program and
 * its arguments untouched. Only parses and checks the form; what the options
 * mean for mpirun is command.c's business. */
#define _POSIX_C_SOURCE 200809L /* strndup */
#include <stdlib.h>
#include <string.h>

#include "launcher/launcher.h"

const char dsc_launch_usage[] =
    "usage: dsc-launch [-n N] [-H|--hostfile FILE] [-i|--include HOSTS | -e|--exclude HOSTS]\n"
    "                  [--remote-agent COMMAND] [--net CIDR] [--no-host-check]\n"
    "                  [--oversubscribe] [--dry-run] [--mpirun PATH] [--mpi-args \"OPTIONS\"]\n"
    "                  [--stop-timeout S]\n"
    "                  [--] PROGRAM [ARGS...]\n"
    "       dsc-launch --help | --version\n"
    "\n"
    "  -n, --np N          ranks to start (default: every slot of the hostfile)\n"
    "  -H, --hostfile FILE DeepSpeed hostfile: \"HOSTNAME slots=N\" per line, # comments;\n"
    "                      without it the job runs on this machine\n"
    "  -i, --include HOSTS use only these hosts/slots, e.g. \"worker-1:0,1@worker-2\"\n"
    "  -e, --exclude HOSTS use all but these hosts/slots (same syntax)\n"
    "  --remote-agent CMD  how mpirun starts its daemon on a host, as `CMD HOST COMMAND`\n"
    "                      (default: ssh)\n"
    "  --net CIDR          MPI over TCP on this network only, e.g. 10.1.0.0/16\n"
    "  --no-host-check     do not ask every host (`AGENT HOST true`) before the start\n"
    "  --oversubscribe     allow more ranks than hostfile slots (automatic without a hostfile)\n"
    "  --dry-run           print the mpirun command and exit\n"
    "  --mpirun PATH       the mpirun to run (default: mpirun on PATH)\n"
    "  --mpi-args OPTIONS  extra mpirun options, split on blanks (repeatable)\n"
    "  --stop-timeout S    after SIGTERM/SIGINT, seconds the ranks get to exit before the job is\n"
    "                      ended (60)\n"
    "\n"
    "Sets OMP_NUM_THREADS=1 and DSC_NUM_THREADS=1 unless set, forwards every DSC_* variable,\n"
    "and exits non-zero naming the failed rank when any rank fails. SIGTERM or SIGINT reach\n"
    "every rank as SIGUSR2 (dsc-serve drains on it; the launcher exits 0 when every rank\n"
    "does); a second signal ends the job at once.\n";

/* Splits `text` on blanks and appends the words to opt->mpi_args. */
static dsc_status add_mpi_args(dsc_launch_options *opt, const char *text) {
    for (const char *p = text;;) {
        p += strspn(p, " \t\n");
        if (!*p) return NULL;
        size_t n = strcspn(p, " \t\n");
        const char **grown = realloc(opt->mpi_args, (size_t)(opt->n_mpi_args + 1) * sizeof *grown);
        DSC_CHECK(grown, DSC_ERR_NOMEM, "--mpi-args");
        opt->mpi_args = grown;
        char *word = strndup(p, n);
        DSC_CHECK(word, DSC_ERR_NOMEM, "--mpi-args");
        opt->mpi_args[opt->n_mpi_args++] = word;
        p += n;
    }
}

/* Matches `arg` against an option taking a value ("-n 4", "--np=4"); sets
 * *value and advances *i past what it consumed. */
static dsc_status take_value(int argc, char **argv, int *i, const char *short_name, const char *long_name,
                             const char **value, bool *matched) {
    const char *arg = argv[*i];
    size_t long_len = strlen(long_name);
    *matched = false;
    if (strncmp(arg, long_name, long_len) == 0 && arg[long_len] == '=') {
        *matched = true;
        *value = arg + long_len + 1;
        return NULL;
    }
    if (strcmp(arg, long_name) != 0 && !(short_name && strcmp(arg, short_name) == 0)) return NULL;
    *matched = true;
    DSC_CHECK(*i + 1 < argc, DSC_ERR_INVALID, "option %s needs a value", arg);
    *value = argv[++*i];
    return NULL;
}

static dsc_status parse_np(const char *text, int *np) {
    char *end;
    long v = strtol(text, &end, 10);
    DSC_CHECK(*text && !*end && v >= 1 && v <= 1 << 20, DSC_ERR_INVALID,
              "-n needs a positive number of ranks, got \"%s\"", text);
    *np = (int)v;
    return NULL;
}

static dsc_status parse_option(int argc, char **argv, int *i, dsc_launch_options *opt) {
    const char *arg = argv[*i], *value = NULL;
    bool m;
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) {
        opt->help = true;
        return NULL;
    }
    if (strcmp(arg, "--version") == 0) {
        opt->version = true;
        return NULL;
    }
    if (strcmp(arg, "--oversubscribe") == 0) {
        opt->oversubscribe = true;
        return NULL;
    }
    if (strcmp(arg, "--dry-run") == 0) {
        opt->dry_run = true;
        return NULL;
    }
    if (strcmp(arg, "--no-host-check") == 0) {
        opt->no_host_check = true;
        return NULL;
    }
    DSC_TRY(take_value(argc, argv, i, "-n", "--np", &value, &m));
    if (m) return parse_np(value, &opt->np);
    DSC_TRY(take_value(argc, argv, i, "-H", "--hostfile", &value, &m));
    if (m) {
        opt->hostfile = value;
        return NULL;
    }
    DSC_TRY(take_value(argc, argv, i, "-i", "--include", &value, &m));
    if (m) {
        opt->include = value;
        return NULL;
    }
    DSC_TRY(take_value(argc, argv, i, "-e", "--exclude", &value, &m));
    if (m) {
        opt->exclude = value;
        return NULL;
    }
    DSC_TRY(take_value(argc, argv, i, NULL, "--mpirun", &value, &m));
    if (m) {
        opt->mpirun = value;
        return NULL;
    }
    DSC_TRY(take_value(argc, argv, i, NULL, "--remote-agent", &value, &m));
    if (m) {
        opt->remote_agent = value;
        return NULL;
    }
    DSC_TRY(take_value(argc, argv, i, NULL, "--net", &value, &m));
    if (m) {
        opt->net = value;
        return NULL;
    }
    DSC_TRY(take_value(argc, argv, i, NULL, "--mpi-args", &value, &m));
    if (m) return add_mpi_args(opt, value);
    DSC_TRY(take_value(argc, argv, i, NULL, "--stop-timeout", &value, &m));
    if (m) {
        char *end;
        opt->stop_timeout_s = strtod(value, &end);
        DSC_CHECK(*value && !*end && opt->stop_timeout_s >= 0 && opt->stop_timeout_s <= 86400, DSC_ERR_INVALID,
                  "--stop-timeout needs seconds in [0, 86400], got \"%s\"", value);
        return NULL;
    }
    return dsc_error(DSC_ERR_INVALID, "unknown option \"%s\" (see dsc-launch --help)", arg);
}

dsc_status dsc_launch_parse_args(int argc, char **argv, dsc_launch_options *opt) {
    memset(opt, 0, sizeof *opt);
    opt->mpirun = "mpirun";
    opt->stop_timeout_s = 60.0;
    int i = 0;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        }
        dsc_status st = parse_option(argc, argv, &i, opt);
        if (st) {
            dsc_launch_options_free(opt);
            return st;
        }
    }
    opt->program = argv + i;
    opt->n_program = argc - i;
    if (opt->help || opt->version) return NULL;
    dsc_status st = NULL;
    if (opt->include && opt->exclude)
        st = dsc_error(DSC_ERR_INVALID, "--include and --exclude cannot be combined");
    else if ((opt->remote_agent || opt->net) && !opt->hostfile)
        st = dsc_error(DSC_ERR_INVALID, "%s needs --hostfile (without one the job runs on this machine)",
                       opt->remote_agent ? "--remote-agent" : "--net");
    else if (opt->n_program == 0)
        st = dsc_error(DSC_ERR_INVALID, "missing PROGRAM to run (see dsc-launch --help)");
    if (st) dsc_launch_options_free(opt);
    return st;
}

void dsc_launch_options_free(dsc_launch_options *opt) {
    for (int i = 0; i < opt->n_mpi_args; i++)
        free((char *)opt->mpi_args[i]);
    free(opt->mpi_args);
    opt->mpi_args = NULL;
    opt->n_mpi_args = 0;
}
