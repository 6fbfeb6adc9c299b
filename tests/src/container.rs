//! Containers for the tests: podman with the flags that work on this kernel, the bookworm base
//! image made here from Debian's packages (registry images cannot be pulled on this machine), and
//! a Docker engine for `docker` commands run as the README writes them (podman's Docker-compatible
//! API service on a socket of the test's own).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::{text, wait_until};

/// The bookworm base image (minbase and libudev1), made once with mmdebstrap and kept.
pub const BASE_IMAGE: &str = "localhost/bookworm-base";

/// Where the base image's tarball is kept between runs.
pub const CACHE: &str = "/var/cache/blockjanitor-test";

/// The name the Dockerfile's `BASE` defaults to, as podman stores a Docker Hub image.
pub const DOCKERFILE_BASE: &str = "docker.io/library/debian:bookworm-slim";

/// Raising rlimits above the current ones is refused here: keep them.
pub const ULIMITS: [&str; 4] = ["--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"];

/// podman with the flags that work on this kernel (runc, cgroupfs; crun refuses the hybrid
/// cgroup layout).
pub fn podman() -> Command {
    let mut c = Command::new("podman");
    c.args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"]).stdin(Stdio::null());
    c
}

/// Runs `c`; panics with its output unless it succeeds. Returns its stdout.
pub fn run(mut c: Command, what: &str) -> String {
    let out = c.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(out.status.success(), "{what} failed:\n{}{}", text(&out.stdout), text(&out.stderr));
    text(&out.stdout)
}

/// Whether podman has the image `name`.
pub fn image_exists(name: &str) -> bool {
    podman().args(["image", "exists", name]).status().is_ok_and(|s| s.success())
}

/// The bookworm base image, made from Debian's packages once and cached (under a lock: another
/// test run may be making it).
pub fn base_image() {
    std::fs::create_dir_all(CACHE).expect("cache dir");
    let lock = std::fs::File::create(Path::new(CACHE).join(".lock")).expect("lock file");
    lock.lock().expect("lock the base image cache");
    if image_exists(BASE_IMAGE) {
        return;
    }
    let tar = Path::new(CACHE).join("bookworm-minbase.tar");
    if !tar.exists() {
        // mmdebstrap picks the output format from the name: keep ".tar" at the end.
        let partial = Path::new(CACHE).join("bookworm-minbase.partial.tar");
        let mut c = Command::new("mmdebstrap");
        c.args(["--variant=minbase", "--include=libudev1", "bookworm"]).arg(&partial);
        run(c, "mmdebstrap (builds the bookworm base image from Debian's mirror)");
        std::fs::rename(&partial, &tar).expect("keep the tarball");
    }
    let mut c = podman();
    c.args(["import", "--message", "bookworm minbase + libudev1 (mmdebstrap)"]).arg(&tar).arg(BASE_IMAGE);
    run(c, "podman import");
}

/// A Docker engine for the `docker` client: podman's Docker-compatible API on a socket in `dir`
/// (`DOCKER_HOST` = [`DockerEngine::host`]), configured as [`podman`] and [`ULIMITS`] are, with
/// the Dockerfile's default base ([`DOCKERFILE_BASE`]) present as the bookworm image made here,
/// since Docker Hub cannot be reached. On drop the service stops and a base tag it added goes.
pub struct DockerEngine {
    service: Child,
    socket: PathBuf,
    tagged_base: bool,
}

impl DockerEngine {
    pub fn start(dir: &Path) -> Self {
        base_image();
        let tagged_base = !image_exists(DOCKERFILE_BASE);
        if tagged_base {
            let mut c = podman();
            c.args(["tag", BASE_IMAGE, DOCKERFILE_BASE]);
            run(c, "podman tag (the Dockerfile's base, from the bookworm image made here)");
        }
        let conf = dir.join("containers.conf");
        std::fs::write(
            &conf,
            "[containers]\ndefault_ulimits = [\"nofile=1024:1024\", \"nproc=1024:1024\"]\n\
             [engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\n",
        )
        .expect("containers.conf");
        let socket = dir.join("docker.sock");
        let log = std::fs::File::create(dir.join("podman-service.log")).expect("service log");
        let service = Command::new("podman")
            .env("CONTAINERS_CONF", &conf)
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", socket.display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("podman system service");
        let engine = Self { service, socket, tagged_base };
        let up = wait_until(Duration::from_secs(30), || engine.socket.exists());
        assert!(up, "podman system service did not make {} within 30 s", engine.socket.display());
        engine
    }

    /// The value of `DOCKER_HOST` that reaches this engine.
    pub fn host(&self) -> String {
        format!("unix://{}", self.socket.display())
    }
}

impl Drop for DockerEngine {
    fn drop(&mut self) {
        let _ = self.service.kill();
        let _ = self.service.wait();
        if self.tagged_base {
            let _ = podman().args(["untag", DOCKERFILE_BASE, DOCKERFILE_BASE]).stdout(Stdio::null()).status();
        }
    }
}
