//! Scenarios in the qemu guest (Debian's kernel): what this host's kernel cannot show
//! (scsi_debug disks, device-mapper multipath, nbd, rbd), with the real agent binary inside.

use blockjanitor_tests::guest::{require_guest, run_scenario};

#[test]
fn root_guest_agent_scans_a_scsi_disk_and_releases_a_foreign_mount() {
    if !require_guest() {
        return;
    }
    let run = run_scenario("agent-scan.sh");
    run.assert_ok();
    let scan: serde_json::Value = serde_json::from_str(&run.section("scan")).expect("scan JSON");
    let sda = scan["devices"]
        .as_array()
        .expect("devices")
        .iter()
        .find(|d| d["device"]["name"] == "sda")
        .unwrap_or_else(|| panic!("no sda in {scan:#}"));
    assert_eq!(sda["device"]["kind"], "disk");
    assert_eq!(sda["device"]["size_bytes"], 16 << 20);
    let holders: serde_json::Value = serde_json::from_str(&run.section("holders")).expect("holders JSON");
    let h = &holders["holders"][0];
    assert_eq!(h["kind"], "mount");
    assert_eq!(h["in_host_namespace"], false);
    assert_eq!(h["mount_point"], "/mnt/vol");
    assert_eq!(h["comm"], "sleep");
}
