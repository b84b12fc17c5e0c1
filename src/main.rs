//! `gateway`: see the library's `cli` module.
#![forbid(unsafe_code)]

// The system allocator: mimalloc was measured and not taken (idle
// connections grew past their budget; benches/README.md, Decisions).

fn main() -> std::process::ExitCode {
    gateway::cli::main()
}
