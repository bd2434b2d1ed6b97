//! Small OS services for the collector process (it may not use `unsafe` itself): the monotonic
//! clock shared with the traced processes, signal forwarding, and process liveness.

use core::sync::atomic::{AtomicI32, Ordering};

/// CLOCK_MONOTONIC in nanoseconds: the clock of every event.
pub fn monotonic_nanos() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: ts is a valid, writable timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

static FORWARD_PID: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, _ctx: *mut libc::c_void) {
    // A signal the terminal generated (Ctrl-C: si_code SI_KERNEL) already went to the whole
    // foreground process group, the program included: do not deliver it twice.
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    if !info.is_null() && unsafe { (*info).si_code } == libc::SI_KERNEL {
        return;
    }
    let pid = FORWARD_PID.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe; pid is the child we started.
        unsafe { libc::kill(pid, sig) };
    }
}

/// From now on, SIGINT, SIGTERM, SIGHUP and SIGQUIT received by this process are sent to `pid`
/// instead of terminating it (so the collector can finish the trace after the child exits).
/// Terminal-generated signals are not re-sent: the program, in the same process group, got them.
pub fn forward_signals_to(pid: u32) -> std::io::Result<()> {
    FORWARD_PID.store(pid as i32, Ordering::Relaxed);
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGQUIT] {
        // SAFETY: a zeroed sigaction with a valid handler and SA_RESTART is a valid argument;
        // the handler only does async-signal-safe work.
        let rc = unsafe {
            let mut sa: libc::sigaction = core::mem::zeroed();
            sa.sa_sigaction = forward as *const () as usize;
            sa.sa_flags = libc::SA_RESTART | libc::SA_SIGINFO;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, core::ptr::null_mut())
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether a process with this pid exists (and is not a zombie we could still reap).
pub fn process_alive(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    // A zombie still answers kill(0); /proc/<pid>/stat says Z for it.
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        return match stat.rfind(')') {
            Some(i) => !matches!(stat[i + 1..].trim_start().chars().next(), Some('Z' | 'X')),
            None => true,
        };
    }
    // SAFETY: kill with signal 0 only checks existence.
    unsafe { libc::kill(pid as i32, 0) == 0 }
}
