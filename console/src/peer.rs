//! An Apply forwarded to the replica that holds the apply Lease (issue 36): the kubectl plugin
//! and agentctl reach whichever replica the Service or the port-forward picks, and a replica
//! that does not hold the Lease passes an Apply with `execute` on to the one that does, at the
//! address it wrote into the Lease ([`crate::lease_steps::HOLDER_ADDRESS`]). The holder decides
//! again who the caller is: a bearer token travels as it came (the holder has it reviewed
//! itself); a certificate caller, whom this replica let through, is named in the on-behalf-of
//! metadata under this replica's own certificate, which the holder takes only from an identity
//! it lists with `--peer-console`. A forwarded call carries [`FROM_REPLICA`] and is never
//! forwarded again (a holder that lost the Lease meanwhile refuses it).

use std::time::Duration;

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::fleet_client::FleetClient;
use blockjanitor_rpc::client;
use tonic::metadata::MetadataValue;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tonic::{Request, Status};

use crate::forward::{on_behalf_of, FROM_REPLICA};
use crate::person::Person;

/// How a replica reaches another: the CA of the replicas' serving certificate, its own client
/// certificate (the one it shows the agents), the name their certificates carry.
#[derive(Clone, Debug)]
pub struct PeerTls {
    pub ca: Vec<u8>,
    pub cert: Vec<u8>,
    pub key: Vec<u8>,
    pub server_name: String,
    pub connect_timeout: Duration,
}

/// Whether a call came from another replica (and so is not forwarded again).
pub fn forwarded<T>(req: &Request<T>) -> Option<String> {
    req.metadata().get(FROM_REPLICA).and_then(|v| v.to_str().ok()).map(str::to_owned)
}

/// Forwards `r` to the holder `holder` at `address`, as `person` (with their bearer token when
/// they sent one), bounded by `timeout`; its answer, or its refusal naming it.
pub async fn forward_apply(
    tls: &PeerTls,
    (holder, address): (&str, &str),
    me: &str,
    r: pb::FleetApplyRequest,
    (authorization, person): (Option<&str>, &Person),
    timeout: Duration,
) -> Result<pb::FleetApplyResponse, Status> {
    let via = |what: String| format!("the holder of the apply Lease, replica {holder} at {address}: {what}");
    let config = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(&tls.ca))
        .identity(Identity::from_pem(&tls.cert, &tls.key))
        .domain_name(tls.server_name.clone());
    let unreachable =
        |e: String| Status::unavailable(via(format!("not an address this replica can reach: {e}")));
    let endpoint = Endpoint::from_shared(format!("https://{address}"))
        .map_err(|e| unreachable(e.to_string()))?
        .connect_timeout(tls.connect_timeout)
        .tls_config(config)
        .map_err(|e| unreachable(e.to_string()))?;
    let channel = endpoint.connect().await.map_err(|e| {
        Status::unavailable(via(format!(
            "cannot be reached ({}); nothing ran: retry",
            client::error_chain(&e)
        )))
    })?;
    let mut req = client::request(r, timeout);
    match authorization {
        Some(a) => {
            let v = MetadataValue::try_from(a)
                .map_err(|_| Status::unauthenticated("the authorization metadata is not text"))?;
            req.metadata_mut().insert("authorization", v);
        }
        None => on_behalf_of(&mut req, person)?,
    }
    if let Ok(v) = MetadataValue::try_from(me) {
        req.metadata_mut().insert(FROM_REPLICA, v);
    }
    tracing::info!(target: "audit", caller = %person.name, holder = %holder, address = %address,
        "forwarding an Apply to the apply Lease's holder {holder} for {}", person.name);
    let mut c = FleetClient::new(channel).max_decoding_message_size(64 << 20);
    client::call(timeout, c.apply(req)).await.map_err(|s| Status::new(s.code(), via(s.message().to_owned())))
}
