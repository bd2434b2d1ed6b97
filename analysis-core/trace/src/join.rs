//! Two independent parts of a computation, run at once where the caller can. The crates of the
//! analysis core start no threads: a front end that may (the CLI, the server) passes a [`Join`]
//! that runs both parts at once, and [`Sequential`] runs one after the other. Results are the
//! same either way: each part fills its own result, merged in a fixed order.

/// Runs two independent parts and returns both results.
pub trait Join: Sync {
    fn join<A: Send, B: Send>(
        &self,
        a: impl FnOnce() -> A + Send,
        b: impl FnOnce() -> B + Send,
    ) -> (A, B);
}

/// Runs both parts on the caller's thread (WebAssembly, tests).
pub struct Sequential;

impl Join for Sequential {
    fn join<A: Send, B: Send>(
        &self,
        a: impl FnOnce() -> A + Send,
        b: impl FnOnce() -> B + Send,
    ) -> (A, B) {
        (a(), b())
    }
}
