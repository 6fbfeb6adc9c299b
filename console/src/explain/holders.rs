//! Who holds a device, for a person: the agent's holder records (pid, command, mount namespace,
//! mount point, the pod uid and container id its cgroup names) joined to the pods the console
//! read from the API on that node, so a holder is `pod shop/node-exporter-x7k2p, container
//! node-exporter`, not a uid.

use std::collections::HashMap;

use blockjanitor_proto::v1 as pb;
use k8s_openapi::api::core::v1::Pod;

/// Pods by uid (those on the nodes whose devices are held).
pub type Pods = HashMap<String, Pod>;

/// `NAMESPACE/NAME` of a pod.
pub fn pod_key(p: &Pod) -> String {
    format!("{}/{}", p.metadata.namespace.as_deref().unwrap_or(""), p.metadata.name.as_deref().unwrap_or(""))
}

/// The name of the container whose id is `id` (`containerd://ID`, `cri-o://ID` in the status).
fn container_name(p: &Pod, id: &str) -> String {
    if id.is_empty() {
        return String::new();
    }
    let status = p.status.as_ref();
    let all = status.into_iter().flat_map(|s| {
        s.container_statuses.iter().flatten().chain(s.init_container_statuses.iter().flatten())
    });
    for c in all {
        if c.container_id.as_deref().is_some_and(|cid| cid.rsplit("://").next() == Some(id)) {
            return c.name.clone();
        }
    }
    String::new()
}

fn kind_name(raw: i32) -> String {
    blockjanitor_rpc::view::names::holder_kind_name(raw)
}

/// One device's holders on `node`, named; the processes first (a mount's "processes" are those
/// living in its namespace, pid 1 for the host's: the process that uses the volume says more).
pub fn of_device(node: &str, d: &pb::Device, pods: &Pods) -> Vec<pb::ExplainHolder> {
    let mut out: Vec<pb::ExplainHolder> = d
        .holders
        .iter()
        .map(|h| {
            let pod = pods.get(&h.pod_uid);
            pb::ExplainHolder {
                node: node.to_owned(),
                device: d.name.clone(),
                kind: kind_name(h.kind),
                pid: h.pids.first().copied().unwrap_or(0),
                command: h.comm.clone(),
                pod: pod.map(pod_key).unwrap_or_default(),
                pod_uid: h.pod_uid.clone(),
                container: pod.map(|p| container_name(p, &h.container_id)).unwrap_or_default(),
                container_id: h.container_id.clone(),
                mount_namespace: h.mount_namespace,
                in_host_namespace: h.in_host_namespace,
                mount_point: h.mount_point.clone(),
                description: h.description.clone(),
            }
        })
        .collect();
    out.sort_by_key(|h| h.kind == "mount");
    out
}

/// A holder in one line: `pid 21839 (node_exporter) in pod monitoring/node-exporter-x7k2p,
/// container node-exporter, mount namespace 4026532845 (not the host's): DESCRIPTION`.
pub fn line(h: &pb::ExplainHolder) -> String {
    let mut s = if h.pid > 0 { format!("pid {} ({})", h.pid, h.command) } else { format!("a {}", h.kind) };
    match (h.pod.is_empty(), h.pod_uid.is_empty()) {
        (false, _) => s.push_str(&format!(" in pod {}", h.pod)),
        (true, false) => s.push_str(&format!(" in pod uid {} (not found on the node)", h.pod_uid)),
        (true, true) => s.push_str(" (no pod: a process of the host)"),
    }
    if !h.container.is_empty() {
        s.push_str(&format!(", container {}", h.container));
    } else if !h.container_id.is_empty() {
        s.push_str(&format!(", container id {}", &h.container_id[..h.container_id.len().min(12)]));
    }
    if h.mount_namespace > 0 {
        let whose = if h.in_host_namespace { "the host's" } else { "not the host's" };
        s.push_str(&format!(", mount namespace {} ({whose})", h.mount_namespace));
    }
    // The agent's sentence often starts with the process it names: say it once.
    let prefix = format!("pid {} ({}) ", h.pid, h.command);
    let description = h.description.strip_prefix(&prefix).unwrap_or(&h.description);
    if !description.is_empty() {
        s.push_str(&format!(": {description}"));
    }
    s
}

/// Whether only private copies of its mount in other mount namespaces hold `d` (incident 5):
/// every holder a mount outside the host's namespace, nothing stacked on it.
pub fn private_copies_only(d: &pb::Device) -> bool {
    !d.holders.is_empty()
        && d.stacked_on_top.is_empty()
        && d.holders.iter().all(|h| h.kind == pb::HolderKind::Mount as i32 && !h.in_host_namespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_holder_is_named_by_its_pod_and_container() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "node-exporter-x7k2p", "namespace": "monitoring", "uid": "0a5eb91b-7c1e-4f0e-9d3b-2b1f0e0c1d2e"},
            "spec": {"containers": []},
            "status": {"containerStatuses": [{"name": "node-exporter", "containerID": "containerd://3f1c2b9a", "image": "x",
                       "imageID": "", "ready": true, "restartCount": 0}]}
        }))
        .expect("pod");
        let pods: Pods = [("0a5eb91b-7c1e-4f0e-9d3b-2b1f0e0c1d2e".to_owned(), pod)].into_iter().collect();
        let d = pb::Device {
            name: "loop3".into(),
            holders: vec![pb::Holder {
                kind: pb::HolderKind::Mount as i32,
                pids: vec![21839],
                comm: "node_exporter".into(),
                pod_uid: "0a5eb91b-7c1e-4f0e-9d3b-2b1f0e0c1d2e".into(),
                container_id: "3f1c2b9a".into(),
                mount_namespace: 4026532845,
                mount_point: "/host/var/lib/kubelet/x".into(),
                description: "mounted at /host/var/lib/kubelet/x".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let h = of_device("node-old", &d, &pods);
        assert_eq!(
            (h[0].pod.as_str(), h[0].container.as_str()),
            ("monitoring/node-exporter-x7k2p", "node-exporter")
        );
        assert_eq!(
            line(&h[0]),
            "pid 21839 (node_exporter) in pod monitoring/node-exporter-x7k2p, container node-exporter, mount namespace \
             4026532845 (not the host's): mounted at /host/var/lib/kubelet/x"
        );
        assert!(private_copies_only(&d));
        let unknown = of_device("node-old", &d, &Pods::new());
        assert!(line(&unknown[0])
            .contains("in pod uid 0a5eb91b-7c1e-4f0e-9d3b-2b1f0e0c1d2e (not found on the node)"));
    }
}
