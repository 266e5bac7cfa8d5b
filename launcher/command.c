/* From options and hosts to the mpirun command: rank count, slots per host,
 * oversubscription, running as root, one thread per rank, the DSC_*
 * environment, the remote agent and the network (Open MPI's MCA options),
 * extra mpirun options, then the program. Builds argv only;
 * running it is supervise.c's job. */
#define _POSIX_C_SOURCE 200809L /* strdup */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "launcher/launcher.h"

/* Variables every rank gets even when not exported by the user: one thread
 * per rank unless asked otherwise (main sets them when unset). */
static const char *const thread_vars[] = {"OMP_NUM_THREADS", "DSC_NUM_THREADS"};

dsc_status dsc_launch_select_hosts(const dsc_launch_options *opt, const dsc_launch_env *env,
                                   dsc_launch_hosts *hosts) {
    if (opt->hostfile)
        DSC_TRY(dsc_launch_hostfile_load(opt->hostfile, hosts));
    else
        DSC_TRY(dsc_launch_hosts_local(env->cores, hosts));
    dsc_status st = NULL;
    if (opt->include) st = dsc_launch_hosts_filter(hosts, opt->include, true);
    if (!st && opt->exclude) st = dsc_launch_hosts_filter(hosts, opt->exclude, false);
    if (!st && dsc_launch_hosts_total(hosts) == 0)
        st = dsc_error(DSC_ERR_INVALID, "%s leaves no slots to run on", opt->include ? "--include" : "--exclude");
    if (st) dsc_launch_hosts_free(hosts);
    return st;
}

static dsc_status push(dsc_launch_command *cmd, const char *arg) {
    char **grown = realloc(cmd->argv, (size_t)(cmd->argc + 2) * sizeof *grown);
    DSC_CHECK(grown, DSC_ERR_NOMEM, "building the mpirun command");
    cmd->argv = grown;
    cmd->argv[cmd->argc] = strdup(arg);
    DSC_CHECK(cmd->argv[cmd->argc], DSC_ERR_NOMEM, "building the mpirun command");
    cmd->argv[++cmd->argc] = NULL;
    return NULL;
}

static dsc_status push_mca(dsc_launch_command *cmd, const char *name, const char *value) {
    DSC_TRY(push(cmd, "--mca"));
    DSC_TRY(push(cmd, name));
    return push(cmd, value);
}

static int compare_strings(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* "-x NAME" for the thread variables and every DSC_* variable, sorted so the
 * command does not depend on the environment's order. */
static dsc_status push_environment(dsc_launch_command *cmd, char *const *environ) {
    size_t n = 0;
    for (char *const *e = environ; e && *e; e++)
        n++;
    char **names = calloc(n + 2, sizeof *names);
    DSC_CHECK(names, DSC_ERR_NOMEM, "building the mpirun command");
    size_t count = 0;
    for (size_t i = 0; i < 2; i++)
        names[count++] = strdup(thread_vars[i]);
    for (char *const *e = environ; e && *e; e++) {
        size_t len = strcspn(*e, "=");
        if (strncmp(*e, "DSC_", 4) != 0 ||
            (len == strlen(thread_vars[1]) && strncmp(*e, thread_vars[1], len) == 0))
            continue;
        names[count] = malloc(len + 1);
        if (names[count]) snprintf(names[count], len + 1, "%s", *e);
        count++;
    }
    dsc_status st = NULL;
    for (size_t i = 0; i < count && !st; i++)
        if (!names[i]) st = dsc_error(DSC_ERR_NOMEM, "building the mpirun command");
    if (!st) qsort(names, count, sizeof *names, compare_strings);
    for (size_t i = 0; i < count && !st; i++) {
        st = push(cmd, "-x");
        if (!st) st = push(cmd, names[i]);
    }
    for (size_t i = 0; i < count; i++)
        free(names[i]);
    free(names);
    return st;
}

/* "--host h1:2,h2:4": the enabled slot count of each host, in hostfile order. */
static dsc_status push_hosts(dsc_launch_command *cmd, const dsc_launch_hosts *hosts) {
    char *list = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&list, &len);
    DSC_CHECK(out, DSC_ERR_NOMEM, "building the mpirun command");
    const char *sep = "";
    for (int i = 0; i < hosts->count; i++) {
        int slots = dsc_launch_host_slots(hosts, i);
        if (slots == 0) continue;
        fprintf(out, "%s%s:%d", sep, hosts->host[i].name, slots);
        sep = ",";
    }
    fclose(out);
    dsc_status st = push(cmd, "--host");
    if (!st) st = push(cmd, list);
    free(list);
    return st;
}

static dsc_status build(const dsc_launch_options *opt, const dsc_launch_hosts *hosts, const dsc_launch_env *env,
                        dsc_launch_command *cmd) {
    int slots = dsc_launch_hosts_total(hosts);
    int np = opt->np ? opt->np : slots;
    /* Without a hostfile the slots are this machine's cores; a test or a small
     * job may still want more ranks than cores, so allow it there. */
    DSC_CHECK(np <= slots || !opt->hostfile || opt->oversubscribe, DSC_ERR_INVALID,
              "-n %d exceeds the %d slot%s of hostfile %s%s; pass --oversubscribe to run more ranks than slots",
              np, slots, slots == 1 ? "" : "s", opt->hostfile,
              opt->include || opt->exclude ? " (after --include/--exclude)" : "");
    char np_text[16];
    snprintf(np_text, sizeof np_text, "%d", np);
    DSC_TRY(push(cmd, opt->mpirun));
    DSC_TRY(push(cmd, "-np"));
    DSC_TRY(push(cmd, np_text));
    if (env->root) DSC_TRY(push(cmd, "--allow-run-as-root"));
    if (np > slots || opt->oversubscribe) DSC_TRY(push(cmd, "--oversubscribe"));
    if (opt->hostfile) DSC_TRY(push_hosts(cmd, hosts));
    DSC_TRY(push_environment(cmd, env->environ));
    if (opt->remote_agent) DSC_TRY(push_mca(cmd, "plm_rsh_agent", opt->remote_agent));
    if (opt->net) {
        /* Ranks of one host talk through shared memory, hosts through TCP on
         * the given network; mpirun's own daemons use the same network. */
        DSC_TRY(push_mca(cmd, "btl", "self,vader,tcp"));
        DSC_TRY(push_mca(cmd, "btl_tcp_if_include", opt->net));
        DSC_TRY(push_mca(cmd, "oob_tcp_if_include", opt->net));
    }
    for (int i = 0; i < opt->n_mpi_args; i++)
        DSC_TRY(push(cmd, opt->mpi_args[i]));
    for (int i = 0; i < opt->n_program; i++)
        DSC_TRY(push(cmd, opt->program[i]));
    return NULL;
}

dsc_status dsc_launch_build_command(const dsc_launch_options *opt, const dsc_launch_hosts *hosts,
                                    const dsc_launch_env *env, dsc_launch_command *cmd) {
    cmd->argv = NULL;
    cmd->argc = 0;
    dsc_status st = build(opt, hosts, env, cmd);
    if (st) dsc_launch_command_free(cmd);
    return st;
}

/* Arguments made only of these characters are printed unquoted. */
static bool shell_safe(const char *s) {
    if (!*s) return false;
    return strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./,:=@%+^") == strlen(s);
}

char *dsc_launch_command_string(const dsc_launch_command *cmd) {
    char *line = NULL;
    size_t len = 0;
    FILE *out = open_memstream(&line, &len);
    if (!out) return NULL;
    for (int i = 0; i < cmd->argc; i++) {
        const char *a = cmd->argv[i];
        if (i) fputc(' ', out);
        if (shell_safe(a)) {
            fputs(a, out);
            continue;
        }
        fputc('\'', out);
        for (; *a; a++) {
            if (*a == '\'')
                fputs("'\\''", out);
            else
                fputc(*a, out);
        }
        fputc('\'', out);
    }
    fclose(out);
    return line;
}

void dsc_launch_command_free(dsc_launch_command *cmd) {
    for (int i = 0; i < cmd->argc; i++)
        free(cmd->argv[i]);
    free(cmd->argv);
    cmd->argv = NULL;
    cmd->argc = 0;
}
