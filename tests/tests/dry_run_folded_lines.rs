//! A dry run says a repeated sentence once (issue 38, item 2): a loop device mounted on a shared
//! mount, copied into three mount namespaces as shared peers of the host's mount; `release` must
//! leave each copy alone with the same sentence but for the namespace's number. Both CLIs
//! (`blockjanitor-agent release`, and `agentctl release` against a daemon) say it on one line,
//! with the count and the other namespaces, where they said it three times.

use std::process::{Command, Stdio};
use std::time::Duration;

use blockjanitor_tests::daemon::Daemon;
use blockjanitor_tests::*;

const TOOLS: &[&str] = &["losetup", "mkfs.ext4", "mount", "umount", "unshare"];

#[test]
fn root_a_release_dry_run_says_the_sentence_of_each_peer_copy_once() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let dir = s.mkdir("shared");
    let d = utf8(&dir);
    // Drop order: the namespaces, the device's mount, the shared bind mount under it.
    let _bind = HostMount::new(d, &dir, &["--bind"]);
    sh("mount", &["--make-shared", d]);
    let (_mount, lo) = s.loop_mount("peer.img", &dir);
    let spaces: Vec<NsProcess> =
        (0..3).map(|_| NsProcess::spawn_with("unchanged", "exec sleep 1000")).collect();
    for ns in &spaces {
        assert!(wait_until(Duration::from_secs(5), || ns.has_mount(&dir)), "the namespace copied the mount");
    }
    let inodes: Vec<String> = spaces.iter().map(|ns| ns.ns_inode().to_string()).collect();
    let daemon = Daemon::start(s.dir.path(), &[]);
    let state = s.path("cli-state.json");
    let journal = s.path("cli-journal.jsonl");
    let agent_out = agent(&["--state", utf8(&state), "--journal", utf8(&journal), "release", &lo.dev]);
    let ctl = || {
        Command::new(agent_bin().with_file_name("agentctl"))
            .args(["--socket", utf8(&daemon.socket), "release", lo.name()])
            .stdin(Stdio::null())
            .output()
            .expect("agentctl")
    };
    let mut ctl_out = ctl();
    // The daemon may not have seen the namespaces yet.
    wait_until(REACT, || {
        ctl_out = ctl();
        inodes.iter().all(|i| text(&ctl_out.stdout).contains(i.as_str()))
    });
    for (bin, out) in [("agent", &agent_out), ("agentctl", &ctl_out)] {
        let said = text(&out.stdout);
        let peers: Vec<&str> = said.lines().filter(|l| l.contains("shared peer")).collect();
        assert_eq!(peers.len(), 1, "{bin}: the peer copies' sentence once:\n{said}\n{}", text(&out.stderr));
        assert!(peers[0].contains("(×3; also "), "{bin}: with its count: {}", peers[0]);
        for i in &inodes {
            assert!(peers[0].contains(i.as_str()), "{bin}: names namespace {i}: {}", peers[0]);
        }
    }
    drop(spaces);
}
