//! Telling Kubernetes what the agent found and did, on the Node object: core/v1 Events
//! (`kubectl describe node`), de-duplicated in memory, and a `StaleBlockDevices` node condition
//! patched the way node-problem-detector patches its own: a strategic merge on `status.conditions`
//! (merged by `type`, so other conditions are untouched), the heartbeat on every call and the
//! transition time only when the status flips.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ::kube::api::{Patch, PatchParams, PostParams};
use ::kube::{Api, Client};
use k8s_openapi::api::core::v1::{Event, EventSource, Node, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use super::error::KubeError;

/// The node condition's type.
pub const CONDITION_TYPE: &str = "StaleBlockDevices";
/// The same event (reason, device, message) is not posted again within this window.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(600);
/// Longest answer awaited for one API request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Events and condition messages are cut to this many bytes.
const MAX_MESSAGE: usize = 1024;
/// Events on cluster-scoped objects live here, as the kubelet's Node events do.
const EVENT_NAMESPACE: &str = "default";
const COMPONENT: &str = "blockjanitor";

/// Why an Event is posted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventReason {
    /// A device was found stale (Warning).
    StaleBlockDevice,
    /// A stale device's holders were released (Normal).
    BlockDeviceReleased,
    /// A stale device was removed (Normal).
    BlockDeviceCleaned,
    /// Releasing or removing a device failed (Warning).
    CleanupFailed,
}

impl EventReason {
    /// The Event's `reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventReason::StaleBlockDevice => "StaleBlockDevice",
            EventReason::BlockDeviceReleased => "BlockDeviceReleased",
            EventReason::BlockDeviceCleaned => "BlockDeviceCleaned",
            EventReason::CleanupFailed => "CleanupFailed",
        }
    }

    /// The Event's `type`.
    pub fn event_type(self) -> &'static str {
        match self {
            EventReason::StaleBlockDevice | EventReason::CleanupFailed => "Warning",
            EventReason::BlockDeviceReleased | EventReason::BlockDeviceCleaned => "Normal",
        }
    }
}

/// What [`Reporter::event`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivery {
    /// The Event was created.
    Sent,
    /// The same Event was sent less than [`DEDUP_WINDOW`] ago; nothing was posted.
    Suppressed,
}

/// The condition as last written: its status and when that status began.
#[derive(Clone, Debug)]
struct Written {
    stale: bool,
    since: Time,
}

/// Posts Events on this node's Node object and keeps its `StaleBlockDevices` condition.
pub struct Reporter {
    client: Client,
    node_name: String,
    /// (reason, device, message) -> when it was last posted (or is being posted).
    sent: Mutex<HashMap<(EventReason, String, String), Instant>>,
    /// `None` until the first write (or read of the Node) succeeds.
    condition: tokio::sync::Mutex<Option<Written>>,
}

impl Reporter {
    pub fn new(client: Client, node_name: &str) -> Self {
        Reporter {
            client,
            node_name: node_name.to_string(),
            sent: Mutex::new(HashMap::new()),
            condition: tokio::sync::Mutex::new(None),
        }
    }

    /// Posts an Event on the Node: `reason`, and `"<device>: <message>"` as its message. The same
    /// (reason, device, message) within [`DEDUP_WINDOW`] is [`Delivery::Suppressed`]; a failed
    /// post is not remembered, so the next call tries again.
    pub async fn event(
        &self,
        reason: EventReason,
        device: &str,
        message: &str,
    ) -> Result<Delivery, KubeError> {
        let key = (reason, device.to_string(), message.to_string());
        let now = Instant::now();
        {
            let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
            sent.retain(|_, at| now.duration_since(*at) < DEDUP_WINDOW);
            if sent.contains_key(&key) {
                tracing::debug!(reason = reason.as_str(), device, "event suppressed: sent recently");
                return Ok(Delivery::Suppressed);
            }
            // Claimed before posting, so concurrent callers do not both post.
            sent.insert(key.clone(), now);
        }
        let result = self.post_event(reason, device, message).await;
        if result.is_err() {
            let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
            sent.remove(&key);
        }
        result.map(|()| Delivery::Sent)
    }

    async fn post_event(&self, reason: EventReason, device: &str, message: &str) -> Result<(), KubeError> {
        let now = Time(Timestamp::now());
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
        let event = Event {
            metadata: ObjectMeta {
                // As client-go names them: the object's name and a hex timestamp.
                name: Some(format!("{}.{nanos:x}", self.node_name)),
                namespace: Some(EVENT_NAMESPACE.to_string()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".to_string()),
                kind: Some("Node".to_string()),
                name: Some(self.node_name.clone()),
                // The kubelet's Node events carry the node name as the UID, too.
                uid: Some(self.node_name.clone()),
                ..Default::default()
            },
            reason: Some(reason.as_str().to_string()),
            message: Some(truncate(format!("{device}: {message}"))),
            type_: Some(reason.event_type().to_string()),
            source: Some(EventSource {
                component: Some(COMPONENT.to_string()),
                host: Some(self.node_name.clone()),
            }),
            first_timestamp: Some(now.clone()),
            last_timestamp: Some(now),
            count: Some(1),
            reporting_component: Some(COMPONENT.to_string()),
            reporting_instance: Some(self.node_name.clone()),
            ..Default::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), EVENT_NAMESPACE);
        let action = format!("create Event {} for {device} on node {}", reason.as_str(), self.node_name);
        request(&action, api.create(&PostParams::default(), &event)).await?;
        tracing::info!(reason = reason.as_str(), device, node = %self.node_name, "event posted");
        Ok(())
    }

    /// Sets the Node's `StaleBlockDevices` condition: `True` naming the devices
    /// (`StaleBlockDevicesFound`), or `False` when the list is empty (`NoStaleBlockDevices`).
    /// Every call patches (it is the heartbeat); `lastTransitionTime` moves only when the status
    /// flips. The first call reads the Node to keep a transition time set before a restart.
    pub async fn set_condition(&self, stale_devices: &[String]) -> Result<(), KubeError> {
        let stale = !stale_devices.is_empty();
        let mut written = self.condition.lock().await;
        if written.is_none() {
            *written = self.read_condition().await;
        }
        let now = Time(Timestamp::now());
        let since = match written.as_ref() {
            Some(w) if w.stale == stale => w.since.clone(),
            _ => now.clone(),
        };
        let (status, reason, message) = if stale {
            ("True", "StaleBlockDevicesFound", devices_message(stale_devices))
        } else {
            ("False", "NoStaleBlockDevices", "no stale block devices".to_string())
        };
        let patch = serde_json::json!({
            "status": {
                "conditions": [{
                    "type": CONDITION_TYPE,
                    "status": status,
                    "reason": reason,
                    "message": message,
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": since,
                }]
            }
        });
        let api: Api<Node> = Api::all(self.client.clone());
        let action = format!("patch condition {CONDITION_TYPE}={status} on node {}", self.node_name);
        request(
            &action,
            api.patch_status(&self.node_name, &PatchParams::default(), &Patch::Strategic(patch)),
        )
        .await?;
        tracing::debug!(node = %self.node_name, status, devices = stale_devices.len(), "node condition set");
        *written = Some(Written { stale, since });
        Ok(())
    }

    /// The condition as the Node has it now, if it can be read and has one.
    async fn read_condition(&self) -> Option<Written> {
        let api: Api<Node> = Api::all(self.client.clone());
        let action = format!("get node {} status", self.node_name);
        let node = match request(&action, api.get_status(&self.node_name)).await {
            Ok(node) => node,
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the node's condition; its transition time starts now");
                return None;
            }
        };
        let conditions = node.status?.conditions?;
        let c = conditions.into_iter().find(|c| c.type_ == CONDITION_TYPE)?;
        Some(Written { stale: c.status == "True", since: c.last_transition_time? })
    }
}

/// Runs one API request with [`REQUEST_TIMEOUT`], naming the action in any error.
pub(super) async fn request<T>(
    action: &str,
    fut: impl Future<Output = Result<T, ::kube::Error>>,
) -> Result<T, KubeError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(KubeError::Api { action: action.to_string(), source }),
        Err(_) => Err(KubeError::TimedOut { action: action.to_string(), timeout: REQUEST_TIMEOUT }),
    }
}

/// "stale block devices: a, b, c", cut at whole names to fit, ending "and N more".
fn devices_message(devices: &[String]) -> String {
    let mut msg = String::from("stale block devices: ");
    for (i, d) in devices.iter().enumerate() {
        let sep = if i == 0 { "" } else { ", " };
        let more = format!(" and {} more", devices.len() - i);
        if msg.len() + sep.len() + d.len() + more.len() > MAX_MESSAGE {
            msg.push_str(&more);
            return msg;
        }
        msg.push_str(sep);
        msg.push_str(d);
    }
    msg
}

/// Cuts a message to [`MAX_MESSAGE`] bytes on a character boundary.
fn truncate(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_device_lists_are_cut_at_names() {
        let devices: Vec<String> = (0..500).map(|i| format!("/dev/rbd{i}")).collect();
        let msg = devices_message(&devices);
        assert!(msg.len() <= MAX_MESSAGE, "{}", msg.len());
        assert!(msg.starts_with("stale block devices: /dev/rbd0, /dev/rbd1"));
        assert!(msg.ends_with(" more"));
        assert_eq!(devices_message(&["/dev/loop3".to_string()]), "stale block devices: /dev/loop3");
    }

    #[test]
    fn truncate_keeps_characters_whole() {
        let s = "é".repeat(MAX_MESSAGE);
        let t = truncate(s);
        assert!(t.len() <= MAX_MESSAGE && t.chars().all(|c| c == 'é'));
    }
}
