/* hangfs: a FUSE filesystem of one file, `disk.img`, of zeros, for the real-kernel test of hung
 * devices (tests/tests/hung_device.rs). Every read goes to this server (direct_io, no page
 * cache), so a loop device backed by disk.img blocks in the kernel as soon as the server stops
 * answering (SIGSTOP), exactly as one backed by a file on a dead NFS or FUSE server does.
 *
 *   hangfs MOUNTPOINT SIZE_MIB      (foreground, single-threaded; stop with SIGTERM)
 *
 * Built by the test with `cc hangfs.c $(pkg-config --cflags --libs fuse3)` (Debian: libfuse3-dev).
 */
#define FUSE_USE_VERSION 31
#include <fuse.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *NAME = "/disk.img";
static off_t SIZE;

static void *hang_init(struct fuse_conn_info *conn, struct fuse_config *cfg) {
    (void)conn;
    cfg->direct_io = 1;    /* every read reaches the server */
    cfg->kernel_cache = 0;
    cfg->attr_timeout = 1; /* attributes go stale: the kernel asks again */
    cfg->entry_timeout = 1;
    return NULL;
}

static int hang_getattr(const char *path, struct stat *st, struct fuse_file_info *fi) {
    (void)fi;
    memset(st, 0, sizeof *st);
    if (strcmp(path, "/") == 0) {
        st->st_mode = S_IFDIR | 0755;
        st->st_nlink = 2;
        return 0;
    }
    if (strcmp(path, NAME) == 0) {
        st->st_mode = S_IFREG | 0644;
        st->st_nlink = 1;
        st->st_size = SIZE;
        return 0;
    }
    return -ENOENT;
}

static int hang_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off,
                        struct fuse_file_info *fi, enum fuse_readdir_flags flags) {
    (void)off; (void)fi; (void)flags;
    if (strcmp(path, "/") != 0) return -ENOENT;
    fill(buf, ".", NULL, 0, 0);
    fill(buf, "..", NULL, 0, 0);
    fill(buf, NAME + 1, NULL, 0, 0);
    return 0;
}

static int hang_open(const char *path, struct fuse_file_info *fi) {
    if (strcmp(path, NAME) != 0) return -ENOENT;
    fi->direct_io = 1;
    return 0;
}

static int hang_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi) {
    (void)path; (void)fi;
    if (off >= SIZE) return 0;
    if ((off_t)size > SIZE - off) size = (size_t)(SIZE - off);
    memset(buf, 0, size);
    return (int)size;
}

static int hang_write(const char *path, const char *buf, size_t size, off_t off,
                      struct fuse_file_info *fi) {
    (void)path; (void)buf; (void)fi;
    if (off >= SIZE) return -ENOSPC;
    if ((off_t)size > SIZE - off) size = (size_t)(SIZE - off);
    return (int)size; /* discarded: reads are zeros */
}

static const struct fuse_operations OPS = {
    .init = hang_init,
    .getattr = hang_getattr,
    .readdir = hang_readdir,
    .open = hang_open,
    .read = hang_read,
    .write = hang_write,
};

int main(int argc, char **argv) {
    if (argc != 3 || atoll(argv[2]) <= 0) return 2;
    SIZE = (off_t)atoll(argv[2]) << 20;
    char *args[] = {argv[0], "-f", "-s", "-o", "fsname=hangfs,allow_other", argv[1], NULL};
    return fuse_main(6, args, &OPS, NULL);
}
