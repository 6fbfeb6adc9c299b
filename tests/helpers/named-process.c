/* A process that names itself (issue 34): a task name is whatever a process sets, so tests use
 * this to stand in for a process that only bears a daemon's name, or one whose name mimics a
 * kernel subsystem's prefix.
 *
 * Usage: named-process COMM [--listen ABSTRACT_NAME] [--segv]
 *   sets its task name (comm) to COMM with prctl(PR_SET_NAME);
 *   --listen: binds and listens on the abstract unix stream socket ABSTRACT_NAME;
 *   --segv: then writes through a null pointer (the kernel logs "COMM[PID]: segfault at 0 ...
 *           in EXE[...]" at facility 0, EXE being this file's name);
 *   otherwise prints "ready PID" and waits until killed.
 * Built by the tests with `gcc -O0 -Wall -Werror -o NAME named-process.c`.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: %s COMM [--listen ABSTRACT_NAME] [--segv]\n", argv[0]);
        return 2;
    }
    if (prctl(PR_SET_NAME, argv[1], 0, 0, 0) != 0) {
        perror("prctl");
        return 1;
    }
    int segv = 0;
    for (int i = 2; i < argc; i++) {
        if (strcmp(argv[i], "--segv") == 0) {
            segv = 1;
        } else if (strcmp(argv[i], "--listen") == 0 && i + 1 < argc) {
            const char *name = argv[++i];
            int s = socket(AF_UNIX, SOCK_STREAM, 0);
            struct sockaddr_un a;
            memset(&a, 0, sizeof(a));
            a.sun_family = AF_UNIX;
            size_t n = strlen(name);
            if (s < 0 || n + 1 > sizeof(a.sun_path)) {
                perror("socket");
                return 1;
            }
            memcpy(a.sun_path + 1, name, n); /* sun_path[0] = 0: abstract */
            if (bind(s, (struct sockaddr *)&a, (socklen_t)(sizeof(sa_family_t) + 1 + n)) != 0 || listen(s, 4) != 0) {
                perror("bind/listen");
                return 1;
            }
        } else {
            fprintf(stderr, "unknown argument %s\n", argv[i]);
            return 2;
        }
    }
    printf("ready %d\n", (int)getpid());
    fflush(stdout);
    if (segv) {
        *(volatile int *)0 = 1;
    }
    for (;;) {
        pause();
    }
}
