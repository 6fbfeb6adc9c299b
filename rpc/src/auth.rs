//! Who is calling, and what they may do.
//!
//! Unix socket: the peer's credentials as the kernel recorded them at connect time
//! (`SO_PEERCRED`, `SO_PEERGROUPS`: [`super::peer`]): uid 0 is an operator; a member of the
//! socket's group (primary or supplementary) is a viewer; anyone else is refused. TCP: the
//! verified client certificate's DNS SANs (its CN only when it has none), matched against the
//! config's `operators`, `consoles` and `viewers`.
//!
//! Every identity names one person (a team never shares an operator certificate: the shipped
//! manifests make none; each operator gets their own, listed in `operators`), or the console.
//! The console role is the fleet console's: it reads like a viewer and may call Apply only on
//! behalf of someone, named in the [`ON_BEHALF_OF`] metadata (their groups in
//! [`ON_BEHALF_OF_GROUPS`]), which the audit log records next to the console's own identity. (The
//! console forwards only a person the cluster reviewed: TokenReview and SubjectAccessReview of
//! `apply` on `fleet.blockjanitor.io`, or a per-person certificate it lists as an operator.)

use std::sync::Arc;

use super::peer::PeerInfo;
use tonic::{Request, Status};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Viewer,
    /// The fleet console: a viewer that may forward an operator's Apply (with [`ON_BEHALF_OF`]).
    Console,
    Operator,
}

/// The metadata key in which the console names the person it forwards a call for.
pub const ON_BEHALF_OF: &str = "x-blockjanitor-on-behalf-of";
/// The metadata key, one value per group, with that person's groups (as the TokenReview named
/// them).
pub const ON_BEHALF_OF_GROUPS: &str = "x-blockjanitor-on-behalf-of-groups";

/// Who is calling: the role and a name for the audit log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub role: Role,
    /// `uid N` on the unix socket; the certificate's first identity on TCP.
    pub identity: String,
    /// Whether it came over the node's unix socket.
    pub on_socket: bool,
}

/// The rules, from the config.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// GID of the unix socket's group, whose members are viewers.
    pub socket_gid: Option<u32>,
    pub socket_group_name: Option<String>,
    pub tcp_operators: Vec<String>,
    pub tcp_viewers: Vec<String>,
    /// Client identities with the console role.
    pub tcp_consoles: Vec<String>,
    /// A uid besides 0 that is an operator on the unix socket: only the agent's server on a
    /// simulated host sets it (its tests run as a normal user); never from a config.
    pub socket_operator: Option<u32>,
}

/// Identities in a DER certificate: its DNS SANs; its CN only when it has no DNS SAN (as RFC
/// 6125 has it: a CA that issues SANs vouches for those, and a CN beside them may say anything).
pub fn cert_identities(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = X509Certificate::from_der(der) else { return Vec::new() };
    let mut out = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let GeneralName::DNSName(d) = n {
                out.push((*d).to_owned());
            }
        }
    }
    if out.is_empty() {
        out.extend(cert.subject().iter_common_name().filter_map(|cn| cn.as_str().ok()).map(str::to_owned));
    }
    out
}

/// The person a call is made for: the one the console names (console role only; anyone else's
/// [`ON_BEHALF_OF`] is only recorded, never used to count), else the caller itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Person {
    /// `console for alice` when forwarded, else the caller's identity: the key for per-person
    /// limits.
    pub key: String,
    /// Whom the audit line names as acting.
    pub name: String,
    /// Their groups, when the console named them.
    pub groups: Vec<String>,
}

/// The person behind `req` from `caller` (see [`Person`]).
pub fn person<T>(caller: &Caller, req: &Request<T>) -> Person {
    let named = (caller.role == Role::Console)
        .then(|| req.metadata().get(ON_BEHALF_OF).and_then(|v| v.to_str().ok()))
        .flatten()
        .map(str::trim)
        .filter(|w| !w.is_empty());
    match named {
        Some(who) => Person {
            key: format!("{} for {who}", caller.identity),
            name: who.to_owned(),
            groups: req
                .metadata()
                .get_all(ON_BEHALF_OF_GROUPS)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .map(str::to_owned)
                .collect(),
        },
        None => Person { key: caller.identity.clone(), name: caller.identity.clone(), groups: Vec::new() },
    }
}

impl Policy {
    /// The caller's role, or PermissionDenied saying why.
    pub fn role<T>(&self, req: &Request<T>) -> Result<Role, Status> {
        self.caller(req).map(|c| c.role)
    }

    /// The caller's role and identity, or PermissionDenied saying why.
    pub fn caller<T>(&self, req: &Request<T>) -> Result<Caller, Status> {
        if let Some(info) = req.extensions().get::<PeerInfo>() {
            let Some(cred) = info.uds.peer_cred else {
                return Err(Status::permission_denied(
                    "cannot read the peer's credentials on the unix socket",
                ));
            };
            let identity = format!("uid {}", cred.uid());
            if cred.uid() == 0 || self.socket_operator == Some(cred.uid()) {
                return Ok(Caller { role: Role::Operator, identity, on_socket: true });
            }
            let supplementary = info.groups.as_ref().map(|g| g.as_slice());
            let member = self
                .socket_gid
                .is_some_and(|g| cred.gid() == g || supplementary.is_ok_and(|groups| groups.contains(&g)));
            if member {
                return Ok(Caller { role: Role::Viewer, identity, on_socket: true });
            }
            return Err(Status::permission_denied(format!(
                "uid {} is neither root nor a member of the socket's group{}{}",
                cred.uid(),
                self.socket_group_name.as_deref().map(|g| format!(" ({g})")).unwrap_or_default(),
                // Fail closed, and say why a member may have been turned away.
                supplementary
                    .err()
                    .map(|e| format!(" (its supplementary groups are unknown: {e})"))
                    .unwrap_or_default()
            )));
        }
        let certs: Option<Arc<Vec<_>>> = req.peer_certs();
        let Some(certs) = certs.filter(|c| !c.is_empty()) else {
            return Err(Status::unauthenticated("a client certificate is required"));
        };
        let ids = cert_identities(certs[0].as_ref());
        let found = |list: &[String]| ids.iter().find(|i| list.contains(i)).cloned();
        if let Some(identity) = found(&self.tcp_operators) {
            return Ok(Caller { role: Role::Operator, identity, on_socket: false });
        }
        if let Some(identity) = found(&self.tcp_consoles) {
            return Ok(Caller { role: Role::Console, identity, on_socket: false });
        }
        if let Some(identity) = found(&self.tcp_viewers) {
            return Ok(Caller { role: Role::Viewer, identity, on_socket: false });
        }
        Err(Status::permission_denied(format!("client identity {ids:?} has no role in this agent's config")))
    }

    /// For Apply: an operator, or the console on behalf of someone it names in [`ON_BEHALF_OF`].
    /// Returns the caller and whom it says it acts for (required of the console).
    pub fn require_apply<T>(&self, req: &Request<T>) -> Result<(Caller, Option<String>), Status> {
        let caller = self.caller(req)?;
        let on_behalf = req
            .metadata()
            .get(ON_BEHALF_OF)
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .map(str::to_owned);
        match caller.role {
            // An operator may act anyway; whom it says it acts for is recorded as said (a
            // console configured as an operator forwards this too).
            Role::Operator => Ok((caller, on_behalf)),
            Role::Console => match on_behalf {
                Some(who) => Ok((caller, Some(who))),
                None => Err(Status::permission_denied(format!(
                    "the console may call Apply only on behalf of a person named in {ON_BEHALF_OF}"
                ))),
            },
            Role::Viewer => Err(Status::permission_denied(
                "this call needs the operator role (root on the socket, or your own operator certificate \
                 listed in tcp.operators, or the console's Apply as a person the cluster lets apply)",
            )),
        }
    }

    /// Checks that the caller has at least `need`.
    pub fn require<T>(&self, req: &Request<T>, need: Role) -> Result<Role, Status> {
        let role = self.role(req)?;
        if role < need {
            return Err(Status::permission_denied(
                "this call needs the operator role (root on the socket, or an operator certificate)",
            ));
        }
        Ok(role)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(cn: &str, sans: &[&str]) -> Vec<u8> {
        let mut params =
            rcgen::CertificateParams::new(sans.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
                .expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, cn);
        let key = rcgen::KeyPair::generate().expect("key");
        params.self_signed(&key).expect("cert").der().to_vec()
    }

    #[test]
    fn a_common_name_counts_only_without_dns_sans() {
        assert_eq!(cert_identities(&cert("admin", &["viewer.example"])), ["viewer.example"]);
        assert_eq!(cert_identities(&cert("admin", &[])), ["admin"]);
        assert_eq!(cert_identities(&cert("a", &["b.example", "c.example"])), ["b.example", "c.example"]);
        assert!(cert_identities(b"not a certificate").is_empty());
    }

    #[test]
    fn only_the_console_names_a_person_and_each_counts_apart() {
        let mut req = Request::new(());
        req.metadata_mut().insert(ON_BEHALF_OF, "alice".parse().expect("value"));
        req.metadata_mut().append(ON_BEHALF_OF_GROUPS, "ops".parse().expect("value"));
        req.metadata_mut().append(ON_BEHALF_OF_GROUPS, "system:authenticated".parse().expect("value"));
        let console =
            Caller { role: Role::Console, identity: "console.blockjanitor.svc".into(), on_socket: false };
        let p = person(&console, &req);
        assert_eq!(p.key, "console.blockjanitor.svc for alice");
        assert_eq!(p.name, "alice");
        assert_eq!(p.groups, ["ops", "system:authenticated"]);
        let operator = Caller { role: Role::Operator, identity: "bob".into(), on_socket: false };
        let p = person(&operator, &req);
        assert_eq!((p.key.as_str(), p.name.as_str()), ("bob", "bob"), "an operator cannot name someone else");
        assert!(p.groups.is_empty());
        let bare = person(&console, &Request::new(()));
        assert_eq!(bare.name, "console.blockjanitor.svc");
    }
}
