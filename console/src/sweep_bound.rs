//! A Sweep answer kept under a size: at 5,000 nodes, with many nodes unanswered, the findings
//! carry every last-seen device and one answer passed gRPC's 64 MiB (issue 36's bench), so every
//! Sweep failed. Over [`SWEEP_BYTES`], the findings' device records go first (each finding still
//! names its volume, nodes and why), then, when that is not enough, the findings past the size;
//! `counts` always counts every finding, and `summary` says what was left out and how to see it.

use blockjanitor_proto::v1 as pb;
use prost::Message;

/// The most a Sweep answer holds, encoded: several callers' answers at once stay a small part of
/// a replica's memory, and far under any client's 64 MiB.
pub const SWEEP_BYTES: usize = 8 << 20;

/// Bytes kept for what the summary says about a cut.
const SUMMARY_ROOM: usize = 1024;

/// Cuts `r` to at most `limit` bytes encoded (see the module doc); a no-op when it fits.
pub fn bound(r: &mut pb::SweepResponse, limit: usize) {
    let before = r.encoded_len();
    if before <= limit {
        return;
    }
    let devices: usize = r.findings.iter().map(|f| f.devices.len()).sum();
    for f in &mut r.findings {
        f.devices.clear();
    }
    let mut said = vec![format!(
        "the answer would be {} MiB, over {} MiB: the findings' {devices} device record(s) are left out \
         (`fleet where VOLUME` lists a volume's devices)",
        before >> 20,
        limit >> 20
    )];
    if r.encoded_len() > limit {
        let all = r.findings.len();
        // What the rest of the answer takes, and room for the summary's lines about the cut.
        let rest = r.encoded_len() - findings_len(&r.findings) + SUMMARY_ROOM;
        let room = limit.saturating_sub(rest);
        let mut used = 0;
        let kept = r
            .findings
            .iter()
            .take_while(|f| {
                used += field_len(f);
                used <= room
            })
            .count();
        r.findings.truncate(kept);
        said.push(format!(
            "{kept} of {all} findings listed (by kind, then volume; `counts` has them all): ask for one kind \
             (`fleet sweep --kind KIND`) for the rest"
        ));
    }
    r.summary = format!("{}; {}", r.summary, said.join("; "));
}

/// The encoded bytes of `findings` as the answer's repeated field.
fn findings_len(findings: &[pb::Finding]) -> usize {
    findings.iter().map(field_len).sum()
}

/// One finding's bytes in the repeated field: its tag, its length and itself.
fn field_len(f: &pb::Finding) -> usize {
    let len = f.encoded_len();
    1 + prost::length_delimiter_len(len) + len
}

#[cfg(test)]
mod tests {
    use super::*;

    fn device(i: usize) -> pb::FleetDevice {
        pb::FleetDevice { node: format!("node-{i:04}"), ..Default::default() }
    }

    fn finding(i: usize, devices: usize) -> pb::Finding {
        pb::Finding {
            kind: pb::FindingKind::AttachedNotInUse as i32,
            volume: format!("k8s/csi-vol-{i:06}"),
            nodes: vec![format!("node-{i:04}")],
            devices: (0..devices).map(device).collect(),
            detail: "attached to node-x, and no pod there uses it".repeat(4),
            ..Default::default()
        }
    }

    fn answer(findings: usize, devices: usize) -> pb::SweepResponse {
        pb::SweepResponse {
            findings: (0..findings).map(|i| finding(i, devices)).collect(),
            summary: format!("{findings} finding(s)"),
            ..Default::default()
        }
    }

    #[test]
    fn an_answer_that_fits_is_left_as_it_is() {
        let mut r = answer(10, 3);
        let whole = r.clone();
        bound(&mut r, SWEEP_BYTES);
        assert_eq!(r, whole);
    }

    #[test]
    fn device_records_go_first_and_the_summary_says_so() {
        let mut r = answer(200, 40);
        let limit = r.encoded_len() / 2;
        bound(&mut r, limit);
        assert!(r.encoded_len() <= limit, "{} > {limit}", r.encoded_len());
        assert_eq!(r.findings.len(), 200, "every finding kept");
        assert!(r.findings.iter().all(|f| f.devices.is_empty() && !f.nodes.is_empty()));
        assert!(r.summary.starts_with("200 finding(s); the answer would be"), "{}", r.summary);
        assert!(r.summary.contains("8000 device record(s) are left out"), "{}", r.summary);
    }

    #[test]
    fn findings_past_the_size_go_next_in_order_and_the_summary_counts_them() {
        let mut r = answer(5_000, 1);
        let limit = 64 << 10;
        bound(&mut r, limit);
        assert!(r.encoded_len() <= limit, "{} > {limit}", r.encoded_len());
        let kept = r.findings.len();
        assert!(kept > 0 && kept < 5_000, "{kept}");
        assert_eq!(r.findings.last().map(|f| f.volume.clone()), Some(format!("k8s/csi-vol-{:06}", kept - 1)));
        assert!(r.summary.contains(&format!("{kept} of 5000 findings listed")), "{}", r.summary);
    }
}
