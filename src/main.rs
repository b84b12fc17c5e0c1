//! `gateway`: see the library's `cli` module.
#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    gateway::cli::main()
}
