//! Which process owns a daemon's control socket: the one holding the listening unix socket bound
//! to its abstract name, in its own network namespace. A process is never taken for a daemon by
//! its name (`comm`, which any process can set): the name only narrows the search, and the
//! process must hold an fd on the listening socket that `/proc/PID/net/unix` (its network
//! namespace's table) lists under the abstract name. Each is read pinned by a pidfd
//! ([`super::process_identity`]).
//!
//! `/proc/net/unix` (`Num RefCount Protocol Flags Type St Inode Path`): the listening socket has
//! `__SO_ACCEPTCON` (`0x10000`) in Flags; an abstract name is printed with `@` for its leading
//! NUL. The connections a listener accepted carry its name too, without that flag.

use super::process_identity::{self, PinnedProcess};
use crate::host::HostRoot;

/// `__SO_ACCEPTCON` in `/proc/net/unix`'s Flags: a listening socket.
const SO_ACCEPTCON: u32 = 0x0001_0000;

/// The inodes of the listening sockets bound to the abstract name `name` (without its `@`) in a
/// `/proc/net/unix` text. A line that does not parse is skipped (the table's own header).
pub fn listening_inodes(table: &str, name: &str) -> Vec<u64> {
    let wanted = format!("@{name}");
    let mut out = Vec::new();
    for line in table.lines() {
        let fields: Vec<&str> = line.split_ascii_whitespace().collect();
        if fields.len() < 8 || fields[7..].join(" ") != wanted {
            continue;
        }
        let flags = u32::from_str_radix(fields[3], 16).ok();
        let inode = fields[6].parse::<u64>().ok();
        if let (Some(flags), Some(inode)) = (flags, inode) {
            if flags & SO_ACCEPTCON != 0 {
                out.push(inode);
            }
        }
    }
    out
}

/// What the processes named `comm` say about the control socket `name`.
#[derive(Debug, Default)]
pub struct Owners {
    /// Processes named `comm` that hold a listening socket bound to `name` in their network
    /// namespace, pinned (the daemon: one per namespace it runs in).
    pub owners: Vec<PinnedProcess>,
    /// Processes named `comm` that hold no such socket (a client, `multipathd -k`; a daemon
    /// starting up; or just a process that named itself so), by PID.
    pub others: Vec<u32>,
}

/// The processes named `comm` and whether each owns the listening socket `name` in its network
/// namespace. A process that exits meanwhile is left out; one that cannot be read is an error
/// naming it (nothing can be told about it).
pub fn owners(host: &HostRoot, comm: &str, name: &str) -> Result<Owners, String> {
    let mut out = Owners::default();
    for pid in named(host, comm)? {
        let Some(p) = process_identity::pin(host, pid)? else { continue };
        let dir = host.proc_pid(pid);
        let table = match std::fs::read_to_string(dir.join("net/unix")) {
            Ok(t) => t,
            Err(e) if super::is_gone(&e) => continue,
            Err(e) => return Err(format!("{}: {e}", dir.join("net/unix").display())),
        };
        let listening = listening_inodes(&table, name);
        let holds = !listening.is_empty() && holds_socket(&dir, &listening)?;
        if !p.still_running() {
            continue;
        }
        if holds {
            out.owners.push(p);
        } else {
            out.others.push(pid);
        }
    }
    Ok(out)
}

/// The PIDs of processes whose `comm` is `comm` (thread-group leaders: what `/proc` lists).
fn named(host: &HostRoot, comm: &str) -> Result<Vec<u32>, String> {
    let proc = host.proc();
    let entries = std::fs::read_dir(proc).map_err(|e| format!("listing {}: {e}", proc.display()))?;
    let mut pids = Vec::new();
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        match std::fs::read(e.path().join("comm")) {
            Ok(c) if c.strip_suffix(b"\n").unwrap_or(&c) == comm.as_bytes() => pids.push(pid),
            _ => {}
        }
    }
    pids.sort_unstable();
    Ok(pids)
}

/// Whether the process at `dir` (`/proc/PID`) holds an fd on one of the socket `inodes`.
fn holds_socket(dir: &std::path::Path, inodes: &[u64]) -> Result<bool, String> {
    let fd_dir = dir.join("fd");
    let entries = match std::fs::read_dir(&fd_dir) {
        Ok(e) => e,
        Err(e) if super::is_gone(&e) => return Ok(false),
        Err(e) => return Err(format!("listing {}: {e}", fd_dir.display())),
    };
    let wanted: Vec<String> = inodes.iter().map(|i| format!("socket:[{i}]")).collect();
    Ok(entries
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .any(|l| wanted.iter().any(|w| l.as_os_str() == w.as_str())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_listening_socket_is_found_by_its_abstract_name_and_flag() {
        // As a 6.1 kernel prints it with multipathd listening and one client connected.
        let table = "Num       RefCount Protocol Flags    Type St Inode Path\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 20716 @/org/kernel/linux/storage/multipathd\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 20802 @/org/kernel/linux/storage/multipathd\n\
            0000000000000000: 00000003 00000000 00000000 0001 03 20801\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 30001 @/org/kernel/linux/storage/multipathd2\n\
            0000000000000000: 00000002 00000000 00010000 0001 01 30002 /org/kernel/linux/storage/multipathd\n";
        assert_eq!(listening_inodes(table, "/org/kernel/linux/storage/multipathd"), [20716]);
        assert!(listening_inodes("garbage\n", "/x").is_empty());
    }

    /// On the live kernel: a process that holds the listening socket owns it; one that only
    /// bears the name does not.
    #[test]
    fn a_process_owns_a_socket_only_by_holding_it() {
        use std::os::linux::net::SocketAddrExt;
        let host = HostRoot::default();
        if !host.is_live() {
            return;
        }
        let name = format!("/blockjanitor/test/owner-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).expect("addr");
        let listener = std::os::unix::net::UnixListener::bind_addr(&addr).expect("bind");
        let me = std::fs::read_to_string("/proc/self/comm").expect("comm").trim_end().to_owned();
        let o = owners(&host, &me, &name).expect("owners");
        assert!(o.owners.iter().any(|p| p.id.pid == std::process::id()), "{o:?}");
        drop(listener);
        let o = owners(&host, &me, &name).expect("owners");
        assert!(o.owners.is_empty() && o.others.contains(&std::process::id()), "{o:?}");
    }
}
