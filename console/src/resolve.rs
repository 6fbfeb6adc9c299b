//! What a Where request names, read with the parsers of [`crate::ident`]: an rbd image (with or
//! without a rados namespace), a PV or PVC (through the Kubernetes view), an nbd backend, a WWID
//! in any of its forms, an iSCSI target (IQN) or an NVMe subsystem (NQN). A query that is none of
//! these is INVALID_ARGUMENT naming what was expected, never an empty answer.

use blockjanitor_proto::v1 as pb;
use tonic::Status;

use crate::ident::{self, Bare};
use crate::index::Key;
use crate::multiattach;
use crate::service::{uninterpretable, FleetService};

/// A Where request, understood.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// What it was taken for and what it resolved to (PVC -> PV -> image...).
    pub text: String,
    /// The index keys to look up.
    pub keys: Vec<Key>,
    /// A target the index has no key for, found by looking at every device.
    pub target: Option<Target>,
}

/// A storage target devices are reached through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// An iSCSI target name (lower case).
    Iqn(String),
    /// An NVMe subsystem NQN.
    Nqn(String),
}

impl Target {
    /// Whether a device is reached through this target.
    pub fn matches(&self, d: &pb::Device) -> bool {
        match self {
            Target::Iqn(iqn) => d.iscsi_session.as_ref().is_some_and(|s| s.target.eq_ignore_ascii_case(iqn)),
            Target::Nqn(nqn) => d.nvme.as_ref().is_some_and(|n| {
                n.subsysnqn.eq_ignore_ascii_case(nqn)
                    || n.controllers.iter().any(|c| c.subsysnqn.eq_ignore_ascii_case(nqn))
            }),
        }
    }
}

fn keys(text: String, keys: Vec<Key>) -> Resolved {
    Resolved { text, keys, target: None }
}

fn invalid(e: ident::IdentError) -> Status {
    tracing::info!(error = %e, "Where: query not understood");
    uninterpretable(&e.to_string())
}

fn wwid_keys(forms: Vec<String>) -> Vec<Key> {
    forms.into_iter().map(Key::Wwid).collect()
}

/// A PVC name is `NAMESPACE/NAME`.
fn check_pvc(pvc: &str) -> Result<(), Status> {
    match pvc.split('/').collect::<Vec<_>>().as_slice() {
        [ns, name] if !ns.is_empty() && !name.is_empty() => Ok(()),
        _ => Err(uninterpretable(&format!(
            "'{pvc}' is not a PVC: expected NAMESPACE/NAME (e.g. shop/data-db-0)"
        ))),
    }
}

impl FleetService {
    /// What a Where request names.
    pub(crate) fn resolve(&self, r: &pb::WhereRequest) -> Result<Resolved, Status> {
        let set =
            [&r.query, &r.image, &r.pv, &r.pvc, &r.wwid].iter().filter(|s| !s.trim().is_empty()).count();
        if set != 1 {
            return Err(uninterpretable(&format!(
                "give exactly one of query, image, pv, pvc, wwid: {}",
                ident::EXPECTED
            )));
        }
        if !r.image.is_empty() {
            let spec = ident::parse_image(&r.image).map_err(invalid)?;
            return Ok(keys(format!("rbd image {}", spec.key()), vec![Key::Image(spec.key())]));
        }
        if !r.pv.is_empty() {
            return Ok(self.pv_keys(r.pv.trim(), format!("PV {}", r.pv.trim())));
        }
        if !r.pvc.is_empty() {
            return self.pvc_keys(r.pvc.trim());
        }
        if !r.wwid.is_empty() {
            let forms = ident::parse_wwid(&r.wwid).map_err(invalid)?;
            return Ok(keys(format!("WWID {}", forms[0]), wwid_keys(forms)));
        }
        let q = r.query.trim();
        if let Some(pv) = q.strip_prefix("pv/") {
            return Ok(self.pv_keys(pv, format!("PV {pv}")));
        }
        if let Some(pvc) = q.strip_prefix("pvc/") {
            return self.pvc_keys(pvc);
        }
        let cluster = self.cluster.as_ref().filter(|c| c.not_synced().is_none());
        if q.contains('/') {
            if let Some(pv) = cluster.and_then(|c| c.pv_of_pvc(q).ok()) {
                return Ok(self.pv_keys(&pv, format!("PVC {q} -> PV {pv}")));
            }
            // An image, or the same spec as an rbd-nbd backend.
            let spec = ident::parse_image(q).map_err(invalid)?;
            let mut text = format!("rbd image {}", spec.key());
            if self.cluster.is_some() && cluster.is_none() && q.split('/').count() == 2 {
                text.push_str(
                    " (the Kubernetes view is not synced: were it a PVC, it could not be found now)",
                );
            }
            return Ok(keys(text, vec![Key::Image(spec.key()), Key::NbdBackend(q.to_owned())]));
        }
        if !self.index.read().lookup(&Key::NbdBackend(q.to_owned())).is_empty() {
            return Ok(keys(format!("nbd backend {q}"), vec![Key::NbdBackend(q.to_owned())]));
        }
        if cluster.is_some_and(|c| c.pv(q).is_some())
            || !self.index.read().lookup(&Key::Pv(q.to_owned())).is_empty()
        {
            return Ok(self.pv_keys(q, format!("PV {q}")));
        }
        Ok(match ident::parse_bare(q).map_err(invalid)? {
            Bare::Wwid(forms) => keys(format!("WWID {}", forms[0]), wwid_keys(forms)),
            Bare::Iqn(iqn) => {
                Resolved { text: format!("iSCSI target {iqn}"), keys: vec![], target: Some(Target::Iqn(iqn)) }
            }
            Bare::Nqn(nqn) => Resolved {
                text: format!("NVMe subsystem {nqn}"),
                keys: vec![],
                target: Some(Target::Nqn(nqn)),
            },
        })
    }

    fn pvc_keys(&self, pvc: &str) -> Result<Resolved, Status> {
        check_pvc(pvc)?;
        let pv = self.cluster()?.pv_of_pvc(pvc).map_err(Status::not_found)?;
        Ok(self.pv_keys(&pv, format!("PVC {pvc} -> PV {pv}")))
    }

    /// The keys of a PV: its name, and its images and WWIDs when the API has it.
    fn pv_keys(&self, pv: &str, mut text: String) -> Resolved {
        let mut keys = vec![Key::Pv(pv.to_owned())];
        if let Some(obj) = self.cluster.as_ref().and_then(|c| c.pv(pv)) {
            let v = multiattach::volume_id(&obj);
            for i in &v.images {
                text.push_str(&format!(" -> rbd image {i}"));
            }
            for w in &v.wwids {
                text.push_str(&format!(" -> WWID {w}"));
            }
            keys.extend(v.images.into_iter().map(Key::Image));
            keys.extend(v.wwids.into_iter().map(Key::Wwid));
        }
        Resolved { text, keys, target: None }
    }

    /// Every device reached through `target`, on every node: the index's key for the target
    /// (its matches, not the fleet), each device checked against it.
    pub(crate) fn scan_target(&self, target: &Target) -> Vec<pb::FleetDevice> {
        let key = match target {
            Target::Iqn(iqn) => Key::Iqn(iqn.to_ascii_lowercase()),
            Target::Nqn(nqn) => Key::Nqn(nqn.to_ascii_lowercase()),
        };
        let ix = self.index.read();
        ix.lookup(&key).into_iter().filter(|f| f.device.as_ref().is_some_and(|d| target.matches(d))).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_match_iscsi_sessions_and_nvme_subsystems() {
        let d = pb::Device {
            iscsi_session: Some(pb::IscsiSessionInfo {
                target: "iqn.2004-10.com.example:disk1".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(Target::Iqn("iqn.2004-10.com.example:disk1".into()).matches(&d));
        assert!(!Target::Iqn("iqn.2004-10.com.example:disk2".into()).matches(&d));
        let n = pb::Device {
            nvme: Some(pb::NvmeNamespace {
                controllers: vec![pb::NvmeController {
                    subsysnqn: "nqn.2019-08.org.qemu:t".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert!(Target::Nqn("nqn.2019-08.org.qemu:t".into()).matches(&n));
        assert!(!Target::Nqn("nqn.2019-08.org.qemu:t".into()).matches(&d));
        assert!(check_pvc("shop/db").is_ok());
        for bad in ["shop", "shop/", "a/b/c"] {
            assert_eq!(check_pvc(bad).expect_err(bad).code(), tonic::Code::InvalidArgument);
        }
    }
}
