//! The words the gates answer with when they have more to say than "no" ([`super::gates`]
//! re-exports them): what the Kubernetes API says of a device, and of a pod.

/// What the Kubernetes API says about a device.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ApiWord {
    /// The agent runs without the API: the node's own evidence decides.
    NotConfigured,
    /// The API is configured but cannot vouch now (why).
    CannotVouch(String),
    /// Running pods or attached VolumeAttachments use it (one reason each).
    InUse(Vec<String>),
    /// The API vouches that nothing in the cluster uses it (why it believes so).
    NoUser(String),
}

impl ApiWord {
    /// Why nothing destructive may be done, if the API forbids it.
    pub fn refusal(&self) -> Option<String> {
        match self {
            Self::NotConfigured | Self::NoUser(_) => None,
            Self::CannotVouch(why) => {
                Some(format!("the Kubernetes API cannot vouch for it ({why}): nothing destructive rests on missing API evidence"))
            }
            Self::InUse(users) => Some(users.join("; ")),
        }
    }
}

/// What the Kubernetes API says of a pod, by the UID kubelet names its directory by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PodWord {
    /// The API is not asked, or cannot vouch now (why): no orphan verdict rests on it.
    CannotVouch(String),
    /// The pod is on this node (which one, in its phase).
    OnNode(String),
    /// No pod with the UID (nor a mirror pod naming it) is on this node (why it believes so).
    Gone(String),
}
