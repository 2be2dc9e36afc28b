//! The `gpuscale` command line.

mod cli;

use clap::Parser;

/// mimalloc instead of the system allocator: a plan of a large cluster allocates and frees
/// millions of small objects (decoded pods, workloads, device choices), where glibc's malloc
/// spent a fifth of `plan --snapshot`'s time.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let args = cli::Cli::parse();
    cli::init_logging(args.log_format);
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            std::process::ExitCode::from(2)
        }
    }
}
