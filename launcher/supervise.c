/* Running the mpirun command under supervision. The job's output passes
 * through unchanged while each line is read for failures (failure.c). Once a
 * rank is known to have failed, mpirun gets `grace_s` to end the job itself;
 * after that every process of the job gets SIGTERM, then SIGKILL. When
 * mpirun has exited, whatever it left behind is killed too, so no process of
 * the job survives the launcher.
 *
 * SIGTERM or SIGINT to the launcher first asks the ranks to stop: mpirun
 * gets SIGUSR2, which it passes to every rank (Open MPI forwards SIGUSR1/2
 * by default, ess_base_forward_signals), so a program that drains on it
 * (dsc-serve) finishes its work and exits 0, and so does the launcher. A
 * program without a handler dies of it and the job ends as interrupted. A
 * second signal, or a job still running `stop_s` later, is passed to
 * mpirun itself, which ends the job (it kills the ranks 1 s after passing
 * the signal on, odls_base_sigkill_timeout). SIGHUP goes to mpirun at once.
 *
 * "The job" is every descendant of the launcher, found through /proc, because
 * Open MPI puts each rank in a process group of its own (a group kill would
 * miss them); the launcher is a child subreaper, so ranks orphaned by a dead
 * mpirun stay its descendants. mpirun keeps the launcher's process group, so
 * terminal job control and stdin forwarding work as with plain mpirun.
 * Linux-only. Does not build the command or decide what the text means. */
#define _POSIX_C_SOURCE 200809L /* sigaction, kill, clock_gettime */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launcher/launcher.h"

static volatile sig_atomic_t interrupted, n_signals;

static void on_signal(int sig) {
    if (!interrupted) interrupted = sig;
    n_signals += sig == SIGHUP ? 2 : 1; /* SIGHUP: no drain */
}

/* How far a signal to the launcher has gone. */
typedef enum stop_stage {
    STOP_NONE = 0,
    STOP_ASKED, /* SIGUSR2 to the ranks: they may drain and exit 0 */
    STOP_FORCED /* the signal to mpirun: the job ends */
} stop_stage;

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* ---- the job's processes ------------------------------------------------------ */

typedef struct proc_entry {
    pid_t pid, ppid;
    char state;
} proc_entry;

/* Every process visible in /proc with its parent; *n entries, free() the result. */
static proc_entry *list_processes(size_t *n) {
    *n = 0;
    DIR *dir = opendir("/proc");
    if (!dir) return NULL;
    size_t cap = 256;
    proc_entry *list = malloc(cap * sizeof *list);
    struct dirent *d;
    while (list && (d = readdir(dir))) {
        char path[288], stat[512];
        if (d->d_name[0] < '0' || d->d_name[0] > '9') continue;
        snprintf(path, sizeof path, "/proc/%s/stat", d->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue; /* exited meanwhile */
        size_t len = fread(stat, 1, sizeof stat - 1, f);
        fclose(f);
        stat[len] = '\0';
        /* "pid (comm) S ppid ...": comm may hold spaces and parentheses. */
        char *close = strrchr(stat, ')');
        int pid, ppid;
        char state;
        if (!close || sscanf(stat, "%d", &pid) != 1 || sscanf(close + 1, " %c %d", &state, &ppid) != 2) continue;
        if (*n == cap) {
            proc_entry *grown = realloc(list, 2 * cap * sizeof *list);
            if (!grown) break;
            list = grown;
            cap *= 2;
        }
        list[(*n)++] = (proc_entry){pid, ppid, state};
    }
    closedir(dir);
    return list;
}

/* Sends `sig` to every live descendant of this process; returns how many
 * there were. Zombies are left to reap_children. */
static int signal_descendants(int sig) {
    size_t n;
    proc_entry *all = list_processes(&n);
    if (!all) return 0;
    pid_t *tree = malloc((n + 1) * sizeof *tree);
    int found = 0;
    if (tree) {
        size_t head = 0, tail = 0;
        tree[tail++] = getpid();
        while (head < tail) {
            pid_t parent = tree[head++];
            for (size_t i = 0; i < n; i++) {
                if (all[i].ppid != parent) continue;
                tree[tail++] = all[i].pid;
                if (all[i].state == 'Z') continue;
                kill(all[i].pid, sig);
                found++;
            }
        }
    }
    free(tree);
    free(all);
    return found;
}

static void reap_children(void) {
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

/* Kills whatever is left of the job and waits until it is gone. */
static void kill_job(void) {
    for (int round = 0; round < 100; round++) {
        reap_children();
        if (signal_descendants(SIGKILL) == 0) return;
        struct timespec pause = {0, 20 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    fprintf(stderr, "dsc-launch: some job processes did not die after SIGKILL\n");
}

/* ---- output --------------------------------------------------------------------- */

typedef struct stream {
    int fd;     /* read end of the pipe; -1 at EOF */
    int out_fd; /* where the text goes: 1 or 2 */
    char line[8192];
    size_t used;
} stream;

static void write_all(int fd, const char *buf, size_t n) {
    while (n > 0) {
        ssize_t w = write(fd, buf, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) return; /* our own output is gone; keep supervising anyway */
        buf += w;
        n -= (size_t)w;
    }
}

/* Passes bytes through and scans every complete line; true when a line
 * reported a failure. */
static bool consume(stream *s, const char *buf, size_t n, dsc_launch_failure *failure) {
    bool failed = false;
    write_all(s->out_fd, buf, n);
    for (size_t i = 0; i < n; i++) {
        if (buf[i] != '\n' && s->used < sizeof s->line - 1) {
            s->line[s->used++] = buf[i];
            continue;
        }
        s->line[s->used] = '\0';
        failed |= dsc_launch_failure_scan(failure, s->line);
        s->used = 0;
        if (buf[i] != '\n') s->line[s->used++] = buf[i];
    }
    return failed;
}

/* Reads what is available (waiting up to timeout_ms); true when a line
 * reported a failure. */
static bool pump(stream *streams, int timeout_ms, dsc_launch_failure *failure) {
    struct pollfd fds[2];
    int n = 0;
    for (int i = 0; i < 2; i++)
        if (streams[i].fd >= 0) fds[n++] = (struct pollfd){streams[i].fd, POLLIN, 0};
    if (n == 0) {
        struct timespec pause = {0, (long)timeout_ms * 1000 * 1000};
        nanosleep(&pause, NULL);
        return false;
    }
    if (poll(fds, (nfds_t)n, timeout_ms) <= 0) return false;
    bool failed = false;
    for (int i = 0; i < 2; i++) {
        if (streams[i].fd < 0) continue;
        char buf[65536];
        ssize_t got = read(streams[i].fd, buf, sizeof buf);
        if (got > 0) {
            failed |= consume(&streams[i], buf, (size_t)got, failure);
        } else if (got == 0 || (errno != EAGAIN && errno != EINTR)) {
            close(streams[i].fd);
            streams[i].fd = -1;
        }
    }
    return failed;
}

static void flush_partial_lines(stream *streams, dsc_launch_failure *failure) {
    for (int i = 0; i < 2; i++) {
        if (streams[i].used == 0) continue;
        streams[i].line[streams[i].used] = '\0';
        dsc_launch_failure_scan(failure, streams[i].line);
        streams[i].used = 0;
    }
}

/* ---- the run -------------------------------------------------------------------- */

static pid_t start(const dsc_launch_command *cmd, stream *streams) {
    int out[2], err[2];
    if (pipe(out) != 0) return -1;
    if (pipe(err) != 0) {
        close(out[0]);
        close(out[1]);
        return -1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        signal(SIGPIPE, SIG_DFL);
        dup2(out[1], 1);
        dup2(err[1], 2);
        close(out[0]);
        close(out[1]);
        close(err[0]);
        close(err[1]);
        execvp(cmd->argv[0], cmd->argv);
        fprintf(stderr, "dsc-launch: cannot run %s: %s\n", cmd->argv[0], strerror(errno));
        _exit(127);
    }
    close(out[1]);
    close(err[1]);
    if (pid < 0) {
        close(out[0]);
        close(err[0]);
        return -1;
    }
    streams[0] = (stream){.fd = out[0], .out_fd = 1};
    streams[1] = (stream){.fd = err[0], .out_fd = 2};
    for (int i = 0; i < 2; i++)
        fcntl(streams[i].fd, F_SETFL, fcntl(streams[i].fd, F_GETFL) | O_NONBLOCK);
    return pid;
}

static void install_handlers(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal; /* no SA_RESTART: poll returns at once */
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    /* A closed stdout (| head) must not kill the launcher and orphan the job. */
    signal(SIGPIPE, SIG_IGN);
}

/* The launcher's exit status and the verdict line. */
static int verdict(int status, const dsc_launch_failure *failure, bool watchdog, double grace_s, stop_stage stop) {
    char what[1024];
    dsc_launch_failure_describe(failure, what, sizeof what);
    int mpirun_failed = !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    if (!mpirun_failed && !what[0] && !interrupted) return 0;
    if (!mpirun_failed && !what[0] && stop == STOP_ASKED) {
        fprintf(stderr, "dsc-launch: every rank stopped and exited 0 after signal %d\n", (int)interrupted);
        return 0;
    }
    if (!what[0] && WIFSIGNALED(status))
        snprintf(what, sizeof what, "mpirun killed by signal %d", WTERMSIG(status));
    else if (!what[0] && WIFEXITED(status) && WEXITSTATUS(status) != 0)
        snprintf(what, sizeof what, "mpirun exited with status %d", WEXITSTATUS(status));
    else if (!what[0])
        snprintf(what, sizeof what, "interrupted by signal %d", (int)interrupted);
    if (interrupted && !strstr(what, "interrupted"))
        fprintf(stderr, "dsc-launch: job failed: %s (interrupted by signal %d)\n", what, (int)interrupted);
    else
        fprintf(stderr, "dsc-launch: job failed: %s\n", what);
    if (watchdog)
        fprintf(stderr,
                "dsc-launch: mpirun did not end the job within %.0f s of the failure; the launcher killed it\n",
                grace_s);
    if (interrupted) return 128 + interrupted;
    if (WIFEXITED(status) && WEXITSTATUS(status) != 0) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

int dsc_launch_run(const dsc_launch_command *cmd, dsc_launch_timing timing, bool name_hosts) {
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    install_handlers();
    stream streams[2];
    pid_t pid = start(cmd, streams);
    if (pid < 0) {
        fprintf(stderr, "dsc-launch: cannot start %s: %s\n", cmd->argv[0], strerror(errno));
        return 1;
    }
    dsc_launch_failure failure;
    dsc_launch_failure_init(&failure);
    failure.name_hosts = name_hosts;
    double deadline = 0, kill_at = 0, stop_at = 0;
    bool watchdog = false;
    stop_stage stop = STOP_NONE;
    int status = 0;
    for (;;) {
        if (pump(streams, 100, &failure) && deadline == 0) deadline = now_s() + timing.grace_s;
        if (interrupted && stop == STOP_NONE && n_signals == 1) {
            fprintf(stderr,
                    "dsc-launch: signal %d: asking every rank to stop (SIGUSR2 through mpirun); the job ends in "
                    "%.0f s or at a second signal\n",
                    (int)interrupted, timing.stop_s);
            kill(pid, SIGUSR2); /* mpirun passes it to every rank */
            stop = STOP_ASKED;
            stop_at = now_s() + timing.stop_s;
        }
        if (interrupted && stop != STOP_FORCED && (n_signals > 1 || (stop == STOP_ASKED && now_s() > stop_at))) {
            kill(pid, (int)interrupted); /* mpirun ends the job on SIGINT / SIGTERM / SIGHUP */
            stop = STOP_FORCED;
            if (deadline == 0) deadline = now_s() + timing.grace_s;
        }
        pid_t done = waitpid(pid, &status, WNOHANG);
        if (done == pid) break;
        double t = now_s();
        if (deadline > 0 && t > deadline && kill_at == 0) {
            watchdog = !interrupted;
            signal_descendants(SIGTERM);
            kill_at = t + timing.kill_s;
        }
        if (kill_at > 0 && t > kill_at) signal_descendants(SIGKILL);
    }
    /* Take what mpirun wrote last, clear out stragglers (which may hold the
     * pipes open), then read to the end. */
    pump(streams, 0, &failure);
    kill_job();
    for (double end = now_s() + 1.0; (streams[0].fd >= 0 || streams[1].fd >= 0) && now_s() < end;)
        pump(streams, 50, &failure);
    for (int i = 0; i < 2; i++)
        if (streams[i].fd >= 0) close(streams[i].fd);
    flush_partial_lines(streams, &failure);
    return verdict(status, &failure, watchdog, timing.grace_s, stop);
}
