/*
 * scene-sleeper: the long-lived process of the blockjanitor "busy node"
 * benchmark scene (see busy-node-scene.sh).
 *
 * Usage: scene-sleeper NTHREADS READYFILE [OPENFILE]
 *
 * With OPENFILE (the node-like scene), the process also keeps that file open
 * for appending, as a container keeps its logs or data files open.
 *
 * Starts NTHREADS-1 extra pthreads (so the process has NTHREADS tasks in
 * total, counting the main thread), then writes its PID to READYFILE
 * (write to READYFILE.tmp + rename, so readers never see a partial file)
 * and sleeps forever.  The ready file tells busy-node-scene.sh that the
 * process has finished `unshare -m` (it runs after exec) and has all of its
 * threads, so the scene is exactly in place once every ready file exists.
 *
 * The threads use small stacks: 200 processes x 19 threads x the default
 * 8 MiB would be ~30 GiB of address space for nothing.
 *
 * Built by busy-node-scene.sh with: gcc -O2 -Wall -Wextra -pthread
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void *idle_thread(void *arg)
{
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s NTHREADS READYFILE [OPENFILE]\n", argv[0]);
        return 2;
    }
    long nthreads = strtol(argv[1], NULL, 10);
    if (nthreads < 1 || nthreads > 10000) {
        fprintf(stderr, "%s: bad thread count '%s'\n", argv[0], argv[1]);
        return 2;
    }

    if (argc == 4 && fopen(argv[3], "a") == NULL) {
        fprintf(stderr, "%s: opening %s: %s\n", argv[0], argv[3], strerror(errno));
        return 1;
    }

    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, 64 * 1024);
    for (long i = 1; i < nthreads; i++) {
        pthread_t t;
        int err = pthread_create(&t, &attr, idle_thread, NULL);
        if (err != 0) {
            fprintf(stderr, "%s: pthread_create: %s\n", argv[0], strerror(err));
            return 1;
        }
        pthread_detach(t);
    }
    pthread_attr_destroy(&attr);

    /* Announce readiness: PID into READYFILE, atomically. */
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", argv[2]) >= (int)sizeof tmp) {
        fprintf(stderr, "%s: ready file path too long\n", argv[0]);
        return 2;
    }
    FILE *f = fopen(tmp, "w");
    if (f == NULL || fprintf(f, "%ld\n", (long)getpid()) < 0 || fclose(f) != 0) {
        fprintf(stderr, "%s: writing %s: %s\n", argv[0], tmp, strerror(errno));
        return 1;
    }
    if (rename(tmp, argv[2]) != 0) {
        fprintf(stderr, "%s: rename %s: %s\n", argv[0], tmp, strerror(errno));
        return 1;
    }

    for (;;)
        pause();
}
