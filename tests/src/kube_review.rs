//! The stand-in API server's authentication and authorization APIs, as kube-apiserver serves
//! them to a component that reviews its callers (kube-rbac-proxy, an aggregated API server, the
//! fleet console): `POST /apis/authentication.k8s.io/v1/tokenreviews` and `POST
//! /apis/authorization.k8s.io/v1/subjectaccessreviews`. Each request body is decoded as the API
//! server decodes it, through the typed model (`k8s-openapi`'s `TokenReview`,
//! `SubjectAccessReview`: a wrong `apiVersion`, `kind` or shape is a 400), and the answer is the
//! same object with its `status` set, encoded from that model (201 Created, as the API server
//! answers a create of these virtual resources).
//!
//! What it answers comes from the test ([`Reviews`]): a table of bearer tokens to users (name,
//! uid, groups), and RBAC bindings (a user or group granted verbs on a resource of an API group,
//! in a namespace or cluster-wide, as a RoleBinding or ClusterRoleBinding would). A token not in
//! the table is not authenticated (`status.authenticated: false`, with the error the API server
//! gives); a review nothing grants is `allowed: false` with no reason (what the RBAC authorizer
//! answers). Only the callers the test lists may create reviews (the console's own token, as its
//! ClusterRole allows): anyone else gets 403. [`Reviews::hang`]: every review is left unanswered,
//! as an API server cut off from its callers (or with its authentication webhook down).

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewStatus, UserInfo};
use k8s_openapi::api::authorization::v1::{SubjectAccessReview, SubjectAccessReviewStatus};
use serde_json::{json, Value};

use crate::kube_mock::{parse_query, reply, ApiServer, Body, Recorded};

pub const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
pub const ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// Who a token is.
#[derive(Clone, Debug)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

/// One binding: `subject` (`User:NAME` or `Group:NAME`) may `verbs` on `resource` in `group`, in
/// `namespace` (`None`: cluster-wide, a ClusterRoleBinding); `binding` names it in the reason. A
/// grant whose `group` is empty and whose `resource` starts with `/` is a non-resource URL (a
/// ClusterRole's `nonResourceURLs`, such as `/metrics`).
#[derive(Clone, Debug)]
pub struct Grant {
    pub subject: String,
    pub group: String,
    pub resource: String,
    pub verbs: Vec<String>,
    pub namespace: Option<String>,
    pub binding: String,
}

/// The table the test sets.
#[derive(Default)]
pub struct Reviews {
    pub tokens: std::collections::HashMap<String, User>,
    pub grants: Vec<Grant>,
    /// Bearer tokens allowed to create reviews.
    pub reviewers: Vec<String>,
    /// Every review left unanswered.
    pub hang: bool,
}

impl ApiServer {
    /// `token` is `user` (with `groups`, and the groups every authenticated user has).
    pub fn user(&self, token: &str, user: &str, groups: &[&str]) {
        let mut groups: Vec<String> = groups.iter().map(|g| (*g).to_owned()).collect();
        groups.push("system:authenticated".into());
        let u = User { name: user.into(), uid: format!("uid-{user}"), groups };
        self.state.lock().expect("state").reviews.tokens.insert(token.into(), u);
    }

    /// Grants `subject` (`User:alice`, `Group:sre`) `verbs` on `resource.group` in `namespace`.
    pub fn grant(&self, subject: &str, group: &str, resource: &str, verbs: &[&str], namespace: Option<&str>) {
        let binding = format!("{}-{resource}", subject.split(':').nth(1).unwrap_or(subject));
        self.state.lock().expect("state").reviews.grants.push(Grant {
            subject: subject.into(),
            group: group.into(),
            resource: resource.into(),
            verbs: verbs.iter().map(|v| (*v).to_owned()).collect(),
            namespace: namespace.map(str::to_owned),
            binding,
        });
    }

    /// Requests with this bearer token may create reviews.
    pub fn reviewer(&self, token: &str) {
        self.state.lock().expect("state").reviews.reviewers.push(token.into());
    }

    /// Every review from now on is left unanswered (`true`), or answered again.
    pub fn hang_reviews(&self, on: bool) {
        self.state.lock().expect("state").reviews.hang = on;
    }

    /// The reviews received, in order.
    pub fn reviews_received(&self) -> Vec<Recorded> {
        self.requests().into_iter().filter(|r| r.path == TOKEN_REVIEWS || r.path == ACCESS_REVIEWS).collect()
    }
}

/// Serves the request when it is a review; gives it back otherwise.
pub async fn route(server: &ApiServer, req: Request<Incoming>) -> Result<Response<Body>, Request<Incoming>> {
    let path = req.uri().path().to_owned();
    if path != TOKEN_REVIEWS && path != ACCESS_REVIEWS {
        return Err(req);
    }
    let header = |name: hyper::header::HeaderName| {
        req.headers().get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_owned()
    };
    let (authorization, content_type, accept) = (
        header(hyper::header::AUTHORIZATION),
        header(hyper::header::CONTENT_TYPE),
        header(hyper::header::ACCEPT),
    );
    let (method, query) = (req.method().clone(), parse_query(req.uri().query().unwrap_or("")));
    let bytes = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    let rec = Recorded {
        method: method.clone(),
        path: path.clone(),
        query,
        content_type,
        authorization,
        accept,
        body,
    };
    server.state.lock().expect("state").requests.push(rec.clone());
    if server.state.lock().expect("state").reviews.hang {
        std::future::pending::<()>().await;
    }
    let token = rec.authorization.strip_prefix("Bearer ").unwrap_or("").to_owned();
    let resource = path.rsplit('/').next().unwrap_or_default().to_owned();
    if method != Method::POST {
        return Ok(status(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "only create is served"));
    }
    if !server.state.lock().expect("state").reviews.reviewers.contains(&token) {
        let group = path.split('/').nth(2).unwrap_or_default();
        return Ok(status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            &format!("{resource}.{group} is forbidden: User \"{token}\" cannot create resource \"{resource}\" in API group \"{group}\" at the cluster scope"),
        ));
    }
    Ok(if path == TOKEN_REVIEWS { token_review(server, &rec.body) } else { access_review(server, &rec.body) })
}

fn token_review(server: &ApiServer, body: &Value) -> Response<Body> {
    let mut review: TokenReview = match serde_json::from_value(body.clone()) {
        Ok(r) => r,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", &format!("TokenReview: {e}")),
    };
    let token = review.spec.token.clone().unwrap_or_default();
    let user = server.state.lock().expect("state").reviews.tokens.get(&token).cloned();
    review.status = Some(match user {
        Some(u) => TokenReviewStatus {
            authenticated: Some(true),
            // The API server's own audience when the review names none; else those it asked for.
            audiences: Some(
                review
                    .spec
                    .audiences
                    .clone()
                    .unwrap_or_else(|| vec!["https://kubernetes.default.svc".into()]),
            ),
            user: Some(UserInfo {
                username: Some(u.name),
                uid: Some(u.uid),
                groups: Some(u.groups),
                extra: None,
            }),
            error: None,
        },
        None => TokenReviewStatus {
            authenticated: Some(false),
            audiences: None,
            user: Some(UserInfo::default()),
            error: Some("[invalid bearer token, token lookup failed]".into()),
        },
    });
    created(&review)
}

fn access_review(server: &ApiServer, body: &Value) -> Response<Body> {
    let mut review: SubjectAccessReview = match serde_json::from_value(body.clone()) {
        Ok(r) => r,
        Err(e) => return status(StatusCode::BAD_REQUEST, "BadRequest", &format!("SubjectAccessReview: {e}")),
    };
    let spec = &review.spec;
    let text = |v: &Option<String>| v.clone().unwrap_or_default();
    // (group, resource or path, verb, namespace) as RBAC matches them.
    let asked = match (&spec.resource_attributes, &spec.non_resource_attributes) {
        (Some(a), None) => (text(&a.group), text(&a.resource), text(&a.verb), text(&a.namespace)),
        (None, Some(n)) => (String::new(), text(&n.path), text(&n.verb), String::new()),
        _ => {
            let e = "exactly one of resourceAttributes, nonResourceAttributes must be specified";
            return status(StatusCode::UNPROCESSABLE_ENTITY, "Invalid", e);
        }
    };
    let user = spec.user.clone().unwrap_or_default();
    let subjects: Vec<String> = std::iter::once(format!("User:{user}"))
        .chain(spec.groups.iter().flatten().map(|g| format!("Group:{g}")))
        .collect();
    let st = server.state.lock().expect("state");
    let found = st.reviews.grants.iter().find(|g| {
        subjects.contains(&g.subject)
            && g.group == asked.0
            && g.resource == asked.1
            && g.verbs.iter().any(|v| *v == asked.2 || v == "*")
            && g.namespace.as_ref().is_none_or(|ns| *ns == asked.3)
    });
    review.status = Some(match found {
        Some(g) => {
            let (kind, at) = match &g.namespace {
                Some(ns) => ("RoleBinding", format!("{}/{ns}", g.binding)),
                None => ("ClusterRoleBinding", g.binding.clone()),
            };
            let (skind, sname) = g.subject.split_once(':').unwrap_or(("User", &g.subject));
            SubjectAccessReviewStatus {
                allowed: true,
                reason: Some(format!(
                    "RBAC: allowed by {kind} \"{at}\" of Role \"{}\" to {skind} \"{sname}\"",
                    g.binding
                )),
                ..Default::default()
            }
        }
        None => SubjectAccessReviewStatus { allowed: false, ..Default::default() },
    });
    drop(st);
    created(&review)
}

/// 201 with the object as its typed model encodes it.
fn created<T: serde::Serialize>(object: &T) -> Response<Body> {
    let v = serde_json::to_value(object).expect("encode");
    reply(StatusCode::CREATED, &v)
}

fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    reply(
        code,
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": reason, "code": code.as_u16()}),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The typed model refuses what the API server would: another group's apiVersion, another
    /// kind, a spec of the wrong shape.
    #[test]
    fn a_review_of_the_wrong_shape_is_refused_by_its_typed_model() {
        let good =
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": "t"}});
        assert!(serde_json::from_value::<TokenReview>(good).is_ok());
        for bad in [
            json!({"apiVersion": "authentication.k8s.io/v1beta1", "kind": "TokenReview", "spec": {"token": "t"}}),
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SubjectAccessReview", "spec": {"token": "t"}}),
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": ["t"]}}),
        ] {
            assert!(serde_json::from_value::<TokenReview>(bad.clone()).is_err(), "{bad}");
        }
        let sar = json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
            "spec": {"user": "alice", "resourceAttributes": {"verb": "apply", "resource": "fleet"}}});
        assert!(serde_json::from_value::<SubjectAccessReview>(sar).is_ok());
        let v1beta1 = json!({"apiVersion": "authorization.k8s.io/v1beta1", "kind": "SubjectAccessReview",
            "spec": {"user": "alice"}});
        assert!(serde_json::from_value::<SubjectAccessReview>(v1beta1).is_err());
    }
}
