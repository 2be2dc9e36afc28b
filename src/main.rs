//! The `gpuscale` command line.

mod cli;

use clap::Parser;

/// mimalloc instead of the system allocator: a plan of a large cluster allocates and frees
/// millions of small objects (decoded pods, workloads, device choices), where glibc's malloc
/// spent a fifth of `plan --snapshot`'s time.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// mimalloc 3 gives freed memory back to the OS a second after the first free since its last
/// purge (`purge_delay`). A controller's passes come seconds apart and each needs the memory the
/// last one freed: it faulted it all in again, a tenth of a 5,000-node pass. Kept instead, the
/// controller's memory is its largest pass's, as its peak already was.
fn keep_freed_memory() {
    /// `mi_option_purge_delay` in mimalloc.h; libmimalloc-sys leaves it out of its constants.
    const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
    // SAFETY: sets a plain integer option, before any other thread exists.
    unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, -1) }
}

fn main() -> std::process::ExitCode {
    keep_freed_memory();
    let args = cli::Cli::parse();
    cli::init_logging(args.log_format);
    match cli::run(args) {
        Ok(code) => code,
        Err(err) => {
            // Messages quote names and values from the input: each goes through the one escaping
            // function, so none can forge a line; several config problems are one line each.
            use gpuscale::providers::config::ConfigError;
            match err.downcast_ref::<ConfigError>() {
                Some(ConfigError::Multiple(errors)) => {
                    for e in errors {
                        eprintln!("error: {}", gpuscale::shown::Shown(e));
                    }
                }
                _ => eprintln!("error: {}", gpuscale::shown::Shown(format_args!("{err:#}"))),
            }
            std::process::ExitCode::from(2)
        }
    }
}
