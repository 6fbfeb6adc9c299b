//! Where the agents are: a static list (`node=https://host:port,...`), or the agent DaemonSet's
//! pods in the agent namespace, selected by label, kept current with a watch. Each pod gives a
//! node (`spec.nodeName`) and an address (`status.podIP` and the agent port from the console's
//! config: pods do not say which of their ports is the gRPC one). A pod with no IP yet is still
//! a node: answers name it as missing, with that reason.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use tokio::sync::watch;
use tokio_stream::StreamExt;

/// One agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentSpec {
    /// The node's name.
    pub node: String,
    /// `HOST:PORT` ("" when unknown).
    pub address: String,
    /// `static` or `kubernetes`.
    pub source: String,
    /// Why it cannot be reached, known without trying (no pod IP yet).
    pub error: Option<String>,
    /// Its pod, `NAMESPACE/NAME` ("" for a static agent): where `kubectl exec` reaches it.
    pub pod: String,
}

/// A static list could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("--agents entry '{0}' is not NODE=HOST:PORT (or NODE=https://HOST:PORT)")]
    BadEntry(String),
    #[error("--agents names node '{0}' twice")]
    Duplicate(String),
}

/// Parses `node=https://host:port,node2=host2:port` (whitespace and empty entries ignored).
pub fn parse_static(list: &str) -> Result<BTreeMap<String, AgentSpec>, DiscoverError> {
    let mut out = BTreeMap::new();
    for entry in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = || DiscoverError::BadEntry(entry.to_owned());
        let (node, url) = entry.split_once('=').ok_or_else(bad)?;
        let node = node.trim();
        let addr = url.trim().trim_start_matches("https://").trim_end_matches('/');
        if node.is_empty() || blockjanitor_rpc::client::split_host_port(addr).is_none() {
            return Err(bad());
        }
        let spec = AgentSpec {
            node: node.to_owned(),
            address: addr.to_owned(),
            source: "static".into(),
            error: None,
            pod: String::new(),
        };
        if out.insert(node.to_owned(), spec).is_some() {
            return Err(DiscoverError::Duplicate(node.to_owned()));
        }
    }
    Ok(out)
}

/// The agents the pods stand for: one per node (a pod with an IP wins over one without; then
/// the one created last, as during a rolling update).
pub fn agents_from_pods<'a>(
    pods: impl IntoIterator<Item = &'a Pod>,
    port: u16,
) -> BTreeMap<String, AgentSpec> {
    let mut best: BTreeMap<String, (bool, String, AgentSpec)> = BTreeMap::new();
    for p in pods {
        let Some(node) = p.spec.as_ref().and_then(|s| s.node_name.clone()).filter(|n| !n.is_empty()) else {
            continue; // not scheduled yet: no node to speak for
        };
        if p.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let name = p.metadata.name.clone().unwrap_or_default();
        let pod = format!("{}/{name}", p.metadata.namespace.as_deref().unwrap_or(""));
        let ip = p.status.as_ref().and_then(|s| s.pod_ip.clone()).filter(|i| !i.is_empty());
        let created = p.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string()).unwrap_or_default();
        let spec = match &ip {
            Some(ip) if ip.contains(':') => AgentSpec {
                node: node.clone(),
                address: format!("[{ip}]:{port}"),
                source: "kubernetes".into(),
                error: None,
                pod: pod.clone(),
            },
            Some(ip) => AgentSpec {
                node: node.clone(),
                address: format!("{ip}:{port}"),
                source: "kubernetes".into(),
                error: None,
                pod: pod.clone(),
            },
            None => AgentSpec {
                node: node.clone(),
                address: String::new(),
                source: "kubernetes".into(),
                error: Some(format!("the agent pod {name} has no IP yet")),
                pod: pod.clone(),
            },
        };
        let rank = (ip.is_some(), created);
        match best.get(&node) {
            Some((has_ip, c, _)) if (*has_ip, c.clone()) >= rank => {}
            _ => {
                best.insert(node, (rank.0, rank.1, spec));
            }
        }
    }
    best.into_iter().map(|(n, (_, _, s))| (n, s)).collect()
}

/// An agent pod as discovery keeps it: what [`agents_from_pods`] reads, nothing else.
fn strip(p: Pod) -> Pod {
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    Pod {
        metadata: ObjectMeta {
            name: p.metadata.name,
            namespace: p.metadata.namespace,
            creation_timestamp: p.metadata.creation_timestamp,
            deletion_timestamp: p.metadata.deletion_timestamp,
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec { node_name: p.spec.and_then(|s| s.node_name), ..PodSpec::default() }),
        status: Some(PodStatus { pod_ip: p.status.and_then(|s| s.pod_ip), ..PodStatus::default() }),
    }
}

/// Watches the agent pods in `namespace` matching `selector`; the receiver always holds the
/// current agents, and `listed` turns true once the pods were listed in full. The task ends when
/// every receiver is gone. A relist is applied in place (only the pods' names are held on the
/// side), each pod stripped to what makes an agent.
pub fn watch_pods(
    client: Client,
    namespace: &str,
    selector: &str,
    port: u16,
) -> (watch::Receiver<BTreeMap<String, AgentSpec>>, tokio::task::JoinHandle<()>, Arc<AtomicBool>) {
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let cfg = crate::cluster::paged_watch().labels(selector);
    let (tx, rx) = watch::channel(BTreeMap::new());
    let ns = namespace.to_owned();
    let listed = Arc::new(AtomicBool::new(false));
    let done = Arc::clone(&listed);
    let task = tokio::spawn(async move {
        let mut pods: BTreeMap<String, Pod> = BTreeMap::new();
        let mut relist: Option<HashSet<String>> = None;
        let mut stream = std::pin::pin!(watcher::watcher(api, cfg).default_backoff());
        while let Some(ev) = stream.next().await {
            let changed = match ev {
                Ok(Event::Init) => {
                    relist = Some(HashSet::new());
                    false
                }
                Ok(Event::InitApply(p)) => {
                    let name = p.metadata.name.clone().unwrap_or_default();
                    if let Some(r) = relist.as_mut() {
                        r.insert(name.clone());
                    }
                    pods.insert(name, strip(p));
                    false
                }
                Ok(Event::InitDone) => {
                    let seen = relist.take().unwrap_or_default();
                    pods.retain(|name, _| seen.contains(name));
                    done.store(true, Ordering::Release);
                    true
                }
                Ok(Event::Apply(p)) => {
                    pods.insert(p.metadata.name.clone().unwrap_or_default(), strip(p));
                    relist.is_none()
                }
                Ok(Event::Delete(p)) => {
                    pods.remove(&p.metadata.name.clone().unwrap_or_default());
                    relist.is_none()
                }
                Err(e) => {
                    tracing::warn!(namespace = %ns, error = %e, "watching the agent pods failed; retrying");
                    false
                }
            };
            if changed {
                let agents = agents_from_pods(pods.values(), port);
                if tx.send(agents).is_err() {
                    return;
                }
            }
        }
    });
    (rx, task, listed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn static_list() {
        let a = parse_static("node-a=https://127.0.0.2:9443, node-b=10.0.0.7:9443,").expect("parses");
        assert_eq!(a.len(), 2);
        assert_eq!(a["node-a"].address, "127.0.0.2:9443");
        assert_eq!(a["node-b"].address, "10.0.0.7:9443");
        assert!(parse_static("node-a").is_err());
        assert!(parse_static("node-a=nohost").is_err());
        assert!(matches!(parse_static("a=h:1,a=h:2"), Err(DiscoverError::Duplicate(_))));
    }

    fn pod(name: &str, node: &str, ip: Option<&str>, created: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": "blockjanitor", "creationTimestamp": created},
            "spec": {"nodeName": node, "containers": []},
            "status": ip.map_or(serde_json::json!({}), |ip| serde_json::json!({"podIP": ip}))
        }))
        .expect("pod")
    }

    #[test]
    fn pods_to_agents() {
        let pods = [
            pod("a-1", "node-a", Some("10.244.1.5"), "2026-01-01T00:00:00Z"),
            pod("a-2", "node-a", Some("10.244.1.9"), "2026-01-02T00:00:00Z"),
            pod("b-1", "node-b", None, "2026-01-01T00:00:00Z"),
            pod("c-1", "node-c", Some("fd00::7"), "2026-01-01T00:00:00Z"),
        ];
        let a = agents_from_pods(pods.iter(), 9443);
        assert_eq!(a["node-a"].address, "10.244.1.9:9443", "the newer pod");
        assert_eq!(a["node-b"].address, "");
        assert!(a["node-b"].error.as_deref().is_some_and(|e| e.contains("b-1 has no IP")));
        assert_eq!(a["node-c"].address, "[fd00::7]:9443");
        assert_eq!(a["node-a"].pod, "blockjanitor/a-2", "where kubectl exec reaches it");
    }
}
