//! Settings the `cgnmt` process takes before it parses its command line or starts a thread: the allocator's
//! thresholds and the thread pools' sizes.

/// Set up the process, first thing (before any thread exists).
pub fn set_up() {
    tune_allocator();
    set_thread_defaults();
}

/// For a subcommand that decodes batches concurrently, one per thread (`translate`): each decoder does its
/// own elementwise work instead of sharing candle's one elementwise helper pool (whose lock serialises them).
/// Measured on the Tatoeba test set (2 cores): 116–120 against 96–105 sentences/s. Matrix products still use
/// all threads. An explicit `CANDLE_NUM_THREADS` wins.
pub fn decode_concurrently() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
}

/// The thread pools' sizes, fixed once (also for the Python package, which does not run [`set_up`]).
///
/// candle asks for the thread count on every matmul and, without `RAYON_NUM_THREADS`, counts the physical
/// cores from /proc each time; fix it once (same default: physical cores).
pub fn set_thread_defaults() {
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        std::env::set_var(
            "RAYON_NUM_THREADS",
            num_cpus::get_physical().max(1).to_string(),
        );
    }
}

/// Keep freed tensor buffers in the process instead of returning them to the kernel after every op: the
/// recurrent steps allocate and free the same sizes thousands of times per batch, and fresh pages cost a
/// page fault each (measured in docs/design-notes.md, "Measurements behind code choices").
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator parameters; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
        libc::mallopt(libc::M_TOP_PAD, 256 << 20);
    }
}
