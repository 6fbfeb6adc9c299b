//! Files the agent must find whole after a crash (the journal, the grace-clock state file), and
//! never through a symlink someone planted in their directory.
//!
//! Every open uses `O_NOFOLLOW` (a symlink as the file's last component fails with `ELOOP`);
//! new files are `0600`. A whole-file write goes to a fresh temporary file beside the target
//! (`O_CREAT | O_EXCL | O_NOFOLLOW`), is fsync'd, renamed over the target, and the directory is
//! fsync'd: a crash leaves the old file or the new one, never half of one.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Mode of every file created here: the journal and clocks are the agent's alone.
const MODE: u32 = 0o600;

/// The directory `path` lives in (`.` for a bare name).
fn dir_of(path: &Path) -> &Path {
    path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."))
}

/// Explains `ELOOP` from `O_NOFOLLOW`, which otherwise reads "too many levels of symbolic links".
fn explain(path: &Path, e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(libc::ELOOP) {
        return io::Error::new(
            e.kind(),
            format!(
                "{} is a symbolic link; refusing to follow it (remove it if it is not an attack)",
                path.display()
            ),
        );
    }
    e
}

/// Opens `path` for appending, creating it (and its directory) when missing.
pub fn open_append(path: &Path) -> io::Result<File> {
    std::fs::create_dir_all(dir_of(path))?;
    OpenOptions::new()
        .create(true)
        .append(true)
        .mode(MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| explain(path, e))
}

/// Opens (creating it and its directory) `path` for reading and writing, without truncating
/// it: a lock file.
pub fn open_lock(path: &Path) -> io::Result<File> {
    std::fs::create_dir_all(dir_of(path))?;
    OpenOptions::new()
        .create(true)
        .read(true)
        .write(true)
        .truncate(false)
        .mode(MODE)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| explain(path, e))
}

/// Opens `path` for reading.
pub fn open_read(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
        .map_err(|e| explain(path, e))
}

/// Reads the whole of `path`.
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    let mut buf = Vec::new();
    open_read(path)?.read_to_end(&mut buf)?;
    Ok(buf)
}

/// The temporary file a write of `path` goes through.
fn temp_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(format!(".tmp.{}", std::process::id()));
    path.with_file_name(name)
}

/// Fsyncs the directory `path` lives in, so a rename or creation in it survives a crash.
pub fn sync_dir_of(path: &Path) -> io::Result<()> {
    File::open(dir_of(path))?.sync_all()
}

/// Replaces `path` with `bytes`, atomically and durably (see the module docs).
pub fn write_atomically(path: &Path, bytes: &[u8]) -> io::Result<()> {
    std::fs::create_dir_all(dir_of(path))?;
    replace(path, bytes, MODE)
}

/// Replaces the existing file `path` (in an existing directory) with `bytes`, atomically and
/// durably, the new file getting permission bits `mode`: for a file the agent does not own, such
/// as multipath-tools' `/etc/multipath/wwids`, whose mode is kept.
pub fn replace(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let tmp = temp_path(path);
    // A leftover of this pid's earlier crash (pids are reused) would make O_EXCL fail.
    match std::fs::remove_file(&tmp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let written = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)
            .map_err(|e| explain(&tmp, e))?;
        f.write_all(bytes)?;
        // The umask may have taken bits away from `mode`.
        f.set_permissions(std::os::unix::fs::PermissionsExt::from_mode(mode))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e);
    }
    sync_dir_of(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_whole_files_and_never_follows_a_planted_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/state.json");
        write_atomically(&path, b"one").expect("first write");
        write_atomically(&path, b"two").expect("second write");
        assert_eq!(read(&path).expect("read"), b"two");
        assert_eq!(
            std::fs::read_dir(path.parent().expect("dir")).expect("ls").count(),
            1,
            "no temp file left"
        );
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777, 0o600);

        // A symlink where the file should be: reading and appending refuse, naming the link.
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").expect("victim");
        let link = dir.path().join("journal.jsonl");
        std::os::unix::fs::symlink(&victim, &link).expect("symlink");
        let e = open_append(&link).expect_err("append through a link");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let e = read(&link).expect_err("read through a link");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        // A symlink planted at the temporary name is removed, not written through.
        let tmp = temp_path(&path);
        std::os::unix::fs::symlink(&victim, &tmp).expect("planted temp link");
        write_atomically(&path, b"three").expect("write past the planted link");
        assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
        assert_eq!(read(&path).expect("read"), b"three");
    }
}
