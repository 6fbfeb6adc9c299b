//! Who may call the console, and for what. Two ways to be someone:
//!
//! - a bearer token in the `authorization` metadata (what the kubectl plugin sends: the user's
//!   own Kubernetes credentials), which the API server's TokenReview names, and whose every call
//!   a SubjectAccessReview of the method's [`Verb`] on `fleet.blockjanitor.io` in the console's
//!   namespace lets through or not ([`crate::review`]): the cluster's RBAC is the gate;
//! - a client certificate from the console's client CA whose identity the console's flags list,
//!   one per person (`--operator`: every verb; `--viewer`: get and plan).
//!
//! A token wins over a certificate on the same call. Neither: UNAUTHENTICATED.
//!
//! A third way, for the console's own replicas only (issue 36): another replica (a certificate
//! identity listed with `--peer-console`, the console role) forwarding an Apply to the holder of
//! the apply Lease on behalf of a person it has let through itself, named in
//! `x-blockjanitor-on-behalf-of` (and their groups), as the console forwards to the agents. Every refusal is
//! logged (target `audit`) with the person it names. [`MetricsGate`] is the same review for
//! `/metrics` (`--metrics-review`): a bearer token, and `get` on the path.

use std::sync::Arc;

use blockjanitor_rpc::auth::{Policy, Role};
use blockjanitor_rpc::metrics_http::{Gate, GateFuture, Refusal};
use tonic::{Request, Status};

use crate::person::{self, Ask, Person, Verb, Via};
use crate::review::{ReviewError, Reviewer};

/// The console's door.
pub struct Access {
    /// Certificate identities (operators and viewers, one per person).
    pub policy: Policy,
    /// The API server's reviews (`None`: the console runs without the API, and takes no token).
    pub reviewer: Option<Arc<Reviewer>>,
    /// The namespace RBAC is asked about (the console's own).
    pub namespace: String,
}

/// A review's refusal as a gRPC status; one arm per kind.
pub fn status(e: &ReviewError) -> Status {
    match e {
        ReviewError::NotAuthenticated(_) => Status::unauthenticated(e.to_string()),
        ReviewError::Denied(_) => Status::permission_denied(e.to_string()),
        ReviewError::Unavailable { .. } => Status::unavailable(e.to_string()),
    }
}

impl Access {
    /// The person behind `req` if they may do `verb`, or why not.
    pub async fn authorize<T>(&self, req: &Request<T>, verb: Verb) -> Result<Person, Status> {
        let header = req.metadata().get("authorization").map(|v| v.to_str().map(str::to_owned));
        let outcome = match header {
            Some(value) => {
                let value =
                    value.map_err(|_| Status::unauthenticated("the authorization metadata is not text"))?;
                self.by_token(&value, verb).await
            }
            None => self.by_certificate(req, verb),
        };
        if let Err(s) = &outcome {
            tracing::info!(target: "audit", verb = verb.as_str(), code = ?s.code(), "refused: {}", s.message());
        }
        outcome
    }

    async fn by_token(&self, value: &str, verb: Verb) -> Result<Person, Status> {
        let token = person::bearer(value).map_err(Status::unauthenticated)?;
        let Some(reviewer) = &self.reviewer else {
            return Err(Status::failed_precondition(
                "this console runs without the Kubernetes API (--in-cluster, --kubeconfig or --kube-url), so it \
                 cannot review a bearer token: use a client certificate it lists",
            ));
        };
        let user = reviewer.authenticate(token).await.map_err(|e| status(&e))?;
        let ask = Ask::Fleet { verb, namespace: self.namespace.clone() };
        reviewer.authorize(&user, &ask).await.map_err(|e| status(&e))?;
        Ok(Person { name: user.name, groups: user.groups, via: Via::TokenReview })
    }

    fn by_certificate<T>(&self, req: &Request<T>, verb: Verb) -> Result<Person, Status> {
        let caller = self.policy.caller(req).map_err(|s| {
            if s.code() == tonic::Code::Unauthenticated {
                Status::unauthenticated(
                    "no credentials: send your Kubernetes token (authorization: Bearer TOKEN; kubectl blockjanitor \
                     does) or a client certificate the console lists",
                )
            } else {
                s
            }
        })?;
        if caller.role == Role::Console {
            return peer_person(req, &caller.identity);
        }
        let need = match verb {
            Verb::Get | Verb::Plan => Role::Viewer,
            Verb::Apply => Role::Operator,
        };
        if caller.role < need {
            return Err(Status::permission_denied(format!(
                "{} needs the operator role on the console: certificate identity {} is a viewer (--operator \
                 lists one identity per person)",
                match verb {
                    Verb::Apply => "Apply",
                    Verb::Get | Verb::Plan => "this call",
                },
                caller.identity
            )));
        }
        Ok(Person { name: caller.identity, groups: Vec::new(), via: Via::Certificate })
    }
}

/// The person another replica forwards a call for (it let them through itself), from the
/// on-behalf-of metadata; a replica that names nobody is refused.
fn peer_person<T>(req: &Request<T>, peer: &str) -> Result<Person, Status> {
    use blockjanitor_rpc::auth::{ON_BEHALF_OF, ON_BEHALF_OF_GROUPS};
    let name = req
        .metadata()
        .get(ON_BEHALF_OF)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .ok_or_else(|| {
            Status::permission_denied(format!(
                "{peer} is a console replica: it may call only on behalf of a person named in {ON_BEHALF_OF}"
            ))
        })?;
    let groups = req
        .metadata()
        .get_all(ON_BEHALF_OF_GROUPS)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::to_owned)
        .collect();
    Ok(Person { name: name.to_owned(), groups, via: Via::Peer })
}

/// `/metrics` behind the API server's review: the scraper's bearer token (TokenReview) and `get`
/// on the path (SubjectAccessReview with nonResourceAttributes, which Prometheus' usual
/// ClusterRole grants: `nonResourceURLs: ["/metrics"], verbs: ["get"]`).
pub struct MetricsGate(pub Arc<Reviewer>);

impl Gate for MetricsGate {
    fn admit(&self, path: &str, authorization: Option<String>) -> GateFuture {
        let (reviewer, path) = (Arc::clone(&self.0), path.to_owned());
        Box::pin(async move {
            let refuse = |status: u16, message: String| Refusal { status, message };
            let value = authorization.ok_or_else(|| {
                refuse(401, "a bearer token is required (authorization: Bearer TOKEN)".into())
            })?;
            let token = person::bearer(&value).map_err(|e| refuse(401, e.into()))?;
            let review = async {
                let user = reviewer.authenticate(token).await?;
                reviewer.authorize(&user, &Ask::Path(path)).await
            };
            review.await.map_err(|e| {
                let status = match &e {
                    ReviewError::NotAuthenticated(_) => 401,
                    ReviewError::Denied(_) => 403,
                    ReviewError::Unavailable { .. } => 503,
                };
                refuse(status, e.to_string())
            })
        })
    }
}
