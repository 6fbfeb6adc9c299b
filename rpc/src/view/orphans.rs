//! Orphaned pod volume directories (`ListDevicesResponse.orphaned_volume_dirs`) for people and
//! for documents: the section `scan` prints after its devices, in both CLIs, and each one's
//! JSON value (the `orphaned_volume_dirs` list of the `devices` document).

use blockjanitor_proto::v1 as pb;
use serde_json::{json, Value};

use crate::view::table::{clean, columns, cut, is_wide};

/// Width of the WHY column.
const WHY_WIDTH: usize = 70;

/// The section after the devices table: a heading, then one row per directory (VERDICT, POD,
/// VOLUME, CONTENT, WHY) and, for every one that is not removable, what to check. Empty when
/// there is nothing to say.
pub fn section(r: &pb::ListDevicesResponse) -> String {
    if !r.orphaned_volume_dirs_unknown.is_empty() {
        return format!(
            "\norphaned pod volume directories: unknown ({})\n",
            clean(&r.orphaned_volume_dirs_unknown)
        );
    }
    if r.orphaned_volume_dirs.is_empty() {
        return String::new();
    }
    let rows: Vec<Vec<String>> = r
        .orphaned_volume_dirs
        .iter()
        .map(|d| {
            let why =
                if is_wide() { d.reasons.join("; ") } else { d.reasons.last().cloned().unwrap_or_default() };
            vec![
                clean(&d.verdict),
                cut(&clean(&d.pod_uid), 36),
                cut(&clean(&format!("{} {}/{}", d.kind, d.plugin, d.name)), 48),
                cut(&clean(&d.content), 30),
                cut(&clean(&why), WHY_WIDTH),
            ]
        })
        .collect();
    let mut out = format!(
        "\norphaned pod volume directories ({}; `clean ARGUMENT` removes a removable one with rmdir):\n",
        r.orphaned_volume_dirs.len()
    );
    out.push_str(&columns(&["VERDICT", "POD", "VOLUME", "CONTENT", "WHY"], &rows));
    for d in &r.orphaned_volume_dirs {
        let advice = if d.advice.is_empty() { String::new() } else { format!(": {}", clean(&d.advice)) };
        out.push_str(&format!("  {} {}{advice}\n", clean(&d.verdict), clean(&d.argument)));
    }
    out
}

/// One directory's JSON value.
pub fn orphaned_dir_value(d: &pb::OrphanedVolumeDir) -> Value {
    json!({
        "argument": d.argument,
        "path": d.path,
        "pod_uid": d.pod_uid,
        "kind": d.kind,
        "plugin": d.plugin,
        "name": d.name,
        "verdict": d.verdict,
        "reasons": d.reasons,
        "advice": d.advice,
        "mounts": d.mounts,
        "content": d.content,
        "identity": d.identity,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_to_say_is_nothing_a_directory_is_a_row_with_its_advice() {
        let mut r = pb::ListDevicesResponse::default();
        assert_eq!(section(&r), "");
        r.orphaned_volume_dirs_unknown = "cannot read /var/lib/kubelet".into();
        assert!(section(&r).contains("unknown (cannot read /var/lib/kubelet)"));
        r.orphaned_volume_dirs_unknown.clear();
        r.orphaned_volume_dirs.push(pb::OrphanedVolumeDir {
            argument: "pod-volume:u1/volumes/kubernetes.io~csi/pvc-1".into(),
            pod_uid: "u1".into(),
            kind: "volume".into(),
            plugin: "kubernetes.io/csi".into(),
            name: "pvc-1".into(),
            verdict: "mounted".into(),
            reasons: vec!["no pod".into(), "still mounted: mount 9 at /x in mount namespace 4".into()],
            advice: "never rm -rf it".into(),
            content: "empty (2 directories)".into(),
            ..Default::default()
        });
        let s = section(&r);
        assert!(s.contains("VERDICT  POD"), "{s}");
        assert!(s.contains("mounted  u1   volume kubernetes.io/csi/pvc-1"), "{s}");
        assert!(s.contains("still mounted: mount 9"), "{s}");
        assert!(
            s.contains("  mounted pod-volume:u1/volumes/kubernetes.io~csi/pvc-1: never rm -rf it"),
            "{s}"
        );
        assert_eq!(orphaned_dir_value(&r.orphaned_volume_dirs[0])["verdict"], "mounted");
    }
}
