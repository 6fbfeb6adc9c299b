//! A stand-in agent that carries out Apply steps, slowly, and records each one with the console
//! replica that sent it (the `x-blockjanitor-console-replica` metadata the console adds): for the
//! tests of two console replicas that must never both send a node a step. Its Plan covers every
//! device asked about, with identity `id-DEVICE`; everything else is [`StandIn`]'s.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::agent_server::Agent;
use tonic::{Request, Response, Status};

use crate::standin_fleet::{EventStream, StandIn};

/// The metadata naming the console replica that forwarded a step.
pub const FROM_REPLICA: &str = "x-blockjanitor-console-replica";

/// One step as the agent saw it.
#[derive(Debug, Clone)]
pub struct StepSeen {
    pub node: String,
    /// The replica that sent it ("" when the call did not say).
    pub replica: String,
    pub devices: Vec<String>,
    pub started: Instant,
    /// When the step ended (`None`: still running).
    pub ended: Option<Instant>,
}

/// Every step every stepping agent of a test saw, in the order they started.
pub type StepLog = Arc<Mutex<Vec<StepSeen>>>;

/// The identity a stepping agent's Plan gives `device`.
pub fn identity_of(device: &str) -> String {
    format!("id-{device}")
}

/// A [`StandIn`] whose Plan covers what it is asked and whose Apply takes `step_time`.
pub struct SteppingAgent {
    pub inner: StandIn,
    pub step_time: Duration,
    pub log: StepLog,
}

#[tonic::async_trait]
impl Agent for SteppingAgent {
    async fn get_node(&self, r: Request<pb::GetNodeRequest>) -> Result<Response<pb::Node>, Status> {
        self.inner.get_node(r).await
    }
    async fn list_devices(
        &self,
        r: Request<pb::ListDevicesRequest>,
    ) -> Result<Response<pb::ListDevicesResponse>, Status> {
        self.inner.list_devices(r).await
    }
    async fn get_device(&self, r: Request<pb::GetDeviceRequest>) -> Result<Response<pb::Device>, Status> {
        self.inner.get_device(r).await
    }
    async fn list_holders(
        &self,
        r: Request<pb::ListHoldersRequest>,
    ) -> Result<Response<pb::ListHoldersResponse>, Status> {
        self.inner.list_holders(r).await
    }
    async fn plan(&self, r: Request<pb::PlanRequest>) -> Result<Response<pb::PlanResponse>, Status> {
        let plans = r
            .into_inner()
            .devices
            .iter()
            .map(|d| pb::DevicePlan { device: d.clone(), identity: identity_of(d), ..Default::default() })
            .collect();
        Ok(Response::new(pb::PlanResponse { plans, ..Default::default() }))
    }
    async fn apply(&self, r: Request<pb::ApplyRequest>) -> Result<Response<pb::ApplyResponse>, Status> {
        let replica =
            r.metadata().get(FROM_REPLICA).and_then(|v| v.to_str().ok()).unwrap_or_default().to_owned();
        let devices = r.into_inner().devices;
        let i = {
            let mut log = self.log.lock().expect("step log");
            log.push(StepSeen {
                node: self.inner.node.clone(),
                replica,
                devices,
                started: Instant::now(),
                ended: None,
            });
            log.len() - 1
        };
        // The step runs to its end whether or not its caller is still there, as the agent's does.
        tokio::time::sleep(self.step_time).await;
        self.log.lock().expect("step log")[i].ended = Some(Instant::now());
        Ok(Response::new(pb::ApplyResponse::default()))
    }
    type WatchEventsStream = EventStream;
    async fn watch_events(
        &self,
        r: Request<pb::WatchEventsRequest>,
    ) -> Result<Response<EventStream>, Status> {
        self.inner.watch_events(r).await
    }
}
