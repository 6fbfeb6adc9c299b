//! `agentctl` (and, linked as `kubectl-blockjanitor`, the kubectl plugin): everything is in
//! [`blockjanitor_ctl::cli`].

fn main() -> std::process::ExitCode {
    blockjanitor_ctl::cli::main()
}
