//! The device-mapper steps through the recording kernel, on the `dm-stacks` tree (maps as the
//! guest's kernel answered for them: `mpatha` 254:0 with its paths failed, `vgdata-lvdata` 254:3
//! on it): a uuid that now names another device, a path that came back, or a multipathd that
//! cannot be told apart refuses the step with nothing written; the planned map gets exactly its
//! `DM_DEV_REMOVE` or `DM_TARGET_MSG`.

use super::*;
use crate::act::kernel::MapStatus;
use crate::act::recording_kernel::{Call, Effect, RecordingKernel, ScriptedMap};

const MPATHA: &str = "mpath-36001405d424ed6f36a304f3000000000";
const LVDATA: &str = "LVM-z4vD2nrDfsbpKlR7hgTUXJCuyJcyw6j7AtePcuEal2B7CuVWIievGN9shFz62Mid";

fn name(n: &str) -> DeviceName {
    DeviceName::new(n).expect("name")
}

fn dm_stacks() -> RecordingKernel {
    let k = RecordingKernel::fixture("dm-stacks");
    k.dm_maps_from_tree();
    k
}

/// `mpatha` once the map stacked on it is gone (its open count 0), with `status` for its
/// multipath target's status parameters.
fn mpatha_alone(k: &RecordingKernel, status: Option<&str>) {
    let mut map = ScriptedMap {
        uuid: MPATHA.into(),
        header: MapStatus { dev: DevNum::new(254, 0), open_count: 0, name: "mpatha".into() },
        status: Vec::new(),
    };
    let fixture = "2 0 0 0 1 1 A 0 2 0 8:0 F 1 8:48 F 1";
    map.status.push(crate::act::kernel::TargetStatus {
        target_type: "multipath".into(),
        params: status.unwrap_or(fixture).into(),
    });
    k.dm_map(map);
}

fn assert_refused(r: Result<StepOutcome, ActError>, device: &str, why: &str) {
    let e = r.expect_err("refused");
    assert!(matches!(&e, ActError::Precondition { device: d, .. } if d.as_str() == device), "{e:?}");
    assert!(e.to_string().starts_with(&format!("{device}: precondition failed: ")), "{e}");
    assert!(e.to_string().contains(why), "{e}");
}

#[test]
fn a_map_whose_uuid_is_now_another_device_is_left_alone() {
    // Planned as dm-9 (254:9); the uuid now names 254:3: removed and created again since.
    let k = dm_stacks();
    let planned = DevNum::new(254, 9);
    let why = format!("uuid '{LVDATA}' is now device 254:3, not 254:9: the map was recreated");
    assert_refused(k.actuator().dm_remove(&name("dm-9"), planned, LVDATA, false), "dm-9", &why);
    assert_refused(k.actuator().dm_message(&name("dm-9"), planned, LVDATA, "fail_if_no_path"), "dm-9", &why);
    assert_eq!(k.writes(), vec![], "nothing reached the kernel");
}

#[test]
fn a_map_without_a_uuid_is_never_changed() {
    let k = dm_stacks();
    assert_refused(
        k.actuator().dm_remove(&name("dm-3"), DevNum::new(254, 3), "", false),
        "dm-3",
        "no device-mapper uuid",
    );
    assert_eq!(k.calls(), vec![], "the kernel was not asked anything");
}

#[test]
fn a_multipath_map_a_path_came_back_to_is_left_alone() {
    let k = dm_stacks();
    mpatha_alone(&k, Some("2 0 0 0 1 1 A 0 2 0 8:0 A 0 8:48 F 1"));
    assert_refused(
        k.actuator().dm_remove(&name("dm-0"), DevNum::new(254, 0), MPATHA, false),
        "dm-0",
        "path 8:0 is active again",
    );
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn a_root_multipathd_without_its_socket_leaves_the_map_in_place() {
    // A daemon starting or stopping: whether the map is its own cannot be told.
    let k = dm_stacks();
    mpatha_alone(&k, None);
    k.file("proc/812/status", "Name:\tmultipathd\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t812\nPid:\t812\nPPid:\t1\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n");
    k.multipathd_without_socket(&[812]);
    let why = "a root process named multipathd (pid 812) runs but holds no control socket";
    assert_refused(k.actuator().dm_remove(&name("dm-0"), DevNum::new(254, 0), MPATHA, false), "dm-0", why);
    assert_eq!(k.writes(), vec![]);
}

#[test]
fn the_planned_maps_are_removed_with_one_ioctl_each() {
    let k = dm_stacks();
    let remove = |uuid: &str| Call::DmRemove { uuid: uuid.into(), deferred: false };
    k.on(remove(LVDATA), vec![Effect::DropMap(LVDATA.into())]);
    let lv = k.actuator().dm_remove(&name("dm-3"), DevNum::new(254, 3), LVDATA, false);
    assert_eq!(lv.expect("removed"), StepOutcome::Done);
    assert_eq!(k.writes(), vec![remove(LVDATA)]);
    // Then the multipath map under it, no multipathd running: by the ioctl too.
    mpatha_alone(&k, None);
    k.on(remove(MPATHA), vec![Effect::DropMap(MPATHA.into())]);
    let mp = k.actuator().dm_remove(&name("dm-0"), DevNum::new(254, 0), MPATHA, false);
    assert_eq!(mp.expect("removed"), StepOutcome::Done);
    assert!(k.calls().contains(&Call::MultipathdOwners), "multipathd was looked for");
    assert_eq!(k.writes(), vec![remove(LVDATA), remove(MPATHA)]);
}

#[test]
fn a_deferred_removal_of_an_open_map_is_deferred() {
    // mpathb is open (cryptdata sits on it): a deferred removal goes on, and the map stays.
    let k = dm_stacks();
    let uuid = "mpath-360014055a355048c1e28cb2000000000";
    let r = k.actuator().dm_remove(&name("dm-1"), DevNum::new(254, 1), uuid, true);
    assert!(
        matches!(&r, Ok(StepOutcome::Deferred(why)) if why == "dm-1 is removed when its last opener closes it"),
        "{r:?}"
    );
    assert_eq!(k.writes(), vec![Call::DmRemove { uuid: uuid.into(), deferred: true }]);
}

#[test]
fn the_planned_map_gets_its_message() {
    let k = dm_stacks();
    let r = k.actuator().dm_message(&name("dm-0"), DevNum::new(254, 0), MPATHA, "fail_if_no_path");
    assert_eq!(r.expect("sent"), StepOutcome::Done);
    assert_eq!(k.writes(), vec![Call::DmMessage { uuid: MPATHA.into(), message: "fail_if_no_path".into() }]);
}

#[test]
fn a_map_that_is_gone_is_already_absent() {
    let k = dm_stacks();
    let gone = "mpath-3600140500000000000000000000000000";
    assert_eq!(
        k.actuator().dm_remove(&name("dm-7"), DevNum::new(254, 7), gone, false).expect("absent"),
        StepOutcome::AlreadyAbsent
    );
    assert_eq!(
        k.actuator().dm_message(&name("dm-7"), DevNum::new(254, 7), gone, "fail_if_no_path").expect("absent"),
        StepOutcome::AlreadyAbsent
    );
    assert_eq!(k.writes(), vec![]);
}
