//! Tests of reading the kubelet directory: every layout, bad input, symlinks.

use super::walk::*;
use super::*;
use crate::host::HostRoot;
use crate::model::DevNum;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/kubelet");
const KUBELET: &str = "/var/lib/kubelet";
const DRIVER: &str = "rbd.csi.ceph.com";
const NODE: &str = "mec52";

fn fixture(tree: &str) -> KubeletScan {
    let host = HostRoot::new(format!("{FIXTURES}/{tree}"));
    scan(&host, Path::new(DEFAULT_KUBELET_DIR)).expect("scan")
}

fn ceph_handle(image_uuid: &str) -> String {
    format!("0001-0024-b2e1c3d4-5f60-4a7b-8c9d-0e1f2a3b4c5d-0000000000000002-{image_uuid}")
}

fn at<'a>(s: &'a KubeletScan, path: &str) -> &'a KubeletVolume {
    s.volumes.iter().find(|v| v.path == Path::new(path)).unwrap_or_else(|| panic!("no entry {path}"))
}

fn kinds(s: &KubeletScan) -> Vec<VolumeKind> {
    s.volumes.iter().map(|v| v.kind).collect()
}

#[test]
fn pre_1_24_staging_by_pv_name() {
    let s = fixture("pre-1.24");
    assert_eq!(s.warnings, vec![]);
    assert_eq!(s.kubelet_dir, Path::new(KUBELET));
    // The projected service-account volume is not a block device.
    assert_eq!(kinds(&s), vec![VolumeKind::StagingLegacy, VolumeKind::PodMount]);
    let pv = "pvc-0a5eb91b-3c1d-4e7f-9a2b-6c8d0e1f2a3b";
    let pod = "7d3c1e2f-4a5b-4c6d-8e9f-0a1b2c3d4e5f";
    let handle = ceph_handle("10ff5cc1-3b7e-11ee-9c2a-0a580a800021");
    let stage_dir = format!("{KUBELET}/plugins/kubernetes.io/csi/pv/{pv}");
    let stage = at(&s, &format!("{stage_dir}/globalmount"));
    assert_eq!(stage.pv_name.as_deref(), Some(pv));
    assert_eq!(stage.volume_handle.as_deref(), Some(handle.as_str()));
    assert_eq!(stage.driver.as_deref(), Some(DRIVER));
    assert_eq!(stage.vol_data, Some(PathBuf::from(format!("{stage_dir}/vol_data.json"))));
    assert_eq!(stage.pod_uid, None);

    let mount = format!("{KUBELET}/pods/{pod}/volumes/kubernetes.io~csi/{pv}/mount");
    let m = at(&s, &mount);
    assert_eq!(m.kind, VolumeKind::PodMount);
    assert_eq!((m.pv_name.as_deref(), m.pod_uid.as_deref()), (Some(pv), Some(pod)));
    assert_eq!(m.volume_handle.as_deref(), Some(handle.as_str()));
    assert_eq!(m.node_name.as_deref(), Some(NODE));
    assert_eq!(m.lifecycle_mode.as_deref(), Some("Persistent"));
    let attach = format!("csi-{}", sha256_hex(&format!("{handle}{DRIVER}{NODE}")));
    assert_eq!(m.attachment_id.as_deref(), Some(attach.as_str()));
    assert_eq!(s.pods_using(pv), vec![pod]);

    // ceph-csi mounts at globalmount/<volumeHandle>: that is the staging entry.
    let ceph_mount = format!("{stage_dir}/globalmount/{handle}");
    assert_eq!(s.find_by_mount_point(&ceph_mount).map(|v| v.kind), Some(VolumeKind::StagingLegacy));
    assert_eq!(s.find_by_mount_point(&mount).map(|v| v.kind), Some(VolumeKind::PodMount));
    assert_eq!(s.find_by_mount_point(&format!("{KUBELET}/pods/{pod}")), None);
    assert_eq!(s.find_by_mount_point("/"), None);
}

#[test]
fn post_1_24_staging_by_driver_and_handle_hash() {
    let s = fixture("post-1.24");
    assert_eq!(s.warnings, vec![], "the directory is sha256 of the handle");
    let pv = "pvc-5f2d7c44-9e1a-4b3c-8d6e-2a4b6c8d0e1f";
    let handle = ceph_handle("6a2e9c0d-4f1b-11ee-8a7c-0a580a800022");
    let hash = sha256_hex(&handle);
    assert_eq!(hash, "b2c31e81a30fedc9869133305a5cb7b059c7aa2b129e5d7e0a7fd759b7cb1619");
    let stage = at(&s, &format!("{KUBELET}/plugins/kubernetes.io/csi/{DRIVER}/{hash}/globalmount"));
    assert_eq!(stage.kind, VolumeKind::Staging);
    assert_eq!(stage.driver.as_deref(), Some(DRIVER));
    assert_eq!(stage.volume_handle.as_deref(), Some(handle.as_str()));
    // Not in the staging vol_data.json: taken from the pod mounts of the same handle.
    assert_eq!(stage.pv_name.as_deref(), Some(pv));
    let pods = ["1b2c3d4e-5f60-4718-a9b0-c1d2e3f40516", "9e8d7c6b-5a49-4837-b261-50f4e3d2c1b0"];
    assert_eq!(s.pods_using(pv), pods.to_vec());
    assert_eq!(s.volumes_of_pv(pv).count(), 3);

    // A CSI ephemeral inline volume has no PV.
    let inline = format!("{KUBELET}/pods/{}/volumes/kubernetes.io~csi/secrets-store-inline/mount", pods[0]);
    let v = at(&s, &inline);
    assert_eq!(v.pv_name, None);
    assert_eq!(v.spec_name.as_deref(), Some("secrets-store-inline"));
    assert_eq!(v.lifecycle_mode.as_deref(), Some("Ephemeral"));
    assert_eq!(v.driver.as_deref(), Some("secrets-store.csi.k8s.io"));
    let inline_handle = format!("csi-{}", sha256_hex(&format!("{}secrets-store-inline", pods[0])));
    assert_eq!(v.volume_handle.as_deref(), Some(inline_handle.as_str()));
}

#[test]
fn raw_block_volume_and_its_loop_backing_file() {
    let s = fixture("raw-block");
    assert_eq!(s.warnings, vec![]);
    let pv = "pvc-c3a9d1e5-7b2f-4e8a-9c0d-1e2f3a4b5c6d";
    let pod = "4f3e2d1c-0b9a-4887-9665-544332211000";
    let handle = ceph_handle("93b1f0a2-5c3d-11ee-b1e4-0a580a800023");
    let vd = format!("{KUBELET}/plugins/kubernetes.io/csi/volumeDevices");
    let map_file = format!("{vd}/{pv}/dev/{pod}");
    let publish = format!("{vd}/publish/{pv}/{pod}");
    let data = PathBuf::from(format!("{vd}/{pv}/data/vol_data.json"));
    for (path, kind, pod_uid) in [
        (map_file.clone(), VolumeKind::BlockMapFile, Some(pod)),
        (publish.clone(), VolumeKind::BlockPublish, Some(pod)),
        (format!("{vd}/staging/{pv}"), VolumeKind::BlockStaging, None),
        (
            format!("{KUBELET}/pods/{pod}/volumeDevices/kubernetes.io~csi/{pv}"),
            VolumeKind::PodDevice,
            Some(pod),
        ),
    ] {
        let v = at(&s, &path);
        assert_eq!(v.kind, kind, "{path}");
        assert_eq!(v.pv_name.as_deref(), Some(pv), "{path}");
        assert_eq!(v.pod_uid.as_deref(), pod_uid, "{path}");
        assert_eq!(v.volume_handle.as_deref(), Some(handle.as_str()), "{path}");
        assert_eq!(v.driver.as_deref(), Some(DRIVER), "{path}");
        assert_eq!(v.vol_data.as_ref(), Some(&data), "{path}");
        assert_eq!(v.devnum, None, "fixture files are not device nodes");
    }
    assert_eq!(s.volumes.len(), 4);
    let link = at(&s, &format!("{KUBELET}/pods/{pod}/volumeDevices/kubernetes.io~csi/{pv}"));
    assert_eq!(link.link_target, Some(PathBuf::from(&publish)));
    assert_eq!(s.pods_using(pv), vec![pod]);

    // What sysfs shows as the loop device's backing file.
    assert_eq!(s.find_by_backing_file(&map_file).map(|v| v.kind), Some(VolumeKind::BlockMapFile));
    let deleted = format!("{map_file} (deleted)");
    assert_eq!(s.find_by_backing_file(&deleted).map(|v| &v.path), Some(&PathBuf::from(&map_file)));
    assert!(s.find_by_backing_file(&publish).is_none(), "only map files are loop backing files");
    // ceph-csi bind-mounts the device at staging/<pv>/<volumeHandle>.
    let staged = format!("{vd}/staging/{pv}/{handle}");
    assert_eq!(s.find_by_mount_point(&staged).map(|v| v.kind), Some(VolumeKind::BlockStaging));
    assert_eq!(s.find_by_mount_point(&map_file).map(|v| v.kind), Some(VolumeKind::BlockMapFile));
}

#[test]
fn in_tree_rbd_mounts_and_devices() {
    let s = fixture("in-tree-rbd");
    assert_eq!(s.warnings, vec![]);
    let image = "kubernetes-dynamic-pvc-0a5eb91b-8a0b-11e8-9a3b-fa163e6f1a5c";
    let global = format!("{KUBELET}/plugins/kubernetes.io/rbd/mounts/k8s-image-{image}");
    let g = at(&s, &global);
    assert_eq!(g.kind, VolumeKind::InTreeRbd);
    assert_eq!(g.plugin, "kubernetes.io/rbd");
    assert_eq!(g.rbd, Some(RbdImage { pool: "k8s".into(), image: image.into() }));
    assert!(g.names_rbd_image("k8s", image));
    assert!(!g.names_rbd_image("k8s", "other"));
    // Left by an old kubelet: rbd/rbd/, with a pool that has a dash.
    let old = at(&s, &format!("{KUBELET}/plugins/kubernetes.io/rbd/rbd/rbd-k8s-image-cephimage2"));
    assert_eq!(old.rbd, Some(RbdImage { pool: "rbd-k8s".into(), image: "cephimage2".into() }));

    let pod = "5d1c7c2e-8a0b-11e8-9a3b-fa163e6f1a5c";
    let pv = "pvc-0a5eb91b-8a0b-11e8-9a3b-fa163e6f1a5c";
    let m = at(&s, &format!("{KUBELET}/pods/{pod}/volumes/kubernetes.io~rbd/{pv}"));
    assert_eq!((m.kind, m.plugin.as_str()), (VolumeKind::PodMount, "kubernetes.io/rbd"));
    assert_eq!((m.spec_name.as_deref(), m.pv_name.as_deref()), (Some(pv), None));
    assert_eq!(m.pod_uid.as_deref(), Some(pod));

    let pod_e = "6e2d8d3f-8a0b-11e8-9a3b-fa163e6f1a5c";
    let image_e = "kubernetes-dynamic-pvc-3c9e0d7a-8a0b-11e8-9a3b-fa163e6f1a5c";
    let map =
        at(&s, &format!("{KUBELET}/plugins/kubernetes.io/rbd/volumeDevices/k8s-image-{image_e}/{pod_e}"));
    assert_eq!(map.kind, VolumeKind::BlockMapFile);
    assert_eq!(map.rbd, Some(RbdImage { pool: "k8s".into(), image: image_e.into() }));
    assert!(map.names_rbd_image("k8s", image_e));
    assert_eq!(map.pod_uid.as_deref(), Some(pod_e));
    let dev = at(
        &s,
        &format!(
            "{KUBELET}/pods/{pod_e}/volumeDevices/kubernetes.io~rbd/pvc-3c9e0d7a-8a0b-11e8-9a3b-fa163e6f1a5c"
        ),
    );
    assert_eq!(dev.link_target, Some(PathBuf::from("/dev/rbd1")));
    assert_eq!(dev.pv_name, None);
    assert_eq!(s.volumes.len(), 5);

    // Field-notes incident 5: node_exporter mounts the host at /host and keeps its own copy.
    let seen = format!("/host/var/lib/kubelet/plugins/kubernetes.io/rbd/mounts/k8s-image-{image}");
    assert_eq!(s.find_by_foreign_path(&seen).map(|v| &v.path), Some(&PathBuf::from(&global)));
    assert_eq!(s.find_by_foreign_path("/host/var/lib/kubelet/plugins/kubernetes.io/rbd/mounts"), None);
    assert_eq!(s.find_by_mount_point(&seen), None, "not a host path");
}

#[test]
fn malformed_files_are_warnings_and_the_scan_goes_on() {
    let s = fixture("malformed");
    let base = format!("{KUBELET}/pods/0c0ffee0-1234-4abc-8def-0123456789ab/volumes/kubernetes.io~csi");
    let file = |name: &str| PathBuf::from(format!("{base}/{name}/vol_data.json"));
    let vol_data_error = |name: &str| {
        s.warnings.iter().find_map(|w| match w {
            KubeletWarning::VolData { path, error } if *path == file(name) => Some(error.clone()),
            _ => None,
        })
    };
    assert!(matches!(vol_data_error("pvc-truncated"), Some(VolDataError::Json { .. })));
    assert!(matches!(vol_data_error("pvc-empty"), Some(VolDataError::Json { .. })));
    assert_eq!(vol_data_error("pvc-no-driver"), Some(VolDataError::Missing { field: "driverName" }));
    assert_eq!(vol_data_error("pvc-number"), Some(VolDataError::NotAString { field: "volumeHandle" }));
    let missing = PathBuf::from(format!("{base}/pvc-no-vol-data"));
    assert!(s.warnings.contains(&KubeletWarning::MissingVolData { path: missing }));
    let bad_rbd = PathBuf::from(format!("{KUBELET}/plugins/kubernetes.io/rbd/mounts/not-an-rbd-mount"));
    assert!(s.warnings.iter().any(|w| matches!(w, KubeletWarning::BadName { path, .. } if *path == bad_rbd)));
    assert_eq!(s.warnings.len(), 7, "{:#?}", s.warnings);
    // Every warning names its file.
    for w in &s.warnings {
        assert!(w.to_string().contains(KUBELET), "{w}");
    }

    // Entries are kept, with what is known.
    let truncated = at(&s, &format!("{base}/pvc-truncated/mount"));
    assert_eq!((truncated.volume_handle.as_ref(), truncated.pv_name.as_ref()), (None, None));
    assert_eq!(truncated.spec_name.as_deref(), Some("pvc-truncated"));
    assert!(at(&s, &bad_rbd.to_string_lossy()).rbd.is_none());
    let ok = at(&s, &format!("{base}/pvc-11111111-2222-4333-8444-555555555555/mount"));
    assert_eq!(ok.driver.as_deref(), Some(DRIVER));
    assert_eq!(s.volumes.len(), 8);
}

#[test]
fn staging_directory_must_be_sha256_of_the_handle() {
    let s = fixture("malformed");
    let named_for = ceph_handle("bb22cc33-6d5e-11ee-8f00-0a580a800025");
    let recorded = ceph_handle("cc33dd44-6d5e-11ee-8f00-0a580a800026");
    let dir = sha256_hex(&named_for);
    let w = s.warnings.iter().find(|w| matches!(w, KubeletWarning::HashMismatch { .. })).expect("mismatch");
    let file = PathBuf::from(format!("{KUBELET}/plugins/kubernetes.io/csi/{DRIVER}/{dir}/vol_data.json"));
    assert_eq!(
        w,
        &KubeletWarning::HashMismatch { path: file, dir: dir.clone(), expected: sha256_hex(&recorded) }
    );
    // The staging entry is still there, with the handle its file records.
    let stage = at(&s, &format!("{KUBELET}/plugins/kubernetes.io/csi/{DRIVER}/{dir}/globalmount"));
    assert_eq!(stage.volume_handle.as_deref(), Some(recorded.as_str()));
    // FIPS 180-2 test vectors.
    assert_eq!(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    assert_eq!(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

#[test]
fn missing_kubelet_directory_is_empty() {
    let s = scan(&HostRoot::new("/nonexistent"), Path::new(DEFAULT_KUBELET_DIR)).expect("no kubelet");
    assert_eq!((s.volumes.len(), s.warnings.len()), (0, 0));
    // A tree with a kubelet directory elsewhere than asked.
    let s = scan(&HostRoot::new(format!("{FIXTURES}/pre-1.24")), Path::new("/data/kubelet")).expect("scan");
    assert_eq!((s.volumes.len(), s.warnings.len()), (0, 0));
    // A file where the directory should be is an error naming it.
    let tmp = tempfile::tempdir().expect("tempdir");
    std::fs::write(tmp.path().join("kubelet"), "").expect("write");
    let e = scan(&HostRoot::new(tmp.path()), Path::new("/kubelet")).expect_err("not a directory");
    assert!(e.to_string().contains("kubelet"), "{e}");
}

#[test]
fn vol_data_parser() {
    let kubelet = r#"{"attachmentID":"csi-1","driverName":"rbd.csi.ceph.com","nodeName":"mec52","specVolID":"pvc-1","volumeHandle":"0001-x","volumeLifecycleMode":"Persistent"}"#;
    let d = parse_vol_data(kubelet).expect("kubelet's own text");
    assert_eq!(d.spec_vol_id.as_deref(), Some("pvc-1"));
    assert_eq!(d.volume_handle.as_deref(), Some("0001-x"));
    assert_eq!(d.driver_name.as_deref(), Some("rbd.csi.ceph.com"));
    assert_eq!(d.node_name.as_deref(), Some("mec52"));
    assert_eq!(d.attachment_id.as_deref(), Some("csi-1"));
    assert_eq!(d.volume_lifecycle_mode.as_deref(), Some("Persistent"));
    let staging = r#"{"driverName":"d","seLinuxMountContext":"system_u:object_r:container_file_t:s0","volumeHandle":"h","future":{"x":1}}"#;
    let d = parse_vol_data(staging).expect("staging with a newer and an unknown key");
    assert_eq!(d.selinux_mount_context.as_deref(), Some("system_u:object_r:container_file_t:s0"));
    assert_eq!(d.spec_vol_id, None);
    let d = parse_vol_data(r#"{"driverName":"d","volumeHandle":"h","nodeName":"","specVolID":null}"#)
        .expect("ok");
    assert_eq!((d.node_name, d.spec_vol_id), (None, None));

    for (text, want) in [
        ("", "json"),
        ("{", "json"),
        (r#"{"driverName":"d","volumeHandle":"h"} x"#, "json"),
        ("[]", "object"),
        ("\"x\"", "object"),
        (r#"{"driverName":"d"}"#, "missing volumeHandle"),
        (r#"{"volumeHandle":"h"}"#, "missing driverName"),
        (r#"{"driverName":"d","volumeHandle":""}"#, "missing volumeHandle"),
        (r#"{"driverName":["d"],"volumeHandle":"h"}"#, "type"),
    ] {
        let e = parse_vol_data(text).expect_err(text);
        let got = match &e {
            VolDataError::Json { .. } => "json".to_owned(),
            VolDataError::NotAnObject => "object".to_owned(),
            VolDataError::Missing { field } => format!("missing {field}"),
            VolDataError::NotAString { .. } => "type".to_owned(),
            other => other.to_string(),
        };
        assert_eq!(got, want, "{text}: {e}");
    }
}

#[test]
fn rbd_directory_names() {
    let p = |s| parse_rbd_dir_name(s).map(|r| (r.pool, r.image));
    assert_eq!(
        p("k8s-image-kubernetes-dynamic-pvc-1"),
        Some(("k8s".into(), "kubernetes-dynamic-pvc-1".into()))
    );
    assert_eq!(p("rbd-k8s-image-cephimage2"), Some(("rbd-k8s".into(), "cephimage2".into())));
    assert_eq!(p("k8s-rbd-image-a-image-b"), Some(("k8s-rbd".into(), "a-image-b".into())));
    assert_eq!(p("kubernetes-image-rbd.img"), Some(("kubernetes".into(), "rbd.img".into())));
    for bad in ["", "k8s", "-image-x", "k8s-image-", "k8s-imagex"] {
        assert_eq!(p(bad), None, "{bad}");
    }
    // A pool ending in "-image" is ambiguous; the whole name still matches.
    assert_eq!(p("a-image-image-x"), Some(("a".into(), "image-x".into())));
    let mut v = KubeletVolume::new(
        VolumeKind::InTreeRbd,
        PathBuf::from("/var/lib/kubelet/plugins/kubernetes.io/rbd/mounts/a-image-image-x"),
        RBD_PLUGIN,
    );
    v.rbd = parse_rbd_dir_name("a-image-image-x");
    assert!(v.names_rbd_image("a-image", "x"));
    assert!(v.names_rbd_image("a", "image-x"));
    assert!(!v.names_rbd_image("a", "x"));
}

/// Builds files under a temporary host root.
fn host_tree(files: &[(&str, &str)], links: &[(&str, &str)]) -> tempfile::TempDir {
    let tmp = tempfile::tempdir().expect("tempdir");
    for (path, text) in files {
        let p = tmp.path().join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(&p, text).expect("write");
    }
    for (path, target) in links {
        let p = tmp.path().join(path.trim_start_matches('/'));
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::os::unix::fs::symlink(target, &p).expect("symlink");
    }
    tmp
}

#[test]
fn kubelet_directory_symlink_resolves_through_the_host_root() {
    // /var/lib/kubelet -> /data/kubelet: an absolute target is the host's, not ours.
    let vd = r#"{"driverName":"d","specVolID":"pv1","volumeHandle":"h","volumeLifecycleMode":"Persistent"}"#;
    let tmp = host_tree(
        &[("/data/kubelet/pods/u1/volumes/kubernetes.io~csi/pv1/vol_data.json", vd)],
        &[("/var/lib/kubelet", "/data/kubelet")],
    );
    let s = scan(&HostRoot::new(tmp.path()), Path::new(DEFAULT_KUBELET_DIR)).expect("scan");
    assert_eq!(s.kubelet_dir, Path::new("/data/kubelet"));
    let mount = "/data/kubelet/pods/u1/volumes/kubernetes.io~csi/pv1/mount";
    assert_eq!(s.volumes.iter().map(|v| v.path.to_string_lossy().into_owned()).collect::<Vec<_>>(), [mount]);
    assert_eq!(s.find_by_mount_point(mount).map(|v| v.pv_name.as_deref()), Some(Some("pv1")));
}

#[test]
fn shared_volume_handle_leaves_staging_pv_unknown() {
    // kubernetes#105899: two PVs with one handle share a 1.24+ staging directory.
    let pod = |pv: &str| {
        format!(
            r#"{{"driverName":"d","specVolID":"{pv}","volumeHandle":"h","volumeLifecycleMode":"Persistent"}}"#
        )
    };
    let (a, b) = (pod("pv-a"), pod("pv-b"));
    let stage = format!("/var/lib/kubelet/plugins/kubernetes.io/csi/d/{}/vol_data.json", sha256_hex("h"));
    let tmp = host_tree(
        &[
            ("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pv-a/vol_data.json", &a),
            ("/var/lib/kubelet/pods/u2/volumes/kubernetes.io~csi/pv-b/vol_data.json", &b),
            (&stage, r#"{"driverName":"d","volumeHandle":"h"}"#),
        ],
        &[],
    );
    let s = scan(&HostRoot::new(tmp.path()), Path::new(DEFAULT_KUBELET_DIR)).expect("scan");
    assert_eq!(s.warnings, vec![]);
    let staging: Vec<_> = s.volumes.iter().filter(|v| v.kind == VolumeKind::Staging).collect();
    assert_eq!(staging.len(), 1);
    assert_eq!(staging[0].pv_name, None);
    assert_eq!((s.pods_using("pv-a"), s.pods_using("pv-b")), (vec!["u1"], vec!["u2"]));
}

#[test]
fn raw_block_device_number_on_a_live_node() {
    // Any block device node of this machine stands in for the rbd device.
    let Some((name, rdev)) = std::fs::read_dir("/dev").ok().and_then(|rd| {
        rd.filter_map(|e| e.ok()).find_map(|e| {
            let m = e.metadata().ok()?;
            m.file_type().is_block_device().then(|| (e.file_name().to_string_lossy().into_owned(), m.rdev()))
        })
    }) else {
        eprintln!("no block device node in /dev: skipped");
        return;
    };
    let target = format!("/dev/{name}");
    let tmp = host_tree(&[], &[("/var/lib/kubelet/pods/u1/volumeDevices/kubernetes.io~rbd/pv1", &target)]);
    let host = HostRoot::new(tmp.path()).with_dev("/dev");
    let s = scan(&host, Path::new(DEFAULT_KUBELET_DIR)).expect("scan");
    assert_eq!(s.volumes.len(), 1);
    let dev = DevNum::from_dev_t(rdev);
    assert_eq!(s.volumes[0].devnum, Some(dev));
    assert_eq!(s.find_by_devnum(dev).len(), 1);
}

#[test]
fn subpaths_and_old_publish_files() {
    let data = r#"{"attachmentID":"a","driverName":"d","nodeName":"n","specVolID":"pv1","volumeHandle":"h"}"#;
    let tmp = host_tree(
        &[
            ("/var/lib/kubelet/pods/u1/volume-subpaths/data/app/0", ""),
            ("/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/pv1/data/vol_data.json", data),
            // Before 1.18 the publish path was a file per PV.
            ("/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv1", ""),
        ],
        &[],
    );
    let s = scan(&HostRoot::new(tmp.path()), Path::new(DEFAULT_KUBELET_DIR)).expect("scan");
    assert_eq!(s.warnings, vec![]);
    let sub = at(&s, "/var/lib/kubelet/pods/u1/volume-subpaths/data/app/0");
    assert_eq!(
        (sub.kind, sub.spec_name.as_deref(), sub.pod_uid.as_deref()),
        (VolumeKind::PodSubpath, Some("data"), Some("u1"))
    );
    let publish = at(&s, "/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/pv1");
    assert_eq!((publish.kind, publish.pod_uid.as_deref()), (VolumeKind::BlockPublish, None));
    assert_eq!(publish.volume_handle.as_deref(), Some("h"));
}
