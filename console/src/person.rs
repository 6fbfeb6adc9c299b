//! Who is behind a call to the console, and what they ask to do, in the cluster's terms: a
//! [`Person`] (the username and groups a TokenReview answered, or the identity of a per-person
//! client certificate), the [`Verb`] a Fleet method needs on the resource `fleet` of the API
//! group `blockjanitor.io` (no CRD: RBAC rules may name any resource, and a SubjectAccessReview
//! evaluates them, as kube-rbac-proxy relies on), and the refusal a person can act on: which verb
//! on which resource in which namespace, and which shipped Role grants it. Pure.

/// The API group of the resource the console's RBAC names.
pub const API_GROUP: &str = "blockjanitor.io";
/// The resource: the fleet, as the console serves it.
pub const RESOURCE: &str = "fleet";
/// The shipped Role that grants `get` and `plan` (deploy/components/console/rbac-users.yaml).
pub const VIEWER_ROLE: &str = "blockjanitor-fleet-viewer";
/// The shipped Role that also grants `apply`.
pub const OPERATOR_ROLE: &str = "blockjanitor-fleet-operator";

/// What a Fleet method asks of the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verb {
    /// Every question (ListNodes, ListDevices, Where, WhoWatches, MultiAttach, Sweep).
    Get,
    /// Plan: each node's plan, asked afresh.
    Plan,
    /// Apply: the dry run and the execution.
    Apply,
}

impl Verb {
    pub fn as_str(self) -> &'static str {
        match self {
            Verb::Get => "get",
            Verb::Plan => "plan",
            Verb::Apply => "apply",
        }
    }

    /// The shipped Role that grants it.
    pub fn role(self) -> &'static str {
        match self {
            Verb::Get | Verb::Plan => VIEWER_ROLE,
            Verb::Apply => OPERATOR_ROLE,
        }
    }
}

/// What a SubjectAccessReview asks about.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Ask {
    /// A verb on `fleet.blockjanitor.io` in a namespace.
    Fleet { verb: Verb, namespace: String },
    /// `get` on a non-resource path (`/metrics`, as Prometheus' ClusterRoles grant it).
    Path(String),
}

/// How the console knows who the caller is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// A bearer token the API server's TokenReview authenticated.
    TokenReview,
    /// A client certificate from the console's client CA, listed one per person.
    Certificate,
    /// Another replica of the console, which let the person through itself and forwards their
    /// Apply to the holder of the apply Lease.
    Peer,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Via::TokenReview => "tokenreview",
            Via::Certificate => "certificate",
            Via::Peer => "peer-console",
        }
    }
}

/// The person behind a call, as the audit log names them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Person {
    pub name: String,
    pub groups: Vec<String>,
    pub via: Via,
}

/// A user as TokenReview answers and SubjectAccessReview asks.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
    pub extra: std::collections::BTreeMap<String, Vec<String>>,
}

/// The refusal of `ask` to `user`, as a person can act on it; `reason` is the authorizer's,
/// when it gave one.
pub fn denied(user: &str, ask: &Ask, reason: &str) -> String {
    let mut line = match ask {
        Ask::Fleet { verb, namespace } => format!(
            "user {user} may not '{}' {RESOURCE}.{API_GROUP} in namespace {namespace}: ask for the {} role \
             (kubectl -n {namespace} create rolebinding ... --role {} --user {user})",
            verb.as_str(),
            verb.role(),
            verb.role(),
        ),
        Ask::Path(path) => {
            format!("user {user} may not 'get' {path}: it needs a ClusterRole granting get on that path")
        }
    };
    if !reason.trim().is_empty() {
        line.push_str(&format!(" (the authorizer: {})", reason.trim()));
    }
    line
}

/// The token of an `authorization` value `Bearer TOKEN` (the scheme in any case), or why not.
pub fn bearer(value: &str) -> Result<&str, &'static str> {
    let (scheme, token) =
        value.trim().split_once(' ').ok_or("the authorization header is not 'Bearer TOKEN'")?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err("only bearer tokens are accepted (authorization: Bearer TOKEN)");
    }
    let token = token.trim();
    if token.is_empty() {
        return Err("the bearer token is empty");
    }
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_names_the_verb_the_resource_the_namespace_and_the_role() {
        let ask = Ask::Fleet { verb: Verb::Apply, namespace: "blockjanitor".into() };
        assert_eq!(
            denied("alice", &ask, ""),
            "user alice may not 'apply' fleet.blockjanitor.io in namespace blockjanitor: ask for the \
             blockjanitor-fleet-operator role (kubectl -n blockjanitor create rolebinding ... --role \
             blockjanitor-fleet-operator --user alice)"
        );
        let get = Ask::Fleet { verb: Verb::Get, namespace: "ops".into() };
        let line = denied("bob", &get, " no RBAC policy matched ");
        assert!(line.contains("'get' fleet.blockjanitor.io in namespace ops"), "{line}");
        assert!(line.contains("blockjanitor-fleet-viewer"), "{line}");
        assert!(line.ends_with("(the authorizer: no RBAC policy matched)"), "{line}");
        assert!(denied("p", &Ask::Path("/metrics".into()), "").contains("'get' /metrics"));
    }

    #[test]
    fn only_a_bearer_token_is_taken() {
        assert_eq!(bearer("Bearer abc.def"), Ok("abc.def"));
        assert_eq!(bearer("bearer  abc "), Ok("abc"));
        assert!(bearer("Basic dXNlcjpwYXNz").is_err());
        assert!(bearer("Bearer ").is_err());
        assert!(bearer("abc").is_err());
    }
}
