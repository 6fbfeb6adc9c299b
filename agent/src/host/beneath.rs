//! Reading a tree someone else writes (the kubelet directory) without being led out of it:
//! every path below a directory fd is opened with `openat2(RESOLVE_BENEATH |
//! RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`, and with `RESOLVE_NO_XDEV` wherever crossing
//! a mount must be refused (a directory something is mounted on, in this process's namespace,
//! then fails with `EXDEV` instead of being entered). A name is looked at through an `O_PATH`
//! file of it that crosses no mount ([`kind_of`]), never a `stat` of its path (which would reach
//! a filesystem mounted on it), and a symlink is read (`readlinkat`), never followed. No write:
//! the one rmdir is `act/`'s.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};

use crate::model::DevNum;

/// What a name in a directory is ([`kind_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    Symlink,
    File,
    /// A device node, fifo or socket.
    Other,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Dir => "directory",
            Self::Symlink => "symlink",
            Self::File => "file",
            Self::Other => "device node, fifo or socket",
        }
    }
}

/// A file's device and inode: what it is, whatever its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
pub struct FileKey {
    pub dev: DevNum,
    pub ino: u64,
}

impl std::fmt::Display for FileKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.dev, self.ino)
    }
}

fn resolve(cross_mounts: bool) -> ResolveFlag {
    let mut r =
        ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS | ResolveFlag::RESOLVE_NO_MAGICLINKS;
    if !cross_mounts {
        r |= ResolveFlag::RESOLVE_NO_XDEV;
    }
    r
}

/// Opens the directory `path` (an absolute path this process reaches, its symlinks already
/// resolved by the caller) as the root of a walk: `O_PATH`, refusing a symlink in its place.
pub fn open_root(path: &Path) -> io::Result<OwnedFd> {
    use std::os::unix::fs::OpenOptionsExt;
    let f = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    Ok(f.into())
}

/// Opens the directory `rel` below `dir` for reading, never leaving `dir`, following no symlink
/// and (unless `cross_mounts`) crossing no mount: a directory something is mounted on, at or
/// above `rel`, is `EXDEV`.
pub fn open_dir(dir: BorrowedFd<'_>, rel: &Path, cross_mounts: bool) -> io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(resolve(cross_mounts));
    openat2(dir, rel, how).map_err(io::Error::from)
}

/// Opens `rel` below `dir` as `O_PATH` (no filesystem's `open` runs), the same way.
pub fn open_path(dir: BorrowedFd<'_>, rel: &Path, cross_mounts: bool) -> io::Result<OwnedFd> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC)
        .resolve(resolve(cross_mounts));
    openat2(dir, rel, how).map_err(io::Error::from)
}

/// The names in the directory open at `dir` (`.` and `..` left out), sorted.
pub fn names(dir: BorrowedFd<'_>) -> io::Result<Vec<OsString>> {
    let again = open_dir(dir, Path::new("."), false)?;
    let mut d = nix::dir::Dir::from_fd(again).map_err(io::Error::from)?;
    let mut out = Vec::new();
    for entry in d.iter() {
        let entry = entry.map_err(io::Error::from)?;
        let name = OsStr::from_bytes(entry.file_name().to_bytes());
        if name != "." && name != ".." {
            out.push(name.to_owned());
        }
    }
    out.sort();
    Ok(out)
}

/// What `name` in `dir` is, and its device and inode, without following it and without
/// touching a filesystem mounted on it: `name` is opened `O_PATH | O_NOFOLLOW` without crossing a
/// mount (something mounted on it in this namespace is `EXDEV`, [`is_mount_crossing`]), and the
/// open file is asked with `statx(AT_STATX_DONT_SYNC)`. A `stat` of the path would look at the
/// mounted filesystem's root, which on a dead NFS server or a map queueing I/O can block.
pub fn kind_of(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<(Kind, FileKey)> {
    let fd = open_path(dir, Path::new(name), false)?;
    let id = crate::host::sys::stat_fd(fd.as_fd())?;
    let kind = match id.mode & libc::S_IFMT {
        libc::S_IFDIR => Kind::Dir,
        libc::S_IFLNK => Kind::Symlink,
        libc::S_IFREG => Kind::File,
        _ => Kind::Other,
    };
    Ok((kind, FileKey { dev: id.dev, ino: id.ino }))
}

/// Where the symlink `name` in `dir` points, as written.
pub fn link_target(dir: BorrowedFd<'_>, name: &OsStr) -> io::Result<PathBuf> {
    nix::fcntl::readlinkat(dir, name).map(PathBuf::from).map_err(io::Error::from)
}

/// The device and inode of an open file.
pub fn key_of(fd: BorrowedFd<'_>) -> io::Result<FileKey> {
    let id = crate::host::sys::stat_fd(fd)?;
    Ok(FileKey { dev: id.dev, ino: id.ino })
}

/// Whether `e` says a mount was on the way (`RESOLVE_NO_XDEV`).
pub fn is_mount_crossing(e: &io::Error) -> bool {
    e.raw_os_error() == Some(libc::EXDEV)
}

/// Opens `rel` (a path of names below `dir`) as a directory, crossing no mount; the fd and the
/// directory's device and inode.
pub fn open_keyed(dir: BorrowedFd<'_>, rel: &Path) -> io::Result<(OwnedFd, FileKey)> {
    let fd = open_dir(dir, rel, false)?;
    let key = key_of(fd.as_fd())?;
    Ok((fd, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn walks_beneath_without_symlinks() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join("a/b")).expect("mkdir");
        std::fs::write(dir.path().join("a/f"), b"x").expect("file");
        std::os::unix::fs::symlink("/", dir.path().join("a/up")).expect("symlink");
        let root = open_root(dir.path()).expect("root");
        let a = open_dir(root.as_fd(), Path::new("a"), false).expect("a");
        assert_eq!(names(a.as_fd()).expect("names"), ["b", "f", "up"]);
        assert_eq!(kind_of(a.as_fd(), OsStr::new("b")).expect("b").0, Kind::Dir);
        assert_eq!(kind_of(a.as_fd(), OsStr::new("f")).expect("f").0, Kind::File);
        assert_eq!(kind_of(a.as_fd(), OsStr::new("up")).expect("up").0, Kind::Symlink);
        assert_eq!(link_target(a.as_fd(), OsStr::new("up")).expect("target"), Path::new("/"));
        assert!(open_dir(a.as_fd(), Path::new("up"), false).is_err(), "a symlink is never followed");
        assert!(open_dir(a.as_fd(), Path::new("../.."), false).is_err(), "nothing above the root");
        let (_, key) = open_keyed(root.as_fd(), Path::new("a/b")).expect("keyed");
        assert_eq!(key, kind_of(a.as_fd(), OsStr::new("b")).expect("b").1);
    }
}
