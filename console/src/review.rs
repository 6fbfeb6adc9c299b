//! The cluster's word on a caller, asked of the API server with the console's own service
//! account: TokenReview (`authentication.k8s.io/v1`: is this bearer token someone, and who:
//! username, uid, groups, extra) and SubjectAccessReview (`authorization.k8s.io/v1`: may that
//! user do this verb on `fleet.blockjanitor.io` in the console's namespace, or `get` a path),
//! as kube-rbac-proxy and aggregated API servers ask them.
//!
//! Audiences: without `--token-audience` the review names none, so the API server checks the
//! token against its own audiences: a token good for the API server (a user's kubeconfig token,
//! an OIDC id token, an exec plugin's output) is good here. With one, the token must have been
//! issued for it (`status.audiences` must name it), e.g. a ServiceAccount token from
//! `kubectl create token NAME --audience blockjanitor-console`.
//!
//! Answers are cached briefly ([`ReviewOptions::ttl`], bounded to [`ReviewOptions::capacity`]
//! entries each), denials and unauthenticated tokens too, so a burst of calls costs one review.
//! Every review has a deadline; an API server that does not answer (or refuses the console's own
//! review) is [`ReviewError::Unavailable`]: the caller is refused, never let through.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::Api;

use crate::person::{self, Ask, User, API_GROUP, RESOURCE};
use crate::ttl_cache::TtlCache;

/// How reviews are asked and kept.
#[derive(Clone, Debug)]
pub struct ReviewOptions {
    /// The audience a token must carry (`None`: the API server's own).
    pub audience: Option<String>,
    /// How long an answer is reused.
    pub ttl: Duration,
    /// Deadline of one review.
    pub timeout: Duration,
    /// Answers kept at most, per kind of review.
    pub capacity: usize,
}

impl Default for ReviewOptions {
    fn default() -> Self {
        ReviewOptions {
            audience: None,
            ttl: Duration::from_secs(10),
            timeout: Duration::from_secs(5),
            capacity: 4096,
        }
    }
}

/// Why a caller is not let through.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReviewError {
    /// The token is nobody (UNAUTHENTICATED).
    #[error("the Kubernetes API server does not authenticate this token{}", detail(.0))]
    NotAuthenticated(String),
    /// The user may not (PERMISSION_DENIED).
    #[error("{0}")]
    Denied(String),
    /// The API server could not be asked (UNAVAILABLE): nothing is let through.
    #[error("cannot review the caller with the Kubernetes API server ({what}): {message}; nothing was done")]
    Unavailable { what: &'static str, message: String },
}

fn detail(reason: &str) -> String {
    if reason.trim().is_empty() {
        String::new()
    } else {
        format!(": {}", reason.trim())
    }
}

/// TokenReviews and SubjectAccessReviews with their caches.
pub struct Reviewer {
    client: kube::Client,
    opts: ReviewOptions,
    tokens: Mutex<TtlCache<String, Result<User, String>>>,
    access: Mutex<TtlCache<(User, Ask), Result<(), String>>>,
}

impl Reviewer {
    pub fn new(client: kube::Client, opts: ReviewOptions) -> Self {
        Reviewer {
            tokens: Mutex::new(TtlCache::new(opts.capacity)),
            access: Mutex::new(TtlCache::new(opts.capacity)),
            client,
            opts,
        }
    }

    /// Who the bearer `token` is.
    pub async fn authenticate(&self, token: &str) -> Result<User, ReviewError> {
        if let Some(known) = lock(&self.tokens).get(&token.to_owned(), Instant::now()) {
            return known.map_err(ReviewError::NotAuthenticated);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: Some(token.to_owned()),
                audiences: self.opts.audience.clone().map(|a| vec![a]),
            },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answered =
            self.ask("TokenReview", "tokenreviews", api.create(&PostParams::default(), &review)).await?;
        let outcome = user_of(&answered, self.opts.audience.as_deref());
        lock(&self.tokens).put(token.to_owned(), outcome.clone(), self.opts.ttl, Instant::now());
        outcome.map_err(ReviewError::NotAuthenticated)
    }

    /// Whether `user` may do `ask`.
    pub async fn authorize(&self, user: &User, ask: &Ask) -> Result<(), ReviewError> {
        let key = (user.clone(), ask.clone());
        if let Some(known) = lock(&self.access).get(&key, Instant::now()) {
            return known.map_err(ReviewError::Denied);
        }
        let review = SubjectAccessReview { spec: access_spec(user, ask), ..Default::default() };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answered = self
            .ask("SubjectAccessReview", "subjectaccessreviews", api.create(&PostParams::default(), &review))
            .await?;
        let status = answered.status.unwrap_or_default();
        let outcome = if status.allowed && status.denied != Some(true) {
            Ok(())
        } else {
            let reason = [status.reason.unwrap_or_default(), status.evaluation_error.unwrap_or_default()]
                .into_iter()
                .filter(|s| !s.trim().is_empty())
                .collect::<Vec<_>>()
                .join("; ");
            Err(person::denied(&user.name, ask, &reason))
        };
        lock(&self.access).put(key, outcome.clone(), self.opts.ttl, Instant::now());
        outcome.map_err(ReviewError::Denied)
    }

    /// One review within the deadline; any failure is [`ReviewError::Unavailable`].
    async fn ask<T>(
        &self,
        what: &'static str,
        resource: &str,
        call: impl std::future::Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, ReviewError> {
        let unavailable = |message: String| ReviewError::Unavailable { what, message };
        match tokio::time::timeout(self.opts.timeout, call).await {
            Err(_) => Err(unavailable(format!("no answer within {} ms", self.opts.timeout.as_millis()))),
            Ok(Ok(answer)) => Ok(answer),
            Ok(Err(kube::Error::Api(s))) if s.code == 403 => Err(unavailable(format!(
                "the API server refuses the console's own review: {} (does the console's ClusterRole grant \
                 create on {resource}?)",
                s.message
            ))),
            Ok(Err(e)) => Err(unavailable(blockjanitor_rpc::client::error_chain(&e))),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The user a TokenReview answered, or why the token is nobody (for `audience`, its status must
/// name it).
fn user_of(review: &TokenReview, audience: Option<&str>) -> Result<User, String> {
    let status = review.status.clone().unwrap_or_default();
    if status.authenticated != Some(true) {
        return Err(status.error.unwrap_or_default());
    }
    if let Some(a) = audience {
        if !status.audiences.iter().flatten().any(|x| x == a) {
            return Err(format!("the token was not issued for the audience {a}"));
        }
    }
    let info = status.user.unwrap_or_default();
    let name = info.username.unwrap_or_default();
    if name.is_empty() {
        return Err("the review names no user".into());
    }
    Ok(User {
        name,
        uid: info.uid.unwrap_or_default(),
        groups: info.groups.unwrap_or_default(),
        extra: info.extra.unwrap_or_default(),
    })
}

/// The SubjectAccessReview's spec for `user` and `ask`.
fn access_spec(user: &User, ask: &Ask) -> SubjectAccessReviewSpec {
    let (resource_attributes, non_resource_attributes) = match ask {
        Ask::Fleet { verb, namespace } => (
            Some(ResourceAttributes {
                group: Some(API_GROUP.into()),
                resource: Some(RESOURCE.into()),
                verb: Some(verb.as_str().into()),
                namespace: Some(namespace.clone()),
                ..Default::default()
            }),
            None,
        ),
        Ask::Path(path) => {
            (None, Some(NonResourceAttributes { path: Some(path.clone()), verb: Some("get".into()) }))
        }
    };
    SubjectAccessReviewSpec {
        user: Some(user.name.clone()),
        uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
        groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
        extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
        resource_attributes,
        non_resource_attributes,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::person::Verb;

    fn review(status: serde_json::Value) -> TokenReview {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
            "metadata": {}, "spec": {"token": "t"}, "status": status}))
        .expect("TokenReview")
    }

    #[test]
    fn a_review_is_someone_only_when_authenticated_with_a_name_and_the_audience() {
        let alice = review(
            serde_json::json!({"authenticated": true, "audiences": ["https://kubernetes.default.svc"],
            "user": {"username": "alice", "uid": "u-1", "groups": ["ops", "system:authenticated"]}}),
        );
        let u = user_of(&alice, None).expect("alice");
        assert_eq!((u.name.as_str(), u.uid.as_str()), ("alice", "u-1"));
        assert_eq!(u.groups, ["ops", "system:authenticated"]);
        assert_eq!(
            user_of(&alice, Some("blockjanitor-console")),
            Err("the token was not issued for the audience blockjanitor-console".into())
        );
        let nobody = review(serde_json::json!({"authenticated": false, "error": "token expired"}));
        assert_eq!(user_of(&nobody, None), Err("token expired".into()));
        assert!(user_of(&review(serde_json::json!({})), None).is_err(), "no status: nobody");
        let nameless = review(serde_json::json!({"authenticated": true, "user": {}}));
        assert_eq!(user_of(&nameless, None), Err("the review names no user".into()));
        let e = ReviewError::NotAuthenticated(String::new());
        assert_eq!(e.to_string(), "the Kubernetes API server does not authenticate this token");
    }

    #[test]
    fn the_access_review_names_the_verb_on_fleet_in_the_namespace() {
        let user = User { name: "alice".into(), groups: vec!["ops".into()], ..Default::default() };
        let spec = access_spec(&user, &Ask::Fleet { verb: Verb::Apply, namespace: "blockjanitor".into() });
        let v = serde_json::to_value(&spec).expect("json");
        assert_eq!(
            v,
            serde_json::json!({"user": "alice", "groups": ["ops"],
                "resourceAttributes": {"group": "blockjanitor.io", "resource": "fleet", "verb": "apply",
                                       "namespace": "blockjanitor"}})
        );
        let metrics = serde_json::to_value(access_spec(&user, &Ask::Path("/metrics".into()))).expect("json");
        assert_eq!(metrics["nonResourceAttributes"], serde_json::json!({"path": "/metrics", "verb": "get"}));
    }
}
