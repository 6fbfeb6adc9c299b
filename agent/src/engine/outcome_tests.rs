//! The INCOMPLETE VIEW line's remedy: the one that applies on this host, never "run as root" to
//! a run that is root.

use super::remedy;
use crate::model::blindspot::BlindSpot;

fn spot(what: &str) -> BlindSpot {
    BlindSpot::any(what)
}

#[test]
fn root_is_never_told_to_run_as_root() {
    let pid1 = spot("cannot inspect pid 1 (systemd): reading its ns/mnt: Permission denied (os error 13)");
    let r = remedy(&[&pid1], true);
    assert!(r.contains("--trust-unreadable-init"), "{r}");
    assert!(!r.contains("run it as root"), "{r}");
    let other = spot("cannot inspect pid 4242 (app): reading its fd table: Permission denied (os error 13)");
    let r = remedy(&[&other], true);
    assert!(!r.contains("run it as root") && !r.contains("trust-unreadable-init"), "{r}");
    assert!(r.contains("run it again"), "{r}");
}

#[test]
fn a_run_that_is_not_root_is_told_to_be() {
    let other = spot("cannot inspect pid 4242 (app): reading its ns/mnt: Permission denied (os error 13)");
    assert!(remedy(&[&other], false).starts_with("run it as root on the host"));
}

#[test]
fn a_blind_spot_that_names_its_own_remedy_is_not_contradicted() {
    let pidns = spot(
        "/proc is the procfs of PID namespace 4026532201, not the host's (4026531836); run it in the host's PID namespace: in a pod `hostPID: true`",
    );
    let pid1 = spot("cannot inspect pid 1 (systemd): reading its ns/mnt: Permission denied (os error 13)");
    let r = remedy(&[&pid1, &pidns], true);
    assert!(r.contains("said with each"), "{r}");
}
