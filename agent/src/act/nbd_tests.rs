//! The nbd step through the recording kernel: the set-up re-check (server pid, backend, device
//! number) refuses a reconnected or reused nbd device with nothing written; the planned one gets
//! exactly `NBD_DISCONNECT` and `NBD_CLEAR_SOCK`.

use super::*;
use crate::act::recording_kernel::{Call, Effect, RecordingKernel, ScriptedNode};

const NBD0: DevNum = DevNum { major: 43, minor: 0 };
const DIR: &str = "sys/devices/virtual/block/nbd0";

fn nbd0() -> DeviceName {
    DeviceName::new("nbd0").expect("name")
}

/// `nbd0` connected by server pid 4242 with backend `vol-a`, 1 GiB: sysfs as drivers/block/nbd.c
/// writes it (`pid` and `backend` exist while connected, each one line; `size` in sectors).
fn connected_nbd0() -> RecordingKernel {
    let k = RecordingKernel::new();
    for (attr, text) in [("dev", "43:0\n"), ("size", "2097152\n"), ("pid", "4242\n"), ("backend", "vol-a\n")]
    {
        k.file(&format!("{DIR}/{attr}"), text);
    }
    k.link("sys/class/block/nbd0", "../../devices/virtual/block/nbd0");
    k.node("dev/nbd0", ScriptedNode::block(NBD0));
    k
}

fn disconnect(k: &RecordingKernel, pid: u32, backend: &str) -> Result<StepOutcome, ActError> {
    k.actuator().nbd_disconnect(&nbd0(), NBD0, Some(pid), Some(backend))
}

/// What the kernel does once the socket is cleared and nothing else has the node open.
fn on_clear_sock(k: &RecordingKernel) -> Vec<Call> {
    let node = k.path("dev/nbd0");
    let teardown = vec![
        Effect::Remove(k.path(&format!("{DIR}/pid"))),
        Effect::WriteFile(k.path(&format!("{DIR}/size")), "0\n".into()),
    ];
    k.on(Call::NbdClearSock(node.clone()), teardown);
    vec![Call::NbdDisconnect(node.clone()), Call::NbdClearSock(node)]
}

#[test]
fn a_device_set_up_by_another_server_is_left_alone() {
    let k = connected_nbd0();
    let e = disconnect(&k, 4241, "vol-a").expect_err("reconnected");
    assert!(matches!(&e, ActError::Precondition { device, .. } if device.as_str() == "nbd0"), "{e:?}");
    assert_eq!(
        e.to_string(),
        "nbd0: precondition failed: it is now set up by pid 4242 with backend vol-a, not pid 4241 with backend vol-a: reconnected or reused"
    );
    assert_eq!(k.writes(), vec![], "nothing reached the kernel");
}

#[test]
fn a_device_with_another_backend_is_left_alone() {
    let k = connected_nbd0();
    let e = disconnect(&k, 4242, "vol-b").expect_err("reused");
    assert!(e.to_string().contains("with backend vol-a, not pid 4242 with backend vol-b"), "{e}");
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn a_node_that_is_another_device_is_refused() {
    let k = connected_nbd0();
    k.node("dev/nbd0", ScriptedNode::block(DevNum::new(43, 32)));
    let e = disconnect(&k, 4242, "vol-a").expect_err("another device");
    assert!(e.to_string().starts_with("nbd0: precondition failed: "), "{e}");
    assert!(e.to_string().ends_with("/dev/nbd0 is not device 43:0"), "{e}");
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn the_planned_connection_is_disconnected_with_the_two_ioctls() {
    let k = connected_nbd0();
    let expected = on_clear_sock(&k);
    assert_eq!(disconnect(&k, 4242, "vol-a").expect("disconnected"), StepOutcome::Done);
    assert_eq!(k.writes(), expected);
}

#[test]
fn an_already_disconnected_socket_is_not_an_error() {
    let k = connected_nbd0();
    let expected = on_clear_sock(&k);
    k.fail(Call::NbdDisconnect(k.path("dev/nbd0")), libc::EINVAL);
    assert_eq!(disconnect(&k, 4242, "vol-a").expect("disconnected"), StepOutcome::Done);
    assert_eq!(k.writes(), expected);
}

#[test]
fn a_disconnected_device_is_already_absent() {
    let k = connected_nbd0();
    std::fs::remove_file(k.path(&format!("{DIR}/pid"))).expect("rm pid");
    std::fs::write(k.path(&format!("{DIR}/size")), "0\n").expect("size");
    assert_eq!(disconnect(&k, 4242, "vol-a").expect("absent"), StepOutcome::AlreadyAbsent);
    assert_eq!(k.writes(), vec![]);
}
