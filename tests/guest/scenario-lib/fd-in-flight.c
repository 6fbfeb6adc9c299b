/* An opener the fd scan cannot see (issue 17): opens a block device, sends the fd over a
 * socketpair to itself with SCM_RIGHTS without ever receiving it, closes its own fd and sleeps.
 * The open file lives on only in the socket's receive queue ("in flight"): no /proc/PID/fd
 * entry shows it, but the kernel still counts it (a dm device's open count).
 *
 * Usage: fd-in-flight DEVICE SECONDS. Prints "in flight <pid>" once the fd is only in flight.
 * Built on the host with `gcc -static -O2 -o fd-in-flight fd-in-flight.c` (tests/tests/guest.rs).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: %s DEVICE SECONDS\n", argv[0]);
        return 2;
    }
    int fd = open(argv[1], O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_DGRAM, 0, sv) != 0) {
        perror("socketpair");
        return 1;
    }
    char byte = 'x';
    struct iovec iov = {.iov_base = &byte, .iov_len = 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof(u));
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    if (sendmsg(sv[0], &msg, 0) != 1) {
        perror("sendmsg");
        return 1;
    }
    close(fd);
    printf("in flight %d\n", (int)getpid());
    fflush(stdout);
    sleep((unsigned)atoi(argv[2]));
    return 0;
}
