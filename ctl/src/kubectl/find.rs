//! Finding the console: its pods by the shipped manifests' labels ([`CONSOLE_SELECTOR`]) in the
//! namespace, one that is running and ready (the first by name, so that repeated calls reach the
//! same replica), and its container port named `grpc` (else [`DEFAULT_PORT`]). Pods, not the
//! Service: `kubectl port-forward svc/...` also forwards to one pod the Service selects, and
//! listing pods is all the RBAC it needs.

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use super::route::{api_error, Error, CONSOLE_SELECTOR, DEFAULT_NAMESPACE, DEFAULT_PORT};

/// The console pod to forward to, and its gRPC port.
pub(crate) async fn console_pod(
    client: &kube::Client,
    server: &str,
    namespace: &str,
) -> Result<(String, u16), Error> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let list = pods
        .list(&ListParams::default().labels(CONSOLE_SELECTOR))
        .await
        .map_err(|e| api_error(server, "list the console's pods", namespace, e))?;
    pick(namespace, list.items)
}

/// The console's namespace, found by its pods' labels in every namespace (one namespace, or
/// [`DEFAULT_NAMESPACE`] among several); a user who may not list pods cluster-wide (the shipped
/// Roles grant it in the console's namespace only) gets [`DEFAULT_NAMESPACE`].
pub(crate) async fn console_namespace(client: &kube::Client, server: &str) -> Result<String, Error> {
    let pods: Api<Pod> = Api::all(client.clone());
    let list = match pods.list(&ListParams::default().labels(CONSOLE_SELECTOR)).await {
        Ok(list) => list,
        Err(kube::Error::Api(s)) if s.code == 403 => return Ok(DEFAULT_NAMESPACE.to_owned()),
        Err(e) => return Err(api_error(server, "list the console's pods", "(every namespace)", e)),
    };
    let found: std::collections::BTreeSet<String> =
        list.items.iter().filter_map(|p| p.metadata.namespace.clone()).collect();
    match found.len() {
        0 => Ok(DEFAULT_NAMESPACE.to_owned()),
        1 => Ok(found.into_iter().next().unwrap_or_default()),
        _ if found.contains(DEFAULT_NAMESPACE) => Ok(DEFAULT_NAMESPACE.to_owned()),
        _ => Err(Error::ManyConsoles { namespaces: found.into_iter().collect::<Vec<_>>().join(", ") }),
    }
}

/// The first running, ready pod by name, and its `grpc` port.
fn pick(namespace: &str, mut pods: Vec<Pod>) -> Result<(String, u16), Error> {
    if pods.is_empty() {
        return Err(Error::NoConsole { namespace: namespace.to_owned() });
    }
    pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    let Some(pod) = pods.iter().find(|p| ready(p)) else {
        let found: Vec<String> = pods
            .iter()
            .map(|p| {
                let phase =
                    p.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_else(|| "Unknown".into());
                let state =
                    if p.metadata.deletion_timestamp.is_some() { "Terminating".into() } else { phase };
                format!("{} {state}", p.metadata.name.as_deref().unwrap_or("?"))
            })
            .collect();
        return Err(Error::NotReady { namespace: namespace.to_owned(), found: found.join(", ") });
    };
    let port = pod
        .spec
        .iter()
        .flat_map(|s| &s.containers)
        .flat_map(|c| c.ports.iter().flatten())
        .find(|p| p.name.as_deref() == Some("grpc"))
        .and_then(|p| u16::try_from(p.container_port).ok())
        .unwrap_or(DEFAULT_PORT);
    Ok((pod.metadata.name.clone().unwrap_or_default(), port))
}

/// Running, its Ready condition true, not being deleted.
fn ready(pod: &Pod) -> bool {
    let Some(status) = &pod.status else { return false };
    pod.metadata.deletion_timestamp.is_none()
        && status.phase.as_deref() == Some("Running")
        && status.conditions.iter().flatten().any(|c| c.type_ == "Ready" && c.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, phase: &str, ready: bool, port: Option<(&str, i32)>) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "console",
                "ports": port.map(|(n, p)| vec![serde_json::json!({"name": n, "containerPort": p})])}]},
            "status": {"phase": phase,
                       "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}]}
        }))
        .expect("pod")
    }

    #[test]
    fn picks_the_first_ready_pod_and_its_grpc_port() {
        let pods = vec![
            pod("console-b", "Running", true, Some(("grpc", 7000))),
            pod("console-a", "Pending", false, Some(("grpc", 9444))),
            pod("console-c", "Running", true, Some(("metrics", 9912))),
        ];
        assert_eq!(pick("ns", pods).expect("pick"), ("console-b".to_owned(), 7000));
        let pods = vec![pod("console-c", "Running", true, Some(("metrics", 9912)))];
        assert_eq!(pick("ns", pods).expect("pick"), ("console-c".to_owned(), DEFAULT_PORT));
    }

    #[test]
    fn no_pod_or_none_ready_is_one_clear_line() {
        let e = pick("ops", vec![]).expect_err("none");
        assert!(e.to_string().starts_with("no console pod in namespace 'ops' (pods labelled "), "{e}");
        let e = pick("ops", vec![pod("console-a", "Pending", false, None)]).expect_err("not ready");
        assert_eq!(
            e.to_string(),
            "no console pod is running and ready in namespace 'ops' (found: console-a Pending)"
        );
    }
}
