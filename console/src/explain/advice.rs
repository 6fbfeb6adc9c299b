//! The next steps an explanation prints, each ready to paste with what it changes and the warning
//! it carries (design.md: "every command printed is a dry run or says what it changes"). Explain
//! carries none of them out; the console and the agents never fence.
//!
//! Dead-node advice (gotchas 32-34), only for a node believed dead (never while its agent
//! answers): `ceph osd blocklist add` of each exact client instance `IP:0/NONCE` the node's last
//! view names (never the whole IP; the default expiry is one hour), a CSI-Addons NetworkFence for
//! the node's addresses with the unfence order (set `Unfenced`, wait for `Succeeded`, then
//! delete: deleting alone does not unfence), and the `node.kubernetes.io/out-of-service` taint
//! (only once the machine is really off; removed after).

use blockjanitor_proto::v1 as pb;
use k8s_openapi::api::core::v1::Pod;

use super::volumes::Volume;

fn advice(command: impl Into<String>, note: impl Into<String>) -> pb::Advice {
    pb::Advice { command: command.into(), note: note.into(), manifest: String::new() }
}

/// The agent's plan for the device and, once it shows what it will do, carrying it out.
pub fn clean(node: &str, dev: &str) -> Vec<pb::Advice> {
    vec![
        advice(
            format!("kubectl blockjanitor plan {node}/{dev}"),
            format!("a dry run: the agent's plan to tear {dev} down on {node} (unmap, detach...), or why it refuses; changes nothing"),
        ),
        advice(
            format!("kubectl blockjanitor apply {node}/{dev} --yes"),
            "shows that plan again and carries it out, bound to what it showed (on behalf of you; audited; \
             a refusal in it stops everything): the device goes, and kubelet and the attach/detach controller \
             can then let the volume go",
        ),
    ]
}

/// The agent's `release` of the private copies of a device's mount, on its node.
pub fn release(node: &str, dev: &str, agent_pod: &str) -> Vec<pb::Advice> {
    let exec = match agent_pod.split_once('/') {
        Some((ns, pod)) => format!("kubectl -n {ns} exec {pod} -- "),
        None => format!("(on node {node}) "),
    };
    vec![
        advice(
            format!("{exec}agentctl release {dev}"),
            format!(
                "a dry run: which copies of {dev}'s mount the agent would detach, inside each holder's mount namespace \
                 (no process is killed; a mount live on the host is never touched), or why it refuses"
            ),
        ),
        advice(
            format!("{exec}agentctl release {dev} --apply"),
            format!("detaches those copies (journaled, audited); then kubelet's unmap of {dev} on {node} succeeds"),
        ),
    ]
}

/// The manifest fix for the pod whose container keeps a private copy: the container's hostPath
/// mount that contains `mount_point` gets `mountPropagation: HostToContainer` (when the pod is
/// known), so it receives the host's unmounts instead of keeping a copy.
pub fn propagation(pod: Option<&Pod>, container: &str, mount_point: &str) -> pb::Advice {
    let mut found: Option<(String, String, String)> = None;
    let spec = pod.and_then(|p| p.spec.as_ref());
    for c in
        spec.iter().flat_map(|s| s.containers.iter()).filter(|c| container.is_empty() || c.name == container)
    {
        for m in c.volume_mounts.iter().flatten() {
            let under = mount_point == m.mount_path
                || mount_point.starts_with(&format!("{}/", m.mount_path.trim_end_matches('/')))
                || m.mount_path == "/";
            let host_path = spec
                .and_then(|s| s.volumes.as_ref())
                .is_some_and(|vs| vs.iter().any(|v| v.name == m.name && v.host_path.is_some()));
            if under && host_path && found.as_ref().is_none_or(|f| f.2.len() < m.mount_path.len()) {
                found = Some((c.name.clone(), m.name.clone(), m.mount_path.clone()));
            }
        }
    }
    let who = pod.map(super::holders::pod_key).unwrap_or_else(|| "the holder's pod".into());
    let (c, name, path) = found.unwrap_or_else(|| {
        (
            if container.is_empty() { "<container>".into() } else { container.into() },
            "<host volume>".into(),
            "<path>".into(),
        )
    });
    pb::Advice {
        command: String::new(),
        note: format!(
            "the fix in pod {who}'s manifest (its owner's pod template): container {c} mounts a host path with the \
             default propagation (None), so it keeps a private copy of every mount that existed when it started; with \
             HostToContainer it receives the host's unmounts (or do not mount the host's root at all)"
        ),
        manifest: format!(
            "spec:\n  containers:\n    - name: {c}\n      volumeMounts:\n        - name: {name}\n          mountPath: {path}\n          mountPropagation: HostToContainer\n"
        ),
    }
}

/// Stopping a holder that is not a private copy.
pub fn stop_holder(h: &pb::ExplainHolder) -> pb::Advice {
    if let Some((ns, name)) = h.pod.split_once('/') {
        return advice(
            format!("kubectl -n {ns} delete pod {name} --dry-run=server"),
            format!(
                "a dry run; without --dry-run=server it deletes pod {} on {} (its controller may start it again \
                 elsewhere): only if it should no longer hold the volume there; kubelet then unmounts and unmaps it",
                h.pod, h.node
            ),
        );
    }
    if h.kind == "mount" {
        return advice(
            format!(
                "kubectl debug node/{} -it --profile=sysadmin --image=busybox -- chroot /host findmnt --target {}",
                h.node, h.mount_point
            ),
            format!(
                "read-only: what is mounted at {} on {} ({}); unmount it there only once nothing uses it: that \
                 changes the node (the mount goes), and the agent's plan then tears the device down",
                h.mount_point,
                h.node,
                if h.in_host_namespace { "in the host's mount namespace" } else { "in another mount namespace" }
            ),
        );
    }
    advice(
        format!(
            "kubectl debug node/{} -it --profile=sysadmin --image=busybox -- chroot /host ps -o pid,args -p {}",
            h.node, h.pid
        ),
        format!(
            "read-only: what pid {} ({}) on {} is; stop it the way it was started (it holds the volume: {})",
            h.pid, h.command, h.node, h.description
        ),
    )
}

/// Deleting a VolumeAttachment the controller has not let go of.
pub fn delete_va(va: &str, node: &str) -> pb::Advice {
    advice(
        format!("kubectl delete volumeattachment {va} --dry-run=server"),
        format!(
            "a dry run; without --dry-run=server it deletes the VolumeAttachment: the attacher detaches the volume \
             from {node} and the attach/detach controller can attach it where the pod waits. Safe because {node}'s \
             agent answered and nothing there maps, mounts or uses the volume"
        ),
    )
}

/// What to look at when a node cannot be asked (never fence a node whose machine may run).
pub fn look_at_agent(node: &str) -> pb::Advice {
    advice(
        format!(
            "kubectl get pods -A -l app.kubernetes.io/name=blockjanitor-agent --field-selector spec.nodeName={node} -o wide"
        ),
        format!(
            "read-only: why {node}'s agent does not answer; once it does, explain again. Do not fence {node} or taint \
             it out-of-service while its machine may run"
        ),
    )
}

/// The exact rbd client instances a node's devices name (`IP:0/NONCE`).
fn clients(devs: &[&pb::Device]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for r in devs.iter().filter_map(|d| d.rbd.as_ref()) {
        if crate::ceph_addr::client_instance(&r.client_addr).is_some()
            && !out.iter().any(|(a, _)| *a == r.client_addr)
        {
            out.push((r.client_addr.clone(), r.client_id.clone()));
        }
    }
    out
}

/// A NetworkFence for the node's addresses.
fn network_fence(node: &str, l: &pb::NodeLiveness, v: &Volume) -> pb::Advice {
    let cidrs: Vec<String> = l
        .addresses
        .iter()
        .filter_map(|a| a.parse::<std::net::IpAddr>().ok())
        .map(|ip| if ip.is_ipv4() { format!("{ip}/32") } else { format!("{ip}/128") })
        .collect();
    let cidr_lines = if cidrs.is_empty() {
        "    - <the node's IP>/32\n".to_owned()
    } else {
        cidrs.iter().map(|c| format!("    - {c}\n")).collect()
    };
    let driver = if v.driver.is_empty() || v.driver.starts_with("kubernetes.io/") {
        "<CSI driver, e.g. rbd.csi.ceph.com>"
    } else {
        &v.driver
    };
    let cluster = if v.cluster_id.is_empty() { "<clusterID>" } else { &v.cluster_id };
    pb::Advice {
        command: "kubectl apply -f networkfence.yaml".into(),
        note: format!(
            "fences every client from {node}'s addresses at the storage (CSI-Addons; the node is believed dead, so none \
             may write). To unfence: set fenceState: Unfenced, wait until status.result is Succeeded, then delete \
             it: deleting it alone does not unfence"
        ),
        manifest: format!(
            "apiVersion: csiaddons.openshift.io/v1alpha1\nkind: NetworkFence\nmetadata:\n  name: fence-{node}\nspec:\n  \
             driver: {driver}\n  fenceState: Fenced\n  cidrs:\n{cidr_lines}  secret:\n    name: <provisioner secret name>\n    \
             namespace: <provisioner secret namespace>\n  parameters:\n    clusterID: {cluster}\n"
        ),
    }
}

/// The dead-node advice for `node` (see the module docs). `devs` are its devices for the volume
/// as last seen.
pub fn fence(node: &str, l: &pb::NodeLiveness, devs: &[&pb::Device], v: &Volume) -> Vec<pb::Advice> {
    let mut out = Vec::new();
    let images: Vec<&str> = v.identity.iter().filter_map(|i| i.strip_prefix("rbd image ")).collect();
    for (addr, id) in clients(devs) {
        out.push(advice(
            format!("ceph osd blocklist add {addr}"),
            format!(
                "fences exactly {node}'s client {id} {addr} (as its agent last reported it), not the whole IP: \
                 IP:0/0 would block every client of that IP, the fencer or a new pod on a reused IP included. \
                 The entry expires after one hour by default (add seconds: `ceph osd blocklist add {addr} 86400`). \
                 Lift it (`ceph osd blocklist rm {addr}`) only once `kubectl blockjanitor who-watches {addr}` says \
                 unfence safe: yes"
            ),
        ));
    }
    if out.is_empty() && !images.is_empty() {
        out.push(advice(
            format!("rbd status {}", images[0]),
            format!(
                "read-only: the image's watchers; {node}'s client instance is not in its last view, so find the watcher \
                 from {node}'s IP and fence that exact IP:0/NONCE (`ceph osd blocklist add IP:0/NONCE`; expires after \
                 one hour by default), never the whole IP"
            ),
        ));
    }
    if !v.driver.is_empty() {
        out.push(network_fence(node, l, v));
    }
    out.push(advice(
        format!("kubectl taint nodes {node} node.kubernetes.io/out-of-service=nodeshutdown:NoExecute"),
        format!(
            "only once the machine is really off (powered off, not merely NotReady): the attach/detach controller then \
             detaches its volumes at once and its Terminating pods are force-deleted; on a machine still running, \
             filesystem corruption can occur. Remove it when {node} is back: `kubectl taint nodes {node} \
             node.kubernetes.io/out-of-service=nodeshutdown:NoExecute-`"
        ),
    ));
    out
}

/// What else to look at when nothing on any node blocks the volume.
pub fn elsewhere(pod: Option<&pb::ExplainPod>, v: &Volume) -> Vec<pb::Advice> {
    let mut out = Vec::new();
    if let Some(p) = pod {
        out.push(advice(
            format!("kubectl -n {} describe pod {}", p.namespace, p.name),
            "read-only: the pod's conditions and its events (they expire after an hour)",
        ));
    }
    if !v.pvc.is_empty() {
        if let Some((ns, name)) = v.pvc.split_once('/') {
            out.push(advice(
                format!("kubectl -n {ns} describe pvc {name}"),
                "read-only: whether the claim is bound, and its provisioner's events",
            ));
        }
    }
    let node = pod.map(|p| p.node.as_str()).filter(|n| !n.is_empty()).unwrap_or("<the pod's node>");
    out.push(advice(
        format!("kubectl get pods -A --field-selector spec.nodeName={node} -o wide"),
        format!(
            "read-only: the storage driver's node plugin on {node} ({}) and its logs say why the mount has not happened",
            if v.driver.is_empty() { "its CSI driver" } else { &v.driver }
        ),
    ));
    out
}
