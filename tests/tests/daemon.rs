//! End-to-end tests of `blockjanitor-agent serve`: real unix socket, real TCP with certificates
//! made here, health, reflection, roles, bad requests, events on a real loop device, metrics,
//! concurrency and graceful shutdown.

use std::time::Duration;

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::agent_client::AgentClient;
use blockjanitor_tests::daemon::{tls_channel, unix_client, Daemon, Pki};
use blockjanitor_tests::*;
use tokio_stream::StreamExt;
use tonic::Code;

const TOOLS: &[&str] = &["losetup", "setpriv"];

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime")
}

/// A daemon with a TCP listener, an operator identity and a viewer identity.
fn tls_daemon(s: &Scratch, pki: &Pki) -> Daemon {
    let (cert, key, ca) = pki.write_server(s.dir.path());
    Daemon::start(
        s.dir.path(),
        &[
            "--listen",
            "127.0.0.1:0",
            "--tls-cert",
            cert.to_str().expect("utf8"),
            "--tls-key",
            key.to_str().expect("utf8"),
            "--tls-client-ca",
            ca.to_str().expect("utf8"),
            "--tls-operator",
            "console",
            "--tls-viewer",
            "dashboard",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    )
}

#[test]
fn root_tcp_mtls_roles_and_refusals() {
    if !require_real_kernel(TOOLS) {
        return;
    }
    let s = Scratch::new();
    let pki = Pki::new("blockjanitor test CA");
    let d = tls_daemon(&s, &pki);
    let addr = d.tcp.expect("tcp address logged");
    let operator = pki.issue("console", &["console"]);
    let viewer = pki.issue("dashboard", &["dashboard"]);
    let stranger = pki.issue("someone-else", &["someone-else"]);
    let rogue = Pki::new("rogue CA").issue("console", &["console"]);
    rt().block_on(async {
        // Viewer: reads, but Apply is refused.
        let ch = tls_channel(addr, &pki.ca.cert, Some((&viewer.cert, &viewer.key)))
            .await
            .expect("viewer connects");
        let mut c = AgentClient::new(ch);
        let node = c.get_node(pb::GetNodeRequest {}).await.expect("viewer GetNode").into_inner();
        assert!(node.scans >= 1, "scanned at start: {node:?}");
        let list =
            c.list_devices(pb::ListDevicesRequest::default()).await.expect("viewer ListDevices").into_inner();
        assert!(!list.devices.is_empty());
        let e = c
            .apply(pb::ApplyRequest { devices: vec!["loop0".into()], ..Default::default() })
            .await
            .expect_err("viewer Apply");
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

        // Operator: Apply passes the role check (and then fails on the unknown device).
        let ch = tls_channel(addr, &pki.ca.cert, Some((&operator.cert, &operator.key)))
            .await
            .expect("operator connects");
        let e = AgentClient::new(ch)
            .apply(pb::ApplyRequest { devices: vec!["sdzz".into()], ..Default::default() })
            .await
            .expect_err("unknown");
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
        assert!(e.message().contains("sdzz"), "{e:?}");

        // A valid certificate with no role in the config.
        let ch = tls_channel(addr, &pki.ca.cert, Some((&stranger.cert, &stranger.key)))
            .await
            .expect("handshake ok");
        let e = AgentClient::new(ch).get_node(pb::GetNodeRequest {}).await.expect_err("no role");
        assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");

        // No client certificate, or one from another CA: the handshake or the first call fails.
        for ident in [None, Some((rogue.cert.as_str(), rogue.key.as_str()))] {
            let refused = match tls_channel(addr, &pki.ca.cert, ident).await {
                Err(_) => true,
                Ok(ch) => AgentClient::new(ch).get_node(pb::GetNodeRequest {}).await.is_err(),
            };
            assert!(refused, "a client without a certificate from our CA was served");
        }

        // Health and reflection over TCP.
        let ch = tls_channel(addr, &pki.ca.cert, Some((&viewer.cert, &viewer.key))).await.expect("connect");
        let mut h = tonic_health::pb::health_client::HealthClient::new(ch.clone());
        for service in ["", "blockjanitor.v1.Agent"] {
            let r = h
                .check(tonic_health::pb::HealthCheckRequest { service: service.into() })
                .await
                .expect("health");
            assert_eq!(
                r.into_inner().status,
                tonic_health::pb::health_check_response::ServingStatus::Serving as i32
            );
        }
        let services = reflected_services(ch).await;
        assert!(services.contains(&"blockjanitor.v1.Agent".to_owned()), "{services:?}");
        assert!(services.contains(&"grpc.health.v1.Health".to_owned()), "{services:?}");
    });
}

async fn reflected_services(ch: tonic::transport::Channel) -> Vec<String> {
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    let req = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut stream = ServerReflectionClient::new(ch)
        .server_reflection_info(tokio_stream::once(req))
        .await
        .expect("reflection")
        .into_inner();
    let resp = stream.next().await.expect("one response").expect("ok");
    match resp.message_response {
        Some(MessageResponse::ListServicesResponse(l)) => l.service.into_iter().map(|s| s.name).collect(),
        other => panic!("unexpected reflection answer {other:?}"),
    }
}

#[test]
fn root_unix_socket_roles_health_and_bad_requests() {
    if !require_real_kernel(TOOLS) {
        return;
    }
    let s = Scratch::new();
    // Group "daemon" (GID 1) exists on every Debian system: its members are viewers.
    let d = Daemon::start(s.dir.path(), &["--socket-group", "1"]);
    let meta = std::fs::metadata(&d.socket).expect("socket");
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    assert_eq!(meta.permissions().mode() & 0o777, 0o660, "socket mode");
    assert_eq!(meta.gid(), 1, "socket group");
    rt().block_on(async {
        let mut c = unix_client(&d.socket).await;
        // Root is an operator; bad requests are InvalidArgument or NotFound, naming the device.
        for (dev, code) in [
            ("", Code::InvalidArgument),
            ("bad name", Code::InvalidArgument),
            ("sdzz", Code::NotFound),
            ("9:99", Code::NotFound),
        ] {
            let e = c.get_device(pb::GetDeviceRequest { device: dev.into() }).await.expect_err("bad device");
            assert_eq!(e.code(), code, "{dev:?}: {e:?}");
            if !dev.is_empty() {
                assert!(e.message().contains(dev.split(' ').next().unwrap_or(dev)), "{e:?}");
            }
        }
        let e = c
            .apply(pb::ApplyRequest { devices: vec![], ..Default::default() })
            .await
            .expect_err("empty apply");
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        let e = c.list_devices(pb::ListDevicesRequest { kind: 99, verdict: 0 }).await.expect_err("bad kind");
        assert_eq!(e.code(), Code::InvalidArgument);
        let e =
            c.plan(pb::PlanRequest { devices: vec!["/etc/passwd".into()] }).await.expect_err("not a device");
        assert_eq!(e.code(), Code::NotFound, "{e:?}");
        // Still serving.
        let node = c.get_node(pb::GetNodeRequest {}).await.expect("still serving").into_inner();
        assert_eq!(node.agent_version, env!("CARGO_PKG_VERSION"));
        let ch = blockjanitor_tests::daemon::unix_channel(&d.socket).await.expect("connect");
        let r = tonic_health::pb::health_client::HealthClient::new(ch.clone())
            .check(tonic_health::pb::HealthCheckRequest { service: "blockjanitor.v1.Agent".into() })
            .await
            .expect("health");
        assert_eq!(
            r.into_inner().status,
            tonic_health::pb::health_check_response::ServingStatus::Serving as i32
        );
        assert!(reflected_services(ch).await.contains(&"blockjanitor.v1.Agent".to_owned()));
    });
}

#[test]
fn root_watch_events_sees_a_loop_device_appear_and_apply_detaches_it() {
    if !require_real_kernel(TOOLS) {
        return;
    }
    let _serial = serial();
    let s = Scratch::new();
    let d = Daemon::start(s.dir.path(), &["--grace-period", "0"]);
    let img = s.path("watched.img");
    std::fs::File::create(&img).expect("create").set_len(8 << 20).expect("size");
    rt().block_on(async {
        let mut c = unix_client(&d.socket).await;
        let mut events = c.watch_events(pb::WatchEventsRequest {}).await.expect("watch").into_inner();
        let lo = LoopDev::attach(&img);
        let name = lo.name().to_owned();
        let got = tokio::time::timeout(Duration::from_secs(15), async {
            while let Some(e) = events.next().await {
                let e = e.expect("event");
                if e.device == name {
                    return Some(e);
                }
            }
            None
        })
        .await
        .expect("an event within 15 s of the uevent")
        .expect("stream open");
        let t = pb::event::Type::try_from(got.r#type).expect("type");
        assert!(matches!(t, pb::event::Type::DeviceAdded | pb::event::Type::VerdictChanged), "{got:?}");
        let dev = got.current.expect("current device");
        assert_eq!(dev.loop_backing_file, img.to_str().expect("utf8"));
        assert_eq!(dev.verdict, pb::Verdict::Stale as i32, "unheld and grace 0: {dev:?}");

        // The plan for every stale device includes it; Apply (root = operator) detaches it.
        let plans = c.plan(pb::PlanRequest { devices: vec![] }).await.expect("plan").into_inner().plans;
        let p = plans.iter().find(|p| p.device == name).expect("planned");
        assert_eq!(p.steps[0].action, "detach_loop");
        let r = c
            .apply(pb::ApplyRequest { devices: vec![name.clone()], ..Default::default() })
            .await
            .expect("apply")
            .into_inner();
        assert_eq!(r.results.len(), 1, "{r:?}");
        assert_eq!(r.results[0].result, "done", "{r:?}");
        assert!(!lo.is_bound());
        // ...and the stream reports the action.
        let finished = tokio::time::timeout(Duration::from_secs(10), async {
            while let Some(Ok(e)) = events.next().await {
                if e.device == name && e.r#type == pb::event::Type::ActionFinished as i32 {
                    return true;
                }
            }
            false
        })
        .await
        .unwrap_or(false);
        assert!(finished, "ActionFinished event");
    });
}

#[test]
fn root_fifty_concurrent_clients_and_metrics() {
    if !require_real_kernel(TOOLS) {
        return;
    }
    let s = Scratch::new();
    let d = Daemon::start(s.dir.path(), &["--metrics-listen", "127.0.0.1:0"]);
    rt().block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..50 {
            let sock = d.socket.clone();
            tasks.spawn(async move {
                let mut c = unix_client(&sock).await;
                c.list_devices(pb::ListDevicesRequest::default()).await.map(|r| r.into_inner().devices.len())
            });
        }
        let mut ok = 0;
        while let Some(r) = tasks.join_next().await {
            assert!(r.expect("task").expect("served") > 0);
            ok += 1;
        }
        assert_eq!(ok, 50);
    });
    let text = http_get(d.metrics.expect("metrics address"), "/metrics");
    for series in [
        "blockjanitor_devices{kind=\"loop\",verdict=",
        "blockjanitor_holders{kind=\"mount\"}",
        "blockjanitor_scan_duration_seconds_bucket",
        "blockjanitor_scans_total{trigger=\"start\"} ",
        "blockjanitor_last_scan_timestamp_seconds ",
        "blockjanitor_build_info{version=",
        "# HELP blockjanitor_actions_total",
    ] {
        assert!(text.contains(series), "missing {series} in\n{text}");
    }
    let path = s.path("metrics.txt");
    std::fs::write(&path, &text).expect("write");
    if require_real_kernel(&["promtool"]) {
        let out = std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(std::fs::File::open(&path).expect("open"))
            .output()
            .expect("promtool");
        assert!(out.status.success(), "promtool: {}{}", text_of(&out.stdout), text_of(&out.stderr));
    }
    assert!(http_get(d.metrics.expect("metrics"), "/other").contains("only /metrics"));
}

fn text_of(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A plain HTTP/1.0 GET on loopback; returns the body.
fn http_get(addr: std::net::SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect metrics");
    s.set_read_timeout(Some(Duration::from_secs(5))).expect("timeout");
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("send");
    let mut resp = String::new();
    s.read_to_string(&mut resp).expect("read");
    resp.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or(resp)
}

#[test]
fn root_sigterm_stops_gracefully_and_removes_the_socket() {
    if !require_real_kernel(TOOLS) {
        return;
    }
    let s = Scratch::new();
    let mut d = Daemon::start(s.dir.path(), &[]);
    assert!(d.socket.exists());
    // A client watching events must not hold up the shutdown.
    let rt = rt();
    let mut watch = rt.block_on(async {
        let mut c = unix_client(&d.socket).await;
        c.watch_events(pb::WatchEventsRequest {}).await.expect("watch").into_inner()
    });
    let started = std::time::Instant::now();
    assert_eq!(d.stop(), Some(0), "clean exit on SIGTERM; log:\n{}", d.log_text());
    assert!(started.elapsed() < Duration::from_secs(3), "stopped in {:?}", started.elapsed());
    let end = rt.block_on(async { tokio::time::timeout(Duration::from_secs(2), watch.next()).await });
    assert!(matches!(end, Ok(None) | Ok(Some(Err(_)))), "the stream ended: {end:?}");
    assert!(!d.socket.exists(), "socket removed");
    // A second agent refuses to take over a live socket, and TCP without TLS is refused.
    let d1 = Daemon::start(s.dir.path(), &[]);
    let out = agent(&["serve", "--socket", d1.socket.to_str().expect("utf8"), "--journal", "/dev/null"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("another process is serving on it"), "{}", text(&out.stderr));
    let out = agent(&["serve", "--socket", "/tmp/x.sock", "--listen", "127.0.0.1:0", "--tls-operator", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("mutual TLS"), "{}", text(&out.stderr));
}

/// Runs agentctl as uid 65534 with `groups` as its supplementary groups.
fn agentctl_as_nobody(groups: &str, args: &[&str]) -> std::process::Output {
    let ctl = agent_bin().with_file_name("agentctl");
    std::process::Command::new("setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--groups", groups])
        .arg(ctl)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("setpriv agentctl")
}

#[test]
fn root_unix_socket_viewer_reads_but_cannot_apply() {
    if !require_real_kernel(TOOLS) {
        return;
    }
    let s = Scratch::new();
    // The scratch directory must be reachable by uid 65534.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(s.dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let d = Daemon::start(s.dir.path(), &["--socket-group", "1"]);
    let sock = d.socket.to_str().expect("utf8");
    // A member of the socket's group (GID 1) is a viewer.
    let out = agentctl_as_nobody("1", &["--socket", sock, "devices", "-o", "json"]);
    assert!(out.status.success(), "viewer lists: {}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!(v.to_string().contains("\"name\""), "{v}");
    let out = agentctl_as_nobody("1", &["--socket", sock, "apply", "loop0", "--yes"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("PermissionDenied") && err.contains("operator"), "{err}");
    // Anyone else cannot even connect, and is told why.
    let out = agentctl_as_nobody("65534", &["--socket", sock, "node"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("permission denied") && err.contains("group"), "{err}");
    // Root, on the same socket, is an operator.
    let out = std::process::Command::new(agent_bin().with_file_name("agentctl"))
        .args(["--socket", sock, "apply", "sdzz", "--yes"])
        .output()
        .expect("agentctl");
    assert!(text(&out.stderr).contains("NotFound"), "root passes the role check: {}", text(&out.stderr));
}

fn device_verdict(sock: &std::path::Path, name: &str) -> Option<i32> {
    rt().block_on(async {
        let mut c = unix_client(sock).await;
        c.get_device(pb::GetDeviceRequest { device: name.into() }).await.ok().map(|d| d.into_inner().verdict)
    })
}

#[test]
fn root_clean_mode_detaches_stale_loop_devices_by_itself_within_the_rate_limit() {
    if !require_real_kernel(TOOLS) {
        return;
    }
    let _serial = serial();
    let s = Scratch::new();
    let d = Daemon::start(
        s.dir.path(),
        &["--mode", "clean", "--grace-period", "0", "--max-actions-per-minute", "1"],
    );
    let mut devs = Vec::new();
    for i in 0..2 {
        let img = s.path(&format!("auto{i}.img"));
        std::fs::File::create(&img).expect("create").set_len(8 << 20).expect("size");
        devs.push(LoopDev::attach(&img));
    }
    // The uevents wake the scanner; clean mode unbinds what is stale, one step a minute.
    assert!(
        wait_until(Duration::from_secs(15), || devs.iter().any(|l| !l.is_bound())),
        "nothing was cleaned; log:\n{}",
        d.log_text()
    );
    std::thread::sleep(Duration::from_secs(3));
    let unbound = devs.iter().filter(|l| !l.is_bound()).count();
    assert_eq!(unbound, 1, "the rate limit allows one step a minute");
    assert!(d.log_text().contains("rate limit reached"), "the postponed one is logged");
    let journal = std::fs::read_to_string(s.path("journal.jsonl")).expect("journal");
    assert!(journal.contains("\"result\":\"done\"") && journal.contains("detach_loop"), "{journal}");
}

#[test]
fn root_unreachable_api_makes_candidates_unknown_and_nothing_is_cleaned() {
    if !require_real_kernel(TOOLS) {
        return;
    }
    let _serial = serial();
    let s = Scratch::new();
    // Port 9 (discard) on loopback: nothing listens, every API call fails at once.
    let d = Daemon::start(
        s.dir.path(),
        &[
            "--mode",
            "clean",
            "--grace-period",
            "0",
            "--kube-url",
            "http://127.0.0.1:9",
            "--node-name",
            "node-a",
        ],
    );
    let img = s.path("kept.img");
    std::fs::File::create(&img).expect("create").set_len(8 << 20).expect("size");
    let lo = LoopDev::attach(&img);
    let name = lo.name().to_owned();
    assert!(
        wait_until(Duration::from_secs(15), || device_verdict(&d.socket, &name)
            == Some(pb::Verdict::Unknown as i32)),
        "unheld, stale by the node's evidence, but the API cannot vouch for it: unknown; log:\n{}",
        d.log_text()
    );
    std::thread::sleep(Duration::from_secs(2));
    assert!(lo.is_bound(), "nothing destructive rests on missing API evidence");
    let node = rt().block_on(async {
        unix_client(&d.socket).await.get_node(pb::GetNodeRequest {}).await.expect("node").into_inner()
    });
    assert_eq!(node.mode, "clean");
}

#[test]
fn root_daemon_reports_stale_devices_as_node_events_and_condition() {
    use blockjanitor_tests::kube_mock::{node_object, ready_only, ApiServer, NODE};
    if !require_real_kernel(TOOLS) {
        return;
    }
    let _serial = serial();
    let rt = rt();
    let server = rt.block_on(ApiServer::start(node_object(ready_only())));
    let s = Scratch::new();
    let url = server.url();
    let d = Daemon::start(s.dir.path(), &["--grace-period", "0", "--kube-url", &url, "--node-name", NODE]);
    let img = s.path("reported.img");
    std::fs::File::create(&img).expect("create").set_len(8 << 20).expect("size");
    let lo = LoopDev::attach(&img);
    let name = lo.name().to_owned();
    let event_posted = || {
        server.requests().iter().any(|r| {
            r.method == hyper::Method::POST
                && r.path.ends_with("/events")
                && r.body["reason"] == "StaleBlockDevice"
                && r.body["involvedObject"]["kind"] == "Node"
                && r.body["involvedObject"]["name"] == NODE
                && r.body["message"].as_str().is_some_and(|m| m.starts_with(&format!("{name}:")))
        })
    };
    let condition_set = || {
        server.requests().iter().any(|r| {
            r.method == hyper::Method::PATCH
                && r.path == format!("/api/v1/nodes/{NODE}/status")
                && r.body["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter().any(|c| {
                        c["type"] == "StaleBlockDevices"
                            && c["status"] == "True"
                            && c["message"].as_str().is_some_and(|m| m.contains(&name))
                    })
                })
        })
    };
    assert!(
        wait_until(Duration::from_secs(20), || event_posted() && condition_set()),
        "no StaleBlockDevice event and condition for {name}; requests: {:#?}\nlog:\n{}",
        server.requests().iter().map(|r| format!("{} {}", r.method, r.path)).collect::<Vec<_>>(),
        d.log_text()
    );
    assert!(lo.is_bound(), "report mode reports; it does not clean");
    drop(d);
    drop(rt);
}

#[test]
fn root_release_mode_detaches_a_foreign_mount_of_a_volume_kubelet_let_go() {
    if !require_real_kernel(&[TOOLS, &["mkfs.ext4", "unshare", "mount", "umount"]].concat()) {
        return;
    }
    let _serial = serial();
    let s = Scratch::new();
    // A kubelet directory with one CSI volume staged the pre-1.24 way and no pod using it.
    let kdir = s.mkdir("kubelet");
    let pv_dir = kdir.join("plugins/kubernetes.io/csi/pv/pvc-rel");
    let gm = pv_dir.join("globalmount");
    std::fs::create_dir_all(&gm).expect("mkdir globalmount");
    std::fs::write(
        pv_dir.join("vol_data.json"),
        r#"{"driverName":"rbd.csi.ceph.com","specVolID":"pvc-rel","volumeHandle":"0001-0024-rel","attachmentID":"csi-rel","nodeName":"node-a","volumeLifecycleMode":"Persistent"}"#,
    )
    .expect("vol_data.json");
    let img = s.ext4_image("rel.img", 32);
    let host_mount = HostMount::new(img.to_str().expect("utf8"), &gm, &["-o", "loop"]);
    let name = loop_for(&img).expect("loop device");
    let lo = LoopDev::adopt(&name, &img);
    // Incident 5: a process in its own namespace keeps a copy; kubelet unmounts on the host.
    let mut holder = NsProcess::spawn("exec sleep 1000");
    assert!(wait_until(Duration::from_secs(5), || holder.has_mount(&gm)));
    host_mount.umount();
    let d = Daemon::start(
        s.dir.path(),
        &["--mode", "release", "--kubelet-dir", kdir.to_str().expect("utf8"), "--rescan-interval", "1"],
    );
    assert!(
        wait_until(Duration::from_secs(20), || !holder.has_mount(&gm)),
        "release mode did not detach the stale mount; log:\n{}",
        d.log_text()
    );
    assert!(holder.is_alive(), "no process is killed");
    let journal = std::fs::read_to_string(s.path("journal.jsonl")).expect("journal");
    assert!(journal.contains("detach_mount") && journal.contains("\"result\":\"done\""), "{journal}");
    assert!(
        wait_until(Duration::from_secs(10), || !lo.is_bound()),
        "the loop device auto-cleared once released"
    );
}
