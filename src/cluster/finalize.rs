//! A guard for the `MPI_Finalize` that never returns.
//!
//! Debian's MPICH 4.0 over UCX 1.13's TCP transport hangs in `MPI_Finalize` now and then (about 1 job in 20
//! on a busy machine, none over shared memory): one rank has closed its connections and waits in the
//! launcher's barrier, blocked on reading the launcher's socket; the other waits for its connection's close,
//! which needs the first rank to make progress. Every output is written by then (the job's last barrier is
//! behind every rank), so the job has done its work and only its end is stuck.
//!
//! MPICH's finalize ends its talk with the launcher (MPICH's PMI-1 over the socket `PMI_FD`) with a barrier
//! and a `finalize`. [`guard`] starts a thread that, once [`GRACE`] has passed (and 2 s more per rank, so that
//! the ranks act one at a time), looks at where this rank's main thread is blocked:
//! - reading the launcher's socket: it is in that barrier, and is released when its peers join it; the
//!   guard watches on (a rank stuck after that barrier is only reported: the barrier must not be said
//!   twice);
//! - anywhere else, for 200 ms (a connection's close that will not end): it parks the main thread in a signal handler
//!   (so it never touches the socket again), says the barrier and the `finalize` in its place, and ends the
//!   process with exit status 0. Its peers' barrier completes, they finish as usual, and the launcher sees
//!   every rank finalize: the job ends with status 0.
//!
//! Without `PMI_FD` (another launcher or MPI library), or where Linux's `/proc/self/task/<tid>/syscall`
//! cannot be read, the thread only says, on standard error, that the job's output is complete.

use std::io::{Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// How long after the job's last barrier `MPI_Finalize` may take before the guard acts.
pub const GRACE: Duration = Duration::from_secs(10);

/// Set by the signal handler once the main thread is parked in it.
static PARKED: AtomicBool = AtomicBool::new(false);

extern "C" fn park(_signal: libc::c_int) {
    PARKED.store(true, Ordering::SeqCst);
    loop {
        // SAFETY: pause is async-signal-safe; the thread stays here until the process ends.
        unsafe {
            libc::pause();
        }
    }
}

/// Start the guard for a rank that is about to call `MPI_Finalize` (call it on the main thread).
pub fn guard(rank: usize, size: usize) {
    let main = unsafe { libc::pthread_self() };
    let fd = std::env::var("PMI_FD")
        .ok()
        .and_then(|v| v.parse::<libc::c_int>().ok());
    std::thread::spawn(move || {
        // The ranks act one after another (2 s apart, within a minute), so that what one rank's action sets
        // going in its peers has settled before the next one looks.
        let step = Duration::from_secs(2).min(Duration::from_secs(60) / size as u32);
        let wait = GRACE + step * rank as u32;
        std::thread::sleep(wait);
        let who = format!("note (rank {rank} of {size})");
        let Some(fd) = fd else {
            return stuck(&who);
        };
        let mut waited = false;
        loop {
            match main_thread_at_launcher(fd) {
                None => return stuck(&who),
                // In the launcher's barrier: the peers release it.
                Some(true) => {
                    waited = true;
                    std::thread::sleep(Duration::from_millis(50));
                }
                // Past the launcher's barrier and stuck after it (MPICH's shared-memory clean-up waiting on
                // a peer that is gone): saying the barrier again would be wrong.
                Some(false) if waited => {
                    std::thread::sleep(GRACE);
                    return stuck(&who);
                }
                // Away from the launcher for a while yet (a main thread on its way through the launcher's
                // barrier would show there): not started on it.
                Some(false) if !away_for(fd, 20) => waited = true,
                Some(false) => {
                    if let Err(e) = finish_for(main, fd) {
                        say(&format!(
                            "{who}: MPI_Finalize has not returned {} s after every rank finished, and \
                             telling the launcher failed ({e}); all output is written\n",
                            wait.as_secs()
                        ));
                        return;
                    }
                    say(&format!(
                        "{who}: MPI_Finalize has not returned {} s after every rank finished (a \
                         connection's close did not end); finished with the launcher in its place (all \
                         output is written)\n",
                        wait.as_secs()
                    ));
                    leave(0);
                }
            }
        }
    });
}

/// A note on standard error in one write (the launcher forwards it whole).
fn say(message: &str) {
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(message.as_bytes());
    let _ = err.flush();
}

fn stuck(who: &str) {
    say(&format!(
        "{who}: MPI_Finalize has not returned {} s after every rank finished; all output is written\n",
        GRACE.as_secs()
    ));
}

/// Whether the process's main thread is in a `read` or a `write` on `fd` (the launcher's socket), from
/// Linux's `/proc/self/task/<pid>/syscall` (the call's number, then its arguments in hexadecimal); `None` where
/// that cannot be told.
fn main_thread_at_launcher(fd: libc::c_int) -> Option<bool> {
    if !cfg!(all(target_os = "linux", target_arch = "x86_64")) {
        return None;
    }
    let s =
        std::fs::read_to_string(format!("/proc/self/task/{}/syscall", std::process::id())).ok()?;
    let mut f = s.split_whitespace();
    let call = f.next()?;
    let arg = f
        .next()
        .and_then(|a| i64::from_str_radix(a.trim_start_matches("0x"), 16).ok());
    // x86-64's read and write are calls 0 and 1.
    Some((call == "0" || call == "1") && arg == Some(fd as i64))
}

/// Whether the main thread stays away from the launcher's socket in `samples` looks 10 ms apart.
fn away_for(fd: libc::c_int, samples: usize) -> bool {
    (0..samples).all(|_| {
        std::thread::sleep(Duration::from_millis(10));
        main_thread_at_launcher(fd) == Some(false)
    })
}

/// Park the main thread, then say MPICH's last two things to the launcher: the barrier and `finalize`.
fn finish_for(main: libc::pthread_t, fd: libc::c_int) -> std::io::Result<()> {
    // SAFETY: installs a handler that only stores an atomic and pauses; then signals the main thread.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = park as *const () as usize;
        libc::sigemptyset(&mut action.sa_mask);
        if libc::sigaction(libc::SIGUSR2, &action, std::ptr::null_mut()) != 0
            || libc::pthread_kill(main, libc::SIGUSR2) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    let t0 = std::time::Instant::now();
    while !PARKED.load(Ordering::SeqCst) {
        if t0.elapsed() > Duration::from_secs(2) {
            return Err(std::io::Error::other("the main thread did not stop"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // The socket stays open (it is the process's, and MPI's): borrow it without closing it.
    let mut socket = std::mem::ManuallyDrop::new(unsafe {
        <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd)
    });
    for (say, answer) in [
        ("cmd=barrier_in\n", "cmd=barrier_out"),
        ("cmd=finalize\n", "cmd=finalize_ack"),
    ] {
        socket.write_all(say.as_bytes())?;
        let line = read_line(&mut *socket)?;
        if line.trim_end() != answer {
            return Err(std::io::Error::other(format!(
                "the launcher answered {line:?} to {:?}",
                say.trim_end()
            )));
        }
    }
    Ok(())
}

/// One line from the launcher, read a byte at a time (nothing after it may be consumed).
fn read_line(socket: &mut std::fs::File) -> std::io::Result<String> {
    let mut line = Vec::new();
    let mut b = [0u8];
    while line.len() < 4096 {
        if socket.read(&mut b)? == 0 {
            return Err(std::io::Error::other("the launcher closed the connection"));
        }
        if b[0] == b'\n' {
            break;
        }
        line.push(b[0]);
    }
    Ok(String::from_utf8_lossy(&line).into_owned())
}

/// End the process at once with `code`, after flushing standard output: no exit handlers run (the MPI
/// library's would wait on the connections `MPI_Finalize` did not close).
fn leave(code: i32) -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: `_exit` ends the process; nothing runs after it.
    unsafe { libc::_exit(code) }
}
