//! The iSCSI logout through the recording kernel, on the `iscsi-guest` tree (`session3` logs in
//! to `...:emptied` at 127.0.0.1:3260 with no SCSI device left; `session1` still has two): a
//! reused SID (another target or portal) or a session with disks refuses the logout with nothing
//! run; the planned session gets exactly one `iscsiadm -m session -r SID -u` in the host's
//! namespaces.

use super::*;
use crate::act::recording_kernel::{Call, Effect, RecordingKernel};

const EMPTIED: &str = "iqn.2026-11.io.blockjanitor:emptied";
const LIVE: &str = "iqn.2026-11.io.blockjanitor:live";
const PORTAL: &str = "127.0.0.1:3260";

fn name(n: &str) -> DeviceName {
    DeviceName::new(n).expect("name")
}

/// The guest's tree with the host's iscsiadm where open-iscsi installs it.
fn iscsi_guest() -> RecordingKernel {
    let k = RecordingKernel::fixture("iscsi-guest");
    k.file("usr/sbin/iscsiadm", "");
    k
}

fn logout(k: &RecordingKernel, sid: u32, target: &str, portal: &str) -> Result<StepOutcome, ActError> {
    let action =
        Action::IscsiLogout { sid, target: target.into(), portal: portal.into(), iface: "default".into() };
    k.actuator().iscsi_logout_step(&name(&format!("session{sid}")), &action)
}

/// The one write of a logout of `sid`.
fn iscsiadm(sid: u32) -> Call {
    let args = ["-m", "session", "-r", &sid.to_string(), "-u"].map(str::to_owned).to_vec();
    Call::RunInHostNamespaces { program: "/usr/sbin/iscsiadm".into(), args }
}

fn assert_refused(r: Result<StepOutcome, ActError>, device: &str, why: &str) {
    let e = r.expect_err("refused");
    assert!(matches!(&e, ActError::Precondition { device: d, .. } if d.as_str() == device), "{e:?}");
    assert!(e.to_string().starts_with(&format!("{device}: precondition failed: ")), "{e}");
    assert!(e.to_string().contains(why), "{e}");
}

#[test]
fn a_sid_that_logs_in_to_another_target_now_is_left_alone() {
    let k = iscsi_guest();
    let why = format!("session3 now logs in to '{EMPTIED}', not '{LIVE}': the SID was reused");
    assert_refused(logout(&k, 3, LIVE, PORTAL), "session3", &why);
    assert_eq!(k.writes(), vec![], "nothing was run");
}

#[test]
fn a_sid_that_goes_to_another_portal_now_is_left_alone() {
    let k = iscsi_guest();
    let why = format!("session3 now goes to portal '{PORTAL}', not '127.0.0.1:3261': the SID was reused");
    assert_refused(logout(&k, 3, EMPTIED, "127.0.0.1:3261"), "session3", &why);
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn a_session_with_disks_left_is_not_logged_out() {
    let k = iscsi_guest();
    assert_refused(
        logout(&k, 1, LIVE, PORTAL),
        "session1",
        "session1 still has SCSI device(s) 0:0:0:0, 0:0:0:1",
    );
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn the_planned_session_is_logged_out_through_iscsiadm_once() {
    let k = iscsi_guest();
    let gone = [
        "sys/class/iscsi_session/session3",
        "sys/class/iscsi_connection/connection3:0",
        "sys/devices/platform/host2/session3",
    ];
    k.on(iscsiadm(3), gone.iter().map(|p| Effect::Remove(k.path(p))).collect());
    assert_eq!(logout(&k, 3, EMPTIED, PORTAL).expect("logged out"), StepOutcome::Done);
    assert_eq!(k.writes(), vec![iscsiadm(3)]);
}

#[test]
fn iscsiadm_failing_fails_the_step_in_its_own_words() {
    let k = iscsi_guest();
    k.child_exit((Some(21), "iscsiadm: No session found.\n".into()));
    let e = logout(&k, 3, EMPTIED, PORTAL).expect_err("failed");
    assert!(
        matches!(&e, ActError::Syscall { device, op: "iscsiadm -m session -u", .. } if device.as_str() == "session3"),
        "{e:?}"
    );
    assert!(e.to_string().ends_with("exited with 21: iscsiadm: No session found."), "{e}");
    assert_eq!(k.writes(), vec![iscsiadm(3)]);
}

#[test]
fn no_iscsiadm_on_the_host_refuses_the_logout() {
    let k = RecordingKernel::fixture("iscsi-guest");
    assert_refused(logout(&k, 3, EMPTIED, PORTAL), "session3", "no iscsiadm in the host's file system");
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn a_session_that_is_gone_is_already_absent() {
    let k = iscsi_guest();
    assert_eq!(logout(&k, 9, EMPTIED, PORTAL).expect("absent"), StepOutcome::AlreadyAbsent);
    assert_eq!(k.writes(), vec![]);
}
