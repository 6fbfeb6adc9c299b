//! The agent API from the caller's side, for `agentctl`: connecting over the unix socket (with
//! one clear line when that fails) or over TCP with mutual TLS, turning gRPC statuses into one
//! line, and rendering responses as readable values and tables.
//!
//! Values keep the proto's field names; enum values become lower-case names without their prefix
//! (`DEVICE_KIND_LOOP` -> `"loop"`, `VERDICT_IN_USE` -> `"in_use"`, `TYPE_DEVICE_ADDED` ->
//! `"device_added"`). Every field is always present, so scripts see one shape. Tables escape
//! control characters in anything the agent sends (command lines, paths).

use std::fmt::Write as _;
use std::future::Future;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::agent_client::AgentClient;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity, Uri};
use tonic::{Request, Status};

use crate::cli::render::size;

/// Where the agent listens on its node unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/blockjanitor/agent.sock";

/// Responses larger than this are refused (a busy node's device list is far smaller).
const MAX_MESSAGE: usize = 64 << 20;

/// Where the agent is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// The agent's unix socket on this node.
    Unix(PathBuf),
    /// An agent on TCP with mutual TLS.
    Tcp(TcpTarget),
}

/// An agent on TCP with mutual TLS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TcpTarget {
    /// HOST:PORT.
    pub addr: String,
    /// Client certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM).
    pub key: PathBuf,
    /// CA that signed the agent's certificate (PEM).
    pub ca: PathBuf,
    /// The name the agent's certificate must carry.
    pub server_name: String,
}

impl Target {
    /// For messages: the socket path or `HOST:PORT`.
    pub fn describe(&self) -> String {
        match self {
            Self::Unix(p) => p.display().to_string(),
            Self::Tcp(t) => t.addr.clone(),
        }
    }
}

/// Why there is no connection, in one line.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("cannot connect to {}: no such socket (is blockjanitor-agent serve running?)", path.display())]
    NoSocket { path: PathBuf },
    #[error("cannot connect to {}: permission denied (run as root or as a member of {})", path.display(),
        group.as_deref().map_or_else(|| "the socket's group".to_owned(), |g| format!("group {g}")))]
    PermissionDenied { path: PathBuf, group: Option<String> },
    #[error("cannot connect to {}: connection refused (stale socket?)", path.display())]
    Refused { path: PathBuf },
    #[error("cannot connect to {}: not a socket", path.display())]
    NotSocket { path: PathBuf },
    #[error("cannot connect to {}: {source}", path.display())]
    Io { path: PathBuf, source: io::Error },
    #[error("cannot read {flag} {}: {source}", path.display())]
    ReadFile { flag: &'static str, path: PathBuf, source: io::Error },
    #[error("cannot connect to {target}: {message}")]
    Transport { target: String, message: String },
    #[error("cannot connect to {target}: no connection within {seconds}s")]
    Timeout { target: String, seconds: u64 },
}

/// Splits `HOST:PORT` (`[v6]:PORT` for IPv6 addresses); `None` when it is not that shape.
pub fn split_host_port(addr: &str) -> Option<(&str, u16)> {
    let (host, port) = match addr.strip_prefix('[') {
        Some(rest) => rest.split_once("]:")?,
        None => {
            let (h, p) = addr.rsplit_once(':')?;
            if h.contains(':') {
                return None;
            }
            (h, p)
        }
    };
    if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control() || c == '/') {
        return None;
    }
    Some((host, port.parse().ok()?))
}

/// The name of the group that owns `path`, or its number; `None` when it cannot be read.
fn socket_group(path: &Path) -> Option<String> {
    let gid = std::fs::metadata(path).ok()?.gid();
    match nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid)) {
        Ok(Some(g)) => Some(g.name),
        _ => Some(gid.to_string()),
    }
}

/// Turns a failed connect(2) on the socket into one clear error.
pub fn explain_socket_error(path: &Path, e: io::Error) -> ConnectError {
    let path = path.to_owned();
    match e.kind() {
        io::ErrorKind::NotFound => ConnectError::NoSocket { path },
        io::ErrorKind::PermissionDenied => {
            let group = socket_group(&path);
            ConnectError::PermissionDenied { path, group }
        }
        io::ErrorKind::ConnectionRefused => match std::fs::symlink_metadata(&path) {
            Ok(m) if !m.file_type().is_socket() => ConnectError::NotSocket { path },
            _ => ConnectError::Refused { path },
        },
        _ => ConnectError::Io { path, source: e },
    }
}

/// Tries the socket once with a plain connect(2), so that the usual failures (no agent, no
/// permission, stale socket) come out as one clear line rather than a transport error.
pub fn probe_socket(path: &Path) -> Result<(), ConnectError> {
    std::os::unix::net::UnixStream::connect(path).map(drop).map_err(|e| explain_socket_error(path, e))
}

/// An error and its causes on one line, each cause once.
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let s = c.to_string();
        if !msg.contains(&s) {
            msg = format!("{msg}: {s}");
        }
        cause = c.source();
    }
    one_line(&msg)
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn read_file(flag: &'static str, path: &Path) -> Result<Vec<u8>, ConnectError> {
    std::fs::read(path).map_err(|source| ConnectError::ReadFile { flag, path: path.to_owned(), source })
}

/// Connects to the agent; the whole attempt is bounded by `timeout`.
pub async fn connect(target: &Target, timeout: Duration) -> Result<AgentClient<Channel>, ConnectError> {
    connect_tuned(target, timeout, |e| e).await
}

/// Like [`connect`], with `tune` applied to the endpoint (keepalives, for a long-lived link).
pub async fn connect_tuned(
    target: &Target,
    timeout: Duration,
    tune: impl FnOnce(Endpoint) -> Endpoint,
) -> Result<AgentClient<Channel>, ConnectError> {
    Ok(AgentClient::new(connect_channel_tuned(target, timeout, tune).await?)
        .max_decoding_message_size(MAX_MESSAGE)
        .max_encoding_message_size(MAX_MESSAGE))
}

/// A channel to the agent (or, over TCP, to the fleet console, which speaks the same mutual
/// TLS); the whole attempt is bounded by `timeout`.
pub async fn connect_channel(target: &Target, timeout: Duration) -> Result<Channel, ConnectError> {
    connect_channel_tuned(target, timeout, |e| e).await
}

/// Like [`connect_channel`], with `tune` applied to the endpoint.
pub async fn connect_channel_tuned(
    target: &Target,
    timeout: Duration,
    tune: impl FnOnce(Endpoint) -> Endpoint,
) -> Result<Channel, ConnectError> {
    let transport = |e: &(dyn std::error::Error + 'static)| ConnectError::Transport {
        target: target.describe(),
        message: error_chain(e),
    };
    let attempt = async {
        let channel = match target {
            Target::Unix(path) => {
                probe_socket(path)?;
                let path = path.clone();
                // The URI is required by the API but unused: the connector ignores it.
                tune(Endpoint::from_static("http://[::]:50051"))
                    .connect_timeout(timeout)
                    .connect_with_connector(tower::service_fn(move |_: Uri| {
                        let path = path.clone();
                        async move {
                            Ok::<_, io::Error>(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
                        }
                    }))
                    .await
                    .map_err(|e| transport(&e))?
            }
            Target::Tcp(t) => {
                let cert = read_file("--cert", &t.cert)?;
                let key = read_file("--key", &t.key)?;
                let ca = read_file("--ca", &t.ca)?;
                let tls = ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(ca))
                    .identity(Identity::from_pem(cert, key))
                    .domain_name(t.server_name.clone());
                tune(Endpoint::from_shared(format!("https://{}", t.addr)).map_err(|e| transport(&e))?)
                    .connect_timeout(timeout)
                    .tls_config(tls)
                    .map_err(|e| transport(&e))?
                    .connect()
                    .await
                    .map_err(|e| transport(&e))?
            }
        };
        Ok(channel)
    };
    match tokio::time::timeout(timeout, attempt).await {
        Ok(r) => r,
        Err(_) => Err(ConnectError::Timeout { target: target.describe(), seconds: timeout.as_secs() }),
    }
}

/// A request that tells the agent how long the caller waits.
pub fn request<T>(message: T, timeout: Duration) -> Request<T> {
    let mut r = Request::new(message);
    r.set_timeout(timeout);
    r
}

/// Runs one unary call, giving up after `timeout`.
pub async fn call<T>(
    timeout: Duration,
    fut: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, Status> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r.map(tonic::Response::into_inner),
        Err(_) => Err(Status::deadline_exceeded(format!(
            "no answer from the agent within {}s (see --timeout)",
            timeout.as_secs()
        ))),
    }
}

/// `Code: message` on one line, e.g. `NotFound: unknown device 'sdz'`.
pub fn status_line(s: &Status) -> String {
    let mut msg = one_line(s.message());
    if msg.is_empty() {
        msg = s.code().description().to_owned();
    }
    if let Some(src) = std::error::Error::source(s) {
        let detail = error_chain(src);
        if detail.contains(&msg) {
            msg = detail;
        } else if !msg.contains(&detail) {
            msg = format!("{msg}: {detail}");
        }
    }
    // Transport errors often repeat a cause ("a: b: b"): say each once.
    let mut parts: Vec<&str> = Vec::new();
    for p in msg.split(": ") {
        if parts.last() != Some(&p) {
            parts.push(p);
        }
    }
    format!("{:?}: {}", s.code(), parts.join(": "))
}

// ---------------------------------------------------------------------------------------------
// Enum names.

fn lower_name(name: Option<&str>, prefix: &str, raw: i32) -> String {
    match name {
        Some(n) => n.strip_prefix(prefix).unwrap_or(n).to_ascii_lowercase(),
        None => format!("unknown({raw})"),
    }
}

/// `loop`, `in_use`... for a raw `DeviceKind`.
pub fn kind_name(raw: i32) -> String {
    lower_name(pb::DeviceKind::try_from(raw).ok().map(|k| k.as_str_name()), "DEVICE_KIND_", raw)
}

/// `stale`, `in_use`... for a raw `Verdict`.
pub fn verdict_name(raw: i32) -> String {
    lower_name(pb::Verdict::try_from(raw).ok().map(|v| v.as_str_name()), "VERDICT_", raw)
}

/// `mount`, `open_device`... for a raw `HolderKind`.
pub fn holder_kind_name(raw: i32) -> String {
    lower_name(pb::HolderKind::try_from(raw).ok().map(|k| k.as_str_name()), "HOLDER_KIND_", raw)
}

/// `device_added`, `verdict_changed`... for a raw `Event.Type`.
pub fn event_type_name(raw: i32) -> String {
    lower_name(pb::event::Type::try_from(raw).ok().map(|t| t.as_str_name()), "TYPE_", raw)
}

/// The `DeviceKind` for a lower-case name (`loop`); `None` for unknown names and `unspecified`.
pub fn parse_kind(name: &str) -> Option<pb::DeviceKind> {
    pb::DeviceKind::from_str_name(&format!("DEVICE_KIND_{}", name.to_ascii_uppercase()))
        .filter(|k| *k != pb::DeviceKind::Unspecified)
}

/// The `Verdict` for a lower-case name (`in_use`); `None` for unknown names and `unspecified`.
pub fn parse_verdict(name: &str) -> Option<pb::Verdict> {
    pb::Verdict::from_str_name(&format!("VERDICT_{}", name.to_ascii_uppercase()))
        .filter(|v| *v != pb::Verdict::Unspecified)
}

// ---------------------------------------------------------------------------------------------
// Values (for JSON and YAML).

pub fn node_value(n: &pb::Node) -> Value {
    json!({
        "name": n.name,
        "kernel": n.kernel,
        "agent_version": n.agent_version,
        "last_scan_unix_seconds": n.last_scan_unix_seconds,
        "last_scan_duration_ms": n.last_scan_duration_ms,
        "scans": n.scans,
        "devices": n.devices,
        "warnings": n.warnings,
        "mode": n.mode,
        "kubernetes": n.kubernetes,
        "blind_spots": n.blind_spots,
    })
}

pub fn holder_value(h: &pb::Holder) -> Value {
    json!({
        "kind": holder_kind_name(h.kind),
        "pids": h.pids,
        "pid_count": h.pid_count,
        "comm": h.comm,
        "cmdline": h.cmdline,
        "mount_namespace": h.mount_namespace,
        "in_host_namespace": h.in_host_namespace,
        "mount_point": h.mount_point,
        "container_id": h.container_id,
        "pod_uid": h.pod_uid,
        "path": h.path,
        "device": h.device,
        "fstype": h.fstype,
        "fds": h.fds,
        "description": h.description,
    })
}

pub fn device_value(d: &pb::Device) -> Value {
    json!({
        "name": d.name,
        "major": d.major,
        "minor": d.minor,
        "kind": kind_name(d.kind),
        "size_bytes": d.size_bytes,
        "read_only": d.read_only,
        "parent": d.parent,
        "stacked_on_top": d.stacked_on_top,
        "stacked_below": d.stacked_below,
        "loop_backing_file": d.loop_backing_file,
        "dm_name": d.dm_name,
        "dm_uuid": d.dm_uuid,
        "verdict": verdict_name(d.verdict),
        "reasons": d.reasons,
        "holders": d.holders.iter().map(holder_value).collect::<Vec<_>>(),
        "kernel_threads": d.kernel_threads,
        "pv_names": d.pv_names,
        "pod_uids": d.pod_uids,
        "kubelet_paths": d.kubelet_paths,
        "identity": d.identity,
        "rbd": d.rbd.as_ref().map(rbd_value),
        "wwid": d.wwid,
        "nbd_backend": d.nbd_backend,
        "nvme": d.nvme.as_ref().map(nvme_value),
    })
}

/// An NVMe namespace's role, subsystem and controllers.
pub fn nvme_value(n: &pb::NvmeNamespace) -> Value {
    json!({
        "role": n.role,
        "subsystem": n.subsystem,
        "subsysnqn": n.subsysnqn,
        "head": n.head,
        "live_controllers": n.live_controllers,
        "outage_target": n.outage_target,
        "siblings": n.siblings,
        "controllers": n.controllers.iter().map(|c| json!({
            "name": c.name,
            "transport": c.transport,
            "subsysnqn": c.subsysnqn,
            "address": c.address,
            "state": c.state,
            "ctrl_loss_tmo": c.ctrl_loss_tmo,
            "reconnect_delay": c.reconnect_delay,
            "cntlid": c.cntlid,
            "hostnqn": c.hostnqn,
            "fabrics": c.fabrics,
        })).collect::<Vec<_>>(),
    })
}

pub fn rbd_value(r: &pb::RbdMapping) -> Value {
    json!({
        "id": r.id,
        "pool": r.pool,
        "pool_namespace": r.pool_namespace,
        "image": r.image,
        "image_id": r.image_id,
        "snap": r.snap,
        "client_id": r.client_id,
        "client_addr": r.client_addr,
        "cluster_fsid": r.cluster_fsid,
    })
}

pub fn devices_value(r: &pb::ListDevicesResponse) -> Value {
    json!({
        "devices": r.devices.iter().map(device_value).collect::<Vec<_>>(),
        "scan_unix_seconds": r.scan_unix_seconds,
    })
}

pub fn holders_value(r: &pb::ListHoldersResponse) -> Value {
    json!({ "device": r.device.as_ref().map(device_value) })
}

pub fn step_value(s: &pb::Step) -> Value {
    json!({ "action": s.action, "device": s.device, "description": s.description })
}

pub fn plan_value(p: &pb::DevicePlan) -> Value {
    json!({
        "device": p.device,
        "steps": p.steps.iter().map(step_value).collect::<Vec<_>>(),
        "left_alone": p.left_alone,
        "refusal": p.refusal,
        "identity": p.identity,
    })
}

pub fn plans_value(r: &pb::PlanResponse) -> Value {
    json!({ "plans": r.plans.iter().map(plan_value).collect::<Vec<_>>() })
}

pub fn step_result_value(r: &pb::StepResult) -> Value {
    json!({ "step": r.step.as_ref().map(step_value), "result": r.result, "detail": r.detail })
}

/// What `apply` did; `planned` holds the plans shown before applying (none when the apply was
/// bound to identities from an earlier plan).
pub fn apply_value(planned: &[pb::DevicePlan], r: &pb::ApplyResponse) -> Value {
    json!({
        "planned": planned.iter().map(plan_value).collect::<Vec<_>>(),
        "plans": r.plans.iter().map(plan_value).collect::<Vec<_>>(),
        "results": r.results.iter().map(step_result_value).collect::<Vec<_>>(),
    })
}

pub fn event_value(e: &pb::Event) -> Value {
    json!({
        "type": event_type_name(e.r#type),
        "device": e.device,
        "unix_seconds": e.unix_seconds,
        "message": e.message,
        "current": e.current.as_ref().map(device_value),
    })
}

// ---------------------------------------------------------------------------------------------
// Tables.

/// `s` with control characters (escape sequences, newlines) escaped, safe for a terminal.
pub fn clean(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_owned();
    }
    s.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

/// At most `max` characters of `s`, ending in `…` when cut.
pub fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_owned();
    }
    let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
    out.push('…');
    out
}

/// Left-aligned columns two spaces apart; the last column is not padded.
pub fn columns(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let head: Vec<String> = header.iter().map(|h| (*h).to_owned()).collect();
    for row in std::iter::once(&head).chain(rows) {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = widths.get(i).copied().unwrap_or(0).saturating_sub(cell.chars().count());
                line.push_str(cell);
                line.push_str(&" ".repeat(pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian (H. Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC`; `never` for 0 (and anything odd).
pub fn utc_time(secs: f64) -> String {
    // Up to the end of year 9999; beyond that (or NaN, or negative) it is not a real time.
    if !(secs > 0.0 && secs < 253_402_300_800.0) {
        return "never".into();
    }
    let t = secs as i64;
    let (y, m, d) = civil_from_days(t.div_euclid(86_400));
    let s = t.rem_euclid(86_400);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", s / 3600, s % 3600 / 60, s % 60)
}

/// How long before `now` the time `then` was: `4s ago`, `3m ago`, `2h ago`, `5d ago`.
pub fn ago(then: f64, now: f64) -> String {
    let d = now - then;
    if !d.is_finite() {
        return "?".into();
    }
    if d < -1.0 {
        return "in the future: check the clocks".into();
    }
    let d = d.max(0.0) as u64;
    match d {
        0..=119 => format!("{d}s ago"),
        120..=7199 => format!("{}m ago", d / 60),
        7200..=172_799 => format!("{}h ago", d / 3600),
        _ => format!("{}d ago", d / 86_400),
    }
}

/// Now, in seconds since the epoch.
pub fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

/// `node` as `key: value` lines; `now` is for the age of the last scan. The warnings and the
/// blind spots follow their counts, one line each.
pub fn node_table(n: &pb::Node, now: f64) -> String {
    let last = if n.last_scan_unix_seconds > 0.0 {
        format!(
            "{} ({}), took {:.0} ms",
            utc_time(n.last_scan_unix_seconds),
            ago(n.last_scan_unix_seconds, now),
            n.last_scan_duration_ms
        )
    } else {
        "none yet".into()
    };
    let rows = [
        ("name", clean(&n.name)),
        ("kernel", clean(&n.kernel)),
        ("agent version", clean(&n.agent_version)),
        ("mode", clean(&n.mode)),
        (
            "Kubernetes API",
            if n.kubernetes.is_empty() { "not reported".into() } else { clean(&n.kubernetes) },
        ),
        ("last scan", last),
        ("scans", n.scans.to_string()),
        ("devices", n.devices.to_string()),
    ];
    let mut out = String::new();
    for (k, v) in rows {
        let _ = writeln!(out, "{:<16}{v}", format!("{k}:"));
    }
    for (k, list) in [("warnings", &n.warnings), ("blind spots", &n.blind_spots)] {
        let count = if list.is_empty() { "none".into() } else { list.len().to_string() };
        let _ = writeln!(out, "{:<16}{count}", format!("{k}:"));
        for w in list {
            let _ = writeln!(out, "  - {}", clean(w));
        }
    }
    out
}

/// Width of the WHY column of `devices`.
const WHY_WIDTH: usize = 60;

/// The PV and pods (per kubelet) of a device, for the devices table: `pvc-1 (2 pods)`, `-`.
fn kube_cell(d: &pb::Device) -> String {
    if d.pv_names.is_empty() && d.pod_uids.is_empty() && d.kubelet_paths.is_empty() {
        return "-".into();
    }
    let pv = d.pv_names.first().cloned().unwrap_or_else(|| "(kubelet volume)".into());
    match d.pod_uids.len() {
        0 => format!("{pv} (no pod)"),
        1 => format!("{pv} (pod {})", d.pod_uids[0]),
        n => format!("{pv} ({n} pods)"),
    }
}

/// `devices` as a table: NAME, MAJ:MIN, KIND, SIZE, VERDICT, HOLDERS, PV / PODS, WHY.
pub fn devices_table(r: &pb::ListDevicesResponse) -> String {
    if r.devices.is_empty() {
        return "no matching devices\n".into();
    }
    let rows: Vec<Vec<String>> = r
        .devices
        .iter()
        .map(|d| {
            vec![
                clean(&d.name),
                format!("{}:{}", d.major, d.minor),
                kind_name(d.kind),
                size(d.size_bytes),
                verdict_name(d.verdict),
                d.holders.len().to_string(),
                cut(&clean(&kube_cell(d)), 40),
                cut(&clean(d.reasons.first().map_or("", String::as_str)), WHY_WIDTH),
            ]
        })
        .collect();
    columns(&["NAME", "MAJ:MIN", "KIND", "SIZE", "VERDICT", "HOLDERS", "PV / PODS", "WHY"], &rows)
}

/// One line about the device: `loop3 (7:3, loop, 8.0M) backed by /x.img`.
fn device_header(d: &pb::Device) -> String {
    let mut s =
        format!("{} ({}:{}, {}, {}", clean(&d.name), d.major, d.minor, kind_name(d.kind), size(d.size_bytes));
    if d.read_only {
        s.push_str(", read-only");
    }
    s.push(')');
    if !d.loop_backing_file.is_empty() {
        let _ = write!(s, " backed by {}", clean(&d.loop_backing_file));
    } else if d.kind == pb::DeviceKind::Loop as i32 {
        s.push_str(" unbound");
    }
    if !d.dm_name.is_empty() {
        let _ = write!(s, " dm name {}", clean(&d.dm_name));
    }
    if !d.parent.is_empty() {
        let _ = write!(s, " partition of {}", clean(&d.parent));
    }
    if let Some(n) = &d.nvme {
        let ctrls: Vec<String> =
            n.controllers.iter().map(|c| format!("{} {}", clean(&c.name), clean(&c.state))).collect();
        let _ = write!(
            s,
            " nvme {} of {} ({} of {} live: {})",
            clean(&n.role),
            clean(&n.subsysnqn),
            n.live_controllers,
            n.controllers.len(),
            ctrls.join(", ")
        );
    }
    s
}

/// Pids listed per holder in tables (JSON has all the agent sent).
const SHOWN_PIDS: usize = 5;

/// What the holder's description does not already say: pids, namespace, mount point,
/// filesystem, container, pod.
fn holder_details(h: &pb::Holder) -> Vec<String> {
    let desc = &h.description;
    let mut parts = Vec::new();
    if let Some(first) = h.pids.first() {
        let total = (h.pid_count as usize).max(h.pids.len());
        let comm = if h.comm.is_empty() || desc.contains(&format!("({})", h.comm)) {
            String::new()
        } else {
            format!(" ({})", clean(&h.comm))
        };
        if total == 1 {
            if !desc.contains(&format!("pid {first}")) {
                parts.push(format!("pid {first}{comm}"));
            }
        } else {
            let shown: Vec<String> = h.pids.iter().take(SHOWN_PIDS).map(u32::to_string).collect();
            let more = total.saturating_sub(shown.len());
            let more = if more > 0 { format!(" and {more} more") } else { String::new() };
            let comm =
                if h.comm.is_empty() { String::new() } else { format!(" (first: {})", clean(&h.comm)) };
            parts.push(format!("pids {}{more}{comm}", shown.join(",")));
        }
    }
    if h.mount_namespace != 0 {
        let host = if h.in_host_namespace { " (host)" } else { "" };
        if !desc.contains(&h.mount_namespace.to_string()) {
            parts.push(format!("mount namespace {}{host}", h.mount_namespace));
        } else if h.in_host_namespace && !desc.contains("host") {
            parts.push("host namespace".into());
        }
    }
    if !h.mount_point.is_empty() && !desc.contains(&h.mount_point) {
        parts.push(format!("mount point {}", clean(&h.mount_point)));
    }
    if !h.fstype.is_empty() && !desc.contains(&format!("{} filesystem", h.fstype)) {
        parts.push(clean(&h.fstype));
    }
    if !h.container_id.is_empty() {
        parts.push(format!("container {}", clean(&h.container_id)));
    }
    if !h.pod_uid.is_empty() {
        parts.push(format!("pod {}", clean(&h.pod_uid)));
    }
    parts
}

/// One holder: `mount: mounted at /mnt in mount namespace 4026532 [pids 12,13; ext4; pod ...]`.
pub fn holder_line(h: &pb::Holder) -> String {
    let desc = if h.description.is_empty() { "(no description)".to_owned() } else { clean(&h.description) };
    let details = holder_details(h);
    let mut s = format!("{}: {desc}", holder_kind_name(h.kind));
    if !details.is_empty() {
        let _ = write!(s, " [{}]", details.join("; "));
    }
    s
}

/// `device` and `holders` as text: a header line, the verdict with every reason, one line per
/// holder, kernel threads as symptoms. `stack` adds what is stacked on and below it.
pub fn device_table(d: &pb::Device, stack: bool) -> String {
    let mut out = format!("{}\n", device_header(d));
    if !d.identity.is_empty() {
        let _ = writeln!(out, "identity: {}", clean(&d.identity));
    }
    if stack {
        if !d.stacked_on_top.is_empty() {
            let _ = writeln!(out, "stacked on top: {}", clean(&d.stacked_on_top.join(", ")));
        }
        if !d.stacked_below.is_empty() {
            let _ = writeln!(out, "stacked below: {}", clean(&d.stacked_below.join(", ")));
        }
        if !d.dm_uuid.is_empty() {
            let _ = writeln!(out, "dm uuid: {}", clean(&d.dm_uuid));
        }
    }
    if !d.pv_names.is_empty() || !d.pod_uids.is_empty() || !d.kubelet_paths.is_empty() {
        let or_none =
            |v: &[String], none: &str| if v.is_empty() { none.to_owned() } else { clean(&v.join(", ")) };
        let _ = writeln!(out, "kubernetes: PV {}", or_none(&d.pv_names, "unknown"));
        let _ = writeln!(out, "  pods on this node: {}", or_none(&d.pod_uids, "none"));
        let _ = writeln!(out, "  kubelet paths: {}", or_none(&d.kubelet_paths, "none"));
    }
    let _ = writeln!(out, "verdict: {}", verdict_name(d.verdict));
    for r in &d.reasons {
        let _ = writeln!(out, "  - {}", clean(r));
    }
    if d.holders.is_empty() {
        out.push_str("holders: none\n");
    } else {
        let _ = writeln!(out, "holders ({}):", d.holders.len());
        for h in &d.holders {
            let _ = writeln!(out, "  - {}", holder_line(h));
        }
    }
    if !d.kernel_threads.is_empty() {
        out.push_str("kernel threads (symptoms, not holders):\n");
        for k in &d.kernel_threads {
            let _ = writeln!(out, "  - {}", clean(k));
        }
    }
    out
}

fn step_text(s: &pb::Step) -> String {
    format!("{}: {}", clean(&s.action), clean(&s.description))
}

fn plural(n: usize, word: &str) -> String {
    format!("{n} {word}{}", if n == 1 { "" } else { "s" })
}

/// The first line of one device's plan.
fn plan_head(p: &pb::DevicePlan) -> String {
    let name = clean(&p.device);
    if !p.refusal.is_empty() {
        format!("{name}: refused: {}", clean(&p.refusal))
    } else if p.steps.is_empty() {
        format!("{name}: nothing to do")
    } else {
        format!("{name}: {}", plural(p.steps.len(), "step"))
    }
}

/// The identity a plan was made for: what `apply --identity` takes back.
fn identity_line(out: &mut String, p: &pb::DevicePlan) {
    if !p.identity.is_empty() {
        let _ = writeln!(out, "  identity: {}", clean(&p.identity));
    }
}

fn left_alone_lines(out: &mut String, p: &pb::DevicePlan) {
    for l in &p.left_alone {
        let _ = writeln!(out, "  left alone: {}", clean(l));
    }
}

/// `plan` as text: per device the numbered steps, what is left alone, the refusal.
pub fn plans_table(r: &pb::PlanResponse, all_stale: bool) -> String {
    if r.plans.is_empty() {
        return if all_stale { "no stale devices: nothing to do\n".into() } else { "nothing to do\n".into() };
    }
    let mut out = String::new();
    for p in &r.plans {
        let _ = writeln!(out, "{}", plan_head(p));
        identity_line(&mut out, p);
        if p.refusal.is_empty() {
            for (i, s) in p.steps.iter().enumerate() {
                let _ = writeln!(out, "  {}. {}", i + 1, step_text(s));
            }
        }
        left_alone_lines(&mut out, p);
    }
    out
}

/// The Apply request bound to what a Plan answered: its devices by kernel name, each with the
/// identity it was planned for, so that the agent refuses (FailedPrecondition, naming both
/// identities) a device whose number now stands for another kernel object.
pub fn apply_bound_to(plans: &pb::PlanResponse, operation: pb::Operation) -> pb::ApplyRequest {
    pb::ApplyRequest {
        devices: plans.plans.iter().map(|p| p.device.clone()).collect(),
        identities: plans.plans.iter().map(|p| p.identity.clone()).collect(),
        operation: operation as i32,
    }
}

/// The Apply request for devices planned earlier: one identity (`--identity`, as `plan -o json`
/// printed it; "" for none) per device, in the same order.
pub fn apply_with_identities(
    devices: &[String],
    identities: &[String],
    operation: pb::Operation,
) -> Result<pb::ApplyRequest, String> {
    if identities.len() != devices.len() {
        let n = identities.len();
        return Err(format!(
            "{n} {} for {}: give one --identity per device, in the same order (\"\" for none)",
            if n == 1 { "identity" } else { "identities" },
            plural(devices.len(), "device")
        ));
    }
    Ok(pb::ApplyRequest {
        devices: devices.to_vec(),
        identities: identities.to_vec(),
        operation: operation as i32,
    })
}

/// What `apply` did, counted.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ApplySummary {
    pub done: usize,
    pub already_absent: usize,
    pub deferred: usize,
    pub failed: usize,
    /// Planned steps with no result (an earlier step failed or was deferred).
    pub not_run: usize,
    /// Plans refused as a whole.
    pub refused: usize,
}

impl ApplySummary {
    /// 1 when a step failed; 2 when a step was deferred or not run, or a plan refused; else 0.
    pub fn exit_code(&self) -> u8 {
        if self.failed > 0 {
            1
        } else if self.deferred > 0 || self.not_run > 0 || self.refused > 0 {
            2
        } else {
            0
        }
    }

    pub fn line(&self) -> String {
        let mut parts = vec![format!("{} done", self.done)];
        if self.already_absent > 0 {
            parts.push(format!("{} already absent", self.already_absent));
        }
        parts.push(format!("{} deferred", self.deferred));
        parts.push(format!("{} failed", self.failed));
        if self.not_run > 0 {
            parts.push(format!("{} not run", self.not_run));
        }
        if self.refused > 0 {
            parts.push(format!("{} refused", plural(self.refused, "plan")));
        }
        parts.join(", ")
    }
}

/// Each plan's steps paired with their results, in order; results no step claims come last.
type Matched<'a> = (Vec<Vec<Option<&'a pb::StepResult>>>, Vec<&'a pb::StepResult>);

fn match_results(r: &pb::ApplyResponse) -> Matched<'_> {
    let mut used = vec![false; r.results.len()];
    let mut per_plan = Vec::new();
    for p in &r.plans {
        let mut row = Vec::new();
        for s in p.steps.iter().filter(|_| p.refusal.is_empty()) {
            let found = r
                .results
                .iter()
                .enumerate()
                .find(|(i, res)| !used.get(*i).copied().unwrap_or(true) && res.step.as_ref() == Some(s));
            row.push(found.map(|(i, res)| {
                if let Some(u) = used.get_mut(i) {
                    *u = true;
                }
                res
            }));
        }
        per_plan.push(row);
    }
    let rest = r.results.iter().zip(&used).filter(|(_, u)| !**u).map(|(res, _)| res).collect();
    (per_plan, rest)
}

fn count(s: &mut ApplySummary, res: &pb::StepResult) {
    match res.result.as_str() {
        "done" => s.done += 1,
        "already_absent" => s.already_absent += 1,
        "deferred" => s.deferred += 1,
        // "failed", and any word this client does not know.
        _ => s.failed += 1,
    }
}

/// Counts `apply`'s results.
pub fn apply_summary(r: &pb::ApplyResponse) -> ApplySummary {
    let (per_plan, rest) = match_results(r);
    let mut s = ApplySummary {
        refused: r.plans.iter().filter(|p| !p.refusal.is_empty()).count(),
        ..Default::default()
    };
    for res in per_plan.iter().flatten() {
        match res {
            Some(res) => count(&mut s, res),
            None => s.not_run += 1,
        }
    }
    for res in rest {
        count(&mut s, res);
    }
    s
}

fn result_text(res: &pb::StepResult) -> String {
    let word = clean(&res.result.replace('_', " "));
    if res.detail.is_empty() {
        word
    } else {
        format!("{word}: {}", clean(&res.detail))
    }
}

/// `apply` as text: per device each step with its result, then a summary line.
pub fn apply_table(r: &pb::ApplyResponse) -> String {
    let (per_plan, rest) = match_results(r);
    let mut out = String::new();
    if r.plans.is_empty() && r.results.is_empty() {
        out.push_str("nothing to do\n");
    }
    for (p, results) in r.plans.iter().zip(&per_plan) {
        let _ = writeln!(out, "{}", plan_head(p));
        identity_line(&mut out, p);
        for (i, (s, res)) in p.steps.iter().zip(results).enumerate() {
            let what = res.map_or_else(|| "not run".to_owned(), result_text);
            let _ = writeln!(out, "  {}. {} -> {what}", i + 1, step_text(s));
        }
        left_alone_lines(&mut out, p);
    }
    for res in rest {
        let step = res.step.as_ref().map_or_else(|| "(unknown step)".to_owned(), step_text);
        let _ = writeln!(out, "{step} -> {}", result_text(res));
    }
    let _ = writeln!(out, "{}", apply_summary(r).line());
    out
}

/// One event on one line: time, type, device, message.
pub fn event_line(e: &pb::Event) -> String {
    let kind = match pb::event::Type::try_from(e.r#type) {
        Ok(pb::event::Type::Unspecified) => "notice".to_owned(),
        _ => event_type_name(e.r#type),
    };
    let device = if e.device.is_empty() { "-".to_owned() } else { clean(&e.device) };
    let mut s = format!("{}  {kind:<16} {device:<10} {}", utc_time(e.unix_seconds), clean(&e.message));
    if let Some(d) = &e.current {
        let _ = write!(s, " [{}, {} holder(s)]", verdict_name(d.verdict), d.holders.len());
    }
    s
}

/// `agentctl fleet apply`'s arguments (`NODE/DEVICE`) grouped by node, in the order nodes are
/// first named.
pub fn fleet_targets(args: &[String]) -> Result<Vec<(String, Vec<String>)>, String> {
    let mut out: Vec<(String, Vec<String>)> = Vec::new();
    for a in args {
        let Some((node, device)) = a.split_once('/').filter(|(n, d)| !n.is_empty() && !d.is_empty()) else {
            return Err(format!("'{a}' is not NODE/DEVICE (e.g. node-a/rbd4)"));
        };
        match out.iter_mut().find(|(n, _)| n == node) {
            Some((_, devices)) => devices.push(device.to_owned()),
            None => out.push((node.to_owned(), vec![device.to_owned()])),
        }
    }
    if out.is_empty() {
        return Err("name at least one NODE/DEVICE".to_owned());
    }
    Ok(out)
}

/// The console's Apply for these nodes' devices with their identities (one list per node).
pub fn fleet_apply_request(
    targets: &[(String, Vec<String>)],
    identities: &[Vec<String>],
    execute: bool,
) -> pb::FleetApplyRequest {
    let mut all = targets.iter().zip(identities).map(|((node, devices), ids)| pb::FleetApplyTarget {
        node: node.clone(),
        devices: devices.clone(),
        identities: ids.clone(),
    });
    let first = all.next().unwrap_or_default();
    pb::FleetApplyRequest {
        node: first.node,
        devices: first.devices,
        identities: first.identities,
        targets: all.collect(),
        execute,
    }
}

/// Whether the dry run refuses anywhere.
pub fn fleet_dry_run_refuses(r: &pb::FleetApplyResponse) -> bool {
    r.summary.iter().any(|s| !s.refusal.is_empty())
}

/// The dry run as text: per node its steps, or why it may not run, then the budget.
pub fn fleet_summary_table(r: &pb::FleetApplyResponse) -> String {
    let mut out = String::new();
    for n in &r.summary {
        if n.refusal.is_empty() {
            let _ = writeln!(out, "{}: {} step(s)", clean(&n.node), n.steps);
        } else {
            let _ = writeln!(out, "{}: REFUSED: {}", clean(&n.node), clean(&n.refusal));
        }
        for p in n.plan.iter().flat_map(|p| &p.plans) {
            for st in &p.steps {
                let _ = writeln!(
                    out,
                    "  {} {}: {}",
                    clean(&st.action),
                    clean(&st.device),
                    clean(&st.description)
                );
            }
        }
    }
    if r.budget_steps_per_minute > 0 {
        let _ = writeln!(
            out,
            "fleet budget: {} of {} steps left this minute",
            r.budget_steps_left, r.budget_steps_per_minute
        );
    }
    if let Some(why) = crate::fleet_plan::over_budget(r) {
        let _ = writeln!(out, "{why}");
    }
    out
}

/// The dry run and, when it ran, every node's results, as a value.
pub fn fleet_apply_value(r: &pb::FleetApplyResponse) -> Value {
    json!({
        "executed": r.executed,
        "on_behalf_of": r.on_behalf_of,
        "summary": r.summary.iter().map(|n| json!({
            "node": n.node,
            "steps": n.steps,
            "refusal": n.refusal,
            "plans": n.plan.as_ref().map(plans_value).unwrap_or(Value::Null),
        })).collect::<Vec<_>>(),
        "results": r.results.iter().map(|n| json!({
            "node": n.node,
            "error": n.error,
            "results": n.result.as_ref().map(|a| a.results.iter().map(step_result_value).collect::<Vec<_>>())
                .unwrap_or_default(),
        })).collect::<Vec<_>>(),
        "budget_steps_left": r.budget_steps_left,
        "budget_steps_per_minute": r.budget_steps_per_minute,
    })
}

/// Every node's Apply results as text.
pub fn fleet_results_table(r: &pb::FleetApplyResponse) -> String {
    let mut out = String::new();
    for n in &r.results {
        let _ = writeln!(out, "{}:", clean(&n.node));
        if let Some(a) = &n.result {
            for line in apply_table(a).lines() {
                let _ = writeln!(out, "  {line}");
            }
        }
        if !n.error.is_empty() {
            let _ = writeln!(out, "  error: {}", clean(&n.error));
        }
    }
    out
}

/// Whether every node's every step finished.
pub fn fleet_all_done(r: &pb::FleetApplyResponse) -> bool {
    r.executed
        && r.results.iter().all(|n| {
            n.error.is_empty() && n.result.as_ref().is_some_and(|a| apply_summary(a).exit_code() == 0)
        })
}

#[cfg(test)]
mod tests {
    #[test]
    fn fleet_apply_arguments_group_by_node() {
        let args: Vec<String> = ["a/rbd4", "b/nbd0", "a/loop3"].iter().map(|s| s.to_string()).collect();
        let t = fleet_targets(&args).expect("ok");
        assert_eq!(
            t,
            [("a".to_string(), vec!["rbd4".to_string(), "loop3".into()]), ("b".into(), vec!["nbd0".into()])]
        );
        assert!(fleet_targets(&["rbd4".to_string()]).is_err_and(|e| e.contains("NODE/DEVICE")));
        assert!(fleet_targets(&["a/".to_string()]).is_err());
        assert!(fleet_targets(&[]).is_err());
        let ids = vec![vec!["r".to_string(), "l".into()], vec!["n".into()]];
        let req = fleet_apply_request(&t, &ids, false);
        assert_eq!(
            (req.node.as_str(), req.devices.len(), req.identities.len(), req.execute),
            ("a", 2, 2, false)
        );
        assert_eq!(req.targets.len(), 1);
        assert_eq!(req.targets[0].identities, ["n"]);
        let dry = pb::FleetApplyResponse {
            summary: vec![pb::NodePlanSummary {
                node: "b".into(),
                refusal: "nbd0: in use".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        assert!(fleet_dry_run_refuses(&dry));
        assert!(fleet_summary_table(&dry).starts_with("b: REFUSED: nbd0: in use"));
        assert!(!fleet_all_done(&dry), "not executed");
    }

    use super::*;

    fn loop_device() -> pb::Device {
        pb::Device {
            name: "loop3".into(),
            major: 7,
            minor: 3,
            kind: pb::DeviceKind::Loop as i32,
            size_bytes: 64 << 20,
            loop_backing_file: "/var/lib/x.img".into(),
            verdict: pb::Verdict::InUse as i32,
            reasons: vec!["mounted at /mnt in mount namespace 4026532001".into(), "second".into()],
            holders: vec![pb::Holder {
                kind: pb::HolderKind::Mount as i32,
                pids: vec![100, 101],
                pid_count: 40,
                comm: "sh".into(),
                mount_namespace: 4026532001,
                mount_point: "/mnt".into(),
                fstype: "ext4".into(),
                pod_uid: "1234-abcd".into(),
                description: "mounted at /mnt in mount namespace 4026532001".into(),
                ..Default::default()
            }],
            kernel_threads: vec!["jbd2/loop3-8 (pid 77)".into()],
            ..Default::default()
        }
    }

    #[test]
    fn enum_names_are_lower_case_without_prefix() {
        assert_eq!(kind_name(pb::DeviceKind::Loop as i32), "loop");
        assert_eq!(verdict_name(pb::Verdict::InUse as i32), "in_use");
        assert_eq!(holder_kind_name(pb::HolderKind::OpenDevice as i32), "open_device");
        assert_eq!(event_type_name(pb::event::Type::DeviceAdded as i32), "device_added");
        assert_eq!(kind_name(99), "unknown(99)");
        assert_eq!(verdict_name(-1), "unknown(-1)");
        assert_eq!(parse_kind("rbd"), Some(pb::DeviceKind::Rbd));
        assert_eq!(parse_verdict("in_use"), Some(pb::Verdict::InUse));
        assert_eq!(parse_verdict("unspecified"), None);
        assert_eq!(parse_kind("floppy"), None);
    }

    #[test]
    fn device_value_keeps_proto_names_and_lower_case_enums() {
        let v = device_value(&loop_device());
        assert_eq!(v["kind"], "loop");
        assert_eq!(v["verdict"], "in_use");
        assert_eq!(v["size_bytes"], 64u64 << 20);
        assert_eq!(v["loop_backing_file"], "/var/lib/x.img");
        assert_eq!(v["holders"][0]["kind"], "mount");
        assert_eq!(v["holders"][0]["pid_count"], 40);
        assert_eq!(v["kernel_threads"][0], "jbd2/loop3-8 (pid 77)");
        let e = pb::Event {
            r#type: pb::event::Type::DeviceRemoved as i32,
            device: "loop3".into(),
            ..Default::default()
        };
        let ev = event_value(&e);
        assert_eq!(ev["type"], "device_removed");
        assert!(ev["current"].is_null());
        let yaml = serde_yaml_ng::to_string(&v).expect("yaml");
        assert!(yaml.contains("verdict: in_use"), "{yaml}");
    }

    #[test]
    fn devices_table_has_human_sizes_and_cut_reasons() {
        let mut d = loop_device();
        d.reasons[0] = "x".repeat(200);
        let t = devices_table(&pb::ListDevicesResponse { devices: vec![d], scan_unix_seconds: 0.0, scan: 0 });
        let mut lines = t.lines();
        let head = lines.next().expect("header");
        assert!(head.starts_with("NAME   MAJ:MIN  KIND  SIZE   VERDICT  HOLDERS  PV / PODS  WHY"), "{head}");
        let row = lines.next().expect("row");
        assert!(row.starts_with("loop3  7:3      loop  64.0M  in_use   1        -          xxx"), "{row}");
        assert!(row.ends_with('…'));
        assert_eq!(row.split("  ").last().map(|w| w.chars().count()), Some(WHY_WIDTH));
        assert_eq!(devices_table(&pb::ListDevicesResponse::default()), "no matching devices\n");
    }

    #[test]
    fn devices_table_shows_the_pv_and_pods() {
        let mut d = loop_device();
        d.pv_names = vec!["pvc-1".into()];
        d.pod_uids = vec!["uid-a".into()];
        let t = devices_table(&pb::ListDevicesResponse {
            devices: vec![d.clone()],
            scan_unix_seconds: 0.0,
            scan: 0,
        });
        assert!(t.contains("pvc-1 (pod uid-a)"), "{t}");
        d.pod_uids.clear();
        let t = devices_table(&pb::ListDevicesResponse { devices: vec![d], scan_unix_seconds: 0.0, scan: 0 });
        assert!(t.contains("pvc-1 (no pod)"), "{t}");
    }

    #[test]
    fn device_table_shows_holders_and_symptoms() {
        let t = device_table(&loop_device(), true);
        assert!(t.starts_with("loop3 (7:3, loop, 64.0M) backed by /var/lib/x.img\nverdict: in_use\n"), "{t}");
        assert!(
            t.contains(
                "  - mount: mounted at /mnt in mount namespace 4026532001 [pids 100,101 and 38 more (first: sh); ext4; pod 1234-abcd]"
            ),
            "{t}"
        );
        assert!(t.contains("kernel threads (symptoms, not holders):\n  - jbd2/loop3-8 (pid 77)\n"), "{t}");
    }

    #[test]
    fn node_shows_the_kubernetes_api_and_blind_spots() {
        let n = pb::Node {
            name: "node-a".into(),
            mode: "report".into(),
            kubernetes: "cannot vouch: no Node named 'node-b' in the cluster: its pods cannot be told".into(),
            blind_spots: vec![
                "cannot read /proc/1/ns/mnt of pid 1 (could hide a holder of any device)".into(),
                "dm tables\x1b[2J (could hide a holder of every dm device)".into(),
            ],
            warnings: vec!["w1".into()],
            ..Default::default()
        };
        let t = node_table(&n, 0.0);
        assert!(
            t.contains("\nKubernetes API: cannot vouch: no Node named 'node-b' in the cluster: its pods cannot be told\n"),
            "{t}"
        );
        assert!(t.contains("\nwarnings:       1\n  - w1\n"), "{t}");
        assert!(
            t.contains(
                "\nblind spots:    2\n  - cannot read /proc/1/ns/mnt of pid 1 (could hide a holder of any device)\n  - dm tables\\u{1b}[2J (could hide"
            ),
            "{t}"
        );
        let v = node_value(&n);
        assert_eq!(v["kubernetes"], n.kubernetes.as_str());
        assert_eq!(v["blind_spots"][0], n.blind_spots[0].as_str());
        assert_eq!(v["blind_spots"].as_array().map(Vec::len), Some(2));
        let yaml = serde_yaml_ng::to_string(&v).expect("yaml");
        assert!(yaml.contains("kubernetes: ") && yaml.contains("blind_spots:\n- "), "{yaml}");
        let quiet = pb::Node { kubernetes: "vouching".into(), ..Default::default() };
        let t = node_table(&quiet, 0.0);
        assert!(t.contains("Kubernetes API: vouching\n") && t.contains("blind spots:    none\n"), "{t}");
        assert!(node_table(&pb::Node::default(), 0.0).contains("Kubernetes API: not reported\n"));
    }

    #[test]
    fn a_filesystem_holder_shows_its_kind_and_description() {
        let mut d = loop_device();
        d.verdict = pb::Verdict::Unknown as i32;
        d.holders = vec![pb::Holder {
            kind: pb::HolderKind::Filesystem as i32,
            fstype: "ext4".into(),
            path: "/sys/fs/ext4/loop3".into(),
            description:
                "a ext4 filesystem still lives on it with no mount in any namespace (/sys/fs/ext4/loop3)"
                    .into(),
            ..Default::default()
        }];
        let t = device_table(&d, true);
        assert!(
            t.contains("holders (1):\n  - filesystem: a ext4 filesystem still lives on it with no mount in any namespace (/sys/fs/ext4/loop3)\n"),
            "{t}"
        );
        assert_eq!(device_value(&d)["holders"][0]["kind"], "filesystem");
    }

    #[test]
    fn identities_are_shown_and_bind_apply_to_the_plan() {
        let mut d = loop_device();
        d.identity = "loop3@7:3#12;loop=8:1/77+0".into();
        let t = device_table(&d, true);
        assert!(
            t.starts_with(
                "loop3 (7:3, loop, 64.0M) backed by /var/lib/x.img\nidentity: loop3@7:3#12;loop=8:1/77+0\n"
            ),
            "{t}"
        );
        assert_eq!(device_value(&d)["identity"], "loop3@7:3#12;loop=8:1/77+0");
        let plan = |dev: &str, id: &str| pb::DevicePlan {
            device: dev.into(),
            identity: id.into(),
            steps: vec![pb::Step {
                action: "detach_loop".into(),
                device: dev.into(),
                description: "detach".into(),
            }],
            ..Default::default()
        };
        let r = pb::PlanResponse {
            plans: vec![plan("loop3", "loop3@7:3#12;a"), plan("loop4", "loop4@7:4#13;b")],
        };
        let t = plans_table(&r, false);
        assert!(
            t.starts_with("loop3: 1 step\n  identity: loop3@7:3#12;a\n  1. detach_loop: detach\n"),
            "{t}"
        );
        assert_eq!(plans_value(&r)["plans"][1]["identity"], "loop4@7:4#13;b");
        let req = apply_bound_to(&r, pb::Operation::Clean);
        assert_eq!(req.operation, pb::Operation::Clean as i32);
        assert_eq!(apply_bound_to(&r, pb::Operation::Release).operation, pb::Operation::Release as i32);
        assert_eq!(req.devices, ["loop3", "loop4"]);
        assert_eq!(req.identities, ["loop3@7:3#12;a", "loop4@7:4#13;b"]);
        let applied = pb::ApplyResponse { plans: vec![r.plans[0].clone()], results: vec![] };
        assert!(apply_table(&applied).contains("\n  identity: loop3@7:3#12;a\n"));
        let v = apply_value(&r.plans, &applied);
        assert_eq!(v["planned"][1]["identity"], "loop4@7:4#13;b");
        assert_eq!(v["plans"][0]["identity"], "loop3@7:3#12;a");
        assert_eq!(apply_value(&[], &applied)["planned"], json!([]));

        let devs = vec!["loop3".to_owned(), "/dev/loop4".to_owned()];
        let req = apply_with_identities(&devs, &["x".into(), String::new()], pb::Operation::Release)
            .expect("one per device");
        assert_eq!(req.operation, pb::Operation::Release as i32);
        assert_eq!(req.devices, devs);
        assert_eq!(req.identities, ["x", ""]);
        let e = apply_with_identities(&devs, &["x".into()], pb::Operation::Clean).expect_err("too few");
        assert_eq!(
            e,
            "1 identity for 2 devices: give one --identity per device, in the same order (\"\" for none)"
        );
    }

    #[test]
    fn control_characters_are_escaped_in_tables() {
        let mut d = loop_device();
        d.holders[0].description = "evil\x1b[2Jname\n".into();
        let t = device_table(&d, false);
        assert!(!t.contains('\x1b'));
        assert!(t.contains("evil\\u{1b}[2Jname\\n"), "{t}");
    }

    #[test]
    fn apply_summary_and_exit_codes() {
        let step = |d: &str| pb::Step {
            action: "detach_loop".into(),
            device: d.into(),
            description: format!("detach {d}"),
        };
        let plan = |d: &str| pb::DevicePlan { device: d.into(), steps: vec![step(d)], ..Default::default() };
        let result = |d: &str, w: &str| pb::StepResult {
            step: Some(step(d)),
            result: w.into(),
            detail: String::new(),
        };
        let ok = pb::ApplyResponse { plans: vec![plan("loop1")], results: vec![result("loop1", "done")] };
        assert_eq!(apply_summary(&ok).exit_code(), 0);
        assert!(
            apply_table(&ok).contains("  1. detach_loop: detach loop1 -> done\n"),
            "{}",
            apply_table(&ok)
        );
        let deferred =
            pb::ApplyResponse { plans: vec![plan("loop1")], results: vec![result("loop1", "deferred")] };
        assert_eq!(apply_summary(&deferred).exit_code(), 2);
        let failed = pb::ApplyResponse {
            plans: vec![plan("loop1"), plan("loop2")],
            results: vec![result("loop1", "failed"), result("loop2", "deferred")],
        };
        assert_eq!(apply_summary(&failed).exit_code(), 1);
        let refused = pb::ApplyResponse {
            plans: vec![pb::DevicePlan {
                device: "sda".into(),
                refusal: "held".into(),
                ..Default::default()
            }],
            results: vec![],
        };
        assert_eq!(apply_summary(&refused).exit_code(), 2);
        assert!(apply_table(&refused).starts_with("sda: refused: held\n"));
        let not_run = pb::ApplyResponse { plans: vec![plan("loop1")], results: vec![] };
        assert_eq!(apply_summary(&not_run).not_run, 1);
        assert!(apply_table(&not_run).contains("-> not run"));
    }

    #[test]
    fn addresses_and_times() {
        assert_eq!(split_host_port("node1:9443"), Some(("node1", 9443)));
        assert_eq!(split_host_port("[fd00::1]:9443"), Some(("fd00::1", 9443)));
        assert_eq!(split_host_port("fd00::1:9443"), None);
        assert_eq!(split_host_port("node1"), None);
        assert_eq!(split_host_port(":9443"), None);
        assert_eq!(split_host_port("node1:99999"), None);
        assert_eq!(utc_time(0.0), "never");
        assert_eq!(utc_time(f64::NAN), "never");
        assert_eq!(utc_time(1e300), "never");
        assert_eq!(utc_time(951_782_400.0), "2000-02-29 00:00:00 UTC");
        assert_eq!(utc_time(1_700_000_000.5), "2023-11-14 22:13:20 UTC");
        assert_eq!(ago(100.0, 104.0), "4s ago");
        assert_eq!(ago(0.0, 7200.0), "2h ago");
        assert_eq!(cut("abc", 2), "a…");
        assert_eq!(cut("abc", 0), "…");
    }

    #[test]
    fn status_is_one_line() {
        let s = Status::not_found("unknown device 'sdz':\n no such device");
        assert_eq!(status_line(&s), "NotFound: unknown device 'sdz': no such device");
        assert_eq!(status_line(&Status::internal("")), "Internal: Internal error");
        let s = Status::unknown("h2 protocol error: error reading a body: error reading a body: broken pipe");
        assert_eq!(status_line(&s), "Unknown: h2 protocol error: error reading a body: broken pipe");
        let s = Status::failed_precondition(
            "loop3: the device changed since it was planned: planned for [loop3@7:3#12;loop=8:1/77+0], now [loop3@7:3#13;loop=8:1/78+0]; plan again",
        );
        assert_eq!(
            status_line(&s),
            "FailedPrecondition: loop3: the device changed since it was planned: planned for [loop3@7:3#12;loop=8:1/77+0], now [loop3@7:3#13;loop=8:1/78+0]; plan again"
        );
    }

    #[test]
    fn socket_errors_are_one_clear_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("agent.sock");
        let e = probe_socket(&missing).expect_err("no socket");
        assert_eq!(
            e.to_string(),
            format!(
                "cannot connect to {}: no such socket (is blockjanitor-agent serve running?)",
                missing.display()
            )
        );
        let file = dir.path().join("file");
        std::fs::write(&file, b"").expect("write");
        let e = probe_socket(&file).expect_err("not a socket");
        assert!(e.to_string().ends_with(": not a socket"), "{e}");
        let stale = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
        let e = probe_socket(&stale).expect_err("stale");
        assert!(e.to_string().ends_with("connection refused (stale socket?)"), "{e}");
        let denied = explain_socket_error(&stale, io::Error::from_raw_os_error(libc::EACCES));
        assert!(
            denied.to_string().contains("permission denied (run as root or as a member of group "),
            "{denied}"
        );
    }
}
