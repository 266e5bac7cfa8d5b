/* Checkpoint directories and their crash-safe publication (see ckpt_dir.h).
 * POSIX file-system calls only; nothing here knows what a checkpoint holds. */
#define _POSIX_C_SOURCE 200809L
#include "runtime/checkpoint/ckpt_dir.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void dsc_ckpt_partial_dir(const char *save_dir, const char *tag, char *buf, size_t len) {
    snprintf(buf, len, "%s/.%s.partial", save_dir, tag);
}

void dsc_ckpt_final_dir(const char *save_dir, const char *tag, char *buf, size_t len) {
    snprintf(buf, len, "%s/%s", save_dir, tag);
}

dsc_status dsc_fs_make_dirs(const char *path) {
    char tmp[1024];
    snprintf(tmp, sizeof tmp, "%s", path);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/') continue;
        *p = '\0';
        if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
            return dsc_error(DSC_ERR_IO, "cannot create directory %s: %s", tmp, strerror(errno));
        *p = '/';
    }
    if (mkdir(tmp, 0755) != 0 && errno != EEXIST)
        return dsc_error(DSC_ERR_IO, "cannot create directory %s: %s", tmp, strerror(errno));
    return NULL;
}

static void remove_tree(const char *path) {
    DIR *d = opendir(path);
    if (!d) return;
    struct dirent *e;
    char child[1300];
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(child, sizeof child, "%s/%s", path, e->d_name);
        struct stat st;
        if (lstat(child, &st) == 0 && S_ISDIR(st.st_mode))
            remove_tree(child);
        else
            unlink(child);
    }
    closedir(d);
    rmdir(path);
}

static dsc_status fsync_path(const char *path, int flags) {
    int fd = open(path, flags);
    if (fd < 0) return dsc_error(DSC_ERR_IO, "cannot open %s for fsync: %s", path, strerror(errno));
    int rc = fsync(fd);
    int err = errno;
    close(fd);
    if (rc != 0) return dsc_error(DSC_ERR_IO, "fsync of %s failed: %s", path, strerror(err));
    return NULL;
}

dsc_status dsc_ckpt_dir_begin(const char *save_dir, const char *tag) {
    DSC_CHECK(tag[0] && !strchr(tag, '/') && tag[0] != '.', DSC_ERR_INVALID,
              "checkpoint tag \"%s\" must be a plain name", tag);
    DSC_TRY(dsc_fs_make_dirs(save_dir));
    char final_dir[1024], partial[1024];
    dsc_ckpt_final_dir(save_dir, tag, final_dir, sizeof final_dir);
    struct stat st;
    DSC_CHECK(stat(final_dir, &st) != 0, DSC_ERR_IO,
              "checkpoint %s already exists; refusing to overwrite a saved checkpoint", final_dir);
    dsc_ckpt_partial_dir(save_dir, tag, partial, sizeof partial);
    remove_tree(partial); /* left over from a save that was killed */
    if (mkdir(partial, 0755) != 0)
        return dsc_error(DSC_ERR_IO, "cannot create directory %s: %s", partial, strerror(errno));
    return NULL;
}

dsc_status dsc_ckpt_dir_publish(const char *save_dir, const char *tag) {
    char partial[1024], final_dir[1024], file[1100];
    dsc_ckpt_partial_dir(save_dir, tag, partial, sizeof partial);
    dsc_ckpt_final_dir(save_dir, tag, final_dir, sizeof final_dir);
    snprintf(file, sizeof file, "%s/%s", partial, DSC_CKPT_FILE);
    DSC_TRY(fsync_path(file, O_RDONLY));
    DSC_TRY(fsync_path(partial, O_RDONLY | O_DIRECTORY));
    if (rename(partial, final_dir) != 0)
        return dsc_error(DSC_ERR_IO, "cannot rename %s to %s: %s", partial, final_dir, strerror(errno));
    DSC_TRY(fsync_path(save_dir, O_RDONLY | O_DIRECTORY));
    return dsc_ckpt_write_latest(save_dir, tag);
}

dsc_status dsc_ckpt_write_latest(const char *save_dir, const char *tag) {
    char latest[1100], latest_tmp[1100];
    snprintf(latest, sizeof latest, "%s/latest", save_dir);
    snprintf(latest_tmp, sizeof latest_tmp, "%s/latest.tmp", save_dir);
    FILE *out = fopen(latest_tmp, "w");
    if (!out) return dsc_error(DSC_ERR_IO, "cannot write %s: %s", latest_tmp, strerror(errno));
    int ok = fprintf(out, "%s\n", tag) > 0;
    ok = fflush(out) == 0 && ok;
    ok = fsync(fileno(out)) == 0 && ok;
    ok = fclose(out) == 0 && ok;
    if (!ok) return dsc_error(DSC_ERR_IO, "writing %s failed: %s", latest_tmp, strerror(errno));
    if (rename(latest_tmp, latest) != 0)
        return dsc_error(DSC_ERR_IO, "cannot rename %s to %s: %s", latest_tmp, latest, strerror(errno));
    return fsync_path(save_dir, O_RDONLY | O_DIRECTORY);
}

void dsc_ckpt_dir_abandon(const char *save_dir, const char *tag) {
    char partial[1024];
    dsc_ckpt_partial_dir(save_dir, tag, partial, sizeof partial);
    remove_tree(partial);
}

dsc_status dsc_ckpt_read_latest(const char *save_dir, char *tag, size_t len) {
    char latest[1100];
    snprintf(latest, sizeof latest, "%s/latest", save_dir);
    FILE *in = fopen(latest, "r");
    if (!in) return dsc_error(DSC_ERR_IO, "no checkpoint to resume: cannot read %s: %s", latest, strerror(errno));
    char line[256] = "";
    char *got = fgets(line, sizeof line, in);
    fclose(in);
    line[strcspn(line, "\r\n")] = '\0';
    DSC_CHECK(got && line[0], DSC_ERR_CORRUPT, "%s is empty", latest);
    snprintf(tag, len, "%s", line);
    return NULL;
}

long long dsc_ckpt_tag_step(const char *tag) {
    const char *last = NULL;
    for (const char *p = tag; *p; p++)
        if (*p >= '0' && *p <= '9' && (p == tag || p[-1] < '0' || p[-1] > '9')) last = p;
    return last ? atoll(last) : -1;
}

dsc_status dsc_ckpt_set_aside(const char *save_dir, const char *tag, char *name, size_t len) {
    char from[1024], to[1100];
    dsc_ckpt_final_dir(save_dir, tag, from, sizeof from);
    struct stat st;
    for (int n = 1; n < 1000; n++) {
        if (n == 1)
            snprintf(name, len, "%s.damaged", tag);
        else
            snprintf(name, len, "%s.damaged.%d", tag, n);
        snprintf(to, sizeof to, "%s/%s", save_dir, name);
        if (stat(to, &st) == 0) continue;
        if (rename(from, to) != 0)
            return dsc_error(DSC_ERR_IO, "cannot set aside %s as %s: %s", from, to, strerror(errno));
        return fsync_path(save_dir, O_RDONLY | O_DIRECTORY);
    }
    return dsc_error(DSC_ERR_IO, "cannot set aside %s: %s.damaged .. .damaged.999 all exist", from, tag);
}

static int compare_tags(const void *a, const void *b) {
    long long sa = dsc_ckpt_tag_step(a), sb = dsc_ckpt_tag_step(b);
    if (sa != sb) return sa < sb ? -1 : 1;
    return strcmp(a, b);
}

dsc_status dsc_ckpt_list_tags(const char *save_dir, char (**tags)[128], int *count) {
    *tags = NULL;
    *count = 0;
    DIR *d = opendir(save_dir);
    if (!d) return dsc_error(DSC_ERR_IO, "cannot list %s: %s", save_dir, strerror(errno));
    struct dirent *e;
    int cap = 0;
    dsc_status s = NULL;
    while (!s && (e = readdir(d))) {
        if (e->d_name[0] == '.' || strlen(e->d_name) >= 128 || strstr(e->d_name, ".damaged")) continue;
        char file[1400];
        struct stat st;
        snprintf(file, sizeof file, "%s/%s/%s", save_dir, e->d_name, DSC_CKPT_FILE);
        if (stat(file, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        if (*count == cap) {
            cap = cap ? 2 * cap : 16;
            char(*grown)[128] = realloc(*tags, (size_t)cap * sizeof **tags);
            if (!grown) {
                s = dsc_error(DSC_ERR_NOMEM, "listing %s", save_dir);
                break;
            }
            *tags = grown;
        }
        memcpy((*tags)[(*count)++], e->d_name, strlen(e->d_name) + 1); /* shorter than 128: checked above */
    }
    closedir(d);
    if (*count) qsort(*tags, (size_t)*count, sizeof **tags, compare_tags);
    return s;
}

/* What a killed prune leaves: .<tag>.pruning directories (finished now) and,
 * from before pruning renamed first, empty tag directories (rmdir removes
 * only empty ones, so nothing saved can go). */
static void finish_pruning(const char *save_dir) {
    DIR *d = opendir(save_dir);
    if (!d) return;
    struct dirent *e;
    char path[1300];
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        snprintf(path, sizeof path, "%s/%s", save_dir, e->d_name);
        struct stat st;
        if (lstat(path, &st) != 0 || !S_ISDIR(st.st_mode)) continue;
        if (e->d_name[0] == '.' && n > 8 && strcmp(e->d_name + n - 8, ".pruning") == 0)
            remove_tree(path);
        else if (e->d_name[0] != '.')
            rmdir(path); /* fails, harmlessly, unless empty */
    }
    closedir(d);
}

dsc_status dsc_ckpt_prune(const char *save_dir, int keep_last) {
    if (keep_last <= 0) return NULL;
    char(*tags)[128];
    int n;
    DSC_TRY(dsc_ckpt_list_tags(save_dir, &tags, &n));
    char latest[128] = "";
    dsc_status s = dsc_ckpt_read_latest(save_dir, latest, sizeof latest);
    dsc_status_free(s);
    s = NULL;
    for (int i = 0; i < n - keep_last && !s; i++) {
        if (strcmp(tags[i], latest) == 0) continue;
        char dir[1024], doomed[1100];
        dsc_ckpt_final_dir(save_dir, tags[i], dir, sizeof dir);
        snprintf(doomed, sizeof doomed, "%s/.%s.pruning", save_dir, tags[i]);
        if (rename(dir, doomed) != 0)
            s = dsc_error(DSC_ERR_IO, "pruning: cannot rename %s to %s: %s", dir, doomed, strerror(errno));
    }
    free(tags);
    if (!s) s = fsync_path(save_dir, O_RDONLY | O_DIRECTORY);
    finish_pruning(save_dir);
    return s;
}
