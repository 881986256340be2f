//! Work at process exit. Statics are never dropped, but the C runtime runs `atexit` handlers
//! when `main` returns or `std::process::exit` is called, which is how a test binary ends
//! (passing or failing). Signals that kill the process skip them.

/// Registers `handler` to run at exit. It must not unwind (a panic there aborts).
#[allow(unsafe_code)]
pub fn register(handler: extern "C" fn()) {
    // SAFETY: `atexit` only stores the function pointer; `handler` is a plain function with
    // no captured state. A non-zero return (table full) just means it will not run, which
    // the stale-directory sweep at the next start covers.
    let _ = unsafe { libc::atexit(handler) };
}
