/* Private to launcher/: the parts of dsc-launch that tests can drive without
 * running a job. The launcher turns its command line and a DeepSpeed-style
 * hostfile into one `mpirun` command, runs it under supervision, and turns
 * what mpirun and the ranks print into one verdict naming the failed rank.
 * It never talks MPI itself; ranks read their rank and size from MPI, so a
 * program runs the same under plain `mpirun -np N`. */
#ifndef DSC_LAUNCHER_H
#define DSC_LAUNCHER_H

#include <stdbool.h>
#include <stddef.h>

#include "dsc/status.h"

/* ---- hosts and slots (hostfile.c) ------------------------------------------ */

typedef struct dsc_launch_host {
    char *name;
    int slots;
    bool *enabled; /* (slots) after --include / --exclude */
} dsc_launch_host;

typedef struct dsc_launch_hosts {
    dsc_launch_host *host;
    int count;
} dsc_launch_hosts;

/* Parses DeepSpeed's hostfile format: "HOSTNAME slots=N" per line, '#'
 * comments, blank lines. `source` names the file in messages, which give the
 * line number ("hosts:3: ..."). */
dsc_status dsc_launch_hostfile_parse(const char *text, const char *source, dsc_launch_hosts *hosts);
dsc_status dsc_launch_hostfile_load(const char *path, dsc_launch_hosts *hosts);

/* One host with `slots` slots (the implicit host list without a hostfile). */
dsc_status dsc_launch_hosts_local(int slots, dsc_launch_hosts *hosts);

/* Applies DeepSpeed's --include / --exclude syntax, "host1:0,1@host2": hosts
 * separated by '@', each optionally with a list of slot indices. Include keeps
 * only what is listed; exclude removes it. Unknown hosts and slots are errors. */
dsc_status dsc_launch_hosts_filter(dsc_launch_hosts *hosts, const char *spec, bool include);

/* Enabled slots on host i, and in total. */
int dsc_launch_host_slots(const dsc_launch_hosts *hosts, int i);
int dsc_launch_hosts_total(const dsc_launch_hosts *hosts);

void dsc_launch_hosts_free(dsc_launch_hosts *hosts);

/* ---- the command line (args.c) --------------------------------------------- */

typedef struct dsc_launch_options {
    int np;               /* 0: every enabled slot of the hostfile */
    const char *hostfile; /* NULL: this machine only */
    const char *include;
    const char *exclude;
    bool oversubscribe; /* allow more ranks than slots with a hostfile */
    bool dry_run;
    const char *mpirun;       /* "mpirun" unless --mpirun PATH */
    const char *remote_agent; /* --remote-agent: how mpirun reaches a host (ssh when NULL) */
    const char *net;          /* --net CIDR: MPI and mpirun's own traffic only over this network */
    bool no_host_check;       /* --no-host-check: skip asking every host before the start */
    const char **mpi_args;    /* (n_mpi_args) extra mpirun options, split on blanks */
    int n_mpi_args;
    char **program; /* (n_program) PROGRAM ARGS... */
    int n_program;
    bool help;             /* --help / -h: print the usage */
    bool version;          /* --version */
    double stop_timeout_s; /* --stop-timeout: a stopping job's time to exit after SIGTERM (60) */
} dsc_launch_options;

/* Parses dsc-launch's arguments (argv[0] excluded). Options end at the first
 * argument that is not one, or at "--"; the rest is the program. */
dsc_status dsc_launch_parse_args(int argc, char **argv, dsc_launch_options *opt);
void dsc_launch_options_free(dsc_launch_options *opt);
extern const char dsc_launch_usage[];

/* ---- the mpirun command (command.c) ---------------------------------------- */

typedef struct dsc_launch_env {
    int cores;            /* cores of this machine, for local oversubscription */
    bool root;            /* running as root: mpirun needs --allow-run-as-root */
    char *const *environ; /* the environment whose DSC_* variables are forwarded */
} dsc_launch_env;

typedef struct dsc_launch_command {
    char **argv; /* (argc + 1), NULL-terminated */
    int argc;
} dsc_launch_command;

/* The hosts the options select (hostfile or this machine, then filters). */
dsc_status dsc_launch_select_hosts(const dsc_launch_options *opt, const dsc_launch_env *env,
                                   dsc_launch_hosts *hosts);

/* Builds the mpirun command for the options on the selected hosts. */
dsc_status dsc_launch_build_command(const dsc_launch_options *opt, const dsc_launch_hosts *hosts,
                                    const dsc_launch_env *env, dsc_launch_command *cmd);

/* The command as one shell-quoted line (what --dry-run prints); free() it. */
char *dsc_launch_command_string(const dsc_launch_command *cmd);
void dsc_launch_command_free(dsc_launch_command *cmd);

/* ---- asking every host before the start (hostcheck.c) ------------------------ */

/* True when `name` is this machine (localhost, 127.x, or its host name):
 * mpirun starts its ranks without the remote agent. */
bool dsc_launch_host_is_local(const char *name);

/* Runs `AGENT HOST true` (AGENT: --remote-agent, split on blanks, or ssh) for
 * every selected host that is not this machine, all at once, and waits at
 * most timeout_s. An error names every host that failed, with the agent's
 * last line of output or "no answer within N s". */
dsc_status dsc_launch_check_hosts(const dsc_launch_options *opt, const dsc_launch_hosts *hosts, double timeout_s);

/* ---- reading the job's output for failures (failure.c) ---------------------- */

enum { DSC_LAUNCH_MAX_NOTES = 8 };

typedef enum dsc_launch_failure_kind {
    DSC_LAUNCH_FAILURE_KIND_NONE = 0,
    DSC_LAUNCH_FAILURE_KIND_EXIT,     /* non-zero exit status */
    DSC_LAUNCH_FAILURE_KIND_SIGNAL,   /* killed by a signal */
    DSC_LAUNCH_FAILURE_KIND_ABORT,    /* MPI_Abort */
    DSC_LAUNCH_FAILURE_KIND_IMPROPER, /* exited without MPI_Finalize */
    DSC_LAUNCH_FAILURE_KIND_HOST_LOST /* mpirun lost contact with a host's daemon */
} dsc_launch_failure_kind;

/* What the output said about failed ranks: mpirun's report of the first
 * failed process, and the ranks' own notes ("dsc: rank 3 failed: why"). */
typedef struct dsc_launch_failure {
    dsc_launch_failure_kind kind;
    int rank; /* of mpirun's report; -1 when none */
    int code; /* exit status, signal number or MPI_Abort error code */
    char signal_name[32];
    char host[64];   /* where the failure happened, when mpirun's report names it */
    bool name_hosts; /* the verdict names the host (a multi-host job); false after init */
    int n_notes;
    struct {
        int rank;
        char reason[480];
    } note[DSC_LAUNCH_MAX_NOTES];
    int expect; /* which continuation line mpirun's report needs next */
} dsc_launch_failure;

void dsc_launch_failure_init(dsc_launch_failure *f);

/* Feeds one line of output (without its newline). Returns true when the line
 * says a rank failed, which starts the launcher's watchdog. */
bool dsc_launch_failure_scan(dsc_launch_failure *f, const char *line);

/* The verdict after the job: "rank 2 exited with status 3: <note>". Empty
 * when the output named no failure. */
void dsc_launch_failure_describe(const dsc_launch_failure *f, char *out, size_t len);

/* ---- running (supervise.c) -------------------------------------------------- */

typedef struct dsc_launch_timing {
    double grace_s; /* after a failure is seen, how long mpirun may take to exit */
    double kill_s;  /* after SIGTERM to every job process, how long until SIGKILL */
    double stop_s;  /* after SIGTERM / SIGINT passed to the ranks as SIGUSR2, how long until mpirun gets it */
} dsc_launch_timing;

/* Runs the command with its output passed through, watching for failures;
 * makes sure no process of the job survives. SIGTERM / SIGINT become
 * SIGUSR2 to every rank, then (a second signal, or stop_s later) the signal
 * to mpirun. Returns the launcher's exit status (0 only when mpirun
 * succeeded and no rank reported a failure, also after a SIGTERM the ranks
 * drained on) and
 * prints the verdict line on failure, naming the failed rank's host when
 * `name_hosts` (the job runs on a hostfile's hosts). */
int dsc_launch_run(const dsc_launch_command *cmd, dsc_launch_timing timing, bool name_hosts);

#endif
