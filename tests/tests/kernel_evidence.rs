//! Real-kernel tests for issue 17's evidence items: the kernel's word is the kernel's (a record
//! written to `/dev/kmsg` from user space is no evidence), and identity everywhere on btrfs (a
//! process's cwd, open file and mapping on a btrfs subvolume, a loop device backed by a file
//! there, and a mount whose source text lies).
//!
//! Every object is owned by a guard (`LoopDev`, `NsProcess`) that cleans up on drop, even when an
//! assertion fails; guards are declared so that they drop in the safe order (the loop device
//! backed by a file on btrfs, then the processes of the namespace that mounts it, then the btrfs
//! loop device). No btrfs is ever mounted on the host: every mount lives in a private namespace.

use std::io::Write;
use std::path::Path;
use std::time::Duration;

use blockjanitor::discover::{iscsi, kmsg};
use blockjanitor::host::HostRoot;
use blockjanitor_tests::*;
use serde_json::Value;

const BTRFS: &[&str] = &["losetup", "mkfs.btrfs", "btrfs", "unshare", "mount", "umount", "mknod"];

/// `holders DEV --output json` (exit 2 when it names a holder, else 0), with the scratch's state
/// file and journal.
fn holders(s: &Scratch, dev: &str) -> Value {
    let (state, journal) = (s.path("state.json"), s.path("journal.jsonl"));
    agent_holders(&["--state", utf8(&state), "--journal", utf8(&journal)], dev)
}

/// The holders of `kind` whose pids include `pid`.
fn holder_with_pid<'a>(v: &'a Value, kind: &str, pid: u32) -> Option<&'a Value> {
    v["holders"].as_array()?.iter().find(|h| {
        h["kind"] == kind
            && h["pids"].as_array().is_some_and(|p| p.iter().any(|x| x.as_u64() == Some(u64::from(pid))))
    })
}

/// Waits for a pid file the namespace's script writes; panics naming it when it never comes.
fn pid_file(p: &Path) -> u32 {
    assert!(
        wait_until(Duration::from_secs(20), || std::fs::read_to_string(p)
            .is_ok_and(|t| t.trim().parse::<u32>().is_ok())),
        "{} was never written: the namespace's script failed",
        p.display()
    );
    std::fs::read_to_string(p).expect("pid file").trim().parse().expect("pid")
}

// ---------------------------------------------------------------------------------------------
// Item 4: kernel evidence is the kernel's.

/// A record written to the real `/dev/kmsg` from user space gets facility 1 (`user`), even when
/// it asks for another with a `<N>` prefix: it is in the log, it reads exactly like the kernel's
/// "Logical unit not supported" and krbd's fence, and the parsers that would have taken it (the
/// same text with facility 0 is taken) ignore it.
#[test]
fn root_a_forged_dev_kmsg_line_is_no_kernel_evidence() {
    let _serial = serial();
    if !require_real_kernel(&[]) {
        return;
    }
    // A disk name no kernel gave (sdbj..., letters only as the kernel's are: the pid's hex
    // digits spelled a..p) and an rbd name, unique to this run.
    let tag: String = format!("{:x}", std::process::id())
        .chars()
        .filter_map(|c| c.to_digit(16).map(|d| char::from(b'a' + d as u8)))
        .collect();
    let disk = format!("sdbj{tag}");
    let lun = format!("sd 9:0:0:7: [{disk}] tag#1 Add. Sense: Logical unit not supported");
    let rbd = format!("rbd{}", 900_000 + std::process::id() % 99_999);
    let attach = format!("rbd: {rbd}: capacity 1073741824 features 0x1");
    let fence = format!("rbd: {rbd}: failed to reregister watch: -108");
    let host = HostRoot::default();
    let logged = |text: &str| {
        let mut found = false;
        kmsg::for_each_record(&host, |r| found |= r.ends_with(text));
        found
    };
    // One record per write; `<0>` asks for kern/emerg, which the kernel does not grant. Writes
    // from user space are rate limited (a burst of 10 per 5 s, shared by every writer): a write
    // that was dropped is made again.
    for (prefix, text) in [("<0>", &attach), ("<4>", &fence), ("<3>", &lun)] {
        let ok = wait_until(Duration::from_secs(30), || {
            if logged(text) {
                return true;
            }
            let mut k = std::fs::OpenOptions::new()
                .write(true)
                .open("/dev/kmsg")
                .expect("open /dev/kmsg for writing");
            k.write_all(format!("{prefix}{text}").as_bytes()).expect("write a record to /dev/kmsg");
            std::thread::sleep(Duration::from_millis(1500));
            false
        });
        assert!(ok, "the record {text:?} never reached the kernel log");
    }
    let mut seen = Vec::new();
    kmsg::for_each_record(&host, |r| {
        if r.contains(&disk) || r.contains(&rbd) {
            seen.push(r.to_owned());
        }
    });
    for text in [&attach, &fence, &lun] {
        assert!(seen.iter().any(|r| r.ends_with(text.as_str())), "{text:?} is in the kernel log: {seen:?}");
    }
    for r in &seen {
        let priority: u32 = r.split(',').next().and_then(|p| p.parse().ok()).expect("priority");
        assert!(priority >= 8, "a user-space record has facility >= 1: {r}");
        assert_eq!(kmsg::KernelRecord::parse(r), None, "a user-space record is no kernel record: {r}");
    }
    // The scene would have mattered: the same records with facility 0 are evidence.
    let as_kernel: Vec<String> = seen
        .iter()
        .map(|r| {
            let (prio, rest) = r.split_once(',').expect("record");
            format!("{},{rest}", prio.parse::<u32>().expect("priority") & 7)
        })
        .collect();
    let wanted = vec![(disk.clone(), "9:0:0:7".to_owned())];
    let gone = iscsi::luns_gone(as_kernel.clone(), &wanted);
    assert_eq!(gone.len(), 1, "the same line from the kernel says the LUN is gone: {as_kernel:?}");
    assert!(gone[0].1.contains("kernel record") && gone[0].1.contains("facility kern"), "{gone:?}");
    let log = kmsg::RbdLog::from_records(as_kernel.iter().map(String::as_str));
    assert!(log.fenced.contains_key(&rbd), "the same lines from the kernel fence {rbd}: {log:?}");
    // From user space, nothing.
    assert!(iscsi::luns_gone(seen.clone(), &wanted).is_empty(), "a forged record made a LUN gone");
    assert!(
        iscsi::read_luns_gone(&host, &wanted).is_empty(),
        "the live kernel log's forged record made a LUN gone"
    );
    let log = kmsg::read_rbd(&host);
    assert!(!log.fenced.contains_key(&rbd), "a forged record fenced {rbd}: {log:?}");
    assert!(!log.attached.contains_key(&rbd), "a forged record announced {rbd}: {log:?}");
}

/// End to end: a scan of the iSCSI fixture with a kernel log beside it. `sdc` (3:0:0:1, its
/// session logged in) is `unused`; a forged "Logical unit not supported" for it (facility 1)
/// leaves it `unused`, while the kernel's own record of the same text makes it a candidate
/// whose reason names a kernel record.
#[test]
fn a_forged_lun_gone_record_changes_no_verdict_in_a_scan() {
    let s = Scratch::new();
    let root = s.path("iscsi");
    sh("cp", &["-a", utf8(&fixtures().join("iscsi")), utf8(&root)]);
    std::fs::create_dir_all(root.join("dev")).expect("mkdir dev");
    let line = "sd 3:0:0:1: [sdc] tag#18 Add. Sense: Logical unit not supported";
    let scan = |priority: u32| -> Value {
        std::fs::write(
            root.join("dev/kmsg"),
            format!(
                "5,900,13682979,-;sd 3:0:0:1: [sdc] Attached SCSI disk\n{priority},952,23438550,-;{line}\n"
            ),
        )
        .expect("write kmsg");
        let v = agent_json(&["--root", utf8(&root), "--grace-period", "0", "scan", "--output", "json"], 0);
        find_device(&v, "sdc").clone()
    };
    // Facility 1 (user), level 3: what a write to /dev/kmsg from user space becomes.
    let forged = scan(8 + 3);
    assert_eq!(forged["verdict"], "unused", "a forged record changed the verdict: {forged:#}");
    assert_eq!(forged["scsi"]["lun_gone"], "", "{forged:#}");
    // Facility 0: the kernel's word.
    let kernel = scan(3);
    assert_ne!(kernel["verdict"], "unused", "the kernel's record is evidence: {kernel:#}");
    let reasons = kernel["reasons"].to_string();
    assert!(reasons.contains("kernel record #952") && reasons.contains("facility kern"), "{kernel:#}");
}

// ---------------------------------------------------------------------------------------------
// Item 9: identity on btrfs.

/// A btrfs on a loop device, mounted (subvolume `sub`) only in a private namespace, with one
/// process whose cwd is in the subvolume, one holding a file there open, and one running a
/// binary from it (a mapping, no fd, cwd `/`); a loop device backed by a file in the subvolume.
/// Files on btrfs stat with the subvolume's anonymous number, neither the superblock's (what
/// mountinfo and maps show) nor the device's (gotcha 23): `holders` must name each user.
#[test]
fn root_btrfs_subvolume_users_are_holders_of_the_device() {
    let _serial = serial();
    if !require_real_kernel(BTRFS) {
        return;
    }
    let s = Scratch::new();
    let img = s.btrfs_image("btrfs.img");
    let lo = LoopDev::attach(&img);
    let p = s.mkdir("p");
    let (pp, st) = (utf8(&p), utf8(s.dir.path()));
    let script = format!(
        "set -e; mount {dev} {pp}; btrfs subvolume create {pp}/sub >/dev/null; cp /bin/sleep {pp}/sub/sleep; \
         echo data > {pp}/sub/file; truncate -s 16M {pp}/sub/inner.img; \
         btrfs subvolume create {pp}/sub/nested >/dev/null; truncate -s 16M {pp}/sub/nested/deep.img; umount {pp}; \
         mount -o subvol=sub {dev} {pp}; \
         sh -c 'echo $$ > {st}/cwd.pid; cd {pp}; exec sleep 1000' & \
         sh -c 'echo $$ > {st}/fd.pid; cd /; exec 3<{pp}/file; exec sleep 1000' & \
         sh -c 'echo $$ > {st}/map.pid; cd /; exec {pp}/sleep 1000' & \
         losetup -f --show {pp}/inner.img > {st}/inner.tmp && mv {st}/inner.tmp {st}/inner; \
         losetup -f --show {pp}/nested/deep.img > {st}/deep.tmp && mv {st}/deep.tmp {st}/deep; \
         echo $$ > {st}/ns.pid; wait",
        dev = lo.dev
    );
    let ns = NsProcess::spawn(&script);
    let (cwd, fd, map) =
        (pid_file(&s.path("cwd.pid")), pid_file(&s.path("fd.pid")), pid_file(&s.path("map.pid")));
    pid_file(&s.path("ns.pid"));
    let inner_dev = std::fs::read_to_string(s.path("inner")).expect("inner loop device").trim().to_owned();
    let inner_name = inner_dev.trim_start_matches("/dev/").to_owned();
    let inner = LoopDev::adopt(&inner_name, &p.join("inner.img"));
    let deep_dev = std::fs::read_to_string(s.path("deep")).expect("deep loop device").trim().to_owned();
    let deep_name = deep_dev.trim_start_matches("/dev/").to_owned();
    let deep = LoopDev::adopt(&deep_name, &p.join("nested/deep.img"));
    // The holders exist as the kernel shows them: cwd, fd, mapping on the subvolume.
    let sub_dev = std::fs::metadata(format!("/proc/{cwd}/cwd")).map(|m| {
        use std::os::unix::fs::MetadataExt;
        m.dev()
    });
    assert!(
        sub_dev.as_ref().is_ok_and(|&d| libc::major(d) == 0),
        "the cwd is on an anonymous device: {sub_dev:?}"
    );
    assert!(std::fs::read_to_string(format!("/proc/{map}/maps"))
        .is_ok_and(|m| m.contains(&format!("{pp}/sleep"))));

    let v = holders(&s, &lo.dev);
    let shown = serde_json::to_string_pretty(&v["holders"]).unwrap_or_default();
    assert!(
        v["holders"].as_array().is_some_and(|hs| hs
            .iter()
            .any(|h| h["kind"] == "mount" && h["fstype"] == "btrfs" && h["in_host_namespace"] == false)),
        "the namespace's btrfs mount is tied to {} by its fsid: {shown}",
        lo.dev
    );
    for (kind, pid) in [("cwd", cwd), ("open_file", fd), ("mmap", map)] {
        assert!(
            holder_with_pid(&v, kind, pid).is_some(),
            "pid {pid}'s {kind} on the btrfs subvolume is not a holder of {}: {shown}",
            lo.dev
        );
    }
    assert!(
        v["holders"].as_array().is_some_and(|hs| hs
            .iter()
            .any(|h| h["kind"] == "loop_backing" && h["device"] == inner_name.as_str())),
        "{inner_name}, backed by a file on the btrfs subvolume, is not a holder of {}: {shown}",
        lo.dev
    );
    // A file in a nested subvolume (its own anonymous number, which no mount root or open file
    // shows): tied through the namespace's view of the backing file's path, checked by inode.
    assert!(
        v["holders"].as_array().is_some_and(|hs| hs
            .iter()
            .any(|h| h["kind"] == "loop_backing" && h["device"] == deep_name.as_str())),
        "{deep_name}, backed by a file in a nested btrfs subvolume, is not a holder of {}: {shown}",
        lo.dev
    );
    assert_ne!(v["verdict"], "unused", "{v:#}");
    drop(deep);
    drop(inner);
    drop(ns);
    drop(lo);
}

/// Two btrfs filesystems, A and B, on two loop devices. In a namespace with a /dev of its own
/// (as a container has), B is mounted through a node named after A's device: the mount's source
/// text says A (`/dev/loopA`), the filesystem is B's. The mount is B's holder, never A's: it is
/// tied by the fsid the kernel gives, not by the text.
#[test]
fn root_a_btrfs_mount_whose_source_text_lies_is_tied_by_its_fsid() {
    let _serial = serial();
    if !require_real_kernel(BTRFS) {
        return;
    }
    let s = Scratch::new();
    let (img_a, img_b) = (s.btrfs_image("a.img"), s.btrfs_image("b.img"));
    let a = LoopDev::attach(&img_a);
    let b = LoopDev::attach(&img_b);
    let p = s.mkdir("p");
    let rdev = |dev: &str| {
        use std::os::unix::fs::MetadataExt;
        let r = std::fs::metadata(dev).expect("stat loop node").rdev();
        (libc::major(r), libc::minor(r))
    };
    let (bmaj, bmin) = rdev(&b.dev);
    let (pp, st) = (utf8(&p), utf8(s.dir.path()));
    // A to be live too (its /sys/fs/btrfs entry), mounted on the side in the same namespace.
    let q = s.mkdir("q");
    let script = format!(
        "set -e; mount {a} {q}; mount -t tmpfs none /dev; mknod {a} b {bmaj} {bmin}; \
         mount -t btrfs {a} {pp}; echo $$ > {st}/ns.pid; exec sleep 1000",
        a = a.dev,
        q = utf8(&q)
    );
    let ns = NsProcess::spawn(&script);
    let pid = pid_file(&s.path("ns.pid"));
    let line = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))
        .expect("mountinfo")
        .lines()
        .find(|l| l.split(' ').nth(4) == Some(pp))
        .map(str::to_owned)
        .expect("the lying mount");
    let lies = line.contains(&format!(" {} ", a.dev));
    if !lies {
        eprintln!("note: this kernel shows the mount's real device, not the node's name: {line}");
    }
    let mount_at = |v: &Value| -> bool {
        v["holders"]
            .as_array()
            .is_some_and(|hs| hs.iter().any(|h| h["kind"] == "mount" && h["mount_point"] == pp))
    };
    let vb = holders(&s, &b.dev);
    assert!(mount_at(&vb), "the mount at {pp} (mountinfo: {line}) is not a holder of {}: {vb:#}", b.dev);
    let va = holders(&s, &a.dev);
    assert!(
        !mount_at(&va),
        "the mount at {pp} (mountinfo: {line}) was tied to {} by its source text: {va:#}",
        a.dev
    );
    drop(ns);
    drop(b);
    drop(a);
}
