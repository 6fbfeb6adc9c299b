//! Telling Kubernetes what the agent found and did: core/v1 Events on the Node (`kubectl
//! describe node`) and on the objects people look at (a volume's PV, its PVC and the pods that
//! use or wait for it; a pod whose container is a pin risk), de-duplicated in memory per object,
//! and the Node's conditions (`StaleBlockDevices`, `MountPinRisk`) patched the way
//! node-problem-detector patches its own: a strategic merge on `status.conditions` (merged by
//! `type`, so other conditions are untouched), the heartbeat on every call and the transition
//! time only when the status flips.

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
/// The node condition set while a mount namespace on the node is a pin risk.
pub const PIN_CONDITION_TYPE: &str = "MountPinRisk";
/// The same event (reason, device, message) is not posted again within this window.
pub const DEDUP_WINDOW: Duration = Duration::from_secs(600);
/// At most this many Events are posted in any minute (all objects together); the rest wait for
/// the next round (they are not remembered as sent).
pub const EVENTS_PER_MINUTE: u32 = 60;
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
    /// A pod's container keeps private copies of live host mounts (Warning, on the pod).
    MountPinRisk,
    /// A volume is held by a private copy of its mount in a namespace of none of its pods
    /// (Warning, on the Node, the PV, the PVC and the pods).
    VolumeHeldElsewhere,
}

impl EventReason {
    /// The Event's `reason`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventReason::StaleBlockDevice => "StaleBlockDevice",
            EventReason::BlockDeviceReleased => "BlockDeviceReleased",
            EventReason::BlockDeviceCleaned => "BlockDeviceCleaned",
            EventReason::CleanupFailed => "CleanupFailed",
            EventReason::MountPinRisk => "MountPinRisk",
            EventReason::VolumeHeldElsewhere => "VolumeHeldElsewhere",
        }
    }

    /// The Event's `type`.
    pub fn event_type(self) -> &'static str {
        match self {
            EventReason::StaleBlockDevice
            | EventReason::CleanupFailed
            | EventReason::MountPinRisk
            | EventReason::VolumeHeldElsewhere => "Warning",
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
    /// [`EVENTS_PER_MINUTE`] were posted in the last minute; nothing was posted (the next call
    /// tries again).
    RateLimited,
}

/// The condition as last written: its status (`True`, `False`, `Unknown`) and when that status
/// began.
#[derive(Clone, Debug)]
struct Written {
    status: &'static str,
    since: Time,
}

/// The object an Event is about, as its `involvedObject` names it (the real API wants the
/// kind, name, namespace of a namespaced object, and its UID, which `kubectl describe` selects
/// Events by).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Involved {
    /// `Node`, `PersistentVolume`, `PersistentVolumeClaim`, `Pod`.
    pub kind: &'static str,
    pub name: String,
    /// The object's namespace; `None` for a cluster-scoped object (its Events go to `default`).
    pub namespace: Option<String>,
    pub uid: String,
}

/// Posts Events and keeps this node's conditions.
pub struct Reporter {
    client: Client,
    node_name: String,
    /// (reason, object, message) -> when it was last posted (or is being posted).
    sent: Mutex<HashMap<(EventReason, Involved, String), Instant>>,
    /// When each Event of the last minute was posted, oldest first.
    posted: Mutex<std::collections::VecDeque<Instant>>,
    /// Per condition type: as last written; absent until the first write (or read of the Node)
    /// succeeds.
    conditions: tokio::sync::Mutex<HashMap<&'static str, Written>>,
}

impl Reporter {
    pub fn new(client: Client, node_name: &str) -> Self {
        Reporter {
            client,
            node_name: node_name.to_string(),
            sent: Mutex::new(HashMap::new()),
            posted: Mutex::new(std::collections::VecDeque::new()),
            conditions: tokio::sync::Mutex::new(HashMap::new()),
        }
    }

    /// This node's Node, as an Event names it (the kubelet's Node events carry the node name as
    /// the UID, too).
    pub fn node(&self) -> Involved {
        Involved { kind: "Node", name: self.node_name.clone(), namespace: None, uid: self.node_name.clone() }
    }

    /// The node's name.
    pub fn node_name(&self) -> &str {
        &self.node_name
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
        self.event_on(&self.node(), reason, &format!("{device}: {message}")).await
    }

    /// Posts an Event with `message` on `on`; de-duplicated as [`Reporter::event`] is, per object.
    pub async fn event_on(
        &self,
        on: &Involved,
        reason: EventReason,
        message: &str,
    ) -> Result<Delivery, KubeError> {
        let key = (reason, on.clone(), message.to_string());
        let now = Instant::now();
        {
            let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
            sent.retain(|_, at| now.duration_since(*at) < DEDUP_WINDOW);
            if sent.contains_key(&key) {
                tracing::debug!(reason = reason.as_str(), kind = on.kind, name = %on.name, "event suppressed: sent recently");
                return Ok(Delivery::Suppressed);
            }
            let mut posted = self.posted.lock().unwrap_or_else(|p| p.into_inner());
            while posted.front().is_some_and(|at| now.duration_since(*at) >= Duration::from_secs(60)) {
                posted.pop_front();
            }
            if posted.len() >= EVENTS_PER_MINUTE as usize {
                tracing::debug!(reason = reason.as_str(), kind = on.kind, name = %on.name, "event held back: {EVENTS_PER_MINUTE} a minute");
                return Ok(Delivery::RateLimited);
            }
            posted.push_back(now);
            // Claimed before posting, so concurrent callers do not both post.
            sent.insert(key.clone(), now);
        }
        let result = self.post_event(on, reason, message).await;
        if result.is_err() {
            let mut sent = self.sent.lock().unwrap_or_else(|p| p.into_inner());
            sent.remove(&key);
        }
        result.map(|()| Delivery::Sent)
    }

    async fn post_event(&self, on: &Involved, reason: EventReason, message: &str) -> Result<(), KubeError> {
        let now = Time(Timestamp::now());
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or_default();
        let namespace = on.namespace.clone().unwrap_or_else(|| EVENT_NAMESPACE.to_string());
        let event = Event {
            metadata: ObjectMeta {
                // As client-go names them: the object's name and a hex timestamp.
                name: Some(format!("{}.{nanos:x}", on.name)),
                namespace: Some(namespace.clone()),
                ..Default::default()
            },
            involved_object: ObjectReference {
                api_version: Some("v1".to_string()),
                kind: Some(on.kind.to_string()),
                name: Some(on.name.clone()),
                namespace: on.namespace.clone(),
                uid: Some(on.uid.clone()),
                ..Default::default()
            },
            reason: Some(reason.as_str().to_string()),
            message: Some(truncate(message.to_string())),
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
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        let object = match &on.namespace {
            Some(ns) => format!("{} {ns}/{}", on.kind, on.name),
            None => format!("{} {}", on.kind, on.name),
        };
        let head: String = message.chars().take(80).collect();
        let action = format!("create Event {} on {object} ({head})", reason.as_str());
        request(&action, api.create(&PostParams::default(), &event)).await?;
        tracing::info!(reason = reason.as_str(), kind = on.kind, name = %on.name, node = %self.node_name, "event posted");
        Ok(())
    }

    /// Sets the Node's `StaleBlockDevices` condition: `True` naming the devices
    /// (`StaleBlockDevicesFound`), or `False` when the list is empty (`NoStaleBlockDevices`).
    /// Every call patches (it is the heartbeat); `lastTransitionTime` moves only when the status
    /// flips. The first call reads the Node to keep a transition time set before a restart.
    pub async fn set_condition(&self, stale_devices: &[String]) -> Result<(), KubeError> {
        let (status, reason, message) = if stale_devices.is_empty() {
            ("False", "NoStaleBlockDevices", "no stale block devices".to_string())
        } else {
            ("True", "StaleBlockDevicesFound", devices_message(stale_devices))
        };
        self.patch_condition(CONDITION_TYPE, status, reason, &message).await
    }

    /// Sets the Node's condition `type_` to `status` (`True`, `False` or `Unknown`) with its
    /// reason and message, as [`Reporter::set_condition`] does its own.
    pub async fn patch_condition(
        &self,
        type_: &'static str,
        status: &'static str,
        reason: &str,
        message: &str,
    ) -> Result<(), KubeError> {
        let mut written = self.conditions.lock().await;
        if !written.contains_key(type_) {
            if let Some(w) = self.read_condition(type_).await {
                written.insert(type_, w);
            }
        }
        let now = Time(Timestamp::now());
        let since = match written.get(type_) {
            Some(w) if w.status == status => w.since.clone(),
            _ => now.clone(),
        };
        let patch = serde_json::json!({
            "status": {
                "conditions": [{
                    "type": type_,
                    "status": status,
                    "reason": reason,
                    "message": truncate(message.to_string()),
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": since,
                }]
            }
        });
        let api: Api<Node> = Api::all(self.client.clone());
        let action = format!("patch condition {type_}={status} on node {}", self.node_name);
        request(
            &action,
            api.patch_status(&self.node_name, &PatchParams::default(), &Patch::Strategic(patch)),
        )
        .await?;
        tracing::debug!(node = %self.node_name, condition = type_, status, "node condition set");
        written.insert(type_, Written { status, since });
        Ok(())
    }

    /// The condition `type_` as the Node has it now, if it can be read and has one.
    async fn read_condition(&self, type_: &str) -> Option<Written> {
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
        let c = conditions.into_iter().find(|c| c.type_ == type_)?;
        let status = match c.status.as_str() {
            "True" => "True",
            "False" => "False",
            _ => "Unknown",
        };
        Some(Written { status, since: c.last_transition_time? })
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
