//! Fleet.MultiAttach for one volume (a PV, or a PVC's): its diagnosis per node
//! ([`crate::multiattach`]) from the Nodes, VolumeAttachments and agents that concern it, and,
//! for a stale mapping, its agent's own plan to clear it, asked on behalf of the caller (those
//! plans are a fan-out: counted as one fresh one, and each a plan among those running at once).

use blockjanitor_proto::v1 as pb;
use blockjanitor_rpc::client;
use tonic::Status;

use crate::multiattach;
use crate::person::Person;
use crate::service::{uninterpretable, FleetService};

impl FleetService {
    /// The diagnosis of `r`'s volume (see the module docs).
    pub(crate) async fn multi_attach_now(
        &self,
        caller: &Person,
        r: pb::MultiAttachRequest,
    ) -> Result<pb::MultiAttachResponse, Status> {
        let cluster = self.cluster()?;
        let pv = match (r.pv.is_empty(), r.pvc.is_empty()) {
            (false, true) => r.pv.clone(),
            (true, false) => cluster.pv_of_pvc(&r.pvc).map_err(Status::not_found)?,
            _ => return Err(uninterpretable("give exactly one of pv, pvc")),
        };
        let obj = cluster.pv(&pv).ok_or_else(|| Status::not_found(format!("no PersistentVolume {pv}")))?;
        let v = multiattach::volume_id(&obj);
        let vas = cluster.vas_of(&pv);
        let nodes = multiattach::nodes_concerned(cluster, &v, &vas, &self.index.read());
        let mut missing = self.missing_of(&self.index.read());
        let mut diags = multiattach::diagnose(&v, &vas, &nodes, &self.index.read(), &mut missing);
        let stale = |d: &pb::NodeDiagnosis| d.diagnosis == pb::Diagnosis::StaleMapping as i32;
        let asks = diags.iter().any(|d| stale(d) && self.links.client(&d.node).is_some());
        let _fresh = self.admit_fresh(caller, asks)?;
        let _plans = if asks { Some(self.enter(&self.concurrency.plans, caller)?) } else { None };
        for d in diags.iter_mut().filter(|d| stale(d)) {
            let devices: Vec<String> =
                d.devices.iter().filter_map(|f| f.device.as_ref().map(|x| x.name.clone())).collect();
            if self.links.client(&d.node).is_none() {
                continue;
            }
            match self.forwarder().node_plan(&d.node, devices, caller).await {
                Ok(p) => {
                    for plan in p.plans {
                        d.clear_steps.extend(plan.steps);
                        d.identities.push(plan.identity);
                        if !plan.refusal.is_empty() {
                            d.detail.push_str(&format!(
                                "; the agent refuses to clean {}: {}",
                                plan.device, plan.refusal
                            ));
                        }
                    }
                }
                Err(s) => d
                    .detail
                    .push_str(&format!("; the agent's plan could not be read: {}", client::status_line(&s))),
            }
        }
        Ok(pb::MultiAttachResponse { pv, nodes: diags, missing_nodes: missing, sweep: None })
    }
}
