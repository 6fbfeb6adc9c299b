//! Who is calling, and what they may do.
//!
//! Unix socket: the peer's credentials (`SO_PEERCRED`): uid 0 is an operator; a member of the
//! socket's group (primary or supplementary, from `/proc/PID/status`) is a viewer; anyone else is
//! refused. TCP: the verified client certificate's DNS SANs and CN, matched against the config's
//! `operators` and `viewers`.

use std::sync::Arc;

use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Status};
use x509_parser::prelude::{FromDer, GeneralName, X509Certificate};

/// What a caller may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Role {
    Viewer,
    Operator,
}

/// The rules, from the config.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// GID of the unix socket's group, whose members are viewers.
    pub socket_gid: Option<u32>,
    pub socket_group_name: Option<String>,
    pub tcp_operators: Vec<String>,
    pub tcp_viewers: Vec<String>,
}

/// Identities (DNS SANs, then CN) in a DER certificate.
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
    for cn in cert.subject().iter_common_name() {
        if let Ok(s) = cn.as_str() {
            if !out.iter().any(|o| o == s) {
                out.push(s.to_owned());
            }
        }
    }
    out
}

fn groups_of(pid: i32) -> Vec<u32> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { return Vec::new() };
    status
        .lines()
        .filter_map(|l| l.strip_prefix("Groups:").or_else(|| l.strip_prefix("Gid:")))
        .flat_map(|rest| rest.split_whitespace().filter_map(|g| g.parse().ok()).collect::<Vec<u32>>())
        .collect()
}

impl Policy {
    /// The caller's role, or PermissionDenied saying why.
    pub fn role<T>(&self, req: &Request<T>) -> Result<Role, Status> {
        if let Some(info) = req.extensions().get::<UdsConnectInfo>() {
            let Some(cred) = info.peer_cred else {
                return Err(Status::permission_denied(
                    "cannot read the peer's credentials on the unix socket",
                ));
            };
            if cred.uid() == 0 {
                return Ok(Role::Operator);
            }
            let member = self.socket_gid.is_some_and(|g| {
                cred.gid() == g || cred.pid().is_some_and(|pid| groups_of(pid).contains(&g))
            });
            if member {
                return Ok(Role::Viewer);
            }
            return Err(Status::permission_denied(format!(
                "uid {} is neither root nor a member of the socket's group{}",
                cred.uid(),
                self.socket_group_name.as_deref().map(|g| format!(" ({g})")).unwrap_or_default()
            )));
        }
        let certs: Option<Arc<Vec<_>>> = req.peer_certs();
        let Some(certs) = certs.filter(|c| !c.is_empty()) else {
            return Err(Status::unauthenticated("a client certificate is required"));
        };
        let ids = cert_identities(certs[0].as_ref());
        if ids.iter().any(|i| self.tcp_operators.contains(i)) {
            return Ok(Role::Operator);
        }
        if ids.iter().any(|i| self.tcp_viewers.contains(i)) {
            return Ok(Role::Viewer);
        }
        Err(Status::permission_denied(format!("client identity {ids:?} has no role in this agent's config")))
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
