//! Scenarios against a real Ceph cluster (Debian's ceph packages: one monitor and one memstore
//! OSD in a network namespace of their own) with the guest mapping images through the kernel
//! client (`tests/ceph/`). Every client of the cluster runs inside that namespace or inside the
//! guest: nothing leaves the machine.
//!
//! Tests are named `root_ceph_*` and run one at a time (each brings a cluster up and down).

use std::process::{Command, Stdio};

use crate::guest::{guest_dir, stage_agent, Run};

/// Checks that Ceph tests can run: fails in CI, skips with a reason elsewhere.
pub fn require_ceph() -> bool {
    crate::require_real_kernel(&["ip", "strip", "timeout"])
}

/// Runs `tests/ceph/scenarios/<name>` through `agent-scenario.sh` with the agent staged.
pub fn run_ceph_scenario(name: &str) -> Run {
    let _serial = crate::serial();
    let extra = tempfile::tempdir().expect("tempdir");
    stage_agent(extra.path());
    let ceph = guest_dir().with_file_name("ceph");
    std::fs::copy(ceph.join("scenarios/rbd-common.sh"), extra.path().join("lib/rbd-common.sh"))
        .expect("copy rbd-common.sh");
    let out = Command::new(ceph.join("agent-scenario.sh"))
        .arg(ceph.join("scenarios").join(name))
        .arg(extra.path())
        .stdin(Stdio::null())
        .output()
        .expect("agent-scenario.sh");
    Run {
        code: out.status.code(),
        output: String::from_utf8_lossy(&out.stdout).into_owned(),
        harness: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}
