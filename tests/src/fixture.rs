//! Generated fixture trees, for scale: a host with many block devices, in the kernel's sysfs and
//! procfs layout (the same shapes as `fixtures/incident5`, see `fixtures/make-incident5.py`).

use std::os::unix::fs::symlink;
use std::path::Path;

fn w(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    std::fs::write(p, text).expect("write");
}

fn l(root: &Path, rel: &str, target: &str) {
    let p = root.join(rel);
    if let Some(d) = p.parent() {
        std::fs::create_dir_all(d).expect("mkdir");
    }
    symlink(target, p).expect("symlink");
}

fn stat_line(pid: u32, comm: &str, flags: u32) -> String {
    format!(
        "{pid} ({comm}) S 0 {pid} {pid} 0 -1 {flags} 1520 873 0 0 20 0 0 0 20 0 1 0 5130 740192256 6530 \
         18446744073709551615 4194304 11374428 140730399795888 0 0 0 0 0 2143420159 0 0 0 17 1 0 0 0 0 0 \
         11375256 11657896 34590720 140730399799025 140730399799082 140730399799082 140730399801315 0\n"
    )
}

/// Writes a host with `n` loop devices under `root`: every other one bound to a backing file,
/// every tenth bound one mounted in a container's mount namespace, plus `sda`/`sda1` holding `/`.
pub fn many_devices(root: &Path, n: usize) {
    let host_ns = 4026531840u64;
    let mut host_mounts = String::from("22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n");
    let mut container_mounts = String::from("2700 2650 0:310 / / rw,relatime - overlay overlay rw\n");
    for i in 0..n {
        let dir = format!("devices/virtual/block/loop{i}");
        w(root, &format!("sys/{dir}/dev"), &format!("7:{i}\n"));
        w(root, &format!("sys/{dir}/ro"), "0\n");
        w(root, &format!("sys/{dir}/removable"), "0\n");
        let bound = i % 2 == 0;
        w(root, &format!("sys/{dir}/size"), if bound { "131072\n" } else { "0\n" });
        w(
            root,
            &format!("sys/{dir}/uevent"),
            &format!("MAJOR=7\nMINOR={i}\nDEVNAME=loop{i}\nDEVTYPE=disk\n"),
        );
        if bound {
            w(root, &format!("sys/{dir}/loop/backing_file"), &format!("/var/lib/images/vol{i}.img\n"));
            w(root, &format!("sys/{dir}/loop/offset"), "0\n");
            w(root, &format!("sys/{dir}/loop/sizelimit"), "0\n");
            w(root, &format!("sys/{dir}/loop/autoclear"), "1\n");
            w(root, &format!("sys/{dir}/loop/partscan"), "0\n");
            w(root, &format!("sys/{dir}/loop/dio"), "0\n");
            if i % 20 == 0 {
                container_mounts.push_str(&format!(
                    "{} 2700 7:{i} / /data/vol{i} rw,relatime - ext4 /dev/loop{i} rw\n",
                    3000 + i
                ));
            }
        }
        l(root, &format!("sys/class/block/loop{i}"), &format!("../../{dir}"));
    }
    let sda = "devices/pci0000:00/0000:00:10.0/host0/target0:0:0/0:0:0:0/block/sda";
    for (rel, dev, part) in [(sda.to_owned(), "8:0", false), (format!("{sda}/sda1"), "8:1", true)] {
        w(root, &format!("sys/{rel}/dev"), &format!("{dev}\n"));
        w(root, &format!("sys/{rel}/size"), "209715200\n");
        w(root, &format!("sys/{rel}/ro"), "0\n");
        if part {
            w(root, &format!("sys/{rel}/partition"), "1\n");
        }
        let name = rel.rsplit('/').next().unwrap_or("sda");
        l(root, &format!("sys/class/block/{name}"), &format!("../../{rel}"));
    }
    l(root, &format!("sys/{sda}/device"), "../../../0:0:0:0");
    host_mounts.push_str("23 22 0:22 / /proc rw,nosuid,nodev,noexec,relatime - proc proc rw\n");
    for (pid, comm, ns, mounts) in [
        (1u32, "systemd", host_ns, host_mounts.as_str()),
        (4242, "app", host_ns + 700, container_mounts.as_str()),
    ] {
        w(root, &format!("proc/{pid}/stat"), &stat_line(pid, comm, 0x400100));
        w(root, &format!("proc/{pid}/cmdline"), comm);
        w(root, &format!("proc/{pid}/cgroup"), "0::/init.scope\n");
        l(root, &format!("proc/{pid}/ns/mnt"), &format!("mnt:[{ns}]"));
        l(root, &format!("proc/{pid}/task/{pid}/ns/mnt"), &format!("mnt:[{ns}]"));
        w(root, &format!("proc/{pid}/task/{pid}/mountinfo"), mounts);
    }
    w(root, "proc/2/stat", &stat_line(2, "kthreadd", 0x208040));
    l(root, "proc/2/ns/mnt", &format!("mnt:[{host_ns}]"));
    w(root, "proc/swaps", "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n");
}
