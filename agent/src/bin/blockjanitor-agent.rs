//! `blockjanitor-agent`: scan this node's block devices and who holds them, and release stale
//! holders. Parses flags, calls the library (`release` and `clean` through the one request
//! workflow, [`Engine::carry_out`]), prints. Exit codes (README, "Exit codes"): 0 free or done,
//! 1 error, 2 held, 3 unknown (could not see), 4 refused.

use std::io::IsTerminal;
use std::process::ExitCode;

use blockjanitor::cli::args::LogFormat;
use blockjanitor::cli::commands::run;

/// At most two glibc malloc arenas. glibc gives each thread that allocates its own arena (up
/// to 8 per core), and the daemon's blocking threads (scans, Plan) come and go: memory freed in
/// an arena stays with it, and under load (BENCHMARKS.md, "Load") RSS climbed 10 MiB higher
/// with the default than with two arenas, for no gain in speed.
fn limit_malloc_arenas() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets a tunable of glibc's allocator; it is called first thing in
    // main, before any other thread exists, and its arguments are constants glibc documents.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}

fn main() -> ExitCode {
    limit_malloc_arenas();
    let cli = match blockjanitor::cli::args::parse() {
        Ok(Some(c)) => c,
        Ok(None) => return ExitCode::SUCCESS,
        Err(e) => {
            let code = if e.use_stderr() { 1 } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    init_logging(cli.log_format);
    match run(&cli) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("error: {}", blockjanitor::errors::one_line(e.as_ref()));
            ExitCode::from(1)
        }
    }
}

fn init_logging(format: LogFormat) {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("BLOCKJANITOR_LOG").unwrap_or_else(|_| {
        // A one-shot run says what the Kubernetes API's word is worth on its first line: the
        // client's and the watches' own failure lines would say it again, once per watch.
        EnvFilter::new(if std::env::args().any(|a| a == "serve") {
            "info"
        } else {
            "warn,audit=info,kube_client=off,blockjanitor::kube=error"
        })
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(true)
        .with_ansi(std::io::stderr().is_terminal());
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}
