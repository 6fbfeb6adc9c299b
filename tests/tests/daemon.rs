//! End-to-end tests of `blockjanitor-agent serve` and `agentctl`: real unix socket, real TCP with
//! certificates made here, health, reflection, roles, bad requests, events on a real loop device,
//! metrics, concurrency and graceful shutdown; `agentctl apply` bound to the identities of the
//! plan it showed (and refusing a reused loop number), holders' command lines kept from viewers,
//! Node Events without ages that de-duplicate across scans, and `agentctl node` showing whether
//! the Kubernetes API vouches and what the scan could not see.

use std::time::Duration;

use blockjanitor_proto::v1 as pb;
use blockjanitor_proto::v1::agent_client::AgentClient;
use blockjanitor_tests::daemon::{
    assert_serving_and_reflected, reporting_daemon, tls_channel, unix_client, Daemon, Pki,
};
use blockjanitor_tests::http::{http_get, http_response};
use blockjanitor_tests::kube_mock::NODE;
use blockjanitor_tests::*;
use tokio_stream::StreamExt;
use tonic::Code;

const TOOLS: &[&str] = &["losetup", "setpriv"];

/// A daemon with a TCP listener, an operator identity and a viewer identity.
fn tls_daemon(s: &Scratch, pki: &Pki) -> Daemon {
    let tls = pki.write_server(s.dir.path());
    let roles = ["--tls-operator", "console", "--tls-viewer", "dashboard", "--metrics-listen", "127.0.0.1:0"];
    Daemon::start_tls(s.dir.path(), &[], "127.0.0.1:0", &tls, &roles)
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
        assert_serving_and_reflected(ch, "blockjanitor.v1.Agent").await;
    });
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
        // A path outside /dev is refused before the agent stats it: a viewer learns nothing of
        // the host's files (an existing file and a missing one get the same answer).
        for path in ["/etc/passwd", "/etc/no-such-file", "/dev/../etc/passwd", "/dev/./loop0", "/dev/"] {
            let e = c
                .plan(pb::PlanRequest { devices: vec![path.into()], ..Default::default() })
                .await
                .expect_err("not a device");
            assert_eq!(e.code(), Code::InvalidArgument, "{path}: {e:?}");
            assert!(e.message().contains("is not under /dev"), "{path}: {e:?}");
            let e =
                c.get_device(pb::GetDeviceRequest { device: path.into() }).await.expect_err("not a device");
            assert_eq!(e.code(), Code::InvalidArgument, "{path}: {e:?}");
        }
        // A release is planned only for devices named; an operation this agent does not know is
        // refused, never taken for a cleanup.
        let e = c
            .plan(pb::PlanRequest { devices: vec![], operation: pb::Operation::Release as i32 })
            .await
            .expect_err("release needs devices");
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("needs the devices named"), "{e:?}");
        let e = c
            .apply(pb::ApplyRequest { devices: vec!["sdzz".into()], operation: 7, ..Default::default() })
            .await
            .expect_err("unknown operation");
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains("unknown operation 7"), "{e:?}");
        let e = c
            .get_device(pb::GetDeviceRequest { device: "/dev/no-such-node".into() })
            .await
            .expect_err("no such node");
        assert_eq!(e.code(), Code::NotFound, "a /dev path is still looked up: {e:?}");
        // Still serving.
        let node = c.get_node(pb::GetNodeRequest {}).await.expect("still serving").into_inner();
        assert_eq!(node.agent_version, env!("CARGO_PKG_VERSION"));
        let ch = blockjanitor_tests::daemon::unix_channel(&d.socket).await.expect("connect");
        assert_serving_and_reflected(ch, "blockjanitor.v1.Agent").await;
    });
}

#[test]
fn root_watch_events_sees_a_loop_device_appear_and_apply_detaches_it() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let d = Daemon::start(s.dir.path(), &["--grace-period", "0"]);
    let img = s.sparse_file("watched.img", 8);
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
        let plans = c
            .plan(pb::PlanRequest { devices: vec![], ..Default::default() })
            .await
            .expect("plan")
            .into_inner()
            .plans;
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
    assert!(http_response(d.metrics.expect("metrics"), "/other").1.contains("only /metrics"));
}

fn text_of(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
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
    // Events published before the stop (another test's mounts show here too) may still be on
    // their way: the stream must end after them, within the 2 s.
    let end = rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                match watch.next().await {
                    Some(Ok(_)) => continue,
                    other => return other,
                }
            }
        })
        .await
    });
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
    assert_eq!(out.status.code(), Some(4), "refused: not an operator");
    let err = text(&out.stderr);
    assert!(err.contains("PermissionDenied") && err.contains("operator"), "{err}");
    // Anyone else cannot even connect, and is told why.
    let out = agentctl_as_nobody("65534", &["--socket", sock, "node"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(err.contains("permission denied") && err.contains("group"), "{err}");
    // The file mode stopped that one before the server saw it. With the mode opened up (an
    // operator's mistake, or a umask gone wrong), the server's own check still refuses.
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o666)).expect("chmod 0666");
    let out = agentctl_as_nobody("65534", &["--socket", sock, "devices", "-o", "json"]);
    std::fs::set_permissions(&d.socket, std::fs::Permissions::from_mode(0o660)).expect("chmod 0660");
    assert_eq!(out.status.code(), Some(1), "stdout: {}", text(&out.stdout));
    let err = text(&out.stderr);
    assert!(
        err.contains("PermissionDenied") && err.contains("uid 65534 is neither root nor a member"),
        "the server refuses a non-member itself: {err}"
    );
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

/// A daemon in clean mode with no grace period, then `args`.
fn clean_daemon(s: &Scratch, args: &[&str]) -> Daemon {
    let all: Vec<&str> = ["--mode", "clean", "--grace-period", "0"].iter().chain(args).copied().collect();
    Daemon::start(s.dir.path(), &all)
}

#[test]
fn root_clean_mode_detaches_stale_loop_devices_by_itself_within_the_rate_limit() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    // Rescans every 2 s: a scan made blind for a moment by a process of another test (its
    // candidate then unknown, rightly) is followed by a complete one soon, not in a minute.
    let d = clean_daemon(&s, &["--max-actions-per-minute", "1", "--rescan-interval", "2"]);
    let mut devs = Vec::new();
    for i in 0..2 {
        devs.push(s.loop_file(&format!("auto{i}.img")));
    }
    // The uevents wake the scanner; clean mode unbinds what is stale, one step a minute.
    assert!(
        wait_until(REACT, || devs.iter().any(|l| !l.is_bound())),
        "nothing was cleaned; verdicts {:?}; log:\n{}",
        devs.iter().map(|l| (l.name().to_owned(), device_verdict(&d.socket, l.name()))).collect::<Vec<_>>(),
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
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    // Port 9 (discard) on loopback: nothing listens, every API call fails at once.
    let d = clean_daemon(&s, &["--kube-url", "http://127.0.0.1:9", "--node-name", "node-a"]);
    let lo = s.loop_file("kept.img");
    let name = lo.name().to_owned();
    assert!(
        wait_until(REACT, || device_verdict(&d.socket, &name) == Some(pb::Verdict::Unknown as i32)),
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
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let rt = rt();
    // Rescans every 2 s (see the clean-mode test): what is asserted is the report of a stale
    // device, not how soon a trigger arrives after a momentarily blind scan.
    let (server, d) = reporting_daemon(&s, &rt, &["--rescan-interval", "2"]);
    let lo = s.loop_file("reported.img");
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
        wait_until(REACT, || event_posted() && condition_set()),
        "no StaleBlockDevice event and condition for {name}; the agent says: {:?}; requests: {:#?}\nlog:\n{}",
        rt.block_on(async {
            let mut c = unix_client(&d.socket).await;
            c.get_device(pb::GetDeviceRequest { device: name.clone() }).await.map(|r| {
                let r = r.into_inner();
                (r.verdict, r.reasons)
            })
        }),
        server
            .requests()
            .iter()
            .map(|r| format!("{} {}{}", r.method, r.path, if r.is_watch() { " (watch)" } else { "" }))
            .collect::<Vec<_>>(),
        d.log_text()
    );
    assert!(lo.is_bound(), "report mode reports; it does not clean");
    drop(d);
    drop(rt);
}

#[test]
fn root_release_mode_detaches_a_foreign_mount_of_a_volume_kubelet_let_go() {
    let Some((_serial, s)) =
        real_kernel_test(&[TOOLS, &["mkfs.ext4", "unshare", "mount", "umount"]].concat())
    else {
        return;
    };
    // A kubelet directory with one CSI volume staged the pre-1.24 way and no pod using it.
    let (kdir, gm) = s.staged_csi_volume("rel");
    let (host_mount, lo) = s.loop_mount("rel.img", &gm);
    // Incident 5: a process in its own namespace keeps a copy; kubelet unmounts on the host.
    let mut holder = NsProcess::spawn("exec sleep 1000");
    assert!(wait_until(REACT, || holder.has_mount(&gm)));
    host_mount.umount();
    let d = Daemon::start(
        s.dir.path(),
        &["--mode", "release", "--kubelet-dir", kdir.to_str().expect("utf8"), "--rescan-interval", "1"],
    );
    assert!(
        wait_until(REACT, || !holder.has_mount(&gm)),
        "release mode did not detach the stale mount; log:\n{}",
        d.log_text()
    );
    assert!(holder.is_alive(), "no process is killed");
    // The result is journaled right after the unmount returns.
    let journal = || std::fs::read_to_string(s.path("journal.jsonl")).unwrap_or_default();
    assert!(
        wait_until(REACT, || {
            let j = journal();
            j.contains("detach_mount") && j.contains("\"result\":\"done\"")
        }),
        "{}",
        journal()
    );
    assert!(wait_until(REACT, || !lo.is_bound()), "the loop device auto-cleared once released");
}

/// Runs agentctl (as root: an operator) against the daemon on `socket`.
fn agentctl(socket: &std::path::Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(agent_bin().with_file_name("agentctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run agentctl")
}

/// Runs agentctl with `-o json`, asserting it succeeds; its stdout parsed.
fn agentctl_json(socket: &std::path::Path, args: &[&str]) -> serde_json::Value {
    let args: Vec<&str> = args.iter().copied().chain(["-o", "json"]).collect();
    let out = agentctl(socket, &args);
    assert!(out.status.success(), "agentctl {args:?}: {}{}", text(&out.stdout), text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {}", text(&out.stdout)))
}

/// The identity `agentctl plan DEVICE` answers for it.
fn planned_identity(socket: &std::path::Path, device: &str) -> String {
    let v = agentctl_json(socket, &["plan", device]);
    let id = v["plans"][0]["identity"].as_str().unwrap_or_default().to_owned();
    assert!(id.starts_with(&format!("{device}@")), "an identity for {device}: {v:#}");
    id
}

#[test]
fn root_agentctl_apply_acts_on_the_device_it_planned_and_refuses_a_reused_number() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let d = Daemon::start(s.dir.path(), &["--grace-period", "0"]);
    let stale = |name: &str| {
        assert!(
            wait_until(REACT, || device_verdict(&d.socket, name) == Some(pb::Verdict::Stale as i32)),
            "{name} never turned stale; log:\n{}",
            d.log_text()
        );
    };

    // agentctl plans, shows the plan with its identity, and applies bound to it.
    let lo = s.loop_file("first.img");
    let name = lo.name().to_owned();
    stale(&name);
    let identity = planned_identity(&d.socket, &name);
    let shown = agentctl(&d.socket, &["device", &name]);
    assert!(text(&shown.stdout).contains(&format!("\nidentity: {identity}\n")), "{}", text(&shown.stdout));
    let out = agentctl(&d.socket, &["apply", &name, "--yes"]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    let plan_at = stdout.find(&format!("{name}: 1 step\n  identity: {identity}\n  1. detach_loop: "));
    let done_at = stdout.find(" -> done\n");
    assert!(plan_at.is_some() && plan_at < done_at, "the plan, then what was done:\n{stdout}");
    assert!(stdout.ends_with("1 done, 0 deferred, 0 failed\n"), "{stdout}");
    assert!(!lo.is_bound(), "detached");
    let journal = std::fs::read_to_string(s.path("journal.jsonl")).expect("journal");
    assert!(journal.contains("detach_loop") && journal.contains(&name), "{journal}");

    // The reuse race: planned, then the number is detached and attached to another file.
    let old_img = s.sparse_file("planned.img", 8);
    let lo = LoopDev::attach(&old_img);
    let name = lo.name().to_owned();
    stale(&name);
    let old = planned_identity(&d.socket, &name);
    sh("losetup", &["-d", &lo.dev]);
    let new_img = s.sparse_file("reused.img", 8);
    let new_path = new_img.to_str().expect("utf8");
    // The detach completes on last close (a scan may hold it open a moment).
    assert!(
        wait_until(REACT, || std::process::Command::new("losetup")
            .args([lo.dev.as_str(), new_path])
            .status()
            .is_ok_and(|s| s.success())),
        "cannot attach {} again",
        lo.dev
    );
    let reused = LoopDev::adopt(&name, &new_img);
    assert!(reused.is_bound());
    let out = agentctl(&d.socket, &["apply", &name, "--yes", "--identity", &old]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "refused: {}{err}", text(&out.stdout));
    let new = planned_identity(&d.socket, &name);
    assert_ne!(new, old, "a new attach is a new identity");
    assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
    assert!(
        err.starts_with("error: FailedPrecondition: ")
            && err.contains(&format!("[{old}]"))
            && err.contains(&format!("[{new}]")),
        "names both identities: {err}"
    );
    assert!(reused.is_bound(), "the device that replaced the planned one is left alone");
    // Too few identities is the caller's mistake, said before anything is sent.
    let out = agentctl(&d.socket, &["apply", &name, "loop0", "--yes", "--identity", &new]);
    assert_eq!(out.status.code(), Some(1));
    assert!(text(&out.stderr).contains("1 identity for 2 devices"), "{}", text(&out.stderr));
    assert!(reused.is_bound());
}

/// A process that keeps `device` open with `marker` in its command line; killed on drop.
fn open_holder(device: &str, marker: &str) -> Killed {
    // `$0` is the marker; `read` waits on a pipe that never delivers.
    let child = std::process::Command::new("sh")
        .args(["-c", &format!("exec 3<{device}; read x"), marker])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("spawn holder");
    Killed(child)
}

#[test]
fn root_viewers_get_holders_without_command_lines() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(s.dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let d = Daemon::start(s.dir.path(), &["--socket-group", "1", "--rescan-interval", "1"]);
    let sock = d.socket.to_str().expect("utf8");
    let lo = s.loop_file("held.img");
    let name = lo.name().to_owned();
    const MARKER: &str = "bj-holder-marker-6d1f";
    let _holder = open_holder(&lo.dev, MARKER);
    // Root (an operator) sees the holder's command line.
    let mut root_view = serde_json::Value::Null;
    assert!(
        wait_until(REACT, || {
            root_view = agentctl_json(&d.socket, &["device", &name]);
            root_view["holders"].as_array().is_some_and(|hs| {
                hs.iter().any(|h| {
                    h["kind"] == "open_device" && h["cmdline"].as_str().is_some_and(|c| c.contains(MARKER))
                })
            })
        }),
        "root never saw the holder's command line: {root_view:#}\nlog:\n{}",
        d.log_text()
    );
    // A viewer sees the same holders, named by their command, with no command line anywhere.
    for args in [
        vec!["device", name.as_str(), "-o", "json"],
        vec!["holders", name.as_str(), "-o", "yaml"],
        vec!["devices", "-o", "json"],
        vec!["device", name.as_str()],
    ] {
        let out = agentctl_as_nobody("1", &[&["--socket", sock][..], &args].concat());
        let stdout = text(&out.stdout);
        // `holders` exits 2 for a held device, as `fuser -s` does.
        let want = if args[0] == "holders" { 2 } else { 0 };
        assert_eq!(out.status.code(), Some(want), "viewer {args:?}: {}", text(&out.stderr));
        assert!(!stdout.contains(MARKER), "viewer {args:?} got a command line:\n{stdout}");
    }
    let out = agentctl_as_nobody("1", &["--socket", sock, "device", &name, "-o", "json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let holders = v["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), root_view["holders"].as_array().map_or(0, Vec::len), "{v:#}");
    assert!(holders.iter().all(|h| h["cmdline"] == ""), "{v:#}");
    assert!(holders.iter().any(|h| h["kind"] == "open_device" && h["comm"] == "sh"), "{v:#}");
}

/// Whether an Event message says how long something has lasted (`for 0s`, `for 3m`).
fn says_an_age(message: &str) -> bool {
    message.split("for ").skip(1).any(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
}

#[test]
fn root_events_hold_no_age_and_de_duplicate_across_scans() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let rt = rt();
    let (server, d) = reporting_daemon(&s, &rt, &["--rescan-interval", "1"]);
    let lo = s.loop_file("reported.img");
    let name = lo.name().to_owned();
    let stale_events = || -> Vec<String> {
        server
            .requests()
            .iter()
            .filter(|r| {
                r.method == hyper::Method::POST
                    && r.path.ends_with("/events")
                    && r.body["reason"] == "StaleBlockDevice"
            })
            .filter_map(|r| r.body["message"].as_str().map(str::to_owned))
            .filter(|m| m.starts_with(&format!("{name}:")))
            .collect()
    };
    assert!(
        wait_until(REACT, || !stale_events().is_empty()),
        "no StaleBlockDevice event for {name}; log:\n{}",
        d.log_text()
    );
    let scans = || {
        rt.block_on(async {
            unix_client(&d.socket)
                .await
                .get_node(pb::GetNodeRequest {})
                .await
                .expect("node")
                .into_inner()
                .scans
        })
    };
    // Three more scans (about 4 s at one a second; longer on a loaded machine).
    let before = scans();
    std::thread::sleep(Duration::from_secs(4));
    assert!(wait_until(REACT, || scans() >= before + 3), "three more scans");
    assert_eq!(device_verdict(&d.socket, &name), Some(pb::Verdict::Stale as i32), "still stale");
    let events = stale_events();
    assert_eq!(events.len(), 1, "one Event over several scans: {events:#?}");
    assert!(!says_an_age(&events[0]), "no age in {:?}", events[0]);
    assert!(events[0].contains("stale"), "{:?}", events[0]);
    drop(d);
    drop(rt);
}

#[test]
fn root_agentctl_node_shows_the_kubernetes_api_and_blind_spots() {
    use blockjanitor_tests::kube_mock::{node_object, ready_only, ApiServer};
    if !require_real_kernel(TOOLS) {
        return;
    }
    let rt = rt();
    let server = rt.block_on(ApiServer::start(node_object(ready_only())));
    let s = Scratch::new();
    let url = server.url();
    // No Node by this name in the cluster (the mock answers 404), and PID 1 is not trusted.
    let d = Daemon::start_configured(
        s.dir.path(),
        &[],
        &["--kube-url", &url, "--node-name", "node-zz", "--rescan-interval", "1"],
        |c| {
            c.env_remove(TRUST_INIT_ENV);
        },
    );
    let want = "cannot vouch: no Node named 'node-zz' in the cluster";
    let mut node = serde_json::Value::Null;
    assert!(
        wait_until(REACT, || {
            node = agentctl_json(&d.socket, &["node"]);
            node["kubernetes"].as_str().is_some_and(|k| k.starts_with(want))
        }),
        "the Kubernetes line: {node:#}\nlog:\n{}",
        d.log_text()
    );
    let spots: Vec<String> = node["blind_spots"]
        .as_array()
        .expect("blind_spots")
        .iter()
        .map(|b| b.as_str().unwrap_or_default().to_owned())
        .collect();
    let out = agentctl(&d.socket, &["node"]);
    let table = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(table.contains(&format!("\nKubernetes API: {want}")), "{table}");
    let yaml = text(&agentctl(&d.socket, &["node", "-o", "yaml"]).stdout);
    // (YAML quotes the value, doubling its single quotes.)
    assert!(yaml.contains("\nkubernetes: 'cannot vouch: no Node named ''node-zz'' in the cluster"), "{yaml}");
    if pid1_uninspectable() {
        let pid1 = spots.iter().find(|b| b.contains("pid 1 (")).unwrap_or_else(|| {
            panic!("PID 1 is not inspectable here and not trusted: a blind spot names it: {node:#}")
        });
        assert!(pid1.contains("could hide a holder of any device"), "{pid1}");
        assert!(table.contains(&format!("\nblind spots:    {}\n", spots.len())), "{table}");
        assert!(table.contains(&format!("\n  - {pid1}\n")), "{table}");
        assert!(yaml.contains("blind_spots:\n- ") && yaml.contains("pid 1 ("), "{yaml}");
    } else {
        assert!(table.contains("\nblind spots:    none\n"), "{table}");
    }
    drop(d);
    drop(rt);
}

#[test]
fn root_plans_are_rate_limited_per_client() {
    let Some((_serial, s)) = real_kernel_test(TOOLS) else { return };
    let config = s.path("agent.toml");
    std::fs::write(&config, "plans_per_minute_per_client = 3\n").expect("config");
    let d = Daemon::start(s.dir.path(), &["--config", config.to_str().expect("utf8")]);
    rt().block_on(async {
        let mut c = unix_client(&d.socket).await;
        for _ in 0..3 {
            let e = c
                .plan(pb::PlanRequest { devices: vec!["sdzz".into()], ..Default::default() })
                .await
                .expect_err("no such device, but counted");
            assert_eq!(e.code(), Code::NotFound, "{e:?}");
        }
        let e = c
            .plan(pb::PlanRequest { devices: vec![], ..Default::default() })
            .await
            .expect_err("a fourth plan in a minute");
        assert_eq!(e.code(), Code::ResourceExhausted, "{e:?}");
        assert!(e.message().contains("uid 0 asked for more than 3 plans a minute"), "{e:?}");
        // Other calls are not limited, and another caller (a viewer on the socket) has its own minute.
        c.get_node(pb::GetNodeRequest {}).await.expect("GetNode still answers");
    });
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(s.dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = agentctl_as_nobody("0", &["--socket", d.socket.to_str().expect("utf8"), "plan", "-o", "json"]);
    assert!(out.status.success(), "another caller plans: {}", text(&out.stderr));
}

/// The health service says whether the agent can see: the agent service (the readiness probe's)
/// is NOT_SERVING while its latest scan failed, SERVING again once one succeeds; the server's
/// own (the liveness probe's) stays SERVING throughout. On a copy of a fixture tree whose
/// `/sys/class/block` is taken away, then put back.
#[test]
fn health_is_not_serving_while_scans_fail_and_serving_once_one_succeeds() {
    use tonic_health::pb::health_check_response::ServingStatus;
    let s = Scratch::new();
    let root = s.path("root");
    let cp = std::process::Command::new("cp")
        .arg("-a")
        .arg(fixtures().join("incident1"))
        .arg(&root)
        .status()
        .expect("cp");
    assert!(cp.success(), "cp -a the fixture");
    let d = Daemon::start_with_global(
        s.dir.path(),
        &["--root", root.to_str().expect("utf8"), "--rescan-interval", "1"],
        &["--node-name", "node-health"],
    );
    let rt = rt();
    let status = |want: ServingStatus| d.wait_health(&rt, want);
    status(ServingStatus::Serving);
    let class = root.join("sys/class/block");
    let aside = root.join("sys/class/block.aside");
    std::fs::rename(&class, &aside).expect("take /sys/class/block away");
    status(ServingStatus::NotServing);
    assert!(d.log_text().contains("NOT_SERVING until every check passes"), "{}", d.log_text());
    std::fs::rename(&aside, &class).expect("put it back");
    status(ServingStatus::Serving);
}
